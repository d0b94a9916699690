"""Hash benchmark: objects found by sha1_git (git's blob hash, what a
content SWHID names) against the same objects found by their SHA-256 key,
and the speed of building the sha1 and sha1_git indexes.

Measures (one dataset: `small`, 1..4096 B objects, 20,000 quick, 100,000
full; a random sample of 5,000 / 20,000 of them, in the same order for
both names):
- `api`: the Python API of an objstorage or a program, a `ShardSet` of the
  shard with its `HashSet`: find + read of each object (`find(key)` then
  `pread`; `hashes.find("sha1_git", digest)`, which hashes each candidate
  again, then `pread`), objects per second, `warm` (pages cached, one
  untimed pass first: the set also remembers the digests it checked then,
  as a long-running reader of hot objects does) and `cold` (drop_caches,
  the set opened afresh, nothing remembered).
- `mount`: bench/c/open_read.c (open, read to EOF, close; no Python)
  through a flat mount with `-o hashes=sha1_git`: `MNT/<key>` against
  `MNT/sha1_git/<hex>`, `cold` (mounted anew, caches dropped) and `warm`
  (a second pass: names and pages cached by the kernel).
- `build`: `shardfs index --hashes sha1,sha1_git --force` of a shard of
  the `mix` dataset (lognormal sizes, median 4 KiB, most bytes in the
  large objects, as in Software Heritage; 10,000 objects quick, 20,000
  full: 0.3 and 0.65 GB), cold (caches dropped first), against `cat SHARD > /dev/null`
  (reading the shard) and `sha1sum` of the same objects as plain files
  (cold), in MB of object bytes per second (shard bytes for cat); and the
  bytes per object of each index.

Goals: a lookup (+ read) by sha1_git ≥ 0.8× one by SHA-256, for api warm,
api cold, mount cold and mount warm; the index build ≥ 0.8× the speed of
reading the shard (object MB/s against shard MB/s).
"""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import sys

import harness as H

PLAN = {False: (100_000, 20_000, 20_000), True: (20_000, 5_000, 10_000)}  # quick -> (objects, sample, build)
WORK = "/tmp/bench-hashes"
NAMES = {"key": "SHA-256 key", "sha1_git": "sha1_git"}


