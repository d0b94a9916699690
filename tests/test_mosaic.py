"""MOSAIC files (Software Heritage's format) read by shardfs's C reader:
the Python API (`shardfs.mosaic.MosaicFile`) and ``shardfs info/ls/get/
check`` against files written by SWH's own writer (swh.mosaic's
MosaicCreator and MosaicUpdater, through tests/mosaic_fixtures.py) and
manifests made by SWH's own reader (MosaicReader): raw, zstd and
zstd-with-dictionary files, deleted objects, absent keys, damaged files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mounting import SHARDFS, run

from shardfs.errors import CorruptShardError
from shardfs.mosaic import MosaicFile, is_mosaic
from shardfs.shard import Shard

FIXTURES = Path(__file__).with_name("mosaic_fixtures.py")
FILES = ["raw", "zstd", "zstd_dict", "deleted", "deleted_zstd", "empty", "small", "small_zstd"]


@pytest.fixture(scope="module")
def mosaics(tmp_path_factory):
    """The fixture files, written by swh.mosaic: {name: (path, manifest)}.
    A manifest: {"indexes": [...], "objects": [(keys by index, length,
    sha256 hex)], "deleted": [keys by index], "absent": [(index, key)],
    "live": {index: count}, "compression": str}."""
    out = tmp_path_factory.mktemp("mosaic")
    subprocess.run([sys.executable, str(FIXTURES), str(out), "--objects", "300"], check=True,
                   capture_output=True, timeout=600)
    found = {}
    for name in FILES:
        m = {"objects": [], "deleted": [], "absent": [], "live": {}}
        for line in (out / f"{name}.mosaic.manifest").read_text().splitlines():
            tag, *fields = line.split()
            if tag == "indexes":
                m["indexes"] = fields
            elif tag == "compression":
                m["compression"] = fields[0]
            elif tag == "live":
                m["live"][fields[0]] = int(fields[1])
            elif tag == "O":
                n = len(m["indexes"])
                m["objects"].append(([bytes.fromhex(k) for k in fields[:n]], int(fields[n]), fields[n + 1]))
            elif tag == "D":
                m["deleted"].append([bytes.fromhex(k) for k in fields])
            elif tag == "A":
                m["absent"].append((fields[0], bytes.fromhex(fields[1])))
        found[name] = (out / f"{name}.mosaic", m)
    return found


@pytest.mark.parametrize("name", FILES)
def test_every_object_by_every_index_as_swh_reads_it(mosaics, name):
    """Every live object, looked up by each of its keys, reads as
    MosaicReader.lookup gave it (length and SHA-256), whole and in pieces;
    deleted and absent keys are not found; the sha256 index lists exactly
    the live keys."""
    path, m = mosaics[name]
    assert is_mosaic(str(path))
    with MosaicFile(str(path)) as f:
        assert f.indexes == m["indexes"]
        assert f.info["compression"] == m["compression"]
        for keys, length, digest in m["objects"]:
            for kind, key in zip(m["indexes"], keys):
                where = f.locate(key, kind)
                assert where is not None and where[1] == length, (kind, key.hex())
                data = f.pread(where[0], length, 0, length)
                assert len(data) == length and hashlib.sha256(data).hexdigest() == digest
            if length > 10:  # a piece from the middle
                assert f.pread(where[0], length, 7, 3) == data[7:10]
            assert f.pread(where[0], length, length, 10) == b""
        for kind in m["indexes"]:  # get and get_batch: one call each into C
            at = m["indexes"].index(kind)
            wanted = [keys[at] for keys, _, _ in m["objects"]] + [keys[at] for keys in m["deleted"]]
            got = f.get_batch(wanted, kind)
            assert len(got) == len(wanted)
            for (keys, length, digest), data in zip(m["objects"], got):
                assert len(data) == length and hashlib.sha256(data).hexdigest() == digest
            assert got[len(m["objects"]):] == [None] * len(m["deleted"])
            if m["objects"]:
                keys, length, digest = m["objects"][-1]
                assert hashlib.sha256(f.get(keys[at], kind)).hexdigest() == digest
        for keys in m["deleted"]:
            for kind, key in zip(m["indexes"], keys):
                assert f.locate(key, kind) is None
                assert f.get(key, kind) is None
        for kind, key in m["absent"]:
            if kind in f.indexes and len(key) in (20, 32):
                try:
                    assert f.locate(key, kind) is None
                except ValueError:  # a key of another kind's length
                    pass
        for kind, count in m["live"].items():
            assert sum(1 for _ in f.entries(kind)) == count
        if "sha256" in f.indexes:
            live = {keys[m["indexes"].index("sha256")] for keys, _, _ in m["objects"]}
            assert set(f.keys()) == live


def test_cli_info_ls_get_check(mosaics, tmp_path):
    """The shardfs verbs take a MOSAIC file as they take a shard: info
    names its format and indexes, ls -l lists live keys and sizes, get
    writes objects by SHA-256 and (from the file's own indexes) by sha1,
    sha1_git and SWHID, check --hash verifies every key of every object."""
    path, m = mosaics["zstd"]
    info = run(SHARDFS + ["info", path], check=True).stdout
    assert "format: mosaic" in info and "compression: zstd" in info and "index.sha1_git:" in info
    ls = run(SHARDFS + ["ls", "-l", path], check=True).stdout.split("\n")
    at = m["indexes"].index("sha256")
    assert sorted(filter(None, ls)) == sorted(f"{keys[at].hex()} {length}" for keys, length, _ in m["objects"])
    keys, length, digest = next(o for o in m["objects"] if o[1] > 1000)
    for args in (["get", path, keys[at].hex()],
                 ["get", "--hash", "sha1", path, keys[m["indexes"].index("sha1")].hex()],
                 ["get", "--hash", "sha1_git", path, "swh:1:cnt:" + keys[m["indexes"].index("sha1_git")].hex()]):
        proc = subprocess.run(SHARDFS + args, capture_output=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert hashlib.sha256(proc.stdout).hexdigest() == digest
    proc = run(SHARDFS + ["get", "-o", tmp_path / "out", path, keys[at].hex(), "00" * 32])
    assert proc.returncode == 1 and "not found" in proc.stderr
    assert hashlib.sha256((tmp_path / "out" / keys[at].hex()).read_bytes()).hexdigest() == digest
    proc = run(SHARDFS + ["get", "--hash", "blake2s256", path, "00" * 20])
    assert proc.returncode == 2  # not a hash shardfs names objects by
    for name in ("raw", "zstd", "zstd_dict", "small", "small_zstd", "empty"):
        proc = run(SHARDFS + ["check", "--hash", mosaics[name][0]])
        assert proc.returncode == 0 and "OK" in proc.stdout, (name, proc.stdout, proc.stderr)


def test_damaged_files_get_one_line_errors(mosaics, tmp_path):
    """A truncated file, or one whose metadata, an object or an index is
    damaged, is refused or reported in one line naming what is wrong, with
    a non-zero exit and no traceback; never served wrong bytes."""
    path, m = mosaics["small"]
    data = path.read_bytes()
    bad = tmp_path / "bad.mosaic"
    for cut in (3, 40, 200, len(data) // 2, len(data) - 30):
        bad.write_bytes(data[:cut])
        proc = run(SHARDFS + ["info", bad])
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, cut
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        with pytest.raises((CorruptShardError, OSError)):
            MosaicFile(str(bad))
        if cut >= 4:  # EBML's magic is there: a MOSAIC file cut short
            with pytest.raises(CorruptShardError) as refused:
                Shard(str(bad))
            assert "\n" not in str(refused.value) and "bad magic" not in str(refused.value)
    # One byte of an object flipped (raw: stored as it is): check names the
    # Tile whose CRC-32 no longer matches; the object read gives other
    # bytes than the manifest's, so check --hash names its key too.
    with MosaicFile(str(path)) as f:
        keys, length, digest = next(o for o in m["objects"] if o[1] > 100)
        obj, _ = f.locate(keys[m["indexes"].index("sha256")], "sha256")
    flipped = bytearray(data)
    flipped[obj + 50] ^= 0xFF
    bad.write_bytes(bytes(flipped))
    proc = run(SHARDFS + ["check", "--hash", bad])
    assert proc.returncode == 1 and "CRC-32 of Tile" in proc.stdout and "has another sha256" in proc.stdout
    assert "Traceback" not in proc.stderr
    # The metadata damaged: refused at open.
    flipped = bytearray(data)
    meta = data.index(bytes.fromhex("1D535748"))
    flipped[meta + 20] ^= 0x01
    bad.write_bytes(bytes(flipped))
    proc = run(SHARDFS + ["ls", bad])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "CRC" in proc.stderr


def test_shardfs_does_not_write_mosaic_files(mosaics, tmp_path):
    """delete refuses a MOSAIC file in one line, the file untouched."""
    path, m = mosaics["small"]
    copy = tmp_path / "copy.mosaic"
    shutil.copy(path, copy)
    before = copy.read_bytes()
    key = m["objects"][0][0][m["indexes"].index("sha256")]
    proc = run(SHARDFS + ["delete", "--yes", copy, key.hex()])
    assert proc.returncode != 0 and "MOSAIC" in proc.stderr and "Traceback" not in proc.stderr
    assert copy.read_bytes() == before
    assert os.path.getsize(copy) == len(before)


# ------------------------------------------------------------------ MOSAIC files as shards


def _live(m):
    """{sha256 key: (keys by index name, length, sha256 hex)} of a manifest."""
    names = m["indexes"]
    return {keys[names.index("sha256")]: (dict(zip(names, keys)), length, digest)
            for keys, length, digest in m["objects"]}


@pytest.mark.parametrize("name", ["raw", "zstd", "zstd_dict", "deleted_zstd"])
def test_mosaic_file_is_a_shard(mosaics, name):
    """`shardfs.Shard` opens a MOSAIC file by its content (kind "mosaic")
    and serves it as a Read Shard of its sha256 index's slots: every live
    object's bytes as swh's reader gives them (whole and in pieces), by
    key and by slot; deleted and absent keys not found; its structure
    check clean; writing refused in one line."""
    from shardfs.errors import ShardError
    from shardfs.shard import Shard

    path, m = mosaics[name]
    live = _live(m)
    with Shard(path) as shard:
        assert shard.kind == "mosaic"
        assert len(shard) == m["live"]["sha256"] == len(live)
        for key, (_, length, digest) in live.items():
            data = shard[key]
            assert len(data) == length and hashlib.sha256(data).hexdigest() == digest
            if length > 10:
                data_offset, size = shard.locate(key)
                assert shard.pread(data_offset, size, 3, 7) == data[3:10]
                assert shard.pread(data_offset, size, length - 2, 100) == data[-2:]
        at = m["indexes"].index("sha256")
        for keys in m["deleted"]:
            assert keys[at] not in shard
        for index, key in m["absent"]:
            if index == "sha256":
                assert key not in shard
        assert {key for _slot, key, _off, _size in shard.scan()} == set(live)
        assert shard.check() == []
        assert shard.get_batch(list(live)[:50] + [b"\0" * 32]) == [shard[k] for k in list(live)[:50]] + [None]
    with pytest.raises((ShardError, OSError, ValueError)) as refused:
        Shard(path, writable=True)
    assert "MOSAIC" in str(refused.value) and "\n" not in str(refused.value)


def test_objstorage_serves_mosaic_files_beside_read_shards(mosaics, tmp_path):
    """The objstorage's shard_dir takes MOSAIC files (named anything) beside
    Read Shards: every object of each, by sha256; absent ones raise."""
    from swh.objstorage.exc import ObjNotFoundError

    from shardfs.objstorage import ShardfsObjStorage

    d = tmp_path / "dir"
    d.mkdir()
    expected = {}
    for name in ("raw", "zstd_dict"):
        shutil.copy(mosaics[name][0], d / f"{name}-image")
        expected.update({k: v[2] for k, v in _live(mosaics[name][1]).items()})
    from shardfs.shard import ShardWriter
    data = {hashlib.sha256(b).digest(): b for b in (os.urandom(n) for n in (1, 100, 5000))}
    with ShardWriter(str(d / "r.shard")) as w:
        for key, b in data.items():
            w.add(key, b)
    expected.update({k: hashlib.sha256(b).hexdigest() for k, b in data.items()})
    storage = ShardfsObjStorage(shard_dir=str(d), cache_dir=str(tmp_path / "cache"))
    for key, digest in expected.items():
        assert hashlib.sha256(storage.get({"sha256": key})).hexdigest() == digest
    absent = [key for index, key in mosaics["raw"][1]["absent"] if index == "sha256"]
    assert absent
    for key in absent:
        with pytest.raises(ObjNotFoundError):
            storage.get({"sha256": key})


def test_mount_serves_mosaic_files_beside_read_shards(mosaics, mounter, tmp_path):
    """A --shard-dir mount of MOSAIC files (raw, zstd, zstd with a
    dictionary; named without a suffix: recognized by content) beside a
    Read Shard: every object read through the mount by sha256sum is right,
    the tree lists exactly the live keys, sha1 and sha1_git names and
    SWHIDs answer (-o hashes), deleted and absent keys are not there; an
    object deleted in place by swh's MosaicUpdater on a mounted file is
    gone within the live bound, cached bytes included."""
    from mosaic_fixtures import INDEXES
    from mounting import bash, build_shard, make_blobs, wait_until
    from swh.mosaic import MosaicUpdater

    d = tmp_path / "dir"
    d.mkdir()
    expected, by_hash = {}, []
    for name in ("raw", "zstd", "zstd_dict", "deleted_zstd"):
        shutil.copy(mosaics[name][0], d / f"{name}-image")
        for key, (keys, length, digest) in _live(mosaics[name][1]).items():
            expected[key.hex()] = digest
            by_hash += [(h, keys[h].hex(), digest) for h in ("sha1", "sha1_git") if h in keys]
    blobs = build_shard(d / "r.shard", make_blobs(5, 60, 1, 5000))
    expected.update({k: k for k in blobs})
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(d), "--cache-dir", str(tmp_path / "cache"),
                          "-o", "hashes=sha1:sha1_git")
    sums = bash('cd "$1" && find . -type f | xargs sha256sum', point).split("\n")
    listed = {line.split()[1].rsplit("/", 1)[1]: line.split()[0] for line in sums if line}
    assert listed == expected
    for key in list(expected)[::7]:
        assert hashlib.sha256((point / key).read_bytes()).hexdigest() == expected[key]
    name, m = "raw", mosaics["raw"][1]
    at = m["indexes"].index("sha256")
    for keys in mosaics["deleted_zstd"][1]["deleted"]:
        assert not (point / keys[-1].hex()).exists()
    for index, key in m["absent"]:
        if index == "sha256":
            assert not (point / key.hex()).exists()

    def by_hashes_answer():
        try:
            return all(hashlib.sha256((point / h / hx).read_bytes()).hexdigest() == digest
                       for h, hx, digest in by_hash[::5])
        except FileNotFoundError:
            return False  # the hash indexes are still being built

    # zstd_dict has no sha1_git index of its own: that index is built by
    # hashing its objects (the others come from the files' own indexes)
    for keys in [o[0] for o in mosaics["zstd_dict"][1]["objects"][:10]]:
        data = (point / keys[mosaics["zstd_dict"][1]["indexes"].index("sha256")].hex()).read_bytes()
        git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        by_hash.append(("sha1_git", git, hashlib.sha256(data).hexdigest()))
    assert wait_until(by_hashes_answer, timeout=60)
    assert all(hashlib.sha256((point / h / hx).read_bytes()).hexdigest() == digest for h, hx, digest in by_hash)
    h, hx, digest = next(t for t in by_hash if t[0] == "sha1_git")
    assert hashlib.sha256((point / f"swh:1:cnt:{hx}").read_bytes()).hexdigest() == digest

    # A takedown by swh's own updater, on the mounted copy of raw.
    victim_keys, length, digest = next(o for o in m["objects"] if o[1] > 100)
    victim = point / victim_keys[at].hex()
    old = victim.read_bytes()  # its name, attributes and bytes in the kernel's caches
    updater = MosaicUpdater(str(d / "raw-image"))
    updater.delete([(INDEXES[n][0], k) for n, k in zip(m["indexes"], victim_keys)])
    updater.close()

    def gone():
        try:
            data = victim.read_bytes()
        except FileNotFoundError:
            return True
        assert data == old, "a deleted object read other bytes than its own"
        return False

    assert wait_until(gone, timeout=5.0), "a deleted MOSAIC object is still served"
    others = [o for o in m["objects"] if o[0] is not victim_keys][:20]
    for keys, _length, digest in others:
        assert hashlib.sha256((point / keys[at].hex()).read_bytes()).hexdigest() == digest


def test_mount_reads_large_compressed_objects_in_pieces(mounter, tmp_path):
    """Objects of several READs in a zstd MOSAIC file (swh's writer), read
    through the mount whole by `cat` and in pieces at random offsets by 8
    threads at once, then again after the mount's process let their
    decoded copies go: every byte right (an object of more than 32 MiB:
    the first READ decodes it whole and stores the rest into the page
    cache; a smaller one: decoded once into the process's cache, which
    answers the READs; concurrent READs share one decoding)."""
    import concurrent.futures
    import random

    from swh.mosaic import IdxDescription, MosaicCreator

    rng = random.Random(7)
    sizes = [128 * 1024 + 1, 300_000, 1 << 20, 5 << 20, 3 << 20]
    objects = []
    for size in sizes:
        text = b" ".join(rng.choice((b"mosaic", b"shard", b"heritage", b"%d" % rng.randrange(10**6)))
                         for _ in range(size // 4))
        objects.append(bytes(a ^ b for a, b in zip(text[:size], rng.randbytes(size))) if size % 2 else text[:size])
    objects.append(rng.randbytes(1 << 20) * 33 + b"past 32 MiB")  # decoded whole, stored (ll_fast.c)
    d = tmp_path / "dir"
    d.mkdir()
    creator = MosaicCreator(str(d / "big"), [IdxDescription.SHA256FMPHGO], compression_level=3)
    for data in objects:
        creator.add([hashlib.sha256(data).digest()], data)
    creator.close()
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(d), "--layout", "flat")
    by_name = {hashlib.sha256(data).hexdigest(): data for data in objects}
    for round_ in range(2):
        pieces = [(name, rng.randrange(len(data)), rng.randrange(1, 400_000))
                  for name, data in by_name.items() for _ in range(40)]
        rng.shuffle(pieces)

        def read(piece):
            name, offset, length = piece
            fd = os.open(point / name, os.O_RDONLY)
            try:
                return os.pread(fd, length, offset) == by_name[name][offset:offset + length]
            finally:
                os.close(fd)

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert all(pool.map(read, pieces)), f"round {round_}: a piece read other bytes"
        for name, data in by_name.items():
            proc = subprocess.run(["cat", str(point / name)], capture_output=True, timeout=60)
            assert proc.returncode == 0 and proc.stdout == data
        # the kernel's cached pages dropped: the next round reads through the mount again
        for name in by_name:
            fd = os.open(point / name, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def test_close_from_another_thread_waits_for_reads_in_flight(tmp_path):
    """`MosaicFile.close()` from one thread while another decodes a large
    zstd object (the GIL released): the read in flight ends with the
    object's bytes (the file is unmapped when it returns, not under it),
    every later call raises ValueError, and the process lives (a child,
    so that a crash shows as its exit status)."""
    code = r"""
import hashlib, os, sys, threading, time
from swh.mosaic import IdxDescription, MosaicCreator
from shardfs.mosaic import MosaicFile
path = sys.argv[1]
block = os.urandom(1 << 20)
big = block * 96
key = hashlib.sha256(big).digest()
creator = MosaicCreator(path, [IdxDescription.SHA256FMPHGO], compression_level=1)
creator.add([key], big)
creator.close()
outcomes = []
for attempt in range(20):
    f = MosaicFile(path)
    started = threading.Event()
    def read():
        started.set()
        try:
            outcomes.append(f.get(key) == big)
        except ValueError:
            outcomes.append("closed")
    t = threading.Thread(target=read)
    t.start()
    started.wait()
    time.sleep(0.002 * (attempt % 5))
    f.close()
    t.join()
    try:
        f.get(key)
        outcomes.append("read after close")
    except ValueError:
        pass
print(sorted(set(map(str, outcomes))))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "big.mosaic")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    seen = eval(proc.stdout)
    assert set(seen) <= {"True", "closed"} and "True" in seen, seen


def test_a_million_keys_by_every_index_as_swh_reads_them(tmp_path):
    """Files of 1,000,000 objects written by swh.mosaic's MosaicCreator
    (raw, indexed by sha256, sha1 and sha1_git; zstd level 3, by sha256):
    every object, looked up by each index, and 20,000 absent keys, give
    exactly what swh.mosaic's MosaicReader gives (perfect hashes of many
    levels, entries across a large index)."""
    import random

    from swh.mosaic import Backend, IdxDescription, MosaicCreator, MosaicReader

    count = 1_000_000
    rng = random.Random(31)
    contents = [b"%d:" % i + rng.randbytes(rng.randrange(0, 48)) for i in range(count)]
    digests = {"sha256": [hashlib.sha256(c).digest() for c in contents],
               "sha1": [hashlib.sha1(c).digest() for c in contents],
               "sha1_git": [hashlib.sha1(b"blob %d\0" % len(c) + c).digest() for c in contents]}
    described = {"sha256": IdxDescription.SHA256FMPHGO, "sha1": IdxDescription.SHA1FMPHGO,
                 "sha1_git": IdxDescription.SHA1GITFMPHGO}
    for name, kinds, level in (("raw", ["sha256", "sha1", "sha1_git"], None), ("zstd", ["sha256"], 3)):
        path = tmp_path / f"{name}.mosaic"
        creator = MosaicCreator(str(path), [described[k] for k in kinds],
                                **({"compression_level": level} if level else {}))
        for i, content in enumerate(contents):
            creator.add([digests[k][i] for k in kinds], content)
        creator.close()
        with MosaicFile(str(path)) as mine:
            assert mine.info["objects_counter"] == count
            for kind in kinds:
                theirs = MosaicReader(str(path), described[kind], Backend.MMAP)
                absent = [rng.randbytes(len(digests[kind][0])) for _ in range(20_000)]
                keys = digests[kind] + absent
                for start in range(0, len(keys), 100_000):
                    chunk = keys[start:start + 100_000]
                    got = mine.get_batch(chunk, kind)
                    assert got == [_lookup(theirs, k) for k in chunk], (name, kind, start)
                assert got[-20_000:] == [None] * 20_000
                assert [mine.get(k, kind) for k in digests[kind][::997]] == contents[::997]


def _lookup(reader, key: bytes):
    """swh.mosaic's MosaicReader.lookup, None for an absent key (it raises
    KeyError)."""
    try:
        return reader.lookup(key)
    except KeyError:
        return None


def test_get_batch_reports_a_damaged_object_in_one_line(mosaics, tmp_path):
    """`get_batch` over many keys (several threads) with one object's
    element damaged: CorruptShardError naming its byte position in one
    line, as `get` of that key gives; the other keys read right."""
    path, m = mosaics["zstd"]
    at = m["indexes"].index("sha256")
    good = [(o[0][at], o[2]) for o in m["objects"]]
    with MosaicFile(str(path)) as f:
        victim = good[len(good) // 2][0]
        obj, _ = f.locate(victim)
    data = bytearray(path.read_bytes())
    assert data[obj] == 0xF0  # the Object element's ID
    data[obj] = 0xF1
    bad = tmp_path / "bad.mosaic"
    bad.write_bytes(bytes(data))
    keys = [k for k, _ in good] * 3
    with MosaicFile(str(bad)) as f:
        with pytest.raises(CorruptShardError) as batch:
            f.get_batch(keys)
        with pytest.raises(CorruptShardError) as one:
            f.get(victim)
        assert str(batch.value) == str(one.value) and "\n" not in str(one.value) and str(obj) in str(one.value)
        rest = [k for k in keys if k != victim]
        assert [hashlib.sha256(d).hexdigest() for d in f.get_batch(rest)] == \
            [digest for k, digest in good if k != victim] * 3
