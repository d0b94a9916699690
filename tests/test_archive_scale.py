"""A mount of 100,000 shards whose processes may each keep only about 64
open (RLIMIT_NOFILE forced low): every object is read by name, while shards
are added, removed and taken down; each process stays within its bound
(descriptors and mapped shards), and lookups are answered from the lookup
records (the pool opens no shard to stat a name).

The shards hold 2 tiny objects each (200,000 objects), written by two
processes: building them takes about 20 s here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mounting import SHARDFS, mount_processes, needs_fuse, run, wait_until

pytestmark = needs_fuse

SHARDS = 100_000
PER_SHARD = 2
#: RLIMIT_NOFILE of the mount: default_max_open() = 88 - 88 // 4 = 66
#: shards open per process (16 in Python's cache, 50 in the C pool).
LIMIT = 88
BOUND = LIMIT - LIMIT // 4


def blob(shard: int, j: int, tag: bytes = b"") -> bytes:
    return b"%s%d/%d:" % (tag, shard, j) + hashlib.sha256(b"%d.%d" % (shard, j)).digest()[: (shard + j) % 32]


WRITER = """
import hashlib, sys
sys.path.insert(0, {tests!r})
from shardfs import ShardWriter
from test_archive_scale import PER_SHARD, blob
d, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(lo, hi):
    with ShardWriter(f"{{d}}/s{{i:06d}}.shard") as w:
        for j in range(PER_SHARD):
            b = blob(i, j)
            w.add(hashlib.sha256(b).digest(), b)
"""


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """SHARDS shards in one directory."""
    d = tmp_path_factory.mktemp("archive") / "shards"
    d.mkdir()
    code = WRITER.format(tests=str(Path(__file__).parent))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d), str(SHARDS * p // 2), str(SHARDS * (p + 1) // 2)])
             for p in range(2)]
    assert all(p.wait(timeout=600) == 0 for p in procs)
    return d


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _stats(point: Path) -> dict:
    return json.loads(os.getxattr(point, "user.shardfs.stats"))


def _files_of(pid: int, d: Path) -> "tuple[int, int]":
    """(descriptors, distinct mapped files) of process `pid` under `d`."""
    fds = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds += os.readlink(f"/proc/{pid}/fd/{name}").startswith(str(d) + "/")
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as f:
        maps = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    return fds, sum(1 for m in maps if m.startswith(str(d) + "/"))


def _key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_100000_shards_read_whole_under_a_bound_of_64_while_they_change(archive, mounter, tmp_path):
    point = tmp_path / "m"
    log = tmp_path / "mount.log"
    proc = mounter.command(SHARDFS + ["mount", "--shard-dir", str(archive), "--layout", "flat", "--cache-dir",
                                      str(tmp_path / "cache"), "--log-file", str(log), str(point)], point,
                           preexec_fn=_limit, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert wait_until(lambda: (_stats(point)["records"] or {}).get("recorded_shards") == SHARDS, timeout=600), \
        _stats(point)

    # Lookups from the records: statting present names opens no shard.
    rnd = random.Random(1)
    sample = rnd.sample(range(SHARDS), 2_000)
    before = _stats(point)["pool"]["opens"]
    for i in sample:
        data = blob(i, 0)
        assert os.stat(point / _key(data)).st_size == len(data)
    assert _stats(point)["pool"]["opens"] == before

    # Changes made while every object is read: shards removed, added,
    # objects taken down.
    removed = set(rnd.sample(range(SHARDS), 100))
    downs = [i for i in rnd.sample(range(SHARDS), 30) if i not in removed][:20]
    added = list(range(SHARDS, SHARDS + 100))
    changing = removed | set(downs)
    errors, done = [], threading.Event()

    def read_all():
        order = list(range(SHARDS))
        random.Random(2).shuffle(order)
        try:
            for i in order:
                for j in range(PER_SHARD):
                    data = blob(i, j)
                    try:
                        got = (point / _key(data)).read_bytes()
                    except FileNotFoundError:
                        got = None
                    except OSError as exc:
                        got = exc
                    # a shard removed or written while its object is read:
                    # absent, or ESTALE (its file went between LOOKUP and READ)
                    gone = got is None or (isinstance(got, OSError) and got.errno == errno.ESTALE)
                    if got != data and not (gone and i in changing):
                        errors.append((i, j, i in changing, got))
        finally:
            done.set()

    reader = threading.Thread(target=read_all)
    reader.start()
    try:
        for i in sorted(removed):
            os.unlink(archive / f"s{i:06d}.shard")
        from shardfs import ShardWriter
        for i in added:
            tmp = archive / f".s{i:06d}.tmp"
            with ShardWriter(tmp) as w:
                for j in range(PER_SHARD):
                    data = blob(i, j, b"new")
                    w.add(bytes.fromhex(_key(data)), data)
            os.rename(tmp, archive / f"s{i:06d}.shard")
        for i in downs:
            r = run(SHARDFS + ["delete", "--yes", str(archive / f"s{i:06d}.shard"), _key(blob(i, 0))], timeout=120)
            assert r.returncode == 0, r.stderr
            assert not (point / _key(blob(i, 0))).exists(), (  # at once: told by shardfs delete
                r.stderr, [line for line in log.read_text().splitlines() if "takedown" in line][-3:])
    finally:
        reader.join(timeout=900)
    assert done.is_set() and not errors, (len(errors), errors[:5])

    # Once followed: the added shards are served, the removed ones are not.
    assert wait_until(lambda: all((point / _key(blob(i, 0, b"new"))).exists() for i in added), timeout=60)
    assert wait_until(lambda: not any((point / _key(blob(i, 0))).exists() for i in removed), timeout=60)
    for i in added:
        for j in range(PER_SHARD):
            data = blob(i, j, b"new")
            assert (point / _key(data)).read_bytes() == data
    for i in downs:
        assert not (point / _key(blob(i, 0))).exists()
        assert (point / _key(blob(i, 1))).read_bytes() == blob(i, 1)

    # Within the bound, every process, whatever was read.
    for pid in mount_processes(point):
        fds, maps = _files_of(pid, archive)
        assert len(os.listdir(f"/proc/{pid}/fd")) <= LIMIT, pid
        assert fds <= BOUND and maps <= BOUND, (pid, fds, maps)
    assert run(SHARDFS + ["umount", str(point)]).returncode == 0
