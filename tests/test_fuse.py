"""End-to-end tests of the FUSE filesystem: real shards, real mounts.

Shards are built with shardfs.ShardWriter (keys are the SHA-256 of the
bytes, as in Software Heritage) and mounted through the command line
(``python -m shardfs mount``) exactly as a user would; the checks then use
ordinary tools (cat, ls, stat, sha256sum, cp, tar, rsync) and system calls.

Every mount made here is torn down in a fixture finalizer, with
``fusermount3 -uz`` as the last resort, so a failing test leaves no stale
mount behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List

import pytest
from mounting import (
    SHARDFS,
    TIMEOUT,
    build_shard,
    daemon_pids,
    kill_every_process,
    default_workers,
    mount_processes,
    worker_pids,
    gone,
    key_of,
    make_blobs,
    mount_info,
    mount_fails,
    mounted,
    needs_fuse,
    prefixed_blobs,
    run,
    wait_until,
)

pytestmark = needs_fuse

shardfs = pytest.importorskip("shardfs")

EMPTY_KEY = key_of(b"")
BIG_SIZE = 100 * 1000 * 1000  # the issue asks for a 100 MB object
# Sizes around the page size, the FUSE read size (128 KiB) and odd values.
SIZES = [0, 1, 2, 511, 512, 513, 4095, 4096, 4097, 65536, 131071, 131072, 131073, 1 << 20, (1 << 20) + 3]


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A shard with the tricky sizes plus a few hundred small objects
    (enough that a listing takes many readdir requests)."""
    rng = random.Random(20240501)
    blobs = [rng.randbytes(n) for n in SIZES]
    blobs += [rng.randbytes(rng.randrange(1, 3000)) for _ in range(400)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.shard"
    objects = build_shard(path, blobs)
    return path, objects


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A shard holding one 100 MB object (and a small one); returns
    (shard path, source file of the big object, its hex key)."""
    d = tmp_path_factory.mktemp("big")
    src = d / "big.bin"
    rng = random.Random(1234)
    h = hashlib.sha256()
    with open(src, "wb") as f:
        left = BIG_SIZE
        while left:
            chunk = rng.randbytes(min(left, 8 << 20))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    key = h.hexdigest()
    path = d / "big.shard"
    with shardfs.ShardWriter(str(path)) as w:
        w.add_file(bytes.fromhex(key), str(src))
        w.add(hashlib.sha256(b"small").digest(), b"small")
    return path, src, key


@pytest.fixture(scope="module")
def mnt(corpus, module_mounter, tmp_path_factory):
    """The corpus shard mounted in the background for the whole module."""
    path, objects = corpus
    point = tmp_path_factory.mktemp("mnt") / "m"
    module_mounter.mount(path, point)
    return point, objects


@pytest.fixture(scope="module")
def big_mnt(big, module_mounter, tmp_path_factory):
    path, src, key = big
    point = tmp_path_factory.mktemp("bigmnt") / "m"
    module_mounter.mount(path, point)
    evict_from_page_cache(path)  # reads must come from the device
    return point, src, key


def evict_from_page_cache(path: os.PathLike) -> None:
    """Drop the file's clean pages from the page cache (only this file), so
    the filesystem's reads are cold and take the worker-thread path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ reading


def test_mount_shows_in_mount_table(mnt, corpus):
    point, _ = mnt
    info = mount_info(point)
    assert info is not None
    assert info["fstype"] == "fuse.shardfs"
    assert info["source"] == "shardfs:" + corpus[0].name
    assert "ro" in info["options"]


def test_cat_every_object(mnt):
    point, objects = mnt
    for key, data in objects.items():
        with open(point / key, "rb") as f:
            assert f.read() == data, key
    # and through cat(1), for a handful including the empty one
    for key in list(objects)[:20] + [EMPTY_KEY]:
        out = subprocess.run(["cat", str(point / key)], capture_output=True, timeout=TIMEOUT, check=True).stdout
        assert out == objects[key]


def test_ls_lists_every_key_once(mnt):
    point, objects = mnt
    names = os.listdir(point)
    assert len(names) == len(set(names)) == len(objects)
    assert set(names) == set(objects)
    out = run(["ls", "-1", str(point)], check=True).stdout.split()
    assert sorted(out) == sorted(objects)
    # A second listing answers the same (kernel cache or not).
    assert sorted(os.listdir(point)) == sorted(objects)


def test_readdir_resumes_after_seekdir(mnt):
    """next_id lets a listing resume exactly where it stopped: telldir in
    the middle, read on, seekdir back, and the same entries follow."""
    point, objects = mnt
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

    class Dirent(ctypes.Structure):
        _fields_ = [
            ("d_ino", ctypes.c_uint64),
            ("d_off", ctypes.c_int64),
            ("d_reclen", ctypes.c_ushort),
            ("d_type", ctypes.c_ubyte),
            ("d_name", ctypes.c_char * 256),
        ]

    libc.opendir.restype = ctypes.c_void_p
    libc.opendir.argtypes = [ctypes.c_char_p]
    libc.readdir.restype = ctypes.POINTER(Dirent)
    libc.readdir.argtypes = [ctypes.c_void_p]
    libc.telldir.restype = ctypes.c_long
    libc.telldir.argtypes = [ctypes.c_void_p]
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    libc.closedir.argtypes = [ctypes.c_void_p]

    def read_all(d) -> List[tuple]:
        out = []
        while True:
            ent = libc.readdir(d)
            if not ent:
                return out
            out.append((ent.contents.d_name.decode(), ent.contents.d_ino))

    d = libc.opendir(str(point).encode())
    assert d
    try:
        first = [(libc.readdir(d).contents.d_name.decode()) for _ in range(137)]
        pos = libc.telldir(d)
        rest = read_all(d)
        libc.seekdir(d, pos)
        again = read_all(d)
        libc.seekdir(d, 0)
        whole = read_all(d)
    finally:
        libc.closedir(d)
    assert again == rest
    names = first + [n for n, _ in rest]
    assert len(names) == len(set(names)) == len(objects)
    assert [n for n, _ in whole] == names
    # readdir's inode numbers are the ones stat reports
    for name, ino in rest[:50]:
        assert os.stat(point / name).st_ino == ino


def test_stat_attributes(mnt, corpus):
    point, objects = mnt
    shard_mtime = os.stat(corpus[0]).st_mtime
    root = os.stat(point)
    assert stat.S_ISDIR(root.st_mode) and stat.S_IMODE(root.st_mode) == 0o555
    assert root.st_nlink == 2
    assert root.st_ino == 1
    assert abs(root.st_mtime - shard_mtime) < 1e-3
    for key, data in objects.items():
        st = os.stat(point / key)
        assert stat.S_ISREG(st.st_mode), key
        assert stat.S_IMODE(st.st_mode) == 0o444
        assert st.st_size == len(data)
        assert st.st_nlink == 1
        assert st.st_uid == os.getuid() and st.st_gid == os.getgid()
        assert st.st_blocks == (len(data) + 511) // 512
        assert abs(st.st_mtime - shard_mtime) < 1e-3
        assert abs(st.st_ctime - shard_mtime) < 1e-3
    # stat(1) agrees
    key = next(k for k, v in objects.items() if len(v) == 4097)
    out = run(["stat", "-c", "%s %a %F", str(point / key)], check=True).stdout.strip()
    assert out == "4097 444 regular file"


def test_inode_is_shard_number_and_slot(mnt, corpus):
    """An object's inode is (shard number + 1) << 32 | slot: stable across
    remounts, unique across shards."""
    point, objects = mnt
    with shardfs.Shard(str(corpus[0])) as s:
        for key in objects:
            assert os.stat(point / key).st_ino == (1 << 32) | s.slot_of(bytes.fromhex(key))


def test_inodes_stable_across_remount(corpus, mounter, tmp_path):
    path, objects = corpus
    point = tmp_path / "m"
    mounter.mount(path, point)
    before = {k: os.stat(point / k) for k in objects}
    assert len({st.st_ino for st in before.values()}) == len(objects)  # unique
    assert run(SHARDFS + ["umount", str(point)]).returncode == 0
    assert not mounted(point)
    mounter.mount(path, point)
    for k in reversed(list(objects)):  # other order: numbers do not depend on it
        st = os.stat(point / k)
        assert (st.st_ino, st.st_size, st.st_mode, st.st_mtime_ns) == (
            before[k].st_ino,
            before[k].st_size,
            before[k].st_mode,
            before[k].st_mtime_ns,
        )


def test_sha256sum_names_equal_sums(mnt):
    point, objects = mnt
    proc = run(["sh", "-c", 'cd "$1" && sha256sum -- *', "sh", str(point)], check=True)
    lines = proc.stdout.splitlines()
    assert len(lines) == len(objects)
    for line in lines:
        digest, name = line.split(None, 1)
        assert digest == name.lstrip("*")


def _assert_copy(dest: Path, objects: Dict[str, bytes]) -> None:
    names = sorted(os.listdir(dest))
    assert names == sorted(objects)
    for name in names:
        assert (dest / name).read_bytes() == objects[name], name


def test_cp_r_copies_everything(mnt, tmp_path):
    point, objects = mnt
    run(["cp", "-r", str(point), str(tmp_path / "copy")], check=True)
    _assert_copy(tmp_path / "copy", objects)


def test_tar_copies_everything(mnt, tmp_path):
    point, objects = mnt
    archive = tmp_path / "a.tar"
    run(["tar", "-C", str(point), "-cf", str(archive), "."], check=True)
    with tarfile.open(archive) as t:
        members = {m.name.lstrip("./"): m for m in t.getmembers() if m.isfile()}
        assert set(members) == set(objects)
        for name, m in members.items():
            assert m.size == len(objects[name])
            assert t.extractfile(m).read() == objects[name]


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync")
def test_rsync_copies_everything(mnt, tmp_path):
    point, objects = mnt
    dest = tmp_path / "r"
    run(["rsync", "-a", str(point) + "/", str(dest) + "/"], check=True)
    _assert_copy(dest, objects)
    st = os.stat(dest / next(iter(objects)))
    assert stat.S_IMODE(st.st_mode) == 0o444
    # nothing left to transfer on a second run
    again = run(["rsync", "-a", "--itemize-changes", str(point) + "/", str(dest) + "/"], check=True)
    assert [l for l in again.stdout.splitlines() if l and not l.startswith(".d")] == []


OFFSETS = [0, 1, 511, 4095, 4096, 4097, 65535, 131071, 131072, 131073, 1 << 20]
LENGTHS = [1, 7, 4096, 4097, 131072, 131073, 300000]


def _check_preads(fd: int, size: int, expect) -> None:
    offsets = sorted({o for o in OFFSETS if o <= size} | {max(size - 1, 0), size, size + 1, size + 4096})
    for off in offsets:
        for length in LENGTHS:
            got = os.pread(fd, length, off)
            assert got == expect(off, length), (off, length)


def test_reads_at_odd_offsets(mnt):
    point, objects = mnt
    for key, data in objects.items():
        if len(data) not in SIZES:
            continue
        fd = os.open(point / key, os.O_RDONLY)
        try:
            _check_preads(fd, len(data), lambda off, n: data[off : off + n])
        finally:
            os.close(fd)


def test_zero_byte_object(mnt):
    point, objects = mnt
    assert EMPTY_KEY in objects
    p = point / EMPTY_KEY
    assert os.stat(p).st_size == 0
    assert p.read_bytes() == b""
    fd = os.open(p, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 0) == b""
        assert os.pread(fd, 1, 1) == b""
    finally:
        os.close(fd)


def test_100mb_object(big_mnt):
    point, src, key = big_mnt
    p = point / key
    assert os.stat(p).st_size == BIG_SIZE
    h = hashlib.sha256()
    with open(p, "rb", buffering=0) as f:
        while True:
            chunk = f.read(4 << 20)
            if not chunk:
                break
            h.update(chunk)
    assert h.hexdigest() == key
    near_end = [BIG_SIZE - n for n in (1, 2, 4095, 4096, 4097, 131071, 131072, 131073, 1 << 20)]
    offsets = OFFSETS + [BIG_SIZE // 2 + 1, BIG_SIZE // 3] + near_end + [BIG_SIZE, BIG_SIZE + 1]
    fd = os.open(p, os.O_RDONLY)
    sfd = os.open(src, os.O_RDONLY)
    try:
        for off in offsets:
            for length in LENGTHS + [3 << 20]:
                assert os.pread(fd, length, off) == os.pread(sfd, length, off), (off, length)
    finally:
        os.close(fd)
        os.close(sfd)


def test_big_object_sha256sum(big_mnt):
    point, _, key = big_mnt
    out = run(["sha256sum", str(point / key)], check=True).stdout.split()[0]
    assert out == key


def test_concurrent_reads(mnt):
    """Many threads reading at once all get the right bytes."""
    import concurrent.futures

    point, objects = mnt
    keys = list(objects) * 3
    random.Random(7).shuffle(keys)

    def check(key: str) -> bool:
        with open(point / key, "rb") as f:
            return f.read() == objects[key]

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        assert all(pool.map(check, keys))


def test_cold_cache_lookups_and_reads(corpus, mounter, tmp_path):
    """With nothing of the shard in the page cache, lookups and reads take
    the worker-thread path; the answers are the same."""
    path, objects = corpus
    point = mounter.mount(path, tmp_path / "m")
    evict_from_page_cache(path)
    for key, data in objects.items():
        assert os.stat(point / key).st_size == len(data)
    evict_from_page_cache(path)
    for key, data in objects.items():
        assert (point / key).read_bytes() == data


@pytest.fixture
def loop_device(corpus, tmp_path):
    """The corpus shard at the start of a larger image, attached read-only
    to a loop device (shards live on block devices in production)."""
    if shutil.which("losetup") is None:
        pytest.skip("needs losetup")
    image = tmp_path / "disk.img"
    shutil.copyfile(corpus[0], image)
    with open(image, "ab") as f:
        f.truncate(os.path.getsize(image) + (8 << 20))  # the device is larger than the shard
    proc = run(["losetup", "--find", "--show", "--read-only", str(image)])
    if proc.returncode != 0:
        pytest.skip(f"cannot attach a loop device: {proc.stderr.strip()}")
    dev = proc.stdout.strip()
    yield dev
    run(["losetup", "-d", dev])


def test_shard_on_block_device(loop_device, corpus, mounter, tmp_path):
    point = mounter.mount(Path(loop_device), tmp_path / "m")
    objects = corpus[1]
    assert sorted(os.listdir(point)) == sorted(objects)
    for key, data in objects.items():
        assert (point / key).read_bytes() == data
    assert mount_info(point)["source"] == "shardfs:" + os.path.basename(loop_device)
    run(SHARDFS + ["umount", str(point)], check=True)


def test_statfs(mnt, corpus):
    point, objects = mnt
    sv = os.statvfs(point)
    assert sv.f_namemax == 64
    assert sv.f_files == len(objects)
    assert sv.f_bfree == 0 and sv.f_bavail == 0 and sv.f_ffree == 0
    with shardfs.Shard(str(corpus[0])) as s:
        assert sv.f_blocks * sv.f_frsize >= s.extent
    assert sv.f_flag & os.ST_RDONLY


def test_xattrs(mnt):
    point, objects = mnt
    p = point / next(iter(objects))
    with pytest.raises(OSError) as exc:
        os.getxattr(p, "user.anything")
    assert exc.value.errno == errno.ENODATA
    assert sorted(os.listxattr(p)) == ["user.shardfs.offset", "user.shardfs.shard"]
    with pytest.raises(OSError) as exc:
        os.getxattr(point, "user.anything")
    assert exc.value.errno == errno.ENODATA
    # asked again: ENODATA did not turn xattrs off (ENOSYS would)
    with pytest.raises(OSError) as exc:
        os.getxattr(point, "security.selinux")
    assert exc.value.errno == errno.ENODATA


def _requests(point: Path) -> Dict[str, int]:
    """The root's user.shardfs.requests: requests served, by kind."""
    import json

    return json.loads(os.getxattr(point, "user.shardfs.requests"))


def _grown(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    """Requests served between two readings of the requests xattr, less
    the GETXATTR of the second reading; kinds that did not grow left out."""
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    grown["getxattr"] = grown.get("getxattr", 0) - 1
    return {k: v for k, v in grown.items() if v}


def test_request_counts_xattr(corpus, mounter, tmp_path):
    """The root's user.shardfs.requests counts requests by kind, summed over
    the workers. Reading a fresh small object with Python's open() costs one
    LOOKUP and one IOCTL (CPython's buffered open() asks whether the file
    is a terminal; answered ENOTTY once the object's bytes are pushed into
    the page cache, so no READ follows). Objects are served in the kernel's
    no-open mode (OPEN answered ENOSYS): the mount sees one OPEN and at
    most one FLUSH in all, never a RELEASE."""
    path, objects = corpus
    point = tmp_path / "m"
    mounter.mount(path, point)
    assert "user.shardfs.requests" in os.listxattr(point)
    before = _requests(point)
    keys = [k for k, v in objects.items() if 0 < len(v) <= 4096][:20]
    for key in keys:
        assert (point / key).read_bytes() == objects[key]
    grown = _grown(before, _requests(point))
    assert grown.pop("open", 0) <= 1, grown
    assert grown.pop("flush", 0) <= 1, grown
    assert grown == {"lookup": len(keys), "ioctl": len(keys)}
    # Read again: names, attributes and pages are cached; only the IOCTLs
    # reach the mount.
    before = _requests(point)
    for key in keys:
        assert (point / key).read_bytes() == objects[key]
    assert _grown(before, _requests(point)) == {"ioctl": len(keys)}


def test_kernel_caches_names_and_negative_entries(corpus, mounter, tmp_path):
    """The timeouts the C request path puts in its replies: a name and its
    attributes are cached for CACHE_TIMEOUT (a year: a second stat after
    more than ENTRY_TIMEOUT sends nothing), the absence of a name for
    ENTRY_TIMEOUT only (asked again once it passed)."""
    import time

    from shardfs.fuse.handlers import CACHE_TIMEOUT, ENTRY_TIMEOUT

    assert CACHE_TIMEOUT >= 365 * 86400 and ENTRY_TIMEOUT <= 1.0
    path, objects = corpus
    point = mounter.mount(path, tmp_path / "m")
    keys = sorted(objects)[:10]
    absent = [hashlib.sha256(b"absent %d" % i).hexdigest() for i in range(10)]
    before = _requests(point)
    for key in keys:
        assert os.stat(point / key).st_size == len(objects[key])
    for name in absent:
        assert not os.path.exists(point / name)
    assert _grown(before, _requests(point)) == {"lookup": len(keys) + len(absent)}
    # Within ENTRY_TIMEOUT, both are answered by the kernel (retried if
    # this machine was too slow to ask twice within the timeout).
    for _ in range(5):
        t0 = time.monotonic()
        before = _requests(point)
        for key in keys:
            os.stat(point / key)
        for name in absent:
            assert not os.path.exists(point / name)
        grown = _grown(before, _requests(point))
        if time.monotonic() - t0 < ENTRY_TIMEOUT / 2:
            break
    assert grown == {}, grown
    time.sleep(ENTRY_TIMEOUT + 0.2)
    before = _requests(point)
    for key in keys:
        assert os.stat(point / key).st_size == len(objects[key])
    for name in absent:
        assert not os.path.exists(point / name)
    assert _grown(before, _requests(point)) == {"lookup": len(absent)}


def test_forget_then_lookup_again(corpus, mounter, tmp_path):
    """FORGET (answered in C, which keeps no per-inode state) of the inodes
    the kernel evicted: the names are looked up again and give the same
    inodes and bytes, since an inode carries its shard and slot."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop the kernel's inode cache")
    path, objects = corpus
    point = mounter.mount(path, tmp_path / "m")
    keys = sorted(objects)[:50]
    inodes = {k: os.stat(point / k).st_ino for k in keys}
    before = _requests(point)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")  # dentries and inodes: the kernel sends FORGET for ours
    assert wait_until(lambda: _requests(point).get("forget", 0) > before.get("forget", 0)), \
        "no FORGET reached the mount"
    lookups = _requests(point)["lookup"]
    assert {k: os.stat(point / k).st_ino for k in keys} == inodes
    assert _requests(point)["lookup"] > lookups
    for key in keys:
        assert (point / key).read_bytes() == objects[key]
    assert mounted(point)


# ------------------------------------------------------- names and errors


@pytest.mark.parametrize(
    "name",
    [
        "not-hex",
        "zz" * 32,
        "UPPER",  # replaced by the uppercase form of a real key
        "SHORT",  # 63 characters of a real key
        "LONG",  # a real key plus one character
        hashlib.sha256(b"not in the shard").hexdigest(),
        "x" * 300,
    ],
)
def test_bad_names_are_enoent(mnt, name):
    point, objects = mnt
    key = sorted(objects)[3]
    name = {"UPPER": key.upper(), "SHORT": key[:63], "LONG": key + "0"}.get(name, name)
    for _ in range(2):  # the second answer comes from the negative entry cache
        with pytest.raises(OSError) as exc:
            os.stat(point / name)
        assert exc.value.errno in (errno.ENOENT, errno.ENAMETOOLONG)
        if len(name) <= 255:
            assert exc.value.errno == errno.ENOENT
            with pytest.raises(FileNotFoundError):
                open(point / name, "rb")
    assert os.path.exists(point / key)


def _erofs(fn, *args) -> None:
    with pytest.raises(OSError) as exc:
        fn(*args)
    assert exc.value.errno == errno.EROFS, (fn, args, exc.value)


def test_writes_are_erofs(mnt):
    point, objects = mnt
    key = next(k for k, v in objects.items() if len(v) == 4096)
    p = str(point / key)
    other = str(point / "new-file")
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND):
        _erofs(os.open, p, flags)
    _erofs(os.open, other, os.O_WRONLY | os.O_CREAT, 0o644)
    _erofs(os.open, p, os.O_WRONLY | os.O_CREAT, 0o644)
    _erofs(os.unlink, p)
    _erofs(os.rename, p, other)
    _erofs(os.mkdir, str(point / "d"))
    _erofs(os.chmod, p, 0o644)
    _erofs(os.chown, p, 1, 1)
    _erofs(os.utime, p, (1, 1))
    _erofs(os.truncate, p, 0)
    _erofs(os.setxattr, p, "user.x", b"1")
    _erofs(os.removexattr, p, "user.x")
    _erofs(os.symlink, key, other)
    _erofs(os.link, p, other)
    _erofs(os.mknod, other, stat.S_IFIFO | 0o644)
    _erofs(os.chmod, str(point), 0o755)
    assert run(["touch", other]).returncode != 0
    # O_RDONLY | O_APPEND: in no-open mode the kernel no longer asks the
    # mount once it answered an OPEN, so the open may succeed (the mount is
    # read-only: not refused by the kernel); the descriptor cannot write.
    try:
        fd = os.open(p, os.O_RDONLY | os.O_APPEND)
    except OSError as exc:
        assert exc.errno == errno.EROFS
    else:
        try:
            with pytest.raises(OSError) as exc:
                os.write(fd, b"x")
            assert exc.value.errno == errno.EBADF
        finally:
            os.close(fd)
    # nothing changed
    assert (point / key).read_bytes() == objects[key]
    assert sorted(os.listdir(point)) == sorted(objects)


def test_write_requests_reaching_the_daemon_are_erofs(corpus, tmp_path):
    """A shardfs mount is read-only ("ro"), so the kernel refuses writes
    before they reach it. The C request path answers EROFS to every write
    request anyway (OPEN for writing, CREATE, WRITE, SETATTR, MKNOD, MKDIR,
    UNLINK, RMDIR, SYMLINK, RENAME, LINK, SETXATTR, REMOVEXATTR), without
    the Python handlers (which have none of them): checked here on a
    session mounted without "ro" in this process (the handlers' test used
    to call each write handler directly)."""
    import threading

    from shardfs._shardfs import Session
    from shardfs.fuse.handlers import CACHE_TIMEOUT, ENTRY_TIMEOUT, ShardFS
    from shardfs.fuse.layout import Layout
    from shardfs.shardset import ShardSet
    from shardfs.fuse.shared import REQUEST_KINDS

    path, objects = corpus
    key = sorted(objects)[0]
    point = tmp_path / "rw"
    point.mkdir()
    shards = ShardSet(cache_dir=str(tmp_path / "cache"))
    shards.add(str(path))
    fs = ShardFS(shards, layout=Layout.fanout())
    session = Session(fs, str(point), ["fsname=shardfs-rw-test", "subtype=shardfs", "default_permissions"],
                      os.getuid(), os.getgid(), CACHE_TIMEOUT, ENTRY_TIMEOUT)
    served = []
    thread = None
    try:
        assert session.answer_init(10.0)
        thread = threading.Thread(target=lambda: served.append(session.serve(2)), daemon=True)
        thread.start()
        assert "ro" not in mount_info(point)["options"]

        def counts() -> Dict[str, int]:
            return {k: n for k, n in zip(REQUEST_KINDS, session.counts()) if n}

        p = str(point / key)
        other = str(point / "new-file")
        # The first OPENs of the session reach C: refused for writing.
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_APPEND, os.O_WRONLY | os.O_APPEND):
            _erofs(os.open, p, flags)
        assert counts()["open"] == 4
        os.close(os.open(p, os.O_RDONLY))  # answered ENOSYS: no-open from now on
        assert counts()["open"] == 5
        # The kernel no longer asks: an open for writing succeeds, the
        # WRITE that follows reaches C and is refused.
        fd = os.open(p, os.O_WRONLY)
        try:
            _erofs(os.write, fd, b"x")
        finally:
            os.close(fd)
        assert counts()["open"] == 5
        _erofs(os.open, other, os.O_WRONLY | os.O_CREAT, 0o644)
        _erofs(os.truncate, p, 0)
        _erofs(os.chmod, p, 0o644)
        _erofs(os.utime, p, (1, 1))
        _erofs(os.mknod, other, stat.S_IFIFO | 0o644)
        _erofs(os.mkdir, str(point / "d"))
        _erofs(os.unlink, p)
        _erofs(os.rmdir, str(point / key[:2]))  # a fan-out directory
        _erofs(os.symlink, key, other)
        _erofs(os.rename, p, other)
        _erofs(os.link, p, other)
        _erofs(os.setxattr, p, "user.x", b"1")
        _erofs(os.removexattr, p, "user.x")
        got = counts()
        for kind in ("write", "create", "setattr", "mknod", "mkdir", "unlink", "rmdir", "symlink", "rename",
                     "link", "setxattr", "removexattr"):
            assert got.get(kind, 0) >= 1, (kind, got)
        assert (point / key).read_bytes() == objects[key]
        assert key in os.listdir(point / key[:2] / key[2:4])
    finally:
        run(["fusermount3", "-u", str(point)])
        if mounted(point):
            run(["fusermount3", "-uz", str(point)])
        if thread is not None:
            thread.join(TIMEOUT)
            assert not thread.is_alive(), "the session's loop did not end at unmount"
        session.unmount()
        fs.close()
        shards.close()
    assert served == [0]


# -------------------------------------------------- mount and unmount life


def test_umount_command(corpus, mounter, tmp_path):
    point = mounter.mount(corpus[0], tmp_path / "m")
    assert len(daemon_pids(point)) == 1
    assert len(worker_pids(point)) == default_workers()
    pids = mount_processes(point)
    proc = run(SHARDFS + ["umount", str(point)])
    assert proc.returncode == 0, proc.stderr
    assert not mounted(point)
    assert os.listdir(point) == []
    assert wait_until(lambda: all(gone(p) for p in pids)), "a mount process is still running"


def test_status_command(mounter, tmp_path):
    """``shardfs status`` tells what a mount serves and how far its
    background build is; --wait returns once every shard is in the global
    index and has a lookup record; errors are one line with status 1."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    objects = {}
    for i in range(12):
        objects.update(build_shard(shard_dir / f"{i:02}.shard", make_blobs(900 + i, 30 + i)))
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "--cache-dir", str(tmp_path / "c"))
    proc = run(SHARDFS + ["status", "--wait", "--timeout", "60", "--json", str(point)])
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["mountpoint"] == str(point) and st["shards"] == 12 and st["objects"] == len(objects)
    assert st["index"]["indexed_shards"] == 12
    assert st["records"]["recorded_shards"] == 12 and st["records"]["pending_shards"] == 0
    assert len(st["workers"]) == default_workers()
    text = run(SHARDFS + ["status", str(point)])
    assert text.returncode == 0 and text.stderr == ""
    lines = dict(line.split(":", 1) for line in text.stdout.splitlines())
    assert lines["shards"].strip() == f"12 ({len(objects):,} objects)"
    assert lines["global index"].strip().startswith("12 of 12 shards indexed")
    assert lines["lookup records"].strip().startswith("12 shards, 0 to write")
    assert lines["background build"].strip() == "complete"
    assert lines["version"].strip() == f"shardfs {shardfs.__version__}" and st["version"] == shardfs.__version__
    assert st["restarts"] == 0 and lines["workers"].strip().endswith("; 0 restarted")

    for where, why in ((tmp_path, "is not a mount point"), (Path("/proc"), "is not a shardfs mount")):
        bad = run(SHARDFS + ["status", str(where)])
        assert bad.returncode == 1 and bad.stdout == "" and why in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr

    pids = kill_every_process(point)
    assert wait_until(lambda: all(gone(p) for p in pids))
    stale = run(SHARDFS + ["status", str(point)])
    assert stale.returncode == 1 and "stale mount" in stale.stderr and "Traceback" not in stale.stderr
    assert run(SHARDFS + ["umount", str(point)]).returncode == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> Dict[str, Dict[tuple, float]]:
    """The mount's /metrics, parsed by prometheus_client's own parser:
    {sample name: {labels (sorted items): value}}."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Dict[str, Dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_endpoint(mounter, tmp_path):
    """``-o metrics=HOST:PORT`` serves Prometheus's text format at
    /metrics: requests by operation counted across the workers, shards and
    objects served, workers and their restarts; a bad address is a
    one-line error before mounting, an address in use a one-line error of
    the mount, which is then not left behind."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    objects = {}
    for i in range(3):
        objects.update(build_shard(shard_dir / f"{i}.shard", make_blobs(700 + i, 40)))
    port = _free_port()
    log = tmp_path / "mount.log"
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "-o",
                          f"workers=2,metrics=127.0.0.1:{port}", "--log-file", str(log))
    keys = sorted(objects)[:25]
    for key in keys:
        assert (point / key).read_bytes() == objects[key]
    assert wait_until(lambda: _scrape(port)["shardfs_shards"][()] == 3)
    m = _scrape(port)
    assert m["shardfs_objects"][()] == len(objects)
    assert m["shardfs_workers"][()] == 2 and m["shardfs_worker_restarts_total"][()] == 0
    requests = m["shardfs_requests_total"]
    assert requests[(("operation", "lookup"),)] >= len(keys)
    assert requests[(("operation", "mkdir"),)] == 0  # every kind, from the start
    assert m["shardfs_lookups_total"][()] >= len(keys)
    assert m["shardfs_build_info"][(("version", shardfs.__version__),)] == 1
    # the objects' bytes were answered or pushed into the page cache; no error answered
    assert m["shardfs_answered_bytes_total"][()] + m["shardfs_pushed_bytes_total"][()] >= \
        sum(len(objects[key]) for key in keys)
    assert m["shardfs_pushed_bytes_total"][()] > 0  # (CPython's open asks isatty: the object is pushed)
    assert m["shardfs_errors_total"][()] == 0
    # request durations: a histogram per kind, every lookup in it
    lookup = (("operation", "lookup"),)
    count = m["shardfs_request_duration_seconds_count"][lookup]
    assert count == requests[lookup] and 0 < m["shardfs_request_duration_seconds_sum"][lookup] < 60
    buckets = sorted((float(dict(labels)["le"]), v) for labels, v in m["shardfs_request_duration_seconds_bucket"].items()
                     if dict(labels)["operation"] == "lookup")
    assert len(buckets) == 20 and buckets[-1] == (float("inf"), count)
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))  # cumulative
    before = sum(requests.values())
    for key in sorted(objects)[25:35]:
        (point / key).read_bytes()
    assert sum(_scrape(port)["shardfs_requests_total"].values()) >= before + 20  # a lookup and a read each
    os.kill(worker_pids(point)[0], signal.SIGKILL)
    assert wait_until(lambda: _scrape(port)["shardfs_worker_restarts_total"][()] == 1), log.read_text()
    assert wait_until(lambda: _scrape(port)["shardfs_workers"][()] == 2)
    said = run(SHARDFS + ["status", "--json", str(point)])
    assert said.returncode == 0, said.stderr
    assert json.loads(said.stdout)["restarts"] == 1  # shardfs status says it too

    for bad in ("metrics=127.0.0.1:99999", "metrics=:80", "metrics=[nope]:80"):
        mount_fails([str(shard_dir / "0.shard"), str(tmp_path / "m2"), "-o", bad], "metrics=")
    (tmp_path / "m3").mkdir()
    taken = run(SHARDFS + ["mount", str(shard_dir / "0.shard"), str(tmp_path / "m3"), "-o",
                           f"metrics=127.0.0.1:{port}"])
    assert taken.returncode == 1 and "Address already in use" in taken.stderr, taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1 and "Traceback" not in taken.stderr
    assert not mounted(tmp_path / "m3")


