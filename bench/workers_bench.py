# Needs the Debian packages squashfuse (squashfuse_ll) and squashfs-tools
# (mksquashfs), besides fio, rsync and fuse3 (fusermount3):
#     apt-get install -y squashfuse squashfs-tools fio rsync
"""shardfs worker pool against squashfuse_ll, same objects, side by side.

One run builds a dataset of small objects (1 B..4 KiB of random bytes each,
seeded; files named by the hex SHA-256 of their content), stores it both as
a shard (``shardfs create``) and as a squashfs image (``mksquashfs``, lz4
if available, else gzip; random bytes do not compress, so the image holds
them as they are), and measures each target in turn:

    shardfs workers=1, 2, 4, 8 (and the default, nproc but at least 2):
        shardfs mount --layout flat -o workers=N --cache-dir CACHE SHARD MP
    squashfuse_ll (libfuse's low-level C API, multi-threaded):
        squashfuse_ll IMAGE MP

Measures, each target in turn within every measure (interleaved, so that
drift of a shared machine does not favour one target):

    cold-orc   cold open+read+close: R reader processes (R = 1, 4, 16), each
               with a disjoint slice of the shuffled object list, read every
               object once (os.open, os.read to the end, os.close); figure =
               objects / wall time. The readers start (and load their lists)
               before the clock; then the target is unmounted and mounted
               afresh and `sync; echo 3 > /proc/sys/vm/drop_caches` runs, then
               they all start. Every 16th object read is SHA-256-checked
               against its name afterwards: a broken mount cannot look fast.
    warm-fio   fio --opendir=MP --rw=randread, 2 jobs, psync, time based;
               objects smaller than 4 KiB cannot be read with bs=4k, so reads
               are of 1..1024 bytes at random offsets (bsrange=1-1k,
               bs_unaligned); every object read once beforehand and
               invalidate=0 (fio would drop each file's pages on open).
               fio keeps every file open (openfiles = number of files: the
               open file limit of fio is raised for it). Figure: fio's IOPS.
    rsync      rsync -a MP/ DEST/ into a fresh directory on the same disk as
               the shard and image, target cold as above; figure: seconds.
               The copy's file count is checked.
    cold-fio   fio, numjobs 1 and 16, each job reading whole objects of a
               disjoint slice of the shuffled list once (psync, reads of
               1..1024 bytes to the end of each object, openfiles=1): after
               fio's setup (it stats every file) the first job to get there
               remounts the target and drops the caches (exec_prerun, the
               others wait on a lock). Figure: objects / fio's run time
               (IOPS of whole objects); the bytes fio read are checked
               against the objects' total.

Goals (``GOAL <name>: <figure> PASS|MISS``; a missing figure is a MISS):
cold open+read+close >= 1.5x squashfuse_ll with 1 reader and >= 1x with 4
(shardfs with the default worker count); warm fio randread >= 1x
squashfuse_ll; rsync -a time <= 1x squashfuse_ll's; cold fio at 16 jobs >=
3x the 1-job figure (default workers); and a complete workers x readers
table of cold open+read+close.

Usage (as root, from the checkout, venv built with `make venv`):

    .venv/bin/python bench/workers_bench.py          # 20,000 objects, 5 s fio runs,
                                                     # 2 runs per cell (~6 min on 2 cores)
    .venv/bin/python bench/workers_bench.py --quick  # 5,000 objects, 2 s fio runs,
                                                     # 1 run per cell (~1.5 min)

Every cell runs --repeat times (rounds over all targets, interleaved) and
keeps the best figure (highest rate, lowest time). Other options:
--workers 1,2,4,8 (worker counts measured), --count N, --runtime S,
--only MEASURE (repeatable: cold-orc, warm-fio, rsync, cold-fio),
--no-workers-option (mount shardfs
without -o workers: for a shardfs that does not know the option; one shardfs
row), --tmp-dir DIR (where the dataset, shard, image, mounts and rsync copies
go: must be a real disk, default the system temporary directory), --out DIR
(default bench/results). PYTHONPATH=OTHER_CHECKOUT measures the shardfs of
another tree (its extension built in place); it is recorded with the command.
Writes workers.json and workers.md to --out and
prints the tables and the goal lines. Exit status: 0 all ran, 1 some target
or measure failed (recorded, the run goes on), 2 a required program is
missing or not root.

Mounts are made only under the run's temporary directory and always
unmounted (shardfs umount / fusermount3 -u, then the FUSE connection's abort
and fusermount3 -uz as a last resort); the temporary directory is removed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fio_bench import filename_lines, load_fio_json, mount_points, split  # noqa: E402
from machine import abort_fuse_connection, cpu_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DROP_CACHES = "/proc/sys/vm/drop_caches"
#: fio rejects option values longer than 4096 characters.
READERS = (1, 4, 16)
COLD_FIO_JOBS = (1, 16)
#: Every VERIFY_EVERY-th object a reader reads is hashed after the clock stops.
VERIFY_EVERY = 16
MEASURES = ("cold-orc", "warm-fio", "rsync", "cold-fio")
SQUASH = "squashfuse_ll"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------ the readers

#: One reader process (python -c): argv = root, list file, verify step.
#: Prints "ready" once its list is loaded, waits for "go" on stdin, reads
#: every object of its list once, then prints one JSON line.
READER = r"""
import hashlib, json, os, sys, time
root, listfile, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(listfile) as f:
    names = f.read().split()
paths = [os.path.join(root, n) for n in names]
sys.stdout.write("ready\n")
sys.stdout.flush()
if sys.stdin.readline().strip() != "go":
    sys.exit(3)
t0 = time.monotonic()
n = nbytes = errors = 0
first_error = ""
keep = []
O_RDONLY = os.O_RDONLY
read, open_, close = os.read, os.open, os.close
for i, p in enumerate(paths):
    try:
        fd = open_(p, O_RDONLY)
        try:
            data = read(fd, 65536)
            if data:
                more = read(fd, 65536)
                while more:
                    data += more
                    more = read(fd, 65536)
        finally:
            close(fd)
    except OSError as exc:
        errors += 1
        if not first_error:
            first_error = f"{p}: {exc}"
        continue
    n += 1
    nbytes += len(data)
    if i % every == 0:
        keep.append((names[i], data))
t1 = time.monotonic()
bad = [name for name, data in keep if hashlib.sha256(data).hexdigest() != name]
print(json.dumps({"t0": t0, "t1": t1, "objects": n, "bytes": nbytes, "errors": errors,
                  "first_error": first_error, "verified": len(keep), "bad": len(bad),
                  "first_bad": bad[0] if bad else ""}))
