#!/usr/bin/env python3
"""Write MOSAIC test files and their manifests, for tests/c/test_mosaic.c.

    python3 tests/mosaic_fixtures.py OUTDIR [--objects N] [--seed S]

Every file is written by Software Heritage's own writer, the Python package
swh.mosaic (PyPI 0.6.1: MosaicCreator, MosaicUpdater), and every manifest is
made by reading the file back with its reference reader (MosaicReader), so
that the C reader (shardfs/c/mosaic.h) is compared with the reference, not
with what this script meant to write. The script also checks that the
reference reader gives back what was added (else it exits non-zero).

Files written into OUTDIR (each with NAME.manifest beside it):

  raw.mosaic          no compression; indexed by sha1, sha1_git, sha256 and
                      blake2s256; tiles of ~1 MiB (several Tiles); two
                      Comments; one content added twice (so ObjectsCounter
                      counts one more object than each index has keys)
  zstd.mosaic         zstd level 3, one frame per object; sha1, sha1_git,
                      sha256; the default tile threshold (32 MB)
  zstd_dict.mosaic    "zstd.dict": zstd level 3 with a dictionary trained on
                      samples of the contents (create_zstd_dict), stored in
                      CompressionData; indexes sha256, sha1
  deleted.mosaic      as raw (sha1, sha1_git, sha256; tiles of ~512 KiB), then
                      about 5% of its objects deleted through MosaicUpdater
                      (the first and the last added among them)
  deleted_zstd.mosaic zstd, tiles of ~256 KiB, then objects deleted likewise
  empty.mosaic        no object at all; one index (sha1)
  small.mosaic        40 objects of up to 3 KiB, no compression, Tiles of ~4
                      KiB, indexed by sha1 and sha256, one Comment: small
                      enough to corrupt byte by byte
  small_zstd.mosaic   the same objects, zstd

Objects: N (default 2000) per file, 0 B .. 100 KiB (exact sizes 0, 1, 127,
128, 4095, 4096, 65536 and 102400 among them; otherwise mostly under 4 KiB,
some up to 32 KiB, a few up to 100 KiB), their bytes random,
compressible text, one repeated byte, or a random block repeated.

Manifest, one record a line, fields separated by one space, hex lowercase:

  file NAME                      the MOSAIC file it describes
  compression none|zstd|zstd.dict
  objects_counter N              len(MosaicReader): ObjectsCounter
  objects_total_size N           MosaicReader.objects_total_size
  comment HEX                    one per Comment, in order (UTF-8 bytes, hex)
  indexes NAME...                the file's indexes, in file order (sha1,
                                 sha1_git, sha256, blake2s256)
  live INDEX N                   keys of the index that MosaicReader.keys()
                                 lists (deleted entries are not listed)
  O KEY... LENGTH SHA256         a live object: its key in each index (the
                                 order of "indexes"), then the length and
                                 SHA-256 of the bytes MosaicReader.lookup()
                                 returns for it (the same through every index)
  D KEY...                       a deleted object: its keys, which
                                 MosaicReader.lookup() no longer finds
  A INDEX KEY                    a key absent from that index (random, one
                                 bit away from a present key, or a key of
                                 another index's kind)
"""
import argparse
import hashlib
import os
import random
import sys

from swh.mosaic import (
    CompressionMethod,
    IdxDescription,
    MosaicCreator,
    MosaicReader,
    MosaicUpdater,
    create_zstd_dict,
)

# Our index names, the reference's descriptions, their key functions.
INDEXES = {
    "sha1": (IdxDescription.SHA1FMPHGO, lambda d: hashlib.sha1(d).digest()),
    "sha1_git": (
        IdxDescription.SHA1GITFMPHGO,
        lambda d: hashlib.sha1(b"blob %d\0" % len(d) + d).digest(),
    ),
    "sha256": (IdxDescription.SHA256FMPHGO, lambda d: hashlib.sha256(d).digest()),
    "blake2s256": (IdxDescription.BLAKE2FMPHGO, lambda d: hashlib.blake2s(d).digest()),
}

