"""Build benchmark: how long writing a shard takes, against copying a file
of the same size, from 10k objects up, and how it grows.

What is timed, for each object count (all times are wall-clock seconds):

* ``ShardWriter``: ``shardfs.ShardWriter`` fed objects already in memory
  (a list of ``bytes`` and their 32-byte keys), from open to ``close()``
  (perfect hash, index, header, fdatasync, rename, directory fsync). The
  perfect-hash share is ``build_stats["hash_seconds"]`` (the CHD_PH build, by
  ``build_stats["builder"]``: shardfs's own unless SHARDFS_CHD_BUILDER=cmph;
  the key-by-key check against cmph is ``check_seconds``, apart)
  of that same run.
* ``swh ShardCreator``: Software Heritage's ``swh.shard.ShardCreator(path, n)``
  fed the same in-memory objects, in the same run.
* ``shardfs create``: the command (a new process: interpreter start-up
  included; the start-up alone is measured and reported) over a directory
  tree holding one file per object. The tree is written before, outside the
  timing, and synced; its pages are still in the page cache (warm). The
  command reads every file and hashes it with SHA-256.
* ``copy``: ``cp`` of the shard just produced (a file of exactly the shard's
  size), to the same disk: **warm** (the source read once just before, so it
  is in the page cache; the destination is left dirty in the page cache, as
  cp does), **cold** (``sync; echo 3 > /proc/sys/vm/drop_caches`` first, so
  the source is read from the device), and **warm + fsync** (cp, then
  fsync of the destination: the bytes are on the device at the end, as
  ShardWriter's are).

Every timing starts after ``sync()`` so that write-back left by the previous
step does not run during it. Build times are the best of 3 repetitions when
the shard is under 1 GB, else one run (the JSON keeps every repetition).
Peak RSS: for the in-process builders, the peak resident set above the
resident set at the start of the build (``/proc/self/clear_refs`` resets the
peak), in MiB; for ``shardfs create``, the peak RSS of the whole process.

Objects are made from a 64 MiB pool of seeded random bytes: object ``i`` is a
slice of the pool at a seeded offset with a seeded size, whose first 8 bytes
are replaced by ``i`` (little-endian), so contents differ; the key is the
SHA-256 of the content (what ``shardfs create`` computes). The rare
duplicates (objects under 8 bytes) are removed before anything is timed, so
the object count reported is the number of distinct objects.

Modes:

* ``--quick`` (default, about a minute): 10k and 100k objects of 1 B..4 KiB
  (uniform, ~2 KiB on average), then 1M objects of 1 B..512 B (ShardWriter,
  swh and copy only: writing, reading and deleting a million files does not
  fit in a minute).
* ``--full``: 10k, 100k, 1M objects of 1 B..4 KiB, then 10M of 1 B..512 B
  (10M x 2 KiB would be 20 GB of shard plus as much of copies and files).
  ``shardfs create`` is timed up to 1M files (``--create-max`` to change:
  on this machine 10M files take ~10 min to write, far longer to read back
  and ~20 min to delete). Free disk space is checked first
  (``shutil.disk_usage``); a size that does not fit is skipped with a
  message. ``build.json`` is rewritten after every size (``"complete":
  false`` until the end).

Units in the outputs: seconds (s), bytes, MB = 10^6 bytes, MiB = 2^20 bytes,
µs per object, ns per key.

    .venv/bin/python bench/build_bench.py [--quick | --full] [--out DIR]
        [--tmp DIR]   (where shards, copies and files are written, all on one
                       disk: default the system's temporary directory, $TMPDIR)

Writes ``DIR/build.json``, ``DIR/build.md``, ``DIR/build_time.png`` and
``DIR/build_hash.png`` and prints the goal lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results")

POOL_SIZE = 64 << 20  #: bytes of seeded random data objects are cut from
SEED = 20240601
REPEAT_UNDER = 1_000_000_000  #: bytes: shards smaller than this are built 3 times
REPS = 3


# --------------------------------------------------------------- objects


def random_pool(seed: int = SEED, size: int = POOL_SIZE) -> bytes:
    """``size`` bytes of seeded pseudo-random data (numpy's PCG64)."""
    import numpy as np

    return np.random.default_rng(seed).bytes(size)


def make_objects(n: int, min_size: int, max_size: int, seed: int = SEED,
                 pool: Optional[bytes] = None) -> Tuple[List[bytes], List[bytes]]:
    """``n`` objects of uniform random size in [min_size, max_size] bytes.

    Object i is ``pool[off:off + size]`` with its first 8 bytes replaced by
    ``i`` (little-endian), ``off`` and ``size`` drawn from a generator seeded
    with ``seed`` and ``n``: the same arguments give the same objects.
    Duplicates (possible only under 8 bytes) are dropped.

    :returns: ``(keys, datas)``: SHA-256 digests (32 bytes) and contents.
    """
    import numpy as np

    if pool is None:
        pool = random_pool(seed)
    rng = np.random.default_rng([seed, n, min_size, max_size])
    sizes = rng.integers(min_size, max_size + 1, n).tolist()
    offsets = rng.integers(0, len(pool) - max_size, n).tolist()
    sha = hashlib.sha256
    seen = {}
    for i, (size, off) in enumerate(zip(sizes, offsets)):
        if size >= 8:
            data = i.to_bytes(8, "little") + pool[off + 8:off + size]
        else:
            data = pool[off:off + size]
        seen.setdefault(sha(data).digest(), data)
    return list(seen), list(seen.values())


# ------------------------------------------------------- system helpers


def drop_caches() -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``. False if not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def evict(path: str) -> None:
    """Drop one file's pages from the page cache (fsync + FADV_DONTNEED):
    the fallback when drop_caches is not allowed."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def make_cold(*paths: str) -> str:
    """Make ``paths`` cold; returns how ("drop_caches" or "fadvise")."""
    if drop_caches():
        return "drop_caches"
    for p in paths:
        evict(p)
    return "fadvise"


def warm(path: str) -> None:
    """Read a file once so that it is in the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class PeakRSS:
    """Peak resident set of this process during a ``with`` block, above the
    resident set at its start, in MiB (None if the kernel cannot reset the
    peak through /proc/self/clear_refs)."""

    def __enter__(self):
        # Give memory freed earlier back to the system first, else the
        # builder's allocations reuse resident pages and do not show.
        try:
            import ctypes

            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5\n")
            self.ok = True
        except OSError:
            self.ok = False
        self.base = _status_kib("VmRSS")
        return self

    def __exit__(self, *exc):
        self.mib = (_status_kib("VmHWM") - self.base) / 1024 if self.ok else None
        return False


class DeviceReads:
    """Reads issued to the block device holding ``path`` during a ``with``
    block, from /sys/dev/block/MAJ:MIN/stat (system-wide for that device:
    read requests and KiB read). ``None`` values when unavailable."""

    def __init__(self, path: str):
        st = os.stat(path)
        self.stat = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
        if not os.path.exists(self.stat):  # a partition: its stat file is there too
            self.stat = None

    def _read(self):
        if not self.stat:
            return None
        with open(self.stat) as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[2]) * 512  # read requests, bytes

    def __enter__(self):
        self.before = self._read()
        return self

    def __exit__(self, *exc):
        after = self._read()
        if self.before and after:
            self.requests, self.bytes = after[0] - self.before[0], after[1] - self.before[1]
        else:
            self.requests = self.bytes = None
        return False


