"""A set of many shards: which are served, in which order, their filters and global index.

Every front end that reads many shards uses it: a mount (`shardfs.fuse`),
`shardfs.winery.WineryStore` and the objstorage (`shardfs.objstorage`).
A mount serves one tree over many shards. Each shard gets a *number*, unique
for the life of the mount and never reused: shards given on the command line
are numbered in the order given, a ``--shard-dir`` is scanned in name order,
and shards that appear later get the next numbers. The number is the high
half of every inode of the shard's objects (`shardfs.fuse.handlers`), and decides
which copy wins when a key is in several shards: the lowest number (the same
key always names the same bytes, so any copy is right; one must be chosen so
that a key has one inode and is listed once).

Finding a key must not read every shard's index: the mount's global index
(`shardfs.gindex`) gives the shards that may hold it, whatever their
number. A shard no index level holds yet is found through its *sidecar*
(`shardfs.sidecar`: a filter over its keys and its slots sorted by key,
kept in a cache directory so that a remount does not rebuild it; the
filters sit in one C `SidecarSet`), or, until its sidecar is built, is
always a candidate (probed directly), so a mount answers at once however
many shards are new. Only the candidates are probed, in one C call over
the shards open in the process (`shardfs._shardfs.OpenShards`); at most
`max_open` shards are open at once.

Processes: a mount's coordinator owns the authoritative set (it numbers the
shards, follows the files, builds sidecars); each worker process keeps a
copy that mirrors what the coordinator publishes (`shardfs.fuse.worker`),
with the same numbers, so that an inode names the same object everywhere. A
set is used by one thread at a time.
"""

from __future__ import annotations

import array
import collections
import errno
import logging
import os
import resource
import stat
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from shardfs import Shard, normalize_key
from shardfs import rbd, s3
from shardfs.shard import is_remote_source
from shardfs import lookups as lookups_mod
from shardfs import sidecar as sidecar_mod
from shardfs import _shardfs
from shardfs._shardfs import OpenShards, SidecarSet, key_prefixes, probe_shards
from shardfs.errors import RESOURCE_ERRORS, CorruptShardError, ShardError

log = logging.getLogger("shardfs.fuse")

#: Errors of a sidecar build that come from the cache directory (then a
#: private temporary directory is used instead).
CACHE_DIR_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR,
                    errno.EEXIST}  # EEXIST: a component of the cache directory's path is a file


@dataclass(eq=False, slots=True)
class MountedShard:
    """One shard of a mount, open or not.

    A shard is opened (a descriptor and a mapping) when it is used, through
    its set's bounded cache (`ShardSet.open_shard`): `shard` gives it,
    opening it again if it was closed since. What the mount needs without
    reading the shard is kept here: `path` it is opened by (a file or a
    block device), `ident` the (st_dev, st_ino, st_rdev) it had when first
    opened (a file found under `path` with another ident is another shard
    and is not opened in its place), `objects_count` (the header field),
    `extent` (bytes mapped), `slot_count` (index slots), `mtime` (seconds)
    and `identity`.
    """

    number: int
    path: str
    ident: Tuple[int, int, int]
    objects_count: int
    slot_count: int
    extent: int
    mtime: float
    #: The shard's 32-byte identity (`shardfs.sidecar.identity`), computed
    #: when the coordinator first opened it.
    identity: bytes = b""
    #: No longer served (gone from the shard directory, replaced): new
    #: lookups and opens do not see it, files already open keep reading it
    #: until the coordinator closes it (`ShardSet.discard`).
    removed: bool = False
    #: The directory holding its sidecar (built or found there), None while
    #: it has none.
    sidecar_dir: Optional[str] = None
    #: A sidecar build was tried and failed: the shard stays unfiltered.
    sidecar_failed: bool = False
    #: Live objects (its sidecar's count of keys), once a sidecar was read.
    live_count: Optional[int] = None
    #: A level of the global index holds the shard: it is found through
    #: the index, and needs no filter of its own.
    indexed: bool = False
    #: Kept open whatever the cache (a removed shard whose files are still
    #: open: its path may name another file, or none).
    held: Optional[Shard] = None
    #: Opened by this path instead of `path` (a worker opens a held shard
    #: through the coordinator's descriptor, /proc/<pid>/fd/<n>).
    source: Optional[str] = None
    #: The sidecar in the set's filters (a shard not in the global index).
    filter: object = None
    #: Why the last open failed (logged once), None after a success.
    error: Optional[str] = None
    #: The hashes (`shardfs.hashes.HASH_NAMES`) it has an index by, in
    #: its set's `sidecar_dir` or `cache_dir` (`shardfs.hashes.HashSet`).
    hashes: Tuple[str, ...] = ()
    #: A hash index build of it failed: not tried again in this mount.
    hashes_failed: bool = False
    #: In a winery mount, the id (``shards.id``) of the winery shard whose
    #: image this is; None otherwise. Not its number: an image moved to
    #: another pool is served as a new shard number, the same winery shard.
    winery_shard: Optional[int] = None
    #: Where its lookup record is (`shardfs.lookups`: pack name, byte
    #: offset) when the pool answers its lookups without opening it.
    record: Optional[Tuple[str, int]] = None
    owner: Optional["ShardSet"] = field(default=None, repr=False)

    @property
    def shard(self) -> Shard:
        """The open shard (opened now if needed: see `ShardSet.open_shard`)."""
        return self.owner.open_shard(self)

    @property
    def sidecar(self) -> object:
        """Its sidecar (`shardfs.sidecar.Sidecar`, loaded now if needed),
        or None while it has none (see `ShardSet.sidecar_of`)."""
        return self.owner.sidecar_of(self)


#: An open that failed for want of descriptors or memory is tried again
#: this many times, this many seconds apart (see `ShardSet.open_for_resolver`).
RESOURCE_RETRIES = 10
RESOURCE_WAIT = 0.01

#: Descriptors of a process left to everything but open shards (the FUSE
#: device, pipes, logs, Python's own), at most: a quarter of the limit.
FD_RESERVE = 1024
#: Memory maps of a process left to everything but open shards and
#: sidecars (the interpreter and its libraries take a few hundred).
MAP_RESERVE = 4096
#: Fewest shards a process keeps open, whatever the limits say.
MIN_OPEN = 16
#: Index slots whose keys `open_shard_set` indexes itself, as it opens the
#: shards (8 bytes of memory each, 64 MiB at most); past them, the
#: background builder indexes the rest.
START_INDEX_SLOTS = 1 << 23
#: Paths opened between two calls of `ShardSet.rescan`'s progress.
PROGRESS_EVERY = 1000
#: Seconds before an rbd: image that could not be opened (being written by
#: ``rbd import``, not a shard) is tried again: images have no mtime.
RBD_RETRY_SECONDS = 10


