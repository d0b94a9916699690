"""Reading objects through a mount: shardfs against plain files, kernel
erofs, squashfuse_ll, an older shardfs and the FUSE transport's floor.

Targets (bench/harness.py standard_targets, the same objects): **shardfs**
(this checkout, flat layout, default worker count); **before**
(`--before-venv PATH`, e.g. /work/before/.venv holding 2fc8a92, the pyfuse3
request path; skipped without it); **plain** files in one directory (the
physical limit); kernel **erofs** (loop); **squashfuse_ll** (lz4 image);
the **FUSE floor** (bench/c/fuse_null.c: any name is 1 KiB of zeros, no
work done; request-path measures only, its bytes differ and are not
checked); **shardfs -o workers=N**, N in 1, 2, 4 unless the default.

Dataset "small": 20,000 objects of 1 B..4 KiB (--quick 5,000), read in a
seeded random order, every byte counted against the objects' total.
Cold = FUSE targets mounted afresh, then sync and drop_caches (readers are
started first); warm = an untimed C-reader pass first. Objects/s unless
said; every FUSE run also records the serving processes' CPU µs per object
(user and system apart) and shardfs's FUSE requests per object (root xattr
user.shardfs.requests).

  c-cached, c-cold  bench/c/open_read.c (open, read to EOF, close), 1 thread
  py1, py4, py16    Python open(p, 'rb').read() (buffered: one ioctl each),
                    cold, 1/4/16 processes; py1-raw: buffering=0, 1 process
  fio-warm          fio --opendir randread of 1..1024 B (bs_unaligned: fio
                    reads whole blocks only), 2 jobs, warm: reads/s
  rsync, tar, sha   cold rsync -a (copy's files and bytes checked), tar -cf -
                    | wc -c (size checked), find -print0 | xargs -0 -P4
                    sha256sum (every hash checked against its name)
  fio-cold-J        fio whole objects (reads of 1..1 KiB to EOF; open and
                    close each), random order, J = 1/4/16 jobs on disjoint
                    shares, cold: the remount and drop_caches run in fio's
                    exec_prerun, after its setup has stat()ed every file
Full set only, shardfs against plain files:
  mix-cold-J        as fio-cold-J on "mix" (10,000 objects, lognormal sizes,
                    median 4 KiB)
  4k-warm-J         4 KiB random reads in 8 "large" objects (1 B..100 MB) kept
                    open, J jobs on disjoint slices, warm: reads/s
  seq-cold-J        the large objects streamed with 1 MiB reads, J jobs on
                    disjoint slices, cold: MB/s
  mixed-cold/-warm  4 whole-object readers (small) while 2 jobs stream the
                    large objects: objects/s and the latency of each
                    object's first read (the one fetching it: p50, p98, max)

Figures are medians of interleaved rounds (3, --quick 1; target order
rotated); ratios the median of each round's ratio. Time-based fio runs
last 3 s (--quick 2).

Goals (shardfs, default workers): C reader cached >= 0.6x plain; Python
cold 1 reader >= 0.8x plain; Python cold 4 readers >= 1.5x squashfuse_ll;
warm fio >= 0.95x plain; cold rsync, tar, find|xargs sha256sum each >= 1x
plain; serving CPU per cold object (py1) <= 10 us (the FUSE floor's shown
beside it); cold whole-object fio (best of 1/4/16 jobs) >= 10,000/s; cold
fio at 16 jobs >= 3x 1 job; workers x readers table of py1/py4/py16
complete; warm 4 KiB random reads (best of 1/4/16 jobs) >= 50% of plain's
best; objects under the mixed load p98 < 10 ms and max < 1 s (worst of
cold and warm).

  .venv/bin/python bench/bench_mount.py [--quick] [--rounds N] [--only MEASURE,...]
                                        [--before-venv /work/before/.venv]
"""
import hashlib
import math
import os
import random
import re
import resource
import shlex
import shutil
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

