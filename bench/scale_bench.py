"""Scale benchmark: 1,000 shards against 1, mount start time, daemon memory.

Three questions, each printed as a table and as goal lines (PASS / MISS):

1. **1,000 shards vs 1 shard.** The same 1,000,000 small objects (16..256
   bytes, uniform) stored as 1,000 shards of 1,000 objects, and as one
   shard. For each setup:

   * Python level: a `shardfs.fuse.shardset.ShardSet` with every shard added
     and every sidecar built (``ShardSet.build_sidecar``);
     ``ShardSet.find`` of random present keys and of random absent keys
     (random 32 bytes), one thread; lookups per second, and index reads per
     lookup (``ShardSet.probes / ShardSet.lookups``). For the 1,000 shards
     also before any sidecar is built (every shard probed).
   * Through a mount (``shardfs mount --shard-dir DIR --layout flat`` for the
     1,000, ``shardfs mount --layout flat ONE.shard`` for the other), once
     every sidecar is ready (root xattr ``user.shardfs.stats``: sidecars =
     shards): ``os.stat`` of N random present names, then N random absent
     names, each name used once (the kernel's dentry cache never answers),
     from --threads Python threads; lookups per second (wall clock of the
     whole pass) and index reads per lookup (the difference of the xattr's
     ``index_probes`` over the difference of its ``lookups``).

   Goal: an absent key costs < 0.1 index reads on average with 1,000 shards.

2. **Start time**: wall-clock seconds from running
   ``python -m shardfs mount ... MP`` until it returns (it returns once the
   mount answers a stat; interpreter start-up included), for a shard of
   10,000,000 tiny objects (8..32 bytes; 1,000,000 in --quick) and for the
   1,000 shards (``--shard-dir``). *cold* = a fresh, empty ``--cache-dir``
   (no sidecar: built in the background after the mount answers; how long
   until they are all ready is reported too); *warm* = the cache directory
   a previous mount filled. Best of the runs (3 warm; cold: 2 in --quick, 3
   in --full). The shard files are in the page cache (they were just built
   or read); only the sidecar cache is cold. Goals: the big shard < 0.5 s
   (cold and warm), the 1,000 shards with warm sidecars < 5 s.

3. **Memory** of the mount daemon (of the ``python -m shardfs.fuse.mount``
   processes serving the mount point, the coordinator and its workers, the
   one with the largest RssAnon; /proc/PID/status VmRSS, RssAnon,
   RssFile; and from /proc/PID/smaps the resident bytes of the sidecar
   mappings) right after the mount returns (cold and warm), at its peak
   while the sidecars are built (sampled every 50 ms), once they are ready,
   and after reading 50,000 and 100,000 random objects through the mount
   (``os.open`` + ``os.read`` + ``os.close`` of ``MP/<key>``, --threads
   threads), for the big shard and the 1,000 shards (and the 1 shard, no
   reads). Also the sidecars' size on disk per object. Goals: RssAnon
   (anonymous memory: the sidecars and shards are file mappings, counted in
   RssFile) < 64 MiB while serving (after a warm mount, sidecars ready,
   after the reads; the build's peak is reported beside it), and it does not
   grow with reads: growth over the second 50,000 reads < 1 MiB (the first
   ones fill bounded caches: listings, the kernel-facing buffers; that
   warm-up is reported too).

Datasets are built once with `shardfs.ShardWriter` and cached under
``bench/data/`` (gitignored): ``scale-1000x1000-s1/`` (the 1,000 shards in
``shards/``, the single shard in ``one/``, ``keys.bin`` = the 1,000,000
32-byte keys in order) and ``scale-tiny-n<N>-s1/objects.shard``; a
``dataset.json`` written last marks a complete one. Building takes about a
minute the first time (plus about a minute for the 10M shard of --full).
Mount points, sidecar cache directories and daemon logs live in a fresh
directory under /tmp (--tmp), removed at the end; every mount is unmounted
in a ``finally`` (``shardfs umount``, then ``fusermount3 -uz``).

Units: seconds, lookups per second, bytes; MiB = 2^20 bytes, MB = 10^6.

    .venv/bin/python bench/scale_bench.py [--quick | --full] [--out DIR] [--tmp DIR]
        [--threads N]

Writes ``DIR/scale.json`` and ``DIR/scale.md``; prints the tables and the
goal lines. Needs /dev/fuse and fusermount3 for everything but the Python
level; what cannot run is reported, not faked.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from build_bench import DEFAULT_OUT, machine_info  # noqa: E402  (same directory)
import machine  # noqa: E402

DATA_DIR = os.path.join(HERE, "data")
SEED = 1
#: Bumped when the generation changes, so stale caches are rebuilt.
FORMAT_VERSION = 1

#: The 1,000-shard dataset: shards x objects per shard, object sizes.
MANY_SHARDS = 1000
PER_SHARD = 1000
SMALL_SIZES = (16, 256)
#: The big shard: tiny objects.
TINY_SIZES = (8, 32)

MiB = 1 << 20

#: Goals (see the module docstring).
GOAL_ABSENT_PROBES = 0.1
GOAL_START_BIG = 0.5
GOAL_START_MANY = 5.0
GOAL_RSS_ANON = 64 * MiB
GOAL_RSS_GROWTH = 1 * MiB
#: Memory samples the RssAnon goal applies to (and "after N reads"): the
#: daemon serving, not building sidecars.
STEADY_PHASES = ("after mount (warm)", "sidecars ready")


def big_name(count: int) -> str:
    """The name of the big-shard setup."""
    return f"big shard ({count:,} tiny objects)"

#: mode -> settings
PLANS = {
    "quick": {"tiny_objects": 1_000_000, "py_lookups": 200_000, "py_unfiltered": 1_000,
              "mount_stats": 20_000, "reads": 100_000, "warm_runs": 3, "cold_runs": 2},
    "full": {"tiny_objects": 10_000_000, "py_lookups": 1_000_000, "py_unfiltered": 2_000,
             "mount_stats": 100_000, "reads": 100_000, "warm_runs": 3, "cold_runs": 3},
}

#: Seconds allowed for one `shardfs mount` / `shardfs umount` command.
MOUNT_TIMEOUT = 120
#: Seconds allowed for the sidecars of a mount to be built.
SIDECAR_TIMEOUT = 1800

_t_start = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _t_start:6.1f}s] {msg}", flush=True)


# ------------------------------------------------------------- datasets


def _pool(seed: int) -> bytes:
    return random.Random(f"shardfs-scale:pool:{seed}").randbytes(1 << 20)


def _object(pool: bytes, i: int, lo: int, hi: int) -> bytes:
    """Object i: its index (8 bytes, little-endian: contents are unique)
    then bytes of the pool, lo..hi bytes in all; size and offset hashed
    from i."""
    h = (i * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    size = lo + (h >> 20) % (hi - lo + 1)
    off = (h >> 7) % (len(pool) - hi)
    return i.to_bytes(8, "little") + pool[off:off + size - 8]


def _write_meta(path: str, meta: dict) -> None:
    tmp = os.path.join(path, "dataset.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    os.rename(tmp, os.path.join(path, "dataset.json"))


def _read_meta(path: str) -> Optional[dict]:
    try:
        with open(os.path.join(path, "dataset.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _check_space(path: str, need: int) -> None:
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if free < need:
        raise SystemExit(f"scale_bench.py: not enough free space in {probe}: "
                         f"need ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")


class ManyShards:
    """1,000 shards of 1,000 objects, and one shard of the same 1,000,000."""

    def __init__(self, data_dir: str, seed: int = SEED):
        self.path = os.path.join(data_dir, f"scale-{MANY_SHARDS}x{PER_SHARD}-s{seed}")
        self.shard_dir = os.path.join(self.path, "shards")
        self.one = os.path.join(self.path, "one", "all.shard")
        self.seed = seed
        self.count = MANY_SHARDS * PER_SHARD
        self.keys = b""  #: 32 bytes per object, in order

    def shard_paths(self) -> List[str]:
        return [os.path.join(self.shard_dir, f"s{j:04d}.shard") for j in range(MANY_SHARDS)]

    def key(self, i: int) -> bytes:
        return self.keys[32 * i:32 * i + 32]

    def ensure(self) -> "ManyShards":
        want = {"version": FORMAT_VERSION, "shards": MANY_SHARDS, "per_shard": PER_SHARD,
                "seed": self.seed, "sizes": list(SMALL_SIZES)}
        meta = _read_meta(self.path)
        if meta is not None and all(meta.get(k) == v for k, v in want.items()) and \
                os.path.exists(self.one) and all(os.path.exists(p) for p in self.shard_paths()):
            with open(os.path.join(self.path, "keys.bin"), "rb") as f:
                self.keys = f.read()
            if len(self.keys) == 32 * self.count:
                log(f"dataset {os.path.basename(self.path)}: reused")
                return self
        self.build(want)
        return self

    def build(self, meta: dict) -> None:
        import shardfs

        mean = sum(SMALL_SIZES) / 2
        _check_space(os.path.dirname(self.path), int(2 * self.count * (mean + 60)) + (256 << 20))
        log(f"dataset {os.path.basename(self.path)}: building {MANY_SHARDS:,} shards of "
            f"{PER_SHARD:,} objects and one of {self.count:,} (once; cached in {self.path})")
        t = time.perf_counter()
        if os.path.lexists(self.path):
            shutil.rmtree(self.path)
        os.makedirs(self.shard_dir)
        os.makedirs(os.path.dirname(self.one))
        pool = _pool(self.seed)
        lo, hi = SMALL_SIZES
        sha = hashlib.sha256
        keys = bytearray()
        total = 0
        with shardfs.ShardWriter(self.one) as one:
            for j, path in enumerate(self.shard_paths()):
                with shardfs.ShardWriter(path) as w:
                    for i in range(j * PER_SHARD, (j + 1) * PER_SHARD):
                        data = _object(pool, i, lo, hi)
                        k = sha(data).digest()
                        w.add(k, data)
                        one.add(k, data)
                        keys += k
                        total += len(data)
                if (j + 1) % 200 == 0:
                    log(f"  {j + 1:,}/{MANY_SHARDS:,} shards ({time.perf_counter() - t:.0f} s)")
        with open(os.path.join(self.path, "keys.bin"), "wb") as f:
            f.write(keys)
        self.keys = bytes(keys)
        _write_meta(self.path, dict(meta, objects=self.count, total_bytes=total,
                                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        log(f"dataset {os.path.basename(self.path)}: built in {time.perf_counter() - t:.1f} s "
            f"({total / 1e6:.0f} MB of objects, twice)")


class TinyShard:
    """One shard of `count` tiny objects."""

    def __init__(self, data_dir: str, count: int, seed: int = SEED):
        self.path = os.path.join(data_dir, f"scale-tiny-n{count}-s{seed}")
        self.shard = os.path.join(self.path, "objects.shard")
        self.count = count
        self.seed = seed

    def ensure(self) -> "TinyShard":
        want = {"version": FORMAT_VERSION, "count": self.count, "seed": self.seed,
                "sizes": list(TINY_SIZES)}
        meta = _read_meta(self.path)
        if meta is not None and all(meta.get(k) == v for k, v in want.items()) and \
                os.path.exists(self.shard):
            log(f"dataset {os.path.basename(self.path)}: reused")
            return self
        import shardfs

        _check_space(os.path.dirname(self.path),
                     int(self.count * (sum(TINY_SIZES) / 2 + 60)) + (256 << 20))
        log(f"dataset {os.path.basename(self.path)}: building {self.count:,} objects of "
            f"{TINY_SIZES[0]}..{TINY_SIZES[1]} bytes (once; cached in {self.path})")
        t = time.perf_counter()
        if os.path.lexists(self.path):
            shutil.rmtree(self.path)
        os.makedirs(self.path)
        pool = _pool(self.seed)
        lo, hi = TINY_SIZES
        sha = hashlib.sha256
        total = 0
        with shardfs.ShardWriter(self.shard) as w:
            add = w.add
            for i in range(self.count):
                data = _object(pool, i, lo, hi)
                add(sha(data).digest(), data)
                total += len(data)
                if (i + 1) % 2_000_000 == 0:
                    log(f"  {i + 1:,}/{self.count:,} objects ({time.perf_counter() - t:.0f} s)")
        _write_meta(self.path, dict(want, total_bytes=total,
                                    created=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        log(f"dataset {os.path.basename(self.path)}: built in {time.perf_counter() - t:.1f} s "
            f"(shard {os.path.getsize(self.shard) / 1e6:.0f} MB)")
        return self

    def sample_keys(self, n: int, seed: int) -> List[bytes]:
        """`n` distinct random live keys (read from random index slots)."""
        import shardfs

        rnd = random.Random(seed)
        out: Dict[bytes, None] = {}
        with shardfs.Shard(self.shard) as s:
            slots = s.slot_count
            while len(out) < min(n, self.count):
                item = s.slot(rnd.randrange(slots))
                if item is not None:
                    out[item[0]] = None
        return list(out)


def random_absent(n: int, seed: int) -> List[bytes]:
    """`n` random 32-byte keys (absent from every shard, but for a chance
    of 2^-236 or so)."""
    rnd = random.Random(f"shardfs-scale:absent:{seed}")
    return [rnd.randbytes(32) for _ in range(n)]


def dir_bytes(path: str) -> Tuple[int, int]:
    """(bytes, files) of the regular files under `path`."""
    total = files = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
                files += 1
            except OSError:
                pass
    return total, files


# ------------------------------------------------------- Python level


def python_level(name: str, paths: Sequence[str], present: List[bytes], absent: List[bytes],
                 unfiltered: int, cache_dir: str) -> List[dict]:
    """ShardSet.find rates and index reads per lookup (see the docstring)."""
    from shardfs.fuse.shardset import ShardSet

    rows: List[dict] = []
    ss = ShardSet(cache_dir=cache_dir)
    try:
        t = time.perf_counter()
        for p in paths:
            ss.add(p)
        t_add = time.perf_counter() - t
        objects = sum(m.objects for m in ss.served())

        def measure(kind: str, keys: List[bytes], sidecars: str) -> None:
            ss.lookups = ss.probes = 0
            find = ss.find
            found = 0
            t0 = time.perf_counter()
            for k in keys:
                if find(k) is not None:
                    found += 1
            dt = time.perf_counter() - t0
            expect = len(keys) if kind == "present" else 0
            row = {"setup": name, "level": "ShardSet.find", "kind": kind, "sidecars": sidecars,
                   "shards": len(paths), "objects": objects, "lookups": len(keys),
                   "seconds": round(dt, 4), "lookups_per_s": len(keys) / dt,
                   "index_reads_per_lookup": ss.probes / max(ss.lookups, 1),
                   "found": found, "errors": abs(found - expect)}
            rows.append(row)
            log(f"  {name}: ShardSet.find {kind:7} ({sidecars} sidecars) "
                f"{row['lookups_per_s']:12,.0f}/s, {row['index_reads_per_lookup']:.3f} index reads "
                f"per lookup ({len(keys):,} lookups{', %d WRONG' % row['errors'] if row['errors'] else ''})")

        if len(paths) > 1 and unfiltered:
            measure("present", present[:unfiltered], "no")
            measure("absent", absent[:unfiltered], "no")
        t = time.perf_counter()
        for m in ss.served():
            ss.build_sidecar(m)
        t_build = time.perf_counter() - t
        ready = sum(1 for m in ss.served() if m.sidecar is not None)
        sc_bytes, sc_files = dir_bytes(cache_dir)
        log(f"  {name}: {len(paths):,} shard(s) added in {t_add:.2f} s, {ready:,} sidecars built in "
            f"{t_build:.2f} s ({sc_bytes / objects:.2f} bytes per object)")
        measure("present", present, "all")
        measure("absent", absent, "all")
        for r in rows:
            r.update(add_seconds=round(t_add, 3), sidecar_build_seconds=round(t_build, 3),
                     sidecars_ready=ready, sidecar_bytes=sc_bytes, sidecar_files=sc_files)
    finally:
        ss.close()
    return rows


# ----------------------------------------------------------- mounting


def shardfs_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "shardfs", *args]


def mountinfo_points() -> List[str]:
    import re

    points = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def is_mounted(mp: str) -> bool:
    return os.path.realpath(mp) in mountinfo_points()


def daemon_pids(mp: str) -> List[int]:
    """PIDs of the shardfs daemons (``python -m shardfs.fuse.mount``)
    serving mount point `mp`, found by their command line."""
    target = os.path.realpath(mp)
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"shardfs.fuse.mount" not in argv or b"--mountpoint" not in argv:
            continue
        try:
            mp_arg = argv[argv.index(b"--mountpoint") + 1].decode(errors="replace")
        except IndexError:
            continue
        if os.path.realpath(mp_arg) == target:
            pids.append(int(pid))
    return pids


def memory(pid: int, cache_dir: str, maps: bool = True) -> Dict[str, int]:
    """Bytes: VmRSS, RssAnon, RssFile, RssShmem, VmHWM from /proc/PID/status;
    with `maps`, sidecar_rss / shard_rss: resident bytes of the mappings of
    files under `cache_dir` / of the shard files (from /proc/PID/smaps)."""
    out: Dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    if not maps:
        return out
    prefix = os.path.realpath(cache_dir) + "/"
    sidecar = shard = 0
    current = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if not first.endswith(":"):  # a mapping's header line
                    parts = line.split(None, 5)
                    path = parts[5].strip() if len(parts) > 5 else ""
                    current = ("sidecar" if path.startswith(prefix)
                               else "shard" if path.endswith(".shard") else None)
                elif first == "Rss:" and current:
                    kib = int(line.split()[1]) * 1024
                    if current == "sidecar":
                        sidecar += kib
                    else:
                        shard += kib
    except OSError:
        pass
    out["sidecar_rss"] = sidecar
    out["shard_rss"] = shard
    return out


def stats_xattr(mp: str) -> dict:
    return json.loads(os.getxattr(mp, "user.shardfs.stats"))


class Mount:
    """One `shardfs mount` (timed), always unmounted by `close()`."""

    def __init__(self, what: List[str], mp: str, cache_dir: str, log_file: str):
        self.what, self.mp, self.cache_dir, self.log_file = what, mp, cache_dir, log_file
        self.seconds: Optional[float] = None

    def open(self) -> "Mount":
        os.makedirs(self.mp, exist_ok=True)
        os.makedirs(self.cache_dir, exist_ok=True)
        # Options first: `shardfs mount SHARD --opt X MP` is refused by argparse.
        cmd = shardfs_cmd("mount", "--cache-dir", self.cache_dir, "--log-file", self.log_file,
                          *self.what, self.mp)
        t = time.perf_counter()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=MOUNT_TIMEOUT,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self.close()
            raise RuntimeError(f"`{' '.join(cmd)}` did not return within {MOUNT_TIMEOUT} s")
        self.seconds = time.perf_counter() - t
        if r.returncode != 0:
            self.close()
            raise RuntimeError(f"`{' '.join(cmd)}` failed with status {r.returncode}: "
                               f"{(r.stderr or r.stdout).strip()}{self.log_tail()}")
        if not daemon_pids(self.mp):
            log(f"  warning: no daemon process found for {self.mp}")
        return self

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            return ""
        return "\n  daemon log (last lines):\n    " + "\n    ".join(tail) if tail else ""

    def memory(self, maps: bool = True) -> Dict[str, int]:
        """`memory()` of the mount's process with the largest RssAnon now:
        the coordinator, a worker or the sidecar builder (a mount has
        several processes; each holds its own anonymous memory), plus
        "processes": how many there are. {} when none answers."""
        best: Dict[str, int] = {}
        pids = daemon_pids(self.mp)
        for pid in pids:
            try:
                mem = memory(pid, self.cache_dir, maps)
            except OSError:
                continue
            if "RssAnon" not in mem:  # a child that exited (a sidecar builder)
                continue
            if mem["RssAnon"] > best.get("RssAnon", -1):
                best = mem
        if best:
            best["processes"] = len(pids)
        return best

    def stats(self) -> dict:
        return stats_xattr(self.mp)

    def wait_sidecars(self, timeout: float = SIDECAR_TIMEOUT,
                      peak: Optional[Dict[str, int]] = None) -> Optional[float]:
        """Seconds from now until stats["sidecars"] == stats["shards"];
        None on timeout (or if the mount stops answering). With `peak`,
        the daemon's memory is sampled at every poll (50 ms) and `peak` is
        updated to the sample with the largest RssAnon."""
        t = time.perf_counter()
        deadline = t + timeout
        while time.perf_counter() < deadline:
            if peak is not None:
                mem = self.memory(maps=False)
                if mem and mem["RssAnon"] > peak.get("RssAnon", -1):
                    peak.clear()
                    peak.update(mem, sidecar_rss=None, shard_rss=None)
            try:
                st = self.stats()
            except OSError as exc:
                log(f"  {self.mp}: cannot read the stats xattr: {exc}{self.log_tail()}")
                return None
            if st.get("shards") and st.get("sidecars") == st.get("shards"):
                return time.perf_counter() - t
            time.sleep(0.05)
        log(f"  {self.mp}: sidecars still not ready after {timeout:.0f} s: {self.stats()}")
        return None

    def close(self) -> None:
        """Unmount (shardfs umount, then fusermount3 -uz) and wait for the
        daemon to leave (SIGTERM, then SIGKILL, to its PID after 60 s).
        Never raises."""
        pids = daemon_pids(self.mp) if os.path.isdir(self.mp) else []
        try:
            if is_mounted(self.mp):
                try:
                    r = subprocess.run(shardfs_cmd("umount", self.mp), capture_output=True, text=True,
                                       timeout=MOUNT_TIMEOUT, stdin=subprocess.DEVNULL)
                    if r.returncode != 0:
                        log(f"  shardfs umount {self.mp} failed: {(r.stderr or r.stdout).strip()}")
                except subprocess.TimeoutExpired:
                    log(f"  shardfs umount {self.mp} timed out")
                if is_mounted(self.mp):
                    subprocess.run(["fusermount3", "-uz", self.mp], capture_output=True, timeout=60)
        except Exception as exc:  # never let cleanup hide the real error
            log(f"  unmounting {self.mp} failed: {exc}")
        deadline = time.monotonic() + 60
        for pid in pids:
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if not os.path.exists(f"/proc/{pid}"):
                    break
                log(f"  daemon {pid} of {self.mp} still running after the unmount: {sig.name}")
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
                time.sleep(2)


def split(items: list, n: int) -> List[list]:
    return [items[len(items) * i // n:len(items) * (i + 1) // n] for i in range(n)]


def threaded(fn: Callable[[list], int], items: list, threads: int) -> Tuple[float, int]:
    """Run fn over `threads` contiguous parts of `items` at once; (wall
    seconds from the common start to the last end, sum of fn's results)."""
    parts = split(items, threads)
    barrier = threading.Barrier(threads + 1)
    results = [0] * threads
    errors: List[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(parts[i])
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return dt, sum(results)


def stat_work(present: bool) -> Callable[[list], int]:
    """os.stat each path; returns how many answered wrongly (present: not
    a regular file; absent: anything but ENOENT)."""
    def run(paths: list) -> int:
        bad = 0
        st = os.stat
        for p in paths:
            try:
                st(p)
                if not present:
                    bad += 1
            except FileNotFoundError:
                if present:
                    bad += 1
        return bad
    return run


def read_work(paths: list) -> int:
    """open + read + close each path; returns bytes read."""
    total = 0
    op, rd, cl, flags = os.open, os.read, os.close, os.O_RDONLY
    for p in paths:
        fd = op(p, flags)
        try:
            total += len(rd(fd, 1 << 16))
        finally:
            cl(fd)
    return total


def requests_xattr(mp: str) -> dict:
    return json.loads(os.getxattr(mp, "user.shardfs.requests"))


def mount_lookups(m: Mount, name: str, present: List[bytes], absent: List[bytes],
                  threads: int) -> List[dict]:
    """stat() of present then absent names through the mount.

    Index reads per lookup = the difference of the stats xattr's
    index_probes over the names stat'ed. (Its "lookups" counts
    ShardSet.find calls, one per LOOKUP.)
    """
    rows = []
    for kind, keys in (("present", present), ("absent", absent)):
        paths = [os.path.join(m.mp, k.hex()) for k in keys]
        before, req0 = m.stats(), requests_xattr(m.mp)
        dt, bad = threaded(stat_work(kind == "present"), paths, threads)
        after, req1 = m.stats(), requests_xattr(m.mp)
        dl = after["lookups"] - before["lookups"]
        dp = after["index_probes"] - before["index_probes"]
        fuse_lookups = req1.get("lookup", 0) - req0.get("lookup", 0)
        row = {"setup": name, "level": f"mount stat(), {threads} threads", "kind": kind,
               "sidecars": f"{before['sidecars']}/{before['shards']}", "shards": before["shards"],
               "objects": before["objects"], "lookups": len(keys), "seconds": round(dt, 4),
               "lookups_per_s": len(keys) / dt, "fuse_lookup_requests": fuse_lookups,
               "xattr_lookups": dl, "xattr_index_probes": dp,
               "index_reads_per_lookup": dp / len(keys), "errors": bad}
        rows.append(row)
        log(f"  {name}: mount stat {kind:7} {row['lookups_per_s']:12,.0f}/s, "
            f"{row['index_reads_per_lookup']:.3f} index reads per lookup ({len(keys):,} names, "
            f"{fuse_lookups:,} FUSE lookups, {dl:,} ShardSet.find calls"
            f"{', %d WRONG' % bad if bad else ''})")
    return rows


def read_objects(m: Mount, keys: List[bytes], threads: int) -> dict:
    paths = [os.path.join(m.mp, k.hex()) for k in keys]
    dt, nbytes = threaded(read_work, paths, threads)
    return {"objects": len(paths), "seconds": round(dt, 3), "objects_per_s": len(paths) / dt,
            "bytes": nbytes}


# ------------------------------------------------------------ sections


class Run:
    """Everything measured, and the temporary directory."""

    def __init__(self, plan: dict, tmp: str, threads: int, can_mount: bool):
        self.plan, self.tmp, self.threads, self.can_mount = plan, tmp, threads, can_mount
        self.lookup_rows: List[dict] = []
        self.start_rows: List[dict] = []
        self.memory_rows: List[dict] = []
        self.read_rows: List[dict] = []
        self.sidecar_rows: List[dict] = []
        self.skipped: List[str] = []
        self.errors: List[str] = []
        self._n = 0

    def fresh(self, label: str) -> Tuple[str, str, str]:
        """(mount point, empty cache dir, log file) under tmp."""
        self._n += 1
        base = os.path.join(self.tmp, f"{self._n:02d}-{label}")
        return base + ".mnt", base + ".cache", base + ".log"

    def mem_row(self, setup: str, objects: int, phase: str, mem: Dict[str, int]) -> None:
        if not mem:
            return
        row = dict(setup=setup, objects=objects, phase=phase, **mem)
        self.memory_rows.append(row)
        log(f"  {setup}: daemon {phase}: VmRSS {mem['VmRSS'] / MiB:.1f} MiB, RssAnon "
            f"{mem['RssAnon'] / MiB:.1f} MiB, RssFile {mem['RssFile'] / MiB:.1f} MiB (sidecar "
            f"mappings {_mib(mem['sidecar_rss'])} MiB, shard mappings {_mib(mem['shard_rss'])} MiB)")

    def start_row(self, setup: str, objects: int, shards: int, cache: str, m: Mount,
                  ready: Optional[float]) -> None:
        row = {"setup": setup, "objects": objects, "shards": shards, "sidecars": cache,
               "seconds": round(m.seconds, 4),
               "sidecars_ready_after_s": None if ready is None else round(ready, 3)}
        self.start_rows.append(row)
        log(f"  {setup}: mount ({cache} sidecars) returned in {m.seconds:.3f} s"
            + ("" if ready is None else f", sidecars all ready {ready:.2f} s later"))

    def sidecar_row(self, setup: str, objects: int, cache_dir: str) -> None:
        b, files = dir_bytes(cache_dir)
        self.sidecar_rows.append({"setup": setup, "objects": objects, "sidecar_files": files,
                                  "sidecar_bytes": b, "bytes_per_object": b / objects})
        log(f"  {setup}: {files:,} sidecar file(s), {b / 1e6:.1f} MB, {b / objects:.2f} bytes per object")

    def reads(self, m: Mount, setup: str, objects: int, keys: List[bytes]) -> None:
        """Read `keys` through the mount in two halves; memory before,
        after the first half and after all (growth: since before)."""
        before = m.memory()
        half = len(keys) // 2
        r1 = read_objects(m, keys[:half], self.threads)
        mid = m.memory()
        r2 = read_objects(m, keys[half:], self.threads)
        after = m.memory()
        seconds = r1["seconds"] + r2["seconds"]
        r = {"setup": setup, "objects": len(keys), "seconds": round(seconds, 3),
             "objects_per_s": len(keys) / seconds, "bytes": r1["bytes"] + r2["bytes"]}
        self.read_rows.append(r)
        log(f"  {setup}: read {r['objects']:,} objects through the mount in "
            f"{r['seconds']:.1f} s ({r['objects_per_s']:,.0f}/s, {self.threads} threads)")
        for n, mem in ((half, mid), (len(keys), after)):
            self.mem_row(setup, objects, f"after {n:,} reads", mem)
            if before and mem:
                self.memory_rows[-1]["growth_anon"] = mem["RssAnon"] - before["RssAnon"]
                self.memory_rows[-1]["growth_rss"] = mem["VmRSS"] - before["VmRSS"]
                self.memory_rows[-1]["reads"] = n

    # -- a whole mount scenario -----------------------------------------
    def scenario(self, setup: str, label: str, what: List[str], objects: int, shards: int,
                 present: List[bytes], absent: List[bytes], reads: List[bytes]) -> None:
        """Cold mount (+ lookups, memory, reads), then warm mounts. `what`:
        the mount's arguments (options first, then shards)."""
        mp, cache, logf = self.fresh(label)
        warm_cache = cache
        for rep in range(self.plan["cold_runs"]):
            if rep:
                mp, cache, logf = self.fresh(label + "-cold")
            m = Mount(what, mp, cache, logf)
            try:
                m.open()
                mem0 = m.memory()
                peak: Dict[str, int] = {}
                ready = m.wait_sidecars(peak=peak)
                self.start_row(setup, objects, shards, "cold", m, ready)
                if rep == 0:
                    self.mem_row(setup, objects, "after mount (cold)", mem0)
                    self.mem_row(setup, objects, "peak while sidecars build (sampled)", peak)
                    if ready is None:
                        self.errors.append(f"{setup}: sidecars never all ready")
                    time.sleep(0.2)
                    self.mem_row(setup, objects, "sidecars ready", m.memory())
                    self.sidecar_row(setup, objects, cache)
                    if present:
                        self.lookup_rows += mount_lookups(m, setup, present, absent, self.threads)
                    if reads:
                        self.reads(m, setup, objects, reads)
            except Exception as exc:
                self.errors.append(f"{setup}, cold run {rep + 1}: {exc}")
                log(f"  ERROR {setup}: {exc}")
                return
            finally:
                m.close()
        for rep in range(self.plan["warm_runs"]):
            mp, _unused, logf = self.fresh(label + "-warm")
            m = Mount(what, mp, warm_cache, logf)
            try:
                m.open()
                mem = m.memory()
                st = m.stats()
                ready = 0.0 if st["sidecars"] == st["shards"] else m.wait_sidecars()
                self.start_row(setup, objects, shards, "warm", m, ready)
                if rep == 0:
                    self.mem_row(setup, objects, "after mount (warm)", mem)
            except Exception as exc:
                self.errors.append(f"{setup}, warm run {rep + 1}: {exc}")
                log(f"  ERROR {setup}: {exc}")
                return
            finally:
                m.close()


# ------------------------------------------------------------- reports


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> List[str]:
    """A plain-text table."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return [line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _mib(value: Optional[int]) -> str:
    return "—" if value is None else f"{value / MiB:.1f}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> List[str]:
    return (["| " + " | ".join(headers) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
            + ["| " + " | ".join(r) + " |" for r in rows])


def best(rows: List[dict], **kw) -> Optional[dict]:
    match = [r for r in rows if all(r.get(k) == v for k, v in kw.items())]
    return min(match, key=lambda r: r["seconds"]) if match else None


def tables(res: dict) -> List[Tuple[str, List[str], List[List[str]], List[bool]]]:
    """(title, headers, rows, right-aligned) of each table."""
    out = []
    rows = []
    for r in res["lookups"]:
        rows.append([r["setup"], r["level"], r["sidecars"], r["kind"], f"{r['lookups']:,}",
                     f"{r['lookups_per_s']:,.0f}", f"{r['index_reads_per_lookup']:.3f}",
                     str(r.get("errors", 0))])
    out.append(("Lookups: 1,000 shards vs 1 shard (same 1,000,000 objects)",
                ["setup", "how", "sidecars", "keys", "lookups", "lookups/s", "index reads/lookup",
                 "wrong"],
                rows, [False, False, False, False, True, True, True, True]))
    rows = []
    seen = []
    for r in res["start"]:
        key = (r["setup"], r["sidecars"])
        if key in seen:
            continue
        seen.append(key)
        runs = [x for x in res["start"] if (x["setup"], x["sidecars"]) == key]
        ready = [x["sidecars_ready_after_s"] for x in runs if x["sidecars_ready_after_s"] is not None]
        rows.append([r["setup"], f"{r['objects']:,}", f"{r['shards']:,}", r["sidecars"],
                     ", ".join(f"{x['seconds']:.3f}" for x in runs),
                     f"{min(x['seconds'] for x in runs):.3f}",
                     ", ".join(f"{x:.2f}" for x in ready) if ready and r["sidecars"] == "cold"
                     else ("0 (loaded)" if ready else "—")])
    out.append(("Start time: `shardfs mount` until it returns (the mount answers a stat)",
                ["setup", "objects", "shards", "sidecars", "runs s", "best s",
                 "then sidecars all ready after s"],
                rows, [False, True, True, False, False, True, False]))
    rows = []
    for r in res["memory"]:
        growth = "" if "growth_anon" not in r else f"{r['growth_anon'] / MiB:+.2f}"
        rows.append([r["setup"], f"{r['objects']:,}", r["phase"], f"{r['VmRSS'] / MiB:.1f}",
                     f"{r['RssAnon'] / MiB:.1f}", f"{r['RssFile'] / MiB:.1f}",
                     _mib(r["sidecar_rss"]), _mib(r["shard_rss"]),
                     f"{r['VmHWM'] / MiB:.1f}", growth])
    out.append(("Memory of the mount daemon (MiB)",
                ["setup", "objects", "when", "VmRSS", "RssAnon", "RssFile", "sidecar maps",
                 "shard maps", "VmHWM", "RssAnon growth over the reads"],
                rows, [False, True, False, True, True, True, True, True, True, True]))
    rows = []
    for r in res["sidecars"]:
        rows.append([r["setup"], f"{r['objects']:,}", f"{r['sidecar_files']:,}",
                     f"{r['sidecar_bytes'] / 1e6:.1f}", f"{r['bytes_per_object']:.2f}"])
    out.append(("Sidecars on disk", ["setup", "objects", "files", "MB", "bytes per object"],
                rows, [False, True, True, True, True]))
    rows = []
    for r in res["reads"]:
        rows.append([r["setup"], f"{r['objects']:,}", f"{r['seconds']:.1f}",
                     f"{r['objects_per_s']:,.0f}"])
    out.append((f"Reads through the mount (open + read + close, {res['threads']} threads)",
                ["setup", "objects read", "seconds", "objects/s"], rows, [False, True, True, True]))
    return out


def goal_lines(res: dict) -> List[str]:
    lines = []
    quick = " (--quick)" if res["mode"] == "quick" else ""

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    many = f"{MANY_SHARDS:,} shards"
    for level, label in (("ShardSet.find", "Python ShardSet"), ("mount", "mount")):
        rs = [r for r in res["lookups"] if r["setup"] == many and r["kind"] == "absent"
              and r["level"].startswith(level) and r["sidecars"] != "no"]
        if rs:
            x = rs[0]["index_reads_per_lookup"]
            lines.append(f"{verdict(x < GOAL_ABSENT_PROBES)} absent-key index reads {x:.3f} < "
                         f"{GOAL_ABSENT_PROBES} per lookup ({many}, {label})")
        else:
            lines.append(f"MISS absent-key index reads: not measured ({many}, {label})")
    big_setup = big_name(res["tiny_objects"])
    for cache in ("cold", "warm"):
        r = best(res["start"], setup=big_setup, sidecars=cache)
        if r:
            lines.append(f"{verdict(r['seconds'] < GOAL_START_BIG)} start time {r['seconds']:.3f} s < "
                         f"{GOAL_START_BIG} s ({big_setup}{quick}, {cache} sidecar, best of "
                         f"{len([x for x in res['start'] if x['setup'] == big_setup and x['sidecars'] == cache])})")
        else:
            lines.append(f"MISS start time: not measured ({big_setup}, {cache} sidecar)")
    r = best(res["start"], setup=many, sidecars="warm")
    if r:
        lines.append(f"{verdict(r['seconds'] < GOAL_START_MANY)} start time {r['seconds']:.3f} s < "
                     f"{GOAL_START_MANY:g} s ({many}, --shard-dir, warm sidecars)")
    else:
        lines.append(f"MISS start time: not measured ({many}, warm sidecars)")
    for setup in (big_setup, many):
        q = quick if setup == big_setup else ""
        rs = [r for r in res["memory"] if r["setup"] == setup]
        steady = [r for r in rs if r["phase"] in STEADY_PHASES or r["phase"].endswith(" reads")]
        if not steady:
            lines.append(f"MISS daemon memory: not measured ({setup})")
            continue
        worst = max(steady, key=lambda r: r["RssAnon"])
        build = [r for r in rs if r["phase"].startswith("peak while")]
        lines.append(f"{verdict(worst['RssAnon'] < GOAL_RSS_ANON)} daemon RssAnon "
                     f"{worst['RssAnon'] / MiB:.1f} MiB < {GOAL_RSS_ANON // MiB} MiB "
                     f"({setup}{q}, largest once serving: {worst['phase']}; VmRSS "
                     f"{worst['VmRSS'] / MiB:.1f} MiB of which sidecar maps "
                     f"{_mib(worst['sidecar_rss'])} MiB, shard maps {_mib(worst['shard_rss'])} MiB"
                     + (f"; while the sidecars build, RssAnon peaks at {build[0]['RssAnon'] / MiB:.1f} MiB"
                        if build else "") + ")")
        g = [r for r in rs if "growth_anon" in r]
        if len(g) >= 2:
            g.sort(key=lambda r: r.get("reads", 0))
            first, last = g[0], g[-1]
            x = last["growth_anon"] - first["growth_anon"]
            lines.append(f"{verdict(x < GOAL_RSS_GROWTH)} daemon RssAnon growth over reads "
                         f"{first['reads']:,}..{last['reads']:,}: {x / MiB:.2f} MiB < "
                         f"{GOAL_RSS_GROWTH // MiB} MiB ({setup}{q}; warm-up over the first "
                         f"{first['reads']:,}: {first['growth_anon'] / MiB:.2f} MiB)")
        else:
            lines.append(f"MISS daemon RssAnon growth over reads: not measured ({setup})")
    return lines


def markdown(res: dict) -> str:
    m = res["machine"]
    out = [f"# Scale benchmark ({res['mode']})", "",
           f"{res['when']}, {m['cores']} cores ({m['cpu']}), {m['memory_bytes'] / 2**30:.0f} GiB RAM, "
           f"kernel {m['kernel']}, Python {m['python']}. Command: `{res['command']}`.", "",
           f"Datasets: {MANY_SHARDS:,} shards of {PER_SHARD:,} objects of {SMALL_SIZES[0]}..{SMALL_SIZES[1]} "
           f"bytes, and one shard of the same {MANY_SHARDS * PER_SHARD:,} objects; one shard of "
           f"{res['tiny_objects']:,} objects of {TINY_SIZES[0]}..{TINY_SIZES[1]} bytes"
           + (" (10,000,000 with --full)" if res["mode"] == "quick" else "") + ". "
           "Lookups: `ShardSet.find` in one thread (index reads = `ShardSet.probes / lookups`), and "
           f"`os.stat` of `MP/<hex key>` from {res['threads']} threads through a flat-layout mount once "
           "every sidecar is ready, each name once (index reads from the root xattr "
           "`user.shardfs.stats`: Δindex_probes / names stat'ed). The big shard is mounted with the default layout (auto: "
           "fan-out above 100,000 objects); its objects are read as `MP/<hex key>`. "
           "Start time: wall clock of "
           "`python -m shardfs mount ...` (interpreter start-up included; it returns once the mount "
           "answers a stat); cold = fresh empty `--cache-dir` (sidecars built in the background "
           "afterwards), warm = sidecars present; shard files in the page cache. Memory: the "
           "daemon's /proc/PID/status; sidecar / shard maps = resident bytes of those file "
           "mappings (/proc/PID/smaps, part of RssFile); peak while sidecars build = the sample with "
           "the largest RssAnon, polled every 50 ms until they are ready. The RssAnon goal "
           "applies to the daemon serving: after a warm mount, once the sidecars are ready, "
           "after the reads; growth = RssAnon after the reads - right before them."
           + (f" `python -m shardfs --version` alone takes {res['cli_startup_s']:.3f} s here."
              if res.get("cli_startup_s") else ""), ""]
    for title, headers, rows, right in tables(res):
        if rows:
            out += [f"**{title}**", ""] + md_table(headers, rows, right) + [""]
    if res.get("skipped"):
        out += ["Not measured: " + "; ".join(res["skipped"]), ""]
    if res.get("errors"):
        out += ["Errors: " + "; ".join(res["errors"]), ""]
    out += ["Goals:", ""] + [f"    {line}" for line in res["goal_lines"]] + [""]
    return "\n".join(out)


# ---------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="big shard of 1,000,000 objects, 20,000 names per stat pass: about 3 "
                           "minutes once the datasets are built")
    mode.add_argument("--full", action="store_true",
                      help="big shard of 10,000,000 objects, 100,000 names per stat pass (default)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default bench/results)")
    ap.add_argument("--tmp", default="/tmp",
                    help="where the scratch directory (mount points, sidecar caches) goes "
                         "(default /tmp)")
    ap.add_argument("--data-dir", default=DATA_DIR, help="dataset cache (default bench/data)")
    ap.add_argument("--threads", type=int, default=4,
                    help="threads for stat() and reads through the mount (default 4)")
    args = ap.parse_args(argv)
    mode_name = "quick" if args.quick else "full"
    plan = PLANS[mode_name]
    os.makedirs(args.out, exist_ok=True)

    skipped: List[str] = []
    can_mount = machine.can_mount()
    if not can_mount:
        skipped.append("everything through a mount (no /dev/fuse, fusermount3 or pyfuse3)")

    log(f"scale benchmark, {mode_name} mode")
    many = ManyShards(args.data_dir).ensure()
    tiny = TinyShard(args.data_dir, plan["tiny_objects"]).ensure()
    try:
        from shardfs import sidecar  # noqa: F401
        from shardfs.fuse.shardset import ShardSet  # noqa: F401
    except ImportError as exc:
        print(f"scale_bench.py: the sidecar code is not importable: {exc}", file=sys.stderr)
        return 1

    tmp = tempfile.mkdtemp(prefix="scale-bench-", dir=args.tmp)
    run = Run(plan, tmp, args.threads, can_mount)
    rnd = random.Random(f"shardfs-scale:sample:{SEED}")
    order = rnd.sample(range(many.count), min(many.count, plan["py_lookups"]))
    py_present = [many.key(i) for i in order]
    py_absent = random_absent(plan["py_lookups"], 1)
    n_stat, n_reads = plan["mount_stats"], plan["reads"]
    order = rnd.sample(range(many.count), 2 * n_stat + n_reads)
    stat_present = [[many.key(i) for i in order[:n_stat]],
                    [many.key(i) for i in order[n_stat:2 * n_stat]]]
    many_reads = [many.key(i) for i in order[2 * n_stat:]]
    stat_absent = [random_absent(n_stat, 2), random_absent(n_stat, 3)]
    many_setup, one_setup = f"{MANY_SHARDS:,} shards", "1 shard"
    big_setup = big_name(tiny.count)
    cli_startup = None
    interrupted = False
    try:
        log("Python level: ShardSet.find")
        for setup, paths in ((many_setup, many.shard_paths()), (one_setup, [many.one])):
            run.lookup_rows += python_level(setup, paths, py_present, py_absent,
                                            plan["py_unfiltered"],
                                            os.path.join(tmp, f"py-{len(paths)}.cache"))
        if can_mount:
            cli_startup = min(_timed(shardfs_cmd("--version")) for _ in range(3))
            log(f"`python -m shardfs --version` takes {cli_startup:.3f} s (interpreter start-up)")
            log(f"mount: {many_setup} (--shard-dir, flat layout)")
            run.scenario(many_setup, "many", ["--shard-dir", many.shard_dir, "--layout", "flat"],
                         many.count, MANY_SHARDS, stat_present[0], stat_absent[0], many_reads)
            log(f"mount: {one_setup} of {many.count:,} objects (flat layout)")
            run.scenario(one_setup, "one", ["--layout", "flat", many.one], many.count, 1,
                         stat_present[1], stat_absent[1], [])
            log(f"mount: {big_setup} (default layout)")
            tiny_reads = tiny.sample_keys(n_reads, SEED)
            run.scenario(big_setup, "big", [tiny.shard], tiny.count, 1, [], [], tiny_reads)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: unmounting")
    finally:
        leftovers = [os.path.join(tmp, d) for d in os.listdir(tmp)
                     if d.endswith(".mnt") and is_mounted(os.path.join(tmp, d))]
        for mp in leftovers:
            Mount([], mp, tmp, os.devnull).close()
        if any(is_mounted(os.path.join(tmp, d)) for d in os.listdir(tmp)):
            log(f"something is still mounted under {tmp}: not removed")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if interrupted:
        return 130

    res = {
        "benchmark": "scale", "mode": mode_name, "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO)
                             else sys.executable, os.path.relpath(__file__, REPO)]
                            + list(argv if argv is not None else sys.argv[1:])),
        "machine": machine_info(), "threads": args.threads, "plan": plan,
        "tiny_objects": tiny.count, "reads_per_mount": n_reads, "cli_startup_s": cli_startup,
        "units": {"seconds": "wall-clock seconds", "lookups_per_s": "lookups per second (all threads)",
                  "memory": "bytes (VmRSS, RssAnon, RssFile, RssShmem, VmHWM from /proc/PID/status; "
                            "sidecar_rss, shard_rss: resident bytes of those file mappings from "
                            "/proc/PID/smaps)"},
        "lookups": run.lookup_rows, "start": run.start_rows, "memory": run.memory_rows,
        "sidecars": run.sidecar_rows, "reads": run.read_rows,
        "skipped": skipped, "errors": run.errors,
        "wall_seconds": round(time.perf_counter() - _t_start, 1),
    }
    res["goal_lines"] = goal_lines(res)
    with open(os.path.join(args.out, "scale.json"), "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "scale.md"), "w") as f:
        f.write(markdown(res))
    print()
    for title, headers, rows, right in tables(res):
        if rows:
            print(title)
            print("\n".join(table(headers, rows, right)))
            print()
    if cli_startup:
        print(f"(`python -m shardfs --version` alone: {cli_startup:.3f} s)")
    for s in skipped:
        print(f"not measured: {s}")
    for e in run.errors:
        print(f"ERROR: {e}")
    for line in res["goal_lines"]:
        print(line)
    print(f"\nwrote {os.path.join(args.out, 'scale.json')}, {os.path.join(args.out, 'scale.md')} "
          f"in {res['wall_seconds']} s")
    return 1 if run.errors else 0


def _timed(cmd: List[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, timeout=60, check=True)
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
