"""Random object reads on one winery deployment: winery's own reader against
shardfs (Python API, and a FUSE mount), on the same objects.

One run builds a real Software Heritage winery deployment (swh-objstorage's
``WineryObjStorage``, a private PostgreSQL server and a directory shards
pool) with the test helpers (tests/pg_server.py, tests/winery_deploy.py):
--objects objects (default 20,000; random bytes, sizes uniform in
1..8,192 B, median ~4 KiB, seeded) added through swh's writer with a
shard_max_size that makes ~--shards (8) write shards, which swh's packer and
cleaner turn into Read Shard images (state readonly, write tables dropped);
then --write-objects more (default 1,000) that stay in a write shard, in
PostgreSQL. Then, for each location (read shards, write shards), the same
random keys (fixed seed; --reads per location, at most the location's
objects, no key twice) are read by each method:

    winery-get      swh's WineryObjStorage(readonly=True).get({"sha256": key})
                    over the same database (read-only role) and pool
    api-get         shardfs.winery.WineryStore(dsn, pools_dir=...).get(key)
    api-batch       WineryStore.get_batch(keys), batches of --batch (100)
    mount-read      shardfs mount --winery DSN --winery-pools-dir DIR MP;
                    os.open / os.read to the end / os.close of MP/<hex key>,
                    in this Python process (no process spawned per file)
    mount-xargs-cat xargs -d '\\n' -a LIST cat | sha256sum: what a user types;
                    xargs packs as many paths per cat as fit (a few cat
                    processes for thousands of files)
    mount-cat-1     xargs -d '\\n' -n 1 -a LIST cat | sha256sum: one cat
                    process per file (the process-spawn cost per object)

Each (method, location) gets a cold pass then a warm pass:

    cold  PostgreSQL restarted (its shared buffers empty), the reader built
          afresh (a new WineryObjStorage / WineryStore; a fresh mount),
          primed without reading any object (winery: its ROShard and RWShard
          objects opened, one query on an absent key, as shardfs opens images
          and connects when it starts; the mount: lookups of absent names, so
          its workers connect), then `sync; echo 3 > /proc/sys/vm/drop_caches`,
          then the clock.
    warm  the same keys again, same reader or mount, right after.

Figures: objects/s and MB/s (10^6 bytes of object contents per second),
and the ratio of each to winery-get's figure for the same location and
temperature. --repeat rounds (default 3, --quick 1), interleaved (each round
measures every method in turn); the best run of each cell is kept, all of
them are in the JSON output.

Every byte read is checked: the Python methods keep what they read and check
sha256(content) == key for every object after the clock stops; the cat
methods pipe cat's output into sha256sum, checked against the SHA-256 of the
expected objects concatenated in list order. A wrong or missing byte makes
the figure an error (not a number), prints "ERROR ... WRONG BYTES" and makes
the exit status 1.

Goals (issue: "≥ 5× winery's reader for objects in read shards"), each cold
and warm: WineryStore.get vs winery-get, and mount-read (open/read/close
through the mount) vs winery-get, objects in read shards. A line says GOAL
... MET or MISSED; a figure that could not be measured is MISSED.

Usage (as root, from the checkout, venv built with `make venv`; needs
PostgreSQL's server binaries, fuse3, xargs, sha256sum):

    .venv/bin/python bench/winery_bench.py --quick   # 2,000 + 200 objects, 500 reads,
                                                     # 1 round (< 1 min)
    .venv/bin/python bench/winery_bench.py --json bench/results/winery.json \\
        --md bench/results/winery.md                 # make bench-winery

--snapshot measures the committed HEAD rather than the working tree (a copy
made with git archive, its extension built, imported through PYTHONPATH by
this process and the mounts): for a tree being edited during the run.

Exit status: 0 every figure measured and verified, 1 some figure failed
(wrong bytes, an error, a timeout), 2 a requirement is missing, 130
interrupted. The mount is always unmounted (shardfs umount, then fusermount3
-u, then the FUSE connection's abort and fusermount3 -uz), the PostgreSQL
server destroyed and the temporary directory removed, on failure and on
Ctrl-C or SIGTERM too.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib
import importlib.metadata
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from machine import abort_fuse_connection, cpu_model, memory_bytes  # noqa: E402
from workers_bench import drop_caches, fs_type, is_mounted, source_state  # noqa: E402

#: (key, label) of each method, in the order of the tables.
METHODS = [
    ("winery-get", "winery WineryObjStorage.get"),
    ("api-get", "shardfs WineryStore.get"),
    ("api-batch", "shardfs WineryStore.get_batch"),
    ("mount-read", "mount: open/read/close in-process"),
    ("mount-read-4", "mount: open/read/close, 4 reader threads"),
    ("mount-xargs-cat", "mount: xargs cat"),
    ("mount-cat-1", "mount: one cat per file (xargs -n 1)"),
]
MOUNT_METHODS = ("mount-read", "mount-read-4", "mount-xargs-cat", "mount-cat-1")
#: Reader threads of "mount-read-4" (what a program reading many objects
#: at once, or `xargs -P`, does).
PARALLEL_READERS = 4
LOCATIONS = [("read", "read shards"), ("write", "write shards")]
TEMPS = ("cold", "warm")
BASELINE = "winery-get"
GOAL_RATIO = 5.0
MAX_SIZE = 8192
SHARDFS = [sys.executable, "-m", "shardfs"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Interrupted(Exception):
    """SIGTERM (or SIGHUP) arrived: unwind like Ctrl-C."""


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


# ---------------------------------------------------------------- dataset


def make_contents(count: int, rnd: random.Random, seen: set) -> List[bytes]:
    """`count` distinct objects of 1..MAX_SIZE random bytes (not in `seen`)."""
    out: List[bytes] = []
    while len(out) < count:
        data = rnd.randbytes(rnd.randint(1, MAX_SIZE))
        key = hashlib.sha256(data).digest()
        if key in seen:  # a repeated tiny object: draw another
            continue
        seen.add(key)
        out.append(data)
    return out


# ------------------------------------------------------------------ mount


def unmount(mp: str) -> None:
    """Unmount `mp` whatever its state; raise RuntimeError if it stays mounted."""
    if not is_mounted(mp):
        return
    try:
        subprocess.run(SHARDFS + ["umount", mp], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        pass
    if is_mounted(mp):
        subprocess.run(["fusermount3", "-u", mp], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    if is_mounted(mp):
        log(f"winery_bench: unmount of {mp} failed; aborting the FUSE connection")
        abort_fuse_connection(mp)
        subprocess.run(["fusermount3", "-uz", mp], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60)
    if is_mounted(mp):
        raise RuntimeError(f"{mp} is still mounted")


def mount(dsn: str, pools_dir: str, cache_dir: str, mp: str) -> None:
    unmount(mp)
    proc = subprocess.run(SHARDFS + ["mount", "--winery", dsn, "--winery-pools-dir", pools_dir,
                                     "--cache-dir", cache_dir, mp],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not is_mounted(mp):
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        unmount(mp)
        raise RuntimeError(f"mount failed (exit {proc.returncode}): "
                           f"{msg[-1] if msg else 'not mounted'}")


def mount_stats(mp: str) -> Dict[str, Any]:
    return json.loads(os.getxattr(mp, "user.shardfs.stats"))


# ------------------------------------------------------------------ bench


class Bench:
    """The deployment's facts and the measures. `rows`: one dict per pass."""

    def __init__(self, args, dep, keys: Dict[str, List[bytes]], contents: Dict[bytes, bytes],
                 shard_names: Dict[str, List[str]], work: str) -> None:
        self.args = args
        self.dep = dep
        self.server = dep.server
        self.dsn = dep.readonly_dsn
        self.keys = keys
        self.contents = contents
        self.shard_names = shard_names
        self.work = work
        self.mp = os.path.join(work, "mnt")
        self.cache_dir = os.path.join(work, "cache")
        os.makedirs(self.mp, exist_ok=True)
        os.makedirs(self.cache_dir, exist_ok=True)
        self.rows: List[dict] = []
        self.problems: List[str] = []
        self.wrong_bytes = False
        self.sidecars = ""
        self.api_sidecars = ""
        # What the cat methods read, and the SHA-256 of what they must print.
        self.lists: Dict[str, str] = {}
        self.stream_sha: Dict[str, str] = {}
        self.nbytes: Dict[str, int] = {}
        for loc, ks in keys.items():
            path = os.path.join(work, f"{loc}.list")
            with open(path, "w") as f:
                f.write("".join(os.path.join(self.mp, k.hex()) + "\n" for k in ks))
            self.lists[loc] = path
            h = hashlib.sha256()
            for k in ks:
                h.update(contents[k])
            self.stream_sha[loc] = h.hexdigest()
            self.nbytes[loc] = sum(len(contents[k]) for k in ks)

    # ------------------------------------------------------------ readers
    def open_reader(self, method: str):
        if method == BASELINE:
            from swh.objstorage.backends.winery.objstorage import WineryObjStorage
            st = WineryObjStorage(database={"db": self.dsn},
                                  shards_pools=[self.dep.pool_settings], readonly=True)
            # Prime: images opened and connections made, as shardfs does when
            # it starts; no object read.
            for name in self.shard_names["read"]:
                if st.reader.roshard(name) is None:
                    raise RuntimeError(f"winery's reader cannot open the image of {name}")
            for name in self.shard_names["write"]:
                st.reader.rwshard(name)
            if {"sha256": b"\0" * 32} in st:
                raise RuntimeError("winery says it holds the all-zero key")
            return st
        if method in ("api-get", "api-batch"):
            from shardfs.winery import WineryStore
            store = WineryStore(self.dsn, pools_dir=self.dep.pools_dir, cache_dir=self.cache_dir)
            served = store.shards.served()
            self.api_sidecars = (f"{sum(1 for m in served if m.sidecar is not None)}/"
                                 f"{len(served)}")
            return store
        mount(self.dsn, self.dep.pools_dir, self.cache_dir, self.mp)
        # Prime: absent names, looked up by the workers in the database.
        for i in range(8):
            if os.path.exists(os.path.join(self.mp, f"{i:064x}")):
                raise RuntimeError("the mount shows an absent key")
        return self.mp

    def close_reader(self, method: str, handle) -> None:
        if handle is None:
            return
        if method == BASELINE:
            from winery_deploy import _close_database
            reader = handle.reader
            rw = list(reader.rw_shards.values())
            try:
                handle.on_shutdown()
            finally:
                for db in [reader.base] + rw:
                    _close_database(db)
        elif method in ("api-get", "api-batch"):
            handle.close()
        else:
            unmount(self.mp)

    # -------------------------------------------------------------- passes
    def python_pass(self, method: str, handle, keys: List[bytes]) -> Tuple[float, List[Any]]:
        """Read every key once; (seconds, contents). Raises what the reader raises."""
        out: List[Any] = []
        append = out.append
        perf = time.perf_counter
        if method == BASELINE:
            get = handle.get
            objs = [{"sha256": k} for k in keys]
            t0 = perf()
            for o in objs:
                append(get(o))
            return perf() - t0, out
        if method == "api-get":
            get = handle.get
            t0 = perf()
            for k in keys:
                append(get(k))
            return perf() - t0, out
        if method == "api-batch":
            get_batch, b = handle.get_batch, self.args.batch
            batches = [keys[i:i + b] for i in range(0, len(keys), b)]
            t0 = perf()
            for batch in batches:
                out.extend(get_batch(batch))
            return perf() - t0, out
        assert method in ("mount-read", "mount-read-4")
        paths = [os.path.join(self.mp, k.hex()) for k in keys]
        if method == "mount-read-4":
            return self.parallel_read(paths)
        open_, read, close, flags = os.open, os.read, os.close, os.O_RDONLY
        # A hung mount must not wedge the run: abort the FUSE connection.
        dog = threading.Timer(self.args.timeout, abort_fuse_connection, [self.mp])
        dog.daemon = True
        dog.start()
        try:
            t0 = perf()
            for p in paths:
                fd = open_(p, flags)
                try:
                    data = read(fd, 65536)
                    if data:
                        more = read(fd, 65536)
                        while more:
                            data += more
                            more = read(fd, 65536)
                finally:
                    close(fd)
                append(data)
            t1 = perf()
        finally:
            dog.cancel()
        if t1 - t0 >= self.args.timeout:
            raise TimeoutError(f"over {self.args.timeout:g} s (FUSE connection aborted)")
        return t1 - t0, out

    def parallel_read(self, paths: List[str]) -> Tuple[float, List[Any]]:
        """Read `paths` with PARALLEL_READERS threads (open/read/close each);
        (seconds, contents in the order of `paths`)."""
        from concurrent.futures import ThreadPoolExecutor

        def read_one(p: str) -> bytes:
            with open(p, "rb", buffering=0) as f:
                return f.read()

        dog = threading.Timer(self.args.timeout, abort_fuse_connection, [self.mp])
        dog.daemon = True
        dog.start()
        try:
            with ThreadPoolExecutor(PARALLEL_READERS) as pool:
                t0 = time.perf_counter()
                out = list(pool.map(read_one, paths, chunksize=16))
                t1 = time.perf_counter()
        finally:
            dog.cancel()
        if t1 - t0 >= self.args.timeout:
            raise TimeoutError(f"over {self.args.timeout:g} s (FUSE connection aborted)")
        return t1 - t0, out

    def cat_pass(self, method: str, loc: str) -> Tuple[float, str]:
        """xargs cat over the location's list, piped into sha256sum; (seconds, digest)."""
        n = " -n 1" if method == "mount-cat-1" else ""
        script = f"set -o pipefail; xargs -d '\\n'{n} -a {shlex.quote(self.lists[loc])} cat " \
                 "| sha256sum"
        t0 = time.perf_counter()
        proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            abort_fuse_connection(self.mp)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise TimeoutError(f"over {self.args.timeout:g} s (FUSE connection aborted)")
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            raise
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            lines = err.strip().splitlines()
            raise RuntimeError(f"{script!r} exited {proc.returncode}: "
                               f"{lines[0] if lines else ''}")
        return seconds, out.split()[0] if out.split() else ""

    def verify(self, keys: List[bytes], got: List[Any]) -> str:
        """'' if every content matches its key, else what is wrong."""
        if len(got) != len(keys):
            return f"{len(got)} contents for {len(keys)} keys"
        bad = [(k, d) for k, d in zip(keys, got)
               if not isinstance(d, bytes) or hashlib.sha256(d).digest() != k]
        if not bad:
            return ""
        k, d = bad[0]
        what = "None" if d is None else f"{len(d)} bytes, sha256 " \
            f"{hashlib.sha256(d).hexdigest()[:16]}..."
        return (f"WRONG BYTES: {len(bad)} of {len(keys)} objects do not hash to their key "
                f"(first: {k.hex()[:16]}...: got {what}, expected {len(self.contents[k])} bytes)")

    def measure(self, method: str, loc: str, temp: str, rnd: int, handle) -> dict:
        keys = self.keys[loc]
        row = {"method": method, "location": loc, "temp": temp, "round": rnd,
               "objects": len(keys), "bytes": self.nbytes[loc]}
        try:
            if temp == "cold":
                drop_caches()
            if method in ("mount-xargs-cat", "mount-cat-1"):
                seconds, digest = self.cat_pass(method, loc)
                err = "" if digest == self.stream_sha[loc] else (
                    f"WRONG BYTES: the {len(keys)} objects through cat hash to "
                    f"{digest[:16]}..., expected {self.stream_sha[loc][:16]}...")
            else:
                seconds, got = self.python_pass(method, handle, keys)
                err = self.verify(keys, got)
                del got
        except (KeyboardInterrupt, Interrupted):
            raise
        except Exception as exc:  # noqa: BLE001 - the figure is an error, the run goes on
            seconds, err = None, f"{type(exc).__name__}: {first_line(exc)}"
        row["seconds"] = None if seconds is None else round(seconds, 6)
        if err:
            row["error"] = err
            row["objects_s"] = row["mb_s"] = None
            if "WRONG BYTES" in err:
                self.wrong_bytes = True
                log(f"winery_bench: ERROR {method} {loc} {temp}: {err}")
            self.problems.append(f"round {rnd}, {method}, {loc} shards, {temp}: {err}")
        else:
            row["objects_s"] = round(len(keys) / seconds, 1)
            row["mb_s"] = round(self.nbytes[loc] / seconds / 1e6, 2)
            row["verified"] = len(keys)
        self.rows.append(row)
        fig = "error" if err else f"{row['objects_s']:,.0f} objects/s, {row['mb_s']:.1f} MB/s"
        log(f"winery_bench: round {rnd} {loc:5} {method:16} {temp}: {fig}")
        return row

    def cell(self, method: str, loc: str, rnd: int) -> None:
        """A fresh reader (cold), then the same keys again (warm)."""
        handle = None
        try:
            self.server.restart()
            handle = self.open_reader(method)
            for temp in TEMPS:
                row = self.measure(method, loc, temp, rnd, handle)
                if row.get("error") and temp == "cold":
                    # the reader may be broken (a mount aborted): no warm figure
                    self.rows.append({**row, "temp": "warm", "seconds": None,
                                      "error": "not measured: the cold pass failed"})
                    break
        except (KeyboardInterrupt, Interrupted):
            raise
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            msg = f"{type(exc).__name__}: {first_line(exc)}"
            self.problems.append(f"round {rnd}, {method}, {loc} shards: reader failed: {msg}")
            log(f"winery_bench: {method} {loc}: {msg}")
            for temp in TEMPS:
                if not any(r["method"] == method and r["location"] == loc and r["temp"] == temp
                           and r["round"] == rnd for r in self.rows):
                    self.rows.append({"method": method, "location": loc, "temp": temp,
                                      "round": rnd, "objects": len(self.keys[loc]),
                                      "bytes": self.nbytes[loc], "seconds": None,
                                      "objects_s": None, "mb_s": None, "error": msg})
        finally:
            self.close_reader(method, handle)

    def prepare_sidecars(self) -> None:
        """Mount once, untimed, so that the images' sidecars are built into
        the cache directory that every later mount and WineryStore uses."""
        try:
            mount(self.dsn, self.dep.pools_dir, self.cache_dir, self.mp)
            deadline = time.monotonic() + 120
            st: Dict[str, Any] = {}
            while time.monotonic() < deadline:
                st = mount_stats(self.mp)
                if st.get("sidecars", 0) >= st.get("shards", 1):
                    break
                time.sleep(0.1)
            self.sidecars = f"{st.get('sidecars', '?')}/{st.get('shards', '?')}"
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
            self.problems.append(f"sidecar build mount failed: {exc}")
        finally:
            unmount(self.mp)


