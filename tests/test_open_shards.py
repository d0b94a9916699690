"""OpenShards: the open shards of a set by shard number, and `find` over
them in one C call (global index levels and per-shard filters give the
candidates). Real shards and real index levels; every answer is checked
against `Shard.find` of the shard that holds the key."""

from __future__ import annotations

import array
import os
import struct
import threading

import pytest

from shardfs import Shard, _shardfs, sidecar
from shardfs.errors import CorruptShardError
from shardfs.shardset import OpenCache, ShardSet

from test_gindex import build_shard, sha

OpenShards = _shardfs.OpenShards

#: Shards of the fixture; shards SHARED_A and SHARED_B hold the same
#: SHARED objects.
SHARDS = 12
SHARED_A, SHARED_B = 3, 7
SHARED = [b"shared object %d" % i for i in range(10)]


@pytest.fixture(scope="module")
def level(tmp_path_factory):
    """SHARDS shards and one global index level over them, numbered
    100 + i in a mount (numbers need not start at 0): (shards, keys of
    each, the level, its number map, base directory)."""
    base = tmp_path_factory.mktemp("open-shards")
    shards, keys = [], []
    for i in range(SHARDS):
        path = base / f"{i}.shard"
        keys.append(build_shard(path, 20 + 9 * i, 500 + i, SHARED if i in (SHARED_A, SHARED_B) else ()))
        shards.append(Shard(path))
    path = str(base / "level")
    _shardfs.write_global_index(path, [(sidecar.identity(s), _shardfs.key_prefixes(s)) for s in shards])
    g = _shardfs.GlobalIndex(path)
    numbers = array.array("q", [100 + i for i in range(SHARDS)])
    yield shards, keys, g, numbers, base
    g.close()
    for s in shards:
        s.close()


def full_table(shards) -> OpenShards:
    table = OpenShards()
    for i, s in enumerate(shards):
        table.set(100 + i, s.reader, ("member", i))
    return table


def test_every_key_found_as_its_shard_finds_it(level):
    shards, keys, g, numbers, _ = level
    table = full_table(shards)
    assert len(table) == SHARDS
    args = ((g,), (numbers,))
    for i, ks in enumerate(keys):
        for key in ks:
            member, slot, data_offset, size = table.find(key, *args)
            holder = min(SHARED_A, i) if key in keys[SHARED_A] and key in keys[SHARED_B] else i
            assert member == ("member", holder)
            assert (slot, data_offset, size) == shards[holder].find(key)
    for n in range(200):
        assert table.find(sha(b"absent %d" % n), *args) is None
    # One probe per present key (the first candidate holds it: a shared
    # key is found in the lower shard first), none for absent ones.
    assert table.probes == sum(len(ks) for ks in keys)
    table.probes = 0
    table.find(keys[0][0], *args, count=False)
    assert table.probes == 0


def test_start_and_below_choose_among_the_shards_holding_a_key(level):
    shards, keys, g, numbers, _ = level
    table = full_table(shards)
    args = ((g,), (numbers,))
    key = sha(SHARED[0])
    assert table.find(key, *args)[0] == ("member", SHARED_A)
    assert table.find(key, *args, start=100 + SHARED_A + 1)[0] == ("member", SHARED_B)
    assert table.find(key, *args, below=100 + SHARED_B)[0] == ("member", SHARED_A)
    assert table.find(key, *args, below=100 + SHARED_A) is None
    assert table.find(key, *args, start=100 + SHARED_B + 1) is None


def test_a_candidate_not_held_is_reported_then_found_once_set(level):
    shards, keys, g, numbers, _ = level
    table = OpenShards()
    args = ((g,), (numbers,))
    key = keys[5][3]
    assert table.find(key, *args) == 105  # not held: the caller opens it
    table.set(105, shards[5].reader, "five")
    assert table.find(key, *args)[0] == "five"
    assert table.get(105) is shards[5].reader and table.get(104) is None
    # A number the map marks as not served is never a candidate.
    unserved = array.array("q", numbers)
    unserved[5] = -1
    assert table.find(key, (g,), (unserved,)) is None
    table.set(105, None)
    assert len(table) == 0 and table.find(key, *args) == 105
    # The shared key: the lower shard is held, the other is reported only
    # when the search goes past the first.
    table.set(100 + SHARED_A, shards[SHARED_A].reader, "a")
    assert table.find(sha(SHARED[1]), *args)[0] == "a"
    assert table.find(sha(SHARED[1]), *args, start=100 + SHARED_A + 1) == 100 + SHARED_B


