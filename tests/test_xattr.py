"""Extended attributes of a mount: real shards, real mounts.

A mount has four: ``user.shardfs.requests`` and ``user.shardfs.stats`` on
the root, ``user.shardfs.shard`` and ``user.shardfs.offset`` on an object
(shardfs.fuse.handlers). Tools ask every file for others: ``ls -l`` for
security.selinux and system.posix_acl_access, ``cp -a`` and ``rsync -X``
for the list and each name in it, the kernel for security.capability
before a write. Those are answered ENODATA by the C request path
(shardfs/c/py_ll_ops.c) without reaching the Python handlers, which run
one at a time per worker; so are the root's names asked of another inode,
an object's asked of a directory, and the (empty) list of a directory
other than the root. The root's ``stats`` counts the requests that
reached the handlers (``"python"``, by handler): the tests read it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from pathlib import Path
from typing import Dict, List

import pytest
from mounting import build_shard, make_blobs, needs_fuse

pytestmark = needs_fuse

shardfs = pytest.importorskip("shardfs")

from shardfs import _shardfs  # noqa: E402
from shardfs.fuse import handlers  # noqa: E402

REQUESTS, STATS = "user.shardfs.requests", "user.shardfs.stats"
SHARD, OFFSET = "user.shardfs.shard", "user.shardfs.offset"

#: Names no inode has: what ls -l, cp -a, rsync -X, getcap, the kernel and
#: a curious user ask.
PROBES = ("security.selinux", "security.capability", "system.posix_acl_access", "user.nonexistent",
          "user.shardfs.nonexistent", "trusted.overlay.opaque")

#: Mount options of each mount tried: a flat root, fan-out directories,
#: and the directories of names by another hash (MOUNT/sha1, MOUNT/sha1_git).
MOUNTS = {
    "flat": ["--layout", "flat"],
    "fanout": ["--layout", "fanout"],
    "hashes": ["--layout", "flat", "-o", "hashes=sha1:sha1_git"],
}


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """A shard of 300 small objects: (its path, hex key -> bytes)."""
    path = tmp_path_factory.mktemp("xattr") / "x.shard"
    return path, build_shard(path, make_blobs(11, 300, 1, 3000))


@pytest.fixture(scope="module", params=sorted(MOUNTS))
def mount(request, shard, module_mounter, tmp_path_factory):
    """The shard mounted each way of MOUNTS: (mount point, shard path,
    objects, directories to ask (the root first), paths of some objects
    with their keys)."""
    path, objects = shard
    point = tmp_path_factory.mktemp(request.param) / "m"
    module_mounter.mount(path, point, *MOUNTS[request.param])
    keys = sorted(objects)[:3] + sorted(objects)[-2:]
    if request.param == "fanout":
        dirs = [point]
        for key in keys[:2]:
            dirs += [point / key[:2], point / key[:2] / key[2:4]]
        files = [(point / key[:2] / key[2:4] / key, key) for key in keys]
    else:
        dirs = [point] + ([point / "sha1", point / "sha1_git"] if request.param == "hashes" else [])
        files = [(point / key, key) for key in keys]
    return point, path, objects, dirs, files


_libc = ctypes.CDLL(None, use_errno=True)
_libc.getxattr.restype = ctypes.c_ssize_t


def _xattr(path: Path, name: str) -> bytes:
    """Extended attribute `name` of `path` in one GETXATTR request
    (os.getxattr asks with a 128-byte buffer first, then again on ERANGE:
    the requests counted would depend on the value's length)."""
    buf = ctypes.create_string_buffer(1 << 16)
    n = _libc.getxattr(os.fsencode(path), name.encode(), buf, ctypes.c_size_t(len(buf)))
    if n < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(path))
    return buf.raw[:n]


def _json_xattr(point: Path, name: str) -> Dict:
    return json.loads(_xattr(point, name))