def test_external_fusermount_unmount(corpus, mounter, tmp_path):
    """fusermount3 -u (not our command) also ends the daemon cleanly."""
    point = mounter.mount(corpus[0], tmp_path / "m")
    pids = mount_processes(point)
    run(["fusermount3", "-u", str(point)], check=True)
    assert not mounted(point)
    assert wait_until(lambda: all(gone(p) for p in pids))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_foreground_unmounts_on_signal(corpus, mounter, tmp_path, sig):
    point = tmp_path / "m"
    proc = mounter.foreground(corpus[0], point)
    key = sorted(corpus[1])[0]
    assert (point / key).read_bytes() == corpus[1][key]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert not mounted(point), "stale mount left after signal"
    assert not os.path.ismount(point)
    assert os.listdir(point) == []


def test_foreground_log_file(corpus, mounter, tmp_path):
    point = tmp_path / "m"
    log = tmp_path / "fuse.log"
    proc = mounter.foreground(corpus[0], point, "--log-file", str(log))
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0
    text = log.read_text()
    assert "mounted" in text and "unmounted" in text


def test_background_log_file_and_debug(corpus, mounter, tmp_path):
    """The daemon logs to --log-file (DEBUG with --debug) until unmounted."""
    log = tmp_path / "fuse.log"
    point = mounter.mount(corpus[0], tmp_path / "m", "--debug", "--log-file", str(log))
    key = sorted(corpus[1])[1]
    assert (point / key).read_bytes() == corpus[1][key]
    run(SHARDFS + ["umount", str(point)], check=True)
    assert wait_until(lambda: "unmounted" in log.read_text())
    text = log.read_text()
    assert "mounted" in text and "serving" in text and "DEBUG" in text


