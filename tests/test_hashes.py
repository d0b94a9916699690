"""Objects found by sha1, sha1_git and content SWHIDs (shardfs/hashes.py,
shardfs/c/hashindex.c): names checked against sha1sum, git hash-object and
swh.model's own hashing for real files; the CLI, the Python API and a
mount; mappings with wrong rows, damaged indexes and killed builds never
serve a wrong object."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mounting import SHARDFS, bash, run, wait_until
from swh.model.hashutil import MultiHash
from swh.model.swhids import CoreSWHID, ObjectType

from shardfs import Shard, ShardWriter, hashes, sidecar
from shardfs import delete as shardfs_delete

#: Files every Debian machine has (base-files, bash, coreutils...).
SOURCES = ["/usr/share/common-licenses", "/usr/share/doc/bash", "/usr/share/doc/coreutils", "/etc/debian_version"]


def _files(limit: int = 200) -> list:
    out = []
    for source in SOURCES:
        if os.path.isfile(source):
            out.append(source)
            continue
        for root, _, names in sorted(os.walk(source)):
            for name in sorted(names):
                path = os.path.join(root, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    out.append(path)
    return out[:limit]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A shard built by `shardfs create` from real files, indexed by
    `shardfs index` in its own cache directory; (shard path, cache dir,
    {path: bytes})."""
    d = tmp_path_factory.mktemp("real")
    files = _files()
    shard = d / "real.shard"
    run(SHARDFS + ["create", shard, *files], check=True)
    cache = d / "cache"
    proc = run(SHARDFS + ["index", "--hashes", "sha1,sha1_git", "--cache-dir", cache, shard], check=True)
    assert "sha1, sha1_git indexed" in proc.stdout
    return shard, cache, {f: Path(f).read_bytes() for f in files}


