"""fio through the shardfs mount against the same objects as plain files.

For every job of bench/fio/*.fio, both targets (the FUSE mount of the shard,
and the same objects as plain files on the same disk: the native baseline)
and both cache states, run fio (psync, JSON output) and collect IOPS, MB/s
and latency percentiles:

    random-objects  whole objects of random keys: open, read to the end, close
                    (API clients); small objects; 1, 4, 16 workers
    seq-objects     whole objects in storage order (mirroring); 1, 4, 16
    random-4k       4 KiB random reads inside large objects kept open; 1, 4, 16
    seq-large       large objects streamed with 1 MiB reads; 1, 4, 16
    mixed           random object readers while streamers read large objects

Cache states:

    cold  the first fio worker to finish its setup runs a reset script
          (exec_prerun; the others wait for it on a lock): for the mount it
          unmounts and mounts the shard again (a fresh daemon: its mmap'ed
          pages are unmapped, the kernel's FUSE dentries, inodes and pages are
          gone), then `sync; echo 3 > /proc/sys/vm/drop_caches`. Doing it after
          fio's setup matters: fio stat()s every file while setting up, which
          for the mount is a LOOKUP that reads the object's index slot and size
          field (and for a small object, its bytes). Each worker then reads its
          objects once (time_based=0, RUNTIME as a cap).
    warm  every file of the job is read once through the target beforehand;
          fio then loops over them for RUNTIME seconds (time_based).

Whole-object jobs: fio can only read a file in blocks that fit inside it, so
objects are read with random-length reads (bsrange=1-1k, bs_unaligned);
fio_bench keeps, from fio's per-read latency log, the first read of each
object (offset 0, the one that fetches its bytes): "IOPS" is objects per
second (their count over the run time, open and close included) and the
latencies are per object (that first read; open/lookup time is not in fio's
latency). For the block jobs, fio's own IOPS and completion latency.

Outputs in --out (bench/results by default): fio.json (one row per job,
target, cache state and worker count), fio.md (the table, with the mount's
IOPS over the native IOPS), fio_latency.png and fio_throughput.png, and the
goal lines printed last (``GOAL <name>: <figure> PASS|MISS``).

    python bench/fio_bench.py --quick     # ~2 minutes: 10k small objects, 12 large, 1.5 s runs
    python bench/fio_bench.py --full      # bigger datasets (small 1M, mix 300k,
                                          # large 64), 30 s runs: about an hour

Needs root (drop_caches), fio, fusermount3, and the venv's shardfs. Mounts
are unmounted in all cases (``shardfs umount``, ``fusermount3 -uz`` as a last
resort).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import datasets as dsmod  # noqa: E402  (bench/datasets.py)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import abort_fuse_connection, cpu_model  # noqa: E402

FIO_DIR = os.path.join(HERE, "fio")
DROP_CACHES = "/proc/sys/vm/drop_caches"
#: fio rejects option values longer than 4096 characters.
FILENAME_LINE_MAX = 3900
#: Percentiles kept per row for the latency plots.
CDF_POINTS = [0, 1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 98, 99, 99.5, 99.9, 100]


# ------------------------------------------------------------------ modes


@dataclass
class Mode:
    """What --quick and --full run."""

    name: str
    #: Objects per dataset kind.
    counts: Dict[str, int]
    #: Seconds per run (warm: measured time; cold: a cap on the single pass).
    runtime: float
    #: Worker counts of the scaling jobs.
    numjobs: Tuple[int, ...] = (1, 4, 16)
    #: Largest number of objects one fio run reads (fio stats every file at
    #: setup and keeps a structure per file).
    max_files: int = 10000
    #: Datasets the whole-object jobs run on.
    object_kinds: Tuple[str, ...] = ("small",)
    #: Random readers and streamers of the mixed job.
    mixed_random: int = 4
    mixed_stream: int = 2
    #: Largest read of the whole-object jobs (see bench/fio/random_objects.fio).
    chunk: str = "1k"


MODES = {
    # 52 fio runs: 1.5 s each keeps the whole under 2.5 minutes on 2 cores.
    "quick": Mode("quick", counts={"small": 10000, "large": 12}, runtime=1.5),
    "full": Mode("full", counts={"small": 1_000_000, "large": 64, "mix": 300_000}, runtime=30,
                 max_files=100_000, object_kinds=("small", "mix")),
}


@dataclass
class Job:
    """One job of the matrix: a template and the datasets its roles read."""

    name: str
    template: str
    #: "objects" (whole-object reads, latency per object) or "blocks".
    unit: str
    #: Dataset kind read (the random role's, for the mixed job).
    kind: str
    numjobs: Tuple[int, ...]
    #: For the mixed job: dataset kind of the streamers.
    stream_kind: Optional[str] = None


def job_matrix(mode: Mode) -> List[Job]:
    jobs = []
    for kind in mode.object_kinds:
        jobs.append(Job("random-objects", "random_objects.fio", "objects", kind, mode.numjobs))
    for kind in mode.object_kinds:
        jobs.append(Job("seq-objects", "seq_objects.fio", "objects", kind, mode.numjobs))
    jobs.append(Job("random-4k", "random_4k.fio", "blocks", "large", mode.numjobs))
    jobs.append(Job("seq-large", "seq_large.fio", "blocks", "large", mode.numjobs))
    jobs.append(Job("mixed", "mixed.fio", "objects", "small", (mode.mixed_random,),
                    stream_kind="large"))
    return jobs


# ----------------------------------------------------------------- mounts


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def block_device_of(path: str) -> Optional[Tuple[int, int]]:
    """(major, minor) of the device holding `path`, as /proc/diskstats names it."""
    dev = os.stat(path).st_dev
    return os.major(dev), os.minor(dev)


def device_reads(dev: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    """(reads completed, bytes read) of block device `dev` since boot."""
    if dev is None:
        return 0, 0
    with open("/proc/diskstats") as f:
        for line in f:
            fields = line.split()
            if (int(fields[0]), int(fields[1])) == dev:
                return int(fields[3]), int(fields[5]) * 512
    return 0, 0


def daemon_cpu(mountpoints: Sequence[str]) -> Dict[int, float]:
    """CPU seconds (user + system) of each shardfs daemon serving one of
    `mountpoints`, by pid."""
    out: Dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"shardfs.fuse.mount" not in argv or b"--mountpoint" not in argv:
                continue
            mp = argv[argv.index(b"--mountpoint") + 1].decode(errors="replace")
            if os.path.realpath(mp) not in mountpoints:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(pid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return out


def kill_fio(proc: subprocess.Popen, workdir: str) -> None:
    """Kill a fio run: its main process and its job processes, which fio
    puts each in a session of its own (found by the job file path in their
    command line), by pid."""
    pids = {proc.pid}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"fio" and any(
                a.startswith(workdir.encode()) for a in argv[1:]):
            pids.add(int(pid))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        log(f"fio_bench: fio (pid {proc.pid}) does not die (blocked in the kernel?)")


def mount_points() -> List[str]:
    """Mount points of this process's mount table (octal escapes decoded)."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 4:
                points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                                     fields[4]))
    return points


