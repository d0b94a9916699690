"""Global index levels over real shards: key_prefixes, write, lookup, merge."""

import array
import hashlib
import os
import random
import struct
import threading

import pytest

from shardfs import Shard, ShardWriter, _shardfs, sidecar
from shardfs.errors import CorruptShardError

GlobalIndex = _shardfs.GlobalIndex
key_prefixes = _shardfs.key_prefixes
write_global_index = _shardfs.write_global_index
merge_global_index = _shardfs.merge_global_index


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def prefix(key: bytes) -> int:
    return int.from_bytes(key[:5], "big")


def build_shard(path, n, seed, extra=()):
    """A shard of n objects derived from seed, plus the objects `extra`."""
    rnd = random.Random(seed)
    objects = [rnd.randbytes(rnd.randint(0, 64)) + seed.to_bytes(4, "big") + i.to_bytes(4, "big")
               for i in range(n)]
    objects += list(extra)
    with ShardWriter(path) as w:
        for data in objects:
            w.add(sha(data), data)
    return [sha(d) for d in objects]


def packed(values):
    return struct.pack(f"<{len(values)}Q", *values)


@pytest.fixture(scope="module")
def fifty(tmp_path_factory):
    """50 shards (50 + 37 i objects each); shards 3 and 4 share 20 objects."""
    base = tmp_path_factory.mktemp("gindex")
    shared = [b"shared object %d" % i for i in range(20)]
    shards, keys = [], []
    for i in range(50):
        path = base / f"{i}.shard"
        keys.append(build_shard(path, 50 + 37 * i, 100 + i, shared if i in (3, 4) else ()))
        shards.append(Shard(path))
    idents = [sidecar.identity(s) for s in shards]
    yield base, shards, keys, idents
    for s in shards:
        s.close()


def test_key_prefixes(tmp_path):
    path = tmp_path / "p.shard"
    keys = build_shard(path, 3000, 1)
    with Shard(path, writable=True) as shard:
        want = sorted({prefix(k) for k in keys})
        got = key_prefixes(shard)
        assert isinstance(got, bytes) and got == packed(want)
        assert key_prefixes(shard._reader) == got  # a Reader too
        for k in keys[::3]:
            shard.delete(k)
        live = keys[1::3] + keys[2::3]
        assert key_prefixes(shard) == packed(sorted({prefix(k) for k in live}))
    with pytest.raises(ValueError):
        key_prefixes(shard)  # closed
    with pytest.raises(TypeError):
        key_prefixes("not a shard")
    # an empty shard
    with ShardWriter(tmp_path / "e.shard"):
        pass
    with Shard(tmp_path / "e.shard") as empty:
        assert key_prefixes(empty) == b""


