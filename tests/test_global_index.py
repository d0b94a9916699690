"""The global index of a mount (shardfs.gindex.IndexSet) and its use by
ShardSet and by real mounts: every key of every shard found while shards
arrive and leave and levels merge, absent keys not; a crash during a merge
leaves a usable index; a remount reuses the index."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mounting import SHARDFS, needs_fuse, run, wait_until
from shardfs import ShardWriter
from shardfs.shardset import ShardSet
from shardfs.gindex import MANIFEST, IndexSet, index_dir


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def build(path: Path, n: int, seed: int) -> list:
    """A shard of `n` objects derived from `seed`; returns their keys."""
    rnd = random.Random(seed)
    objects = [rnd.randbytes(rnd.randint(1, 48)) + b"%d/%d" % (seed, i) for i in range(n)]
    with ShardWriter(path) as w:
        for data in objects:
            w.add(sha(data), data)
    return [sha(d) for d in objects]


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """60 shards of 20..200 objects; returns (directory, {path: keys})."""
    base = tmp_path_factory.mktemp("many")
    shards = {}
    for i in range(60):
        p = base / f"s{i:03d}.shard"
        shards[str(p)] = build(p, 20 + 3 * i, i)
    return base, shards


def index_set(cache: Path) -> ShardSet:
    shards = ShardSet(cache_dir=str(cache))
    shards.index = IndexSet(index_dir(str(cache), "test scope"))
    shards.index.load()
    return shards


def index_pending(shards: ShardSet) -> None:
    todo = [(m.identity, m.shard) for m in shards.served() if not m.indexed]
    shards.index.add_shards(todo, [m.identity for m in shards.served()])
    shards.reload_index()


def check_all_found(shards: ShardSet, expected: dict) -> None:
    by_key = {}
    for path, keys in expected.items():
        for k in keys:
            by_key.setdefault(k, set()).add(path)
    for k, paths in by_key.items():
        found = shards.find(k)
        assert found is not None and found[0].path in paths, k.hex()
    rnd = random.Random(7)
    misses = sum(shards.find(rnd.randbytes(32)) is not None for _ in range(2000))
    assert misses == 0


def test_batches_merge_into_few_levels_and_every_key_is_found(many, tmp_path):
    base, expected = many
    shards = index_set(tmp_path / "cache")
    paths = sorted(expected)
    # Shards arrive in batches of growing size, as on a live directory.
    done = {}
    start = 0
    for size in (1, 1, 1, 2, 5, 10, 40):
        for p in paths[start:start + size]:
            shards.add(p)
            done[p] = expected[p]
        start += size
        index_pending(shards)
        assert all(m.indexed for m in shards.served())
        check_all_found(shards, done)
        counts = shards.index.stats()["levels"]
        # Each level is at least MERGE_FACTOR times the next one.
        assert all(a >= 8 * b for a, b in zip(counts, counts[1:])), counts
    assert len(shards.index.levels) <= 3
    # A shard added but not indexed yet is found through its own filter.
    extra = tmp_path / "late.shard"
    late = build(extra, 50, 999)
    shards.add(str(extra))
    assert not shards.get(max(m.number for m in shards.served())).indexed
    check_all_found(shards, {**done, str(extra): late})
    shards.close()


def test_removed_shard_is_masked_at_once_and_purged_by_a_merge(many, tmp_path):
    base, expected = many
    shards = index_set(tmp_path / "cache")
    for p in sorted(expected)[:20]:
        shards.add(p)
    index_pending(shards)
    gone = shards.by_path[sorted(expected)[5]]
    shards.remove(gone)
    for k in expected[gone.path]:
        found = shards.find(k)
        assert found is None or found[0] is not gone
    kept = {p: expected[p] for p in sorted(expected)[:20] if p != gone.path}
    check_all_found(shards, kept)
    # The next merges keep only served shards.
    for p in sorted(expected)[20:40]:
        shards.add(p)
    index_pending(shards)
    identities = set()
    for lv in shards.index.levels:
        identities.update(lv.index.identities())
    assert gone.identity not in identities or len(shards.index.levels) > 1
    check_all_found(shards, {**kept, **{p: expected[p] for p in sorted(expected)[20:40]}})
    shards.close()


def test_index_is_reused_from_disk_and_a_bad_manifest_is_rebuilt(many, tmp_path):
    base, expected = many
    cache = tmp_path / "cache"
    shards = index_set(cache)
    for p in sorted(expected):
        shards.add(p)
    index_pending(shards)
    names = shards.index.names()
    shards.close()
    again = index_set(cache)
    assert again.index.names() == names
    for p in sorted(expected):
        again.add(p)
    assert all(m.indexed for m in again.served())  # attached at add: nothing to build
    check_all_found(again, expected)
    again.close()
    (Path(again.index.directory) / MANIFEST).write_text("{not json")
    third = index_set(cache)
    assert third.index.names() == []
    for p in sorted(expected):
        third.add(p)
    check_all_found(third, expected)  # through the filters
    index_pending(third)
    check_all_found(third, expected)
    names = third.index.names()
    third.close()  # (closes its levels too)
    # A level written by an older shardfs (format version 1): refused at
    # open, the shards found through their filters and indexed again.
    for name in names:
        with open(Path(third.index.directory) / name, "r+b") as f:
            f.seek(8)
            f.write((1).to_bytes(4, "little"))
    fourth = index_set(cache)
    assert fourth.index.names() == []
    for p in sorted(expected):
        fourth.add(p)
    check_all_found(fourth, expected)
    index_pending(fourth)
    assert fourth.index.names() and all(m.indexed for m in fourth.served())
    check_all_found(fourth, expected)
    fourth.close()


_MERGER = """
import sys
sys.path.insert(0, {repo!r})
from shardfs.shardset import ShardSet
from shardfs.gindex import IndexSet
shards = ShardSet(cache_dir={cache!r})
shards.index = IndexSet({directory!r}); shards.index.load()
for p in {paths!r}:
    shards.add(p)