# ---------------------------------------------------------------- results


def best(rows: List[dict], method: str, loc: str, temp: str) -> Optional[dict]:
    """The fastest run of a cell; None if none succeeded, or if any run of
    the cell read wrong bytes (the others do not redeem it)."""
    cell = [r for r in rows if r["method"] == method and r["location"] == loc
            and r["temp"] == temp]
    if any("WRONG BYTES" in (r.get("error") or "") for r in cell):
        return None
    ok = [r for r in cell if r.get("objects_s") is not None]
    return max(ok, key=lambda r: r["objects_s"]) if ok else None


def failed(rows: List[dict], method: str, loc: str, temp: str) -> bool:
    return any(r["method"] == method and r["location"] == loc and r["temp"] == temp
               and r.get("error") for r in rows)


def fmt(v: Optional[float], digits: int = 0) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def fmt_ratio(r: Optional[float]) -> str:
    """Two decimals, truncated, not rounded: 4.997 shows 4.99×, never 5.00×
    beside a MISSED 5× goal."""
    return "—" if r is None else f"{math.floor(r * 100) / 100:.2f}×"


def ratio(rows: List[dict], method: str, loc: str, temp: str) -> Optional[float]:
    a, b = best(rows, method, loc, temp), best(rows, BASELINE, loc, temp)
    return a["objects_s"] / b["objects_s"] if a and b else None


