"""The FUSE request handlers (shardfs.fuse.handlers.ShardFS) called
directly, without the kernel: no mount, no /dev/fuse, no root, so this runs
everywhere pyfuse3 is installed. What a mount answers through the kernel is
tested in test_fuse.py.
"""

from __future__ import annotations

import errno
import hashlib
import os

import pytest
from mounting import build_shard, make_blobs

pyfuse3 = pytest.importorskip("pyfuse3")
shardfs = pytest.importorskip("shardfs")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A shard of 400 small objects and an empty one: (path, objects)."""
    path = tmp_path_factory.mktemp("handlers") / "corpus.shard"
    objects = build_shard(path, [b""] + make_blobs(7, 400, 1, 3000, tag=b"handlers"))
    return path, objects


def test_handlers_bookkeeping(corpus):
    """lookup counts, forget, negative entries and read-only answers."""
    import trio

    from shardfs.fuse.handlers import CACHE_TIMEOUT, ENTRY_TIMEOUT, ShardFS
    from shardfs.fuse.layout import object_inode
    from shardfs.fuse.shardset import ShardSet

    path, objects = corpus
    key = sorted(objects)[0]
    shards = ShardSet(cache_dir=str(path.parent / "cache"))
    shard = shards.add(str(path)).shard
    try:
        fs = ShardFS(shards)

        async def main():
            a1 = await fs.lookup(pyfuse3.ROOT_INODE, key.encode(), None)
            a2 = await fs.lookup(pyfuse3.ROOT_INODE, key.encode(), None)
            assert a1.st_ino == a2.st_ino == object_inode(0, shard.slot_of(bytes.fromhex(key)))
            assert a1.entry_timeout >= CACHE_TIMEOUT and a1.attr_timeout >= CACHE_TIMEOUT
            await fs.forget([(a1.st_ino, 2)])
            # The inode carries its location: still answered after forget.
            assert (await fs.getattr(a1.st_ino, None)).st_size == len(objects[key])
            # A slot past the index names nothing; a shard not served (any
            # more) is stale: the kernel looks the name up again.
            for bogus, code in ((object_inode(0, shard.slot_count), errno.ENOENT),
                                (object_inode(7, 0), errno.ESTALE)):
                with pytest.raises(pyfuse3.FUSEError) as exc:
                    await fs.getattr(bogus, None)
                assert exc.value.errno == code
            for bad in (b"nothex", key.upper().encode(), key[:-1].encode(), hashlib.sha256(b"?").hexdigest().encode()):
                neg = await fs.lookup(pyfuse3.ROOT_INODE, bad, None)
                assert neg.st_ino == 0 and neg.entry_timeout == ENTRY_TIMEOUT
            with pytest.raises(pyfuse3.FUSEError) as exc:
                await fs.getxattr(pyfuse3.ROOT_INODE, b"user.x", None)
            assert exc.value.errno == errno.ENODATA
            a = await fs.lookup(pyfuse3.ROOT_INODE, key.encode(), None)
            for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_APPEND):
                with pytest.raises(pyfuse3.FUSEError) as exc:
                    await fs.open(a.st_ino, flags, None)
                assert exc.value.errno == errno.EROFS
            with pytest.raises(pyfuse3.FUSEError) as exc:
                await fs.access(a.st_ino, os.W_OK, None)
            assert exc.value.errno == errno.EROFS
            assert await fs.access(a.st_ino, os.R_OK, None)
            for name in ("setattr", "mknod", "mkdir", "unlink", "rmdir", "symlink", "rename", "link", "create", "write", "setxattr", "removexattr"):
                with pytest.raises(pyfuse3.FUSEError) as exc:
                    await getattr(fs, name)(1, b"x", b"y", None, None, None)
                assert exc.value.errno == errno.EROFS, name

        trio.run(main)
        fs.close()
    finally:
        shards.close()