print("ready", flush=True)
shards.index.add_shards([(m.identity, m.shard) for m in shards.served() if not m.indexed],
                        [m.identity for m in shards.served()])
print("done", flush=True)
"""


def test_a_crash_during_a_build_leaves_a_usable_index(many, tmp_path):
    base, expected = many
    cache = tmp_path / "cache"
    shards = index_set(cache)
    first = sorted(expected)[:30]
    for p in first:
        shards.add(p)
    index_pending(shards)
    before = shards.index.names()
    directory = shards.index.directory
    shards.close()
    repo = str(Path(__file__).resolve().parent.parent)
    # Killed at random points of a build that adds 30 shards and merges.
    for delay in (0.0, 0.02, 0.05, 0.1):
        code = _MERGER.format(repo=repo, cache=str(cache), directory=directory, paths=sorted(expected))
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        survivor = index_set(cache)
        assert survivor.index.names() in (before, survivor.index.read_manifest())
        for p in sorted(expected):
            survivor.add(p)
        check_all_found(survivor, expected)  # indexed or through the filters
        survivor.close()
    final = index_set(cache)
    for p in sorted(expected):
        final.add(p)
    index_pending(final)
    assert all(m.indexed for m in final.served())
    check_all_found(final, expected)
    # Nothing but the manifest's levels, the manifest and the lock is left.
    left = set(os.listdir(final.index.directory))
    assert left == set(final.index.names()) | {MANIFEST, "LOCK"}
    final.close()


def _stats(point: Path) -> dict:
    return json.loads(os.getxattr(point, "user.shardfs.stats"))


@needs_fuse
def test_mount_indexes_its_shards_follows_changes_and_reuses_the_index(many, mounter, tmp_path):
    base, expected = many
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for p in sorted(expected)[:40]:
        os.link(p, shard_dir / Path(p).name)
    cache = tmp_path / "cache"
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "--layout", "flat",
                          "--cache-dir", str(cache))
    assert wait_until(lambda: (_stats(point)["index"] or {}).get("indexed_shards") == 40, timeout=30), \
        _stats(point)
    keys = [k for p in sorted(expected)[:40] for k in expected[p]]
    for k in keys[::7]:
        assert (point / k.hex()).stat().st_size > 0
    assert not (point / sha(b"absent").hex()).exists()
    # A shard arrives: found at once (its filter), then indexed.
    new = sorted(expected)[40]
    os.link(new, shard_dir / Path(new).name)
    assert wait_until(lambda: (point / expected[new][0].hex()).exists(), timeout=5)
    assert wait_until(lambda: _stats(point)["index"]["indexed_shards"] == 41, timeout=30)
    # A shard leaves: its keys are gone.
    old = sorted(expected)[0]
    os.unlink(shard_dir / Path(old).name)
    assert wait_until(lambda: not (point / expected[old][0].hex()).exists(), timeout=5)
    assert run(SHARDFS + ["umount", str(point)]).returncode == 0
    # Remount: the index on disk covers every shard from the start.
    point = mounter.mount([], tmp_path / "m2", "--shard-dir", str(shard_dir), "--layout", "flat",
                          "--cache-dir", str(cache))
    assert _stats(point)["index"]["indexed_shards"] == 40
    for p in sorted(expected)[1:41]:
        for k in expected[p][::5]:
            assert (point / k.hex()).exists()
