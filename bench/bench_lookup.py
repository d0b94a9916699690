"""Lookup benchmark: a key's lookup plus the read of its whole object, per
second, through shardfs's C and Python APIs against swh-shard's Python API,
all on the same shard.

Interfaces (each looks up a key and gets all of its object's bytes):

- `C`: bench/c/lookup_bench.c, sfs_lookup + sfs_read into a buffer; the
  threads share one reader.
- `Shard`: shardfs.Shard, s[key]; the threads share one Shard.
- `get_batch`: Shard.get_batch over batches of --batch keys (default 1,000);
  `--batch N --only get_batch,Shard,medium,hot` is the batch-length probe.
- `swh`: swh.shard.Shard.lookup (swh-shard from PyPI; not installed: not
  measured); one reader per thread (its reader is not thread-safe).

1 and 2 threads, each a contiguous half of the keys, from a common start.
Datasets (harness.dataset, shard only): `small`, 1..4096 B objects (20,000
quick, 200,000 full) and `medium`, 64 KiB objects (1,000 / 8,000).
Caches (sizes: small quick / full, medium quick / full): `hot`, the keys
shuffled and repeated to a pass of 100,000 / 1,000,000 and 10,000 / 50,000
lookups, one untimed pass, then one timed; `cold`, drop_caches, the shard
opened afresh, one timed pass over a random sample of 1,000 / 5,000 and
200 / 1,000 keys.

Figures: lookups per second (lookup + read; the pass's keys over its wall
seconds), median of 3 interleaved rounds (--quick too); MB/s of object
bytes; cold, the read requests and KiB the shard's block device served per
lookup (the device's counters around the run, the shard's open included:
system-wide, so noisy on a busy machine). Ratios are medians of same-round
ratios, against swh 1 thread (× swh 1t) or the same interface on 1 thread
(× 1t). The mount (open/read/close of MNT/<key>) is measured by bench_mount.py.

Goals, each for small hot, small cold and medium cold (medium hot is shown
without one: a batch of 64 KiB objects is bound by memory, not lookups):
- Python API lookup+read ≥ 2× swh-shard (1 thread): Shard 1t / swh 1t
- Python API 2 threads ≥ 0.9× its 1-thread figure: Shard 2t / Shard 1t
- get_batch ≥ 4× swh-shard (1 thread): get_batch 1t / swh 1t
- get_batch 2 threads ≥ 1.6× its 1-thread figure: get_batch 2t / get_batch 1t
"""
from __future__ import annotations

import glob
import json
import os
import random
import sys

import harness as H
import shardfs

try:
    from swh.shard import Shard as SwhShard
except ImportError:
    SwhShard = None

PLAN = {  # kind -> (objects, hot pass lookups, cold sample), quick then full
    "small": ((20_000, 100_000, 1_000), (200_000, 1_000_000, 5_000)),
    "medium": ((1_000, 10_000, 200), (8_000, 50_000, 1_000)),
}
IFACES = ("C", "Shard", "get_batch", "swh")
LABEL = {"C": "C API", "Shard": "shardfs.Shard s[key]", "get_batch": "get_batch", "swh": "swh.shard.Shard.lookup"}
CACHES = ("hot", "cold")
GOAL_KINDS = ("small hot", "small cold", "medium cold")
GOALS = (("Python API lookup+read ≥ 2× swh-shard (1 thread)", "Shard 1t", "swh 1t", 2.0),
         ("Python API 2 threads ≥ 0.9× its 1-thread figure", "Shard 2t", "Shard 1t", 0.9),
         ("get_batch ≥ 4× swh-shard (1 thread)", "get_batch 1t", "swh 1t", 4.0),
         ("get_batch 2 threads ≥ 1.6× its 1-thread figure", "get_batch 2t", "get_batch 1t", 1.6))
WORK = "/tmp/bench-lookup"


