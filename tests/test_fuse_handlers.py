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


def test_fanout_listing_resumed_after_the_shard_set_changed(corpus):
    """A fan-out directory listed over several READDIRs while the shard's
    sidecar becomes ready (the listing goes from every subdirectory to the
    non-empty ones): the listing resumes after the last name returned, so
    no non-empty subdirectory is skipped. (With positions that were indexes
    into the listing of the moment, the resumed part started at the 100th
    non-empty subdirectory and skipped those after the first 100 names.)"""
    from shardfs import sidecar as sidecar_mod
    from shardfs.fuse.handlers import ShardFS
    from shardfs.fuse.layout import ROOT_INODE, Layout
    from shardfs.fuse.shardset import ShardSet

    path, objects = corpus
    cache = path.parent / "cache-listing"
    shards = ShardSet(cache_dir=str(cache))
    member = shards.add(str(path))
    try:
        fs = ShardFS(shards, layout=Layout.fanout())
        before = fs._entries(ROOT_INODE, 0)
        assert len(before) == 256  # no sidecar yet: every subdirectory
        first = before[:100]
        sidecar_mod.build(member.shard, str(cache))
        assert shards.sidecar_built(member, str(cache))
        rest = fs._entries(ROOT_INODE, first[-1][0])
        names = [e[1].decode() for e in first + list(rest)]
        assert names == sorted(set(names))
        nonempty = {k[:2] for k in objects}
        last = first[-1][1].decode()
        assert {n for n in names if n > last} == {p for p in nonempty if p > last}
        assert nonempty <= set(names)
        fs.close()
    finally:
        shards.close()
