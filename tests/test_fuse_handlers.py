"""The FUSE request handlers (shardfs.fuse.handlers.ShardFS) called
directly, without the kernel: no mount, no /dev/fuse, no root, so this runs
everywhere. The handlers are plain synchronous methods that the C request
path (shardfs._shardfs.Session, shardfs/c/py_ll_ops.c) calls for LOOKUP,
GETATTR, READ, READDIRPLUS, STATFS, ACCESS, GETXATTR and LISTXATTR; they
return plain values or raise `FUSEError`. What C answers alone (OPEN with
write flags and every write: EROFS; FORGET; the cache timeouts it puts in
its replies) is tested through a real mount in test_fuse.py
(test_writes_are_erofs, test_forget_then_lookup_again,
test_kernel_caches_names_and_negative_entries).
"""

from __future__ import annotations

import errno
import hashlib
import os

import pytest
from mounting import build_shard, make_blobs, prefixed_blobs

shardfs = pytest.importorskip("shardfs")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A shard of 400 small objects and an empty one: (path, objects)."""
    path = tmp_path_factory.mktemp("handlers") / "corpus.shard"
    objects = build_shard(path, [b""] + make_blobs(7, 400, 1, 3000, tag=b"handlers"))
    return path, objects


class Reply:
    """What the C request path hands `readdir` (a DirBuffer): `add` returns
    False, without taking the entry, once `room` entries were taken."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.entries = []

    def add(self, name, ino, is_dir, size, time_ns, next_id) -> bool:
        if len(self.entries) >= self.room:
            return False
        self.entries.append((name, ino, is_dir, size, time_ns, next_id))
        return True


