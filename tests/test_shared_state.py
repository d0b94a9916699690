"""The memory a mount's processes share (shardfs.fuse.shared), without a
mount: the counters of a worker's row stay exact when the C request path
and the Python handlers count at the same time.

The C request path of a worker counts its lookups, index probes and hash
probes with relaxed atomic adds (shardfs/c/ll_fast.c), from every thread
serving, in the words worker.py gives it; the Python handlers
(`WorkerHooks.end`, one request at a time) add what the shard set counted.
Here a small C library compiled for the test does the C side's adds, the
same instructions on the same words, from threads that do not hold the GIL,
while this thread calls `WorkerHooks.end` many thousand times; then the
totals read through `SharedState` must be every add of both.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
import types
from pathlib import Path

import pytest

pytest.importorskip("shardfs")

from shardfs.fuse.shared import HASH_PROBES, LOOKUPS, SharedState  # noqa: E402
from shardfs.fuse.layout import Layout  # noqa: E402
from shardfs.fuse.worker import WorkerHooks  # noqa: E402

#: What ll_fast.c does for each lookup it answers: stats[0] lookups,
#: stats[1] index probes, stats[4] hash index probes (relaxed atomics),
#: here in a loop until *stop is set; returns the rounds made.
COUNTER_C = r"""
#include <stdint.h>
int64_t count_until(int64_t *stats, const int *stop, int *started)
{
    int64_t n = 0;
    __atomic_store_n(started, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
        __atomic_fetch_add(&stats[0], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&stats[1], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&stats[4], 1, __ATOMIC_RELAXED);
        n++;
    }
    return n;
}
"""


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    d = tmp_path_factory.mktemp("counter")
    (d / "counter.c").write_text(COUNTER_C)
    cc = os.environ.get("CC", "gcc")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(d / "counter.so"), str(d / "counter.c")], check=True)
    lib = ctypes.CDLL(str(d / "counter.so"))  # calls release the GIL
    lib.count_until.restype = ctypes.c_int64
    lib.count_until.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def test_counts_of_c_and_python_in_one_row_are_all_kept(counter):
    """Two C threads count into worker 1's row (the words worker.py gives
    the C request path) while this thread runs the worker's end-of-request
    hook 200,000 times, each after the shard set counted one lookup, two
    index probes and one hash probe. The mount's totals must hold every
    count of both: a read-modify-write of a word the C side adds to loses
    the adds that land between its read and its write."""
    state = SharedState(3)
    position, rounds = 1, 200_000
    row = state.row(position)
    shards = types.SimpleNamespace(lookups=0, probes=0, hashes=types.SimpleNamespace(probes=0))
    hooks = WorkerHooks(shards, state, position, coordinator=os.getpid())
    hooks.start()
    words = state.words[row + LOOKUPS:row + HASH_PROBES + 1]  # as worker.run gives it to Session.serve
    stats = (ctypes.c_int64 * len(words)).from_buffer(words)
    stop = ctypes.c_int(0)
    started = [ctypes.c_int(0) for _ in range(2)]
    done = [0, 0]

    def c_thread(i: int) -> None:
        done[i] = counter.count_until(ctypes.addressof(stats), ctypes.addressof(stop),
                                      ctypes.addressof(started[i]))

    threads = [threading.Thread(target=c_thread, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        while not all(s.value for s in started):
            pass
        for _ in range(rounds):
            shards.lookups += 1
            shards.probes += 2
            shards.hashes.probes += 1
            hooks.end()
    finally:
        stop.value = 1
        for t in threads:
            t.join()
    c_rounds = sum(done)
    assert c_rounds > 0
    lookups, probes = state.lookups()
    assert (lookups - c_rounds - rounds, probes - c_rounds - 2 * rounds) == (0, 0), \
        f"counts lost: {c_rounds + rounds - lookups} lookups, {c_rounds + 2 * rounds - probes} probes " \
        f"of {c_rounds} C rounds and {rounds} Python ones"
    assert state.hash_probes() == c_rounds + rounds
    del stats
    words.release()
    state.close()


def _members(shards) -> dict:
    """What a worker's set knows of each shard, by number."""
    return {n: (m.path, m.removed, m.sidecar_dir, m.live_count, m.objects_count, m.source)
            for n, m in sorted(shards.shards.items())}


