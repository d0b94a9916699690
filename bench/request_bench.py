"""The FUSE request path in C against the pyfuse3 one, plain files, erofs and squashfuse_ll.

The same objects (bench/datasets.py "small": 20,000 of 1 B-4 KiB, seeded
random bytes; --quick 5,000) served as: now = `shardfs mount SHARD MP
--layout flat` of this checkout's .venv (C request path, no-open mode);
before = the same from commit 2fc8a92 (pyfuse3), --before-venv (default
/work/before/.venv: `git worktree add /work/before 2fc8a92`, a venv there,
`pip install -e /work/before`; absent: not measured); plain = plain files in
one directory on the same filesystem (the physical limit); erofs =
mkfs.erofs IMG DIR, mount -t erofs -o loop,ro; squash = squashfuse_ll on
mksquashfs DIR IMG -comp lz4 -noappend.

Measures, objects/s unless said ("cold": FUSE targets mounted afresh, then
sync; echo 3 > /proc/sys/vm/drop_caches):
  c_warm, c_cold  bench/c/open_read (open, read to EOF, close), 1 thread:
          names and pages cached (an untimed pass first), and cold
  py1, py4  Python open(p, 'rb').read() per object (buffered: one
          ioctl(TCGETS) each), cold, random order, 1 and 4 processes;
          py1raw: open(p, 'rb', buffering=0), 1 process (no ioctl)
  fio     warm fio --opendir=MP --rw=randread --numjobs=2 psync, IOPS. Not
          --bs=4k: fio reads whole blocks only, so a file under 4 KiB is
          opened and closed unread (and fio still counts I/Os); reads of
          1..1024 B (--bsrange=1-1k --bs_unaligned), --invalidate=0
  rsync, tar, sha  cold rsync -a MP/ DEST/; tar -cf - -C MP . | cat >
          /dev/null; find MP -type f -print0 | xargs -0 -P4 sha256sum
  cpu     user+system CPU of the serving processes (shardfs coordinator and
          workers, squashfuse_ll) during py1, us per object
Every measure of every target once per round (5 rounds), the targets' order
rotated each round; figures are medians over rounds, ratios the median of
each round's ratio (runs seconds apart: the machine's drift cancels); every
run is kept in the JSON (with shardfs's request counts: root xattr
user.shardfs.requests).

Goals for "now" (GOAL <text> <measured> MET|MISS; not measured = MISS): C
reader cached >= 0.6x plain; Python cold 1 reader >= 0.8x plain; 4 readers
>= 1.5x squashfuse_ll; warm fio >= 0.95x plain; rsync, tar, sha256sum each
>= 1x plain; CPU per cold object <= 10 us.

  make bench-request [ARGS=--quick]   (root, ~20 min, quick ~4; bench/results/request.{md,json,png})
  .venv/bin/python bench/request_bench.py [--quick] [--rounds N] [--count N]
"""
import argparse
import hashlib
import json
import os
import platform
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import datasets  # noqa: E402
from machine import abort_fuse_connection, cpu_model, memory_bytes  # noqa: E402

BEFORE_COMMIT = "2fc8a92"
MEASURES = [  # key, row label, unit
    ("c_warm", "C reader, cached, 1 thread", "objects/s"),
    ("c_cold", "C reader, cold, 1 thread", "objects/s"),
    ("py1", "Python open().read(), cold, 1 reader", "objects/s"),
    ("py4", "Python open().read(), cold, 4 readers", "objects/s"),
    ("py1raw", "Python open(buffering=0).read(), cold, 1 reader", "objects/s"),
    ("fio", "fio randread 1..1024 B, warm, 2 jobs", "IOPS"),
    ("rsync", "rsync -a, cold", "objects/s"),
    ("tar", "tar -cf - . | cat, cold", "objects/s"),
    ("sha", "find | xargs -P4 sha256sum, cold", "objects/s"),
]
READER = r"""
import json, os, sys, time
root, listfile, buffering = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = open(listfile).read().split()
print("ready", flush=True)
sys.stdin.readline()
n = 0
for name in names:
    n += len(open(os.path.join(root, name), 'rb', buffering=-1 if buffering else 0).read())
print(json.dumps({"objects": len(names), "bytes": n, "t1": time.monotonic()}))
"""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(cmd, timeout=600):
    """Run a command (list, or a shell line); its stdout, or RuntimeError."""
    p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if p.returncode:
        raise RuntimeError(f"{cmd if isinstance(cmd, str) else ' '.join(cmd)}: exit {p.returncode}: "
                           f"{p.stderr.decode(errors='replace').strip()[-300:]}")
    return p.stdout


