"""Two versions of the mount's read path side by side: open+read+close of
small objects through a shardfs mount, objects per second and the daemon's
CPU microseconds per object (user + system of every process serving the
mount, divided by the objects read), in alternating runs on the same shard.

    .venv/bin/python bench/mount_ab.py --tree /tmp/old --tree . -o workers=2
    .venv/bin/python bench/mount_ab.py --tree . --tree . --options workers=1 --options workers=2
    .venv/bin/python bench/mount_ab.py --cold ...     # drop the page cache before each run

Each --tree is a checkout whose extension is built in place (``python
setup.py build_ext --inplace``); the mount runs ``python -m shardfs mount``
with PYTHONPATH set to it. ``--options`` (one per tree, or one for all) are
the -o options of that tree's mounts. The kernel's caches of the mount are
always fresh (unmounted and mounted again before each run); the page cache
is warm unless --cold (needs root). This machine is shared and noisy: run
several rounds, quote ratios. The shard (20,000 objects of 1 B–4 KiB by
default) is built once in --tmp and reused.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import List, Sequence

PY = sys.executable


def shardfs(tree: str, *args: str) -> None:
    subprocess.run([PY, "-m", "shardfs", *args], check=True, cwd="/",
                   env=dict(os.environ, PYTHONPATH=os.path.abspath(tree)))


def daemon_cpu(mountpoint: str) -> float:
    """CPU seconds used so far by the processes whose command line names
    `mountpoint` (the mount's daemon: coordinator and workers)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if mountpoint.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            continue
    return total / os.sysconf("SC_CLK_TCK")


def read_all(mountpoint: str, names: Sequence[str], readers: int) -> float:
    """Objects per second: `readers` forked processes open, read and close
    their share of `names`, all started at once."""
    r, w = os.pipe()
    pids = []
    for part in (names[i::readers] for i in range(readers)):
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            for name in part:
                fd = os.open(os.path.join(mountpoint, name), os.O_RDONLY)
                while os.read(fd, 65536):
                    pass
                os.close(fd)
            os._exit(0)
        pids.append(pid)
    os.close(r)
    start = time.monotonic()
    os.write(w, b"x" * readers)
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
    return len(names) / (time.monotonic() - start)


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="a checkout (repeat: 2 or more)")
    ap.add_argument("--options", "-o", action="append", default=[],
                    help="-o options of the mounts of the matching --tree (or of all)")
    ap.add_argument("--readers", default="1,4", help="reader counts (default 1,4)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--objects", type=int, default=20_000, help="objects in the shard")
    ap.add_argument("--read", type=int, default=4_000, help="objects read per run")
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each run (root)")
    ap.add_argument("--tmp", default="/tmp/shardfs-mount-ab")
    args = ap.parse_args(argv)
    options = args.options or [""]
    if len(options) not in (1, len(args.tree)):
        ap.error("give one --options for all trees or one per --tree")
    options = options * len(args.tree) if len(options) == 1 else options
    os.makedirs(args.tmp, exist_ok=True)
    shard = os.path.join(args.tmp, f"objects-{args.objects}.shard")
    if not os.path.exists(shard):
        src = os.path.join(args.tmp, "src")
        os.makedirs(src, exist_ok=True)
        rng = random.Random(1)
        for i in range(args.objects):
            with open(os.path.join(src, str(i)), "wb") as f:
                f.write(rng.randbytes(rng.randint(1, 4096)))
        shardfs(args.tree[-1], "create", shard, src)
    mountpoint = os.path.join(args.tmp, "mnt")
    os.makedirs(mountpoint, exist_ok=True)
    results = {}
    for rnd in range(args.rounds):
        for i, (tree, opts) in enumerate(zip(args.tree, options)):
            label = f"{i}:{tree}" + (f" -o {opts}" if opts else "")
            extra = ["-o", opts] if opts else []
            for readers in (int(x) for x in args.readers.split(",")):
                mount = ["mount", "--layout", "flat", "--cache-dir", os.path.join(args.tmp, "cache"),
                         *extra, shard, mountpoint]
                shardfs(tree, *mount)
                try:
                    names = sorted(os.listdir(mountpoint))
                    random.Random(rnd).shuffle(names)
                    names = names[:args.read]
                    time.sleep(0.5)  # the sidecar build, on a first mount
                finally:
                    shardfs(tree, "umount", mountpoint)
                shardfs(tree, *mount)  # fresh kernel caches
                try:
                    if args.cold:
                        subprocess.run("sync; echo 3 > /proc/sys/vm/drop_caches", shell=True, check=True)
                    cpu = daemon_cpu(mountpoint)
                    rate = read_all(mountpoint, names, readers)
                    cpu = (daemon_cpu(mountpoint) - cpu) / len(names) * 1e6
                    requests = json.loads(os.getxattr(mountpoint, "user.shardfs.requests"))
                finally:
                    shardfs(tree, "umount", mountpoint)
                per_object = sum(requests.values()) / len(names)
                results.setdefault((label, readers), []).append((rate, cpu))
                print(f"round {rnd} {label} readers={readers}: {rate:,.0f} objects/s, daemon CPU "
                      f"{cpu:.0f} us/object, {per_object:.2f} requests/object", flush=True)
    print()
    for (label, readers), runs in results.items():
        print(f"{label} readers={readers}: " + ", ".join(f"{r:,.0f}/s {c:.0f} us" for r, c in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
