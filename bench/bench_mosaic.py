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

Cold reads depend on how much of the file a pass touches. In the set
above (`dense`) a pass asks for a quarter of a 42 MB file's objects: a
reader whose page faults read around (swh.mosaic's mapping, the kernel's
default) ends up reading the whole file in large sequential pieces, a
reader that reads what it needs (shardfs: MADV_RANDOM on the objects) makes
one small random read per object. So a second set, `sparse`, asks for 1% of
the objects of a file ten times larger (200,000 objects and 2,000 keys
quick, 1,000,000 and 10,000 full): the case of a large shard (Software
Heritage's hold ~50 million objects). There the `floor` reader times what
any reader that does not cache the whole index pays per cold object: two
4 KiB reads one after the other (a page of the index entries, then the
object's page), with plain preads (POSIX_FADV_RANDOM); in the dense set
`floor` times the whole file read with 1 MiB reads after the same
drop_caches, for scale.

Through a mount (`--mount`, or always unless `--no-mount`): the same
objects as files of three `shardfs mount`s (flat layout), the Read Shard,
the raw MOSAIC file and the zstd one (the mosaic shard kind, C request
path), each read whole by name in random order by bench/c/open_read.c
(1 and 4 threads): `cold` (mounted anew, caches dropped) and `warm` (an
untimed pass first: the kernel's page cache holds the decoded bytes; then
WARM_REPEAT passes timed).

Goals (issue 31): get >= 1.2x MosaicReader.lookup, raw and zstd, cold and
warm; get_batch >= 1.5x MosaicReader.get_batch; through the mount, cold
random, MOSAIC raw >= 0.9x the same objects in a Read Shard, zstd >= 0.7x,
warm >= 0.95x.
"""
from __future__ import annotations

import os
import random
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

WORK = os.path.join(H.DATA, "mosaic")
PLAN = ((20_000, 5_000), (100_000, 20_000))  # (objects, keys per pass): quick, full
SPARSE_PLAN = ((200_000, 2_000), (1_000_000, 10_000))
BATCH = 1000
#: Warm passes go over the sample this many times (a single pass lasts
#: milliseconds: too short to time).
WARM_REPEAT = 10
READERS = ("shardfs", "swh", "shard")
LABEL = {"shardfs": "shardfs MosaicFile", "swh": "swh.mosaic MosaicReader", "shard": "shardfs.Shard (Read Shard)"}


def build(count: int, kind: str = "small"):
    """The MOSAIC files (raw, zstd) and the Read Shard of the `kind`
    dataset's first `count` objects, written once into WORK; their keys."""
    from swh.mosaic import IdxDescription, MosaicCreator

    import shardfs

    os.makedirs(WORK, exist_ok=True)
    paths = {c: os.path.join(WORK, f"{kind}-{count}-{c}.mosaic") for c in ("raw", "zstd")}
    paths["shard"] = os.path.join(WORK, f"{kind}-{count}.shard")
    keys = []
    if all(os.path.exists(p) for p in paths.values()):
        for key, _ in H.objects(count, kind):
            keys.append(key)
        return paths, keys
    objects = list(H.objects(count, kind))
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


class Floor:
    """Two 4 KiB preads per key, one after the other: a page of the sha256
    index's entries (where the key's entry would be if they were in key
    order: any page of them costs the same cold read) and the object's
    first page. Offsets are taken before the caches are dropped."""

    def __init__(self, path: str, keys: list) -> None:
        from shardfs.mosaic import MosaicFile

        with MosaicFile(path) as f:
            index = next(i for i in f.info["indexes"] if i["name"] == "sha256")
            first, length = index["position"], index["slots"] * index["entry_size"]
            self.offsets = {k: (first + (int.from_bytes(k[:8], "big") * length >> 64) & ~4095,
                                f.locate(k)[0] & ~4095) for k in keys}
        self.path = path
        self.fd = -1

    def open(self):
        self.fd = os.open(self.path, os.O_RDONLY)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        return self, self.get, None

    def get(self, key: bytes) -> bytes:
        entry, data = self.offsets[key]
        os.pread(self.fd, 4096, entry)
        return os.pread(self.fd, 4096, data)

    def close(self) -> None:
        os.close(self.fd)


def read_whole(path: str) -> float:
    """Seconds to read the whole file from the device, 1 MiB at a time
    (drop_caches first): the floor of a cold pass that touches most of it
    (the dense set), whatever the reader."""
    import time

    H.drop_caches()
    start = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - start


def open_reader(reader: str, path: str):
    if isinstance(reader, Floor):
        return reader.open()
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


MOUNTED = ("shard", "raw", "zstd")
#: Objects of the `mix` dataset (lognormal sizes, median 4 KiB, up to the
#: maximum object size: SWH's) read through the mounts beside the `small`
#: ones: quick, full.
MIX_PLAN = (2_000, 10_000)
MOUNT_LABEL = {"shard": "Read Shard", "raw": "MOSAIC raw", "zstd": "MOSAIC zstd"}


def mount_part(res, rounds: int, sets: dict) -> None:
    """Files of the same objects read through three mounts per dataset
    (see the module docstring): `sets` {dataset: (paths, keys)}; adds rows
    and goals to `res`."""
    mnt = os.path.join(H.DATA, "mnt-mosaic")
    targets = {(d, k): H.Target(k, MOUNT_LABEL[k], "shardfs", f"{mnt}/{d}-{k}", sources=[paths[k]],
                                options=["layout=flat", f"cache_dir={WORK}/cache-{d}-{k}"])
               for d, (paths, _) in sets.items() for k in MOUNTED}
    names = {d: [k.hex() for k in keys] for d, (_, keys) in sets.items()}
    configs = [(d, cache, threads, k) for d in sets for cache in ("cold", "warm") for threads in (1, 4)
               for k in MOUNTED]

    def measure(d, cache, threads, k):
        t = targets[d, k]
        if cache == "cold":
            r = H.read_files(t.path, names[d], procs=threads, mode="c", before=t.cold)
        else:  # a pass lasts milliseconds: WARM_REPEAT passes timed
            t.mount()
            H.read_files(t.path, names[d], procs=threads, mode="c")
            r = H.read_files(t.path, names[d] * WARM_REPEAT, procs=threads, mode="c")
        return {"value": r["objects"] / r["seconds"], "seconds": r["seconds"], "mb_s": r["bytes"] / r["seconds"] / 1e6}

    try:
        H.rounds(rounds, configs, lambda r, cfg: res.attempt(f"mount {cfg[0]} {cfg[1]} {cfg[2]}", cfg[3], r,
                                                            lambda: measure(*cfg)))
    finally:
        for t in targets.values():
            t.umount()
    rows = []
    for d in sets:
        for cache in ("cold", "warm"):
            for threads in (1, 4):
                m = f"mount {d} {cache} {threads}"
                rows.append([d, cache, str(threads), *[H.fmt(res.value(m, k)) for k in MOUNTED],
                             *[H.fmt(res.value(m, k, "mb_s")) for k in MOUNTED],
                             H.fmt(res.ratio_of_rounds(m, "raw", "shard"), 2),
                             H.fmt(res.ratio_of_rounds(m, "zstd", "shard"), 2)])
    res.table(["objects", "cache", "reader threads", *[f"{MOUNT_LABEL[k]}, files/s" for k in MOUNTED],
               *[f"{MOUNT_LABEL[k]}, MB/s" for k in MOUNTED], "MOSAIC raw / Read Shard", "MOSAIC zstd / Read Shard"],
              rows,
              f"Through shardfs mounts (flat layout, C request path), files read whole in random order by "
              f"bench/c/open_read.c: the small objects (1..4096 B) and `mix` (lognormal, median 4 KiB, a long "
              f"tail up to 100 MB). Medians of {rounds} interleaved round(s); ratios: medians of same-round ratios.")
    for d in sets:
        for threads in (1, 4):
            for k, want in (("raw", 0.9), ("zstd", 0.7)):
                x = res.ratio_of_rounds(f"mount {d} cold {threads}", k, "shard")
                res.goal(f"mount, {d}, cold random, {threads} reader(s): MOSAIC {k} >= {want}x Read Shard", x, ">=",
                         want, shown=H.times(x))
            for k in ("raw", "zstd"):
                x = res.ratio_of_rounds(f"mount {d} warm {threads}", k, "shard")
                res.goal(f"mount, {d}, warm, {threads} reader(s): MOSAIC {k} >= 0.95x Read Shard", x, ">=", 0.95,
                         shown=H.times(x))


def main() -> None:
    def extra(p):
        p.set_defaults(rounds=3)
        p.add_argument("--no-mount", action="store_true", help="skip the measures through mounts")
        p.add_argument("--only-mount", action="store_true", help="only the measures through mounts")

    args = H.main_args(__doc__.split("\n\n")[0], extra=extra)
    count, sample = PLAN[0 if args.quick else 1]
    res = H.Results("mosaic", "MOSAIC files: shardfs's C reader against swh.mosaic's reader", args.quick, sys.argv[1:])
    paths, keys = build(count)
    keys = random.Random(1).sample(keys, sample)
    res.text(f"{count:,} objects of 1..4096 B; passes of {sample:,} keys in random order; MOSAIC files written by "
             f"swh.mosaic's MosaicCreator (raw {os.path.getsize(paths['raw']) / 1e6:,.1f} MB, zstd level 3 "
             f"{os.path.getsize(paths['zstd']) / 1e6:,.1f} MB), Read Shard {os.path.getsize(paths['shard']) / 1e6:,.1f} MB.")
    if not args.no_mount:
        mix_count = MIX_PLAN[0 if args.quick else 1]
        mix_paths, mix_keys = build(mix_count, "mix")
        res.text(f"Through the mounts also {mix_count:,} objects of the `mix` dataset (MOSAIC raw "
                 f"{os.path.getsize(mix_paths['raw']) / 1e6:,.1f} MB, zstd {os.path.getsize(mix_paths['zstd']) / 1e6:,.1f} MB).")
        mount_part(res, args.rounds, {"small": (paths, keys),
                                      "mix": (mix_paths, random.Random(2).sample(mix_keys, len(mix_keys)))})
    if args.only_mount:
        res.write()
        return
    sparse_count, sparse_sample = SPARSE_PLAN[0 if args.quick else 1]
    sparse_paths, sparse_keys = build(sparse_count)
    sparse_keys = random.Random(3).sample(sparse_keys, sparse_sample)
    floor = Floor(sparse_paths["raw"], sparse_keys)
    configs = [(comp, cache, how, reader) for comp in ("raw", "zstd") for cache in ("warm", "cold")
               for how in ("get", "get_batch") for reader in READERS]

    configs += [(comp, "sparse", how, reader) for comp in ("raw", "zstd") for how in ("get", "get_batch")
                for reader in READERS]
    configs += [("raw", "sparse", "get", "floor"), ("raw", "cold", "get", "floor")]

    def measure(comp, cache, how, reader):
        where, sample = (sparse_paths, sparse_keys) if cache == "sparse" else (paths, keys)
        path = where["shard"] if reader == "shard" else where[comp]
        before = H.device_reads(path)
        if reader == "floor" and cache == "cold":
            seconds = read_whole(path)
        else:
            seconds = one_pass(floor if reader == "floor" else reader, path, sample, how, cache != "warm")
        after = H.device_reads(path)
        return {"value": len(sample) / seconds, "seconds": seconds,
                "device_kib": (after[1] - before[1]) / 1024 / len(sample)}

    H.rounds(args.rounds, configs, lambda r, cfg: res.attempt(f"{cfg[0]} {cfg[1]} {cfg[2]}", cfg[3], r,
                                                             lambda: measure(*cfg)))
    rows = []
    for comp in ("raw", "zstd"):
        for cache in ("warm", "cold", "sparse"):
            for how in ("get", "get_batch"):
                m = f"{comp} {cache} {how}"
                rows.append([comp, cache, how, *[H.fmt(res.value(m, r)) for r in READERS],
                             H.fmt(res.ratio_of_rounds(m, "shardfs", "swh"), 2),
                             H.fmt(res.ratio_of_rounds(m, "shardfs", "shard"), 2),
                             *[H.fmt(res.value(m, r, "device_kib"), 1) if cache != "warm" else "—"
                               for r in ("shardfs", "swh")]])
    res.table(["file", "cache", "call", *[f"{LABEL[r]}, objects/s" for r in READERS], "shardfs / swh.mosaic",
               "shardfs MOSAIC / Read Shard", "KiB read from the device / object, shardfs",
               "KiB read / object, swh.mosaic"], rows,
              f"Medians of {args.rounds} interleaved round(s); ratios: medians of same-round ratios. `cold`: the "
              f"dense set ({count:,} objects, {sample:,} keys); `sparse`: cold, {sparse_count:,} objects "
              f"({os.path.getsize(sparse_paths['raw']) / 1e6:,.0f} MB raw), {sparse_sample:,} keys.")
    whole = res.value("raw cold get", "floor")

    def of_whole(measure: str, reader: str) -> Optional[float]:
        got = res.value(measure, reader)
        return got / whole if got and whole else None

    res.text(f"Dense set, cold, beside the whole raw file read from the device with 1 MiB reads after the same "
             f"drop_caches ({H.fmt(whole)} objects/s of the pass; not a floor: swh.mosaic's page faults, read "
             f"around, fetch nearly every byte of the file faster): swh.mosaic's get (raw) at "
             f"{H.fmt(of_whole('raw cold get', 'swh'), 2)}× it, its get_batch "
             f"{H.fmt(of_whole('raw cold get_batch', 'swh'), 2)}×; shardfs's get_batch "
             f"{H.fmt(of_whole('raw cold get_batch', 'shardfs'), 2)}×, its get "
             f"{H.fmt(of_whole('raw cold get', 'shardfs'), 2)}× (one random read per object). Medians.")
    fl = res.value("raw sparse get", "floor")
    res.text(f"Floor, sparse: two dependent 4 KiB preads per object: {H.fmt(fl)} objects/s; shardfs MosaicFile.get "
             f"(raw) at {H.fmt(res.ratio_of_rounds('raw sparse get', 'shardfs', 'floor'), 2)}× it, zstd "
             f"{H.fmt(res.ratio_of_rounds('zstd sparse get', 'shardfs', 'floor'), 2)}×; swh.mosaic (raw) "
             f"{H.fmt(res.ratio_of_rounds('raw sparse get', 'swh', 'floor'), 2)}×.")
    for comp in ("raw", "zstd"):
        for cache in ("warm", "cold", "sparse"):
            x = res.ratio_of_rounds(f"{comp} {cache} get", "shardfs", "swh")
            res.goal(f"get >= 1.2x MosaicReader.lookup, {comp} {cache}", x, ">=", 1.2, shown=H.times(x))
            x = res.ratio_of_rounds(f"{comp} {cache} get_batch", "shardfs", "swh")
            res.goal(f"get_batch >= 1.5x MosaicReader.get_batch, {comp} {cache}", x, ">=", 1.5, shown=H.times(x))
    res.write()


if __name__ == "__main__":
    main()