def test_killed_daemon_recovered_by_umount_or_a_new_mount(corpus, mounter, tmp_path):
    """kill -9 of every process of the mount at once (`pkill -9`, the
    host's OOM killer) leaves "Transport endpoint is not connected": a new
    mount over it clears the stale mount and serves; after another such
    kill, umount clears it."""
    path, objects = corpus
    key = next(iter(objects))
    point = mounter.mount(path, tmp_path / "m")
    processes = kill_every_process(point)
    assert wait_until(lambda: _stale(point))
    assert mounted(point)
    assert wait_until(lambda: all(gone(p) for p in processes)), "orphan worker"
    proc = run(SHARDFS + ["mount", str(path), str(point)])
    assert proc.returncode == 0, proc.stderr
    assert (point / key).read_bytes() == objects[key]
    kill_every_process(point)
    assert wait_until(lambda: _stale(point))
    proc = run(SHARDFS + ["umount", str(point)])
    assert proc.returncode == 0, proc.stderr
    assert not mounted(point)
    mounter.mount(path, point)  # usable again
    assert (point / key).read_bytes() == objects[key]


def _stale(point: Path) -> bool:
    try:
        os.statvfs(point)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def test_mount_onto_mounted_point(corpus, mounter, tmp_path):
    point = mounter.mount(corpus[0], tmp_path / "m")
    mount_fails([str(corpus[0]), str(point)], str(point), "already a mount point")
    assert mounted(point)
    assert len(os.listdir(point)) == len(corpus[1])  # the first mount still works


