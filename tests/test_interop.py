"""Interoperability with the reference implementation, swh-shard 2.2.1
(module ``swh.shard``, command ``swh-shard``).

- a shard written by swh-shard opens, lists, reads and checks in shardfs
  (Python API and CLI);
- a shard written by shardfs (API and CLI) passes ``swh-shard check
  --with-hash`` and reads back through swh's API;
- an object deleted by either tool is gone for both (``ls``, ``get``,
  iteration, lookups).

swh-shard cannot build a shard of 0 objects (it hangs), so none is built here.
"""

import hashlib
import os
import random
import shutil
import subprocess
import sys

import pytest

import shardfs

swh_shard = pytest.importorskip("swh.shard")

SHARDFS = [sys.executable, "-m", "shardfs"]
TIMEOUT = 120  # seconds


def _swh_shard_command():
    """The swh-shard console script: next to this Python, or on PATH."""
    candidate = os.path.join(os.path.dirname(sys.executable), "swh-shard")
    if os.access(candidate, os.X_OK):
        return [candidate]
    found = shutil.which("swh-shard")
    if found:
        return [found]
    return None


SWH_SHARD = _swh_shard_command()
needs_swh_cli = pytest.mark.skipif(SWH_SHARD is None, reason="swh-shard command not found")


def run(cmd, *args):
    return subprocess.run(
        cmd + [str(a) for a in args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        timeout=TIMEOUT,
    )


def shardfs_cli(*args):
    return run(SHARDFS, *args)


def swh_cli(*args):
    return run(SWH_SHARD, *args)


def make_objects(n, seed=0, max_size=5000):
    """n distinct objects {sha256 key (32 bytes): content}, sizes in
    [0, max_size] bytes; the first one is the empty object."""
    rng = random.Random(seed)
    objects = {hashlib.sha256(b"").digest(): b""}
    while len(objects) < n:
        data = rng.randbytes(rng.randint(1, max_size))
        objects[hashlib.sha256(data).digest()] = data
    return objects


def build_with_swh(path, objects):
    with swh_shard.ShardCreator(str(path), len(objects)) as w:
        for key, data in objects.items():
            w.write(key, data)


def build_with_shardfs(path, objects):
    with shardfs.ShardWriter(str(path)) as w:
        for key, data in objects.items():
            w.add(key, data)


def shardfs_ls(path):
    proc = shardfs_cli("ls", "-l", path)
    assert proc.returncode == 0, proc.stderr
    return {k: int(s) for k, s in (line.split() for line in proc.stdout.decode().splitlines())}


def swh_keys(path):
    with swh_shard.Shard(str(path)) as s:
        return set(s)


@pytest.fixture(params=[1, 2, 1000], ids=lambda n: f"{n}obj")
def objects(request):
    return make_objects(request.param)


# -------------------------------------------------------- swh writes, we read


def test_swh_shard_reads_in_shardfs_api(tmp_path, objects):
    path = tmp_path / "swh.shard"
    build_with_swh(path, objects)
    with shardfs.Shard(str(path)) as s, swh_shard.Shard(str(path)) as ref:
        assert len(s) == len(objects)
        assert set(s) == set(objects)
        assert tuple(s.header) == tuple(
            getattr(ref.header, f)
            for f in (
                "version", "objects_count", "objects_position", "objects_size",
                "index_position", "index_size", "hash_position",
            )
        )
        assert s.slot_count == ref.header.index_size // 40
        for key, data in objects.items():
            assert key in s
            assert s[key] == data
            assert s.size(key) == len(data)
            data_offset, size = s.locate(key)
            assert size == len(data)
            assert s.pread(data_offset, size, 0, size) == data
        assert dict(s.items_sizes()) == {k: len(v) for k, v in objects.items()}
        absent = hashlib.sha256(b"absent").digest()
        assert absent not in s and s.get(absent) is None
        assert s.check() == []
        assert s.check(hash=True) == []


def test_swh_shard_reads_in_shardfs_cli(tmp_path, objects):
    path = tmp_path / "swh.shard"
    build_with_swh(path, objects)
    assert shardfs_ls(path) == {k.hex(): len(v) for k, v in objects.items()}
    keys = list(objects)[:50]
    proc = shardfs_cli("get", path, *[k.hex() for k in keys])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"".join(objects[k] for k in keys)
    proc = shardfs_cli("check", "--hash", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = shardfs_cli("info", path)
    assert proc.returncode == 0
    info = dict(line.split(": ", 1) for line in proc.stdout.decode().splitlines())
    assert int(info["live_objects"]) == len(objects)
    assert int(info["objects_position"]) == 512


def test_swh_shard_larger(tmp_path):
    """20,000 objects: the CHD hash of swh (cmph) and ours agree on every key."""
    objects = make_objects(20_000, seed=7, max_size=300)
    path = tmp_path / "big.swh.shard"
    build_with_swh(path, objects)
    with shardfs.Shard(str(path)) as s:
        assert len(s) == len(objects)
        for key, data in objects.items():
            assert s[key] == data
        assert s.check(hash=True) == []


@needs_swh_cli
def test_swh_cli_created_shard(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    contents = {}
    for i in range(30):
        data = f"file {i}\n".encode() * (i + 1)
        (src / f"f{i}").write_bytes(data)
        contents[hashlib.sha256(data).hexdigest()] = len(data)
    path = tmp_path / "cli.swh.shard"
    proc = swh_cli("create", path, *sorted(str(p) for p in src.iterdir()))
    assert proc.returncode == 0, proc.stderr
    assert shardfs_ls(path) == contents
    assert shardfs_cli("check", "--hash", path).returncode == 0


# -------------------------------------------------------- we write, swh reads


def test_shardfs_shard_reads_in_swh(tmp_path, objects):
    path = tmp_path / "ours.shard"
    build_with_shardfs(path, objects)
    with swh_shard.Shard(str(path)) as ref:
        assert ref.header.version == 1
        assert ref.header.objects_count == len(objects)
        assert set(ref) == set(objects)
        for key, data in objects.items():
            assert ref.lookup(key) == data
            assert ref.getsize(key) == len(data)
        with pytest.raises(KeyError):
            ref.lookup(hashlib.sha256(b"absent").digest())


@needs_swh_cli
def test_shardfs_shard_passes_swh_check(tmp_path, objects):
    path = tmp_path / "ours.shard"
    build_with_shardfs(path, objects)
    proc = swh_cli("check", "--with-hash", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = swh_cli("info", path)
    assert proc.returncode == 0, proc.stderr


@needs_swh_cli
def test_shardfs_cli_created_shard_passes_swh_check(tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {"a": b"alpha", "d/b": b"beta" * 1000, "d/c": b"alpha", "e": b""}
    for name, data in files.items():
        (src / name).write_bytes(data)
    path = tmp_path / "ours.shard"
    proc = shardfs_cli("create", path, src)
    assert proc.returncode == 0, proc.stderr
    proc = swh_cli("check", "--with-hash", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with swh_shard.Shard(str(path)) as ref:
        for data in files.values():
            assert ref.lookup(hashlib.sha256(data).digest()) == data
        assert len(set(ref)) == 3


@pytest.mark.parametrize("hash_builder", ["shardfs", "cmph"])
@pytest.mark.parametrize("n", [1, 3, 5000])
def test_both_hash_builders_read_in_swh(tmp_path, monkeypatch, hash_builder, n):
    """The perfect hash built by our builder (shardfs/c/chd_build.c, the
    default) and by cmph's (SHARDFS_CHD_BUILDER=cmph): swh-shard, which
    evaluates the function with cmph_load + cmph_search, finds every object;
    ``shardfs check --hash`` and ``swh-shard check --with-hash`` pass."""
    if hash_builder == "cmph":
        monkeypatch.setenv("SHARDFS_CHD_BUILDER", "cmph")
    else:
        monkeypatch.delenv("SHARDFS_CHD_BUILDER", raising=False)
    objects = make_objects(n, seed=12, max_size=200)
    path = tmp_path / f"{hash_builder}.shard"
    with shardfs.ShardWriter(str(path)) as w:
        for key, data in objects.items():
            w.add(key, data)
    stats = w.build_stats
    assert stats["builder"] == hash_builder
    assert stats["hash_seconds"] >= 0 and stats["check_seconds"] >= 0
    with swh_shard.Shard(str(path)) as ref:
        for key, data in objects.items():
            assert ref.lookup(key) == data
        with pytest.raises(KeyError):
            ref.lookup(hashlib.sha256(b"absent").digest())
    proc = shardfs_cli("check", "--hash", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if SWH_SHARD is not None:
        proc = swh_cli("check", "--with-hash", path)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shardfs_larger_reads_in_swh(tmp_path):
    objects = make_objects(20_000, seed=8, max_size=300)
    path = tmp_path / "big.ours.shard"
    build_with_shardfs(path, objects)
    with swh_shard.Shard(str(path)) as ref:
        for key, data in objects.items():
            assert ref.lookup(key) == data


# ------------------------------------------------------------------- deletes


def victims_of(objects, k=3):
    """k keys to delete: the empty object and non-empty ones."""
    keys = list(objects)
    return keys[:1] + keys[1:k]


def assert_deleted_everywhere(path, objects, deleted):
    """Both tools agree that `deleted` are gone and the rest is intact."""
    remaining = {k: v for k, v in objects.items() if k not in deleted}
    # shardfs API
    with shardfs.Shard(str(path)) as s:
        assert set(s) == set(remaining)
        assert len(s) == len(remaining)
        for key in deleted:
            assert key not in s
            assert s.get(key) is None
            assert s.locate(key) is None
            with pytest.raises(KeyError):
                s[key]
        for key, data in remaining.items():
            assert s[key] == data
        assert s.check(hash=True) == []
    # shardfs CLI
    assert shardfs_ls(path) == {k.hex(): len(v) for k, v in remaining.items()}
    for key in deleted:
        proc = shardfs_cli("get", path, key.hex())
        assert proc.returncode == 1 and b"not found" in proc.stderr
    assert shardfs_cli("check", "--hash", path).returncode == 0
    # swh
    assert swh_keys(path) == set(remaining)
    with swh_shard.Shard(str(path)) as ref:
        for key in deleted:
            with pytest.raises(KeyError):
                ref.lookup(key)
        for key, data in remaining.items():
            assert ref.lookup(key) == data
    # the deleted bytes are no longer in the file
    raw = path.read_bytes()
    for key in deleted:
        if len(objects[key]) >= 32:
            assert objects[key] not in raw


def test_swh_api_delete_seen_by_shardfs(tmp_path):
    objects = make_objects(100, seed=1)
    path = tmp_path / "swh.shard"
    build_with_swh(path, objects)
    deleted = victims_of(objects)
    for key in deleted:
        swh_shard.Shard.delete(str(path), key)
    assert_deleted_everywhere(path, objects, deleted)


@needs_swh_cli
def test_swh_cli_delete_seen_by_shardfs(tmp_path):
    objects = make_objects(100, seed=2)
    path = tmp_path / "ours.shard"
    build_with_shardfs(path, objects)
    deleted = victims_of(objects)
    proc = swh_cli("delete", "--no-confirm", path, *[k.hex() for k in deleted])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_deleted_everywhere(path, objects, deleted)


@pytest.mark.parametrize("builder", [build_with_swh, build_with_shardfs])
def test_shardfs_cli_delete_seen_by_swh(tmp_path, builder):
    objects = make_objects(100, seed=3)
    path = tmp_path / "x.shard"
    builder(path, objects)
    deleted = victims_of(objects)
    proc = shardfs_cli("delete", "--yes", path, *[k.hex() for k in deleted])
    assert proc.returncode == 0, proc.stderr
    assert_deleted_everywhere(path, objects, deleted)


def test_shardfs_api_delete_seen_by_swh(tmp_path):
    objects = make_objects(50, seed=4)
    path = tmp_path / "swh.shard"
    build_with_swh(path, objects)
    deleted = victims_of(objects, 5)
    assert shardfs.delete(str(path), deleted) == len(deleted)
    assert_deleted_everywhere(path, objects, deleted)


def test_same_bytes_as_swh(tmp_path):
    """Not required by the format, but expected from the same algorithm and
    parameters: both writers produce the same objects and index sections."""
    objects = make_objects(500, seed=5)
    ours, theirs = tmp_path / "ours.shard", tmp_path / "theirs.shard"
    build_with_shardfs(ours, objects)
    build_with_swh(theirs, objects)
    with shardfs.Shard(str(ours)) as a, shardfs.Shard(str(theirs)) as b:
        ha, hb = a.header, b.header
        assert ha.objects_position == hb.objects_position == 512
        assert ha.objects_size == hb.objects_size
        assert ha.objects_count == hb.objects_count
        raw_a, raw_b = ours.read_bytes(), theirs.read_bytes()
        objects_end = ha.objects_position + ha.objects_size
        assert raw_a[ha.objects_position:objects_end] == raw_b[hb.objects_position:objects_end]


# ----------------------------------------------------------------- mount


def _can_mount():
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return False
    try:
        from shardfs.fuse import mount  # noqa: F401
    except ImportError:
        return False
    return True


def _is_mountpoint(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


@pytest.fixture
def mountpoint(tmp_path):
    """An empty directory; unmounted at the end whatever happens."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    yield mp
    if _is_mountpoint(mp):
        shardfs_cli("umount", mp)
    if _is_mountpoint(mp):
        subprocess.run(["fusermount3", "-u", "-z", str(mp)], timeout=TIMEOUT)


@pytest.mark.skipif(not _can_mount(), reason="needs /dev/fuse, fusermount3, shardfs.fuse")
def test_swh_shard_with_deletions_mounts(tmp_path, mountpoint):
    """A shard built, then partly deleted, by swh-shard serves through
    ``shardfs mount``: one file per live object, named by its hex key, with
    the object's bytes; the deleted objects are absent."""
    objects = make_objects(300, seed=9)
    path = tmp_path / "swh.shard"
    build_with_swh(path, objects)
    deleted = victims_of(objects, 4)
    for key in deleted:
        swh_shard.Shard.delete(str(path), key)
    remaining = {k.hex(): v for k, v in objects.items() if k not in deleted}

    proc = shardfs_cli("mount", path, mountpoint)
    assert proc.returncode == 0, proc.stderr
    try:
        assert _is_mountpoint(mountpoint)
        assert sorted(os.listdir(mountpoint)) == sorted(remaining)
        for name, data in remaining.items():
            assert (mountpoint / name).read_bytes() == data
            assert (mountpoint / name).stat().st_size == len(data)
        for key in deleted:
            assert not (mountpoint / key.hex()).exists()
    finally:
        proc = shardfs_cli("umount", mountpoint)
    assert proc.returncode == 0, proc.stderr
    assert not _is_mountpoint(mountpoint)