def test_per_shard_filters_give_candidates_too(level, tmp_path):
    shards, keys, g, numbers, _ = level
    filters = _shardfs.SidecarSet()
    table = OpenShards()
    for i in (1, 2):
        sc = sidecar.load_or_build(shards[i], str(tmp_path))
        filters.set(200 + i, sc)
        table.set(200 + i, shards[i].reader, i)
    filters.set(209, None)  # no filter yet: always a candidate
    table.set(209, shards[9].reader, 9)
    for key in keys[2]:
        assert table.find(key, (), (), filters)[0] == 2
    # Through the index and the filters at once, in number order.
    assert table.find(keys[9][0], (g,), (numbers,), filters) == 109
    assert table.find(keys[9][0], (), (), filters)[0] == 9
    assert table.find(sha(b"absent"), (), (), filters) is None
    assert table.probes >= len(keys[2])


def test_touched_marks_the_shards_find_probed(level):
    shards, keys, g, numbers, _ = level
    table = full_table(shards)
    assert not table.touched(101)
    table.find(keys[1][0], (g,), (numbers,))
    assert table.touched(101) and not table.touched(101)  # cleared once asked
    assert not table.touched(102) and not table.touched(10**9)


def test_second_chance_keeps_shards_find_probed(level):
    shards, keys, g, numbers, _ = level
    table = full_table(shards)
    dropped = []
    cache = OpenCache(3, lambda n: False, touched=table.touched, dropped=dropped.append)
    for n in (100, 101, 102):
        cache.put(n, shards[n - 100])
    table.find(keys[0][0], (g,), (numbers,))  # shard 100 used without the cache
    cache.put(103, shards[3])
    assert dropped == [101] and list(cache.items) == [102, 103, 100]


def test_a_closed_reader_stays_readable_while_held(tmp_path):
    path = tmp_path / "s.shard"
    keys = build_shard(path, 30, 1)
    shard = Shard(path)
    level = str(tmp_path / "level")
    _shardfs.write_global_index(level, [(sidecar.identity(shard), _shardfs.key_prefixes(shard))])
    args = ((_shardfs.GlobalIndex(level),), (array.array("q", [0]),))
    table = OpenShards()
    table.set(0, shard.reader, "m")
    fds = len(os.listdir("/proc/self/fd"))
    shard.close()
    assert shard.closed
    with pytest.raises(ValueError):
        shard.find(keys[0])
    # The table still holds it: its mapping stays valid for find...
    assert table.find(keys[0], *args)[0] == "m"
    assert len(os.listdir("/proc/self/fd")) == fds
    # ...and the shard closes when the table lets it go.
    table.set(0, None)
    assert len(os.listdir("/proc/self/fd")) == fds - 1
    assert table.find(keys[0], *args) == 0
    with pytest.raises(ValueError):
        table.set(0, shard.reader, "m")  # closed: cannot be held again
    args[0][0].close()


def test_a_corrupt_slot_raises(tmp_path):
    path = tmp_path / "bad.shard"
    keys = build_shard(path, 40, 2)
    with Shard(path) as s:
        slot = s.find(keys[7])[0]
        index_position = s.header.index_position
        runs = [(sidecar.identity(s), _shardfs.key_prefixes(s))]
    with open(path, "r+b") as f:  # the slot's offset points past the file
        f.seek(index_position + 40 * slot + 32)
        f.write(struct.pack(">Q", 2**40))
    level = str(tmp_path / "level")
    _shardfs.write_global_index(level, runs)
    shard = Shard(path)
    table = OpenShards()
    table.set(0, shard.reader, "m")
    args = ((_shardfs.GlobalIndex(level),), (array.array("q", [0]),))
    with pytest.raises(CorruptShardError, match="outside the objects section"):
        table.find(keys[7], *args)
    assert table.find(keys[8], *args)[0] == "m"
    shard.close()


