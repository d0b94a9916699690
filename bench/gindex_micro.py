"""Micro-benchmarks of the global index (docs/scale.md): writing and
merging levels, and ShardSet.find over N shards with the index and with
the per-shard sidecar filters only, in one run.

    .venv/bin/python bench/gindex_micro.py            # 1 shard of 100,000 objects, 1,000 of 100

Files go to /dev/shm (removed at the end); figures are printed.
"""

import array
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardfs import ShardWriter  # noqa: E402
from shardfs._shardfs import GlobalIndex, merge_global_index, write_global_index  # noqa: E402
from shardfs.fuse.shardset import ShardSet  # noqa: E402
from shardfs.gindex import IndexSet, index_dir  # noqa: E402


def levels(base: str) -> None:
    rnd = random.Random(1)
    made = []
    for nshards, per in ((10, 200_000), (1000, 2000)):
        runs = [(rnd.randbytes(32), array.array("Q", sorted({rnd.getrandbits(40) for _ in range(per)})).tobytes())
                for _ in range(nshards)]
        path = os.path.join(base, f"w{nshards}.gidx")
        t = time.perf_counter()
        write_global_index(path, runs)
        took = time.perf_counter() - t
        n = GlobalIndex(path).count
        made.append(path)
        print(f"write a level of {n:,} entries from {nshards} shards: {took:.2f} s "
              f"({n / took / 1e6:.1f} M entries/s), {os.path.getsize(path) / n:.3f} bytes/entry")
    a, b = GlobalIndex(made[0]), GlobalIndex(made[1])
    path = os.path.join(base, "merged.gidx")
    t = time.perf_counter()
    merge_global_index(path, [a, b])
    took = time.perf_counter() - t
    n = GlobalIndex(path).count
    print(f"merge levels of {a.count:,} and {b.count:,} entries: {took:.2f} s ({n / took / 1e6:.1f} M entries/s)")


def finds(base: str, nshards: int, per: int) -> None:
    keys, paths = [], []
    for i in range(nshards):
        p = os.path.join(base, f"n{nshards}-{i}.shard")
        paths.append(p)
        with ShardWriter(p) as w:
            for j in range(per):
                data = b"%d-%d" % (i, j)
                k = hashlib.sha256(data).digest()
                w.add(k, data)
                keys.append(k)
    rnd = random.Random(1)
    present = [rnd.choice(keys) for _ in range(50_000)]
    absent = [rnd.randbytes(32) for _ in range(50_000)]
    for use_index in (True, False):
        cache = tempfile.mkdtemp(dir=base)
        shards = ShardSet(cache_dir=cache)
        if use_index:
            shards.index = IndexSet(index_dir(cache, "bench"))
            shards.index.load()
        for p in paths:
            shards.add(p)
        for m in shards.served():
            shards.build_sidecar(m)
        if use_index:
            shards.index.add_shards([(m.identity, m.shard) for m in shards.served()],
                                    [m.identity for m in shards.served()])
            shards.reload_index()
        rates = []
        for sample in (present, absent):
            t = time.perf_counter()
            for k in sample:
                shards.find(k)
            rates.append(len(sample) / (time.perf_counter() - t))
        print(f"ShardSet.find, {nshards:,} shard(s) of {per:,} objects, "
              f"{'global index' if use_index else 'sidecar filters only'}: "
              f"present {rates[0]:,.0f}/s, absent {rates[1]:,.0f}/s")
        shards.close()


def main() -> None:
    base = tempfile.mkdtemp(prefix="gindex-micro-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        levels(base)
        finds(base, 1, 100_000)
        finds(base, 1000, 100)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