class Mounts:
    """The shards mounted for the benchmark, one mount point per dataset
    under bench/data/mnt/. Always call umount_all() (in a finally)."""

    def __init__(self, shardfs_cli: str, base: str) -> None:
        self.cli = shardfs_cli
        self.base = base
        #: dataset name -> (shard path, mount point)
        self.points: Dict[str, Tuple[str, str]] = {}

    def mountpoint(self, ds: dsmod.Dataset) -> str:
        return self.points[ds.name][1]

    def is_mounted(self, mp: str) -> bool:
        return os.path.realpath(mp) in mount_points()

    def add(self, ds: dsmod.Dataset) -> str:
        mp = os.path.join(self.base, ds.name)
        os.makedirs(mp, exist_ok=True)
        self.points[ds.name] = (ds.shard, mp)
        if self.is_mounted(mp):  # left over by an interrupted run
            self._umount(mp)
        self._mount(ds.shard, mp)
        return mp

    def _mount(self, shard: str, mp: str) -> None:
        subprocess.run([self.cli, "mount", shard, mp], check=True, timeout=60)

    def _umount(self, mp: str) -> None:
        try:
            subprocess.run([self.cli, "umount", mp], check=True, timeout=60,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            log(f"fio_bench: shardfs umount {mp} failed ({exc}); aborting the FUSE "
                f"connection and unmounting lazily")
            abort_fuse_connection(mp)
            subprocess.run(["fusermount3", "-uz", mp], timeout=60)

    def healthy(self, mp: str) -> bool:
        """True if the daemon answers a statfs within 10 s. (statfs always
        reaches the daemon, where the kernel answers a stat of the root from
        its attribute cache even after the daemon died; it runs in a child
        process so that a hung daemon cannot hang us.)"""
        try:
            return subprocess.run(["stat", "-f", "-c", "%b", mp], timeout=10,
                                  stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def ensure(self, name: str) -> None:
        """Mounted and answering, else unmount (lazily if need be) and mount again."""
        shard, mp = self.points[name]
        if self.is_mounted(mp) and self.healthy(mp):
            return
        log(f"fio_bench: the mount at {mp} is gone or does not answer: mounting again")
        if self.is_mounted(mp):
            self._umount(mp)
        self._mount(shard, mp)

    def umount_all(self) -> None:
        for shard, mp in self.points.values():
            if self.is_mounted(mp):
                self._umount(mp)
            if self.is_mounted(mp):
                log(f"fio_bench: {mp} is still mounted")


# ------------------------------------------------------------ job files


def filename_lines(names: Sequence[str]) -> List[str]:
    """filename= lines of colon-separated names, each under fio's limit."""
    lines, cur, length = [], [], 0
    for name in names:
        if cur and length + len(name) + 1 > FILENAME_LINE_MAX:
            lines.append("filename=" + ":".join(cur))
            cur, length = [], 0
        cur.append(name)
        length += len(name) + 1
    if cur:
        lines.append("filename=" + ":".join(cur))
    return lines


def render_job(template: str, files: Dict[str, List[List[str]]]) -> str:
    """The job file: `template` with every section that holds a line
    ``;@files NAME`` written once per group of files in files[NAME]: copy k
    (k > 0) is named ``[<section>.<k>]``, and the marker line becomes the
    group's filename= lines. Other lines are copied as they are (fio expands
    the ${VARIABLES} itself)."""
    out: List[str] = []
    section: List[str] = []

    def flush() -> None:
        marks = [i for i, l in enumerate(section) if l.strip().startswith(";@files")]
        if not marks:
            out.extend(section)
            return
        mark = marks[0]
        groups = files[section[mark].split()[1]]
        name = section[0].strip()[1:-1]
        for k, group in enumerate(groups):
            out.append(f"[{name}]" if k == 0 else f"[{name}.{k}]")
            out.extend(section[1:mark])
            out.extend(filename_lines(group))
            out.extend(section[mark + 1:])

    for line in template.splitlines():
        if line.startswith("[") and section:
            flush()
            section = []
        section.append(line)
    if section:
        flush()
    return "\n".join(out) + "\n"


def split(seq: Sequence[str], parts: int) -> List[List[str]]:
    """`seq` cut into `parts` contiguous, nearly equal, non-empty groups."""
    parts = max(1, min(parts, len(seq)))
    bounds = [len(seq) * i // parts for i in range(parts + 1)]
    return [list(seq[bounds[i]:bounds[i + 1]]) for i in range(parts)]


# ------------------------------------------------------------- parsing


_FIRST_READ = re.compile(rb"^\d+, (\d+), 0, \d+, 0,", re.M)


def first_read_latencies(logdir: str, prefix: str = "objects") -> List[int]:
    """Latencies (ns) of the reads at offset 0 in fio's clat logs: one per
    object read."""
    values: List[int] = []
    for name in os.listdir(logdir):
        if name.startswith(prefix + "_clat.") and name.endswith(".log"):
            with open(os.path.join(logdir, name), "rb") as f:
                values.extend(map(int, _FIRST_READ.findall(f.read())))
    return values


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def load_fio_json(path: str) -> dict:
    """fio's JSON output (fio may print notices before it)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    start = text.find("{\n")
    if start < 0:
        raise ValueError(f"no JSON in fio output {path}: {text[:300]!r}")
    return json.loads(text[start:])


# ---------------------------------------------------------------- runner


@dataclass
class Bench:
    """One benchmark session: the datasets, their mounts, a scratch directory
    (`work`, on /dev/shm: fio's latency logs must not load the disk measured)
    and the rows collected so far."""

    mode: Mode
    out: str
    seed: int
    shardfs_cli: str
    data_dir: str
    datasets: Dict[str, dsmod.Dataset] = field(default_factory=dict)
    mounts: Optional[Mounts] = None
    work: str = ""
    rows: List[dict] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    run_id: int = 0
    #: Job names to run (all when empty).
    only: List[str] = field(default_factory=list)
    #: Keep each run's job file, fio output and logs (debugging).
    keep_work: bool = False
    #: (major, minor) of the disk holding the datasets, for its read counters.
    device: Optional[Tuple[int, int]] = None

    # -- file sets --------------------------------------------------------

    def object_set(self, job: Job) -> List[int]:
        """Indexes (in storage order) of the objects a whole-object job
        reads: all of them up to max_files; above, a seeded random sample
        (random order) or a contiguous range (storage order)."""
        ds = self.datasets[job.kind]
        n = min(ds.count, self.mode.max_files)
        if job.name == "seq-objects":
            start = (ds.count - n) // 2
            return list(range(start, start + n))
        idx = list(range(ds.count))
        rnd = random.Random(f"fio-bench:{job.name}:{job.kind}:{self.seed}")
        rnd.shuffle(idx)
        return idx[:n]

    def names(self, ds: dsmod.Dataset, target: str, indexes: Sequence[int]) -> List[str]:
        if target == "mount":
            return [ds.keys[i] for i in indexes]
        return [ds.native_relpath(ds.keys[i]) for i in indexes]

    def root(self, ds: dsmod.Dataset, target: str) -> str:
        return self.mounts.mountpoint(ds) if target == "mount" else ds.native_dir

    # -- cold reset ---------------------------------------------------------

    def prerun_script(self, workdir: str, target: str, kinds: Sequence[str]) -> str:
        """A shell script fio runs in every worker after its setup: the first
        worker to take the lock remounts (mount target) and drops the caches,
        the others wait for it and do nothing."""
        lock = shlex.quote(os.path.join(workdir, "prerun.lock"))
        done = shlex.quote(os.path.join(workdir, "prerun.done"))
        lines = ["#!/bin/sh",
                 "# Cold-cache reset for one fio run (written by bench/fio_bench.py).",
                 f"exec 9>{lock}", "flock 9", f"[ -e {done} ] && exit 0"]
        if target == "mount":
            cli = shlex.quote(self.shardfs_cli)
            for kind in kinds:
                shard, mp = self.mounts.points[self.datasets[kind].name]
                # 9>&-: the daemon must not inherit (and hold) the lock.
                lines.append(f"{cli} umount {shlex.quote(mp)} 9>&- || exit 1")
                lines.append(f"{cli} mount {shlex.quote(shard)} {shlex.quote(mp)} 9>&- || exit 1")
        lines += ["sync", f"echo 3 > {DROP_CACHES} || exit 1", f"touch {done}", ""]
        path = os.path.join(workdir, "prerun.sh")
        with open(path, "w") as f:
            f.write("\n".join(lines))
        return path

    # -- warm-up --------------------------------------------------------------

    def warm_up(self, paths: Sequence[str]) -> None:
        """Read every file of `paths` to the end (4 threads)."""

        def read(path: str) -> int:
            fd = os.open(path, os.O_RDONLY)
            try:
                n = 0
                while True:
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        return n
                    n += len(chunk)
            finally:
                os.close(fd)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for _ in pool.map(read, paths, chunksize=64):
                pass

    def warm_paths(self, jobs: Sequence[Job], target: str) -> List[str]:
        paths: Dict[str, None] = {}
        for job in jobs:
            ds = self.datasets[job.kind]
            idx = self.object_set(job) if job.unit == "objects" else range(ds.count)
            for name in self.names(ds, target, idx):
                paths[os.path.join(self.root(ds, target), name)] = None
            if job.stream_kind:
                sds = self.datasets[job.stream_kind]
                for name in self.names(sds, target, range(sds.count)):
                    paths[os.path.join(self.root(sds, target), name)] = None
        return list(paths)

    # -- one fio run ------------------------------------------------------------

    def run(self, job: Job, target: str, cache: str, numjobs: int) -> List[dict]:
        """Run `job` once; returns its result rows (two for the mixed job)."""
        self.run_id += 1
        workdir = os.path.join(self.work, f"run{self.run_id:03d}-{job.name}-{target}-{cache}-{numjobs}")
        os.makedirs(workdir)
        ds = self.datasets[job.kind]
        kinds = [job.kind] + ([job.stream_kind] if job.stream_kind else [])
        for kind in kinds:
            if target == "mount":
                self.mounts.ensure(self.datasets[kind].name)
        env = dict(os.environ)
        env.update(RUNTIME=f"{int(self.mode.runtime * 1000)}ms", TIME_BASED="0" if cache == "cold" else "1",
                   LOGDIR=workdir)
        env["PRERUN"] = ("sh " + self.prerun_script(workdir, target, kinds)) if cache == "cold" \
            else "true"
        files: Dict[str, List[List[str]]] = {}
        if job.name in ("random-objects", "seq-objects"):
            files["objects"] = split(self.names(ds, target, self.object_set(job)), numjobs)
            env.update(DIR=self.root(ds, target), CHUNK=self.mode.chunk)
        elif job.name in ("random-4k", "seq-large"):
            files["objects"] = [self.names(ds, target, range(ds.count))]
            env.update(DIR=self.root(ds, target), NUMJOBS=str(numjobs),
                       SLICE=str(100 // numjobs))
        elif job.name == "mixed":
            sds = self.datasets[job.stream_kind]
            files["random"] = split(self.names(ds, target, self.object_set(job)), numjobs)
            files["stream"] = [self.names(sds, target, range(sds.count))]
            env.update(RANDOM_DIR=self.root(ds, target), STREAM_DIR=self.root(sds, target),
                       CHUNK=self.mode.chunk, STREAM_JOBS=str(self.mode.mixed_stream),
                       STREAM_SLICE=str(100 // self.mode.mixed_stream))
        with open(os.path.join(FIO_DIR, job.template)) as f:
            jobfile = render_job(f.read(), files)
        jobpath = os.path.join(workdir, job.template)
        with open(jobpath, "w") as f:
            f.write(jobfile)
        output = os.path.join(workdir, "out.json")
        cmd = ["fio", "--output-format=json", f"--output={output}", "--eta=never", jobpath]
        # Generous: setup (fio stats every file), the prerun remount, the run.
        nfiles = sum(len(group) for groups in files.values() for group in groups)
        timeout = 2 * self.mode.runtime + 60 + nfiles / 2000
        mps = [os.path.realpath(self.mounts.points[self.datasets[k].name][1]) for k in kinds] \
            if target == "mount" else []
        cpu0 = daemon_cpu(mps)
        dev0 = device_reads(self.device)
        t0 = time.monotonic()
        console_path = os.path.join(workdir, "console.txt")
        with open(console_path, "wb") as console:
            # A file, not a pipe: fio's job processes (each in its own session)
            # may outlive a killed fio, and a pipe would never see its end.
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=console,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except BaseException as exc:  # timeout, or Ctrl-C: fio runs in its own sessions
            kill_fio(proc, workdir)
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            msg = (f"{job.name} {target} {cache} x{numjobs}: fio did not finish in {timeout:.0f} s "
                   f"(killed)" + ("; the mount may hang" if target == "mount" else ""))
            self.problems.append(msg)
            log("fio_bench: " + msg)
            return [self.error_row(job, target, cache, numjobs, "timeout")]
        wall = time.monotonic() - t0
        dev1 = device_reads(self.device)
        cpu1 = daemon_cpu(mps)
        # A daemon started by the cold reset served only this run: all of its CPU counts.
        daemon_s = sum(c - cpu0.get(pid, 0.0) for pid, c in cpu1.items())
        with open(console_path, errors="replace") as f:
            console_text = f.read().strip()
        try:
            result = load_fio_json(output)
        except (OSError, ValueError) as exc:
            msg = f"{job.name} {target} {cache} x{numjobs}: fio exit {proc.returncode}: " \
                  f"{console_text[-500:] or exc}"
            self.problems.append(msg)
            log("fio_bench: " + msg)
            return [self.error_row(job, target, cache, numjobs, f"fio exit {proc.returncode}")]
        rows = self.rows_from(job, target, cache, numjobs, result, workdir)
        for row in rows:
            row["wall_s"] = round(wall, 2)
            # Whole fio run (setup and cold reset included; shared by the two
            # roles of the mixed job).
            row["dev_reads"] = dev1[0] - dev0[0]
            row["dev_read_mb"] = round((dev1[1] - dev0[1]) / 1e6, 1)
            if target == "mount":
                row["daemon_cpu_s"] = round(daemon_s, 2)
            if proc.returncode != 0 or row.get("error"):
                err = row.get("error") or f"fio exit {proc.returncode}"
                row["error"] = err
                msg = f"{job.name} {target} {cache} x{numjobs}: {err}: {console_text[-300:]}"
                self.problems.append(msg)
                log("fio_bench: " + msg)
        if not self.keep_work:
            shutil.rmtree(workdir, ignore_errors=True)
        return rows

    def error_row(self, job: Job, target: str, cache: str, numjobs: int, error: str) -> dict:
        return {"job": job.name, "role": "", "dataset": self.datasets[job.kind].name,
                "target": target, "cache": cache, "numjobs": numjobs, "error": error}

    def rows_from(self, job: Job, target: str, cache: str, numjobs: int, result: dict,
                  workdir: str) -> List[dict]:
        rows = []
        for entry in result.get("jobs", []):
            read = entry["read"]
            runtime_s = read["runtime"] / 1000.0
            is_stream = entry["jobname"] == "stream"
            role = "" if job.name != "mixed" else ("stream" if is_stream else "random")
            kind = job.stream_kind if is_stream else job.kind
            row = {
                "job": job.name, "role": role, "dataset": self.datasets[kind].name,
                "target": target, "cache": cache,
                "numjobs": self.mode.mixed_stream if is_stream else numjobs,
                "runtime_s": round(runtime_s, 3), "mb_s": round(read["bw_bytes"] / 1e6, 2),
                "bytes": read["io_bytes"], "fio_reads": read["total_ios"],
                "fio_read_iops": round(read["iops"], 1),
                "usr_cpu": round(entry.get("usr_cpu", 0.0), 1),
                "sys_cpu": round(entry.get("sys_cpu", 0.0), 1),
            }
            if entry.get("error"):
                row["error"] = f"fio error {entry['error']} ({os.strerror(entry['error'])})"
            clat = read["clat_ns"]
            object_role = job.unit == "objects" and not is_stream
            if object_role:
                lat = sorted(first_read_latencies(workdir))
                row["unit"] = "objects/s"
                row["latency_of"] = "first read of each object"
                row["objects"] = len(lat)
                row["iops"] = round(len(lat) / runtime_s, 1) if runtime_s else 0.0
                pcts = {p: percentile(lat, p) / 1e6 for p in (50, 98, 99.9)}
                row["max_ms"] = round(lat[-1] / 1e6, 3) if lat else None
                row["cdf_ms"] = [[p, round(percentile(lat, p) / 1e6, 4)] for p in CDF_POINTS] \
                    if lat else []
            else:
                row["unit"] = "reads/s"
                row["latency_of"] = "each read"
                row["iops"] = round(read["iops"], 1)
                got = clat.get("percentile", {})
                pcts = {p: got.get(f"{p:.6f}", float("nan")) / 1e6 for p in (50, 98, 99.9)}
                row["max_ms"] = round(clat["max"] / 1e6, 3)
            row["p50_ms"] = round(pcts[50], 4)
            row["p98_ms"] = round(pcts[98], 4)
            row["p99_9_ms"] = round(pcts[99.9], 4)
            rows.append(row)
        return rows

    # -- the whole matrix ---------------------------------------------------------

    def run_all(self) -> None:
        jobs = [j for j in job_matrix(self.mode) if not self.only or j.name in self.only]
        targets = ("native", "mount")
        total = sum(len(j.numjobs) for j in jobs) * len(targets) * 2
        done = 0
        for cache in ("cold", "warm"):
            for job in jobs:
                for target in targets:
                    if cache == "warm":
                        # Right before the job: other work on the machine
                        # (or a cold run) may have dropped the caches.
                        t0 = time.monotonic()
                        if target == "mount":
                            for kind in {job.kind, job.stream_kind} - {None}:
                                self.mounts.ensure(self.datasets[kind].name)
                        paths = self.warm_paths([job], target)
                        try:
                            self.warm_up(paths)
                        except OSError as exc:
                            msg = f"warm-up of {job.name} through the {target}: {exc}"
                            self.problems.append(msg)
                            log("fio_bench: " + msg)
                        log(f"warm-up {job.name} {target}: read {len(paths):,} files in "
                            f"{time.monotonic() - t0:.1f} s")
                    for nj in job.numjobs:
                        done += 1
                        rows = self.run(job, target, cache, nj)
                        self.rows.extend(rows)
                        for row in rows:
                            log(f"[{done}/{total}] {fmt_row_short(row)}")


def fmt_row_short(row: dict) -> str:
    name = row["job"] + (f"/{row['role']}" if row.get("role") else "")
    if row.get("error") and "iops" not in row:
        return f"{name} {row['target']} {row['cache']} x{row['numjobs']}: ERROR {row['error']}"
    return (f"{name} {row['dataset']} {row['target']} {row['cache']} x{row['numjobs']}: "
            f"{row['iops']:,.0f} {row['unit']}, {row['mb_s']:,.1f} MB/s, p50 {row['p50_ms']:.3f} ms, "
            f"p98 {row['p98_ms']:.3f} ms, max {row['max_ms']} ms"
            + (f"  ERROR {row['error']}" if row.get("error") else ""))


# ---------------------------------------------------------------- goals


def find(rows: List[dict], **kw) -> List[dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items())
            and "iops" in r and not r.get("error")]


def goals(rows: List[dict]) -> List[str]:
    """The goal lines: ``GOAL <name>: <figure> PASS|MISS``."""
    lines = []
    cold = find(rows, job="random-objects", target="mount", cache="cold")
    cold = [r for r in cold if r["dataset"].startswith("small-")] or cold
    if cold:
        best = max(cold, key=lambda r: r["iops"])
        ok = best["iops"] >= 10000
        lines.append(f"GOAL cold whole-object reads through the mount (fio random-objects, "
                     f"best of {'/'.join(str(r['numjobs']) for r in cold)} jobs) >= 10,000/s: "
                     f"{best['iops']:,.0f}/s with {best['numjobs']} job{'s' if best['numjobs'] > 1 else ''} "
                     f"{'PASS' if ok else 'MISS'}")
    else:
        lines.append("GOAL cold whole-object reads through the mount >= 10,000/s: no result MISS")
    mount = find(rows, job="random-4k", target="mount", cache="warm")
    native = find(rows, job="random-4k", target="native", cache="warm")
    if mount and native:
        bm = max(mount, key=lambda r: r["iops"])
        bn = max(native, key=lambda r: r["iops"])
        ratio = bm["iops"] / bn["iops"]
        lines.append(f"GOAL warm 4 KiB random reads through the mount >= 50% of native IOPS "
                     f"(best of each): {bm['iops']:,.0f} vs {bn['iops']:,.0f} IOPS = {ratio:.0%} "
                     f"{'PASS' if ratio >= 0.5 else 'MISS'}")
    else:
        lines.append("GOAL warm 4 KiB random reads through the mount >= 50% of native IOPS: "
                     "no result MISS")
    mixed = find(rows, job="mixed", role="random", target="mount")
    if mixed:
        worst98 = max(mixed, key=lambda r: r["p98_ms"])
        worstmax = max(mixed, key=lambda r: r["max_ms"])
        ok = worst98["p98_ms"] < 10 and worstmax["max_ms"] < 1000
        lines.append(f"GOAL random object reads under the mixed load through the mount, "
                     f"p98 < 10 ms and max < 1 s (worst of cold and warm): "
                     f"p98 {worst98['p98_ms']:.2f} ms ({worst98['cache']}), max "
                     f"{worstmax['max_ms']:.1f} ms ({worstmax['cache']}) {'PASS' if ok else 'MISS'}")
    else:
        lines.append("GOAL random object reads under the mixed load p98 < 10 ms and max < 1 s: "
                     "no result MISS")
    return lines


# ---------------------------------------------------------------- report


def machine() -> Dict[str, str]:
    cpu = cpu_model()
    fio = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": str(os.cpu_count()),
            "memory_gib": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}",
            "kernel": platform.release(), "fio": fio, "python": platform.python_version()}


def ratio_of(rows: List[dict], row: dict) -> Optional[float]:
    if row["target"] != "mount" or "iops" not in row or row.get("error"):
        return None
    for other in rows:
        if (other["target"] == "native" and other["job"] == row["job"]
                and other.get("role") == row.get("role") and other["cache"] == row["cache"]
                and other["numjobs"] == row["numjobs"]
                and other["dataset"] == row["dataset"] and other.get("iops")):
            return row["iops"] / other["iops"]
    return None


def cpu_pct(row: dict) -> str:
    """The mount daemon's CPU time over the run time, as a percentage of one core."""
    if "daemon_cpu_s" not in row or not row.get("runtime_s"):
        return ""
    return f"{100 * row['daemon_cpu_s'] / row['runtime_s']:.0f}%"


def fmt_ms(v: Optional[float]) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


JOB_LABELS = {
    "random-objects": "random whole objects",
    "seq-objects": "whole objects, storage order",
    "random-4k": "random 4 KiB reads, open files",
    "seq-large": "large objects, 1 MiB reads",
    ("mixed", "random"): "mixed: random object readers",
    ("mixed", "stream"): "mixed: streamers (1 MiB)",
}


def job_label(row: dict) -> str:
    if row["job"] == "mixed":
        return JOB_LABELS[("mixed", row.get("role") or "random")]
    return JOB_LABELS.get(row["job"], row["job"])


def write_markdown(path: str, mode: Mode, rows: List[dict], goal_lines: List[str],
                   ds_info: List[str], mach: Dict[str, str], wall: float, command: str,
                   problems: List[str], load: Dict[str, List[float]]) -> None:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    out = [
        f"# fio through the mount vs plain files ({mode.name})",
        "",
        f"{now}, {mach['cores']} cores ({mach['cpu']}), {mach['memory_gib']} GiB RAM, kernel "
        f"{mach['kernel']}, {mach['fio']}, Python {mach['python']}. Command: `{command}` "
        f"({wall:.0f} s in all). Load average (1/5/15 min) {'/'.join(map(str, load['start']))} "
        f"at the start, {'/'.join(map(str, load['end']))} at the end: with 2 cores, anything "
        "else running moves these figures.",
        "",
        "Each job runs against the FUSE mount of the shard (`shardfs mount`, files "
        "`MNT/<64-hex key>`) and against the same objects as plain files on the same disk "
        "(`native/ab/cd/<key>`, the pathslicing layout): ioengine=psync, one run per "
        "line. **cold**: after fio's setup the shard is mounted afresh and "
        "`sync; echo 3 > /proc/sys/vm/drop_caches` runs, then each worker reads its objects "
        f"once (capped at {mode.runtime} s); **warm**: every file read once beforehand, then "
        f"{mode.runtime} s of reading. Workers read disjoint sets of objects (whole-object "
        "jobs) or disjoint slices of every object (block jobs).",
        "",
        "For whole-object jobs **IOPS is objects per second** (open, read to the end, close; "
        "fio reads an object in random-length chunks since it cannot issue a read larger "
        "than what is left of a file) and the latencies are per object: the first read of "
        "each object, the one that fetches its bytes (the open and its lookup are not "
        "timed by fio, but they are in objects/s). For the block jobs, fio's reads per "
        "second and completion latency of each read. Ratio = the mount's IOPS / native "
        "IOPS, same job, cache state and workers. Daemon CPU = CPU time of the shardfs "
        "daemon(s) during the run over the run time (100% = one core busy; the machine has "
        f"{os.cpu_count()}). Device MB read = what the disk served during the whole fio run "
        "(its setup and the cold reset included): near 0 for a warm run, unless something "
        "else on the machine dropped the caches (the counters are the whole device's: "
        "other processes' reads count too).",
        "",
        "Datasets: " + "; ".join(ds_info) + ".",
        "",
        "## Goals",
        "",
    ]
    out += [f"- {line}" for line in goal_lines]
    out += ["", "## Mount vs native, best of the worker counts", "",
            "| job | cache | mount IOPS (jobs) | native IOPS (jobs) | ratio |",
            "|---|---|---:|---:|---:|"]
    seen = []
    for row in rows:
        key = (row["job"], row.get("role", ""), row["dataset"], row["cache"])
        if key in seen or "iops" not in row:
            continue
        seen.append(key)
        sel = {t: find(rows, job=row["job"], role=row.get("role", ""), dataset=row["dataset"],
                       cache=row["cache"], target=t) for t in ("mount", "native")}
        if not sel["mount"] or not sel["native"]:
            continue
        bm = max(sel["mount"], key=lambda r: r["iops"])
        bn = max(sel["native"], key=lambda r: r["iops"])
        out.append(f"| {job_label(row)} ({row['dataset'].split('-')[0]}) | {row['cache']} | "
                   f"{bm['iops']:,.0f} ({bm['numjobs']}) | {bn['iops']:,.0f} ({bn['numjobs']}) | "
                   f"{bm['iops'] / bn['iops']:.2f} |")
    out += ["", "## Results", "",
            "| job | dataset | target | cache | jobs | IOPS | MB/s | p50 ms | p98 ms | p99.9 ms "
            "| max ms | mount/native IOPS | daemon CPU | device MB read |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if "iops" not in row:
            out.append(f"| {job_label(row)} | {row['dataset']} | {row['target']} | {row['cache']} "
                       f"| {row['numjobs']} | error: {row.get('error')} | | | | | | | | |")
            continue
        ratio = ratio_of(rows, row)
        err = f" (error: {row['error']})" if row.get("error") else ""
        out.append(
            f"| {job_label(row)} | {row['dataset']} | {row['target']} | {row['cache']} | "
            f"{row['numjobs']} | {row['iops']:,.0f}{err} | {row['mb_s']:,.1f} | "
            f"{fmt_ms(row['p50_ms'])} | {fmt_ms(row['p98_ms'])} | {fmt_ms(row['p99_9_ms'])} | "
            f"{fmt_ms(row['max_ms'])} | {'' if ratio is None else f'{ratio:.2f}'} | "
            f"{cpu_pct(row)} | {row.get('dev_read_mb', '')} |")
    out += ["", "![latency](fio_latency.png)", "", "![throughput](fio_throughput.png)", ""]
    if problems:
        out += ["## Problems seen", ""] + [f"- {p}" for p in problems] + [""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def fmt_latency(ms: float) -> str:
    return f"{ms * 1000:.0f} µs" if ms < 1 else f"{ms:.1f} ms"


def plot(out: str, rows: List[dict], mode: Mode) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    styles = {("mount", "cold"): ("tab:red", "-"), ("mount", "warm"): ("tab:red", "--"),
              ("native", "cold"): ("tab:blue", "-"), ("native", "warm"): ("tab:blue", "--")}

    # Latency: CDF of per-object latency, random whole objects and mixed readers.
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels = [("random-objects", None, "random whole objects (1 worker)", 1),
              ("mixed", "random", f"random readers under the mixed load "
                                  f"({mode.mixed_random} readers, {mode.mixed_stream} streamers)",
               mode.mixed_random)]
    for ax, (jobname, role, title, nj) in zip(axes, panels):
        for (target, cache), (color, ls) in styles.items():
            sel = [r for r in find(rows, job=jobname, target=target, cache=cache, numjobs=nj)
                   if (role is None or r.get("role") == role) and r.get("cdf_ms")
                   and r["dataset"].startswith("small-")]
            if not sel:
                continue
            pts = sel[0]["cdf_ms"]
            xs = [max(p[1], 1e-4) for p in pts]
            ys = [p[0] for p in pts]
            ax.plot(xs, ys, color=color, linestyle=ls, marker=".",
                    label=f"{target} {cache} (p98 {fmt_latency(sel[0]['p98_ms'])})")
        ax.set_xscale("log")
        ax.set_xlabel("latency of an object's first read (ms, log)")
        ax.set_ylabel("percentile")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("Per-object read latency, mount vs plain files (fio, small objects)")
    fig.tight_layout()
    path = os.path.join(out, "fio_latency.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    # Throughput against concurrency.
    panels = [("random-objects", "iops", "random whole objects (objects/s)"),
              ("seq-objects", "iops", "whole objects in storage order (objects/s)"),
              ("random-4k", "iops", "4 KiB random reads in open files (IOPS)"),
              ("seq-large", "mb_s", "large objects, 1 MiB reads (MB/s)")]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (jobname, key, title) in zip(axes.flat, panels):
        for (target, cache), (color, ls) in styles.items():
            sel = sorted(find(rows, job=jobname, target=target, cache=cache),
                         key=lambda r: r["numjobs"])
            kinds = sorted({r["dataset"] for r in sel})
            for kind in kinds[:1]:
                pts = [r for r in sel if r["dataset"] == kind]
                ax.plot([r["numjobs"] for r in pts], [r[key] for r in pts], color=color,
                        linestyle=ls, marker="o", label=f"{target} {cache}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(mode.numjobs))
        ax.set_xticklabels([str(n) for n in mode.numjobs])
        ax.set_xlabel("concurrent fio jobs")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle("Throughput against concurrency, mount vs plain files "
                 f"({os.cpu_count()} cores)")
    fig.tight_layout()
    path = os.path.join(out, "fio_throughput.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


# ------------------------------------------------------------------ main


def preflight() -> Optional[str]:
    """Why the benchmark cannot run here, or None."""
    if os.geteuid() != 0:
        return "must run as root (cold runs write to /proc/sys/vm/drop_caches)"
    for tool in ("fio", "fusermount3", "flock"):
        if shutil.which(tool) is None:
            return f"{tool} not found (Debian: apt-get install fio fuse3 util-linux)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    return None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_const", dest="mode", const="quick",
                       help="10k small objects, 12 large, 1.5 s runs (default)")
    group.add_argument("--full", action="store_const", dest="mode", const="full",
                       help="bigger datasets and 30 s runs")
    parser.add_argument("--out", default=os.path.join(HERE, "results"),
                        help="directory of fio.md, fio.json and the plots (default bench/results)")
    parser.add_argument("--runtime", type=float, help="seconds per run (overrides the mode's)")
    parser.add_argument("--count", action="append", default=[], metavar="KIND=N",
                        help="objects of a dataset kind, e.g. --count small=100000")
    parser.add_argument("--only", action="append", default=[], metavar="JOB",
                        help="run only this job (random-objects, seq-objects, random-4k, "
                             "seq-large, mixed); may be repeated")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep the generated job files, fio outputs and logs (their "
                             "directory is printed)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=dsmod.DEFAULT_DATA_DIR)
    args = parser.parse_args(argv)
    t_start = time.monotonic()
    load_start = os.getloadavg()
    mode = MODES[args.mode or "quick"]
    if args.runtime:
        mode.runtime = args.runtime
    for item in args.count:
        kind, _, n = item.partition("=")
        if kind not in mode.counts or not n.isdigit():
            parser.error(f"--count {item}: expected KIND=N with KIND in {', '.join(mode.counts)}")
        mode.counts[kind] = int(n)
    why = preflight()
    if why:
        print(f"fio_bench: {why}", file=sys.stderr)
        return 1
    cli = os.path.join(os.path.dirname(sys.executable), "shardfs")
    if not os.path.exists(cli):
        cli = shutil.which("shardfs") or ""
    if not cli:
        print("fio_bench: the shardfs command is not installed (make venv)", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)

    bench = Bench(mode, args.out, args.seed, cli, args.data_dir, only=args.only,
                  keep_work=args.keep_work)
    try:
        for kind, count in mode.counts.items():
            bench.datasets[kind] = dsmod.ensure(kind, count, args.seed, args.data_dir, log=log)
    except dsmod.DatasetError as exc:
        print(f"fio_bench: {exc}", file=sys.stderr)
        return 1
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    bench.device = block_device_of(args.data_dir)
    bench.work = tempfile.mkdtemp(prefix="shardfs-fio-", dir=shm)
    bench.mounts = Mounts(cli, os.path.join(args.data_dir, "mnt"))
    interrupted = False
    try:
        for ds in bench.datasets.values():
            mp = bench.mounts.add(ds)
            smoke_test(ds, mp)
        bench.run_all()
    except KeyboardInterrupt:
        interrupted = True
        log("fio_bench: interrupted; unmounting")
    finally:
        bench.mounts.umount_all()
        if args.keep_work:
            log(f"fio_bench: job files, fio outputs and logs kept in {bench.work}")
        else:
            shutil.rmtree(bench.work, ignore_errors=True)
    if interrupted:
        return 130

    wall = time.monotonic() - t_start
    load = {"start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()]}
    goal_lines = goals(bench.rows)
    ds_info = [f"**{ds.name}**: {ds.count:,} objects of {min(ds.sizes):,}..{max(ds.sizes):,} B, "
               f"{ds.total_bytes / 1e6:,.1f} MB" for ds in bench.datasets.values()]
    mach = machine()
    command = "python bench/fio_bench.py --" + mode.name + "".join(
        f" --only {j}" for j in args.only) + (
        f" --runtime {args.runtime}" if args.runtime else "") + "".join(
        f" --count {c}" for c in args.count)
    with open(os.path.join(args.out, "fio.json"), "w") as f:
        json.dump({"mode": mode.name, "command": command, "runtime_s": mode.runtime,
                   "machine": mach, "wall_s": round(wall, 1), "loadavg": load,
                   "datasets": {ds.name: {"kind": ds.kind, "count": ds.count, "seed": ds.seed,
                                          "bytes": ds.total_bytes}
                                for ds in bench.datasets.values()},
                   "goals": goal_lines, "problems": bench.problems, "rows": bench.rows},
                  f, indent=1)
        f.write("\n")
    write_markdown(os.path.join(args.out, "fio.md"), mode, bench.rows, goal_lines, ds_info,
                   mach, wall, command, bench.problems, load)
    try:
        plot(args.out, bench.rows, mode)
    except ImportError:
        log("fio_bench: matplotlib is not installed: no plots (pip install matplotlib)")
    log(f"wrote {args.out}/fio.md, fio.json, fio_latency.png, fio_throughput.png "
        f"({wall:.0f} s in all)")
    for line in goal_lines:
        print(line)
    return 1 if bench.problems else 0


def smoke_test(ds: dsmod.Dataset, mp: str, n: int = 50) -> None:
    """Read a few objects through the mount (up to n, or 64 MB) and check
    their SHA-256: the benchmark must read the right bytes."""
    import hashlib

    rnd = random.Random(0)
    budget = 64 << 20
    for i in rnd.sample(range(ds.count), min(n, ds.count)):
        if budget < ds.sizes[i]:
            continue
        budget -= ds.sizes[i]
        key = ds.keys[i]
        h = hashlib.sha256()
        with open(os.path.join(mp, key), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != key:
            raise RuntimeError(f"{mp}/{key}: content does not hash to its name")


if __name__ == "__main__":
    sys.exit(main())
