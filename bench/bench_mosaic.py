"""MOSAIC benchmark: objects of MOSAIC files read through shardfs's C reader
(`shardfs.mosaic.MosaicFile`) against Software Heritage's reference reader
(`swh.mosaic.MosaicReader`, the Rust crate's Python binding, mmap backend),
on the same files, the same keys, in the same order, in one run.

Files: the `small` dataset's objects (1..4096 B; 20,000 quick, 100,000 full)
written by swh.mosaic's own `MosaicCreator` twice, raw and zstd level 3,
indexed by sha256 (the key shardfs names objects by) and sha1; the same
objects in a Read Shard for scale (`shardfs.Shard`).

Measures (objects per second, one Python thread; key sample: 5,000 quick,
20,000 full, random order):
- `get`: one object at a time (MosaicFile.get / MosaicReader.lookup /
  Shard.get), `warm` (pages cached, the file open, an untimed pass first)
  and `cold` (drop_caches, the file opened afresh, the open included);
- `get_batch`: batches of 1,000 keys (MosaicFile.get_batch /
  MosaicReader.get_batch, which fans out on rayon threads / Shard.get_batch).

Goals (issue 31): get >= 1.2x MosaicReader.lookup, raw and zstd, cold and
warm; get_batch >= 1.5x MosaicReader.get_batch.
"""
from __future__ import annotations

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

WORK = os.path.join(H.DATA, "mosaic")
PLAN = ((20_000, 5_000), (100_000, 20_000))  # (objects, keys per pass): quick, full
BATCH = 1000
#: Warm passes go over the sample this many times (a single pass lasts
#: milliseconds: too short to time).
WARM_REPEAT = 10
READERS = ("shardfs", "swh", "shard")
LABEL = {"shardfs": "shardfs MosaicFile", "swh": "swh.mosaic MosaicReader", "shard": "shardfs.Shard (Read Shard)"}


def build(count: int):
    """The MOSAIC files (raw, zstd) and the Read Shard of the `small`
    dataset's first `count` objects, written once into WORK; their keys."""
    from swh.mosaic import IdxDescription, MosaicCreator

    import shardfs

    os.makedirs(WORK, exist_ok=True)
    paths = {c: os.path.join(WORK, f"small-{count}-{c}.mosaic") for c in ("raw", "zstd")}
    paths["shard"] = os.path.join(WORK, f"small-{count}.shard")
    keys = []
    if all(os.path.exists(p) for p in paths.values()):
        for key, _ in H.objects(count, "small"):
            keys.append(key)
        return paths, keys
    objects = list(H.objects(count, "small"))
    keys = [k for k, _ in objects]
    import hashlib

    for comp, path in (("raw", paths["raw"]), ("zstd", paths["zstd"])):
        tmp = path + ".tmp"
        kwargs = {"compression_level": 3} if comp == "zstd" else {}
        creator = MosaicCreator(tmp, [IdxDescription.SHA256FMPHGO, IdxDescription.SHA1FMPHGO], **kwargs)
        for key, data in objects:
            creator.add([key, hashlib.sha1(data).digest()], data)
        creator.close()
        os.rename(tmp, path)
    with shardfs.ShardWriter(paths["shard"] + ".tmp") as w:
        for key, data in objects:
            w.add(key, data)
    os.rename(paths["shard"] + ".tmp", paths["shard"])
    return paths, keys


def open_reader(reader: str, path: str):
    if reader == "shardfs":
        from shardfs.mosaic import MosaicFile

        f = MosaicFile(path)
        return f, f.get, f.get_batch
    if reader == "swh":
        from swh.mosaic import Backend, IdxDescription, MosaicReader

        r = MosaicReader(path, IdxDescription.SHA256FMPHGO, Backend.MMAP)
        return r, r.lookup, r.get_batch
    import shardfs

    s = shardfs.Shard(path)
    return s, s.get, s.get_batch


