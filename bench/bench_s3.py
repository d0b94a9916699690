"""S3 benchmark: one shard's objects read from an S3 object (s3://BUCKET/KEY,
ranged GETs through libcurl) against one ranged GET of each (the floor,
with the same library and a kept-alive connection), against Software
Heritage's MOSAIC reader over S3 (swh.mosaic, Backend.S3) on a MOSAIC file
of the same objects in the same bucket, and against the shard as a local
file; on Ceph's radosgw started here on a single-host cluster
(tests/ceph_cluster.py: one monitor, one memstore OSD, on this machine).

Measures (dataset `small`, 1..4096 B objects, 20,000 quick / 100,000 full;
a random sample of 1,000 / 5,000 of them, the same order everywhere),
µs per object (wall time of the sample / objects):
- `floor`: bench/c/s3_get.c, one ranged GET per object (its exact byte
  range in the shard), one libcurl handle kept alive, SigV4 as shardfs signs.
- `api cold`: a new Python process opens the s3: source (its local copy
  built beforehand: the lookup state is local) and reads each object
  (`shard[key]`): one GET each. `api batch`: one `get_batch` of the sample
  (GETs in flight at once). The same for the local file.
- `swh.mosaic cold`: a new Python process, `MosaicReader(s3 URL,
  SHA256FMPHGO, Backend.S3).lookup(key)` of each object (the crate's
  object_store client; its index entry and its object: two GETs); the
  same file read by shardfs's API (`api cold`, source `s3-mosaic`: its
  local copy built beforehand; one GET per object).
- `mount cold` / `mount warm`: bench/c/open_read.c (open, read, close) on
  the sample through a flat mount of the s3: source (mounted anew; warm: a
  second pass, the kernel's page cache) and of the local file.

Goals (issue 31): a cold object through the API ≤ 1.2× the floor (a Read
Shard and a MOSAIC file), and on the MOSAIC file at least 1.5× faster than
swh.mosaic's S3 reader; through the mount ≤ 1.5× the floor; warm through
the mount ≥ 0.9× a local file.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys

import harness as H

sys.path.insert(0, os.path.join(H.ROOT, "tests"))
from ceph_cluster import S3_ACCESS_KEY, S3_SECRET_KEY, CephCluster, rgw_available  # noqa: E402

PLAN = {False: (100_000, 5_000), True: (20_000, 1_000)}  # quick -> (objects, sample)
WORK = "/tmp/bench-s3"
BUCKET = "bench"

API = r"""
import json, sys, time, shardfs
from shardfs import s3
cache, source, listfile, batch = sys.argv[1:5]
s3.configure(cache_dir=cache)
keys = [bytes.fromhex(k) for k in open(listfile).read().split()]
s = shardfs.Shard(source)
t = time.perf_counter()
if batch == "1":
    n = sum(len(b) for b in s.get_batch(keys))
else:
    n = sum(len(s[k]) for k in keys)
