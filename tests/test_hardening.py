"""Shards that change under a mount or an open Shard, and faults.

A shard is read through a shared mapping; when its file shrinks, touching a
page past the new end raises SIGBUS, which would kill the FUSE daemon and
every mount it serves. These tests truncate and overwrite shards while they
are open or mounted and check that the vanished bytes answer EIO while
everything else keeps working.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path

import pytest

from mounting import Mounter, build_shard, daemon_pids, key_of, make_blobs, mounted, run, SHARDFS

pyfuse3 = pytest.importorskip("pyfuse3")
shardfs = pytest.importorskip("shardfs")

needs_fuse = [
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse"),
    pytest.mark.skipif(shutil.which("fusermount3") is None, reason="needs fusermount3 (fuse3)"),
]


@pytest.fixture
def mounter():
    m = Mounter()
    yield m
    m.cleanup()


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_truncated_shard_api_raises_eio(tmp_path):
    """Every Shard call that touches the mapping of a truncated file raises
    OSError(EIO) instead of killing the process with SIGBUS."""
    path = tmp_path / "t.shard"
    objects = build_shard(path, make_blobs(1, 3000, 100, 3000))
    with shardfs.Shard(str(path)) as s:
        keys = list(objects)
        assert s[keys[0]] == objects[keys[0]]
        os.truncate(path, 4096)
        calls = [
            lambda: s.get(keys[1]),
            lambda: s.find(keys[2]),
            lambda: s.locate(keys[3]),
            lambda: s.slot_of(keys[4]),
            lambda: s.slot(s.slot_count - 1),
            lambda: list(s.scan(0, 100)),
            lambda: len(s),
            lambda: s.check(),
        ]
        for call in calls:
            with pytest.raises(OSError) as exc:
                call()
            assert exc.value.errno == errno.EIO
    # The process is alive and a valid shard still works.
    other = tmp_path / "u.shard"
    fine = build_shard(other, make_blobs(2, 10))
    with shardfs.Shard(str(other)) as s:
        assert all(s[k] == v for k, v in fine.items())


@pytest.mark.parametrize("how", ["truncate", "overwrite"])
def test_shard_changed_under_a_mount(tmp_path, mounter, how):
    """Two shards mounted; one is truncated (or its index and hash
    overwritten with random bytes) while mounted: its objects answer EIO
    (or are not found), the other shard's objects read correctly, the
    daemon survives and unmounts cleanly."""
    for mark in needs_fuse:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    a, b = tmp_path / "a.shard", tmp_path / "b.shard"
    objects_a = build_shard(a, make_blobs(3, 2000, 100, 5000, tag=b"a"))
    objects_b = build_shard(b, make_blobs(4, 2000, 100, 5000, tag=b"b"))
    point = mounter.mount([a, b], tmp_path / "mnt", "--layout", "flat",
                          "--cache-dir", str(tmp_path / "cache"))
    pids = daemon_pids(point)
    assert len(pids) == 1
    keys_a = list(objects_a)
    # Some objects of A read before the change (their pages may stay cached
    # by the kernel: keep_cache), the rest never touched.
    for key in keys_a[:20]:
        assert _read(point / key) == objects_a[key]
    with shardfs.Shard(str(a)) as s:
        index_position = s.header.index_position
    if how == "truncate":
        os.truncate(a, 4096)
    else:
        size = os.path.getsize(a)
        with open(a, "r+b") as f:
            f.seek(index_position)
            f.write(random.Random(5).randbytes(size - index_position))
    outcomes = {"ok": 0, "eio": 0, "enoent": 0, "wrong": 0}
    for key in keys_a[100:400]:
        try:
            data = _read(point / key)
        except OSError as exc:
            assert exc.errno in (errno.EIO, errno.ENOENT), exc
            outcomes["eio" if exc.errno == errno.EIO else "enoent"] += 1
        else:
            outcomes["ok" if data == objects_a[key] else "wrong"] += 1
    assert outcomes["wrong"] == 0, outcomes
    if how == "truncate":
        assert outcomes["eio"] == 300, outcomes  # every byte of A's index is gone
    # B is untouched and served as before.
    for key in list(objects_b)[:500]:
        assert _read(point / key) == objects_b[key]
    assert daemon_pids(point) == pids
    requests = json.loads(os.getxattr(point, "user.shardfs.requests"))
    assert requests["lookup"] > 0
    proc = run(SHARDFS + ["umount", point])
    assert proc.returncode == 0, proc.stderr
    assert not mounted(point)
