"""The Python API over real shards: round trips, keys, edge cases, threads."""

import hashlib
import itertools
import os
import random
import subprocess
import sys
import threading
import time

import pytest

import shardfs
from shardfs import CorruptShardError, DuplicateKeyError, Shard, ShardWriter


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def build(path, objects):
    with ShardWriter(path) as w:
        for data in objects:
            w.add(sha(data), data)
    return {sha(d): d for d in objects}


@pytest.fixture
def objects():
    rnd = random.Random(42)
    return [rnd.randbytes(rnd.randint(0, 5000)) for _ in range(2000)] + [b""]


def test_round_trip(tmp_path, objects):
    path = tmp_path / "a.shard"
    expected = build(path, objects)
    with Shard(path) as s:
        assert len(s) == len(expected)
        assert set(s) == set(expected)
        for key, data in expected.items():
            assert key in s
            assert s[key] == data
            assert s.get(key) == data
            assert s.size(key) == len(data)
            assert s[key.hex()] == data
            assert s[key.hex().upper()] == data
            assert s[key.hex().encode()] == data
        assert dict(s.items_sizes()) == {k: len(v) for k, v in expected.items()}
        h = s.header
        assert h.version == 1
        assert h.objects_count == len(expected)
        assert h.objects_position == 512
        assert h.objects_size == sum(8 + len(d) for d in expected.values())
        assert h.index_position == 512 + h.objects_size
        assert h.index_size == 40 * s.slot_count
        assert h.hash_position == h.index_position + h.index_size
        assert s.extent == os.path.getsize(path)
        assert s.check(hash=True) == []


def test_absent_keys_in_occupied_slots(tmp_path, objects):
    path = tmp_path / "a.shard"
    expected = build(path, objects)
    with Shard(path) as s:
        occupied = {s.slot_of(k) for k in expected}
        rnd = random.Random(7)
        hits = 0
        for _ in range(5000):
            key = rnd.randbytes(32)
            if s.slot_of(key) in occupied:
                hits += 1
                assert key not in s
                assert s.get(key) is None
                with pytest.raises(KeyError):
                    s[key]
                with pytest.raises(KeyError):
                    s.size(key)
        assert hits > 1000  # the load factor is 0.99: most slots are taken


@pytest.mark.parametrize("key", ["", "ab", "z" * 64, "0" * 63, b"\x00" * 31, b"\x00" * 33, 42, None])
def test_bad_keys_raise_value_error(tmp_path, key):
    path = tmp_path / "a.shard"
    build(path, [b"x"])
    with Shard(path) as s:
        with pytest.raises(ValueError):
            s.get(key)
    with ShardWriter(tmp_path / "b.shard") as w:
        with pytest.raises(ValueError):
            w.add(key, b"data")


def test_empty_shard(tmp_path):
    path = tmp_path / "empty.shard"
    with ShardWriter(path):
        pass
    with Shard(path) as s:
        assert len(s) == 0
        assert list(s) == []
        assert s.header.objects_count == 0
        assert s.slot_count >= 1
        assert s.get(b"\x00" * 32) is None
        assert s.get(os.urandom(32)) is None
        assert s.check(hash=True) == []


def test_one_object_and_empty_object(tmp_path):
    path = tmp_path / "one.shard"
    build(path, [b""])
    with Shard(path) as s:
        assert len(s) == 1
        assert s[sha(b"")] == b""
        assert s.size(sha(b"")) == 0
        data_offset, size = s.locate(sha(b""))
        assert size == 0 and s.pread(data_offset, size, 0, 10) == b""


def test_pread_clips_to_object(tmp_path):
    data = bytes(range(256)) * 40
    path = tmp_path / "p.shard"
    build(path, [data, b"neighbour"])
    with Shard(path) as s:
        off, size = s.locate(sha(data))
        assert size == len(data)
        for start, length in [(0, 1), (1, 4095), (4095, 4097), (len(data) - 1, 100), (len(data), 5), (len(data) + 10, 5)]:
            assert s.pread(off, size, start, length) == data[start:start + length]


