"""Many shards: the same objects as 1 shard and as N shards, in Python and
through a `--shard-dir` mount (issues 4 and 11).

Objects: harness.dataset("tiny") (16..256 B), split by harness.split into
N shards of consecutive objects. Quick: 100,000 objects as 1, 100 and
1,000 shards, 50,000 keys per Python pass, 10,000 names per stat pass;
full: 1,000,000 as 1, 1,000, 10,000 and 100,000 shards (`--shards` for
others), 200,000 keys, 50,000 names; 100,000 reads in both. Shard
files are read into the page cache before each start or open: "cold"
below means an empty sidecar and index cache, not dropped kernel caches.

Measures (medians of `--rounds` interleaved rounds, the N rotated; every
run in shards.json):

- **python** (`--only` takes these names): `ShardSet.find`, one thread, of random present keys and of
  random absent keys (32 random bytes): lookups/s, index probes per lookup
  (`ShardSet.probes / lookups`) and wrong answers (a present key not found,
  an absent one found; first, untimed, 2,000 present keys checked for the
  object's size and 2,000 absent ones; then an untimed warm-up pass).
  *index*: every shard in the global index (`IndexSet.add_shards`, timed);
  *filters*: no index, every sidecar built (timed), each lookup asking
  every shard's filter (a pass stops after its time budget). The sets of
  the N interleaved are open at once: the N are grouped to fit
  `default_max_open()` descriptors, and *filters* are skipped above it.
- **levels**: the global index's level writer and merger on synthetic
  40-bit entries (files in /dev/shm): M entries/s, bytes per entry.
- **mount** (`shardfs mount --shard-dir D -o layout=flat,cache_dir=C`; D
  holds hard links to the N shards): *start cold* = wall seconds until
  `shardfs mount` returns with a fresh, empty cache directory, then
  seconds until every sidecar is built and until the global index covers
  every shard (`Target.wait_ready`); *start warm* = the same with the
  cache the first cold run left. Index and sidecar bytes per object (that
  cache). On warm mounts of every N, up at once: `os.stat` of present
  names (size checked) and of absent names (ENOENT), 4 threads, each name
  used once per mount: stat()s/s, index probes per lookup (Δindex_probes /
  Δlookups of the `user.shardfs.stats` xattr). Then 2 × reads/2 objects
  read (open, read, close; SHA-256 checked), 4 threads: objects/s. Memory
  (MiB, /proc status) of the mount's process (coordinator, workers) with
  the largest RssAnon:
  after the cold mount, its peak while sidecars and index build (sampled
  every 50 ms), after the warm mount, after each half of the reads. Per
  process after the reads: descriptors, maps, RssAnon, RssFile. Live
  pickup (largest N): a new shard renamed into D, seconds until its
  object is served, and until the index covers it. `shardfs --version`:
  the CLI's start-up, part of every start time.

Goals (the largest N ≤ 10,000 against 1 shard of the same objects):
absent-key index probes < 0.1 per lookup (ShardSet.find with the index;
the mount); N shards ≥ 0.8× one shard (present and absent; ShardSet.find
with the index; stat through the mount); the mount answers < 5 s with N
shards (cold and warm cache); < 0.5 s with the one big shard (cold and
warm); daemon RssAnon < 64 MiB once serving and its growth < 1 MiB over
the second half of the reads (1 shard and N); no wrong answer.

A/B of another checkout (its C extension built in place):
`--pythonpath DIR` runs everything (this process, the mounts) on DIR's
shardfs and writes shards_pythonpath.md instead; run it alternately with
`--pythonpath $PWD`.
"""
from __future__ import annotations

import hashlib
import os
import random
import resource
import shutil
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402

WORK = "/tmp/bench-shards"
PLANS = {"quick": dict(objects=100_000, shards=[1, 100, 1000], keys=50_000, stats=10_000, reads=100_000,
                       budget=2.0),
         "full": dict(objects=1_000_000, shards=[1, 1000, 10_000, 100_000], keys=200_000, stats=50_000, reads=100_000,
                      budget=5.0)}
