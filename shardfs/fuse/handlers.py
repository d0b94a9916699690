"""The request handlers: Read Shards seen as one read-only tree.

Every object is a regular file named by its key, 64 lowercase hex
characters, whose bytes are the object's bytes; nothing can be written.
Where names are listed depends on the layout (`shardfs.fuse.layout`): the
root lists every object (``flat``) or directories sliced from the key's hex
(``fanout``, ``MOUNT/ab/cd/<key>``); in both, ``MOUNT/<key>`` is found by
lookup. A key held by several shards appears once, from the shard with the
lowest number (`shardfs.shardset`).

Inodes encode where an object is: ``(shard number + 1) << 32 | slot``, so
the filesystem keeps no table of the inodes the kernel knows (its memory
does not grow with what is read or listed); an inode is resolved from its
slot when needed.

The requests are parsed and answered by the C request path
(``shardfs._shardfs.Session``, ``shardfs/c/ll.h``): it serves alone what
needs no Python (OPEN is answered ENOSYS, the kernel's no-open mode: no
OPEN, FLUSH or RELEASE ever reaches the daemon; IOCTL, FORGET, writes;
GETXATTR of a name the inode does not have, LISTXATTR of a directory other
than the root; and LOOKUP, GETATTR and READ of objects in shards open in
the process), and
calls these handlers for the rest, one at a time per process, from any of
its threads. Each handler returns plain values (an entry is ``(inode,
is_dir, size, time_ns)``) or raises `FUSEError`. Several processes serve
one FUSE connection (`shardfs.fuse.worker`), so the READs of one file, or
the READDIR calls of one listing, may each reach another process:

* No state a later request needs: READ resolves the inode's slot again
  (which also makes a takedown effective at once), and a listing position
  is computed from the shard set (a shard number and slot for a flat root,
  a child number for a fan-out directory, bits of the key for a fan-out
  leaf). What a handler remembers between requests is a cache that
  any process may rebuild.
* A handler does its I/O inline (the C core releases the GIL).
* What the handlers must tell the process that runs them (a request began
  or ended) goes through `RequestHooks`.

Caching by the kernel: names and attributes are cached for `CACHE_TIMEOUT`
(a year: what changes an object in place is a takedown, and the
coordinator invalidates those inodes; the names of a shard that is removed
or replaced are invalidated by the coordinator too); the absence of a name
only for `ENTRY_TIMEOUT`, so that a shard added under the mount is seen
within that bound. In no-open mode the kernel keeps an object's pages
between opens.

A handler may only raise `FUSEError`; the C caller answers EIO to anything
else, and every handler is wrapped so an unexpected exception is logged
and answered with EIO.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import functools
import json
import logging
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from shardfs import __version__ as shardfs_version
from shardfs import _shardfs
from shardfs import sidecar as sidecar_mod
from shardfs.errors import RESOURCE_ERRORS, ShardError
from shardfs.fuse.layout import (HASH_DIR_INODES, OBJECT_SHIFT, ROOT_INODE, SLOT_MASK, Layout, object_inode,
                                 split_db_inode, split_object_inode)
from shardfs.hashes import DIGEST_SIZE, parse_swhid
from shardfs.shardset import MountedShard, ShardSet
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

# The extended attributes are named once, in C (shardfs/c/ll.h), where
# the request path answers every other name ENODATA without these handlers.
#: Extended attribute of the root: requests served, by kind, as JSON.
REQUESTS_XATTR = _shardfs.XATTR_REQUESTS.encode()
#: Extended attribute of the root: shards, sidecars, lookups and index
#: probes, as JSON.
STATS_XATTR = _shardfs.XATTR_STATS.encode()
#: Extended attribute of an object: the path of the shard serving it.
SHARD_XATTR = _shardfs.XATTR_SHARD.encode()
#: Extended attribute of an object: the byte offset of its first byte in
#: the shard (after its 8-byte size field), decimal ASCII.
OFFSET_XATTR = _shardfs.XATTR_OFFSET.encode()

#: Bytes of an object read ahead when it is looked up (the READ that
#: follows asks for up to 128 KiB of it).
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

#: Bits of a key, after its fan-out leaf's prefix, that make its listing
#: position (`_leaf_position`).
LEAF_POSITION_BITS = 62

#: What the C resolver (``shardfs/c/ll_resolve.h``, `shardfs._shardfs.Resolver`)
#: answers, and what `fast_state` says of a shard number that is not served.
RESOLVE_FOUND, RESOLVE_ABSENT, RESOLVE_STALE = _shardfs.RESOLVE_FOUND, _shardfs.RESOLVE_ABSENT, _shardfs.RESOLVE_STALE
RESOLVE_OPEN, RESOLVE_FAILED = _shardfs.RESOLVE_OPEN, _shardfs.RESOLVE_FAILED
RESOLVE_NOT_OBJECT = _shardfs.RESOLVE_NOT_OBJECT

_HEX_DIGITS = frozenset(b"0123456789abcdef")
#: Bytes of an object's name: its key in hex.
NAME_SIZE = 2 * KEY_SIZE


class FUSEError(Exception):
    """The answer of a request that failed: `errno` (an errno value)."""

    def __init__(self, errno_: int) -> None:
        super().__init__(errno_)
        self.errno = errno_

    def __str__(self) -> str:
        return os.strerror(self.errno)


#: What a handler answers for an inode: (inode, is_dir, size in bytes,
#: mtime in ns since the epoch). The C request path adds the mode (0555
#: for a directory, 0444 for an object), links, owner and cache timeouts.
Entry = Tuple[int, bool, int, int]


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


#: One directory entry ready for `DirBuffer.add`:
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

    def requests(self) -> Dict[str, int]:
        """Requests served since the mount, by kind."""
        return dict(self.counts)

    def python_requests(self) -> Dict[str, int]:
        """Requests that reached these handlers since the mount, by
        handler name (here: every request counted)."""
        return dict(self.counts)

    def lookups(self) -> Tuple[int, int]:
        """(lookups, index probes) made by the shard set since the mount."""
        return (self.shards.lookups, self.shards.probes)

    def hash_probes(self) -> int:
        """Hash indexes asked by lookups by sha1 or sha1_git since the mount."""
        return self.shards.hashes.probes if self.shards.hashes is not None else 0

    def pushes(self) -> Tuple[int, int]:
        """(objects pushed into the kernel's page cache ahead of their
        reads, pushes the kernel refused: it no longer had the inode)
        since the mount; counted by the C request path of worker processes
        only (0, 0 here)."""
        return (0, 0)

    def restarts(self) -> int:
        """Worker processes that died and were replaced since the mount
        (none here: one process)."""
        return 0

    def coordinator_restarts(self) -> int:
        """Coordinators started since the mount after one died (none here:
        one process)."""
        return 0

    def written(self) -> Dict[str, int]:
        """What the workers wrote to the FUSE device (`shardfs.fuse.shared.
        SharedState.written`: bytes answered and pushed, error answers);
        not counted here (zeros)."""
        return {"reply_bytes": 0, "pushed_bytes": 0, "errors": 0}

    def per_process(self) -> List[int]:
        """Requests served by each process serving the mount."""
        return [sum(self.counts.values())]



def _handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tell the hooks a request begins and ends, and turn an unexpected
    exception of a handler into EIO (and a log line)."""

    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: "ShardFS", *args: Any) -> Any:
        hooks = self.hooks
        hooks.begin(name)
        try:
            return fn(self, *args)
        except FUSEError:
            raise
        except ImageNotMapped as exc:
            log.warning("%s", exc)
            raise FUSEError(errno.EIO) from None
        except DatabaseUnavailable:  # logged once per outage by the Database
            raise FUSEError(errno.EIO) from None
        except OSError as exc:
            log.error("%s%r failed: %s", name, args[:2], exc)
            raise FUSEError(errno.EIO) from None
        except Exception:
            log.exception("%s%r failed", name, args[:2])
            raise FUSEError(errno.EIO) from None
        finally:
            hooks.end()

    return wrapper


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


