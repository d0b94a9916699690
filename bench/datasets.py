"""Seeded, reproducible benchmark datasets: one shard plus the same objects as plain files.

A dataset is identified by (kind, count, seed) and cached under
``bench/data/<kind>-n<count>-s<seed>/`` (bench/data/ is gitignored), so that
reruns reuse it:

    objects.shard      the Read Shard, built with shardfs.ShardWriter
    native/ab/cd/<key> the same objects as plain files on the same disk, in the
                       "pathslicing" layout of Software Heritage's older object
                       storage (slicing 0:2/2:4 of the 64-hex key): the native
                       baseline the FUSE mount is compared with
    objects.tsv        "<64-hex key>\\t<size>" per object, in storage order
                       (= insertion order into the shard = the order the
                       native files were written)
    dataset.json       kind, count, seed, sizes; written last, so a dataset
                       without it is incomplete and gets rebuilt

Kinds (sizes in bytes):

    small  sizes uniform in [1, 4096]          many small objects
    large  sizes uniform in [1, 100,000,000]   few large objects
    mix    lognormal, median 4096, sigma 2.0, clipped to [1, 100,000,000]:
           like the archive, mostly small objects with a long tail
           (mean ~30 KB, p99 ~430 KB, p99.9 ~2 MB)

Contents come from a pool of 64 MiB of seeded random bytes: each object is a
slice of the pool at a seeded random offset (wrapping around for objects
larger than the pool) whose first 8 bytes are XORed with a hash of the
object's index, so contents differ, keys are unique and nothing compresses;
generation costs a copy and a SHA-256 per object, never /dev/urandom. The key
is the SHA-256 of the content, as in the archive (``shardfs check --hash``
passes). Objects of 1 or 2 bytes have only 256 or 65536 possible contents: a
content already present is redrawn (new offset), and after a few tries the
size itself is redrawn, so a dataset always has exactly `count` distinct
objects (this only changes the size distribution for huge counts).

Before writing anything, the free space (and free inodes) of the data
directory are checked against the exact sizes the seed gives; when short the
command fails with a one-line error and exit status 1.

    python bench/datasets.py --kind small --count 10000 [--seed 1] [--data-dir DIR] [--force]

Library use (bench/fio_bench.py): ``ensure(kind, count, seed)`` returns a
`Dataset`.
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_DATA_DIR = os.path.join(HERE, "data")

#: Bytes of seeded random data every object is cut from.
POOL_SIZE = 64 << 20
#: Largest object of any kind (the archive's limit for one content).
MAX_OBJECT = 100_000_000
#: Median and sigma (of the natural log) of the "mix" kind.
MIX_MEDIAN = 4096
MIX_SIGMA = 2.0
KINDS = ("small", "large", "mix")
#: Bumped when the generation changes, so stale caches are rebuilt.
FORMAT_VERSION = 1
#: Tries with a new offset before the size of a duplicate object is redrawn.
DUPLICATE_TRIES = 4


class DatasetError(Exception):
    """A dataset cannot be built (not enough space, bad arguments)."""


@dataclass
class Dataset:
    """A complete dataset on disk (see the module docstring for the layout)."""

    kind: str
    count: int
    seed: int
    path: str
    #: 64-hex keys in storage order.
    keys: List[str] = field(repr=False)
    #: Sizes in bytes, same order as keys.
    sizes: List[int] = field(repr=False)

    @property
    def name(self) -> str:
        return dataset_name(self.kind, self.count, self.seed)

    @property
    def shard(self) -> str:
        return os.path.join(self.path, "objects.shard")

    @property
    def native_dir(self) -> str:
        return os.path.join(self.path, "native")

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    @staticmethod
    def native_relpath(key: str) -> str:
        """Path of an object's plain file relative to native_dir: ab/cd/<key>."""
        return f"{key[0:2]}/{key[2:4]}/{key}"


def dataset_name(kind: str, count: int, seed: int) -> str:
    return f"{kind}-n{count}-s{seed}"


# ------------------------------------------------------------ generation


def draw_size(kind: str, rng: random.Random) -> int:
    """One object size of the given kind, in bytes (>= 1)."""
    if kind == "small":
        return rng.randint(1, 4096)
    if kind == "large":
        return rng.randint(1, MAX_OBJECT)
    if kind == "mix":
        size = int(round(rng.lognormvariate(math.log(MIX_MEDIAN), MIX_SIGMA)))
        return min(max(size, 1), MAX_OBJECT)
    raise DatasetError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")