def test_a_worker_that_applied_the_table_before_reads_only_the_change(tmp_path, monkeypatch):
    """The coordinator's table (its own `Coordinator.table`) published
    twice: a worker at the first reads, for the second, only the entries
    added or changed and the numbers gone, and ends with the set a worker
    that read the whole second table has; a worker further behind reads
    the whole table."""
    from mounting import build_shard, make_blobs
    from shardfs.fuse import shared
    from shardfs.fuse.coordinator import Coordinator
    from shardfs.fuse.worker import apply_table
    from shardfs.shardset import ShardSet

    paths = []
    for i in range(6):
        paths.append(str(tmp_path / f"s{i}.shard"))
        build_shard(Path(paths[-1]), make_blobs(40 + i, 5))
    coordinator = ShardSet(cache_dir=str(tmp_path / "cache"))
    members = [coordinator.add(p) for p in paths[:5]]
    state = SharedState(1)
    # the coordinator's own table and publication
    ns = types.SimpleNamespace(shards=coordinator, catalog=None, state=state, pid=os.getpid(),
                               fs=types.SimpleNamespace(layout=Layout.flat()))
    ns.table = lambda: Coordinator.table(ns)
    table = ns.table
    publish = lambda: Coordinator._publish(ns)  # noqa: E731
    first = publish()
    worker = ShardSet(cache_dir=str(tmp_path / "cache"))
    seq, whole, change = state.read_change(-1)
    assert (seq, change) == (first, False) and len(whole["shards"]) == 5
    apply_table(worker, whole, os.getpid(), change=change)

    added = coordinator.add(paths[5])
    coordinator.discard(members[1])
    members[2].live_count = 4  # as when its sidecar is read
    second = publish()
    seq, delta, change = state.read_change(first)
    assert (seq, change) == (second, True)
    assert sorted(e["number"] for e in delta["shards"]) == [members[2].number, added.number]
    assert delta["gone"] == [members[1].number]
    apply_table(worker, delta, os.getpid(), change=True)

    fresh = ShardSet(cache_dir=str(tmp_path / "cache"))
    seq, whole, change = state.read_change(first - 2)  # behind by more than one table
    assert (seq, change) == (second, False) and len(whole["shards"]) == 5
    apply_table(fresh, whole, os.getpid())
    assert _members(worker) == _members(fresh) and len(_members(worker)) == 5
    third = publish()  # nothing changed: an empty change
    rest = {key: value for key, value in table().items() if key != "shards"}  # pid, next, layout
    assert state.read_change(second)[1:] == ({"shards": [], "gone": [], **rest}, True) and third == second + 2

    # A table that fits, with no room for its change beside it: read whole.
    coordinator.discard(added)
    size = len(json.dumps(table(), separators=(",", ":")))
    monkeypatch.setattr(shared, "TABLE_BYTES", size + 10)
    fourth = state.publish(table())
    seq, whole, change = state.read_change(third)
    assert (seq, change) == (fourth, False) and len(whole["shards"]) == 4
    for shards in (coordinator, worker, fresh):
        shards.close()


def test_a_coordinator_killed_while_publishing_leaves_the_table_before(tmp_path):
    """The state lives in a memory file another process attaches to (a
    coordinator taking over: `SharedState.attach`); a publication cut off
    half way (the sequence left odd, the region being written garbage)
    leaves the table before it readable whole (`read_last`), and the next
    publication makes the sequence even again, with the change from the
    table taken over."""
    from shardfs.fuse import shared

    state = shared.SharedState(2)
    first = state.publish({"shards": [{"number": 0, "path": "/a"}, {"number": 1, "path": "/b"}], "next": 2})
    # What a publication killed after its first bytes leaves behind:
    state.words[shared.SEQ] = first + 1
    other = state._regions[1 - state.words[shared._ACTIVE]]
    state.mm[other:other + 15] = b"{garbage, torn "
    attached = shared.SharedState.attach(os.dup(state.fd))
    seq, table = attached.read_last()
    assert seq == first + 1 and table["shards"][1]["path"] == "/b" and table["next"] == 2
    attached.take_over(table)
    second = attached.publish({"shards": [{"number": 0, "path": "/a"}, {"number": 2, "path": "/c"}], "next": 3})
    assert second == first + 2 and second % 2 == 0
    # a worker that applied the first table reads the change alone
    seq, change, is_change = state.read_change(first)
    assert (seq, is_change) == (second, True)
    assert [e["number"] for e in change["shards"]] == [2] and change["gone"] == [1]
    # a state of another layout version is refused
    state.words[shared.VERSION] = shared.STATE_VERSION + 1
    with pytest.raises(ValueError, match="version"):
        shared.SharedState.attach(os.dup(state.fd))
    attached.close()
    state.close()
