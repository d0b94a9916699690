"""Objects found by the other hashes Software Heritage names content with.

A Read Shard's key is the SHA-256 of an object's bytes. Software Heritage
also names content by

* ``sha1``: SHA-1 of the bytes (the objstorage's historical primary key);
* ``sha1_git``: git's blob hash, SHA-1 of ``b"blob <size in decimal>\\0"``
  followed by the bytes, which a content SWHID names:
  ``swh:1:cnt:<sha1_git as 40 hex digits>``.

(Source: swh.model's ``hashutil``/``MultiHash`` and git's object format;
docs/hashes.md.)

Each shard gets one *hash index* file per hash (``shardfs/c/hashindex.h``):
the digests' bits and slots, 8 bytes per object, kept in the cache
directory next to the shard's sidecar as ``<identity hex>.<hash name>`` and
replaced whole (temporary file, fdatasync, rename). It is built by reading
every object of the shard once (`build`), or imported from a mapping of
(sha256, sha1, sha1_git) rows such as an export of Software Heritage's
``content`` table (`import_mapping`), so that an archive need not hash its
objects again.

An index only proposes slots: before an object is served under a sha1 or
sha1_git, its bytes are hashed again and compared (`find`). A damaged file
or a wrong row can make an object not found by that name, never make the
wrong object found. The cost is one read and one SHA-1 of the object per
lookup (SHA-1 runs at about 1.4 GB/s on the 2-core test machine: some
3 µs for a 4 KiB object).
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
from array import array
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from shardfs import Shard, _shardfs, sidecar
from shardfs._shardfs import HashIndex, build_hash_indexes, write_hash_index
from shardfs.errors import RESOURCE_ERRORS, ShardError, StaleSidecarError

log = logging.getLogger("shardfs")

#: The hashes an object can be found by besides its key, in this order.
HASH_NAMES = ("sha1", "sha1_git")
#: Their numbers in the C core (hashindex.h: enum sfs_hash_kind).
KINDS = {"sha1": 1, "sha1_git": 2}
#: Bytes of a sha1 or sha1_git digest.
DIGEST_SIZE = 20
#: Up to this many indexed shards, a lookup asks each one's hash index
#: (a binary search of one bucket each) rather than the levels first: a
#: level costs one more read (a page of the level file) than it saves.
DIRECT_SHARDS = 8
#: Digests a HashSet remembers as checked (their object hashed and found
#: equal), so that a hot object is hashed once, not at every lookup.
CHECKED_CACHE = 65536


class NoHashIndexError(ShardError):
    """A shard has no index by the hash asked for (build it with
    ``shardfs index --hashes``)."""


def parse_names(text: str, sep: str = ",") -> Tuple[str, ...]:
    """The hash names in `text` (e.g. ``"sha1,sha1_git"``; mount options
    use ``sep=":"``), each once, in `HASH_NAMES` order. ValueError naming
    an unknown one."""
    names = {part.strip() for part in text.split(sep) if part.strip()}
    unknown = sorted(names - set(HASH_NAMES))
    if unknown:
        raise ValueError(f"unknown hash {unknown[0]!r}: choose from {', '.join(HASH_NAMES)}")
    if not names:
        raise ValueError(f"no hash named: choose from {', '.join(HASH_NAMES)}")
    return tuple(n for n in HASH_NAMES if n in names)


def parse_digest(text: str) -> bytes:
    """A 40-hex-digit sha1 or sha1_git (any case) as 20 bytes; ValueError."""
    if len(text) != 2 * DIGEST_SIZE:
        raise ValueError(f"{text!r}: a sha1 or sha1_git is 40 hexadecimal digits")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{text!r}: a sha1 or sha1_git is 40 hexadecimal digits") from None


#: parse_swhid(text) -> the 20-byte sha1_git a content SWHID
#: (``swh:1:cnt:<40 lowercase hex>``) names, or None when `text` is not
#: one: the parser of the request path (``shardfs/c/ll_names.h``).
parse_swhid = _shardfs.parse_swhid


def digest(name: str, data: bytes) -> bytes:
    """The `name` digest of `data` (hashlib): what an index answers for."""
    if name == "sha1":
        return hashlib.sha1(data).digest()
    if name == "sha1_git":
        h = hashlib.sha1(b"blob %d\0" % len(data))
        h.update(data)
        return h.digest()
    raise ValueError(f"unknown hash {name!r}")


def index_path(cache_dir: str, identity: bytes, name: str) -> str:
    """``<cache_dir>/<identity as 64 hex digits>.<name>``."""
    if name not in KINDS:
        raise ValueError(f"unknown hash {name!r}")
    return os.path.join(os.fspath(cache_dir), identity.hex() + "." + name)


def open_index(shard: Shard, name: str, cache_dir: Optional[str] = None,
               identity: Optional[bytes] = None) -> Optional[HashIndex]:
    """The shard's `name` index from `cache_dir` (default: the sidecars'),
    or None when there is none, or it is another shard's or damaged (logged:
    build it again). OSError for other failures."""
    cache_dir = cache_dir or sidecar.default_cache_dir()
    identity = identity or sidecar.identity(shard)
    path = index_path(cache_dir, identity, name)
    try:
        return HashIndex(path, identity, shard.slot_count)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except StaleSidecarError as exc:
        log.warning("%s: %s", shard.path, exc)
        return None


def build(shard: Shard, names: Sequence[str], cache_dir: Optional[str] = None,
          progress: Optional[Callable[[int], None]] = None, force: bool = False) -> List[str]:
    """Build the shard's indexes by `names` that are missing (all with
    `force`) in `cache_dir`, reading every object once (in file order, at
    the device's sequential speed; the GIL is released). progress(bytes)
    is called about every 64 MiB with the object bytes hashed so far (of
    ``shard.header.objects_size``); an exception it raises stops the
    build with nothing written. Returns the names built. OSError (ENOSPC,
    EACCES...: nothing is left behind), CorruptShardError."""
    cache_dir = cache_dir or sidecar.default_cache_dir()
    identity = sidecar.identity(shard)
    todo = []
    for name in names:
        if force:
            todo.append(name)
            continue
        existing = open_index(shard, name, cache_dir, identity)
        if existing is None:
            todo.append(name)
        else:
            existing.close()
    if not todo:
        return []
    sidecar._makedirs_private(cache_dir)
    paths = {name: index_path(cache_dir, identity, name) for name in todo}
    build_hash_indexes(shard.reader, identity, progress=progress, **{f"{n}_path": p for n, p in paths.items()})
    return todo


def find(shard: Shard, index: HashIndex, digest_: bytes) -> Optional[Tuple[int, int, int]]:
    """``(slot, data_offset, size)`` of the object of `shard` whose digest
    of the index's hash is `digest_` (20 bytes), checked by hashing its
    bytes again; None when absent. OSError when an object cannot be read."""
    return index.find(shard.reader, digest_)


# ------------------------------------------------------------------ mappings


def _cell(text: str, column: str, line: int) -> bytes:
    text = text.strip()
    if text.startswith("\\x"):  # PostgreSQL's bytea output
        text = text[2:]
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"line {line}: column {column}: {text[:80]!r} is not hexadecimal") from None


def read_mapping(stream: io.TextIOBase, names: Sequence[str]) -> Iterator[Tuple[bytes, Dict[str, bytes]]]:
    """Rows ``(sha256, {name: digest})`` of a mapping: CSV or TSV (told by
    the first line) with a header naming its columns, among them ``sha256``
    and each of `names` (others, such as ``blake2s256`` or ``length``, are
    ignored), values in hexadecimal or PostgreSQL's ``\\x`` form. ValueError
    naming the line of a malformed row or a missing column."""
    first = stream.readline()
    dialect = "excel-tab" if "\t" in first else "excel"
    header = next(csv.reader([first], dialect=dialect), [])
    columns = {c.strip(): i for i, c in enumerate(header)}
    for column in ("sha256", *names):
        if column not in columns:
            raise ValueError(f"line 1: no {column} column (the header names {', '.join(header) or 'nothing'})")
    want = [(n, columns[n]) for n in names]
    key_at = columns["sha256"]
    for line, row in enumerate(csv.reader(stream, dialect=dialect), 2):
        if not row:
            continue
        if len(row) < len(header):
            raise ValueError(f"line {line}: {len(row)} columns, the header has {len(header)}")
        key = _cell(row[key_at], "sha256", line)
        if len(key) != 32:
            raise ValueError(f"line {line}: column sha256: {len(key)} bytes, not 32")
        digests = {}
        for name, i in want:
            d = _cell(row[i], name, line)
            if len(d) != DIGEST_SIZE:
                raise ValueError(f"line {line}: column {name}: {len(d)} bytes, not 20")
            digests[name] = d
        yield key, digests


def import_mapping(shards: Sequence[Shard], rows: Iterable[Tuple[bytes, Dict[str, bytes]]],
                   names: Sequence[str], cache_dir: Optional[str] = None,
                   progress: Optional[Callable[[int], None]] = None) -> Dict[str, int]:
    """Write the `names` indexes of `shards` from mapping `rows` (see
    `read_mapping`) without reading any object: each row's sha256 is looked
    up in the shards (its first holder gets the entry). The rows are not
    trusted: every lookup hashes the object again (module docstring).
    Memory: 24 bytes per row and name until the files are written.
    progress(rows) is called every 65,536 rows. Returns counts: ``rows``,
    ``found`` (rows whose sha256 is in a shard), ``objects`` (live objects
    of the shards: those above ``found`` are not findable by these names).
    OSError when a file cannot be written."""
    cache_dir = cache_dir or sidecar.default_cache_dir()
    identities = [sidecar.identity(s) for s in shards]
    digests = [{n: bytearray() for n in names} for _ in shards]
    slots = [array("I") for _ in shards]
    total = found = 0
    for key, row in rows:
        total += 1
        if progress is not None and total % 65536 == 0:
            progress(total)
        for i, shard in enumerate(shards):
            where = shard.find(key)
            if where is not None:
                found += 1
                slots[i].append(where[0])
                for name in names:
                    digests[i][name] += row[name]
                break
    sidecar._makedirs_private(cache_dir)
    for i, shard in enumerate(shards):
        for name in names:
            write_hash_index(index_path(cache_dir, identities[i], name), KINDS[name], identities[i],
                             shard.slot_count, bytes(digests[i][name]), slots[i])
    return {"rows": total, "found": found, "objects": sum(len(s) for s in shards)}


# ------------------------------------------------------------------ shard sets


class HashSet:
    """The objects of a `shardfs.shardset.ShardSet` found by the hashes
    `names` (a mount's ``-o hashes=``): which served shards have an index
    by each (`MountedShard.hashes`), their indexes opened when first used,
    and `find`.

    A shard without an index by a hash is not searched for it: its objects
    are not found by that hash until the index is built (`pending` lists
    them; a mount's builder builds them in the background) or imported.

    When the set has a global index (a mount's: `shardfs.gindex`), each
    hash gets one too (`levels`, in the directory of the set's with
    ``-<name>`` added), built over the shards' digests (their top 40 bits,
    from the hash indexes), so that a lookup asks only the shards that may
    hold the digest, however many are served; the shards the levels do not
    hold yet are asked each (`unlevelled`). Without one (the objstorage),
    every indexed shard is asked: a C lookup of ~1 µs each.
    Used by one thread at a time, as its set.
    """

    def __init__(self, shards, names: Sequence[str]) -> None:
        self.shards = shards
        self.names = tuple(names)
        self._open: Dict[Tuple[int, str], HashIndex] = {}
        #: Object bytes hashed so far by the build running, and its total.
        self.progress: Tuple[int, int] = (0, 0)
        #: Changes whenever a shard's `hashes` or the levels change.
        self.generation = 0
        #: Shards asked by `find` (index lookups), for the stats.
        self.probes = 0
        #: Per hash, the global index (`shardfs.gindex.IndexSet`) over the
        #: digests, when the set has a global index.
        self.levels: Dict[str, object] = {}
        if shards.index is not None:
            from shardfs.gindex import IndexSet

            for name in self.names:
                try:
                    level = IndexSet(f"{shards.index.directory}-{name}")
                    level.load()
                except Exception as exc:  # a cache: never a reason to fail
                    log.warning("%s index unavailable (%s): every indexed shard is asked", name, exc)
                    continue
                self.levels[name] = level
        self._unlevelled: Dict[str, Tuple[object, List]] = {}
        self._direct: Dict[str, Tuple[object, Optional[List]]] = {}
        #: (hash name, digest) -> the inode (shard number, slot) of an
        #: object checked.
        self._checked: Dict[Tuple[str, bytes], int] = {}
        for member in shards.served():
            self.attach(member)

    def directories(self) -> List[str]:
        """Where indexes are looked for: the set's sidecar directory (a
        private one once the cache directory failed), then the cache
        directory."""
        return list(dict.fromkeys([self.shards.sidecar_dir, self.shards.cache_dir]))

    def scan(self, members: Optional[Iterable] = None) -> int:
        """Mark in each of `members` (default: every served shard) the
        hashes it has a usable index by; returns how many gained one."""
        gained = 0
        for member in self.shards.served() if members is None else members:
            if member.removed or not member.identity or set(member.hashes) >= set(self.names):
                continue
            have = tuple(n for n in self.names if n in member.hashes or self._exists(member, n))
            if have != member.hashes:
                member.hashes = have
                gained += 1
        if gained:
            self.generation += 1
        return gained

    def attach(self, member) -> None:
        """Tell the levels `member`'s number (a served shard)."""
        for level in self.levels.values():
            if member.identity:
                level.attach(member.identity, member.number)
        self.generation += 1

    def unlevelled(self, name: str) -> List:
        """Served shards with an index by `name` that its levels do not
        hold (asked one by one), by number."""
        stamp = (self.shards.version, self.generation)
        cached = self._unlevelled.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        level = self.levels.get(name)
        out = [m for m in self.shards.served()
               if name in m.hashes and (level is None or not level.covers(m.identity))]
        self._unlevelled[name] = (stamp, out)
        return out

    def direct(self, name: str) -> Optional[List]:
        """Every served shard indexed by `name` when they are at most
        DIRECT_SHARDS (a lookup asks each, not the levels), else None."""
        stamp = (self.shards.version, self.generation)
        cached = self._direct.get(name)
        if cached is None or cached[0] != stamp:
            indexed = [m for m in self.shards.served() if name in m.hashes]
            cached = self._direct[name] = (stamp, indexed if len(indexed) <= DIRECT_SHARDS else None)
        return cached[1]

    def add_to_levels(self, members: Sequence, served: Iterable[bytes]) -> None:
        """Add `members` (indexed shards) to every hash's levels (in the
        builder process; the coordinator then `reload`s). OSError."""
        for name, level in self.levels.items():
            pairs = []
            for member in members:
                index = self.index_of(member, name)
                if index is not None:
                    pairs.append((member.identity, index))
            if pairs:
                level.add_shards(pairs, served, prefixes=lambda index: index.prefixes())

    def reload(self, names: Optional[Dict[str, List[str]]] = None) -> None:
        """Use each hash's levels `names[hash]` (default: their manifests')."""
        for name, level in self.levels.items():
            if level.load(None if names is None else names.get(name)):
                for member in self.shards.served():
                    if member.identity:
                        level.attach(member.identity, member.number)
        self.generation += 1

    def level_names(self) -> Dict[str, List[str]]:
        return {name: level.names() for name, level in self.levels.items()}

    def _exists(self, member, name: str) -> bool:
        for directory in self.directories():
            if os.path.exists(index_path(directory, member.identity, name)):
                return True
        return False

    def pending(self) -> List:
        """Served shards that lack an index by one of `names` (and whose
        build did not fail), by number."""
        return [m for m in self.shards.served()
                if m.identity and not m.hashes_failed and not set(self.names) <= set(m.hashes)]

    def index_of(self, member, name: str) -> Optional[HashIndex]:
        """`member`'s index by `name`, opened now if needed; None when it
        has none (or it is damaged: logged, and the shard is no longer
        searched by that hash)."""
        found = self._open.get((member.number, name))
        if found is not None or name not in member.hashes:
            return found
        for directory in self.directories():
            try:
                found = HashIndex(index_path(directory, member.identity, name), member.identity, member.slot_count)
                break
            except (FileNotFoundError, NotADirectoryError):
                continue
            except (StaleSidecarError, OSError) as exc:
                log.warning("%s: %s index unusable, not searched by %s: %s", member.path, name, name, exc)
                break
        if found is None:
            member.hashes = tuple(n for n in member.hashes if n != name)
            return None
        self._open[(member.number, name)] = found
        return found

    def snapshot_hashes(self, numbers: int, dir_inodes: Dict[str, int]) -> Tuple[Any, Any]:
        """What a snapshot of the C resolver (``shardfs/c/ll_snapshot.h``)
        holds of the names by sha1 and sha1_git: a pair (sha1, sha1_git),
        each None (not one of `names`) or (the inode of its directory in
        `dir_inodes`, 0 when absent; the levels over its digests, their
        maps; the `HashIndex` of each shard number below `numbers`, or
        None; an ``array('q')`` of the indexed shards the levels do not
        hold, asked each). Every index of a served shard is opened here."""
        out = []
        for name in ("sha1", "sha1_git"):
            if name not in self.names:
                out.append(None)
                continue
            level = self.levels.get(name)
            levels, maps = level.lookup_args if level is not None else ((), ())
            indexes: List[Any] = [None] * numbers
            for member in self.shards.served():
                if name in member.hashes and member.number < numbers:
                    indexes[member.number] = self.index_of(member, name)
            direct = self.direct(name)
            if direct is not None:  # few shards: each asked, not the levels
                levels, maps = (), ()
            unlevelled = array("q", [m.number for m in (direct if direct is not None else self.unlevelled(name))])
            out.append((dir_inodes.get(name, 0), levels, maps, tuple(indexes), unlevelled))
        return (out[0], out[1])

    def find(self, name: str, digest_: bytes) -> Optional[Tuple[object, int, int, int]]:
        """The first served shard (by number) holding an object whose
        `name` digest is `digest_` (20 bytes), as (shard, slot,
        data_offset, size), or None: the C resolver of the set
        (`shardfs.shardset.ShardSet.resolver`, ``ll_resolve_digest``),
        which hashes each candidate object again before answering it
        (module docstring). A shard that cannot be opened is logged and
        skipped; one that cannot be read is logged, and the digest is then
        absent unless a later shard holds it. Raises OSError (EMFILE,
        ENFILE, ENOMEM) when a candidate cannot be opened for want of
        descriptors or memory. The last CHECKED_CACHE
        digests found are remembered with their slot: found again, the
        object is not hashed again (its bytes cannot change), but its slot
        is read again (a takedown is seen at once)."""
        if name not in self.names:
            return None
        hit = self._checked.pop((name, digest_), None)
        if hit is not None:
            code, value = self.shards.resolver().inode(hit)
            if code == _shardfs.RESOLVE_FOUND and name in getattr(self.shards.get(value[3]), "hashes", ()):
                self._checked[(name, digest_)] = hit
                return (self.shards.get(value[3]), hit & 0xFFFFFFFF, value[4], value[1])
        kind, start, opened = KINDS[name] - 1, 0, set()
        while True:
            code, value = self.shards.resolver().find_digest(kind, digest_, start)
            if code != _shardfs.RESOLVE_OPEN:
                break
            member, start = self.shards.get(value), value + 1
            try:
                shard = self.shards.open_for_resolver(member)
            except (OSError, ShardError) as exc:
                if getattr(exc, "errno", None) in RESOURCE_ERRORS:
                    raise
                log.warning("%s: looking up a %s: %s", member.path, name, exc)
                continue
            if value not in opened:  # asked again, now open
                opened.add(value)
                start = value
                continue
            index = self.index_of(member, name)  # opened, yet past the resolver's bound: asked here
            found = index.find(shard.reader, digest_) if index is not None else None
            if found is not None:
                self.probes += 1
                self._remember(name, digest_, _shardfs.object_inode(member.number, found[0]))
                return (member, found[0], found[1], found[2])
        if code == _shardfs.RESOLVE_FAILED:
            member = self.shards.get(value[0])
            log.warning("%s: looking up a %s: %s", member.path if member else "?", name, value[1])
            return None
        self.probes += value[5] if code == _shardfs.RESOLVE_FOUND else value
        if code != _shardfs.RESOLVE_FOUND:
            return None
        ino, size, _, number, offset, _ = value
        self._remember(name, digest_, ino)
        return (self.shards.get(number), ino & 0xFFFFFFFF, offset, size)

    def _remember(self, name: str, digest_: bytes, ino: int) -> None:
        if len(self._checked) >= CHECKED_CACHE:
            self._checked.clear()
        self._checked[(name, digest_)] = ino

    def forget(self, member) -> None:
        """Close `member`'s indexes (it is no longer served)."""
        for name in self.names:
            index = self._open.pop((member.number, name), None)
            if index is not None:
                index.close()
        for level in self.levels.values():
            level.detach(member.number)
        self.generation += 1

    def close(self) -> None:
        for index in self._open.values():
            index.close()
        self._open.clear()
        for level in self.levels.values():
            level.close()

    def stats(self, probes: Optional[int] = None) -> Dict[str, object]:
        """For the stats xattr: per hash, the served shards indexed by it;
        the shards still to index; per hash, the indexed shards its levels
        do not hold yet; the shards asked by lookups in this process; the
        bytes hashed of the build running, and its total. `probes`: the
        hash indexes asked in all (a mount's workers count them; default:
        this process's `probes`)."""
        served = self.shards.served()
        out: Dict[str, object] = {n: sum(1 for m in served if n in m.hashes) for n in self.names}
        out["pending"] = len(self.pending())
        out["unlevelled"] = {n: len(self.unlevelled(n)) for n in self.names}
        out["probes"] = self.probes if probes is None else probes
        out["hashed_bytes"], out["hashing_bytes"] = self.progress
        return out
