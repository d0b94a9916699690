"""The pyfuse3 request handlers: a Read Shard seen as a read-only directory.

Layout: the root directory (inode 1) holds one regular file per live object,
named by its key as 64 lowercase hex characters; the file's bytes are the
object's bytes. Nothing else exists and nothing can be written.

Inode numbers are stable across remounts: an object's inode is its slot in
the shard's index plus 2 (inode 1 is the root). A slot is fixed in the file
and unique per key, so `stat` and `find -inum` keep working after a remount.

Why the handlers look the way they do (see docs/design.md, section 4):

* pyfuse3 runs every handler inline in one thread. Anything that may wait
  for the device (a lookup reads an index slot and a size field, a read
  copies object bytes) runs in a worker thread through
  `trio.to_thread.run_sync` with a `trio.CapacityLimiter`, so a cold read on
  a slow device (HDD, Ceph) does not stall the other requests; the Shard
  methods release the GIL. A thread round trip costs more than the rest of
  the request, so lookups and reads first ask the C core for an answer from
  the page cache only (``Shard.find(nowait=True)``, ``Shard.try_pread``:
  preadv2 with RWF_NOWAIT, which fails at once instead of waiting), and
  only go to a thread when the bytes are not cached.
* Shards are immutable, so every answer is cached by the kernel as long as
  it allows: very long entry and attribute timeouts, negative entries
  (``st_ino = 0``) for names that do not exist, and ``keep_cache`` on open.
* A handler may only raise `pyfuse3.FUSEError`; anything else would escape
  the pyfuse3 main loop and kill the mount. Every handler is wrapped so an
  unexpected exception is logged and answered with EIO.

The filesystem is built over a list of shards so that several shards can be
served later (each with its own inode range); for now exactly one is
supported.
"""

from __future__ import annotations

import collections
import errno
import functools
import itertools
import json
import logging
import math
import os
import stat
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import pyfuse3
import trio

log = logging.getLogger("shardfs.fuse")

#: Seconds the kernel may cache names, negative names and attributes. The
#: data never changes while mounted, so one year ("forever" in practice).
CACHE_TIMEOUT = 365 * 86400.0

#: Inode of the root directory.
ROOT_INODE = pyfuse3.ROOT_INODE
#: An object's inode is its slot number plus this.
INODE_BASE = 2

#: Worker threads allowed to block on shard I/O at once (reads and lookups).
DEFAULT_IO_THREADS = 16

#: Extended attribute of the root: requests served, by kind, as JSON.
REQUESTS_XATTR = b"user.shardfs.requests"

#: Bytes of an object read ahead when it is looked up (the kernel's first
#: READ of a file asks for up to 128 KiB).
PREFETCH_BYTES = 128 * 1024

#: Directory entries fetched from the shard per worker-thread round trip.
READDIR_BATCH = 1024

_HEX_DIGITS = frozenset(b"0123456789abcdef")

#: open(2) flags that ask for write access or would modify the file.
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CREAT", 0)


def parse_name(name: bytes) -> Optional[bytes]:
    """Return the 32-byte key a directory entry name stands for, or None.

    Only the canonical spelling is accepted: exactly 64 lowercase hex
    characters. Uppercase hex, other lengths and anything else are not names
    of this filesystem (so each object has exactly one path).
    """
    if len(name) != 64 or not _HEX_DIGITS.issuperset(name):
        return None
    return bytes.fromhex(name.decode("ascii"))


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


@dataclass
class _Inode:
    """What the filesystem remembers about an object the kernel knows.

    Filled by lookup and readdir, dropped by forget when the kernel's lookup
    count reaches zero.
    """

    key: bytes
    size: int
    #: Absolute offset of the object's first byte in the shard file.
    data_offset: int
    #: Kernel lookup count (lookup and accepted readdir entries add one).
    nlookup: int = 0


class _DirHandle:
    """State of one open directory listing.

    `pending` holds entries fetched from the shard but not yet accepted by
    the kernel (a readdir request fills about one page, far fewer than a
    batch); `next_id` is the readdir position of pending[0]. A request at
    any other position drops them and scans the index from there.
    """

    __slots__ = ("pending", "next_id")

    def __init__(self) -> None:
        #: (slot, key, data_offset, size) in slot order.
        self.pending: Deque[Tuple[int, bytes, int, int]] = collections.deque()
        self.next_id = 0


