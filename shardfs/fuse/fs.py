"""The pyfuse3 request handlers: Read Shards seen as one read-only tree.

Every object is a regular file named by its key, 64 lowercase hex
characters, whose bytes are the object's bytes; nothing can be written.
Where names are listed depends on the layout (`shardfs.fuse.layout`): the
root lists every object (``flat``) or directories sliced from the key's hex
(``fanout``, ``MOUNT/ab/cd/<key>``); in both, ``MOUNT/<key>`` is found by
lookup. A key held by several shards appears once, from the shard with the
lowest number (`shardfs.fuse.shardset`).

Inodes encode where an object is: ``(shard number + 1) << 32 | slot``, so
the filesystem keeps no table of the inodes the kernel knows (its memory
does not grow with what is read or listed); an inode is resolved from its
slot when needed. Directories have small fixed inodes (see layout).

Why the handlers look the way they do (see ../shared/design.md, section 4):

* pyfuse3 runs every handler inline in one thread. Anything that may wait
  for the device runs in a worker thread through `trio.to_thread.run_sync`
  with a `trio.CapacityLimiter`; the C core releases the GIL. A thread
  round trip costs more than the rest of a request, so lookups and reads
  first ask the C core for an answer from the page cache only
  (``nowait=True``, ``try_pread``), and go to a thread only when the bytes
  are not cached.
* Shards are immutable, so answers are cached by the kernel as long as it
  allows: one-year attribute timeouts, negative entries (``st_ino = 0``)
  for names that do not exist, ``keep_cache`` on open. With a shard
  directory followed live, names (positive and negative) are cached for
  `LIVE_ENTRY_TIMEOUT` only, so that shards that come and go show quickly.
* A handler may only raise `pyfuse3.FUSEError`; anything else would escape
  the pyfuse3 main loop and kill the mount. Every handler is wrapped so an
  unexpected exception is logged and answered with EIO.
"""

from __future__ import annotations

import collections
import errno
import functools
import json
import logging
import math
import os
import stat
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import pyfuse3
import trio

from shardfs.fuse.layout import ROOT_INODE, Layout, object_inode, split_object_inode
from shardfs.fuse.shardset import MountedShard, ShardSet

log = logging.getLogger("shardfs.fuse")

#: Seconds the kernel may cache names, negative names and attributes. The
#: data never changes while mounted, so one year ("forever" in practice).
CACHE_TIMEOUT = 365 * 86400.0

#: Seconds names are cached when a shard directory is followed live.
LIVE_ENTRY_TIMEOUT = 1.0

#: Worker threads allowed to block on shard I/O at once (reads and lookups).
DEFAULT_IO_THREADS = 16

#: Extended attribute of the root: requests served, by kind, as JSON.
REQUESTS_XATTR = b"user.shardfs.requests"
#: Extended attribute of the root: shards, sidecars, lookups and index
#: probes, as JSON.
STATS_XATTR = b"user.shardfs.stats"
#: Extended attribute of an object: the path of the shard serving it.
SHARD_XATTR = b"user.shardfs.shard"
#: Extended attribute of an object: the byte offset of its first byte in
#: the shard (after its 8-byte size field), decimal ASCII.
OFFSET_XATTR = b"user.shardfs.offset"

#: Bytes of an object read ahead when it is looked up (the kernel's first
#: READ of a file asks for up to 128 KiB).
PREFETCH_BYTES = 128 * 1024

#: Directory entries fetched from the shards per worker-thread round trip.
READDIR_BATCH = 1024

#: A fan-out leaf of up to this many entries (summed over shards) is listed
#: in the trio thread when its sidecars and index slots are in memory.
INLINE_LISTING = 4096

#: Objects whose location the filesystem remembers between a lookup and
#: the open that follows (a bounded FIFO; anything else is resolved from
#: the inode's slot).
OBJECT_CACHE_SIZE = 16384

_HEX_DIGITS = frozenset(b"0123456789abcdef")

#: open(2) flags that ask for write access or would modify the file.
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CREAT", 0)


def parse_name(name: bytes) -> Optional[bytes]:
    """Return the 32-byte key a directory entry name stands for, or None.

    Only the canonical spelling is accepted: exactly 64 lowercase hex
    characters. Uppercase hex, other lengths and anything else are not names
    of this filesystem (so each object has exactly one spelling).
    """
    if len(name) != 64 or not _HEX_DIGITS.issuperset(name):
        return None
    return bytes.fromhex(name.decode("ascii"))


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


