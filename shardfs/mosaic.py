"""MOSAIC files: Software Heritage's successor of the Read Shard, read by
shardfs's C reader (``shardfs/c/mosaic.h``, ``shardfs/c/gof.c``; the format:
docs/mosaic.md).

A MOSAIC file holds objects in Tiles, stored raw or zstd-compressed (with a
dictionary stored in the file, or not), and one index per kind of key
(sha1, sha1_git, sha256, blake2s256), each a minimal perfect hash
(``ph::fmph::GOFunction``) over its keys. shardfs names objects by SHA-256,
so a MOSAIC file is used as a shard through its sha256 index; its sha1 and
sha1_git indexes answer ``shardfs get --hash``.

`MosaicFile` gives the part of `shardfs.Shard`'s interface the command line
uses (locate, pread, keys, items_sizes, check, len), so that ``shardfs
info/ls/get/check`` take either kind of file; `is_mosaic` tells them apart
by content (the EBML magic), never by name.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from shardfs import _shardfs
from shardfs.errors import ShardError

#: The first four bytes of every EBML file, hence of every MOSAIC file
#: (RFC 8794's EBML header element ID); a Read Shard starts otherwise.
MAGIC = b"\x1a\x45\xdf\xa3"

#: The kinds of key a MOSAIC index may have, and how each is computed from
#: an object's bytes (swh.model's hashes: sha1_git is git's blob hash).
KEY_FUNCTIONS: Dict[str, Callable[[bytes], bytes]] = {
    "sha1": lambda data: hashlib.sha1(data).digest(),
    "sha1_git": lambda data: hashlib.sha1(b"blob %d\0" % len(data) + data).digest(),
    "sha256": lambda data: hashlib.sha256(data).digest(),
    "blake2s256": lambda data: hashlib.blake2s(data).digest(),
}

#: Bytes read at a time when an object is hashed by `check`.
CHECK_CHUNK = 1 << 20


def is_mosaic(path: str) -> bool:
    """Whether `path` is a regular file or block device that starts as a
    MOSAIC (EBML) file does (anything else, a FIFO included, is not looked
    into). Raises OSError when it cannot be read."""
    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISBLK(mode)):
        return False
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


class MosaicFile:
    """An open MOSAIC file (`shardfs._shardfs.Mosaic`), keyed by SHA-256
    like a shard: `locate` and `keys` use its sha256 index.

    Raises CorruptShardError for a file this reader refuses (not MOSAIC,
    an unknown format version, a damaged header, metadata or index: the
    message names the element and its byte offset), OSError when it
    cannot be opened.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._m = _shardfs.Mosaic(path)
        self.info = self._m.info()
        #: The kinds of key the file has an index by, in file order.
        self.indexes: List[str] = [ix["name"] for ix in self.info["indexes"]]
        # `get` is the C method itself, no Python frame in between (the
        # method below documents it): a get costs ~0.5 µs warm, of which a
        # Python call would be a tenth.
        self.get = self._m.get  # type: ignore[method-assign]

    # ----------------------------------------------------- shard interface

    def close(self) -> None:
        self._m.close()

    def __enter__(self) -> "MosaicFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _need(self, kind: str) -> None:
        if kind not in self.indexes:
            have = ", ".join(self.indexes) or "none"
            raise ShardError(f"{self.path}: MOSAIC file without a {kind} index (it has: {have})")

    def locate(self, key: bytes, kind: str = "sha256") -> Optional[Tuple[int, int]]:
        """(object, size) of the object whose `kind` key is `key`, None when
        absent or deleted: `object` is the byte offset of its element (for
        `pread`), `size` its decoded size in bytes. Raises ShardError when
        the file has no `kind` index."""
        self._need(kind)
        found = self._m.lookup(kind, key)
        if found is None:
            return None
        size = self._m.size(found)
        return None if size is None else (found, size)

    def pread(self, obj: int, size: int, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of the decoded object `obj`
        (from `locate`), as `shardfs.Shard.pread`; b"" when deleted since."""
        data = self._m.read(obj, offset, length)
        return b"" if data is None else data

    def get(self, key: bytes, kind: str = "sha256") -> Optional[bytes]:
        """The bytes of the object whose `kind` key is `key`, or None when
        absent or deleted (one call into C: lookup, size, read). Raises
        KeyError without a `kind` index, ValueError for a key of another
        length, CorruptShardError for a damaged entry or object."""
        return self._m.get(key, kind)

    def get_batch(self, keys, kind: str = "sha256") -> List[Optional[bytes]]:
        """`get` of each of `keys` (an iterable of bytes), in order, in one
        call into C (one zstd context for them all)."""
        self._need(kind)
        return self._m.get_batch(kind, keys)

    def entries(self, kind: Optional[str] = None) -> Iterator[Tuple[bytes, int]]:
        """(key, object) of every live entry of the `kind` index (default:
        sha256, else the file's first index), in slot order."""
        kind = kind or ("sha256" if "sha256" in self.indexes else (self.indexes[0] if self.indexes else None))
        if kind is None:
            return
        slots = next(ix["slots"] for ix in self.info["indexes"] if ix["name"] == kind)
        for slot in range(slots):
            entry = self._m.entry(kind, slot)
            if entry is not None:
                yield entry

    def keys(self) -> Iterator[bytes]:
        """The SHA-256 keys of the live objects (ShardError without a
        sha256 index)."""
        self._need("sha256")
        for key, _ in self.entries("sha256"):
            yield key

    def items_sizes(self) -> Iterator[Tuple[bytes, int]]:
        """(SHA-256 key, decoded size) of every live object."""
        self._need("sha256")
        for key, obj in self.entries("sha256"):
            size = self._m.size(obj)
            if size is not None:
                yield key, size

    def __len__(self) -> int:
        """Live objects: the entries of the first index."""
        return sum(1 for _ in self.entries())

    # -------------------------------------------------------------- check

    def check(self, hash: bool = False, progress: Optional[Callable[[int, int], None]] = None) -> List[str]:
        """Problems found, one line each (empty: sound): every CRC-32, the
        tiles' structure and every index entry (`shardfs._shardfs.Mosaic.
        check`); with `hash`, every live object read whole and its digest
        of each kind the file indexes compared with its keys. `progress`
        (done, total) is called with object bytes hashed."""
        problems, _ = self._m.check()
        out = [f"byte {position}: {message}" for position, message in problems]
        if not hash:
            return out
        total = self.info["objects_total_size"] * max(1, len(self.indexes))
        done = 0
        for kind in self.indexes:
            digest = KEY_FUNCTIONS[kind]
            for key, obj in self.entries(kind):
                data = self._m.read(obj)
                if data is None:
                    out.append(f"{kind} {key.hex()}: its object at byte {obj} was deleted, its entry was not")
                    continue
                if digest(data) != key:
                    out.append(f"{kind} {key.hex()}: the object at byte {obj} has another {kind}")
                done += len(data)
                if progress is not None:
                    progress(done, max(total, done))
        return out

    def summary(self) -> List[Tuple[str, object]]:
        """``shardfs info``'s lines for this file: (name, value)."""
        i = self.info
        lines: List[Tuple[str, object]] = [
            ("path", self.path),
            ("format", "mosaic"),
            ("doctype_version", i["doctype_version"]),
            ("objects_count", i["objects_counter"]),
            ("object_bytes", i["objects_total_size"]),
            ("compression", i["compression"]),
            ("dictionary_size", i["dictionary_size"]),
            ("tiles_position", i["tiles_position"]),
            ("end_of_tiles", i["end_of_tiles"]),
            ("file_size", i["file_size"]),
        ]
        for ix in i["indexes"]:
            lines.append((f"index.{ix['name']}", f"{ix['slots']} slots, {ix['entry_size']} B entries, "
                                                  f"{ix['map_size']} B perfect hash"))
        for number, comment in enumerate(i["comments"]):
            lines.append((f"comment.{number}", comment))
        return lines
