"""Perfect-hash build benchmark: shardfs's own CHD_PH builder
(``shardfs/c/chd_build.c``) against cmph's (``SHARDFS_CHD_BUILDER=cmph``),
inside ``ShardWriter.close()``, in the same run.

For each key count (100k and 1M; 10M too unless ``--quick``), a shard of
that many random 32-byte keys with empty objects is written with each
builder in turn, the order swapped every repetition (cmph, ours, ours, cmph,
cmph, ours), 3 repetitions; figures are the best of the 3 per builder:

* ``build``: ``build_stats["hash_seconds"]``, the CHD_PH build alone (ours:
  hashing, bucketing, displacement search, dump encoding; cmph: cmph_new and
  cmph_dump into memory);
* ``check``: ``build_stats["check_seconds"]``, what the writer does next
  whatever the builder: our parser over the dump, cmph_load (ours only: cmph's
  builder hands over its function) and every key through cmph_search and
  our evaluator, slot uniqueness;
* ``close``: the whole ``ShardWriter.close()`` (index, fdatasync included).

Also the shard's hash section size (bytes after ``hash_position``) and slots.
Units: ns per key (seconds / keys), bytes, bits per key. Wall clock
(``time.perf_counter`` for close; CLOCK_MONOTONIC in C for the stats). The
machine may be shared: compare within one run.

Goal lines (issue 12): ours ≤ 100 ns/key for the build at 1M keys, and
the same with the check included; a missing figure is a MISS.

    .venv/bin/python bench/hash_bench.py [--quick] [--out DIR] [--tmp DIR]

Writes ``DIR/hash.json`` and ``DIR/hash.md`` (default bench/results) and
prints the goal lines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPS = 3
GOAL_NS = 100.0
BUILDERS = ("cmph", "shardfs")


def random_keys(n: int, seed: int = 12) -> list:
    rng = random.Random(seed * 1_000_003 + n)
    keys = []
    for start in range(0, n, 1 << 20):  # randbytes takes at most 2^31 bits
        raw = rng.randbytes(32 * min(1 << 20, n - start))
        keys += [raw[i:i + 32] for i in range(0, len(raw), 32)]
    if len(set(keys)) != n:  # 2^-200: never, but a duplicate would fail the build
        raise SystemExit("duplicate random keys")
    return keys


def build(path: str, keys: list, builder: str) -> dict:
    """One shard of empty objects; the stats of its close()."""
    import shardfs

    if builder == "cmph":
        os.environ["SHARDFS_CHD_BUILDER"] = "cmph"
    else:
        os.environ.pop("SHARDFS_CHD_BUILDER", None)
    w = shardfs.ShardWriter(path)
    add = w.add
    for k in keys:
        add(k, b"")
    t = time.perf_counter()
    w.close()
    close_s = time.perf_counter() - t
    stats = dict(w.build_stats)
    if stats["builder"] != builder:
        raise SystemExit(f"asked for the {builder} builder, got {stats['builder']}")
    with shardfs.Shard(path) as s:
        hash_bytes = os.path.getsize(path) - s.header.hash_position
    os.unlink(path)
    return {"build_s": stats["hash_seconds"], "check_s": stats["check_seconds"],
            "close_s": close_s, "slots": stats["slots"], "hash_bytes": hash_bytes}


def measure(n: int, tmp: str, log) -> dict:
    keys = random_keys(n)
    runs = {b: [] for b in BUILDERS}
    for rep in range(REPS):
        order = BUILDERS if rep % 2 == 0 else BUILDERS[::-1]
        for b in order:
            r = build(os.path.join(tmp, f"{b}.shard"), keys, b)
            runs[b].append(r)
            log(f"  {n:,} keys, {b}: build {r['build_s'] / n * 1e9:.0f} ns/key, "
                f"check {r['check_s'] / n * 1e9:.0f} ns/key, close {r['close_s']:.3f} s")
    point = {"keys": n}
    for b, rs in runs.items():
        point[b] = {
            "build_ns": min(r["build_s"] for r in rs) / n * 1e9,
            "check_ns": min(r["check_s"] for r in rs) / n * 1e9,
            "build_check_ns": min(r["build_s"] + r["check_s"] for r in rs) / n * 1e9,
            "close_s": min(r["close_s"] for r in rs),
            "slots": rs[0]["slots"],
            "hash_bytes": rs[0]["hash_bytes"],
            "runs": rs,
        }
    return point


def goal_lines(points: list) -> list:
    at = {p["keys"]: p for p in points}
    p = at.get(1_000_000)

    def verdict(ok):
        return "MET" if ok else "MISS"

    if p is None:
        return ["perfect-hash build ≤ 100 ns/key at 1M keys: no figure MISS",
                "perfect-hash build + check ≤ 100 ns/key at 1M keys: no figure MISS"]
    ours, cmph = p["shardfs"], p["cmph"]
    return [
        f"perfect-hash build ≤ 100 ns/key at 1M keys: ours {ours['build_ns']:.0f} ns/key "
        f"{verdict(ours['build_ns'] <= GOAL_NS)} (cmph {cmph['build_ns']:.0f} ns/key, "
        f"{cmph['build_ns'] / ours['build_ns']:.1f}× ours)",
        f"perfect-hash build + check against cmph ≤ 100 ns/key at 1M keys: ours "
        f"{ours['build_check_ns']:.0f} ns/key {verdict(ours['build_check_ns'] <= GOAL_NS)} "
        f"(cmph's build + the same check: {cmph['build_check_ns']:.0f} ns/key)",
    ]


def markdown(res: dict) -> str:
    out = ["# Perfect-hash build: shardfs's builder against cmph's", "",
           f"{res['date']}, {res['machine']}. Command: `{res['command']}`.", "",
           "Shards of empty objects with random 32-byte keys, written by ShardWriter with each "
           "builder in turn (order swapped each repetition), best of 3 per builder. build = "
           "`build_stats['hash_seconds']` (the CHD_PH build alone); check = "
           "`build_stats['check_seconds']` (dump parsed, cmph_load for ours, every key through "
           "cmph_search and our evaluator, slots unique); close = the whole "
           "`ShardWriter.close()`. Hash section = bytes from `hash_position` to the end.", "",
           "| keys | builder | build ns/key | check ns/key | build + check ns/key | close s "
           "| slots | hash section bytes (bits/key) |",
           "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for p in res["points"]:
        for b in ("shardfs", "cmph"):
            r = p[b]
            out.append(f"| {p['keys']:,} | {b} | {r['build_ns']:.0f} | {r['check_ns']:.0f} "
                       f"| {r['build_check_ns']:.0f} | {r['close_s']:.3f} | {r['slots']:,} "
                       f"| {r['hash_bytes']:,} ({8 * r['hash_bytes'] / p['keys']:.2f}) |")
    out += ["", "Goals:", ""] + [f"    {line}" for line in res["goals"]] + [""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k and 1M keys only (no 10M)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tmp", default=None, help="directory for the shards (default $TMPDIR)")
    args = ap.parse_args()
    sizes = [100_000, 1_000_000] + ([] if args.quick else [10_000_000])
    tmp = tempfile.mkdtemp(prefix="hash-bench-", dir=args.tmp)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    try:
        points = [measure(n, tmp, log) for n in sizes]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.environ.pop("SHARDFS_CHD_BUILDER", None)
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores ({cpu_model()}), kernel {platform.release()}, "
                   f"Python {platform.python_version()}",
        "command": ".venv/bin/python bench/hash_bench.py" + (" --quick" if args.quick else ""),
        "points": points,
    }
    res["goals"] = goal_lines(points)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hash.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "hash.md"), "w") as f:
        f.write(markdown(res))
    for line in res["goals"]:
        print(line)


if __name__ == "__main__":
    main()