def test_mount_user_option_passed(corpus, mounter, tmp_path):
    point = mounter.mount(corpus[0], tmp_path / "m", "-o", "noatime,noexec")
    opts = mount_info(point)["options"]
    assert "noatime" in opts and "noexec" in opts and "ro" in opts


def test_corrupt_slot_under_a_mount(corpus, mounter, tmp_path):
    """A slot pointing outside the objects section: that object reads as EIO
    and is left out of listings; every other object and the daemon are fine."""
    path, objects = corpus
    bad = tmp_path / "bad.shard"
    shutil.copyfile(path, bad)
    keys = sorted(objects)
    victim = keys[0]
    with shardfs.Shard(str(bad)) as s:
        slot_offset = s.header.index_position + 40 * s.slot_of(victim) + 32
        outside = s.header.index_position + 8
    with open(bad, "r+b") as f:
        f.seek(slot_offset)
        f.write(outside.to_bytes(8, "big"))
    point = tmp_path / "m"
    mounter.mount(bad, point)
    with pytest.raises(OSError) as err:
        (point / victim).read_bytes()
    assert err.value.errno == errno.EIO
    assert sorted(os.listdir(point)) == keys[1:]
    assert (point / keys[1]).read_bytes() == objects[keys[1]]
    assert mounted(point)