def is_mounted(mp):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mp for line in f)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def daemon_pids(mp):
    """The processes serving `mp`: `pgrep -f 'shardfs.fuse.mount|squashfuse_ll'`
    (shardfs: coordinator and workers) whose command line names `mp`."""
    pids = subprocess.run(["pgrep", "-f", "shardfs.fuse.mount|squashfuse_ll"], capture_output=True,
                          text=True).stdout.split()
    return [p for p in pids if mp.encode() in read(f"/proc/{p}/cmdline", b"").split(b"\0")]


def daemon_cpu(mp):
    """(user, system) CPU seconds so far of the processes serving `mp`."""
    stats = [read(f"/proc/{p}/stat", ")").rsplit(")", 1)[1].split() for p in daemon_pids(mp)]
    stats = [f for f in stats if len(f) > 12]
    return tuple(sum(int(f[i]) for f in stats) / os.sysconf("SC_CLK_TCK") for i in (11, 12))


def read(path, default):
    try:
        with open(path, "rb" if isinstance(default, bytes) else "r") as f:
            return f.read()
    except OSError:
        return default


class Target:
    def __init__(self, key, label, path, mount_cmd=None, umount_cmd=None, fuse=False):
        self.key, self.label, self.path = key, label, path
        self.mount_cmd, self.umount_cmd, self.fuse = mount_cmd, umount_cmd, fuse
        self.error = ""  # why it is not measured

    def mount(self):
        if self.mount_cmd and not is_mounted(self.path):
            sh(self.mount_cmd, timeout=120)

    def umount(self):
        if not self.mount_cmd or not is_mounted(self.path):
            return
        try:
            sh(self.umount_cmd, timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"request_bench: {exc}; aborting the connection, lazy unmount")
            abort_fuse_connection(self.path)
            subprocess.run(["umount", "-l", self.path], capture_output=True)
        deadline = time.monotonic() + 10  # let the daemon leave
        while self.fuse and daemon_pids(self.path) and time.monotonic() < deadline:
            time.sleep(0.05)

    def fresh(self):
        if self.fuse:
            self.umount()
        self.mount()

    def cold(self):
        self.fresh()
        drop_caches()

    def requests(self):
        try:
            return json.loads(os.getxattr(self.path, "user.shardfs.requests"))
        except OSError:  # not shardfs
            return None


