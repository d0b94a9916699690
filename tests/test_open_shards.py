"""OpenShards: the open shards of a set by shard number, and the C
resolver's `find` over them (`shardfs._shardfs.Resolver`, built from the
table, the global index levels and the per-shard filters that give the
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
from shardfs.shardset import OpenCache, ShardSet, SnapshotState

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


#: Shard numbers below this are served (the states `find` gives the resolver).
SERVED = 300


class Probes:
    """Index probes counted over `find` calls."""

    def __init__(self) -> None:
        self.count = 0


def find(table, key, levels, maps, filters=None, start=0, below=-1, count=True, probes=None,
         members=lambda number: ("member", number - 100)):
    """`key` looked up by the C resolver over `table` (an OpenShards), the
    index `levels` with their `maps` and the `filters`, among shard numbers
    [start, below): (member of the shard holding it, slot, data_offset,
    size), None, or the number of the first candidate the table does not
    hold (as ShardSet.find sees it). Every number a map or the filters name
    is served. Raises CorruptShardError or OSError as ShardSet.find."""
    numbers = [n for m in maps for n in m if n >= 0]
    states = array.array("q", [0]) * (max(numbers + [SERVED - 1]) + 1)
    resolver = _shardfs.Resolver(SnapshotState(table, filters, levels, maps, states))
    code, value = resolver.find(key, start, below)
    if code == _shardfs.RESOLVE_OPEN:
        return value
    if code == _shardfs.RESOLVE_FAILED:
        if value[2]:
            raise CorruptShardError(value[1])
        raise OSError(value[1])
    if probes is not None and count:
        probes.count += value[5] if code == _shardfs.RESOLVE_FOUND else value
    if code != _shardfs.RESOLVE_FOUND:
        return None
    ino, size, _, number, offset, _ = value
    return (members(number), ino & 0xFFFFFFFF, offset, size)


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
    probes = Probes()
    for i, ks in enumerate(keys):
        for key in ks:
            member, slot, data_offset, size = find(table, key, *args, probes=probes)
            holder = min(SHARED_A, i) if key in keys[SHARED_A] and key in keys[SHARED_B] else i
            assert member == ("member", holder)
            assert (slot, data_offset, size) == shards[holder].find(key)
    for n in range(200):
        assert find(table, sha(b"absent %d" % n), *args, probes=probes) is None
    # One probe per present key (the first candidate holds it: a shared
    # key is found in the lower shard first), none for absent ones.
    assert probes.count == sum(len(ks) for ks in keys)
    probes.count = 0
    find(table, keys[0][0], *args, count=False, probes=probes)
    assert probes.count == 0


def test_start_and_below_choose_among_the_shards_holding_a_key(level):
    shards, keys, g, numbers, _ = level
    table = full_table(shards)
    args = ((g,), (numbers,))
    key = sha(SHARED[0])
    assert find(table, key, *args)[0] == ("member", SHARED_A)
    assert find(table, key, *args, start=100 + SHARED_A + 1)[0] == ("member", SHARED_B)
    assert find(table, key, *args, below=100 + SHARED_B)[0] == ("member", SHARED_A)
    assert find(table, key, *args, below=100 + SHARED_A) is None
    assert find(table, key, *args, start=100 + SHARED_B + 1) is None


def test_a_candidate_not_held_is_reported_then_found_once_set(level):
    shards, keys, g, numbers, _ = level
    table = OpenShards()
    args = ((g,), (numbers,))
    key = keys[5][3]
    assert find(table, key, *args) == 105  # not held: the caller opens it
    table.set(105, shards[5].reader, "five")
    assert find(table, key, *args)[0] == ("member", 5)
    assert table.get(105) is shards[5].reader and table.get(104) is None
    # A number the map marks as not served is never a candidate.
    unserved = array.array("q", numbers)
    unserved[5] = -1
    assert find(table, key, (g,), (unserved,)) is None
    table.set(105, None)
    assert len(table) == 0 and find(table, key, *args) == 105
    # The shared key: the lower shard is held, the other is reported only
    # when the search goes past the first.
    table.set(100 + SHARED_A, shards[SHARED_A].reader, "a")
    assert find(table, sha(SHARED[1]), *args)[0] == ("member", SHARED_A)
    assert find(table, sha(SHARED[1]), *args, start=100 + SHARED_A + 1) == 100 + SHARED_B


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
    probes = Probes()
    by_number = lambda number: number - 200  # noqa: E731
    for key in keys[2]:
        assert find(table, key, (), (), filters, probes=probes, members=by_number)[0] == 2
    # Through the index and the filters at once, in number order.
    assert find(table, keys[9][0], (g,), (numbers,), filters) == 109
    assert find(table, keys[9][0], (), (), filters, members=by_number)[0] == 9
    assert find(table, sha(b"absent"), (), (), filters) is None
    assert probes.count >= len(keys[2])


def test_touched_marks_the_shards_find_probed(level):
    shards, keys, g, numbers, _ = level
    table = full_table(shards)
    assert not table.touched(101)
    find(table, keys[1][0], (g,), (numbers,))
    assert table.touched(101) and not table.touched(101)  # cleared once asked
    assert not table.touched(102) and not table.touched(10**9)


def test_second_chance_keeps_shards_find_probed(level):
    shards, keys, g, numbers, _ = level
    table = full_table(shards)
    dropped = []
    cache = OpenCache(3, lambda n: False, touched=table.touched, dropped=dropped.append)
    for n in (100, 101, 102):
        cache.put(n, shards[n - 100])
    find(table, keys[0][0], (g,), (numbers,))  # shard 100 used without the cache
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
    assert find(table, keys[0], *args, members=str)[0] == "0"
    assert len(os.listdir("/proc/self/fd")) == fds
    # ...and the shard closes when the table lets it go.
    table.set(0, None)
    assert len(os.listdir("/proc/self/fd")) == fds - 1
    assert find(table, keys[0], *args) == 0
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
        find(table, keys[7], *args)
    assert find(table, keys[8], *args, members=str)[0] == "0"
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
    found = find(table, shared, *args, members=lambda n: "member %d" % n)
    assert found[0] == "member 1" and (found[2], found[3]) == shards[1].find(shared)[1:]
    with pytest.raises(CorruptShardError, match="outside the objects section"):
        find(table, shared, *args, below=1)  # shard 0 alone
    g.close()
    for s in shards:
        s.close()


def test_bad_arguments(level):
    shards, keys, g, numbers, _ = level
    table = OpenShards()
    states = array.array("q", [0]) * SERVED

    def resolver(levels=(g,), maps=(numbers,), filters=None, **more):
        return _shardfs.Resolver(SnapshotState(table, filters, levels, maps, states, **more))

    with pytest.raises(ValueError):
        resolver().find(b"short")
    with pytest.raises(TypeError, match="one length"):
        resolver(maps=())
    with pytest.raises(TypeError):
        resolver(levels=("not a level",))
    with pytest.raises(TypeError):
        resolver(filters="not a SidecarSet")
    with pytest.raises(TypeError, match="open_shards must be an OpenShards"):
        _shardfs.Resolver(SnapshotState("not a table", None, (g,), (numbers,), states))
    with pytest.raises(AttributeError):
        _shardfs.Resolver((table, None, (g,)))
    with pytest.raises(TypeError, match="levels, maps"):
        resolver(levels=[g])
    with pytest.raises(ValueError, match="prefix lengths"):
        resolver(prefix_lengths=(3, 2))
    # start and below by position.
    assert resolver().find(keys[0][0], 0, 100) == (_shardfs.RESOLVE_ABSENT, 0)
    assert resolver().find(keys[0][0], 0, -1) == (_shardfs.RESOLVE_OPEN, 100)
    with pytest.raises(TypeError):
        table.set(1, "not a Reader")
    with pytest.raises(ValueError):
        table.set(-1, shards[0].reader)
    # A number past the dense table's range is never held: a resolver
    # reports it as not open, so the caller probes it itself.
    table.set(1 << 24, shards[0].reader, "far")
    assert len(table) == 0 and table.get(1 << 24) is None


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
                got = find(table, key, *args)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))
                return
            if isinstance(got, tuple) and key not in keys[got[0][1]]:  # members ("member", i)
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


def test_the_entry_just_put_is_never_dropped():
    """When every other entry was used since the cache last looked (each
    gets its second chance), the entry just put is not the one dropped:
    the caller opened it to use it now (a resolver asks it next)."""
    marks = {1, 2}
    dropped = []
    cache = OpenCache(2, lambda n: False, touched=lambda n: n in marks and not marks.discard(n),
                      dropped=dropped.append)
    cache.put(1, "one")
    cache.put(2, "two")
    cache.put(3, "three")
    assert 3 in cache.items and dropped == [1] and len(cache) == 2
