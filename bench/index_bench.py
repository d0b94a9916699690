"""Global index benchmark: the same objects as 1, 1,000, 10,000 (100,000) shards.

The same 1,000,000 small objects (16..256 bytes, those of
``bench/scale_bench.py``: same generator, same keys) stored as 1 shard,
1,000 shards of 1,000, 10,000 shards of 100 (and, with --full, 100,000
shards of 10). For each shard count N, in one run:

1. **Python level** (one thread): a `shardfs.fuse.shardset.ShardSet` over
   the N shards; ``ShardSet.find`` of 200,000 random present keys and
   200,000 random absent keys (random 32 bytes); lookups per second (best
   of the passes over the same keys) and index probes per lookup
   (``ShardSet.probes / ShardSet.lookups``), two ways:

   * *filters*: no index (``ShardSet.index = None``, the old way), every
     sidecar built: each lookup asks every shard's filter
     (``SidecarSet.candidates``, linear in N). A pass stops early once it
     has taken its share of the plan's ``filters_budget`` seconds; the
     lookups actually made are reported;
   * *index*: the global index (``shardfs.gindex.IndexSet``) built over
     all the shards in one batch (``IndexSet.add_shards``, timed: the
     index build time; its levels and bytes on disk are reported), every
     shard marked indexed (``ShardSet.reload_index``): lookups go through
     the levels only.

   A verification pass (untimed) first checks 2,000 present and 2,000
   absent keys: a present key found with the object's size, an absent one
   not found.

2. **Through a mount** (``shardfs mount --shard-dir DIR --layout flat``),
   each N in turn: *cold* = a fresh, empty ``--cache-dir``: seconds until
   ``python -m shardfs mount`` returns (it returns once the mount answers;
   interpreter start-up included), then seconds from there until every
   sidecar is built and until the index covers every shard (root xattr
   ``user.shardfs.stats``: index.indexed_shards == shards, polled every
   50 ms); 2 cold runs. *warm* = the cache directory the first cold run
   left (the index is reused: it must cover every shard at once); 2 warm
   runs. The first warm mount of every N stays up, and on them:
   ``os.stat`` of 50,000 random present names and 50,000 random absent
   names per pass (``MP/<hex key>``; each name used once in the whole run,
   so the kernel's dentry cache never answers), from --threads threads;
   lookups per second = the best pass (wall clock); index probes per
   lookup from the stats xattr (Δindex_probes / Δlookups); a present name
   must be a file of the object's size, an absent one ENOENT. Then a
   serve check: stat + open + read + compare of 2,000 random objects and
   stat of 2,000 absent names. Index size on disk = the ``index-*``
   directories of the cache directory once the first cold mount covered
   every shard.

   The machine may be shared and noisy: the N compared are measured side
   by side, their passes interleaved (pass r of every N in turn, the
   order rotated each round; the Python sets and the warm mounts of all N
   are open at once), so that load weighs on all of them alike; every
   pass is in the JSON.

3. Ratios: each rate against the 1-shard rate of the same kind in the
   same run. Goals (MET / MISSED): with the index, 10,000 shards >= 0.8x
   one shard (Python, present and absent); the mount answers in < 5 s
   with 10,000 shards (cold and warm cache, best run); through the mount,
   10,000 shards >= 0.8x one shard (present and absent). With --quick the
   largest N (1,000 shards of 100 objects) stands in for 10,000, and says
   so.

4. With --full, 100,000 shards of 10 objects go through all of the above
   (alone, after the others), but for the Python level without the index
   (every sidecar mapped at once: more maps than vm.max_map_count). More
   shards than a process may keep open (`shardfs.fuse.shardset.
   default_max_open`: 18,976 with 20,000 descriptors) are opened on demand
   through a bounded cache, in the mount and in this process alike; the
   mount must open, index and serve them all. What fails is recorded
   verbatim as the result, not hidden.

--quick: 100,000 objects as 1, 100 and 1,000 shards, 50,000 Python keys,
10,000 names per stat pass, 3 passes (a few minutes); default and --full:
5 passes (--full: 45,000 names per stat pass, so that no name is used
twice over four shard counts).

Datasets are built once and cached under ``bench/data/``: the 1 shard and
1,000 shards of the 1,000,000 objects are ``bench/scale_bench.py``'s
(``scale-1000x1000-s1``, reused, or built by it); the others are
``index-n<objects>-x<shards>-s1/shards/`` (a ``dataset.json`` written last
marks a complete one). Mount points, caches and daemon logs go in a fresh
directory under --tmp, removed at the end; every mount is unmounted in a
``finally`` (also on Ctrl-C / SIGTERM).

    .venv/bin/python bench/index_bench.py [--quick | --full] [--json FILE] [--md FILE]

Units: seconds, lookups per second (all threads), bytes (MB = 10^6).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import scale_bench  # noqa: E402  (same directory)
from build_bench import machine_info  # noqa: E402
import machine  # noqa: E402
from machine import abort_fuse_connection  # noqa: E402
from scale_bench import (SEED, SMALL_SIZES, ManyShards, Mount, _check_space, _object, _pool,  # noqa: E402
                         _read_meta, _write_meta, dir_bytes, is_mounted, log, md_table,
                         random_absent, table, threaded)

DATA_DIR = os.path.join(HERE, "data")
#: Bumped when the generation of the index-* datasets changes.
FORMAT_VERSION = 1

PLANS = {
    "quick": {"objects": 100_000, "splits": [1, 100, 1_000], "py_lookups": 50_000,
              "filters_budget": 20.0, "stats": 10_000, "check": 500, "reps": 3, "cold_runs": 2, "warm_runs": 2},
    "default": {"objects": 1_000_000, "splits": [1, 1_000, 10_000], "py_lookups": 200_000,
                "filters_budget": 60.0, "stats": 50_000, "check": 2_000, "reps": 5, "cold_runs": 2, "warm_runs": 2},
    "full": {"objects": 1_000_000, "splits": [1, 1_000, 10_000, 100_000], "py_lookups": 200_000,
             "filters_budget": 60.0, "stats": 45_000, "check": 2_000, "reps": 5, "cold_runs": 2, "warm_runs": 2},
}

#: Goals: the largest N (10,000, or the --quick stand-in) against 1 shard.
GOAL_RATIO = 0.8
GOAL_START = 5.0
GOAL_SHARDS = 10_000
#: Seconds allowed for a mount to build its sidecars and index.
INDEX_TIMEOUT = 1800
#: Seconds allowed for one `shardfs mount` (100,000 shards open slowly).
MOUNT_TIMEOUT = 900
#: Lookups between clock checks in a Python pass.
CHUNK = 1000


class Interrupted(Exception):
    pass


def _sigterm(signum, frame):  # noqa: ANN001
    raise KeyboardInterrupt


# ------------------------------------------------------------- datasets


def _build_range(directory: str, first: int, last: int, per: int, seed: int) -> int:
    """Write shards first..last-1 (objects j*per .. (j+1)*per - 1 each);
    returns the bytes of objects written. Runs in a worker process."""
    import shardfs

    pool = _pool(seed)
    lo, hi = SMALL_SIZES
    sha = hashlib.sha256
    total = 0
    for j in range(first, last):
        path = os.path.join(directory, f"s{j:06d}.shard")
        with shardfs.ShardWriter(path) as w:
            for i in range(j * per, (j + 1) * per):
                data = _object(pool, i, lo, hi)
                w.add(sha(data).digest(), data)
                total += len(data)
    return total


class Split:
    """`objects` objects (scale_bench's generator, in order) as `shards`
    shards of objects/shards each, in ``shard_dir`` (nothing else in it)."""

    def __init__(self, data_dir: str, objects: int, shards: int, seed: int = SEED):
        if objects % shards:
            raise ValueError(f"{objects} objects do not split into {shards} equal shards")
        self.objects, self.shards, self.seed = objects, shards, seed
        self.per = objects // shards
        self.path = os.path.join(data_dir, f"index-n{objects}-x{shards}-s{seed}")
        self.shard_dir = os.path.join(self.path, "shards")

    def ensure(self, jobs: int) -> "Split":
        want = {"version": FORMAT_VERSION, "objects": self.objects, "shards": self.shards,
                "seed": self.seed, "sizes": list(SMALL_SIZES)}
        meta = _read_meta(self.path)
        if meta is not None and all(meta.get(k) == v for k, v in want.items()):
            try:
                n = sum(1 for e in os.scandir(self.shard_dir) if e.name.endswith(".shard"))
            except OSError:
                n = -1
            if n == self.shards:
                log(f"dataset {os.path.basename(self.path)}: reused")
                return self
        _check_space(os.path.dirname(self.path),
                     int(self.objects * (sum(SMALL_SIZES) / 2 + 60) + self.shards * 4096) + (256 << 20))
        log(f"dataset {os.path.basename(self.path)}: building {self.shards:,} shards of {self.per:,} "
            f"objects ({jobs} processes; once, cached in {self.path})")
        t = time.perf_counter()
        if os.path.lexists(self.path):
            shutil.rmtree(self.path)
        os.makedirs(self.shard_dir)
        step = max(1, min(1000, self.shards // (4 * jobs) or 1))
        ranges = [(a, min(a + step, self.shards)) for a in range(0, self.shards, step)]
        total = done = 0
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            futs = {ex.submit(_build_range, self.shard_dir, a, b, self.per, self.seed): (a, b)
                    for a, b in ranges}
            for f in as_completed(futs):
                total += f.result()
                a, b = futs[f]
                done += b - a
                if len(ranges) > 8 and done * 10 // self.shards != (done - (b - a)) * 10 // self.shards:
                    log(f"  {done:,}/{self.shards:,} shards ({time.perf_counter() - t:.0f} s)")
        _write_meta(self.path, dict(want, total_bytes=total, created=time.strftime("%Y-%m-%dT%H:%M:%S%z")))
        log(f"dataset {os.path.basename(self.path)}: built in {time.perf_counter() - t:.1f} s")
        return self


def dataset_dirs(data_dir: str, objects: int, splits: Sequence[int], jobs: int) -> Dict[int, str]:
    """N -> a directory holding exactly the N shards of the objects."""
    out: Dict[int, str] = {}
    if objects == ManyShards(data_dir).count and (1 in splits or scale_bench.MANY_SHARDS in splits):
        many = ManyShards(data_dir).ensure()
        out[1] = os.path.dirname(many.one)
        out[scale_bench.MANY_SHARDS] = many.shard_dir
    for n in splits:
        if n not in out:
            out[n] = Split(data_dir, objects, n).ensure(jobs).shard_dir
    return out


def shard_paths(directory: str) -> List[str]:
    """The shard files of `directory` in name order (= the mount's numbers)."""
    return sorted(os.path.join(directory, e.name) for e in os.scandir(directory)
                  if e.name.endswith(".shard") and not e.name.startswith("."))


class Objects:
    """Keys and sizes of objects 0..count-1."""

    def __init__(self, count: int, seed: int = SEED):
        t = time.perf_counter()
        self.pool = _pool(seed)
        self.count = count
        lo, hi = SMALL_SIZES
        sha = hashlib.sha256
        keys = bytearray()
        for i in range(count):
            keys += sha(_object(self.pool, i, lo, hi)).digest()
        self.keys = bytes(keys)
        log(f"{count:,} keys computed in {time.perf_counter() - t:.1f} s")

    def key(self, i: int) -> bytes:
        return self.keys[32 * i:32 * i + 32]

    def data(self, i: int) -> bytes:
        return _object(self.pool, i, *SMALL_SIZES)


# ------------------------------------------------------- Python level


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def timed_finds(ss, keys: List[bytes], budget: Optional[float]) -> Tuple[int, float, int, float]:
    """One pass of ShardSet.find over `keys` (stopping after `budget`
    seconds if given): (lookups made, seconds, found, probes per lookup)."""
    ss.lookups = ss.probes = 0
    find = ss.find
    found = done = 0
    perf = time.perf_counter
    t0 = perf()
    for start in range(0, len(keys), CHUNK):
        for k in keys[start:start + CHUNK]:
            if find(k) is not None:
                found += 1
        done = min(len(keys), start + CHUNK)
        if budget is not None and perf() - t0 > budget:
            break
    dt = perf() - t0
    return done, dt, found, ss.probes / max(ss.lookups, 1)


def verify_finds(ss, objs: Objects, present_idx: List[int], absent: List[bytes]) -> int:
    """Wrong answers of ShardSet.find (untimed): a present key not found
    or with another size, an absent key found."""
    wrong = 0
    lo, hi = SMALL_SIZES
    for i in present_idx:
        r = ss.find(objs.key(i), count=False)
        if r is None or r[3] != len(_object(objs.pool, i, lo, hi)):
            wrong += 1
    for k in absent:
        if ss.find(k, count=False) is not None:
            wrong += 1
    return wrong


def open_set(how: str, n: int, directory: str, cache_dir: str, objs: Objects,
             errors: List[str]) -> Tuple[object, Optional[dict], dict]:
    """A ShardSet over the N shards of `directory`, ready for `how`
    ("filters": every sidecar built, no index; "index": every shard in
    the global index): (the set, the index build row, timings). Raises what
    adding a shard raises (the set is closed first)."""
    from shardfs.fuse.shardset import ShardSet
    from shardfs.gindex import IndexSet, index_dir

    paths = shard_paths(directory)
    ss = ShardSet(cache_dir=cache_dir)
    added = 0
    build = None
    try:
        if how == "index":
            ss.index = IndexSet(index_dir(cache_dir, f"index_bench {n}"))
            ss.index.load()
        t = time.perf_counter()
        for p in paths:
            ss.add(p)
            added += 1
        t_add = time.perf_counter() - t
        t = time.perf_counter()
        if how == "filters":
            for m in ss.served():
                ss.build_sidecar(m)
            t_prep = time.perf_counter() - t
            ready = sum(1 for m in ss.served() if m.sidecar is not None)
            log(f"  {n:,} shards, Python, filters: {added:,} shards added in {t_add:.2f} s, "
                f"{ready:,} sidecars built in {t_prep:.2f} s")
        else:
            served = ss.served()
            # A generator: shards are opened one at a time, as the index
            # reads them (100,000 open at once would not fit the limits).
            names = ss.index.add_shards(((m.identity, m.shard) for m in served if not m.indexed),
                                        [m.identity for m in served])
            t_prep = time.perf_counter() - t
            ss.reload_index()
            indexed = sum(1 for m in ss.served() if m.indexed)
            st = ss.index.stats()
            b, files = dir_bytes(ss.index.directory)
            build = {"shards": n, "objects": objs.count, "levels": len(names),
                     "level_entries": st["levels"], "index_bytes": b, "index_files": files,
                     "bytes_per_object": b / objs.count, "build_seconds": round(t_prep, 3),
                     "indexed_shards": indexed, "add_seconds": round(t_add, 3)}
            log(f"  {n:,} shards, Python, index: {added:,} shards added in {t_add:.2f} s, index "
                f"built in {t_prep:.2f} s ({len(names)} level(s), {b / 1e6:.2f} MB, "
                f"{b / objs.count:.2f} bytes per object), {indexed:,} shards indexed, "
                f"{len(ss.filters)} per-shard filters left")
            if indexed != n:
                errors.append(f"Python level, {n:,} shards: only {indexed:,} of {n:,} shards "
                              f"indexed after add_shards + reload_index")
        return ss, build, {"add_seconds": round(t_add, 3), "prepare_seconds": round(t_prep, 3)}
    except BaseException as exc:
        close_set(ss)
        if isinstance(exc, Exception):
            raise RuntimeError(f"{_err(exc)} (after {added:,} of {len(paths):,} shards added)") from exc
        raise


def close_set(ss) -> None:
    ss.close()
    if ss.index is not None:
        ss.index.close()


def python_level(group: Sequence[int], dirs: Dict[int, str], objs: Objects, present_idx: List[int],
                 absent: List[bytes], plan: dict, tmp: str,
                 errors: List[str]) -> Tuple[List[dict], List[dict]]:
    """Both kinds (filters, then index) for the shard counts of `group`,
    their sets open at once and their passes interleaved (round r: every
    N in turn, the order rotated each round), so that the machine's load
    weighs on all alike: (lookup rows, index build rows)."""
    present = [objs.key(i) for i in present_idx]
    rows: List[dict] = []
    builds: List[dict] = []
    check_idx, check_absent = present_idx[:2000], absent[:2000]
    # Without the index every sidecar is mapped at once: beyond 10,000
    # shards that is not a way to serve (100,000 maps > vm.max_map_count).
    for how in ("filters", "index") if max(group) <= GOAL_SHARDS else ("index",):
        sets: Dict[int, object] = {}
        info: Dict[int, dict] = {}
        try:
            for n in group:
                try:
                    sets[n], build, info[n] = open_set(how, n, dirs[n], os.path.join(tmp, f"py-{n}.cache"), objs, errors)
                except (KeyboardInterrupt, Interrupted):
                    raise
                except Exception as exc:
                    msg = f"Python level, {n:,} shards, {how}: {exc}"
                    errors.append(msg)
                    log(f"  ERROR {msg}")
                    for kind in ("present", "absent"):
                        rows.append({"shards": n, "level": "python", "how": how, "kind": kind, "error": str(exc)})
                    continue
                if build:
                    builds.append(dict(build, where="Python (add_shards)"))
                wrong = verify_finds(sets[n], objs, check_idx, check_absent)
                info[n]["verify_wrong"] = wrong
                if wrong:
                    errors.append(f"Python level, {n:,} shards, {how}: {wrong} wrong answers of "
                                  f"ShardSet.find over {len(check_idx) + len(check_absent):,} checked keys")
            budget = plan["filters_budget"] / plan["reps"] if how == "filters" else None
            order = list(sets)
            if not order:
                continue
            for kind, keys in (("present", present), ("absent", absent)):
                passes: Dict[int, list] = {n: [] for n in order}
                for r in range(plan["reps"]):
                    for n in order[r % len(order):] + order[:r % len(order)]:
                        passes[n].append(timed_finds(sets[n], keys, budget))
                for n in order:
                    rates = [d / s for d, s, _f, _p in passes[n]]
                    done, secs, found, ppl = max(passes[n], key=lambda x: x[0] / x[1])
                    expect = done if kind == "present" else 0
                    row = {"shards": n, "level": "python", "how": how, "kind": kind,
                           "lookups": done, "lookups_asked": len(keys), "seconds": round(secs, 4),
                           "lookups_per_s": done / secs, "pass_rates": [round(x) for x in rates],
                           "probes_per_lookup": ppl, "found": found, "wrong": abs(found - expect),
                           **info[n]}
                    rows.append(row)
                    log(f"  {n:,} shards, Python, {how:7} {kind:7}: {row['lookups_per_s']:10,.0f}/s "
                        f"(best of {len(rates)}: {', '.join(f'{x:,.0f}' for x in rates)}; {done:,} lookups), "
                        f"{ppl:.4f} probes/lookup" + (f", {row['wrong']} WRONG" if row["wrong"] else ""))
                    if row["wrong"]:
                        errors.append(f"Python level, {n:,} shards, {how}, {kind}: {row['wrong']} wrong answers")
        finally:
            for ss in sets.values():
                close_set(ss)
    for n in group:
        shutil.rmtree(os.path.join(tmp, f"py-{n}.cache"), ignore_errors=True)
    return rows, builds


# ----------------------------------------------------------- mounting


def close_mount(m: Mount) -> None:
    m.close()
    if os.path.isdir(m.mp) and is_mounted(m.mp):
        log(f"  {m.mp} still mounted after umount: aborting the FUSE connection")
        abort_fuse_connection(m.mp)
        subprocess.run(["fusermount3", "-uz", m.mp], capture_output=True, timeout=60)


def wait_index(m: Mount, timeout: float = INDEX_TIMEOUT) -> Tuple[Optional[float], Optional[float], dict]:
    """Poll the stats xattr every 50 ms from now until every served shard
    has its sidecar and the index covers them all: (seconds until the
    first, seconds until the second (each None on timeout; the second
    None when the mount has no index), last stats). The caller compares stats["shards"] with the shards given."""
    t = time.perf_counter()
    deadline = t + timeout
    t_sc = t_idx = None
    while True:
        st = m.stats()
        now = time.perf_counter() - t
        served = st.get("shards") or 0
        if t_sc is None and served and st.get("sidecars") == served:
            t_sc = now
        idx = st.get("index")
        if t_idx is None and idx is not None and served and idx.get("indexed_shards") == served:
            t_idx = now
        # The builder indexes first, then builds sidecars: wait for both.
        if (t_idx is not None or idx is None) and t_sc is not None:
            return t_sc, t_idx, st
        if time.perf_counter() > deadline:
            return t_sc, t_idx, st
        time.sleep(0.05)


def index_bytes(cache: str) -> Tuple[int, int]:
    b = files = 0
    for d in glob.glob(os.path.join(cache, "index-*")):
        x, y = dir_bytes(d)
        b += x
        files += y
    return b, files


def stat_pass(mp: str, items: List[Tuple[str, int]], threads: int) -> Tuple[float, int, List[str]]:
    """os.stat each (name, expected size; -1 = absent) from `threads`
    threads: (seconds, wrong answers, first error messages)."""
    msgs: List[str] = []

    def run(part: list) -> int:
        bad = 0
        st = os.stat
        for name, size in part:
            try:
                r = st(os.path.join(mp, name))
                if size < 0 or r.st_size != size:
                    bad += 1
                    if len(msgs) < 5:
                        msgs.append(f"{name}: size {r.st_size}, expected "
                                    + ("ENOENT" if size < 0 else str(size)))
            except FileNotFoundError:
                if size >= 0:
                    bad += 1
                    if len(msgs) < 5:
                        msgs.append(f"{name}: ENOENT, expected a file of {size} bytes")
            except OSError as exc:
                bad += 1
                if len(msgs) < 5:
                    msgs.append(f"{name}: {_err(exc)}")
        return bad

    dt, bad = threaded(run, items, threads)
    return dt, bad, msgs


def serve_check(mp: str, objs: Objects, idx: List[int], absent: List[bytes]) -> dict:
    """stat + read + compare `idx` objects, stat `absent` keys (one thread)."""
    wrong = 0
    msgs: List[str] = []
    for i in idx:
        name = objs.key(i).hex()
        data = objs.data(i)
        try:
            st = os.stat(os.path.join(mp, name))
            with open(os.path.join(mp, name), "rb") as f:
                got = f.read()
            if st.st_size != len(data) or got != data:
                wrong += 1
                msg = f"{name}: wrong size or contents ({st.st_size} / {len(got)} bytes read, {len(data)} expected)"
            else:
                continue
        except OSError as exc:
            wrong += 1
            msg = f"{name}: {_err(exc)}"
        if len(msgs) < 5:
            msgs.append(msg)
    for k in absent:
        try:
            os.stat(os.path.join(mp, k.hex()))
            wrong += 1
            if len(msgs) < 5:
                msgs.append(f"{k.hex()}: absent key answered")
        except FileNotFoundError:
            pass
        except OSError as exc:
            wrong += 1
            if len(msgs) < 5:
                msgs.append(f"{k.hex()}: {_err(exc)}")
    return {"objects_read": len(idx), "absent_stat": len(absent), "wrong": wrong, "messages": msgs}


def log_problems(logf: str, limit: int = 4) -> Tuple[int, List[str]]:
    """(count, examples) of the warning/error lines of a daemon log: the
    first line of each kind (lines that differ only in numbers, such as a
    shard's name, are one kind), verbatim, with how many lines of its
    kind there are."""
    import re

    kinds: Dict[str, List] = {}
    count = 0
    try:
        with open(logf, errors="replace") as f:
            for line in f:
                if not any(w in line for w in ("WARNING", "ERROR", "CRITICAL", "Traceback", "Errno")):
                    continue
                count += 1
                text = line.strip()
                body = text.split("] ", 1)[-1]  # without the time stamp and pid
                kind = re.sub(r"[0-9a-f]{16,}|\d+", "#", body)
                if kind in kinds:
                    kinds[kind][1] += 1
                elif len(kinds) < 50:
                    kinds[kind] = [text[:400], 1]
    except OSError:
        pass
    examples = [f"{n:,} x {text}" for text, n in list(kinds.values())[:limit]]
    return count, examples


class MountRun:
    def __init__(self, tmp: str, threads: int, plan: dict):
        self.tmp, self.threads, self.plan = tmp, threads, plan
        self._n = 0
        self.start_rows: List[dict] = []
        self.lookup_rows: List[dict] = []
        self.index_rows: List[dict] = []
        self.check_rows: List[dict] = []
        self.errors: List[str] = []
        self.mounts: List[Mount] = []

    def fresh(self, label: str) -> Tuple[str, str, str]:
        self._n += 1
        base = os.path.join(self.tmp, f"{self._n:02d}-{label}")
        return base + ".mnt", base + ".cache", base + ".log"

    def _open(self, what, mp, cache, logf) -> Mount:
        m = Mount(what, mp, cache, logf)
        self.mounts.append(m)
        m.open()
        return m

    def _close(self, m: Mount) -> None:
        close_mount(m)
        if m in self.mounts:
            self.mounts.remove(m)

    def _fail(self, n: int, what: str, exc: BaseException, logf: str) -> None:
        count, lines = log_problems(logf)
        # (the daemon log's last lines, which Mount.open appends, are
        # summed up by kind below instead)
        msg = f"mount, {n:,} shards, {what}: {_err(exc).split(chr(10) + '  daemon log (last lines):')[0]}"
        if lines:
            msg += f" [daemon log: {count:,} warning/error lines; by kind: " + " | ".join(lines) + "]"
        self.errors.append(msg)
        log(f"  ERROR {msg}")

    def check_served(self, n: int, st: dict, logf: str, what: str) -> None:
        """An error when the mount serves fewer shards than the N given."""
        if st.get("shards") != n:
            count, lines = log_problems(logf)
            self.errors.append(f"mount, {n:,} shards, {what}: serves {st.get('shards')} of the {n:,} shards "
                               f"(daemon log: {count:,} warning/error lines; by kind: {' | '.join(lines)})")
            log(f"  ERROR {self.errors[-1]}")

    def cold(self, n: int, directory: str, objs: Objects) -> Optional[str]:
        """The cold runs of N shards (each with a fresh cache directory):
        start time, then time until the sidecars / the index cover every
        shard. Returns the cache directory the first run left (None if
        it failed)."""
        what = ["--shard-dir", directory, "--layout", "flat"]
        start = {"shards": n, "objects": objs.count}
        self.start_rows.append(start)
        first = None
        for rep in range(self.plan["cold_runs"]):
            mp, cache, logf = self.fresh(f"{n}-cold")
            m = None
            try:
                m = self._open(what, mp, cache, logf)
                start.setdefault("cold_runs_s", []).append(round(m.seconds, 4))
                t_sc, t_idx, st = wait_index(m)
                self.check_served(n, st, logf, "cold")
                start.setdefault("cold_sidecars_ready_after_s", []).append(
                    None if t_sc is None else round(t_sc, 3))
                start.setdefault("cold_indexed_after_s", []).append(None if t_idx is None else round(t_idx, 3))
                log(f"  {n:,} shards: cold mount returned in {m.seconds:.3f} s; sidecars ready "
                    f"{'never' if t_sc is None else f'{t_sc:.2f} s'} later, index covers every shard "
                    f"{'NEVER' if t_idx is None else f'{t_idx:.2f} s'} later (stats: shards "
                    f"{st.get('shards')}, sidecars {st.get('sidecars')}, index {st.get('index')})")
                if t_idx is None:
                    count, lines = log_problems(logf)
                    self.errors.append(f"mount, {n:,} shards: the index never covered every shard within "
                                       f"{INDEX_TIMEOUT} s (last stats: {json.dumps(st)}; daemon log: "
                                       f"{count:,} warning/error lines; by kind: {' | '.join(lines)})")
                if rep == 0:
                    start["cold_stats"] = st
                    b, files = index_bytes(cache)
                    idx = st.get("index") or {}
                    self.index_rows.append({
                        "shards": n, "objects": objs.count, "where": "mount (cold)",
                        "levels": len(idx.get("levels") or []), "level_entries": idx.get("levels"),
                        "index_bytes": b, "index_files": files, "bytes_per_object": b / objs.count,
                        "build_seconds": None if t_idx is None else round(t_idx, 3),
                        "sidecars_after_index_s": None if t_idx is None or t_sc is None else round(t_sc - t_idx, 3),
                        "indexed_shards": idx.get("indexed_shards")})
                    first = cache
            except (KeyboardInterrupt, Interrupted):
                raise
            except Exception as exc:
                self._fail(n, f"cold mount {rep + 1}", exc, logf)
                return None
            finally:
                if m is not None:
                    self._close(m)
                if rep:
                    shutil.rmtree(cache, ignore_errors=True)
        start["cold_s"] = min(start["cold_runs_s"])
        return first

    def warm(self, n: int, directory: str, cache: str, keep: bool) -> Optional[Mount]:
        """A warm mount of N shards on `cache` (timed; the index must cover
        every shard at once, else how long it takes is recorded). Returns
        the mount if `keep` and it serves with the whole index, else
        unmounts it and returns None."""
        what = ["--shard-dir", directory, "--layout", "flat"]
        start = _find(self.start_rows, shards=n)
        mp, _unused, logf = self.fresh(f"{n}-warm")
        m = None
        try:
            m = self._open(what, mp, cache, logf)
            start.setdefault("warm_s", []).append(round(m.seconds, 4))
            st = m.stats()
            idx = st.get("index") or {}
            at_once = st.get("shards") == n and idx.get("indexed_shards") == n
            if at_once:
                t_idx = 0.0
            else:
                _t_sc, t_idx, st = wait_index(m)
                self.check_served(n, st, logf, "warm")
                if t_idx is None:
                    self.errors.append(f"mount, {n:,} shards, warm: the index never covered every "
                                       f"shard (last stats: {json.dumps(st)})")
            start.setdefault("warm_indexed_after_s", []).append(None if t_idx is None else round(t_idx, 3))
            log(f"  {n:,} shards: warm mount returned in {m.seconds:.3f} s; index covers every shard "
                + ("at once" if at_once else "NEVER" if t_idx is None else f"after {t_idx:.2f} s")
                + f" ({st.get('index')})")
            if keep and t_idx is not None:
                kept, m = m, None
                return kept
            return None
        except (KeyboardInterrupt, Interrupted):
            raise
        except Exception as exc:
            self._fail(n, "warm mount", exc, logf)
            return None
        finally:
            if m is not None:
                self._close(m)

    def run_group(self, group: Sequence[int], dirs: Dict[int, str], objs: Objects,
                  present: Dict[int, List[List[int]]], absent: Dict[int, List[List[bytes]]],
                  checks: Dict[int, Tuple[List[int], List[bytes]]]) -> None:
        """Cold runs of each N in turn; then the first warm mount of each,
        all up at once, their stat passes interleaved; serve checks; then
        the other warm runs."""
        caches: Dict[int, str] = {}
        for n in group:
            log(f"mount: {n:,} shard(s) (--shard-dir, flat layout), cold")
            cache = self.cold(n, dirs[n], objs)
            if cache is not None:
                caches[n] = cache
        mounts: Dict[int, Mount] = {}
        try:
            for n in caches:
                m = self.warm(n, dirs[n], caches[n], keep=True)
                if m is not None:
                    mounts[n] = m
            if mounts:
                log("mount: stat passes, " + ", ".join(f"{n:,}" for n in mounts) + " shards interleaved")
                self.lookups(mounts, objs, present, absent)
            for n, m in mounts.items():
                chk = serve_check(m.mp, objs, *checks[n])
                chk.update(shards=n, objects=objs.count, stats_shards=m.stats().get("shards"))
                count, lines = log_problems(m.log_file)
                chk.update(daemon_log_problems=count, daemon_log_first=lines,
                           processes=mount_resources(m.mp))
                self.check_rows.append(chk)
                log(f"  {n:,} shards: processes after the serve check: " + "; ".join(
                    f"{p['comm']}: {p['fds']:,} fds, {p['maps']:,} maps, {p['rss_anon_kb'] / 1024:.1f} MiB anon"
                    for p in chk["processes"]))
                log(f"  {n:,} shards: serve check: {chk['objects_read']:,} objects stat'ed, read and "
                    f"compared, {chk['absent_stat']:,} absent names: {chk['wrong']} wrong"
                    + (f" ({'; '.join(chk['messages'])})" if chk["messages"] else ""))
                if chk["wrong"]:
                    self.errors.append(f"mount, {n:,} shards: serve check: {chk['wrong']} wrong: "
                                       + "; ".join(chk["messages"]))
        finally:
            for m in mounts.values():
                self._close(m)
        for _rep in range(1, self.plan["warm_runs"]):
            for n in caches:
                self.warm(n, dirs[n], caches[n], keep=False)

    def lookups(self, mounts: Dict[int, Mount], objs: Objects, present: Dict[int, List[List[int]]],
                absent: Dict[int, List[List[bytes]]]) -> None:
        lo, hi = SMALL_SIZES
        order = list(mounts)
        for kind in ("present", "absent"):
            passes: Dict[int, list] = {n: [] for n in order}
            for rep in range(self.plan["reps"]):
                for n in order[rep % len(order):] + order[:rep % len(order)]:
                    m = mounts[n]
                    if kind == "present":
                        items = [(objs.key(i).hex(), len(_object(objs.pool, i, lo, hi))) for i in present[n][rep]]
                    else:
                        items = [(k.hex(), -1) for k in absent[n][rep]]
                    before = m.stats()
                    dt, bad, msgs = stat_pass(m.mp, items, self.threads)
                    after = m.stats()
                    dl = after["lookups"] - before["lookups"]
                    dp = after["index_probes"] - before["index_probes"]
                    passes[n].append({"names": len(items), "seconds": round(dt, 4),
                                      "lookups_per_s": len(items) / dt, "xattr_lookups": dl,
                                      "xattr_index_probes": dp, "wrong": bad, "messages": msgs})
                    if bad:
                        self.errors.append(f"mount, {n:,} shards, stat {kind}: {bad} wrong answers: "
                                           + "; ".join(msgs))
            for n in order:
                ps = passes[n]
                best = max(ps, key=lambda p: p["lookups_per_s"])
                dl = sum(p["xattr_lookups"] for p in ps)
                dp = sum(p["xattr_index_probes"] for p in ps)
                row = {"shards": n, "level": "mount", "how": "index", "kind": kind, "threads": self.threads,
                       "lookups": best["names"], "seconds": best["seconds"],
                       "lookups_per_s": best["lookups_per_s"],
                       "pass_rates": [round(p["lookups_per_s"]) for p in ps],
                       "probes_per_lookup": dp / max(dl, 1), "xattr_lookups": dl,
                       "names_stated": sum(p["names"] for p in ps),
                       "wrong": sum(p["wrong"] for p in ps), "passes": ps}
                self.lookup_rows.append(row)
                log(f"  {n:,} shards: mount stat {kind:7} {row['lookups_per_s']:10,.0f}/s (best of "
                    f"{len(ps)}: {', '.join(f'{r:,}' for r in row['pass_rates'])}; {best['names']:,} names, "
                    f"{self.threads} threads), {row['probes_per_lookup']:.4f} probes/lookup"
                    + (f", {row['wrong']} WRONG" if row["wrong"] else ""))

    def cleanup(self) -> None:
        for m in list(self.mounts):
            try:
                self._close(m)
            except Exception as exc:  # never hide the real error
                log(f"  cleanup of {m.mp}: {exc}")
        for d in os.listdir(self.tmp):
            p = os.path.join(self.tmp, d)
            if d.endswith(".mnt") and is_mounted(p):
                close_mount(Mount([], p, self.tmp, os.devnull))


# ------------------------------------------------------------- reports


def _find(rows: List[dict], **kw) -> Optional[dict]:
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def _rate(rows: List[dict], n: int, level: str, how: str, kind: str) -> Optional[float]:
    r = _find(rows, shards=n, level=level, how=how, kind=kind)
    return None if r is None or "lookups_per_s" not in r else r["lookups_per_s"]


def ratio(res: dict, n: int, level: str, how: str, kind: str) -> Optional[float]:
    a, b = _rate(res["lookups"], n, level, how, kind), _rate(res["lookups"], 1, level, how, kind)
    return None if a is None or not b else a / b


def _cell(res: dict, n: int, level: str, how: str, kind: str) -> str:
    r = _find(res["lookups"], shards=n, level=level, how=how, kind=kind)
    if r is None:
        if level == "mount" and _find(res["start"], shards=n):
            return "FAILED"  # the mount did not come up (see the errors)
        return "not run"
    if "lookups_per_s" not in r:
        return "FAILED"
    x = ratio(res, n, level, how, kind)
    s = f"{r['lookups_per_s']:,.0f}"
    if n != 1 and x is not None:
        s += f" ({x:.2f}x)"
    if r.get("wrong"):
        s += " WRONG"
    return s


def main_table(res: dict) -> Tuple[List[str], List[List[str]], List[bool]]:
    headers = ["shards", "index present/s", "index absent/s", "filters present/s", "filters absent/s",
               "mount stat present/s", "mount stat absent/s", "mount start cold s", "warm s"]
    rows = []
    for n in res["splits"]:
        st = _find(res["start"], shards=n) or {}
        cold = ", ".join(f"{x:.3f}" for x in st.get("cold_runs_s", [])) or ("FAILED" if st else "not run")
        warm = ", ".join(f"{x:.3f}" for x in st.get("warm_s", [])) or ("FAILED" if st else "not run")
        rows.append([f"{n:,}", _cell(res, n, "python", "index", "present"),
                     _cell(res, n, "python", "index", "absent"),
                     _cell(res, n, "python", "filters", "present"),
                     _cell(res, n, "python", "filters", "absent"),
                     _cell(res, n, "mount", "index", "present"), _cell(res, n, "mount", "index", "absent"),
                     cold, warm])
    return headers, rows, [True] * len(headers)


def other_tables(res: dict) -> List[Tuple[str, List[str], List[List[str]], List[bool]]]:
    out = []
    rows = []
    for r in res["lookups"]:
        if "lookups_per_s" not in r:
            rows.append([f"{r['shards']:,}", r["level"], r["how"], r["kind"], "—", "—", "—", r["error"][:80]])
            continue
        rows.append([f"{r['shards']:,}", r["level"] + (f", {r['threads']} threads" if r["level"] == "mount" else ""),
                     r["how"], r["kind"], f"{r['lookups']:,}" + ("" if r.get("lookups_asked", r["lookups"]) ==
                                                                 r["lookups"] else f" of {r['lookups_asked']:,}"),
                     ", ".join(f"{x:,}" for x in r["pass_rates"]), f"{r['probes_per_lookup']:.4f}",
                     str(r["wrong"] + r.get("verify_wrong", 0))])
    out.append(("Lookups: every pass (lookups/s), index probes per lookup, wrong answers",
                ["shards", "level", "how", "keys", "lookups per pass", "passes /s", "probes/lookup", "wrong"],
                rows, [True, False, False, False, True, True, True, True]))
    rows = []
    for r in res["index"]:
        rows.append([f"{r['shards']:,}", r["where"], str(r["levels"]),
                     ", ".join(f"{x:,}" for x in (r["level_entries"] or [])),
                     f"{r['index_bytes'] / 1e6:.2f}", f"{r['bytes_per_object']:.2f}",
                     "—" if r["build_seconds"] is None else f"{r['build_seconds']:.2f}",
                     "—" if r.get("sidecars_after_index_s") is None else f"{r['sidecars_after_index_s']:.2f}",
                     f"{r['indexed_shards']:,}" if r.get("indexed_shards") is not None else "—"])
    out.append(("Global index: levels, size on disk, build time (Python: IndexSet.add_shards; mount: "
                "seconds after the cold mount returned until it covers every shard). An entry is a distinct "
                "(top 40 bits of a key, shard) pair: keys of one shard that share their top 40 bits make "
                "one entry",
                ["shards", "where", "levels", "entries per level", "MB", "bytes/object", "build s",
                 "sidecars done s later", "shards indexed"],
                rows, [True, False, True, True, True, True, True, True, True]))
    rows = []

    def runs(xs: Optional[list], fmt: str) -> str:
        return ", ".join("never" if x is None else format(x, fmt) for x in xs) if xs else "—"

    for r in res["start"]:
        rows.append([f"{r['shards']:,}", runs(r.get("cold_runs_s"), ".3f"),
                     runs(r.get("cold_sidecars_ready_after_s"), ".2f"), runs(r.get("cold_indexed_after_s"), ".2f"),
                     runs(r.get("warm_s"), ".3f"), runs(r.get("warm_indexed_after_s"), ".2f")])
    out.append(("Mount start: `python -m shardfs mount` until it returns (each run), then until the sidecars / "
                "the index cover every shard",
                ["shards", "cold s", "sidecars ready after s", "index complete after s", "warm s",
                 "warm: index complete after s"],
                rows, [True] * 6))
    rows = []
    for r in res["checks"]:
        rows.append([f"{r['shards']:,}", f"{r.get('stats_shards') or 0:,}", f"{r['objects_read']:,}",
                     f"{r['absent_stat']:,}", str(r["wrong"]), f"{r['daemon_log_problems']:,}"])
    out.append(("Serve check on the warm mount: stat + read + compare objects, stat absent names",
                ["shards", "shards served", "objects read", "absent names", "wrong", "daemon log warnings"],
                rows, [True] * 6))
    rows = []
    for r in res["checks"]:
        for p in r.get("processes") or []:
            rows.append([f"{r['shards']:,}", p["comm"], f"{p['fds']:,}", f"{p['maps']:,}",
                         f"{p['rss_anon_kb'] / 1024:.1f}", f"{p['rss_file_kb'] / 1024:.1f}"])
    out.append((f"Processes of the warm mount after the serve check (limits: {res['nofile'][0]:,} descriptors, "
                f"{res['max_map_count']} maps per process)",
                ["shards", "process", "descriptors", "memory maps", "anonymous MiB", "file-backed MiB"],
                rows, [True, False, True, True, True, True]))
    return out


def mount_resources(mountpoint: str) -> List[dict]:
    """Descriptors, memory maps and resident memory (anonymous, file-backed)
    of each process serving `mountpoint` (its command line names it)."""
    out = []
    for pid in sorted(int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"shardfs.fuse.mount" not in argv or os.fsencode(mountpoint) not in argv:
                continue
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/maps") as f:
                maps = sum(1 for _ in f)
            fields = {}
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    fields[name] = value.split()
            out.append({"pid": pid, "comm": comm, "fds": len(os.listdir(f"/proc/{pid}/fd")), "maps": maps,
                        "rss_anon_kb": int(fields["RssAnon"][0]), "rss_file_kb": int(fields["RssFile"][0])})
        except (OSError, KeyError, ValueError):
            continue  # gone meanwhile
    return out


def goal_lines(res: dict) -> List[str]:
    lines = []
    big = max(n for n in res["splits"] if n <= GOAL_SHARDS)
    stand = "" if big == GOAL_SHARDS else f" [{big:,} shards of {res['objects'] // big:,} objects stand in]"

    def v(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    label = f"{GOAL_SHARDS:,} shards"
    for kind in ("present", "absent"):
        x = ratio(res, big, "python", "index", kind)
        a, b = _rate(res["lookups"], big, "python", "index", kind), _rate(res["lookups"], 1, "python", "index", kind)
        if x is None:
            lines.append(f"MISSED {label} >= {GOAL_RATIO}x one shard ({kind}): not measured{stand}")
        else:
            lines.append(f"{v(x >= GOAL_RATIO)} {label} >= {GOAL_RATIO}x one shard ({kind}): "
                         f"ShardSet.find with the global index {a:,.0f}/s vs {b:,.0f}/s = {x:.2f}x{stand}")
    st = _find(res["start"], shards=big) or {}
    for cache, runs in (("cold cache", st.get("cold_runs_s")), ("warm cache", st.get("warm_s"))):
        val = min(runs) if runs else None
        if val is None:
            lines.append(f"MISSED mount answers in < {GOAL_START:g} s with {label} ({cache}): not measured{stand}")
        else:
            lines.append(f"{v(val < GOAL_START)} mount answers in < {GOAL_START:g} s with {label} ({cache}): "
                         f"{val:.3f} s (best of {len(runs)}: {', '.join(f'{x:.3f}' for x in runs)})" + stand)
    for kind in ("present", "absent"):
        x = ratio(res, big, "mount", "index", kind)
        a, b = _rate(res["lookups"], big, "mount", "index", kind), _rate(res["lookups"], 1, "mount", "index", kind)
        if x is None:
            lines.append(f"MISSED {label} >= {GOAL_RATIO}x one shard through the mount ({kind}): "
                         f"not measured{stand}")
        else:
            lines.append(f"{v(x >= GOAL_RATIO)} {label} >= {GOAL_RATIO}x one shard through the mount ({kind}): "
                         f"stat {a:,.0f}/s vs {b:,.0f}/s = {x:.2f}x ({res['threads']} threads){stand}")
    for n in [n for n in res["splits"] if n > GOAL_SHARDS]:
        chk = _find(res["checks"], shards=n)
        procs = (chk or {}).get("processes") or []
        if chk is None or not procs:
            lines.append(f"MISSED {n:,} shards mount and serve: no serve check (see the errors)")
            continue
        fds, maps = max(p["fds"] for p in procs), max(p["maps"] for p in procs)
        ok = (chk["wrong"] == 0 and chk.get("stats_shards") == n and fds <= res["nofile"][0]
              and maps <= int(res["max_map_count"]))
        lines.append(f"{v(ok)} {n:,} shards mount and serve: {chk.get('stats_shards') or 0:,} served, "
                     f"{chk['objects_read']:,} objects read and {chk['absent_stat']:,} absent names, "
                     f"{chk['wrong']} wrong; at most {fds:,} descriptors and {maps:,} maps per process "
                     f"(limits {res['nofile'][0]:,} and {res['max_map_count']})")
    return lines


def markdown(res: dict) -> str:
    m = res["machine"]
    p = res["plan"]
    out = [f"# Global index benchmark ({res['mode']})", "",
           f"{res['when']}, {m['cores']} cores ({m['cpu']}), {m['memory_bytes'] / 2**30:.0f} GiB RAM, "
           f"kernel {m['kernel']}, Python {m['python']}; open files limit {res['nofile']}, "
           f"vm.max_map_count {res['max_map_count']}. Command: `{res['command']}`. "
           f"Code: {res['git']}.", "",
           f"The same {res['objects']:,} objects of {SMALL_SIZES[0]}..{SMALL_SIZES[1]} bytes as "
           + ", ".join(f"{n:,} shard{'s' if n > 1 else ''} of {res['objects'] // n:,}" for n in res["splits"])
           + ". **Python**: `ShardSet.find` in one thread, best of "
           f"{p['reps']} passes over the same {p['py_lookups']:,} random present keys / random absent "
           "keys (32 random bytes); *index* = every shard in the global index (`IndexSet.add_shards`, "
           "`ShardSet.reload_index`), *filters* = no index, every sidecar built (the old way: each "
           f"lookup asks every shard's filter; a pass stops after {p['filters_budget'] / p['reps']:.0f} s). "
           "**Mount**: `shardfs mount --shard-dir DIR --layout flat`; cold = fresh `--cache-dir` "
           f"({p['cold_runs']} runs), warm = the cache the first cold mount left, index reused "
           f"({p['warm_runs']} runs); start = wall clock until "
           "`python -m shardfs mount` returns (interpreter start-up included), every run listed; the "
           f"stats are measured on the first warm mounts: `os.stat` of {p['stats']:,} random present names "
           f"and {p['stats']:,} random absent names per pass from {res['threads']} threads, best of "
           f"{p['reps']} passes, every name used once in the run. The shard counts up to 10,000 are "
           "measured side by side (their Python sets, then their warm mounts, open at once; pass r of "
           "each in turn, order rotated every round) so that the shared machine's load weighs on all "
           "alike. Ratios (in brackets): against the 1-shard figure of the same kind in this run. Shard "
           "files in the page cache.", ""]
    headers, rows, right = main_table(res)
    out += ["**Lookups per second and mount start**", ""] + md_table(headers, rows, right) + [""]
    for title, h, r, rt in other_tables(res):
        if r:
            out += [f"**{title}**", ""] + md_table(h, r, rt) + [""]
    if res["skipped"]:
        out += ["Not measured: " + "; ".join(res["skipped"]), ""]
    if res["errors"]:
        out += ["Errors (verbatim):", "", "```"] + [line for e in res["errors"] for line in (e, "")][:-1] + ["```", ""]
    out += ["Goals:", ""] + [f"    {line}" for line in res["goal_lines"]] + [""]
    return "\n".join(out)


def git_state() -> str:
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "shardfs"],
                               capture_output=True, text=True, timeout=30).stdout.split("\n")
        dirty = [line[3:] for line in dirty if line.strip()]
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"commit {head}" + (f" plus uncommitted changes to {', '.join(dirty)}" if dirty else "")


# ---------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="100,000 objects as 1, 100, 1,000 shards")
    mode.add_argument("--full", action="store_true", help="also 100,000 shards of 10 objects")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    ap.add_argument("--md", metavar="FILE", help="write the results as Markdown")
    ap.add_argument("--tmp", default="/tmp", help="where the scratch directory goes (default /tmp)")
    ap.add_argument("--data-dir", default=DATA_DIR, help="dataset cache (default bench/data)")
    ap.add_argument("--threads", type=int, default=4, help="threads for stat() through the mount (4)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes building datasets (default: the cores)")
    args = ap.parse_args(argv)
    mode_name = "quick" if args.quick else "full" if args.full else "default"
    plan = dict(PLANS[mode_name])
    signal.signal(signal.SIGTERM, _sigterm)
    scale_bench.MOUNT_TIMEOUT = MOUNT_TIMEOUT

    skipped: List[str] = []
    can_mount = machine.can_mount()
    if not can_mount:
        skipped.append("everything through a mount (no /dev/fuse, fusermount3 or pyfuse3)")
    try:
        from shardfs.gindex import IndexSet  # noqa: F401
    except ImportError as exc:
        print(f"index_bench.py: the global index is not importable: {exc}", file=sys.stderr)
        return 1

    log(f"index benchmark, {mode_name} mode: {plan['objects']:,} objects as "
        + ", ".join(f"{n:,}" for n in plan["splits"]) + " shards")
    dirs = dataset_dirs(args.data_dir, plan["objects"], plan["splits"], args.jobs)
    objs = Objects(plan["objects"])
    rnd = random.Random(f"shardfs-index:sample:{SEED}")
    py_present = rnd.sample(range(objs.count), min(objs.count, plan["py_lookups"]))
    py_absent = random_absent(plan["py_lookups"], 11)
    reps, n_stat = plan["reps"], plan["stats"]
    # Mount names: each used once in the whole run (all N, all passes).
    splits = plan["splits"]
    need = len(splits) * reps * n_stat + len(splits) * plan["check"]
    if need > objs.count:
        raise SystemExit(f"index_bench.py: {need:,} distinct names needed, {objs.count:,} objects")
    order = rnd.sample(range(objs.count), need)
    stat_present: Dict[int, List[List[int]]] = {}
    stat_absent: Dict[int, List[List[bytes]]] = {}
    checks: Dict[int, Tuple[List[int], List[bytes]]] = {}
    pos = 0
    for j, n in enumerate(splits):
        stat_present[n] = [order[pos + r * n_stat:pos + (r + 1) * n_stat] for r in range(reps)]
        pos += reps * n_stat
        checks[n] = (order[pos:pos + plan["check"]], random_absent(plan["check"], 100 + j))
        pos += plan["check"]
        stat_absent[n] = [random_absent(n_stat, 1000 + 10 * j + r) for r in range(reps)]

    tmp = tempfile.mkdtemp(prefix="index-bench-", dir=args.tmp)
    errors: List[str] = []
    lookup_rows: List[dict] = []
    index_rows: List[dict] = []
    run = MountRun(tmp, args.threads, plan)
    interrupted = False
    try:
        # The shard counts up to 10,000 together (sets / mounts up at once,
        # passes interleaved); 100,000 (--full) alone afterwards.
        groups = [[n for n in splits if n <= GOAL_SHARDS], [n for n in splits if n > GOAL_SHARDS]]
        for group in [g for g in groups if g]:
            if max(group) > GOAL_SHARDS:
                skipped.append(f"the Python level without the index (filters) for {max(group):,} shards: "
                               "every sidecar would be mapped at once (more maps than vm.max_map_count)")
            log("Python level: " + ", ".join(f"{n:,}" for n in group) + " shard(s)")
            rows, builds = python_level(group, dirs, objs, py_present, py_absent, plan, tmp, errors)
            lookup_rows += rows
            index_rows += builds
            if can_mount:
                run.run_group(group, dirs, objs, stat_present, stat_absent, checks)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: unmounting")
    finally:
        run.cleanup()
        if any(is_mounted(os.path.join(tmp, d)) for d in os.listdir(tmp)):
            log(f"something is still mounted under {tmp}: not removed")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if interrupted:
        return 130

    lookup_rows += run.lookup_rows
    res = {
        "benchmark": "index", "mode": mode_name, "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join([os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO)
                             else sys.executable, os.path.relpath(__file__, REPO)]
                            + list(argv if argv is not None else sys.argv[1:])),
        "git": git_state(), "machine": machine_info(), "threads": args.threads, "plan": plan,
        "objects": plan["objects"], "splits": splits,
        "nofile": list(__import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)),
        "max_map_count": open("/proc/sys/vm/max_map_count").read().strip(),
        "units": {"seconds": "wall-clock seconds", "lookups_per_s": "lookups per second (all threads)",
                  "bytes": "bytes; MB = 10^6"},
        "lookups": lookup_rows, "index": index_rows + run.index_rows, "start": run.start_rows,
        "checks": run.check_rows, "skipped": skipped, "errors": errors + run.errors,
        "wall_seconds": round(time.perf_counter() - scale_bench._t_start, 1),
    }
    res["goal_lines"] = goal_lines(res)
    headers, rows, right = main_table(res)
    res["table"] = table(headers, rows, right)
    for path, text in ((args.json, json.dumps(res, indent=1) + "\n"), (args.md, markdown(res))):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    print()
    print("\n".join(res["table"]))
    print()
    for title, h, r, rt in other_tables(res):
        if r:
            print(title)
            print("\n".join(table(h, r, rt)))
            print()
    for s in skipped:
        print(f"not measured: {s}")
    for e in res["errors"]:
        print(f"ERROR: {e}")
    for line in res["goal_lines"]:
        print(line)
    print(f"\n({res['git']}; {res['wall_seconds']} s"
          + (f"; wrote {', '.join(p for p in (args.json, args.md) if p)})" if args.json or args.md else ")"))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