def test_a_candidate_that_cannot_be_probed_does_not_hide_another(tmp_path):
    """Shard 0's slot of a key held by shards 0 and 1 is corrupt: find
    answers from shard 1 instead of raising; a key only shard 0 holds still
    raises (no other candidate holds it)."""
    paths = [tmp_path / "a.shard", tmp_path / "b.shard"]
    for i, p in enumerate(paths):
        build_shard(p, 40, 11 + i, SHARED)
    shared = sha(SHARED[0])
    with Shard(paths[0]) as s:
        slot = s.find(shared)[0]
        index_position = s.header.index_position
    runs = []
    for p in paths:
        with Shard(p) as s:
            runs.append((sidecar.identity(s), _shardfs.key_prefixes(s)))
    with open(paths[0], "r+b") as f:  # the slot's offset points past the file
        f.seek(index_position + 40 * slot + 32)
        f.write(struct.pack(">Q", 2**40))
    level = str(tmp_path / "level")
    _shardfs.write_global_index(level, runs)
    shards = [Shard(p) for p in paths]
    table = OpenShards()
    for i, s in enumerate(shards):
        table.set(i, s.reader, "member %d" % i)
    g = _shardfs.GlobalIndex(level)
    args = ((g,), (array.array("q", [0, 1]),))
    found = table.find(shared, *args)
    assert found[0] == "member 1" and (found[2], found[3]) == shards[1].find(shared)[1:]
    with pytest.raises(CorruptShardError, match="outside the objects section"):
        table.find(shared, *args, below=1)  # shard 0 alone
    g.close()
    for s in shards:
        s.close()


def test_bad_arguments(level):
    shards, keys, g, numbers, _ = level
    table = OpenShards()
    with pytest.raises(ValueError):
        table.find(b"short", (g,), (numbers,))
    with pytest.raises(ValueError, match="differ in length"):
        table.find(keys[0][0], (g,), ())
    with pytest.raises(TypeError):
        table.find(keys[0][0], ("not a level",), (numbers,))
    with pytest.raises(TypeError):
        table.find(keys[0][0], (), (), "not a SidecarSet")
    with pytest.raises(TypeError, match="missing required argument 'maps'"):
        table.find(keys[0][0], (g,))
    with pytest.raises(TypeError, match="unexpected argument 'shard'"):
        table.find(keys[0][0], (g,), (numbers,), shard=1)
    with pytest.raises(TypeError, match="more than one value for argument 'levels'"):
        table.find(keys[0][0], (g,), (numbers,), levels=(g,))
    with pytest.raises(TypeError, match="at most 7 arguments"):
        table.find(keys[0][0], (g,), (numbers,), None, 0, -1, True, 1)
    with pytest.raises(TypeError, match="must be tuples"):
        table.find(keys[0][0], [g], (numbers,))
    # Keywords and positions name the same arguments.
    assert (table.find(key=keys[0][0], maps=(numbers,), levels=(g,), count=False, below=100)
            is None)
    assert table.find(keys[0][0], (g,), (numbers,), None, 0, -1, False) == 100
    with pytest.raises(TypeError):
        table.set(1, "not a Reader")
    with pytest.raises(ValueError):
        table.set(-1, shards[0].reader)
    with pytest.raises(TypeError):
        del table.probes
    # A number past the dense table's range is never held: reported as
    # not open, so the caller probes it itself.
    table.set(1 << 24, shards[0].reader, "far")
    assert len(table) == 0 and table.get(1 << 24) is None
    far = array.array("q", [1 << 24] + [-1] * (SHARDS - 1))
    assert table.find(keys[0][0], (g,), (far,)) == 1 << 24


