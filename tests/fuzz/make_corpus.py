#!/usr/bin/env python3
"""Write the seed corpus of the fuzz harnesses (tests/fuzz/fuzz_*.c).

    .venv/bin/python tests/fuzz/make_corpus.py OUT_DIR

OUT_DIR/shard/ receives real shards built with shardfs (0, 1, 2, 3, 10, 100
and 1000 objects, objects of 0 bytes to 20 KiB, one with deleted keys) and
variants of them: each header field set to interesting values, a region of
the objects, index or hash section overwritten (zeros, 0xff, random bytes,
one byte of each field of the CHD_PH dump), truncations at the section
boundaries, bytes appended. OUT_DIR/sidecar/ receives the sidecars of those
shards (plus larger ones) and variants: header fields, directory entries,
unsorted fingerprints, truncations. OUT_DIR/ll_names/ receives inputs of
fuzz_ll_names.c (its format is in that file's header): the layouts flat,
0:2/2:4, 0:1/1:3/3:5, seven levels and refused ones, each with inodes at
the edges, object inodes, names found, absent and of other lengths, and
overflow-prone reads; names by another hash (digests in MOUNT/sha1 and
MOUNT/sha1_git, content SWHIDs in the root, in the wrong place, upper case,
cut, one longer, other prefixes, hash directories not served) and hex of
every length; extended attribute names (the four, their neighbours, others)
with LISTXATTR buffers around the lists' sizes; directory entry names of 0,
1, 64, 255, 256 bytes, with a '/' or a NUL.

Deterministic: the same files every run (fixed random seed). Most variants
do not open; they are there to reach the error paths, while the real files
take the fuzzer deep into lookups, check and delete at once.
"""

import hashlib
import os
import random
import shutil
import struct
import sys
import tempfile

from shardfs import Shard, ShardWriter
from shardfs import _shardfs
from shardfs import sidecar as sidecar_mod

HEADER = 88
SIDE_HEADER = 64


def key_of(i: int, tag: bytes) -> bytes:
    return hashlib.sha256(tag + i.to_bytes(8, "little")).digest()


def build_shard(path, sizes, tag=b"seed", delete=()):
    keys = []
    with ShardWriter(path) as w:
        for i, size in enumerate(sizes):
            k = key_of(i, tag)
            keys.append(k)
            w.add(k, bytes((i * 31 + j) & 0xFF for j in range(size)))
    if delete:
        with Shard(path, writable=True) as s:
            for i in delete:
                s.delete(keys[i])
    return keys


def header_fields(blob):
    return list(struct.unpack(">7Q", blob[32:HEADER]))


def set_field(blob, field, value):
    b = bytearray(blob)
    b[32 + 8 * field:40 + 8 * field] = struct.pack(">Q", value & (2**64 - 1))
    return bytes(b)


def overwrite(blob, at, data):
    b = bytearray(blob)
    at = max(0, min(at, len(b)))
    b[at:at + len(data)] = data  # past the end: the file grows
    return bytes(b)


def chd_fields(blob, hash_position):
    """Byte offsets of the fields of the CHD_PH dump (see shardfs/c/chd.h)."""
    h = hash_position
    cs = h + 31
    cs_len = struct.unpack_from("<I", blob, h + 27)[0]
    sel = cs + 16
    sel_len = struct.unpack_from("<I", blob, cs + 12)[0]
    sel_n, sel_m = struct.unpack_from("<II", blob, sel)
    nbits = sel_n + sel_m
    vec = ((nbits + 31) >> 5) * 4
    return {
        "name": h, "size": h + 7, "hl_len": h + 11, "hashname": h + 15, "seed": h + 23,
        "cs_len": h + 27, "cs_n": cs, "rem_r": cs + 4, "total_length": cs + 8,
        "sel_len": cs + 12, "sel_n": sel, "sel_m": sel + 4, "bits": sel + 8,
        "select_table": sel + 8 + vec, "length_rems": cs + 16 + sel_len,
        "store_last": cs + cs_len - 4, "n": cs + cs_len, "nbuckets": cs + cs_len + 4,
    }


