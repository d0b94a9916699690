"""Peak memory of ShardWriter per key (cmph's perfect hash build included).

Builds shards of N empty objects in a fresh child process each and prints the
peak RSS (VmHWM) above an interpreter that imported shardfs, divided by N.

    python bench/writer_memory.py [N ...]     (default: 100000 1000000 4000000)
"""
import os
import re
import subprocess
import sys
import tempfile

CHILD = r"""
import hashlib, re, sys, shardfs
def hwm():
    return int(re.search(r'VmHWM:\s+(\d+)', open('/proc/self/status').read()).group(1)) * 1024
n, path = int(sys.argv[1]), sys.argv[2]
keys = None
base = hwm()
with shardfs.ShardWriter(path) as w:
    key = bytearray(32)
    for i in range(n):
        key[:8] = i.to_bytes(8, 'little')
        key[8:16] = (i * 0x9E3779B97F4A7C15 % (1 << 64)).to_bytes(8, 'little')
        w.add(key, b'')
print(base, hwm())
"""


def main(sizes):
    print(f"{'keys':>10} {'peak RSS above baseline':>24} {'bytes/key':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = os.path.join(tmp, f"{n}.shard")
            out = subprocess.run([sys.executable, "-c", CHILD, str(n), path], check=True,
                                 capture_output=True, text=True).stdout.split()
            base, peak = int(out[0]), int(out[1])
            print(f"{n:>10,} {(peak - base) / 2**20:>20.1f} MiB {(peak - base) / n:>10.1f}")
            os.unlink(path)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100_000, 1_000_000, 4_000_000])
