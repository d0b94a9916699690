"""Sidecar files over real shards: identity, load/build, SidecarSet, ranges."""

import hashlib
import os
import random
import shutil
import subprocess

import pytest

from shardfs import Shard, ShardWriter, sidecar
from shardfs.errors import StaleSidecarError
from shardfs.sidecar import Sidecar, SidecarSet


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def build_shard(path, n, seed):
    rnd = random.Random(seed)
    objects = [rnd.randbytes(rnd.randint(0, 64)) + seed.to_bytes(4, "big") + i.to_bytes(4, "big")
               for i in range(n)]
    with ShardWriter(path) as w:
        for data in objects:
            w.add(sha(data), data)
    return [sha(d) for d in objects]


@pytest.fixture
def two_shards(tmp_path):
    keys_a = build_shard(tmp_path / "a.shard", 3000, 1)
    keys_b = build_shard(tmp_path / "b.shard", 3000, 2)
    with Shard(tmp_path / "a.shard") as a, Shard(tmp_path / "b.shard") as b:
        yield a, keys_a, b, keys_b


def test_default_cache_dir(monkeypatch):
    monkeypatch.setenv("SHARDFS_CACHE_DIR", "/x/y")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert sidecar.default_cache_dir() == "/x/y"
    monkeypatch.delenv("SHARDFS_CACHE_DIR")
    assert sidecar.default_cache_dir() == "/xdg/shardfs"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", "/home/someone")
    assert sidecar.default_cache_dir() == "/home/someone/.cache/shardfs"


def test_identity(two_shards, tmp_path):
    a, _, b, _ = two_shards
    assert a.slot_count == b.slot_count
    ida, idb = sidecar.identity(a), sidecar.identity(b)
    assert len(ida) == len(idb) == 32
    assert ida != idb
    assert sidecar.identity(a) == ida  # deterministic
    shutil.copy(a.path, tmp_path / "copy.shard")
    with Shard(tmp_path / "copy.shard") as c:
        assert sidecar.identity(c) == ida  # a copy is the same shard
    assert sidecar.sidecar_path(tmp_path, ida) == str(tmp_path / (ida.hex() + ".sidecar"))
    with pytest.raises(ValueError):
        sidecar.sidecar_path(tmp_path, b"short")


def test_load_build(two_shards, tmp_path):
    a, keys_a, _, keys_b = two_shards
    cache = tmp_path / "cache" / "deeper"
    assert sidecar.load(a, cache) is None
    sc = sidecar.build(a, cache)
    assert os.stat(cache).st_mode & 0o777 == 0o700
    assert os.stat(cache.parent).st_mode & 0o777 == 0o700
    assert sc.count == len(a) == len(keys_a)
    assert sc.slot_count == a.slot_count
    assert sc.prefix_bits == 9  # smallest p with 2^p >= 3000 / 8
    assert all(sc.may_contain(k) for k in keys_a)
    assert sum(sc.may_contain(k) for k in keys_b) <= 1
    loaded = sidecar.load(a, cache)
    assert loaded is not None and loaded.count == sc.count
    assert sidecar.load_or_build(a, cache).count == sc.count
    assert [p.name for p in cache.iterdir()] == [sidecar.identity(a).hex() + ".sidecar"]
    sc.close()
    assert sc.closed
    with pytest.raises(ValueError):
        sc.may_contain(keys_a[0])
    with pytest.raises(ValueError):
        sc.may_contain(b"short")  # closed first: ValueError either way


def test_default_cache_dir_is_used(two_shards, tmp_path, monkeypatch):
    a, keys_a, _, _ = two_shards
    monkeypatch.setenv("SHARDFS_CACHE_DIR", str(tmp_path / "env-cache"))
    sc = sidecar.load_or_build(a)
    assert sc.may_contain(keys_a[0])
    assert sidecar.load(a) is not None
    assert len(list((tmp_path / "env-cache").iterdir())) == 1