def default_max_open() -> int:
    """Shards one process of a mount keeps open at once: what its
    descriptor limit (RLIMIT_NOFILE, soft) and the system's map limit
    (vm.max_map_count) allow, an open shard taking one descriptor and one
    mapping and a loaded sidecar one mapping more (on this machine, 20,000
    descriptors and 65,530 maps: 18,976 shards)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            maps = int(f.read())
    except (OSError, ValueError):
        maps = 65530  # the kernel's default
    return max(MIN_OPEN, min(soft - min(FD_RESERVE, soft // 4), (maps - MAP_RESERVE) // 2))


class OpenCache:
    """Open objects (shards or sidecars) by shard number, at most
    `capacity`, the least recently used dropped first.

    A dropped object is not closed here: it closes when its last reference
    goes (at once, unless a caller still holds it, as a listing holding a
    shard it scans), so a caller never finds it closed under it. An entry
    for which `in_use(number)` is True (files open on its shard) is kept
    past the capacity. `touched(number)`, when given, tells whether an
    entry was used without `get` since it last asked (`OpenShards.find`
    probes shards without Python): such an entry gets a second chance (it
    moves to the most recent end). `dropped(number)` is called for each
    entry dropped to make room.
    """

    def __init__(self, capacity: int, in_use: Callable[[int], bool],
                 touched: Optional[Callable[[int], bool]] = None,
                 dropped: Optional[Callable[[int], None]] = None) -> None:
        self.capacity = max(1, capacity)
        self.in_use = in_use
        self.touched = touched
        self.dropped = dropped
        self.items: "collections.OrderedDict[int, Any]" = collections.OrderedDict()

    def get(self, number: int) -> Any:
        item = self.items.get(number)
        if item is not None:
            self.items.move_to_end(number)
        return item

    def make_room(self) -> None:
        """Drop entries so that one more fits within `capacity` (entries in
        use stay): called before an object is opened, so that a process
        never holds capacity + 1 of them, even for a moment."""
        excess = len(self.items) + 1 - self.capacity
        if excess > 0:
            self._drop(excess, -1)

    def put(self, number: int, item: Any) -> None:
        self.items[number] = item
        self.items.move_to_end(number)
        excess = len(self.items) - self.capacity
        if excess > 0:
            self._drop(excess, number)

    def _drop(self, count: int, keep: int) -> None:
        # Entries in use are moved to the end and at most count + 16 of
        # them are passed over, so each call costs O(count) however many
        # are in use; touched entries are moved too, each at the price of
        # the use that marked it (the mark is cleared).
        skipped = 0
        items = self.items
        while count > 0 and items and skipped <= count + 16:
            number = next(iter(items))
            if self.touched is not None and self.touched(number):
                items.move_to_end(number)
                continue
            if number == keep or self.in_use(number):  # never the entry just put
                items.move_to_end(number)
                skipped += 1
                continue
            del items[number]
            if self.dropped is not None:
                self.dropped(number)
            count -= 1

    def pop(self, number: int) -> Any:
        return self.items.pop(number, None)

    def clear(self) -> None:
        self.items.clear()

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class SnapshotState:
    """What a snapshot of the C resolver (``shardfs/c/ll_snapshot.h``) is
    built from: the mount's request path (`shardfs.fuse.handlers.ShardFS.
    fast_state`) and `shardfs._shardfs.Resolver` read these attributes."""

    #: The served shards open in the process (`shardfs._shardfs.OpenShards`).
    open_shards: Any
    #: The per-shard filters (`shardfs._shardfs.SidecarSet`) of the shards
    #: no global index level holds, or None when none.
    filters: Any
    #: The global index levels (`shardfs._shardfs.GlobalIndex`) and, for
    #: each, an ``array('q')`` from its shard index to a shard number
    #: (negative: not served).
    levels: Tuple[Any, ...]
    maps: Tuple[Any, ...]
    #: ``array('q')``, per shard number: served (its mtime in ns, or 0),
    #: ``SHARD_REMOVED`` (no longer served; read for files opened before)
    #: or ``SHARD_UNKNOWN``.
    states: Any
    #: The cumulative hex prefix length of each fan-out level (() flat).
    prefix_lengths: Tuple[int, ...] = ()
    #: The directories' mtime in ns.
    dir_time_ns: int = 0
    #: The shard table sequence the set matches (a mount's worker).
    applied: int = 0
    #: Per shard number: (its sidecar's path as bytes, its 32-byte
    #: identity) or None, for pushes ahead in key order.
    orders: Tuple[Any, ...] = ()
    #: The names by sha1 and sha1_git: None, or a pair, each None or
    #: (directory inode, levels, maps, `HashIndex` or None per shard
    #: number, ``array('q')`` of the indexed shards no level holds).
    hashes: Any = None
    #: (shard number, `shardfs._shardfs.Reader`) of each removed shard
    #: still open here.
    removed_open: Tuple[Tuple[int, Any], ...] = ()
    #: The `shardfs._shardfs.ShardPool` that opens a served shard not in
    #: `open_shards` for the resolver, or None (the handlers open it).
    pool: Any = None


class ProbedStat(NamedTuple):
    """The fields of a shard's fstat that `probe_shards` gives (names and
    units as in os.stat_result: nanoseconds for the *_ns fields, seconds
    for st_mtime)."""
    st_dev: int
    st_ino: int
    st_rdev: int
    st_mode: int
    st_size: int
    st_mtime_ns: int
    st_ctime_ns: int
    st_mtime: float


def file_ident(st: os.stat_result) -> Tuple[int, int, int]:
    """(st_dev, st_ino, st_rdev): which file (or device) a stat names."""
    return (st.st_dev, st.st_ino, st.st_rdev)


def list_shard_dir(directory: str) -> List[str]:
    """Paths of the candidate shards in `directory`, in name order.

    Regular files and block devices (symlinks followed, as in
    ``/dev/rbd/<pool>/``); names starting with "." are skipped (the writer's
    temporary files are ``.<name>.tmp-*``). Raises OSError if the directory
    cannot be read. For ``rbd:POOL``, the sources ``rbd:POOL/IMAGE`` of the
    pool's images (`shardfs.rbd.pool_sources`); for ``s3://BUCKET/PREFIX``,
    the sources ``s3://BUCKET/KEY`` of the objects under it
    (`shardfs.s3.list_sources`).
    """
    if rbd.is_source(directory):  # rbd:POOL: its images
        return rbd.pool_sources(rbd.parse(directory)[0])
    if s3.is_source(directory):  # s3://BUCKET/PREFIX: its objects
        return s3.list_sources(directory)
    paths = []
    with os.scandir(directory) as it:
        for entry in it:
            if entry.name.startswith("."):
                continue
            try:
                st = os.stat(entry.path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode):
                paths.append(entry.path)
    paths.sort()
    return paths


class ShardSet:
    """The shards served by one mount, numbered, with their filters.

    `cache_dir` holds the sidecars (created when needed); when it cannot be
    written, sidecars are built in a private temporary directory removed by
    `close()`. `shard_dir`, when given, is the directory `rescan()` follows.
    At most `max_open` shards (default `default_max_open()`) and as many
    sidecars are open at once, plus the shards with files open on them
    (`in_use`) and the sidecars of the shards filtered by their own
    (`filters`: not in the global index). The shards split between
    `open_shards` (Python's: a quarter, at least 16) and `pool` (the C
    resolver's: the rest, at least 1, so a bound under 17 is exceeded by
    one shard the resolver opened).
    """

    def __init__(self, cache_dir: Optional[str] = None, shard_dir: Optional[str] = None,
                 max_open: Optional[int] = None) -> None:
        self.cache_dir = cache_dir or sidecar_mod.default_cache_dir()
        self.shard_dir = shard_dir
        self.shards: Dict[int, MountedShard] = {}
        #: The same by position (None where no shard is): `find` answers
        #: through it (a list item, where a dictionary of 100,000 entries
        #: costs cache misses per lookup). Numbers are given in order.
        self._numbered: List[Optional[MountedShard]] = []
        #: Served shards by path.
        self.by_path: Dict[str, MountedShard] = {}
        self.filters = SidecarSet()
        #: Where new sidecars are built: `cache_dir`, or a private temporary
        #: directory once the cache directory failed.
        self.sidecar_dir = self.cache_dir
        self._next_number = 0
        self._tmp_cache: Optional[tempfile.TemporaryDirectory] = None
        #: Paths that failed to open, with the (size, mtime) seen, so that a
        #: rescan retries them only once they changed.
        self._rejected: Dict[str, Tuple[int, int]] = {}
        self._rejected_why: Dict[str, str] = {}
        #: Lookups made by `find`.
        self.lookups = 0
        #: Shards opened again after the cache had closed them.
        self.reopens = 0
        #: Changes with every change of what is served or filtered (listings
        #: computed before are stale).
        self.version = 0
        #: Paths named at mount (served first, in this order).
        self.pinned: List[str] = []
        #: Whether shards come and go by a source other than `shard_dir`
        #: (a winery database): the layout is then chosen as for a directory.
        self.followed = False
        #: Numbers the set must not give out (see `add`).
        self.reserved: Callable[[int], bool] = lambda number: False
        #: Whether files are open on shard `number` (its open shard and
        #: sidecar are then kept past the bound); set by the mount.
        self.in_use: Callable[[int], bool] = lambda number: False
        self.max_open = max_open or default_max_open()
        #: The bound splits between the shards Python opens (`open_shards`:
        #: listings, reads of the API, shards the pool could not open) and
        #: the pool of shards the C resolver opens itself (`pool`: lookups
        #: and reads of a mount), three quarters of it.
        python_bound = max(min(self.max_open, MIN_OPEN), self.max_open // 4)
        #: Shards the C resolver opens on demand and closes, least recently
        #: used first, within its bound (``shardfs/c/ll_pool.h``): a key in
        #: a shard not open costs an open in C, not a trip through Python.
        self.pool = _shardfs.ShardPool(max(1, self.max_open - python_bound))
        #: The served shards open in this process, probed by `find` through
        #: the C resolver (`resolver`); `open_shards` keeps their recency
        #: order and bound.
        self.open_table = OpenShards()
        self.open_shards = OpenCache(python_bound, lambda n: self.in_use(n),
                                     touched=self.open_table.touched,
                                     dropped=lambda n: self.open_table.set(n, None))
        self.open_sidecars = OpenCache(self.max_open, lambda n: False)
        #: The global index (`shardfs.gindex.IndexSet`) of the shards, when
        #: the mount keeps one: an indexed shard is found through it, the
        #: others through their own filters.
        self.index = None
        #: The lookup records (`shardfs.lookups.LookupSet`) of the shards,
        #: when the mount keeps them: the pool answers a recorded shard's
        #: lookups without opening it.
        self.records = None
        #: What earlier mounts validated of each shard file
        #: (`shardfs.lookups.KnownShards`): an unchanged file joins the
        #: set without being opened (`add`).
        self.known = None
        #: Objects found by sha1 and sha1_git (`shardfs.hashes.HashSet`),
        #: when the set is asked to (a mount's ``-o hashes=``).
        self.hashes = None
        #: (version, shards in `filters`): filters are skipped when empty.
        self._filtered = (-1, 0)
        #: Index reads made by `find`.
        self._probes = 0
        #: (what it was made from, `shardfs._shardfs.Resolver`): see `resolver`.
        self._resolver: Tuple[Any, Any] = (None, None)
        #: (version, `served()` then).
        self._served: Tuple[int, List[MountedShard]] = (-1, [])
        #: While `open_shard_set` opens the shards: the (identity, key run)
        #: of each shard added that the global index lacks, at most
        #: START_INDEX_SLOTS slots in all (None otherwise).
        self.start_runs: Optional[List[Tuple[bytes, bytes]]] = None
        self._start_objects = 0
        #: See `_cache_has_sidecars` (None: not scanned yet).
        self._sidecars_seen: Optional[bool] = None

    # ------------------------------------------------------------ members

    @property
    def probes(self) -> int:
        """Index reads made by `find` (probes of a shard's index), for
        benchmarks: absent keys should cost almost none. Settable (to 0)."""
        return self._probes

    @probes.setter
    def probes(self, value: int) -> None:
        self._probes = value

    def resolver_state(self, mtimes: bool = False, hash_dirs: Optional[Dict[str, int]] = None) -> SnapshotState:
        """What the C resolver (``shardfs/c/ll_resolve.h``) reads of the set
        (a flat layout): its open shards, filters, global index levels,
        each shard number's state (a served shard's mtime in ns when
        `mtimes`, else 0) and the hash indexes (`shardfs.hashes.HashSet.
        snapshot_hashes`; `hash_dirs`: the inodes of the directories of
        names by each hash, none by default)."""
        if self._filtered[0] != self.version:
            self._filtered = (self.version, len(self.filters))
        levels, maps = self.index.lookup_args if self.index is not None else ((), ())
        states = array.array("q", [_shardfs.SHARD_UNKNOWN]) * (max(self.shards, default=-1) + 1)
        for member in self.shards.values():
            states[member.number] = (_shardfs.SHARD_REMOVED if member.removed
                                     else int(round(member.mtime * 1e9)) if mtimes else 0)
        hashes = self.hashes.snapshot_hashes(len(states), hash_dirs or {}) if self.hashes is not None else None
        return SnapshotState(self.open_table, self.filters if self._filtered[1] else None, levels, maps, states,
                             hashes=hashes, pool=self.pool)

    def resolver(self) -> Any:
        """The C resolver (`shardfs._shardfs.Resolver`) over the set as it
        is now: made again when a shard is added, removed, opened or
        closed, or the index or the hash indexes changed."""
        levels = self.index.lookup_args if self.index is not None else None
        made_of = (self.version, levels, _shardfs.table_generation(),
                   self.hashes.generation if self.hashes is not None else None)
        old, resolver = self._resolver
        if resolver is None or old[0] != made_of[0] or old[1] is not made_of[1] or old[2:] != made_of[2:]:
            resolver = _shardfs.Resolver(self.resolver_state())
            self._resolver = (made_of, resolver)
        return resolver

    def served(self) -> List[MountedShard]:
        """Served shards (not removed), by number (= priority). The list is
        shared until the set changes: do not modify it."""
        if self._served[0] != self.version:
            self._served = (self.version, [m for n, m in sorted(self.shards.items()) if not m.removed])
        return self._served[1]

    def __len__(self) -> int:
        return sum(1 for m in self.shards.values() if not m.removed)

    def get(self, number: int) -> Optional[MountedShard]:
        """The shard numbered `number`, served or removed-but-open, or None."""
        return self.shards.get(number)

    def open_shard(self, member: MountedShard) -> Shard:
        """`member`'s open Shard: `held`, the cached one, or opened now
        (from `source`, else `path`, and validated) and cached, closing
        the least recently used beyond `max_open`. Raises OSError with
        errno ESTALE when `path` names another file than the one mounted,
        or a shard of another object count or extent; what `shardfs.Shard`
        raises (OSError, CorruptShardError) when it cannot be opened."""
        shard = member.held or self.open_shards.get(member.number)
        if shard is not None:
            return shard
        self.open_shards.make_room()
        shard = Shard(member.source or member.path)
        try:
            if (member.source is None and not is_remote_source(member.path)
                    and file_ident(os.fstat(shard.fileno())) != member.ident):
                raise OSError(errno.ESTALE, f"{member.path}: replaced by another file since it was mounted")
            if shard.header.objects_count != member.objects_count or shard.extent != member.extent:
                raise OSError(errno.ESTALE, f"{member.path}: changed size since it was mounted")
        except BaseException:
            shard.close()
            raise
        shard.path = member.path
        self.reopens += 1
        member.error = None
        self._keep_open(member, shard)
        return shard

    def _keep_open(self, member: MountedShard, shard: Shard) -> None:
        """Cache `member`'s open `shard` (bounded) and let `find` probe it
        while `member` is served."""
        if not member.removed:
            self.open_table.set(member.number, shard.reader, member)
        self.open_shards.put(member.number, shard)

    def sidecar_of(self, member: MountedShard) -> object:
        """`member`'s sidecar: its filter's, the cached one, or loaded now
        from `sidecar_dir` (and cached, closing the least recently used
        beyond `max_open`); None when it has none or it cannot be loaded
        (logged; it has none from then on)."""
        if member.filter is not None:
            return member.filter
        if member.sidecar_dir is None:
            return None
        sidecar = self.open_sidecars.get(member.number)
        if sidecar is None:
            sidecar = self._load_sidecar(member, member.sidecar_dir)
            if sidecar is None:
                member.sidecar_dir = None
            else:
                self.open_sidecars.put(member.number, sidecar)
        return sidecar

    def _load_sidecar(self, member: MountedShard, directory: str) -> object:
        """`member`'s sidecar in `directory`, or None (logged) when it is
        missing, stale or cannot be read."""
        try:
            sidecar = sidecar_mod.Sidecar(sidecar_mod.sidecar_path(directory, member.identity),
                                          member.identity, member.slot_count)
        except Exception as exc:  # removed from the cache directory, damaged
            log.warning("%s: cannot load its sidecar from %s: %s", member.path, directory, exc)
            return None
        member.live_count = sidecar.count
        return sidecar

    def sidecar_built(self, member: MountedShard, directory: str) -> bool:
        """`member`'s sidecar was just built in `directory`: filter with it
        while the global index does not hold the shard, list with it.
        Returns False when it cannot be loaded (logged)."""
        if member.removed or member.sidecar_dir is not None:
            return True
        sidecar = self._load_sidecar(member, directory)
        if sidecar is None:
            return False
        self.set_sidecar(member, sidecar, directory)
        return True

    def open_for_resolver(self, member: MountedShard) -> Shard:
        """`open_shard` for a candidate the C resolver asked for: the
        resolver cached here lets go of its snapshot first (which would
        keep the shard the open closes to make room open meanwhile).
        Raises what `open_shard` raises; an OSError of RESOURCE_ERRORS is
        tried again RESOURCE_RETRIES times, RESOURCE_WAIT seconds apart,
        then logged and raised, whatever the caller does with others."""
        self._resolver = (None, None)
        for attempt in range(RESOURCE_RETRIES + 1):
            try:
                return self.open_shard(member)
            except OSError as exc:
                if exc.errno not in RESOURCE_ERRORS:
                    raise
                if attempt < RESOURCE_RETRIES:
                    # Shards closed to make room may still be held for a
                    # moment by requests that took them before (a mount's
                    # snapshots): they let go within milliseconds.
                    time.sleep(RESOURCE_WAIT)
                    continue
                log.error("shard %s (number %d) cannot be opened now: %s", member.path, member.number,
                          os.strerror(exc.errno))
                raise OSError(exc.errno, f"{member.path}: {os.strerror(exc.errno)}") from None
        raise AssertionError("unreachable")

    def _open_failed(self, member: MountedShard, exc: BaseException) -> None:
        message = f"{exc}"
        if member.error != message:
            member.error = message
            log.error("shard %s (number %d) cannot be read: %s", member.path, member.number, message)

    def open_candidate(self, path: str) -> Tuple[Shard, object]:
        """Open and validate the shard at `path` and load its sidecar from
        the cache (None when missing or stale): the slow part of `add`,
        which reads the shard's hash section. Changes nothing in the set.
        Raises what `shardfs.Shard`
        raises (CorruptShardError, OSError, ShardError)."""
        shard = Shard(path)
        sidecar = None
        try:
            sidecar = sidecar_mod.load(shard, self.cache_dir)
        except Exception as exc:  # a broken cache must never stop a mount
            log.warning("%s: cannot load its sidecar: %s", path, exc)
        return shard, sidecar

    def add(self, path: str, shard: Optional[Shard] = None, sidecar: object = None,
            number: Optional[int] = None, sidecar_dir: Optional[str] = None,
            probed: Optional[tuple] = None, known: Optional[tuple] = None) -> MountedShard:
        """Serve the shard at `path`, opened and validated now; returns its
        MountedShard.

        `shard` (and its `sidecar`, loaded from `sidecar_dir`), when given,
        come from `open_candidate` or the caller (the set then owns them);
        else the shard is opened here, and its sidecar loaded from the
        cache when the global index does not hold it. `number`: the
        shard's number (else the next one for which `reserved(number)` is
        False). A shard without a sidecar is probed unfiltered until
        `set_sidecar` (or until the global index holds it). `probed`: what
        `probe_shards` learnt of `path`, used instead of opening it again
        when the shard is not kept open; `known`: what `KnownShards.match`
        gave for it (`_probe` gives one or the other).
        Raises what `open_candidate` raises.
        """
        if probed is not None and shard is None:
            member = self._add_probed(path, probed, number)
            if member is not None:
                return member
        elif shard is None and self.known is not None:
            member = self._add_known(path, number, known)
            if member is not None:
                return member
        if shard is None:
            self.open_shards.make_room()
            shard = Shard(path)
        try:
            st = os.fstat(shard.fileno())
            identity = sidecar_mod.identity(shard)
            ident = (s3.listed_identity(path) or file_ident(st)) if s3.is_source(path) else file_ident(st)
        except BaseException:
            shard.close()
            raise
        if self.known is not None and not is_remote_source(path) and shard.kind == "file":
            self.known.remember(path, st, shard.header.objects_count, shard.slot_count, shard.extent, identity)
        if number is None:
            number = self._next_number
            while self.reserved(number):
                number += 1
        member = self._insert(MountedShard(number, path, ident, shard.header.objects_count,
                                           shard.slot_count, shard.extent, shard.mtime, identity=identity))
        runs = self.start_runs
        if runs is not None and not member.indexed and identity and \
                self._start_objects + member.slot_count <= START_INDEX_SLOTS:
            runs.append((identity, key_prefixes(shard)))  # while it is open (open_shard_set)
            self._start_objects += member.slot_count
            if sidecar is None:
                # Indexed before the mount answers: found through the index,
                # it needs no filter; its sidecar serves listings (loaded
                # then, as for an indexed shard; else the builder makes it).
                # Not kept open either: a mount opening 100,000 shards would
                # close all but the last few thousand again (the pool opens
                # what lookups need).
                shard.close()
                if self._cache_has_sidecars() and \
                        os.path.exists(sidecar_mod.sidecar_path(self.cache_dir, identity)):
                    member.sidecar_dir = self.cache_dir
                log.debug("serving shard %s as number %d (%d objects, indexed at start)", path, number,
                          member.objects_count)
                return member
        self._keep_open(member, shard)
        if sidecar is not None:
            self.set_sidecar(member, sidecar, sidecar_dir or self.cache_dir)
        elif not member.indexed:
            try:
                self.set_sidecar(member, sidecar_mod.load(shard, self.cache_dir, identity), self.cache_dir)
            except Exception as exc:  # a broken cache must never stop a mount
                log.warning("%s: cannot load its sidecar: %s", path, exc)
        elif os.path.exists(sidecar_mod.sidecar_path(self.cache_dir, identity)):
            member.sidecar_dir = self.cache_dir  # loaded when a listing needs it
        log.debug("serving shard %s as number %d (%d objects%s)", path, number, member.objects_count,
                  ", indexed" if member.indexed else "" if member.filter is not None else ", sidecar pending")
        return member

    def _add_probed(self, path: str, probed: tuple, number: Optional[int]) -> Optional[MountedShard]:
        """Serve the shard at `path` from what `probe_shards` learnt of it,
        when the global index holds it or takes it at start (`start_runs`):
        it is not kept open, nor opened again. None otherwise (it is then
        opened)."""
        st = ProbedStat(*probed[:8])
        objects, slots, extent, identity, prefixes = probed[8:]
        covered = self.index is not None and self.index.covers(identity)
        runs = self.start_runs
        if not covered and (runs is None or self._start_objects + slots > START_INDEX_SLOTS):
            return None
        if prefixes is None and not covered:
            try:
                with Shard(path) as shard:  # not given any under probe_shards's budget
                    if sidecar_mod.identity(shard) != identity:
                        return None  # replaced since: opened as a new file
                    prefixes = key_prefixes(shard)
            except (OSError, ShardError):
                return None
        if self.known is not None:
            self.known.remember(path, st, objects, slots, extent, identity)
        member = self._insert_closed(path, st, objects, slots, extent, identity, number)
        if not member.indexed:
            runs.append((identity, prefixes))
            self._start_objects += slots
        log.debug("serving shard %s as number %d (%d objects, %s)", path, member.number, objects,
                  "indexed" if covered else "indexed at start")
        return member

    def _insert_closed(self, path: str, st: Any, objects: int, slots: int, extent: int, identity: bytes,
                       number: Optional[int]) -> MountedShard:
        """Serve the shard at `path` (of stat `st`, header and identity
        known) without keeping it open, as `number` (else the next free)."""
        if number is None:
            number = self._next_number
            while self.reserved(number):
                number += 1
        member = self._insert(MountedShard(number, path, file_ident(st), objects, slots, extent, st.st_mtime,
                                           identity=identity))
        if self._cache_has_sidecars() and os.path.exists(sidecar_mod.sidecar_path(self.cache_dir, identity)):
            member.sidecar_dir = self.cache_dir  # loaded when a listing needs it
        return member

    def _cache_has_sidecars(self) -> bool:
        """Whether the cache directory held a sidecar when first asked
        (scanned once, up to the first: a first mount's empty cache spares
        a stat per shard)."""
        if self._sidecars_seen is None:
            try:
                with os.scandir(self.cache_dir) as it:
                    self._sidecars_seen = any(e.name.endswith(".sidecar") for e in it)
            except OSError:
                self._sidecars_seen = False
        return self._sidecars_seen

    def _add_known(self, path: str, number: Optional[int], found: Optional[tuple] = None
                   ) -> Optional[MountedShard]:
        """Serve the shard at `path` without opening it when `known` says
        it was validated as it is now (same device, inode, size, mtime,
        ctime) and the global index holds it; None otherwise (it is then
        opened). `found`: what `known.match(path)` gave, when asked
        already."""
        if is_remote_source(path):
            return None
        if found is None:
            found = self.known.match(path)
        if found is None or self.index is None or not self.index.covers(found[1][3]):
            return None
        st, (objects, slots, extent, identity) = found
        member = self._insert_closed(path, st, objects, slots, extent, identity, number)
        log.debug("serving shard %s as number %d (%d objects, indexed, known unchanged)", path, member.number,
                  objects)
        return member

    def next_number(self) -> int:
        """The number the next shard added gets at least (numbers are never
        reused: an inode names one object for the mount's life)."""
        return self._next_number

    def reserve_numbers(self, below: int) -> None:
        """Give no shard added from now on a number below `below` (a
        coordinator taking over continues the numbering of the one before)."""
        self._next_number = max(self._next_number, below)

    def add_entry(self, member: MountedShard) -> MountedShard:
        """Serve `member` as the coordinator described it (a worker mirrors
        its table: nothing is opened now); returns it."""
        return self._insert(member)

    def _insert(self, member: MountedShard) -> MountedShard:
        member.owner = self
        self._next_number = max(self._next_number, member.number + 1)
        self.shards[member.number] = member
        numbered = self._numbered
        if member.number >= len(numbered):
            numbered.extend([None] * (member.number + 1 - len(numbered)))
        numbered[member.number] = member
        self.by_path[member.path] = member
        self.filters.set(member.number, None)  # probed unfiltered until it has a filter
        if self.index is not None and member.identity and self.index.attach(member.identity, member.number):
            self.mark_indexed(member)
        if self.hashes is not None:
            self.hashes.attach(member)
        self._register(member, joined=True)
        self.version += 1
        return member

    def _register(self, member: MountedShard, joined: bool = False) -> None:
        """Tell the pool where `member` opens (as it `joined` the set, or
        again when the lookup records changed), and its lookup record when
        `records` has one standing for it as it is."""
        if member.source is not None or member.removed or is_remote_source(member.path):
            return
        found = self.records.locate(member) if self.records is not None else None
        where = (found[0], found[2]) if found is not None else None
        if not joined and where == member.record:
            return  # registered so already: re-registering would close what the pool has open of it
        kwargs = {}
        if found is not None:
            kwargs = dict(pack=found[1], record=found[2], stamp=lookups_mod.stamp(member), slots=member.slot_count)
        used = self.pool.register(member.number, member.path, tuple(member.ident[:2]), member.objects_count,
                                  member.extent, **kwargs)
        member.record = where if used else None

    def reload_records(self, names: Optional[List[str]] = None) -> None:
        """Use the lookup packs `names` (default: the manifest's), and give
        the pool the records of the served shards that have none there."""
        if self.records is None:
            return
        self.records.load(names)
        packs = set(self.records.names())
        for member in self.served():
            if member.record is None or member.record[0] not in packs:
                self._register(member)

    def build_records(self, members: Optional[Sequence[MountedShard]] = None) -> int:
        """Write the lookup records of `members` (default: every served
        shard that lacks one, `needs_record`) as one pack, opening each
        shard in turn, and give them to the pool: from then on their
        lookups need no open. Returns how many shards have a record now.
        Raises OSError (the cache directory cannot take them: ENOSPC...);
        a shard whose record cannot be made is logged and left out."""
        if self.records is None:
            return 0
        todo = self.needs_record() if members is None else members
        if todo:
            self.records.add_shards(((m, m.shard) for m in todo), self.served())
        self.reload_records()
        return sum(1 for m in self.served() if m.record is not None)

    def needs_record(self) -> List[MountedShard]:
        """Served shards of a local file the pool has no lookup record of."""
        if self.records is None:
            return []
        return [m for m in self.served() if m.record is None and lookups_mod.recordable(m) and m.source is None
                and not is_remote_source(m.path)]

    def remove(self, member: MountedShard) -> None:
        """Stop serving `member`: lookups, listings and new opens no longer
        see it. Files already open keep reading it until `discard`."""
        if member.removed:
            return
        member.removed = True
        self.version += 1
        self.open_table.set(member.number, None)
        self.pool.forget(member.number)
        member.record = None
        self.filters.remove(member.number)
        if self.index is not None:
            self.index.detach(member.number)
        if self.hashes is not None:
            self.hashes.forget(member)
        if self.by_path.get(member.path) is member:
            del self.by_path[member.path]
        log.info("shard %s (number %d) removed", member.path, member.number)

    def discard(self, member: MountedShard) -> None:
        """Close `member` and forget it (its number is never given again)."""
        self.remove(member)
        self.open_shards.pop(member.number)
        self.open_sidecars.pop(member.number)
        member.held = member.filter = None
        if self.shards.pop(member.number, None) is member:
            self._numbered[member.number] = None

    def close(self) -> None:
        """Close every shard and sidecar (after the mount is gone)."""
        for shard in list(self.open_shards.items.values()):
            shard.close()
        for sidecar in list(self.open_sidecars.items.values()):
            sidecar.close()
        for member in self.shards.values():
            for item in (member.held, member.filter):
                if item is not None:
                    item.close()
            member.held = member.filter = None
        if self.hashes is not None:
            self.hashes.close()
        for cache in (self.index, self.records):
            if cache is not None:
                cache.close()
        self._resolver = (None, None)  # its snapshot holds the shards it probed open
        for number in self.shards:
            self.pool.forget(number)
        self.open_table.clear()
        self.open_shards.clear()
        self.open_sidecars.clear()
        self.shards.clear()
        self._numbered = []
        self.by_path.clear()
        if self._tmp_cache is not None:
            self._tmp_cache.cleanup()
            self._tmp_cache = None

    # ----------------------------------------------------------- sidecars

    def needs_sidecar(self) -> List[MountedShard]:
        """Served shards without a sidecar whose build was not tried yet."""
        return [m for m in self.served() if m.sidecar_dir is None and not m.sidecar_failed]

    def build_sidecar(self, member: MountedShard) -> None:
        """Load or build `member`'s sidecar in `sidecar_dir`, in this
        thread (reads the whole index), and filter with it. Raises OSError
        or ShardError when it cannot be built."""
        self.set_sidecar(member, sidecar_mod.load_or_build(member.shard, self.sidecar_dir), self.sidecar_dir)

    def use_private_sidecar_dir(self) -> str:
        """Build sidecars in a temporary directory of this set (removed by
        `close()`) from now on, the cache directory having failed; returns
        it."""
        if self._tmp_cache is None:
            self._tmp_cache = tempfile.TemporaryDirectory(prefix="shardfs-sidecars-")
            log.warning("cannot write sidecars in %s: using %s", self.cache_dir, self._tmp_cache.name)
        self.sidecar_dir = self._tmp_cache.name
        return self.sidecar_dir

    def set_sidecar(self, member: MountedShard, sidecar: object, directory: Optional[str]) -> None:
        """`member`'s sidecar is `sidecar` (loaded from `directory`; None:
        it has none there): it filters the lookups of `member` until the
        global index holds it, and serves its listings."""
        if sidecar is None:
            return
        if member.removed or member.sidecar_dir is not None:
            sidecar.close()
            return
        member.sidecar_dir = directory
        member.live_count = sidecar.count
        if member.indexed:
            sidecar.close()  # loaded again when a listing needs it
        else:
            member.filter = sidecar
            self.filters.set(member.number, sidecar)
        self.version += 1
        log.info("shard %s: sidecar ready (%d keys)", member.path, member.live_count)

    def mark_indexed(self, member: MountedShard) -> None:
        """`member` is in the global index from now on: drop its own filter
        from the lookups (its sidecar is loaded again for listings)."""
        if member.indexed or member.removed:
            return
        member.indexed = True
        self.filters.remove(member.number)
        if member.filter is not None:
            self.open_sidecars.put(member.number, member.filter)
            member.filter = None
        self.version += 1

    def reload_index(self, names: Optional[List[str]] = None) -> None:
        """Use the global index levels `names` (default: its manifest's)
        and mark the shards they hold as indexed."""
        if self.index is None:
            return
        self.index.load(names)
        for member in self.served():
            if not member.indexed and member.identity and self.index.covers(member.identity):
                self.mark_indexed(member)  # load() mapped it: attached when added

    # ------------------------------------------------------------- lookup

    def find(self, key: bytes, below: Optional[int] = None,
             count: bool = True) -> Optional[Tuple[MountedShard, int, int, int]]:
        """The first served shard holding `key` (32 bytes), as (shard,
        slot, data_offset, size), or None.

        The C resolver (`resolver`) asks only the shards that may hold the
        key (the global index's candidates, and those of the filters of
        shards it does not hold yet), in number order; `below` limits the
        search to numbers under it (to decide whether an entry is a
        duplicate). A candidate that is not open is opened here (bounded by
        `max_open`) and the search resumes from it; one that cannot be
        opened (replaced or damaged since it was mounted) is logged once
        and skipped. It may wait for the device (the GIL is released
        meanwhile). Raises CorruptShardError when a probed slot is corrupt
        and no later candidate holds the key, OSError (EIO) when a shard's
        file shrank, OSError (EMFILE, ENFILE, ENOMEM) when a candidate
        cannot be opened for want of descriptors or memory. `count`: add the call to `lookups` and `probes` (False
        for the duplicate checks of a listing, which are not lookups).
        """
        start, limit, opened = 0, -1 if below is None else below, set()
        while True:
            code, value = self.resolver().find(key, start, limit)
            if code != _shardfs.RESOLVE_OPEN:
                break
            member = self.shards[value]
            start = value + 1
            try:
                shard = self.open_for_resolver(member)
            except (OSError, ShardError) as exc:
                if getattr(exc, "errno", None) in RESOURCE_ERRORS:
                    raise
                self._open_failed(member, exc)
                continue
            if value not in opened:  # asked again, now open
                opened.add(value)
                start = value
                continue
            # Opened, yet not held by the resolver's table (a number past
            # what OpenShards holds): asked here.
            found = shard.find(key)
            if found is not None:
                code, value = _shardfs.RESOLVE_FOUND, (0, found[2], 0, member.number, found[1], 1)
                value = ((member.number + 1) << 32 | found[0],) + value[1:]
                break
        if code == _shardfs.RESOLVE_FAILED:
            number, what, corrupt = value
            path = self.shards[number].path if number in self.shards else "?"
            if corrupt:
                raise CorruptShardError(f"{path}: {what}")
            raise OSError(errno.EIO, f"{path}: {what}")
        # Counted once per answer: a corrupt slot (an exception) is not a
        # lookup.
        if count:
            self.lookups += 1
            self._probes += value[5] if code == _shardfs.RESOLVE_FOUND else value
        if code != _shardfs.RESOLVE_FOUND:
            return None
        ino, size, _, number, offset, _ = value
        return (self._numbered[number], ino & 0xFFFFFFFF, offset, size)

    def get_batch(self, keys: Iterable) -> List[Optional[bytes]]:
        """The bytes of each key's object in the first served shard holding
        it (the shard `find` answers), or None where no shard holds it, in
        the order of `keys` (an iterable of keys as `shardfs.Shard.get`
        takes them: 32 bytes, or 64 hex digits as str or bytes).

        Each key is found with `find`; then the objects of each shard are
        copied with one `Shard.get_batch` call (GIL released, copies
        prefetched). An object deleted between the two answers None, as it
        would a moment later. Raises ValueError for a malformed key (before
        any lookup), CorruptShardError for a corrupt slot, OSError when a
        shard cannot be read.
        """
        raws = [normalize_key(k) for k in keys]
        out: List[Optional[bytes]] = [None] * len(raws)
        groups: Dict[int, Tuple[MountedShard, List[int]]] = {}
        for i, key in enumerate(raws):
            answer = self.find(key)
            if answer is not None:
                groups.setdefault(answer[0].number, (answer[0], []))[1].append(i)
        for member, where in groups.values():
            datas = self.open_shard(member).get_batch([raws[i] for i in where])
            for i, data in zip(where, datas):
                out[i] = data
        return out

    # --------------------------------------------------------- directory

    def plan_rescan(self) -> Tuple[List[MountedShard], List[Tuple[str, Tuple[int, int]]]]:
        """Compare the files with the set: (served shards to remove, paths
        to open with their (size, mtime_ns)).

        A shard of `shard_dir` is removed when its path vanished or names
        another file (renamed over, as ``shardfs create --force`` publishes
        a shard); a shard named at mount (`pinned`) only when its path names
        another file (a vanished one keeps being served). The new file of a
        replaced path is in the list to open. A path that failed to open
        before is tried again only once its size or mtime changed. Raises
        OSError when `shard_dir` cannot be read."""
        gone: List[MountedShard] = []
        candidates: List[str] = []
        present = set()
        if self.shard_dir is not None:
            candidates = list_shard_dir(self.shard_dir)
            present = set(candidates)
        candidates += [p for p in self.pinned if p not in present]
        # path -> (its ident, or None for an rbd: source, whose image
        # cannot be told from another; what a retry waits to change)
        stats: Dict[str, Tuple[Optional[Tuple[int, int, int]], Tuple[int, int]]] = {}
        retry = (0, int(time.monotonic() // RBD_RETRY_SECONDS))
        for path in candidates:
            if is_remote_source(path):  # listed, or named at mount
                # an S3 object listed: its ETag and size tell a replaced one
                stats[path] = (s3.listed_identity(path), retry)
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            stats[path] = (file_ident(st), (st.st_size, st.st_mtime_ns))
        for member in list(self.by_path.values()):
            st = stats.get(member.path)
            pinned = member.path in self.pinned and member.path not in present
            if st is None and pinned:
                continue
            if st is None or (st[0] is not None and st[0] != member.ident):
                gone.append(member)
        new = []
        for path in candidates:
            st = stats.get(path)
            if st is None:
                continue
            member = self.by_path.get(path)
            if member is not None and member not in gone:
                continue
            seen = st[1]
            if self._rejected.get(path) != seen:
                new.append((path, seen))
        for path in list(self._rejected):
            if path not in stats:
                del self._rejected[path]
                self._rejected_why.pop(path, None)
        return (gone, new)

    def reject(self, path: str, seen: Tuple[int, int], exc: BaseException) -> None:
        """Remember that `path` (as `seen`) is not a valid shard, and say so
        once."""
        again = path in self._rejected and self._rejected_why.get(path) == str(exc)
        self._rejected[path] = seen
        self._rejected_why[path] = str(exc)
        if not again:  # an rbd: image is retried every RBD_RETRY_SECONDS: said once
            log.warning("%s: not served: %s", path, exc)

    def rescan(self, progress: Optional[Callable[[int, int], None]] = None
               ) -> Tuple[List[MountedShard], List[MountedShard]]:
        """Bring the set in line with the files (`plan_rescan`); returns
        (shards added, shards removed). New valid shards are added in name
        order; a path that fails to open (incomplete copy, not a shard) is
        logged once and retried when it changes. Removed shards stay open
        until `discard`. `progress(done, total)`, when given, is called
        every PROGRESS_EVERY paths opened and at the end. Raises OSError
        when `shard_dir` cannot be read."""
        gone, new = self.plan_rescan()
        for member in gone:
            self.remove(member)
        added = []
        for first in range(0, len(new), PROGRESS_EVERY):
            batch = new[first:first + PROGRESS_EVERY]
            probed, known = self._probe([path for path, _ in batch])
            for path, seen in batch:
                try:
                    added.append(self.add(path, probed=probed.get(path), known=known.get(path)))
                except Exception as exc:
                    self.reject(path, seen, exc)
            if progress is not None:
                progress(first + len(batch), len(new))
        return (added, gone)

    def _probe(self, paths: List[str]) -> Tuple[Dict[str, tuple], Dict[str, tuple]]:
        """For `add`, at a start with a global index: (what `probe_shards`
        learnt of the local files among `paths` that `known` does not
        vouch for, what `known.match` gave for the others). ({}, {}) at
        other times."""
        probed: Dict[str, tuple] = {}
        known: Dict[str, tuple] = {}
        if self.start_runs is None or self.index is None:
            return probed, known
        todo = []
        for path in paths:
            if is_remote_source(path):
                continue
            if self.known is not None:
                found = self.known.match(path)
                if found is not None and self.index.covers(found[1][3]):
                    known[path] = found
                    continue
            todo.append(path)
        if todo:
            budget = max(0, START_INDEX_SLOTS - self._start_objects)
            for path, found in zip(todo, probe_shards(todo, budget)):
                if found is not None:
                    probed[path] = found
        return probed, known


# ------------------------------------------------------------ opening


def open_shard_set(shard_paths: Sequence[str], shard_dir: Optional[str] = None,
                   cache_dir: Optional[str] = None,
                   progress: Optional[Callable[[int, int], None]] = None) -> ShardSet:
    """Open the shards of a mount (or an objstorage): `shard_paths` in order (each must be a
    valid shard: errors propagate), then the shards of `shard_dir` in name
    order (invalid ones are logged and skipped; they are retried when they
    change). Sidecars are loaded from `cache_dir`, never built here.
    `progress(done, total)` is called as the directory's shards are opened.
    Raises ShardError when there is nothing to serve and no directory."""
    if not shard_paths and shard_dir is None:
        raise ShardError("no shard to mount")
    shards = ShardSet(cache_dir=cache_dir, shard_dir=shard_dir)
    shards.pinned = list(dict.fromkeys(shard_paths))
    use_global_index(shards, shard_dir or "\n".join(shards.pinned))
    if shards.index is not None and not os.environ.get("SHARDFS_TEST_NO_BUILDS"):
        shards.start_runs = []  # (TEST ONLY variable: no index, sidecar or hash builds)
    try:
        for p in shard_paths:
            if p in shards.by_path:
                continue  # the same shard twice: serve it once
            shards.add(p)
        if shard_dir is not None:
            try:
                shards.rescan(progress)  # the directory's shards
            except OSError as exc:
                raise ShardError(f"shard directory {shard_dir}: {exc.strerror or exc}") from None
        _index_at_start(shards)
        if shards.known is not None:  # for the next start; not needed after this one
            shards.known.save(m.path for m in shards.served())
            shards.known = None
    except BaseException:
        shards.close()
        raise
    return shards


def _index_at_start(shards: ShardSet) -> None:
    """Write the key runs `add` took while it had the shards open as a new
    level of the global index, so that the mount answers with every shard
    indexed (else, until the background builder indexed them, each lookup
    would ask every shard not indexed: 2 lookups/s with 100,000 new
    shards). A failure is logged: the builder indexes them later."""
    runs, shards.start_runs = shards.start_runs, None
    if not runs:
        return
    served = [m.identity for m in shards.served() if m.identity]
    try:
        shards.index.add_shards(runs, served, prefixes=lambda run: run)
    except Exception as exc:
        log.warning("cannot build the global index in %s now: %s", shards.index.directory, exc)
        return
    shards.reload_index()


def use_global_index(shards: ShardSet, scope: str) -> None:
    """Give `shards` the global index (`shardfs.gindex`) of mount source
    `scope` in its cache directory, as left by earlier mounts (the shards
    it does not hold are indexed in the background). Without it (the
    cache directory cannot be used: logged), every shard is found through
    its own filter."""
    from shardfs.gindex import IndexSet, index_dir
    from shardfs.lookups import KnownShards, LookupSet, lookup_dir

    try:
        index = IndexSet(index_dir(shards.cache_dir, scope))
        index.load()
    except Exception as exc:  # the index is a cache: never a reason to fail a mount
        log.warning("global index unavailable (%s): lookups ask every shard's filter", exc)
        return
    shards.index = index
    try:
        lookups = LookupSet(lookup_dir(shards.cache_dir, scope))
        lookups.load()
    except Exception as exc:  # a cache too
        log.warning("lookup records unavailable (%s): lookups open the shards", exc)
        return
    shards.records = lookups
    known = KnownShards(lookups.directory)
    known.load()
    shards.known = known
