"""Read Shards kept in Ceph RBD images, read through librbd.

A source ``rbd:POOL/IMAGE`` names an RBD image whose first bytes are a Read
Shard (``rbd import`` of a shard file, or a winery rbd pool's image); the
image may be larger than the shard. Wherever shardfs takes a shard path
(``Shard``, the CLI's read verbs, ``shardfs mount``) it takes such a source,
and ``rbd:POOL`` as a shard directory (every image of the pool).

Opening a source the first time on a host copies the shard's header, index
and hash sections into the cache directory (``<cache>/rbd/<pool>/<image>.copy``,
a sparse file, ~41 bytes per slot) with each object's size; lookups then
read only that copy, and an object costs one read of its bytes from the
cluster. Details and costs: docs/ceph.md.

The connection settings are process-wide (`configure`); without a call,
the first source opened uses librados's defaults ($CEPH_CONF, else
/etc/ceph/ceph.conf; client ``admin``), the default cache directory and a
30-second timeout.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from shardfs import _shardfs

#: What starts an RBD source.
PREFIX = "rbd:"
#: librados's op timeouts (seconds) when none is given.
DEFAULT_TIMEOUT = 30

_configured = False


def is_source(path) -> bool:
    """Whether `path` (str or os.PathLike) is an ``rbd:`` source."""
    return isinstance(path, str) and path.startswith(PREFIX)


def parse(source: str) -> Tuple[str, Optional[str]]:
    """``rbd:POOL/IMAGE`` -> (POOL, IMAGE); ``rbd:POOL`` -> (POOL, None).
    ValueError for anything else (empty names, more than one '/', '@')."""
    if not is_source(source):
        raise ValueError(f"{source}: not an RBD source (rbd:POOL/IMAGE or rbd:POOL)")
    spec = source[len(PREFIX):]
    pool, _, image = spec.partition("/")
    if not pool or "@" in spec or "/" in image or (_ and not image):
        raise ValueError(f"{source}: not an RBD source (rbd:POOL/IMAGE or rbd:POOL)")
    return pool, image or None


def available() -> bool:
    """Whether this build of shardfs can read RBD images (librbd)."""
    return bool(_shardfs.RBD_BUILT)


def configure(conf: Optional[str] = None, client_id: Optional[str] = None,
              cache_dir: Optional[str] = None, timeout: Optional[int] = None,
              isolate: bool = False, max_images: Optional[int] = None) -> None:
    """Set this process's Ceph settings for the connections made after it:
    `conf` a ceph.conf path (None: $CEPH_CONF, else /etc/ceph/ceph.conf),
    `client_id` the client name without ``client.`` (None: ``admin``),
    `cache_dir` where local copies live (None: `shardfs.sidecar.default_cache_dir()`),
    `timeout` seconds before a cluster operation fails with ETIMEDOUT
    (librados's rados_osd_op_timeout, rados_mon_op_timeout and
    client_mount_timeout; None: 30), `isolate`: build copies and list pools
    in a child process (a process that forks later must not start
    librados's threads), `max_images` the images kept open at once (None:
    1024; beyond, the least recently used one no read is using is closed,
    and opened again when read: a few ms). ValueError for a timeout < 1
    or max_images < 1."""
    global _configured
    from shardfs.sidecar import default_cache_dir
    if timeout is not None and timeout < 1:
        raise ValueError(f"ceph timeout must be at least 1 second, got {timeout}")
    if max_images is not None and max_images < 1:
        raise ValueError(f"max_images must be at least 1, got {max_images}")
    _shardfs.rbd_configure(conf=conf, id=client_id, cache_dir=os.fspath(cache_dir or default_cache_dir()),
                           timeout=int(timeout or DEFAULT_TIMEOUT), isolate=isolate,
                           max_images=max_images or 0)
    _configured = True


def open_images() -> int:
    """RBD images this process holds open now (at most `configure`'s
    max_images, plus those being read)."""
    return _shardfs.rbd_open_images()


def ensure_configured() -> None:
    """`configure()` with the defaults unless it was called already."""
    if not _configured:
        configure()


def list_images(pool: str) -> List[str]:
    """The image names of `pool`, sorted. OSError (ENOENT: no such pool,
    ETIMEDOUT: no answer within the timeout); ShardError without librbd."""
    ensure_configured()
    return sorted(_shardfs.rbd_list(pool))


def pool_sources(pool: str) -> List[str]:
    """``rbd:POOL/IMAGE`` for every image of `pool`, sorted."""
    return [f"{PREFIX}{pool}/{name}" for name in list_images(pool)]

#: Seconds between two listings of a mount's shard pool (``--shard-dir
#: rbd:POOL``): a new image is served within this bound plus its copy.
POLL_SECONDS = 2.0
#: Seconds before a pool is listed again after a listing failed (the
#: cluster did not answer within the timeout, or refused).
POLL_FAILED_SECONDS = 30.0
