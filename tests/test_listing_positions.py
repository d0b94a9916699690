"""Listing positions: the offsets the kernel hands back to READDIR.

The C request path does not parse a READDIR's offset: ll_readdirplus
(shardfs/c/py_ll_ops.c) hands the kernel's offset to the handlers as it is,
and the positions of a listing are computed in Python
(shardfs/fuse/handlers.py): flat root (shard number << 32 | slot) + 1,
fan-out children their child number + 1, leaf objects `_leaf_position` of
their key + 1, resumed with `_after`. So these are property tests of those
functions (hypothesis), not a libFuzzer harness (tests/fuzz/README.md):
any offset a process can make the kernel send (lseek or seekdir on a
directory: [0, 2^63)) lists exactly the entries after it, and the positions
the handlers give fit an offset (signed 64-bit, above 0).
"""

from __future__ import annotations

import pytest
from mounting import build_shard, make_blobs, prefixed_blobs

shardfs = pytest.importorskip("shardfs")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from shardfs.fuse.handlers import DB_LISTING_BASE, LEAF_POSITION_BITS, _after, _leaf_position  # noqa: E402
from shardfs.fuse.layout import OBJECT_SHIFT, SLOT_MASK, Layout, object_inode  # noqa: E402

OFF_MAX = (1 << 63) - 1
#: Shard numbers whose object inodes leave bit 62 (database objects) clear.
MAX_NUMBER = (1 << 30) - 2

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

keys = st.binary(min_size=32, max_size=32)
# the bits a leaf spells: 4 per hex digit, 1..7 digits (ll_names.h)
leaf_bits = st.integers(1, 7).map(lambda n: 4 * n)
offsets = st.one_of(
    st.integers(0, OFF_MAX),
    st.sampled_from([0, 1, 2, SLOT_MASK, 1 << 32, (1 << 32) + 1, DB_LISTING_BASE - 1, DB_LISTING_BASE,
                     DB_LISTING_BASE + 1, OFF_MAX]),
    st.integers(0, 1 << 40),
)


@SETTINGS
@given(key=keys, nbits=leaf_bits)
def test_leaf_position_fits_an_offset(key, nbits):
    pos = _leaf_position(key, nbits)
    assert 0 <= pos < 1 << LEAF_POSITION_BITS
    next_id = pos + 1
    assert 0 < next_id <= OFF_MAX  # a readdir offset: signed 64-bit, above 0
    # the LEAF_POSITION_BITS bits after the leaf's prefix, nothing else
    bits = int.from_bytes(key, "big")
    assert pos == (bits >> (256 - nbits - LEAF_POSITION_BITS)) & ((1 << LEAF_POSITION_BITS) - 1)


@SETTINGS
@given(prefix=st.integers(0, (1 << 28) - 1), nbits=leaf_bits, rest=st.lists(keys, min_size=2, max_size=40))
def test_keys_of_a_leaf_sort_as_their_positions(prefix, nbits, rest):
    """Keys of one leaf (their first nbits the same) in key order have
    positions in order: a listing resumed at a key's position goes on with
    the keys after it."""
    prefix &= (1 << nbits) - 1
    leaf = [((prefix << (256 - nbits)) | (int.from_bytes(k, "big") >> nbits)).to_bytes(32, "big")
            for k in rest]
    leaf.sort()
    positions = [_leaf_position(k, nbits) for k in leaf]
    assert positions == sorted(positions)


def _entries(positions):
    return [(p, b"name", 0, False, 0, 0) for p in positions]


@SETTINGS
@given(positions=st.lists(st.integers(1, OFF_MAX), max_size=60, unique=True), offset=offsets)
def test_after_splits_at_any_offset(positions, offset):
    """_after(entries, offset): the entries at or before the offset, then
    those after it, for any offset the kernel can hand back."""
    entries = _entries(sorted(positions))
    i = _after(entries, offset)
    assert 0 <= i <= len(entries)
    assert all(e[0] <= offset for e in entries[:i])
    assert all(e[0] > offset for e in entries[i:])


@SETTINGS
@given(positions=st.lists(st.integers(1, OFF_MAX), min_size=1, max_size=60, unique=True),
       rooms=st.lists(st.integers(1, 7), min_size=1, max_size=60))
def test_a_listing_resumed_anywhere_lists_each_entry_once(positions, rooms):
    """READDIRs of a few entries each (the kernel's buffer full after
    `room`), each resumed from the next_id of the last entry taken: every
    entry once, in order."""
    entries = _entries(sorted(positions))
    listed, offset = [], 0
    for room in rooms * (len(entries) + 1):
        batch = entries[_after(entries, offset):][:room]
        if not batch:
            break
        listed += batch
        offset = batch[-1][0]
    assert listed == entries


