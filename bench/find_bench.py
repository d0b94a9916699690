"""Lookups per second through ShardSet.find (the mount's lookup path, page
cache warm), present and absent keys, on one shard of 200,000 objects with
its sidecar: to compare two versions of the read path on the same machine.

    .venv/bin/python bench/find_bench.py                  # this tree
    .venv/bin/python bench/find_bench.py --tree /tmp/old  # another checkout
                                                          # (extension built in place)

Run the two alternately, a few times: this machine is shared and noisy;
quote ratios. The shard and the sidecar cache go to --tmp (default
/tmp/shardfs-find-bench), reused across runs. Prints the best of 3 passes.
"""

import argparse
import hashlib
import os
import random
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", help="import shardfs from this checkout (default: this one)")
    ap.add_argument("--tmp", default="/tmp/shardfs-find-bench", help="scratch directory")
    ap.add_argument("--objects", type=int, default=200_000)
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.tree or os.path.join(os.path.dirname(__file__), "..")))
    import shardfs
    from shardfs.fuse.shardset import ShardSet

    os.makedirs(args.tmp, exist_ok=True)
    path = os.path.join(args.tmp, f"find-{args.objects}.shard")
    if not os.path.exists(path):
        with shardfs.ShardWriter(path) as w:
            for i in range(args.objects):
                data = b"object %d" % i
                w.add(hashlib.sha256(data).digest(), data)
    shards = ShardSet(cache_dir=os.path.join(args.tmp, "cache"))
    member = shards.add(path)
    shards.build_sidecar(member)
    present = list(member.shard.keys())
    random.Random(1).shuffle(present)
    rng = random.Random(2)
    absent = [rng.randbytes(32) for _ in range(len(present))]
    print(f"shardfs from {os.path.dirname(os.path.dirname(os.path.abspath(shardfs.__file__)))}")
    for label, keys in (("present", present), ("absent", absent)):
        best = 0.0
        for _ in range(3):
            start = time.perf_counter()
            for key in keys:
                shards.find(key)  # what a mount's LOOKUP calls
            best = max(best, len(keys) / (time.perf_counter() - start))
        print(f"  ShardSet.find {label:7s} {best:12,.0f}/s")
    shards.close()


if __name__ == "__main__":
    main()