MNT = "/tmp/bench-mount"          # mount points, job files, latency logs, copies
JOBS = (1, 4, 16)                 # fio jobs of the scaling measures
READERS = (1, 4, 16)              # Python readers of the workers table
WORKERS = (1, 2, 4)
FIO = {"ioengine": "psync", "invalidate": 0, "disk_util": 0, "allow_file_create": 0,
       "group_reporting": 1, "percentile_list": "50:98:99.9"}
# Whole objects with fio: it only issues reads that fit in the file, so
# random lengths of 1..1 KiB (bs_unaligned) read every byte (1 KiB, not
# 4: fio draws lengths until one fits, CPU per object grows with it);
# sequential over a shuffled list, since random file choice costs fio
# O(files) per switch with openfiles=1. The latency log's reads at offset
# 0 are each object's first read. disk_util=0: fio would lstat() every
# file after the cold reset; invalidate=0: it would drop pages on open.
OBJECTS = {"rw": "read", "bs_unaligned": 1, "bsrange": "1-1k", "file_service_type": "sequential",
           "openfiles": 1, "log_offset": 1}


def plural(n, word):
    return f"{n} {word}{'s' if n > 1 else ''}"


MEASURES = [  # key, label, unit, target groups, run(bench, target)
    ("c-cached", "C reader (open_read.c), cached, 1 thread", "objects/s", "main null",
     lambda b, t: b.read(t, 1, "c", warm=True)),
    ("c-cold", "C reader, cold, 1 thread", "objects/s", "main null", lambda b, t: b.read(t, 1, "c")),
    *[(f"py{n}", f"Python open().read(), cold, {plural(n, 'reader')}", "objects/s",
       "main workers" + " null" * (n < 16), lambda b, t, n=n: b.read(t, n, "python")) for n in READERS],
    ("py1-raw", "Python open(buffering=0).read(), cold, 1 reader", "objects/s", "main null",
     lambda b, t: b.read(t, 1, "raw")),
    ("fio-warm", "fio --opendir randread 1..1024 B, warm, 2 jobs", "reads/s", "main workers",
     lambda b, t: b.fio_warm(t)),
    ("rsync", "rsync -a, cold", "objects/s", "main workers", lambda b, t: b.tool(t, "rsync")),
    ("tar", "tar -cf - | wc -c, cold", "objects/s", "main", lambda b, t: b.tool(t, "tar")),
    ("sha", "find | xargs -0 -P4 sha256sum, cold", "objects/s", "main", lambda b, t: b.tool(t, "sha")),
    *[(f"fio-cold-{j}", f"fio whole objects, random order, cold, {plural(j, 'job')}", "objects/s",
       "main" + " workers" * (j != 4), lambda b, t, j=j: b.objects(t, b.ds, j)) for j in JOBS],
    *[(f"mix-cold-{j}", f"fio whole objects of mix, cold, {plural(j, 'job')}", "objects/s", "mix",
       lambda b, t, j=j: b.objects(t, b.mix, j)) for j in JOBS],
    *[(f"4k-warm-{j}", f"fio 4 KiB random reads in large objects, warm, {plural(j, 'job')}", "reads/s",
       "large", lambda b, t, j=j: b.blocks(t, j, warm=True)) for j in JOBS],
    *[(f"seq-cold-{j}", f"fio 1 MiB sequential reads of large objects, cold, {plural(j, 'job')}", "MB/s",
       "large", lambda b, t, j=j: b.blocks(t, j, warm=False)) for j in JOBS],
    ("mixed-cold", "mixed load: 4 object readers, 2 streamers, cold", "objects/s", "large",
     lambda b, t: b.mixed(t, cold=True)),
    ("mixed-warm", "mixed load: 4 object readers, 2 streamers, warm", "objects/s", "large",
     lambda b, t: b.mixed(t, cold=False)),
]
LABEL = {m[0]: f"{m[1]}, {m[2]}".replace("|", "\\|") for m in MEASURES}  # Markdown cells


def shuffled(ds):
    """The keys of `ds` in a seeded random order."""
    return random.Random("bench-mount").sample(ds.keys, ds.count)


