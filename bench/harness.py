"""What every shardfs benchmark does, once: datasets, targets, cold caches,
rounds, statistics, goal lines and results.

A benchmark (bench/bench_*.py) states what it measures, against what, and
its goals; it gets from here:

- **datasets**: `dataset(kind, count, seed)` builds once and caches under
  bench/data/ a shard and the same objects as plain files (kinds "small",
  "large", "mix", "tiny"), with a flat directory and erofs / squashfs images
  made on demand; `split(ds, shards)` the same objects as N shards;
  `objects(n, lo, hi, seed)` objects in memory for builder benchmarks.
- **targets**: `Target` mounts and unmounts a shardfs mount (any options,
  any checkout's venv), plain files, kernel erofs, squashfuse_ll or the
  FUSE transport floor (bench/c/fuse_null.c); `cold()` remounts and drops
  the kernel's caches; serving processes, their CPU and memory, and the
  `user.shardfs.*` counters.
- **readers**: `read_files` (Python processes or the C reader
  bench/c/open_read.c, started before the caches are dropped), `threaded`,
  `fio`, `timed` (a command's wall time, CPU and peak RSS).
- **statistics**: `rounds` interleaves targets (order rotated each round)
  and every run is kept; figures are medians (the stdlib's `statistics`:
  pyperf and hyperfine run one benchmark's repetitions back to back, and on
  this shared machine interleaving matters more than their outlier
  analysis); ratios are the median of each round's ratio.
- **results**: `Results` writes bench/results/NAME.json (every run) and
  NAME.md (tables, the machine and versions line, the command), plots with
  matplotlib, and goal lines `GOAL text: figure MET|MISS` (a goal not
  measured is a MISS). `report()` gathers bench/results/README.md.

Cold means: FUSE targets unmounted and mounted again, then `sync` and
`echo 3 > /proc/sys/vm/drop_caches` (root).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.environ.get("SHARDFS_BENCH_DATA", os.path.join(HERE, "data"))
RESULTS = os.path.join(HERE, "results")
VENV = os.path.join(ROOT, ".venv")
PY = os.path.join(VENV, "bin", "python")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Skip(Exception):
    """A target or measure that cannot run here; its figure is "not measured"."""


def sh(cmd, timeout: float = 600, **kw) -> bytes:
    """Run `cmd` (a list, or a shell line); its stdout. RuntimeError with the
    end of stderr on a non-zero exit."""
    p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, **kw)
    if p.returncode:
        line = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
        raise RuntimeError(f"{line}: exit {p.returncode}: {p.stderr.decode(errors='replace').strip()[-400:]}")
    return p.stdout


def compile_c(name: str, extra: Sequence[str] = (), deps: Sequence[str] = ()) -> str:
    """bench/c/NAME.c compiled (-O2) with `extra` (sources, flags) into
    bench/data/bin/NAME, again whenever it or one of `deps` (more files it
    depends on: headers, the core's sources) is newer; its path."""
    out = os.path.join(DATA, "bin", name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    src = os.path.join(HERE, "c", name + ".c")
    newest = max(os.path.getmtime(f) for f in [src, *deps, *(e for e in extra if os.path.isfile(e))])
    if not os.path.exists(out) or os.path.getmtime(out) < newest:
        sh(["gcc", "-O2", "-o", out, src, *extra, "-lpthread"])
    return out


# ------------------------------------------------------------------ datasets

POOL_SIZE = 64 << 20       # bytes every object is cut from
MAX_OBJECT = 100_000_000    # the archive's largest content
SIZES = {                   # kind -> draw(rng) in bytes
    "small": lambda r: r.randint(1, 4096),
    "large": lambda r: r.randint(1, MAX_OBJECT),
    # lognormal, median 4 KiB, sigma 2: mostly small, a long tail (mean ~30 KB)
    "mix": lambda r: min(max(int(round(r.lognormvariate(math.log(4096), 2.0))), 1), MAX_OBJECT),
    "tiny": lambda r: r.randint(16, 256),
    "medium": lambda r: 65536,
}
DATASET_VERSION = 2


def _pool(seed: int) -> bytes:
    return random.Random(f"shardfs-bench:pool:{seed}").randbytes(POOL_SIZE)


def _content(pool: bytes, offset: int, size: int, tag: int) -> bytes:
    """`size` bytes of the pool from `offset` (wrapping), the first 8 of them
    XORed with `tag`: distinct, incompressible, one copy to make."""
    body = pool[offset:offset + size]
    while len(body) < size:
        body += pool[:size - len(body)]
    n = min(size, 8)
    head = (int.from_bytes(body[:n], "little") ^ (tag & ((1 << (8 * n)) - 1))).to_bytes(n, "little")
    return head + body[n:]


def objects(count: int, kind: str = "small", seed: int = 1) -> Iterator[Tuple[bytes, bytes]]:
    """`count` distinct (32-byte SHA-256 key, content) of `kind`, seeded, in
    memory (builder and lookup benchmarks). Duplicates (1-2 byte objects) are
    redrawn with a new offset, so there are exactly `count`."""
    pool, rng = _pool(seed), random.Random(f"shardfs-bench:{kind}:{seed}")
    seen = set()
    for i in range(count):
        size, attempt = SIZES[kind](rng), 0
        while True:
            data = _content(pool, rng.randrange(POOL_SIZE), size,
                            (i * 0x9E3779B97F4A7C15 ^ attempt * 0xC2B2AE3D27D4EB4F) & (2**64 - 1))
            key = hashlib.sha256(data).digest()
            if key not in seen:
                break
            attempt += 1
            if attempt % 4 == 0:
                size = SIZES[kind](rng)
        seen.add(key)
        yield key, data


@dataclass
class Dataset:
    """A cached dataset: bench/data/<kind>-n<count>-s<seed>/ holds
    objects.shard, native/ab/cd/<key> (plain files, Software Heritage's
    pathslicing layout), objects.tsv (key, size in storage order) and
    dataset.json (written last: a dataset without it is rebuilt)."""
    kind: str
    count: int
    seed: int
    path: str
    keys: List[str] = field(repr=False)
    sizes: List[int] = field(repr=False)

    @property
    def shard(self) -> str:
        return os.path.join(self.path, "objects.shard")

    @property
    def native_dir(self) -> str:
        return os.path.join(self.path, "native")

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    @staticmethod
    def native_relpath(key: str) -> str:
        return f"{key[0:2]}/{key[2:4]}/{key}"

    def flat(self) -> str:
        """The objects as plain files in one directory (made once)."""
        d = os.path.join(self.path, "flat")
        if not os.path.exists(d + ".done"):
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            for key in self.keys:
                os.link(os.path.join(self.native_dir, self.native_relpath(key)), os.path.join(d, key))
            open(d + ".done", "w").close()
        return d

    def image(self, kind: str) -> str:
        """The flat directory as an image: "erofs" (mkfs.erofs) or "squash"
        (mksquashfs -comp lz4); made once."""
        img = os.path.join(self.path, kind + ".img")
        if not os.path.exists(img + ".done"):
            src = self.flat()
            if kind == "erofs":
                sh(["mkfs.erofs", img, src], timeout=3600)
            else:
                sh(["mksquashfs", src, img, "-comp", "lz4", "-noappend", "-quiet", "-no-progress"], timeout=3600)
            os.sync()
            open(img + ".done", "w").close()
        return img


def _space_check(path: str, kind: str, count: int, factor: float = 2.0) -> None:
    mean = {"small": 2048, "large": MAX_OBJECT / 2, "mix": 30000, "tiny": 136, "medium": 65536}[kind]
    need = count * (factor * mean + 4096) + (64 << 20)
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if free < need:
        raise Skip(f"not enough free space in {probe} for {count:,} {kind} objects: "
                   f"{need / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free")


def dataset(kind: str, count: int, seed: int = 1, native: bool = True) -> Dataset:
    """The dataset (kind, count, seed), built unless cached. `native=False`:
    the shard only (no plain files). Raises Skip when the disk is short."""
    name = f"{kind}-n{count}-s{seed}" + ("" if native else "-shard")
    path = os.path.join(DATA, name)
    try:
        with open(os.path.join(path, "dataset.json")) as f:
            if json.load(f).get("version") == DATASET_VERSION:
                rows = [line.split("\t") for line in open(os.path.join(path, "objects.tsv"))]
                return Dataset(kind, count, seed, path, [r[0] for r in rows], [int(r[1]) for r in rows])
    except (OSError, ValueError):
        pass
    import shardfs
    _space_check(DATA, kind, count, 2.0 if native else 1.0)
    log(f"dataset {name}: building {count:,} objects")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    keys, sizes, t0 = [], [], time.monotonic()
    with shardfs.ShardWriter(os.path.join(path, "objects.shard")) as w, \
            open(os.path.join(path, "objects.tsv"), "w") as tsv:
        for key, data in objects(count, kind, seed):
            w.add(key, data)
            hexkey = key.hex()
            if native:
                p = os.path.join(path, "native", Dataset.native_relpath(hexkey))
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(data)
            tsv.write(f"{hexkey}\t{len(data)}\n")
            keys.append(hexkey)
            sizes.append(len(data))
    os.sync()  # clean pages: drop_caches must be able to drop them
    with open(os.path.join(path, "dataset.json"), "w") as f:
        json.dump({"version": DATASET_VERSION, "kind": kind, "count": count, "seed": seed,
                   "bytes": sum(sizes)}, f)
    log(f"dataset {name}: {sum(sizes) / 1e6:,.1f} MB in {time.monotonic() - t0:.1f} s")
    return Dataset(kind, count, seed, path, keys, sizes)


def split(ds: Dataset, shards: int, procs: int = 2) -> List[str]:
    """The objects of `ds` (its shard) as `shards` shards of consecutive
    objects, cached in bench/data/<ds>-x<shards>/; their paths."""
    d = f"{ds.path}-x{shards}"
    paths = [os.path.join(d, f"{i:06d}.shard") for i in range(shards)]
    if os.path.exists(os.path.join(d, "done")):
        return paths
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    log(f"splitting {ds.count:,} objects into {shards:,} shards")
    bounds = [ds.count * i // shards for i in range(shards + 1)]
    code = ("import sys, shardfs\n"
            "tsv, shard, d, lo, hi, *b = sys.argv[1:]; lo, hi = int(lo), int(hi); b = list(map(int, b))\n"
            "keys = [bytes.fromhex(l.split()[0]) for l in open(tsv)]\n"
            "with shardfs.Shard(shard) as s:\n"
            "    for i in range(lo, hi):\n"
            "        with shardfs.ShardWriter(f'{d}/{i:06d}.shard') as w:\n"
            "            for k in keys[b[i]:b[i + 1]]:\n"
            "                w.add(k, s[k])\n")
    children = [subprocess.Popen([PY, "-c", code, os.path.join(ds.path, "objects.tsv"), ds.shard, d,
                                  str(shards * p // procs), str(shards * (p + 1) // procs), *map(str, bounds)])
                for p in range(procs)]
    if any(c.wait() for c in children):
        raise RuntimeError("split: a writer failed")
    os.sync()
    open(os.path.join(d, "done"), "w").close()
    return paths


# ------------------------------------------------------------------ machine


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def _first_line(cmd: Sequence[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "?"
    except (OSError, subprocess.SubprocessError):
        return "not installed"


def deb_version(package: str) -> str:
    return _first_line(["dpkg-query", "-W", "-f", "${Version}", package])


def machine() -> Dict[str, str]:
    """CPU, cores, memory, kernel, filesystem of bench/data, load average,
    the checkout's commit."""
    cpu = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    os.makedirs(DATA, exist_ok=True)
    fs = _first_line(["findmnt", "-n", "-o", "FSTYPE", "-T", DATA])
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "shardfs", "setup.py"],
                           capture_output=True, text=True).stdout.strip()
    return {"cpu": f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM", "kernel": platform.release(),
            "filesystem": fs, "python": platform.python_version(),
            "commit": _first_line(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]) + ("+dirty" if dirty else ""),
            "loadavg": " ".join(open("/proc/loadavg").read().split()[:3]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


# ------------------------------------------------------------------ processes


def mounted(path: str) -> bool:
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def abort_fuse(path: str) -> None:
    """Abort the FUSE connection mounted at `path` (fusectl), so that readers
    blocked on a hung server get ENOTCONN."""
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == path:
                try:
                    with open(f"/sys/fs/fuse/connections/{fields[2].split(':')[1]}/abort", "w") as a:
                        a.write("1")
                except OSError:
                    pass


def serving_pids(path: str, names: Sequence[str] = ("shardfs.fuse.mount", "squashfuse_ll", "fuse_null")) -> List[int]:
    """The processes whose command line names `path` and one of `names`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if path.encode() in args and any(n.encode() in a for a in args for n in names):
            out.append(int(pid))
    return out


def device_reads(path: str) -> Tuple[int, int]:
    """(read requests, bytes read) so far by the block device holding
    `path` (/sys/dev/block/MAJ:MIN/stat, the partition's counters)."""
    dev = os.stat(path).st_dev
    f = open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat").read().split()
    return int(f[0]), int(f[2]) * 512


def cpu_seconds(pids: Iterable[int]) -> Tuple[float, float]:
    """(user, system) CPU seconds so far of `pids` (their threads included)."""
    user = system = 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(f[11]), system + int(f[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def memory(pid: int) -> Dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile of a process, in MiB."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) / 1024
    return out


def timed(cmd: Sequence[str], timeout: float = 3600, stdin: str = "", **kw) -> Dict[str, float]:
    """Run `cmd` to its end (`stdin`: a file fed to it): wall seconds, user
    and system CPU seconds of it and its children (os.wait4), peak RSS in
    MiB from GNU time (wait4's ru_maxrss would start at this process's RSS,
    inherited over fork; None without /usr/bin/time). RuntimeError on a
    non-zero exit."""
    import tempfile
    with tempfile.NamedTemporaryFile("r") as peak, open(stdin or os.devnull, "rb") as fin:
        gnu_time = ["/usr/bin/time", "-o", peak.name, "-f", "%M"] if os.access("/usr/bin/time", os.X_OK) else []
        t0 = time.monotonic()
        p = subprocess.Popen([*gnu_time, *cmd], stdin=fin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        wall = time.monotonic() - t0
        err = p.stderr.read().decode(errors="replace")
        p.stderr.close()
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode:
            raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {p.returncode}: {err.strip()[-400:]}")
        out = peak.read().split()
    return {"seconds": wall, "user": ru.ru_utime, "system": ru.ru_stime,
            "peak_mib": int(out[-1]) / 1024 if gnu_time and out else None}


# ------------------------------------------------------------------ targets


class Target:
    """Something objects are read from: a directory, mounted or not.

    kind "shardfs" (shardfs mount of `sources` with `options`, from the
    venv `venv`), "plain" (a directory), "erofs" (kernel erofs on a loop
    device), "squashfuse" (squashfuse_ll), "null" (bench/c/fuse_null.c).
    `error` is why it cannot be measured here ("" when it can)."""

    def __init__(self, key: str, label: str, kind: str, path: str, source: str = "",
                 sources: Sequence[str] = (), options: Sequence[str] = (), venv: str = VENV):
        self.key, self.label, self.kind, self.path = key, label, kind, path
        self.source, self.sources, self.options, self.venv = source, list(sources), list(options), venv
        self.error = ""
        if kind != "plain":
            os.makedirs(path, exist_ok=True)
        tool = {"shardfs": os.path.join(venv, "bin", "shardfs"), "erofs": "mkfs.erofs",
                "squashfuse": "squashfuse_ll", "null": "gcc", "plain": "true"}[kind]
        if not (os.access(tool, os.X_OK) or shutil.which(tool)):
            self.error = f"{tool} not found"

    @property
    def fuse(self) -> bool:
        return self.kind in ("shardfs", "squashfuse", "null")

    def mount_cmd(self) -> List[str]:
        if self.kind == "shardfs":
            opts = ["-o", ",".join(self.options)] if self.options else []
            return [os.path.join(self.venv, "bin", "shardfs"), "mount", *self.sources, self.path, *opts]
        if self.kind == "erofs":
            return ["mount", "-t", "erofs", "-o", "loop,ro", self.source, self.path]
        if self.kind == "squashfuse":
            return ["squashfuse_ll", self.source, self.path]
        if self.kind == "null":
            return [compile_c("fuse_null", sh(["pkg-config", "--cflags", "--libs", "fuse3"]).decode().split()),
                    *self.options, self.path]
        return []

    def mount(self) -> None:
        if self.kind != "plain" and not mounted(self.path):
            sh(self.mount_cmd(), timeout=600)

    def umount_cmd(self) -> List[str]:
        return {"shardfs": [os.path.join(self.venv, "bin", "shardfs"), "umount", self.path],
                "erofs": ["umount", self.path]}.get(self.kind, ["fusermount3", "-u", self.path])

    def umount(self) -> None:
        if self.kind == "plain" or not mounted(self.path):
            return
        try:
            sh(self.umount_cmd(), timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"{self.label}: {exc}; aborting the connection, lazy unmount")
            abort_fuse(self.path)
            subprocess.run(["umount", "-l", self.path], capture_output=True)
        deadline = time.monotonic() + 10
        while self.fuse and self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def fresh(self) -> None:
        """Mounted anew (a FUSE server starts with nothing cached)."""
        if self.fuse:
            self.umount()
        self.mount()

    def cold(self) -> None:
        """Mounted anew and the kernel's caches dropped."""
        self.fresh()
        drop_caches()

    def pids(self) -> List[int]:
        return serving_pids(self.path) if self.fuse else []

    def cpu(self) -> Tuple[float, float]:
        return cpu_seconds(self.pids())

    def xattr(self, name: str) -> Optional[dict]:
        """The root's `user.shardfs.NAME` xattr (stats, requests) as a dict,
        or None (not shardfs)."""
        try:
            return json.loads(os.getxattr(self.path, "user.shardfs." + name))
        except OSError:
            return None

    def wait_ready(self, timeout: float = 600) -> Tuple[Optional[float], Optional[float]]:
        """Poll the stats xattr until every served shard has its sidecar, the
        global index covers them all and the lookup records too, where the
        mount keeps them (so that no figure includes their builds):
        (seconds until the sidecars, until the index), each None on
        timeout; the index's None also when the mount has none. The
        seconds until the records are in `records_after` (None likewise)."""
        t0 = time.monotonic()
        t_sc = t_idx = self.records_after = None
        while self.kind == "shardfs" and time.monotonic() < t0 + timeout:
            st, now = self.xattr("stats") or {}, time.monotonic() - t0
            served, idx, rec = st.get("shards") or 0, st.get("index"), st.get("records")
            if t_sc is None and served and st.get("sidecars") == served:
                t_sc = now
            if t_idx is None and idx and served and idx.get("indexed_shards") == served:
                t_idx = now
            if self.records_after is None and rec and served and rec.get("recorded_shards") == served:
                self.records_after = now
            if t_sc is not None and (t_idx is not None or idx is None) and \
                    (self.records_after is not None or rec is None):
                break
            time.sleep(0.05)
        return t_sc, t_idx


def standard_targets(ds: Dataset, mnt: str, which: Sequence[str], before_venv: str = "",
                     options: Sequence[str] = ()) -> List[Target]:
    """Targets serving the objects of `ds` under `mnt`: "shardfs" (flat
    layout, this checkout), "before" (the same from `before_venv`), "plain"
    (flat directory), "erofs", "squash" (squashfuse_ll, lz4), "null"."""
    cache = os.path.join(ds.path, "cache")
    sf = ["layout=flat", f"cache_dir={cache}", *options]
    make = {
        "shardfs": lambda: Target("shardfs", "shardfs", "shardfs", f"{mnt}/shardfs", sources=[ds.shard], options=sf),
        "before": lambda: Target("before", "shardfs before", "shardfs", f"{mnt}/before", sources=[ds.shard],
                                 options=["layout=flat", f"cache_dir={cache}-before"], venv=before_venv),
        "plain": lambda: Target("plain", "plain files", "plain", ds.flat()),
        "erofs": lambda: Target("erofs", "erofs", "erofs", f"{mnt}/erofs", source=ds.image("erofs")),
        "squash": lambda: Target("squash", "squashfuse_ll", "squashfuse", f"{mnt}/squash", source=ds.image("squash")),
        "null": lambda: Target("null", "FUSE floor (fuse_null)", "null", f"{mnt}/null", options=["-s"]),
    }
    out = []
    for key in which:
        if key == "before" and not before_venv:
            continue
        out.append(make[key]())
    return out


# ------------------------------------------------------------------ readers

READER = r"""
import os, sys, time
root, listfile, mode = sys.argv[1:4]
names = open(listfile).read().split()
print("ready", flush=True)
sys.stdin.readline()
n = 0
for name in names:
    if mode == "python":
        with open(os.path.join(root, name), "rb") as f:
            n += len(f.read())
    else:
        with open(os.path.join(root, name), "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                n += len(b)
print(n, time.monotonic(), flush=True)
"""


def read_files(root: str, names: Sequence[str], procs: int = 1, mode: str = "python",
               before: Callable[[], None] = lambda: None, timeout: float = 1800) -> Dict[str, float]:
    """Read every file `root`/NAME whole, the list shared by `procs`
    processes: mode "python" (open(p, 'rb').read(): buffered, one ioctl),
    "raw" (buffering=0), "c" (bench/c/open_read.c, `procs` threads).
    Processes are started and their lists loaded, then `before()` runs
    (make the target cold), then all go. {"seconds", "bytes", "objects"}."""
    import tempfile
    with tempfile.TemporaryDirectory(dir=DATA) as work:
        return _read_files(work, root, names, procs, mode, before, timeout)


def _read_files(work, root, names, procs, mode, before, timeout):
    if mode == "c":
        listfile = os.path.join(work, "all")
        with open(listfile, "w") as f:
            f.write("\n".join(names) + "\n")
        before()
        r = json.loads(sh([compile_c("open_read"), root, listfile, str(procs)], timeout))
        return {"seconds": r["seconds"], "bytes": r["bytes"], "objects": r["files"]}
    children = []
    try:
        for i, chunk in enumerate(shares(names, procs)):
            listfile = os.path.join(work, f"list{i}")
            with open(listfile, "w") as f:
                f.write("\n".join(chunk))
            p = subprocess.Popen([sys.executable, "-c", READER, root, listfile, mode], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            children.append(p)
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"reader did not start: {p.stderr.read()[-300:]}")
        before()
        t0 = time.monotonic()
        for p in children:
            p.stdin.write("go\n")
            p.stdin.flush()
        total, end = 0, t0
        for p in children:
            out, err = p.communicate(timeout=timeout)
            if p.returncode:
                raise RuntimeError(f"reader exit {p.returncode}: {err.strip()[-300:]}")
            n, t1 = out.split()
            total, end = total + int(n), max(end, float(t1))
        return {"seconds": end - t0, "bytes": total, "objects": len(names)}
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
                p.wait()


def shares(items: Sequence, n: int) -> List[Sequence]:
    """`items` cut into `n` contiguous shares (sizes differ by at most one)."""
    return [items[len(items) * i // n:len(items) * (i + 1) // n] for i in range(n)]


def threaded(work: Callable[[Sequence], None], items: Sequence, threads: int) -> float:
    """Seconds for `threads` threads to run work(share) over `items` split
    in contiguous shares, from a common start."""
    barrier, errors = threading.Barrier(threads + 1), []

    def run(share):
        barrier.wait()
        try:
            work(share)
        except BaseException as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=run, args=(s,)) for s in shares(items, threads)]
    for t in pool:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def fio(args: Sequence[str], timeout: float = 1800) -> dict:
    """Run fio with `args` (--output-format=json added); its parsed report.
    The process group is killed on timeout."""
    p = subprocess.Popen(["fio", "--output-format=json", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise RuntimeError("fio: timed out")
    if p.returncode:
        raise RuntimeError(f"fio: exit {p.returncode}: {err.decode(errors='replace').strip()[-400:]}")
    text = out.decode()
    return json.loads(text[text.index("{"):])


# ------------------------------------------------------------------ statistics


def rounds(n: int, items: Sequence, run: Callable[[int, object], None]) -> None:
    """Call run(round, item) for every item in each of `n` rounds, the
    item order rotated by one each round (no item always goes first)."""
    items = list(items)
    for r in range(n):
        k = r % len(items) if items else 0
        for item in items[k:] + items[:k]:
            run(r, item)


def median(values: Iterable[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def times(r: Optional[float]) -> str:
    """A ratio as "1.23×", or "—" when not measured."""
    return "—" if r is None else f"{r:.2f}×"


def fmt(v: Optional[float], digits: int = 0) -> str:
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


# ------------------------------------------------------------------ results


class Results:
    """The figures of one benchmark: every run (JSON), tables, goals, plots.

    runs: dicts with at least "measure", "target", "round" and "value";
    `value(measure, target)` is the median over rounds."""

    def __init__(self, name: str, title: str, quick: bool, args: Sequence[str] = ()):
        self.name, self.title, self.quick = name, title, quick
        self.command = "make bench-full" if not quick else "make bench"
        self.argv = " ".join(["python", f"bench/{os.path.basename(sys.argv[0])}", *args])
        self.meta = machine()
        self.runs: List[dict] = []
        self.sections: List[str] = []
        self.goals: List[str] = []
        self.plots: List[str] = []
        self.errors: Dict[str, str] = {}

    def add(self, measure: str, target: str, value: Optional[float], round_: int = 0, **extra) -> dict:
        run = {"measure": measure, "target": target, "round": round_, "value": value, **extra}
        self.runs.append(run)
        log(f"  {measure} {target} round {round_}: " + (fmt(value, 2) if value is not None else "—")
            + "".join(f" {k}={v}" for k, v in extra.items() if not isinstance(v, (dict, list))))
        return run

    def attempt(self, measure: str, target: str, round_: int, fn: Callable[[], Optional[dict]]) -> None:
        """Run fn() -> {"value": ..., ...} and record it; a failure is logged
        and recorded (the figure becomes "not measured"), never fatal."""
        try:
            out = fn()
        except Skip as exc:
            self.errors[f"{measure}/{target}"] = str(exc)
            return
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
            log(f"  {measure} {target}: failed: {exc}")
            self.errors[f"{measure}/{target}"] = str(exc)[:300]
            return
        if out is not None:
            self.add(measure, target, out.pop("value"), round_, **out)

    def values(self, measure: str, target: str, key: str = "value") -> List[float]:
        return [r[key] for r in self.runs if r["measure"] == measure and r["target"] == target
                and r.get(key) is not None]

    def value(self, measure: str, target: str, key: str = "value") -> Optional[float]:
        return median(self.values(measure, target, key))

    def ratio_of_rounds(self, measure: str, a: str, b: str) -> Optional[float]:
        """Median over rounds of value(a) / value(b) in the same round."""
        by = {}
        for r in self.runs:
            if r["measure"] == measure and r["target"] in (a, b) and r["value"] is not None:
                by.setdefault(r["round"], {})[r["target"]] = r["value"]
        return median(v[a] / v[b] for v in by.values() if a in v and v.get(b))

    def goal(self, text: str, value: Optional[float], op: str, threshold: float, shown: str = "") -> str:
        """`GOAL text: shown MET|MISS`; op ">=" or "<="; value None: MISS."""
        if value is None:
            line = f"GOAL {text}: not measured MISS"
        else:
            ok = value >= threshold if op == ">=" else value <= threshold
            line = f"GOAL {text}: {shown or fmt(value, 2)} {'MET' if ok else 'MISS'}"
        self.goals.append(line)
        print(line, flush=True)
        return line

    def table(self, header: Sequence[str], rows: Iterable[Sequence], caption: str = "") -> None:
        rows = [list(r) for r in rows]
        numeric = [all(isinstance(r[i], (int, float)) or str(r[i]) == "—" or str(r[i]).rstrip("×%")
                       .replace(",", "").replace(".", "").lstrip("-").isdigit() for r in rows)
                   for i in range(len(header))]
        lines = ([caption, ""] if caption else []) + ["| " + " | ".join(header) + " |",
                                                      "|" + "|".join("---:" if n and i else "---" for i, n in
                                                                     enumerate(numeric)) + "|"]
        lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        self.sections.append("\n".join(lines))

    def text(self, md: str) -> None:
        self.sections.append(md)

    def plot(self, suffix: str, draw: Callable) -> None:
        """draw(ax) on a new figure, saved as bench/results/NAME_SUFFIX.png."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log("matplotlib missing: no plot")
            return
        fig, ax = plt.subplots(figsize=(8, 4.5))
        draw(ax)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = os.path.join(RESULTS, f"{self.name}_{suffix}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        self.plots.append(os.path.basename(path))

    def write(self) -> None:
        os.makedirs(RESULTS, exist_ok=True)
        m = self.meta
        head = [f"# {self.title}", "",
                f"{m['date']}; {m['cpu']}; kernel {m['kernel']}; {m['filesystem']}; Python {m['python']}; "
                f"shardfs {m['commit']}; load average {m['loadavg']} at start, "
                f"{' '.join(open('/proc/loadavg').read().split()[:3])} at end. "
                f"Command: `{self.command}` ({'quick' if self.quick else 'full'} set: `{self.argv}`).", ""]
        body = head + ["```", *self.goals, "```", ""] if self.goals else head
        for s in self.sections:
            body += [s, ""]
        body += [f"![{p}]({p})" for p in self.plots]
        if self.errors:
            body += ["", "Not measured:", ""] + [f"- {k}: {v}" for k, v in sorted(self.errors.items())]
        with open(os.path.join(RESULTS, self.name + ".md"), "w") as f:
            f.write("\n".join(body).rstrip() + "\n")
        with open(os.path.join(RESULTS, self.name + ".json"), "w") as f:
            json.dump({"meta": {**m, "quick": self.quick, "command": self.command, "argv": self.argv},
                       "goals": self.goals, "errors": self.errors, "runs": self.runs}, f, indent=1)
            f.write("\n")
        log(f"wrote bench/results/{self.name}.md and .json")


def report() -> None:
    """bench/results/README.md: every benchmark's goals, then links."""
    parts = ["# shardfs benchmark results", "",
             "Made by `make bench` (quick set) or `make bench-full`; each file names its command. "
             "Goals (a goal not measured is a MISS):", ""]
    for name in sorted(os.listdir(RESULTS)):
        if name.endswith(".json"):
            meta = json.load(open(os.path.join(RESULTS, name)))
            parts += [f"## [{name[:-5]}]({name[:-5]}.md) — {meta['meta']['date']}, "
                      f"{'quick' if meta['meta']['quick'] else 'full'}", "", "```", *meta["goals"], "```", ""]
    with open(os.path.join(RESULTS, "README.md"), "w") as f:
        f.write("\n".join(parts))


def main_args(description: str, argv=None, extra: Callable = lambda p: None):
    """The common command line: --quick, --rounds, --only MEASURE,...; a
    benchmark adds its own options through `extra(parser)`."""
    import argparse
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="the small set (minutes), as `make bench`")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default: 3, quick 1)")
    p.add_argument("--only", default="", help="comma-separated measures to run (default: all)")
    extra(p)
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    args.only = set(filter(None, args.only.split(",")))
    return args
