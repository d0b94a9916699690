"""Ceph benchmark: one shard's objects read from an RBD image (rbd:POOL/IMAGE
through librbd) against the same shard as a local file, against shardfs
over rbd-fuse (the image as a file: the naive way), and against the floor
of one 4 KiB librbd read; on a single-host cluster started here
(tests/ceph_cluster.py: one monitor, one memstore OSD, on this machine).

Measures (dataset `small`, 1..4096 B objects, 20,000 quick / 100,000 full;
a random sample of 2,000 / 5,000 of them, the same order everywhere):
- `floor`: bench/c/rbd_read.c, 4 KiB reads at queue depth 1 at random
  offsets of the image, median µs (librbd's cache off, as shardfs reads).
- `api cold`: a new Python process opens the shard and reads each sampled
  object (`shard[key]`), µs per object, after drop_caches with the lookup
  state read back (the local file's index and hash sections; the rbd:
  source's local copy): the objects cold, the index hot.
- `api batch`: the same with one `get_batch` of the whole sample (rbd:
  asynchronous librbd reads, 64 in flight).
- `mount cold` / `cold-all` / `warm`: bench/c/open_read.c (open, read,
  close) on the sample through a flat mount, µs per object; cold: mounted
  anew, drop_caches, the lookup state read back (as for the API); cold-all:
  nothing read back; warm: a second pass (the kernel's page cache).
  Targets: local file, rbd: source, rbd-fuse image file.

Goals: a cold object through the mount and through the API ≤ 1.2× one
4 KiB librbd read (the floor of the same round); warm reads through the
mount ≥ 0.9× a local shard's.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys

import harness as H
import shardfs

sys.path.insert(0, os.path.join(H.ROOT, "tests"))
from ceph_cluster import POOL, CephCluster, available  # noqa: E402

PLAN = {False: (100_000, 5_000), True: (20_000, 2_000)}  # quick -> (objects, sample)
WORK = "/tmp/bench-ceph"
IMAGE = "bench"

API = r"""
import json, sys, time, shardfs
from shardfs import rbd
conf, cache, source, listfile, batch = sys.argv[1:6]
rbd.configure(conf=conf, cache_dir=cache)
keys = [bytes.fromhex(k) for k in open(listfile).read().split()]
s = shardfs.Shard(source)
t = time.perf_counter()
if batch == "1":
    n = sum(len(b) for b in s.get_batch(keys))
else:
    n = sum(len(s[k]) for k in keys)