def shard_variants(name, blob, rnd):
    """Mutated copies of one real shard: (name, bytes) pairs."""
    out = []
    f = header_fields(blob)
    _, count, opos, osize, ipos, isize, hpos = f
    size = len(blob)
    values = [0, 1, 39, 40, 87, 88, 511, 512, 513, size - 1, size, size + 1,
              2**32, 2**63, 2**64 - 1, 2**64 - 8]
    for field in range(7):
        for v in values + [f[field] + 1, f[field] - 1, f[field] + 40, f[field] - 40]:
            if v != f[field]:
                out.append((f"{name}-h{field}-{v & (2**64 - 1):x}", set_field(blob, field, v)))
    # consistent moves: the index and hash sections where they are
    out.append((f"{name}-count0", set_field(blob, 1, 0)))
    # truncations and extensions
    cuts = {0, 1, 8, 31, 32, 87, 88, 100, 511, 512, opos + 8, ipos - 1, ipos, ipos + 39,
            ipos + 40, hpos - 1, hpos, hpos + 7, hpos + 27, hpos + 30, hpos + 31,
            hpos + 60, size - 9, size - 8, size - 1}
    for c in sorted(cuts):
        if 0 <= c < size:
            out.append((f"{name}-cut{c}", blob[:c]))
    out.append((f"{name}-plus1", blob + b"\0"))
    out.append((f"{name}-plus4k", blob + bytes(rnd.getrandbits(8) for _ in range(4096))))
    # regions overwritten
    for label, at, length in [("obj", opos, min(osize, 64)), ("objmid", opos + osize // 2, 24),
                              ("idx", ipos, min(isize, 80)), ("idxmid", ipos + isize // 2, 40),
                              ("idxend", ipos + isize - 40, 40)]:
        if length <= 0:
            continue
        for fill in ("zero", "ff", "rand"):
            data = (bytes(length) if fill == "zero" else b"\xff" * length if fill == "ff"
                    else bytes(rnd.getrandbits(8) for _ in range(length)))
            out.append((f"{name}-{label}-{fill}", overwrite(blob, at, data)))
    # a slot whose offset points elsewhere: into the header, the index, past the end
    for label, target in [("hdr", 0), ("idx", ipos), ("end", size), ("last", ipos - 8),
                          ("max", 2**64 - 2)]:
        out.append((f"{name}-slot0-{label}", overwrite(blob, ipos + 32, struct.pack(">Q", target))))
    # an object's size field made huge
    if osize >= 8:
        out.append((f"{name}-objsize-huge", overwrite(blob, opos, struct.pack(">Q", 2**63))))
        out.append((f"{name}-objsize-end", overwrite(blob, opos, struct.pack(">Q", osize - 8))))
    # each field of the perfect hash, changed by one and set to extremes
    for field, at in chd_fields(blob, hpos).items():
        if at + 4 > size:
            continue
        orig = struct.unpack_from("<I", blob, at)[0]
        for v in {orig + 1, orig - 1, 0, 0xFFFFFFFF, orig ^ 0x80000000}:
            out.append((f"{name}-chd-{field}-{v & 0xFFFFFFFF:x}",
                        overwrite(blob, at, struct.pack("<I", v & 0xFFFFFFFF))))
    # random byte flips in the hash section
    for r in range(8):
        b = bytearray(blob)
        for _ in range(1 + r):
            b[hpos + rnd.randrange(size - hpos)] ^= 1 << rnd.randrange(8)
        out.append((f"{name}-hashflip{r}", bytes(b)))
    return out


def sidecar_variants(name, blob, rnd):
    out = []
    p = struct.unpack_from("<I", blob, 12)[0]
    n = struct.unpack_from("<Q", blob, 16)[0]
    slots = struct.unpack_from("<Q", blob, 24)[0]
    dir_at = SIDE_HEADER
    fp_at = dir_at + 4 * ((1 << p) + 1)
    slot_at = fp_at + 4 * n
    size = len(blob)
    for label, at, fmt, values in [
            ("version", 8, "<I", [0, 2, 0xFFFFFFFF]),
            ("p", 12, "<I", [0, 1, p + 1, p - 1, 32, 33, 0xFFFFFFFF]),
            ("n", 16, "<Q", [0, n + 1, n - 1, slots, slots + 1, 2**32, 2**64 - 1]),
            ("slots", 24, "<Q", [0, n, n - 1, slots + 1, 2**64 - 1])]:
        for v in values:
            mask = 2**32 - 1 if fmt == "<I" else 2**64 - 1
            out.append((f"{name}-{label}-{v & mask:x}",
                        overwrite(blob, at, struct.pack(fmt, v & mask))))
    out.append((f"{name}-magic", overwrite(blob, 0, b"SFSSIDE2")))
    for c in sorted({0, 8, 63, 64, 65, fp_at - 1, fp_at, slot_at, size - 1}):
        if 0 <= c < size:
            out.append((f"{name}-cut{c}", blob[:c]))
    out.append((f"{name}-plus4", blob + b"\0\0\0\0"))
    # directory entries: past n, decreasing, all zero, all n
    nd = (1 << p) + 1
    for label, values in [("dirbig", [n + 5, 0xFFFFFFFF]), ("dirzero", [0]), ("dirn", [n])]:
        for v in values:
            b = bytearray(blob)
            for i in range(0, nd, max(1, nd // 7)):
                struct.pack_into("<I", b, dir_at + 4 * i, v)
            out.append((f"{name}-{label}-{v:x}", bytes(b)))
    b = bytearray(blob)
    for i in range(nd):
        struct.pack_into("<I", b, dir_at + 4 * i, (nd - i) * n // nd)
    out.append((f"{name}-dirdecreasing", bytes(b)))
    b = bytearray(blob)
    for i in range(nd):
        struct.pack_into("<I", b, dir_at + 4 * i, n if i % 2 else 0)
    out.append((f"{name}-dirzigzag", bytes(b)))
    if n > 1:
        # fingerprints reversed (unsorted buckets), random slots
        fps = blob[fp_at:slot_at]
        words = [fps[i:i + 4] for i in range(0, len(fps), 4)]
        out.append((f"{name}-fprev", blob[:fp_at] + b"".join(reversed(words)) + blob[slot_at:]))
        out.append((f"{name}-slotsrand", blob[:slot_at] + bytes(rnd.getrandbits(8)
                                                                 for _ in range(4 * n))))
    return out


def synthetic_sidecars(rnd):
    """Well-formed sidecars built by hand: empty, one bucket crowded, a large
    sparse directory, a bucket of more than 16 entries (binary search)."""
    out = []

    def make(p, entries, slot_count, ident=b"\x11" * 32):
        entries = sorted(entries)  # (top64, slot)
        n = len(entries)
        head = b"SFSSIDE1" + struct.pack("<IIQQ", 1, p, n, slot_count) + ident
        dirs, pos = [], 0
        for b in range((1 << p) + 1):
            while pos < n and (entries[pos][0] >> (64 - p) if p else 0) < b:
                pos += 1
            dirs.append(pos)
        fp = [((t << p) & (2**64 - 1)) >> 32 for t, _ in entries]
        return (head + struct.pack(f"<{len(dirs)}I", *dirs) + struct.pack(f"<{n}I", *fp)
                + struct.pack(f"<{n}I", *[s for _, s in entries]))

    out.append(("syn-empty-p0", make(0, [], 0)))
    out.append(("syn-empty-p10", make(10, [], 5)))
    same = [((0x1234 << 48) | rnd.getrandbits(40), i) for i in range(40)]
    out.append(("syn-crowded-p2", make(2, same, 100)))
    out.append(("syn-crowded-p4", make(4, same + [(rnd.getrandbits(64), 50 + i)
                                                    for i in range(20)], 100)))
    out.append(("syn-sparse-p12", make(12, [(rnd.getrandbits(64), i) for i in range(30)], 40)))
    # p = 32 needs a 16 GiB file: a header only (fails the size check)
    head = b"SFSSIDE1" + struct.pack("<IIQQ", 1, 32, 0, 0) + b"\x11" * 32
    out.append(("syn-p32-header", head + bytes(64)))
    dup = [(0xABCDEF << 40, i) for i in range(20)]
    out.append(("syn-dupkeys-p1", make(1, dup, 30)))
    return out


# ---------------------------------------------------------------- ll_names
# Inputs of fuzz_ll_names.c: a layout (8 bytes) then operations, each a tag
# byte and its bytes (see the header of fuzz_ll_names.c).
LL_INODE, LL_EDGE, LL_OBJECT, LL_NAME, LL_READ, LL_HASH, LL_XATTR, LL_DIRENT = range(8)
LL_ODD_DEPTHS = [-1, 8, 9, 15, 16, 2**31 - 1, -2**31, -8]


def ll_layout(nhex, depth=None):
    """The layout bytes: `depth` levels (len(nhex) by default) of cumulative
    hex lengths `nhex` (raw signed bytes); a depth outside 0..7 must be one
    of LL_ODD_DEPTHS."""
    depth = len(nhex) if depth is None else depth
    if 0 <= depth <= 7:
        b0 = 0x80 | depth
    else:
        b0 = 0x80 | 0x40 | LL_ODD_DEPTHS.index(depth)
    raw = [(v & 0xFF) for v in nhex] + [0] * (7 - len(nhex))
    return bytes([b0] + raw[:7])


def ll_inode(ino):
    return bytes([LL_INODE]) + struct.pack("<Q", ino & (2**64 - 1))


def ll_edge(sel, delta=0):
    return bytes([LL_EDGE, sel & 0xFF, delta & 0xFF])


def ll_object(number, slot):
    return bytes([LL_OBJECT]) + struct.pack("<II", number, slot)


def ll_name(depth, name, prefix=0, poke=None, upper=None):
    """Look `name` (bytes, < 97) up in the directory at `depth` (0..7, or
    one of LL_ODD_DEPTHS) spelling `prefix` (< 2^32): the raw name bytes,
    then the prefix; `upper`: one character upper-cased; `poke` (position,
    byte): one byte overwritten."""
    assert len(name) < 97 and prefix < 2**32
    dsel = depth if 0 <= depth < 0x80 else 0x80 | LL_ODD_DEPTHS.index(depth)
    mode = (8 if upper is not None else 0) | (16 if poke is not None else 0)
    out = bytes([LL_NAME, dsel, 0, mode, len(name)]) + name + struct.pack("<I", prefix)
    if upper is not None:
        out += bytes([upper])
    if poke is not None:
        out += bytes(poke)
    return out


def ll_name_spelled(depth, key, psel=3):
    """A hex-mode name of 64 characters from the 32 bytes `key`, with the
    directory's prefix (psel 3: the name's own) spelled at its start."""
    return bytes([LL_NAME, depth, psel, 1 | 2 | 4, 2]) + key  # 62 + 2 % 5 = 64 chars


def ll_read(size, offset, want):
    """Raw size, offset and want (selector 0: the next 8 bytes)."""
    return bytes([LL_READ]) + b"".join(b"\0" + struct.pack("<Q", v & (2**64 - 1))
                                       for v in (size, offset, want))


def ll_read_edges(a, b, c):
    """Size, offset and want picked from the harness's table of edges."""
    return bytes([LL_READ, 0x80 | a, 0x80 | b, 0x80 | c])


# do_hash: the forms of a name (mode & 3) and what is done to it
LL_HASH_RAW, LL_HASH_DIGEST, LL_HASH_SWHID, LL_HASH_OTHER_PREFIX = range(4)
LL_HASH_UPPER, LL_HASH_POKE, LL_HASH_SHORT, LL_HASH_LONGER = 4, 8, 16, 32
# do_hash: the parent (psel % 8)
LL_P_ROOT, LL_P_SHA1, LL_P_SHA1_GIT, LL_P_NEXT, LL_P_FANOUT, LL_P_ZERO, LL_P_GIT_DIR, LL_P_RAW = range(8)


def ll_hash(form, body=b"", psel=LL_P_ROOT, dsel=0, flags=0, length=0, dirs=None, parent=None,
            upper=None, poke=None, ndigits_high=0):
    """A HASH operation: `body` is the raw name (form RAW) or the digest's
    20 bytes (the others); dsel 0..3: both hash directories served, sha1
    only, sha1_git only, none (| 4: one for both; `dirs`: two raw u32
    instead); `length`: the raw name's length, or for the other forms what
    picks the other prefix (% 6) and, with ndigits_high (0..3), how many
    characters sfs_ll_parse_hex reads (ndigits_high * 32 + length % 33)."""
    if form == LL_HASH_RAW:
        length = len(body)
        assert length < 64
    else:
        assert len(body) == 20
    mode = form | flags | (LL_HASH_UPPER if upper is not None else 0) | \
        (LL_HASH_POKE if poke is not None else 0) | (ndigits_high << 6)
    if dirs is not None:
        dsel |= 8
    out = bytes([LL_HASH, dsel, psel, mode, length & 0xFF])
    if dirs is not None:
        out += struct.pack("<II", *dirs)
    if psel % 8 == LL_P_RAW:
        out += struct.pack("<Q", parent & (2**64 - 1))
    out += body
    if upper is not None:
        out += bytes([upper])
    if poke is not None:
        out += bytes(poke)
    return out


LL_XATTR_NAMES = [b"user.shardfs.requests", b"user.shardfs.stats", b"user.shardfs.shard",
                  b"user.shardfs.offset"]


def ll_xattr(which, list_size=128, raw=None, poke=None, append=None, flip=None, drop=False):
    """An XATTR operation: one of the four names (`which`) or `raw` bytes
    (< 48), then `poke` (position, byte), `append` a byte, `flip` the case
    of the character at a position, `drop` the last; `list_size`: the
    LISTXATTR buffer (% 129)."""
    mode = (0 if raw is not None else 1) | (4 if poke is not None else 0) | \
        (8 if append is not None else 0) | (16 if flip is not None else 0) | (32 if drop else 0)
    out = bytes([LL_XATTR, mode, which or 0, len(raw) if raw is not None else 0])
    if raw is not None:
        assert len(raw) < 48
        out += raw
    if poke is not None:
        out += bytes(poke)
    if append is not None:
        out += bytes([append])
    if flip is not None:
        out += bytes([flip])
    return out + bytes([list_size])


def ll_dirent(length, raw=None, slash=None, nul=None, fill=0):
    """A DIRENT operation: `length` (< 300) bytes, `raw` or lowercase hex
    (fill: the pattern's start), a '/' or a NUL at a position."""
    mode = (1 if raw is not None else 0) | (2 if slash is not None else 0) | (4 if nul is not None else 0) | \
        (fill & 0xF8)
    out = bytes([LL_DIRENT]) + struct.pack("<H", length) + bytes([mode])
    if raw is not None:
        assert len(raw) == length
        out += raw
    if slash is not None:
        out += struct.pack("<H", slash)
    if nul is not None:
        out += struct.pack("<H", nul)
    return out


def ll_kernel_ops():
    """Names by another hash, hex, extended attribute names and directory
    entry names (the same in every layout)."""
    digest = hashlib.sha1(b"ll_names").digest()
    ops = []
    for psel in (LL_P_ROOT, LL_P_SHA1, LL_P_SHA1_GIT, LL_P_FANOUT, LL_P_ZERO, LL_P_GIT_DIR):
        for dsel in (0, 1, 2, 3, 4):
            ops.append(ll_hash(LL_HASH_DIGEST, digest, psel, dsel))
            ops.append(ll_hash(LL_HASH_SWHID, digest, psel, dsel))
    for psel in (LL_P_SHA1, LL_P_SHA1_GIT, LL_P_ROOT):
        form = LL_HASH_SWHID if psel == LL_P_ROOT else LL_HASH_DIGEST
        at0 = 10 if form == LL_HASH_SWHID else 0
        ops += [
            ll_hash(form, digest, psel, upper=at0), ll_hash(form, digest, psel, upper=at0 + 39),
            ll_hash(form, digest, psel, poke=(at0 + 20, 0)), ll_hash(form, digest, psel, poke=(at0 + 5, ord("g"))),
            ll_hash(form, digest, psel, poke=(at0 + 40, ord("a"))),  # one more character
            ll_hash(form, digest, psel, flags=LL_HASH_SHORT), ll_hash(form, digest, psel, flags=LL_HASH_LONGER),
            ll_hash(form, digest, psel, flags=LL_HASH_SHORT | LL_HASH_LONGER),  # 40 again, last digit changed
        ]
    ops += [ll_hash(LL_HASH_OTHER_PREFIX, digest, LL_P_ROOT, length=n) for n in range(6)]
    ops += [ll_hash(LL_HASH_SWHID, digest, LL_P_ROOT, poke=(3, ord("2"))),
            ll_hash(LL_HASH_SWHID, digest, LL_P_ROOT, upper=0),
            ll_hash(LL_HASH_SWHID, digest, LL_P_ROOT, poke=(9, 0))]
    # neighbours of the hash directories, raw parents, raw directories
    for psel in (LL_P_NEXT, LL_P_NEXT | 0x40, LL_P_NEXT | 0x80, LL_P_NEXT | 0xC0):
        ops.append(ll_hash(LL_HASH_DIGEST, digest, psel))
    for parent in (1, 2**32 - 3, 2**32 - 2, 2**32 - 1, 2**32, 2**62, 2**64 - 1):
        ops.append(ll_hash(LL_HASH_DIGEST, digest, LL_P_RAW, parent=parent))
        ops.append(ll_hash(LL_HASH_SWHID, digest, LL_P_RAW, parent=parent))
    for dirs in ((1, 1), (1, 2), (2, 1), (0, 1), (258, 259), (2**32 - 1, 0)):
        for psel in (LL_P_ROOT, LL_P_SHA1, LL_P_SHA1_GIT):
            ops.append(ll_hash(LL_HASH_DIGEST, digest, psel, dirs=dirs))
            ops.append(ll_hash(LL_HASH_SWHID, digest, psel, dirs=dirs))
    # raw names: empty, dots, the prefix alone, hex of other lengths
    hexname = digest.hex().encode()
    for raw in (b"", b".", b"..", b"swh:1:cnt:", b"swh:1:cnt:" + hexname[:30], hexname[:39], hexname.upper(),
                hexname[:20] + b"\xff" + hexname[21:], b"0" * 63):
        for psel in (LL_P_ROOT, LL_P_SHA1, LL_P_SHA1_GIT):
            ops.append(ll_hash(LL_HASH_RAW, raw, psel))
    # hex of every length, up to 128 digits
    for high in range(4):
        for length in (0, 1, 2, 31, 32, 40):
            ops.append(ll_hash(LL_HASH_DIGEST, digest, LL_P_SHA1, length=length, ndigits_high=high))
            ops.append(ll_hash(LL_HASH_SWHID, digest, LL_P_ROOT, length=length, ndigits_high=high))

    # extended attribute names; lists: the root's 41 bytes, an object's 39
    for which in range(4):
        for size in (0, 1, 38, 39, 40, 41, 42, 128):
            ops.append(ll_xattr(which, size))
        n = len(LL_XATTR_NAMES[which])
        ops += [ll_xattr(which, poke=(n - 1, ord("x"))), ll_xattr(which, poke=(12, 0)),
                ll_xattr(which, poke=(n, 0)), ll_xattr(which, append=ord("s")), ll_xattr(which, append=0),
                ll_xattr(which, flip=0), ll_xattr(which, flip=13), ll_xattr(which, drop=True),
                ll_xattr(which, poke=(n, ord("s")), drop=True)]
    for raw in (b"", b"security.selinux", b"system.posix_acl_access", b"security.capability", b"user.shardfs.",
                b"user.shardfs", b"trusted.shardfs.stats", b"user.shardfs.requests\0x", b"\xff" * 21):
        ops.append(ll_xattr(None, raw=raw))
    # upper case made lower: one of the four again
    ops += [ll_xattr(None, raw=b"User.shardfs.stats", flip=0), ll_xattr(None, raw=b"user.shardfs.OFFSET", flip=13)]

    # directory entry names
    for length in (0, 1, 2, 63, 64, 65, 254, 255, 256, 299):
        ops.append(ll_dirent(length))
        if length:
            ops += [ll_dirent(length, slash=length - 1), ll_dirent(length, nul=0),
                    ll_dirent(length, slash=0, nul=length - 1)]
    ops += [ll_dirent(1, raw=b"/"), ll_dirent(1, raw=b"\0"), ll_dirent(1, raw=b"."), ll_dirent(2, raw=b".."),
            ll_dirent(3, raw=b"\xff\x80\x01"), ll_dirent(64, raw=hexname + hexname[:24])]
    return ops


def ll_names_seeds(rnd):
    out = []
    key = hashlib.sha256(b"ll_names").digest()
    name = key.hex().encode()
    upper = name.upper()
    common = [
        ll_name(0, name), ll_name(0, upper), ll_name(0, name[:63]), ll_name(0, name + b"0"),
        ll_name(0, b"."), ll_name(0, b".."), ll_name(0, b"ab"), ll_name(0, b""),
        ll_name(0, name[:10] + b"g" + name[11:]), ll_name(0, name, upper=5),
        ll_name(0, name, poke=(30, 0)), ll_name(0, name, poke=(64, ord("a"))),
        ll_name(0, name[:40] + b"\xff" + name[41:]),
        ll_inode(0), ll_inode(1), ll_inode(2), ll_inode(2**32 - 1), ll_inode(2**32),
        ll_inode(2**62), ll_inode(2**62 | 2**32 | 5), ll_inode(2**63), ll_inode(2**64 - 1),
        ll_object(0, 0), ll_object(5, 2**32 - 1), ll_object(2**30 - 2, 7), ll_object(2**30 - 1, 7),
        ll_object(2**32 - 1, 9), ll_object(2**31, 1),
        ll_read(10, 0, 4), ll_read(10, 8, 4), ll_read(10, 10, 4), ll_read(10, 11, 4),
        ll_read(2**64 - 1, 2**64 - 2, 2**64 - 1), ll_read(10, 2**64 - 1, 2**64 - 1),
        ll_read(2**63, 2**63 - 5, 131072), ll_read(0, 0, 0),
        ll_read_edges(11, 0, 11), ll_read_edges(3, 13, 19), ll_read_edges(11, 12, 20),
    ] + [ll_edge(i, d) for i in range(0, 60, 3) for d in (-1, 0, 1)]
    out.append(("flat", ll_layout([]) + b"".join(common)))
    kernel = ll_kernel_ops()
    # the kernel's other inputs, in a flat layout and under a fan-out one
    # (the fan-out directory of LL_P_FANOUT is then a leaf), in pieces of
    # at most 512 operations (the harness's MAX_OPS)
    for label, layout in (("flat", ll_layout([])), ("0:2-2:4", ll_layout([2, 4]))):
        for i in range(0, len(kernel), 400):
            out.append((f"kernel-{label}-{i // 400}", layout + b"".join(kernel[i:i + 400])))

    def fanout(nhex):
        depth, n = len(nhex), nhex[-1]
        leaf = int(name[:n], 16)
        ops = [ll_name(depth, name, leaf), ll_name(depth, name, leaf ^ 1),
               ll_name(depth, upper, leaf), ll_name(depth - 1, name, leaf >> 4),
               ll_name(depth + 1, name, leaf), ll_name(-1, name, leaf), ll_name(8, name, leaf),
               ll_name(depth, name[:n] + b"..", 0), ll_name(depth, b"..", leaf),
               ll_name(depth, name[:63], leaf), ll_name(depth, name, leaf, upper=n - 1),
               ll_name(depth, name, leaf, upper=n),
               # raw upper case, the prefix derived from it (psel 3): it
               # matches in value, not in spelling
               bytes([LL_NAME, depth, 3, 0, 64]) + upper]
        for _ in range(4):
            ops.append(ll_name_spelled(depth, bytes(rnd.getrandbits(8) for _ in range(32))))
        base = 2
        for d, w in enumerate(nhex, 1):
            for ino in (base - 1, base, base + 16**w // 2, base + 16**w - 1, base + 16**w):
                ops.append(ll_inode(ino))
            ops.append(ll_name(d, name, int(name[:w], 16)))
            base += 16**w
        return ops + common

    for label, nhex in [("0:2-2:4", [2, 4]), ("0:1-1:3-3:5", [1, 3, 5]), ("0:7", [7]),
                        ("seven", [1, 2, 3, 4, 5, 6, 7]), ("0:3-3:6", [3, 6])]:
        out.append((f"fanout-{label}", ll_layout(nhex) + b"".join(fanout(nhex))))
    # refused layouts: the harness goes on with a flat one
    for label, nhex, depth in [("zero", [0], None), ("same", [2, 2], None), ("down", [3, 2], None),
                               ("eight", [8], None), ("past", [2, 8], None), ("neg", [-1], None),
                               ("depth8", [1, 2, 3, 4, 5, 6, 7], 8), ("depth-1", [], -1),
                               ("depthmax", [2, 4], 2**31 - 1)]:
        out.append((f"refused-{label}", ll_layout(nhex, depth) + b"".join(common[:16])))
    # incremental lengths (bit 7 of byte 0 clear): each byte adds b % 4
    out.append(("incremental-1-2-3", bytes([3, 1, 1, 1, 0, 0, 0, 0]) + b"".join(common[:16])))
    out.append(("incremental-grow0", bytes([2, 2, 0, 0, 0, 0, 0, 0]) + ll_inode(258)))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    shard_dir = os.path.join(out_dir, "shard")
    side_dir = os.path.join(out_dir, "sidecar")
    ll_dir = os.path.join(out_dir, "ll_names")
    for d in (shard_dir, side_dir, ll_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    rnd = random.Random(20240505)
    specs = [
        ("n0", []),
        ("n1", [5]),
        ("n1-empty-object", [0]),
        ("n2", [0, 17]),
        ("n3", [1, 2, 3]),
        ("n10", [rnd.randrange(50) for _ in range(10)]),
        ("n100", [rnd.randrange(300) for _ in range(99)] + [20000]),
        ("n1000", [rnd.randrange(9) for _ in range(1000)]),
    ]
    shards, sidecars = [], []
    with tempfile.TemporaryDirectory() as tmp:
        def one(name, sizes, delete=()):
            path = os.path.join(tmp, name + ".shard")
            build_shard(path, sizes, tag=name.encode(), delete=delete)
            with open(path, "rb") as fh:
                shards.append((name, fh.read()))
            with Shard(path) as s:
                ident = sidecar_mod.identity(s)
                spath = os.path.join(tmp, name + ".sidecar")
                _shardfs.build_sidecar(s._reader, spath, ident)
            with open(spath, "rb") as fh:
                sidecars.append((name, fh.read()))

        for name, sizes in specs:
            one(name, sizes)
        one("n50-deleted", [rnd.randrange(40) for _ in range(50)], delete=(0, 7, 49))
        one("n2-deleted-all", [3, 4], delete=(0, 1))
        # sidecar only (its shard is too big for a fast seed): p = 11
        path = os.path.join(tmp, "n10000.shard")
        build_shard(path, [0] * 10000, tag=b"big")
        with Shard(path) as s:
            spath = os.path.join(tmp, "n10000.sidecar")
            _shardfs.build_sidecar(s._reader, spath, sidecar_mod.identity(s))
        with open(spath, "rb") as fh:
            sidecars.append(("n10000", fh.read()))

    written = {"shard": 0, "sidecar": 0, "ll_names": 0}

    def write(d, kind, name, data):
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(data)
        written[kind] += 1

    for name, blob in shards:
        write(shard_dir, "shard", name, blob)
        if name in ("n0", "n1", "n10", "n100", "n1000", "n50-deleted"):
            for vname, data in shard_variants(name, blob, rnd):
                write(shard_dir, "shard", vname, data)
    for name, blob in sidecars:
        write(side_dir, "sidecar", name, blob)
        if name in ("n0", "n1", "n10", "n1000", "n10000", "n50-deleted"):
            for vname, data in sidecar_variants(name, blob, rnd):
                write(side_dir, "sidecar", vname, data)
    for vname, data in synthetic_sidecars(rnd):
        write(side_dir, "sidecar", vname, data)
    for vname, data in ll_names_seeds(random.Random(20261125)):
        write(ll_dir, "ll_names", vname, data)
    print(f"seed corpus: {written['shard']} shard inputs in {shard_dir}, "
          f"{written['sidecar']} sidecar inputs in {side_dir}, "
          f"{written['ll_names']} ll_names inputs in {ll_dir}")


if __name__ == "__main__":
    main()
