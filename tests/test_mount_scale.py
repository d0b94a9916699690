"""Mounts at scale, through the command line and ordinary tools.

What test_fuse.py does for one shard, done here for what a production mount
looks like: many shards as one tree (``shardfs mount A B C MP`` and
``--shard-dir``), shards arriving and leaving while mounted, sidecars that
keep lookups from probing every shard, fan-out layouts, listings that resume
exactly, a million objects, mirroring 100,000 objects with rsync and tar,
shards on block devices, metadata, mount options and fstab.

Every check uses real mounts (``python -m shardfs mount``, the mount helper
form, ``mount -t fuse.shardfs``) and real tools (ls, find, rsync, tar,
sha256sum, du, losetup); nothing is mocked. Every mount is torn down in a
fixture finalizer, with ``fusermount3 -uz`` as the last resort; every loop
device is detached; every subprocess has a timeout.

Shards are built once per module and shared; the big ones (1,000,000 and
100,000 objects) hold tiny objects so that building them takes seconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import os
import random
import shutil
import signal
import stat
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import pytest
from mounting import (
    SHARDFS,
    TIMEOUT,
    bash,
    build_shard,
    daemon_pids,
    force_unmount,
    gone,
    key_of,
    make_blobs,
    mount_info,
    mounted,
    needs_fuse,
    one_error_line,
    run,
    wait_until,
)

pytestmark = needs_fuse

shardfs = pytest.importorskip("shardfs")

LONG_TIMEOUT = 300  # find over a million entries, rsync/tar of 100,000 files
LIVE_DELAY = 5.0  # seconds a shard directory change may take to show
STATS_XATTR = "user.shardfs.stats"
SHARD_XATTR = "user.shardfs.shard"
OFFSET_XATTR = "user.shardfs.offset"

#: Timings of the slow steps, printed with -s (for the report).
TIMINGS: Dict[str, float] = {}


# ------------------------------------------------------------------ helpers


def timed_wait(predicate: Callable[[], bool], timeout: float = LIVE_DELAY) -> float:
    """Seconds until `predicate()` holds; fails after `timeout`."""
    start = time.monotonic()
    assert wait_until(predicate, timeout, interval=0.05), f"not true after {timeout} s"
    return time.monotonic() - start


def stats(mountpoint: os.PathLike) -> Dict[str, int]:
    return json.loads(os.getxattr(mountpoint, STATS_XATTR))


def read_or_none(path: os.PathLike) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def readable(path: os.PathLike, data: bytes) -> Callable[[], bool]:
    return lambda: read_or_none(path) == data


def absent(path: os.PathLike) -> Callable[[], bool]:
    return lambda: not os.path.exists(path)


def find_files(mountpoint: os.PathLike, timeout: float = TIMEOUT) -> List[str]:
    """`find MP -type f` output, one path per entry."""
    return bash('find "$1" -type f', mountpoint, timeout=timeout).splitlines()


def ro_nosuid_nodev(mountpoint: os.PathLike) -> None:
    opts = mount_info(mountpoint)["options"]
    assert {"ro", "nosuid", "nodev"} <= set(opts), opts
    assert "rw" not in opts


@pytest.fixture(scope="module", autouse=True)
def _print_timings():
    """Print the timings of the slow steps at the end (seen with -s)."""
    yield
    for name, value in TIMINGS.items():
        print(f"\n  {name}: {value:.2f}" if isinstance(value, float) else f"\n  {name}: {value}", end="")
    print()


# ------------------------------------------------------------------- shards


def make_trio(d: Path, n: int, seed: int) -> SimpleNamespace:
    """Three shards a, b, c in `d` with overlapping keys: n distinct
    objects, 1.25 n copies. With i = 20 * index / n: a holds i in [0, 9),
    b [7, 16), c [14, 20) and [0, 1); so [0, 1) is in a and c, [7, 9) in a
    and b, [14, 16) in b and c."""
    blobs = make_blobs(seed, n, 0, 80)
    keys = [key_of(b) for b in blobs]
    part = n // 20

    def span(lo: int, hi: int) -> List[int]:
        return list(range(lo * part, hi * part))

    parts = {"a": span(0, 9), "b": span(7, 16), "c": span(14, 20) + span(0, 1)}
    paths, held = {}, {}
    for name, indexes in parts.items():
        paths[name] = d / f"{name}.shard"
        build_shard(paths[name], (blobs[i] for i in indexes))
        held[name] = {keys[i] for i in indexes}
    return SimpleNamespace(
        paths=paths, objects=dict(zip(keys, blobs)), keys=keys, held=held,
        in_ac=keys[0:part], in_ab=keys[7 * part:9 * part], in_bc=keys[14 * part:16 * part],
        only_c=keys[16 * part:20 * part], only_b=keys[9 * part:14 * part],
    )


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    """Three overlapping shards, 20,000 distinct objects (25,000 copies):
    for flat listings."""
    return make_trio(tmp_path_factory.mktemp("trio"), 20000, 11)


@pytest.fixture(scope="module")
def trio4k(tmp_path_factory):
    """The same with 4,000 distinct objects (5,000 copies): for fan-out
    walks, which cost a few round trips per directory."""
    return make_trio(tmp_path_factory.mktemp("trio4k"), 4000, 12)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One shard of 300 objects, sizes around 512 and a few larger ones."""
    d = tmp_path_factory.mktemp("small")
    rng = random.Random(3)
    blobs = [rng.randbytes(n) for n in (0, 1, 511, 512, 513, 4095, 4096, 4097, 70000, 300000)]
    blobs += make_blobs(4, 290, 1, 3000, tag=b"small")
    path = d / "small.shard"
    objects = build_shard(path, blobs)
    return SimpleNamespace(path=path, objects=objects)