def test_digests_match_sha1sum_git_and_swh_model(real):
    """For each real file, `shardfs get --hash` by the digest sha1sum and
    git hash-object print (and by the SWHID swh.model makes of the same
    bytes) writes the file's bytes; swh.model's MultiHash agrees with the
    digests shardfs computes."""
    shard, cache, files = real
    paths = sorted(files)[:40]
    sha1sum = dict(line.split(None, 1)[::-1] for line in bash('sha1sum "$@"', *paths).splitlines())
    git = bash('git hash-object "$@"', *paths).split()
    for path, git_hex in zip(paths, git):
        data = files[path]
        ours = {n: hashes.digest(n, data) for n in hashes.HASH_NAMES}
        theirs = MultiHash.from_data(data).digest()
        assert ours["sha1"] == theirs["sha1"] == bytes.fromhex(sha1sum[path])
        assert ours["sha1_git"] == theirs["sha1_git"] == bytes.fromhex(git_hex)
        swhid = str(CoreSWHID(object_type=ObjectType.CONTENT, object_id=theirs["sha1_git"]))
        assert swhid == f"swh:1:cnt:{git_hex}"
        for name, text in (("sha1", sha1sum[path]), ("sha1_git", git_hex), ("sha1_git", swhid)):
            proc = subprocess.run(SHARDFS + ["get", "--hash", name, "--cache-dir", str(cache), str(shard), text],
                                  capture_output=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
            assert proc.stdout == data, (path, name)


def test_parse_swhid_reads_what_swh_model_writes():
    """`hashes.parse_swhid` (the request path's parser) gives back the
    sha1_git of every content SWHID swh.model writes, and None for what is
    no content SWHID (another object type, upper case, a wrong length, a
    NUL, qualifiers)."""
    for data in (b"", b"x", bytes(range(256)) * 9):
        git = MultiHash.from_data(data).digest()["sha1_git"]
        swhid = str(CoreSWHID(object_type=ObjectType.CONTENT, object_id=git))
        assert hashes.parse_swhid(swhid) == git
        assert hashes.parse_swhid(swhid.upper()) is None
        assert hashes.parse_swhid(swhid[:-1]) is None
        assert hashes.parse_swhid(swhid + "0") is None
        assert hashes.parse_swhid(swhid[:-1] + "\0") is None
        assert hashes.parse_swhid(swhid + ";origin=x") is None
        assert hashes.parse_swhid(str(CoreSWHID(object_type=ObjectType.DIRECTORY, object_id=git))) is None
    assert hashes.parse_swhid("") is None


def test_get_by_hash_errors(real, tmp_path):
    """An absent digest: reported, exit 1; a malformed one: exit 2; a
    digest of the other hash is absent; no index: one line naming the
    command that builds it."""
    shard, cache, files = real
    data = next(iter(files.values()))
    base = SHARDFS + ["get", "--cache-dir", str(cache), str(shard)]
    proc = run(base + ["--hash", "sha1", "0" * 40])
    assert proc.returncode == 1 and "not found" in proc.stderr
    proc = run(base + ["--hash", "sha1_git", hashlib.sha1(data).hexdigest()])
    assert proc.returncode == 1
    proc = run(base + ["--hash", "sha1", "swh:1:cnt:" + "0" * 40])
    assert proc.returncode == 2 and "not a sha1" in proc.stderr
    proc = run(base + ["--hash", "sha1", "z" * 40])
    assert proc.returncode == 2
    proc = run(SHARDFS + ["get", "--hash", "sha1", "--cache-dir", str(tmp_path), str(shard), "0" * 40])
    assert proc.returncode == 1
    assert "no sha1 index: build it with 'shardfs index --hashes sha1" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run(SHARDFS + ["index", "--hashes", "md5", str(shard)])
    assert proc.returncode == 2 and "unknown hash 'md5'" in proc.stderr


def _shard(path: Path, blobs) -> dict:
    with ShardWriter(path) as w:
        for b in blobs:
            w.add(hashlib.sha256(b).digest(), b)
    return {hashlib.sha256(b).digest(): b for b in blobs}


def _blobs(seed: int, n: int) -> list:
    rng = random.Random(seed)
    out = {rng.randbytes(rng.choice([0, 1, 7, 100, 4096, 20000])) for _ in range(n)}
    return sorted(out)


def test_api_finds_by_every_hash(tmp_path):
    """The Python API: every object found by its sha1 and sha1_git (slot,
    offset, size of its key's lookup), an empty object and a 3 MB one
    included; absent digests None; an index by one hash never answers for
    the other."""
    blobs = _blobs(1, 300) + [b"x" * 3_000_000]
    objects = _shard(tmp_path / "s.shard", blobs)
    cache = str(tmp_path / "cache")
    with Shard(tmp_path / "s.shard") as s:
        assert hashes.build(s, hashes.HASH_NAMES, cache) == ["sha1", "sha1_git"]
        assert hashes.build(s, hashes.HASH_NAMES, cache) == []  # already there
        indexes = {n: hashes.open_index(s, n, cache) for n in hashes.HASH_NAMES}
        for key, data in objects.items():
            where = s.find(key)
            for name, index in indexes.items():
                assert hashes.find(s, index, hashes.digest(name, data)) == where
        assert hashes.find(s, indexes["sha1"], os.urandom(20)) is None
        assert hashes.find(s, indexes["sha1_git"], hashes.digest("sha1", blobs[5])) is None
        assert os.path.getsize(hashes.index_path(cache, sidecar.identity(s), "sha1")) <= 8 * len(objects) + 96 + 4 * 257


def test_wrong_mapping_rows_never_serve_a_wrong_object(tmp_path):
    """A mapping made with swh.model (the content table's columns) is
    imported without reading the objects; then rows that lie (the digests
    of two objects swapped, a digest of no object, rows of keys in no
    shard, a malformed file) make objects not found by those names, never
    found as another object."""
    blobs = _blobs(2, 200)
    _shard(tmp_path / "s.shard", blobs)
    cache = str(tmp_path / "cache")
    rows = [MultiHash.from_data(b).digest() for b in blobs]
    liars = {0, 1}
    rows[0]["sha1"], rows[1]["sha1"] = rows[1]["sha1"], rows[0]["sha1"]
    rows[2]["sha1_git"] = bytes(20)
    rows.append(MultiHash.from_data(b"in no shard").digest())
    mapping = tmp_path / "content.csv"
    with open(mapping, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sha1", "sha1_git", "sha256", "blake2s256", "length"])
        for r, b in zip(rows, blobs + [b"in no shard"]):
            w.writerow(["\\x" + r["sha1"].hex(), r["sha1_git"].hex(), r["sha256"].hex(), r["blake2s256"].hex(),
                        len(b)])
    proc = run(SHARDFS + ["index", "--hashes", "sha1,sha1_git", "--mapping", mapping, "--cache-dir", cache,
                          tmp_path / "s.shard"], check=True)
    assert f"{len(rows)} rows, {len(blobs)} of the shards' {len(blobs)} objects" in proc.stdout
    with Shard(tmp_path / "s.shard") as s:
        sha1 = hashes.open_index(s, "sha1", cache)
        git = hashes.open_index(s, "sha1_git", cache)
        for i, b in enumerate(blobs):
            where = s.find(hashlib.sha256(b).digest())
            found = hashes.find(s, sha1, hashes.digest("sha1", b))
            assert found == (None if i in liars else where)
            assert hashes.find(s, sha1, rows[i]["sha1"]) == (None if i in liars else where)
            assert hashes.find(s, git, hashes.digest("sha1_git", b)) == (None if i == 2 else where)
        assert hashes.find(s, git, bytes(20)) is None
    bad = tmp_path / "bad.tsv"
    bad.write_text("sha256\tsha1\n" + "ab" * 32 + "\tnothex\n")
    proc = run(SHARDFS + ["index", "--hashes", "sha1", "--mapping", bad, "--cache-dir", cache, tmp_path / "s.shard"])
    assert proc.returncode == 1 and "line 2: column sha1" in proc.stderr
    proc = run(SHARDFS + ["index", "--hashes", "sha1_git", "--mapping", bad, "--cache-dir", cache,
                          tmp_path / "s.shard"])
    assert proc.returncode == 1 and "no sha1_git column" in proc.stderr


def test_damaged_index_never_serves_a_wrong_object(tmp_path):
    """Every byte of an index's entries overwritten at random (seeded, 30
    times): each lookup answers the right object or none; a truncated or
    another shard's index is not used (logged), and is built again."""
    blobs = _blobs(3, 150)
    objects = _shard(tmp_path / "s.shard", blobs)
    cache = str(tmp_path / "cache")
    rng = random.Random(3)
    with Shard(tmp_path / "s.shard") as s:
        hashes.build(s, ["sha1_git"], cache)
        path = hashes.index_path(cache, sidecar.identity(s), "sha1_git")
        good = Path(path).read_bytes()
        for _ in range(30):
            damaged = bytearray(good)
            for _ in range(rng.randint(1, 40)):
                at = rng.randrange(96, len(damaged))
                damaged[at] = rng.randrange(256)
            Path(path).write_bytes(bytes(damaged))
            index = hashes.open_index(s, "sha1_git", cache)
            for key, data in objects.items():
                found = hashes.find(s, index, hashes.digest("sha1_git", data))
                assert found is None or found == s.find(key)
            index.close()
        Path(path).write_bytes(good[:-8])
        assert hashes.open_index(s, "sha1_git", cache) is None
        assert hashes.build(s, ["sha1_git"], cache) == ["sha1_git"]
        assert Path(path).read_bytes() == good


def test_killed_build_leaves_nothing_or_a_whole_index(tmp_path):
    """`shardfs index` killed (SIGKILL) at random points of its build
    leaves either no index or a complete, usable one, and no temporary
    file in the cache directory."""
    rng = random.Random(4)
    blobs = [rng.randbytes(rng.randint(1, 200_000)) for _ in range(600)]
    objects = _shard(tmp_path / "s.shard", blobs)
    cache = tmp_path / "cache"
    outcomes = set()
    for delay in (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5):
        shutil.rmtree(cache, ignore_errors=True)
        proc = subprocess.Popen(SHARDFS + ["index", "--hashes", "sha1,sha1_git", "--cache-dir", str(cache),
                                           str(tmp_path / "s.shard")], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        names = sorted(os.listdir(cache)) if cache.exists() else []
        assert all(n.endswith((".sha1", ".sha1_git")) for n in names), names
        outcomes.add(len(names))
        with Shard(tmp_path / "s.shard") as s:
            for name in hashes.HASH_NAMES:
                index = hashes.open_index(s, name, str(cache))
                if index is None:
                    continue
                assert index.count == len(objects)
                for key, data in list(objects.items())[:50]:
                    assert hashes.find(s, index, hashes.digest(name, data)) == s.find(key)
    assert 0 in outcomes, "no kill landed before the indexes were written"


def test_mount_names_by_hash(tmp_path, mounter):
    """A mount with -o hashes=sha1:sha1_git over several shards: sha1/<hex>,
    sha1_git/<hex> and swh:1:cnt:<hex> give each object's bytes with the
    inode of its key's name; those names are not listed (the root lists
    each object once: rsync copies each once); absent or malformed names
    are ENOENT; the stats say how many shards are indexed. Indexes are
    built by the mount itself (the cache directory starts empty)."""
    shards = []
    objects = {}
    for i in range(4):
        blobs = _blobs(10 + i, 60)
        objects.update(_shard(tmp_path / f"s{i}.shard", blobs))
        shards.append(tmp_path / f"s{i}.shard")
    point = mounter.mount(shards, tmp_path / "m", "--layout", "flat", "-o", "hashes=sha1:sha1_git")
    stats = lambda: json.loads(os.getxattr(point, "user.shardfs.stats"))  # noqa: E731
    assert wait_until(lambda: stats()["hashes"]["sha1_git"] == 4, timeout=30), stats()
    assert stats()["hashes"]["pending"] == 0
    # The levels over the digests hold every shard: a lookup asks the one
    # shard that has the object (not the four).
    assert wait_until(lambda: stats()["hashes"]["unlevelled"] == {"sha1": 0, "sha1_git": 0}, timeout=30), stats()
    listed = os.listdir(point)
    assert sorted(listed) == sorted(k.hex() for k in objects)
    for key, data in objects.items():
        ino = os.stat(point / key.hex()).st_ino
        git = hashes.digest("sha1_git", data).hex()
        for name in (f"sha1/{hashes.digest('sha1', data).hex()}", f"sha1_git/{git}", f"swh:1:cnt:{git}"):
            assert (point / name).read_bytes() == data, name
            assert os.stat(point / name).st_ino == ino
    for name in ("sha1/" + "0" * 40, "sha1_git/" + "0" * 40, "swh:1:cnt:" + "0" * 40, "sha1/xyz",
                 "swh:1:cnt:" + "A" * 40, "swh:1:dir:" + git, "sha1/" + git.upper()):
        with pytest.raises(FileNotFoundError):
            os.stat(point / name)
    assert os.listdir(point / "sha1") == []
    copy = tmp_path / "copy"
    run(["rsync", "-a", f"{point}/", str(copy)], check=True)
    assert sorted(os.listdir(copy)) == sorted(k.hex() for k in objects)


def test_mount_without_hashes_has_no_hash_names(tmp_path, mounter):
    """Without -o hashes, sha1/ and swh:1:cnt: names do not exist; a bad
    hashes= value is refused at mount with one line."""
    objects = _shard(tmp_path / "s.shard", _blobs(20, 10))
    data = next(iter(objects.values()))
    point = mounter.mount(tmp_path / "s.shard", tmp_path / "m")
    assert not os.path.exists(point / "sha1")
    assert not os.path.exists(point / f"swh:1:cnt:{hashes.digest('sha1_git', data).hex()}")
    proc = run(SHARDFS + ["mount", "-o", "hashes=md5", tmp_path / "s.shard", tmp_path / "m2"])
    assert proc.returncode == 1 and "hashes=md5" in proc.stderr and "unknown hash 'md5'" in proc.stderr


def test_hash_lookups_ask_only_the_shard_that_holds_the_object(tmp_path, mounter):
    """40 shards in a shard directory, one worker: once the levels over
    the digests hold them all, finding 40 objects by sha1_git asks about
    40 shards in all (not 40 x 40); a shard added later is indexed and
    found too."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    objects = {}
    for i in range(40):
        objects.update(_shard(shard_dir / f"{i:02}.shard", _blobs(100 + i, 5)))
    point = mounter.mount([], tmp_path / "m", "--shard-dir", shard_dir, "-o", "hashes=sha1_git,workers=1")
    stats = lambda: json.loads(os.getxattr(point, "user.shardfs.stats"))["hashes"]  # noqa: E731
    assert wait_until(lambda: stats()["sha1_git"] == 40 and stats()["unlevelled"]["sha1_git"] == 0, timeout=60), \
        stats()
    before = stats()["probes"]
    for data in list(objects.values())[::5]:
        assert (point / f"swh:1:cnt:{hashes.digest('sha1_git', data).hex()}").read_bytes() == data
    asked = stats()["probes"] - before
    assert asked <= len(list(objects)[::5]) + 2, asked
    late = _shard(shard_dir / "99.shard", [b"a late object"])
    data = next(iter(late.values()))
    name = point / "sha1_git" / hashes.digest("sha1_git", data).hex()
    assert wait_until(lambda: name.exists(), timeout=30), stats()
    assert name.read_bytes() == data


def test_takedown_hides_the_names_by_hash_too(tmp_path, mounter):
    """`shardfs delete` of an object read through its sha1_git and SWHID
    names (cached by the kernel): those names fail at once, like its key;
    the builder logged its work."""
    blobs = _blobs(30, 20)
    objects = _shard(tmp_path / "s.shard", blobs)
    log_file = tmp_path / "mount.log"
    point = mounter.mount(tmp_path / "s.shard", tmp_path / "m", "-o", "hashes=sha1:sha1_git",
                          "--log-file", log_file)
    stats = lambda: json.loads(os.getxattr(point, "user.shardfs.stats"))["hashes"]  # noqa: E731
    assert wait_until(lambda: stats()["pending"] == 0, timeout=30), stats()
    key, data = next((k, d) for k, d in objects.items() if d)
    git = hashes.digest("sha1_git", data).hex()
    names = [point / "sha1_git" / git, point / f"swh:1:cnt:{git}", point / "sha1" / hashes.digest("sha1", data).hex()]
    for name in names:
        assert name.read_bytes() == data
    run(SHARDFS + ["delete", "--yes", tmp_path / "s.shard", key.hex()], check=True)
    for name in names + [point / key.hex()]:
        with pytest.raises(FileNotFoundError):
            name.read_bytes()
    text = log_file.read_text()
    assert "indexing by sha1, sha1_git" in text and "indexed by sha1, sha1_git in" in text


def test_shard_set_finds_by_hash_and_sees_takedowns(tmp_path):
    """A ShardSet's HashSet (what the objstorage and the mount's handlers
    use) over three shards: every object found by sha1 and sha1_git, the
    second time from the digests it remembers as checked; a takedown is
    seen at the next lookup all the same."""
    from shardfs.shardset import open_shard_set

    objects, paths = {}, []
    for i in range(3):
        paths.append(str(tmp_path / f"{i}.shard"))
        objects.update(_shard(Path(paths[-1]), _blobs(40 + i, 30)))
    cache = str(tmp_path / "cache")
    for path in paths:
        with Shard(path) as s:
            hashes.build(s, hashes.HASH_NAMES, cache)
    shards = open_shard_set(paths, cache_dir=cache)
    shards.hashes = hashes.HashSet(shards, hashes.HASH_NAMES)
    try:
        assert shards.hashes.scan() == 3
        for _ in range(2):
            for key, data in objects.items():
                for name in hashes.HASH_NAMES:
                    member, slot, off, size = shards.hashes.find(name, hashes.digest(name, data))
                    assert member.shard.pread(off, size, 0, size) == data
        assert shards.hashes.find("sha1", os.urandom(20)) is None
        key, data = next((k, d) for k, d in objects.items() if len(d) > 100)  # in one shard only
        member = shards.find(key)[0]
        shardfs_delete(member.path, [key])
        assert shards.hashes.find("sha1_git", hashes.digest("sha1_git", data)) is None
    finally:
        shards.close()