print(json.dumps({"seconds": time.perf_counter() - t, "bytes": n}))
"""


def main() -> None:
    args = H.main_args(__doc__.split("\n\n")[0])
    if not available():
        print("Ceph is not installed (make test installs it): nothing measured", file=sys.stderr)
        return
    count, sample = PLAN[args.quick]
    res = H.Results("ceph", "Shards in RBD images: librbd sources against local files and rbd-fuse", args.quick,
                    sys.argv[1:])
    ds = H.dataset("small", count)
    keys = random.Random(7).sample(ds.keys, sample)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    listfile = os.path.join(WORK, "keys")
    with open(listfile, "w") as f:
        f.write("\n".join(keys) + "\n")
    cluster = CephCluster(WORK).start()
    fuse_dir = os.path.join(WORK, "rbd-fuse")
    fuse = contextlib.ExitStack()
    targets = []
    try:
        cluster.rbd("import", ds.shard, f"{POOL}/{IMAGE}")
        conf = str(cluster.conf)
        os.makedirs(fuse_dir)
        fuse.enter_context(cluster.rbd_fuse(fuse_dir, wait_for=IMAGE))
        cache = os.path.join(WORK, "cache")
        sources = {"local": ds.shard, "rbd": f"rbd:{POOL}/{IMAGE}", "rbd-fuse": os.path.join(fuse_dir, IMAGE)}
        labels = {"local": "local file", "rbd": "rbd: (librbd)", "rbd-fuse": "rbd-fuse image file"}
        for name, source in sources.items():
            targets.append(H.Target(name, labels[name], "shardfs", os.path.join(WORK, "mnt", name), sources=[source],
                                    options=["layout=flat", f"cache_dir={cache}-{name}", f"ceph_conf={conf}"]))
        size = os.path.getsize(ds.shard)
        floor_bin = H.compile_c("rbd_read", ["-lrbd", "-lrados"])
        res.text(f"{count:,} objects of 1..4096 B ({ds.total_bytes / 1e6:,.0f} MB, shard {size / 1e6:,.0f} MB) in "
                 f"one RBD image; a sample of {sample:,} read whole, the same order everywhere. The cluster: one "
                 f"monitor and one memstore OSD on this machine (no network, no disk: the floor is librbd's and "
                 f"the OSD's own cost).")

        def warm_index(cache_dir: str) -> None:
            """After drop_caches: the lookup state back in the page cache
            (the shard's index and hash sections, every file of the cache
            directory: sidecars, global index, an rbd: source's local copy),
            the objects left cold."""
            with open(ds.shard, "rb") as f:
                h = shardfs.Shard(ds.shard)
                f.seek(h.header.index_position)
                left = h.extent - h.header.index_position
                h.close()
                while left > 0:
                    left -= len(f.read(min(left, 1 << 20)) or b"x" * left)
            for root, _, files in os.walk(cache_dir):
                for name in files:
                    with open(os.path.join(root, name), "rb") as f:
                        while f.read(1 << 20):
                            pass

        def api(name: str, batch: bool) -> dict:
            for t in targets:
                t.umount()  # a mount's mapping would keep pages drop_caches cannot drop
            H.drop_caches()
            warm_index(f"{cache}-api")
            out = json.loads(H.sh([H.PY, "-c", API, conf, f"{cache}-api", sources[name], listfile,
                                   "1" if batch else "0"]))
            return {"value": out["seconds"] / sample * 1e6, "seconds": out["seconds"]}

        def mount(target: H.Target, state: str) -> dict:
            target.cold()
            target.wait_ready()
            if state == "cold":
                H.drop_caches()  # wait_ready read the cache directory
                warm_index(f"{cache}-{target.key}")
            elif state == "cold-all":
                H.drop_caches()
            if state == "warm":
                H.read_files(target.path, keys, mode="c")
            r = H.read_files(target.path, keys, mode="c")
            return {"value": r["seconds"] / r["objects"] * 1e6, "seconds": r["seconds"]}

        def floor() -> dict:
            out = json.loads(H.sh([floor_bin, conf, POOL, IMAGE, str(sample), "4096", str(size)]))
            return {"value": out["mean_us"], "median_us": out["median_us"], "p99_us": out["p99_us"]}

        # the copies of the index and the sidecars exist before anything is timed
        H.sh([H.PY, "-c", API, conf, f"{cache}-api", sources["rbd"], listfile, "1"])
        for t in targets:
            t.fresh()
            t.wait_ready()
            t.umount()

        configs = [("floor", "librbd")]
        configs += [(f"api {m}", n) for m in ("cold", "batch") for n in ("local", "rbd")]
        configs += [(f"mount {m}", t.key) for m in ("cold", "cold-all", "warm") for t in targets]
        by_key = {t.key: t for t in targets}

        def measure(cfg):
            what, name = cfg
            if what == "floor":
                return floor()
            if what.startswith("api"):
                return api(name, what == "api batch")
            return mount(by_key[name], what.split()[1])

        H.rounds(args.rounds, [c for c in configs if not args.only or c[0].split()[0] in args.only],
                 lambda r, cfg: res.attempt(cfg[0], cfg[1], r, lambda: measure(cfg)))
    finally:
        for t in targets:
            t.umount()
        fuse.close()
        cluster.stop()

    floor_us = res.value("floor", "librbd")
    rows = [["librbd read, 4 KiB, QD1 (floor)", f"median {H.fmt(res.value('floor', 'librbd', 'median_us'), 1)}",
             H.fmt(floor_us, 1), "", ""]]
    for m in ("api cold", "api batch", "mount cold", "mount cold-all", "mount warm"):
        names = ["local", "rbd"] + (["rbd-fuse"] if m.startswith("mount") else [])
        for n in names:
            v = res.value(m, n)
            rows.append([m, labels[n], H.fmt(v, 1), H.times(H.ratio(v, floor_us)),
                         H.times(res.ratio_of_rounds(m, n, "local"))])
    res.table(["measure", "source", "µs per object", "/ floor", "/ local file"], rows,
              f"Medians of {args.rounds} interleaved round(s); lower is faster. µs per object: wall time of the "
              "whole sample / objects (a mean; the floor's is its mean too). cold: the objects' bytes dropped "
              "from every cache, the lookup state (index, sidecars, global index, local copy) in the page "
              "cache, as on a reader host with hot indexes; cold-all: everything dropped; warm: a second "
              "pass. rbd-fuse bypasses the page cache: its index is read from the cluster at each lookup.")

    def vs_floor(m: str):
        by = {}
        for r in res.runs:
            if (r["measure"], r["target"]) in ((m, "rbd"), ("floor", "librbd")) and r["value"] is not None:
                by.setdefault(r["round"], {})[r["measure"]] = r["value"]
        return H.median(v[m] / v["floor"] for v in by.values() if m in v and v.get("floor"))

    for m in ("mount cold", "api cold"):
        x = vs_floor(m)
        res.goal(f"a cold object through the {m.split()[0]} ≤ 1.2× one 4 KiB librbd read", x, "<=", 1.2,
                 shown=H.times(x))
    x = res.ratio_of_rounds("mount warm", "local", "rbd")  # µs local / µs rbd = objects/s rbd / local
    res.goal("warm reads through the mount ≥ 0.9× a local shard's (objects/s)", x, ">=", 0.9, shown=H.times(x))
    res.write()


if __name__ == "__main__":
    main()