@pytest.fixture(scope="module")
def trio_flat(trio, module_mounter, tmp_path_factory):
    point = tmp_path_factory.mktemp("trio-flat") / "m"
    module_mounter.mount([trio.paths[n] for n in "abc"], point, "--layout", "flat")
    return point


@pytest.fixture(scope="module")
def trio4k_fanout(trio4k, module_mounter, tmp_path_factory):
    point = tmp_path_factory.mktemp("trio4k-fanout") / "m"
    module_mounter.mount([trio4k.paths[n] for n in "abc"], point, "--layout", "fanout")
    # A fan-out directory lists the exact names of a shard once its sidecar
    # is ready (before, all the children it may have): wait for them, or the
    # listings depend on whether an earlier test's mount built them.
    assert wait_until(lambda: json.loads(os.getxattr(point, STATS_XATTR))["sidecars"] == 3, timeout=60)
    return point


@pytest.fixture(scope="module")
def small_mnt(small, module_mounter, tmp_path_factory):
    point = tmp_path_factory.mktemp("small-mnt") / "m"
    return module_mounter.mount([small.path], point)


# ------------------------------------------------------ 1. many shards, one tree


def test_many_shards_union_each_key_once(trio, trio_flat):
    """`mount a b c MP`: ls and find show the union of the three key sets,
    each key once, and every file's SHA-256 is its name."""
    point = trio_flat
    ro_nosuid_nodev(point)
    names = os.listdir(point)
    assert len(names) == len(set(names)) == len(trio.objects) == 20000
    assert set(names) == set(trio.objects)
    out = run(["ls", "-1", point], check=True).stdout.split()
    assert len(out) == 20000 and set(out) == set(trio.objects)
    paths = find_files(point)
    assert len(paths) == 20000
    assert {os.path.basename(p) for p in paths} == set(trio.objects)
    assert all(os.path.dirname(p) == str(point) for p in paths)
    _verify_copy(point, trio.objects)  # sha256sum of every file is its name
    for key in random.Random(1).sample(trio.keys, 500) + trio.in_ac[:50] + trio.in_bc[:50]:
        assert (point / key).read_bytes() == trio.objects[key]


def test_duplicated_key_comes_from_first_shard_given(trio, trio_flat, mounter, tmp_path):
    point = trio_flat
    expect = [(trio.in_ac, "a"), (trio.in_ab, "a"), (trio.in_bc, "b"), (trio.only_c, "c"), (trio.only_b, "b")]
    for keys, name in expect:
        for key in keys[:25] + keys[-25:]:
            assert os.getxattr(point / key, SHARD_XATTR).decode() == str(trio.paths[name]), key
    # the other order: c first now wins for keys held by a and c
    other = mounter.mount([trio.paths["c"], trio.paths["a"]], tmp_path / "m")
    for key in trio.in_ac[:50]:
        assert os.getxattr(other / key, SHARD_XATTR).decode() == str(trio.paths["c"])
        assert (other / key).read_bytes() == trio.objects[key]
    for key in trio.in_ab[:50]:  # b is not mounted: a serves these
        assert os.getxattr(other / key, SHARD_XATTR).decode() == str(trio.paths["a"])
    assert len(os.listdir(other)) == len(trio.held["a"] | trio.held["c"])


def test_shard_dir_serves_every_shard_and_skips_others(trio4k, mounter, tmp_path):
    """--shard-dir DIR serves each shard file in DIR (in name order), and
    skips a file that is not a shard and a hidden writer temporary file
    (here a complete, valid shard whose key must not show)."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for name in "abc":
        shutil.copyfile(trio4k.paths[name], shard_dir / f"{name}.shard")
    (shard_dir / "notes.txt").write_bytes(random.Random(1).randbytes(5000))
    hidden = build_shard(shard_dir / ".d.shard.tmp-Ab12Cd", [b"only in a hidden file"])
    log = tmp_path / "fuse.log"
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "--log-file", str(log))
    paths = find_files(point)
    assert len(paths) == len(set(paths)) == len(trio4k.objects) == 4000
    # --shard-dir defaults to the fan-out layout
    assert sorted(paths) == sorted(f"{point}/{k[:2]}/{k[2:4]}/{k}" for k in trio4k.objects)
    assert stats(point)["shards"] == 3
    for key in list(hidden):
        assert not os.path.exists(point / key)
    for key in trio4k.in_ac[:20]:
        assert os.getxattr(point / key, SHARD_XATTR).decode() == str(shard_dir / "a.shard")
        assert (point / key).read_bytes() == trio4k.objects[key]
    for key in trio4k.only_c[:20]:
        assert os.getxattr(point / key, SHARD_XATTR).decode() == str(shard_dir / "c.shard")
    text = log.read_text()
    assert "notes.txt: not served" in text
    assert ".tmp-" not in text  # hidden names are not even tried


# ------------------------------------------------------------- 2. live pickup


@pytest.fixture
def live(small, mounter, tmp_path):
    """A shard directory holding a copy of the small shard, mounted (live)
    with a log file."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    shutil.copyfile(small.path, shard_dir / "a.shard")
    log = tmp_path / "fuse.log"
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "--log-file", str(log))
    assert stats(point)["shards"] == 1
    return SimpleNamespace(dir=shard_dir, point=point, log=log, objects=small.objects)


def _new_objects(tag: bytes, count: int = 40) -> List[bytes]:
    return make_blobs(zlib.crc32(tag), count, 1, 5000, tag=tag)