def fio_job(path, sections, **common):
    """Write a fio job file: [global] FIO and `common`, then each (name,
    options, files) section; an option None is a flag (new_group), files
    become filename= lines under fio's 4,096-character limit."""
    def opts(d):
        return [k if v is None else f"{k}={v}" for k, v in d.items()]
    lines = ["[global]", *opts({**FIO, **common})]
    for name, options, files in sections:
        lines += ["", f"[{name}]", *opts(options)]
        cur = []
        for f in files:
            if cur and sum(len(x) + 1 for x in cur) + len(f) > 3900:
                lines.append("filename=" + ":".join(cur))
                cur = []
            cur.append(f)
        if cur:
            lines.append("filename=" + ":".join(cur))
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")


def percentiles(ns, read=None):
    """p50/p98/p99.9/max in ms of sorted latencies `ns` (nearest rank), or
    of fio's clat of `read` (a block job's report)."""
    if read is not None:
        got, clat = read["clat_ns"].get("percentile", {}), read["clat_ns"]
        out = {f"p{p}_ms": got.get(f"{float(p):.6f}", 0) / 1e6 for p in (50, 98, 99.9)}
        return {**out, "max_ms": clat["max"] / 1e6}
    if not ns:
        return {}
    at = {p: ns[min(len(ns), max(1, math.ceil(p / 100 * len(ns)))) - 1] / 1e6 for p in (50, 98, 99.9)}
    return {**{f"p{p}_ms": round(v, 4) for p, v in at.items()}, "max_ms": round(ns[-1] / 1e6, 4)}


