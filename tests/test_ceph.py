"""Shards in Ceph RBD images, on a live single-host cluster started by the
tests (tests/ceph_cluster.py), every byte checked against the files the
shard was made from: first the naive way (an image read as a file through
rbd-fuse), then `rbd:POOL/IMAGE` sources read through librbd by the API,
the command line and mounts, with the cluster's daemons stopped under them.
The API runs in child processes: librados keeps one client per process,
with the settings of its first connection."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ceph_cluster import POOL, CephCluster, available
from mounting import SHARDFS, files_by_key, mounted, run, wait_until

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
    with ceph.rbd_fuse(point) as images:
        yield images


def _files() -> dict:
    return files_by_key(SOURCES)


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


# ------------------------------------------------------------ rbd: sources (librbd)

#: librados's op timeouts in these tests (seconds): -o ceph_timeout=.
CEPH_TIMEOUT = 3
#: A read of an object not cached fails within this (seconds): the kernel
#: may ask twice (read-ahead, then the read itself), plus scheduling slack.
EIO_BOUND = 2 * CEPH_TIMEOUT + 4

needs_librbd = pytest.mark.skipif(
    not __import__("shardfs")._shardfs.RBD_BUILT, reason="shardfs built without librbd (make test installs librbd-dev)")


def _import(ceph, shard: Path, image: str, pool: str = POOL) -> None:
    """`rbd import` the shard, then grow the image past it."""
    ceph.rbd("import", str(shard), f"{pool}/{image}")
    ceph.rbd("resize", "--size", str(os.path.getsize(shard) // (1 << 20) + 4) + "M", f"{pool}/{image}")


def _docs_shard(tmp_path: Path) -> tuple:
    files = _files()
    shard = tmp_path / "docs.shard"
    run(SHARDFS + ["create", shard, *SOURCES], check=True)
    return shard, files


def _python(ceph, cache: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a new Python process (a librados client of its own,
    with this module's settings) after `shardfs.rbd.configure`."""
    prelude = ("import os, sys, time, errno, json, shardfs\n"
               "from shardfs import rbd\n"
               f"rbd.configure(conf={str(ceph.conf)!r}, cache_dir={str(cache)!r}, timeout={CEPH_TIMEOUT})\n")
    proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _resident_pages(path: Path) -> int:
    """Pages of `path` in the page cache (util-linux's fincore)."""
    return int(run(["fincore", "--noheadings", "--output", "PAGES", str(path)], check=True).stdout)


def _ceph_options(ceph, cache: Path) -> list:
    return ["-o", f"ceph_conf={ceph.conf},ceph_timeout={CEPH_TIMEOUT}", "--cache-dir", str(cache)]


@needs_librbd
def test_the_api_reads_every_object_from_an_rbd_image(ceph, tmp_path):
    """`Shard("rbd:POOL/IMAGE")`: the header of the file imported, every
    object's bytes (one by one and in a batch of asynchronous reads),
    `check(hash=True)` clean, a sha1 index built by reading the image; the
    local copy is sparse (its objects section a hole) and reused by the
    next open."""
    shard, files = _docs_shard(tmp_path)
    _import(ceph, shard, "api")
    cache = tmp_path / "cache"
    out = _python(ceph, cache, f"""
local = shardfs.Shard({str(shard)!r})
s = shardfs.Shard("rbd:{POOL}/api")
assert s.header == local.header and s.extent == local.extent and len(s) == len(local)
files = {files!r}
assert sorted(k.hex() for k in s) == sorted(files)
for key, path in files.items():
    assert s[bytes.fromhex(key)] == open(path, "rb").read(), key
keys = [bytes.fromhex(k) for k in files]
assert s.get_batch(keys) == [open(files[k.hex()], "rb").read() for k in keys]
assert s.check(hash=True) == []
from shardfs import hashes
import hashlib
hashes.build(s, ("sha1",), {str(cache)!r})
index = hashes.open_index(s, "sha1", {str(cache)!r})
data = open(next(iter(files.values())), "rb").read()
slot, offset, size = hashes.find(s, index, hashlib.sha1(data).digest())
assert s.pread(offset, size, 0, size) == data
copy = os.path.join({str(cache)!r}, "rbd", "{POOL}", "api.copy")
st = os.stat(copy)
ino = st.st_ino
s.close()
s = shardfs.Shard("rbd:{POOL}/api")
assert os.stat(copy).st_ino == ino and len(s) == len(local)
print(st.st_size, st.st_blocks * 512)
""")
    size, used = map(int, out.stdout.split())
    assert size > os.path.getsize(shard) * 0.99
    assert used < size / 4, "the local copy should hold no object bytes"