THREADS = 4
CHECK = 2000


def extra_args(p) -> None:
    p.add_argument("--shards", default="", help="comma-separated shard counts (default: the set's)")
    p.add_argument("--pythonpath", default="", help="run on the shardfs of this checkout (A/B)")


# ------------------------------------------------------------------ python


def warm_files(paths) -> None:
    """Read the files whole: in the page cache again (others may have
    dropped the caches), so that start and add times do not wait for the disk."""
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass


def find_pass(ss, keys, budget: float):
    """ShardSet.find over `keys` (until `budget` s): lookups, s, found, probes/lookup."""
    ss.lookups = ss.probes = 0
    find, found, t0, perf = ss.find, 0, time.perf_counter(), time.perf_counter
    for i in range(0, len(keys), 1000):
        for k in keys[i:i + 1000]:
            if find(k) is not None:
                found += 1
        if perf() - t0 > budget:
            break
    dt = perf() - t0
    return ss.lookups, dt, found, ss.probes / max(ss.lookups, 1)


def open_set(res, how: str, n: int, paths, present, check, absent, budget: float):
    """A ShardSet over `paths`, with the global index and the lookup
    records, or every sidecar, built, checked, then warmed by an untimed
    pass of each kind."""
    from shardfs.shardset import ShardSet
    from shardfs.gindex import IndexSet, index_dir
    from shardfs.lookups import LookupSet, lookup_dir
    cache = f"{WORK}/py-{how}-{n}"
    shutil.rmtree(cache, ignore_errors=True)
    warm_files(paths)
    ss = ShardSet(cache_dir=cache)
    if how == "index":
        ss.index = IndexSet(index_dir(cache, "bench"))
        ss.index.load()
    t0 = time.perf_counter()
    for p in paths:
        ss.add(p)
    t1 = time.perf_counter()
    if how == "index":
        served = ss.served()
        ss.index.add_shards(((m.identity, m.shard) for m in served), [m.identity for m in served])
        ss.reload_index()
        done = sum(m.indexed for m in served)
        ss.records = LookupSet(lookup_dir(cache, "bench"))  # what a mount's builder writes
        ss.build_records()
    else:
        for m in ss.served():
            ss.build_sidecar(m)
        done = sum(m.filter is not None for m in ss.served())
    t2 = time.perf_counter()
    wrong = sum((r := ss.find(k, count=False)) is None or r[3] != size for k, size in check)
    wrong += sum(ss.find(k, count=False) is not None for k in absent[:CHECK])
    res.add(f"build {how}", str(n), t2 - t1, add_seconds=t1 - t0, ready=done, wrong=wrong,
            levels=(ss.index.stats()["levels"] if how == "index" else None))
    for keys in (present, absent):
        find_pass(ss, keys, budget)
    return ss


def python_level(res, ds, dirs, plan, rounds: int) -> None:
    from shardfs.shardset import default_max_open
    rng = random.Random(2)
    sample = rng.sample(range(ds.count), plan["keys"])
    present = [bytes.fromhex(ds.keys[i]) for i in sample]
    absent = [rng.randbytes(32) for _ in sample]
    check = [(present[j], ds.sizes[i]) for j, i in enumerate(sample[:CHECK])]
    bound, groups = default_max_open(), [[]]
    for n in sorted(dirs):  # sets open at once must fit the descriptors
        if sum(groups[-1]) + n > bound:
            groups.append([])
        groups[-1].append(n)
    for group in groups:
        for how in ("index", "filters"):
            sets = {}
            try:
                for n in group:
                    if how == "filters" and n > bound:
                        res.errors[f"find {how}/{n}"] = f"every sidecar mapped at once: more than {bound:,}"
                        continue

                    def opened():
                        sets[n] = open_set(res, how, n, dirs[n], present, check, absent, plan["budget"])
                    res.attempt(f"build {how}", str(n), 0, opened)

                def run(r, n):
                    for kind, keys in (("present", present), ("absent", absent)):
                        done, dt, found, ppl = find_pass(sets[n], keys, plan["budget"])
                        res.add(f"find {kind} {how}", str(n), done / dt, r, probes_per_lookup=ppl,
                                lookups=done, wrong=done - found if kind == "present" else found)
                h.rounds(rounds, sorted(sets), run)
            finally:
                for ss in sets.values():
                    ss.close()
                    if ss.index is not None:
                        ss.index.close()