def lookup_bench() -> str:
    """bench/c/lookup_bench.c built against the C core (again when it changes)."""
    core = os.path.join(H.ROOT, "shardfs", "c")
    # shard.c, every kind of source (kind_*.c) and what they call; rbd.c
    # without SFS_HAVE_RBD (no librbd: rbd: sources refused); the mosaic kind's
    # reader (libzstd, zlib) and the s3 kind's client (libcurl, loaded with dlopen)
    sources = [os.path.join(core, f) for f in ("shard.c", "chd.c", "rbd.c", "output.c", "mosaic.c", "gof.c",
                                               "remote_copy.c", "s3.c")]
    sources += sorted(glob.glob(os.path.join(core, "kind_*.c")))
    return H.compile_c("lookup_bench", ["-std=gnu11", "-I" + core, *sources, "-lzstd", "-lz", "-ldl"],
                       glob.glob(os.path.join(core, "*.h")))


def python_pass(iface: str, path: str, keys: list, threads: int, batch: int, warm: bool) -> float:
    """Seconds of one timed pass of `iface` over `keys` (after an untimed one
    if `warm`); the readers are opened before and closed after."""
    if iface == "swh" and SwhShard is None:
        raise H.Skip("swh-shard is not installed (pip install swh-shard)")
    readers = [SwhShard(path) for _ in range(threads)] if iface == "swh" else [shardfs.Shard(path)]
    free: list = []

    def work(share):
        r = free.pop()
        if iface == "get_batch":
            for i in range(0, len(share), batch):
                r.get_batch(share[i:i + batch])
        else:
            get = r.lookup if iface == "swh" else r.__getitem__
            for k in share:
                get(k)

    def one_pass():
        free[:] = [readers[i % len(readers)] for i in range(threads)]
        return H.threaded(work, keys, threads)

    try:
        if warm:
            one_pass()
        return one_pass()
    finally:
        for r in readers:
            r.close()


