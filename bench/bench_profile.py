"""Where the serving CPU of a cold object goes: perf profiles of the FUSE
servers while one Python reader reads every object once, cut into groups
of code we own (our C code, Python) and code we don't (libfuse, libc, the
kernel's FUSE transport, scheduling, device I/O, page cache).

Targets (harness.standard_targets): **shardfs** (flat layout, default
workers), **shardfs -o workers=1**, the **FUSE floor** (bench/c/fuse_null.c
-s: 1 KiB of zeros per name) and **plain** files (the reader's profile).

Measure `py1`, as bench_mount's: open(p, 'rb').read() of every object of
"small" (20,000 of 1 B..4 KiB, bench_mount's order; --quick: 1 round, else
3), cold (remount, sync, drop_caches), one reader, under `perf record -a -e cpu-clock -F 4999 -g`
(enabled through its control FIFO once cold, SIGINT when the reader is
done), the serving processes' samples kept (-p would add ~80 µs of perf
context-switch cost per object here). Per object: serving CPU µs from /proc
as bench_mount (plain: sampled), sampled CPU (sum of periods), each group's
µs (share × µs; shares pooled over rounds, µs the median); the default
mount's top 15 symbols; shardfs / floor with and without device I/O and
scheduling, and the gap by group. No PMU in this VM: cpu-clock charges time
with interrupts off to where they come back on (finish_task_switch,
_raw_spin_unlock_irqrestore), hence the callchain rules. Noisy: shared host.

  .venv/bin/python bench/bench_profile.py [--quick] [--rounds N] [--freq HZ]
"""
import collections
import itertools
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

MNT = "/tmp/bench-profile"
OURS, LIBFUSE, LIBC, PYTHON, USER = "our C code", "libfuse", "libc", "Python", "user: other"
FUSE, SCHED, DEVICE = "kernel: FUSE transport", "kernel: scheduling and wakeups", "kernel: device I/O"
PAGES, OTHER = "kernel: page cache and faults", "kernel: other"
GROUPS = [OURS, LIBFUSE, LIBC, PYTHON, USER, FUSE, SCHED, DEVICE, PAGES, OTHER]

# The classification. A user-space sample goes by its leaf's object file
# (fuse_null's own binary counts as "our C code": the floor's server code).
USER_DSO = [(g, re.compile(p)) for g, p in [(OURS, r"_shardfs.*\.so$|fuse_null$"), (LIBFUSE, r"libfuse3"),
                                            (LIBC, r"libc[.-]"), (PYTHON, r"libpython|python[\d.]*$")]]
# A kernel sample goes by its leaf symbol: first match (re.match) wins, no
# match is "kernel: other" (syscall entry, VFS, interrupts and softirqs).
# Waking a page's waiters (folio_wake_bit) is a wakeup, not page cache work.
KERNEL = [(g, re.compile(p)) for g, p in [
          (DEVICE, r"iowrite|ioread|blk_|__blk_|bio_|submit_bio|__submit_bio|virtio|virtqueue|vring_|vp_|\w*_mq_"
                   r"|io_schedule|dd_|wbt_|ext4_mpage_readpages|nvme_|scsi_"),
          (SCHED, r"finish_task_switch|__schedule|schedule|preempt_schedule|try_to_wake_up|ttwu_|__wake_up|wake_up"
                  r"|\w+_wake_function|enqueue_|dequeue_|pick_next|__switch_to|switch_mm|update_curr|update_load_avg"
                  r"|select_task_rq|psi_|exit_to_user_mode_loop|folio_wake_bit"),
          (FUSE, r"_*fuse_"),
          (PAGES, r"filemap_|\w*page_fault|_*handle_mm_fault|do_fault|do_read_fault|\w*folio|next_uptodate|page_cache_"
                  r"|\w*readahead|\w*copy_page|_*memcpy|__pi_memcpy|copy_user|rep_movs|xas_|mark_page_accessed|set_pte"
                  r"|flush_tlb|do_wp_page|_*alloc_pages|__alloc_|lru_|gup_|\w*get_user_pages")]]