def levels(res, rounds: int) -> None:
    """Write a level of 2M entries from 10 and from 1,000 shards; merge them."""
    import array
    from shardfs._shardfs import GlobalIndex, merge_global_index, write_global_index
    rnd = random.Random(1)
    inputs = {s: [(rnd.randbytes(32), array.array("Q", sorted({rnd.getrandbits(40) for _ in range(per)})).tobytes())
                  for _ in range(s)] for s, per in ((10, 200_000), (1000, 2000))}
    base = "/dev/shm" if os.path.isdir("/dev/shm") else WORK
    d = f"{base}/bench-shards-levels"
    os.makedirs(d, exist_ok=True)

    try:
        for r, what in ((r, what) for r in range(rounds) for what in (*inputs, "merge")):
            path, t0 = f"{d}/{what}.gidx", time.perf_counter()
            if what == "merge":
                merge_global_index(path, [GlobalIndex(f"{d}/{s}.gidx") for s in inputs])
            else:
                write_global_index(path, inputs[what])
            dt, count = time.perf_counter() - t0, GlobalIndex(path).count
            res.add("level " + ("merge" if what == "merge" else f"write from {what:,} shards"), "gindex",
                    count / dt / 1e6, r, entries=count, seconds=dt, bytes_per_entry=os.path.getsize(path) / count)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ mount


def largest(t) -> dict:
    """Memory (MiB) of the mount's process with the largest RssAnon."""
    mems = []
    for pid in t.pids():
        try:
            mems.append(h.memory(pid))
        except OSError:
            pass
    return max((m for m in mems if "RssAnon" in m), key=lambda m: m["RssAnon"], default={})


def processes(t) -> list:
    out = []
    for pid in t.pids():
        try:
            maps = sum(1 for _ in open(f"/proc/{pid}/maps"))
            out.append({"pid": pid, "fds": len(os.listdir(f"/proc/{pid}/fd")), "maps": maps, **h.memory(pid)})
        except OSError:
            pass
    return out


def dir_bytes(path: str, test) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs if test(r, f))