def draw_sizes(kind: str, count: int, seed: int) -> array.array:
    """The `count` sizes the seed gives, in storage order (before any
    duplicate redraw, which is rare and only shrinks or grows tiny objects)."""
    rng = random.Random(f"shardfs-bench:{kind}:{seed}:sizes")
    return array.array("Q", (draw_size(kind, rng) for _ in range(count)))


def make_pool(seed: int) -> bytes:
    """POOL_SIZE seeded random bytes (incompressible)."""
    return random.Random(f"shardfs-bench:pool:{seed}").randbytes(POOL_SIZE)


def payload(pool: bytes, offset: int, size: int, tag: int) -> bytes:
    """`size` bytes of the pool from `offset` (wrapping around), the first
    min(size, 8) of them XORed with `tag`."""
    if offset + size <= len(pool):
        body = pool[offset:offset + size]
    else:
        parts, need, pos = [], size, offset
        while need:
            piece = pool[pos:pos + need]
            parts.append(piece)
            need -= len(piece)
            pos = 0
        body = b"".join(parts)
    n = min(size, 8)
    head = (int.from_bytes(body[:n], "little") ^ (tag & ((1 << (8 * n)) - 1))).to_bytes(n, "little")
    return head + body[n:] if size > 8 else head


def _mix(index: int, attempt: int) -> int:
    """A 64-bit tag for object `index` (attempt > 0 for duplicate redraws):
    a multiplicative hash, so even 1-byte objects get varied bytes."""
    return ((index * 0x9E3779B97F4A7C15) ^ (attempt * 0xC2B2AE3D27D4EB4F) ^ (index >> 7)) & (2**64 - 1)


