"""A reader waiting on a slow device does not stall the other readers.

Each worker of a mount does its I/O inline, so a request waiting for the
device holds that worker and no other: with two workers, the other one
keeps serving. This module checks it through a real mount whose shard
lives on a device that is slow for one object only.

The slow device is "slowfs", a tiny pyfuse3 filesystem run in a process of
its own (a script written to the test's temporary directory and started
with ``python``, so no process running trio is ever forked). It serves one
regular file, ``shard``, with the bytes of a shard built here; its READ
handler waits, polling every 20 ms, while the range asked for overlaps the
"gated" pages (4 KiB pages of one object, see below) and the gate file
does not exist. Other requests keep being served meanwhile
(``pyfuse3.main`` with many tasks). Each wait and each release is logged
to a file, so the test knows when the gated read has reached the device.

The shard holds 3,000 objects of 4 KiB: the gated one is in the middle,
the 50 others read meanwhile are the first and last 25 of the file, megabytes
away from the gated pages, so no readahead of the slowfs file (at most a
few hundred KiB; shardfs maps the shard MADV_RANDOM) reaches both. Header,
index and hash (read at mount) are at the ends of the file, outside the
gated pages.

Where the gated reader waits matters, hence two tests:

* The object's data starts on a page boundary and only its data page is
  gated: its size field (the 8 bytes before, in the previous page) is not.
  LOOKUP (which reads the index slot and the size field) answers; the
  prefetch it starts and then OPEN (which reads objects up to 128 KiB
  whole) wait on the device. This is what the workers are for, and it
  must hold.
* The size field is gated too, so the reader waits in LOOKUP. The kernel
  then holds the directory's FUSE lock (``fuse_lock_inode``) unless the
  connection negotiated FUSE_PARALLEL_DIROPS, which libfuse only passes
  to the kernel from 3.17.1 on (libfuse commit c9905341, issue #861): with
  an older libfuse every other lookup in that directory (with
  ``--layout flat``: the whole mount) waits for the device, whatever the
  number of workers. That test is an expected failure there.

slowfs opens its file with ``keep_cache=True``: with ``keep_cache=False``
every open(2) of the file makes the kernel drop its cached pages, and
doing so waits, uninterruptibly, for the locked page of the gated read in
flight; a shardfs worker that reopens the shard meanwhile (it does, to
load a sidecar built after the mount) would then hang for reasons of
slowfs's own. A real slow disk has no such open-time invalidation.

Teardown opens the gate first, then unmounts shardfs, then slowfs
(``fusermount3 -u``, ``-uz`` as a last resort), so a failure never leaves
a hung mount or a reader stuck in the kernel.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional

import pytest
from mounting import build_shard, force_unmount, key_of, make_blobs, mounted, needs_fuse, run, wait_until

pytestmark = needs_fuse

pytest.importorskip("pyfuse3")
pytest.importorskip("trio")
shardfs = pytest.importorskip("shardfs")

#: Worker processes of the shardfs mount under test.
WORKERS = 2
#: Objects in the shard, and their size (4 KiB each, random bytes).
OBJECT_COUNT = 3000
OBJECT_SIZE = 4096
#: Objects read while the gated one waits: the first and last half of them.
OTHER_READS = 50
#: Seconds those reads may take in all (they take milliseconds).
OTHERS_DEADLINE = 5.0
#: Seconds for a read to reach slowfs, and for the gated one to end once
#: the gate is open.
SETTLE_TIMEOUT = 10.0
PAGE = 4096



SLOWFS_SCRIPT = r'''
"""slowfs: one read-only file whose reads of a byte range wait for a gate.

