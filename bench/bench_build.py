"""Build benchmark: writing a shard, against copying it, building its perfect
hash, and `shardfs create` of a tree, against tar, mksquashfs and swh-shard.

Measures (every figure the median of interleaved rounds, order rotated):

- **write KIND N** (N objects held in memory, `harness.objects(N, KIND)`:
  "small" 1..4096 B, "tiny" 16..256 B): wall seconds of `ShardWriter` from
  open to `close()` (perfect hash, index, fdatasync, rename), the split of
  `close()` from `build_stats` (hash_seconds = the CHD build, check_seconds
  = every key against cmph, index, sync, the adds as the rest) and the
  writer's peak RSS above its start (MiB, /proc/self/clear_refs); swh's
  `ShardCreator` (peer `swh.shard`, not measured when missing) on the same
  objects; `cp` of the shard (same disk): warm (source read just before),
  cold (`drop_caches` first), warm + fsync of the copy. Seconds.
- **hash N** (N keys with empty objects): the perfect-hash build in ns/key,
  ours against cmph's (`SHARDFS_CHD_BUILDER=cmph`), `build_stats` of
  `ShardWriter.close()`; also check ns/key, close() s, slots, hash section
  bytes, and the writer's peak RSS per key (MiB above its start).
- **create N** (the N plain files of `harness.dataset("small", N)`, Software
  Heritage's ab/cd/KEY layout, read once before each run so the page cache
  is warm; the device's reads during the run show it): wall, CPU s, peak
  RSS (GNU time) and output MB of `shardfs create OUT TREE`, `shardfs
  create --files-from LIST -0`, `tar -cf`, `mksquashfs -comp lz4`,
  `swh-shard create` (peer), `shardfs --version` (start-up), and with
  `--before REV` that commit's `shardfs/cli.py`. Outputs on the same disk.

Sets: `--quick` write small 10k and 100k and tiny 1M, hash 100k and 1M,
create 20k files (1 round); full: write small 10k, 100k and 1M and tiny 1M,
hash 100k and 1M, create 100k files (3 rounds). 10M objects or keys (the old
full sets) are not run: 20 GB of shard and copies, a quarter of an hour.

Goals: ShardWriter ≤ 1.5× cold cp of its shard at every point; perfect hash
≤ 10% of cold cp at every point; linear growth (log-log slope over counts:
ShardWriter over the small ones ≤ 1.1, perfect hash ≤ 1.15); our
perfect-hash build ≤ 100 ns/key at 1M keys, and with the check; `shardfs
create` ≤ 1.2× `tar -cf` and ≤ 0.8× `mksquashfs -comp lz4`.
"""
from __future__ import annotations

import ctypes
import math
import os
import shutil
import sys
import statistics
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (DATA, ROOT, VENV, Results, Skip, dataset, device_reads, drop_caches,  # noqa: E402
                     fmt, log, main_args, memory, objects, rounds, sh, timed, times)

import shardfs  # noqa: E402

SCRATCH = os.path.join(DATA, "build-scratch")
SIZES = {"small": "1..4096 B", "tiny": "16..256 B"}  # harness.objects kinds
WRITERS = ["ShardWriter", "swh ShardCreator", "cp warm", "cp cold", "cp+fsync"]
SPLIT = ["hash_seconds", "check_seconds", "index_seconds", "sync_seconds"]


def peak_above(fn):
    """(fn(), MiB this process's peak RSS rose above its RSS at the start):
    freed memory given back first (malloc_trim), the peak reset
    (clear_refs 5)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5\n")
    base = memory(os.getpid())["VmRSS"]
    out = fn()
    return out, memory(os.getpid())["VmHWM"] - base


def loglog_slope(xs, ys):
    """Least-squares slope of log y against log x (1 = linear); None under 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y]
    return statistics.linear_regression(*zip(*pts)).slope if len(pts) >= 2 else None


