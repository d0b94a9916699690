"""The request handlers: Read Shards seen as one read-only tree.

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
slot when needed.

The handlers know nothing of processes, yet they are written to be run by
several processes serving one FUSE connection (`shardfs.fuse.worker`),
where the OPEN, READ and RELEASE of one file, or the READDIR calls of one
listing, may each reach another process:

* No state a later request needs: a file handle is the object's inode
  (READ resolves the slot again, which also makes a takedown effective at
  once), a directory handle is the directory's inode, and a listing
  position is computed from the shard set (a shard number and slot for a
  flat root, an index into a sorted listing for a fan-out directory).
  What a handler remembers between requests is a cache that any process
  may rebuild.
* A handler does its I/O inline (the C core releases the GIL): concurrency
  comes from the number of processes, never from threads a handler awaits.
* What the handlers must tell the process that runs them (a request began
  or ended, a file was opened or released) goes through `RequestHooks`.

Caching by the kernel: names, objects and directories are cached for
`CACHE_TIMEOUT` (a year: what changes an object in place is a takedown, and
the coordinator invalidates those inodes; the names of a shard that is
removed or replaced are invalidated by the coordinator too); the absence
of a name only for `ENTRY_TIMEOUT`, so that a shard added under the mount
is seen within that bound. Objects up to `PUSH_BYTES` are pushed into the
kernel's page cache at open (``notify_store``), so reading them sends no
READ request; ``keep_cache`` keeps those pages between opens.

A handler may only raise `pyfuse3.FUSEError`; anything else would escape
the pyfuse3 main loop and kill the process. Every handler is wrapped so an
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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pyfuse3

from shardfs.fuse.layout import (OBJECT_SHIFT, ROOT_INODE, SLOT_MASK, Layout, object_inode, split_db_inode,
                                 split_object_inode)
from shardfs.fuse.shardset import MountedShard, ShardSet
from shardfs.shard import KEY_SIZE
from shardfs.winery import POLL_SECONDS, DatabaseUnavailable, ImageNotMapped

log = logging.getLogger("shardfs.fuse")

#: Seconds the kernel may cache attributes (and a directory's names): the
#: data never changes while mounted but for takedowns, which invalidate
#: the inode. One year ("forever" in practice).
CACHE_TIMEOUT = 365 * 86400.0

#: Seconds the kernel may cache the absence of a name: the bound within
#: which the objects of a shard added under the mount are seen through
#: names the kernel had looked up before.
ENTRY_TIMEOUT = 1.0

#: Objects up to this many bytes are pushed into the kernel's page cache
#: when opened (``pyfuse3.notify_store``): no READ request follows.
PUSH_BYTES = 128 * 1024

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

#: Bytes of an object read ahead when it is looked up (the open that
#: follows reads up to PUSH_BYTES of it).
PREFETCH_BYTES = 128 * 1024

#: Directory entries computed per READDIR of a flat root (a reply holds a
#: few dozen; the rest is kept in a small per-process cache).
READDIR_BATCH = 256

#: Listings (fan-out directories) and flat-root batches a process keeps.
LISTING_CACHE_SIZE = 64

#: Listing positions of a flat root from which the objects only in a
#: winery database are listed (image objects use shard number << 32 | slot,
#: below it).
DB_LISTING_BASE = 1 << 62

_HEX_DIGITS = frozenset(b"0123456789abcdef")
#: Bytes of an object's name: its key in hex.
NAME_SIZE = 2 * KEY_SIZE

#: open(2) flags that ask for write access or would modify the file.
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CREAT", 0)


def parse_name(name: bytes) -> Optional[bytes]:
    """Return the 32-byte key a directory entry name stands for, or None.

    Only the canonical spelling is accepted: exactly 64 lowercase hex
    characters. Uppercase hex, other lengths and anything else are not names
    of this filesystem (so each object has exactly one spelling).
    """
    if len(name) != NAME_SIZE or not _HEX_DIGITS.issuperset(name):
        return None
    return bytes.fromhex(name.decode("ascii"))


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


#: One directory entry ready for readdir_reply:
#: (next_id, name, inode, is_dir, size, mtime_ns).
_Entry = Tuple[int, bytes, int, bool, int, int]


class RequestHooks:
    """What the handlers tell the process that runs them, and ask of it.

    This default serves a filesystem run by one process (and tests): plain
    counters. `shardfs.fuse.worker` has one that brings the shard set up to
    date before each request and counts in memory shared by all workers.
    """

    def __init__(self, shards: ShardSet) -> None:
        self.shards = shards
        self.counts: collections.Counter = collections.Counter()

    def begin(self, kind: str) -> None:
        """A request of `kind` (the handler's name) starts."""
        self.counts[kind] += 1

    def end(self) -> None:
        """The request is answered (or failed)."""

    def opened(self, number: int) -> None:
        """A file of shard `number` was opened (the kernel will RELEASE it)."""

    def released(self, number: int) -> None:
        """A file of shard `number` was released."""

    def requests(self) -> Dict[str, int]:
        """Requests served since the mount, by kind."""
        return dict(self.counts)

    def lookups(self) -> Tuple[int, int]:
        """(lookups, index probes) made by the shard set since the mount."""
        return (self.shards.lookups, self.shards.probes)

    def per_process(self) -> List[int]:
        """Requests served by each process serving the mount."""
        return [sum(self.counts.values())]


#: One directory entry ready for readdir_reply:
#: (next_id, name, inode, is_dir, size, mtime_ns).
_Entry = Tuple[int, bytes, int, bool, int, int]


def _handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tell the hooks a request begins and ends, and turn an unexpected
    exception of a handler into EIO (and a log line).

    pyfuse3 only answers `FUSEError`; any other exception would escape its
    main loop and take the process down.
    """

    name = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: "ShardFS", *args: Any) -> Any:
        hooks = self.hooks
        hooks.begin(name)
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except ImageNotMapped as exc:
            log.warning("%s", exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except DatabaseUnavailable:  # logged once per outage by the Database
            raise pyfuse3.FUSEError(errno.EIO) from None
        except OSError as exc:
            log.error("%s%r failed: %s", name, args[:2], exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            log.exception("%s%r failed", name, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            hooks.end()

    return wrapper


def _erofs(name: str) -> Callable[..., Any]:
    async def handler(self: "ShardFS", *args: Any) -> Any:
        raise pyfuse3.FUSEError(errno.EROFS)

    handler.__name__ = name
    handler.__doc__ = f"{name}: always raises FUSEError(EROFS): the filesystem is read-only."
    return handler


class _Cache(collections.OrderedDict):
    """A small LRU mapping (listings a process computed and may reuse)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class ShardFS(pyfuse3.Operations):
    """A read-only pyfuse3 filesystem over the shards of a `ShardSet`.

    `layout` is a `shardfs.fuse.layout.Layout` (flat by default). `uid` and
    `gid` own every file and directory (default: the mounting user).
    `hooks` is what the process running the handlers provides (default: a
    `RequestHooks` counting in this process). `winery`, a
    `shardfs.fuse.winery.WineryView`, makes it a mount of a winery object
    storage: the shard set holds its images (numbered by shard id), keys
    it hides are refused, and keys no image holds are looked up in its
    database (their inodes carry `shardfs.fuse.layout.DB_INODE_FLAG`). The
    filesystem does not own the set: the caller closes it after
    `pyfuse3.close()`.
    """

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, shards: ShardSet, layout: Optional[Layout] = None, uid: Optional[int] = None,
                 gid: Optional[int] = None, hooks: Optional[RequestHooks] = None,
                 winery: Any = None) -> None:
        super().__init__()
        self.shards = shards
        self.winery = winery
        self.layout = layout or Layout.flat()
        self.hooks = hooks or RequestHooks(shards)
        self._uid = os.getuid() if uid is None else uid
        self._gid = os.getgid() if gid is None else gid
        mtimes = [m.mtime for m in shards.served()]
        self._dir_time_ns = _ns(max(mtimes) if mtimes else time.time())
        #: (directory inode, position, shard set version) -> entries.
        self._listings = _Cache(LISTING_CACHE_SIZE)

    def close(self) -> None:
        """Drop what the filesystem caches itself (the set is the caller's)."""
        self._listings.clear()

    # ------------------------------------------------------------ helpers

    def _attr(self, inode: int, mode: int, nlink: int, size: int, time_ns: int) -> pyfuse3.EntryAttributes:
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
        # du(1) counts st_blocks: the bytes the object takes in its shard.
        attr.st_blocks = (size + 511) // 512
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = time_ns
        return attr

    def _dir_attr(self, inode: int) -> pyfuse3.EntryAttributes:
        return self._attr(inode, stat.S_IFDIR | 0o555, 2, 0, self._dir_time_ns)

    def _file_attr(self, inode: int, size: int, member: MountedShard) -> pyfuse3.EntryAttributes:
        return self._attr(inode, stat.S_IFREG | 0o444, 1, size, _ns(member.mtime))

    def _negative_entry(self) -> pyfuse3.EntryAttributes:
        """A lookup answer that makes the kernel cache "no such name"."""
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = 0
        attr.entry_timeout = ENTRY_TIMEOUT
        attr.attr_timeout = ENTRY_TIMEOUT
        return attr

    def _lookup_object(self, key: bytes) -> pyfuse3.EntryAttributes:
        if self.winery is not None:
            loc = self.winery.locate(key)
            if loc is None:
                return self._negative_entry()
            if loc.member is None:
                return self._attr(self.winery.inode_for(key, loc.size), stat.S_IFREG | 0o444, 1,
                                  loc.size, self._dir_time_ns)
            found = (loc.member, loc.slot, loc.data_offset, loc.size)
        else:
            found = self.shards.find(key)
        if found is None:
            return self._negative_entry()
        member, slot, data_offset, size = found
        # The open that follows reads the object: start reading it now.
        member.shard.prefetch(data_offset, size, PREFETCH_BYTES)
        return self._file_attr(object_inode(member.number, slot), size, member)

    def _object(self, inode: int, opened: bool = False) -> Tuple[MountedShard, int, int]:
        """(shard, data_offset, size) of an object inode, read from its
        index slot now (so a takedown is seen at once). Raises ENOENT when
        the inode names nothing: a directory, an empty or deleted slot.
        Raises ESTALE when its shard is no longer served (unless `opened`:
        a file opened before the shard was removed keeps reading it) or
        was replaced under the mount: the kernel then looks the name up
        again (LOOKUP_REVAL) and finds the key where it is served now, or
        nowhere, even if it still cached the name."""
        split = split_object_inode(inode)
        if split is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        member = self.shards.get(split[0])
        if member is None or (member.removed and not opened):
            raise pyfuse3.FUSEError(errno.ESTALE)
        if split[1] >= member.slot_count:
            raise pyfuse3.FUSEError(errno.ENOENT)
        try:
            found = member.shard.slot(split[1])
        except OSError as exc:
            if exc.errno == errno.ESTALE:  # replaced: the rescan will notice
                raise pyfuse3.FUSEError(errno.ESTALE) from None
            raise
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if self.winery is not None and self.winery.reader.is_hidden(found[0], member.number):
            raise pyfuse3.FUSEError(errno.ENOENT)  # taken down in the database
        return (member, found[1], found[2])

    def _db_object(self, inode: int) -> Optional[Tuple[bytes, int]]:
        """(key, size) of a database object's inode; None when `inode` is
        not one. Raises ESTALE when its ring entry was overwritten (the
        kernel looks the name up again), ENOENT when the key is no object
        anymore, EIO when the database is needed and unavailable."""
        if self.winery is None or split_db_inode(inode) is None:
            return None
        entry = self.winery.resolve(inode)
        if entry is None:
            raise pyfuse3.FUSEError(errno.ESTALE)
        loc = self.winery.locate(entry[0])
        if loc is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return entry[0], loc.size

    def _split_dir(self, inode: int) -> Optional[Tuple[int, int]]:
        return self.layout.split_dir_inode(inode)

    # --------------------------------------------------------- name space

    @_handler
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        """Find `name` in directory `parent_inode`.

        Returns the attributes of an object or a directory, the parent
        directory's for "." and "..", or a negative entry (``st_ino = 0``,
        cached by the kernel for ENTRY_TIMEOUT) when nothing has that name:
        not 64 lowercase hex characters, a key no served shard holds, or
        (in a fan-out directory) a key that does not start with the
        directory's prefix. Raises ENOTDIR when `parent_inode` is an object.
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
            return self._lookup_object(key)
        if depth < self.layout.depth:
            width = self.layout.widths[depth]
            if len(name) == width and _HEX_DIGITS.issuperset(name):
                child = (prefix << (4 * width)) | int(name, 16)
                return self._dir_attr(self.layout.dir_inode(depth + 1, child))
        return self._negative_entry()

    async def forget(self, inode_list: Sequence[Tuple[int, int]]) -> None:
        """Kernel lookup references dropped: nothing to do, inodes carry
        their own location. Never raises (pyfuse3 requires it)."""
        self.hooks.begin("forget")
        self.hooks.end()

    @_handler
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        """Attributes of `inode`: a directory or an object.

        Raises ENOENT for an inode that names nothing (anymore).
        """
        if self._split_dir(inode) is not None:
            return self._dir_attr(inode)
        db = self._db_object(inode)
        if db is not None:
            return self._attr(inode, stat.S_IFREG | 0o444, 1, db[1], self._dir_time_ns)
        member, _, size = self._object(inode)
        return self._file_attr(inode, size, member)

    # -------------------------------------------------------------- files

    @_handler
    async def open(self, inode: int, flags: int, ctx: Any = None) -> pyfuse3.FileInfo:
        """Open an object for reading; the file handle is the inode.

        An object of at most PUSH_BYTES is read whole and pushed into the
        kernel's page cache, so its reads never reach the daemon. Returns a
        FileInfo with ``keep_cache=True``: the kernel keeps the pages it
        cached (the bytes never change but for a takedown, whose inode is
        invalidated). Raises EROFS for any write access flag, EISDIR for a
        directory, ENOENT for an inode that names nothing.
        """
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        if self._split_dir(inode) is not None:
            raise pyfuse3.FUSEError(errno.EISDIR)
        db = self._db_object(inode)
        if db is not None:
            key, size = db
            if 0 < size <= PUSH_BYTES:
                data = self.winery.read(key, 0, size)
                if data is None:
                    raise pyfuse3.FUSEError(errno.ENOENT)
                try:
                    pyfuse3.notify_store(inode, 0, data)
                except OSError as exc:
                    log.debug("notify_store of inode %d failed: %s", inode, exc)
            return pyfuse3.FileInfo(fh=inode, keep_cache=True)
        member, data_offset, size = self._object(inode)
        if 0 < size <= PUSH_BYTES:
            data = member.shard.pread(data_offset, size, 0, size)
            try:
                pyfuse3.notify_store(inode, 0, data)
            except OSError as exc:
                # Not fatal: the reads will come as READ requests instead.
                log.debug("notify_store of inode %d failed: %s", inode, exc)
        self.hooks.opened(member.number)  # last: a failed open gets no RELEASE
        return pyfuse3.FileInfo(fh=inode, keep_cache=True)

    @_handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        """Bytes [off, off+size) of the object whose inode is `fh`, clipped
        at its end (b"" at or after it). The slot is read again, so a
        deleted object raises ENOENT; EIO if the shard cannot be read."""
        db = self._db_object(fh)
        if db is not None:
            if off >= db[1] or size <= 0:
                return b""
            data = self.winery.read(db[0], off, size)
            if data is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return data
        member, data_offset, objsize = self._object(fh, opened=True)
        if off >= objsize or size <= 0:
            return b""
        return member.shard.pread(data_offset, objsize, off, size)

    @_handler
    async def flush(self, fh: int) -> None:
        """Always raises FUSEError(ENOSYS): the kernel then stops sending
        FLUSH (on every close) for the rest of the mount, one request per
        object saved. There is nothing to flush on a read-only filesystem."""
        raise pyfuse3.FUSEError(errno.ENOSYS)

    @_handler
    async def release(self, fh: int) -> None:
        """The kernel closed a file of inode `fh`. Returns None."""
        split = split_object_inode(fh)
        if split is not None:
            self.hooks.released(split[0])

    async def fsync(self, fh: int, datasync: bool) -> None:
        """Nothing to sync: returns None."""

    # -------------------------------------------------------- directories

    @_handler
    async def opendir(self, inode: int, ctx: Any = None) -> int:
        """Open a directory; the handle is its inode. Raises ENOTDIR for an
        object inode."""
        if self._split_dir(inode) is None:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    def _flat_batch(self, start_id: int) -> List[_Entry]:
        """Up to READDIR_BATCH objects of a flat root from position
        `start_id` (= shard number << OBJECT_SHIFT | slot) on, in that order, leaving
        out keys a lower-numbered shard serves. In a winery mount, the
        objects only in its database follow, from position
        DB_LISTING_BASE + their index in this process's listing of them."""
        if start_id < DB_LISTING_BASE:
            out = self._flat_image_batch(start_id)
            if out or self.winery is None:
                return out
            start_id = DB_LISTING_BASE
        if self.winery is None:
            return []
        index = start_id - DB_LISTING_BASE
        out = []
        for key, size in self.winery.table_listing(self.shards.version)[index:index + READDIR_BATCH]:
            index += 1
            out.append((DB_LISTING_BASE + index, key.hex().encode("ascii"),
                        self.winery.inode_for(key, size), False, size, self._dir_time_ns))
        return out

    def _flat_image_batch(self, start_id: int) -> List[_Entry]:
        number, slot = start_id >> OBJECT_SHIFT, start_id & SLOT_MASK
        hidden = self.winery.reader.is_hidden if self.winery is not None else None
        out: List[_Entry] = []
        for member in self.shards.served():
            if member.number < number:
                continue
            first = slot if member.number == number else 0

            def corrupt(count: int, member: MountedShard = member, first: int = first) -> None:
                log.warning("%s: %d slot(s) from slot %d on point outside the objects section: "
                            "left out of the listing (run shardfs check)", member.path, count, first)

            time_ns = _ns(member.mtime)
            for slot_, key, _, size in member.shard.scan(first, READDIR_BATCH, on_corrupt=corrupt):
                if hidden is not None and hidden(key, member.number):
                    continue  # taken down in the database
                if member.number and self.shards.find(key, below=member.number, count=False) is not None:
                    continue  # served by a lower-numbered shard
                pos = (member.number << OBJECT_SHIFT) | slot_
                out.append((pos + 1, key.hex().encode("ascii"), object_inode(member.number, slot_),
                            False, size, time_ns))
                if len(out) >= READDIR_BATCH:
                    return out
            if out:
                return out
        return out

    def _child_entries(self, depth: int, prefix: int) -> List[_Entry]:
        """The non-empty subdirectories of a fan-out directory, in name
        order (all of them while a shard has no sidecar)."""
        width = self.layout.widths[depth]
        nbits = 4 * self.layout.prefix_len(depth + 1)
        children = range(prefix << (4 * width), (prefix + 1) << (4 * width))
        nonempty = set()
        for member in self.shards.served():
            sc = member.sidecar
            if sc is None:  # no sidecar (yet): cannot tell, list them all
                nonempty = set(children)
                break
            for child in children:
                if child in nonempty:
                    continue
                begin, end = sc.range(_prefix_bytes(child, nbits), nbits)
                if end > begin:
                    nonempty.add(child)
        if self.winery is not None and len(nonempty) < len(children):
            from shardfs.fuse.winery import key_range

            # Children holding objects only in the database's write shards.
            width_hex = self.layout.prefix_len(depth + 1)
            for key, _ in self.winery.table_range(*key_range(self.layout.prefix_hex(depth, prefix))):
                nonempty.add(int(key.hex()[:width_hex], 16))
        # An entry's position is its child number + 1 (names sort as numbers):
        # a listing resumed in another READDIR, maybe in another process, or
        # after the shard set changed (a sidecar became ready), goes on
        # after the last name returned instead of at an index into a list
        # that may have changed meanwhile (which skipped names).
        return [(child + 1, self.layout.child_name(depth + 1, child), self.layout.dir_inode(depth + 1, child),
                 True, 0, self._dir_time_ns) for child in sorted(nonempty)]

    def _leaf_entries(self, depth: int, prefix: int) -> List[_Entry]:
        """The objects of a fan-out leaf directory, by key (a shard without
        a sidecar yet is scanned whole)."""
        hexprefix = self.layout.prefix_hex(depth, prefix)
        nbits = 4 * len(hexprefix)
        pbytes = _prefix_bytes(prefix, nbits)
        best: Dict[bytes, Tuple[MountedShard, int, int]] = {}
        hidden = self.winery.reader.is_hidden if self.winery is not None else None
        for member in self.shards.served():
            sc = member.sidecar
            if sc is not None:
                begin, end = sc.range(pbytes, nbits)
                # In slot order: index reads then go forward through the file.
                items = ((s, member.shard.slot(s)) for s in sorted(sc.slots(begin, end)))
            else:  # no sidecar: scan the whole index (slow, but right)
                items = ((s, (k, o, z)) for s, k, o, z in member.shard.scan(0, 65536)
                         if k.hex().startswith(hexprefix))
            for slot, item in items:
                if item is None:
                    continue  # deleted since the sidecar was built
                key, _, size = item
                if key in best or not key.hex().startswith(hexprefix):
                    continue
                if hidden is not None and hidden(key, member.number):
                    continue  # taken down in the database
                best[key] = (member, slot, size)
        entries: Dict[bytes, Tuple[int, int, int]] = {
            key: (object_inode(member.number, slot), size, _ns(member.mtime))
            for key, (member, slot, size) in best.items()}
        if self.winery is not None:
            from shardfs.fuse.winery import key_range

            for key, size in self.winery.table_range(*key_range(hexprefix)):
                if key not in entries:
                    entries[key] = (self.winery.inode_for(key, size), size, self._dir_time_ns)
        out = []
        for key in sorted(entries):
            inode, size, time_ns = entries[key]
            out.append((len(out) + 1, key.hex().encode("ascii"), inode, False, size, time_ns))
        return out

    def _listing_version(self) -> Any:
        """What a cached listing is valid for: the shard set's version,
        and in a winery mount the current POLL_SECONDS period too (its
        database gets new objects without the set changing)."""
        if self.winery is None:
            return self.shards.version
        return (self.shards.version, int(time.monotonic() / POLL_SECONDS))

    def _entries(self, inode: int, start_id: int) -> Sequence[_Entry]:
        """Entries of directory `inode` from position `start_id` on (all of
        them for a fan-out directory; a batch for a flat root). Computed
        from the shard set alone, so any process gives the same answer;
        cached per process for the listing's next READDIR."""
        depth, prefix = self.layout.split_dir_inode(inode)
        flat = depth == 0 and self.layout.is_flat
        key = (inode, start_id if flat else 0, self._listing_version())
        entries = self._listings.pop(key, None)
        if entries is None:
            if flat:
                entries = self._flat_batch(start_id)
            elif depth < self.layout.depth:
                entries = self._child_entries(depth, prefix)
            else:
                entries = self._leaf_entries(depth, prefix)
        if flat:
            return entries
        self._listings.put(key, entries)
        if depth < self.layout.depth:  # positions are child numbers + 1
            return entries[_after(entries, start_id):]
        return entries[start_id:]

    @_handler
    async def readdir(self, fh: int, start_id: int, token: Any) -> None:
        """List directory `fh` (its inode) from position `start_id`.

        Flat root: objects by (shard number, slot); a fan-out directory:
        its non-empty subdirectories or its objects, by name. An entry's
        `next_id` is the position just after it, so a listing resumes
        exactly after the last entry the kernel accepted, in any process.
        No "." or ".." entries. Returns None.
        """
        if self._split_dir(fh) is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        flat = self.layout.is_flat and fh == ROOT_INODE
        while True:
            entries = self._entries(fh, start_id)
            if not entries:
                return
            for i, (next_id, name, inode, is_dir, size, time_ns) in enumerate(entries):
                if is_dir:
                    attr = self._dir_attr(inode)
                else:
                    attr = self._attr(inode, stat.S_IFREG | 0o444, 1, size, time_ns)
                if not pyfuse3.readdir_reply(token, name, attr, next_id):
                    # Kernel buffer full: keep the rest for the next call.
                    if flat:
                        self._listings.put((fh, start_id, self._listing_version()), entries[i:])
                    return
                start_id = next_id
            if not flat:
                return

    @_handler
    async def releasedir(self, fh: int) -> None:
        """Nothing to forget (the handle is the inode); returns None."""

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        """Nothing to sync: returns None."""

    # -------------------------------------------------- filesystem-wide

    @_handler
    async def statfs(self, ctx: Any = None) -> pyfuse3.StatvfsData:
        """Filesystem statistics: the served shards' extents in 4 KiB
        blocks, none free; their objects as files (the live count of the
        shard's sidecar when the coordinator read it, else the header's
        object count), none free; names of 64 bytes."""
        served = self.shards.served()
        data = pyfuse3.StatvfsData()
        data.f_bsize = 4096
        data.f_frsize = 4096
        data.f_blocks = sum(math.ceil(m.extent / 4096) for m in served)
        data.f_bfree = 0
        data.f_bavail = 0
        data.f_files = sum(m.objects_count if m.live_count is None else m.live_count for m in served)
        data.f_ffree = 0
        data.f_favail = 0
        data.f_namemax = NAME_SIZE
        return data

    @_handler
    async def access(self, inode: int, mode: int, ctx: Any = None) -> bool:
        """True for F_OK/R_OK/X_OK; raises EROFS when W_OK is asked.

        (Not called by the kernel when mounted with default_permissions.)
        """
        if mode & os.W_OK:
            raise pyfuse3.FUSEError(errno.EROFS)
        if self._split_dir(inode) is None and self._db_object(inode) is None:
            self._object(inode)
        return True

    # ------------------------------------------------------------ xattrs

    def stats(self) -> Dict[str, Any]:
        """Counters of the shard set: shards served, sidecars ready,
        lookups and index probes made by them, objects in the headers, and
        the requests served by each worker process (a list)."""
        served = self.shards.served()
        lookups, probes = self.hooks.lookups()
        return {
            "shards": len(served),
            "sidecars": sum(1 for m in served if m.sidecar_dir is not None),
            "lookups": lookups,
            "index_probes": probes,
            "objects": sum(m.objects_count for m in served),
            "workers": self.hooks.per_process(),
            "index": self.shards.index.stats() if self.shards.index is not None else None,
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
                return json.dumps(self.hooks.requests(), sort_keys=True).encode()
            if name == STATS_XATTR:
                return json.dumps(self.stats(), sort_keys=True).encode()
        elif self._split_dir(inode) is None and name in (SHARD_XATTR, OFFSET_XATTR):
            if self._db_object(inode) is not None:
                raise pyfuse3.FUSEError(pyfuse3.ENOATTR)  # in a database, not a shard
            member, data_offset, _ = self._object(inode)
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
            if self._db_object(inode) is not None:
                return []
            self._object(inode)
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


def _after(entries: Sequence[_Entry], position: int) -> int:
    """Index of the first of `entries` (sorted by position, their next_id)
    whose position is above `position`: a binary search."""
    lo, hi = 0, len(entries)
    while lo < hi:
        mid = (lo + hi) // 2
        if entries[mid][0] <= position:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _prefix_bytes(value: int, nbits: int) -> bytes:
    """The first `nbits` bits `value` stands for, left-aligned in bytes."""
    nbytes = (nbits + 7) // 8
    return (value << (8 * nbytes - nbits)).to_bytes(nbytes, "big") if nbytes else b""
