"""The shards of one mount: which are served, in which order, and their filters.

A mount serves one tree over many shards. Each shard gets a *number*, unique
for the life of the mount and never reused: shards given on the command line
are numbered in the order given, a ``--shard-dir`` is scanned in name order,
and shards that appear later get the next numbers. The number is the high
half of every inode of the shard's objects (`shardfs.fuse.handlers`), and decides
which copy wins when a key is in several shards: the lowest number (the same
key always names the same bytes, so any copy is right; one must be chosen so
that a key has one inode and is listed once).

Finding a key must not read every shard's index from disk: each shard has a
*sidecar* (`shardfs.sidecar`: a filter over its keys and its slots sorted by
key), kept in a cache directory so that a remount does not rebuild it. The
filters of all shards sit in one C `SidecarSet`, asked once per lookup for
the shards that may hold the key; only those are probed. A shard whose
sidecar is not built yet is always a candidate (probed directly) until the
background build finishes, so a mount answers at once however many shards
lack a sidecar.

Processes: a mount's coordinator owns the authoritative set (it numbers the
shards, follows the files, builds sidecars); each worker process keeps a
copy that mirrors what the coordinator publishes (`shardfs.fuse.worker`),
with the same numbers, so that an inode names the same object everywhere. A
set is used by one thread at a time.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from shardfs import Shard
from shardfs import sidecar as sidecar_mod
from shardfs._shardfs import SidecarSet, gindex_candidates

log = logging.getLogger("shardfs.fuse")

#: Errors of a sidecar build that come from the cache directory (then a
#: private temporary directory is used instead).
CACHE_DIR_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR}


@dataclass(eq=False)
class MountedShard:
    """One shard of a mount.

    `path` is the path it was opened by (a file or a block device); `ident`
    the (st_dev, st_ino, st_rdev) seen when it was opened, to notice a file
    replaced under the same name; `sidecar` its filter once loaded or built,
    from the directory `sidecar_dir`.
    """

    number: int
    path: str
    shard: Shard
    ident: Tuple[int, int, int]
    sidecar: object = None
    sidecar_dir: Optional[str] = None
    #: No longer served (gone from the shard directory, replaced): new
    #: lookups and opens do not see it, files already open keep reading it
    #: until the coordinator closes it (`ShardSet.discard`).
    removed: bool = False
    #: A sidecar build was tried and failed: the shard stays unfiltered.
    sidecar_failed: bool = False
    objects: int = 0
    extent: int = 0
    #: The shard's 32-byte identity (`shardfs.sidecar.identity`), when the
    #: set has a global index; `indexed`: a level of it holds the shard
    #: (its filter is then left out of the per-shard filters).
    identity: bytes = b""
    indexed: bool = False

    def __post_init__(self) -> None:
        self.objects = self.shard.header.objects_count
        self.extent = self.shard.extent


def _ident(st: os.stat_result) -> Tuple[int, int, int]:
    return (st.st_dev, st.st_ino, st.st_rdev)


def list_shard_dir(directory: str) -> List[str]:
    """Paths of the candidate shards in `directory`, in name order.

    Regular files and block devices (symlinks followed, as in
    ``/dev/rbd/<pool>/``); names starting with "." are skipped (the writer's
    temporary files are ``.<name>.tmp-*``). Raises OSError if the directory
    cannot be read.
    """
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
    """

    def __init__(self, cache_dir: Optional[str] = None, shard_dir: Optional[str] = None) -> None:
        self.cache_dir = cache_dir or sidecar_mod.default_cache_dir()
        self.shard_dir = shard_dir
        self.shards: Dict[int, MountedShard] = {}
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
        #: Index reads made by `find` (probes of a shard's index), for
        #: benchmarks: absent keys should cost almost none.
        self.probes = 0
        #: Lookups made by `find`.
        self.lookups = 0
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
        #: The global index (`shardfs.gindex.IndexSet`) of the shards, when
        #: the mount keeps one: an indexed shard is found through it, the
        #: others through their own filters.
        self.index = None
        #: (version, shards in `filters`): filters are skipped when empty.
        self._filtered = (-1, 0)

    # ------------------------------------------------------------ members

    def served(self) -> List[MountedShard]:
        """Served shards (not removed), by number (= priority)."""
        return [m for n, m in sorted(self.shards.items()) if not m.removed]

    def __len__(self) -> int:
        return sum(1 for m in self.shards.values() if not m.removed)

    def get(self, number: int) -> Optional[MountedShard]:
        """The shard numbered `number`, served or removed-but-open, or None."""
        return self.shards.get(number)

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
            identity: Optional[bytes] = None) -> MountedShard:
        """Serve the shard at `path`; returns its MountedShard.

        `shard` (and its `sidecar`, loaded from `sidecar_dir`), when given,
        come from `open_candidate` or the caller (the set then owns them);
        else `open_candidate(path)` is called here. `number` is given by a
        worker that mirrors the coordinator's numbering; else the next
        number for which `reserved(number)` is False. A shard without a
        sidecar is probed unfiltered until `set_sidecar` (or until the
        global index holds it; `identity`, when known, spares computing
        it). Raises what
        `open_candidate` raises, OSError when `path` cannot be stat'ed.
        """
        if shard is None:
            shard, sidecar = self.open_candidate(path)
            sidecar_dir = self.cache_dir if sidecar is not None else None
        st = os.fstat(shard.fileno())
        if number is None:
            number = self._next_number
            while self.reserved(number):
                number += 1
        self._next_number = max(self._next_number, number + 1)
        member = MountedShard(number, path, shard, _ident(st), sidecar=sidecar,
                              sidecar_dir=sidecar_dir if sidecar is not None else None)
        self.shards[number] = member
        self.by_path[path] = member
        self.filters.set(number, sidecar)
        if self.index is not None:
            member.identity = identity or sidecar_mod.identity(shard)
            if self.index.attach(member.identity, number):
                self.mark_indexed(member)
        self.version += 1
        log.info("serving shard %s as number %d (%d objects%s)", path, number, member.objects,
                 "" if sidecar is not None else ", sidecar pending")
        return member

    def remove(self, member: MountedShard) -> None:
        """Stop serving `member`: lookups, listings and new opens no longer
        see it. It stays open (files already open keep reading) until
        `discard`."""
        if member.removed:
            return
        member.removed = True
        self.version += 1
        self.filters.remove(member.number)
        if self.index is not None:
            self.index.detach(member.number)
        if self.by_path.get(member.path) is member:
            del self.by_path[member.path]
        log.info("shard %s (number %d) removed", member.path, member.number)

    def discard(self, member: MountedShard) -> None:
        """Close `member` and forget it (its number is never given again)."""
        self.remove(member)
        member.shard.close()
        sc, member.sidecar = member.sidecar, None
        if sc is not None:
            sc.close()
        self.shards.pop(member.number, None)

    def close(self) -> None:
        """Close every shard and sidecar (after the mount is gone)."""
        for member in list(self.shards.values()):
            member.shard.close()
            if member.sidecar is not None:
                member.sidecar.close()
        self.shards.clear()
        self.by_path.clear()
        if self._tmp_cache is not None:
            self._tmp_cache.cleanup()
            self._tmp_cache = None

    # ----------------------------------------------------------- sidecars

    def needs_sidecar(self) -> List[MountedShard]:
        """Served shards without a sidecar whose build was not tried yet."""
        return [m for m in self.served() if m.sidecar is None and not m.sidecar_failed]

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
        """Filter `member` with `sidecar` (loaded from `directory`) from now on."""
        if member.removed or member.sidecar is not None:
            if sidecar is not None:
                sidecar.close()
            return
        member.sidecar = sidecar
        member.sidecar_dir = directory
        if not member.indexed:
            self.filters.set(member.number, sidecar)
        self.version += 1
        log.info("shard %s: sidecar ready (%d keys)", member.path, sidecar.count)

    def mark_indexed(self, member: MountedShard) -> None:
        """`member` is in the global index from now on: drop its own filter
        from the lookups (its sidecar stays, for listings)."""
        if member.indexed or member.removed:
            return
        member.indexed = True
        self.filters.remove(member.number)
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
        """The first served shard holding `key`, as (shard, slot,
        data_offset, size), or None.

        Only the shards whose filter may hold the key are probed, in number
        order; `below` limits the search to numbers under it (to decide
        whether an entry is a duplicate). It may wait for the device (the
        C core releases the GIL meanwhile). Raises CorruptShardError when a probed slot is corrupt. `count`: add the
        call to `lookups` and `probes` (False for the duplicate checks of a
        listing, which are not lookups).
        """
        probes = 0
        answer = None
        if self._filtered[0] != self.version:
            self._filtered = (self.version, len(self.filters))
        numbers = self.filters.candidates(key) if self._filtered[1] else []
        if self.index is not None:
            levels, maps = self.index.lookup_args
            if levels:
                more = gindex_candidates(levels, maps, key)
                if more:
                    numbers = sorted(set(numbers).union(more)) if numbers else more
        for number in numbers:
            if below is not None and number >= below:
                break
            member = self.shards.get(number)
            if member is None or member.removed:
                continue
            probes += 1
            found = member.shard.find(key)
            if found is not None:
                answer = (member, found[0], found[1], found[2])
                break
        # Counted once per answer: a corrupt slot (an exception) is not a
        # lookup.
        if count:
            self.lookups += 1
            self.probes += probes
        return answer

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
        stats: Dict[str, os.stat_result] = {}
        for path in candidates:
            try:
                stats[path] = os.stat(path)
            except OSError:
                pass
        for member in list(self.by_path.values()):
            st = stats.get(member.path)
            pinned = member.path in self.pinned and member.path not in present
            if st is None and pinned:
                continue
            if st is None or _ident(st) != member.ident:
                gone.append(member)
        new = []
        for path in candidates:
            st = stats.get(path)
            if st is None:
                continue
            member = self.by_path.get(path)
            if member is not None and member not in gone:
                continue
            seen = (st.st_size, st.st_mtime_ns)
            if self._rejected.get(path) != seen:
                new.append((path, seen))
        for path in list(self._rejected):
            if path not in stats:
                del self._rejected[path]
        return (gone, new)

    def reject(self, path: str, seen: Tuple[int, int], exc: BaseException) -> None:
        """Remember that `path` (as `seen`) is not a valid shard, and say so
        once."""
        self._rejected[path] = seen
        log.warning("%s: not served: %s", path, exc)

    def rescan(self) -> Tuple[List[MountedShard], List[MountedShard]]:
        """Bring the set in line with the files (`plan_rescan`); returns
        (shards added, shards removed). New valid shards are added in name
        order; a path that fails to open (incomplete copy, not a shard) is
        logged once and retried when it changes. Removed shards stay open
        until `discard`. Raises OSError when `shard_dir` cannot be read."""
        gone, new = self.plan_rescan()
        for member in gone:
            self.remove(member)
        added = []
        for path, seen in new:
            try:
                added.append(self.add(path))
            except Exception as exc:
                self.reject(path, seen, exc)
        return (added, gone)
