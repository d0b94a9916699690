"""Failover benchmark: what readers see when a process of a mount is
killed, or the mount is upgraded in place.

A shardfs mount (`-o workers=3`) of the `small` dataset's shard (5,000
objects quick, 20,000 full) is read by 8 threads, each opening random
objects with O_DIRECT (no page cache, no readahead: every read is a READ
request a worker answers, and its error reaches the reader) and checking
every byte. Meanwhile, --events times (default 20) one second apart, one
of three events, each in a run of its own:

- a worker is killed with SIGKILL: the coordinator forks a replacement
  and, on Linux 6.9 and later, the kernel is asked to resend what the
  dead worker had read (docs/workers.md, "Resends");
- the coordinator is killed with SIGKILL: the supervisor forks a new one,
  which takes the mount over (docs/workers.md, "The supervisor"); its
  takeover time is from the kill to its first publication of the shard
  table (the time it writes in the shared state's TAKEN_OVER_NS word);
- `shardfs upgrade` hands the mount to the shardfs installed (here: the
  same one), every process but the supervisor replaced; its time is the
  one the command prints, from its signal to the last worker replaced.

Figures, over each run: reads, errors (any OSError), wrong bytes, hung
readers (a read not back 30 s after the last event); per event, the
pause: the longest time a read that was in flight during the event
(started before its end, ended after its start) took, from its start.
Median and maximum over the events; the read time of the same readers with
no event near (the run's median) beside them.

Goals (issue 33): 0 errors, 0 wrong bytes, 0 hung readers; the longest
pause ≤ 0.5 s; a coordinator's takeover within 1 s.
"""
from __future__ import annotations

import mmap
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

import harness as H

PLAN = {True: 5_000, False: 20_000}  # objects: quick, full
READERS = 8
WORKERS = 3


#: The events, in the order of the table.
EVENTS = ("worker killed", "coordinator killed", "upgrade")


def named_pids(point: str, name: str) -> list:
    """The mount's processes named `name` (shardfs-worker, shardfs-coord)."""
    out = []
    for pid in H.serving_pids(point):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == name:
                out.append(pid)
        except OSError:
            pass
    return out


def taken_over_ns(point: str) -> "callable":
    """A function reading when (CLOCK_MONOTONIC, ns) the mount's last
    coordinator taking over published its table (the shared state's
    TAKEN_OVER_NS word, through its supervisor's /proc/PID/fd): written by
    that coordinator, so the readers' load on this process does not delay
    the figure."""
    from shardfs.fuse import mount
    from shardfs.fuse.shared import TAKEN_OVER_NS

    state = mount._state_of(mount.supervisor_of(os.path.realpath(point)))
    return lambda: state.words[TAKEN_OVER_NS]


def event(kind: str, point: str, rng: random.Random) -> "tuple[float, float, float | None]":
    """Cause one event of `kind`; (start, end, its time in seconds: a
    coordinator's takeover, an upgrade's command; None for a worker)."""
    start = time.monotonic()
    if kind == "worker killed":
        os.kill(rng.choice(named_pids(point, "shardfs-worker")), signal.SIGKILL)
        return start, time.monotonic(), None
    if kind == "coordinator killed":
        taken = taken_over_ns(point)
        before = taken()
        (coordinator,) = named_pids(point, "shardfs-coord")
        start = time.monotonic_ns()
        os.kill(coordinator, signal.SIGKILL)
        while taken() == before and time.monotonic_ns() - start < 10e9:
            time.sleep(0.001)
        end = taken() if taken() != before else time.monotonic_ns()
        return start / 1e9, end / 1e9, (end - start) / 1e9
    done = subprocess.run([sys.executable, "-m", "shardfs", "upgrade", point], capture_output=True, text=True)
    end = time.monotonic()
    if done.returncode != 0:
        raise RuntimeError(f"shardfs upgrade failed: {done.stderr.strip()}")
    # its own figure: from its signal to the last worker replaced (not its interpreter's start)
    return start, end, float(done.stdout.rsplit(" in ", 1)[1].split()[0])


def reader(point: str, keys: list, sizes: dict, expected: dict, seed: int, stop: threading.Event,
           log: list) -> None:
    """Read random objects until `stop`; log (start, end, error or "")."""
    rng = random.Random(seed)
    buf = mmap.mmap(-1, max(sizes.values()) + 4096)
    while not stop.is_set():
        key = rng.choice(keys)
        t0 = time.monotonic()
        error = ""
        try:
            fd = os.open(os.path.join(point, key), os.O_RDONLY | os.O_DIRECT)
            try:
                got = os.preadv(fd, [buf], 0)
            finally:
                os.close(fd)
            if got != sizes[key] or (key in expected and buf[:got] != expected[key]):
                error = "wrong bytes"
        except OSError as exc:
            error = f"{exc.__class__.__name__}: {exc}"
        log.append((t0, time.monotonic(), error))