usage: python slowfs.py BACKING MOUNTPOINT GATE LOG GATED_START GATED_END
"""
import errno
import os
import stat
import sys

import pyfuse3
import trio

BACKING, MOUNTPOINT, GATE, LOG = sys.argv[1:5]
GATED_START, GATED_END = int(sys.argv[5]), int(sys.argv[6])
ROOT = pyfuse3.ROOT_INODE
FILE = ROOT + 1
NAME = b"shard"


class SlowFS(pyfuse3.Operations):
    def __init__(self):
        super().__init__()
        self.fd = os.open(BACKING, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(self.fd)
        self.size = st.st_size
        self.time_ns = st.st_mtime_ns
        self.log = open(LOG, "a", buffering=1)

    def _attr(self, inode):
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.entry_timeout = attr.attr_timeout = 3600
        if inode == ROOT:
            attr.st_mode, attr.st_nlink, attr.st_size = stat.S_IFDIR | 0o555, 2, 0
        else:
            attr.st_mode, attr.st_nlink, attr.st_size = stat.S_IFREG | 0o444, 1, self.size
        attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
        attr.st_blksize = 4096
        attr.st_blocks = (attr.st_size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = self.time_ns
        return attr

    async def getattr(self, inode, ctx=None):
        if inode not in (ROOT, FILE):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(inode)

    async def lookup(self, parent, name, ctx=None):
        if parent != ROOT:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if name in (b".", b".."):
            return self._attr(ROOT)
        if name == NAME:
            return self._attr(FILE)
        raise pyfuse3.FUSEError(errno.ENOENT)

    async def opendir(self, inode, ctx=None):
        if inode != ROOT:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        if start_id == 0:
            pyfuse3.readdir_reply(token, NAME, self._attr(FILE), 1)

    async def open(self, inode, flags, ctx=None):
        if inode != FILE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC):
            raise pyfuse3.FUSEError(errno.EROFS)
        # Page-cache reads (no direct_io: the file can be mapped). keep_cache:
        # without it every open drops the cached pages, which waits for the
        # locked page of a gated read in flight (see the test module).
        return pyfuse3.FileInfo(fh=inode, direct_io=False, keep_cache=True)

    async def read(self, fh, off, size):
        if off < GATED_END and off + size > GATED_START and not os.path.exists(GATE):
            self.log.write("wait %d %d\n" % (off, size))
            while not os.path.exists(GATE):
                await trio.sleep(0.02)
            self.log.write("go %d %d\n" % (off, size))
        return os.pread(self.fd, size, off)

    async def release(self, fh):
        pass


def main():
    fs = SlowFS()
    options = set(pyfuse3.default_options)
    options.update({"fsname=slowfs", "ro"})
    pyfuse3.init(fs, MOUNTPOINT, options)
    try:
        trio.run(pyfuse3.main, 1, 64)  # a waiting read keeps one task: others serve
    finally:
        pyfuse3.close(unmount=False)  # the session ended: unmounted by fusermount3 -u


main()
'''


def _log_lines(log: Path) -> List[str]:
    try:
        return log.read_text().splitlines()
    except FileNotFoundError:
        return []


def _stop_slowfs(proc: subprocess.Popen, point: Path) -> None:
    """Unmount slowfs (its process then leaves), else kill it and detach."""
    try:
        if mounted(point):
            run(["fusermount3", "-u", point])
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    finally:
        if mounted(point):
            run(["fusermount3", "-uz", point])
    assert not mounted(point), f"could not unmount slowfs at {point}"


def _blobs() -> List[bytes]:
    """OBJECT_COUNT objects of OBJECT_SIZE random bytes, and before the
    middle one a padding object sized so that the middle one's data starts
    on a page boundary (its size field ends the page before)."""
    blobs = make_blobs(7, OBJECT_COUNT, OBJECT_SIZE - 4, OBJECT_SIZE - 3)
    middle = OBJECT_COUNT // 2
    # Objects are written in order from byte 512, each as a u64 size then
    # its bytes: the padding's size field starts at `here`.
    here = 512 + middle * (8 + OBJECT_SIZE)
    pad = (-(here + 8 + 8)) % PAGE or PAGE
    pad += PAGE if pad < 16 else 0
    return blobs[:middle] + [b"padding:" + bytes(pad - 8)] + blobs[middle:]


@pytest.fixture
def slow_shard(request, tmp_path, mounter):
    """A shard served by slowfs with pages of one object gated.

    ``request.param`` says where its reader is to wait: "open" gates the
    object's data page only, "lookup" the page of its size field too.
    Yields a namespace: ``path`` (the shard as slowfs serves it),
    ``objects`` (key -> bytes), ``gated`` (the key of the gated object),
    ``others`` (OTHER_READS keys far from it), ``gate`` (the file that opens
    the gate), ``log`` (slowfs's wait/go lines), ``pages`` (the gated range).
    At teardown: the gate is opened, everything `mounter` mounted (shardfs,
    over slowfs) is unmounted, then slowfs is.
    """
    waits_in = request.param
    backing = tmp_path / "backing.shard"
    objects = build_shard(backing, _blobs())
    with shardfs.Shard(backing) as shard:
        header = shard.header
        located = sorted((shard.locate(key)[0], shard.locate(key)[1], key) for key in objects)
    offset, size, gated = located[OBJECT_COUNT // 2 + 1]
    assert size == OBJECT_SIZE and offset % PAGE == 0, "the gated object's data is not page-aligned"
    start = offset - PAGE if waits_in == "lookup" else offset  # the size field is in the page before
    end = offset + size
    half = OTHER_READS // 2
    far = 4 << 20  # well beyond any readahead window
    others = [key for key_offset, _, key in located[:half] + located[-half:]]
    assert all(abs(key_offset - offset) > far for key_offset, _, key in located[:half] + located[-half:])
    assert len(set(others)) == OTHER_READS and gated not in others
    # What the mount reads at open (header, index, hash) is never gated.
    assert header.objects_position + far < start and end + far < header.index_position

    gate = tmp_path / "gate-open"
    log = tmp_path / "slowfs.log"
    script = tmp_path / "slowfs.py"
    script.write_text(SLOWFS_SCRIPT)
    point = tmp_path / "slow"
    point.mkdir()
    stderr = open(tmp_path / "slowfs.err", "w")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(backing), str(point), str(gate), str(log), str(start), str(end)],
        stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr,
    )
    try:
        assert wait_until(lambda: mounted(point) or proc.poll() is not None), "slowfs never mounted"
        assert proc.poll() is None, f"slowfs exited: {(tmp_path / 'slowfs.err').read_text()}"
        assert os.stat(point / "shard").st_size == backing.stat().st_size
        yield SimpleNamespace(path=point / "shard", objects=objects, gated=gated, others=others,
                              gate=gate, log=log, pages=(start, end))
    finally:
        gate.touch()  # nothing waits on slowfs any more
        try:
            mounter.cleanup()  # shardfs first: it holds the slowfs file open
        finally:
            _stop_slowfs(proc, point)
            stderr.close()


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class Reader(threading.Thread):
    """Reads files in order, remembering what each read gave (or raised)."""

    def __init__(self, paths: List[Path]) -> None:
        super().__init__(daemon=True)  # a stuck reader must not keep pytest alive
        self.paths = paths
        self.results: Dict[Path, bytes] = {}
        self.error: Optional[BaseException] = None
        self.elapsed: Optional[float] = None

    def run(self) -> None:
        start = time.monotonic()
        try:
            for path in self.paths:
                self.results[path] = _read(path)
        except BaseException as exc:  # reported by the test
            self.error = exc
        self.elapsed = time.monotonic() - start


def _others_read_while_one_waits(s: SimpleNamespace, mounter, tmp_path: Path) -> None:
    """Mount with WORKERS workers; read the gated object in a thread (it
    waits on the device), then the others: all of them, byte-exact, within
    OTHERS_DEADLINE while the gated read still waits; then open the gate:
    the gated read ends with the right bytes."""
    point = mounter.mount(s.path, tmp_path / "m", "--layout", "flat", "--cache-dir", str(tmp_path / "cache"),
                          "-o", f"workers={WORKERS}")
    try:
        assert not any(line.startswith("wait") for line in _log_lines(s.log)), \
            "mounting read the gated pages"

        blocked = Reader([point / s.gated])
        blocked.start()
        # The gated read has reached the device (and waits there).
        assert wait_until(lambda: any(line.startswith("wait") for line in _log_lines(s.log)),
                          timeout=SETTLE_TIMEOUT), "the gated read never reached slowfs"
        time.sleep(0.3)
        assert blocked.is_alive(), f"the gated read did not wait: {blocked.error!r}"

        others = Reader([point / key for key in s.others])
        start = time.monotonic()
        others.start()
        others.join(timeout=OTHERS_DEADLINE)
        took = time.monotonic() - start
        assert not others.is_alive(), (
            f"only {len(others.results)} of {len(s.others)} other objects read in {OTHERS_DEADLINE} s "
            f"while one read waits on the device: the waiting reader stalls the others")
        assert others.error is None, f"reading the other objects failed: {others.error!r}"
        for key in s.others:
            assert hashlib.sha256(others.results[point / key]).hexdigest() == key
            assert others.results[point / key] == s.objects[key]
        # All of that while the gated read still waited on the device.
        assert blocked.is_alive() and not s.gate.exists(), "the gated read ended before the gate opened"
        assert not any(line.startswith("go") for line in _log_lines(s.log))
        print(f"\n{len(s.others)} objects read in {took:.3f} s while the gated read waited")

        s.gate.touch()
        blocked.join(timeout=SETTLE_TIMEOUT)
        assert not blocked.is_alive(), "the gated read did not end once the gate was opened"
        assert blocked.error is None, f"the gated read failed: {blocked.error!r}"
        assert key_of(blocked.results[point / s.gated]) == s.gated
        assert blocked.results[point / s.gated] == s.objects[s.gated]
    finally:
        s.gate.touch()  # first: then nothing waits on slowfs, and unmounting cannot hang
        force_unmount(point)


@pytest.mark.parametrize("slow_shard", ["open"], indirect=True)
def test_reader_waiting_on_slow_device_does_not_stall_others(slow_shard, mounter, tmp_path):
    """With 2 workers, an open whose object waits on the device holds one
    worker; 50 other objects are read, byte-exact, within a few seconds
    meanwhile, and the waiting read is still waiting when they are done;
    once the gate opens it completes with the right bytes."""
    _others_read_while_one_waits(slow_shard, mounter, tmp_path)


@pytest.mark.parametrize("slow_shard", ["lookup"], indirect=True)
def test_lookup_waiting_on_slow_device_does_not_stall_others(slow_shard, mounter, tmp_path):
    """The same when the gated reader waits in LOOKUP (the size field of
    its object is on the slow page): the other lookups of the directory
    must not wait for it. (libfuse before 3.17.1 drops FUSE_PARALLEL_DIROPS
    from its answer to INIT, and the kernel then runs one LOOKUP per
    directory at a time: the mount adds the flag itself, py_session.c.)"""
    _others_read_while_one_waits(slow_shard, mounter, tmp_path)
