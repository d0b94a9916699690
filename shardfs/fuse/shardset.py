"""The shards of one mount: which are served, in which order, and their filters.

A mount serves one tree over many shards. Each shard gets a *number*, unique
for the life of the mount and never reused: shards given on the command line
are numbered in the order given, a ``--shard-dir`` is scanned in name order,
and shards that appear later get the next numbers. The number is the high
half of every inode of the shard's objects (`shardfs.fuse.fs`), and decides
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

Thread safety: the set is changed only by the trio thread. Worker threads
may probe it; the filesystem counts them in `ShardSet.workers`, and a
removed shard is closed only once it has no open file and no worker thread
runs (`close_idle`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from shardfs import Shard
from shardfs import sidecar as sidecar_mod
from shardfs._shardfs import SidecarSet

log = logging.getLogger("shardfs.fuse")

#: Errors of a sidecar build that come from the cache directory (then a
#: private temporary directory is used instead).
_CACHE_DIR_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR}


@dataclass(eq=False)
class MountedShard:
    """One shard of a mount.

    `path` is the path it was opened by (a file or a block device); `ident`
    the (st_dev, st_ino, st_rdev) seen when it was opened, to notice a file
    replaced under the same name; `sidecar` its filter once loaded or built.
    """

    number: int
    path: str
    shard: Shard
    ident: Tuple[int, int, int]
    sidecar: object = None
    #: Files of this shard the kernel has open (open minus release).
    open_files: int = 0
    #: No longer served (gone from the shard directory); closed when idle.
    removed: bool = False
    #: Set once the sidecar is loaded, built, or its build failed.
    sidecar_done: threading.Event = field(default_factory=threading.Event)
    #: True once the sidecar is in the set's filters.
    installed: bool = False
    #: Held while the sidecar is being built (one build per shard).
    build_lock: threading.Lock = field(default_factory=threading.Lock)
    objects: int = 0
    extent: int = 0

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
        #: Called with a MountedShard whose sidecar must be built (the
        #: filesystem schedules it in a worker thread).
        self.on_needs_sidecar: Optional[Callable[[MountedShard], None]] = None
        #: Worker threads running that may touch any shard (kept by the
        #: filesystem); removed shards are closed only when it is 0.
        self.workers = 0

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
        which reads the shard's hash section. Changes nothing in the set,
        so it may run in a worker thread. Raises what `shardfs.Shard`
        raises (CorruptShardError, OSError, ShardError)."""
        shard = Shard(path)
        sidecar = None
        try:
            sidecar = sidecar_mod.load(shard, self.cache_dir)
        except Exception as exc:  # a broken cache must never stop a mount
            log.warning("%s: cannot load its sidecar: %s", path, exc)
        return shard, sidecar

    def add(self, path: str, shard: Optional[Shard] = None, sidecar: object = None) -> MountedShard:
        """Serve the shard at `path`.

        `shard` (and its `sidecar`), when given, come from `open_candidate`
        or the caller (the set then owns them); else `open_candidate(path)`
        is called here. Without a current sidecar `on_needs_sidecar` is
        called (the shard is probed unfiltered until it is built). Raises
        what `open_candidate` raises.
        """
        st = os.stat(path)
        if shard is None:
            shard, sidecar = self.open_candidate(path)
        number = self._next_number
        self._next_number += 1
        member = MountedShard(number, path, shard, _ident(st))
        self.shards[number] = member
        self.by_path[path] = member
        member.sidecar = sidecar
        self.filters.set(number, member.sidecar)
        if member.sidecar is not None:
            member.installed = True
            member.sidecar_done.set()
        elif self.on_needs_sidecar is not None:
            self.on_needs_sidecar(member)
        log.info("serving shard %s as number %d (%d objects%s)", path, number, member.objects,
                 "" if member.sidecar is not None else ", sidecar pending")
        return member

    def remove(self, member: MountedShard) -> None:
        """Stop serving `member`: lookups and listings no longer see it.
        Its open files keep reading; it is closed once idle."""
        if member.removed:
            return
        member.removed = True
        self.filters.remove(member.number)
        if self.by_path.get(member.path) is member:
            del self.by_path[member.path]
        log.info("shard %s (number %d) removed", member.path, member.number)
        self.close_if_idle(member)

    def close_if_idle(self, member: MountedShard) -> None:
        """Close a removed shard once no file is open and no worker thread
        runs (trio thread)."""
        if member.removed and member.open_files <= 0 and self.workers <= 0:
            member.shard.close()
            sc = member.sidecar
            member.sidecar = None
            if sc is not None:
                sc.close()
            self.shards.pop(member.number, None)

    def close_idle(self) -> None:
        """`close_if_idle` for every removed shard."""
        for member in list(self.shards.values()):
            if member.removed:
                self.close_if_idle(member)

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

    def ensure_sidecar(self, member: MountedShard) -> object:
        """`member`'s sidecar, built first if it is missing; None if it
        cannot be built (worker thread: reads the whole index).

        One build per shard at a time; a failed build is not retried.
        Falls back to a private temporary directory when the cache
        directory cannot be written. Installing it in the filter set is
        `install_sidecar`'s job (trio thread). Never raises: a failure is
        logged and the shard stays unfiltered.
        """
        with member.build_lock:
            if member.sidecar_done.is_set():
                return member.sidecar
            try:
                try:
                    member.sidecar = sidecar_mod.build(member.shard, self.cache_dir)
                except OSError as exc:
                    if exc.errno not in _CACHE_DIR_ERRNOS:
                        raise  # the shard, not the cache directory
                    if self._tmp_cache is None:
                        log.warning("cannot write sidecars in %s (%s): using a temporary directory",
                                    self.cache_dir, exc.strerror or exc)
                        self._tmp_cache = tempfile.TemporaryDirectory(prefix="shardfs-sidecars-")
                    member.sidecar = sidecar_mod.build(member.shard, self._tmp_cache.name)
            except Exception as exc:
                log.warning("%s: cannot build its sidecar, probing it directly: %s", member.path, exc)
            finally:
                member.sidecar_done.set()
            return member.sidecar

    def install_sidecar(self, member: MountedShard) -> None:
        """Put a freshly built sidecar in the filter set (trio thread)."""
        if not member.removed and member.sidecar is not None and not member.installed:
            self.filters.set(member.number, member.sidecar)
            member.installed = True
            log.info("shard %s: sidecar ready (%d keys)", member.path, member.sidecar.count)

    def install_ready(self) -> None:
        """`install_sidecar` for every served shard (after listings built
        some in worker threads)."""
        for member in self.served():
            self.install_sidecar(member)

    # ------------------------------------------------------------- lookup

    def candidates(self, key: bytes) -> List[int]:
        """Numbers of the served shards that may hold `key` (ascending)."""
        return self.filters.candidates(key)

    def find(self, key: bytes, nowait: bool = False, below: Optional[int] = None,
             count: bool = True) -> Optional[Tuple[MountedShard, int, int, int]]:
        """The first served shard holding `key`, as (shard, slot,
        data_offset, size), or None.

        Only the shards whose filter may hold the key are probed, in number
        order; `below` limits the search to numbers under it (to decide
        whether an entry is a duplicate). With `nowait`, raises
        BlockingIOError when a probe would wait for the device. Raises
        CorruptShardError when a probed slot is corrupt. `count`: add the
        call to `lookups` and `probes` (False for the duplicate checks of a
        listing, which are not lookups).
        """
        probes = 0
        answer = None
        for number in self.filters.candidates(key):
            if below is not None and number >= below:
                break
            member = self.shards.get(number)
            if member is None or member.removed:
                continue
            probes += 1
            try:
                found = member.shard.find(key, nowait=nowait)
            except ValueError:  # closed under us: it was removed
                continue
            if found is not None:
                answer = (member, found[0], found[1], found[2])
                break
        # Counted once per answer: an exception (a page-cache-only attempt
        # retried in a thread, a corrupt slot) is not a lookup of its own.
        if count:
            self.lookups += 1
            self.probes += probes
        return answer

    # --------------------------------------------------------- directory

    def plan_rescan(self) -> Tuple[List[MountedShard], List[Tuple[str, Tuple[int, int]]]]:
        """Compare `shard_dir` with the set: (served shards whose path
        vanished or now names another file, new paths to try with their
        (size, mtime_ns)). A path that failed before is tried again only
        once its size or mtime changed. Raises OSError when the directory
        cannot be read."""
        if self.shard_dir is None:
            return ([], [])
        paths = list_shard_dir(self.shard_dir)
        present = set(paths)
        gone = []
        for member in list(self.by_path.values()):
            vanished = member.path not in present
            if not vanished:
                try:
                    vanished = _ident(os.stat(member.path)) != member.ident
                except OSError:
                    vanished = True
            if vanished:
                gone.append(member)
        new = []
        for path in paths:
            if path in self.by_path:
                continue
            try:
                st = os.stat(path)
            except OSError:
                continue
            seen = (st.st_size, st.st_mtime_ns)
            if self._rejected.get(path) != seen:
                new.append((path, seen))
        for path in list(self._rejected):
            if path not in present:
                del self._rejected[path]
        return (gone, new)

    def reject(self, path: str, seen: Tuple[int, int], exc: BaseException) -> None:
        """Remember that `path` (as `seen`) is not a valid shard, and say so
        once."""
        self._rejected[path] = seen
        log.warning("%s: not served: %s", path, exc)

    def rescan(self) -> Tuple[int, int]:
        """Bring the set in line with `shard_dir` (in this thread); returns
        (added, removed). New valid shards are added in name order; a path
        that fails to open (incomplete copy, not a shard) is logged once
        and retried when it changes; shards whose path vanished or now
        names another file are removed. Raises OSError when the directory
        cannot be read. (The filesystem does the same with the opening in
        a worker thread: `plan_rescan`, `open_candidate`, `add`.)"""
        gone, new = self.plan_rescan()
        for member in gone:
            self.remove(member)
        added = 0
        for path, seen in new:
            try:
                self.add(path)
                added += 1
            except Exception as exc:
                self.reject(path, seen, exc)
        return (added, len(gone))