class Bench:
    def __init__(self, args):
        self.args = args
        self.runtime = 2 if args.quick else 3  # seconds of the time-based fio runs
        self.ds = h.dataset("small", 5000 if args.quick else 20000)
        self.names = shuffled(self.ds)
        self.res = h.Results("mount", "Reading through the mount: shardfs against plain files, erofs, "
                             "squashfuse_ll, an older shardfs and the FUSE floor", args.quick, sys.argv[1:])
        main = h.standard_targets(self.ds, MNT, ["shardfs", "before", "plain", "erofs", "squash"],
                                  args.before_venv)
        for t in main:
            if t.key == "before" and not t.error:
                rev = h.sh(["git", "-C", args.before_venv, "rev-parse", "--short", "HEAD"]).decode().strip()
                t.label = f"shardfs before ({rev})"
        self.groups = {"main": main, "null": h.standard_targets(self.ds, MNT, ["null"]), "workers": [],
                       "mix": [], "large": []}
        self.default_workers = 0
        for t in main + self.groups["null"]:
            self.check(t, self.ds)
        for n in WORKERS:
            if n != self.default_workers:
                t, = h.standard_targets(self.ds, f"{MNT}/w{n}", ["shardfs"], options=[f"workers={n}"])
                t.key, t.label, t.workers = f"w{n}", f"shardfs workers={n}", n
                self.groups["workers"].append(t)
                self.check(t, self.ds)
        if not args.quick and any(self.wanted(m[0]) for m in MEASURES if m[3] in ("mix", "large")):
            try:
                self.mix, self.large = h.dataset("mix", 10000), h.dataset("large", 8)
            except h.Skip as exc:
                self.res.errors["mix and large datasets"] = str(exc)
                return
            for group, ds in (("mix", self.mix), ("large", self.large)):
                self.groups[group] = h.standard_targets(ds, f"{MNT}/{group}", ["shardfs", "plain"])
                for t in self.groups[group]:
                    self.check(t, ds)
            for t in self.groups["large"]:  # the mixed job's object readers
                t.partner = next(x for x in main if x.key == t.key)

    def wanted(self, key):
        return not self.args.only or any(key.startswith(o) for o in self.args.only)

    def targets(self):
        return [t for g in self.groups.values() for t in g]

    def check(self, t, ds):
        """Mounted, lists every object, 20 of them hash to their names; a
        shardfs mount's sidecar and index built before any figure."""
        if t.error:
            self.res.errors[f"target {t.key}"] = t.error
            return
        try:
            t.fresh()
            if t.kind == "null":
                return
            if len(os.listdir(t.path)) != ds.count:
                raise RuntimeError("wrong listing")
            for key in random.Random(0).sample(ds.keys, min(20, ds.count)):
                with open(os.path.join(t.path, key), "rb") as f:
                    if hashlib.file_digest(f, "sha256").hexdigest() != key:
                        raise RuntimeError(f"{key}: wrong content")
            if t.kind == "shardfs" and t.wait_ready()[0] is None:
                raise RuntimeError("no sidecar after 600 s")
            if t.key == "shardfs" and ds is self.ds:
                t.workers = self.default_workers = len((t.xattr("stats") or {}).get("workers", ()))
                t.label = f"shardfs (default: workers={t.workers})"
        except (OSError, RuntimeError) as exc:
            t.error = f"cannot be used: {exc}"
            self.res.errors[f"target {t.key}"] = t.error
            h.log(f"{t.label}: {t.error}")
        finally:
            t.umount()

    # -------------------------------------------------------------- measures

    @staticmethod
    def snap(t):
        return (*t.cpu(), t.xattr("requests") or {})

    def usage(self, t, since, n):
        """Serving CPU µs per object (FUSE targets) and shardfs's FUSE
        requests per object from `since` (a snap) to now."""
        u0, s0, r0 = since
        u1, s1, r1 = self.snap(t)
        out = {"cpu_user_us": round((u1 - u0) / n * 1e6, 2), "cpu_system_us": round((s1 - s0) / n * 1e6, 2),
               "cpu_us": round((u1 - u0 + s1 - s0) / n * 1e6, 2)} if t.fuse else {}
        req = {k: d for k, v in r1.items() if (d := round((v - r0.get(k, 0)) / n, 3))}
        return {**out, "requests": req} if r1 else out  # r1: a shardfs mount

    def read(self, t, procs, mode, warm=False):
        """Every object read once by `procs` readers (harness.read_files);
        warm: after an untimed pass, else cold."""
        since = []

        def before():
            if warm:
                t.fresh()
                h.read_files(t.path, self.names, 1, "c")
            else:
                t.cold()
            since.append(self.snap(t))
        r = h.read_files(t.path, self.names, procs, mode, before=before)
        want = 1024 * self.ds.count if t.kind == "null" else self.ds.total_bytes
        if r["bytes"] != want:
            raise RuntimeError(f"read {r['bytes']:,} bytes, expected {want:,}")
        return {"value": r["objects"] / r["seconds"], "seconds": round(r["seconds"], 4),
                **self.usage(t, since[0], r["objects"])}

    def fio(self, sections, cold=(), **common):
        """Run the job (harness.fio); cold: the FUSE targets of `cold`
        remounted and the caches dropped by the first job done with its
        setup. (jobs' reports, sorted first-read latencies in ns, MB the
        data's disk read during the run, its setup and reset included)."""
        lat = os.path.join(MNT, "lat")
        shutil.rmtree(lat, ignore_errors=True)
        os.makedirs(lat)
        for _, options, _ in sections:
            if "log_offset" in options:
                options["write_lat_log"] = os.path.join(lat, "objects")
        done = os.path.join(lat, "reset.done")
        if cold:
            script = [f"exec 9>{lat}/reset.lock", "flock 9", f"[ -e {done} ] && exit 0"]
            for t in cold:
                if t.fuse:  # 9>&-: the server must not hold the lock; nor fio's pipes
                    script += [f"{shlex.join(t.umount_cmd())} 9>&- || exit 1",
                               f"{shlex.join(t.mount_cmd())} </dev/null >/dev/null 2>&1 9>&- || exit 1"]
            with open(os.path.join(lat, "reset.sh"), "w") as f:
                f.write("\n".join(script + ["sync", "echo 3 > /proc/sys/vm/drop_caches || exit 1",
                                            f"touch {done}", ""]))
            common["exec_prerun"] = f"sh {lat}/reset.sh"
        fio_job(os.path.join(MNT, "job.fio"), sections, **common)
        dev = h.device_reads(h.DATA)[1]
        jobs = h.fio(["--eta=never", os.path.join(MNT, "job.fio")])["jobs"]
        if any(j["error"] for j in jobs):
            raise RuntimeError(f"fio error {next(j['error'] for j in jobs if j['error'])}")
        if cold and not os.path.exists(done):
            raise RuntimeError("fio's cold reset did not run")
        first = []
        for name in os.listdir(lat):
            if name.startswith("objects_clat."):
                with open(os.path.join(lat, name), "rb") as f:  # time, ns, read, size, offset 0
                    first += map(int, re.findall(rb"^\d+, (\d+), 0, \d+, 0,", f.read(), re.M))
        return jobs, sorted(first), round((h.device_reads(h.DATA)[1] - dev) / 1e6, 1)

    def fio_warm(self, t):
        t.fresh()
        h.read_files(t.path, self.names, 1, "c")  # names and pages cached
        since, nofile = self.snap(t), resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        jobs, _, _ = self.fio([("warm", {"opendir": t.path, "rw": "randread", "bsrange": "1-1k",
                                         "bs_unaligned": 1, "numjobs": 2, "time_based": 1, "runtime": self.runtime,
                                         "openfiles": min(self.ds.count, nofile - 256)}, [])])
        read = jobs[0]["read"]
        return {"value": read["iops"], "reads": read["total_ios"], **self.usage(t, since, read["total_ios"])}

    def tool(self, t, m):
        dest, q = os.path.join(MNT, "copy"), shlex.quote(t.path)
        shutil.rmtree(dest, ignore_errors=True)
        cmd = {"rsync": ["rsync", "-a", t.path + "/", dest + "/"], "tar": f"tar -cf - -C {q} . | wc -c",
               "sha": f"find {q} -type f -print0 | xargs -0 -P4 sha256sum"}[m]
        try:
            t.cold()
            since, t0 = self.snap(t), time.monotonic()
            out = h.sh(cmd, timeout=1800).decode()
            wall, n = time.monotonic() - t0, self.ds.count
            if m == "rsync":
                files = [e.stat().st_size for e in os.scandir(dest)]
                if (len(files), sum(files)) != (n, self.ds.total_bytes):
                    raise RuntimeError(f"the copy has {len(files)} files, {sum(files):,} bytes")
            elif m == "tar" and int(out) < self.ds.total_bytes:
                raise RuntimeError(f"the archive has {int(out):,} bytes only")
            elif m == "sha" and sorted(ln[:64] for ln in out.splitlines()) != sorted(self.ds.keys):
                raise RuntimeError("sha256sum: a file is missing or does not hash to its name")
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        return {"value": n / wall, "seconds": round(wall, 4), **self.usage(t, since, n)}

    def objects(self, t, ds, jobs):
        """fio whole objects, cold, `jobs` jobs on disjoint shares."""
        t.fresh()  # fio's setup stats every file: mounted
        run, first, dev = self.fio([(f"objects.{i}", {**OBJECTS, "directory": t.path}, s)
                                    for i, s in enumerate(h.shares(shuffled(ds), jobs))], cold=[t], runtime=1800)
        read = run[0]["read"]
        if (len(first), read["io_bytes"]) != (ds.count, ds.total_bytes):
            raise RuntimeError(f"fio read {len(first)} objects, {read['io_bytes']:,} bytes")
        seconds = read["runtime"] / 1000
        return {"value": ds.count / seconds, "seconds": seconds, "device_mb": dev, **percentiles(first),
                **self.usage(t, (0, 0, {}), ds.count)}  # the server started in the reset

    def blocks(self, t, jobs, warm):
        """Large objects, `jobs` jobs on disjoint slices of each: 4 KiB
        random reads kept open (warm), or 1 MiB sequential reads (cold)."""
        t.fresh()
        if warm:
            h.read_files(t.path, self.large.keys, 1, "c")
        since = self.snap(t)
        pattern = {"rw": "randread", "bs": "4k", "file_service_type": "random", "time_based": 1,
                   "runtime": self.runtime} if warm else \
            {"rw": "read", "bs": "1m", "file_service_type": "sequential", "openfiles": 1, "runtime": 1800}
        run, _, dev = self.fio([("blocks", {**pattern, "directory": t.path, "numjobs": jobs,
                                            "size": f"{100 // jobs}%", "offset_increment": f"{100 // jobs}%"},
                                 self.large.keys)], cold=() if warm else [t])
        read = run[0]["read"]
        return {"value": read["iops"] if warm else read["bw_bytes"] / 1e6, "reads": read["total_ios"],
                "mb_s": round(read["bw_bytes"] / 1e6, 1), "device_mb": dev, **percentiles(None, read),
                **self.usage(t, since if warm else (0, 0, {}), read["total_ios"])}

    def mixed(self, t, cold):
        """4 readers of whole small objects (t.partner) while 2 jobs stream
        the large ones (t) with 1 MiB reads, for `runtime` seconds (cold: a
        reader stops when its share is read)."""
        small = t.partner
        for x in (small, t):
            x.fresh()
        if not cold:
            h.read_files(small.path, self.names, 1, "c")
            h.read_files(t.path, self.large.keys, 1, "c")
        sections = [(f"objects.{i}", {**OBJECTS, "directory": small.path, "time_based": int(not cold)}, s)
                    for i, s in enumerate(h.shares(self.names, 4))]
        sections.append(("stream", {"new_group": None, "directory": t.path, "rw": "read", "bs": "1m",
                                    "file_service_type": "sequential", "openfiles": 1, "numjobs": 2,
                                    "size": "50%", "offset_increment": "50%", "time_based": 1}, self.large.keys))
        run, first, dev = self.fio(sections, cold=[small, t] if cold else (), runtime=self.runtime)
        seconds = run[0]["read"]["runtime"] / 1000
        return {"value": len(first) / seconds, "objects": len(first), "device_mb": dev, **percentiles(first),
                "stream_mb_s": round(run[1]["read"]["bw_bytes"] / 1e6, 1)}

    # ------------------------------------------------------------------- run

    def run(self):
        for key, _, _, groups, fn in MEASURES:
            if not self.wanted(key):
                continue
            items = [t for g in groups.split() for t in self.groups[g] if not t.error
                     and not (g == "large" and key.startswith("mixed") and t.partner.error)]
            h.rounds(self.args.rounds, items, lambda r, t: self.once(key, fn, r, t))

    def once(self, key, fn, r, t):
        try:
            self.res.attempt(key, t.key, r, lambda: fn(self, t))
        finally:
            for x in (t, getattr(t, "partner", None)):
                if x is not None:
                    x.umount()

    # ---------------------------------------------------------------- report

    def report(self):
        res, ds = self.res, self.ds
        small = [m[0] for m in MEASURES if set(m[3].split()) & {"main", "null"}]
        shown = self.groups["main"] + self.groups["null"]
        others = [t for t in shown if t.key not in ("plain", "null")]
        versions = "; ".join(f"{p} {h.deb_version(p)}" for p in ("fuse3", "squashfuse", "erofs-utils",
                                                                "squashfs-tools", "fio", "rsync"))
        if self.args.before_venv:
            versions += f"; before: {self.args.before_venv}"
        res.text(f"Small objects: {ds.count:,} of {min(ds.sizes):,}..{max(ds.sizes):,} B ({ds.total_bytes / 1e6:.1f} "
                 f"MB). Figures: median of {self.args.rounds} interleaved round(s); ratios: the median of each "
                 "round's ratio; every run in mount.json. The FUSE floor serves 1 KiB of zeros per name (no ratio). "
                 f"Versions: {versions}.")

        def cell(m, key, base):  # figure (ratio to base's)
            return f"{h.fmt(res.value(m, key))} ({h.times(res.ratio_of_rounds(m, key, base))})"
        res.table(["measure", *[t.label for t in shown], *[f"{t.label} / plain" for t in others]],
                  [[LABEL[m], *[h.fmt(res.value(m, t.key)) for t in shown],
                    *[h.times(res.ratio_of_rounds(m, t.key, "plain")) for t in others]] for m in small],
                  "### Small objects through each target")
        cpu = ["py4", "py16", "rsync", "fio-cold-16"]
        res.table(["target", "py1 user", "py1 system", "py1 total", *cpu, "FUSE requests per object (py1)"],
                  [[t.label, *[h.fmt(res.value("py1", t.key, k), 1) for k in ("cpu_user_us", "cpu_system_us")],
                    *[h.fmt(res.value(m, t.key, "cpu_us"), 1) for m in ["py1", *cpu]], requests(res, "py1", t.key)]
                   for t in shown + self.groups["workers"] if t.fuse],
                  "### Serving CPU µs per cold object (fio-cold: the server's start included)")
        sf = [t for t in shown if t.kind == "shardfs"]
        res.table(["measure", *[t.label for t in sf]],
                  [[LABEL[m[0]], *[requests(res, m[0], t.key) for t in sf]] for m in MEASURES if "main" in m[3]],
                  "### FUSE requests per object counted by shardfs (user.shardfs.requests, during the timed run)")
        if self.groups["workers"]:
            wt = sorted(self.groups["workers"] + [t for t in shown if t.key == "shardfs" and not t.error],
                        key=lambda t: t.workers) + [t for t in shown if t.key == "squash"]
            cols = ["py1", "py4", "py16", "fio-warm", "rsync", "fio-cold-1", "fio-cold-16"]
            res.table(["target", *cols, "fio-cold 16 jobs / 1 job"],
                      [[t.label, *[cell(c, t.key, "squash") for c in cols],
                        h.times(h.ratio(res.value("fio-cold-16", t.key), res.value("fio-cold-1", t.key)))]
                       for t in wt], "### Workers: objects/s (reads/s for fio-warm) and × squashfuse_ll")
        big = [m[0] for m in MEASURES if m[3] in ("mix", "large") and res.values(m[0], "shardfs")]
        if big:
            lat = [(k, w) for k in ("p98_ms", "max_ms") for w in ("shardfs", "plain")]
            res.table(["measure", "shardfs (× plain files)", "plain files", *[f"{w} {k[:-3]} ms" for k, w in lat]],
                      [[LABEL[m], cell(m, "shardfs", "plain"), h.fmt(res.value(m, "plain")),
                        *[h.fmt(res.value(m, w, k), 3) for k, w in lat]] for m in big],
                      f"### fio on the mix ({self.mix.count:,} objects, {self.mix.total_bytes / 1e6:,.0f} MB) and "
                      f"large ({self.large.count} objects, {self.large.total_bytes / 1e6:,.0f} MB) datasets "
                      "(latency: of each object's first read for object jobs, of each read for block jobs)")
        res.plot("ratios", lambda ax: self.draw(ax, small, others))
        self.goals()
        res.write()

    def draw(self, ax, measures, others):
        width = 0.8 / max(1, len(others))
        for i, t in enumerate(others):
            ys = [self.res.ratio_of_rounds(m, t.key, "plain") or 0 for m in measures]
            ax.bar([j + (i - (len(others) - 1) / 2) * width for j in range(len(measures))], ys, width, label=t.label)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="plain files = 1")
        ax.set_yscale("log")
        ax.set_ylim(top=ax.get_ylim()[1] * 4)  # room for the legend
        ax.set_xticks(range(len(measures)), measures, rotation=30, fontsize=8)
        ax.set_ylabel("figure / plain files' (median of rounds)")
        ax.set_title("Small objects, each target against plain files (higher is better)")
        ax.legend(fontsize=7, ncol=3, loc="upper center")

    def goals(self):
        res = self.res
        for text, m, base, need in (
                ("C reader cached >= 0.6x plain files", "c-cached", "plain", 0.6),
                ("Python open().read() cold, 1 reader >= 0.8x plain files", "py1", "plain", 0.8),
                ("Python open().read() cold, 4 readers >= 1.5x squashfuse_ll", "py4", "squash", 1.5),
                ("warm fio --opendir randread >= 0.95x plain files", "fio-warm", "plain", 0.95),
                ("cold rsync -a >= 1x plain files", "rsync", "plain", 1.0),
                ("cold tar -cf >= 1x plain files", "tar", "plain", 1.0),
                ("cold find|xargs sha256sum >= 1x plain files", "sha", "plain", 1.0)):
            r, before = res.ratio_of_rounds(m, "shardfs", base), res.ratio_of_rounds(m, "before", base)
            res.goal(text, r, ">=", need, f"{h.times(r)} (medians {h.fmt(res.value(m, 'shardfs'))} against "
                     f"{h.fmt(res.value(m, base))}; before {h.times(before)})")
        cpu = res.value("py1", "shardfs", "cpu_us")
        res.goal("serving CPU per cold object (py1) <= 10 us", cpu, "<=", 10,
                 f"{h.fmt(cpu, 1)} us (FUSE floor {h.fmt(res.value('py1', 'null', 'cpu_us'), 1)} us, "
                 f"before {h.fmt(res.value('py1', 'before', 'cpu_us'), 1)} us)")
        best = max(((res.value(f"fio-cold-{j}", "shardfs"), j) for j in JOBS
                    if res.value(f"fio-cold-{j}", "shardfs")), default=(None, 0))
        res.goal("cold whole-object fio reads >= 10,000/s (best of 1/4/16 jobs)", best[0], ">=", 10000,
                 f"{h.fmt(best[0])}/s with {plural(best[1], 'job')}")
        a, b = res.value("fio-cold-16", "shardfs"), res.value("fio-cold-1", "shardfs")
        res.goal("cold whole-object fio reads at 16 jobs >= 3x the 1-job figure", h.ratio(a, b), ">=", 3,
                 f"{h.fmt(a)} against {h.fmt(b)}/s = {h.times(h.ratio(a, b))}")
        keys = ["shardfs"] + [t.key for t in self.groups["workers"]]
        have = sum(res.value(f"py{n}", k) is not None for k in keys for n in READERS)
        res.goal(f"workers x readers table of cold open().read() (workers {'/'.join(map(str, WORKERS))} x readers "
                 f"{'/'.join(map(str, READERS))})", have, ">=", len(WORKERS) * len(READERS),
                 f"{have}/{len(WORKERS) * len(READERS)} figures")
        best = [max(filter(None, (res.value(f"4k-warm-{j}", w) for j in JOBS)), default=None)
                for w in ("shardfs", "plain")]
        r = h.ratio(*best)
        res.goal("warm 4 KiB random reads in large objects >= 50% of plain files (best of 1/4/16 jobs each)",
                 r, ">=", 0.5, f"{h.fmt(best[0])} against {h.fmt(best[1])} reads/s = {h.fmt(r and 100 * r)}%")
        for k, need, unit in (("p98_ms", 10, "ms"), ("max_ms", 1000, "ms")):
            worst = max(filter(None, (res.value(m, "shardfs", k) for m in ("mixed-cold", "mixed-warm"))), default=None)
            res.goal(f"objects read under the mixed load, {k[:-3]} < {need:,} {unit} (worst of cold and warm)",
                     worst, "<=", need, f"{h.fmt(worst, 2)} {unit}")


def requests(res, measure, target):
    """Requests per object of the first run that counted them."""
    req = next((r["requests"] for r in res.runs if r["measure"] == measure and r["target"] == target
                and "requests" in r), None)
    if req is None:
        return "—"
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(req.items()) if v >= 0.005) or "none"


def main():
    args = h.main_args(__doc__.split("\n\n")[0], extra=lambda p: p.add_argument(
        "--before-venv", default="", help="venv of another shardfs checkout (e.g. /work/before/.venv)"))
    if os.geteuid() != 0:
        sys.exit("bench_mount: must run as root (mounts, drop_caches)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below runs
    os.makedirs(MNT, exist_ok=True)
    os.chdir(MNT)  # fio writes each job's exec_prerun output to ./JOB.prerun.txt
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # fio --opendir keeps every file open
    bench = None
    try:
        bench = Bench(args)
        bench.run()
    finally:
        for t in bench.targets() if bench else ():
            t.umount()
    bench.report()


if __name__ == "__main__":
    main()