@needs_librbd
def test_lookups_cost_no_cluster_read_and_reads_fail_in_time(ceph, tmp_path):
    """With the OSD stopped, every lookup (presence, size, offset) still
    answers at once from the local copy, and an object read ahead before
    (`prefetch`: what a mount's LOOKUP does) is read from that; any other
    read fails with ETIMEDOUT within the configured timeout instead of
    hanging; once the OSD is back the same read returns the object."""
    shard, files = _docs_shard(tmp_path)
    _import(ceph, shard, "faults-api")
    ready = tmp_path / "ready"
    go = tmp_path / "go"
    script = f"""
s = shardfs.Shard("rbd:{POOL}/faults-api")
keys = [bytes.fromhex(k) for k in {sorted(files)!r}]
s[keys[0]]  # connected
ahead_at, ahead_size = s.locate(keys[2])
s.prefetch(ahead_at, ahead_size, ahead_size)  # read ahead now, taken by the read below
time.sleep(0.5)
open({str(ready)!r}, "w").close()
while not os.path.exists({str(go)!r}): time.sleep(0.05)
t = time.monotonic()
ahead = s.pread(ahead_at, ahead_size, 0, ahead_size).hex()
took_ahead = time.monotonic() - t
t = time.monotonic()
sizes = [s.size(k) for k in keys]
assert all(k in s for k in keys) and all(s.locate(k) for k in keys)
lookups = time.monotonic() - t
t = time.monotonic()
try:
    s[keys[1]]
    failed = None
except OSError as exc:
    failed = exc.errno
print(json.dumps({{"lookups": lookups, "read": time.monotonic() - t, "errno": failed, "sizes": sizes,
                  "ahead": ahead, "took_ahead": took_ahead}}))
open({str(ready)!r} + ".2", "w").close()
while not os.path.exists({str(go)!r} + ".2"): time.sleep(0.05)
print(len(s[keys[1]]))
"""
    prelude = ("import os, sys, time, json, shardfs\nfrom shardfs import rbd\n"
               f"rbd.configure(conf={str(ceph.conf)!r}, cache_dir={str(tmp_path / 'cache')!r}, timeout={CEPH_TIMEOUT})\n")
    proc = subprocess.Popen([sys.executable, "-c", prelude + script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=60), "never connected"
        assert proc.poll() is None, proc.communicate()
        with ceph.paused("osd"):
            go.touch()
            assert wait_until(lambda: Path(str(ready) + ".2").exists() or proc.poll() is not None,
                              timeout=EIO_BOUND + 30)
        Path(str(go) + ".2").touch()
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    first, second = stdout.splitlines()
    result = json.loads(first)
    assert result["lookups"] < 1.0, result
    assert result["errno"] == errno.ETIMEDOUT, result
    assert CEPH_TIMEOUT - 1 <= result["read"] <= EIO_BOUND, result
    local = __import__("shardfs").Shard(shard)
    keys = sorted(files)
    assert result["sizes"] == [local.size(bytes.fromhex(k)) for k in keys]
    # the object read ahead before the OSD stopped is served without it
    assert bytes.fromhex(result["ahead"]) == local[bytes.fromhex(keys[2])] and result["took_ahead"] < 1.0
    assert int(second) == local.size(bytes.fromhex(keys[1]))


@needs_librbd
def test_a_shard_with_deletes_written_through_librbd(ceph, tmp_path):
    """A shard with taken-down objects (their size fields zeroed, the gaps
    between offsets no longer the sizes), written into an image through
    librbd (rbd-fuse, read-write): each size comes from its size field,
    every live object reads back whole, the taken-down ones are absent."""
    shard, files = _docs_shard(tmp_path)
    gone = sorted(files)[::7]
    run(SHARDFS + ["delete", "--yes", shard, *gone], check=True)
    image = "deletes"
    ceph.rbd("create", "--size", str(os.path.getsize(shard) // (1 << 20) + 4) + "M", f"{POOL}/{image}")
    point = tmp_path / "rw"
    point.mkdir()
    with ceph.rbd_fuse(point, read_only=False, wait_for=image):
        run(["dd", f"if={shard}", f"of={point / image}", "bs=1M", "conv=notrunc,fsync", "status=none"], check=True)
    _python(ceph, tmp_path / "cache", f"""
s = shardfs.Shard("rbd:{POOL}/{image}")
files = {files!r}
gone = set({gone!r})
assert len(s) == len(files) - len(gone)
for key, path in files.items():
    k = bytes.fromhex(key)
    if key in gone:
        assert k not in s and s.get(k) is None
    else:
        assert s[k] == open(path, "rb").read(), key
assert s.check(hash=True) == []
""")


@needs_librbd
def test_bad_sources_give_one_line_errors(ceph, tmp_path):
    """A missing image or pool, an image that holds no shard (no local copy
    is left for it), a malformed source, a cluster that does not answer
    (within the timeout): one line each, exit status 1."""
    cache = tmp_path / "cache"
    ceph.rbd("create", "--size", "8M", f"{POOL}/zeros")
    opts = ["--ceph-conf", str(ceph.conf), "--ceph-timeout", str(CEPH_TIMEOUT), "--cache-dir", str(cache)]
    cases = {
        f"rbd:{POOL}/nothing": "no such image",
        "rbd:nopool/x": "no such pool",
        f"rbd:{POOL}/zeros": "not a Read Shard",
        f"rbd:{POOL}": "expected rbd:POOL/IMAGE",
    }
    for source, message in cases.items():
        proc = run(SHARDFS + ["get", *opts, source, "0" * 64])
        assert proc.returncode == 1, (source, proc.stderr)
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (source, proc.stderr)
    assert not (cache / "rbd" / POOL / "zeros.copy").exists()
    dead = tmp_path / "dead.conf"
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead.write_text(ceph.conf.read_text().replace(f"mon_host = v1:127.0.0.1:{ceph.port}/0",
                                                  f"mon_host = v1:127.0.0.1:{port}/0"))
    t = time.monotonic()
    proc = run(SHARDFS + ["info", "--ceph-conf", str(dead), "--ceph-timeout", str(CEPH_TIMEOUT), "--cache-dir",
                          str(tmp_path / "cache2"), f"rbd:{POOL}/anything"])
    assert proc.returncode == 1 and "timeout" in proc.stderr, proc.stderr
    assert time.monotonic() - t < EIO_BOUND + 5
    mp = tmp_path / "m"
    mp.mkdir()
    proc = run(SHARDFS + ["mount", *_ceph_options(ceph, cache), f"rbd:{POOL}/nothing", str(mp)])
    assert proc.returncode == 1 and "no such image" in proc.stderr and not mounted(mp), proc.stderr


@needs_librbd
def test_a_mount_serves_rbd_images_and_survives_a_stopped_cluster(ceph, tmp_path, mounter):
    """`shardfs mount rbd:POOL/IMAGE`: every object sha256sum-clean. Then the
    OSD stopped: cached objects still read, names still looked up, an object
    never read fails with EIO within the timeout bound (no hang); the OSD
    back, it reads whole. The monitor stopped: reads go on (the client
    talks to the OSD), and a new mount fails in one line within the bound."""
    shard, files = _docs_shard(tmp_path)
    _import(ceph, shard, "mounted")
    cache = tmp_path / "cache"
    point = mounter.mount(f"rbd:{POOL}/mounted", tmp_path / "m", *_ceph_options(ceph, cache), "--layout", "flat")
    keys = sorted(files)
    assert sorted(os.listdir(point)) == keys
    cached = keys[:20]
    for key in cached:
        assert hashlib.sha256((point / key).read_bytes()).hexdigest() == key
    # 5 objects with no page cached (reads in slot order push the next
    # slots' objects ahead: their pages are dropped here)
    cold, later = keys[20:25], keys[25:]

    def dropped() -> bool:
        for key in cold:
            fd = os.open(point / key, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        time.sleep(0.2)  # a push ahead still in flight would fill them again
        return all(_resident_pages(point / key) == 0 for key in cold)

    assert wait_until(dropped, timeout=30)
    with ceph.paused("osd"):
        for key in cached:
            assert hashlib.sha256((point / key).read_bytes()).hexdigest() == key
        assert all(os.stat(point / key).st_size == os.path.getsize(files[key]) for key in cold)
        t = time.monotonic()
        proc = run(["cat", str(point / cold[0])], timeout=EIO_BOUND + 30)
        took = time.monotonic() - t
        assert proc.returncode != 0 and "Input/output error" in proc.stderr, proc.stderr
        assert took <= EIO_BOUND, took
    assert wait_until(lambda: run(["cat", str(point / cold[0])]).returncode == 0, timeout=30)
    assert hashlib.sha256((point / cold[0]).read_bytes()).hexdigest() == cold[0]
    with ceph.paused("mon"):
        for key in cold[1:]:
            proc = run(["sha256sum", str(point / key)], timeout=EIO_BOUND + 30)
            assert proc.returncode != 0 or proc.stdout.split()[0] == key
        t = time.monotonic()
        proc = run(SHARDFS + ["mount", *_ceph_options(ceph, tmp_path / "cache2"), f"rbd:{POOL}/mounted",
                              str(tmp_path / "m2")], timeout=EIO_BOUND + 60)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert time.monotonic() - t < 2 * EIO_BOUND
    sums = run(["sha256sum", *later], cwd=point, check=True).stdout.splitlines()
    assert all(line.split()[0] == line.split()[1] for line in sums)


@needs_librbd
def test_a_pool_mount_follows_its_images(ceph, tmp_path, mounter):
    """`--shard-dir rbd:POOL`: the images there at mount are served; an
    image imported later is served within the poll bound, one removed
    (`rbd rm`) leaves the mount."""
    pool = "live"
    ceph.ceph("osd", "pool", "create", pool)
    ceph.rbd("pool", "init", pool)
    shards = {}
    for name, source in (("one", SOURCES[0]), ("two", SOURCES[1])):
        shards[name] = tmp_path / f"{name}.shard"
        run(SHARDFS + ["create", shards[name], source], check=True)
    keys = {name: run(SHARDFS + ["ls", path], check=True).stdout.split() for name, path in shards.items()}
    _import(ceph, shards["one"], "one", pool=pool)
    point = mounter.mount([], tmp_path / "m", "--shard-dir", f"rbd:{pool}", *_ceph_options(ceph, tmp_path / "cache"),
                          "--layout", "flat")
    assert sorted(os.listdir(point)) == sorted(keys["one"])
    _import(ceph, shards["two"], "two", pool=pool)
    assert wait_until(lambda: set(keys["two"]) <= set(os.listdir(point)), timeout=30)
    key = keys["two"][0]
    assert hashlib.sha256((point / key).read_bytes()).hexdigest() == key
    ceph.rbd("rm", f"{pool}/one")
    assert wait_until(lambda: not set(keys["one"]) & set(os.listdir(point)), timeout=30)
    assert sorted(os.listdir(point)) == sorted(keys["two"])


@needs_librbd
def test_a_winery_mount_reads_its_rbd_pool_through_librbd(ceph, winery, tmp_path, mounter):
    """A winery deployment made by swh-objstorage's own code, its images
    moved into the cluster as winery's rbd pool lays them out (pool
    `<pool_name>`, data in `<pool_name>-data`): `-o winery_rbd=librbd`
    serves them with nothing mapped (no /dev/rbd), every object sha256-clean,
    with the objects still in write shards from PostgreSQL; the API
    (WineryStore with pools_dir "rbd:") reads the same."""
    from test_winery import build

    data, where = build(winery, readonly=15, packed=10, written=5)
    data_pool = f"{winery.pool_name}-data"
    if data_pool not in ceph.ceph("osd", "pool", "ls").stdout.split():
        ceph.ceph("osd", "pool", "create", data_pool)
        ceph.rbd("pool", "init", data_pool)
    images = sorted(os.listdir(os.path.join(winery.pools_dir, winery.pool_name)))
    assert images
    for name in images:
        ceph.rbd("import", "--data-pool", data_pool, os.path.join(winery.pools_dir, winery.pool_name, name),
                 f"{winery.pool_name}/{name}")
    cache = tmp_path / "cache"
    point = mounter.mount([], tmp_path / "m", "--winery", winery.readonly_dsn, "-o",
                          f"winery_rbd=librbd,ceph_conf={ceph.conf},ceph_timeout={CEPH_TIMEOUT}",
                          "--cache-dir", str(cache))
    for key, content in data.items():
        path = point / key.hex()[:2] / key.hex()[2:4] / key.hex()
        assert path.read_bytes() == content, key.hex()
    assert sorted(os.listdir(cache / "rbd" / winery.pool_name)) == sorted(f"{n}.copy" for n in images)
    _python(ceph, tmp_path / "cache-api", f"""
from shardfs.winery import WineryStore, LIBRBD
import hashlib
with WineryStore({winery.readonly_dsn!r}, pools_dir=LIBRBD) as store:
    for key, content in {[(k.hex(), v) for k, v in data.items()]!r}:
        assert store.get(bytes.fromhex(key)) == content, key
""")


@needs_librbd
def test_damaged_and_stale_local_copies(ceph, tmp_path):
    """A local copy cut short is rebuilt at the next open; an image replaced
    under the same name by another shard is noticed at the first read of a
    process (its header differs from the copy's): reads fail with ESTALE
    naming the cause, never another shard's bytes."""
    shard, files = _docs_shard(tmp_path)
    other = tmp_path / "other.shard"
    run(SHARDFS + ["create", other, "/usr/share/doc/bash"], check=True)
    _import(ceph, shard, "stale")
    cache = tmp_path / "cache"
    copy = cache / "rbd" / POOL / "stale.copy"
    key = sorted(files)[0]
    _python(ceph, cache, f"assert shardfs.Shard('rbd:{POOL}/stale')[bytes.fromhex({key!r})]")
    ino = copy.stat().st_ino
    os.truncate(copy, copy.stat().st_size - 100)
    _python(ceph, cache, f"assert shardfs.Shard('rbd:{POOL}/stale')[bytes.fromhex({key!r})] == "
                         f"open({files[key]!r}, 'rb').read()")
    assert copy.stat().st_ino != ino
    ceph.rbd("rm", f"{POOL}/stale")
    _import(ceph, other, "stale")
    out = _python(ceph, cache, f"""
s = shardfs.Shard('rbd:{POOL}/stale')
try:
    s[bytes.fromhex({key!r})]
except OSError as exc:
    print(exc.errno, exc)
""").stdout
    assert out.startswith(f"{errno.ESTALE} ") and "remove the copy" in out, out


@needs_librbd
def test_the_objstorage_reads_rbd_sources(ceph, tmp_path):
    """swh's `get_objstorage("shardfs", ...)` with `shards: [rbd:POOL/IMAGE]`,
    `shard_dir: rbd:POOL2` and `ceph: {conf, timeout}`: every object by its
    swh id (get, get_batch, check)."""
    shard, files = _docs_shard(tmp_path)
    _import(ceph, shard, "objstorage")
    pool = "objstorage-dir"
    ceph.ceph("osd", "pool", "create", pool)
    ceph.rbd("pool", "init", pool)
    other = tmp_path / "other.shard"
    run(SHARDFS + ["create", other, "/usr/share/doc/bash"], check=True)
    _import(ceph, other, "other", pool=pool)
    more = {k: p for k, p in _files().items() if p.startswith("/usr/share/doc/bash/")}
    proc = subprocess.run([sys.executable, "-c", f"""
from swh.objstorage.factory import get_objstorage
storage = get_objstorage("shardfs", shards=["rbd:{POOL}/objstorage"], shard_dir="rbd:{pool}",
                         cache_dir={str(tmp_path / 'cache')!r}, ceph={{"conf": {str(ceph.conf)!r}, "timeout": {CEPH_TIMEOUT}}})
files = {dict(files, **more)!r}
ids = [{{"sha256": bytes.fromhex(k)}} for k in files]
for obj_id, path in zip(ids, files.values()):
    assert storage.get(obj_id) == open(path, "rb").read()
    storage.check(obj_id)
assert list(storage.get_batch(ids)) == [open(p, "rb").read() for p in files.values()]
print(len(ids))
"""], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == len(set(files) | set(more))


@needs_librbd
def test_fstab_lines_name_an_image_or_a_pool(ceph, shardfs_helper_in_path, mounter, tmp_path):
    """`mount -t fuse.shardfs -o ro,ceph_conf=... rbd:POOL/IMAGE MP` (an
    fstab line) mounts the image; `rbd:POOL` mounts the pool's images."""
    shard, files = _docs_shard(tmp_path)
    _import(ceph, shard, "fstab")
    opts = f"ro,ceph_conf={ceph.conf},ceph_timeout={CEPH_TIMEOUT},cache_dir={tmp_path / 'cache'},layout=flat"
    point = tmp_path / "m"
    proc = mounter.command(["mount", "-t", "fuse.shardfs", "-o", opts, f"rbd:{POOL}/fstab", str(point)], point)
    assert proc.returncode == 0, proc.stderr
    key = sorted(files)[3]
    assert (point / key).read_bytes() == Path(files[key]).read_bytes()
    assert sorted(os.listdir(point)) == sorted(files)
    assert run(["umount", str(point)]).returncode == 0
    proc = mounter.command(["mount", "-t", "fuse.shardfs", "-o", opts, f"rbd:{POOL}", str(point)], point)
    assert proc.returncode == 0, proc.stderr
    assert (point / key).read_bytes() == Path(files[key]).read_bytes()


@needs_librbd
def test_open_images_are_bounded(ceph, tmp_path):
    """30 images read in turn by 4 threads with `max_images=8`: every object
    whole, and never more than 8 images open once the reads are done (the
    least recently used idle ones closed, and opened again when read)."""
    from mounting import build_shard

    names, objects = [], {}
    for i in range(30):
        path = tmp_path / f"s{i}.shard"
        objects[f"bound{i}"] = build_shard(path, [f"object {i} {j} ".encode() * (50 + j) for j in range(5)])
        ceph.rbd("import", "--no-progress", str(path), f"{POOL}/bound{i}")
        names.append(f"bound{i}")
    out = _python(ceph, tmp_path / "cache", f"""
import threading
rbd.configure(conf={str(ceph.conf)!r}, cache_dir={str(tmp_path / 'cache')!r}, timeout={CEPH_TIMEOUT}, max_images=8)
objects = {{name: {{bytes.fromhex(k): v for k, v in objs.items()}} for name, objs in {objects!r}.items()}}
shards = {{name: shardfs.Shard(f"rbd:{POOL}/" + name) for name in objects}}
most = []
def work(t):
    for turn in range(3):
        for i, (name, objs) in enumerate(objects.items()):
            if (i + t) % 2:
                continue
            for key, data in objs.items():
                assert shards[name][key] == data
            most.append(rbd.open_images())
threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(max(most), rbd.open_images())
""")
    peak, after = map(int, out.stdout.split())
    assert after == 8, out.stdout  # the 8 used last stay open
    assert peak <= 8 + 4, out.stdout  # plus the images of reads in flight