def _handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an unexpected exception of a handler into EIO (and a log line).

    pyfuse3 only answers `FUSEError`; any other exception would escape its
    main loop and take the whole mount down.
    """

    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: "ShardFS", *args: Any) -> Any:
        self.requests[name] += 1
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:
            log.error("%s%r failed: %s", fn.__name__, args[:2], exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            log.exception("%s%r failed", fn.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


def _erofs(name: str) -> Callable[..., Any]:
    async def handler(self: "ShardFS", *args: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    handler.__name__ = name
    handler.__doc__ = f"{name}: always raises FUSEError(EROFS): the filesystem is read-only."
    return handler


class ShardFS(pyfuse3.Operations):
    """A read-only pyfuse3 filesystem over Read Shards.

    `shards` is one open `shardfs.Shard` or a sequence of them (currently of
    length one). The filesystem does not own the shards: the caller closes
    them after `pyfuse3.close()`.

    `io_threads` bounds the worker threads that may block on shard I/O at
    once.
    """

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, shards: Any, io_threads: int = DEFAULT_IO_THREADS) -> None:
        super().__init__()
        if not isinstance(shards, (list, tuple)):
            shards = [shards]
        if len(shards) != 1:
            raise ValueError("ShardFS serves exactly one shard for now")
        self._shards: List[Any] = list(shards)
        self._shard = self._shards[0]
        self._io_threads = io_threads
        self._limiter: Optional[trio.CapacityLimiter] = None
        self._inodes: Dict[int, _Inode] = {}
        self._dirs: Dict[int, _DirHandle] = {}
        self._next_dir_fh = 1
        self._uid = os.getuid()
        self._gid = os.getgid()
        self._time_ns = _ns(self._shard.mtime)
        self._live: Optional[int] = None
        #: Requests served since the mount, by handler name.
        self.requests: collections.Counter = collections.Counter()

    def close(self) -> None:
        """Release what the filesystem opened itself (nothing so far; the
        shards belong to the caller)."""

    # ------------------------------------------------------------ helpers

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` (shard I/O that may block) in a worker thread.
        Counted in `requests` as "thread:<fn name>"."""
        self.requests["thread:" + getattr(fn, "__name__", "call")] += 1
        if self._limiter is None:
            # Created lazily: it must belong to the running trio loop.
            self._limiter = trio.CapacityLimiter(self._io_threads)
        return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._limiter)

    def _attr(self, inode: int, mode: int, nlink: int, size: int) -> pyfuse3.EntryAttributes:
        """Attributes of an inode: owned by the mounting user, timed by the
        shard file's mtime, cached by the kernel for CACHE_TIMEOUT."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        attr.entry_timeout = CACHE_TIMEOUT
        attr.attr_timeout = CACHE_TIMEOUT
        attr.st_mode = mode
        attr.st_nlink = nlink
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_rdev = 0
        attr.st_size = size
        attr.st_blksize = 4096
        attr.st_blocks = (size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = self._time_ns
        return attr

    def _root_attr(self) -> pyfuse3.EntryAttributes:
        return self._attr(ROOT_INODE, stat.S_IFDIR | 0o555, 2, 0)

    def _file_attr(self, inode: int, size: int) -> pyfuse3.EntryAttributes:
        return self._attr(inode, stat.S_IFREG | 0o444, 1, size)

    @staticmethod
    def _negative_entry() -> pyfuse3.EntryAttributes:
        """A lookup answer that makes the kernel cache "no such name"."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = 0
        attr.entry_timeout = CACHE_TIMEOUT
        attr.attr_timeout = CACHE_TIMEOUT
        return attr

    def _remember(self, inode: int, key: bytes, size: int, data_offset: int) -> _Inode:
        """Record that the kernel got one more reference to `inode`."""
        entry = self._inodes.get(inode)
        if entry is None:
            entry = self._inodes[inode] = _Inode(key, size, data_offset)
        entry.nlookup += 1
        return entry

    def _find_and_prefetch(self, key: bytes) -> Optional[Tuple[int, int, int]]:
        """(slot, data_offset, size) of a live key or None (worker thread:
        may wait for the device). A lookup is followed by an open and a read:
        start reading the object's first bytes now, so that the read is
        likely served from the page cache, inline."""
        found = self._shard.find(key)
        if found is not None:
            self._shard.prefetch(found[1], found[2], PREFETCH_BYTES)
        return found

    def _entry(self, inode: int) -> _Inode:
        entry = self._inodes.get(inode)
        if entry is None:
            # The kernel only names inodes it got from lookup or readdir and
            # has not forgotten; anything else is a stale or forged number.
            raise pyfuse3.FUSEError(errno.ENOENT)
        return entry

    def _fetch_dir_batch(self, start_id: int) -> Deque[Tuple[int, bytes, int, int]]:
        """Up to READDIR_BATCH live objects from slot `start_id` on, in slot
        order, as (slot, key, data_offset, size) (worker thread)."""
        def corrupt(count: int) -> None:
            log.warning("%s: %d slot(s) from slot %d on point outside the objects section: "
                        "left out of the listing (run shardfs check)", self._shard.path, count,
                        start_id)

        return collections.deque(
            itertools.islice(self._shard.scan(start_id, READDIR_BATCH, on_corrupt=corrupt),
                             READDIR_BATCH)
        )

    # --------------------------------------------------------- name space

    @_handler
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        """Find `name` in directory `parent_inode`.

        Returns the object's attributes (and adds one to its lookup count),
        the root's attributes for "." and "..", or a negative entry
        (``st_ino = 0``, cached by the kernel for `CACHE_TIMEOUT`) when the
        name is not 64 lowercase hex characters or the key is not live in the
        shard. Resolved inline when the index slot and size field are in the
        page cache, else in a worker thread. Raises ENOTDIR when
        `parent_inode` is not the root.
        """
        if parent_inode != ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if name in (b".", b".."):
            return self._root_attr()
        key = parse_name(name)
        if key is None:
            return self._negative_entry()
        try:
            found = self._shard.find(key, nowait=True)
            if found is not None:
                self._shard.prefetch(found[1], found[2], PREFETCH_BYTES)
        except BlockingIOError:
            found = await self._io(self._find_and_prefetch, key)
        if found is None:
            return self._negative_entry()
        slot, data_offset, size = found
        inode = slot + INODE_BASE
        self._remember(inode, key, size, data_offset)
        return self._file_attr(inode, size)

    async def forget(self, inode_list: Sequence[Tuple[int, int]]) -> None:
        """Drop kernel lookup references; forget inodes whose count reaches 0.

        Never raises (pyfuse3 requires it), so not wrapped by _handler.
        """
        self.requests["forget"] += 1
        for inode, nlookup in inode_list:
            entry = self._inodes.get(inode)
            if entry is None:
                continue
            entry.nlookup -= nlookup
            if entry.nlookup <= 0:
                del self._inodes[inode]

    @_handler
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        """Attributes of `inode`: the root directory or a known object.

        Raises ENOENT for an inode the kernel did not get from lookup/readdir.
        """
        if inode == ROOT_INODE:
            return self._root_attr()
        entry = self._entry(inode)
        return self._file_attr(inode, entry.size)

    # -------------------------------------------------------------- files

    @_handler
    async def open(self, inode: int, flags: int, ctx: Any = None) -> pyfuse3.FileInfo:
        """Open an object for reading.

        Returns ``FileInfo(fh=inode, keep_cache=True)``: the kernel keeps the
        pages it cached from earlier opens (the bytes never change). Raises
        EROFS for any write access flag, EISDIR for the root, ENOENT for an
        unknown inode.
        """
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if inode == ROOT_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        self._entry(inode)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    @_handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        """Bytes [off, off+size) of the open object `fh`, clipped at its end.

        Returns b"" at or after the end. Served inline when the bytes are in
        the page cache, else copied in a worker thread (it may wait on the
        device). Raises EIO if the shard cannot be read.
        """
        entry = self._entry(fh)
        if off >= entry.size or size <= 0:
            return b""
        try:
            return self._shard.try_pread(entry.data_offset, entry.size, off, size)
        except BlockingIOError:
            return await self._io(self._shard.pread, entry.data_offset, entry.size, off, size)

    @_handler
    async def flush(self, fh: int) -> None:
        """Always raises FUSEError(ENOSYS): the kernel then stops sending
        FLUSH (on every close) for the rest of the mount, one request per
        object saved. There is nothing to flush on a read-only filesystem."""
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @_handler
    async def release(self, fh: int) -> None:
        """Nothing to free per open file (fh is the inode): returns None."""

    async def fsync(self, fh: int, datasync: bool) -> None:
        """Nothing to sync: returns None."""

    # -------------------------------------------------------- directories

    @_handler
    async def opendir(self, inode: int, ctx: Any = None) -> int:
        """Open the root directory; returns a handle for readdir.

        Raises ENOTDIR for an object inode.
        """
        if inode != ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        self._dirs[fh] = _DirHandle()
        return fh

    @_handler
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        """List live objects in slot order, from position `start_id`.

        An entry's `next_id` is its slot + 1, so a listing resumes exactly
        after the last entry the kernel accepted. No "." or ".." entries.
        Each entry accepted by `readdir_reply` adds one to its inode's
        lookup count. Returns None.
        """
        handle = self._dirs.get(fh)
        if handle is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if start_id != handle.next_id:
            # A rewind or seek: what we prefetched is for another position.
            handle.pending = collections.deque()
        pending = handle.pending
        while True:
            if not pending:
                pending = handle.pending = await self._io(self._fetch_dir_batch, start_id)
                if not pending:  # end of the directory
                    handle.next_id = start_id
                    return
            while pending:
                slot, key, data_offset, size = pending[0]
                inode = slot + INODE_BASE
                attr = self._file_attr(inode, size)
                if not pyfuse3.readdir_reply(token, key.hex().encode("ascii"), attr, slot + 1):
                    # Kernel buffer full: keep the entry for the next call.
                    handle.next_id = start_id
                    return
                pending.popleft()
                self._remember(inode, key, size, data_offset)
                start_id = slot + 1

    @_handler
    async def releasedir(self, fh: int) -> None:
        """Forget the directory handle; returns None."""
        self._dirs.pop(fh, None)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """Nothing to sync: returns None."""

    # -------------------------------------------------- filesystem-wide

    @_handler
    async def statfs(self, ctx: Any = None) -> pyfuse3.StatvfsData:
        """Filesystem statistics: the shard's extent in 4 KiB blocks, none
        free; live objects as files, none free; names of 64 bytes."""
        if self._live is None:
            self._live = await self._io(len, self._shard)
        data = pyfuse3.StatvfsData()
        data.f_bsize = 4096
        data.f_frsize = 4096
        data.f_blocks = math.ceil(self._shard.extent / 4096)
        data.f_bfree = 0
        data.f_bavail = 0
        data.f_files = self._live
        data.f_ffree = 0
        data.f_favail = 0
        data.f_namemax = 64
        return data

    @_handler
    async def access(self, inode: int, mode: int, ctx: Any = None) -> bool:
        """True for F_OK/R_OK/X_OK; raises EROFS when W_OK is asked.

        (Not called by the kernel when mounted with default_permissions.)
        """
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        if inode != ROOT_INODE:
            self._entry(inode)
        return True

    # ------------------------------------------------------------ xattrs

    @_handler
    async def getxattr(self, inode: int, name: bytes, ctx: Any = None) -> bytes:
        """Extended attribute `name` of `inode`.

        The root has ``user.shardfs.requests``: the requests served since
        the mount, by kind, as JSON (``{"lookup": 10, "read": 10, ...}``),
        for benchmarks that count requests per object. Anything else raises
        FUSEError(ENODATA) — not ENOSYS, so the kernel keeps asking and tools
        see the ordinary "no such attribute" answer.
        """
        if inode == ROOT_INODE and name == REQUESTS_XATTR:
            return json.dumps(dict(self.requests), sort_keys=True).encode()
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @_handler
    async def listxattr(self, inode: int, ctx: Any = None) -> List[bytes]:
        """Names of the extended attributes of `inode` (see getxattr)."""
        return [REQUESTS_XATTR] if inode == ROOT_INODE else []

    # ------------------------------------------- everything that writes

    setattr = _erofs("setattr")
    mknod = _erofs("mknod")
    mkdir = _erofs("mkdir")
    unlink = _erofs("unlink")
    rmdir = _erofs("rmdir")
    symlink = _erofs("symlink")
    rename = _erofs("rename")
    link = _erofs("link")
    create = _erofs("create")
    write = _erofs("write")
    setxattr = _erofs("setxattr")
    removexattr = _erofs("removexattr")