def tables(rows: List[dict], methods: Sequence[str], labels: Dict[str, str],
           keys: Dict[str, List[bytes]], populations: Dict[str, str]) -> List[str]:
    out: List[str] = []
    for loc, loc_label in LOCATIONS:
        out += [f"### Objects in {loc_label}: {len(keys[loc]):,} random reads "
                f"({populations[loc]}); objects/s, MB/s, × winery's reader", "",
                "| method | cold objects/s | cold MB/s | cold × winery | warm objects/s "
                "| warm MB/s | warm × winery |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for m in methods:
            cells = []
            for temp in TEMPS:
                b = best(rows, m, loc, temp)
                if b is None:
                    e = "error" if failed(rows, m, loc, temp) else "—"
                    cells += [e, e, "—"]
                else:
                    cells += [fmt(b["objects_s"]), fmt(b["mb_s"], 1),
                              "1 (baseline)" if m == BASELINE
                              else fmt_ratio(ratio(rows, m, loc, temp))]
            out.append(f"| {labels[m]} | " + " | ".join(cells) + " |")
        out.append("")
    return out


def run_lines(rows: List[dict], methods: Sequence[str], labels: Dict[str, str]) -> List[str]:
    """Every run's objects/s, round by round (the spread of a shared machine)."""
    out = ["### Every run, objects/s (round 1 / 2 / ...)", "",
           "| method | " + " | ".join(f"{loc_label}, {t}" for _, loc_label in LOCATIONS
                                     for t in TEMPS) + " |",
           "|---|" + "---:|" * (len(LOCATIONS) * len(TEMPS))]
    for m in methods:
        cells = []
        for loc, _ in LOCATIONS:
            for t in TEMPS:
                runs = sorted((r for r in rows if r["method"] == m and r["location"] == loc
                               and r["temp"] == t), key=lambda r: r["round"])
                cells.append(" / ".join("error" if r.get("objects_s") is None
                                        else fmt(r["objects_s"]) for r in runs) or "—")
        out.append(f"| {labels[m]} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def goals(rows: List[dict]) -> List[str]:
    lines = []
    for method, title in (("api-get", "shardfs API WineryStore.get"),
                          ("mount-read", "cat through the mount (in-process open/read/close)"),
                          ("mount-read-4", "reads through the mount, 4 reader threads")):
        for temp in TEMPS:
            a, b = best(rows, method, "read", temp), best(rows, BASELINE, "read", temp)
            r = ratio(rows, method, "read", temp)
            head = (f"GOAL {title} >= {GOAL_RATIO:g}x winery's WineryObjStorage.get, objects "
                    f"in read shards, {temp}:")
            if r is None:
                why = [f"{m} " + ("failed (see problems)" if failed(rows, m, "read", temp)
                                  else "not measured")
                       for m, fig in ((method, a), (BASELINE, b)) if fig is None]
                lines.append(f"{head} {', '.join(why)} MISSED")
            else:
                lines.append(f"{head} {fmt(a['objects_s'])} vs {fmt(b['objects_s'])} "
                             f"objects/s = {fmt_ratio(r)} {'MET' if r >= GOAL_RATIO else 'MISSED'}")
    return lines


def environment(dep) -> Dict[str, str]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"
    try:
        with dep.connect() as c:
            pg = c.execute("SHOW server_version").fetchone()[0]
    except Exception as exc:  # noqa: BLE001
        pg = f"? ({exc})"
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 0
    fuse3 = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "fuse3"],
                           capture_output=True, text=True).stdout.strip() or "?"
    return {"cpu": cpu_model(), "nproc": str(os.cpu_count()), "cpus_usable": str(affinity),
            "memory_gib": f"{memory_bytes() / 2**30:.0f}", "kernel": platform.release(),
            "python": platform.python_version(), "postgresql": pg,
            "swh_objstorage": version("swh.objstorage"), "swh_shard": version("swh.shard"),
            "psycopg": version("psycopg"), "pyfuse3": version("pyfuse3"), "fuse3": fuse3}