# Generic leaves (locks, copies, allocation, page pinning) do no work of
# their own kind: such a sample goes to the group of its first caller that
# matches a KERNEL rule and is not generic itself (8 frames at most, never
# past an interrupt or syscall entry), else to the leaf's own rule.
GENERIC = re.compile(r"_raw_spin|\w*queued_spin|_*memcpy|__pi_memcpy|_*memset|copy_user|rep_movs|_copy_(to|from)_"
                     r"|copy_page_(to|from)_iter|__check_object_size|check_heap_object|gup_|\w*get_user_pages"
                     r"|iov_iter_|kmem_cache_|kfree|_*kmalloc|mutex_|__list_|rcu_|__rcu|__get_user|__put_user")
BOUNDARY = re.compile(r"asm_|\w*irq_exit|common_interrupt|sysvec_|handle_softirqs|do_syscall_64|entry_SYSCALL")
KERNEL_SPACE = 0xffff800000000000
FRAME = re.compile(r"^\s+([0-9a-f]+) (.+) \((.*)\)$")


def kernel_rule(sym):
    return next((g for g, p in KERNEL if p.match(sym)), None)


def classify(chain):
    """The group of one sample: `chain` is [(ip, symbol, dso)], leaf first."""
    ip, sym, dso = chain[0]
    if ip < KERNEL_SPACE:
        return next((g for g, p in USER_DSO if p.search(os.path.basename(dso))), USER)
    own = kernel_rule(sym) or OTHER
    callers = [c for _, c, _ in itertools.takewhile(lambda f: f[0] >= KERNEL_SPACE and not BOUNDARY.match(f[1]),
                                                    chain[1:9])]
    if own == SCHED and any(c.startswith("io_schedule") for c in callers):
        return DEVICE  # a context switch while waiting for a page to be read
    if GENERIC.match(sym):
        return next((g for c in callers if not GENERIC.match(c) and (g := kernel_rule(c))), own)
    return own


def parse(data, pids):
    """perf script of `data`, the samples of `pids`: ({group: ns}, {(symbol, dso, group): ns}, samples)."""
    out = subprocess.run(["perf", "script", "-i", data, "--pid", ",".join(map(str, pids)),
                          "-F", "tid,period,ip,sym,dso"], capture_output=True, text=True, errors="replace",
                         timeout=1800).stdout
    groups, syms, n = collections.Counter(), collections.Counter(), 0
    for block in out.split("\n\n"):
        head, *frames = block.strip("\n").split("\n")
        head, chain = head.split(), [(int(m[1], 16), m[2], m[3]) for m in map(FRAME.match, frames) if m]
        if len(head) < 2 or not chain:
            continue
        period, g = int(head[1]), classify(chain)
        groups[g] += period
        syms[(chain[0][1], os.path.basename(chain[0][2]), g)] += period
        n += 1
    return groups, syms, n