def test_other_shards_sidecar_is_refused(two_shards, tmp_path):
    a, keys_a, b, keys_b = two_shards
    cache = tmp_path / "cache"
    sa = sidecar.build(a, cache)
    path_a = sidecar.sidecar_path(cache, sidecar.identity(a))
    path_b = sidecar.sidecar_path(cache, sidecar.identity(b))
    with pytest.raises(StaleSidecarError, match="identity"):
        Sidecar(path_a, sidecar.identity(b), b.slot_count)
    with pytest.raises(StaleSidecarError, match="slots"):
        Sidecar(path_a, sidecar.identity(a), a.slot_count + 1)
    # A's file under B's name: ignored, then replaced by B's own
    shutil.copy(path_a, path_b)
    assert sidecar.load(b, cache) is None
    sb = sidecar.load_or_build(b, cache)
    assert all(sb.may_contain(k) for k in keys_b)
    # a damaged (truncated) file is ignored and rebuilt
    with open(path_a, "r+b") as f:
        f.truncate(os.path.getsize(path_a) - 4)
    assert sidecar.load(a, cache) is None
    assert all(sidecar.load_or_build(a, cache).may_contain(k) for k in keys_a)
    # the open sidecar still works: the rebuild replaced the file by rename
    assert sa.may_contain(keys_a[0])
    with pytest.raises(FileNotFoundError):
        Sidecar(tmp_path / "nothing.sidecar", sidecar.identity(a), a.slot_count)
    with pytest.raises(ValueError):
        Sidecar(path_a, b"x" * 31, a.slot_count)


def test_sidecar_set(tmp_path):
    cache = tmp_path / "cache"
    shards, keys, sidecars = [], [], []
    for i in range(50):
        path = tmp_path / f"{i}.shard"
        keys.append(build_shard(path, 50 + 37 * i, 100 + i))
        shards.append(Shard(path))
        sidecars.append(sidecar.load_or_build(shards[-1], cache))
    s = SidecarSet()
    assert len(s) == 0 and s.candidates(keys[0][0]) == []
    for i, sc in enumerate(sidecars):
        s.set(i, sc)
    assert len(s) == 50 and s.size == 50
    others = 0
    for i in range(50):
        for k in keys[i]:
            c = s.candidates(k)
            assert i in c
            others += len(c) - 1
    assert others <= 2  # expected ~1e-4 over ~47,000 keys
    rnd = random.Random(7)
    absent = [rnd.randbytes(32) for _ in range(20000)]
    assert sum(len(s.candidates(k)) for k in absent) <= 2

    # None: always a candidate; remove: never
    s.set(10, None)
    s.remove(20)
    s.remove(20)  # no-op
    s.remove(999)  # no-op
    assert len(s) == 49
    assert s.candidates(absent[0]) == [10]
    assert s.candidates(keys[20][0]) == [10]
    assert s.candidates(keys[30][5]) == [10, 30]
    s.set(20, sidecars[20])
    assert s.candidates(keys[20][0]) == [10, 20]
    # sparse indices; the set keeps sidecars alive and usable after close()
    s.set(1000, sidecars[3])
    assert s.size == 1001 and len(s) == 51
    assert s.candidates(keys[3][1]) == [3, 10, 1000]
    sidecars[3].close()
    assert s.candidates(keys[3][1]) == [3, 10, 1000]
    with pytest.raises(ValueError):
        s.set(4, sidecars[3])  # closed: refused
    s.remove(3)
    s.remove(1000)
    assert s.candidates(keys[3][1]) == [10]
    with pytest.raises(TypeError):
        s.set(5, "not a sidecar")
    with pytest.raises(IndexError):
        s.set(-1, None)
    with pytest.raises(ValueError):
        s.candidates(b"short")
    for sh in shards:
        sh.close()