def rm(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


# ------------------------------------------------------------------ write N


def measure_write(res: Results, kind: str, n: int, nrounds: int) -> None:
    m = f"write {kind} {n}"
    log(f"{m}: generating {n:,} objects")
    keys, datas = map(list, zip(*objects(n, kind)))
    ref, out, copy = (os.path.join(SCRATCH, f) for f in ("ref.shard", "out.shard", "copy.shard"))
    with shardfs.ShardWriter(ref) as w:  # the file the copies copy (untimed)
        for k, d in zip(keys, datas):
            w.add(k, d)
    size = os.path.getsize(ref)

    def writer():
        w = shardfs.ShardWriter(out)
        for k, d in zip(keys, datas):
            w.add(k, d)
        w.close()
        return w.build_stats

    def swh():
        try:
            from swh.shard import ShardCreator
        except ImportError:
            raise Skip("swh.shard is not installed")
        with ShardCreator(out, n) as c:
            for k, d in zip(keys, datas):
                c.write(k, d)

    def cp(target):
        if target == "cp cold":
            drop_caches()
        else:
            with open(ref, "rb", buffering=0) as f:
                while f.read(8 << 20):
                    pass
            os.sync()
        r = timed(["cp", ref, copy])
        if target == "cp+fsync":
            t0, fd = time.perf_counter(), os.open(copy, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            r["seconds"] += time.perf_counter() - t0
        rm(copy)
        return {"value": r["seconds"], "bytes": size}

    def build(fn):
        os.sync()
        t0 = time.perf_counter()
        stats, peak = peak_above(fn)
        seconds = time.perf_counter() - t0
        rm(out)
        return seconds, stats or {}, peak

    def one(r, target):
        if target.startswith("cp"):
            return cp(target)
        seconds, stats, peak = build(writer if target == "ShardWriter" else swh)
        if stats:
            res.add(m, "perfect hash", stats["hash_seconds"], r)
        return {"value": seconds, "peak_mib": peak, "bytes_per_object": peak * 2**20 / n, **stats}

    try:
        rounds(nrounds, WRITERS, lambda r, t: res.attempt(m, t, r, lambda: one(r, t)))
    finally:
        rm(ref)
        os.sync()
    res.add(m, "shard bytes", size)


def report_write(res: Results, points) -> None:
    rows, split = [], []
    for kind, n in points:
        m = f"write {kind} {n}"

        def v(t, key="value"):
            return res.value(m, t, key)
        cold = v("cp cold")

        def x(t, pct=False):
            r = res.ratio_of_rounds(m, t, "cp cold")
            return fmt(v(t), 3) + (f" ({fmt(100 * r, 1)}%)" if pct and r else f" ({times(r)})" if r else "")
        rows.append([f"{n:,}", SIZES[kind], fmt((v("shard bytes") or 0) / 1e6, 1), fmt(v("cp warm"), 3), fmt(cold, 3),
                     fmt(v("cp+fsync"), 3), x("ShardWriter"), x("perfect hash", True), x("swh ShardCreator"),
                     f"{fmt(v('ShardWriter', 'peak_mib'), 1)} / {fmt(v('swh ShardCreator', 'peak_mib'), 1)}"])
        parts = [v("ShardWriter", k) for k in SPLIT]
        rest = v("ShardWriter") - sum(parts) if None not in parts and v("ShardWriter") else None
        split.append([f"{n:,} ({SIZES[kind]})", *(fmt(p, 4) for p in parts), fmt(rest, 4),
                      fmt(v("ShardWriter", "slots")), fmt(parts[0] and parts[0] / n * 1e9),
                      fmt(v("ShardWriter", "bytes_per_object"), 1)])
    res.table(["objects", "sizes", "shard MB", "cp warm s", "cp cold s", "cp+fsync s", "ShardWriter s (× cold cp)",
               "perfect hash s (% of cold cp)", "swh ShardCreator s (× cold cp)", "peak RSS MiB: ShardWriter / swh"],
              rows, "**write N**: N objects from memory, seconds (median; ratios: median of each "
                    "round's ratio to the cold cp of the shard).")
    res.table(["objects", "perfect hash s", "check against cmph s", "index + hash write s",
               "header, fdatasync, rename s", "adds (the rest) s", "slots", "hash ns/key", "writer peak B/object"],
              split, "Where ShardWriter's time goes (`build_stats` of `close()`, medians).")

    def goal(text, t, threshold, unit):
        rs = [(f"{n:,} {kind}", res.ratio_of_rounds(f"write {kind} {n}", t, "cp cold")) for kind, n in points]
        worst = max((r for _, r in rs if r is not None), default=None)
        res.goal(text, None if None in [r for _, r in rs] else worst, "<=", threshold,
                 ", ".join(f"{fmt(r and r * (100 if unit == '%' else 1), 2)}{unit} at {at}" for at, r in rs))
    goal("ShardWriter ≤ 1.5× cold cp of its shard, at every point", "ShardWriter", 1.5, "×")
    goal("perfect hash ≤ 10% of cold cp, at every point", "perfect hash", 0.10, "%")
    # ShardWriter over the counts of one size distribution; the hash over all (it depends on keys only)
    for t, limit, pts in (("ShardWriter", 1.1, [p for p in points if p[0] == "small"]), ("perfect hash", 1.15, points)):
        s = loglog_slope([n for _, n in pts], [res.value(f"write {k} {n}", t) for k, n in pts])
        per = ", ".join(f"{fmt((res.value(f'write {k} {n}', t) or 0) / n * 1e9)} ns at {n:,} {k}" for k, n in pts)
        res.goal(f"linear growth: {t} time, log-log slope over counts ≤ {limit}", s, "<=", limit,
                 f"{fmt(s, 2)} (per object: {per})")

    def draw(ax):
        for i, (t, style) in enumerate((("ShardWriter", "o-"), ("swh ShardCreator", "s-"), ("cp cold", "x--"),
                                        ("cp warm", "+:"), ("cp+fsync", "v:"), ("perfect hash", "d-"))):
            for kind in SIZES:
                pts = [(n, res.value(f"write {k} {n}", t)) for k, n in points if k == kind]
                if any(y for _, y in pts):
                    ax.plot(*zip(*pts), style, color=f"C{i}", label=t if kind == "small" else None,
                            markerfacecolor="none" if kind == "tiny" else f"C{i}")
        ax.set(xscale="log", yscale="log", xlabel="objects", ylabel="seconds (median)",
               title="Writing a shard against copying it (filled: 1..4096 B; hollow: 16..256 B)")
        ax.legend(fontsize=7)
    res.plot("time", draw)


# ------------------------------------------------------------------ hash N


def measure_hash(res: Results, n: int, nrounds: int) -> None:
    m = f"hash {n}"
    log(f"{m}: generating {n:,} keys")
    keys = [k for k, _ in objects(n, "tiny")]
    path = os.path.join(SCRATCH, "hash.shard")

    def one(builder):
        os.environ.pop("SHARDFS_CHD_BUILDER", None)
        if builder == "cmph":
            os.environ["SHARDFS_CHD_BUILDER"] = "cmph"

        def write():
            w = shardfs.ShardWriter(path)
            for k in keys:
                w.add(k, b"")
            t0 = time.perf_counter()
            w.close()
            return w.build_stats, time.perf_counter() - t0
        try:
            (st, close_s), peak = peak_above(write)
        finally:
            os.environ.pop("SHARDFS_CHD_BUILDER", None)
        if st["builder"] != builder:
            raise RuntimeError(f"asked for the {builder} builder, got {st['builder']}")
        with shardfs.Shard(path) as s:
            hash_bytes = os.path.getsize(path) - s.header.hash_position
        rm(path)
        return {"value": st["hash_seconds"] / n * 1e9, "check_ns": st["check_seconds"] / n * 1e9,
                "build_check_ns": (st["hash_seconds"] + st["check_seconds"]) / n * 1e9, "close_s": close_s,
                "slots": st["slots"], "hash_bytes": hash_bytes, "peak_mib": peak, "bytes_per_key": peak * 2**20 / n}

    rounds(nrounds, ["shardfs", "cmph"], lambda r, b: res.attempt(m, b, r, lambda: one(b)))


def report_hash(res: Results, counts) -> None:
    rows = []
    for n in counts:
        for b in ("shardfs", "cmph"):
            v = (lambda key="value": res.value(f"hash {n}", b, key))
            hb = v("hash_bytes")
            rows.append([f"{n:,}", b, fmt(v()), fmt(v("check_ns")), fmt(v("build_check_ns")), fmt(v("close_s"), 3),
                         fmt(v("slots")), f"{fmt(hb)} ({fmt(hb and 8 * hb / n, 2)})",
                         f"{fmt(v('peak_mib'), 1)} ({fmt(v('bytes_per_key'), 1)})"])
    res.table(["keys", "builder", "build ns/key", "check ns/key", "build + check ns/key", "close() s", "slots",
               "hash section bytes (bits/key)", "writer peak MiB (B/key)"], rows,
              "**hash N**: the perfect-hash build, ours against cmph's, inside `ShardWriter.close()` "
              "(keys with empty objects; medians).")
    m = "hash 1000000"
    ours, cmph = res.value(m, "shardfs"), res.value(m, "cmph")
    res.goal("our perfect-hash build ≤ 100 ns/key at 1M keys", ours, "<=", 100,
             f"{fmt(ours)} ns/key (cmph {fmt(cmph)}, {fmt(cmph and ours and cmph / ours, 1)}× ours)")
    both = res.value(m, "shardfs", "build_check_ns")
    res.goal("our perfect-hash build + check against cmph ≤ 100 ns/key at 1M keys", both, "<=", 100,
             f"{fmt(both)} ns/key (cmph's build + the same check {fmt(res.value(m, 'cmph', 'build_check_ns'))})")

    def draw(ax):
        for b, c in (("shardfs", "C0"), ("cmph", "C3")):
            for key, style, label in (("value", "o-", "build"), ("build_check_ns", "x--", "build + check")):
                ax.plot(counts, [res.value(f"hash {n}", b, key) for n in counts], style, color=c,
                        label=f"{b}: {label}")
        ax.axhline(100, color="0.5", lw=1, ls=":", label="goal: 100 ns/key at 1M keys")
        ax.set(xscale="log", xlabel="keys", ylabel="ns per key (median)", title="Perfect-hash build")
        ax.legend(fontsize=8)
    res.plot("hash", draw)


# ------------------------------------------------------------------ create N


def measure_create(res: Results, n: int, nrounds: int, before: str) -> None:
    m = f"create {n}"
    ds = dataset("small", n)
    tree, paths = ds.native_dir, [os.path.join(ds.native_dir, ds.native_relpath(k)) for k in ds.keys]
    lists = {sep: os.path.join(SCRATCH, name) for sep, name in (("\0", "files.list0"), ("\n", "files.list"))}
    for sep, name in lists.items():
        with open(name, "w") as f:
            f.write("".join(p + sep for p in paths))
    cli, o = os.path.join(VENV, "bin", "shardfs"), os.path.join(SCRATCH, "create.out")
    cmds = {"shardfs create": [cli, "create", o, tree],
            "shardfs create --files-from -0": [cli, "create", o, "--files-from", lists["\0"], "-0"],
            "tar -cf": ["tar", "-cf", o, "-C", ds.path, "native"],
            "mksquashfs -comp lz4": ["mksquashfs", tree, o, "-comp", "lz4", "-noappend", "-quiet", "-no-progress"],
            "swh-shard create": [os.path.join(VENV, "bin", "swh-shard"), "create", o, "-"],
            "shardfs --version (start-up)": [cli, "--version"]}
    if before:
        code = sh(["git", "-C", ROOT, "show", f"{before}:shardfs/cli.py"])
        with open(os.path.join(SCRATCH, "before_cli.py"), "wb") as f:
            f.write(code)
        cmds[f"shardfs create ({before})"] = [sys.executable, f.name, "create", o, tree]

    def one(name):
        if not shutil.which(cmds[name][0]):
            raise Skip(f"{cmds[name][0]} not found")
        rm(o)
        os.sync()
        for p in paths:  # warm: the page cache holds the tree
            with open(p, "rb") as f:
                f.read()
        read0 = device_reads(tree)[1]
        r = timed(cmds[name], stdin=lists["\n"] if name.startswith("swh") else "")
        read_mb = (device_reads(tree)[1] - read0) / 1e6
        out_mb = os.path.getsize(o) / 1e6 if os.path.exists(o) else 0
        rm(o)
        return {"value": r["seconds"], "cpu": r["user"] + r["system"], "peak_mib": r["peak_mib"], "out_mb": out_mb,
                "read_mb": read_mb}

    rounds(nrounds, list(cmds), lambda r, name: res.attempt(m, name, r, lambda: one(name)))
    rows = [[f"`{t}`", fmt(res.value(m, t), 3), fmt(res.ratio_of_rounds(m, t, "shardfs create"), 2),
             fmt(res.value(m, t, "cpu"), 3), fmt(res.value(m, t, "peak_mib")), fmt(res.value(m, t, "out_mb"), 1),
             fmt(res.value(m, t, "read_mb"), 1)] for t in cmds]
    res.table(["command", "wall s", "× shardfs create", "CPU s (user + system)", "peak RSS MiB", "output MB",
               "MB read from the device (≈ 0: warm)"],
              rows, f"**create {n}**: {n:,} files of 1..4096 B ({ds.total_bytes / 1e6:.1f} MB) in "
                    "ab/cd/KEY directories, warm; medians. shardfs create includes the start-up, the perfect hash, "
                    "the fdatasync and the rename; tar and mksquashfs (every core) do not sync; swh-shard "
                    "create reads each file twice.")
    for tool, limit in (("tar -cf", 1.2), ("mksquashfs -comp lz4", 0.8)):
        r = res.ratio_of_rounds(m, "shardfs create", tool)
        res.goal(f"shardfs create ≤ {limit}× {tool} ({n:,} files)", r, "<=", limit,
                 f"{fmt(res.value(m, 'shardfs create'), 3)} s / {fmt(res.value(m, tool), 3)} s = {times(r)}")


def main() -> None:
    args = main_args(__doc__.split("\n\n")[0], extra=lambda p: p.add_argument(
        "--before", default="", metavar="REV", help="also time the shardfs create of commit REV"))
    quick = args.quick
    sets = {"write": [("small", 10_000), ("small", 100_000)] + ([] if quick else [("small", 1_000_000)])
            + [("tiny", 1_000_000)], "hash": [100_000, 1_000_000],
            "create": [20_000 if quick else 100_000]}
    res = Results("build", "Build: writing a shard, its perfect hash, shardfs create", quick,
                  sys.argv[1:])
    os.makedirs(SCRATCH, exist_ok=True)
    want = lambda name: not args.only or name in args.only  # noqa: E731
    try:
        if want("write"):
            for kind, n in sets["write"]:
                measure_write(res, kind, n, args.rounds)
            report_write(res, sets["write"])
        if want("hash"):
            for n in sets["hash"]:
                measure_hash(res, n, args.rounds)
            report_hash(res, sets["hash"])
        if want("create"):
            for n in sets["create"]:
                measure_create(res, n, args.rounds, args.before)
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
    res.write()


if __name__ == "__main__":
    main()
