"""Shards in Ceph RBD images, on a live single-host cluster started by the
tests (tests/ceph_cluster.py): imported with `rbd import`, read by the
command line and a mount through rbd-fuse (each image a file), every byte
checked against the files the shard was made from. This is the naive way
of serving shards from Ceph, and the baseline of a librbd source."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from ceph_cluster import POOL, CephCluster, available
from mounting import SHARDFS, mounted, run, wait_until

pytestmark = pytest.mark.skipif(not available(), reason="Ceph is not installed (make test installs it)")

SOURCES = ["/usr/share/common-licenses", "/usr/share/doc/bash"]


@pytest.fixture(scope="module")
def ceph(tmp_path_factory):
    with CephCluster(tmp_path_factory.mktemp("ceph")) as cluster:
        yield cluster


@pytest.fixture
def rbd_fuse(ceph, tmp_path):
    """The pool's images as files under a rbd-fuse mount (read-only)."""
    point = tmp_path / "rbd"
    point.mkdir()
    proc = subprocess.Popen(["rbd-fuse", "-f", "-p", POOL, str(point), "-o", "ro"], env=ceph.env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: mounted(point) or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, proc.stderr.read()
        yield point
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(point)], capture_output=True)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _files() -> dict:
    out = {}
    for source in SOURCES:
        for root, _, names in os.walk(source):
            for name in names:
                path = os.path.join(root, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    out[hashlib.sha256(Path(path).read_bytes()).hexdigest()] = path
    return out


def test_a_shard_in_an_rbd_image_is_read_through_rbd_fuse(ceph, rbd_fuse, tmp_path, mounter):
    """`rbd import` of a shard made from real files, the image grown past
    the shard (as winery's images are larger than their shard): through
    rbd-fuse, `shardfs info`, `check --hash`, `ls` and `get` read it, and a
    shardfs mount of the image file serves every object, sha256sum-clean."""
    files = _files()
    shard = tmp_path / "docs.shard"
    run(SHARDFS + ["create", shard, *SOURCES], check=True)
    ceph.rbd("import", str(shard), f"{POOL}/docs")
    ceph.rbd("resize", "--size", str(os.path.getsize(shard) // (1 << 20) + 4) + "M", f"{POOL}/docs")
    image = rbd_fuse / "docs"
    assert wait_until(lambda: image.exists())
    assert os.path.getsize(image) > os.path.getsize(shard)
    info = run(SHARDFS + ["info", image], check=True).stdout
    assert f"live_objects: {len(files)}" in info
    assert "OK" in run(SHARDFS + ["check", "--hash", image], check=True).stdout
    keys = run(SHARDFS + ["ls", image], check=True).stdout.split()
    assert sorted(keys) == sorted(files)
    out = tmp_path / "out"
    run(SHARDFS + ["get", image, *keys, "-o", out], check=True)
    for key in keys:
        assert (out / key).read_bytes() == Path(files[key]).read_bytes()
    point = mounter.mount(image, tmp_path / "m", "--layout", "flat")
    sums = run(["sha256sum", *keys], cwd=point, check=True).stdout.split("\n")
    assert all(line.split()[0] == line.split()[1] for line in sums if line)
    assert sorted(os.listdir(point)) == sorted(files)
