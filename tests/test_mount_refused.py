"""Mount and umount commands refused before anything reaches the kernel.

A bad mount point, a missing or corrupt shard, a refused or malformed
option, and ``shardfs umount`` of what is not a mount point: each fails
with one line on stderr, mounts nothing and leaves no daemon. None of
these needs /dev/fuse or root, so they run everywhere (the tests that
mount are in test_fuse.py and test_mount_scale.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from mounting import SHARDFS, build_shard, daemon_pids, make_blobs, mount_fails, mounted, one_error_line, run

shardfs = pytest.importorskip("shardfs")


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    """A valid shard of 300 small objects."""
    path = tmp_path_factory.mktemp("refused") / "small.shard"
    build_shard(path, make_blobs(3, 300, 0, 3000, tag=b"refused"))
    return path


def test_mount_onto_missing_directory(shard, tmp_path):
    point = tmp_path / "missing"
    mount_fails([str(shard), str(point)], str(point), "does not exist")
    assert not point.exists()


def test_mount_onto_non_empty_directory(shard, tmp_path):
    point = tmp_path / "full"
    point.mkdir()
    (point / "x").write_text("x")
    mount_fails([str(shard), str(point)], str(point), "not empty")
    assert not mounted(point)


def test_mount_onto_a_file(shard, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    mount_fails([str(shard), str(f)], "not a directory")


def test_mount_bad_option_fails_cleanly(shard, tmp_path):
    point = tmp_path / "m"
    point.mkdir()
    mount_fails(["-o", "no_such_option_xyz", str(shard), str(point)], "no_such_option_xyz")
    assert not mounted(point)
    assert daemon_pids(point) == []


def test_mount_missing_shard(tmp_path):
    point = tmp_path / "m"
    point.mkdir()
    mount_fails([str(tmp_path / "nope.shard"), str(point)], "nope.shard")
    assert not mounted(point)


@pytest.mark.parametrize("damage", ["magic", "truncated", "garbage", "index_position"])
def test_mount_corrupt_shard_fails_before_mounting(shard, tmp_path, damage):
    src = shard
    bad = tmp_path / "bad.shard"
    data = bytearray(src.read_bytes())
    if damage == "magic":
        data[0:8] = b"NOTSHARD"
    elif damage == "truncated":
        data = data[:200]
    elif damage == "garbage":
        data = bytearray(random.Random(5).randbytes(4096))
    elif damage == "index_position":
        # header field 5 (index_position) far past the end of the file
        data[32 + 4 * 8 : 32 + 5 * 8] = (1 << 50).to_bytes(8, "big")
    bad.write_bytes(bytes(data))
    point = tmp_path / "m"
    point.mkdir()
    mount_fails([str(bad), str(point)], "bad.shard")
    assert not mounted(point)
    assert daemon_pids(point) == []


def test_umount_not_a_mount_point(tmp_path):
    proc = run(SHARDFS + ["umount", str(tmp_path)])
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a mount point" in lines[0]
    proc = run(SHARDFS + ["umount", str(tmp_path / "missing")])
    assert proc.returncode != 0
    assert "not a mount point" in proc.stderr


@pytest.mark.parametrize("how", ["option", "-o"])
def test_bad_slicing_refused(shard, tmp_path, how):
    point = tmp_path / "m"
    point.mkdir()
    for slicing in ("2:4", "0:2/3:4", "0:8"):
        if how == "option":
            args = ["--layout", "fanout", "--slicing", slicing]
        else:
            args = ["-o", f"layout=fanout,slicing={slicing}"]
        proc = run(SHARDFS + ["mount", *args, shard, point])
        assert proc.returncode != 0
        line = one_error_line(proc)
        assert "slicing" in line and slicing in line, line
        assert not mounted(point)
        assert daemon_pids(point) == []


@pytest.mark.parametrize("opt", ["rw", "allow_other,rw", "suid", "dev"])
def test_write_options_refused(shard, tmp_path, opt):
    point = tmp_path / "m"
    point.mkdir()
    proc = run(SHARDFS + ["mount", "-o", opt, shard, point])
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert opt.split(",")[-1] in line and "ro,nosuid,nodev" in line, line
    assert not mounted(point) and daemon_pids(point) == []