# Runs the command given as its arguments and prints, as JSON, the wall time
# around it and its rusage. The command is forked from this small fresh
# interpreter, not from the benchmark: a process started from a big one
# inherits the big one's resident set as its peak (Linux keeps the peak of
# the memory it had before exec), so ru_maxrss would say nothing. (This
# interpreter's own ~12 MiB is the floor of the figure.)
_MEASURE = """
import json, os, subprocess, sys, time
t = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, ru = os.wait4(p.pid, 0)
print(json.dumps({"seconds": time.perf_counter() - t, "status": os.waitstatus_to_exitcode(status),
                  "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_mib": ru.ru_maxrss / 1024}))
"""


def run_measured(cmd: Sequence[str], device_of: Optional[str] = None, stdin=None) -> dict:
    """Run a command (stdout discarded; ``stdin``: a file object or None).

    :returns: ``{"seconds": wall clock, "cpu_s": user + system CPU seconds
        of the process and its threads, "peak_rss_mib": its peak resident
        set in MiB, "device_read_mb": MB the device holding ``device_of``
        read meanwhile, or None}``.
    :raises CalledProcessError: on a non-zero exit.
    """
    dev = DeviceReads(device_of or ".")
    with dev:
        out = subprocess.run([sys.executable, "-c", _MEASURE] + list(cmd), stdin=stdin,
                             stdout=subprocess.PIPE, check=True).stdout
    m = json.loads(out)
    status = m.pop("status")
    if status:
        raise subprocess.CalledProcessError(status, cmd)
    m["device_read_mb"] = dev.bytes / 1e6 if dev.bytes is not None else None
    return m


def run_timed(cmd: Sequence[str], device_of: Optional[str] = None) -> Tuple[float, float, Optional[float]]:
    """Run a command; ``(seconds, peak RSS of the process in MiB, MB the
    device holding ``device_of`` read meanwhile or None)`` (see
    run_measured). Raises CalledProcessError on a non-zero exit."""
    r = run_measured(cmd, device_of)
    return r["seconds"], r["peak_rss_mib"], r["device_read_mb"]