print(json.dumps({"seconds": time.perf_counter() - t, "bytes": n}))
"""

MOSAIC = r"""
import json, sys, time
from swh.mosaic import Backend, IdxDescription, MosaicReader
url, listfile = sys.argv[1:3]
keys = [bytes.fromhex(k) for k in open(listfile).read().split()]
r = MosaicReader(url, IdxDescription.SHA256FMPHGO, Backend.S3)
t = time.perf_counter()
n = sum(len(r.lookup(k)) for k in keys)
print(json.dumps({"seconds": time.perf_counter() - t, "bytes": n}))
"""


def main() -> None:
    args = H.main_args(__doc__.split("\n\n")[0])
    if not rgw_available():
        print("Ceph's radosgw is not installed (make test installs it): nothing measured", file=sys.stderr)
        return
    import boto3

    import shardfs

    count, sample = PLAN[args.quick]
    res = H.Results("s3", "Shards in S3 (radosgw): shardfs's ranged GETs against the floor and swh.mosaic",
                    args.quick, sys.argv[1:])
    ds = H.dataset("small", count)
    keys = random.Random(7).sample(ds.keys, sample)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    listfile = os.path.join(WORK, "keys")
    with open(listfile, "w") as f:
        f.write("\n".join(keys) + "\n")
    ranges = os.path.join(WORK, "ranges")
    with shardfs.Shard(ds.shard) as sh, open(ranges, "w") as f:
        for k in keys:
            off, size = sh.locate(bytes.fromhex(k))
            f.write(f"{off} {max(size, 1)}\n")
    cluster = CephCluster(WORK).start()
    targets = []
    try:
        endpoint = cluster.start_rgw()
        os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ENDPOINT=endpoint, AWS_ALLOW_HTTP="true",
                          AWS_ACCESS_KEY_ID=S3_ACCESS_KEY, AWS_SECRET_ACCESS_KEY=S3_SECRET_KEY,
                          AWS_REGION="us-east-1")
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.upload_file(ds.shard, BUCKET, "objects.shard")
        mosaic = os.path.join(WORK, "objects.mosaic")
        from swh.mosaic import IdxDescription, MosaicCreator

        creator = MosaicCreator(mosaic, [IdxDescription.SHA256FMPHGO])
        for key, data in H.objects(count, "small"):
            creator.add([key], data)
        creator.close()
        client.upload_file(mosaic, BUCKET, "objects.mosaic")
        cache = os.path.join(WORK, "cache")
        sources = {"local": ds.shard, "s3": f"s3://{BUCKET}/objects.shard",
                   "s3-mosaic": f"s3://{BUCKET}/objects.mosaic"}
        labels = {"local": "local file", "s3": "s3:// (libcurl)", "s3-mosaic": "s3:// MOSAIC file (libcurl)"}
        for name, source in sources.items():
            if name == "s3-mosaic":
                continue  # through the API only
            targets.append(H.Target(name, labels[name], "shardfs", os.path.join(WORK, "mnt", name), sources=[source],
                                    options=["layout=flat", f"cache_dir={cache}-{name}"]))
        floor_bin = H.compile_c("s3_get", ["-lcurl"])
        res.text(f"{count:,} objects of 1..4096 B ({ds.total_bytes / 1e6:,.0f} MB) in one S3 object (a Read "
                 f"Shard) and in one MOSAIC file (swh.mosaic's writer, raw); a sample of {sample:,} read whole, "
                 f"the same order everywhere. The server: radosgw (Ceph 16.2, beast, tcp_nodelay=1) over one "
                 f"memstore OSD on this machine: no network, no disk, so the floor is the HTTP server's and "
                 f"client's own cost.")

        def api(name: str, batch: bool) -> dict:
            for t in targets:
                t.umount()
            H.drop_caches()
            out = json.loads(H.sh([H.PY, "-c", API, f"{cache}-api", sources[name], listfile, "1" if batch else "0"]))
            return {"value": out["seconds"] / sample * 1e6, "seconds": out["seconds"]}

        def swh_mosaic() -> dict:
            out = json.loads(H.sh([H.PY, "-c", MOSAIC, f"s3://{BUCKET}/objects.mosaic", listfile]))
            return {"value": out["seconds"] / sample * 1e6, "seconds": out["seconds"]}

        def mount(target: H.Target, state: str) -> dict:
            target.cold()
            target.wait_ready()
            if state == "warm":
                H.read_files(target.path, keys, mode="c")
            r = H.read_files(target.path, keys, mode="c")
            return {"value": r["seconds"] / r["objects"] * 1e6, "seconds": r["seconds"]}

        def floor() -> dict:
            out = json.loads(H.sh([floor_bin, f"{endpoint}/{BUCKET}/objects.shard", ranges]))
            return {"value": out["seconds"] / out["gets"] * 1e6, "seconds": out["seconds"]}

        # the local copies and sidecars exist before anything is timed
        H.sh([H.PY, "-c", API, f"{cache}-api", sources["s3"], listfile, "1"])
        H.sh([H.PY, "-c", API, f"{cache}-api", sources["s3-mosaic"], listfile, "1"])
        for t in targets if not args.only or "mount" in args.only else []:
            t.fresh()
            t.wait_ready()
            t.umount()

        configs = [("floor", "libcurl"), ("swh.mosaic cold", "swh.mosaic")]
        configs += [(f"api {m}", n) for m in ("cold", "batch") for n in ("local", "s3", "s3-mosaic")]
        configs += [(f"mount {m}", t.key) for m in ("cold", "warm") for t in targets]
        by_key = {t.key: t for t in targets}

        def measure(cfg):
            what, name = cfg
            if what == "floor":
                return floor()
            if what == "swh.mosaic cold":
                return swh_mosaic()
            if what.startswith("api"):
                return api(name, what == "api batch")
            return mount(by_key[name], what.split()[1])

        H.rounds(args.rounds, [c for c in configs if not args.only or c[0].split()[0] in args.only],
                 lambda r, cfg: res.attempt(cfg[0], cfg[1], r, lambda: measure(cfg)))
    finally:
        for t in targets:
            t.umount()
        cluster.stop()

    floor_us = res.value("floor", "libcurl")
    rows = [["one ranged GET, libcurl, kept alive (floor)", "", H.fmt(floor_us, 1), "", ""],
            ["swh.mosaic MosaicReader.lookup, Backend.S3", "MOSAIC file in the bucket",
             H.fmt(res.value("swh.mosaic cold", "swh.mosaic"), 1),
             H.times(H.ratio(res.value("swh.mosaic cold", "swh.mosaic"), floor_us)), ""]]
    for m in ("api cold", "api batch", "mount cold", "mount warm"):
        for n in ("local", "s3") + (("s3-mosaic",) if m.startswith("api") else ()):
            v = res.value(m, n)
            rows.append([m, labels[n], H.fmt(v, 1), H.times(H.ratio(v, floor_us)),
                         H.times(res.ratio_of_rounds(m, n, "local"))])
    res.table(["measure", "source", "µs per object", "/ floor", "/ local file"], rows,
              f"Medians of {args.rounds} interleaved round(s); lower is faster. cold: the objects' bytes "
              "dropped from the page cache; an s3: source's local copy (index, sizes) is local, as it is "
              "once a mount or a process has opened the source; warm: a second pass through the mount.")

    def vs(m: str, target: str, base: str, base_target: str):
        by = {}
        for r in res.runs:
            if (r["measure"], r["target"]) in ((m, target), (base, base_target)) and r["value"] is not None:
                by.setdefault(r["round"], {})[r["measure"]] = r["value"]
        return H.median(v[m] / v[base] for v in by.values() if m in v and v.get(base))

    x = vs("api cold", "s3", "floor", "libcurl")
    res.goal("a cold object through the API ≤ 1.2× one ranged GET", x, "<=", 1.2, shown=H.times(x))
    x = vs("swh.mosaic cold", "swh.mosaic", "api cold", "s3-mosaic")
    res.goal("swh.mosaic's S3 reader ≥ 1.5× the time of shardfs's API per cold object, same MOSAIC file", x, ">=", 1.5,
             shown=H.times(x))
    x = vs("api cold", "s3-mosaic", "floor", "libcurl")
    res.goal("a cold object of a MOSAIC file in S3 through the API ≤ 1.2× one ranged GET", x, "<=", 1.2,
             shown=H.times(x))
    x = vs("mount cold", "s3", "floor", "libcurl")
    res.goal("a cold object through the mount ≤ 1.5× one ranged GET", x, "<=", 1.5, shown=H.times(x))
    x = res.ratio_of_rounds("mount warm", "local", "s3")  # µs local / µs s3 = objects/s s3 / local
    res.goal("warm reads through the mount ≥ 0.9× a local shard's (objects/s)", x, ">=", 0.9, shown=H.times(x))
    res.write()


if __name__ == "__main__":
    main()
