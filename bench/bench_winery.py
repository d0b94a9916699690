"""Random object reads on one winery deployment: winery's own reader against
shardfs (Python API and FUSE mount), and the cost of a database query.

Deployment: swh-objstorage's WineryObjStorage on a private PostgreSQL
(tests/pg_server.py), built as tests/winery_deploy.py does (swh's writer,
packer and cleaner; directory shards pool). harness.objects "small"
(1..4,096 B): 20,000 in ~8 read shards (packed images, state readonly,
write tables dropped) and 1,000 left in a write shard, in PostgreSQL
(--quick: 2,000 + 200). Reads: 5,000 random keys of the read shards
(quick 500) and every write-shard object in random order; the same keys
for every method; every reader uses the read-only role.

Methods, per location (read shards, write shards) x cold/warm, in
objects/s, MB/s (10^6 bytes of contents) and x winery-get:
  winery-get    WineryObjStorage(readonly=True).get({"sha256": key}): the peer
  api-get       shardfs.winery.WineryStore(dsn, pools_dir, cache_dir).get(key)
  api-batch     WineryStore.get_batch, 100 keys per call
  mount-read    `shardfs mount --winery`: os.open, os.read to EOF, os.close
                of MP/<hex key> in this process, 1 thread
  mount-read-4  the same from 4 threads
  xargs-cat     `xargs -d '\\n' -a LIST cat | sha256sum` over the mount's paths
  libpq, psycopg (write shards only; in µs per object, beside api-get and
                mount-read): the query of shardfs.winery.Reader.fetch
                (_row_query: the object's shard and bytes in one query),
                which WineryStore.get makes once per object in a write table.
                The mount makes one query per request: LOOKUP's present()
                (the same query, the size for the bytes) and READ's (fetch,
                or the row alone when its worker located the key): 2 per
                object. From C (bench/c/pq_lookup.c: libpq, prepared, binary)
                and from Python (psycopg: one connection, shardfs's session
                settings, conn.execute().fetchall() as shardfs's Database).
  Through swh-objstorage's interface (`{"sha256": key}` ids):
  pathslicing   swh's PathSlicingObjStorage over the same objects as files
                (slicing 0:2/2:4, no compression, primary hash sha256)
  os-shardfs, os-shardfs-batch  get_objstorage("shardfs", winery=...): get,
                and get_batch of 100 (winery-get is winery's objstorage)
  rpc-winery, rpc-pathslicing, rpc-shardfs, rpc-shardfs-batch  the same
                backends behind swh's RPC server (its WSGI app under gunicorn
                --preload, 2 sync workers), read with its `remote` client
Cold: PostgreSQL restarted, the reader made afresh (a new WineryObjStorage,
WineryStore or connection; the mount remounted) and primed without reading
an object (images opened, connections made), then sync and drop_caches,
then the clock (pq_lookup connects and prepares after the drop, before its
clock). Warm: the same keys again, same reader. Every byte is checked:
sha256(content) == key per object after the clock, or the SHA-256 of the
stream (xargs-cat inside the clock, libpq after it). Figures are medians of
interleaved rounds (3, quick 1); ratios the median of each round's ratio.

Pools (`--pool`): `directory` (swh's ShardBackedPool: Read Shard images,
results in winery.md), `mosaic` (swh's MosaicBackedPool, MOSAIC files,
zstd level 3: winery-mosaic.md) and `mosaic-raw` (uncompressed:
winery-mosaic-raw.md); bench_winery_mosaic.py runs the two MOSAIC ones,
the readers that matter there (winery-get, api-get, api-batch, mount-read,
mount-read-4, os-shardfs, os-shardfs-batch).

Goals (issue: ">= 5x winery's reader for objects in read shards"): api-get,
mount-read, mount-read-4 and os-shardfs >= 5x winery-get's objects/s, and
rpc-shardfs >= 2x rpc-winery's, objects in read shards, cold and warm (10
GOAL lines).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import random
import shutil
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from harness import (Results, Target, abort_fuse, compile_c, drop_caches, deb_version, fmt,  # noqa: E402
                     log, main_args, objects, ratio, rounds, sh, threaded, times)
from swh_rpc import objstorage_server  # noqa: E402

WORK = "/tmp/bench-winery"
LOCATIONS = {"read": "read shards", "write": "write shards"}
TEMPS = ("cold", "warm")
BATCH, THREADS, GOAL, TIMEOUT = 100, 4, 5.0, 600
METHODS = {
    "winery-get": "winery WineryObjStorage.get (peer)",
    "api-get": "shardfs WineryStore.get",
    "api-batch": f"shardfs WineryStore.get_batch ({BATCH})",
    "mount-read": "mount: open/read/close, 1 thread",
    "mount-read-4": f"mount: open/read/close, {THREADS} threads",
    "xargs-cat": "mount: xargs cat, piped to sha256sum",
    "pathslicing": "swh PathSlicingObjStorage.get (same objects as files)",
    "os-shardfs": "shardfs objstorage get",
    "os-shardfs-batch": f"shardfs objstorage get_batch ({BATCH})",
    "rpc-winery": "RPC: winery objstorage get",
    "rpc-pathslicing": "RPC: pathslicing get",
    "rpc-shardfs": "RPC: shardfs objstorage get",
    "rpc-shardfs-batch": f"RPC: shardfs objstorage get_batch ({BATCH})",
    "libpq": "the query from C (libpq)",
    "psycopg": "the query from Python (psycopg)",
}
QUERIES = ("libpq", "psycopg")


class Bench:
    """The deployment, its keys, and one reader at a time."""

    def __init__(self, quick: bool, pool: str = "directory"):
        from pg_server import PostgresServer
        from winery_deploy import Deployment
        from shardfs.winery import WineryStore

        n_read, n_write = (2000, 200) if quick else (20000, 1000)
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(WORK)
        os.chmod(WORK, 0o711)  # PostgreSQL runs as the postgres user in here
        self.server = PostgresServer(base_dir=WORK)
        pairs = list(objects(n_read + n_write, "small", 1))
        self.contents = dict(pairs)
        ro, rw = [c for _, c in pairs[:n_read]], [c for _, c in pairs[n_read:]]
        kind = {"directory": {}, "mosaic": {"pool_type": "mosaic", "pool_name": "mosaics", "compression_level": 3},
                "mosaic-raw": {"pool_type": "mosaic", "pool_name": "mosaics"}}[pool]
        self.pool = pool
        self.dep = Deployment(self.server, f"{WORK}/pools", shard_max_size=sum(map(len, ro)) // 8 + 1, **kind)
        log(f"winery: adding {n_read:,} objects through swh's writer, packing, cleaning, then {n_write:,} more")
        t0 = time.monotonic()
        ro_keys = self.dep.add_many(ro)
        self.dep.release()
        self.read_shards = self.dep.pack_full()
        self.dep.clean()
        rw_keys = self.dep.add_many(rw)
        self.dep.close()  # swh's writer: the writing shard goes back to standby
        with self.dep.connect() as c:
            where = dict(c.execute("SELECT o.signature, s.state::text FROM signature2shard o "
                                   "JOIN shards s ON s.id = o.shard WHERE o.state = 'present'").fetchall())
        if any(where.get(k) != "readonly" for k in ro_keys) or \
                any(where.get(k) not in ("writing", "standby", "full") for k in rw_keys):
            raise RuntimeError("objects are not where the benchmark put them")
        self.build_s = time.monotonic() - t0
        pick = random.Random(2)
        self.keys = {"read": pick.sample(ro_keys, 500 if quick else 5000), "write": pick.sample(rw_keys, n_write)}
        self.bytes = {loc: sum(len(self.contents[k]) for k in ks) for loc, ks in self.keys.items()}
        self.dsn, self.cache = self.dep.readonly_dsn, f"{WORK}/cache"
        self.mount = Target("mount", "shardfs mount --winery", "shardfs", f"{WORK}/mnt",
                            sources=["--winery", self.dsn, "--winery-pools-dir", self.dep.pools_dir],
                            options=[f"cache_dir={self.cache}"])
        self.mount.fresh()  # untimed: the images' sidecars built into the cache every reader uses
        self.sidecars = self.mount.wait_ready()[0]
        self.mount.umount()
        self.lists, self.stream = {}, {}
        for loc, ks in self.keys.items():
            self.lists[loc] = f"{WORK}/{loc}.list"
            with open(self.lists[loc], "w") as f:
                f.write("".join(f"{self.mount.path}/{k.hex()}\n" for k in ks))
            with open(f"{WORK}/{loc}.keys", "w") as f:
                f.write("".join(k.hex() + "\n" for k in ks))
            self.stream[loc] = hashlib.sha256(b"".join(self.contents[k] for k in ks)).hexdigest()
        store = WineryStore(self.dsn, pools_dir=self.dep.pools_dir, cache_dir=self.cache)
        self.sql = store.reader._row_query("substring(content FROM %(start)s FOR %(length)s)")
        store.close()
        self.pq_sql = (self.sql.replace("%(key)s", "$1").replace("%(start)s", "$2")
                       .replace("%(length)s", "$3").replace("%%", "%"))
        from swh.objstorage.factory import get_objstorage
        self.configs = {
            "winery": {"cls": "winery", "database": {"db": self.dsn}, "shards_pools": [self.dep.pool_settings],
                       "readonly": True},
            "pathslicing": {"cls": "pathslicing", "root": f"{WORK}/pathslicing", "slicing": "0:2/2:4",
                            "compression": "none", "primary_hash": "sha256"},
            "shardfs": {"cls": "shardfs", "winery": {"dsn": self.dsn, "pools_dir": self.dep.pools_dir},
                        "cache_dir": self.cache}}
        os.makedirs(f"{WORK}/pathslicing")
        files = get_objstorage(**self.configs["pathslicing"])
        for key, content in self.contents.items():
            files.add(content, {"sha256": key}, check_presence=False)
        os.sync()
        self.rpc = None
        self.pq_lookup = compile_c("pq_lookup", ["-I" + sh(["pg_config", "--includedir"]).decode().strip(), "-lpq"])
        self.handle = None

    def versions(self) -> str:
        with self.dep.connect() as c:
            pg = c.execute("SHOW server_version").fetchone()[0]
        py = {d: importlib.metadata.version(d) for d in ("swh.objstorage", "swh.shard", "psycopg", "pyfuse3")}
        return (f"PostgreSQL {pg}; " + ", ".join(f"{d} {v}" for d, v in py.items())
                + f"; fuse3 {deb_version('fuse3')}")

    # ------------------------------------------------------------ readers

    def open(self, method: str):
        """A new reader for `method`, primed without reading an object."""
        if method == "winery-get":
            from swh.objstorage.backends.winery.objstorage import WineryObjStorage
            st = WineryObjStorage(database={"db": self.dsn}, shards_pools=[self.dep.pool_settings], readonly=True)
            for name in self.read_shards:
                st.reader.roshard(name)  # its image opened, as shardfs opens images when it starts
            if {"sha256": b"\0" * 32} in st:  # the connections made
                raise RuntimeError("winery holds the all-zero key")
            return st
        if method in ("pathslicing", "os-shardfs", "os-shardfs-batch") or method.startswith("rpc-"):
            from swh.objstorage.factory import get_objstorage
            backend = method.split("-")[1] if "-" in method else method
            if method.startswith("rpc-"):  # answering: its app loaded, its workers forked
                self.rpc = contextlib.ExitStack()
                st = self.rpc.enter_context(objstorage_server(self.configs[backend], WORK))
            else:
                st = get_objstorage(**self.configs[backend])
            for _ in range(4):  # the backend opened in every worker, connections made
                if {"sha256": b"\0" * 32} in st:
                    raise RuntimeError("the objstorage holds the all-zero key")
            return st
        if method in ("api-get", "api-batch"):
            from shardfs.winery import WineryStore
            return WineryStore(self.dsn, pools_dir=self.dep.pools_dir, cache_dir=self.cache)
        if method == "psycopg":
            import psycopg
            from shardfs.winery import connection_kwargs
            conn = psycopg.connect(self.dsn, **connection_kwargs("bench psycopg"))
            conn.execute(self.sql, {"key": b"\0" * 32, "start": 1, "length": 1}).fetchall()
            return conn
        if method == "libpq":
            return "pq_lookup"  # connects in its own process
        self.mount.fresh()
        for i in range(8):  # absent names: the workers connect to the database
            if os.path.exists(f"{self.mount.path}/{i:064x}"):
                raise RuntimeError("the mount shows an absent key")
        return self.mount.path

    def close(self, method: str) -> None:
        handle, self.handle = self.handle, None
        if handle is None:
            return
        if method == "winery-get":
            from winery_deploy import _close_database
            try:
                handle.on_shutdown()
            finally:
                for db in [handle.reader.base, *handle.reader.rw_shards.values()]:
                    _close_database(db)
        elif method in ("api-get", "api-batch", "psycopg", "os-shardfs", "os-shardfs-batch"):
            handle.close()
        elif method.startswith("rpc-"):
            stack, self.rpc = self.rpc, None
            stack.close()
        elif method.startswith(("mount", "xargs")):
            self.mount.umount()

    def read(self, method: str, keys: list, loc: str) -> tuple:
        """Read every key once: (seconds, contents in key order, or None
        when the stream was checked already)."""
        h, out = self.handle, []
        if method == "libpq":
            r = json.loads(sh([self.pq_lookup, self.dsn, self.pq_sql, f"{WORK}/{loc}.keys", f"{WORK}/libpq.out"],
                              TIMEOUT))
            with open(f"{WORK}/libpq.out", "rb") as f:
                check_stream(hashlib.sha256(f.read()).hexdigest(), self.stream[loc])
            return r["seconds"], None
        t0 = time.perf_counter()
        if method in ("winery-get", "pathslicing", "os-shardfs") or method.startswith("rpc-") \
                and not method.endswith("batch"):
            out = [h.get({"sha256": k}) for k in keys]
        elif method in ("os-shardfs-batch", "rpc-shardfs-batch"):
            for i in range(0, len(keys), BATCH):
                out += h.get_batch([{"sha256": k} for k in keys[i:i + BATCH]])
        elif method == "api-get":
            out = [h.get(k) for k in keys]
        elif method == "api-batch":
            for i in range(0, len(keys), BATCH):
                out += h.get_batch(keys[i:i + BATCH])
        elif method == "psycopg":
            out = [bytes(h.execute(self.sql, {"key": k, "start": 1, "length": 2**31 - 1}).fetchall()[0][1])
                   for k in keys]
        else:  # through the mount; a hung mount must not wedge the run
            dog = threading.Timer(TIMEOUT, abort_fuse, [h])
            dog.start()
            try:
                if method == "xargs-cat":
                    digest = sh(["bash", "-c", f"set -o pipefail; xargs -d '\\n' -a {self.lists[loc]} cat | sha256sum"],
                                TIMEOUT).split()[0].decode()
                    seconds = time.perf_counter() - t0
                    check_stream(digest, self.stream[loc])
                    return seconds, None
                out = [None] * len(keys)
                index = {k: i for i, k in enumerate(keys)}

                def work(share):
                    for k in share:
                        fd = os.open(f"{h}/{k.hex()}", os.O_RDONLY)
                        try:
                            chunks = [os.read(fd, 1 << 20)]
                            while chunks[-1]:
                                chunks.append(os.read(fd, 1 << 20))
                        finally:
                            os.close(fd)
                        out[index[k]] = b"".join(chunks)
                return threaded(work, keys, THREADS if method == "mount-read-4" else 1), out
            finally:
                dog.cancel()
        return time.perf_counter() - t0, out

    def measure(self, method: str, loc: str, temp: str) -> dict:
        keys = self.keys[loc]
        try:
            if temp == "cold":
                self.close(method)
                self.server.restart()
                self.handle = self.open(method)
                drop_caches()
            elif self.handle is None:
                raise RuntimeError("not measured: the cold pass failed")
            queries = getattr(getattr(self.handle, "db", None), "queries", None)
            seconds, out = self.read(method, keys, loc)
        except Exception as exc:  # noqa: BLE001 - the figure is "not measured", the run goes on
            self.close(method)
            raise RuntimeError(f"{type(exc).__name__}: {str(exc).strip()[:300]}") from exc
        if out is not None:
            bad = sum(1 for k, d in zip(keys, out) if not isinstance(d, bytes) or hashlib.sha256(d).digest() != k)
            if bad or len(out) != len(keys):
                raise ValueError(f"WRONG BYTES: {bad} of {len(keys)} objects do not hash to their key")
        extra = {"queries_per_object": (self.handle.db.queries - queries) / len(keys)} if queries is not None else {}
        return {"value": len(keys) / seconds, "mb_s": self.bytes[loc] / seconds / 1e6, "seconds": seconds,
                "objects": len(keys), **extra}


def check_stream(got: str, expected: str) -> None:
    if got != expected:
        raise ValueError(f"WRONG BYTES: the stream hashes to {got[:16]}..., expected {expected[:16]}...")


def report(res: Results, b: Bench, methods: list) -> None:
    for loc, where in LOCATIONS.items():
        rows = []
        for m in methods:
            if m in QUERIES:
                continue
            cells = []
            for t in TEMPS:
                r = res.ratio_of_rounds(f"{loc} {t}", m, "winery-get")
                cells += [fmt(res.value(f"{loc} {t}", m)), fmt(res.value(f"{loc} {t}", m, "mb_s"), 1),
                          "1 (peer)" if m == "winery-get" else times(r)]
            rows.append([METHODS[m], *cells])
        res.table(["method", "cold objects/s", "cold MB/s", "cold × winery", "warm objects/s", "warm MB/s",
                   "warm × winery"], rows,
                  f"### Objects in {where}: {len(b.keys[loc]):,} random reads")
    us = {(m, t): ratio(1e6, res.value(f"write {t}", m)) for m in ("libpq", "psycopg", "api-get", "mount-read")
          for t in TEMPS}
    res.table(["method", "cold µs/object", "warm µs/object", "cold / libpq", "warm / libpq"],
              [[METHODS[m], fmt(us[m, "cold"], 1), fmt(us[m, "warm"], 1),
                *(times(ratio(us[m, t], us["libpq", t])) for t in TEMPS)]
               for m in ("libpq", "psycopg", "api-get", "mount-read") if m in methods],
              "### An object only in PostgreSQL: the query (libpq, psycopg) and what readers see, "
              "write shards, µs per object")
    gap = us["psycopg", "cold"] - us["libpq", "cold"] if us["psycopg", "cold"] and us["libpq", "cold"] else None
    res.text(f"Python's share of an object only in PostgreSQL, cold: psycopg − libpq = {fmt(gap, 1)} µs per "
             f"query, of {fmt(us['mount-read', 'cold'], 1)} µs per object through the mount (2 requests, LOOKUP "
             "and READ, one query each). Warm reads through the mount are answered from the kernel's caches: "
             "no request reaches shardfs, no query. "
             f"WineryStore.get makes {fmt(res.value('write warm', 'api-get', 'queries_per_object'), 2)} "
             f"queries per object in write shards, {fmt(res.value('read warm', 'api-get', 'queries_per_object'), 2)} "
             "in read shards.\n\nThe query (psycopg's form; pq_lookup binds the same with $1..$3):\n\n"
             f"```sql\n{b.sql}\n```")
    for m, base, need, title in (
            ("api-get", "winery-get", GOAL, "WineryStore.get"),
            ("mount-read", "winery-get", GOAL, "open/read/close through the mount"),
            ("mount-read-4", "winery-get", GOAL, f"the same, {THREADS} reader threads"),
            ("os-shardfs", "winery-get", GOAL, "the shardfs objstorage's get"),
            ("rpc-shardfs", "rpc-winery", 2.0, "the shardfs objstorage's get through swh's RPC server")):
        if m not in methods or base not in methods:
            continue  # not run (--only)
        for t in TEMPS:
            r = res.ratio_of_rounds(f"read {t}", m, base)
            res.goal(f"{title} >= {need:g}x winery's {'through RPC' if base != 'winery-get' else 'objstorage'}, "
                     f"objects in read shards, {t}", r, ">=", need,
                     shown=f"{fmt(res.value(f'read {t}', m))} vs {fmt(res.value(f'read {t}', base))} "
                     f"objects/s = {times(r)}" if r else "")


POOLS = {"directory": "", "mosaic": ", a mosaic pool (MOSAIC files, zstd level 3)",
         "mosaic-raw": ", a mosaic pool (MOSAIC files, uncompressed)"}


def main(argv=None) -> int:
    def extra(p):
        p.add_argument("--pool", choices=list(POOLS), default="directory",
                       help="the type of the deployment's shards pool (default: directory)")

    args = main_args(__doc__.split("\n\n")[0], argv, extra=extra)
    methods = [m for m in METHODS if not args.only or m in args.only or m == "winery-get"]
    name = "winery" if args.pool == "directory" else f"winery-{args.pool}"
    res = Results(name, "Random object reads on one winery deployment" + POOLS[args.pool]
                  + ": winery's reader against shardfs",
                  args.quick, (["--quick"] if args.quick else []) + (["--pool", args.pool] if name != "winery" else []))
    b = None
    try:
        b = Bench(args.quick, args.pool)
        cells = [(loc, m) for loc in LOCATIONS for m in methods if not (loc == "read" and m in QUERIES)]

        def cell(r, item):
            loc, m = item
            try:
                for t in TEMPS:
                    res.attempt(f"{loc} {t}", m, r, lambda: b.measure(m, loc, t))
            finally:
                b.close(m)

        rounds(args.rounds, cells, cell)
        res.text(f"Deployment (built in {b.build_s:.0f} s): {len(b.read_shards)} read shards, "
                 f"{sum(map(len, b.contents.values())) / 1e6:.1f} MB in all, sidecars built in "
                 f"{fmt(b.sidecars, 1)} s; {b.versions()}. {args.rounds} interleaved round(s), medians; "
                 "every run is in winery.json. Method and cold/warm definitions: the docstring of "
                 "bench/bench_winery.py.")
        report(res, b, methods)
    finally:
        if b is not None:
            b.mount.umount()
            b.server.destroy()
            shutil.rmtree(WORK, ignore_errors=True)
    res.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
