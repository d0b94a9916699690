"""Sidecar files: a per-shard key filter and key-sorted slot list, cached on disk.

When thousands of shards are mounted as one tree, a lookup must not probe
every shard's index. Each shard gets a sidecar file, built once from its
index (format: ``shardfs/c/sidecar.h`` and docs/format.md), holding

* a filter over its keys: ``Sidecar.may_contain(key)`` is never False for a
  key of the shard, and True for an absent key with probability ~8 * 2^-32;
* its live slots sorted by key: ``Sidecar.range(prefix, bits)`` gives the
  positions of the keys that start with a bit prefix, ``Sidecar.slots(begin,
  end)`` their slots (look them up with ``Shard.slot(i)``).

Sidecars live in a cache directory (``default_cache_dir()``), named after the
shard's *identity*: a SHA-256 over the shard's header, its slot count and the
ends of its hash and index sections (a few KiB read per shard, whatever its
size). A sidecar that does not match its shard is ignored by ``load()`` and
replaced by the next ``build()``.

Deletes: ``Shard.delete()`` does not update the sidecar, and a delete in the
middle of a large index does not change the identity. The sidecar then
answers for a superset of the live keys (a deleted key may still be
"contained", its slot still listed), so callers must check every slot they
get (``Shard.slot(i)`` is None for a deleted one; ``Shard.deleted_slots(
sidecar)`` lists the deleted ones in one C call without the GIL).
``build()`` again to drop deleted keys.

``SidecarSet`` holds the sidecars of many shards, by shard number (the
number a mount gives each shard, `shardfs.shardset`):
``candidates(key)`` lists the numbers of the shards that may hold the key,
in one C call that overlaps the cache misses of all sidecars. It is not thread-safe:
use it under the GIL (from one thread at a time).
"""

from __future__ import annotations

import errno
import hashlib
import os
from typing import Optional, Union

from . import _shardfs
from .errors import StaleSidecarError
from .shard import HEADER_END, Shard

#: ``Sidecar(path, identity, slot_count)``: an open sidecar (read-only mmap).
#: Raises StaleSidecarError when the file belongs to another shard or is
#: damaged, OSError (FileNotFoundError...) when it cannot be opened.
#: Methods: ``may_contain(key32) -> bool``, ``range(prefix: bytes,
#: prefix_bits: int) -> (begin, end)`` (positions of the keys that start with
#: the first prefix_bits bits of prefix; bits past the sidecar's own
#: ``prefix_bits + 32`` are ignored, a superset then), ``slots(begin, end) ->
#: list[int]`` (IndexError outside [0, count]), ``close()``; attributes
#: ``count`` (keys listed: the live objects when it was built), ``prefix_bits``
#: (p), ``slot_count``, ``closed``.
#: Queries keep the GIL (may_contain and range take well under a microsecond
#: when the file is in the page cache; a cold page is read with the GIL held).
Sidecar = _shardfs.Sidecar

#: ``SidecarSet()``: shard numbers ``n`` (0 <= n < 2^32 - 1) that are
#: inactive (never a candidate), active without a filter (``set(n, None)``:
#: always a candidate) or active with a Sidecar (``set(n, sidecar)``, kept
#: referenced; closing it while in the set keeps its mapping until the
#: number is removed). ``remove(n)`` makes a number inactive;
#: ``candidates(key32) -> list[int]`` the active numbers whose shard may
#: hold the key, in increasing order; ``len()`` counts the active numbers,
#: ``size`` is 1 + the largest number set.
SidecarSet = _shardfs.SidecarSet

IDENTITY_SIZE = _shardfs.SIDECAR_IDENTITY_SIZE  #: bytes of a shard identity (SHA-256)
_PROBE = 4096  #: bytes read at each end of the hash and index sections
_IDENTITY_TAG = b"shardfs sidecar identity v1\0"

PathLike = Union[str, os.PathLike]


def default_cache_dir() -> str:
    """Where sidecars are kept: ``$SHARDFS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/shardfs``, else ``~/.cache/shardfs`` (empty variables
    count as unset)."""
    explicit = os.environ.get("SHARDFS_CACHE_DIR")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "shardfs")
    return os.path.join(os.path.expanduser("~"), ".cache", "shardfs")


