"""Directory layouts of a mount, and the inode numbers they use.

``flat``: the root lists every object, ``MOUNT/<key>``.

``fanout``: directories sliced from the key's hex, as the Software Heritage
"pathslicing" object storage does: slicing ``0:2/2:4`` gives
``MOUNT/ab/cd/abcd…`` (the file name is always the whole 64-hex key). Each
directory lists only its own children, so a listing stays bounded however
many objects the mount holds. Slices must follow each other from character
0 (``0:2/2:4``, ``0:1/1:3/3:5``); directories may use at most 7 hex
characters in all, so that every directory has an inode below 2^32.

In every layout ``MOUNT/<key>`` is found by lookup, listed or not.

Inodes (64-bit): 1 is the root; a directory at depth d (1..D) whose path
spells the hex prefix P has inode ``2 + sum(16**L_j for j < d) + int(P, 16)``
where L_j is the prefix length at depth j; an object has inode
``(shard number + 1) << 32 | slot``, stable across remounts of the same
shards in the same order. An object read from a winery database (no
shard slot) has inode ``1 << 62 | worker position << 48 | n``, n being its
entry in that worker's inode ring (`shardfs.fuse.shared`). The directories
``MOUNT/sha1`` and ``MOUNT/sha1_git`` of a mount with ``-o hashes=`` have
the inodes `HASH_DIR_INODES`, just below the objects' (above any fan-out
directory's); the objects in them have their usual inodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

from shardfs import _shardfs

#: Inode of the root directory (FUSE's).
ROOT_INODE = 1
#: First directory inode.
DIR_INODE_BASE = 2
#: Objects' inodes are (shard number + 1) << OBJECT_SHIFT | slot.
OBJECT_SHIFT = 32
#: The slot in an object's inode (its low OBJECT_SHIFT bits).
SLOT_MASK = (1 << OBJECT_SHIFT) - 1
#: Most hex characters a fan-out directory path may spell.
MAX_PREFIX_HEX = 7
#: Default slicing of `--layout fanout`.
DEFAULT_SLICING = "0:2/2:4"

_SLICE = re.compile(r"^(\d+):(\d+)$")


#: Inodes of the directories of names by another hash (``MOUNT/sha1``,
#: ``MOUNT/sha1_git``; `shardfs.hashes`).
HASH_DIR_INODES = {"sha1": (1 << OBJECT_SHIFT) - 3, "sha1_git": (1 << OBJECT_SHIFT) - 2}


#: object_inode(number, slot): the inode of slot `slot` of shard number
#: `number`; split_object_inode(inode): (shard number, slot) of an object
#: inode, or None for a directory or a database object. The request path's
#: own encoding (``shardfs/c/ll_names.h``).
object_inode = _shardfs.object_inode
split_object_inode = _shardfs.split_object_inode


#: Flag of the inodes of objects read from a database (see above).
DB_INODE_FLAG = 1 << 62
_DB_POSITION_SHIFT = 48
#: The worker position in a database object's inode: the bits between
#: _DB_POSITION_SHIFT and the flag.
_DB_POSITION_MASK = (DB_INODE_FLAG >> _DB_POSITION_SHIFT) - 1


def db_inode(position: int, number: int) -> int:
    """Inode of entry `number` of worker `position`'s inode ring."""
    return DB_INODE_FLAG | (position << _DB_POSITION_SHIFT) | number


def split_db_inode(inode: int) -> Optional[Tuple[int, int]]:
    """(worker position, ring number) of a database object's inode, None
    for any other inode."""
    if not inode & DB_INODE_FLAG:
        return None
    return (inode >> _DB_POSITION_SHIFT) & _DB_POSITION_MASK, inode & ((1 << _DB_POSITION_SHIFT) - 1)


def parse_slicing(text: str) -> Tuple[int, ...]:
    """Widths in hex characters of each directory level of a slicing.

    "0:2/2:4" gives (2, 2). Raises ValueError (one line) when the slices
    do not follow each other from 0, are empty, or spell more than
    MAX_PREFIX_HEX characters.
    """
    widths = []
    position = 0
    for part in text.strip().strip("/").split("/"):
        m = _SLICE.match(part.strip())
        if not m:
            raise ValueError(f"invalid slicing {text!r}: each level is START:END, e.g. 0:2/2:4")
        start, end = int(m.group(1)), int(m.group(2))
        if start != position or end <= start:
            raise ValueError(
                f"invalid slicing {text!r}: levels must follow each other from 0 (e.g. 0:2/2:4)")
        widths.append(end - start)
        position = end
    if position > MAX_PREFIX_HEX:
        raise ValueError(f"invalid slicing {text!r}: at most {MAX_PREFIX_HEX} hex characters of directories")
    return tuple(widths)


@dataclass(frozen=True)
class Layout:
    """A layout: `widths` empty for flat, else the hex width of each level."""

    widths: Tuple[int, ...] = ()

    @classmethod
    def flat(cls) -> "Layout":
        return cls(())

    @classmethod
    def fanout(cls, slicing: str = DEFAULT_SLICING) -> "Layout":
        return cls(parse_slicing(slicing))

    @property
    def is_flat(self) -> bool:
        return not self.widths

    @property
    def depth(self) -> int:
        """Directory levels below the root (0 for flat)."""
        return len(self.widths)

    @property
    def slicing(self) -> str:
        out, pos = [], 0
        for w in self.widths:
            out.append(f"{pos}:{pos + w}")
            pos += w
        return "/".join(out)

    def describe(self) -> str:
        return "flat" if self.is_flat else f"fanout {self.slicing}"

    def prefix_len(self, depth: int) -> int:
        """Hex characters spelled by a directory at `depth` (0 = root)."""
        return sum(self.widths[:depth])

    def _base(self, depth: int) -> int:
        return DIR_INODE_BASE + sum(16 ** self.prefix_len(j) for j in range(1, depth))

    def dir_inode(self, depth: int, prefix: int) -> int:
        """Inode of the directory at `depth` (>= 1) spelling hex `prefix`."""
        return self._base(depth) + prefix

    def split_dir_inode(self, inode: int) -> Optional[Tuple[int, int]]:
        """(depth, prefix value) of a directory inode; (0, 0) for the root;
        None for anything else."""
        if inode == ROOT_INODE:
            return (0, 0)
        if inode < DIR_INODE_BASE or inode >> OBJECT_SHIFT:
            return None
        for depth in range(1, self.depth + 1):
            base = self._base(depth)
            span = 16 ** self.prefix_len(depth)
            if base <= inode < base + span:
                return (depth, inode - base)
        return None

    def parents_of(self, name: str) -> Tuple[int, ...]:
        """Inodes of the directories where the object named `name` (64 hex
        characters) can be looked up: the root, and its leaf directory in a
        fan-out layout."""
        if self.is_flat:
            return (ROOT_INODE,)
        n = self.prefix_len(self.depth)
        return (ROOT_INODE, self.dir_inode(self.depth, int(name[:n], 16)))

    def child_name(self, depth: int, prefix: int) -> bytes:
        """Name of the directory at `depth` spelling `prefix` (its last
        slice, lowercase hex)."""
        width = self.widths[depth - 1]
        return format(prefix % (16 ** width), f"0{width}x").encode("ascii")

    def prefix_hex(self, depth: int, prefix: int) -> str:
        """The whole hex prefix spelled by a directory."""
        n = self.prefix_len(depth)
        return format(prefix, f"0{n}x") if n else ""
