"""What an object only in a winery database costs: libpq from C against
psycopg from Python, and the mount's path.

A winery mount serves objects that are not yet packed into a shard image
from PostgreSQL: a C request thread hands them to the Python handlers,
which query with psycopg. The other design is a C thread querying with
libpq directly. This measures both on the same database, keys and queries
(the two indexed queries of a database object: its shard in
signature2shard, then its row in that shard's write table), and what the
reader sees (shardfs.winery.WineryStore.get, and open/read/close through a
winery mount). One round each, in turn, `--rounds` times; medians.

    .venv/bin/python bench/winery_query.py [--objects N] [--rounds R]

Writes bench/results/winery_query.{md,json}. Needs root (PostgreSQL runs
as postgres; the mount), gcc and libpq-dev (make deps installs them).
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
SHARDFS = [sys.executable, "-m", "shardfs"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def psycopg_queries(dsn, table, keys):
    """The two queries per key with psycopg (prepared, binary): seconds."""
    import psycopg
    from psycopg import sql

    content = sql.SQL("SELECT content FROM {} WHERE key = %s").format(sql.Identifier(table))
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.monotonic()
        for key in keys:
            if conn.execute("SELECT shard FROM signature2shard WHERE signature = %s AND state = 'present'",
                            (key,), prepare=True, binary=True).fetchone() is None:
                raise RuntimeError("psycopg: a key is not present")
            if conn.execute(content, (key,), prepare=True, binary=True).fetchone() is None:
                raise RuntimeError("psycopg: a key has no row")
        return time.monotonic() - t0


def libpq_queries(exe, dsn, table, keyfile, n):
    out = subprocess.run([exe, dsn, table, keyfile], capture_output=True, text=True, check=True, timeout=600)
    r = json.loads(out.stdout)
    if r["objects"] != n:
        raise RuntimeError(f"pq_lookup read {r['objects']} objects")
    return r["seconds"]


def store_gets(dsn, pools, cache, keys, contents):
    from shardfs.winery import WineryStore

    store = WineryStore(dsn, pools_dir=pools, cache_dir=cache)
    try:
        store.get(keys[0])  # connections made
        t0 = time.monotonic()
        for key in keys:
            if store.get(key) != contents[key]:
                raise RuntimeError("WineryStore.get: wrong bytes")
        return time.monotonic() - t0
    finally:
        store.close()


def mount_reads(dsn, pools, cache, mp, keys, contents):
    subprocess.run(SHARDFS + ["mount", "--winery", dsn, "--winery-pools-dir", pools, "--cache-dir", cache, mp],
                   check=True, capture_output=True, timeout=120)
    try:
        os.stat(os.path.join(mp, keys[0].hex()))  # the workers' connections made
        t0 = time.monotonic()
        for key in keys:
            fd = os.open(os.path.join(mp, key.hex()), os.O_RDONLY)
            try:
                data = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
            if data != contents[key]:
                raise RuntimeError("mount: wrong bytes")
        return time.monotonic() - t0
    finally:
        subprocess.run(SHARDFS + ["umount", mp], capture_output=True, timeout=60)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    from pg_server import PostgresServer
    from winery_deploy import Deployment

    work = tempfile.mkdtemp(prefix="shardfs-winery-query-")
    os.chmod(work, 0o711)
    exe = os.path.join(work, "pq_lookup")
    include = subprocess.run(["pg_config", "--includedir"], capture_output=True, text=True,
                             check=True).stdout.strip()
    subprocess.run(["gcc", "-O2", f"-I{include}", "-o", exe, os.path.join(HERE, "c", "pq_lookup.c"), "-lpq"],
                   check=True)
    server = PostgresServer(base_dir=work)
    dep = None
    try:
        rnd = random.Random(1)
        blobs = [rnd.randbytes(rnd.randint(1, 8192)) for _ in range(args.objects)]
        # One write shard that never fills: every object stays in PostgreSQL.
        dep = Deployment(server, os.path.join(work, "pools"), shard_max_size=1 << 40)
        log(f"winery_query: {args.objects} objects into a write shard ...")
        keys = dep.add_many(blobs)
        contents = dict(zip(keys, blobs))
        (table,) = dep.shard_tables()
        table = "shard_" + table
        order = list(keys)
        rnd.shuffle(order)
        keyfile = os.path.join(work, "keys")
        with open(keyfile, "w") as f:
            f.write("".join(k.hex() + "\n" for k in order))
        dsn, mp = dep.readonly_dsn, os.path.join(work, "mnt")
        os.makedirs(mp)
        methods = {
            "libpq (C), 2 queries": lambda: libpq_queries(exe, dsn, table, keyfile, len(order)),
            "psycopg (Python), 2 queries": lambda: psycopg_queries(dsn, table, order),
            "shardfs WineryStore.get": lambda: store_gets(dsn, dep.pools_dir, os.path.join(work, "cache"),
                                                          order, contents),
            "mount: open/read/close": lambda: mount_reads(dsn, dep.pools_dir, os.path.join(work, "cache"), mp,
                                                          order, contents),
        }
        runs = {m: [] for m in methods}
        for rnd_i in range(args.rounds):
            for m, fn in methods.items():
                s = fn()
                runs[m].append(s / len(order) * 1e6)
                log(f"round {rnd_i + 1}/{args.rounds} {m}: {runs[m][-1]:.1f} us/object")
    finally:
        if dep is not None:
            dep.close()
        server.stop()
    med = {m: statistics.median(v) for m, v in runs.items()}
    base = med["libpq (C), 2 queries"]
    lines = [
        "# Objects only in a winery database: libpq from C against psycopg from Python",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; {args.objects} objects "
        f"of 1 B-8 KiB in one write shard (PostgreSQL, a private server on this machine, read-only role), "
        f"read once each in random order per run; median of {args.rounds} interleaved rounds. "
        "Command: `.venv/bin/python bench/winery_query.py`.",
        "",
        "| method | µs per object (median) | every run | / libpq |",
        "|---|---:|---|---:|",
    ]
    for m, v in runs.items():
        lines.append(f"| {m} | {med[m]:.1f} | {' / '.join(f'{x:.1f}' for x in v)} | {med[m] / base:.2f}× |")
    lines += ["", f"Python's share of a database object through the mount: psycopg − libpq = "
                  f"{med['psycopg (Python), 2 queries'] - base:.1f} µs of {med['mount: open/read/close']:.1f} µs."]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "winery_query.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "winery_query.json"), "w") as f:
        json.dump({"objects": args.objects, "rounds": args.rounds, "us_per_object": runs}, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