class Perf:
    """perf record -a, kept for `pids`: started disabled, enabled through its
    control FIFO (returns once perf acknowledged), stopped with SIGINT."""

    def __init__(self, pids, work, freq):
        self.pids, self.data, ctl, ack = pids, *(os.path.join(work, x) for x in ("perf.data", "ctl", "ack"))
        for f in (ctl, ack):
            os.mkfifo(f)
        self.p = subprocess.Popen(["perf", "record", "-q", "-a", "-e", "cpu-clock", "-F", str(freq), "-g", "-D", "-1",
                                   "--control", f"fifo:{ctl},{ack}", "-o", self.data], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.ctl, self.ack = os.open(ctl, os.O_RDWR), os.open(ack, os.O_RDWR)
        os.write(self.ctl, b"enable\n")
        for _ in range(60):
            if select.select([self.ack], [], [], 1)[0] or self.p.poll() is not None:
                break
        if self.p.poll() is not None or not select.select([self.ack], [], [], 0)[0]:
            self.stop()
            raise RuntimeError(f"perf record did not start: {self.p.stderr.read()[-300:]}")
        os.read(self.ack, 64)

    def stop(self):
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        for fd in (self.ctl, self.ack):
            os.close(fd)
        if not os.path.exists(self.data):
            raise RuntimeError(f"perf record: exit {self.p.returncode}: {self.p.stderr.read()[-300:]}")


def readers():
    """Our child processes (in before(): the harness's reader only)."""
    return [int(p) for p in open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()]


class Bench:
    def __init__(self, args):
        self.args, self.ds = args, H.dataset("small", 20000)
        self.names = random.Random("bench-mount").sample(self.ds.keys, self.ds.count)  # bench_mount's order
        self.res = H.Results("profile", "Where the serving CPU of a cold object goes (perf)", args.quick, sys.argv[1:])
        w1, = H.standard_targets(self.ds, f"{MNT}/w1", ["shardfs"], options=["workers=1"])
        w1.key, w1.label = "w1", "shardfs workers=1"
        self.targets = [*H.standard_targets(self.ds, MNT, ["shardfs"]), w1,
                        *H.standard_targets(self.ds, MNT, ["null", "plain"])]
        self.targets[-1].label = "plain files (the reader)"
        for t in self.targets:
            try:  # mounted once: a shardfs mount's sidecar built, its worker count
                if not t.error:
                    t.fresh()
                    if t.kind == "shardfs" and t.wait_ready()[0] is None:
                        raise RuntimeError("no sidecar after 600 s")
                    if t.key == "shardfs":
                        t.label = f"shardfs (default: workers={len((t.xattr('stats') or {}).get('workers', ()))})"
            except (OSError, RuntimeError) as exc:
                t.error = f"cannot be used: {exc}"
            finally:
                t.umount()
            if t.error:
                self.res.errors[f"target {t.key}"] = t.error
                H.log(f"{t.label}: {t.error}")

    def profile(self, t):
        state = {}
        with tempfile.TemporaryDirectory(dir=MNT) as work:
            def before():
                t.cold()
                pids = t.pids() if t.fuse else readers()
                if not pids:
                    raise RuntimeError("no process to profile")
                state["cpu"], state["perf"] = t.cpu(), Perf(pids, work, self.args.freq)
            try:
                r = H.read_files(t.path, self.names, 1, "python", before=before)
                u1, s1 = t.cpu()
            finally:
                if "perf" in state:
                    state["perf"].stop()
            want = 1024 * self.ds.count if t.kind == "null" else self.ds.total_bytes
            if r["bytes"] != want:
                raise RuntimeError(f"read {r['bytes']:,} bytes, expected {want:,}")
            groups, syms, samples = parse(state["perf"].data, state["perf"].pids)
        if not samples:
            raise RuntimeError("perf: no samples of the serving processes")
        n, (u0, s0) = r["objects"], state["cpu"]
        sampled = sum(groups.values()) / n / 1e3
        return {"value": round((u1 - u0 + s1 - s0) / n * 1e6, 2) if t.fuse else round(sampled, 2),
                "sampled_us": round(sampled, 2), "samples": samples, "objects_s": round(n / r["seconds"]),
                "groups_ns": dict(groups), "top": [[*k, ns] for k, ns in syms.most_common(40)]}

    def run(self):
        def once(r, t):
            try:
                self.res.attempt("py1", t.key, r, lambda: self.profile(t))
            finally:
                t.umount()
        H.rounds(self.args.rounds, [t for t in self.targets if not t.error], once)

    def split(self, key):
        """(median µs per object, {group: µs per object}) or None."""
        runs = [x for x in self.res.runs if x["target"] == key]
        us, pooled = H.median(x["value"] for x in runs), sum((collections.Counter(x["groups_ns"]) for x in runs),
                                                             collections.Counter())
        total = sum(pooled.values())
        return (us, {g: us * pooled[g] / total for g in GROUPS}) if runs and total else None

    def report(self):
        res, ds = self.res, self.ds
        res.text(f"Small objects: {ds.count:,} of {min(ds.sizes):,}..{max(ds.sizes):,} B, read once, cold, by one "
                 f"Python reader; perf record -a -e cpu-clock -F {self.args.freq} -g, the serving processes' samples "
                 f"kept. µs/object: /proc utime + stime (tick-sampled, as bench_mount); sampled: perf's. Median of "
                 f"{self.args.rounds} round(s); group shares pooled over rounds; every run in profile.json.")
        split = {t.key: self.split(t.key) for t in self.targets}
        self.table(["target", "µs/object", "sampled µs/object", "samples", *GROUPS],
                   [[t.label, H.fmt(s and s[0], 1), H.fmt(res.value("py1", t.key, "sampled_us"), 1),
                     H.fmt(res.value("py1", t.key, "samples")), *[H.fmt(s and s[1][g], 2) for g in GROUPS]]
                    for t in self.targets for s in [split[t.key]]],
                   "### Serving CPU µs per cold object, by group (plain files: the reader's CPU)")
        runs, pooled = [x for x in res.runs if x["target"] == "shardfs"], collections.Counter()
        for x in runs:
            pooled.update({tuple(e[:3]): e[3] for e in x["top"]})
        total, us = sum(sum(x["groups_ns"].values()) for x in runs), H.median(x["value"] for x in runs)
        if total:
            self.table(["symbol", "object", "group", "share", "µs/object"],
                       [[s.replace("|", "\\|"), d, g, f"{100 * ns / total:.1f}%", H.fmt(us * ns / total, 2)]
                        for (s, d, g), ns in pooled.most_common(15)],
                       "### Top 15 symbols (leaf) of the default shardfs mount")
        floor, lines = split.get("null"), []
        for t in self.targets:
            s = split[t.key]
            if t.kind != "shardfs" or not (s and floor):
                continue
            a, b = (x[0] - x[1][SCHED] - x[1][DEVICE] for x in (s, floor))
            gap = {g: s[1][g] - floor[1][g] for g in GROUPS}
            lines += [f"{t.label} serving CPU / FUSE floor = {H.times(H.ratio(s[0], floor[0]))}; "
                      f"without device I/O and scheduling = {H.times(H.ratio(a, b))}",
                      f"  gap {s[0] - floor[0]:+.1f} µs/object, of which code we own (our C code, Python) "
                      f"{gap[OURS] + gap[PYTHON]:+.1f}, libfuse and libc {gap[LIBFUSE] + gap[LIBC]:+.1f}: "
                      + ", ".join(f"{g} {v:+.1f}" for g, v in gap.items())]
        print("\n".join(lines), flush=True)
        res.text("```\n" + "\n".join(lines or ["shardfs / FUSE floor: not measured"]) + "\n```")
        res.text("Groups: see USER_DSO, KERNEL and GENERIC in bench/bench_profile.py (leaf symbol; callers for "
                 "locks, copies, allocation; context switches under io_schedule are device I/O).")
        res.write()

    def table(self, header, rows, caption):
        """A Markdown table into the results, and printed."""
        self.res.table(header, rows, caption)
        print(self.res.sections[-1] + "\n", flush=True)


def main():
    args = H.main_args(__doc__.split("\n\n")[0], extra=lambda p: p.add_argument(
        "--freq", type=int, default=4999, help="perf sampling frequency, Hz (default 4999)"))
    if os.geteuid() != 0:
        sys.exit("bench_profile: must run as root (mounts, drop_caches, perf record -a)")
    if not shutil.which("perf"):
        sys.exit("bench_profile: perf not found (Debian: apt-get install linux-perf); nothing measured")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(MNT, exist_ok=True)
    bench = None
    try:
        bench = Bench(args)
        bench.run()
    finally:
        for t in bench.targets if bench else ():
            t.umount()
    bench.report()


if __name__ == "__main__":
    main()