class Mounts:
    """The N-shard mounts: shard directories of hard links, caches, targets."""

    def __init__(self, dirs):
        self.paths, self.dirs, self.caches, self.up = dirs, {}, {}, {}
        for n, paths in dirs.items():
            d = self.dirs[n] = f"{WORK}/src{n}"
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            for p in paths:
                try:
                    os.link(p, f"{d}/{os.path.basename(p)}")
                except OSError:  # another filesystem
                    shutil.copyfile(p, f"{d}/{os.path.basename(p)}")

    def target(self, n: int, cache: str):
        return h.Target(str(n), f"{n:,} shards", "shardfs", f"{WORK}/mnt{n}", sources=["--shard-dir", self.dirs[n]],
                        options=["layout=flat", f"cache_dir={cache}"])

    def start(self, t) -> float:
        warm_files(self.paths[int(t.key)])
        t0 = time.monotonic()
        t.mount()
        return time.monotonic() - t0

    def cold(self, res, r: int, n: int) -> None:
        cache = f"{WORK}/cache{n}-{r}"
        shutil.rmtree(cache, ignore_errors=True)
        t = self.target(n, cache)
        try:
            secs, mem = self.start(t), largest(t)
            res.add("memory after cold mount", str(n), mem.get("RssAnon"), r, **mem)
            peak, stop = {}, threading.Event()

            def sample():
                while not stop.wait(0.05):
                    m = largest(t)
                    if m.get("RssAnon", 0) > peak.get("RssAnon", -1):
                        peak.update(m)
            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                t_sc, t_idx = t.wait_ready()
            finally:
                stop.set()
                sampler.join()
            st = t.xattr("stats") or {}
            res.add("start cold", str(n), secs, r, sidecars_after=t_sc, indexed_after=t_idx,
                    records_after=t.records_after, served=st.get("shards"), index=st.get("index"))
            res.add("memory peak while building", str(n), peak.get("RssAnon"), r, **peak)
            objects = st.get("objects") or 1
            res.add("index bytes/object", str(n), dir_bytes(cache, lambda r_, f: "/index-" in r_) / objects, r)
            res.add("sidecar bytes/object", str(n), dir_bytes(cache, lambda r_, f: f.endswith(".sidecar")) / objects, r)
            res.add("record bytes/object", str(n), dir_bytes(cache, lambda r_, f: "/lookup-" in r_) / objects, r)
        finally:
            t.umount()
        if n not in self.caches:
            self.caches[n] = cache

    def warm(self, res, r: int, n: int, keep: bool) -> None:
        t = self.target(n, self.caches[n])
        try:
            secs, mem = self.start(t), largest(t)
            res.add("memory after warm mount", str(n), mem.get("RssAnon"), r, **mem)
            _, t_idx = t.wait_ready()
            res.add("start warm", str(n), secs, r, indexed_after=t_idx, records_after=t.records_after)
        finally:
            if keep and h.mounted(t.path):
                self.up[n] = t
            else:
                t.umount()

    def stat_pass(self, res, r: int, n: int, kind: str, names) -> None:
        t, wrong = self.up[n], []

        def work(share):
            for name, size in share:
                try:
                    ok = os.stat(f"{t.path}/{name}").st_size == size
                except FileNotFoundError:
                    ok = size < 0
                if not ok:
                    wrong.append(name)
        before = t.xattr("stats")
        dt = h.threaded(work, names, THREADS)
        after = t.xattr("stats")
        lookups = after["lookups"] - before["lookups"]
        res.add(f"stat {kind}", str(n), len(names) / dt, r, names=len(names), wrong=len(wrong),
                probes_per_lookup=(after["index_probes"] - before["index_probes"]) / max(lookups, 1))

    def reads(self, res, n: int, names) -> None:
        t, wrong, half = self.up[n], [], len(names) // 2

        def work(share):
            for name in share:
                fd = os.open(f"{t.path}/{name}", os.O_RDONLY)
                try:
                    data = os.read(fd, 1 << 16)
                finally:
                    os.close(fd)
                if hashlib.sha256(data).hexdigest() != name:
                    wrong.append(name)
        base = largest(t)
        for i, part in enumerate((names[:half], names[half:])):
            wrong.clear()
            dt = h.threaded(work, part, THREADS)
            mem = largest(t)
            res.add(f"memory after {(i + 1) * half:,} reads", str(n), mem.get("RssAnon"), reads_per_s=len(part) / dt,
                    wrong=len(wrong), **mem)
            res.add(f"RssAnon growth {i + 1}/2", str(n), mem["RssAnon"] - base["RssAnon"],
                    reads=f"{i * half:,}..{(i + 1) * half:,}")
            base = mem
        procs = processes(t)
        res.add("processes", str(n), max(p["fds"] for p in procs), processes=procs)

    def live(self, res, n: int) -> None:
        """A new shard renamed into the served directory of N."""
        import shardfs
        t, data = self.up[n], b"a new object in a new shard %f" % time.time()
        key = hashlib.sha256(data).hexdigest()
        with shardfs.ShardWriter(f"{WORK}/new.shard") as w:
            w.add(bytes.fromhex(key), data)
        before = (t.xattr("stats")["index"] or {}).get("indexed_shards", 0)
        t0 = time.monotonic()
        os.rename(f"{WORK}/new.shard", f"{self.dirs[n]}/zz-new.shard")
        try:
            served = indexed = None
            while time.monotonic() - t0 < 120 and None in (served, indexed):
                if served is None and os.path.exists(f"{t.path}/{key}"):
                    served = time.monotonic() - t0
                    if open(f"{t.path}/{key}", "rb").read() != data:
                        raise RuntimeError("live pickup: wrong content")
                if (t.xattr("stats")["index"] or {}).get("indexed_shards", 0) > before:
                    indexed = time.monotonic() - t0
                time.sleep(0.02)
            res.add("live pickup served", str(n), served, indexed_after=indexed)
        finally:
            t.umount()
            self.up.pop(n)
            os.unlink(f"{self.dirs[n]}/zz-new.shard")

    def close(self) -> None:
        for t in self.up.values():
            t.umount()


