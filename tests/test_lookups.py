"""Lookup records (shardfs/lookups.py, shardfs/c/lookup_pack.h): a set
finds every key of shards it does not hold open from their records,
without opening them; a record made for another state of its shard (a
takedown while no mount ran) is not used; a damaged or truncated pack
gives right answers (from the shards) or none, never a crash; packs past
MAX_PACKS are merged."""

from __future__ import annotations

import logging
import os
import random
import time

import pytest

from shardfs import Shard, shard as shard_mod
from shardfs import lookups, sidecar
from shardfs._shardfs import LookupPack
from shardfs.errors import CorruptShardError
from shardfs.shardset import open_shard_set

from test_global_index import sha
from test_open_bound import objects_of, write

SHARDS = 60


@pytest.fixture
def shard_dir(tmp_path):
    """SHARDS shards of 5 tiny objects and one of 3,000 (its sizes come from
    the gaps between its objects), in one directory: (directory, {file
    name: {key: bytes}})."""
    d = tmp_path / "shards"
    d.mkdir()
    contents = {f"s{i:03d}.shard": objects_of(i) for i in range(SHARDS)}
    contents["big.shard"] = objects_of(7_000, 3_000)
    for name, objects in contents.items():
        write(d / name, objects)
    return d, contents


def _open(shard_dir, tmp_path, build=True):
    shards = open_shard_set([], shard_dir=str(shard_dir), cache_dir=str(tmp_path / "cache"))
    if build:
        assert shards.build_records() == len(shards.served())
    _close_python_opens(shards)
    return shards


def _close_python_opens(shards):
    """Nothing open in Python (its resolver's table included): lookups go
    to the pool, through the records or opening shards."""
    for number, shard in list(shards.open_shards.items.items()):
        shards.open_table.set(number, None)
        shard.close()
    shards.open_shards.clear()


def _check_all(shards, contents, shard_dir):
    for name, objects in contents.items():
        for key, data in objects.items():
            found = shards.find(key)
            assert found is not None, name
            member, slot, offset, size = found
            assert member.path == str(shard_dir / name) and size == len(data)
            assert member.shard.pread(offset, size, 0, size) == data
    for i in range(100):
        assert shards.find(sha(b"absent %d" % i)) is None


def test_every_key_is_found_from_the_records_without_opening_a_shard(shard_dir, tmp_path):
    d, contents = shard_dir
    shards = _open(d, tmp_path)
    assert all(m.record is not None for m in shards.served())
    opens = shards.pool.stats()["opens"]
    for name, objects in contents.items():
        for key, data in objects.items():
            member, _, _, size = shards.find(key)
            assert member.path == str(d / name) and size == len(data)
    for i in range(100):
        assert shards.find(sha(b"absent %d" % i)) is None
    assert shards.pool.stats()["opens"] == opens and len(shards.open_shards) == 0
    _check_all(shards, contents, d)  # the bytes at the offsets the records gave
    shards.close()

    # A second open reuses the pack: nothing to build.
    again = _open(d, tmp_path, build=False)
    assert all(m.record is not None for m in again.served()) and not again.needs_record()
    again.close()


def test_a_record_made_before_a_takedown_while_unmounted_is_not_used(shard_dir, tmp_path):
    d, contents = shard_dir
    _open(d, tmp_path).close()
    victim = "s010.shard"
    gone = next(iter(contents[victim]))
    time.sleep(0.01)  # a new mtime
    assert shard_mod.delete(d / victim, [gone]) == 1
    shards = _open(d, tmp_path, build=False)
    member = shards.by_path[str(d / victim)]
    assert member.record is None and member in shards.needs_record()
    assert shards.find(gone) is None
    del contents[victim][gone]
    _check_all(shards, contents, d)
    shards.close()


def test_a_takedown_empties_the_slot_in_the_pack(shard_dir, tmp_path):
    d, contents = shard_dir
    shards = _open(d, tmp_path)
    member = shards.by_path[str(d / "big.shard")]
    keys = list(contents["big.shard"])[:3]
    other = shards.by_path[str(d / "s001.shard")]
    shards.records.delete(member, keys=keys + [next(iter(contents["s001.shard"]))])  # not in big: untouched
    for key in keys:
        assert shards.find(key) is None
    assert shards.find(next(iter(contents["s001.shard"]))) is not None
    # Seen by another process mapping the pack: a new set reading the same pack.
    fresh = _open(d, tmp_path, build=False)
    assert fresh.by_path[str(d / "big.shard")].record is not None
    assert all(fresh.find(key) is None for key in keys)
    del other
    fresh.close()
    shards.close()


