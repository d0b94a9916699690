"""Create benchmark: ``shardfs create`` of a tree of small files against
``tar -cf``, ``mksquashfs -comp lz4`` and swh-shard's ``create``, in the same
run (issue 12: create at the speed of tar).

The tree: 50,000 files (``--files``) of 1 B..4 KiB, uniform (``make_objects``
of build_bench.py, seeded: the same every time; the few duplicates it drops
leave 49,999), in 256 directories, written once to ``--tmp`` (default
``bench/data/create``, git-ignored; on the real disk) and kept there for the
next run. Every output goes to the same directory, hence the same disk.

What is timed, each as a new process, wall clock:

* ``shardfs create OUT TREE``: walk, read, SHA-256, dedup, write, perfect
  hash, fdatasync, rename (interpreter start-up included);
* ``shardfs create OUT --files-from LIST -0``: the same files named by a
  NUL-separated list (written before, untimed);
* ``tar -cf OUT -C PARENT TREE``: reads every file, writes a 512-byte header
  and the padded data per file; no fsync;
* ``mksquashfs TREE OUT -comp lz4 -noappend``: reads, deduplicates,
  compresses with every core; no fsync;
* ``swh-shard create OUT -`` (swh.shard's own command) fed the newline list
  on stdin: reads and hashes every file, then reads each again to write it;
* with ``--before REV``: the ``shardfs create`` of commit REV (its
  ``shardfs/cli.py``, run with the extension built here), for the figures of
  before.

Before each run: the output removed, ``sync()``, and the tree read once
(untimed; this VM pages idle data out, see build_bench.warm_tree), so every
command reads from the page cache. The commands are run in turn, the
starting one rotated at each repetition, ``--reps`` times (default 3); the
best wall-clock time of each counts. CPU time (user + system, all threads)
and peak RSS are kept too.

Goals (issue 12): ``shardfs create`` ≤ 1.2× ``tar -cf`` and ≤ 0.8×
``mksquashfs -comp lz4``; printed as lines ending in MET or MISS (a figure
not measured is a MISS).

    .venv/bin/python bench/create_bench.py [--files N] [--reps N] [--tmp DIR]
        [--out DIR] [--before REV]

Writes ``DIR/create.json`` and ``DIR/create.md`` (DIR: bench/results).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_bench import (  # noqa: E402
    DEFAULT_OUT, REPO, SEED, cli_path, machine_info, make_objects, ratio, rm, run_measured,
    warm_tree, write_results, write_tree,
)

DEFAULT_TMP = os.path.join(REPO, "bench", "data", "create")
GOALS = (("tar -cf", 1.2), ("mksquashfs -comp lz4", 0.8))  # shardfs create ≤ x × tool


def build_tree(tmp: str, n: int, log) -> dict:
    """The tree of ``n`` files under ``tmp``/tree-N, written unless a
    previous run left it complete; the two lists of its files (newline- and
    NUL-separated, in ``shardfs create``'s walk order)."""
    from shardfs.cli import walk_files

    tree = os.path.join(tmp, f"tree-{n}")
    stamp = os.path.join(tmp, f"tree-{n}.done")
    info = {"tree": tree, "list": os.path.join(tmp, f"tree-{n}.list"),
            "list0": os.path.join(tmp, f"tree-{n}.list0")}
    if os.path.exists(stamp):
        with open(stamp) as f:
            info.update(json.load(f))
        log(f"tree {tree}: {info['files']:,} files, {info['file_bytes'] / 1e6:.1f} MB (kept from a "
            f"previous run)")
        return info
    shutil.rmtree(tree, ignore_errors=True)
    t = time.perf_counter()
    _keys, datas = make_objects(n, 1, 4096, seed=SEED)
    info["files"] = write_tree(tree, datas)
    info["file_bytes"] = sum(map(len, datas))
    del datas
    paths = [os.fsencode(p) for p in walk_files(tree)]
    with open(info["list"], "wb") as f:
        f.write(b"".join(p + b"\n" for p in paths))
    with open(info["list0"], "wb") as f:
        f.write(b"".join(p + b"\0" for p in paths))
    os.sync()
    with open(stamp, "w") as f:
        json.dump({"files": info["files"], "file_bytes": info["file_bytes"], "seed": SEED}, f)
    log(f"tree {tree}: {info['files']:,} files, {info['file_bytes'] / 1e6:.1f} MB, written in "
        f"{time.perf_counter() - t:.1f} s (not timed)")
    return info


def before_cli(rev: str, tmp: str) -> str:
    """``shardfs/cli.py`` of commit ``rev``, as a script beside the outputs."""
    text = subprocess.run(["git", "-C", REPO, "show", f"{rev}:shardfs/cli.py"], check=True,
                          capture_output=True).stdout
    path = os.path.join(tmp, "before_cli.py")
    with open(path, "wb") as f:
        f.write(text)
    return path


def commands(info: dict, out: str, before: Optional[str]) -> List[dict]:
    """The timed commands: {name, cmd, output, stdin (a path or None)}."""
    tree = info["tree"]
    parent, base = os.path.split(tree)
    swh = os.path.join(os.path.dirname(sys.executable), "swh-shard")
    cmds = [
        {"name": "shardfs create", "cmd": [cli_path(), "create", f"{out}.shard", tree],
         "output": f"{out}.shard"},
        {"name": "shardfs create --files-from -0",
         "cmd": [cli_path(), "create", f"{out}-list.shard", "--files-from", info["list0"], "-0"],
         "output": f"{out}-list.shard"},
        {"name": "tar -cf", "cmd": ["tar", "-cf", f"{out}.tar", "-C", parent, base],
         "output": f"{out}.tar"},
        {"name": "mksquashfs -comp lz4",
         "cmd": ["mksquashfs", tree, f"{out}.sqfs", "-comp", "lz4", "-noappend", "-quiet",
                 "-no-progress"], "output": f"{out}.sqfs"},
        {"name": "swh-shard create", "cmd": [swh, "create", f"{out}-swh.shard", "-"],
         "output": f"{out}-swh.shard", "stdin": info["list"]},
    ]
    if before:
        cmds.append({"name": "shardfs create (before)",
                     "cmd": [sys.executable, before, "create", f"{out}-before.shard", tree],
                     "output": f"{out}-before.shard"})
    return cmds


def available(cmd: dict) -> Optional[str]:
    """None when the command's program is there, else why not."""
    prog = cmd["cmd"][0]
    if os.path.sep in prog:
        return None if os.access(prog, os.X_OK) else f"{prog} not found"
    return None if shutil.which(prog) else f"{prog} not found on PATH"


def run_all(cmds: List[dict], info: dict, reps: int, log) -> None:
    """Each command ``reps`` times, in turn, rotating the first; results in
    each command dict (``runs``, ``best_s``...)."""
    for c in cmds:
        c["runs"] = []
    for r in range(reps):
        for k in range(len(cmds)):
            c = cmds[(r + k) % len(cmds)]
            if c.get("missing"):
                continue
            rm(c["output"])
            os.sync()
            warm_tree(info["tree"])
            stdin = open(c["stdin"], "rb") if c.get("stdin") else None
            try:
                m = run_measured(c["cmd"], device_of=info["tree"], stdin=stdin)
            except subprocess.CalledProcessError as exc:
                c["missing"] = f"exit status {exc.returncode}"
                log(f"  {c['name']}: failed ({c['missing']})")
                continue
            finally:
                if stdin:
                    stdin.close()
            c["output_bytes"] = os.path.getsize(c["output"])
            c["runs"].append({k: (round(v, 4) if isinstance(v, float) else v) for k, v in m.items()})
            log(f"  rep {r + 1} {c['name']}: {m['seconds']:.3f} s (CPU {m['cpu_s']:.3f} s)")
    for c in cmds:
        rm(c["output"])
        if c["runs"]:
            best = min(c["runs"], key=lambda m: m["seconds"])
            c["best_s"] = best["seconds"]
            c["cpu_s"] = min(m["cpu_s"] for m in c["runs"])
            c["peak_rss_mib"] = max(m["peak_rss_mib"] for m in c["runs"])


def goal_lines(cmds: List[dict]) -> List[str]:
    """The goals, one line each, ending in MET or MISS."""
    by = {c["name"]: c for c in cmds}
    create = by["shardfs create"].get("best_s")
    lines = []
    for tool, limit in GOALS:
        r = ratio(create, by[tool].get("best_s"))
        if r is None:
            why = by["shardfs create"].get("missing") or by[tool].get("missing") or "not measured"
            lines.append(f"GOAL shardfs create ≤ {limit}× {tool}: no figure ({why}) MISS")
        else:
            lines.append(f"GOAL shardfs create ≤ {limit}× {tool}: {create:.3f} s / "
                         f"{by[tool]['best_s']:.3f} s = {r:.2f}× {'MET' if r <= limit else 'MISS'}")
    return lines


def fmt(x: Optional[float], spec: str) -> str:
    return "—" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    m = res["machine"]
    by = {c["name"]: c for c in res["commands"]}
    create = by["shardfs create"].get("best_s")
    out = [
        "# `shardfs create` against tar, mksquashfs and swh-shard",
        "",
        f"Produced by `{res['command']}` on {res['when']} ({res['wall_seconds']} s).",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB, kernel "
        f"{m['kernel']}, Python {m['python']}; shared with other work (load average "
        f"{res['loadavg_before']} before, {res['loadavg_after']} after): figures are the best of "
        f"{res['reps']} alternated runs.",
        "",
        f"Tree: {res['files']:,} files of 1 B..4 KiB ({res['file_bytes'] / 1e6:.1f} MB) in 256 "
        f"directories, on {res['tmp']} (outputs on the same disk), in the page cache.",
        "",
        "| command | best wall s | ratio to shardfs create | CPU s (user+sys) | peak RSS MiB "
        "| output MB | runs (s) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in res["commands"]:
        if not c["runs"]:
            out.append(f"| `{c['name']}` | — | — | — | — | — | {c.get('missing', 'not run')} |")
            continue
        runs = ", ".join(format(r["seconds"], ".3f") for r in c["runs"])
        out.append(
            f"| `{c['name']}` | {c['best_s']:.3f} | {fmt(ratio(c['best_s'], create), '.2f')} "
            f"| {c['cpu_s']:.3f} | {c['peak_rss_mib']:.0f} | {c['output_bytes'] / 1e6:.1f} "
            f"| {runs} |")
    out += ["", "Goals (issue 12):", "", "```"] + res["goal_lines"] + ["```", ""]
    out += [
        "Notes: `shardfs create` includes the interpreter's start-up, the perfect hash, the",
        "fdatasync of the shard and the rename; tar and mksquashfs do not sync. mksquashfs",
        "compresses on every core. swh-shard create reads each file twice (hash, then write).",
        "Commands:",
        "",
    ]
    for c in res["commands"]:
        cmd = " ".join(_rel(a) for a in c["cmd"])
        out.append(f"- `{c['name']}`: `{cmd}`" + (f" < `{_rel(c['stdin'])}`" if c.get("stdin") else ""))
    return "\n".join(out) + "\n"


def _rel(path: str) -> str:
    """A path inside the repository, relative to it."""
    return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=50_000, help="files in the tree (default 50000)")
    ap.add_argument("--reps", type=int, default=3, help="runs of each command (default 3)")
    ap.add_argument("--tmp", default=DEFAULT_TMP,
                    help="where the tree is kept and the outputs written (default bench/data/create)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="results directory (default bench/results)")
    ap.add_argument("--before", metavar="REV",
                    help="also time the shardfs create of commit REV (its shardfs/cli.py)")
    args = ap.parse_args(argv)
    os.makedirs(args.tmp, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    info = build_tree(args.tmp, args.files, log)
    scratch = tempfile.mkdtemp(prefix="create-bench-", dir=args.tmp)
    try:
        before = before_cli(args.before, scratch) if args.before else None
        cmds = commands(info, os.path.join(scratch, "out"), before)
        for c in cmds:
            c["missing"] = available(c)
            if c["missing"]:
                log(f"  {c['name']}: not timed ({c['missing']})")
        load_before = _loadavg()
        run_all(cmds, info, args.reps, log)
        load_after = _loadavg()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = goal_lines(cmds)
    rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    res = {
        "benchmark": "create", "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO)
                             else sys.executable, os.path.relpath(__file__, REPO)]
                            + list(argv if argv is not None else sys.argv[1:])),
        "commit": rev, "before": args.before, "machine": machine_info(),
        "loadavg_before": load_before, "loadavg_after": load_after,
        "tmp": args.tmp, "files": info["files"], "file_bytes": info["file_bytes"], "reps": args.reps,
        "units": {"*_s": "seconds", "peak_rss_mib": "MiB", "output_bytes": "bytes"},
        "commands": [{k: v for k, v in c.items() if k != "output"} for c in cmds],
        "goal_lines": lines, "wall_seconds": round(time.perf_counter() - t_start, 1),
    }
    md = markdown(res)
    write_results(args.out, "create", res, md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
