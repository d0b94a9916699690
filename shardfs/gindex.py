"""The global index of a mount: key -> the shards that may hold it, in a few
levels whose lookup cost does not depend on the number of shards.

A *level* (``shardfs/c/gindex.h``, `shardfs._shardfs.GlobalIndex`) is one
immutable file covering a set of shards, named in it by their 32-byte
identity (`shardfs.sidecar.identity`): one entry per object (the top 40
bits of its key and the shard's position in the level's table), sorted,
with a bucket directory, so that a lookup reads one bucket (one page when
cold); an entry does not repeat the bits its bucket gives, so it takes 7
bytes from 16,384 objects, 6 from 4 million, 5 from a billion.

`IndexSet` keeps the levels of one mount source in a directory of the cache
(``<cache_dir>/index-<scope>/``): a ``MANIFEST`` (JSON, replaced by rename)
lists the levels, largest first. Shards are added in batches as a new
level; then, as in an LSM tree, the newest level is merged into the one
before it while that one is less than `MERGE_FACTOR` times bigger, so
there are about log_MERGE_FACTOR(objects) levels at most. A merge keeps
only the shards served at that moment (a removed shard is masked at once
by the lookup's number map, and purged by the next merge that touches
it). Level files and the manifest are written to temporary names and
renamed, under a lock (``LOCK``, flock), so a crash leaves either the old
or the new manifest, both usable; files no manifest names are removed at
the next load. A manifest or level that cannot be read is logged and the
index starts empty (the shards are then indexed again).

Lookups map a level's shard positions to the mount's shard numbers
(`attach`; `lookup_args` for `shardfs._shardfs.OpenShards.find`); a
shard not attached is never a candidate.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import uuid
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from array import array

from shardfs._shardfs import GlobalIndex, key_prefixes, merge_global_index, write_global_index

log = logging.getLogger("shardfs.fuse")

MANIFEST = "MANIFEST"
LOCK = "LOCK"
#: A level is merged into the one before it while that one holds fewer
#: than MERGE_FACTOR times its entries.
MERGE_FACTOR = 8


def index_dir(cache_dir: str, scope: str) -> str:
    """The index directory of mount source `scope` (a shard directory, or
    the list of shards named at mount) under `cache_dir`."""
    digest = hashlib.sha256(scope.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(cache_dir, f"index-{digest}")


def lock_directory(directory: str) -> int:
    """Create `directory` (mode 0700) if needed and take its ``LOCK``
    (flock, exclusive, waiting): the descriptor to close to let go."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def write_manifest(directory: str, content: Dict[str, object]) -> None:
    """Replace `directory`'s ``MANIFEST`` by `content` (JSON): written to a
    temporary name, fsync'ed, renamed, the directory fsync'ed. OSError."""
    path = os.path.join(directory, MANIFEST)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(content, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def sweep_directory(directory: str, keep: Iterable[str]) -> None:
    """Remove the files of `directory` but `keep`, ``MANIFEST`` and
    ``LOCK`` (left by a crash, or replaced by a merge); best effort."""
    keep = set(keep) | {MANIFEST, LOCK}
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for name in entries:
        if name not in keep:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


class Level:
    """One open level: its file `name`, the `GlobalIndex` (whose
    `position(identity)` gives a shard's position in its shard table) and
    `numbers` (shard position -> the mount's shard number, -1 when not
    attached)."""

    __slots__ = ("name", "index", "numbers")

    def __init__(self, name: str, index: GlobalIndex) -> None:
        self.name = name
        self.index = index
        self.numbers = array("q", [-1]) * index.shard_count


class IndexSet:
    """The levels of one index directory, and which mount shard numbers
    their shards are.

    `directory` is created when needed. Not thread-safe; one per process
    (a worker mirrors its coordinator's through `load(names)`).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.levels: List[Level] = []
        #: (levels, number maps) as `shardfs._shardfs.OpenShards.find`
        #: takes them: ShardSet.find passes them with the key (one C call
        #: gives the attached shards that may hold it, in number order, and
        #: probes those open in the process).
        self.lookup_args: Tuple[tuple, tuple] = ((), ())
        #: Identity -> shard number, for the shards attached.
        self.attached: Dict[bytes, int] = {}

    # ------------------------------------------------------------- levels

    def names(self) -> List[str]:
        """The level files in use, largest first."""
        return [lv.name for lv in self.levels]

    def read_manifest(self) -> List[str]:
        """Level names the manifest lists ([] when there is none or it is
        unreadable: logged)."""
        path = os.path.join(self.directory, MANIFEST)
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
            names = [str(n) for n in data["levels"]]
            if any("/" in n or n.startswith(".") for n in names):
                raise ValueError("bad level name")
            return names
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable index manifest (%s): the shards are indexed again", path, exc)
            return []

    def load(self, names: Optional[Sequence[str]] = None) -> bool:
        """Use the levels `names` (default: the manifest's); returns True
        when they changed. A level that cannot be opened empties the index
        (logged): its shards are then indexed again."""
        if names is None:
            names = self.read_manifest()
        names = list(names)
        if names == self.names():
            return False
        old = {lv.name: lv for lv in self.levels}
        levels: List[Level] = []
        try:
            for name in names:
                lv = old.pop(name, None)
                if lv is None:
                    lv = Level(name, GlobalIndex(os.path.join(self.directory, name)))
                levels.append(lv)
        except Exception as exc:
            log.warning("%s: cannot open index level (%s): the shards are indexed again", self.directory, exc)
            current = {l.name for l in self.levels}
            for lv in levels:
                if lv.name not in current:
                    lv.index.close()
            levels = []
            old = {lv.name: lv for lv in self.levels}
        for lv in old.values():
            lv.index.close()
        self.levels = levels
        for lv in self.levels:
            for ident, number in self.attached.items():
                j = lv.index.position(ident)
                if j >= 0:
                    lv.numbers[j] = number
        self.lookup_args = (tuple(lv.index for lv in levels), tuple(lv.numbers for lv in levels))
        return True

    def close(self) -> None:
        for lv in self.levels:
            lv.index.close()
        self.levels = []
        self.lookup_args = ((), ())

    # ------------------------------------------------------------ shards

    def covers(self, identity: bytes) -> bool:
        """Whether a level holds the shard with `identity`."""
        return any(lv.index.position(identity) >= 0 for lv in self.levels)

    def attach(self, identity: bytes, number: int) -> bool:
        """Serve the shard `identity` as `number`; True if a level holds it."""
        self.attached[identity] = number
        found = False
        for lv in self.levels:
            j = lv.index.position(identity)
            if j >= 0:
                lv.numbers[j] = number
                found = True
        return found

    def detach(self, number: int) -> None:
        """Never give `number` as a candidate again (its shard is removed)."""
        for ident in [i for i, n in self.attached.items() if n == number]:
            del self.attached[ident]
            for lv in self.levels:
                j = lv.index.position(ident)
                if j >= 0:
                    lv.numbers[j] = -1

    # ---------------------------------------------------------- building

    def _lock(self) -> int:
        return lock_directory(self.directory)

    def _new_name(self) -> str:
        return f"level-{uuid.uuid4().hex[:16]}.gidx"

    def _write_manifest(self, names: List[str]) -> None:
        write_manifest(self.directory, {"version": 1, "levels": names})

    def _sweep(self, keep: Iterable[str]) -> None:
        sweep_directory(self.directory, keep)

    def add_shards(self, shards: Sequence[Tuple[bytes, object]], served: Iterable[bytes],
                   prefixes: Callable[[object], bytes] = key_prefixes) -> List[str]:
        """Index `shards` ((identity, open Shard) pairs) as a new level,
        then merge levels as the module's docstring says, keeping only the
        shards whose identity is in `served`. Reads each shard's index
        (about 8 bytes of memory per object of the shards added). Writes
        the manifest; returns the new level names. Raises OSError (e.g.
        ENOSPC) with the manifest unchanged. `prefixes(item)` gives the
        run of a pair's second item: by default its keys' (a level over
        other 32-byte names, such as sha1 digests padded with zeros, takes
        another: `shardfs.hashes`)."""
        served = set(served)
        fd = self._lock()
        try:
            names = self.read_manifest()
            self.load(names)
            if self.names() != names:
                # A level could not be opened (damaged, or written in an
                # older format): start again from the shards given.
                names = []
            runs = [(ident, prefixes(shard)) for ident, shard in shards
                    if not self.covers(ident)]
            if runs:
                name = self._new_name()
                write_global_index(os.path.join(self.directory, name), runs)
                names = names + [name]
                self.load(names)
            names = self._merge(names, served)
            self._write_manifest(names)
            self._sweep(names)
            return names
        finally:
            os.close(fd)

    def _merge(self, names: List[str], served: set) -> List[str]:
        while len(self.levels) >= 2:
            a, b = self.levels[-2], self.levels[-1]
            if a.index.count >= MERGE_FACTOR * b.index.count and a.index.count > 0:
                break
            keep = [[j for j, ident in enumerate(lv.index.identities()) if ident in served] for lv in (a, b)]
            name = self._new_name()
            merge_global_index(os.path.join(self.directory, name), [a.index, b.index], keep)
            names = names[:-2] + [name]
            self.load(names)
        return names

    def stats(self) -> Dict[str, object]:
        """Levels (entries each) and the shards attached to them."""
        return {"levels": [lv.index.count for lv in self.levels],
                "indexed_shards": sum(1 for lv in self.levels for n in lv.numbers if n >= 0)}