def test_damaged_packs_give_right_answers_or_none(shard_dir, tmp_path):
    d, contents = shard_dir
    _open(d, tmp_path).close()
    directory = next((tmp_path / "cache").glob("lookup-*"))
    (pack_path,) = directory.glob("*.lkp")
    good = pack_path.read_bytes()
    rnd = random.Random(5)
    for round_ in range(20):
        data = bytearray(good)
        for _ in range(50):  # bytes of the records area (its directory stays sorted)
            data[rnd.randrange(64, len(data) - 40 * (SHARDS + 1))] = rnd.randrange(256)
        pack_path.write_bytes(bytes(data))  # a new file: the old mappings keep the old bytes
        shards = _open(d, tmp_path, build=False)
        # A damaged record fails its CRC and is not used: its shard answers.
        assert any(m.record is None for m in shards.served()), round_
        _check_all(shards, contents, d)
        shards.close()
    # Truncated: not a pack, left out; the shards are opened instead.
    pack_path.write_bytes(good[:len(good) // 2])
    with pytest.raises(CorruptShardError):
        LookupPack(str(pack_path))
    shards = _open(d, tmp_path, build=False)
    assert all(m.record is None for m in shards.served())
    _check_all(shards, contents, d)
    shards.close()


def test_packs_past_the_limit_are_merged(shard_dir, tmp_path, monkeypatch):
    d, contents = shard_dir
    monkeypatch.setattr(lookups, "MAX_PACKS", 3)
    shards = open_shard_set([], shard_dir=str(d), cache_dir=str(tmp_path / "cache"))
    members = shards.needs_record()
    for start in range(0, len(members), 10):
        shards.records.add_shards([(m, m.shard) for m in members[start:start + 10]], shards.served())
        assert len(shards.records.names()) <= 3
    shards.reload_records()
    assert all(m.record is not None for m in shards.served())
    _close_python_opens(shards)
    _check_all(shards, contents, d)
    shards.close()


def test_a_shard_on_a_block_device_gets_no_record(loop_device, tmp_path):
    """A block device written by another host (a shared RBD image) shows
    no new mtime or ctime here: a record stamped with them could not tell
    a takedown made there while no mount ran, so a device shard has none
    and its own index answers (here, after a delete made through this
    host's device node)."""
    from mounting import SHARDFS, run

    files = tmp_path / "files"
    files.mkdir()
    objects = {}
    for i, data in enumerate(objects_of(4_000, 20).values()):
        (files / f"f{i}").write_bytes(data)
        objects[sha(data)] = data
    assert run(SHARDFS + ["create", "--force", loop_device, str(files)]).returncode == 0
    cache = str(tmp_path / "cache")
    shards = open_shard_set([loop_device], cache_dir=cache)
    shards.build_records()
    (member,) = shards.served()
    assert member.record is None and not shards.needs_record()
    shards.close()
    gone = next(iter(objects))
    assert shard_mod.delete(loop_device, [gone]) == 1
    shards = open_shard_set([loop_device], cache_dir=cache)
    shards.build_records()
    _close_python_opens(shards)
    assert shards.find(gone) is None
    for key, data in list(objects.items())[1:]:
        assert shards.find(key)[3] == len(data)
    shards.close()


def test_a_warm_start_opens_no_unchanged_shard(shard_dir, tmp_path, caplog):
    """A second open of the same directory takes each shard whose file is
    unchanged (device, inode, size, mtime, ctime) from what the first
    validated, without opening it; a file replaced or touched since, or
    a damaged line of that cache, is opened and validated again."""
    from shardfs.lookups import KNOWN

    d, contents = shard_dir
    _open(d, tmp_path).close()
    warm = open_shard_set([], shard_dir=str(d), cache_dir=str(tmp_path / "cache"))
    assert len(warm.open_shards) == 0 and all(m.indexed and m.record for m in warm.served())
    _check_all(warm, contents, d)
    warm.close()
    # lines out of path order (as an older shardfs wrote them): the same
    known = next((tmp_path / "cache").glob("lookup-*")) / KNOWN
    lines = [line for line in known.read_bytes().split(b"\n") if line]
    assert lines == sorted(lines, key=lambda line: line.split(b" ", 10)[10]) and len(lines) == len(contents)
    known.write_bytes(b"\n".join(reversed(lines)) + b"\n")
    warm = open_shard_set([], shard_dir=str(d), cache_dir=str(tmp_path / "cache"))
    assert len(warm.open_shards) == 0 and len(warm.served()) == len(contents)
    warm.close()
    assert known.read_bytes() == b"\n".join(reversed(lines)) + b"\n"  # nothing changed: not rewritten

    # one replaced, one touched, one line of the cache damaged
    replaced, touched, damaged = "s001.shard", "s002.shard", "s003.shard"
    contents[replaced] = objects_of(9_001)
    write(tmp_path / "new.shard", contents[replaced])
    os.rename(tmp_path / "new.shard", d / replaced)
    os.utime(d / touched)
    lines = known.read_bytes().split(b"\n")
    (i,) = [j for j, line in enumerate(lines) if line.endswith(b"/" + damaged.encode())]
    lines[i] = lines[i].replace(b" 5 ", b" 6 ", 1)  # a count changed: its CRC no longer holds
    known.write_bytes(b"\n".join(lines))
    caplog.set_level(logging.DEBUG, logger="shardfs")
    caplog.clear()
    again = open_shard_set([], shard_dir=str(d), cache_dir=str(tmp_path / "cache"))
    # each shard says how it joined: those not opened, "known unchanged"
    joined = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving shard ")]
    assert len(joined) == len(contents)
    opened = {os.path.basename(m.split()[2]) for m in joined if "known unchanged" not in m}
    assert opened == {replaced, touched, damaged}, opened
    assert again.by_path[str(d / replaced)].record is None  # a new file: its record is to be written
    _check_all(again, contents, d)
    again.close()


@pytest.mark.parametrize("budget", ["all", "some"])
def test_a_cold_start_validates_each_shard_once_and_keeps_none_open(shard_dir, tmp_path, caplog,
                                                                    monkeypatch, budget):
    """A first open of a directory (empty cache directory) validates every
    file (probe_shards: the whole structure, as Shard does), indexes the
    valid shards at start and keeps none of them open; a truncated or
    corrupt file is refused with the error opening it gives. With a start
    budget too small for every shard, those past it are opened and kept
    as before; every key is found either way."""
    from shardfs import shardset

    d, contents = shard_dir
    if budget == "some":
        monkeypatch.setattr(shardset, "START_INDEX_SLOTS", 200)
    good = (d / "s010.shard").read_bytes()
    (d / "t-truncated.shard").write_bytes(good[:-7])
    (d / "t-corrupt.shard").write_bytes(good[:40] + b"\xff" * 8 + good[48:])
    errors = {}
    for name in ("t-truncated.shard", "t-corrupt.shard"):
        with pytest.raises(Exception) as exc:
            Shard(d / name)
        errors[name] = str(exc.value)
    caplog.set_level(logging.DEBUG, logger="shardfs")
    shards = open_shard_set([], shard_dir=str(d), cache_dir=str(tmp_path / "cache"))
    try:
        said = [r.getMessage() for r in caplog.records]
        for name, error in errors.items():
            assert f"{d / name}: not served: {error}" in said
        assert len(shards.served()) == len(contents)
        at_start = [m for m in said if m.startswith("serving shard ") and "indexed at start" in m]
        if budget == "all":
            assert len(at_start) == len(contents) and len(shards.open_shards) == 0
        else:
            assert 0 < len(at_start) < len(contents) and len(shards.open_shards) > 0
        for member in shards.served():
            with Shard(member.path) as shard:
                assert member.identity == sidecar.identity(shard)
                assert (member.objects_count, member.slot_count, member.extent) == \
                    (shard.header.objects_count, shard.slot_count, shard.extent)
        _check_all(shards, contents, d)
    finally:
        shards.close()