def write_results(out: str, name: str, res: dict, md: str) -> List[str]:
    """Write ``out/<name>.json`` (``res``) and ``out/<name>.md`` (``md``);
    returns their paths."""
    paths = [os.path.join(out, f"{name}.json"), os.path.join(out, f"{name}.md")]
    with open(paths[0], "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    with open(paths[1], "w") as f:
        f.write(md)
    return paths


def rm(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def machine_info() -> dict:
    """CPU, memory, kernel and the file system the benchmark writes to."""
    cpu = cpu_model()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem,
            "kernel": platform.release(), "python": platform.python_version()}


def best(values: List[float]) -> float:
    return min(values)


# ------------------------------------------------------------ builders


def build_shardwriter(path: str, keys: List[bytes], datas: List[bytes]) -> Tuple[float, dict, Optional[float]]:
    """ShardWriter over in-memory objects: ``(seconds, build_stats, peak MiB)``."""
    import shardfs

    os.sync()
    with PeakRSS() as peak:
        t = time.perf_counter()
        w = shardfs.ShardWriter(path)
        add = w.add
        for k, d in zip(keys, datas):
            add(k, d)
        w.close()
        dt = time.perf_counter() - t
    return dt, dict(w.build_stats), peak.mib


def build_swh(path: str, keys: List[bytes], datas: List[bytes]) -> Tuple[float, Optional[float]]:
    """swh.shard.ShardCreator over the same objects: ``(seconds, peak MiB)``."""
    from swh.shard import ShardCreator

    os.sync()
    with PeakRSS() as peak:
        t = time.perf_counter()
        with ShardCreator(path, len(keys)) as c:
            write = c.write
            for k, d in zip(keys, datas):
                write(k, d)
        dt = time.perf_counter() - t
    return dt, peak.mib


def write_tree(root: str, datas: List[bytes]) -> int:
    """One file per object under ``root`` (256 or 65536 directories).
    Returns the number of files."""
    n = len(datas)
    two_levels = n > 2_000_000
    dirs = {}
    for i, data in enumerate(datas):
        h = i & 0xFFFF if two_levels else i & 0xFF
        d = dirs.get(h)
        if d is None:
            d = os.path.join(root, f"{h >> 8:02x}", f"{h & 0xFF:02x}") if two_levels else \
                os.path.join(root, f"{h:02x}")
            os.makedirs(d, exist_ok=True)
            dirs[h] = d
        with open(os.path.join(d, str(i)), "wb") as f:
            f.write(data)
    os.sync()
    return n


def warm_tree(root: str) -> None:
    """Read every file under ``root`` once (untimed): the pages of a tree
    just written do not stay cached for long on this VM (DAMON proactive
    reclaim pages out what looks idle), and the first ``shardfs create`` run
    must not be the one that reads it back from the device."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                f.read()


def cli_path() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "shardfs")
    return exe if os.path.exists(exe) else shutil.which("shardfs") or exe


# ------------------------------------------------------------- one size


def disk_needed(n: int, mean_size: float, with_tree: bool) -> int:
    """Bytes of disk one point needs at most: three shard-sized files (ours,
    swh's, the copy; the previous repetition is removed first) and, with the
    tree, one 4 KiB block + an inode per file; plus 10%."""
    shard = n * (mean_size + 8 + 40 * 1.02) + (1 << 20)
    tree = n * (max(4096, math.ceil(mean_size / 4096) * 4096) + 256) if with_tree else 0
    return int(1.1 * (3 * shard + tree))


def bench_point(tmp: str, pool: bytes, n: int, min_size: int, max_size: int,
                with_create: bool, log: Callable[[str], None]) -> dict:
    """All the timings for one object count; see the module docstring."""
    t0 = time.perf_counter()
    keys, datas = make_objects(n, min_size, max_size, pool=pool)
    gen_s = time.perf_counter() - t0
    object_bytes = sum(map(len, datas))
    point = {
        "requested_objects": n, "objects": len(keys), "object_sizes": f"{min_size}..{max_size} B uniform",
        "object_bytes": object_bytes, "generate_seconds": round(gen_s, 3),
    }
    log(f"{len(keys):,} objects of {min_size}..{max_size} B ({object_bytes / 1e6:.1f} MB) "
        f"generated in {gen_s:.1f} s")

    shard = os.path.join(tmp, "sw.shard")
    first_size = len(keys) * (object_bytes / len(keys) + 48)
    reps = REPS if first_size < REPEAT_UNDER else 1
    point["repetitions"] = reps

    # ShardWriter, in memory
    runs = []
    for r in range(reps):
        rm(shard)
        os.sync()
        runs.append(build_shardwriter(shard, keys, datas))
    point["shardwriter_runs_s"] = [round(r[0], 4) for r in runs]
    bestrun = min(runs, key=lambda r: r[0])
    point["shardwriter_s"] = bestrun[0]
    point["build_stats"] = bestrun[1]
    point["hash_s"] = bestrun[1]["hash_seconds"]
    point["hash_runs_s"] = [round(r[1]["hash_seconds"], 5) for r in runs]
    point["shardwriter_peak_mib"] = max((r[2] for r in runs if r[2] is not None), default=None)
    shard_bytes = os.path.getsize(shard)
    point["shard_bytes"] = shard_bytes
    log(f"  ShardWriter {bestrun[0]:.3f} s (hash {bestrun[1]['hash_seconds']:.3f} s), "
        f"shard {shard_bytes / 1e6:.1f} MB")

    # swh ShardCreator, same objects
    swh_shard = os.path.join(tmp, "swh.shard")
    runs = []
    for r in range(reps):
        rm(swh_shard)
        os.sync()
        runs.append(build_swh(swh_shard, keys, datas))
    point["swh_runs_s"] = [round(r[0], 4) for r in runs]
    point["swh_s"] = min(r[0] for r in runs)
    point["swh_peak_mib"] = max((r[1] for r in runs if r[1] is not None), default=None)
    point["swh_shard_bytes"] = os.path.getsize(swh_shard)
    rm(swh_shard)
    log(f"  swh ShardCreator {point['swh_s']:.3f} s")

    # copies of the shard (a file of exactly its size), same disk
    dst = os.path.join(tmp, "copy.shard")
    warm_runs, cold_runs, fsync_runs = [], [], []
    cold_how = None
    for r in range(reps):
        warm(shard)
        rm(dst)
        os.sync()
        t = time.perf_counter()
        subprocess.run(["cp", shard, dst], check=True)
        warm_runs.append(time.perf_counter() - t)
        rm(dst)
        cold_how = make_cold(shard)
        t = time.perf_counter()
        subprocess.run(["cp", shard, dst], check=True)
        cold_runs.append(time.perf_counter() - t)
        rm(dst)
        warm(shard)
        os.sync()
        t = time.perf_counter()
        subprocess.run(["cp", shard, dst], check=True)
        fd = os.open(dst, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        fsync_runs.append(time.perf_counter() - t)
        rm(dst)
    os.sync()
    point.update({
        "copy_warm_runs_s": [round(x, 4) for x in warm_runs], "copy_warm_s": min(warm_runs),
        "copy_cold_runs_s": [round(x, 4) for x in cold_runs], "copy_cold_s": min(cold_runs),
        "copy_fsync_runs_s": [round(x, 4) for x in fsync_runs], "copy_fsync_s": min(fsync_runs),
        "cold_by": cold_how,
    })
    log(f"  cp warm {point['copy_warm_s']:.3f} s, cold {point['copy_cold_s']:.3f} s, "
        f"warm+fsync {point['copy_fsync_s']:.3f} s")
    rm(shard)

    # shardfs create over a tree of files
    if with_create:
        src = os.path.join(tmp, "src")
        t = time.perf_counter()
        write_tree(src, datas)
        point["tree_write_seconds"] = round(time.perf_counter() - t, 2)
        del keys, datas  # the command reads the files; free the memory it might need
        cshard = os.path.join(tmp, "create.shard")
        runs = []
        for r in range(reps):
            rm(cshard)
            os.sync()
            warm_tree(src)
            runs.append(run_timed([cli_path(), "create", cshard, src], device_of=tmp))
        point["create_runs_s"] = [round(r[0], 4) for r in runs]
        # MB the device read during each run: ~0 when the tree was still in the
        # page cache; more means something evicted it (another process's
        # drop_caches on a shared machine, or memory pressure)
        point["create_device_read_mb"] = [None if r[2] is None else round(r[2], 1) for r in runs]
        point["create_s"] = min(r[0] for r in runs)
        point["create_peak_rss_mib"] = max(r[1] for r in runs)
        point["create_shard_bytes"] = os.path.getsize(cshard)
        rm(cshard)
        shutil.rmtree(src)
        os.sync()
        log(f"  shardfs create {point['create_s']:.3f} s (tree written in "
            f"{point['tree_write_seconds']} s, not counted; device read during the runs: "
            f"{', '.join('?' if x is None else f'{x:.0f}' for x in point['create_device_read_mb'])} MB)")
    else:
        point["create_s"] = None
    return point


# ------------------------------------------------------------- reports


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def loglog_slope(xs: List[float], ys: List[float]) -> Optional[float]:
    """Least-squares slope of log(y) against log(x) (1.0 = linear)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else None


def goals(points: List[dict]) -> Tuple[dict, List[str]]:
    """The three goal checks, as data and as printed lines."""
    lines, g = [], {}
    # build <= 1.5x copy, at every point, against the cold cp (the warm cp
    # and cp + fsync figures alongside)
    per = []
    for p in points:
        r = {ref: ratio(p["shardwriter_s"], p[ref]) for ref in ("copy_cold_s", "copy_warm_s", "copy_fsync_s")}
        r["objects"] = p["objects"]
        r["create_vs_copy_cold_s"] = ratio(p.get("create_s"), p["copy_cold_s"])
        r["swh_vs_copy_cold_s"] = ratio(p["swh_s"], p["copy_cold_s"])
        r["hash_share_of_copy_cold"] = p["hash_s"] / p["copy_cold_s"]
        r["hash_share_of_copy_warm"] = p["hash_s"] / p["copy_warm_s"]
        per.append(r)
    g["per_point"] = per
    g["build_pass"] = all(r["copy_cold_s"] <= 1.5 for r in per)

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    def k(n: int) -> str:
        return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 < 5000 else (
            f"{round(n / 1000)}k" if n >= 1000 else str(n))

    lines.append(
        "build ≤ 1.5× copy: " + ", ".join(
            f"{r['copy_cold_s']:.2f}× at {k(r['objects'])} {verdict(r['copy_cold_s'] <= 1.5)}" for r in per)
        + f" — overall {verdict(g['build_pass'])} (ShardWriter / cold cp of the shard; against warm cp: "
        + ", ".join(f"{r['copy_warm_s']:.2f}×" for r in per) + "; against warm cp + fsync: "
        + ", ".join(f"{r['copy_fsync_s']:.2f}×" for r in per) + ")")
    cr = [r for r in per if r["create_vs_copy_cold_s"]]
    if cr:
        lines.append("  shardfs create ≤ 1.5× copy: " + ", ".join(
            f"{r['create_vs_copy_cold_s']:.2f}× at {k(r['objects'])} {verdict(r['create_vs_copy_cold_s'] <= 1.5)}"
            for r in cr) + " (cold cp; includes reading and SHA-256 of every file and the interpreter start-up)")
    lines.append("  swh ShardCreator: " + ", ".join(
        f"{r['swh_vs_copy_cold_s']:.2f}× at {k(r['objects'])}" for r in per) + " of cold cp")
    # perfect hash <= 10% of copy
    g["hash_pass"] = all(r["hash_share_of_copy_cold"] <= 0.10 for r in per)
    lines.append(
        "perfect hash ≤ 10% of copy: " + ", ".join(
            f"{100 * r['hash_share_of_copy_cold']:.1f}% at {k(r['objects'])} "
            f"{verdict(r['hash_share_of_copy_cold'] <= 0.10)}" for r in per)
        + f" — overall {verdict(g['hash_pass'])} (CHD build / cold cp; of warm cp: "
        + ", ".join(f"{100 * r['hash_share_of_copy_warm']:.1f}%" for r in per) + ")")
    # linear growth
    small = min(points, key=lambda p: p["objects"])
    largest = max(points, key=lambda p: p["objects"])
    same = [p for p in points if p["object_sizes"] == small["object_sizes"]]
    per_small = small["shardwriter_s"] / small["objects"] * 1e6
    hs_small = small["hash_s"] / small["objects"] * 1e9
    hs_large = largest["hash_s"] / largest["objects"] * 1e9
    slope_w = loglog_slope([p["objects"] for p in same], [p["shardwriter_s"] for p in same])
    slope_h = loglog_slope([p["objects"] for p in points], [p["hash_s"] for p in points])
    sameL = max(same, key=lambda p: p["objects"])
    per_sameL = sameL["shardwriter_s"] / sameL["objects"] * 1e6
    per_large = largest["shardwriter_s"] / largest["objects"] * 1e6
    # A slope needs two sizes or more: without one, growth is not measured (a MISS).
    measured = slope_w is not None and slope_h is not None
    linear = measured and slope_w <= 1.1 and slope_h <= 1.15
    g.update({"shardwriter_us_per_object": {p["objects"]: p["shardwriter_s"] / p["objects"] * 1e6 for p in points},
              "hash_ns_per_key": {p["objects"]: p["hash_s"] / p["objects"] * 1e9 for p in points},
              "shardwriter_loglog_slope_same_sizes": slope_w, "hash_loglog_slope": slope_h,
              "linear_pass": linear})
    lines.append(
        f"linear growth: time per object at {small['objects']:,} vs largest: ShardWriter "
        f"{per_small:.2f} µs → {per_sameL:.2f} µs at {sameL['objects']:,} ({small['object_sizes']}; "
        f"log-log slope {fmt(slope_w, '.2f')})" + (
            f", {per_large:.2f} µs at {largest['objects']:,} ({largest['object_sizes']})"
            if largest is not sameL else "") +
        f"; perfect hash {hs_small:.0f} ns/key → {hs_large:.0f} ns/key at {largest['objects']:,} "
        f"(slope {fmt(slope_h, '.2f')}) " +
        (verdict(linear) if measured else "not measured (a slope needs two sizes or more) MISS"))
    return g, lines


def fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def markdown(res: dict) -> str:
    pts = res["points"]
    out = [f"# Build benchmark ({res['mode']})", "",
           f"{res['when']}, {res['machine']['cores']} cores ({res['machine']['cpu']}), "
           f"{res['machine']['memory_bytes'] / 2**30:.0f} GiB RAM, kernel {res['machine']['kernel']}, "
           f"Python {res['machine']['python']}; shards written to `{res['tmp_fs']}`. "
           f"Command: `{res['command']}`.", "",
           "Seconds, best of 3 runs for shards under 1 GB (else one). ×copy = time / cold `cp` of "
           "the shard (source dropped from the page cache first, destination not synced); "
           "warm cp = source in the page cache; cp+fsync = warm cp then fsync of the copy "
           "(ShardWriter fdatasyncs its shard). Perfect hash = CHD_PH build inside "
           "ShardWriter.close() (`build_stats['hash_seconds']`, builder "
           f"{pts[0]['build_stats'].get('builder', 'cmph')}), % of cold cp. ShardWriter and "
           "swh ShardCreator are fed the same objects from memory; `shardfs create` is the "
           "command over one file per object (tree written beforehand, warm in the page cache; "
           f"it reads and SHA-256-hashes every file; {res['cli_startup_s']:.2f} s of it is the "
           "interpreter start-up). Peak RSS: MiB above the resident set at the start of the build "
           "(create: whole process).", "",
           "| objects | object sizes | shard MB | cp warm s | cp cold s | cp+fsync s | ShardWriter s (×copy) "
           "| perfect hash s (% of copy) | shardfs create s (×copy) | swh ShardCreator s (×copy) "
           "| peak RSS MiB: ShardWriter / swh / create |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in pts:
        cc = p["copy_cold_s"]
        cr = (f"{p['create_s']:.3f} ({p['create_s'] / cc:.2f}×)" if p.get("create_s") else "not run")
        out.append(
            f"| {p['objects']:,} | {p['object_sizes']} | {p['shard_bytes'] / 1e6:.1f} "
            f"| {p['copy_warm_s']:.3f} | {cc:.3f} | {p['copy_fsync_s']:.3f} "
            f"| {p['shardwriter_s']:.3f} ({p['shardwriter_s'] / cc:.2f}×) "
            f"| {p['hash_s']:.4f} ({100 * p['hash_s'] / cc:.1f}%) | {cr} "
            f"| {p['swh_s']:.3f} ({p['swh_s'] / cc:.2f}×) "
            f"| {fmt(p.get('shardwriter_peak_mib'), '.0f')} / {fmt(p.get('swh_peak_mib'), '.0f')} / "
            f"{fmt(p.get('create_peak_rss_mib'), '.0f')} |")
    out += ["", "Where ShardWriter.close() spends its time (best run, seconds):", "",
            "| objects | perfect hash | check against cmph | index + hash write | "
            "header, fdatasync, rename | slots | adds (rest) | ns per key for the hash |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in pts:
        b = p["build_stats"]
        check = b.get("check_seconds", 0.0)  # results before the split: inside index_seconds
        rest = (p["shardwriter_s"] - b["hash_seconds"] - check - b["index_seconds"]
                - b["sync_seconds"])
        out.append(f"| {p['objects']:,} | {b['hash_seconds']:.4f} | {check:.4f} | "
                   f"{b['index_seconds']:.4f} | "
                   f"{b['sync_seconds']:.4f} | {b['slots']:,} | {rest:.4f} | "
                   f"{b['hash_seconds'] / p['objects'] * 1e9:.0f} |")
    cr = [p for p in pts if p.get("create_device_read_mb")]
    if cr:
        out += ["", "`shardfs create`, MB read from the device during each run (about 0 when the tree "
                "was still in the page cache as intended): " + "; ".join(
                    f"{p['objects']:,} files: {', '.join('?' if x is None else f'{x:.0f}' for x in p['create_device_read_mb'])}"
                    for p in cr) + "."]
        def best_run_mb(p):
            runs = p["create_runs_s"]
            return p["create_device_read_mb"][runs.index(min(runs))]

        out += ["", "(The first run after the cold copies re-reads the interpreter's and the "
                "package's files, which drop_caches evicted; the figure kept is the best run.)"]
        # ~20 MB is the interpreter and the package (read again after a drop)
        cold = [p for p in cr if (best_run_mb(p) or 0) > 30 + 0.1 * p["object_bytes"] / 1e6]
        if cold:
            out += ["", "**Warning**: at " + ", ".join(f"{p['objects']:,}" for p in cold) + " files "
                    "even the best run read the tree back from the device (evicted: another process's "
                    "drop_caches on this shared machine, or memory pressure): those `shardfs create` "
                    "times are partly cold."]
    if res.get("skipped"):
        out += ["", "Skipped: " + "; ".join(res["skipped"])]
    out += ["", "Goals:", ""] + [f"    {line}" for line in res["goal_lines"]]
    out += ["", "![build time](build_time.png)", "", "![perfect hash time](build_hash.png)", ""]
    return "\n".join(out)


def plots(res: dict, out: str) -> List[str]:
    """build_time.png (all builders and copies) and build_hash.png; log-log."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG (pip install matplotlib)", file=sys.stderr)
        return []
    pts = sorted(res["points"], key=lambda p: p["objects"])
    xs = [p["objects"] for p in pts]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    series = [("ShardWriter (in memory)", "shardwriter_s", "o-", "C0"),
              ("swh ShardCreator (in memory)", "swh_s", "s-", "C3"),
              ("shardfs create (files)", "create_s", "^-", "C2"),
              ("cp, cold source", "copy_cold_s", "x--", "k"),
              ("cp, warm source", "copy_warm_s", "+:", "0.5"),
              ("perfect hash (inside ShardWriter)", "hash_s", "d-", "C1")]
    # one line per object-size distribution (hollow markers for the second):
    # times of different distributions are not on one curve
    dists = []
    for p in pts:
        if p["object_sizes"] not in dists:
            dists.append(p["object_sizes"])
    for label, key, style, color in series:
        if key == "hash_s":  # depends on the number of keys only: one line
            ax.plot(xs, [p[key] for p in pts], style, color=color, label=label)
            continue
        for j, dist in enumerate(dists):
            pp = [(p["objects"], p[key]) for p in pts if p.get(key) and p["object_sizes"] == dist]
            if pp:
                ax.plot(*zip(*pp), style, color=color, label=label if j == 0 else None,
                        markerfacecolor=color if j == 0 else "none")
    if len(dists) > 1:
        ax.plot([], [], "o", color="0.3", markerfacecolor="none",
                label=f"hollow: objects of {', '.join(dists[1:])}")
    # linear reference through ShardWriter's largest point of the first distribution
    first = [p for p in pts if p["object_sizes"] == dists[0]]
    x1, y1 = first[-1]["objects"], first[-1]["shardwriter_s"]
    ax.plot([xs[0], xs[-1]], [y1 * xs[0] / x1, y1 * xs[-1] / x1], "-", color="C0", alpha=0.25, lw=6,
            label=f"linear (∝ objects) through ShardWriter at {x1:,} ({dists[0]})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("objects")
    ax.set_ylabel("seconds (best of 3; wall clock)")
    sizes = sorted({p["object_sizes"] for p in pts}, key=lambda s: -int(s.split("..")[1].split()[0]))
    groups = []
    for s in sizes:
        counts = ", ".join(format(p["objects"], ",") for p in pts if p["object_sizes"] == s)
        groups.append(f"{s}: {counts}")
    ax.set_title(f"Build time vs object count ({res['mode']}); objects of " + "; ".join(groups),
                 fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    f1 = os.path.join(out, "build_time.png")
    fig.savefig(f1, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    hs = [p["hash_s"] for p in pts]
    ax.plot(xs, hs, "d-", color="C1",
            label=f"CHD_PH build, {pts[0]['build_stats'].get('builder', 'cmph')} (ShardWriter)")
    ax.plot([xs[0], xs[-1]], [hs[-1] * xs[0] / xs[-1], hs[-1]], "-", color="C1", alpha=0.25, lw=6,
            label="linear (∝ keys)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("keys")
    ax.set_ylabel("seconds")
    ax.set_title("Perfect hash build time vs keys (best of 3)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    f2 = os.path.join(out, "build_hash.png")
    fig.savefig(f2, dpi=110)
    plt.close(fig)
    return [f1, f2]


# ---------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="about a minute (default)")
    mode.add_argument("--full", action="store_true", help="10k .. 10M objects")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default bench/results)")
    ap.add_argument("--tmp", default=None, help="scratch directory (default: $TMPDIR or /tmp)")
    ap.add_argument("--create-max", type=int, default=None, metavar="N",
                    help="time `shardfs create` only up to N objects (default: 100000 in --quick, "
                         "1000000 in --full: 10M files take ~10 min to write, longer to read "
                         "back and ~20 min to delete here)")
    args = ap.parse_args(argv)
    mode_name = "full" if args.full else "quick"
    if mode_name == "full":
        sizes = [(10_000, 1, 4096), (100_000, 1, 4096), (1_000_000, 1, 4096), (10_000_000, 1, 512)]
        create_max = 1_000_000 if args.create_max is None else args.create_max
    else:
        sizes = [(10_000, 1, 4096), (100_000, 1, 4096), (1_000_000, 1, 512)]
        create_max = 100_000 if args.create_max is None else args.create_max
    plan = [(n, lo, hi, n <= create_max) for n, lo, hi in sizes]

    os.makedirs(args.out, exist_ok=True)
    scratch_parent = args.tmp or tempfile.gettempdir()
    tmp = tempfile.mkdtemp(prefix="build-bench-", dir=scratch_parent)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    skipped = []
    points = []
    try:
        # the CLI's start-up, to read shardfs create's small sizes
        startup = min(run_timed([cli_path(), "--version"], device_of=tmp)[0] for _ in range(3))
        log(f"shardfs CLI start-up (shardfs --version): {startup:.3f} s")
        pool = random_pool()
        for n, lo, hi, with_create in plan:
            free = shutil.disk_usage(tmp).free
            need = disk_needed(n, (lo + hi) / 2, with_create)
            if need > free:
                need_nt = disk_needed(n, (lo + hi) / 2, False)
                if with_create and need_nt <= free:
                    msg = (f"{n:,} objects: shardfs create skipped, its {n:,} files need "
                           f"~{need / 1e9:.1f} GB and {free / 1e9:.1f} GB are free")
                    skipped.append(msg)
                    log(msg)
                    with_create = False
                else:
                    msg = (f"{n:,} objects of {lo}..{hi} B: skipped, needs ~{need_nt / 1e9:.1f} GB "
                           f"of disk and {free / 1e9:.1f} GB are free in {tmp}")
                    skipped.append(msg)
                    log(msg)
                    continue
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
            mem_need = n * ((lo + hi) / 2 + 33 + 33 + 16 + 150)  # objects, keys, lists, writers
            if mem_need > 0.8 * mem:
                msg = (f"{n:,} objects: skipped, holding them in memory needs ~{mem_need / 1e9:.1f} GB "
                       f"and {mem / 1e9:.1f} GB are available")
                skipped.append(msg)
                log(msg)
                continue
            if n > create_max:
                skipped.append(f"{n:,} objects: shardfs create not timed (above --create-max {create_max:,})")
            points.append(bench_point(tmp, pool, n, lo, hi, with_create, log))
            # partial results, in case a long --full run is interrupted
            with open(os.path.join(args.out, "build.json"), "w") as f:
                json.dump({"benchmark": "build", "mode": mode_name, "complete": False,
                           "points": points, "skipped": skipped}, f, indent=1, default=str)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not points:
        for goal in ("build ≤ 1.5× copy", "perfect hash ≤ 10% of copy", "linear growth"):
            print(f"{goal}: not measured MISS")
        print("nothing measured", file=sys.stderr)
        return 1

    g, lines = goals(points)
    res = {
        "benchmark": "build", "mode": mode_name, "complete": True,
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO)
                             else sys.executable, os.path.relpath(__file__, REPO)] + list(argv or sys.argv[1:])),
        "machine": machine_info(), "tmp_fs": scratch_parent,
        "units": {"*_s": "seconds (wall clock)", "*_bytes": "bytes", "*_mib": "MiB (2^20 bytes)",
                  "shardwriter_us_per_object": "µs per object", "hash_ns_per_key": "ns per key"},
        "method": ("best of 3 runs when the shard is under 1 GB, else 1; sync() before every timing; "
                   "cold = sync + drop_caches (or fsync + FADV_DONTNEED when not allowed)"),
        "cli_startup_s": startup, "points": points, "skipped": skipped,
        "goals": g, "goal_lines": lines, "wall_seconds": round(time.perf_counter() - t_start, 1),
    }
    with open(os.path.join(args.out, "build.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
        f.write("\n")
    with open(os.path.join(args.out, "build.md"), "w") as f:
        f.write(markdown(res))
    pngs = plots(res, args.out)
    print()
    print(markdown(res).split("\nGoals:")[0].split("\n", 2)[2])
    for line in lines:
        print(line)
    print(f"\nwrote {', '.join([os.path.join(args.out, 'build.json'), os.path.join(args.out, 'build.md')] + pngs)}"
          f" in {res['wall_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