def mount_level(res, ds, dirs, plan, rounds: int) -> None:
    ns, ms = sorted(dirs), Mounts(dirs)
    try:
        res.attempt("shardfs --version", "cli", 0,
                    lambda: {"value": min(h.timed([f"{h.VENV}/bin/shardfs", "--version"])["seconds"]
                                          for _ in range(3))})
        h.rounds(rounds, ns, lambda r, n: res.attempt("start cold", str(n), r, lambda: ms.cold(res, r, n)))
        ns = [n for n in ns if n in ms.caches]
        h.rounds(rounds, ns, lambda r, n: res.attempt(
            "start warm", str(n), r, lambda: ms.warm(res, r, n, keep=r == rounds - 1)))
        rng = random.Random(3)
        order = {n: rng.sample(range(ds.count), ds.count) for n in ms.up}
        s = plan["stats"]

        def stats(r, n):
            present = [(ds.keys[i], ds.sizes[i]) for i in order[n][r * s:(r + 1) * s]]
            absent = [(rng.randbytes(32).hex(), -1) for _ in range(s)]
            for kind, names in (("present", present), ("absent", absent)):
                res.attempt(f"stat {kind}", str(n), r, lambda: ms.stat_pass(res, r, n, kind, names))
        h.rounds(rounds, sorted(ms.up), stats)
        for n in sorted(ms.up):
            names = (order[n][rounds * s:] + order[n][:rounds * s])[:plan["reads"]]
            res.attempt("read", str(n), 0, lambda: ms.reads(res, n, [ds.keys[i] for i in names]))
        if ms.up:
            res.attempt("live pickup served", str(max(ms.up)), 0, lambda: ms.live(res, max(ms.up)))
    finally:
        ms.close()


# ------------------------------------------------------------------ report


LOOKUPS = ("find present index", "find absent index", "find present filters", "find absent filters",
           "stat present", "stat absent")