class ShardFS:
    """The handlers of a read-only filesystem over the shards of a `ShardSet`.

    `layout` is a `shardfs.fuse.layout.Layout` (flat by default). `uid` and
    `gid` own every file and directory (default: the mounting user).
    `hooks` is what the process running the handlers provides (default: a
    `RequestHooks` counting in this process). `winery`, a
    `shardfs.fuse.winery.WineryView`, makes it a mount of a winery object
    storage: the shard set holds its images (numbered by shard id), keys
    it hides are refused, and keys no image holds are looked up in its
    database (their inodes carry `shardfs.fuse.layout.DB_INODE_FLAG`). The
    filesystem does not own the set: the caller closes it after the
    session ends. `uid`, `gid`, `CACHE_TIMEOUT` and `ENTRY_TIMEOUT` are
    given to the session, which fills the attributes.
    """

    def __init__(self, shards: ShardSet, layout: Optional[Layout] = None, uid: Optional[int] = None,
                 gid: Optional[int] = None, hooks: Optional[RequestHooks] = None,
                 winery: Any = None) -> None:
        self.shards = shards
        self.winery = winery
        self.layout = layout or Layout.flat()
        self.hooks = hooks or RequestHooks(shards)
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        mtimes = [m.mtime for m in shards.served()]
        self._dir_time_ns = _ns(max(mtimes) if mtimes else time.time())
        #: (directory inode, position, shard set version) -> entries.
        self._listings = _Cache(LISTING_CACHE_SIZE)
        #: (what it was made from, the tuple): see `fast_state`.
        self._fast: Tuple[Any, Any] = (None, None)
        #: (fast_state tuple, table generation, `shardfs._shardfs.Resolver`):
        #: see `_resolver`.
        self._resolver_of: Tuple[Any, int, Any] = (None, -1, None)
        #: Removed shards opened here for reads of files opened before their
        #: removal (counted: a new one makes a new snapshot).
        self._removed_opens = 0
        #: Publishes the set as it is now to the requests answered in C
        #: (`shardfs._shardfs.Session.refresh`, set by the mount), which
        #: otherwise take it after each handler.
        self.republish: Callable[[], None] = lambda: None
        #: Inode -> hash name of the directories of names by another hash.
        self._hash_dirs: Dict[int, str] = {HASH_DIR_INODES[n]: n for n in shards.hashes.names} \
            if shards.hashes is not None else {}

    def close(self) -> None:
        """Drop what the filesystem caches itself (the set is the caller's)."""
        self._listings.clear()
        self._fast = (None, None)
        self._resolver_of = (None, -1, None)
        self.republish = lambda: None

    def fast_state(self) -> Any:
        """What the C request path needs to answer LOOKUP, GETATTR and READ
        without calling the handlers (``shardfs/c/ll_fast.c``), taken again
        after every handler: None in a winery mount (every request comes
        here: hidden keys, objects only in the database), else a
        `shardfs.shardset.SnapshotState` of the set (its shards' mtimes,
        the layout, the table sequence applied, the sidecars for pushes in
        key order, the names by other hashes, the removed shards still open
        here). The same object is returned while none of it changed, so
        that the C side rebuilds nothing (``shardfs/c/ll_snapshot.c``
        builds a snapshot of it)."""
        if self.winery is not None:
            return None
        shards = self.shards
        levels, maps = shards.index.lookup_args if shards.index is not None else ((), ())
        hashes = shards.hashes
        made_of = (shards.version, levels, maps, getattr(self.hooks, "seen", 0),
                   hashes.generation if hashes is not None else None, self._removed_opens)
        old, state = self._fast
        if old is not None and old[0] == made_of[0] and old[1] is levels and old[2] is maps \
                and old[3] == made_of[3] and old[4] == made_of[4] and old[5] == made_of[5]:
            return state
        base = shards.resolver_state(mtimes=True, hash_dirs=HASH_DIR_INODES)
        removed_open = []
        for member in shards.shards.values():
            shard = (member.held or shards.open_shards.items.get(member.number)) if member.removed else None
            if shard is not None:
                removed_open.append((member.number, shard.reader))
        prefixes = tuple(self.layout.prefix_len(d) for d in range(1, self.layout.depth + 1))
        orders = [None] * len(base.states)  # sidecars: slots in key order, for pushes ahead
        for member in shards.served():
            if member.sidecar_dir is not None and member.identity:
                orders[member.number] = (os.fsencode(sidecar_mod.sidecar_path(member.sidecar_dir, member.identity)),
                                         member.identity)
        state = dataclasses.replace(base, prefix_lengths=prefixes, dir_time_ns=self._dir_time_ns,
                                    applied=made_of[3], orders=tuple(orders), removed_open=tuple(removed_open))
        self._fast = (made_of, state)
        return state

    # ------------------------------------------------------------ helpers

    def _dir_attr(self, inode: int) -> Entry:
        return (inode, True, 0, self._dir_time_ns)

    def _file_attr(self, inode: int, size: int, member: MountedShard) -> Entry:
        return (inode, False, size, _ns(member.mtime))

    def _resolver(self) -> Any:
        """The C resolver (`shardfs._shardfs.Resolver`) over the shard set
        as it is now: made again when `fast_state` or what it holds
        changed (a shard opened, closed, added, removed)."""
        state, generation, resolver = self._resolver_of
        now_state, now_generation = self.fast_state(), _shardfs.table_generation()
        if resolver is None or state is not now_state or generation != now_generation:
            resolver = _shardfs.Resolver(now_state)
            self._resolver_of = (now_state, now_generation, resolver)
        return resolver

    def _open(self, number: int) -> int:
        """Open shard `number` in this process (within the set's bound on
        open shards), so that the resolver can ask it: 0, or the errno of
        why it cannot be: ESTALE (unknown here, replaced since it was
        mounted, or removed and its file gone), EIO (unreadable: logged
        once). Raises FUSEError(EIO) when
        the process is out of descriptors or memory (a lookup must not
        pass such a shard over: the key would be answered absent)."""
        member = self.shards.get(number)
        if member is None:
            return errno.ESTALE
        self._resolver_of = (None, -1, None)  # its snapshot would keep the shard closed to make room open
        try:
            self.shards.open_for_resolver(member)
        except OSError as exc:
            if exc.errno == errno.ESTALE:
                return errno.ESTALE
            if exc.errno in RESOURCE_ERRORS:  # logged; no reason to pass the shard over
                raise FUSEError(errno.EIO) from None
            if member.removed and exc.errno == errno.ENOENT:
                return errno.ESTALE  # removed, and its file gone: the inode is stale, nothing is broken
            self.shards._open_failed(member, exc)
            return errno.EIO
        except ShardError as exc:
            self.shards._open_failed(member, exc)
            return errno.EIO
        if member.removed:
            self._removed_opens += 1  # fast_state gives it to the resolver
        self.republish()  # the requests answered in C let go of the shard closed to make room
        return 0

    def _failed(self, value: Tuple[int, str, bool]) -> FUSEError:
        """Log a shard the resolver could not read; the error to answer."""
        number, what, _ = value
        member = self.shards.get(number)
        log.error("shard %s (number %d): %s (run shardfs check)", member.path if member else "?", number, what)
        return FUSEError(errno.EIO)

    def _resolve(self, ask: Callable[[Any, int], Tuple[int, Any]], lookup: bool = False) -> Tuple[int, Any]:
        """Ask the resolver (``ask(resolver, start)``) until it answers
        something else than a shard to open: each such shard is opened and
        the question asked again (a lookup from that shard's number on:
        the candidates before it were asked already). Raises FUSEError:
        EIO for a shard that cannot be read; for an inode, the errno of
        `_open` when its shard cannot be opened (a lookup passes such a
        candidate over)."""
        start, opened = 0, set()
        while True:
            code, value = ask(self._resolver(), start)
            if code == RESOLVE_FAILED:
                raise self._failed(value)
            if code != RESOLVE_OPEN:
                return code, value
            if value in opened:  # opened, yet not in the snapshot (past OpenShards' bound)
                raise FUSEError(errno.EIO)
            opened.add(value)
            err = self._open(value)
            if err and not lookup:
                raise FUSEError(err)
            start = value + 1 if err else value

    def _lookup_object(self, parent: int, name: bytes) -> Any:
        """The entry of the object `name` stands for in directory `parent`
        (the resolver: a key, a digest in MOUNT/sha1 or MOUNT/sha1_git, a
        SWHID), None when there is none, or RESOLVE_NOT_OBJECT when `name`
        is not an object's name there."""
        code, value = self._resolve(lambda resolver, start: resolver.lookup(parent, name, start), lookup=True)
        if code == RESOLVE_NOT_OBJECT:
            return RESOLVE_NOT_OBJECT
        probes = value[5] if code == RESOLVE_FOUND else value
        if len(name) == NAME_SIZE:  # counted as the C request path counts
            self.shards.lookups += 1
            self.shards.probes += probes
        elif self.shards.hashes is not None:  # by sha1 or sha1_git: hash index probes
            self.shards.hashes.probes += probes
        return (value[0], False, value[1], value[2]) if code == RESOLVE_FOUND else None

    def _inode(self, inode: int, for_read: bool = False) -> Tuple[int, int, int, int]:
        """(shard number, offset, size, mtime_ns) of the object `inode`
        names, its slot read now (a takedown is seen at once). Raises
        FUSEError: ENOENT when it names nothing (a directory, an empty or
        deleted slot), ESTALE when its shard is no longer served (unless
        `for_read`: a shard removed but still open here is read, for files
        opened before its removal) or was replaced: the kernel then looks
        the name up again and finds the key where it is served now."""
        code, value = self._resolve(lambda resolver, start: resolver.inode(inode, for_read))
        if code == RESOLVE_FOUND:
            _, size, mtime_ns, number, offset, _ = value
            return number, offset, size, mtime_ns
        raise FUSEError(errno.ESTALE if code == RESOLVE_STALE else errno.ENOENT)

    def _object(self, inode: int, opened: bool = False) -> Tuple[MountedShard, int, int]:
        """(shard, data_offset, size) of an object inode (see `_inode`; a
        winery mount also hides the keys its database took down)."""
        if self.winery is None:
            number, offset, size, _ = self._inode(inode, opened)
            return self.shards.get(number), offset, size
        split = split_object_inode(inode)
        if split is None:
            raise FUSEError(errno.ENOENT)
        member = self.shards.get(split[0])
        if member is None or (member.removed and not opened):
            raise FUSEError(errno.ESTALE)
        if split[1] >= member.slot_count:
            raise FUSEError(errno.ENOENT)
        try:
            found = member.shard.slot(split[1])
        except OSError as exc:
            if exc.errno == errno.ESTALE:  # replaced: the rescan will notice
                raise FUSEError(errno.ESTALE) from None
            raise
        if found is None:
            raise FUSEError(errno.ENOENT)
        if self.winery.reader.is_hidden(found[0], member.winery_shard):
            raise FUSEError(errno.ENOENT)  # taken down in the database
        return (member, found[1], found[2])

    def _winery_object(self, key: bytes) -> Optional[Entry]:
        """The entry of `key` in a winery mount: an image's object unless
        the database hides it, else an object only in the database."""
        loc = self.winery.locate(key)
        if loc is None:
            return None
        if loc.member is None:
            return (self.winery.inode_for(key, loc.size), False, loc.size, self._dir_time_ns)
        loc.member.shard.prefetch(loc.data_offset, loc.size, PREFETCH_BYTES)
        return self._file_attr(object_inode(loc.member.number, loc.slot), loc.size, loc.member)

    def _db_object(self, inode: int) -> Optional[Tuple[bytes, int]]:
        """(key, size) of a database object's inode; None when `inode` is
        not one. Raises ESTALE when its ring entry was overwritten (the
        kernel looks the name up again), ENOENT when the key is no object
        anymore, EIO when the database is needed and unavailable."""
        if self.winery is None or split_db_inode(inode) is None:
            return None
        entry = self.winery.resolve(inode)
        if entry is None:
            raise FUSEError(errno.ESTALE)
        loc = self.winery.locate(entry[0])
        if loc is None:
            raise FUSEError(errno.ENOENT)
        return entry[0], loc.size

    def _split_dir(self, inode: int) -> Optional[Tuple[int, int]]:
        """(depth, prefix) of a directory inode of the layout, (-1, 0) for
        a directory of names by another hash, None for anything else."""
        if inode in self._hash_dirs:
            return (-1, 0)
        return self.layout.split_dir_inode(inode)

    def _lookup_hash(self, name: str, digest: bytes) -> Optional[Entry]:
        """The entry of the object whose `name` digest is `digest`: the
        inode of its slot, as under its key (`shardfs.hashes.HashSet.find`
        hashes it again first)."""
        found = self.shards.hashes.find(name, digest)
        if found is None:
            if self.winery is None:
                return None
            try:  # an object still in a write shard table
                key = self.winery.find_by_hash(self.shards.hashes.names, name, digest)
            except DatabaseUnavailable:
                raise FUSEError(errno.EIO) from None
            return None if key is None else self._winery_object(key)
        member, slot, data_offset, size = found
        member.shard.prefetch(data_offset, size, PREFETCH_BYTES)
        return self._file_attr(object_inode(member.number, slot), size, member)

    # --------------------------------------------------------- name space

    @_handler
    def lookup(self, parent_inode: int, name: bytes) -> Optional[Entry]:
        """Find `name` in directory `parent_inode`.

        Returns the entry of an object or a directory, the parent
        directory's for "." and "..", or None (a negative entry, cached by
        the kernel for ENTRY_TIMEOUT) when nothing has that name:
        not 64 lowercase hex characters, a key no served shard holds, or
        (in a fan-out directory) a key that does not start with the
        directory's prefix. Raises ENOTDIR when `parent_inode` is an object.
        """
        if self.winery is None:  # objects: the C resolver
            found = self._lookup_object(parent_inode, name)
            if found is not RESOLVE_NOT_OBJECT:
                return found
        where = self._split_dir(parent_inode)
        if where is None:
            raise FUSEError(errno.ENOTDIR)
        depth, prefix = where
        if name == b".":
            return self._dir_attr(parent_inode)
        if depth < 0:  # MOUNT/sha1 or MOUNT/sha1_git
            if name == b"..":
                return self._dir_attr(ROOT_INODE)
            if len(name) != 2 * DIGEST_SIZE or not _HEX_DIGITS.issuperset(name):
                return None
            return self._lookup_hash(self._hash_dirs[parent_inode], bytes.fromhex(name.decode("ascii")))
        if depth == 0 and self._hash_dirs:
            text = name.decode("ascii", "replace")
            if text in self.shards.hashes.names:
                return self._dir_attr(HASH_DIR_INODES[text])
            if "sha1_git" in self.shards.hashes.names:
                digest = parse_swhid(text)
                if digest is not None:
                    return self._lookup_hash("sha1_git", digest)
        if name == b"..":
            if depth <= 1:
                return self._dir_attr(ROOT_INODE)
            width = self.layout.widths[depth - 1]
            return self._dir_attr(self.layout.dir_inode(depth - 1, prefix >> (4 * width)))
        key = parse_name(name)
        if key is not None:
            if depth and not name.startswith(self.layout.prefix_hex(depth, prefix).encode()):
                return None
            if depth not in (0, self.layout.depth):
                return None  # objects live at the root or in leaves
            return self._winery_object(key)
        if depth < self.layout.depth:
            width = self.layout.widths[depth]
            if len(name) == width and _HEX_DIGITS.issuperset(name):
                child = (prefix << (4 * width)) | int(name, 16)
                return self._dir_attr(self.layout.dir_inode(depth + 1, child))
        return None

    @_handler
    def getattr(self, inode: int) -> Entry:
        """Attributes of `inode`: a directory or an object.

        Raises ENOENT for an inode that names nothing (anymore).
        """
        if self._split_dir(inode) is not None:
            return self._dir_attr(inode)
        if self.winery is None:
            _, _, size, mtime_ns = self._inode(inode)
            return (inode, False, size, mtime_ns)
        db = self._db_object(inode)
        if db is not None:
            return (inode, False, db[1], self._dir_time_ns)
        member, _, size = self._object(inode)
        return self._file_attr(inode, size, member)

    # -------------------------------------------------------------- files

    @_handler
    def read(self, inode: int, off: int, size: int) -> bytes:
        """Bytes [off, off+size) of the object `inode` names, clipped at its
        end (b"" at or after it). The slot is read again, so a deleted
        object raises ENOENT; EIO if the shard cannot be read. A shard
        removed from the mount still answers until the coordinator closes
        it, once no process has a file open on it (READ comes from files
        opened before the removal: the kernel sends no OPEN in no-open
        mode)."""
        if self.winery is None:
            code, value = self._resolve(lambda resolver, start: resolver.read(inode, max(off, 0), max(size, 0)))
            if code == RESOLVE_FOUND:
                return value
            raise FUSEError(errno.ESTALE if code == RESOLVE_STALE else errno.ENOENT)
        if split_db_inode(inode) is not None:
            entry = self.winery.resolve(inode)  # (key, size)
            if entry is None:
                raise FUSEError(errno.ESTALE)
            if off >= entry[1] or size <= 0:
                return b""
            data = self.winery.read(entry[0], off, size)  # one query when in a table
            if data is None:
                raise FUSEError(errno.ENOENT)
            return data
        member, data_offset, objsize = self._object(inode, opened=True)
        if off >= objsize or size <= 0:
            return b""
        return member.shard.pread(data_offset, objsize, off, size)

    # -------------------------------------------------------- directories

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
                if hidden is not None and hidden(key, member.winery_shard):
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
        a sidecar yet is scanned whole); an entry's next_id is
        `_leaf_position` of its key + 1."""
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
                if hidden is not None and hidden(key, member.winery_shard):
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
        # Positions come from the keys, as children's from their numbers: a
        # listing resumes after the last key returned whatever was added,
        # removed or taken down meanwhile (an index into the listing of the
        # moment skipped or repeated names).
        return [(_leaf_position(key, nbits) + 1, key.hex().encode("ascii"), inode, False, size, time_ns)
                for key, (inode, size, time_ns) in sorted(entries.items())]

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
        return entries[_after(entries, start_id):]

    @_handler
    def readdir(self, inode: int, start_id: int, reply: Any) -> None:
        """List directory `inode` from position `start_id` into `reply` (a
        `shardfs._shardfs.DirBuffer`: its ``add`` returns False once the
        kernel's buffer is full).

        Flat root: objects by (shard number, slot); a fan-out directory:
        its non-empty subdirectories or its objects, by name. An entry's
        `next_id` is the position just after it, so a listing resumes
        exactly after the last entry the kernel accepted, in any process.
        No "." or ".." entries. Returns None; raises ENOTDIR for an inode
        that is no directory.
        """
        if self._split_dir(inode) is None:
            raise FUSEError(errno.ENOTDIR)
        if inode in self._hash_dirs:
            return  # names found by lookup only
        flat = self.layout.is_flat and inode == ROOT_INODE
        while True:
            entries = self._entries(inode, start_id)
            if not entries:
                return
            for i, (next_id, name, child, is_dir, size, time_ns) in enumerate(entries):
                if not reply.add(name, child, is_dir, size, time_ns, next_id):
                    # Kernel buffer full: keep the rest for the next call.
                    if flat:
                        self._listings.put((inode, start_id, self._listing_version()), entries[i:])
                    return
                start_id = next_id
            if not flat:
                return

    # -------------------------------------------------- filesystem-wide

    @_handler
    def statfs(self) -> Tuple[int, int]:
        """(blocks, files) of the filesystem: the served shards' extents in
        4 KiB blocks, and their objects (the live count of the shard's
        sidecar when the coordinator read it, else the header's object
        count). The session says none are free and names are 64 bytes."""
        served = self.shards.served()
        return (sum(math.ceil(m.extent / 4096) for m in served),
                sum(m.objects_count if m.live_count is None else m.live_count for m in served))

    @_handler
    def access(self, inode: int, mode: int) -> None:
        """None for F_OK/R_OK/X_OK; raises EROFS when W_OK is asked,
        ENOENT for an inode that names nothing.

        (Not called by the kernel when mounted with default_permissions.)
        """
        if mode & os.W_OK:
            raise FUSEError(errno.EROFS)
        if self._split_dir(inode) is None and self._db_object(inode) is None:
            self._object(inode)

    # ------------------------------------------------------------ xattrs

    def stats(self) -> Dict[str, Any]:
        """Counters of the shard set: shards served, sidecars ready,
        lookups and index probes made by them, objects in the headers,
        objects pushed into the kernel's page cache ahead of a reader in
        listing order and pushes the kernel refused (it had dropped the
        inode: that object is READ instead), the requests served by
        each worker process (a list), the lookup packs and the shards
        whose lookups they answer ("records": "pending_shards", those the
        builder is still to record), the answering process's
        pool of shards opened in C ("pool": `ShardPool.stats`), and the
        requests that reached the
        Python handlers, by handler (``"python": {"getxattr": 3, ...}``;
        the rest were answered by the C request path alone)."""
        served = self.shards.served()
        lookups, probes = self.hooks.lookups()
        pushed, refused = self.hooks.pushes()
        return {
            "shards": len(served),
            "sidecars": sum(1 for m in served if m.sidecar_dir is not None),
            "lookups": lookups,
            "index_probes": probes,
            "pushed": pushed,
            "push_refused": refused,
            "objects": sum(m.objects_count for m in served),
            "workers": self.hooks.per_process(),
            "restarts": self.hooks.restarts(),
            "coordinator_restarts": self.hooks.coordinator_restarts(),
            **self.hooks.written(),
            "version": shardfs_version,
            "python": self.hooks.python_requests(),
            "index": self.shards.index.stats() if self.shards.index is not None else None,
            "records": {"packs": len(self.shards.records.packs),
                        "recorded_shards": sum(1 for m in served if m.record is not None),
                        "pending_shards": len(self.shards.needs_record())}
            if self.shards.records is not None else None,
            "pool": self.shards.pool.stats(),
            "hashes": self.shards.hashes.stats(self.hooks.hash_probes()) if self.shards.hashes is not None else None,
        }

    @_handler
    def getxattr(self, inode: int, name: bytes) -> bytes:
        """Extended attribute `name` of `inode`.

        The root has ``user.shardfs.requests`` (requests served since the
        mount, by kind, as JSON: ``{"lookup": 10, "read": 10, ...}``) and
        ``user.shardfs.stats`` (`stats()` as JSON). An object has
        ``user.shardfs.shard`` (the path of its shard) and
        ``user.shardfs.offset`` (the byte offset of its first byte in the
        shard, decimal). Anything else raises FUSEError(ENODATA), not
        ENOSYS, so tools see the ordinary "no such attribute" answer.

        The C request path answers most of those itself (any other name, a
        root's name on another inode, an object's on a directory: see
        ``ll_getxattr`` in shardfs/c/py_ll_ops.c); what reaches here is
        checked all the same (a directory's inode in a winery mount, where
        C does not know the layout).
        """
        if inode == ROOT_INODE:
            if name == REQUESTS_XATTR:
                return json.dumps(self.hooks.requests(), sort_keys=True).encode()
            if name == STATS_XATTR:
                return json.dumps(self.stats(), sort_keys=True).encode()
        elif self._split_dir(inode) is None and name in (SHARD_XATTR, OFFSET_XATTR):
            if self._db_object(inode) is not None:
                raise FUSEError(errno.ENODATA)  # in a database, not a shard
            member, data_offset, _ = self._object(inode)
            if name == SHARD_XATTR:
                return os.fsencode(member.path)
            return str(data_offset).encode("ascii")
        raise FUSEError(errno.ENODATA)

    @_handler
    def listxattr(self, inode: int) -> List[bytes]:
        """Names of the extended attributes of `inode` (see getxattr): the
        root's two, an object's two (ENOENT, ESTALE when its slot names
        nothing now), none for another directory (answered by the C request
        path itself where it knows the layout) or a winery database's
        object."""
        if inode == ROOT_INODE:
            return [REQUESTS_XATTR, STATS_XATTR]
        if self._split_dir(inode) is None:
            if self._db_object(inode) is not None:
                return []
            self._object(inode)
            return [SHARD_XATTR, OFFSET_XATTR]
        return []


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


def _leaf_position(key: bytes, nbits: int) -> int:
    """The listing position of a 32-byte `key` in the fan-out leaf spelled
    by its first `nbits` bits: the LEAF_POSITION_BITS (62) bits that follow
    them, an int in [0, 2^62), so that next_id (+ 1) fits the readdir
    offset (signed 64-bit, > 0). Keys of one leaf sort as their positions.

    Two keys of a leaf sharing these bits get the same position: a READDIR
    that ends between them resumes after both, leaving the second out of
    that listing (lookup still finds it). Among n SHA-256 keys of a leaf
    that has probability about n^2 / 2^63 (1e-7 for a million keys in one
    leaf); contents crafted to collide there cost some 2^((nbits + 62) / 2)
    hashes (2^39 for the default 0:2/2:4 slicing)."""
    shift = 8 * KEY_SIZE - nbits - LEAF_POSITION_BITS
    return (int.from_bytes(key, "big") >> shift) & ((1 << LEAF_POSITION_BITS) - 1)


def _prefix_bytes(value: int, nbits: int) -> bytes:
    """The first `nbits` bits `value` stands for, left-aligned in bytes."""
    nbytes = (nbits + 7) // 8
    return (value << (8 * nbytes - nbits)).to_bytes(nbytes, "big") if nbytes else b""