def run(res: H.Results, ds: H.Dataset, kind: str, count: int, round_: int, mnt: str) -> None:
    target = H.Target("shardfs", "shardfs", "shardfs", os.path.join(mnt, "failover"), sources=[ds.shard],
                      options=["layout=flat", f"cache_dir={os.path.join(mnt, 'failover-cache')}", f"workers={WORKERS}"])
    if target.error:
        raise H.Skip(target.error)
    target.fresh()
    try:
        rng = random.Random(round_)
        keys = list(ds.keys)
        sizes = dict(zip(ds.keys, ds.sizes))
        # the bytes of a sample are checked (all of them would not fit in memory at full size)
        from shardfs import Shard
        with Shard(ds.shard) as shard:
            expected = {k: shard[k] for k in rng.sample(keys, min(2_000, len(keys)))}
        stop = threading.Event()
        logs = [[] for _ in range(READERS)]
        threads = [threading.Thread(target=reader, args=(target.path, keys, sizes, expected, i, stop, logs[i]),
                                    daemon=True) for i in range(READERS)]
        for t in threads:
            t.start()
        time.sleep(1)
        spans, took = [], []
        for _ in range(count):
            if len(named_pids(target.path, "shardfs-worker")) < WORKERS or \
                    len(named_pids(target.path, "shardfs-coord")) != 1:
                time.sleep(0.1)  # a replacement still starting
                continue
            start, end, seconds = event(kind, target.path, rng)
            spans.append((start, end))
            if seconds is not None:
                took.append(seconds)
            time.sleep(1)
        time.sleep(1)
        stop.set()
        for t in threads:
            t.join(30)
        hung = sum(t.is_alive() for t in threads)
        reads = [r for log in logs for r in log]
        errors = [r[2] for r in reads if r[2] and r[2] != "wrong bytes"]
        wrong = sum(1 for r in reads if r[2] == "wrong bytes")
        pauses = []
        for first, last in spans:
            spanning = [end - start for start, end, _ in reads if start <= last and end >= first]
            pauses.append(max(spanning) if spanning else 0.0)
        quiet = [end - start for start, end, _ in reads
                 if all(not (first - 0.1 <= end and start <= last + 1.0) for first, last in spans)]
        res.add("reads", kind, len(reads), round_)
        res.add("errors", kind, len(errors), round_, first=errors[:3])
        res.add("wrong", kind, wrong, round_)
        res.add("hung", kind, hung, round_)
        res.add("events", kind, len(spans), round_)
        res.add("pause median", kind, statistics.median(pauses) if pauses else None, round_)
        res.add("pause max", kind, max(pauses) if pauses else None, round_)
        res.add("read median", kind, statistics.median(quiet) if quiet else None, round_)
        res.add("took median", kind, statistics.median(took) if took else None, round_)
        res.add("took max", kind, max(took) if took else None, round_)
    finally:
        target.umount()


def main(argv=None) -> None:
    args = H.main_args(__doc__.split("\n")[0], argv,
                       lambda p: p.add_argument("--events", type=int, default=20, help="events of each kind per round"))
    res = H.Results("failover", "Failover: processes killed and upgrades under 8 readers", args.quick,
                    (argv if argv is not None else sys.argv[1:]))
    ds = H.dataset("small", PLAN[args.quick], native=False)
    mnt = os.path.join(H.DATA, "mnt")
    resends = tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (6, 9)
    for kind in EVENTS:
        for r in range(args.rounds):
            res.attempt("failover", kind, r, lambda: run(res, ds, kind, args.events, r, mnt))
    rows = []
    for kind in EVENTS:
        v = lambda m: res.value(m, kind)  # noqa: E731
        ms = lambda m: H.fmt(v(m) * 1000, 2) if v(m) is not None else "—"  # noqa: E731
        rows.append([kind, H.fmt(v("events")), H.fmt(v("reads")), H.fmt(v("errors")), H.fmt(v("wrong")),
                     H.fmt(v("hung")), ms("pause median"), ms("pause max"), ms("read median"), ms("took median"),
                     ms("took max")])
    res.table(["event", "events", "reads", "errors", "wrong bytes", "hung readers", "pause median ms",
               "pause max ms", "read median ms (no event near)", "takeover/upgrade median ms", "max ms"], rows,
              f"Medians of {args.rounds} round(s); {READERS} readers, O_DIRECT, {WORKERS} workers; kernel "
              f"{os.uname().release} ({'resends' if resends else 'cannot resend: errors expected'}).")
    for kind in EVENTS:
        v = lambda m: res.value(m, kind)  # noqa: E731
        res.goal(f"{kind}: errors seen by readers = 0", v("errors"), "<=", 0, shown=H.fmt(v("errors")))
        res.goal(f"{kind}: wrong bytes = 0", v("wrong"), "<=", 0, shown=H.fmt(v("wrong")))
        res.goal(f"{kind}: hung readers = 0", v("hung"), "<=", 0, shown=H.fmt(v("hung")))
        worst = max(res.values("pause max", kind), default=None)
        res.goal(f"{kind}: longest pause <= 0.5 s", worst, "<=", 0.5,
                 shown=f"{worst:.3f} s" if worst is not None else "")
    took = max(res.values("took max", "coordinator killed"), default=None)
    res.goal("coordinator killed: taken over within 1 s", took, "<=", 1.0,
             shown=f"{took:.3f} s" if took is not None else "")
    res.write()


if __name__ == "__main__":
    main()