def _grown(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    """Kinds that grew between two readings of a count, and by how much."""
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    return {k: v for k, v in grown.items() if v}


def _enodata(path: Path, name: str) -> None:
    with pytest.raises(OSError) as exc:
        os.getxattr(path, name)
    assert exc.value.errno == errno.ENODATA, (path, name, exc.value)


def test_names_are_the_c_constants():
    """The handlers' names are the C request path's (shardfs/c/ll.h),
    exported by the extension: one definition."""
    assert handlers.REQUESTS_XATTR == _shardfs.XATTR_REQUESTS.encode() == REQUESTS.encode()
    assert handlers.STATS_XATTR == _shardfs.XATTR_STATS.encode() == STATS.encode()
    assert handlers.SHARD_XATTR == _shardfs.XATTR_SHARD.encode() == SHARD.encode()
    assert handlers.OFFSET_XATTR == _shardfs.XATTR_OFFSET.encode() == OFFSET.encode()


def test_every_handler_has_its_python_count():
    """Each handler (wrapped by handlers._handler) has a counter of its
    own in a worker's row (shared.PYTHON_KINDS), not "other"."""
    from shardfs.fuse.shared import PYTHON_KINDS

    wrapped = {name for name, fn in vars(handlers.ShardFS).items() if hasattr(fn, "__wrapped__")}
    assert "getxattr" in wrapped and "listxattr" in wrapped
    assert wrapped <= set(PYTHON_KINDS) - {"other"}


def test_absent_names_answered_without_python(mount):
    """Every name an inode does not have is ENODATA, answered by the C
    request path: none of those GETXATTR (and no LISTXATTR of a directory
    other than the root) reaches the Python handlers, though each reaches
    the mount (the kernel caches no extended attribute of a FUSE mount)."""
    point, _, _, dirs, files = mount
    for p in dirs + [f for f, _ in files]:
        os.stat(p)  # names and attributes cached: only the xattr requests follow
    asked: List = []
    for d in dirs:
        asked += [(d, n) for n in PROBES + (SHARD, OFFSET)]
        if d != point:
            asked += [(d, REQUESTS), (d, STATS)]
    for f, _ in files:
        asked += [(f, n) for n in PROBES + (REQUESTS, STATS)]
    requests_before = _json_xattr(point, REQUESTS)
    python_before = _json_xattr(point, STATS)["python"]
    for path, name in asked:
        _enodata(path, name)
    for d in dirs[1:]:
        assert os.listxattr(d) == []
    python_after = _json_xattr(point, STATS)["python"]
    requests_after = _json_xattr(point, REQUESTS)
    # The handlers saw one request: the second reading of the stats.
    assert _grown(python_before, python_after) == {"getxattr": 1}
    # The mount saw every one: those asked, then the three readings after
    # the first, and the listings.
    grown = _grown(requests_before, requests_after)
    assert grown == {"getxattr": len(asked) + 3, **({"listxattr": len(dirs) - 1} if len(dirs) > 1 else {})}


def test_shardfs_names_still_answered(mount):
    """The four names the handlers answer: the root's requests and stats
    (JSON), an object's shard path and the byte offset of its first byte
    (what the shardfs API says for its key); the lists of the root and of
    an object. Each reaches the handlers (counted)."""
    point, path, objects, _, files = mount
    python_before = _json_xattr(point, STATS)["python"]
    requests = _json_xattr(point, REQUESTS)
    assert requests["getxattr"] >= 2 and all(isinstance(v, int) for v in requests.values())
    stats = _json_xattr(point, STATS)
    assert stats["shards"] == 1 and stats["objects"] == len(objects)
    assert sorted(os.listxattr(point)) == [REQUESTS, STATS]
    with shardfs.Shard(str(path)) as s:
        for f, key in files:
            assert _xattr(f, SHARD) == os.fsencode(str(path))
            assert int(_xattr(f, OFFSET)) == s.locate(key)[0]
            assert sorted(os.listxattr(f)) == [OFFSET, SHARD]
            data = f.read_bytes()
            assert data == objects[key]
            with open(path, "rb") as raw:
                raw.seek(int(_xattr(f, OFFSET)))
                assert raw.read(len(data)) == data
    grown = _grown(python_before, _json_xattr(point, STATS)["python"])
    # requests, stats twice, then 3 per object; the lists of the root and
    # of each object
    assert grown.get("getxattr") == 3 + 3 * len(files), grown
    assert grown.get("listxattr") == 1 + len(files), grown
