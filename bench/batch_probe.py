"""Batch probe: ``Shard.get_batch`` against ``shard[key]`` one key at a
time, page cache warm, for one object size and one batch length, so that
the reasons behind lookup_bench's get_batch figures can be checked:

* small objects (``--min 1 --max 4096``): get_batch runs at the speed of
  the C API's one-key loop, bound by copying the bytes out
  (``perf record`` on this script shows ``memmove`` on top);
* 64 KiB objects (``--min 65536 --max 65536``): a batch's objects are all
  alive at once, so long batches write their memory outside the CPU cache
  (compare ``--batch 16`` and ``--batch 1000``).

Prints lookups per second (lookup + read of the whole object, keys in a
fixed random order), best of ``--passes``. Example:
``.venv/bin/python bench/batch_probe.py --min 65536 --max 65536 --count 2000 --batch 16``
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_bench import make_objects, random_pool  # noqa: E402

import shardfs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000, help="objects in the shard")
    ap.add_argument("--min", type=int, default=1, help="smallest object, bytes")
    ap.add_argument("--max", type=int, default=4096, help="largest object, bytes")
    ap.add_argument("--batch", type=int, default=1000, help="keys per get_batch call")
    ap.add_argument("--lookups", type=int, default=100_000, help="lookups per pass")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--tmp", default=None, help="directory for the shard (default $TMPDIR)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        path = os.path.join(tmp, "probe.shard")
        keys, datas = make_objects(args.count, args.min, args.max, pool=random_pool())
        with shardfs.ShardWriter(path) as w:
            for k, d in zip(keys, datas):
                w.add(k, d)
        del datas
        rng = random.Random(1)
        order = [rng.choice(keys) for _ in range(args.lookups)]
        with shardfs.Shard(path) as s:
            for k in order:  # warm: the page cache and the mapping's page tables
                s[k]

            def one() -> None:
                for k in order:
                    s[k]

            def batched() -> None:
                for i in range(0, len(order), args.batch):
                    s.get_batch(order[i:i + args.batch])

            for name, run in (("shard[key]", one), (f"get_batch({args.batch})", batched)):
                best = 0.0
                for _ in range(args.passes):
                    t = time.perf_counter()
                    run()
                    best = max(best, len(order) / (time.perf_counter() - t))
                print(f"{name:>18}: {best:12,.0f} lookups/s  ({args.count:,} objects of "
                      f"{args.min}..{args.max} B, best of {args.passes} passes of {len(order):,})")


if __name__ == "__main__":
    main()