def test_corrupt_slot_gives_the_same_answer_on_every_path(corpus, mounter, tmp_path):
    """A key held by two shards, whose slot in the first is corrupt: every
    lookup answers the object of the second, whichever path serves it: the
    first lookup in each worker, where no shard is open yet (the handlers
    open them), and the next ones, answered in C with both open; both are
    the one resolver now (ll_resolve.c). A key only the corrupt shard holds
    is EIO on both paths. (Read as a defect of the two implementations the
    request path had, C answering from the next shard where Python said
    EIO; this test passes on those too: the Python path also went on to the
    next shard.)"""
    path, objects = corpus
    keys = sorted(objects)
    victim, lonely = keys[0], keys[1]
    first = tmp_path / "a.shard"
    shutil.copyfile(path, first)
    with shardfs.Shard(str(first)) as s:
        slots = {k: s.header.index_position + 40 * s.slot_of(bytes.fromhex(k)) + 32 for k in (victim, lonely)}
        outside = s.header.index_position + 8
    with open(first, "r+b") as f:
        for offset in slots.values():
            f.seek(offset)
            f.write(outside.to_bytes(8, "big"))
    second = tmp_path / "b.shard"
    build_shard(second, [objects[victim]])
    for attempt in range(3):  # the first (handlers), then C in every worker
        point = mounter.mount([first, second], tmp_path / f"m{attempt}", "--layout", "flat")
        for _ in range(2 * default_workers()):
            assert (point / victim).read_bytes() == objects[victim]
            with pytest.raises(OSError) as err:
                os.stat(point / lonely)
            assert err.value.errno == errno.EIO
            run(["sh", "-c", "echo 2 > /proc/sys/vm/drop_caches"])  # the names are looked up again