def report(res, ns, big: int, objects: int) -> None:
    def v(m, n, key="value", digits=0):
        return h.fmt(res.value(m, str(n), key), digits)

    def runs(m, n=None):
        return [x for x in res.runs if x["measure"] == m and (n is None or x["target"] == str(n))]

    def cell(m, n):
        rt = res.ratio_of_rounds(m, str(n), "1")
        return v(m, n) + (f" ({rt:.2f}×)" if n != 1 and rt else "")
    res.table(["shards", *(f"{m} /s" for m in LOOKUPS), "start cold s", "start warm s"],
              [[f"{n:,}", *(cell(m, n) for m in LOOKUPS), v("start cold", n, digits=3), v("start warm", n, digits=3)]
               for n in ns], f"{objects:,} objects as N shards: lookups per second (× one shard: median of the "
                             f"rounds' ratios; ShardSet.find one thread, stat {THREADS} threads), mount start; "
                             f"medians of {res.rounds} round(s)")
    res.table(["lookups", "shards", "index probes/lookup", "wrong", "every round /s"],
              [[m, f"{n:,}", v(m, n, "probes_per_lookup", 4), sum(x["wrong"] for x in runs(m, n)),
                ", ".join(h.fmt(x["value"]) for x in runs(m, n))] for m in LOOKUPS for n in ns if runs(m, n)])
    res.table(["shards", "shards added s", "index build s", "sidecars build s", "entries per index level", "wrong"],
              [[f"{n:,}", v("build index", n, "add_seconds", 2), v("build index", n, digits=2),
                v("build filters", n, digits=2),
                ", ".join(f"{e:,}" for x in runs("build index", n)[:1] for e in x["levels"]),
                sum(x["wrong"] for m in ("build index", "build filters") for x in runs(m, n))] for n in ns],
              f"Python sets: shards added, then indexed (IndexSet.add_shards) or every sidecar built; wrong: "
              f"of {CHECK:,} present keys (size checked) and {CHECK:,} absent ones")
    res.table(["shards", "cold s", "sidecars ready after s", "index complete after s", "records complete after s",
               "warm s", "warm: index complete after s", "warm: records complete after s", "index B/object",
               "sidecar B/object", "record B/object"],
              [[f"{n:,}", v("start cold", n, digits=3), v("start cold", n, "sidecars_after", 2),
                v("start cold", n, "indexed_after", 2), v("start cold", n, "records_after", 2),
                v("start warm", n, digits=3), v("start warm", n, "indexed_after", 2),
                v("start warm", n, "records_after", 2), v("index bytes/object", n, digits=2),
                v("sidecar bytes/object", n, digits=2), v("record bytes/object", n, digits=2)] for n in ns],
              f"Mount start: `shardfs mount` until it returns (`shardfs --version` alone: "
              f"{v('shardfs --version', 'cli', digits=3)} s), then until sidecars, index and lookup records cover every shard")
    phases = [m for m in dict.fromkeys(x["measure"] for x in res.runs) if m.startswith(("memory", "RssAnon"))]
    res.table(["shards", "when", "RssAnon", "VmRSS", "RssFile", "VmHWM", "reads/s"],
              [[f"{n:,}", m.removeprefix("memory "), v(m, n, digits=2), *(v(m, n, k, 1) for k in ("VmRSS", "RssFile",
                "VmHWM")), v(m, n, "reads_per_s")]
               for n in ns for m in phases if runs(m, n)],
              f"Memory of the mount's process with the largest RssAnon (MiB); reads: open, read, close, "
              f"{THREADS} threads")
    res.table(["shards", "pid", "descriptors", "maps", "RssAnon MiB", "RssFile MiB"],
              [[f"{n:,}", p["pid"], f"{p['fds']:,}", f"{p['maps']:,}", h.fmt(p["RssAnon"], 1), h.fmt(p["RssFile"], 1)]
               for n in ns for x in runs("processes", n) for p in x["processes"]],
              f"The mount's processes after the reads (limits: {resource.getrlimit(resource.RLIMIT_NOFILE)[0]:,} "
              f"descriptors, {int(open('/proc/sys/vm/max_map_count').read()):,} maps)")
    res.table(["level", "M entries/s", "entries", "bytes/entry"],
              [[m, v(m, "gindex", digits=1), v(m, "gindex", "entries"), v(m, "gindex", "bytes_per_entry", 3)]
               for m in dict.fromkeys(x["measure"] for x in res.runs) if m.startswith("level")],
              "Global index levels (synthetic 40-bit entries, files in /dev/shm)")
    for x in runs("live pickup served"):
        res.text(f"Live pickup at {int(x['target']):,} shards: a new shard renamed into the directory is served "
                 f"after {h.fmt(x['value'], 2)} s (negative entries are cached 1 s) and indexed after "
                 f"{h.fmt(x['indexed_after'], 2)} s.")
    goals(res, big)

    def draw(ax):
        for m in LOOKUPS:
            pts = [(n, res.value(m, str(n))) for n in ns if res.value(m, str(n))]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=m)
        ax.set(xscale="log", yscale="log", xlabel=f"shards ({objects:,} objects)", ylabel="lookups/s")
        ax.legend(fontsize=8, loc="lower left")
    if any(res.values(m, str(n)) for m in LOOKUPS for n in ns):
        res.plot("lookups", draw)