def test_finds_from_threads_while_entries_change(level):
    """Threads find keys (the GIL released while they probe) while another
    sets, replaces and drops entries and closes readers: no crash, and
    every answer names a shard that holds the key."""
    shards, keys, g, numbers, base = level
    table = full_table(shards)
    args = ((g,), (numbers,))
    stop = threading.Event()
    errors = []

    def finder(seed: int) -> None:
        n = 0
        while not stop.is_set():
            i = (seed + n) % SHARDS
            key = keys[i][n % len(keys[i])]
            n += 1
            try:
                got = table.find(key, *args)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))
                return
            if isinstance(got, tuple) and key not in keys[got[0][1]]:
                errors.append(f"{key.hex()} answered from shard {got[0][1]}")

    threads = [threading.Thread(target=finder, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    opened = []
    try:
        for round_ in range(3000):
            i = round_ % SHARDS
            s = Shard(base / f"{i}.shard")
            opened.append(s)
            table.set(100 + i, s.reader, ("member", i))  # replaces the entry
            if round_ % 3 == 0:
                s.close()  # closed while held: stays readable through the table
            if round_ % 5 == 0:
                table.set(100 + (round_ * 7) % SHARDS, None)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:5]
    table.clear()
    assert len(table) == 0
    for s in opened:
        s.close()


def test_shard_set_find_uses_the_table_and_keeps_its_bound(level, tmp_path):
    """ShardSet.find over indexed shards opened on demand: every key found
    with the shard's answer, at most max_open held in the table."""
    shards, keys, _, _, base = level
    from shardfs.gindex import IndexSet, index_dir

    ss = ShardSet(cache_dir=str(tmp_path / "cache"), max_open=4)
    ss.index = IndexSet(index_dir(str(tmp_path / "cache"), "t"))
    ss.index.load()
    members = [ss.add(str(base / f"{i}.shard")) for i in range(SHARDS)]
    ss.index.add_shards(((m.identity, m.shard) for m in members), [m.identity for m in members])
    ss.reload_index()
    for i, ks in enumerate(keys):
        for key in ks:
            member, slot, data_offset, size = ss.find(key)
            holder = min(SHARED_A, i) if key in keys[SHARED_A] and key in keys[SHARED_B] else i
            assert member is members[holder]
            assert (slot, data_offset, size) == shards[holder].find(key)
            assert len(ss.open_table) <= 4 and len(ss.open_shards) <= 4
    assert ss.probes == ss.lookups == sum(len(ks) for ks in keys)
    assert ss.find(sha(b"absent")) is None and ss.probes == ss.lookups - 1
    # get_batch: each key's bytes from the shard find answers, in order.
    batch = [k for ks in keys for k in ks] + [sha(b"absent")]
    batch = batch[::-1] + batch[:3]
    want = []
    for k in batch:
        answer = ss.find(k)
        want.append(None if answer is None else shards[members.index(answer[0])].pread(
            answer[2], answer[3], 0, answer[3]))
    assert ss.get_batch(batch) == want and want.count(None) == 1
    assert ss.get_batch(k.hex() for k in batch[:5]) == want[:5]
    assert ss.get_batch([]) == []
    with pytest.raises(ValueError):
        ss.get_batch([batch[0], b"short"])
    assert len(ss.open_table) <= 4 and len(ss.open_shards) <= 4
    # A removed shard is no longer probed, even while it stays open.
    ss.remove(members[1])
    assert ss.find(keys[1][0]) is None
    ss.close()
    assert len(ss.open_table) == 0


def test_a_forgotten_entry_keeps_no_reference(level):
    """set(number, None) drops the entry whole: the garbage collector no
    longer sees its member through the table (a stale pointer there would
    be visited after the member is freed)."""
    import gc

    shards = level[0]
    table = OpenShards()

    class Member:
        pass

    member = Member()
    table.set(100, shards[0].reader, member)
    assert any(x is member for x in gc.get_referents(table))
    table.set(100, None)
    assert not any(x is member for x in gc.get_referents(table))
    table.set(100, shards[0].reader, member)
    table.set(100, shards[1].reader, "other")  # replaced: the old member is dropped too
    assert not any(x is member for x in gc.get_referents(table))