COMPRESSION_NAMES = ((CompressionMethod.NONE, "none"), (CompressionMethod.ZSTD, "zstd"),
                     (CompressionMethod.ZSTDDICT, "zstd.dict"))

WORDS = (
    b"the quick brown fox jumps over lazy dog int main return void static const "
    b"struct include define if else for while software heritage archive mosaic"
).split()

EXACT_SIZES = [0, 1, 127, 128, 4095, 4096, 65536, 102400]


def make_size(rng):
    r = rng.random()
    if r < 0.65:
        return int(2 ** rng.uniform(0, 12)) - 1  # 0 .. 4 KiB, log-uniform
    if r < 0.95:
        return rng.randint(4096, 32768)
    return rng.randint(32768, 102400)


def make_content(rng, size):
    kind = rng.randrange(4)
    if kind == 0 or size < 16:
        return rng.randbytes(size)
    if kind == 1:
        out = bytearray()
        while len(out) < size:
            out += rng.choice(WORDS) + rng.choice((b" ", b"\n", b"; "))
        return bytes(out[:size])
    if kind == 2:
        return bytes([rng.randrange(256)]) * size
    block = rng.randbytes(rng.randint(8, 512))
    return (block * (size // len(block) + 1))[:size]


def make_contents(rng, n):
    sizes = EXACT_SIZES + [make_size(rng) for _ in range(max(0, n - len(EXACT_SIZES)))]
    contents, seen = [], set()
    for size in sizes[:n]:
        data = make_content(rng, size)
        while data in seen:  # one content per object (but see raw.mosaic's duplicate)
            data = rng.randbytes(max(size, 8))
        seen.add(data)
        contents.append(data)
    rng.shuffle(contents)
    return contents


def keys_of(data, names):
    return [INDEXES[name][1](data) for name in names]


def create(path, names, contents, **kwargs):
    creator = MosaicCreator(path, [INDEXES[n][0] for n in names], **kwargs)
    for data in contents:
        creator.add(keys_of(data, names), data)
    creator.close()


def delete(path, names, victims):
    updater = MosaicUpdater(path)
    for data in victims:
        updater.delete(list(zip([INDEXES[n][0] for n in names], keys_of(data, names))))
    updater.close()


def fail(message):
    sys.exit(f"mosaic_fixtures: {message}")


def listed_keys(reader):
    """MosaicReader.keys(), without the line its Rust side prints on stdout
    when an index ends with deleted entries ("offset = ... got empty input")."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return list(reader.keys())
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def lookup(reader, key):
    try:
        return reader.lookup(key)
    except KeyError:
        return None


def write_manifest(path, names, contents, deleted, rng):
    """The manifest of `path`, from what MosaicReader reads back."""
    base = os.path.basename(path)
    readers = {n: MosaicReader(path, INDEXES[n][0]) for n in names}
    first = readers[names[0]]
    file_indexes = [i for i in first.indexes]
    expected = [INDEXES[n][0] for n in names]
    if file_indexes != expected:
        fail(f"{base}: the reader lists indexes {file_indexes}, expected {expected}")
    lines = [
        f"file {base}",
        f"compression {[n for c, n in COMPRESSION_NAMES if c == first.compression][0]}",
        f"objects_counter {len(first)}",
        f"objects_total_size {first.objects_total_size}",
    ]
    lines += [f"comment {c.encode().hex()}" for c in first.comments]
    lines.append("indexes " + " ".join(names))
    present = {n: set() for n in names}
    for n in names:
        listed = listed_keys(readers[n])
        lines.append(f"live {n} {len(listed)}")
        present[n] = set(listed)
    deleted_set = set(deleted)
    live_contents = {}
    for data in contents:
        keys = keys_of(data, names)
        got = [lookup(readers[n], k) for n, k in zip(names, keys)]
        if data in deleted_set:
            if any(g is not None for g in got):
                fail(f"{base}: a deleted object is still found by MosaicReader")
            if any(k in present[n] for n, k in zip(names, keys)):
                fail(f"{base}: a deleted key is still listed by MosaicReader.keys()")
            lines.append("D " + " ".join(k.hex() for k in keys))
            continue
        if any(g != data for g in got):
            fail(f"{base}: MosaicReader does not give back an object of {len(data)} bytes")
        if not all(k in present[n] for n, k in zip(names, keys)):
            fail(f"{base}: a live key is missing from MosaicReader.keys()")
        live_contents[data] = keys
    for data, keys in live_contents.items():  # a content added twice is listed once
        lines.append("O " + " ".join(k.hex() for k in keys)
                     + f" {len(data)} {hashlib.sha256(data).hexdigest()}")
    for n in names:
        size = len(INDEXES[n][1](b""))
        candidates = [rng.randbytes(size) for _ in range(40)]
        for data in list(live_contents)[:40]:
            k = bytearray(INDEXES[n][1](data))
            bit = rng.randrange(8 * size)
            k[bit // 8] ^= 1 << (bit % 8)
            candidates.append(bytes(k))
        for other, (_, fn) in INDEXES.items():  # keys of the other kinds, same size
            if other != n and contents:
                k = fn(contents[0])
                if len(k) == size:
                    candidates.append(k)
        for k in candidates:
            if k in present[n] or lookup(readers[n], k) is not None:
                continue
            lines.append(f"A {n} {k.hex()}")
    for r in readers.values():
        r.close()
    with open(path + ".manifest", "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--objects", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20260401)
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    rng = random.Random(args.seed)
    n = args.objects
    all4 = ["sha1", "sha1_git", "sha256", "blake2s256"]
    three = ["sha1", "sha1_git", "sha256"]

    def path(name):
        p = os.path.join(args.outdir, name)
        for old in (p, p + ".manifest"):
            if os.path.exists(old):
                os.unlink(old)
        return p

    # raw: four indexes, ~1 MiB tiles, comments, one content added twice.
    contents = make_contents(rng, n)
    p = path("raw.mosaic")
    create(p, all4, contents + [contents[n // 2]], tile_threshold=1 << 20,
           comments=["shardfs test fixture", "deuxième commentaire"])
    write_manifest(p, all4, contents, [], rng)

    contents = make_contents(rng, n)
    p = path("zstd.mosaic")
    create(p, three, contents, compression_level=3)
    write_manifest(p, three, contents, [], rng)

    contents = make_contents(rng, n)
    samples = [c for c in contents if 16 <= len(c) <= 8192][:1000]
    dictionary = create_zstd_dict(samples, 16384)
    p = path("zstd_dict.mosaic")
    create(p, ["sha256", "sha1"], contents, compression_level=3, compression_data=dictionary)
    write_manifest(p, ["sha256", "sha1"], contents, [], rng)

    for name, kwargs in (("deleted.mosaic", dict(tile_threshold=512 << 10)),
                         ("deleted_zstd.mosaic", dict(tile_threshold=256 << 10,
                                                      compression_level=3))):
        contents = make_contents(rng, n)
        p = path(name)
        create(p, three, contents, **kwargs)
        victims = [contents[0], contents[-1]] + rng.sample(contents[1:-1], max(0, n // 20 - 2))
        delete(p, three, victims)
        write_manifest(p, three, contents, victims, rng)

    p = path("empty.mosaic")
    create(p, ["sha1"], [])
    write_manifest(p, ["sha1"], [], [], rng)

    # Small files, for the corruption tests (every byte flipped, every
    # length truncated): 40 objects of up to 3 KiB in Tiles of ~4 KiB.
    small = [c for c in make_contents(rng, 400) if len(c) <= 3072][:40]
    for name, kwargs in (("small.mosaic", {}), ("small_zstd.mosaic", dict(compression_level=3))):
        p = path(name)
        create(p, ["sha1", "sha256"], small, tile_threshold=4 << 10, comments=["small"], **kwargs)
        write_manifest(p, ["sha1", "sha256"], small, [], rng)


if __name__ == "__main__":
    main()