def space_needed(sizes: array.array) -> tuple:
    """(bytes, inodes) the dataset takes: the shard (objects + 8-byte size
    fields + 40-byte slots + header) plus the native files (4 KiB blocks each,
    pathslicing directories), plus 5% and 64 MiB of margin."""
    count = len(sizes)
    data = sum(sizes)
    shard = 512 + data + 8 * count + 41 * count + 4096
    native = sum(((s + 4095) // 4096) * 4096 for s in sizes)
    leaf_dirs = min(count, 65536)
    dirs = (leaf_dirs + 256) * 4096
    need = int((shard + native + dirs) * 1.05) + (64 << 20)
    inodes = count + leaf_dirs + 256 + 16
    return need, inodes


#: Mean object size of each kind, for a first space check before the sizes
#: are drawn (drawing 100M sizes takes a minute).
EXPECTED_MEAN = {"small": 2048.5, "large": MAX_OBJECT / 2,
                 "mix": MIX_MEDIAN * math.exp(MIX_SIGMA ** 2 / 2)}


def _existing(path: str) -> str:
    while not os.path.exists(path):
        path = os.path.dirname(path) or "."
    return path


def quick_check_space(path: str, kind: str, count: int) -> None:
    """Refuse at once when even 80% of the expected size does not fit."""
    probe = _existing(path)
    need = 0.8 * count * (2 * EXPECTED_MEAN[kind] + 4096)
    free = shutil.disk_usage(probe).free
    if free < need:
        raise DatasetError(
            f"not enough free space in {probe}: {count:,} {kind} objects need about "
            f"{need / 1e9:,.1f} GB (shard + plain files), {free / 1e9:,.1f} GB free")


def check_space(path: str, sizes: array.array) -> None:
    """Raise DatasetError (one line) when `path`'s filesystem lacks the bytes
    or inodes the dataset needs."""
    need, inodes = space_needed(sizes)
    probe = _existing(path)
    free = shutil.disk_usage(probe).free
    if free < need:
        raise DatasetError(
            f"not enough free space in {probe}: the dataset needs {need / 1e9:.2f} GB "
            f"(shard + plain files + margin), {free / 1e9:.2f} GB free")
    st = os.statvfs(probe)
    if st.f_files and st.f_favail < inodes:
        raise DatasetError(
            f"not enough free inodes in {probe}: the dataset needs {inodes:,}, "
            f"{st.f_favail:,} free")


def _load(path: str, kind: str, count: int, seed: int) -> Optional[Dataset]:
    """The complete dataset at `path`, or None if absent, partial or stale."""
    try:
        with open(os.path.join(path, "dataset.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if (meta.get("version"), meta.get("kind"), meta.get("count"), meta.get("seed")) != (
            FORMAT_VERSION, kind, count, seed):
        return None
    keys, sizes = [], []
    try:
        with open(os.path.join(path, "objects.tsv"), encoding="ascii") as f:
            for line in f:
                key, size = line.split("\t")
                keys.append(key)
                sizes.append(int(size))
    except (OSError, ValueError):
        return None
    if len(keys) != count or not os.path.exists(os.path.join(path, "objects.shard")):
        return None
    return Dataset(kind, count, seed, path, keys, sizes)


def build(kind: str, count: int, seed: int, path: str,
          progress: Optional[Callable[[int, int], None]] = None) -> Dataset:
    """Build the dataset at `path` (removing whatever is there).

    Raises DatasetError when the disk is short, before writing anything.
    """
    import shardfs

    quick_check_space(os.path.dirname(path), kind, count)
    sizes = draw_sizes(kind, count, seed)
    check_space(os.path.dirname(path), sizes)
    if os.path.lexists(path):
        shutil.rmtree(path)
    native = os.path.join(path, "native")
    os.makedirs(native)
    pool = make_pool(seed)
    offsets = random.Random(f"shardfs-bench:{kind}:{seed}:offsets")
    redraw = random.Random(f"shardfs-bench:{kind}:{seed}:redraw")
    made_dirs = set()
    keys: List[str] = []
    out_sizes: List[int] = []
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    with shardfs.ShardWriter(os.path.join(path, "objects.shard")) as writer, \
            open(os.path.join(path, "objects.tsv"), "w", encoding="ascii") as tsv:
        for i, size in enumerate(sizes):
            attempt = 0
            while True:
                off = offsets.randrange(POOL_SIZE)
                data = payload(pool, off, size, _mix(i, attempt))
                digest = hashlib.sha256(data).digest()
                try:
                    writer.add(digest, data)
                    break
                except shardfs.DuplicateKeyError:
                    # Same content as an earlier object (only likely for 1-2
                    # byte objects): new offset and tag, then a new size.
                    attempt += 1
                    if attempt % DUPLICATE_TRIES == 0:
                        size = draw_size(kind, redraw)
            key = digest.hex()
            sub = key[0:2] + "/" + key[2:4]
            if sub not in made_dirs:
                os.makedirs(os.path.join(native, sub), exist_ok=True)
                made_dirs.add(sub)
            fd = os.open(os.path.join(native, sub, key), flags, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            tsv.write(f"{key}\t{size}\n")
            keys.append(key)
            out_sizes.append(size)
            if progress and (i + 1) % 10000 == 0:
                progress(i + 1, count)
    # Page cache pages must be clean for `echo 3 > drop_caches` to drop them:
    # write everything out now rather than during a benchmark.
    os.sync()
    meta = {"version": FORMAT_VERSION, "kind": kind, "count": count, "seed": seed,
            "total_bytes": sum(out_sizes), "min_size": min(out_sizes, default=0),
            "max_size": max(out_sizes, default=0), "layout": "native/ab/cd/<key>",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = os.path.join(path, "dataset.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    os.rename(tmp, os.path.join(path, "dataset.json"))
    return Dataset(kind, count, seed, path, keys, out_sizes)


def ensure(kind: str, count: int, seed: int = 1, data_dir: str = DEFAULT_DATA_DIR,
           force: bool = False, log: Callable[[str], None] = lambda msg: None) -> Dataset:
    """Return the dataset (kind, count, seed), building it unless cached.

    Raises DatasetError (not enough disk space, bad arguments).
    """
    if kind not in KINDS:
        raise DatasetError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    if count < 1:
        raise DatasetError(f"count must be at least 1, not {count}")
    path = os.path.join(data_dir, dataset_name(kind, count, seed))
    if not force:
        ds = _load(path, kind, count, seed)
        if ds is not None:
            log(f"dataset {ds.name}: reused ({count:,} objects, {ds.total_bytes / 1e6:,.1f} MB)")
            return ds
    os.makedirs(data_dir, exist_ok=True)
    quick_check_space(data_dir, kind, count)
    log(f"dataset {dataset_name(kind, count, seed)}: building in {path}")
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if total >= 100000 and done % 100000 == 0:
            log(f"  {done:,}/{total:,} objects ({time.perf_counter() - t0:.0f} s)")

    ds = build(kind, count, seed, path, progress)
    log(f"dataset {ds.name}: built {count:,} objects, {ds.total_bytes / 1e6:,.1f} MB "
        f"in {time.perf_counter() - t0:.1f} s")
    return ds


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build (or reuse) a seeded benchmark dataset: a shard and the same "
                    "objects as plain files, under bench/data/.")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--count", type=int, required=True, help="number of objects")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help="where datasets are cached (default: bench/data)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    log = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        ds = ensure(args.kind, args.count, args.seed, args.data_dir, args.force, log)
    except DatasetError as exc:
        print(f"datasets.py: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("datasets.py: interrupted (the partial dataset will be rebuilt next time)",
              file=sys.stderr)
        return 130
    print(ds.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