def test_deleted_object_is_absent(corpus, mounter, tmp_path):
    """A takedown (shardfs.delete) removes the name from the mount."""
    path = tmp_path / "copy.shard"
    shutil.copyfile(corpus[0], path)
    objects = corpus[1]
    removed = sorted(objects)[5]
    assert shardfs.delete(str(path), [bytes.fromhex(removed)]) == 1
    point = mounter.mount(path, tmp_path / "m")
    names = set(os.listdir(point))
    assert removed not in names
    assert names == set(objects) - {removed}
    assert not os.path.exists(point / removed)


def _getdents(fd: int, size: int) -> List[tuple]:
    """One getdents64 system call on directory `fd` into a `size`-byte
    buffer (a few entries: each call is one READDIRPLUS of the mount, from
    the last d_off returned): [(name, d_off)], [] at the end."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    buf = ctypes.create_string_buffer(size)
    n = libc.getdents64(fd, buf, ctypes.c_size_t(size))
    assert n >= 0, os.strerror(ctypes.get_errno())
    out, at = [], 0
    while at < n:  # struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name
        off, reclen = int.from_bytes(buf.raw[at + 8:at + 16], "little", signed=True), \
            int.from_bytes(buf.raw[at + 16:at + 18], "little")
        out.append((buf.raw[at + 19:at + reclen].split(b"\0", 1)[0].decode(), off))
        at += reclen
    return out


def test_fanout_leaf_listing_resumed_across_shard_changes(mounter, tmp_path):
    """Through the kernel: a fan-out leaf read with getdents a few entries
    at a time while, between calls, a shard whose keys fall in the leaf
    appears in the shard directory, an object already listed is taken
    down (shardfs delete) and a shard file is removed. The listing has no
    name twice, is in key order, and holds every name present throughout
    (the handlers' test: test_fuse_handlers.py,
    test_fanout_leaf_listing_resumed_after_the_shard_set_changed)."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    keys = {}
    for name in "abc":
        where = shard_dir if name != "c" else tmp_path
        objects = build_shard(where / f"{name}.shard", prefixed_blobs("5e", 30, name.encode()))
        keys[name] = set(objects)
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "--layout", "fanout",
                          "--slicing", "0:1/1:2")
    leaf = point / "5" / "e"
    assert set(os.listdir(leaf)) == keys["a"] | keys["b"]
    listed: List[tuple] = []
    deleted = None
    fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for call in range(100):
            piece = _getdents(fd, 300)  # 3 entries of 88 bytes
            if not piece:
                break
            listed += piece
            if call == 1:
                os.rename(tmp_path / "c.shard", shard_dir / "c.shard")
                some = max(keys["c"])
                assert wait_until(lambda: (leaf / some).exists()), "the new shard is not served"
            elif call == 3:
                deleted = min(n for n, _ in listed if n in keys["a"])
                run(SHARDFS + ["delete", "--yes", str(shard_dir / "a.shard"), deleted], check=True)
                assert wait_until(lambda: not (leaf / deleted).exists()), "the takedown is not seen"
            elif call == 5:
                os.unlink(shard_dir / "b.shard")
                some = max(keys["b"])
                assert wait_until(lambda: not (leaf / some).exists()), "the removed shard is still served"
    finally:
        os.close(fd)
    assert deleted is not None and not (shard_dir / "b.shard").exists()
    names = [n for n, _ in listed]
    repeated = sorted({n for n in names if names.count(n) > 1})
    skipped = sorted(keys["a"] - {deleted} - set(names))
    assert not repeated and not skipped, \
        f"{len(repeated)} name(s) listed twice, {len(skipped)} skipped: {repeated[:3]} {skipped[:3]}"
    assert names == sorted(names) and set(names) <= keys["a"] | keys["b"] | keys["c"]
    offsets = [off for _, off in listed]
    assert offsets == sorted(set(offsets)) and offsets[0] > 0