def goals(res, big: int) -> None:
    b, big_s = str(big), f"{big:,} shards"
    for what, m in (("ShardSet.find, global index", "find absent index"), ("mount", "stat absent")):
        x = res.value(m, b, "probes_per_lookup")
        res.goal(f"absent-key index probes per lookup < 0.1 ({big_s}, {what})", x, "<=", 0.1, h.fmt(x, 4))
    for what, m in (("ShardSet.find, global index", "find {} index"), ("stat through the mount", "stat {}")):
        for kind in ("present", "absent"):
            mk = m.format(kind)
            x = res.ratio_of_rounds(mk, b, "1")
            res.goal(f"{big_s} >= 0.8x one shard, {kind} ({what})", x, ">=", 0.8,
                     f"{h.fmt(res.value(mk, b))}/s vs {h.fmt(res.value(mk, '1'))}/s = {h.times(x)}")
    for n, limit in ((big, 5.0), (1, 0.5)):
        for cache in ("cold", "warm"):
            x = res.value(f"start {cache}", str(n))
            res.goal(f"mount answers < {limit:g} s, {n:,} shard{'s' * (n > 1)} ({cache} cache)", x, "<=", limit,
                     h.fmt(x, 3) + " s")
    for n in sorted({1, big}):
        what = f"{n:,} shard{'s' * (n > 1)}"
        x = max((r["value"] for r in res.runs if r["target"] == str(n) and r["value"] is not None and (
            r["measure"] == "memory after warm mount" or r["measure"].endswith(" reads"))), default=None)
        res.goal(f"daemon RssAnon < 64 MiB once serving ({what}, after the warm mount and the reads)", x, "<=", 64,
                 h.fmt(x, 1) + " MiB")
        g = next((r for r in res.runs if r["measure"] == "RssAnon growth 2/2" and r["target"] == str(n)), {})
        res.goal(f"daemon RssAnon growth < 1 MiB over reads {g.get('reads', '')} ({what})", g.get("value"), "<=", 1,
                 h.fmt(g.get("value"), 2) + " MiB")
    wrong = sum(x.get("wrong") or 0 for x in res.runs)
    res.goal("no wrong answer (finds, stats, reads, every N)", wrong, "<=", 0, f"{wrong} wrong")


def main() -> None:
    args = h.main_args(__doc__.split("\n\n")[0], extra=extra_args)
    plan = PLANS["quick" if args.quick else "full"]
    if args.pythonpath:
        os.environ["PYTHONPATH"] = os.path.abspath(args.pythonpath)  # the mounts and split's writers too
        sys.path.insert(0, os.environ["PYTHONPATH"])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the mounts inherit it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unmount on the way out
    ns = sorted({1, *(map(int, args.shards.split(",")) if args.shards else plan["shards"])})
    name = "shards" if ns == sorted({1, *plan["shards"]}) else f"shards_{max(ns)}"
    res = h.Results(f"{name}_pythonpath" if args.pythonpath else name,
                    f"Many shards: {plan['objects']:,} objects as " + ", ".join(f"{n:,}" for n in ns) + " shards"
                    + (f" (shardfs of {args.pythonpath})" if args.pythonpath else ""), args.quick, sys.argv[1:])
    res.rounds = args.rounds
    ds = h.dataset("tiny", plan["objects"], native=False)
    dirs = {n: h.split(ds, n) for n in ns}
    os.makedirs(WORK, exist_ok=True)
    try:
        if not args.only or "python" in args.only:
            python_level(res, ds, dirs, plan, args.rounds)
        if not args.only or "levels" in args.only:
            levels(res, args.rounds)
        if not args.only or "mount" in args.only:
            mount_level(res, ds, dirs, plan, args.rounds)
    finally:
        if not any(h.mounted(f"{WORK}/mnt{n}") for n in ns):
            shutil.rmtree(WORK, ignore_errors=True)
    report(res, ns, max(ns), ds.count)
    res.write()


if __name__ == "__main__":
    main()
