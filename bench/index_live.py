"""Live pickup at 10,000 shards: mount a directory of 10,000 shards (the
dataset `make bench-index` caches under bench/data/), wait for the global
index to cover them, then rename a new shard into the directory and time
until its object is served, and until it is indexed.

    .venv/bin/python bench/index_live.py      # after make bench-index
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from shardfs import ShardWriter  # noqa: E402

src = os.path.join(ROOT, "bench/data/index-n1000000-x10000-s1/shards")
d = tempfile.mkdtemp(dir="/var/tmp"); sd = os.path.join(d, "shards"); os.mkdir(sd)
for n in os.listdir(src): os.link(os.path.join(src, n), os.path.join(sd, n))
mp = os.path.join(d, "m"); os.mkdir(mp); cache = os.path.join(d, "cache")
py = sys.executable
t = time.monotonic()
subprocess.run([py, "-m", "shardfs", "mount", "--shard-dir", sd, "--layout", "flat", "--cache-dir", cache, mp], check=True)
print(f"mount returned after {time.monotonic()-t:.2f} s (cold cache)")
try:
    def st(): return json.loads(os.getxattr(mp, "user.shardfs.stats"))
    while (st()["index"] or {}).get("indexed_shards", 0) < 10000: time.sleep(0.5)
    print(f"index covers 10,000 shards after {time.monotonic()-t:.2f} s")
    data = b"a new object in a new shard"; key = hashlib.sha256(data).hexdigest()
    with ShardWriter(os.path.join(d, "new.shard")) as w: w.add(bytes.fromhex(key), data)
    t0 = time.monotonic(); os.rename(os.path.join(d, "new.shard"), os.path.join(sd, "zz-new.shard"))
    while not os.path.exists(os.path.join(mp, key)): time.sleep(0.02)
    print(f"new shard served after {time.monotonic()-t0:.2f} s; content ok: {open(os.path.join(mp, key),'rb').read() == data}")
    while st()["index"]["indexed_shards"] < 10001: time.sleep(0.1)
    print(f"and indexed after {time.monotonic()-t0:.2f} s; levels {st()['index']['levels']}")
finally:
    subprocess.run([py, "-m", "shardfs", "umount", mp])
    shutil.rmtree(d)
