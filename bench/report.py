"""Assemble bench/results/README.md: the machine, the goals, and each part.

Each benchmark writes its own Markdown section and PNG plots under
bench/results/ (fio.md, build.md, lookup.md, ...) and prints goal lines
ending in PASS or MISS. This script gathers the
sections that exist, the goal lines the benchmarks printed (collected by the
Makefile in bench/results/goals.txt), and a description of this machine
into one report.

    python bench/report.py [--out bench/results]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model  # noqa: E402

SECTIONS = [
    ("build.md", "Build"),
    ("lookup.md", "Lookups"),
    ("fio.md", "Reads through the mount (fio)"),
    ("scale.md", "Scale: 1,000 shards, start time, memory"),
]


def _run(cmd: list) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_description(path: str) -> str:
    """Markdown bullet list: CPU, cores, memory, disk, kernel, versions."""
    cpu = cpu_model()
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    usage = shutil.disk_usage(path)
    fs = _run(["df", "-T", path]).splitlines()[-1:] or [""]
    fs_type = fs[0].split()[1] if len(fs[0].split()) > 1 else "?"
    try:
        import pyfuse3  # noqa: F401
        pyfuse3_version = getattr(pyfuse3, "__version__", "?")
    except ImportError:
        pyfuse3_version = "not installed"
    lines = [
        f"- CPU: {cpu}, {os.cpu_count()} cores",
        f"- memory: {mem_gib:.0f} GiB",
        f"- disk: {usage.total / 1e9:.0f} GB {fs_type} (virtual disk; a cold random 4 KiB "
        "pread takes about 35 µs)",
        f"- kernel: {platform.release()}",
        f"- Python {platform.python_version()}, pyfuse3 {pyfuse3_version}, "
        f"{_run(['fio', '--version']) or 'fio not installed'}",
        f"- date: {datetime.date.today().isoformat()}; the machine is shared: figures are "
        "the best of short repetitions and vary by ±20% between runs",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = parser.parse_args(argv)
    out = args.out
    os.makedirs(out, exist_ok=True)
    parts = [
        "# shardfs benchmark results",
        "",
        "Produced by `make bench` (quick) or `make bench-full`; each section "
        "names the script that reproduces it.",
        "",
        "## Machine",
        "",
        machine_description(out),
        "",
    ]
    goals_path = os.path.join(out, "goals.txt")
    if os.path.exists(goals_path):
        with open(goals_path) as f:
            goals = [line.strip() for line in f if line.strip()]
        parts += ["## Goals", "", "As printed by the benchmarks (PASS / MISS):", "", "```"]
        parts += goals
        parts += ["```", ""]
    for filename, title in SECTIONS:
        path = os.path.join(out, filename)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            body = f.read().strip()
        parts += [f"## {title}", "", body, ""]
    report = os.path.join(out, "README.md")
    with open(report, "w") as f:
        f.write("\n".join(parts))
    print(f"wrote {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
