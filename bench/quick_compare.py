"""Quick figures for the README: build time against cp, lookups against swh-shard.

1. Writes N files of 1 B .. 4 KiB (seeded, from a random pool) under a
   temporary directory, times `shardfs create` over them and `cp` of the
   resulting shard (page cache warm for both, same disk).
2. Lookup+read per second of every key in random order, through
   shardfs.Shard (1 and 2 threads) and swh.shard.Shard, on the same shard.

    python bench/quick_compare.py [N]      (default 100000)
"""
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(n):
    import shardfs
    from swh.shard import Shard as SwhShard

    rnd = random.Random(1)
    pool = rnd.randbytes(1 << 22)
    tmp = tempfile.mkdtemp(prefix="shardfs-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        src = os.path.join(tmp, "src")
        for d in range(256):
            os.makedirs(os.path.join(src, f"{d:02x}"))
        keys = []
        for i in range(n):
            size = rnd.randint(1, 4096)
            off = rnd.randrange(len(pool) - size)
            data = pool[off:off + size]
            with open(os.path.join(src, f"{i % 256:02x}", str(i)), "wb") as f:
                f.write(data)
            keys.append(hashlib.sha256(data).digest())
        shard = os.path.join(tmp, "bench.shard")
        cli = os.path.join(os.path.dirname(sys.executable), "shardfs")
        t_create = timed(lambda: subprocess.run([cli, "create", shard, src], check=True,
                                                stdout=subprocess.DEVNULL))
        t_cp = timed(lambda: subprocess.run(["cp", shard, shard + ".copy"], check=True))
        size = os.path.getsize(shard)
        print(f"objects: {n:,}, shard {size / 1e6:.1f} MB")
        print(f"shardfs create: {t_create:.2f} s   cp of the shard: {t_cp:.2f} s   "
              f"ratio {t_create / t_cp:.1f}x (includes reading {n:,} files and SHA-256)")
        os.unlink(shard + ".copy")

        keys = list(dict.fromkeys(keys))
        rnd.shuffle(keys)
        s = shardfs.Shard(shard)
        sw = SwhShard(shard)
        for k in keys:  # warm the page cache
            s[k]

        def ours():
            for k in keys:
                s[k]

        def theirs():
            for k in keys:
                sw.lookup(k)

        def ours2():
            threads = [threading.Thread(target=lambda part=keys[i::2]: [s[k] for k in part])
                       for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        a = len(keys) / min(timed(ours) for _ in range(3))
        b = len(keys) / min(timed(theirs) for _ in range(3))
        c = len(keys) / min(timed(ours2) for _ in range(3))
        print(f"lookup+read/s, warm: shardfs.Shard {a:,.0f}   swh.shard.Shard {b:,.0f}   "
              f"ratio {a / b:.2f}x")
        print(f"shardfs.Shard with 2 threads: {c:,.0f}/s ({c / a:.2f}x one thread)")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