@SETTINGS
@given(number=st.integers(0, MAX_NUMBER), slot=st.integers(0, SLOT_MASK))
def test_flat_positions_resume_at_the_next_slot(number, slot):
    """A flat root's entry (shard number, slot) has next_id (number << 32 |
    slot) + 1, below the positions of a winery database's objects; the
    handlers split it into the next slot of the same shard, or slot 0 of
    the next shard after the last slot."""
    pos = (number << OBJECT_SHIFT) | slot
    next_id = pos + 1
    assert 0 < next_id < DB_LISTING_BASE
    # an entry's position is its inode less one shard: in the same order
    assert pos == object_inode(number, slot) - (1 << OBJECT_SHIFT)
    n, s = next_id >> OBJECT_SHIFT, next_id & SLOT_MASK
    assert (n, s) == ((number, slot + 1) if slot < SLOT_MASK else (number + 1, 0))


@SETTINGS
@given(widths=st.lists(st.integers(1, 7), min_size=1, max_size=7).filter(lambda w: sum(w) <= 7),
       data=st.data())
def test_fanout_child_positions_sort_as_their_names(widths, data):
    """A fan-out directory's children have position child + 1 (at most
    16^7: an offset); their names sort as their positions."""
    layout = Layout(tuple(widths))
    depth = data.draw(st.integers(0, layout.depth - 1))
    width = layout.widths[depth]
    prefix = data.draw(st.integers(0, 16 ** layout.prefix_len(depth) - 1))
    a, b = sorted(data.draw(st.lists(st.integers(prefix << (4 * width), ((prefix + 1) << (4 * width)) - 1),
                                     min_size=2, max_size=2, unique=True)))
    assert 0 < a + 1 < b + 1 <= 16 ** 7
    assert layout.child_name(depth + 1, a) < layout.child_name(depth + 1, b)


# ------------------------------------------------ the handlers, any offset

class Reply:
    """A DirBuffer that takes every entry."""

    def __init__(self) -> None:
        self.entries = []

    def add(self, name, ino, is_dir, size, time_ns, next_id) -> bool:
        assert 0 < next_id <= OFF_MAX
        self.entries.append((name, ino, is_dir, next_id))
        return True


def _list(fs, inode, offset):
    reply = Reply()
    fs.readdir(inode, offset, reply)
    return reply.entries


@pytest.fixture(scope="module")
def mounts(tmp_path_factory):
    """Two shards (the second repeating some keys of the first) served
    flat and in the fan-out layout 0:1/1:2: {name: (ShardFS, [inodes])}."""
    from shardfs.fuse.handlers import ShardFS
    from shardfs.shardset import ShardSet

    tmp = tmp_path_factory.mktemp("positions")
    a = prefixed_blobs("5e", 12, b"a") + make_blobs(11, 60, 1, 200, tag=b"positions-a")
    b = a[:10] + prefixed_blobs("5e", 5, b"b") + make_blobs(12, 40, 1, 200, tag=b"positions-b")
    build_shard(tmp / "a.shard", a)
    other = min(k for k in build_shard(tmp / "b.shard", b) if not k.startswith("5e"))
    out, sets = {}, []
    for name, layout, inodes in [
            ("flat", Layout.flat(), lambda layout: [1]),
            ("fanout", Layout.fanout("0:1/1:2"),
             lambda layout: [1, layout.dir_inode(1, 5), layout.dir_inode(2, 0x5e),
                             layout.dir_inode(2, int(other[:2], 16))])]:
        shards = ShardSet(cache_dir=str(tmp / f"cache-{name}"))
        shards.add(str(tmp / "a.shard"))
        shards.add(str(tmp / "b.shard"))
        sets.append(shards)
        out[name] = (ShardFS(shards, layout=layout), inodes(layout))
    yield out
    for fs, _ in out.values():
        fs.close()
    for shards in sets:
        shards.close()


@pytest.mark.parametrize("name", ["flat", "fanout"])
def test_listings_have_positions_in_order(mounts, name):
    fs, inodes = mounts[name]
    for inode in inodes:
        full = _list(fs, inode, 0)
        assert full, f"directory {inode} lists nothing"
        positions = [e[3] for e in full]
        assert positions == sorted(set(positions))
    if name == "flat":  # both shards, the second after the first
        assert {e[3] >> OBJECT_SHIFT for e in _list(fs, 1, 0)} == {0, 1}


@pytest.mark.parametrize("name", ["flat", "fanout"])
@SETTINGS
@given(data=st.data())
def test_a_readdir_at_any_offset_lists_the_entries_after_it(mounts, name, data):
    """READDIR of any directory at any offset the kernel can hand back
    (from seekdir, or a listing's own positions +- 1) lists exactly the
    entries whose next_id is above the offset, in order, and raises
    nothing."""
    fs, inodes = mounts[name]
    inode = data.draw(st.sampled_from(inodes))
    full = _list(fs, inode, 0)
    near = [e[3] + d for e in full for d in (-1, 0, 1)]
    offset = data.draw(st.one_of(offsets, st.sampled_from(near)))
    offset = min(max(offset, 0), OFF_MAX)
    assert _list(fs, inode, offset) == [e for e in full if e[3] > offset]
