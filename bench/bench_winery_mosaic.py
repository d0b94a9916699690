"""winery over MOSAIC pools: bench_winery.py on a deployment whose shards
pool is swh's `mosaic` type, zstd level 3 then uncompressed (results:
winery-mosaic.md, winery-mosaic-raw.md). Goal (issue 31): the shardfs
objstorage's get >= 5x swh-objstorage's winery get on the same deployment,
cold and warm; the Python API and the mount beside it."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_winery  # noqa: E402

READERS = "winery-get,api-get,api-batch,mount-read,mount-read-4,os-shardfs,os-shardfs-batch"


def main() -> int:
    args = sys.argv[1:]
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        print("Options: those of bench_winery.py but --pool and --only.")
        return 0
    for pool in ("mosaic", "mosaic-raw"):
        bench_winery.main([*args, "--pool", pool, "--only", READERS])
    return 0


if __name__ == "__main__":
    sys.exit(main())
