"""Lookup records: what a lookup needs of each shard, kept in the cache
directory, so that a mount answers LOOKUP and GETATTR of a shard it does
not hold open (docs/scale.md).

A *record* (``shardfs/c/lookup_pack.h``) holds one Read Shard's perfect
hash, its index and each slot's object size: 48 bytes per slot and the
hash's few bytes per key. Records are written many to a *pack* (one file,
one descriptor and one mapping per process, whatever the number of
shards), by the mount's background builder after the global index; the C
resolver's pool (``shardfs/c/ll_pool.h``) is told each served shard's
record and answers from it without opening the shard. Only a READ opens
the shard.

A record stands for a shard in one state: it carries a *stamp* (`stamp`),
a digest of the shard's identity and of what the mount saw of its file
when it joined (device, inode, counts, extent, mtime). A shard written
since (a takedown made while no mount ran) has another mtime, hence
another stamp, and its record is not used until a new one is built. A
takedown seen by a running mount empties the slot in the pack itself
(`LookupSet.delete`), which every process mapping it sees at once.

`LookupSet` keeps the packs of one mount source in
``<cache_dir>/lookup-<scope digest>/``: a ``MANIFEST`` (JSON, replaced by
rename, under a ``LOCK``) lists them; files it does not name are removed
when packs are written. Past `MAX_PACKS` packs, the records of the shards
still served are copied into one (their shards are not read again).
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import json
import logging
import os
import stat as stat_mod
import uuid
import zlib
from array import array
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from shardfs._shardfs import LookupPack, LookupPackWriter
from shardfs.gindex import MANIFEST, lock_directory, sweep_directory, write_manifest

log = logging.getLogger("shardfs.fuse")

#: More packs than this are merged into one at the next write.
MAX_PACKS = 8


def lookup_dir(cache_dir: str, scope: str) -> str:
    """The pack directory of mount source `scope` under `cache_dir`."""
    digest = hashlib.sha256(scope.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(cache_dir, f"lookup-{digest}")


def recordable(member) -> bool:
    """Whether `member` (a MountedShard) may have a record: a regular file
    with an identity. Not a block device: written by another host (a
    shared RBD image), its mtime and ctime do not move here, so a record
    could not tell a takedown made there while no mount ran."""
    return bool(member.identity) and not member.ident[2]


def stamp(member) -> bytes:
    """The 32-byte stamp of a `shardfs.shardset.MountedShard` as it
    joined the set: SHA-256 of its identity, (st_dev, st_ino), object and
    slot counts, extent (bytes) and mtime (seconds, as a float's repr)."""
    text = "%s %d %d %d %d %d %r" % (member.identity.hex(), member.ident[0], member.ident[1],
                                      member.objects_count, member.slot_count, member.extent, member.mtime)
    return hashlib.sha256(text.encode()).digest()


class LookupSet:
    """The packs of one directory, open (mapped), newest last.

    Not thread-safe; one per process (a worker follows its coordinator's
    through `load(names)`)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.packs: List[Tuple[str, LookupPack]] = []

    def names(self) -> List[str]:
        return [name for name, _ in self.packs]

    def read_manifest(self) -> List[str]:
        """Pack names the manifest lists ([] when none or unreadable:
        logged)."""
        path = os.path.join(self.directory, MANIFEST)
        try:
            with open(path, "rb") as f:
                names = [str(n) for n in json.loads(f.read())["packs"]]
            if any("/" in n or n.startswith(".") for n in names):
                raise ValueError("bad pack name")
            return names
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable lookup manifest (%s): records are built again", path, exc)
            return []

    def load(self, names: Optional[Sequence[str]] = None) -> bool:
        """Use the packs `names` (default: the manifest's); True when they
        changed. A pack that cannot be opened is logged and left out (its
        shards are opened for their lookups until records are built
        again)."""
        names = list(self.read_manifest() if names is None else names)
        if names == self.names():
            return False
        old = dict(self.packs)
        packs = []
        for name in names:
            pack = old.pop(name, None)
            if pack is None:
                try:
                    pack = LookupPack(os.path.join(self.directory, name))
                except Exception as exc:
                    log.warning("%s: cannot open lookup pack %s (%s): left out", self.directory, name, exc)
                    continue
            packs.append((name, pack))
        for pack in old.values():
            pack.close()  # pools holding it keep it
        self.packs = packs
        return True

    def close(self) -> None:
        for _, pack in self.packs:
            pack.close()
        self.packs = []

    def _records(self, member) -> Iterable[Tuple[str, LookupPack, int]]:
        """The records of `member`'s identity, newest pack first, as (pack
        name, pack, byte offset), not checked; none for a shard that may
        have none (`recordable`)."""
        if not self.packs or not recordable(member):
            return
        for name, pack in reversed(self.packs):
            at = pack.record(member.identity)
            if at >= 0:
                yield name, pack, at

    def locate(self, member) -> Optional[Tuple[str, LookupPack, int]]:
        """The newest record of `member`'s identity (pack name, pack, byte
        offset), not checked (`ShardPool.register` checks it), or None."""
        return next(iter(self._records(member)), None)

    def record(self, member) -> Optional[Tuple[str, LookupPack, int]]:
        """The record standing for `member` (a MountedShard) as it is now:
        (pack name, pack, byte offset), the newest pack's first; None when
        no pack has one made for its stamp."""
        want = stamp(member) if recordable(member) else b""
        return next((found for found in self._records(member)
                     if found[1].check(found[2], want, member.slot_count) is None), None)

    def delete(self, member, slots: Iterable[int] = (), keys: Iterable[bytes] = ()) -> None:
        """Empty in `member`'s records (every pack holding one) the
        `slots` found deleted in its index, and the slots of `keys` (32
        bytes each) where the record holds them (a takedown): every process
        mapping the pack sees it at once. Errors are logged."""
        slots, keys = list(slots), list(keys)
        for name, pack in self.packs:
            at = pack.record(member.identity) if member.identity else -1
            if at < 0:
                continue
            try:
                for key in keys:
                    found = pack.find(at, key)
                    if found is not None:
                        pack.delete(at, found[0])
                for slot in slots:
                    pack.delete(at, slot)
            except Exception as exc:
                log.warning("%s: cannot record a takedown in lookup pack %s: %s", member.path, name, exc)

    # ---------------------------------------------------------- building

    def add_shards(self, members: Sequence[Tuple[object, object]], served: Iterable[object] = ()) -> List[str]:
        """Write the records of `members` ((MountedShard, open Shard)
        pairs) that lack one as a new pack. Past MAX_PACKS packs, the
        records of the `served` members (MountedShards) held by the newer
        packs (all of them, unless the oldest holds more records than the
        others together) are copied into the new pack first, and those
        packs dropped. Writes the manifest; returns the pack names. A shard
        whose record cannot be made (a kind without a Read Shard index, an
        inconsistent index) is logged and left out. Raises OSError
        (ENOSPC...) with the manifest unchanged."""
        fd = lock_directory(self.directory)
        try:
            self.load(self.read_manifest())
            names = self.names()
            merged: List[str] = []
            if len(names) >= MAX_PACKS:
                counts = [pack.count for _, pack in self.packs]
                merged = names[1:] if counts[0] > sum(counts[1:]) else names
            name = f"pack-{uuid.uuid4().hex[:16]}.lkp"
            writer = LookupPackWriter(os.path.join(self.directory, name))
            written = 0
            try:
                copied = set()
                for member in served if merged else ():
                    found = self.record(member)
                    if found is not None and found[0] in merged and member.identity not in copied:
                        writer.copy(found[1], found[2], member.identity)
                        copied.add(member.identity)
                        written += 1
                for member, shard in members:
                    if not recordable(member) or member.identity in copied or self.record(member) is not None:
                        continue
                    try:
                        writer.add(shard, member.identity, stamp(member))
                        written += 1
                    except OSError as exc:
                        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                            raise  # the cache cannot take it: the caller says so
                        log.warning("%s: no lookup record (%s): its lookups open it", member.path, exc)
                    except ValueError as exc:  # a kind with an index of its own (MOSAIC): none to make
                        log.debug("%s: no lookup record (%s): its lookups open it", member.path, exc)
                    except Exception as exc:
                        log.warning("%s: no lookup record (%s): its lookups open it", member.path, exc)
                if not written:
                    writer.abort()
                    return names
                writer.commit()
            except BaseException:
                writer.abort()
                raise
            names = [n for n in names if n not in merged] + [name]
            write_manifest(self.directory, {"version": 1, "packs": names})
            sweep_directory(self.directory, names + [KNOWN])
            self.load(names)
            return names
        finally:
            os.close(fd)


#: The file of `KnownShards`, in the pack directory.
KNOWN = "SHARDS"


class KnownShards:
    """What a mount validated of each shard file, so that the next mount
    of the same source need not open a file unchanged since (a warm
    start): its path, the (device, inode, size, mtime in ns, ctime in ns)
    it had, and what opening it gave (object and slot counts, extent in
    bytes, identity). The ctime moves at every write and metadata change
    and cannot be set back, so an equal stat is the same content.

    One text file, ``SHARDS``, in the pack directory: a line per shard,
    ``dev ino size mtime_ns ctime_ns objects slots extent identity_hex
    crc32 path`` (the CRC-32 over the fields before it and the path; a
    line that does not check out is ignored), in the byte order of the
    paths, written whole and renamed. Regular files only (see
    `recordable`).

    Memory: the file is kept as read (one buffer) with the byte offset of
    each line; a line is parsed when `match` asks for its path (by
    bisection, or at once when paths are asked in order, as a directory's
    are), so that what a warm start of 100,000 shards keeps is what its
    shards need, not a Python object per line of a file it drops once
    started."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, KNOWN)
        self._data = b""
        #: Byte offsets of the lines of `_data`, in the order of their paths.
        self._starts = array("Q")
        #: Where the last `match` found its path + 1: the next is tried there first.
        self._next = 0
        #: path -> line (bytes, no newline) validated during this mount.
        self._new: Dict[str, bytes] = {}

    @staticmethod
    def _key(st: os.stat_result) -> Tuple[int, ...]:
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def load(self) -> None:
        """Read the file (missing or unreadable: none known, logged)."""
        self._data, self._starts, self._next = b"", array("Q"), 0
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("%s: unreadable (%s): the shards are opened at start", self.path, exc)
            return
        self._use(data)

    def _use(self, data: bytes) -> None:
        """Take `data` (the file's bytes) as what is known: the offsets of
        its lines, sorted by path unless they already are."""
        starts = array("Q")
        ordered, last, pos = True, b"", 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                end = len(data)
            if end > pos:
                name = self._path_at(data, pos, end)
                ordered = ordered and last <= name
                last = name
                starts.append(pos)
            pos = end + 1
        if not ordered:  # written by an older shardfs, or edited
            starts = array("Q", sorted(starts, key=lambda p: self._path_at(data, p)))
        self._data, self._starts, self._next = data, starts, 0

    @staticmethod
    def _path_at(data: bytes, start: int, end: int = -1) -> bytes:
        """The path field of the line at byte `start` (b"" if it has none)."""
        if end < 0:
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
        fields = data[start:end].split(b" ", 10)
        return fields[10] if len(fields) == 11 else b""

    def _line_of(self, name: bytes) -> Optional[bytes]:
        """The line (no newline) of the file for path `name`, or None."""
        data, starts = self._data, self._starts
        i = self._next
        if not (i < len(starts) and self._path_at(data, starts[i]) == name):
            i = bisect.bisect_left(starts, name, key=lambda p: self._path_at(data, p))
            if not (i < len(starts) and self._path_at(data, starts[i]) == name):
                return None
        self._next = i + 1
        end = data.find(b"\n", starts[i])
        return data[starts[i]:end if end >= 0 else len(data)]

    @staticmethod
    def _parse(line: bytes) -> Optional[Tuple[Tuple[int, ...], Tuple[int, int, int, bytes]]]:
        """(stat key, (objects, slots, extent, identity)) of a line that
        checks out, else None."""
        fields = line.split(b" ", 10)
        if len(fields) != 11:
            return None
        try:
            values = [int(x) for x in fields[:8]]
            identity = bytes.fromhex(fields[8].decode())
            crc = int(fields[9])
        except ValueError:
            return None
        if len(identity) != 32 or zlib.crc32(b" ".join(fields[:9] + fields[10:])) != crc:
            return None
        return tuple(values[:5]), (values[5], values[6], values[7], identity)

    def match(self, path: str) -> Optional[Tuple[os.stat_result, Tuple[int, int, int, bytes]]]:
        """(its stat now, (objects, slots, extent, identity)) of the file
        at `path` as it was validated, when its stat shows it unchanged;
        else None (a path it does not know is not stat'ed)."""
        line = self._new.get(path)
        if line is None:
            line = self._line_of(os.fsencode(path))
        entry = None if line is None else self._parse(line)
        if entry is None:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st, entry[1]) if entry[0] == self._key(st) else None

    def remember(self, path: str, st: os.stat_result, objects: int, slots: int, extent: int,
                 identity: bytes) -> None:
        """The file at `path`, of stat `st` (taken on the open file), was
        validated and gave these; a regular file with a one-line path."""
        if not stat_mod.S_ISREG(st.st_mode) or "\n" in path or len(identity) != 32:
            return
        fields = [str(v).encode() for v in (*self._key(st), objects, slots, extent)] + [identity.hex().encode()]
        name = os.fsencode(path)
        self._new[path] = b" ".join(fields + [str(zlib.crc32(b" ".join(fields + [name]))).encode(), name])

    def save(self, paths: Iterable[str]) -> None:
        """Keep the lines of `paths` (the shards served), and write the
        file when anything changed. Errors are logged (it is a cache)."""
        lines = []
        for p in paths:
            line = self._new.get(p)
            if line is None:
                line = self._line_of(os.fsencode(p))
            if line is not None:
                lines.append(line)
        if not self._new and len(lines) == len(self._starts):
            return  # the same lines (a path is served once)
        lines.sort(key=lambda line: self._path_at(line, 0, len(line)))
        tmp = f"{self.path}.tmp-{os.getpid()}"
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(b"\n".join(lines) + b"\n")
            os.rename(tmp, self.path)
        except OSError as exc:
            log.warning("%s: cannot write it (%s): the next mount opens every shard", self.path, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self._new = {}
        self._use(b"\n".join(lines))
