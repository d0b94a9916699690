"""Failover benchmark: what readers see when a worker of a mount is killed.

A shardfs mount (`-o workers=3`) of the `small` dataset's shard (5,000
objects quick, 20,000 full) is read by 8 threads, each opening random
objects with O_DIRECT (no page cache, no readahead: every read is a READ
request a worker answers, and its error reaches the reader) and checking
every byte. Meanwhile a worker is killed with SIGKILL, --kills times
(default 20), one second apart; the coordinator forks a replacement each
time and, on Linux 6.9 and later, has the kernel resend what the dead
worker had read (docs/workers.md, "Resends").

Figures, over the whole run: reads, errors (any OSError), wrong bytes,
hung readers (a read not back 30 s after the last kill); per kill, the
pause: the longest time a read that was in flight at the kill (started
before it, ended after) took, from its start. Median and maximum over the
kills; the read time of the same readers with no kill (the run's median)
beside them.

Goals (issue 33): 0 errors, 0 wrong bytes, 0 hung readers; the longest
pause ≤ 0.5 s.
"""
from __future__ import annotations

import mmap
import os
import random
import signal
import statistics
import sys
import threading
import time

import harness as H

PLAN = {True: 5_000, False: 20_000}  # objects: quick, full
READERS = 8
WORKERS = 3


def worker_pids(point: str) -> list:
    """The mount's worker processes (named shardfs-worker)."""
    out = []
    for pid in H.serving_pids(point):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == "shardfs-worker":
                out.append(pid)
        except OSError:
            pass
    return out


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


def run(res: H.Results, ds: H.Dataset, kills: int, round_: int, mnt: str) -> None:
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
        kill_times, killed = [], []
        for _ in range(kills):
            pids = worker_pids(target.path)
            if not pids:
                time.sleep(0.1)
                continue
            victim = rng.choice(pids)
            kill_times.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
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
        for k in kill_times:
            spanning = [end - start for start, end, _ in reads if start <= k <= end]
            pauses.append(max(spanning) if spanning else 0.0)
        quiet = [end - start for start, end, _ in reads
                 if all(not (k - 0.1 <= end and start <= k + 1.0) for k in kill_times)]
        res.add("reads", "shardfs", len(reads), round_)
        res.add("errors", "shardfs", len(errors), round_, first=errors[:3])
        res.add("wrong", "shardfs", wrong, round_)
        res.add("hung", "shardfs", hung, round_)
        res.add("kills", "shardfs", len(kill_times), round_)
        res.add("pause median", "shardfs", statistics.median(pauses) if pauses else None, round_)
        res.add("pause max", "shardfs", max(pauses) if pauses else None, round_)
        res.add("read median", "shardfs", statistics.median(quiet) if quiet else None, round_)
    finally:
        target.umount()


def main(argv=None) -> None:
    args = H.main_args(__doc__.split("\n")[0], argv,
                       lambda p: p.add_argument("--kills", type=int, default=20, help="workers killed per round"))
    res = H.Results("failover", "Failover: a worker killed under 8 readers", args.quick,
                    (argv if argv is not None else sys.argv[1:]))
    ds = H.dataset("small", PLAN[args.quick], native=False)
    mnt = os.path.join(H.DATA, "mnt")
    resends = tuple(int(x) for x in os.uname().release.split(".")[:2]) >= (6, 9)
    for r in range(args.rounds):
        res.attempt("failover", "shardfs", r, lambda: run(res, ds, args.kills, r, mnt))
    v = lambda m: res.value(m, "shardfs")  # noqa: E731
    ms = lambda m: H.fmt(v(m) * 1000, 2) if v(m) is not None else "—"  # noqa: E731
    res.table(["kills", "reads", "errors", "wrong bytes", "hung readers", "pause median ms", "pause max ms",
               "read median ms (no kill near)"],
              [[H.fmt(v("kills")), H.fmt(v("reads")), H.fmt(v("errors")), H.fmt(v("wrong")), H.fmt(v("hung")),
                ms("pause median"), ms("pause max"), ms("read median")]],
              f"Medians of {args.rounds} round(s); {READERS} readers, O_DIRECT, {WORKERS} workers; kernel "
              f"{os.uname().release} ({'resends' if resends else 'cannot resend: errors expected'}).")
    res.goal("kill -9 of a worker: errors seen by readers = 0", v("errors"), "<=", 0, shown=H.fmt(v("errors")))
    res.goal("kill -9 of a worker: wrong bytes = 0", v("wrong"), "<=", 0, shown=H.fmt(v("wrong")))
    res.goal("kill -9 of a worker: hung readers = 0", v("hung"), "<=", 0, shown=H.fmt(v("hung")))
    worst = max(res.values("pause max", "shardfs"), default=None)
    res.goal("kill -9 of a worker: longest pause <= 0.5 s", worst, "<=", 0.5,
             shown=f"{worst:.3f} s" if worst is not None else "")
    res.write()


if __name__ == "__main__":
    main()
