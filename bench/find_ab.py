"""ShardSet.find of the code on PYTHONPATH: the same 1,000,000 objects as
1, 1,000 and 10,000 shards (index_bench's datasets), with the global index,
200,000 random present keys and 200,000 random absent keys, best of 5
passes, the shard counts interleaved. For before/after figures of a change
to the lookup path, run it alternately on two commits in one session:

    git worktree add /tmp/before <commit>
    (cd /tmp/before && "$OLDPWD/.venv/bin/python" setup.py -q build_ext --inplace)
    for i in 1 2; do
        PYTHONPATH=/tmp/before .venv/bin/python bench/find_ab.py
        PYTHONPATH=$PWD .venv/bin/python bench/find_ab.py
    done

Prints lookups per second and the ratio to one shard. Datasets are built
(once, under bench/data/) by ``bench/index_bench.py``'s code if missing.
"""

import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import index_bench as ib  # noqa: E402  (same directory)

import shardfs  # noqa: E402  (after sys.path)

SPLITS = (1, 1_000, 10_000)
KEYS = 200_000
PASSES = 5


def main() -> None:
    objs = ib.Objects(1_000_000)
    rng = random.Random(5)
    present = [objs.key(rng.randrange(objs.count)) for _ in range(KEYS)]
    other = random.Random(6)
    absent = [other.randbytes(32) for _ in range(KEYS)]
    dirs = ib.dataset_dirs(ib.DATA_DIR, objs.count, SPLITS, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory() as tmp:
        sets = {n: ib.open_set("index", n, dirs[n], os.path.join(tmp, f"c{n}"), objs, [])[0] for n in SPLITS}
        rates = {}
        for _ in range(PASSES):
            for n, ss in sets.items():
                for kind, keys in (("present", present), ("absent", absent)):
                    t = time.perf_counter()
                    for k in keys:
                        ss.find(k)
                    rates.setdefault((n, kind), []).append(len(keys) / (time.perf_counter() - t))
        for ss in sets.values():
            ib.close_set(ss)
    print(f"code: {os.path.dirname(shardfs.__file__)}")
    for (n, kind), rs in sorted(rates.items()):
        print(f"{n:7,} shards {kind:7} {max(rs):12,.0f}/s ({max(rs) / max(rates[(1, kind)]):.2f}x one shard)")


if __name__ == "__main__":
    main()