def preflight() -> List[str]:
    missing = []
    if os.geteuid() != 0:
        missing.append("must run as root (cold passes write to /proc/sys/vm/drop_caches; "
                       "PostgreSQL runs as the postgres user)")
    for tool, pkg in (("fusermount3", "fuse3"), ("xargs", "findutils"),
                      ("sha256sum", "coreutils"), ("cat", "coreutils")):
        if shutil.which(tool) is None:
            missing.append(f"{tool} not found (Debian package {pkg})")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse is missing")
    try:
        for module in ("psycopg", "psycopg_pool", "swh.objstorage.backends.winery"):
            importlib.import_module(module)
        from pg_server import find_bindir
        find_bindir()
    except Exception as exc:  # noqa: BLE001
        missing.append(f"{exc} (make venv: swh-objstorage[winery], psycopg, PostgreSQL)")
    return missing


# -------------------------------------------------------------------- main


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Example: .venv/bin/python bench/winery_bench.py --quick")
    parser.add_argument("--quick", action="store_true",
                        help="2,000 + 200 objects, 500 reads, 1 round: a smoke run under a "
                             "minute (default: 20,000 + 1,000 objects, 5,000 reads, 3 rounds)")
    parser.add_argument("--objects", type=int, help="objects in read shards")
    parser.add_argument("--write-objects", type=int,
                        help="objects left in write shards (PostgreSQL)")
    parser.add_argument("--reads", type=int,
                        help="random reads per location (at most its object count)")
    parser.add_argument("--shards", type=int, default=8,
                        help="read shards to aim for (sets shard_max_size; default 8)")
    parser.add_argument("--batch", type=int, default=100, help="keys per get_batch (100)")
    parser.add_argument("--repeat", type=int, help="rounds, best run of each cell kept "
                                                   "(default 3; --quick 1)")
    parser.add_argument("--methods", default=",".join(m for m, _ in METHODS),
                        help="comma-separated methods to measure (default all; "
                             f"{BASELINE} always)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds one pass may take (default 300)")
    parser.add_argument("--tmp-dir", default=tempfile.gettempdir(),
                        help="where the pool, the PostgreSQL data and the mount go (a real disk)")
    parser.add_argument("--snapshot", action="store_true",
                        help="measure the committed HEAD, not the working tree: a copy "
                             "(git archive) with its extension built, in the run's temporary "
                             "directory, imported through PYTHONPATH (the code under test "
                             "cannot change during the run)")
    parser.add_argument("--json", metavar="FILE", help="write every run's figures as JSON")
    parser.add_argument("--md", metavar="FILE", help="write the report as Markdown")
    args = parser.parse_args(argv)
    n_read = args.objects or (2000 if args.quick else 20000)
    n_write = args.write_objects if args.write_objects is not None else \
        (200 if args.quick else 1000)
    reads = args.reads or (500 if args.quick else 5000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    known = [m for m, _ in METHODS]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if any(m not in known for m in methods):
        parser.error(f"--methods: expected some of {','.join(known)}")
    methods = [m for m in known if m in methods or m == BASELINE]
    if n_read < args.shards or n_write < 1 or reads < 1 or args.repeat < 1 or args.batch < 1:
        parser.error("need --objects >= --shards, --write-objects >= 1, --reads >= 1, "
                     "--repeat >= 1, --batch >= 1")
    missing = preflight()
    if missing:
        for m in missing:
            log(f"winery_bench: {m}")
        return 2
    kind = fs_type(args.tmp_dir)
    if kind in ("tmpfs", "ramfs"):
        log(f"winery_bench: warning: {args.tmp_dir} is {kind}: 'cold' reads will not touch a "
            "disk (use --tmp-dir)")

    from pg_server import PostgresServer
    from winery_deploy import Deployment

    pythonpath = os.environ.get("PYTHONPATH")
    command = (f"PYTHONPATH={shlex.quote(pythonpath)} " if pythonpath else "") + \
        ".venv/bin/python bench/winery_bench.py" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    t_start = time.monotonic()
    load_start = os.getloadavg()
    commit = source_state()
    old_term = signal.signal(signal.SIGTERM, _on_signal)
    old_hup = signal.signal(signal.SIGHUP, _on_signal)
    work = tempfile.mkdtemp(prefix="shardfs-winery-bench-", dir=args.tmp_dir)
    os.chmod(work, 0o711)  # PostgreSQL runs as the postgres user, its directory in here
    server = dep = bench = None
    env: Dict[str, str] = {}
    dataset: Dict[str, Any] = {}
    interrupted = ""
    setup_error = ""
    try:
        if args.snapshot:
            if "shardfs" in sys.modules:
                raise RuntimeError("shardfs was imported before the snapshot")
            tree = os.path.join(work, "tree")
            os.makedirs(tree)
            log(f"winery_bench: snapshot of HEAD ({commit.split()[0]}) in {tree} ...")
            archive = subprocess.run(["git", "-C", ROOT, "archive", "HEAD"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                           cwd=tree, check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL)
            os.environ["PYTHONPATH"] = tree  # the shardfs command and its daemons
            sys.path.insert(0, tree)  # WineryStore, in this process
            import shardfs
            where = subprocess.run([sys.executable, "-c", "import shardfs; print(shardfs.__file__)"],
                                   capture_output=True, text=True, cwd="/").stdout.strip()
            for w in (where, shardfs.__file__):
                if not w.startswith(tree + os.sep):
                    raise RuntimeError(f"the snapshot is not what gets imported ({w})")
            commit = commit.split()[0] + " (snapshot of HEAD: git archive)"
        log(f"winery_bench: PostgreSQL server and winery deployment in {work} ...")
        server = PostgresServer(base_dir=work)
        rnd = random.Random(args.seed)
        seen: set = set()
        t0 = time.monotonic()
        ro = make_contents(n_read, rnd, seen)
        rw = make_contents(n_write, rnd, seen)
        ro_bytes = sum(map(len, ro))
        # Each write shard fills once it holds >= shard_max_size bytes: the
        # first shards-1 overshoot it, the last stays under it (released).
        shard_max_size = ro_bytes // args.shards + 1
        dep = Deployment(server, os.path.join(work, "pools"), shard_max_size=shard_max_size)
        env = environment(dep)
        log(f"winery_bench: adding {n_read:,} objects ({ro_bytes / 1e6:.1f} MB) through swh's "
            f"writer, shard_max_size {shard_max_size:,} ...")
        ro_keys = dep.add_many(ro)
        t_add = time.monotonic() - t0
        dep.release()
        t1 = time.monotonic()
        packed = dep.pack_full()
        cleaned = dep.clean()
        t_pack = time.monotonic() - t1
        log(f"winery_bench: packed {len(packed)} shards, cleaned {len(cleaned)} "
            f"({t_pack:.1f} s); adding {n_write:,} objects left in write shards ...")
        t1 = time.monotonic()
        rw_keys = dep.add_many(rw)
        t_add += time.monotonic() - t1
        dep.close()  # swh's writer: the writing shard goes back to standby
        contents = {k: c for k, c in zip(ro_keys + rw_keys, ro + rw)}
        del ro, rw
        # Where every object is, as the database says.
        with dep.connect() as c:
            where = {bytes(sig): (name.strip(), state, ostate) for sig, name, state, ostate in
                     c.execute("SELECT o.signature, s.name, s.state::text, o.state::text "
                               "FROM signature2shard o JOIN shards s ON s.id = o.shard")}
        wrong = [k for k in ro_keys if where.get(k, ("", "", ""))[1:] != ("readonly", "present")]
        wrong += [k for k in rw_keys if where.get(k, ("", "", ""))[1] not in
                  ("writing", "standby", "full") or where[k][2] != "present"]
        if wrong:
            raise RuntimeError(f"{len(wrong)} objects are not where the benchmark put them "
                               f"(first {wrong[0].hex()}: {where.get(wrong[0])})")
        shard_names = {"read": sorted({where[k][0] for k in ro_keys}),
                       "write": sorted({where[k][0] for k in rw_keys})}
        tables_left = dep.shard_tables()
        if set(tables_left) & set(shard_names["read"]):
            raise RuntimeError("a read shard still has its write table")
        pick = random.Random(args.seed + 1)
        keys = {"read": pick.sample(ro_keys, min(reads, len(ro_keys))),
                "write": pick.sample(rw_keys, min(reads, len(rw_keys)))}
        image_bytes = sum(os.path.getsize(dep.image_path(n)) for n in shard_names["read"])
        dataset = {
            "objects_read_shards": len(ro_keys), "objects_write_shards": len(rw_keys),
            "bytes_read_shards": ro_bytes, "bytes_write_shards": sum(len(contents[k])
                                                                     for k in rw_keys),
            "sizes": f"1..{MAX_SIZE} B uniform, random bytes", "seed": args.seed,
            "shard_max_size": shard_max_size, "read_shards": len(shard_names["read"]),
            "write_shards": len(shard_names["write"]),
            "write_shard_states": sorted({where[k][1] for k in rw_keys}),
            "image_bytes": image_bytes,
            "reads": {loc: len(ks) for loc, ks in keys.items()},
            "build_s": {"add": round(t_add, 1), "pack_and_clean": round(t_pack, 1)},
        }
        log(f"winery_bench: {len(shard_names['read'])} read shards ({image_bytes / 1e6:.1f} MB "
            f"of images), {len(shard_names['write'])} write shard(s) "
            f"({', '.join(dataset['write_shard_states'])}); "
            f"{len(keys['read']):,} + {len(keys['write']):,} keys to read")
        bench = Bench(args, dep, keys, contents, shard_names, work)
        bench.prepare_sidecars()
        for r in range(1, args.repeat + 1):
            for loc, _ in LOCATIONS:
                for m in methods:
                    bench.cell(m, loc, r)
    except (KeyboardInterrupt, Interrupted) as exc:
        interrupted = type(exc).__name__ if isinstance(exc, KeyboardInterrupt) else str(exc)
        log(f"winery_bench: interrupted ({interrupted}); cleaning up")
    except Exception as exc:  # noqa: BLE001 - reported, then cleaned up
        setup_error = f"{type(exc).__name__}: {exc}"
        log(f"winery_bench: setup failed: {setup_error}")
    finally:
        # Nothing may stop the clean-up half way.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        mp = os.path.join(work, "mnt")
        try:
            unmount(mp)
        except Exception as exc:  # noqa: BLE001
            log(f"winery_bench: {exc}")
        if dep is not None:
            try:
                dep.close()
            except Exception as exc:  # noqa: BLE001
                log(f"winery_bench: closing swh's writer: {exc}")
        if server is not None:
            server.destroy()
        if is_mounted(mp):
            log(f"winery_bench: {mp} still mounted: temporary directory {work} kept")
        else:
            shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)
    if interrupted:
        return 130

    rows = bench.rows if bench else []
    problems = (bench.problems if bench else []) + ([f"setup failed: {setup_error}"]
                                                    if setup_error else [])
    labels = dict(METHODS)
    labels["api-batch"] = f"shardfs WineryStore.get_batch ({args.batch})"
    populations = {
        "read": f"of {dataset.get('objects_read_shards', 0):,} objects in "
                f"{dataset.get('read_shards', 0)} read shards",
        "write": f"of {dataset.get('objects_write_shards', 0):,} objects in "
                 f"{dataset.get('write_shards', 0)} write shard(s)"}
    table_lines = tables(rows, methods, labels, bench.keys if bench else
                         {"read": [], "write": []}, populations)
    goal_lines = goals(rows)
    wall = time.monotonic() - t_start
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    load = {"start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()]}
    end_commit = commit if args.snapshot else source_state()
    if pythonpath and not args.snapshot:
        commit += f" (PYTHONPATH={pythonpath}: shardfs imported from there first)"
    elif end_commit != commit:
        same = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", commit.split()[0],
                               end_commit.split()[0], "--", "shardfs"],
                              capture_output=True).returncode == 0
        commit = (f"{end_commit} (HEAD moved from {commit} during the run; nothing under "
                  "shardfs/ changed)" if same and "uncommitted" not in commit + end_commit
                  else f"{commit} at the start, {end_commit} at the end")
    env_line = (f"{env.get('nproc', '?')} CPUs ({env.get('cpus_usable', '?')} usable; "
                f"{env.get('cpu', '?')}), {env.get('memory_gib', '?')} GiB RAM, kernel "
                f"{env.get('kernel', '?')}, Python {env.get('python', '?')}; PostgreSQL "
                f"{env.get('postgresql', '?')}; swh-objstorage {env.get('swh_objstorage', '?')}, "
                f"swh.shard {env.get('swh_shard', '?')}, psycopg {env.get('psycopg', '?')}, "
                f"pyfuse3 {env.get('pyfuse3', '?')}, fuse3 {env.get('fuse3', '?')}; shardfs "
                f"{commit}")
    verdict = []
    if bench and bench.wrong_bytes:
        verdict.append("ERROR: some method read WRONG BYTES (see problems): its figures are "
                       "errors, not numbers")
    print(f"Environment: {env_line}. Load average {'/'.join(map(str, load['start']))} at the "
          f"start, {'/'.join(map(str, load['end']))} at the end.")
    if dataset:
        print(f"Dataset: {dataset['objects_read_shards']:,} objects in "
              f"{dataset['read_shards']} read shards + {dataset['objects_write_shards']:,} in "
              f"{dataset['write_shards']} write shard(s), 1..{MAX_SIZE:,} B; "
              f"{args.repeat} round(s), best kept; sidecars "
              f"{bench.sidecars if bench else '?'} (WineryStore: "
              f"{bench.api_sidecars if bench else '?'}).")
    print()
    print("\n".join(table_lines))
    for line in goal_lines + verdict:
        print(line)
    for p in problems:
        print(f"problem: {p}")

    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": command, "date": now, "environment": env, "commit": commit,
                       "tmp_dir_fs": kind, "wall_s": round(wall, 1), "loadavg": load,
                       "repeat": args.repeat, "batch": args.batch, "dataset": dataset,
                       "sidecars_at_mount": bench.sidecars if bench else "",
                       "sidecars_winerystore": bench.api_sidecars if bench else "",
                       "methods": {m: labels[m] for m in methods},
                       "best": {f"{m}/{loc}/{t}": best(rows, m, loc, t)
                                for m in methods for loc, _ in LOCATIONS for t in TEMPS},
                       "goals": goal_lines, "problems": problems, "rows": rows},
                      f, indent=1)
            f.write("\n")
    if args.md:
        os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
        md = [f"# Random object reads on one winery deployment: winery's reader vs shardfs "
              f"({'quick' if args.quick else 'default'})", "",
              f"{now}; {env_line}. Command: `{command}` ({wall:.0f} s in all; temporary files "
              f"on {kind}). Load average (1/5/15 min) {'/'.join(map(str, load['start']))} at "
              f"the start, {'/'.join(map(str, load['end']))} at the end: the machine is shared, "
              "so figures move between runs.", ""]
        if dataset:
            md += [f"Deployment: swh-objstorage's own winery (WineryObjStorage; packer and "
                   f"cleaner from swh's housekeeping), directory shards pool, built by "
                   f"tests/winery_deploy.py on a private PostgreSQL (tests/pg_server.py). "
                   f"{dataset['objects_read_shards']:,} objects "
                   f"({dataset['bytes_read_shards'] / 1e6:.1f} MB) in "
                   f"{dataset['read_shards']} read shards (state readonly, write tables "
                   f"dropped; shard_max_size {dataset['shard_max_size']:,} B) and "
                   f"{dataset['objects_write_shards']:,} objects "
                   f"({dataset['bytes_write_shards'] / 1e6:.1f} MB) in "
                   f"{dataset['write_shards']} write shard(s) "
                   f"({', '.join(dataset['write_shard_states'])}), in PostgreSQL. Objects: "
                   f"random bytes, sizes uniform in 1..{MAX_SIZE:,} B (median ~4 KiB), seed "
                   f"{args.seed}. Reads: {dataset['reads']['read']:,} keys of read shards and "
                   f"{dataset['reads']['write']:,} of write shards, drawn at random (seeded), "
                   "no key twice, the same keys for every method. The shardfs side uses the "
                   "read-only role (`guest`, SELECT only), and so does winery's reader "
                   f"(WineryObjStorage readonly=True). Sidecars: built by an untimed first "
                   f"mount ({bench.sidecars if bench else '?'}), kept in the cache directory "
                   f"every mount and WineryStore use (WineryStore loaded "
                   f"{bench.api_sidecars if bench else '?'}). Mounts: default options "
                   f"(workers = max(2, CPUs)).", ""]
        md += ["Cold = PostgreSQL restarted, the reader built afresh (new WineryObjStorage or "
               "WineryStore, fresh mount) and primed without reading an object (images "
               "opened, connections made), then `sync; echo 3 > /proc/sys/vm/drop_caches`, "
               "then the clock. Warm = the same keys again right after, same reader. "
               f"{args.repeat} round(s) (interleaved: each round measures every method in "
               "turn), the best run of each cell kept; the JSON output lists every run. MB/s "
               "= 10^6 bytes of object contents per second. × winery = objects/s over "
               "winery's reader's at the same location and temperature.", "",
               "Every byte is checked: the Python methods check sha256(content) == key for "
               "every object after the clock stops; the cat methods pipe cat's output into "
               "`sha256sum` (inside the clock), checked against the expected objects "
               "concatenated in list order.", "",
               "Methods:", "",
               f"- {labels['winery-get']}: `WineryObjStorage(database=..., shards_pools=..., "
               "readonly=True).get({'sha256': key})`, one key at a time (one query on "
               "signature2shard + shards per object, then the image or the write table).",
               f"- {labels['api-get']}: `shardfs.winery.WineryStore(dsn, pools_dir=..., "
               "cache_dir=...).get(key)`.",
               f"- {labels['api-batch']}: `WineryStore.get_batch(keys)`, {args.batch} keys "
               "per call.",
               f"- {labels['mount-read']}: `os.open`, `os.read` to the end, `os.close` of "
               "`MOUNTPOINT/<64-hex key>` in the benchmark's Python process (no process per "
               "file).",
               f"- {labels['mount-read-4']}: the same from {PARALLEL_READERS} threads of the "
               "benchmark's process (a program reading many objects at once): the device and "
               "the workers serve several reads at a time.",
               f"- {labels['mount-xargs-cat']}: `xargs -d '\\n' -a LIST cat | sha256sum` over "
               "the paths: what a user types; xargs packs as many paths per cat as fit, so a "
               "few cat processes read all the files.",
               f"- {labels['mount-cat-1']}: `xargs -d '\\n' -n 1 -a LIST cat | sha256sum`: one "
               "cat process per file, so the process-spawn cost per object shows.", "",
               "## Goals (≥ 5× winery's reader for objects in read shards)", "", "```"] + \
            goal_lines + verdict + ["```", "", "## Results", ""] + table_lines + \
            run_lines(rows, methods, labels)
        if problems:
            md += ["## Problems seen", ""] + [f"- {p}" for p in problems] + [""]
        with open(args.md, "w") as f:
            f.write("\n".join(md))
    if args.json or args.md:
        log(f"winery_bench: wrote {' and '.join(p for p in (args.json, args.md) if p)} "
            f"({wall:.0f} s in all)")
    complete = all(best(rows, m, loc, t) for m in methods for loc, _ in LOCATIONS for t in TEMPS)
    return 0 if rows and complete and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