def sha1_git(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def digests(ds) -> dict:
    """sha1_git of every object of `ds` by key (hex), cached beside it."""
    path = os.path.join(ds.path, "sha1_git.tsv")
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            for key, data in H.objects(ds.count, ds.kind, ds.seed):
                f.write(f"{key.hex()}\t{sha1_git(data)}\n")
        os.rename(path + ".tmp", path)
    return dict(line.split() for line in open(path))


def api_pass(shard: str, cache: str, pairs: list, by: str, warm: bool) -> float:
    """Seconds of one timed pass finding and reading `pairs` (key, digest)."""
    import time

    from shardfs.hashes import HashSet
    from shardfs.shardset import open_shard_set

    shards = open_shard_set([shard], cache_dir=cache)
    shards.hashes = HashSet(shards, ["sha1_git"])
    shards.hashes.scan()
    find = (lambda k, d: shards.find(k)) if by == "key" else (lambda k, d: shards.hashes.find("sha1_git", d))
    try:
        for _ in range(2 if warm else 1):
            t0 = time.perf_counter()
            for k, d in pairs:
                member, _, off, size = find(k, d)
                member.shard.pread(off, size, 0, size)
            seconds = time.perf_counter() - t0
        return seconds
    finally:
        shards.close()


def main() -> None:
    args = H.main_args(__doc__.split("\n\n")[0])
    count, sample, build_count = PLAN[args.quick]
    res = H.Results("hashes", "Objects found by sha1_git against by SHA-256; index builds", args.quick, sys.argv[1:])
    ds = H.dataset("small", count)
    by_key = digests(ds)
    rng = random.Random(7)
    keys = rng.sample(ds.keys, sample)
    pairs = [(bytes.fromhex(k), bytes.fromhex(by_key[k])) for k in keys]
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    cache = os.path.join(WORK, "cache")
    H.sh([os.path.join(H.VENV, "bin", "shardfs"), "index", "--hashes", "sha1,sha1_git", "--cache-dir", cache, ds.shard])
    mnt = os.path.join(WORK, "mnt")
    target = H.Target("shardfs", "shardfs", "shardfs", mnt, sources=[ds.shard],
                      options=["layout=flat", "hashes=sha1_git", f"cache_dir={cache}"])
    names = {"key": keys, "sha1_git": [f"sha1_git/{by_key[k]}" for k in keys]}
    res.text(f"{count:,} objects of 1..4096 B ({ds.total_bytes / 1e6:,.0f} MB), a sample of {sample:,} looked up "
             f"and read whole, the same order for both names.")

    def measure(cfg):
        what, cache_state, by = cfg
        if what == "api":
            if cache_state == "cold":
                target.umount()  # its mapping of the shard would keep pages drop_caches cannot drop
                H.drop_caches()
            seconds = api_pass(ds.shard, cache, pairs, by, cache_state == "warm")
            return {"value": len(pairs) / seconds, "seconds": seconds}
        target.cold()
        target.wait_ready()
        if cache_state == "warm":
            H.read_files(mnt, names[by], mode="c")
        r = H.read_files(mnt, names[by], mode="c")
        return {"value": r["objects"] / r["seconds"], "seconds": r["seconds"]}

    configs = [(w, c, b) for w in ("api", "mount") for c in ("warm", "cold") for b in NAMES
               if not args.only or w in args.only]
    try:
        H.rounds(args.rounds, configs, lambda r, cfg: res.attempt(f"{cfg[0]} {cfg[1]}", cfg[2], r,
                                                                  lambda: measure(cfg)))
    finally:
        target.umount()
    rows = []
    for what in ("api", "mount"):
        for state in ("warm", "cold"):
            m = f"{what} {state}"
            x = res.ratio_of_rounds(m, "sha1_git", "key")
            rows.append([what, state, H.fmt(res.value(m, "key")), H.fmt(res.value(m, "sha1_git")), H.times(x)])
            res.goal(f"lookup + read by sha1_git ≥ 0.8× by SHA-256, {m}", x, ">=", 0.8, shown=H.times(x))
    res.table(["interface", "cache", "by key, objects/s", "by sha1_git, objects/s", "sha1_git / key"], rows,
              f"Medians of {args.rounds} interleaved round(s). api: ShardSet.find / HashSet.find + pread "
              "(Python); mount: bench/c/open_read.c on MNT/<key> and MNT/sha1_git/<hex>.")

    if not args.only or "build" in args.only:
        ds = H.dataset("mix", build_count)
        files = [os.path.join(ds.native_dir, ds.native_relpath(k)) for k in ds.keys]
        listfile = os.path.join(WORK, "files")
        with open(listfile, "w") as f:
            f.write("\0".join(files))
        shard_bytes = os.path.getsize(ds.shard)
        cmds = {"index": [os.path.join(H.VENV, "bin", "shardfs"), "index", "--hashes", "sha1,sha1_git", "--force",
                          "--cache-dir", cache, ds.shard],
                "cat": ["sh", "-c", f"cat {ds.shard} > /dev/null"],
                "sha1sum": ["sh", "-c", f"xargs -0 sha1sum < {listfile} > /dev/null"]}

        def build(name):
            H.drop_caches()
            t = H.timed(cmds[name])
            size = shard_bytes if name == "cat" else ds.total_bytes
            return {"value": size / t["seconds"] / 1e6, "seconds": t["seconds"], "peak_mib": t["peak_mib"]}

        H.rounds(args.rounds, list(cmds), lambda r, name: res.attempt("build", name, r, lambda: build(name)))
        import shardfs
        from shardfs import hashes, sidecar

        with shardfs.Shard(ds.shard) as s:
            ident = sidecar.identity(s)
        per_object = {n: os.path.getsize(hashes.index_path(cache, ident, n)) / len(ds.keys) for n in hashes.HASH_NAMES}
        res.table(["command", "MB/s", "seconds"],
                  [[n, H.fmt(res.value("build", n)), H.fmt(res.value("build", n, "seconds"), 2)] for n in cmds],
                  "Cold (drop_caches first). MB/s: object bytes per second for index and sha1sum, shard bytes "
                  "for cat.")
        res.text("Bytes per object: " + ", ".join(f"{n} index {v:.2f}" for n, v in sorted(per_object.items())) + ".")
        x = res.ratio_of_rounds("build", "index", "cat")
        res.goal("index build ≥ 0.8× the speed of reading the shard (cat)", x, ">=", 0.8, shown=H.times(x))
    res.write()


if __name__ == "__main__":
    main()