def main() -> None:
    def extra(p):
        p.add_argument("--batch", type=int, default=1000, help="keys per get_batch call (default 1000)")
        p.set_defaults(rounds=3)  # quick too: a single round's ratios are a coin toss, and 3 take a minute

    args = H.main_args(__doc__.split("\n\n")[0], extra=extra)
    groups = (set(IFACES), set(PLAN), set(CACHES))
    unknown = args.only - set().union(*groups)
    if unknown:
        sys.exit(f"--only: unknown {', '.join(sorted(unknown))}; known: {', '.join(IFACES + tuple(PLAN) + CACHES)}")

    def chosen(*values):  # each of interface, kind, cache in --only (or its group not named there)
        return all(not (args.only & g) or v in args.only for g, v in zip(groups, values))

    res = H.Results("lookup", "Lookup + read per second: shardfs C and Python APIs against swh-shard",
                    args.quick, sys.argv[1:])
    os.makedirs(WORK, exist_ok=True)
    rng = random.Random(1)
    sets, runs_of = {}, {}
    for kind, plans in PLAN.items():
        count, hot_n, cold_n = plans[0 if args.quick else 1]
        if not any(chosen(i, kind, c) for i in IFACES for c in CACHES):
            continue
        ds = H.dataset(kind, count, native=False)
        keys = [bytes.fromhex(k) for k in ds.keys]
        size = dict(zip(keys, ds.sizes))
        hot = [k for _ in range(-(-hot_n // count)) for k in rng.sample(keys, count)][:hot_n]
        for cache, ks in (("hot", hot), ("cold", rng.sample(keys, cold_n))):
            keyfile = os.path.join(WORK, f"{kind}-{count}-{cache}.keys")
            with open(keyfile, "wb") as f:
                f.write(b"".join(ks))
            runs_of[kind, cache] = (ks, keyfile, sum(size[k] for k in ks))
        sets[kind] = ds
        res.text(f"**{kind}**: {count:,} objects of {'1..4096 B' if kind == 'small' else '64 KiB'}, shard "
                 f"{os.path.getsize(ds.shard) / 1e6:,.0f} MB; hot passes of {hot_n:,} lookups, "
                 f"cold passes of {cold_n:,}.")

    def measure(kind, cache, iface, threads):
        shard, (keys, keyfile, nbytes) = sets[kind].shard, runs_of[kind, cache]
        if cache == "cold":
            H.drop_caches()
        before = H.device_reads(shard)
        if iface == "C":
            cmd = [lookup_bench(), shard, keyfile, str(threads)] + ["--warm"] * (cache == "hot")
            seconds = json.loads(H.sh(cmd))["seconds"]
        else:
            seconds = python_pass(iface, shard, keys, threads, args.batch, cache == "hot")
        after = H.device_reads(shard)
        out = {"value": len(keys) / seconds, "seconds": seconds, "lookups": len(keys), "bytes": nbytes}
        if cache == "cold":
            out.update(device_reads=(after[0] - before[0]) / len(keys),
                       device_kib=(after[1] - before[1]) / 1024 / len(keys))
        return out

    configs = [(k, c, i, t) for k in sets for c in CACHES for i in IFACES for t in (1, 2) if chosen(i, k, c)]
    H.rounds(args.rounds, configs, lambda r, cfg: res.attempt(
        f"{cfg[0]} {cfg[1]}", f"{cfg[2]} {cfg[3]}t", r, lambda: measure(*cfg)))

    rows = []
    for kind, cache, iface, threads in configs:
        m, t = f"{kind} {cache}", f"{iface} {threads}t"
        v, bpl = res.value(m, t), runs_of[kind, cache][2] / len(runs_of[kind, cache][0])
        if v is None:
            continue
        x1 = res.ratio_of_rounds(m, t, f"{iface} 1t") if threads == 2 else None
        rows.append([kind, cache, LABEL[iface] + (f"({args.batch})" if iface == "get_batch" else ""), threads,
                     H.fmt(v), H.fmt(res.ratio_of_rounds(m, t, "swh 1t"), 2), H.fmt(x1, 2), H.fmt(v * bpl / 1e6),
                     H.fmt(res.value(m, t, "device_reads"), 1), H.fmt(res.value(m, t, "device_kib"), 1)])
    res.table(["dataset", "cache", "interface", "threads", "lookups/s", "× swh 1t", "× 1t", "MB/s",
               "device reads / lookup", "KiB read / lookup"], rows,
              f"Medians of {args.rounds} interleaved round(s); — : not measured or not applicable.")

    suffix = "" if args.batch == 1000 else f" (batches of {args.batch:,})"
    ran = {(f"{k} {c}", f"{i} {t}t") for k, c, i, t in configs}
    for text, a, b, threshold in GOALS:  # with --only, the goals it leaves whole
        for m in GOAL_KINDS:
            if args.only and not {(m, a), (m, b)} <= ran:
                continue
            x = res.ratio_of_rounds(m, a, b)
            res.goal(f"{text}{suffix if 'get_batch' in a else ''}, {m}", x, ">=", threshold, shown=H.times(x))

    def draw(ax):
        measures = [f"{k} {c}" for k in sets for c in CACHES]
        targets = [f"{i} {t}t" for i in IFACES for t in (1, 2)]
        width = 0.8 / len(targets)
        for j, t in enumerate(targets):
            ax.bar([i + j * width for i in range(len(measures))], [res.value(m, t) or float("nan") for m in measures],
                   width, label=t, color=f"C{IFACES.index(t.split()[0])}", hatch="//" if t.endswith("2t") else "")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(measures))], measures)
        ax.set_yscale("log")
        ax.set_ylabel("lookups + reads per second (median, log)")
        ax.legend(fontsize=7, ncol=4)

    res.plot("rate", draw)
    res.write()


if __name__ == "__main__":
    main()