def test_duplicate_is_rejected_and_build_goes_on(tmp_path):
    path = tmp_path / "dup.shard"
    with ShardWriter(path) as w:
        w.add(sha(b"a"), b"a")
        with pytest.raises(DuplicateKeyError, match=sha(b"a").hex()):
            w.add(sha(b"a"), b"other")
        assert len(w) == 1
        w.add(sha(b"b"), b"b")
    with Shard(path) as s:
        assert s[sha(b"a")] == b"a" and len(s) == 2


def test_exception_discards_the_shard(tmp_path):
    path = tmp_path / "x.shard"
    path.write_bytes(b"previous content")
    with pytest.raises(RuntimeError):
        with ShardWriter(path) as w:
            w.add(sha(b"a"), b"a")
            raise RuntimeError("boom")
    assert path.read_bytes() == b"previous content"
    assert sorted(os.listdir(tmp_path)) == ["x.shard"]


def test_add_file_streams(tmp_path):
    src = tmp_path / "big"
    rnd = random.Random(3)
    with open(src, "wb") as f:
        for _ in range(64):
            f.write(rnd.randbytes(1 << 20))
    key = hashlib.file_digest(open(src, "rb"), "sha256").digest() if hasattr(hashlib, "file_digest") else sha(src.read_bytes())
    # Peak RSS of a child adding a 64 MiB file stays far below its size.
    code = (
        "import re, shardfs, sys\n"
        "w = shardfs.ShardWriter(sys.argv[1]); w.add_file(sys.argv[2], sys.argv[3]); w.close()\n"
        "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "f.shard"), key.hex(), str(src)],
                         check=True, capture_output=True, text=True).stdout
    assert int(out) < 32 * 1024  # KiB of peak RSS; the file is 64 MiB
    with Shard(tmp_path / "f.shard") as s:
        assert s.size(key) == 64 << 20
        assert s.check(hash=True) == []


def test_add_file_missing_raises_and_writer_goes_on(tmp_path):
    with ShardWriter(tmp_path / "m.shard") as w:
        with pytest.raises(FileNotFoundError):
            w.add_file(sha(b"x"), tmp_path / "missing")
        w.add(sha(b"y"), b"y")
    with Shard(tmp_path / "m.shard") as s:
        assert list(s) == [sha(b"y")]


def test_delete(tmp_path, objects):
    path = tmp_path / "d.shard"
    expected = build(path, objects)
    victims = list(expected)[:10]
    assert shardfs.delete(path, [v.hex() for v in victims]) == 10
    with Shard(path) as s:
        assert len(s) == len(expected) - 10
        for v in victims:
            assert v not in s
            assert v not in set(s)
        assert s.check(hash=True) == []
    with pytest.raises(KeyError):
        shardfs.delete(path, [list(expected)[20], victims[0]])
    with Shard(path) as s:  # nothing deleted when one key is missing
        assert list(expected)[20] in s