def test_level_over_50_shards(fifty, tmp_path):
    _, shards, keys, idents = fifty
    runs = [(ident, key_prefixes(s)) for ident, s in zip(idents, shards)]
    path = tmp_path / "level.gidx"
    write_global_index(str(path), runs)
    with GlobalIndex(path) as g:
        assert g.count == sum(len(p) // 8 for _, p in runs)
        assert g.shard_count == 50
        assert g.identities() == idents
        assert g.identity(49) == idents[49]
        assert [g.position(i) for i in idents] == list(range(50))
        assert g.position(bytearray(idents[7])) == 7
        assert g.position(sha(b"no such shard")) == -1
        with pytest.raises(ValueError):
            g.position(idents[0][:31])
        # 64 entries per bucket at most, on average
        assert 2 ** g.bucket_bits >= g.count / 64 and (g.bucket_bits == 0 or
                                                      2 ** (g.bucket_bits - 1) < g.count / 64)
        # An entry keeps the 64 - b bits its bucket does not give, in whole
        # bytes; 8 bytes of padding end the file.
        width = (64 - g.bucket_bits + 7) // 8
        assert os.path.getsize(path) == (64 + 32 * 50 + 8 * (2 ** g.bucket_bits + 1)
                                         + width * g.count + 8)
        assert g.bucket_bits >= 8 and width == 7
        others = 0
        for i in range(50):
            for k in keys[i]:
                found = g.lookup(k)
                assert i in found
                assert found == sorted(found)
                others += len(found) - 1
        # the 20 shared objects are in shards 3 and 4: each lists the other
        assert others == 2 * 20
        rnd = random.Random(7)
        absent = [rnd.randbytes(32) for _ in range(20000)]
        assert sum(len(g.lookup(k)) for k in absent) <= 2  # expected ~1e-3


def test_key_in_two_shards(fifty, tmp_path):
    _, shards, keys, idents = fifty
    path = tmp_path / "two.gidx"
    write_global_index(path, [(idents[3], key_prefixes(shards[3])),
                              (idents[4], key_prefixes(shards[4])),
                              (idents[5], key_prefixes(shards[5]))])
    g = GlobalIndex(path)
    for i in range(20):
        assert g.lookup(sha(b"shared object %d" % i)) == [0, 1]
    assert g.lookup(keys[3][0]) == [0]
    assert g.lookup(keys[5][0]) == [2]
    g.close()
    assert g.closed
    with pytest.raises(ValueError):
        g.lookup(keys[3][0])
    g.close()  # twice: fine


def test_merge_with_a_removed_shard(fifty, tmp_path):
    _, shards, keys, idents = fifty
    runs = [(ident, key_prefixes(s)) for ident, s in zip(idents, shards)]
    # level 1: shards 0..24, level 2: shards 20..49 (20..24 in both)
    write_global_index(tmp_path / "l1.gidx", runs[:25])
    write_global_index(tmp_path / "l2.gidx", runs[20:])
    l1, l2 = GlobalIndex(tmp_path / "l1.gidx"), GlobalIndex(tmp_path / "l2.gidx")
    # drop shard 7 (level 1) and shard 30 (index 10 of level 2); shard 22
    # dropped through level 2 stays through level 1
    merge_global_index(str(tmp_path / "m.gidx"), [l1, l2],
                       [set(range(25)) - {7}, set(range(30)) - {10, 2}])
    merged = GlobalIndex(tmp_path / "m.gidx")
    want_ids = [idents[i] for i in range(50) if i not in (7, 30)]
    assert merged.identities() == want_ids
    assert merged.count == sum(len(runs[i][1]) // 8 for i in range(50) if i not in (7, 30))

    def check(g):
        ids = g.identities()
        for i in range(50):
            for k in keys[i]:
                found = [ids[j] for j in g.lookup(k)]
                if i in (7, 30):
                    assert idents[i] not in found
                else:
                    assert idents[i] in found

    check(merged)
    # from disk again, after the inputs are gone
    l1.close()
    l2.close()
    os.unlink(tmp_path / "l1.gidx")
    merged.close()
    with GlobalIndex(tmp_path / "m.gidx") as again:
        check(again)
        # merge of one level keeping everything: the same file
        merge_global_index(tmp_path / "same.gidx", [again])
    with open(tmp_path / "m.gidx", "rb") as a, open(tmp_path / "same.gidx", "rb") as b:
        assert a.read() == b.read()
    # no level at all: an empty level
    merge_global_index(tmp_path / "empty.gidx", [])
    with GlobalIndex(tmp_path / "empty.gidx") as empty:
        assert empty.count == 0 and empty.shard_count == 0 and empty.identities() == []
        assert empty.position(idents[0]) == -1
        assert empty.lookup(keys[0][0]) == []


def test_buffers_and_arguments(tmp_path):
    ident = bytes(range(32))
    values = [1, 5, 5, 9, 2 ** 40 - 1]
    path = tmp_path / "b.gidx"
    # array('Q'), bytearray, an unaligned memoryview: all little-endian u64
    unaligned = memoryview(b"x" + packed(values))[1:]
    write_global_index(path, [(ident, array.array("Q", values)), (b"\x01" * 32, bytearray(
        packed([5]))), (b"\x02" * 32, unaligned)])
    with GlobalIndex(path) as g:
        assert g.count == 4 + 1 + 4
        assert g.lookup((5).to_bytes(5, "big") + bytes(27)) == [0, 1, 2]
        assert g.lookup(b"\xff" * 32) == [0, 2]
        assert g.lookup(bytes(32)) == []
        with pytest.raises(ValueError):
            g.lookup(b"short")
        with pytest.raises(IndexError):
            g.identity(3)
        with pytest.raises(IndexError):
            g.identity(-1)
    with pytest.raises(ValueError, match="not sorted"):
        write_global_index(path, [(ident, packed([3, 2]))])
    with pytest.raises(ValueError, match="40-bit"):
        write_global_index(path, [(ident, packed([2 ** 40]))])
    with pytest.raises(ValueError, match="multiple of 8"):
        write_global_index(path, [(ident, b"1234567")])
    with pytest.raises(ValueError):
        write_global_index(path, [(b"short", packed([1]))])
    with pytest.raises(TypeError):
        write_global_index(path, [ident])
    with pytest.raises(FileNotFoundError):
        write_global_index(tmp_path / "no" / "x.gidx", [(ident, packed([1]))])
    with GlobalIndex(path) as g:  # the failed writes left it alone
        assert g.count == 9
        with pytest.raises(ValueError, match="items"):
            merge_global_index(tmp_path / "m.gidx", [g], [])
        with pytest.raises(IndexError):
            merge_global_index(tmp_path / "m.gidx", [g], [{3}])
        with pytest.raises(TypeError):
            merge_global_index(tmp_path / "m.gidx", [g, "x"])
        merge_global_index(tmp_path / "m.gidx", [g], [None])
    with pytest.raises(ValueError):
        merge_global_index(tmp_path / "m.gidx", [g])  # closed
    assert sorted(os.listdir(tmp_path)) == ["b.gidx", "m.gidx"]


def test_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        GlobalIndex(tmp_path / "missing.gidx")
    path = tmp_path / "g.gidx"
    write_global_index(path, [(b"\x01" * 32, packed(list(range(0, 10 ** 6, 7))))])
    data = path.read_bytes()
    bad = tmp_path / "bad.gidx"
    for cut in (0, 10, 63, 64, 100, len(data) - 1):
        bad.write_bytes(data[:cut])
        with pytest.raises(CorruptShardError):
            GlobalIndex(bad)
    bad.write_bytes(b"NOTGIDX!" + data[8:])
    with pytest.raises(CorruptShardError, match="magic"):
        GlobalIndex(bad)
    # random bodies: open, lookups in bounds, merges refused or valid
    rnd = random.Random(3)
    for _ in range(30):
        body = bytearray(data)
        for _ in range(rnd.randint(1, 200)):
            body[rnd.randrange(64, len(body))] = rnd.randrange(256)
        bad.write_bytes(bytes(body))
        with GlobalIndex(bad) as g:
            for _ in range(200):
                assert all(j < g.shard_count for j in g.lookup(rnd.randbytes(32)))
            try:
                merge_global_index(tmp_path / "out.gidx", [g])
            except CorruptShardError:
                continue
            with GlobalIndex(tmp_path / "out.gidx") as out:
                assert out.shard_count == 1


def test_close_during_merges(fifty, tmp_path):
    """close() while merges run in another thread (GIL released): the
    level stays open until the running merge ends; later merges are
    refused (ValueError); no crash, the output stays valid."""
    _, shards, keys, idents = fifty
    runs = [(ident, key_prefixes(s)) for ident, s in zip(idents, shards)]
    write_global_index(tmp_path / "big.gidx", runs)
    g = GlobalIndex(tmp_path / "big.gidx")
    started, results = threading.Event(), []

    def merge():
        started.set()
        for _ in range(50):
            try:
                merge_global_index(tmp_path / "out.gidx", [g])
                results.append("ok")
            except ValueError as e:
                results.append(str(e))
                break

    t = threading.Thread(target=merge)
    t.start()
    started.wait()
    lookups = sum(len(g.lookup(k)) for k in keys[10][:200])  # while merges run
    assert lookups >= 200
    g.close()
    t.join()
    assert g.closed
    assert results and all(r == "ok" for r in results[:-1])
    assert results[-1] in ("ok", "I/O operation on a closed global index")
    with GlobalIndex(tmp_path / "out.gidx") as out:
        assert out.identities() == idents
        assert all(10 in out.lookup(k) for k in keys[10])


def test_probe_shards_learns_what_opening_does(fifty, tmp_path):
    """probe_shards gives, for each valid Read Shard, the fstat fields, the
    header counts, the identity and (within its budget of slots) the key
    prefixes that opening it with Shard, sidecar.identity and key_prefixes
    give; None for what is not a valid shard."""
    base, shards, keys, idents = fifty
    paths = [s.path for s in shards]
    truncated, corrupt = tmp_path / "truncated.shard", tmp_path / "corrupt.shard"
    data = open(paths[7], "rb").read()
    truncated.write_bytes(data[:len(data) - 100])
    corrupt.write_bytes(data[:40] + b"\xff" * 8 + data[48:])  # objects_count past the slots
    odd = [str(truncated), str(tmp_path / "missing.shard"), str(corrupt), str(tmp_path)]
    every = paths[:25] + odd + paths[25:]
    budget = sum(s.slot_count for s in shards[:20])
    got = _shardfs.probe_shards(every, budget)
    assert len(got) == len(every) and got[25:29] == [None] * 4
    for i, (shard, ident, item) in enumerate(zip(shards, idents, got[:25] + got[29:])):
        st = os.stat(shard.path)
        assert item[:8] == (st.st_dev, st.st_ino, st.st_rdev, st.st_mode, st.st_size, st.st_mtime_ns,
                            st.st_ctime_ns, st.st_mtime)
        assert item[8:12] == (shard.header.objects_count, shard.slot_count, shard.extent, ident)
        assert item[12] == (key_prefixes(shard) if i < 20 else None)  # the fifty grow: none fits after
    assert all(item[12] is None for item in _shardfs.probe_shards(paths, 0))
    assert _shardfs.probe_shards([]) == []
    with pytest.raises(TypeError):
        _shardfs.probe_shards([b"x", 3])