def test_range_and_slots(tmp_path):
    path = tmp_path / "r.shard"
    build_shard(path, 20000, 5)
    with Shard(path) as shard:
        sc = sidecar.build(shard, tmp_path / "cache")
        by_slot = {slot: key for slot, key, _, _ in shard.scan()}
        assert sc.range(b"", 0) == (0, len(by_slot))
        assert sorted(sc.slots(0, sc.count)) == sorted(by_slot)
        listed = [by_slot[slot] for slot in sc.slots(0, sc.count)]
        assert listed == sorted(listed, key=lambda k: k[:8])  # sorted by the key's top 64 bits
        for hex_prefix in ["0", "f", "7", "00", "ab", "ff", "1c", "abc", "0000", "3e9f",
                           by_slot[next(iter(by_slot))].hex()[:4]]:
            bits = 4 * len(hex_prefix)
            raw = bytes.fromhex(hex_prefix + "0" * (len(hex_prefix) % 2))
            begin, end = sc.range(raw, bits)
            got = sorted(by_slot[slot].hex() for slot in sc.slots(begin, end))
            want = sorted(k.hex() for k in by_slot.values() if k.hex().startswith(hex_prefix))
            assert got == want, hex_prefix
        # all 256 two-hex-digit directories tile the entries, in order
        at = 0
        for byte in range(256):
            begin, end = sc.range(bytes([byte]), 8)
            assert begin == at
            at = end
        assert at == sc.count
        with pytest.raises(IndexError):
            sc.slots(0, sc.count + 1)
        with pytest.raises(IndexError):
            sc.slots(5, 4)
        with pytest.raises(ValueError):
            sc.range(b"\x01", 9)
        assert sc.slots(3, 3) == []


def test_deleted_keys_superset_until_rebuilt(tmp_path):
    path = tmp_path / "d.shard"
    keys = build_shard(path, 500, 9)
    cache = tmp_path / "cache"
    with Shard(path, writable=True) as shard:
        sc = sidecar.build(shard, cache)
        slot = shard.slot_of(keys[0])
        shard.delete(keys[0])
        # the identity does not see a delete in the middle of the index...
        assert sc.may_contain(keys[0])
        assert slot in sc.slots(0, sc.count)
        assert shard.slot(slot) is None  # ...callers check every slot
        # a rebuild drops it
        fresh = sidecar.build(shard, cache)
        assert fresh.count == 499
        assert not fresh.may_contain(keys[0])
        assert slot not in fresh.slots(0, fresh.count)


def _deleted_by_slot(shard, sc):
    """What the mount's check found before it was done in C: the slots
    the sidecar lists (in its order) whose ``shard.slot`` is None; a slot
    that raises is skipped."""
    found = []
    for slot in sc.slots(0, sc.count):
        try:
            if shard.slot(slot) is None:
                found.append(slot)
        except Exception:
            continue
    return found


def test_deleted_slots_since_the_build(tmp_path):
    """Shard.deleted_slots(sidecar): the slots the sidecar lists that were
    deleted since it was built, exactly, in the sidecar's order (what the
    slot-by-slot check gives), over any range; refused for another shard's
    or a closed sidecar, or a range outside it."""
    path = tmp_path / "d.shard"
    keys = build_shard(path, 20000, 13)
    build_shard(tmp_path / "other.shard", 100, 14)
    cache = tmp_path / "cache"
    with Shard(path, writable=True) as shard, Shard(tmp_path / "other.shard") as other:
        sc = sidecar.build(shard, cache)
        other_sc = sidecar.build(other, cache)
        assert shard.deleted_slots(sc) == []
        order = sc.slots(0, sc.count)
        victims = [keys[i] for i in range(0, len(keys), 53)]
        victims += [shard.slot(order[0])[0], shard.slot(order[-1])[0]]  # the first and last listed
        for key in dict.fromkeys(victims):
            shard.delete(key)
        want = _deleted_by_slot(shard, sc)
        assert sorted(want) == sorted({shard.slot_of(k) for k in victims})
        assert want[0] == order[0] and want[-1] == order[-1]
        assert shard.deleted_slots(sc) == want
        assert shard.deleted_slots(sc, 0, None) == want
        for step in (1, 999, 4096, sc.count):
            got = []
            for begin in range(0, sc.count, step):
                got += shard.deleted_slots(sc, begin, min(begin + step, sc.count))
            assert got == want, step
        assert shard.deleted_slots(sc, sc.count, sc.count) == []
        assert shard.deleted_slots(sc, begin=5, end=5) == []
        with pytest.raises(IndexError):
            shard.deleted_slots(sc, 0, sc.count + 1)
        with pytest.raises(IndexError):
            shard.deleted_slots(sc, 6, 5)
        with pytest.raises(ValueError):
            shard.deleted_slots(other_sc)  # another slot count
        with pytest.raises(TypeError):
            shard.deleted_slots(object())
        other_sc.close()
        with pytest.raises(ValueError):
            shard.deleted_slots(other_sc)
        # A rebuilt sidecar lists none of them.
        assert shard.deleted_slots(sidecar.build(shard, cache)) == []