def test_live_shard_published_by_rename(live):
    """ShardWriter writes a hidden temporary file and renames it: the new
    shard's keys become readable within seconds, without a remount."""
    blobs = _new_objects(b"renamed")
    key = key_of(blobs[7])
    assert not os.path.exists(live.point / key)  # also leaves a negative entry behind
    objects = build_shard(live.dir / "n.shard", blobs)
    TIMINGS["live: new shard readable after rename"] = timed_wait(readable(live.point / key, blobs[7]))
    for k, data in objects.items():
        assert (live.point / k).read_bytes() == data
    assert stats(live.point)["shards"] == 2
    assert (live.point / key[:2] / key[2:4] / key).read_bytes() == blobs[7]  # listed place too
    assert key in os.listdir(live.point / key[:2] / key[2:4])
    for k, data in list(live.objects.items())[:20]:  # the first shard still serves
        assert (live.point / k).read_bytes() == data


def test_live_shard_copied_in_shows_once_complete(live, tmp_path):
    """A shard copied in place (header first, sections later) is not served
    while incomplete, and is once complete; so is one copied with cp."""
    blobs = _new_objects(b"copied", 200)
    src = tmp_path / "src.shard"
    objects = build_shard(src, blobs)
    data = src.read_bytes()
    key = key_of(blobs[0])
    target = live.dir / "c.shard"
    with open(target, "wb") as f:  # the first half: a header, sections cut short
        f.write(data[: len(data) // 2])
    assert wait_until(lambda: "c.shard: not served" in live.log.read_text(), LIVE_DELAY)
    assert not os.path.exists(live.point / key)
    assert stats(live.point)["shards"] == 1
    with open(target, "ab") as f:
        f.write(data[len(data) // 2:])
    TIMINGS["live: completed copy readable"] = timed_wait(readable(live.point / key, blobs[0]))
    for k, v in objects.items():
        assert (live.point / k).read_bytes() == v
    # and with cp(1)
    blobs2 = _new_objects(b"cp", 200)
    src2 = tmp_path / "src2.shard"
    build_shard(src2, blobs2)
    run(["cp", src2, live.dir / "d.shard"], check=True)
    TIMINGS["live: cp'd shard readable"] = timed_wait(readable(live.point / key_of(blobs2[5]), blobs2[5]))
    assert stats(live.point)["shards"] == 3


def test_live_removed_shard_disappears_open_file_keeps_reading(live, tmp_path):
    """A shard removed from DIR stops being found within seconds; a file of
    it already open reads on, correctly, until closed. A key also held by
    a remaining shard is then served from that shard."""
    big = random.Random(9).randbytes(700_000)  # several FUSE reads
    blobs = _new_objects(b"removed") + [big]
    shared_key, shared = next(iter(live.objects.items()))
    blobs.append(shared)  # also in a.shard
    objects = build_shard(live.dir / "x.shard", blobs)
    other = key_of(blobs[3])
    timed_wait(readable(live.point / other, blobs[3]))
    big_key = key_of(big)
    # a.shard goes: its key also in x.shard is now served by x.shard
    a_only = [k for k in live.objects if k not in objects][:5]
    os.unlink(live.dir / "a.shard")
    TIMINGS["live: removed shard gone"] = timed_wait(absent(live.point / a_only[0]))
    for k in a_only:
        assert not os.path.exists(live.point / k)
    assert wait_until(lambda: os.getxattr(live.point / shared_key, SHARD_XATTR).decode()
                      == str(live.dir / "x.shard"), LIVE_DELAY)
    assert (live.point / shared_key).read_bytes() == shared
    # x.shard goes while one of its files is open, nothing of it read yet
    fd = os.open(live.point / big_key, os.O_RDONLY)
    try:
        head = os.read(fd, 1000)
        os.unlink(live.dir / "x.shard")
        timed_wait(absent(live.point / other))
        assert stats(live.point)["shards"] == 0
        chunks = [head]
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        assert b"".join(chunks) == big
        assert os.pread(fd, 100, 123456) == big[123456:123556]
    finally:
        os.close(fd)
    assert not os.path.exists(live.point / big_key)
    assert mounted(live.point)
    assert os.listdir(live.point) == []


def test_live_removed_shard_name_looked_up_just_before(live, tmp_path):
    """A name the kernel looked up just before its shard was removed (still
    in its 1 s entry cache) must not give EIO: either the bytes or ENOENT."""
    blobs = _new_objects(b"cached", 10)
    build_shard(live.dir / "y.shard", blobs)
    key = key_of(blobs[2])
    timed_wait(readable(live.point / key, blobs[2]))
    for attempt in range(2):
        if attempt:
            build_shard(live.dir / "y.shard", blobs)
            timed_wait(lambda: os.path.exists(live.point / key))
        os.stat(live.point / key)  # fresh dentry and inode in the kernel
        os.unlink(live.dir / "y.shard")
        assert wait_until(lambda: stats(live.point)["shards"] == 1, LIVE_DELAY)
        try:
            data = (live.point / key).read_bytes()
        except FileNotFoundError:
            pass
        else:
            assert data == blobs[2]
        timed_wait(absent(live.point / key))
    assert "Traceback" not in live.log.read_text()


def test_sighup_rescans_without_unmounting(live, tmp_path):
    """A change inotify cannot see (the target of a symlink in DIR
    completed elsewhere) is picked up on SIGHUP; the daemon stays."""
    blobs = _new_objects(b"sighup")
    src = tmp_path / "src.shard"
    build_shard(src, blobs)
    data = src.read_bytes()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = outside / "s.shard"
    target.write_bytes(data[:100])  # a header only
    os.symlink(target, live.dir / "s.shard")
    assert wait_until(lambda: "s.shard: not served" in live.log.read_text(), LIVE_DELAY)
    with open(target, "ab") as f:  # completed through a path DIR's watch does not see
        f.write(data[100:])
    key = key_of(blobs[1])
    time.sleep(1.5)
    assert not os.path.exists(live.point / key), "picked up without SIGHUP: the test proves nothing"
    pids = daemon_pids(live.point)
    assert len(pids) == 1
    os.kill(pids[0], signal.SIGHUP)
    TIMINGS["live: readable after SIGHUP"] = timed_wait(readable(live.point / key, blobs[1]))
    assert mounted(live.point) and not gone(pids[0])
    assert daemon_pids(live.point) == pids
    os.kill(pids[0], signal.SIGHUP)  # nothing changed: still mounted
    assert wait_until(lambda: live.log.read_text().count("got SIGHUP: rescanning") == 2, LIVE_DELAY), \
        "the second SIGHUP was not logged"
    assert mounted(live.point) and (live.point / key).read_bytes() == blobs[1]
    text = live.log.read_text()
    assert f"rescan of {live.dir}: 1 shard(s) added, 0 removed" in text


# ----------------------------------------------------------------- 3. sidecars


@pytest.fixture(scope="module")
def twenty(tmp_path_factory):
    """20 shards of 500 objects, no key shared."""
    d = tmp_path_factory.mktemp("twenty")
    paths, objects = [], {}
    for i in range(20):
        path = d / f"s{i:02d}.shard"
        objects.update(build_shard(path, make_blobs(100 + i, 500, 0, 100, tag=b"%d:" % i)))
        paths.append(path)
    return SimpleNamespace(paths=paths, objects=objects, cache=tmp_path_factory.mktemp("twenty-cache"))


def _reuse_sample(twenty: SimpleNamespace) -> List[str]:
    """Keys read after the remount (left out of the probe counts below:
    the kernel has them cached)."""
    return random.Random(2).sample(sorted(twenty.objects), 100)


def _sidecar_files(cache: Path) -> Dict[str, Tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in cache.glob("*.sidecar")}


@pytest.fixture(scope="module")
def twenty_mnt(twenty, module_mounter, tmp_path_factory):
    """The 20 shards mounted with their own cache directory, once every
    sidecar is built (what test_sidecars_built_then_reused checks)."""
    point = tmp_path_factory.mktemp("twenty-mnt") / "m"
    module_mounter.mount(twenty.paths, point, "--cache-dir", str(twenty.cache))
    wait_until(lambda: stats(point)["sidecars"] == 20, 60)
    return point


def test_sidecars_built_then_reused(twenty, twenty_mnt, tmp_path):
    point = twenty_mnt
    assert wait_until(lambda: stats(point)["sidecars"] == 20, 60), stats(point)
    s = stats(point)
    assert s["shards"] == s["sidecars"] == 20
    assert s["objects"] == 10000
    files = _sidecar_files(twenty.cache)
    assert len(files) == 20
    # Nothing else left behind but the directories of the global index and
    # of the lookup records, which hold only their levels or packs, their
    # manifest and their lock (and, for the records, what the mount
    # validated of each shard file: SHARDS).
    assert wait_until(lambda: (stats(point)["records"] or {}).get("recorded_shards") == 20, 60), stats(point)
    others = sorted(n for n in os.listdir(twenty.cache) if n not in files)
    assert [n.split("-")[0] for n in others] == ["index", "lookup"], others
    for n in others:
        kept = (".gidx" if n.startswith("index-") else ".lkp",)
        assert all(f.endswith(kept) or f in ("MANIFEST", "LOCK", "SHARDS") for f in os.listdir(twenty.cache / n))
    packs = {f: os.stat(twenty.cache / others[1] / f).st_mtime_ns for f in os.listdir(twenty.cache / others[1])}
    # a remount reuses them: ready at once, no file rewritten
    run(SHARDFS + ["umount", point], check=True)
    assert not mounted(point)
    proc = run(SHARDFS + ["mount", "--cache-dir", twenty.cache, *twenty.paths, point])
    assert proc.returncode == 0, proc.stderr
    s = stats(point)
    assert s["shards"] == s["sidecars"] == 20, s
    for key in _reuse_sample(twenty):
        assert (point / key).read_bytes() == twenty.objects[key]
    assert _sidecar_files(twenty.cache) == files
    assert (stats(point)["records"] or {}).get("recorded_shards") == 20  # at once: the packs are reused
    assert {f: os.stat(twenty.cache / others[1] / f).st_mtime_ns for f in os.listdir(twenty.cache / others[1])} == packs


def test_absent_keys_cost_almost_no_probes(twenty, twenty_mnt):
    """2,000 stat()s of absent keys over 20 shards: fewer than 200 index
    probes (without filters it would be 40,000); present keys: about one
    probe each."""
    point = twenty_mnt
    assert stats(point)["sidecars"] == 20
    rng = random.Random(77)
    before = stats(point)
    for _ in range(2000):
        name = rng.randbytes(32).hex()
        with pytest.raises(FileNotFoundError):
            os.stat(point / name)
    after = stats(point)
    lookups = after["lookups"] - before["lookups"]
    probes = after["index_probes"] - before["index_probes"]
    TIMINGS["absent: probes per 2000 lookups"] = probes
    assert lookups >= 2000
    assert probes < 0.1 * 2000, (probes, lookups)
    present = rng.sample(sorted(set(twenty.objects) - set(_reuse_sample(twenty))), 2000)
    before = stats(point)
    for key in present:
        assert os.stat(point / key).st_size == len(twenty.objects[key])
    after = stats(point)
    lookups = after["lookups"] - before["lookups"]
    probes = after["index_probes"] - before["index_probes"]
    TIMINGS["present: probes per 2000 lookups"] = probes
    assert lookups == 2000, lookups
    assert 2000 <= probes <= 1.05 * lookups, (probes, lookups)


# ------------------------------------------------------------------ 4. layouts


def test_fanout_layout(trio4k, trio4k_fanout):
    point = trio4k_fanout
    keys = sorted(trio4k.objects)
    tops = sorted({k[:2] for k in keys})
    assert sorted(os.listdir(point)) == tops  # only non-empty 2-hex directories
    walk = bash('cd "$1" && find . -mindepth 1 -printf "%y %p\\n"', point).splitlines()
    files = [p for t, p in (w.split() for w in walk) if t == "f"]
    dirs = {p for t, p in (w.split() for w in walk) if t == "d"}
    assert len(files) + len(dirs) == len(walk)
    assert len(files) == len(set(files)) == len(trio4k.objects)  # find MP -type f | wc -l
    assert sorted(files) == sorted(f"./{k[:2]}/{k[2:4]}/{k}" for k in keys)
    assert dirs == {f"./{k[:2]}" for k in keys} | {f"./{k[:2]}/{k[2:4]}" for k in keys}
    _verify_copy(point, keys, _fanout_place)
    by_leaf: Dict[str, List[str]] = {}
    for k in keys:
        by_leaf.setdefault(k[:4], []).append(k)
    busiest = max(by_leaf, key=lambda p: len(by_leaf[p]))
    for prefix in [busiest] + random.Random(5).sample(sorted(by_leaf), 30):
        leaf = point / prefix[:2] / prefix[2:4]
        assert sorted(os.listdir(leaf)) == by_leaf[prefix]
        assert sorted(os.listdir(point / prefix[:2])) == sorted({k[2:4] for k in keys if k[:2] == prefix[:2]})
    key = keys[1234]
    # found at the root by lookup, though not listed there
    assert (point / key).read_bytes() == trio4k.objects[key]
    assert key not in os.listdir(point)
    assert (point / key[:2] / key[2:4] / key).read_bytes() == trio4k.objects[key]
    # not in the wrong directory, nor in an inner one
    wrong = next(k for k in keys if not k.startswith("0000"))
    assert not os.path.exists(point / "00" / "00" / wrong)
    assert not os.path.exists(point / key[:2] / key)
    assert not os.path.exists(point / key[:2] / key[2:4] / key[:2])
    with pytest.raises(FileNotFoundError):
        open(point / "00" / "00" / wrong, "rb")


def test_fanout_custom_slicing(trio4k, mounter, tmp_path):
    point = mounter.mount([trio4k.paths[n] for n in "abc"], tmp_path / "m", "--layout", "fanout",
                          "--slicing", "0:1/1:3")
    keys = sorted(trio4k.objects)
    assert sorted(os.listdir(point)) == sorted({k[0] for k in keys})
    paths = find_files(point)
    assert sorted(paths) == sorted(f"{point}/{k[0]}/{k[1:3]}/{k}" for k in keys)
    key = keys[99]
    assert sorted(os.listdir(point / key[0] / key[1:3])) == [k for k in keys if k[:3] == key[:3]]
    assert (point / key).read_bytes() == trio4k.objects[key]


def test_default_layout(small, small_mnt, million, mounter, tmp_path):
    """auto: flat for a small single-shard mount, fan-out above 100,000
    objects."""
    assert sorted(os.listdir(small_mnt)) == sorted(small.objects)
    point = mounter.mount([million.path], tmp_path / "m")
    assert sorted(os.listdir(point)) == [f"{i:02x}" for i in range(256)]
    key = million.some_keys[0]
    assert (point / key[:2] / key[2:4] / key).read_bytes() == million.blob(0)


# ------------------------------------------------------------- 5. readdir resume


class _Dirent(ctypes.Structure):
    """struct dirent of glibc on x86_64 (d_name at offset 19)."""

    _fields_ = [
        ("d_ino", ctypes.c_uint64),
        ("d_off", ctypes.c_int64),
        ("d_reclen", ctypes.c_ushort),
        ("d_type", ctypes.c_ubyte),
        ("d_name", ctypes.c_char * 256),
    ]


@pytest.fixture(scope="module")
def libc():
    if sys.platform != "linux" or ctypes.sizeof(ctypes.c_long) != 8:
        pytest.skip("struct dirent layout of 64-bit Linux")
    assert _Dirent.d_name.offset == 19
    lib = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    lib.opendir.restype = ctypes.c_void_p
    lib.opendir.argtypes = [ctypes.c_char_p]
    lib.readdir.restype = ctypes.POINTER(_Dirent)
    lib.readdir.argtypes = [ctypes.c_void_p]
    lib.telldir.restype = ctypes.c_long
    lib.telldir.argtypes = [ctypes.c_void_p]
    lib.seekdir.restype = None
    lib.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.closedir.argtypes = [ctypes.c_void_p]
    return lib


def _read_dir(libc, path: os.PathLike, pos: Optional[int] = None, count: Optional[int] = None
              ) -> Tuple[List[str], int]:
    """Open `path`, seekdir to `pos`, read up to `count` names (all when
    None), telldir, closedir: (names, position)."""
    d = libc.opendir(os.fsencode(path))
    assert d, os.strerror(ctypes.get_errno())
    try:
        if pos is not None:
            libc.seekdir(d, pos)
        names = []
        while count is None or len(names) < count:
            ctypes.set_errno(0)
            ent = libc.readdir(d)
            if not ent:
                assert ctypes.get_errno() == 0, os.strerror(ctypes.get_errno())
                break
            name = ent.contents.d_name.decode()
            if name not in (".", ".."):
                names.append(name)
        return names, libc.telldir(d)
    finally:
        libc.closedir(d)


def _check_resume(libc, path: os.PathLike, expected: Iterable[str], cuts: Sequence[int], chunk: int) -> None:
    whole, _ = _read_dir(libc, path)
    assert len(whole) == len(set(whole))
    assert set(whole) == set(expected)
    for cut in cuts:
        first, pos = _read_dir(libc, path, count=cut)
        rest, _ = _read_dir(libc, path, pos=pos)
        assert first + rest == whole, cut
    # the whole listing in chunks, closing and reopening between them
    names: List[str] = []
    pos = None
    while True:
        part, pos = _read_dir(libc, path, pos=pos, count=chunk)
        names += part
        if len(part) < chunk:
            break
    assert names == whole


def test_readdir_resumes_exactly_flat_root(libc, trio, trio_flat):
    """~20,000 entries from 3 shards with duplicates: telldir, closedir,
    reopen, seekdir: nothing lost, nothing repeated."""
    _check_resume(libc, trio_flat, trio.objects, cuts=[1, 137, 1024, 9001, 19999, 20000], chunk=61)


def test_readdir_resumes_exactly_fanout_leaf(libc, trio, mounter, tmp_path):
    point = mounter.mount([trio.paths[n] for n in "abc"], tmp_path / "m", "--layout", "fanout",
                          "--slicing", "0:1")
    digit = max("0123456789abcdef", key=lambda c: sum(1 for k in trio.objects if k[0] == c))
    leaf_keys = sorted(k for k in trio.objects if k[0] == digit)
    assert len(leaf_keys) > 1000
    _check_resume(libc, point / digit, leaf_keys, cuts=[1, 50, 500, len(leaf_keys) - 1], chunk=97)
    assert _read_dir(libc, point / digit)[0] == leaf_keys  # a leaf lists by key


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    """A shard of 1,000,000 objects of 4 bytes (the counter)."""
    path = tmp_path_factory.mktemp("million") / "million.shard"
    start = time.monotonic()
    with shardfs.ShardWriter(str(path)) as w:
        sha = hashlib.sha256
        for i in range(1_000_000):
            data = i.to_bytes(4, "big")
            w.add(sha(data).digest(), data)
    TIMINGS["1M: build shard"] = time.monotonic() - start

    def blob(i: int) -> bytes:
        return i.to_bytes(4, "big")

    return SimpleNamespace(path=path, blob=blob, some_keys=[key_of(blob(i)) for i in range(10)])


def test_find_one_million_objects(million, mounter, tmp_path):
    point = mounter.mount([million.path], tmp_path / "m", "--layout", "flat")
    start = time.monotonic()
    out = bash('find "$1" -type f | wc -l', point, timeout=LONG_TIMEOUT)
    TIMINGS["1M: find | wc -l"] = time.monotonic() - start
    assert int(out) == 1_000_000
    for i, key in enumerate(million.some_keys):
        assert (point / key).read_bytes() == million.blob(i)
    start = time.monotonic()
    force_unmount(point)
    TIMINGS["1M: unmount"] = time.monotonic() - start


# ----------------------------------------------------------------- 6. mirroring


@pytest.fixture(scope="module")
def hundred_k(tmp_path_factory, module_mounter):
    """A shard of 100,000 objects of 0..299 bytes, mounted (auto layout:
    flat, 100,000 being the limit)."""
    d = tmp_path_factory.mktemp("hundred-k")
    path = d / "100k.shard"
    rng = random.Random(100)
    with shardfs.ShardWriter(str(path)) as w:
        keys = []
        for i in range(100_000):
            data = i.to_bytes(4, "big") + rng.randbytes(rng.randrange(0, 296))
            key = hashlib.sha256(data).digest()
            w.add(key, data)
            keys.append(key.hex())
    point = module_mounter.mount([path], d / "m")
    return SimpleNamespace(path=path, keys=keys, point=point)


def _flat_place(key: str) -> str:
    return key


def _fanout_place(key: str) -> str:
    return f"{key[:2]}/{key[2:4]}/{key}"


def _verify_copy(dest: Path, keys: Iterable[str], place: Callable[[str], str] = _flat_place) -> None:
    """Every file below `dest` is named by the SHA-256 of its content
    (sha256sum) and sits at place(name); the names are exactly `keys`."""
    out = bash('cd "$1" && find . -type f -print0 | xargs -0 -r sha256sum', dest, timeout=LONG_TIMEOUT)
    names = []
    for line in out.splitlines():
        digest, path = line.split(None, 1)
        assert path.lstrip("*") == "./" + place(digest), line
        names.append(digest)
    keys = list(keys)
    assert len(names) == len(keys)
    assert set(names) == set(keys)


def test_rsync_mirrors_100k_objects(hundred_k, tmp_path):
    assert mount_info(hundred_k.point) is not None
    start = time.monotonic()
    run(["rsync", "-a", f"{hundred_k.point}/", f"{tmp_path}/dest/"], check=True, timeout=LONG_TIMEOUT)
    TIMINGS["100k: rsync -a"] = time.monotonic() - start
    _verify_copy(tmp_path / "dest", hundred_k.keys)


def test_tar_mirrors_100k_objects(hundred_k, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    start = time.monotonic()
    bash('tar -C "$1" -cf - . | tar -C "$2" -xf -', hundred_k.point, dest, timeout=LONG_TIMEOUT)
    TIMINGS["100k: tar | tar"] = time.monotonic() - start
    _verify_copy(dest, hundred_k.keys)


def test_shardfs_ls_as_rsync_files_from(hundred_k, trio, trio_flat, tmp_path):
    """`shardfs ls SHARD` prints one key per line: a files-from list for a
    flat mount. A subset copies exactly that subset; a whole list of one of
    several mounted shards copies exactly that shard's objects."""
    listing = run(SHARDFS + ["ls", hundred_k.path], check=True).stdout.splitlines()
    assert sorted(listing) == sorted(hundred_k.keys)
    subset = [k for k in listing if k.startswith("a")]
    (tmp_path / "list").write_text("".join(k + "\n" for k in subset))
    run(["rsync", "-a", f"--files-from={tmp_path}/list", f"{hundred_k.point}/", f"{tmp_path}/d1/"],
        check=True, timeout=LONG_TIMEOUT)
    _verify_copy(tmp_path / "d1", subset)
    bash('"${@:3}" ls "$1" > "$2"', trio.paths["b"], tmp_path / "list-b", *SHARDFS)
    run(["rsync", "-a", f"--files-from={tmp_path}/list-b", f"{trio_flat}/", f"{tmp_path}/d2/"],
        check=True, timeout=LONG_TIMEOUT)
    _verify_copy(tmp_path / "d2", trio.held["b"])


# ------------------------------------------------------------- 7. block devices


def test_shard_on_a_loop_device(loop_device, mounter, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    rng = random.Random(6)
    expected = {}
    for i, size in enumerate([0, 1, 512, 4097, 100_000, 1 << 20] + [rng.randrange(1, 9000) for _ in range(40)]):
        data = rng.randbytes(size)
        (files / f"f{i}").write_bytes(data)
        expected[key_of(data)] = data
    # a device always "exists": create refuses it without --force, touching nothing
    proc = run(SHARDFS + ["create", loop_device, files])
    assert proc.returncode == 1
    assert "block device" in one_error_line(proc) and "--force" in proc.stderr
    with open(loop_device, "rb") as dev:
        assert dev.read(4096) == bytes(4096)
    proc = run(SHARDFS + ["create", "--force", loop_device, files])
    assert proc.returncode == 0, proc.stderr
    assert os.path.exists(loop_device) and stat.S_ISBLK(os.stat(loop_device).st_mode)
    info = dict(line.split(": ", 1) for line in run(SHARDFS + ["info", loop_device], check=True).stdout.splitlines())
    with open(loop_device, "rb") as dev:
        device_size = dev.seek(0, os.SEEK_END)
    assert device_size == 16 << 20
    assert 0 < int(info["extent"]) < device_size
    assert int(info["live_objects"]) == len(expected)
    assert run(SHARDFS + ["check", "--hash", loop_device]).returncode == 0
    point = mounter.mount([loop_device], tmp_path / "m")
    assert sorted(os.listdir(point)) == sorted(expected)
    for key, data in expected.items():
        assert (point / key).read_bytes() == data
    assert mount_info(point)["source"] == "shardfs:" + os.path.basename(loop_device)
    # a shard directory holding a symlink to the device
    shard_dir = tmp_path / "rbd"
    shard_dir.mkdir()
    os.symlink(loop_device, shard_dir / "image0")
    point2 = mounter.mount([], tmp_path / "m2", "--shard-dir", str(shard_dir))
    paths = find_files(point2)
    assert sorted(os.path.basename(p) for p in paths) == sorted(expected)
    for key, data in expected.items():
        assert (point2 / key[:2] / key[2:4] / key).read_bytes() == data
    key = next(iter(expected))
    assert os.getxattr(point2 / key, SHARD_XATTR).decode() == str(shard_dir / "image0")
    st = os.statvfs(point2)
    assert int(info["extent"]) <= st.f_blocks * st.f_frsize < device_size


# ------------------------------------------------------------------ 8. metadata


def test_offset_xattr_locates_the_bytes(trio, trio_flat):
    point = trio_flat
    sample = random.Random(8).sample(trio.keys, 300) + trio.in_ac[:20] + trio.in_bc[:20]
    for key in sample:
        shard_path = os.getxattr(point / key, SHARD_XATTR).decode()
        offset = int(os.getxattr(point / key, OFFSET_XATTR))
        size = os.stat(point / key).st_size
        with open(shard_path, "rb") as f:
            f.seek(offset - 8)
            head = f.read(8)
            data = f.read(size)
        assert data == trio.objects[key], key
        assert int.from_bytes(head, "big") == size  # the object's size field
    assert sorted(os.listxattr(point / sample[0])) == [OFFSET_XATTR, SHARD_XATTR]


def test_statfs_of_several_shards(trio, trio_flat):
    """f_files is the sum of the shards' live object counts (25,000: keys
    held twice count twice, so it is >= the 20,000 distinct objects);
    f_blocks * f_frsize covers the shards' extents, rounded up to 4 KiB
    each."""
    sv = os.statvfs(trio_flat)
    counts, extents = 0, 0
    for name in "abc":
        with shardfs.Shard(str(trio.paths[name])) as s:
            counts += len(s)
            extents += s.extent
    assert counts == 25000
    assert sv.f_files == counts >= len(trio.objects)
    assert extents <= sv.f_blocks * sv.f_frsize < extents + 3 * 4096
    assert sv.f_bfree == sv.f_bavail == sv.f_ffree == 0
    assert sv.f_flag & os.ST_RDONLY
    assert stats(trio_flat)["objects"] == counts


def test_du_agrees_with_sizes(small, small_mnt):
    for key, data in small.objects.items():
        if len(data) not in (0, 1, 511, 512, 513, 4095, 4096, 4097, 70000, 300000):
            continue
        apparent = run(["du", "--apparent-size", "-b", small_mnt / key], check=True).stdout.split()[0]
        assert int(apparent) == len(data)
        used = run(["du", "-B1", small_mnt / key], check=True).stdout.split()[0]
        assert int(used) == (len(data) + 511) // 512 * 512, len(data)


# ------------------------------------------------------------------- 9. options


def test_uid_gid_option(small, mounter, tmp_path):
    point = mounter.mount([small.path], tmp_path / "m", "--layout", "fanout", "-o", "uid=1234,gid=5678")
    owners = bash('find "$1" -printf "%U:%G %y\\n"', point).splitlines()
    assert {o.split()[0] for o in owners} == {"1234:5678"}
    kinds = [o.split()[1] for o in owners]
    assert kinds.count("f") == len(small.objects) and kinds.count("d") > 1
    key = next(iter(small.objects))
    st = os.stat(point / key)  # at the root, by lookup, too
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    ro_nosuid_nodev(point)


def test_allow_other_and_fsname(small, mounter, tmp_path):
    point = mounter.mount([small.path], tmp_path / "m", "-o", "allow_other,fsname=myshards")
    info = mount_info(point)
    assert "allow_other" in info["super"], info
    assert info["source"] == "myshards"
    assert info["fstype"] == "fuse.shardfs"
    ro_nosuid_nodev(point)
    # the default source, for comparison
    point2 = mounter.mount([small.path], tmp_path / "m2")
    assert mount_info(point2)["source"] == "shardfs:small.shard"
    assert "allow_other" not in mount_info(point2)["super"]
    ro_nosuid_nodev(point2)


def test_log_file_levels(small, mounter, tmp_path):
    key, data = next(iter(small.objects.items()))
    for debug, log in ((False, tmp_path / "info.log"), (True, tmp_path / "debug.log")):
        point = tmp_path / ("d" if debug else "i")
        extra = ["--log-file", str(log)] + (["--debug"] if debug else [])
        mounter.mount([small.path], point, *extra)
        assert (point / key).read_bytes() == data
        run(SHARDFS + ["umount", point], check=True)
        assert wait_until(lambda: "unmounted" in log.read_text())
        text = log.read_text()
        assert " INFO: mounted " in text and " INFO: serving " in text
        if debug:
            assert " DEBUG: " in text
        else:
            assert " DEBUG: " not in text


# ------------------------------------------------------ 10. fstab, mount helper


def test_mount_helper_form(small, mounter, tmp_path):
    """`shardfs SOURCE MP -o rw,dev,suid,...` (what mount.fuse3 runs): the
    rw,dev,suid mount adds are dropped; the mount is ro,nosuid,nodev."""
    point = tmp_path / "m"
    proc = mounter.command(SHARDFS + [small.path, point, "-o", "rw,dev,suid,allow_other"], point)
    assert proc.returncode == 0, proc.stderr
    ro_nosuid_nodev(point)
    assert "allow_other" in mount_info(point)["super"]
    assert sorted(os.listdir(point)) == sorted(small.objects)
    # a directory SOURCE is a shard directory (fan-out, followed live)
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    shutil.copyfile(small.path, shard_dir / "a.shard")
    point2 = tmp_path / "m2"
    proc = mounter.command(SHARDFS + [shard_dir, point2, "-o", "rw,dev,suid"], point2)
    assert proc.returncode == 0, proc.stderr
    ro_nosuid_nodev(point2)
    key = next(iter(small.objects))
    assert sorted(os.listdir(point2 / key[:2] / key[2:4])) == sorted(k for k in small.objects if k[:4] == key[:4])
    blob = b"arrives after the helper mount"
    build_shard(shard_dir / "b.shard", [blob])
    timed_wait(readable(point2 / key_of(blob), blob))


def test_mount_t_fuse_shardfs_and_umount(small, shardfs_helper_in_path, mounter, tmp_path):
    cache = tmp_path / "cache"
    point = tmp_path / "m"
    proc = mounter.command(["mount", "-t", "fuse.shardfs", "-o", f"layout=fanout,cache_dir={cache}",
                            small.path, point], point)
    assert proc.returncode == 0, proc.stderr
    info = mount_info(point)
    assert info["fstype"] == "fuse.shardfs" and info["source"] == "shardfs:small.shard"
    ro_nosuid_nodev(point)
    keys = sorted(small.objects)
    # Until its sidecar is ready, a shard's fan-out directories are all listed.
    assert wait_until(lambda: stats(point)["sidecars"] == 1, 60), stats(point)
    assert sorted(os.listdir(point)) == sorted({k[:2] for k in keys})  # layout=fanout applied
    assert (point / keys[0]).read_bytes() == small.objects[keys[0]]
    pids = daemon_pids(point)
    assert len(pids) == 1
    proc = run(["umount", point])
    assert proc.returncode == 0, proc.stderr
    assert not mounted(point)
    assert wait_until(lambda: gone(pids[0]))
    assert os.listdir(point) == []
    assert len(list(cache.glob("*.sidecar"))) == 1  # cache_dir= reached the daemon
    # a directory SOURCE, as in the fstab example
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    shutil.copyfile(small.path, shard_dir / "a.shard")
    point2 = tmp_path / "m2"
    proc = mounter.command(["mount", "-t", "fuse.shardfs", "-o", f"ro,allow_other,cache_dir={cache}",
                            shard_dir, point2], point2)
    assert proc.returncode == 0, proc.stderr
    ro_nosuid_nodev(point2)
    assert "allow_other" in mount_info(point2)["super"]
    assert len(find_files(point2)) == len(small.objects)
    blob = b"arrives after mount -t"
    build_shard(shard_dir / "b.shard", [blob])
    timed_wait(readable(point2 / key_of(blob), blob))
    assert run(["umount", point2]).returncode == 0
    assert not mounted(point2)