class Bench:
    def __init__(self, args, ds, work):
        self.args, self.work, self.total = args, work, ds.total_bytes
        self.order = list(ds.keys)
        random.Random(f"request-bench:{args.seed}").shuffle(self.order)
        self.names = os.path.join(work, "names.txt")
        with open(self.names, "w") as f:
            f.write("\n".join(self.order) + "\n")

    def c_reader(self, t):
        r = json.loads(sh([self.args.open_read, t.path, self.names, "1"], self.args.timeout))
        if r["files"] != len(self.order) or r["bytes"] != self.total:
            raise RuntimeError(f"open_read read {r['files']} files, {r['bytes']} bytes")
        return r["files_per_second"]

    def c(self, t, warm):
        if warm:
            t.fresh()
            self.c_reader(t)  # untimed: names and pages cached
        else:
            t.cold()
        return {"value": self.c_reader(t)}

    def python(self, t, readers, buffering=True):
        """`readers` processes started (lists loaded) before the target is
        made cold, then all told to go; wall time to the last one's end."""
        procs, n = [], len(self.order)
        try:
            for i in range(readers):
                listfile = os.path.join(self.work, f"list{i}")
                with open(listfile, "w") as f:
                    f.write("\n".join(self.order[n * i // readers:n * (i + 1) // readers]))
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", READER, t.path, listfile, str(int(buffering))],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                if procs[-1].stdout.readline().strip() != "ready":
                    raise RuntimeError(f"reader did not start: {procs[-1].stderr.read()[-300:]}")
            t.cold()
            req0, cpu0, t0 = t.requests(), daemon_cpu(t.path), time.monotonic()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            res = []
            for p in procs:
                out, err = p.communicate(timeout=self.args.timeout)
                if p.returncode:
                    raise RuntimeError(f"reader exit {p.returncode}: {err.strip()[-300:]}")
                res.append(json.loads(out.splitlines()[-1]))
            wall = max(r["t1"] for r in res) - t0
            cpu1, req1 = daemon_cpu(t.path), t.requests()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if sum(r["bytes"] for r in res) != self.total:
            raise RuntimeError(f"read {sum(r['bytes'] for r in res)} bytes, expected {self.total}")
        run = {"value": n / wall, "seconds": round(wall, 4)}
        if t.fuse:
            user, system = ((b - a) / n * 1e6 for a, b in zip(cpu0, cpu1))
            run.update(cpu_us=round(user + system, 2), cpu_user_us=round(user, 2),
                       cpu_system_us=round(system, 2))
        if req0 is not None and req1 is not None:
            run["requests"] = {k: v - req0.get(k, 0) for k, v in req1.items() if v - req0.get(k, 0)}
        return run

    def fio(self, t):
        t.fresh()
        self.c_reader(t)  # names and pages cached
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        openfiles = min(len(self.order), hard - 256)  # fio keeps them open
        out = os.path.join(self.work, "fio.json")
        cmd = ["fio", "--name=warm", f"--opendir={t.path}", "--rw=randread", "--bsrange=1-1k",
               "--bs_unaligned", "--numjobs=2", "--time_based", f"--runtime={self.args.runtime}",
               "--group_reporting", "--output-format=json", "--ioengine=psync", "--invalidate=0",
               f"--openfiles={openfiles}", "--eta=never", f"--output={out}"]
        cpu0 = sum(daemon_cpu(t.path))
        subprocess.run(cmd, check=True, capture_output=True, timeout=self.args.runtime * 4 + 120,
                       cwd=self.work,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)))
        with open(out) as f:
            text = f.read()
        job = json.loads(text[text.index("{"):])["jobs"][0]
        if job["error"]:
            raise RuntimeError(f"fio error {job['error']}")
        run = {"value": job["read"]["iops"], "reads": job["read"]["total_ios"], "openfiles": openfiles}
        if t.fuse:
            run["cpu_us_per_read"] = round((sum(daemon_cpu(t.path)) - cpu0) / max(1, run["reads"]) * 1e6, 3)
        return run

    def tool(self, t, m):
        """rsync, tar or find|xargs sha256sum (output checked), cold."""
        dest = os.path.join(self.work, "rsync-dest")
        shutil.rmtree(dest, ignore_errors=True)
        cmd = {"rsync": f"rsync -a '{t.path}/' '{dest}/'", "tar": f"tar -cf - -C '{t.path}' . | cat > /dev/null",
               "sha": f"find '{t.path}' -type f -print0 | xargs -0 -P4 sha256sum"}[m]
        try:
            t.cold()
            t0 = time.monotonic()
            lines = sh(cmd, self.args.timeout).decode().splitlines()
            wall = time.monotonic() - t0
            if m == "rsync" and len(os.listdir(dest)) != len(self.order):
                raise RuntimeError(f"rsync copied {len(os.listdir(dest))} files")
            if m == "sha" and (len(lines) != len(self.order) or any(ln[:64] != ln[-64:] for ln in lines)):
                raise RuntimeError("sha256sum: a hash is not the file's name, or files are missing")
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        return {"value": len(self.order) / wall, "seconds": round(wall, 4)}

    def measure(self, key, t):
        fn = {"c_warm": lambda t: self.c(t, True), "c_cold": lambda t: self.c(t, False),
              "py1": lambda t: self.python(t, 1), "py4": lambda t: self.python(t, 4),
              "py1raw": lambda t: self.python(t, 1, buffering=False), "fio": self.fio}.get(key) \
            or (lambda t: self.tool(t, key))
        try:
            run = fn(t)
            if t.key in ("now", "before"):  # counted since the mount this run made
                run["requests_since_mount"] = t.requests()
            return run
        except (OSError, RuntimeError, ValueError, KeyError, subprocess.SubprocessError) as exc:
            return {"value": None, "error": str(exc)[-400:]}


def setup(args, ds, work, mnt):
    """Plain files in one directory and the two images (kept in `work`), the
    C reader, and the targets."""
    plain = os.path.join(work, "plain")
    img = {k: os.path.join(work, k + ".img") for k in ("erofs", "squash")}
    if not os.path.exists(os.path.join(work, "images.done")):
        shutil.rmtree(plain, ignore_errors=True)
        os.makedirs(plain)
        for key in ds.keys:
            shutil.copyfile(os.path.join(ds.native_dir, ds.native_relpath(key)), os.path.join(plain, key))
        for path in img.values():
            if os.path.exists(path):
                os.unlink(path)
        sh(["mkfs.erofs", img["erofs"], plain])
        sh(["mksquashfs", plain, img["squash"], "-comp", "lz4", "-noappend", "-quiet", "-no-progress"])
        os.sync()
        open(os.path.join(work, "images.done"), "w").close()
    args.open_read = os.path.join(work, "open_read")
    sh(["gcc", "-O2", "-o", args.open_read, os.path.join(HERE, "c", "open_read.c"), "-lpthread"])
    mp = {k: os.path.join(mnt, k) for k in ("now", "before", "erofs", "squash")}
    for d in mp.values():
        os.makedirs(d)

    def shardfs(venv, key, label):
        cli, cache = os.path.join(venv, "bin", "shardfs"), os.path.join(work, "cache-" + key)
        os.makedirs(cache, exist_ok=True)
        t = Target(key, label, mp[key], [cli, "mount", ds.shard, mp[key], "--layout", "flat",
                                         "--cache-dir", cache], [cli, "umount", mp[key]], fuse=True)
        t.error = "" if os.access(cli, os.X_OK) else f"{cli} not found"
        return t
    return [shardfs(os.path.join(ROOT, ".venv"), "now", "shardfs now"),
            shardfs(args.before_venv, "before", f"shardfs {BEFORE_COMMIT}"),
            Target("plain", "plain files", plain),
            Target("erofs", "erofs", mp["erofs"], ["mount", "-t", "erofs", "-o", "loop,ro", img["erofs"],
                                                   mp["erofs"]], ["umount", mp["erofs"]]),
            Target("squash", "squashfuse_ll", mp["squash"], ["squashfuse_ll", img["squash"], mp["squash"]],
                   ["fusermount3", "-u", mp["squash"]], fuse=True)]


def check_target(t, ds):
    """Mounted, lists every object, 20 objects hash to their names; shardfs's
    sidecar (built on a first mount) in its cache before any figure."""
    try:
        t.fresh()
        if len(os.listdir(t.path)) != ds.count:
            raise RuntimeError("wrong listing")
        for key in random.Random(0).sample(ds.keys, 20):
            with open(os.path.join(t.path, key), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != key:
                    raise RuntimeError(f"{key}: wrong content")
        cache, deadline = t.key in ("now", "before") and t.mount_cmd[-1], time.monotonic() + 60
        while cache and not any(n.endswith(".sidecar") for n in os.listdir(cache)):
            if time.monotonic() > deadline:
                raise RuntimeError("no sidecar after 60 s")
            time.sleep(0.2)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        t.error = f"cannot be used: {exc}"
        log(f"request_bench: {t.label} {t.error}")


def versions():
    def first(*cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        return ((p.stdout + p.stderr).strip().splitlines() or ["unknown"])[0]
    v = {p: first("dpkg-query", "-W", "-f=${Version}", p)
         for p in ("libfuse3-3", "squashfuse", "erofs-utils", "squashfs-tools")}
    changed = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "shardfs"], capture_output=True,
                             text=True).stdout.split()[1::2]
    return {"kernel": platform.release(), **v, "fio": first("fio", "--version"),
            "python": platform.python_version(), "shardfs before": BEFORE_COMMIT,
            "shardfs now": first("git", "-C", ROOT, "describe", "--always", "--dirty")
            + (f" (uncommitted changes in {' '.join(changed)})" if changed else "")}


def med(runs, m, t, field="value"):
    vals = [r[field] for r in runs if r["measure"] == m and r["target"] == t and r.get(field) is not None]
    return statistics.median(vals) if vals else None


def ratio(runs, m, t, ref="plain"):
    """Median over rounds of the ratio of `t`'s figure to `ref`'s in that round."""
    by = {(r["round"], r["target"]): r["value"] for r in runs if r["measure"] == m and r["value"]}
    rs = [by[k, t] / by[k, ref] for k in {r["round"] for r in runs} if (k, t) in by and (k, ref) in by]
    return statistics.median(rs) if rs else None


def goals(runs):
    lines = []

    def goal(text, m, need, ref="plain"):
        r, before = ratio(runs, m, "now", ref), ratio(runs, m, "before", ref)
        if r is None:
            return lines.append(f"GOAL {text} not measured MISS")
        lines.append(f"GOAL {text} {r:.2f}x (medians {med(runs, m, 'now'):,.0f} vs {med(runs, m, ref):,.0f}; "
                     + ("before not measured" if before is None else f"before {before:.2f}x") + ") "
                     + ("MET" if r >= need else "MISS"))
    goal("C reader cached >= 0.6x plain files:", "c_warm", 0.6)
    goal("Python reader cold 1 reader >= 0.8x plain files:", "py1", 0.8)
    goal("Python reader cold 4 readers >= 1.5x squashfuse_ll:", "py4", 1.5, "squash")
    goal("warm fio >= 0.95x plain files:", "fio", 0.95)
    for m, name in (("rsync", "rsync -a"), ("tar", "tar -cf"), ("sha", "find|xargs sha256sum")):
        goal(f"cold {name} >= 1x plain files:", m, 1.0)
    cpu, before = med(runs, "py1", "now", "cpu_us"), med(runs, "py1", "before", "cpu_us")
    lines.append("GOAL CPU per cold object <= 10 us: " + ("not measured MISS" if cpu is None else
                 f"{cpu:.1f} us (before {'not measured' if before is None else f'{before:.1f} us'}) "
                 + ("MET" if cpu <= 10 else "MISS")))
    return lines


def markdown(meta, runs, targets, goal_lines):
    others, n = [t for t in targets if t.key != "plain"], meta["objects"]
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    out = ["# Request path: shardfs (C) against shardfs (pyfuse3), plain files, erofs, squashfuse_ll", "",
           f"{meta['date']}; {meta['machine']}; {n:,} objects of 1 B-4 KiB ({meta['bytes'] / 1e6:.1f} MB); "
           f"median of {meta['rounds']} interleaved rounds (ratios: median of the rounds' ratios; every run "
           f"in request.json); load average "
           f"{meta['load_start']} at start, {meta['load_end']} at end. Command: `{meta['command']}`.", "",
           "| measure | " + " | ".join(t.label for t in targets) + " | "
           + " | ".join(f"{t.label} / plain" for t in others) + " |",
           "|---" + "|---:" * (len(targets) + len(others)) + "|"]
    for m, label, unit in MEASURES:
        v = {t.key: med(runs, m, t.key) for t in targets}
        out.append(f"| {esc(label)}, {unit} | " + " | ".join("—" if v[t.key] is None else f"{v[t.key]:,.0f}"
                                                             for t in targets) + " | "
                   + " | ".join("—" if ratio(runs, m, t.key) is None else f"{ratio(runs, m, t.key):.2f}×"
                                for t in others) + " |")
    cpu = [med(runs, "py1", t.key, "cpu_us") for t in targets]
    out += ["| serving CPU per cold object (py1), µs | " + " | ".join("—" if c is None else f"{c:.1f}" for c in cpu)
            + " |" + " — |" * len(others), "",
            "Requests per object counted by shardfs since the run's mount (root xattr user.shardfs.requests; "
            "the warm runs include their untimed pass; median round; kinds under 0.005 left out):", "",
            "| measure | shardfs now | shardfs before |", "|---|---|---|"]
    for m, label, _ in MEASURES:
        cells = []
        for k in ("now", "before"):
            rr = [r for r in runs if r["target"] == k and r["measure"] == m and r.get("requests_since_mount")]
            req = rr[len(rr) // 2]["requests_since_mount"] if rr else {}
            cells.append(", ".join(f"{kind} {c / n:.2f}" for kind, c in sorted(req.items()) if c >= n / 200) or "—")
        out.append(f"| {esc(label)} | " + " | ".join(cells) + " |")
    out += ["", "Not measured: " + ("; ".join(f"{t.label}: {t.error}" for t in targets if t.error) or "none"),
            "", "```", *goal_lines, "```", "",
            "Versions: " + "; ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".", ""]
    return "\n".join(out)


def plot(path, runs, targets):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return log("request_bench: no matplotlib, no plot")
    others = [t for t in targets if t.key != "plain"]
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(others)
    for i, t in enumerate(others):
        ys = [ratio(runs, m, t.key) or 0 for m, _, _ in MEASURES]
        ax.bar([j + (i - (len(others) - 1) / 2) * width for j in range(len(MEASURES))], ys, width, label=t.label)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="plain files = 1")
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    ticks = [y for y in (0.05, 0.1, 0.2, 0.5, 1, 2, 5) if lo <= y <= hi]
    ax.set_yticks(ticks, [f"{y:g}" for y in ticks])
    ax.minorticks_off()
    ax.set_xticks(range(len(MEASURES)), [m for m, _, _ in MEASURES])
    ax.set_ylabel("rate / plain files' rate (median of rounds, log)")
    ax.set_title("Same objects five ways, normalised to plain files (higher is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5,000 objects, 2-s fio runs")
    for opt, kw in (("--count", {}), ("--runtime", {"help": "fio seconds (default 5, quick 2)"}),
                    ("--rounds", {"default": 5}), ("--seed", {"default": 1}), ("--timeout", {"default": 600})):
        ap.add_argument(opt, type=int, **kw)
    ap.add_argument("--before-venv", default="/work/before/.venv")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    args.count = args.count or (5000 if args.quick else 20000)
    args.runtime = args.runtime or (2 if args.quick else 5)
    if os.geteuid() != 0:
        return log("request_bench: must run as root (drop_caches, mount)") or 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally clauses run
    load_start, versions_start = os.getloadavg(), versions()  # the code mounted is the tree's now
    ds = datasets.ensure("small", args.count, args.seed, log=log)
    work = os.path.join(datasets.DEFAULT_DATA_DIR, f"request-n{args.count}-s{args.seed}")
    os.makedirs(work, exist_ok=True)
    mnt = tempfile.mkdtemp(prefix="request-bench-")
    targets, runs = [], []
    try:
        targets = setup(args, ds, work, mnt)
        for t in targets:
            if not t.error:
                check_target(t, ds)
        bench, live = Bench(args, ds, work), [t for t in targets if not t.error]
        for rnd in range(args.rounds):
            for m, _, unit in MEASURES:
                for t in live[rnd % len(live):] + live[:rnd % len(live)]:
                    run = {"round": rnd, "measure": m, "target": t.key, **bench.measure(m, t),
                           "load1": os.getloadavg()[0]}
                    runs.append(run)
                    log(f"round {rnd + 1}/{args.rounds} {m:7} {t.key:7} "
                        + (f"{run['value']:,.0f} {unit}" if run["value"] is not None else f"ERROR {run['error']}")
                        + (f", {run['cpu_us']} us CPU/object" if "cpu_us" in run else ""))
                    if t.fuse:
                        t.umount()
    finally:
        for t in targets:
            t.umount()
        shutil.rmtree(mnt, ignore_errors=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{cpu_model()}, {os.cpu_count()} cores, {memory_bytes() / 2**30:.0f} GiB RAM, "
                       f"kernel {platform.release()}",
            "objects": ds.count, "bytes": ds.total_bytes, "rounds": args.rounds, "seed": args.seed,
            "fio_runtime_s": args.runtime, "load_start": " ".join(f"{x:.2f}" for x in load_start),
            "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()), "versions": versions_start,
            "command": " ".join([os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT)]
                                + sys.argv[1:]),
            "targets": {t.key: {"label": t.label, "mount": t.mount_cmd, "not_measured": t.error}
                        for t in targets}}
    goal_lines = goals(runs)
    medians = {m: {t.key: med(runs, m, t.key) for t in targets} for m, _, _ in MEASURES}
    medians["cpu_us_per_cold_object"] = {t.key: med(runs, "py1", t.key, "cpu_us") for t in targets}
    ratios = {m: {t.key: ratio(runs, m, t.key) for t in targets} for m, _, _ in MEASURES}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "request.json"), "w") as f:
        json.dump({"meta": meta, "medians": medians, "ratios_to_plain": ratios, "goals": goal_lines,
                   "runs": runs}, f, indent=1)
    md = markdown(meta, runs, targets, goal_lines)
    with open(os.path.join(args.out, "request.md"), "w") as f:
        f.write(md)
    plot(os.path.join(args.out, "request.png"), runs, targets)
    print(md + "\n" + "\n".join(goal_lines))
    return 1 if any(r["value"] is None for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