def _pread(fd: int, size: int, offset: int, path: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise OSError(errno.EIO, f"{path}: short read of {size} bytes at {offset} (file truncated?)")
    return data


def identity(shard: Shard) -> bytes:
    """The shard's identity, 32 bytes: SHA-256 over the magic and header
    (its first HEADER_END bytes), the slot count, the first min(4096,
    hash_size) bytes of the hash section and the first and last min(4096,
    index_size) bytes of the index.

    At most ~12 KiB are read (with os.pread on the shard's own descriptor:
    the very file it maps, even if its path now names another), whatever
    the shard's size. Two
    shards with the same identity are, for all practical purposes, the same
    shard (their perfect hashes agree); a copy of a shard has the identity
    of the original. A MOSAIC file's identity covers instead its kind, slot
    count, size, EBML header and the first and last 4 KiB of its sha256
    index's perfect hash (`Shard._reader.identity_ranges`): bytes that
    swh's in-place deletions do not change. OSError when the file cannot
    be read.
    """
    ranges = shard._reader.identity_ranges
    if ranges:  # a kind that names what identifies it (a MOSAIC file)
        digest = hashlib.sha256(_IDENTITY_TAG)
        digest.update(shard.kind.encode())
        digest.update(shard.slot_count.to_bytes(8, "little"))
        digest.update(shard.extent.to_bytes(8, "little"))
        for offset, length in ranges:
            digest.update(_pread(shard.fileno(), length, offset, shard.path))
        return digest.digest()
    header = shard.header
    probe_hash = min(_PROBE, shard.hash_size)
    probe_index = min(_PROBE, header.index_size)
    fd = shard.fileno()
    head = _pread(fd, HEADER_END, 0, shard.path)
    hash_head = _pread(fd, probe_hash, header.hash_position, shard.path)
    index_head = _pread(fd, probe_index, header.index_position, shard.path)
    index_tail = _pread(fd, probe_index,
                        header.index_position + header.index_size - probe_index, shard.path)
    digest = hashlib.sha256(_IDENTITY_TAG)
    digest.update(head)
    digest.update(shard.slot_count.to_bytes(8, "little"))
    digest.update(hash_head)
    digest.update(index_head)
    digest.update(index_tail)
    return digest.digest()


def sidecar_path(cache_dir: PathLike, ident: bytes) -> str:
    """``<cache_dir>/<identity as 64 hex digits>.sidecar``."""
    if len(ident) != IDENTITY_SIZE:
        raise ValueError(f"an identity is {IDENTITY_SIZE} bytes, got {len(ident)}")
    return os.path.join(os.fspath(cache_dir), ident.hex() + ".sidecar")


def load(shard: Shard, cache_dir: Optional[PathLike] = None,
         ident: Optional[bytes] = None) -> Optional[Sidecar]:
    """The shard's sidecar from ``cache_dir`` (default_cache_dir() when None),
    or None when there is none or it is stale or damaged (it will be
    replaced by the next build()). ``ident``: identity(shard), if known
    already. OSError for other failures (e.g. permission denied)."""
    if cache_dir is None:
        cache_dir = default_cache_dir()
    if ident is None:
        ident = identity(shard)
    try:
        return Sidecar(sidecar_path(cache_dir, ident), ident, shard.slot_count)
    except (FileNotFoundError, NotADirectoryError, StaleSidecarError):
        return None


def _makedirs_private(path: str) -> None:
    # os.makedirs gives mode 0700 to the last component only.
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent and parent != os.path.abspath(path):
        _makedirs_private(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def build(shard: Shard, cache_dir: Optional[PathLike] = None,
          ident: Optional[bytes] = None) -> Sidecar:
    """Build the shard's sidecar in ``cache_dir`` (default_cache_dir() when
    None; created with mode 0700, parents too, if missing), replacing any
    older one, and return it open.

    Two sequential reads of the index (pread, never the mapping), a sort per
    bucket and a write of about 8 bytes per key (plus 4 per 8 keys); about
    as much memory while it runs (sfs_sidecar_build in sidecar.h). The GIL
    is released meanwhile. The file is an unnamed temporary file until it
    is complete and fsynced, then linked or renamed into place: nothing
    partial is ever visible, even after kill -9. OSError when it cannot be
    written (read-only directory, ENOSPC...: errno EACCES, EROFS, ENOSPC) or
    the shard changed under it (ESTALE, ENOENT, EIO); nothing is left behind
    then.
    """
    if cache_dir is None:
        cache_dir = default_cache_dir()
    cache_dir = os.fspath(cache_dir)
    if ident is None:
        ident = identity(shard)
    _makedirs_private(cache_dir)
    path = sidecar_path(cache_dir, ident)
    _shardfs.build_sidecar(shard._reader, path, ident)
    return Sidecar(path, ident, shard.slot_count)


def load_or_build(shard: Shard, cache_dir: Optional[PathLike] = None) -> Sidecar:
    """load(), or build() when there is no usable sidecar. OSError as build()."""
    if cache_dir is None:
        cache_dir = default_cache_dir()
    ident = identity(shard)
    sidecar = load(shard, cache_dir, ident)
    return sidecar if sidecar is not None else build(shard, cache_dir, ident)


__all__ = [
    "IDENTITY_SIZE", "Sidecar", "SidecarSet", "StaleSidecarError", "build", "default_cache_dir",
    "identity", "load", "load_or_build", "sidecar_path",
]