#: One directory entry ready for readdir_reply:
#: (next_id, name, inode, is_dir, size, mtime_ns).
_Entry = Tuple[int, bytes, int, bool, int, int]


class _DirHandle:
    """State of one open directory listing.

    `pending` holds entries fetched but not yet accepted by the kernel (a
    readdir request fills about one page, far fewer than a batch);
    `next_id` is the position they start after. `entries`, for a fan-out
    directory, is its whole listing, computed at the first readdir: a
    position is an index in it, so a listing resumes exactly.
    """

    __slots__ = ("depth", "prefix", "pending", "next_id", "entries")

    def __init__(self, depth: int, prefix: int) -> None:
        self.depth = depth
        self.prefix = prefix
        self.pending: Deque[_Entry] = collections.deque()
        self.next_id = 0
        self.entries: Optional[List[_Entry]] = None


class _OpenFile:
    __slots__ = ("member", "data_offset", "size")

    def __init__(self, member: MountedShard, data_offset: int, size: int) -> None:
        self.member = member
        self.data_offset = data_offset
        self.size = size


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
    """A read-only pyfuse3 filesystem over the shards of a `ShardSet`.

    `layout` is a `shardfs.fuse.layout.Layout` (flat by default). `uid` and
    `gid` own every file and directory (default: the mounting user). `live`
    shortens name caching (a shard directory followed live).
    `io_threads` bounds the worker threads that may block on shard I/O at
    once. The filesystem does not own the set: the caller closes it after
    `pyfuse3.close()`.
    """

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, shards: ShardSet, layout: Optional[Layout] = None, uid: Optional[int] = None,
                 gid: Optional[int] = None, live: bool = False,
                 io_threads: int = DEFAULT_IO_THREADS) -> None:
        super().__init__()
        self.shards = shards
        self.layout = layout or Layout.flat()
        self._io_threads = io_threads
        self._limiter: Optional[trio.CapacityLimiter] = None
        self._build_limiter: Optional[trio.CapacityLimiter] = None
        self._objects: Dict[int, Tuple[MountedShard, int, int]] = {}
        self._files: Dict[int, _OpenFile] = {}
        self._next_fh = 1
        self._dirs: Dict[int, _DirHandle] = {}
        self._next_dir_fh = 1
        self._uid = os.getuid() if uid is None else uid
        self._gid = os.getgid() if gid is None else gid
        self._entry_timeout = LIVE_ENTRY_TIMEOUT if live else CACHE_TIMEOUT
        mtimes = [m.shard.mtime for m in shards.served()]
        self._dir_time_ns = _ns(max(mtimes) if mtimes else time.time())
        #: Shards whose sidecar the background builder must make.
        self._sidecar_queue: Deque[MountedShard] = collections.deque()
        self._sidecar_wakeup: Optional[trio.Event] = None
        self._rescan_wakeup: Optional[trio.Event] = None
        shards.on_needs_sidecar = self._queue_sidecar
        for member in shards.served():
            if not member.sidecar_done.is_set():
                self._sidecar_queue.append(member)
        #: Requests served since the mount, by handler name.
        self.requests: collections.Counter = collections.Counter()

    def close(self) -> None:
        """Release what the filesystem holds itself (the set is the caller's)."""
        self._objects.clear()
        self._files.clear()

    # ---------------------------------------------------- background work

    def _queue_sidecar(self, member: MountedShard) -> None:
        self._sidecar_queue.append(member)
        if self._sidecar_wakeup is not None:
            self._sidecar_wakeup.set()

    def request_rescan(self) -> None:
        """Ask the background task to rescan the shard directory (SIGHUP)."""
        if self._rescan_wakeup is not None:
            self._rescan_wakeup.set()

    async def run_background(self) -> None:
        """The filesystem's own tasks, until cancelled: build missing
        sidecars one at a time, and follow the shard directory (inotify
        events and `request_rescan`)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._build_sidecars)
            if self.shards.shard_dir is not None:
                nursery.start_soon(self._follow_shard_dir)

    async def _build_sidecars(self) -> None:
        self._build_limiter = trio.CapacityLimiter(1)
        while True:
            self._sidecar_wakeup = trio.Event()
            while self._sidecar_queue:
                member = self._sidecar_queue.popleft()
                if member.removed:
                    continue
                await self._io(self.shards.ensure_sidecar, member, limiter=self._build_limiter)
                self.shards.install_sidecar(member)
            await self._sidecar_wakeup.wait()

    async def _follow_shard_dir(self) -> None:
        """Rescan the shard directory on inotify events (debounced) and on
        `request_rescan`."""
        import inotify_simple

        flags = inotify_simple.flags
        mask = (flags.CREATE | flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVED_FROM | flags.DELETE
                | flags.ATTRIB)
        inotify = inotify_simple.INotify(nonblocking=True)
        try:
            try:
                inotify.add_watch(self.shards.shard_dir, mask)
            except OSError as exc:
                log.warning("cannot watch %s (%s): new shards show after SIGHUP only",
                            self.shards.shard_dir, exc)
                inotify.close()
                inotify = None
            async with trio.open_nursery() as nursery:
                if inotify is not None:
                    nursery.start_soon(self._watch_inotify, inotify)
                while True:
                    self._rescan_wakeup = trio.Event()
                    await self._rescan_wakeup.wait()
                    await trio.sleep(0.2)  # let a burst of events settle
                    await self._rescan()
        finally:
            if inotify is not None:
                inotify.close()

    async def _watch_inotify(self, inotify: Any) -> None:
        while True:
            await trio.lowlevel.wait_readable(inotify.fileno())
            try:
                events = inotify.read(timeout=0)
            except BlockingIOError:
                events = []
            if events:
                log.debug("shard directory events: %s", [(e.name, e.mask) for e in events])
                self.request_rescan()

    async def _rescan(self) -> None:
        """Follow the shard directory: removals at once, new shards opened
        (validated, sidecar loaded) in a worker thread so that a slow device
        does not stall requests, then served."""
        try:
            gone, new = self.shards.plan_rescan()
        except OSError as exc:
            log.warning("cannot rescan %s: %s", self.shards.shard_dir, exc)
            return
        for member in gone:
            self.shards.remove(member)
        added = 0
        for path, seen in new:
            if path in self.shards.by_path:
                continue
            try:
                shard, sidecar = await self._io(self.shards.open_candidate, path)
            except Exception as exc:
                self.shards.reject(path, seen, exc)
                continue
            try:
                self.shards.add(path, shard=shard, sidecar=sidecar)
                added += 1
            except OSError as exc:  # vanished meanwhile
                shard.close()
                if sidecar is not None:
                    sidecar.close()
                self.shards.reject(path, seen, exc)
        if added or gone:
            log.info("rescan of %s: %d shard(s) added, %d removed", self.shards.shard_dir, added,
                     len(gone))

    # ------------------------------------------------------------ helpers

    async def _io(self, fn: Callable[..., Any], *args: Any,
                  limiter: Optional[trio.CapacityLimiter] = None) -> Any:
        """Run `fn(*args)` (shard I/O that may block) in a worker thread.
        Counted in `requests` as "thread:<fn name>". Removed shards are not
        closed while a worker thread runs."""
        self.requests["thread:" + getattr(fn, "__name__", "call")] += 1
        if limiter is None:
            if self._limiter is None:
                # Created lazily: it must belong to the running trio loop.
                self._limiter = trio.CapacityLimiter(self._io_threads)
            limiter = self._limiter
        self.shards.workers += 1
        try:
            return await trio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)
        finally:
            self.shards.workers -= 1
            if not self.shards.workers:
                self.shards.close_idle()

    def _attr(self, inode: int, mode: int, nlink: int, size: int, time_ns: int) -> pyfuse3.EntryAttributes:
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.generation = 0
        attr.entry_timeout = self._entry_timeout
        attr.attr_timeout = CACHE_TIMEOUT
        attr.st_mode = mode
        attr.st_nlink = nlink
        attr.st_uid = self._uid
        attr.st_gid = self._gid
        attr.st_rdev = 0
        attr.st_size = size
        attr.st_blksize = 4096
        # du(1) counts st_blocks: the bytes the object takes in its shard.
        attr.st_blocks = (size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = time_ns
        return attr

    def _dir_attr(self, inode: int) -> pyfuse3.EntryAttributes:
        return self._attr(inode, stat.S_IFDIR | 0o555, 2, 0, self._dir_time_ns)

    def _file_attr(self, inode: int, size: int, member: MountedShard) -> pyfuse3.EntryAttributes:
        return self._attr(inode, stat.S_IFREG | 0o444, 1, size, _ns(member.shard.mtime))

    def _negative_entry(self) -> pyfuse3.EntryAttributes:
        """A lookup answer that makes the kernel cache "no such name"."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = 0
        attr.entry_timeout = self._entry_timeout
        attr.attr_timeout = self._entry_timeout
        return attr

    def _remember(self, inode: int, member: MountedShard, data_offset: int, size: int) -> None:
        objects = self._objects
        if inode not in objects and len(objects) >= OBJECT_CACHE_SIZE:
            del objects[next(iter(objects))]
        objects[inode] = (member, data_offset, size)

    def _find_and_prefetch(self, key: bytes) -> Optional[Tuple[MountedShard, int, int, int]]:
        """`ShardSet.find` that may wait for the device (worker thread),
        then starts reading the object's first bytes: the open and read
        that follow a lookup are then likely served inline."""
        found = self.shards.find(key)
        if found is not None:
            found[0].shard.prefetch(found[2], found[3], PREFETCH_BYTES)
        return found

    async def _lookup_object(self, key: bytes) -> pyfuse3.EntryAttributes:
        try:
            found = self.shards.find(key, nowait=True)
            if found is not None:
                found[0].shard.prefetch(found[2], found[3], PREFETCH_BYTES)
        except BlockingIOError:
            found = await self._io(self._find_and_prefetch, key)
        if found is None:
            return self._negative_entry()
        member, slot, data_offset, size = found
        inode = object_inode(member.number, slot)
        self._remember(inode, member, data_offset, size)
        return self._file_attr(inode, size, member)

    def _resolve_slot(self, member: MountedShard, slot: int, nowait: bool = False
                      ) -> Optional[Tuple[int, int]]:
        """(data_offset, size) of a live slot, or None. Without `nowait`
        it may wait for the device (worker thread); with it, raises
        BlockingIOError when the slot is not in the page cache."""
        if member.shard.closed:
            return None
        found = member.shard.slot(slot, nowait)
        return None if found is None else (found[1], found[2])

    async def _object(self, inode: int) -> Tuple[MountedShard, int, int]:
        """(shard, data_offset, size) of an object inode; ENOENT when the
        inode names nothing (a directory, a removed shard, an empty slot)."""
        cached = self._objects.get(inode)
        if cached is not None:
            if not cached[0].shard.closed:
                return cached
            # Its shard was removed and closed since: the kernel may still
            # hold the inode (a name cached just before the removal).
            del self._objects[inode]
        split = split_object_inode(inode)
        if split is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        member = self.shards.get(split[0])
        if member is None or split[1] >= member.shard.slot_count:
            raise pyfuse3.FUSEError(errno.ENOENT)
        try:
            # Inline when cached: the kernel got this inode from a listing
            # (tar, rsync, find then open every entry) or has kept it longer
            # than our small cache of locations.
            found = self._resolve_slot(member, split[1], True)
        except BlockingIOError:
            found = await self._io(self._resolve_slot, member, split[1])
        if found is None or member.shard.closed:  # closed while the thread ran
            raise pyfuse3.FUSEError(errno.ENOENT)
        self._remember(inode, member, found[0], found[1])
        return (member, found[0], found[1])

    def _split_dir(self, inode: int) -> Optional[Tuple[int, int]]:
        return self.layout.split_dir_inode(inode)

    # --------------------------------------------------------- name space

    @_handler
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        """Find `name` in directory `parent_inode`.

        Returns the attributes of an object or a directory, the parent
        directory's for "." and "..", or a negative entry (``st_ino = 0``,
        cached by the kernel) when nothing has that name: not 64 lowercase
        hex characters, a key no served shard holds, or (in a fan-out
        directory) a key that does not start with the directory's prefix.
        Objects are resolved inline when their index slot is in the page
        cache, else in a worker thread. Raises ENOTDIR when `parent_inode`
        is an object.
        """
        where = self._split_dir(parent_inode)
        if where is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        depth, prefix = where
        if name == b".":
            return self._dir_attr(parent_inode)
        if name == b"..":
            if depth <= 1:
                return self._dir_attr(ROOT_INODE)
            width = self.layout.widths[depth - 1]
            return self._dir_attr(self.layout.dir_inode(depth - 1, prefix >> (4 * width)))
        key = parse_name(name)
        if key is not None:
            if depth and not name.startswith(self.layout.prefix_hex(depth, prefix).encode()):
                return self._negative_entry()
            if depth not in (0, self.layout.depth):
                return self._negative_entry()  # objects live at the root or in leaves
            return await self._lookup_object(key)
        if depth < self.layout.depth:
            width = self.layout.widths[depth]
            if len(name) == width and _HEX_DIGITS.issuperset(name):
                child = (prefix << (4 * width)) | int(name, 16)
                return self._dir_attr(self.layout.dir_inode(depth + 1, child))
        return self._negative_entry()

    async def forget(self, inode_list: Sequence[Tuple[int, int]]) -> None:
        """Kernel lookup references dropped: nothing to do, inodes carry
        their own location. Never raises (pyfuse3 requires it)."""
        self.requests["forget"] += 1

    @_handler
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        """Attributes of `inode`: a directory or an object.

        Raises ENOENT for an inode that names nothing (anymore).
        """
        if self._split_dir(inode) is not None:
            return self._dir_attr(inode)
        member, _, size = await self._object(inode)
        return self._file_attr(inode, size, member)

    # -------------------------------------------------------------- files

    @_handler
    async def open(self, inode: int, flags: int, ctx: Any = None) -> pyfuse3.FileInfo:
        """Open an object for reading.

        Returns a FileInfo with ``keep_cache=True``: the kernel keeps the
        pages it cached from earlier opens (the bytes never change). Raises
        EROFS for any write access flag, EISDIR for a directory, ENOENT for
        an inode that names nothing.
        """
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if self._split_dir(inode) is not None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        member, data_offset, size = await self._object(inode)
        fh = self._next_fh
        self._next_fh += 1
        self._files[fh] = _OpenFile(member, data_offset, size)
        member.open_files += 1
        return pyfuse3.FileInfo(fh=fh, keep_cache=True)

    @_handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        """Bytes [off, off+size) of the open object `fh`, clipped at its end.

        Returns b"" at or after the end. Served inline when the bytes are in
        the page cache, else copied in a worker thread (it may wait on the
        device). Raises EIO if the shard cannot be read.
        """
        f = self._files.get(fh)
        if f is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if off >= f.size or size <= 0:
            return b""
        shard = f.member.shard
        try:
            return shard.try_pread(f.data_offset, f.size, off, size)
        except BlockingIOError:
            return await self._io(shard.pread, f.data_offset, f.size, off, size)

    @_handler
    async def flush(self, fh: int) -> None:
        """Always raises FUSEError(ENOSYS): the kernel then stops sending
        FLUSH (on every close) for the rest of the mount, one request per
        object saved. There is nothing to flush on a read-only filesystem."""
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @_handler
    async def release(self, fh: int) -> None:
        """Forget the open file; a removed shard is closed with its last
        open file. Returns None."""
        f = self._files.pop(fh, None)
        if f is not None:
            f.member.open_files -= 1
            self.shards.close_if_idle(f.member)

    async def fsync(self, fh: int, datasync: bool) -> None:
        """Nothing to sync: returns None."""

    # -------------------------------------------------------- directories

    @_handler
    async def opendir(self, inode: int, ctx: Any = None) -> int:
        """Open a directory; returns a handle for readdir. Raises ENOTDIR
        for an object inode."""
        where = self._split_dir(inode)
        if where is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        fh = self._next_dir_fh
        self._next_dir_fh += 1
        self._dirs[fh] = _DirHandle(*where)
        return fh

    def _flat_batch(self, start_id: int) -> Deque[_Entry]:
        """Up to READDIR_BATCH objects of a flat root from position
        `start_id` (= shard number << 32 | slot) on, in that order, leaving
        out keys a lower-numbered shard serves (worker thread)."""
        number, slot = start_id >> 32, start_id & 0xFFFFFFFF
        out: Deque[_Entry] = collections.deque()
        for member in self.shards.served():
            if member.number < number:
                continue
            first = slot if member.number == number else 0

            def corrupt(count: int, member: MountedShard = member, first: int = first) -> None:
                log.warning("%s: %d slot(s) from slot %d on point outside the objects section: "
                            "left out of the listing (run shardfs check)", member.path, count, first)

            time_ns = _ns(member.shard.mtime)
            for slot_, key, _, size in member.shard.scan(first, READDIR_BATCH, on_corrupt=corrupt):
                if member.number and self.shards.find(key, below=member.number, count=False) is not None:
                    continue  # served by a lower-numbered shard
                pos = (member.number << 32) | slot_
                out.append((pos + 1, key.hex().encode("ascii"), object_inode(member.number, slot_),
                            False, size, time_ns))
                if len(out) >= READDIR_BATCH:
                    return out
            if out:
                return out
        return out

    def _child_entries(self, depth: int, prefix: int) -> List[_Entry]:
        """The non-empty subdirectories of a fan-out directory, in name
        order (worker thread; builds missing sidecars first)."""
        width = self.layout.widths[depth]
        nbits = 4 * self.layout.prefix_len(depth + 1)
        children = range(prefix << (4 * width), (prefix + 1) << (4 * width))
        nonempty = set()
        for member in self.shards.served():
            sc = self.shards.ensure_sidecar(member)
            if sc is None:  # no sidecar: cannot tell, list them all
                nonempty = set(children)
                break
            for child in children:
                if child in nonempty:
                    continue
                begin, end = sc.range(_prefix_bytes(child, nbits), nbits)
                if end > begin:
                    nonempty.add(child)
        out = []
        for child in sorted(nonempty):
            name = self.layout.child_name(depth + 1, child)
            out.append((len(out) + 1, name, self.layout.dir_inode(depth + 1, child), True, 0,
                        self._dir_time_ns))
        return out

    def _leaf_entries(self, depth: int, prefix: int, nowait: bool = False) -> List[_Entry]:
        """The objects of a fan-out leaf directory, by key (worker thread;
        builds missing sidecars first). With `nowait` (the trio thread),
        raises BlockingIOError instead of doing anything that may wait: a
        sidecar to build, an index slot not in the page cache, or more than
        INLINE_LISTING entries."""
        hexprefix = self.layout.prefix_hex(depth, prefix)
        nbits = 4 * len(hexprefix)
        pbytes = _prefix_bytes(prefix, nbits)
        best: Dict[bytes, Tuple[MountedShard, int, int]] = {}
        budget = INLINE_LISTING
        for member in self.shards.served():
            if nowait and not member.installed:
                raise BlockingIOError("sidecar not ready")
            sc = self.shards.ensure_sidecar(member)
            if sc is not None:
                begin, end = sc.range(pbytes, nbits)
                budget -= end - begin
                if nowait and budget < 0:
                    raise BlockingIOError("long listing")
                # In slot order: index reads then go forward through the file.
                items = ((s, member.shard.slot(s, nowait)) for s in sorted(sc.slots(begin, end)))
            else:  # no sidecar: scan the whole index (slow, but right)
                items = ((s, (k, o, z)) for s, k, o, z in member.shard.scan(0, 65536)
                         if k.hex().startswith(hexprefix))
            for slot, item in items:
                if item is None:
                    continue  # deleted since the sidecar was built
                key, _, size = item
                if key in best or not key.hex().startswith(hexprefix):
                    continue
                best[key] = (member, slot, size)
        out = []
        for key in sorted(best):
            member, slot, size = best[key]
            out.append((len(out) + 1, key.hex().encode("ascii"), object_inode(member.number, slot),
                        False, size, _ns(member.shard.mtime)))
        return out

    async def _fetch(self, handle: _DirHandle, start_id: int) -> Deque[_Entry]:
        if handle.depth == 0 and self.layout.is_flat:
            return await self._io(self._flat_batch, start_id)
        if handle.entries is None:
            if handle.depth < self.layout.depth:
                handle.entries = await self._io(self._child_entries, handle.depth, handle.prefix)
            else:
                try:
                    # Most leaves are small and cached: no thread round trip.
                    handle.entries = self._leaf_entries(handle.depth, handle.prefix, True)
                except BlockingIOError:
                    handle.entries = await self._io(self._leaf_entries, handle.depth, handle.prefix)
            self.shards.install_ready()  # the listing may have built sidecars
        return collections.deque(handle.entries[start_id:start_id + READDIR_BATCH])

    @_handler
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        """List a directory from position `start_id`.

        Flat root: objects by (shard number, slot); a fan-out directory:
        its non-empty subdirectories or its objects, by name. An entry's
        `next_id` is the position just after it, so a listing resumes
        exactly after the last entry the kernel accepted. No "." or ".."
        entries. Returns None.
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
                pending = handle.pending = await self._fetch(handle, start_id)
                if not pending:  # end of the directory
                    handle.next_id = start_id
                    return
            while pending:
                next_id, name, inode, is_dir, size, time_ns = pending[0]
                if is_dir:
                    attr = self._dir_attr(inode)
                else:
                    attr = self._attr(inode, stat.S_IFREG | 0o444, 1, size, time_ns)
                if not pyfuse3.readdir_reply(token, name, attr, next_id):
                    # Kernel buffer full: keep the entry for the next call.
                    handle.next_id = start_id
                    return
                pending.popleft()
                start_id = next_id

    @_handler
    async def releasedir(self, fh: int) -> None:
        """Forget the directory handle; returns None."""
        self._dirs.pop(fh, None)

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """Nothing to sync: returns None."""

    # -------------------------------------------------- filesystem-wide

    @_handler
    async def statfs(self, ctx: Any = None) -> pyfuse3.StatvfsData:
        """Filesystem statistics: the served shards' extents in 4 KiB
        blocks, none free; their objects as files (the sidecar's live count
        when built, else the header's object count), none free; names of 64
        bytes."""
        served = self.shards.served()
        data = pyfuse3.StatvfsData()
        data.f_bsize = 4096
        data.f_frsize = 4096
        data.f_blocks = sum(math.ceil(m.extent / 4096) for m in served)
        data.f_bfree = 0
        data.f_bavail = 0
        data.f_files = sum(m.sidecar.count if m.sidecar is not None else m.objects for m in served)
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
        if self._split_dir(inode) is None:
            await self._object(inode)
        return True

    # ------------------------------------------------------------ xattrs

    def stats(self) -> Dict[str, int]:
        """Counters of the shard set: shards served, sidecars ready,
        lookups and index probes made by them."""
        served = self.shards.served()
        return {
            "shards": len(served),
            "sidecars": sum(1 for m in served if m.sidecar is not None),
            "lookups": self.shards.lookups,
            "index_probes": self.shards.probes,
            "objects": sum(m.objects for m in served),
        }

    @_handler
    async def getxattr(self, inode: int, name: bytes, ctx: Any = None) -> bytes:
        """Extended attribute `name` of `inode`.

        The root has ``user.shardfs.requests`` (requests served since the
        mount, by kind, as JSON: ``{"lookup": 10, "read": 10, ...}``) and
        ``user.shardfs.stats`` (`stats()` as JSON). An object has
        ``user.shardfs.shard`` (the path of its shard) and
        ``user.shardfs.offset`` (the byte offset of its first byte in the
        shard, decimal). Anything else raises FUSEError(ENODATA), not
        ENOSYS, so tools see the ordinary "no such attribute" answer.
        """
        if inode == ROOT_INODE:
            if name == REQUESTS_XATTR:
                return json.dumps(dict(self.requests), sort_keys=True).encode()
            if name == STATS_XATTR:
                return json.dumps(self.stats(), sort_keys=True).encode()
        elif self._split_dir(inode) is None and name in (SHARD_XATTR, OFFSET_XATTR):
            member, data_offset, _ = await self._object(inode)
            if name == SHARD_XATTR:
                return os.fsencode(member.path)
            return str(data_offset).encode("ascii")
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    @_handler
    async def listxattr(self, inode: int, ctx: Any = None) -> List[bytes]:
        """Names of the extended attributes of `inode` (see getxattr)."""
        if inode == ROOT_INODE:
            return [REQUESTS_XATTR, STATS_XATTR]
        if self._split_dir(inode) is None:
            await self._object(inode)
            return [SHARD_XATTR, OFFSET_XATTR]
        return []

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


def _prefix_bytes(value: int, nbits: int) -> bytes:
    """The first `nbits` bits `value` stands for, left-aligned in bytes."""
    nbytes = (nbits + 7) // 8
    return (value << (8 * nbytes - nbits)).to_bytes(nbytes, "big") if nbytes else b""