def test_deleted_slots_in_threads_while_closed(tmp_path):
    """deleted_slots runs without the GIL: threads walking one sidecar at
    once all get the answer, and closing the shard and the sidecar while a
    walk runs does not unmap them under it (each is let go after)."""
    import threading

    path = tmp_path / "big.shard"
    keys = build_shard(path, 200000, 15)
    with Shard(path, writable=True) as shard:
        sc = sidecar.build(shard, tmp_path / "cache")
        for key in keys[::1000]:
            shard.delete(key)
    with Shard(path) as shard:
        want = sorted(shard.slot_of(k) for k in keys[::1000])
        results = []
        walkers = [threading.Thread(target=lambda: results.extend(sorted(shard.deleted_slots(sc)) for _ in range(5)))
                   for _ in range(4)]
        for t in walkers:
            t.start()
        for t in walkers:
            t.join()
        assert results == [want] * 20
    for _ in range(5):
        reader = Shard(path)
        loaded = sidecar.load(reader, tmp_path / "cache")
        out = []

        def walk():
            try:
                out.append(sorted(reader.deleted_slots(loaded)))
            except ValueError as exc:  # closed before the call began
                out.append(str(exc))

        t = threading.Thread(target=walk)
        t.start()
        reader.close()
        loaded.close()
        t.join()
        # Closed before the call (refused) or while it ran (it finished on
        # the mappings it kept).
        assert out[0] == want or "closed" in out[0], out[0]


def test_empty_shard(tmp_path):
    with ShardWriter(tmp_path / "e.shard"):
        pass
    with Shard(tmp_path / "e.shard") as shard:
        sc = sidecar.build(shard, tmp_path / "cache")
        assert sc.count == 0 and sc.prefix_bits == 0
        assert not sc.may_contain(bytes(32))
        assert sc.range(b"\xab", 8) == (0, 0)
        s = SidecarSet()
        s.set(0, sc)
        assert s.candidates(bytes(32)) == []


def _make_read_only(directory):
    """Make `directory` unwritable; returns an undo function, or None."""
    if os.geteuid() != 0:
        os.chmod(directory, 0o500)
        return lambda: os.chmod(directory, 0o700)
    # root writes anywhere: use the immutable attribute, where there is one
    try:
        subprocess.run(["chattr", "+i", str(directory)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return lambda: subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_build_into_read_only_dir(two_shards, tmp_path):
    a, _, _, _ = two_shards
    cache = tmp_path / "ro"
    cache.mkdir()
    undo = _make_read_only(cache)
    if undo is None:
        pytest.skip("no way to make a read-only directory here")
    try:
        with pytest.raises(OSError):
            sidecar.build(a, cache)
        assert list(cache.iterdir()) == []
        with pytest.raises(OSError):
            sidecar.build(a, cache / "sub")  # cannot even create it
    finally:
        undo()
    assert sidecar.load(a, cache) is None


def test_build_into_missing_parent_that_is_a_file(two_shards, tmp_path):
    a, _, _, _ = two_shards
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(OSError):
        sidecar.build(a, tmp_path / "file" / "cache")
    assert sidecar.load(a, tmp_path / "file" / "cache") is None