def test_handlers_bookkeeping(corpus):
    """Inodes carry their location (same key, same inode = object_inode(0,
    slot); getattr of an inode answered by a ShardFS that never looked it
    up), bogus inodes are ENOENT or ESTALE, bad names are negative entries
    (None), unknown xattrs ENODATA, access for writing EROFS."""
    from shardfs.fuse.handlers import FUSEError, ShardFS
    from shardfs.fuse.layout import ROOT_INODE, object_inode
    from shardfs.shardset import ShardSet

    path, objects = corpus
    key = sorted(objects)[0]
    shards = ShardSet(cache_dir=str(path.parent / "cache"))
    member = shards.add(str(path))
    shard = member.shard
    try:
        fs = ShardFS(shards)
        a1 = fs.lookup(ROOT_INODE, key.encode())
        a2 = fs.lookup(ROOT_INODE, key.encode())
        inode = object_inode(0, shard.slot_of(bytes.fromhex(key)))
        assert a1 == a2
        ino, is_dir, size, time_ns = a1
        assert ino == inode and not is_dir and size == len(objects[key])
        assert abs(time_ns - os.stat(path).st_mtime_ns) < 1000  # the shard's mtime
        assert fs.getattr(inode) == a1
        # The inode carries its location: a ShardFS that never looked the
        # key up (another worker, or after the kernel's FORGET, which C
        # answers without telling the handlers) answers it too.
        other = ShardFS(shards)
        assert other.getattr(inode) == a1
        assert other.read(inode, 0, 1 << 20) == objects[key]
        other.close()
        # Directories: the root, "." and "..".
        assert fs.getattr(ROOT_INODE)[:3] == (ROOT_INODE, True, 0)
        assert fs.lookup(ROOT_INODE, b".")[:2] == (ROOT_INODE, True)
        assert fs.lookup(ROOT_INODE, b"..")[:2] == (ROOT_INODE, True)
        # A slot past the index names nothing; a shard not served (any
        # more) is stale: the kernel looks the name up again.
        for bogus, code in ((object_inode(0, shard.slot_count), errno.ENOENT),
                            (object_inode(7, 0), errno.ESTALE)):
            for call in (fs.getattr, fs.listxattr, lambda i: fs.access(i, os.R_OK),
                         lambda i: fs.read(i, 0, 10)):
                with pytest.raises(FUSEError) as exc:
                    call(bogus)
                assert exc.value.errno == code, (bogus, call)
        # An object is no directory.
        for call in (lambda: fs.lookup(inode, key.encode()), lambda: fs.readdir(inode, 0, Reply(10))):
            with pytest.raises(FUSEError) as exc:
                call()
            assert exc.value.errno == errno.ENOTDIR
        for bad in (b"nothex", key.upper().encode(), key[:-1].encode(), key.encode() + b"0",
                    hashlib.sha256(b"?").hexdigest().encode()):
            assert fs.lookup(ROOT_INODE, bad) is None, bad
        for where, name in ((ROOT_INODE, b"user.x"), (inode, b"user.x"), (inode, b"user.shardfs.requests")):
            with pytest.raises(FUSEError) as exc:
                fs.getxattr(where, name)
            assert exc.value.errno == errno.ENODATA
        assert fs.getxattr(inode, b"user.shardfs.shard") == os.fsencode(str(path))
        assert sorted(fs.listxattr(inode)) == [b"user.shardfs.offset", b"user.shardfs.shard"]
        assert sorted(fs.listxattr(ROOT_INODE)) == [b"user.shardfs.requests", b"user.shardfs.stats"]
        for where in (inode, ROOT_INODE):
            with pytest.raises(FUSEError) as exc:
                fs.access(where, os.W_OK)
            assert exc.value.errno == errno.EROFS
            with pytest.raises(FUSEError) as exc:
                fs.access(where, os.R_OK | os.W_OK)
            assert exc.value.errno == errno.EROFS
            assert fs.access(where, os.R_OK) is None
            assert fs.access(where, os.F_OK) is None
        assert fs.statfs() == ((shard.extent + 4095) // 4096, len(objects))
        # The handlers the C path used to reach and answers alone now.
        for name in ("open", "release", "flush", "forget", "opendir", "releasedir", "setattr", "mknod",
                     "mkdir", "unlink", "rmdir", "symlink", "rename", "link", "create", "write",
                     "setxattr", "removexattr", "ioctl"):
            assert not hasattr(fs, name), name
        fs.close()
    finally:
        shards.close()


def test_read_clips_at_the_object_end(corpus):
    """READ (which carries the inode in no-open mode) answers exactly the
    bytes asked for, clipped at the object's end, b"" at or past it."""
    from shardfs.fuse.handlers import ShardFS
    from shardfs.fuse.layout import object_inode
    from shardfs.shardset import ShardSet

    path, objects = corpus
    shards = ShardSet(cache_dir=str(path.parent / "cache-read"))
    shard = shards.add(str(path)).shard
    try:
        fs = ShardFS(shards)
        for key, data in list(objects.items())[:50] + [(hashlib.sha256(b"").hexdigest(), b"")]:
            inode = object_inode(0, shard.slot_of(bytes.fromhex(key)))
            n = len(data)
            for off, size in ((0, 1 << 17), (0, 1), (1, 7), (n // 2, n), (max(n - 1, 0), 10), (n, 10),
                              (n + 1, 10), (0, 0)):
                assert fs.read(inode, off, size) == data[off:off + size], (key, off, size)
        fs.close()
    finally:
        shards.close()


def test_removed_shard_reads_but_is_not_found(corpus):
    """A removed shard (the coordinator keeps it until no process has a file
    open on it): its keys are negative entries and its inodes stale for
    lookups and attributes, but READ, which the kernel sends for files
    opened before (no-open mode: the mount is not told when they are
    closed), still answers its bytes."""
    from shardfs.fuse.handlers import FUSEError, ShardFS
    from shardfs.fuse.layout import ROOT_INODE, object_inode
    from shardfs.shardset import ShardSet

    path, objects = corpus
    key = sorted(objects)[1]
    shards = ShardSet(cache_dir=str(path.parent / "cache-removed"))
    member = shards.add(str(path))
    try:
        fs = ShardFS(shards)
        inode = object_inode(0, member.shard.slot_of(bytes.fromhex(key)))
        assert fs.lookup(ROOT_INODE, key.encode())[0] == inode
        shards.remove(member)
        assert fs.lookup(ROOT_INODE, key.encode()) is None
        with pytest.raises(FUSEError) as exc:
            fs.getattr(inode)
        assert exc.value.errno == errno.ESTALE
        assert fs.read(inode, 0, 1 << 17) == objects[key]
        assert fs.statfs() == (0, 0)
        fs.close()
    finally:
        shards.close()


def test_worker_that_never_saw_a_held_shard_reads_it(tmp_path):
    """A file opened through one worker is read through any other (one FUSE
    connection, several processes). A worker that took no table between a
    shard's addition and its removal (it served no request meanwhile) is
    handed a table where the shard is already removed, held open by the
    coordinator: it still reads the shard's objects, through the
    coordinator's descriptor, for the files opened before the removal."""
    import types

    from shardfs.fuse.coordinator import Coordinator
    from shardfs.fuse.handlers import FUSEError, ShardFS
    from shardfs.fuse.layout import ROOT_INODE, Layout, object_inode
    from shardfs.fuse.worker import apply_table
    from shardfs.shardset import ShardSet

    path = tmp_path / "x.shard"
    objects = build_shard(path, make_blobs(11, 50, 1, 3000, tag=b"held"))
    key = sorted(objects)[0]
    coordinator = ShardSet(cache_dir=str(tmp_path / "cache"))
    worker = ShardSet(cache_dir=str(tmp_path / "cache"))
    try:
        member = coordinator.add(str(path))
        inode = object_inode(member.number, member.shard.slot_of(bytes.fromhex(key)))
        member.held = coordinator.open_shard(member)  # what Coordinator._hold does
        os.unlink(path)
        coordinator.remove(member)
        table = Coordinator.table(types.SimpleNamespace(shards=coordinator, catalog=None, pid=os.getpid(),
                                                        fs=types.SimpleNamespace(layout=Layout.flat())))
        apply_table(worker, table, os.getpid())
        fs = ShardFS(worker)
        assert fs.lookup(ROOT_INODE, key.encode()) is None
        with pytest.raises(FUSEError) as exc:
            fs.getattr(inode)
        assert exc.value.errno == errno.ESTALE
        assert fs.read(inode, 0, 1 << 17) == objects[key]
        fs.close()
    finally:
        worker.close()
        coordinator.close()


def test_unexpected_exception_is_eio(corpus, monkeypatch, caplog):
    """A handler that fails with anything but FUSEError raises
    FUSEError(EIO) (and logs why): the C caller answers the errno."""
    from shardfs.fuse.handlers import FUSEError, ShardFS
    from shardfs.fuse.layout import ROOT_INODE
    from shardfs.shardset import ShardSet

    path, objects = corpus
    key = sorted(objects)[2]
    shards = ShardSet(cache_dir=str(path.parent / "cache-eio"))
    shards.add(str(path))
    try:
        fs = ShardFS(shards)

        def broken(*args, **kwargs):
            raise RuntimeError("broken shard set")

        monkeypatch.setattr(fs, "_resolver", broken)  # what lookups of objects ask
        with pytest.raises(FUSEError) as exc:
            fs.lookup(ROOT_INODE, key.encode())
        assert exc.value.errno == errno.EIO
        assert "broken shard set" in caplog.text
        monkeypatch.undo()
        assert fs.lookup(ROOT_INODE, key.encode())[2] == len(objects[key])
        fs.close()
    finally:
        shards.close()


def test_readdir_flat_root_resumes_at_next_id(corpus):
    """READDIRPLUS of a flat root into replies that take a few entries
    each: resumed at the last next_id taken, the listing holds every key
    once, with the inode and size a lookup gives."""
    from shardfs.fuse.handlers import ShardFS
    from shardfs.fuse.layout import ROOT_INODE
    from shardfs.shardset import ShardSet

    path, objects = corpus
    shards = ShardSet(cache_dir=str(path.parent / "cache-readdir"))
    shards.add(str(path))
    try:
        fs = ShardFS(shards)
        listed = []
        position = 0
        for _ in range(1000):
            reply = Reply(37)
            assert fs.readdir(ROOT_INODE, position, reply) is None
            if not reply.entries:
                break
            listed += reply.entries
            position = reply.entries[-1][5]
        names = [e[0].decode() for e in listed]
        assert len(names) == len(set(names)) == len(objects)
        assert set(names) == set(objects)
        for name, ino, is_dir, size, time_ns, _ in listed[:60]:
            assert not is_dir
            assert fs.lookup(ROOT_INODE, name) == (ino, False, size, time_ns)
            assert size == len(objects[name.decode()])
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
    from shardfs.shardset import ShardSet

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


def test_fanout_leaf_listing_resumed_after_the_shard_set_changed(tmp_path):
    """A fan-out leaf (MOUNT/5/e/<key>) listed a few entries per READDIR,
    each served by another process (a ShardFS of its own), while the shard
    set changes between READDIRs: a shard whose keys fall in the leaf is
    added, an object already listed is deleted in place (a takedown), a
    shard is removed. The listing resumes after the last key returned: no
    name twice, names in key order, and every name present throughout
    listed. (With positions that were indexes into the listing of the
    moment, the added keys before the position made names come twice and
    the removed ones made names be skipped.)"""
    from shardfs.fuse.handlers import ShardFS
    from shardfs.fuse.layout import Layout
    from shardfs.shardset import ShardSet

    layout = Layout.fanout("0:1/1:2")
    leaf = layout.dir_inode(2, 0x5e)
    paths, keys = {}, {}
    for name in "abc":
        paths[name] = tmp_path / f"{name}.shard"
        objects = build_shard(paths[name], prefixed_blobs("5e", 30, name.encode())
                              + make_blobs(3, 20, 1, 100, tag=name.encode()))
        keys[name] = {k for k in objects if k.startswith("5e")}
    shards = ShardSet(cache_dir=str(tmp_path / "cache"))
    shards.add(str(paths["a"]))
    b = shards.add(str(paths["b"]))
    deleted = None
    listed = []
    try:
        for call in range(100):
            reply = Reply(4)
            fs = ShardFS(shards, layout=layout)
            fs.readdir(leaf, listed[-1][5] if listed else 0, reply)
            fs.close()
            if not reply.entries:
                break
            listed += reply.entries
            if call == 1:
                shards.add(str(paths["c"]))
            elif call == 3:
                deleted = min(e[0].decode() for e in listed if e[0].decode() in keys["a"])
                assert shardfs.delete(str(paths["a"]), [bytes.fromhex(deleted)]) == 1
            elif call == 5:
                shards.remove(b)
        assert deleted is not None and 10 < len(listed) < 90
        names = [e[0].decode() for e in listed]
        repeated = sorted({n for n in names if names.count(n) > 1})
        skipped = sorted(keys["a"] - {deleted} - set(names))
        assert not repeated and not skipped, \
            f"{len(repeated)} name(s) listed twice, {len(skipped)} skipped: {repeated[:3]} {skipped[:3]}"
        assert names == sorted(names)
        assert set(names) <= keys["a"] | keys["b"] | keys["c"]
        positions = [e[5] for e in listed]
        assert positions == sorted(set(positions)) and 0 < positions[0] and positions[-1] < 1 << 63
    finally:
        shards.close()