"""


# ------------------------------------------------------------------ mounts


def is_mounted(mp: str) -> bool:
    return os.path.realpath(mp) in mount_points()


def proc_table() -> Dict[int, Tuple[int, bytes, float]]:
    """pid -> (parent pid, command line, CPU seconds user+system) of every process."""
    tick = os.sysconf("SC_CLK_TCK")
    table = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            table[int(pid)] = (int(fields[1]), cmdline, (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, IndexError, ValueError):
            continue
    return table


def daemon_cpu(mp: str) -> Dict[int, float]:
    """CPU seconds by pid of the processes serving `mp`: those whose command
    line holds the mount point, and their descendants (worker processes)."""
    table = proc_table()
    key = os.path.realpath(mp).encode()
    children: Dict[int, List[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)

    def descendants(roots) -> set:
        seen, todo = set(), list(roots)
        while todo:
            pid = todo.pop()
            if pid not in seen:
                seen.add(pid)
                todo.extend(children.get(pid, ()))
        return seen

    # Our own children (readers, fio, rsync, a mount command still running)
    # name the mount point too; the daemons have left our process tree
    # (they detach).
    ours = descendants([os.getpid()])
    roots = {pid for pid, (_, cmd, _) in table.items()
             if pid not in ours and key in cmd.split(b"\0")[1:]}
    return {pid: table[pid][2] for pid in descendants(roots) if pid not in ours}


def cpu_delta(before: Dict[int, float], after: Dict[int, float]) -> float:
    """CPU seconds spent between two daemon_cpu() snapshots (a process that
    appeared in between counts whole; one that left is not seen)."""
    return sum(c - before.get(pid, 0.0) for pid, c in after.items())


@dataclass
class Target:
    key: str            # "shardfs-w2", "squashfuse_ll"
    label: str          # "shardfs workers=2"
    kind: str           # "shardfs" | "squashfuse"
    workers: Optional[int]
    mp: str
    mount_cmd: List[str]
    umount_cmd: List[str]
    #: First error that made the target unusable (then skipped).
    broken: str = ""

    def mount(self) -> None:
        if is_mounted(self.mp):
            self.umount()
        proc = subprocess.run(self.mount_cmd, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120)
        if proc.returncode != 0 or not is_mounted(self.mp):
            msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            if is_mounted(self.mp):
                self.umount()
            raise RuntimeError(f"mount failed (exit {proc.returncode}): "
                               f"{msg[-1] if msg else 'not mounted'}")

    def umount(self) -> None:
        if not is_mounted(self.mp):
            return
        try:
            proc = subprocess.run(self.umount_cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=60)
            ok = proc.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        if not ok or is_mounted(self.mp):
            log(f"workers_bench: {' '.join(self.umount_cmd)} failed; aborting the FUSE "
                f"connection and unmounting lazily")
            abort_fuse_connection(self.mp)
            subprocess.run(["fusermount3", "-uz", self.mp], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=60)
        # Let the daemon (and its workers) leave before the next measure.
        deadline = time.monotonic() + 10
        while daemon_cpu(self.mp) and time.monotonic() < deadline:
            time.sleep(0.05)

    def remount_shell(self) -> List[str]:
        """Shell lines that remount the target (for fio's exec_prerun)."""
        q = " ".join(map(shlex.quote, self.umount_cmd))
        m = " ".join(map(shlex.quote, self.mount_cmd))
        # 9>&-: the daemon must not inherit (and hold) the prerun lock.
        return [f"{q} 9>&- || exit 1", f"{m} 9>&- </dev/null >/dev/null 2>&1 || exit 1"]


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    with open(DROP_CACHES, "w") as f:
        f.write("3\n")


# ---------------------------------------------------------------- dataset


@dataclass
class Dataset:
    names: List[str]
    sizes: Dict[str, int]
    total_bytes: int
    shard: str = ""
    image: str = ""
    compressor: str = ""
    build_s: Dict[str, float] = field(default_factory=dict)


def make_objects(directory: str, count: int, seed: int) -> Dataset:
    rnd = random.Random(seed)
    names: List[str] = []
    sizes: Dict[str, int] = {}
    total = 0
    while len(names) < count:
        data = rnd.randbytes(rnd.randint(1, 4096))
        name = hashlib.sha256(data).hexdigest()
        if name in sizes:  # a repeated tiny object: draw another
            continue
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
        names.append(name)
        sizes[name] = len(data)
        total += len(data)
    return Dataset(names=names, sizes=sizes, total_bytes=total)


def squashfs_compressor() -> str:
    """lz4 if this mksquashfs has it, else gzip."""
    proc = subprocess.run(["mksquashfs", "-help"], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    m = re.search(r"Compressors available:(.*?)\n\s*\n", text, re.S) or \
        re.search(r"Compressors available[^\n]*\n(.*)", text, re.S)
    section = m.group(1) if m else text
    return "lz4" if re.search(r"^\s*lz4\b", section, re.M) else "gzip"


# ------------------------------------------------------------------ bench


def raise_nofile(limit: int) -> None:
    """preexec_fn: the soft limit of open files raised to `limit` (at most
    the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft < limit:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        except (ValueError, OSError):
            pass


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        log(f"workers_bench: pid {proc.pid} does not die (blocked in the kernel?)")


class Bench:
    def __init__(self, args: argparse.Namespace, ds: Dataset, targets: List[Target],
                 work: str) -> None:
        self.args = args
        self.ds = ds
        self.targets = targets
        self.work = work
        self.rows: List[dict] = []
        self.row_of: Dict[Tuple[str, str, int], dict] = {}
        self.problems: List[str] = []
        self.run_id = 0
        rnd = random.Random(f"workers-bench:{args.seed}")
        self.order = list(ds.names)
        rnd.shuffle(self.order)

    # -- bookkeeping --------------------------------------------------------

    def problem(self, target: Target, what: str, msg: str) -> None:
        text = f"{target.label}, {what}: {msg}"
        self.problems.append(text)
        log("workers_bench: " + text)

    def fresh(self, target: Target) -> None:
        """The target mounted afresh (a new daemon), else an exception."""
        target.umount()
        target.mount()

    def cold(self, target: Target) -> None:
        self.fresh(target)
        drop_caches()

    def healthy(self, target: Target) -> bool:
        """Mounts `target` and reads a few objects with their hash checked;
        marks it broken otherwise."""
        try:
            self.fresh(target)
            rnd = random.Random(0)
            for name in rnd.sample(self.ds.names, min(20, len(self.ds.names))):
                with open(os.path.join(target.mp, name), "rb") as f:
                    data = f.read()
                if hashlib.sha256(data).hexdigest() != name:
                    raise RuntimeError(f"{name}: content does not hash to its name")
            return True
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            target.broken = str(exc)
            self.problem(target, "mount check", str(exc))
            return False
        finally:
            target.umount()

    # -- readers -------------------------------------------------------------

    def read_all(self, target: Target, nreaders: int, cold: bool) -> dict:
        """Every object read once by `nreaders` processes; returns a row's
        figures (objects/s, ...) or raises RuntimeError."""
        self.run_id += 1
        rundir = os.path.join(self.work, "runs", f"{self.run_id:03d}")
        os.makedirs(rundir)
        procs: List[subprocess.Popen] = []
        try:
            for i, part in enumerate(split(self.order, nreaders)):
                listfile = os.path.join(rundir, f"list{i}")
                with open(listfile, "w") as f:
                    f.write("\n".join(part) + "\n")
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", READER, target.mp, listfile, str(VERIFY_EVERY)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, cwd=rundir, start_new_session=True))
            for p in procs:
                line = p.stdout.readline().strip()
                if line != "ready":
                    raise RuntimeError(f"reader did not start: {line!r} {p.stderr.read()[-300:]}")
            if cold:
                self.cold(target)
            elif not is_mounted(target.mp):
                target.mount()
            cpu0 = daemon_cpu(target.mp)
            t0 = time.monotonic()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            deadline = t0 + self.args.timeout
            for p in procs:
                try:
                    out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"readers did not finish in {self.args.timeout:.0f} s")
                if p.returncode != 0 or not out.strip():
                    raise RuntimeError(f"reader exit {p.returncode}: {err.strip()[-300:]}")
                results.append(json.loads(out.strip().splitlines()[-1]))
            cpu1 = daemon_cpu(target.mp)
        except BaseException:
            for p in procs:
                if p.poll() is None:
                    kill_group(p)
            if is_mounted(target.mp):
                abort_fuse_connection(target.mp)
            raise
        finally:
            shutil.rmtree(rundir, ignore_errors=True)
        wall = max(r["t1"] for r in results) - t0
        objects = sum(r["objects"] for r in results)
        nbytes = sum(r["bytes"] for r in results)
        errors = sum(r["errors"] for r in results)
        bad = sum(r["bad"] for r in results)
        fig = {"objects": objects, "bytes": nbytes, "wall_s": round(wall, 4),
               "verified": sum(r["verified"] for r in results),
               "daemon_cpu_s": round(cpu_delta(cpu0, cpu1), 2)}
        if errors:
            first = next(r["first_error"] for r in results if r["first_error"])
            raise RuntimeError(f"{errors} objects could not be read ({first})")
        if bad:
            first = next(r["first_bad"] for r in results if r["first_bad"])
            raise RuntimeError(f"{bad} objects read do not hash to their name (e.g. {first})")
        if objects != len(self.ds.names) or nbytes != self.ds.total_bytes:
            raise RuntimeError(f"read {objects} objects, {nbytes} bytes; expected "
                               f"{len(self.ds.names)}, {self.ds.total_bytes}")
        fig["value"] = objects / wall if wall > 0 else None
        return fig

    # -- the measures ------------------------------------------------------------

    def guarded(self, target: Target, measure: str, n: int, unit: str, fn, digits: int = 0,
                rep: int = 0) -> None:
        """One run of `fn` (a measure of `target`) whose failure is recorded,
        not raised; the target is unmounted afterwards. The row of (measure,
        target, n) keeps the best of its runs (lowest time for seconds, else
        highest rate) and the list of their figures."""
        key = (measure, target.key, n)
        row = self.row_of.get(key)
        if row is None:
            row = {"measure": measure, "target": target.key, "label": target.label,
                   "workers": target.workers, "n": n, "unit": unit, "digits": digits,
                   "value": None, "values": []}
            self.row_of[key] = row
            self.rows.append(row)
        attempt: Optional[dict] = None
        if target.broken:
            error = f"target unusable: {target.broken}"
        else:
            try:
                attempt = fn()
                error = "" if attempt.get("value") is not None else "no figure"
            except (OSError, RuntimeError, ValueError, KeyError,
                    subprocess.SubprocessError) as exc:
                error = str(exc)
                self.problem(target, f"{measure} x{n} (run {rep + 1})", error)
            finally:
                try:
                    target.umount()
                except (OSError, subprocess.SubprocessError) as exc:
                    self.problem(target, "unmount", str(exc))
        if error:
            row.setdefault("errors", []).append(error)
        else:
            row["values"].append(round(attempt["value"], 4))
            if row["value"] is None or (attempt["value"] < row["value"] if unit == "s"
                                        else attempt["value"] > row["value"]):
                row.update(attempt)  # the best run's figures
        if row["value"] is None:
            row["error"] = row["errors"][0]
        else:
            row.pop("error", None)
        shown = "ERROR" if error else f"{attempt['value']:,.{digits}f} {unit}"
        cpu = f", daemon CPU {attempt['daemon_cpu_s']:.2f} s" \
            if attempt and "daemon_cpu_s" in attempt else ""
        log(f"[{measure}] {target.key} x{n} run {rep + 1}/{self.args.repeat}: {shown}{cpu}"
            + (f" (error: {error})" if error else ""))

    def cold_orc(self) -> None:
        for rep in range(self.args.repeat):
            for nreaders in READERS:
                for t in self.targets:
                    self.guarded(t, "cold-orc", nreaders, "objects/s",
                                 lambda t=t, r=nreaders: self.read_all(t, r, cold=True), rep=rep)

    def warm_fio(self) -> None:
        for rep in range(self.args.repeat):
            for t in self.targets:
                self.guarded(t, "warm-fio", 2, "IOPS", lambda t=t: self._warm_fio(t), rep=rep)

    def _warm_fio(self, target: Target) -> dict:
        self.fresh(target)
        warm = self.read_all(target, 2, cold=False)
        numjobs = 2
        # fio keeps every file open (openfiles = nrfiles): each job process
        # needs that many descriptors. The soft limit is raised up to the hard
        # one; beyond it (no CAP_SYS_RESOURCE) fio gets openfiles=limit-256.
        need = len(self.ds.names) + 256
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY and hard < need:
            openfiles: Optional[int] = hard - 256
            need = hard
        else:
            openfiles = None
        cmd = ["fio", "--name=w", f"--opendir={target.mp}", "--rw=randread",
               "--bsrange=1-1k", "--bs_unaligned", f"--numjobs={numjobs}", "--time_based",
               f"--runtime={self.args.runtime}", "--group_reporting", "--output-format=json",
               "--ioengine=psync", "--invalidate=0", "--eta=never"]
        if openfiles is not None:
            cmd.append(f"--openfiles={openfiles}")
        res = self.run_fio(cmd, target, timeout=self.args.runtime * 4 + 120,
                           preexec=lambda: raise_nofile(need))
        read = res["jobs"][0]["read"]
        return {"value": read["iops"], "fio_reads": read["total_ios"],
                "bytes": read["io_bytes"], "runtime_s": read["runtime"] / 1000,
                "mb_s": round(read["bw_bytes"] / 1e6, 1), "daemon_cpu_s": res["_cpu"],
                "warmup_objects_s": round(warm["value"] or 0),
                "openfiles": openfiles or len(self.ds.names),
                "command": " ".join(cmd).replace(self.work, "$TMP")}

    def run_fio(self, cmd: List[str], target: Target, timeout: float,
                preexec=None, cwd: Optional[str] = None) -> dict:
        """Run fio (in a session of its own, output in a file); its JSON with
        '_cpu' (daemon CPU seconds) and '_wall' added."""
        self.run_id += 1
        rundir = cwd or os.path.join(self.work, "runs", f"fio{self.run_id:03d}")
        os.makedirs(rundir, exist_ok=True)
        output = os.path.join(rundir, "out.json")
        console = os.path.join(rundir, "console.txt")
        cpu0 = daemon_cpu(target.mp)
        t0 = time.monotonic()
        with open(console, "wb") as con:
            proc = subprocess.Popen(cmd + [f"--output={output}"], cwd=rundir,
                                    stdin=subprocess.DEVNULL, stdout=con,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=preexec)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            abort_fuse_connection(target.mp)
            raise RuntimeError(f"fio did not finish in {timeout:.0f} s (killed)")
        except BaseException:
            kill_group(proc)
            raise
        wall = time.monotonic() - t0
        cpu1 = daemon_cpu(target.mp)
        with open(console, errors="replace") as f:
            console_text = f.read().strip()
        try:
            res = load_fio_json(output)
        except (OSError, ValueError) as exc:
            raise RuntimeError(f"fio exit {proc.returncode}: {console_text[-300:] or exc}")
        finally:
            shutil.rmtree(rundir, ignore_errors=True)
        err = res["jobs"][0].get("error") if res.get("jobs") else "no jobs"
        if proc.returncode != 0 or err:
            raise RuntimeError(f"fio exit {proc.returncode}, error {err}: {console_text[-300:]}")
        res["_cpu"] = round(cpu_delta(cpu0, cpu1), 2)
        res["_wall"] = wall
        return res

    def rsync(self) -> None:
        for rep in range(self.args.repeat):
            for t in self.targets:
                self.guarded(t, "rsync", 1, "s", lambda t=t: self._rsync(t), digits=2, rep=rep)

    def _rsync(self, target: Target) -> dict:
        dest = os.path.join(self.work, "rsync-dest")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        try:
            self.cold(target)
            cpu0 = daemon_cpu(target.mp)
            t0 = time.monotonic()
            proc = subprocess.run(["rsync", "-a", target.mp + "/", dest + "/"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=self.args.timeout)
            wall = time.monotonic() - t0
            cpu1 = daemon_cpu(target.mp)
            if proc.returncode != 0:
                raise RuntimeError(f"rsync exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            entries = list(os.scandir(dest))
            files = sum(1 for e in entries if e.is_file(follow_symlinks=False))
            nbytes = sum(e.stat(follow_symlinks=False).st_size for e in entries)
            if files != len(self.ds.names) or nbytes != self.ds.total_bytes:
                raise RuntimeError(f"the copy has {files} files, {nbytes} bytes; expected "
                                   f"{len(self.ds.names)}, {self.ds.total_bytes}")
            rnd = random.Random(1)
            for name in rnd.sample(self.ds.names, min(50, len(self.ds.names))):
                with open(os.path.join(dest, name), "rb") as f:
                    if hashlib.sha256(f.read()).hexdigest() != name:
                        raise RuntimeError(f"copy of {name} does not hash to its name")
            return {"value": wall, "files": files, "bytes": nbytes,
                    "daemon_cpu_s": round(cpu_delta(cpu0, cpu1), 2)}
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def cold_fio(self) -> None:
        for rep in range(self.args.repeat):
            for numjobs in COLD_FIO_JOBS:
                for t in self.targets:
                    self.guarded(t, "cold-fio", numjobs, "objects/s",
                                 lambda t=t, n=numjobs: self._cold_fio(t, n), rep=rep)

    def _cold_fio(self, target: Target, numjobs: int) -> dict:
        self.run_id += 1
        rundir = os.path.join(self.work, "runs", f"cfio{self.run_id:03d}")
        os.makedirs(rundir)
        lock = os.path.join(rundir, "prerun.lock")
        done = os.path.join(rundir, "prerun.done")
        script = ["#!/bin/sh", f"exec 9>{shlex.quote(lock)}", "flock 9",
                  f"[ -e {shlex.quote(done)} ] && exit 0"]
        script += target.remount_shell()
        script += ["sync", f"echo 3 > {DROP_CACHES} || exit 1", f"touch {shlex.quote(done)}", ""]
        prerun = os.path.join(rundir, "prerun.sh")
        with open(prerun, "w") as f:
            f.write("\n".join(script))
        job = ["[global]", "ioengine=psync", "rw=read", "bs_unaligned=1", "bsrange=1-1k",
               "file_service_type=sequential", "openfiles=1", "invalidate=0", "disk_util=0",
               "allow_file_create=0", f"directory={target.mp}",
               f"runtime={int(self.args.timeout)}", "time_based=0",
               f"exec_prerun=sh {prerun}", "group_reporting=1", ""]
        parts = split(self.order, numjobs)
        for i, part in enumerate(parts):
            job.append(f"[cold{i}]")
            job.extend(filename_lines(part))
            job.append("")
        jobfile = os.path.join(rundir, "cold.fio")
        with open(jobfile, "w") as f:
            f.write("\n".join(job))
        self.fresh(target)  # fio's setup stats every file: the mount must be there
        res = self.run_fio(["fio", "--output-format=json", "--eta=never", jobfile], target,
                           timeout=self.args.timeout + 120, cwd=rundir)
        if not os.path.exists(done):
            pass  # rundir removed by run_fio; checked through the bytes below
        read = res["jobs"][0]["read"]
        runtime_s = read["runtime"] / 1000
        if read["io_bytes"] != self.ds.total_bytes:
            raise RuntimeError(f"fio read {read['io_bytes']} bytes, the objects hold "
                               f"{self.ds.total_bytes}")
        return {"value": len(self.ds.names) / runtime_s if runtime_s else None,
                "runtime_s": runtime_s, "fio_reads": read["total_ios"],
                "bytes": read["io_bytes"], "fio_wall_s": round(res["_wall"], 2),
                "daemon_cpu_s": res["_cpu"]}


# ------------------------------------------------------------------ report


def value(rows: List[dict], measure: str, target: str, n: int) -> Optional[float]:
    for r in rows:
        if r["measure"] == measure and r["target"] == target and r["n"] == n:
            return r.get("value")
    return None


def fmt(v: Optional[float], digits: int = 0) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def fmt_ratio(r: Optional[float]) -> str:
    return "—" if r is None else f"{r:.2f}×"


def tables(rows: List[dict], targets: List[Target], measures: Sequence[str]) -> List[str]:
    out: List[str] = []
    keys = [t.key for t in targets]
    labels = {t.key: t.label for t in targets}

    def cell(measure: str, key: str, n: int, digits: int = 0) -> str:
        v = value(rows, measure, key, n)
        if v is None:
            err = next((r.get("error") for r in rows if r["measure"] == measure
                        and r["target"] == key and r["n"] == n), None)
            return "error" if err else "—"
        if key == SQUASH:
            return fmt(v, digits)
        return f"{fmt(v, digits)} ({fmt_ratio(ratio(v, value(rows, measure, SQUASH, n)))})"

    if "cold-orc" in measures:
        out += ["### Cold open+read+close, objects/s: workers × readers (× squashfuse_ll)", "",
                "| target | " + " | ".join(f"{r} reader{'s' if r > 1 else ''}"
                                          for r in READERS) + " |",
                "|---|" + "---:|" * len(READERS)]
        for k in keys:
            out.append(f"| {labels[k]} | " + " | ".join(cell("cold-orc", k, r)
                                                         for r in READERS) + " |")
        out.append("")
    if "warm-fio" in measures:
        out += ["### Warm fio --opendir randread (2 jobs, 1..1024-byte reads), IOPS "
                "(× squashfuse_ll)", "", "| target | IOPS |", "|---|---:|"]
        for k in keys:
            out.append(f"| {labels[k]} | {cell('warm-fio', k, 2)} |")
        out.append("")
    if "rsync" in measures:
        out += ["### rsync -a MP/ DEST/ (cold), seconds (time / squashfuse_ll's: lower is "
                "better)", "", "| target | seconds |", "|---|---:|"]
        for k in keys:
            out.append(f"| {labels[k]} | {cell('rsync', k, 1, 2)} |")
        out.append("")
    if "cold-fio" in measures:
        out += ["### Cold fio whole objects, objects/s (× squashfuse_ll)", "",
                "| target | 1 job | 16 jobs | 16 jobs / 1 job |", "|---|---:|---:|---:|"]
        for k in keys:
            r = ratio(value(rows, "cold-fio", k, 16), value(rows, "cold-fio", k, 1))
            out.append(f"| {labels[k]} | {cell('cold-fio', k, 1)} | {cell('cold-fio', k, 16)} | "
                       f"{fmt_ratio(r)} |")
        out.append("")
    cpu_rows = [r for r in rows if "daemon_cpu_s" in r and r.get("value") is not None]
    if cpu_rows:
        cols = [("cold-orc", n) for n in READERS] + [("warm-fio", 2), ("rsync", 1)] + \
               [("cold-fio", n) for n in COLD_FIO_JOBS]
        cols = [(m, n) for m, n in cols if m in measures]
        out += ["### Daemon CPU seconds during each measure (all its processes)", "",
                "| target | " + " | ".join(f"{m} x{n}" for m, n in cols) + " |",
                "|---|" + "---:|" * len(cols)]
        for k in keys:
            cells = []
            for m, n in cols:
                r = next((r for r in cpu_rows if r["measure"] == m and r["target"] == k
                          and r["n"] == n), None)
                cells.append("—" if r is None else f"{r['daemon_cpu_s']:.2f}")
            out.append(f"| {labels[k]} | " + " | ".join(cells) + " |")
    return out


def goals(rows: List[dict], targets: List[Target], default_key: str,
          worker_keys: List[str]) -> List[str]:
    lines = []
    shard_keys = [t.key for t in targets if t.kind == "shardfs"]
    label = {t.key: t.label.replace(" (default)", "") for t in targets}
    dflt = next((t for t in targets if t.key == default_key), None)
    if dflt is not None and dflt.workers is not None:
        label[default_key] = f"shardfs default workers={dflt.workers}"

    def best(measure: str, n: int, lower: bool = False) -> str:
        vals = [(value(rows, measure, k, n), k) for k in shard_keys]
        vals = [(v, k) for v, k in vals if v is not None]
        if not vals:
            return "best: none"
        v, k = (min if lower else max)(vals)
        r = ratio(v, value(rows, measure, SQUASH, n))
        return f"best {label[k]}: {fmt(v, 2 if lower else 0)} = {fmt_ratio(r)}"

    def vs(measure: str, n: int, need: float, title: str, unit: str) -> str:
        v = value(rows, measure, default_key, n)
        s = value(rows, measure, SQUASH, n)
        r = ratio(v, s)
        ok = r is not None and r >= need
        return (f"GOAL {title} >= {need:g}x squashfuse_ll ({label.get(default_key, default_key)}): "
                f"{fmt(v)} vs {fmt(s)} {unit} = {fmt_ratio(r)} ({best(measure, n)}) "
                f"{'PASS' if ok else 'MISS'}")

    lines.append(vs("cold-orc", 1, 1.5, "cold open+read+close, 1 reader", "objects/s"))
    lines.append(vs("cold-orc", 4, 1.0, "cold open+read+close, 4 readers", "objects/s"))
    lines.append(vs("warm-fio", 2, 1.0, "warm fio --opendir randread", "IOPS"))
    v = value(rows, "rsync", default_key, 1)
    s = value(rows, "rsync", SQUASH, 1)
    r = ratio(v, s)
    ok = r is not None and r <= 1.0
    n_obj = next((row.get("files") for row in rows if row["measure"] == "rsync"
                  and row.get("files")), None)
    lines.append(f"GOAL rsync -a of {fmt(n_obj) if n_obj else 'all'} objects <= 1x "
                 f"squashfuse_ll's time ({label.get(default_key, default_key)}): "
                 f"{fmt(v, 2)} s vs {fmt(s, 2)} s = {fmt_ratio(r)} "
                 f"({best('rsync', 1, lower=True)}) {'PASS' if ok else 'MISS'}")
    a = value(rows, "cold-fio", default_key, 16)
    b = value(rows, "cold-fio", default_key, 1)
    r = ratio(a, b)
    ok = r is not None and r >= 3.0
    lines.append(f"GOAL cold random reads at 16 fio jobs >= 3x the 1-job figure "
                 f"({label.get(default_key, default_key)}): {fmt(a)} vs {fmt(b)} objects/s = "
                 f"{fmt_ratio(r)} {'PASS' if ok else 'MISS'}")
    cells = [(k, n) for k in worker_keys for n in READERS]
    have = sum(1 for k, n in cells if value(rows, "cold-orc", k, n) is not None)
    ok = bool(cells) and have == len(cells)
    workers = "/".join(k.rsplit("-w", 1)[-1] for k in worker_keys)
    lines.append(f"GOAL workers x readers table of cold open+read+close (workers {workers} x "
                 f"readers {'/'.join(map(str, READERS))}): "
                 f"{have}/{len(cells) or 12} figures {'PASS' if ok else 'MISS'}")
    return lines


def machine() -> Dict[str, str]:
    cpu = cpu_model()

    packages = {}
    try:
        p = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "squashfuse",
                            "squashfs-tools", "fio", "rsync", "fuse3"],
                           capture_output=True, text=True, timeout=10)
        for line in p.stdout.splitlines():
            name, _, ver = line.partition(" ")
            if ver:
                packages[name] = ver
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        fio = subprocess.run(["fio", "--version"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        fio = "?"
    return {"cpu": cpu, "nproc": str(os.cpu_count()),
            "memory_gib": f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}",
            "kernel": platform.release(), "python": platform.python_version(), "fio": fio,
            "packages": ", ".join(f"{k} {v}" for k, v in sorted(packages.items())) or "?"}


def fs_type(path: str) -> str:
    best, kind = "", "?"
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mp = fields[4]
            if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best):
                best = mp
                kind = fields[fields.index("-") + 1]
    return kind


# -------------------------------------------------------------------- main


def source_state() -> str:
    """The checkout's commit, and whether shardfs/ has uncommitted changes
    (read-only git commands)."""
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "?"
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "shardfs"],
                               capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"
    if dirty:
        diff = subprocess.run(["git", "-C", ROOT, "diff", "HEAD", "--", "shardfs"],
                              capture_output=True).stdout
        commit += f" + uncommitted changes under shardfs/ (diff sha1 " \
                  f"{hashlib.sha1(diff).hexdigest()[:10]})"
    return commit


def preflight(cli: str) -> List[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("must run as root (cold runs write to /proc/sys/vm/drop_caches)")
    packages = {"squashfuse_ll": "squashfuse", "mksquashfs": "squashfs-tools", "fio": "fio",
                "rsync": "rsync", "fusermount3": "fuse3", "flock": "util-linux"}
    for tool, pkg in packages.items():
        if shutil.which(tool) is None:
            missing.append(f"{tool} not found (Debian package {pkg})")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse is missing")
    if not cli or not os.path.exists(cli):
        missing.append("the shardfs command is not installed (make venv)")
    return missing


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: .venv/bin/python bench/workers_bench.py --quick")
    parser.add_argument("--quick", action="store_true",
                        help="5,000 objects, 2 s fio runs, 1 run per cell (default: 20,000 "
                             "objects, 5 s, 2 runs)")
    parser.add_argument("--count", type=int, help="objects in the dataset (overrides the mode's)")
    parser.add_argument("--runtime", type=float, help="seconds of the warm fio run")
    parser.add_argument("--workers", default="1,2,4,8",
                        help="shardfs worker counts to measure (default 1,2,4,8; the default "
                             "count, nproc but at least 2, is added if missing)")
    parser.add_argument("--no-workers-option", action="store_true",
                        help="mount shardfs without -o workers= (one shardfs row): for a "
                             "shardfs that does not know the option yet")
    parser.add_argument("--only", action="append", choices=MEASURES, default=[],
                        help="run only this measure (repeatable)")
    parser.add_argument("--repeat", type=int,
                        help="runs of every cell, the best kept (default 2; --quick: 1)")
    parser.add_argument("--snapshot", action="store_true",
                        help="measure the committed HEAD, not the working tree: a copy "
                             "(git archive) with its extension built, in the run's temporary "
                             "directory, imported through PYTHONPATH (the code under test "
                             "cannot change during the run)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds one measure of one target may take (default 300)")
    parser.add_argument("--tmp-dir", default=tempfile.gettempdir(),
                        help="where the run's temporary directory goes (a real disk)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"),
                        help="directory of workers.json and workers.md (default bench/results)")
    args = parser.parse_args(argv)
    count = args.count or (5000 if args.quick else 20000)
    args.runtime = args.runtime or (2.0 if args.quick else 5.0)
    args.repeat = args.repeat or (1 if args.quick else 2)
    if args.repeat < 1:
        parser.error("--repeat: expected at least 1")
    measures = [m for m in MEASURES if not args.only or m in args.only]
    try:
        worker_counts = sorted({int(w) for w in args.workers.split(",") if w.strip()})
        if not worker_counts or min(worker_counts) < 1:
            raise ValueError
    except ValueError:
        parser.error("--workers: expected a comma-separated list of counts >= 1")
    # As shardfs.fuse.coordinator.default_workers() (without $SHARDFS_WORKERS):
    # the CPUs this process may use, at least 2.
    try:
        default_workers = max(2, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        default_workers = max(2, os.cpu_count() or 1)
    if default_workers not in worker_counts:
        worker_counts.append(default_workers)

    cli = os.path.join(ROOT, ".venv", "bin", "shardfs")
    if not os.path.exists(cli):
        cli = os.path.join(os.path.dirname(sys.executable), "shardfs")
    if not os.path.exists(cli):
        cli = shutil.which("shardfs") or ""
    missing = preflight(cli)
    if missing:
        for m in missing:
            print(f"workers_bench: {m}", file=sys.stderr)
        print("workers_bench: on Debian: apt-get install -y squashfuse squashfs-tools fio rsync "
              "fuse3", file=sys.stderr)
        return 2
    kind = fs_type(args.tmp_dir)
    if kind in ("tmpfs", "ramfs"):
        log(f"workers_bench: warning: {args.tmp_dir} is {kind}: 'cold' reads will not touch a "
            f"disk (use --tmp-dir)")

    pythonpath = os.environ.get("PYTHONPATH")
    command = (f"PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else "") + \
        ".venv/bin/python bench/workers_bench.py" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    t_start = time.monotonic()
    load_start = os.getloadavg()
    commit_start = source_state()
    work = tempfile.mkdtemp(prefix="shardfs-workers-bench-", dir=args.tmp_dir)
    targets: List[Target] = []
    prep: Optional[Target] = None
    default_key = "shardfs" if args.no_workers_option else f"shardfs-w{default_workers}"
    #: The workers x readers table the goal asks for (whatever --workers says).
    worker_keys = [f"shardfs-w{w}" for w in (1, 2, 4, 8)]
    interrupted = False
    bench: Optional[Bench] = None
    ds: Optional[Dataset] = None
    try:
        if args.snapshot:
            tree = os.path.join(work, "tree")
            os.makedirs(tree)
            log(f"workers_bench: snapshot of HEAD ({commit_start.split()[0]}) in {tree} ...")
            archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=tree, check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL)
            os.environ["PYTHONPATH"] = tree  # the shardfs command and its daemons
            where = subprocess.run([sys.executable, "-c", "import shardfs; print(shardfs.__file__)"],
                                   capture_output=True, text=True, cwd="/").stdout.strip()
            if not where.startswith(tree + os.sep):
                raise OSError(f"the snapshot is not what gets imported ({where})")
            commit_start = commit_start.split()[0] + " (snapshot of HEAD: git archive)"
        src = os.path.join(work, "objects")
        os.makedirs(src)
        os.makedirs(os.path.join(work, "runs"))
        log(f"workers_bench: writing {count:,} objects to {src} ...")
        t0 = time.monotonic()
        ds = make_objects(src, count, args.seed)
        gen_s = time.monotonic() - t0
        ds.shard = os.path.join(work, "objects.shard")
        t0 = time.monotonic()
        subprocess.run([cli, "create", ds.shard, src], check=True, stdin=subprocess.DEVNULL)
        ds.build_s["shardfs create"] = round(time.monotonic() - t0, 2)
        ds.compressor = squashfs_compressor()
        ds.image = os.path.join(work, "objects.sqsh")
        t0 = time.monotonic()
        subprocess.run(["mksquashfs", src, ds.image, "-comp", ds.compressor, "-noappend",
                        "-quiet"], check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        ds.build_s["mksquashfs"] = round(time.monotonic() - t0, 2)
        ds.build_s["objects written"] = round(gen_s, 2)
        shutil.rmtree(src)
        log(f"workers_bench: {count:,} objects, {ds.total_bytes / 1e6:.1f} MB; shard "
            f"{os.path.getsize(ds.shard) / 1e6:.1f} MB, squashfs ({ds.compressor}) "
            f"{os.path.getsize(ds.image) / 1e6:.1f} MB")

        cache = os.path.join(work, "cache")
        os.makedirs(cache)
        mnt = os.path.join(work, "mnt")

        def shardfs_target(workers: Optional[int], key: str = "") -> Target:
            key = key or ("shardfs" if workers is None else f"shardfs-w{workers}")
            mp = os.path.join(mnt, key)
            os.makedirs(mp)
            opts = [] if workers is None else ["-o", f"workers={workers}"]
            label = "shardfs" if workers is None else f"shardfs workers={workers}"
            if workers == default_workers:
                label += " (default)"
            return Target(key=key, label=label, kind="shardfs", workers=workers, mp=mp,
                          mount_cmd=[cli, "mount", "--layout", "flat"] + opts +
                          ["--cache-dir", cache, ds.shard, mp],
                          umount_cmd=[cli, "umount", mp])

        if args.no_workers_option:
            targets.append(shardfs_target(None))
        else:
            for w in worker_counts:
                targets.append(shardfs_target(w))
        smp = os.path.join(mnt, SQUASH)
        os.makedirs(smp)
        targets.append(Target(key=SQUASH, label=SQUASH, kind="squashfuse", workers=None, mp=smp,
                              mount_cmd=["squashfuse_ll", ds.image, smp],
                              umount_cmd=["fusermount3", "-u", smp]))

        # The shard's sidecar is built in the background on its first mount and
        # kept in the cache directory: build it once, untimed.
        prep = shardfs_target(None, key="prep")
        prep.label = "shardfs (sidecar build)"
        try:
            prep.mount()
            deadline = time.monotonic() + 120
            ready = False
            while time.monotonic() < deadline:
                try:
                    st = json.loads(os.getxattr(prep.mp, "user.shardfs.stats"))
                    if st.get("sidecars", 0) >= st.get("shards", 1):
                        ready = True
                        break
                except (OSError, ValueError):
                    break
                time.sleep(0.1)
            if not ready:
                os.listdir(prep.mp)  # a listing builds missing sidecars first
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log(f"workers_bench: sidecar build mount failed: {exc}")
        finally:
            prep.umount()

        bench = Bench(args, ds, targets, work)
        for t in targets:
            bench.healthy(t)
        for m in measures:
            log(f"workers_bench: measure {m}")
            getattr(bench, m.replace("-", "_"))()
    except KeyboardInterrupt:
        interrupted = True
        log("workers_bench: interrupted; unmounting")
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"workers_bench: setup failed: {exc}")
        if bench is None:
            bench = Bench(args, ds or Dataset([], {}, 0), targets, work)
        bench.problems.append(f"setup failed: {exc}")
    finally:
        for t in targets + ([prep] if prep is not None else []):
            try:
                t.umount()
            except Exception as exc:  # noqa: BLE001 - keep unmounting the others
                log(f"workers_bench: unmount of {t.mp} failed: {exc}")
        still = [t.mp for t in targets + ([prep] if prep is not None else [])
                 if is_mounted(t.mp)]
        if still:
            log(f"workers_bench: still mounted, temporary directory kept: {', '.join(still)}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if interrupted:
        return 130
    assert bench is not None

    wall = time.monotonic() - t_start
    goal_lines = goals(bench.rows, targets, default_key, worker_keys)
    table_lines = tables(bench.rows, targets, measures)
    mach = machine()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    load = {"start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()]}
    shardfs_commit = commit_start if args.snapshot else source_state()
    if shardfs_commit != commit_start:
        shardfs_commit = f"{commit_start} at the start, {shardfs_commit} at the end (the code " \
                         "under test changed during the run: later mounts ran the newer code)"
    if pythonpath and not args.snapshot:
        shardfs_commit += f" (PYTHONPATH={pythonpath}: shardfs imported from there first)"
    dataset = {"objects": len(ds.names) if ds else 0, "bytes": ds.total_bytes if ds else 0,
               "sizes": "1..4096 B uniform, random bytes", "seed": args.seed,
               "squashfs_compressor": ds.compressor if ds else "",
               "shard_bytes": os.path.getsize(ds.shard) if ds and os.path.exists(ds.shard) else None,
               "build_s": ds.build_s if ds else {}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "workers.json"), "w") as f:
        json.dump({"command": command, "date": now, "machine": mach, "commit": shardfs_commit,
                   "tmp_dir_fs": kind, "wall_s": round(wall, 1), "loadavg": load,
                   "fio_runtime_s": args.runtime, "repeat": args.repeat,
                   "default_workers": default_workers,
                   "no_workers_option": args.no_workers_option, "dataset": dataset,
                   "targets": [{"key": t.key, "label": t.label, "workers": t.workers,
                                "mount": " ".join(t.mount_cmd).replace(work, "$TMP"),
                                "broken": t.broken} for t in targets],
                   "goals": goal_lines, "problems": bench.problems, "rows": bench.rows},
                  f, indent=1)
        f.write("\n")
    md = [f"# shardfs worker pool vs squashfuse_ll ({'quick' if args.quick else 'full'})", "",
          f"{now}; {mach['nproc']} CPUs ({mach['cpu']}), {mach['memory_gib']} GiB RAM, kernel "
          f"{mach['kernel']}, Python {mach['python']}; Debian packages: {mach['packages']}; "
          f"shardfs {shardfs_commit}. Command: `{command}` "
          f"({wall:.0f} s in all; temporary files on {kind}). Load average (1/5/15 min) "
          f"{'/'.join(map(str, load['start']))} at the start, {'/'.join(map(str, load['end']))} "
          f"at the end: the machine is shared, so figures move between runs.", "",
          f"Dataset: {dataset['objects']:,} objects of 1..4,096 random bytes "
          f"({dataset['bytes'] / 1e6:.1f} MB, seed {args.seed}), named by their SHA-256; the same "
          f"objects as a shard (`shardfs create`) and as a squashfs image (`mksquashfs -comp "
          f"{dataset['squashfs_compressor']} -noappend`, default 128 KiB blocks, small files "
          f"packed into fragments). Default shardfs worker count: {default_workers} (nproc, at "
          f"least 2)" + (" — **run with --no-workers-option: shardfs mounted without -o "
                         "workers=**" if args.no_workers_option else "") + ".", "",
          "Cold = the target unmounted and mounted afresh, then `sync; echo 3 > "
          "/proc/sys/vm/drop_caches`, right before the clock starts. "
          f"{args.repeat} run{'s' if args.repeat > 1 else ''} per cell (interleaved: each "
          "round measures every target in turn), the best kept (highest rate, lowest time); "
          "workers.json lists every run's figure. See "
          "the docstring of bench/workers_bench.py for each measure.", "",
          "## Goals", "", "```"] + goal_lines + ["```", "", "## Results", ""] + table_lines
    notes = ["Daemon CPU = user + system seconds of the processes serving the mount (shardfs: "
             "the coordinator and its workers; squashfuse_ll: its one process) while the "
             "figure was taken: for cold-orc and rsync from the start signal to the end "
             "(the fresh daemon's start-up not included); for warm-fio and cold-fio the whole "
             "fio run, its setup included (fio opens every file, warm, or stats every file, "
             "cold); in cold-fio the daemon mounted by fio's prerun counts whole, its "
             "start-up included."]
    open_rows = [r for r in bench.rows if r["measure"] == "warm-fio" and r.get("openfiles")]
    if open_rows and ds and min(r["openfiles"] for r in open_rows) < len(ds.names):
        n_open = min(r["openfiles"] for r in open_rows)
        notes.append(f"warm-fio: each fio job kept {n_open:,} of the {len(ds.names):,} files "
                     f"open (--openfiles; the open-file hard limit is "
                     f"{resource.getrlimit(resource.RLIMIT_NOFILE)[1]:,} and cannot be "
                     "raised without CAP_SYS_RESOURCE), so a few files are opened again "
                     "during the run.")
    md += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    if bench.problems:
        md += ["", "## Problems seen", ""] + [f"- {p}" for p in bench.problems]
    png = plot(os.path.join(args.out, "workers.png"), bench.rows, targets)
    if png:
        md += ["", f"![cold open+read+close and the other measures, x squashfuse_ll]({os.path.basename(png)})"]
    md.append("")
    with open(os.path.join(args.out, "workers.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(table_lines))
    print()
    for line in goal_lines:
        print(line)
    log(f"workers_bench: wrote {args.out}/workers.json and workers.md ({wall:.0f} s in all)")
    return 1 if bench.problems else 0


def plot(path: str, rows: List[dict], targets: list) -> Optional[str]:
    """workers.png: cold open+read+close by readers for every target, and
    every other measure as a ratio to squashfuse_ll. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no workers.png (pip install matplotlib)")
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for t in targets:
        pts = sorted((r["n"], r["value"]) for r in rows
                     if r["measure"] == "cold-orc" and r["target"] == t.key and r.get("value"))
        if pts:
            left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t.label,
                      linestyle="--" if t.workers is None else "-")
    left.set_xscale("log", base=2)
    left.set_xticks([1, 4, 16], ["1", "4", "16"])
    left.set_xlabel("readers")
    left.set_ylabel("objects/s")
    left.set_title("cold open+read+close, 20,000 objects of 1 B-4 KiB")
    left.legend(fontsize=8)
    measures = [("warm-fio", 2, "warm fio\n(IOPS)", False), ("rsync", 1, "rsync -a\n(1 / time)", True),
                ("cold-fio", 1, "cold fio\n1 job", False), ("cold-fio", 16, "cold fio\n16 jobs", False)]
    base = {(r["measure"], r["n"]): r["value"] for r in rows
            if r["target"] == "squashfuse_ll" and r.get("value")}
    shard_targets = [t for t in targets if t.key != "squashfuse_ll"]
    width = 0.8 / max(1, len(shard_targets))
    for i, t in enumerate(shard_targets):
        ratios = []
        for measure, n, _, inverse in measures:
            row = next((r for r in rows if r["measure"] == measure and r["n"] == n
                        and r["target"] == t.key and r.get("value")), None)
            ref = base.get((measure, n))
            ratios.append((ref / row["value"] if inverse else row["value"] / ref) if row and ref else 0)
        right.bar([j + i * width for j in range(len(measures))], ratios, width, label=t.label)
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_xticks([j + 0.4 - width / 2 for j in range(len(measures))], [m[2] for m in measures])
    right.set_ylabel("x squashfuse_ll (higher is better)")
    right.set_title("shardfs / squashfuse_ll")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