@pytest.mark.parametrize("batch", [0, 50], ids=["get", "get_batch"])
def test_threads_share_one_shard(tmp_path, objects, batch):
    """8 threads read one shard at once, key by key or in batches of 50
    (plus an absent key; the GIL released while a batch looks up and
    copies): every answer right."""
    path = tmp_path / "t.shard"
    expected = build(path, objects)
    items = list(expected.items())
    keys = list(expected)
    errors = []

    def reader(seed):
        rnd = random.Random(seed)
        for _ in range(5000 // (batch or 1) * (4 if batch else 1)):
            if batch:
                keys_ = rnd.sample(keys, batch) + [sha(b"no %d" % seed)]
                if s.get_batch(keys_) != [expected.get(k) for k in keys_]:
                    errors.append(seed)
                continue
            key, data = rnd.choice(items)
            if s[key] != data:
                errors.append(key)

    with Shard(path) as s:
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_closed_shard_raises(tmp_path):
    build(tmp_path / "c.shard", [b"a"])
    s = Shard(tmp_path / "c.shard")
    s.close()
    with pytest.raises(ValueError):
        s.get(sha(b"a"))


def test_not_a_shard(tmp_path):
    (tmp_path / "junk").write_bytes(os.urandom(4096))
    with pytest.raises(CorruptShardError, match="junk: bad magic"):
        Shard(tmp_path / "junk")
    with pytest.raises(shardfs.ShardError, match="not a regular file or block device"):
        Shard(tmp_path)


def test_get_batch_answers_as_get_in_order(tmp_path, objects):
    path = tmp_path / "b.shard"
    expected = build(path, objects)
    rnd = random.Random(7)
    keys = list(expected)
    absent = [sha(b"absent %d" % i) for i in range(50)]
    batch = keys + absent + keys[:100]  # repeats and absent keys mixed in
    rnd.shuffle(batch)
    with Shard(path) as s:
        got = s.get_batch(batch)
        assert got == [expected.get(k) for k in batch]
        assert got == [s.get(k) for k in batch]
        # Keys as get takes them: hex (str or bytes), any iterable.
        assert s.get_batch(k.hex() for k in keys[:5]) == [expected[k] for k in keys[:5]]
        assert s.get_batch([keys[0].hex().upper().encode()]) == [expected[keys[0]]]
        assert s.get_batch([]) == []
        # A malformed key fails the whole batch before any lookup.
        with pytest.raises(ValueError):
            s.get_batch([keys[0], b"\x00" * 31])
        with pytest.raises(TypeError):
            s.get_batch(42)
    with pytest.raises(ValueError):
        s.get_batch(keys[:1])  # closed


def cold_shard(tmp_path, seed=8):
    """A shard of 600 objects of 100 B, 5 kB or 70 kB, evicted from the page
    cache (checked: not a tmpfs): (path, {key: bytes}, keys shuffled)."""
    rnd = random.Random(seed)
    objects = [rnd.randbytes(rnd.choice((100, 5000, 70000))) for _ in range(600)]
    path = tmp_path / "cold.shard"
    expected = build(path, objects)
    keys = list(expected)
    rnd.shuffle(keys)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        for _ in range(20):  # pages still in another CPU's LRU batch are not dropped at once
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(fd, [bytearray(4096)], os.path.getsize(path) // 2, os.RWF_NOWAIT)
            except BlockingIOError:
                break  # really evicted (not a tmpfs)
            time.sleep(0.05)
        else:
            pytest.fail("the shard's pages stay in the page cache (a tmpfs?)")
    finally:
        os.close(fd)
    return path, expected, keys


def test_get_batch_of_a_cold_shard(tmp_path):
    """Objects evicted from the page cache: the batch's first device wait
    makes it prefetch the rest, and every object reads back whole."""
    path, expected, keys = cold_shard(tmp_path)
    with Shard(path) as s:
        assert s.get_batch(keys) == [expected[k] for k in keys]


def test_single_lookups_release_the_gil_only_once_one_waited(tmp_path):
    """read/locate/find keep the GIL while lookups are served from memory,
    release it once one waited for the device, and keep it again after 64
    fast ones in a row; the answers are the same either way."""
    path, expected, keys = cold_shard(tmp_path)
    with Shard(path) as s:
        r = s.reader
        assert not r.releases_gil
        assert s[keys[0]] == expected[keys[0]]  # a device read: slow
        assert r.releases_gil
        path.read_bytes()  # now all cached: fast
        calls = 0  # a call that lost its core counts as slow: allow many runs
        while r.releases_gil and calls < 6400:
            k = keys[calls % len(keys)]
            assert s.locate(k)[1] == len(expected[k])
            calls += 1
        assert not r.releases_gil and calls >= 64
        for k in keys:
            assert s[k] == expected[k] and s.find(k)[2] == len(expected[k])


def close_while_reading(s, calls):
    """Run the checks of ``calls`` (an iterable of callables answering
    True when right) in another thread, close ``s`` once one has returned,
    and check: each answered right until one raised ValueError (closed),
    nothing else was raised, nothing crashed or hung."""
    results, errors = [], []
    started = threading.Event()

    def reader():
        try:
            for call in calls:
                results.append(call())
                started.set()
        except ValueError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    t = threading.Thread(target=reader)
    t.start()
    assert started.wait(10)
    s.close()
    t.join(30)
    assert not t.is_alive() and errors == []
    assert results and all(results)
    assert s.closed


@pytest.mark.parametrize("call", ["read", "locate", "find"])
def test_single_lookups_and_close_from_another_thread(tmp_path, call):
    """close() while another thread's lookups wait for the device with the
    GIL released: each call ends with a right answer (the shard stays
    open until it returns), later ones raise ValueError, nothing crashes."""
    path, expected, keys = cold_shard(tmp_path, seed=9)
    s = Shard(path)
    check = {
        "read": lambda k: s[k] == expected[k],
        "locate": lambda k: s.locate(k)[1] == len(expected[k]),
        "find": lambda k: s.find(k)[2] == len(expected[k]),
    }[call]
    close_while_reading(s, (lambda k=k: check(k) for k in keys * 50))


def test_get_batch_corrupt_slot(tmp_path, objects):
    path = tmp_path / "bad.shard"
    expected = build(path, objects)
    keys = list(expected)
    with Shard(path) as s:
        slot = s.find(keys[5])[0]
        index_position = s.header.index_position
    with open(path, "r+b") as f:  # the slot's offset points past the file
        f.seek(index_position + 40 * slot + 32)
        f.write((2 ** 40).to_bytes(8, "big"))
    with Shard(path) as s:
        with pytest.raises(CorruptShardError, match="outside the objects section"):
            s.get_batch(keys[:10])
        assert s.get_batch(keys[:5]) == [expected[k] for k in keys[:5]]


def test_get_batch_and_close_from_another_thread(tmp_path, objects):
    """close() while another thread's batch runs with the GIL released:
    the batch ends with right answers (the shard stays open until it
    returns), later calls raise ValueError, nothing crashes."""
    path = tmp_path / "c.shard"
    expected = build(path, objects)
    keys = list(expected) * 20
    s = Shard(path)
    batch = lambda: s.get_batch(keys) == [expected[k] for k in keys]  # noqa: E731
    close_while_reading(s, itertools.repeat(batch))


def test_abort_waits_for_add_files_in_another_thread(tmp_path):
    """An abort while add_files runs in another thread (create's Ctrl-C)
    waits for it, then discards the shard: no ValueError, add_files
    returns normally, nothing at the path, no temporary file."""
    src = tmp_path / "src"
    src.mkdir()
    paths = []
    for i in range(3000):
        p = src / f"f{i}"
        p.write_bytes(os.urandom(4096))
        paths.append(str(p))
    out = tmp_path / "out" / "s.shard"
    out.parent.mkdir()
    w = shardfs.ShardWriter(str(out))
    returned = threading.Event()
    worker = threading.Thread(target=lambda: (w.add_files(paths, small=1 << 20), returned.set()))
    worker.start()
    # abort only once the other thread is inside add_files (the writer busy)
    assert wait_busy(w), "add_files returned before the writer could be seen busy"
    w.abort()  # raised ValueError while add_files ran, before
    # add_files returned normally (its batch done, then the shard discarded)
    worker.join(30)
    assert returned.is_set(), "add_files did not return"
    assert not out.exists() and os.listdir(out.parent) == []


def wait_busy(w, timeout=10.0):
    """True once w's add_files runs in another thread (count raises then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            w._writer.count
        except ValueError:
            return True
        time.sleep(0.0005)
    return False