def one_pass(reader: str, path: str, keys: list, how: str, cold: bool) -> float:
    """Seconds of one timed pass (the open included when cold)."""
    import time

    if cold:
        H.drop_caches()
        start = time.perf_counter()
        r, get, batch = open_reader(reader, path)
    else:  # warm: an untimed pass first, the open not timed, WARM_REPEAT passes timed
        r, get, batch = open_reader(reader, path)
        for k in keys:
            get(k)
        keys = keys * WARM_REPEAT
        start = time.perf_counter()
    if how == "get":
        for k in keys:
            if get(k) is None:
                raise RuntimeError(f"{reader}: a key was not found")
    else:
        for i in range(0, len(keys), BATCH):
            if any(x is None for x in batch(keys[i:i + BATCH])):
                raise RuntimeError(f"{reader}: a key was not found")
    seconds = time.perf_counter() - start
    r.close()
    return seconds if cold else seconds / WARM_REPEAT


def main() -> None:
    args = H.main_args(__doc__.split("\n\n")[0], extra=lambda p: p.set_defaults(rounds=3))
    count, sample = PLAN[0 if args.quick else 1]
    res = H.Results("mosaic", "MOSAIC files: shardfs's C reader against swh.mosaic's reader", args.quick, sys.argv[1:])
    paths, keys = build(count)
    keys = random.Random(1).sample(keys, sample)
    res.text(f"{count:,} objects of 1..4096 B; passes of {sample:,} keys in random order; MOSAIC files written by "
             f"swh.mosaic's MosaicCreator (raw {os.path.getsize(paths['raw']) / 1e6:,.1f} MB, zstd level 3 "
             f"{os.path.getsize(paths['zstd']) / 1e6:,.1f} MB), Read Shard {os.path.getsize(paths['shard']) / 1e6:,.1f} MB.")
    configs = [(comp, cache, how, reader) for comp in ("raw", "zstd") for cache in ("warm", "cold")
               for how in ("get", "get_batch") for reader in READERS]

    def measure(comp, cache, how, reader):
        path = paths["shard"] if reader == "shard" else paths[comp]
        before = H.device_reads(path)
        seconds = one_pass(reader, path, keys, how, cache == "cold")
        after = H.device_reads(path)
        return {"value": len(keys) / seconds, "seconds": seconds,
                "device_kib": (after[1] - before[1]) / 1024 / len(keys)}

    H.rounds(args.rounds, configs, lambda r, cfg: res.attempt(f"{cfg[0]} {cfg[1]} {cfg[2]}", cfg[3], r,
                                                             lambda: measure(*cfg)))
    rows = []
    for comp in ("raw", "zstd"):
        for cache in ("warm", "cold"):
            for how in ("get", "get_batch"):
                m = f"{comp} {cache} {how}"
                rows.append([comp, cache, how, *[H.fmt(res.value(m, r)) for r in READERS],
                             H.fmt(res.ratio_of_rounds(m, "shardfs", "swh"), 2),
                             H.fmt(res.ratio_of_rounds(m, "shardfs", "shard"), 2),
                             *[H.fmt(res.value(m, r, "device_kib"), 1) if cache == "cold" else "—"
                               for r in ("shardfs", "swh")]])
    res.table(["file", "cache", "call", *[f"{LABEL[r]}, objects/s" for r in READERS], "shardfs / swh.mosaic",
               "shardfs MOSAIC / Read Shard", "KiB read from the device / object, shardfs",
               "KiB read / object, swh.mosaic"], rows,
              f"Medians of {args.rounds} interleaved round(s); ratios: medians of same-round ratios.")
    for comp in ("raw", "zstd"):
        for cache in ("warm", "cold"):
            x = res.ratio_of_rounds(f"{comp} {cache} get", "shardfs", "swh")
            res.goal(f"get >= 1.2x MosaicReader.lookup, {comp} {cache}", x, ">=", 1.2, shown=H.times(x))
            x = res.ratio_of_rounds(f"{comp} {cache} get_batch", "shardfs", "swh")
            res.goal(f"get_batch >= 1.5x MosaicReader.get_batch, {comp} {cache}", x, ">=", 1.5, shown=H.times(x))
    res.write()


if __name__ == "__main__":
    main()
