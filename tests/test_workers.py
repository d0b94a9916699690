"""One mount, several worker processes: real mounts, real shards, real tools.

What must hold whatever worker a request reaches: every byte read is right
under many interleaved readers (the LOOKUP and READs of one file land in
different workers), a listing resumes exactly across workers, live pickup
never makes one inode name two objects, a shard replaced in place is served
from its new file while files opened on the old one keep their bytes for a
while, a takedown reaches the mount (kernel caches included), and killing a
worker or the coordinator leaves no reader hanging and no process behind.
Objects are served in the kernel's no-open mode: no OPEN, FLUSH or RELEASE
reaches the mount after its first OPEN.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mounting import (
    SHARDFS,
    SLOWDOWN,
    bash,
    build_shard,
    coordinator_pids,
    daemon_pids,
    kill_every_process,
    supervisor_pids,
    default_workers,
    force_unmount,
    gone,
    key_of,
    make_blobs,
    mount_processes,
    mounted,
    needs_fuse,
    run,
    wait_until,
    worker_pids,
)

pytestmark = needs_fuse

#: How long a change of the shard files may take to show through a mount
#: (the documented live bound: names cached 1 s, events settled 0.2 s).
LIVE_BOUND = 3.0


def stats(point: Path) -> dict:
    return json.loads(os.getxattr(point, "user.shardfs.stats"))


def requests(point: Path) -> dict:
    return json.loads(os.getxattr(point, "user.shardfs.requests"))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A shard of 600 small objects and 40 of 150 KiB–1 MiB (read through
    several READ requests each: above 128 KiB)."""
    d = tmp_path_factory.mktemp("mixed")
    rng = random.Random(9)
    blobs = make_blobs(1, 600, 0, 4096)
    blobs += [rng.randbytes(rng.randint(150_000, 1_000_000)) for _ in range(40)]
    return d / "mixed.shard", build_shard(d / "mixed.shard", blobs)


def test_default_worker_count_and_workers_option(mixed, mounter, tmp_path):
    """The default is the CPU count, at least 2; -o workers=N is obeyed,
    workers=1 serves; a bad value is a one-line error before mounting."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "d")
    # (a worker forked last may not have taken its name yet when the mount answers)
    assert wait_until(lambda: len(worker_pids(point)) == default_workers())
    assert len(worker_pids(point)) == default_workers()
    one = mounter.mount(path, tmp_path / "one", "-o", "workers=1")
    assert wait_until(lambda: len(worker_pids(one)) == 1)
    key = sorted(objects)[3]
    assert (one / key).read_bytes() == objects[key]
    for bad in ("workers=0", "workers=65", "workers=x"):
        (tmp_path / "bad").mkdir(exist_ok=True)
        proc = run(SHARDFS + ["mount", "-o", bad, str(path), str(tmp_path / "bad")])
        assert proc.returncode != 0 and "workers" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not mounted(tmp_path / "bad")


def _fstat_fails(fd: int) -> bool:
    """True once fstat(fd) of a mounted object answers ENOENT."""
    try:
        os.fstat(fd)
        return False
    except FileNotFoundError:
        return True


def _reader(point: Path, objects: dict, keys: list, seed: int, seconds: float, errors: list, counts: list) -> None:
    rng = random.Random(seed)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        key = rng.choice(keys)
        want = objects[key]
        try:
            with open(point / key, "rb", buffering=0) as f:
                if len(want) > 4096 and rng.random() < 0.5:
                    # Random ranges of a large object: READs in any worker.
                    for _ in range(4):
                        off = rng.randrange(len(want))
                        size = rng.randint(1, 200_000)
                        got = os.pread(f.fileno(), size, off)
                        if got != want[off:off + size]:
                            errors.append(f"{key} [{off}:+{size}] wrong bytes")
                else:
                    got = f.read()
                    if got != want:
                        errors.append(f"{key}: wrong bytes")
        except OSError as exc:
            errors.append(f"{key}: {errno.errorcode.get(exc.errno, exc.errno)} {exc}")
        n += 1
    counts.append(n)


def test_interleaved_readers_every_byte_right(mixed, mounter, tmp_path):
    """16 readers for a few seconds over 4 workers: every object and range
    read is right, and the requests are spread over several workers."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=4")
    keys = sorted(objects)
    errors: list = []
    counts: list = []
    threads = [threading.Thread(target=_reader, args=(point, objects, keys, i, 4.0, errors, counts))
               for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    assert errors == []
    assert sum(counts) > 200
    served = stats(point)["workers"]
    assert len(served) == 4
    assert sum(1 for n in served if n > 0) >= 2, served
    got = requests(point)
    assert got.get("read", 0) > 0  # large objects were read through READ


def test_lookups_counted_exactly_by_c_and_python(mounter, tmp_path):
    """Every LOOKUP is counted once in the stats (`lookups`), whichever
    side of a worker answers it. 70 shards hold 12,000 objects in common
    and 500 of their own each (a key of many shards). 16 threads stat every
    key once, in random order (one LOOKUP each: the kernel caches the entry
    for a year); `lookups` must grow by exactly as many. With 7aa1f2b's
    request path, which left a key of more than 64 shards to the handlers,
    both sides answered at once here, and the handlers added their counts
    with a read-modify-write of the word the C threads add to atomically:
    1 to 19 of the 47,000 were lost in 8 of 9 runs on 2 CPUs. Now C answers
    them all; the two writers of a row are shown exact by
    tests/test_shared_state.py."""
    common = make_blobs(71, 12_000, 0, 100, tag=b"common")
    objects: dict = {}
    paths = []
    for i in range(70):
        path = tmp_path / f"s{i:02}.shard"
        objects.update(build_shard(path, common + make_blobs(100 + i, 500, 0, 100, tag=b"own%d" % i)))
        paths.append(path)
    point = mounter.mount(paths, tmp_path / "m")
    assert wait_until(lambda: stats(point)["sidecars"] == len(paths), timeout=60), stats(point)
    keys = sorted(objects)
    random.Random(5).shuffle(keys)
    before = stats(point)["lookups"]
    errors: list = []

    def stat_all(part: list) -> None:
        for key in part:
            try:
                if os.stat(point / key).st_size != len(objects[key]):
                    errors.append(f"{key}: wrong size")
            except OSError as exc:
                errors.append(f"{key}: {exc}")

    threads = [threading.Thread(target=stat_all, args=(keys[i::16],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a stat hung"
    assert errors == []
    assert stats(point)["lookups"] - before == len(keys) == 12_000 + 70 * 500


def test_readdir_resumes_across_workers(mounter, tmp_path):
    """A flat root of 3,000 objects listed by 8 threads at once, 3 times
    each, with 4 workers: each listing is whole, with no duplicate
    (successive getdents calls of one listing reach different workers)."""
    path = tmp_path / "many.shard"
    objects = build_shard(path, make_blobs(3, 3000, 0, 64))
    point = mounter.mount(path, tmp_path / "m", "--layout", "flat", "-o", "workers=4")
    errors: list = []

    def lister() -> None:
        for _ in range(3):
            names = os.listdir(point)
            if len(names) != len(set(names)) or set(names) != set(objects):
                errors.append(f"listing of {len(names)} names, {len(set(names))} distinct")

    threads = [threading.Thread(target=lister) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    # A fan-out layout over the same shard lists the same objects.
    fan = mounter.mount(path, tmp_path / "f", "--layout", "fanout", "-o", "workers=4")
    found = set()
    for top in os.listdir(fan):
        for sub in os.listdir(fan / top):
            found.update(os.listdir(fan / top / sub))
    assert found == set(objects)


def test_live_pickup_never_gives_one_inode_two_objects(mounter, tmp_path):
    """Shards arrive in and leave a followed directory while 8 readers stat
    and read keys through 4 workers: an inode always names one key, and
    every byte read is right."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    batches = [make_blobs(100 + i, 200, 1, 512, tag=b"batch%d" % i) for i in range(6)]
    objects = {}
    for i in range(2):
        objects.update(build_shard(shard_dir / f"s{i}.shard", batches[i]))
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "-o", "workers=4")
    inode_of: dict = {}
    errors: list = []
    stop = threading.Event()
    lock = threading.Lock()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            with lock:
                keys = list(objects)
            key = rng.choice(keys)
            try:
                st = os.stat(point / key)
                data = (point / key).read_bytes()
            except FileNotFoundError:
                continue  # its shard is leaving or not yet there
            except OSError as exc:
                errors.append(f"{key}: {exc}")
                continue
            if data != objects[key]:
                errors.append(f"{key}: wrong bytes")
            with lock:
                other = inode_of.setdefault(st.st_ino, key)
            if other != key:
                errors.append(f"inode {st.st_ino} named {other} and {key}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        for i in range(2, 6):
            tmp = tmp_path / f"tmp{i}.shard"
            new = build_shard(tmp, batches[i])
            with lock:
                objects.update(new)
            os.rename(tmp, shard_dir / f"s{i}.shard")
            some = next(iter(new))
            assert wait_until(lambda: (point / some).exists(), timeout=LIVE_BOUND), f"shard {i} not picked up"
            if i == 3:
                os.unlink(shard_dir / "s0.shard")  # one leaves
                gone_key = key_of(batches[0][0])
                assert wait_until(lambda: not (point / gone_key).exists(), timeout=LIVE_BOUND)
            time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == []
    assert len(inode_of) > 100


def _write_shard(path: Path, blobs) -> dict:
    return build_shard(path, blobs)


def test_shard_replaced_in_place(mounter, tmp_path):
    """A shard named at mount and renamed over (as `shardfs create --force`
    publishes it): within the live bound the new content is served and the
    old one's keys are gone, while a file opened on the old shard keeps
    reading its bytes, ranges never cached included, as long as it is
    open; the old shard is closed once that file is closed.

    (Objects are served in the kernel's no-open mode: the mount is not told
    when a file is opened or closed; the coordinator finds the files open
    on the mount in /proc/*/fdinfo instead, shardfs.fuse.coordinator.
    open_object_inodes.)"""
    path = tmp_path / "a.shard"
    rng = random.Random(5)
    big = rng.randbytes(3_000_000)
    old = build_shard(path, make_blobs(7, 50, 1, 900, tag=b"old") + [big])
    log = tmp_path / "log"
    point = mounter.mount(path, tmp_path / "m", "--log-file", str(log), "-o", "workers=3")
    big_key = key_of(big)
    old_key = next(k for k in old if k != big_key)
    assert (point / old_key).read_bytes() == old[old_key]
    closed = re.compile(r"shard \S*a\.shard \(number 0\) closed: no file open on it")
    f = open(point / big_key, "rb", buffering=0)
    try:
        assert f.read(4096) == big[:4096]
        src = tmp_path / "newsrc"
        src.mkdir()
        newblobs = make_blobs(8, 60, 1, 900, tag=b"new")
        for i, b in enumerate(newblobs):
            (src / f"{i}").write_bytes(b)
        proc = run(SHARDFS + ["create", "--force", str(path), str(src)])
        assert proc.returncode == 0, proc.stderr
        new_key = key_of(newblobs[0])
        assert wait_until(lambda: (point / new_key).exists(), timeout=LIVE_BOUND), "new shard not served"
        assert (point / new_key).read_bytes() == newblobs[0]
        assert wait_until(lambda: not (point / old_key).exists(), timeout=LIVE_BOUND), "old key still served"
        # The open file still reads the old shard's bytes, ranges never cached.
        for off in (2_000_000, 100_000, 2_999_000):
            assert os.pread(f.fileno(), 50_000, off) == big[off:off + 50_000]
        # ... for as long as it is open: several close checks go by.
        time.sleep(3)
        assert not closed.search(log.read_text()), "the old shard was closed while a file was open on it"
        assert os.pread(f.fileno(), 50_000, 1_500_000) == big[1_500_000:1_550_000]
    finally:
        f.close()
    assert wait_until(lambda: closed.search(log.read_text()) is not None, timeout=10), \
        "the old shard was not closed once its file was"
    assert sorted(os.listdir(point)) == sorted(key_of(b) for b in newblobs)


def _read_gone(path: Path, old: bytes) -> bool:
    """True once reading `path` fails with ENOENT; until then what it reads
    must be `old` (bytes the kernel cached), never other bytes."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return True
    assert data == old, "a taken-down object read other bytes than its own"
    return False


@pytest.mark.parametrize("layout", ["flat", "shard-dir"])
def test_takedown_reaches_the_mount(mounter, tmp_path, layout):
    """`shardfs delete` in place on a served shard: at once, an object
    whose bytes the kernel has not cached cannot be read (READ reads the
    index slot); within the live bound, an object cannot be stat'ed,
    opened, read or listed through the mount, even though the kernel had
    its name, attributes and bytes cached; a file already open gets errors
    or its cached bytes, never new ones; the other objects are untouched.

    (Under pyfuse3 every OPEN read the slot, so even an object whose bytes
    the kernel had cached could not be opened again at once. Objects are
    now served in the kernel's no-open mode: an open is not asked to the
    mount and cached pages are kept between opens, so such an object reads
    its cached bytes until the coordinator invalidates its inode, within
    the live bound. test_takedown_refuses_cached_objects_at_once keeps the
    old guarantee, expected to fail.)"""
    if layout == "flat":
        path = tmp_path / "t.shard"
        objects = build_shard(path, make_blobs(11, 100, 1, 3000))
        point = mounter.mount(path, tmp_path / "m", "--layout", "flat")
    else:
        d = tmp_path / "dir"
        d.mkdir()
        path = d / "t.shard"
        objects = build_shard(path, make_blobs(11, 100, 1, 3000))
        point = mounter.mount([], tmp_path / "m", "--shard-dir", str(d))
    victim, other, uncached = sorted(objects)[:3]

    def at(key: str) -> Path:
        return point / key if layout == "flat" else point / key[:2] / key[2:4] / key

    where = at(victim).parent
    for _ in range(2):  # names, attributes and bytes in the kernel's caches
        assert (where / victim).read_bytes() == objects[victim]
    # Name and attributes cached, bytes never read.
    assert os.stat(at(uncached)).st_size == len(objects[uncached])
    held = os.open(where / victim, os.O_RDONLY)  # attributes cached for a year
    try:
        assert os.fstat(held).st_size == len(objects[victim])
        assert os.pread(held, 100, 0) == objects[victim][:100]
        # Wait for the sidecar, so the deletion can be told apart.
        assert wait_until(lambda: stats(point)["sidecars"] == 1)
        proc = run(SHARDFS + ["delete", "--yes", str(path), victim, uncached])
        assert proc.returncode == 0, proc.stderr
        with pytest.raises(FileNotFoundError):
            at(uncached).read_bytes()  # READ reads the slot: refused at once
        assert wait_until(lambda: _read_gone(where / victim, objects[victim]), timeout=LIVE_BOUND), \
            "a taken-down object still reads its cached bytes"

        # Only an invalidation by the mount drops attributes cached for a year.
        assert wait_until(lambda: _fstat_fails(held), timeout=LIVE_BOUND), \
            "the kernel still has the object's attributes"
        with pytest.raises(OSError):
            os.pread(held, 100, 0)  # its cached pages are gone too
    finally:
        os.close(held)
    for key in (victim, uncached):
        with pytest.raises(FileNotFoundError):
            os.stat(at(key))
        assert key not in os.listdir(at(key).parent)
    assert at(other).read_bytes() == objects[other]


def test_killed_worker_is_replaced_and_no_reader_hangs(mixed, mounter, tmp_path):
    """kill -9 of one worker while 8 readers run: every reader finishes (a
    request the dead worker held is resent to the others, or fails with an
    error on a kernel that cannot resend; it never hangs), a new worker
    takes its place, and the mount keeps serving right bytes."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3")
    keys = sorted(objects)
    before = worker_pids(point)
    assert len(before) == 3
    errors: list = []
    counts: list = []
    threads = [threading.Thread(target=_reader, args=(point, objects, keys, i, 3.0, errors, counts))
               for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    victim = before[1]
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a reader hung after a worker was killed"
    # Where the kernel resends (Linux 6.9 and later), no request fails.
    # Elsewhere only the requests the killed worker held may fail, and only
    # with the errors the kernel gives a request whose server went away:
    # ECONNABORTED (its /dev/fuse clone was closed), EIO or ENOTCONN.
    allowed = () if _kernel_resends() else ("ECONNABORTED", "EIO", "ENOTCONN")
    assert [e for e in errors if not any(f": {name} [Errno" in e for name in allowed)] == [], errors
    assert gone(victim)
    assert wait_until(lambda: len(worker_pids(point)) == 3), "no replacement worker"
    assert victim not in worker_pids(point)
    for key in keys[:50] + keys[-10:]:
        assert (point / key).read_bytes() == objects[key]


def _kernel_resends() -> bool:
    """FUSE_NOTIFY_RESEND came with Linux 6.9."""
    release = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return release is not None and (int(release[1]), int(release[2])) >= (6, 9)


def _uncached_reader(point: Path, objects: dict, keys: list, seed: int, stop: threading.Event,
                     errors: list, counts: list) -> None:
    """Read whole objects with O_DIRECT (no page cache, no readahead: each
    read is a READ request to a worker, whose error the caller sees),
    until `stop`."""
    rng = random.Random(seed)
    buf = mmap.mmap(-1, 1 << 20)  # page-aligned
    n = 0
    while not stop.is_set():
        key = rng.choice(keys)
        want = objects[key]
        try:
            fd = os.open(point / key, os.O_RDONLY | os.O_DIRECT)
            try:
                got = os.preadv(fd, [buf], 0)
            finally:
                os.close(fd)
            if buf[:got] != want:
                errors.append(f"{key}: wrong bytes")
        except OSError as exc:
            errors.append(f"{key}: {errno.errorcode.get(exc.errno, exc.errno)} {exc}")
        n += 1
    counts.append(n)


@contextlib.contextmanager
def _uncached_readers(point: Path, objects: dict, keys: list, count: int):
    """`count` threads of `_uncached_reader` while the block runs; yields
    (errors, counts), complete once it ends. Fails if a reader hangs."""
    stop = threading.Event()
    errors: list = []
    counts: list = []
    threads = [threading.Thread(target=_uncached_reader, args=(point, objects, keys, i, stop, errors, counts),
                                daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    try:
        yield errors, counts
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads), "a reader hung"


def _waiting(point: Path) -> int:
    """Requests of the mount's connection not answered yet (read by a
    server or not): /sys/fs/fuse/connections/<device minor>/waiting (the
    fusectl file system, mounted there if it is not: skip if it cannot
    be)."""
    connections = Path("/sys/fs/fuse/connections")
    if not any(connections.iterdir()):
        done = subprocess.run(["mount", "-t", "fusectl", "fusectl", str(connections)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"fusectl cannot be mounted: {done.stderr.decode().strip()}")
    return int((connections / str(os.minor(os.stat(point).st_dev)) / "waiting").read_text())


@pytest.mark.skipif(not _kernel_resends(), reason="the kernel cannot resend requests (Linux < 6.9)")
def test_killed_worker_costs_no_reader_an_error(mixed, mounter, tmp_path):
    """kill -9 of a worker that holds requests (stopped while it served
    them) while 8 readers read uncached objects: the coordinator has the
    kernel queue them again for the other workers, so no reader sees an
    error or a wrong byte, none hangs, and a new worker takes its place."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3")
    keys = sorted(objects)
    victim = worker_pids(point)[1]
    stop = threading.Event()
    errors: list = []
    counts: list = []
    threads = [threading.Thread(target=_uncached_reader, args=(point, objects, keys, i, stop, errors, counts),
                                daemon=True) for i in range(8)]
    _waiting(point)  # fusectl mounted (or skipped) before any reader runs
    for t in threads:
        t.start()
    killed = False
    try:
        held = 0
        for _ in range(50):  # stop the victim until it is caught holding requests
            time.sleep(0.05)
            os.kill(victim, signal.SIGSTOP)
            time.sleep(0.3)  # what the others had read is answered by now
            held = min(_waiting(point) for _ in range(5))
            if held:
                break
            os.kill(victim, signal.SIGCONT)
        assert held, "the stopped worker never held a request"
        before = sum(counts)
        os.kill(victim, signal.SIGKILL)
        killed = True
        time.sleep(2)
    finally:
        if not killed:
            os.kill(victim, signal.SIGCONT)  # else its requests wait for ever
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads), "a reader hung after a worker was killed"
    assert errors == [], errors[:10]
    assert sum(counts) > before
    assert gone(victim)
    assert wait_until(lambda: len(worker_pids(point)) == 3), "no replacement worker"
    for key in keys[:20] + keys[-10:]:
        assert (point / key).read_bytes() == objects[key]


def test_a_coordinator_out_of_descriptors_still_replaces_a_dead_worker(mixed, mounter, tmp_path):
    """The coordinator makes each worker's clone of the connection; when it
    cannot make one (here: RLIMIT_NOFILE set below the descriptor the
    dead worker's clone had, so the slot it frees is out of reach), a
    killed worker is still replaced: the new worker makes its own clone
    (it closed the coordinator's descriptors it does not need) and the
    mount keeps serving, instead of the coordinator failing and the mount
    ending."""
    path, objects = mixed
    log = tmp_path / "mount.log"
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3", "--log-file", str(log))
    (coordinator,) = daemon_pids(point)
    fds = f"/proc/{coordinator}/fd"
    counts = []
    # the loop runs (its descriptors all open) once their count stays put
    assert wait_until(lambda: counts.append(len(os.listdir(fds))) or counts[-5:] == [counts[-1]] * 5,
                      interval=0.1)
    fuse = sorted(int(fd) for fd in os.listdir(fds) if os.readlink(f"{fds}/{fd}") == "/dev/fuse")
    # The session's: the copies of the workers' clones are the supervisor's.
    assert len(fuse) == 1
    (supervisor,) = supervisor_pids(point)
    held = [fd for fd in os.listdir(f"/proc/{supervisor}/fd") if os.readlink(f"/proc/{supervisor}/fd/{fd}") == "/dev/fuse"]
    assert len(held) == 4  # the session's, and a copy of each worker's clone
    victim = max(worker_pids(point))
    soft, hard = resource.prlimit(coordinator, resource.RLIMIT_NOFILE)
    used = {int(fd) for fd in os.listdir(fds)}
    # every descriptor below the limit in use: the clone cannot be opened
    resource.prlimit(coordinator, resource.RLIMIT_NOFILE, (min(set(range(len(used) + 1)) - used), hard))
    try:
        os.kill(victim, signal.SIGKILL)
        assert wait_until(lambda: "cannot make a clone of the FUSE connection" in log.read_text()
                          and len(worker_pids(point)) == 3 and victim not in worker_pids(point)), log.read_text()
        assert not gone(coordinator)
        for key in sorted(objects)[:30]:
            assert (point / key).read_bytes() == objects[key]
    finally:
        if not gone(coordinator):
            resource.prlimit(coordinator, resource.RLIMIT_NOFILE, (soft, hard))


def _followed_mount(mixed, mounter, tmp_path: Path, workers: int) -> tuple:
    """(objects, shard directory, log file, mount point) of a flat mount
    of a shard directory holding a copy of the `mixed` shard, with
    `workers` workers, logging to the log file."""
    path, objects = mixed
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    shutil.copy(path, shard_dir / "mixed.shard")
    log = tmp_path / "mount.log"
    point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "--layout", "flat",
                          "-o", f"workers={workers}", "--log-file", str(log))
    return objects, shard_dir, log, point


@pytest.mark.skipif(not _kernel_resends(), reason="the kernel cannot resend requests (Linux < 6.9)")
def test_killed_coordinator_costs_no_reader_an_error(mixed, mounter, tmp_path):
    """kill -9 of the coordinator, three times, while 6 readers read
    uncached objects: the workers keep serving, the supervisor starts a
    new coordinator that takes the mount over within a second (the
    workers kept, every inode naming the same object, shard numbers
    continued), and no reader sees an error or a wrong byte. A worker
    killed while no coordinator runs costs no error either (the supervisor
    has its requests resent). The new coordinator follows the shard
    directory and takes objects down; `shardfs status` counts it."""
    objects, shard_dir, log, point = _followed_mount(mixed, mounter, tmp_path, workers=3)
    keys = sorted(objects)
    inodes = {key: os.stat(point / key).st_ino for key in keys[:50]}
    workers = sorted(worker_pids(point))
    (supervisor,) = supervisor_pids(point)
    with _uncached_readers(point, objects, keys, 6) as (errors, counts):
        for round in range(3):
            (coordinator,) = daemon_pids(point)
            killed = time.monotonic()
            os.kill(coordinator, signal.SIGKILL)
            if round == 1:  # a worker dies while no coordinator runs
                victim = workers.pop()
                os.kill(victim, signal.SIGKILL)
            assert wait_until(lambda: coordinator_pids(point) not in ([], [coordinator])
                              and log.read_text().count("took over") > round, timeout=5), log.read_text()[-2000:]
            assert time.monotonic() - killed < 2.0  # within a second, with a second of slack for this machine
            time.sleep(0.5)
        time.sleep(1)
    assert errors == [], errors[:10]
    assert min(counts) > 0
    assert supervisor_pids(point) == [supervisor]
    assert wait_until(lambda: len(worker_pids(point)) == 3), "the dead worker was not replaced"
    assert set(workers) <= set(worker_pids(point))  # the others were kept
    assert {key: os.stat(point / key).st_ino for key in inodes} == inodes
    # Following the directory: a new shard gets a number of its own.
    extra = build_shard(shard_dir / ".new", make_blobs(77, 20, 1, 64, b"extra"))
    os.rename(shard_dir / ".new", shard_dir / "extra.shard")
    new_key = sorted(extra)[0]
    assert wait_until(lambda: (point / new_key).exists(), timeout=10), log.read_text()[-2000:]
    assert (point / new_key).read_bytes() == extra[new_key]
    assert os.stat(point / new_key).st_ino >> 32 not in {ino >> 32 for ino in inodes.values()}
    # Takedowns: told to the new coordinator, gone at once.
    gone_key = keys[3]
    assert (point / gone_key).read_bytes() == objects[gone_key]
    done = run(SHARDFS + ["delete", "--yes", str(shard_dir / "mixed.shard"), gone_key])
    assert done.returncode == 0, done.stderr
    assert not (point / gone_key).exists()
    status = json.loads(run(SHARDFS + ["status", "--json", str(point)]).stdout)
    assert status["coordinator_restarts"] == 3


@pytest.mark.skipif(not _kernel_resends(), reason="the kernel cannot resend requests (Linux < 6.9)")
def test_upgrade_in_place_costs_no_reader_an_error(mixed, mounter, tmp_path):
    """`shardfs upgrade MOUNTPOINT`, then `shardfs mount -o upgrade` on the
    mounted point, while 6 readers read uncached objects: every process
    but the supervisor (the same pid, running the code installed now) is
    replaced, no reader sees an error or a wrong byte, every inode names
    the same object."""
    path, objects = mixed
    log = tmp_path / "mount.log"
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3", "--log-file", str(log))
    keys = sorted(objects)
    inodes = {key: os.stat(point / key).st_ino for key in keys[:50]}
    (supervisor,) = supervisor_pids(point)
    with _uncached_readers(point, objects, keys, 6) as (errors, counts):
        for command in (["upgrade", str(point)], ["mount", "-o", "upgrade", str(path), str(point)]):
            time.sleep(0.5)
            assert wait_until(lambda: len(worker_pids(point)) == 3)
            before = set(daemon_pids(point) + worker_pids(point))
            done = run(SHARDFS + command)
            assert done.returncode == 0, done.stderr + log.read_text()[-3000:]
            if command[0] == "upgrade":
                assert re.fullmatch(r"upgraded \S+ to shardfs \S+: 3 worker\(s\) replaced in [0-9.]+ s\n", done.stdout)
            assert wait_until(lambda: len(worker_pids(point)) == 3)
            after = set(daemon_pids(point) + worker_pids(point))
            assert len(after) == 4 and not after & before, (before, after)
            assert supervisor_pids(point) == [supervisor]
        time.sleep(0.5)
    assert errors == [], errors[:10]
    assert min(counts) > 0
    assert {key: os.stat(point / key).st_ino for key in inodes} == inodes
    assert log.read_text().count("upgrade of %s done" % point) == 2


@contextlib.contextmanager
def _state_version_changed(point: Path, restore: bool = True):
    """While the block runs, the layout version word of the mount's shared
    state (read through its supervisor's /proc/PID/fd) is one more than
    this shardfs knows; put back after it when `restore`."""
    from shardfs.fuse import shared

    (supervisor,) = supervisor_pids(point)
    fds = f"/proc/{supervisor}/fd"
    (memfd,) = [f"{fds}/{n}" for n in os.listdir(fds) if os.readlink(f"{fds}/{n}").startswith("/memfd:shardfs-state")]
    with open(memfd, "r+b") as f, mmap.mmap(f.fileno(), 4096) as head:
        words = memoryview(head).cast("q")
        words[shared.VERSION] += 1
        try:
            yield
        finally:
            if restore:
                words[shared.VERSION] -= 1
            words.release()


def test_upgrade_refused_leaves_the_mount_as_it_is(mixed, mounter, tmp_path):
    """A mount whose state is of a layout this shardfs does not know (here:
    its version word changed) is not upgraded: one line, exit 1, the same
    processes serve. A mount with no supervisor (--foreground) is refused
    in one line too."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=2")
    assert wait_until(lambda: len(worker_pids(point)) == 2)
    processes = sorted(mount_processes(point))
    with _state_version_changed(point):
        done = run(SHARDFS + ["upgrade", str(point)])
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "version" in done.stderr and "not upgraded" in done.stderr and "Traceback" not in done.stderr
    assert sorted(mount_processes(point)) == processes
    key = sorted(objects)[5]
    assert (point / key).read_bytes() == objects[key]

    fg = tmp_path / "fg"
    mounter.foreground(path, fg)
    done = run(SHARDFS + ["upgrade", str(fg)])
    assert done.returncode == 1 and "no supervisor" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_coordinators_that_cannot_take_over_end_the_mount(mixed, mounter, tmp_path):
    """A coordinator that dies before it takes the mount over (here: the
    state's version word changed under it, so every new one refuses it) is
    started again MAX_FAILED_STARTS times, then the supervisor unmounts and
    every process ends: no restart loop, no stale mount."""
    from shardfs.fuse import supervisor as supervisor_mod

    path, objects = mixed
    log = tmp_path / "mount.log"
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=2", "--log-file", str(log))
    processes = mount_processes(point)
    (supervisor,) = supervisor_pids(point)
    with _state_version_changed(point, restore=False):
        pass
    (coordinator,) = daemon_pids(point)
    os.kill(coordinator, signal.SIGKILL)
    assert wait_until(lambda: not mounted(point), timeout=30), log.read_text()[-2000:]
    assert wait_until(lambda: all(gone(p) for p in processes + [supervisor])), "a process is left"
    text = log.read_text()
    assert text.count("cannot take") == supervisor_mod.MAX_FAILED_STARTS
    assert "in a row died before taking it over" in text


@contextlib.contextmanager
def _no_coordinator(point: Path):
    """While the block runs, no coordinator serves `point`: it was killed
    and the supervisor is stopped, so that none replaces it yet; after
    the block, the supervisor goes on and the next coordinator takes over."""
    (supervisor,) = supervisor_pids(point)
    (coordinator,) = coordinator_pids(point)
    os.kill(supervisor, signal.SIGSTOP)
    try:
        os.kill(coordinator, signal.SIGKILL)
        assert wait_until(lambda: gone(coordinator))
        yield
    finally:
        os.kill(supervisor, signal.SIGCONT)


def test_a_shard_added_while_no_coordinator_runs_is_served_after_the_takeover(mixed, mounter, tmp_path):
    """A shard added to the followed directory while no coordinator runs is
    served once the next one took over (its first rescan)."""
    objects, shard_dir, log, point = _followed_mount(mixed, mounter, tmp_path, workers=2)
    with _no_coordinator(point):
        extra = build_shard(shard_dir / ".new", make_blobs(78, 10, 1, 64, b"while"))
        os.rename(shard_dir / ".new", shard_dir / "extra.shard")
        time.sleep(0.5)
        assert not (point / sorted(extra)[0]).exists()  # nobody follows the directory now
    assert wait_until(lambda: log.read_text().count("took over") == 1), log.read_text()[-2000:]
    new_key = sorted(extra)[0]
    assert wait_until(lambda: (point / new_key).exists())
    assert (point / new_key).read_bytes() == extra[new_key]
    key = sorted(objects)[1]
    assert (point / key).read_bytes() == objects[key]


@pytest.mark.xfail(strict=False, reason="failed once in CI (the name still answered 10 s after the next coordinator "
                                        "invalidated its inode), passed in every local run: not understood yet")
def test_a_takedown_made_while_no_coordinator_runs_is_in_force_after_the_takeover(mixed, mounter, tmp_path):
    """An object taken down while no coordinator runs (`shardfs delete`
    finds no one to tell; a file is open on it) is gone once the next
    coordinator took over: its cached name and pages too."""
    objects, shard_dir, log, point = _followed_mount(mixed, mounter, tmp_path, workers=2)
    # the table the next coordinator takes names the sidecar (what its check for takedowns reads)
    assert wait_until(lambda: stats(point)["sidecars"] == 1)
    victim = sorted(objects)[7]
    assert (point / victim).read_bytes() == objects[victim]  # name and pages cached
    held = os.open(point / victim, os.O_RDONLY)
    try:
        with _no_coordinator(point):
            done = run(SHARDFS + ["delete", "--yes", str(shard_dir / "mixed.shard"), victim])
            assert done.returncode == 0, done.stderr
            assert os.pread(held, 16, 0) == objects[victim][:16]  # nobody invalidated it yet
        assert wait_until(lambda: log.read_text().count("took over") == 1), log.read_text()[-2000:]
        assert wait_until(lambda: not (point / victim).exists()), log.read_text()[-2000:]
        with pytest.raises(OSError):
            os.pread(held, 16, 0)
    finally:
        os.close(held)


def test_killed_supervisor_unmounts_cleanly(mixed, mounter, tmp_path):
    """kill -9 of the supervisor: the coordinator is told (SIGTERM), unmounts
    and leaves, the workers die with the supervisor: no stale mount, no
    orphan process."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3")
    processes = mount_processes(point)
    assert len(processes) >= 5  # supervisor, coordinator, 3 workers
    (supervisor,) = supervisor_pids(point)
    os.kill(supervisor, signal.SIGKILL)
    assert wait_until(lambda: all(gone(p) for p in processes)), "orphan processes"
    assert wait_until(lambda: not mounted(point)), "stale mount"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_every_process(mixed, mounter, tmp_path, sig):
    """SIGTERM or SIGINT to the coordinator unmounts and ends every process."""
    path, _ = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3")
    processes = mount_processes(point)
    os.kill(daemon_pids(point)[0], sig)
    assert wait_until(lambda: not mounted(point)), "still mounted"
    assert wait_until(lambda: all(gone(p) for p in processes)), "a process is left"


def _grown(before: dict, after: dict) -> dict:
    """Requests served between two readings of the requests xattr, less
    the GETXATTR of the second reading; kinds that did not grow left out."""
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    grown["getxattr"] = grown.get("getxattr", 0) - 1
    return {k: v for k, v in grown.items() if v}


def _read_with_syscalls(path: Path) -> bytes:
    """The object's bytes read as a C reader (cat) does: open(2), read(2)
    of 128 KiB until end of file, close(2). (CPython's buffered open()
    also asks the file whether it is a terminal: an ioctl.)"""
    fd = os.open(path, os.O_RDONLY)
    try:
        out = []
        while True:
            chunk = os.read(fd, 128 * 1024)
            if not chunk:
                return b"".join(out)
            out.append(chunk)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    """A shard of objects of 1 byte to 128 KiB (one READ of the kernel's
    covers each) and three larger ones: (path, small keys, large keys,
    objects)."""
    d = tmp_path_factory.mktemp("sized")
    rng = random.Random(13)
    small_sizes = [1, 100, 4095, 4096, 4097, 65536, 65537, 100_000, 131071, 131072]
    small_sizes += [rng.randint(1, 4096) for _ in range(30)]
    large_sizes = [131073, 300_000, 1_000_000]
    blobs = [b"s" + i.to_bytes(4, "big") + rng.randbytes(n - 5) if n >= 5 else rng.randbytes(n)
             for i, n in enumerate(small_sizes)]
    blobs += [b"l" + i.to_bytes(4, "big") + rng.randbytes(n - 5) for i, n in enumerate(large_sizes)]
    objects = build_shard(d / "sized.shard", blobs)
    small = [key_of(b) for b in blobs[:len(small_sizes)]]
    large = [key_of(b) for b in blobs[len(small_sizes):]]
    assert len(set(small)) == len(small_sizes) and all(0 < len(objects[k]) <= 128 * 1024 for k in small)
    assert all(len(objects[k]) > 128 * 1024 for k in large)
    return d / "sized.shard", small, large, objects


def test_requests_per_cold_object(sized, mounter, tmp_path):
    """A cold object of at most 128 KiB read by a C reader costs LOOKUP +
    READ; a warm open + read + close costs no request; a Python open() of
    a cached object costs one IOCTL and nothing else; an object above 128
    KiB is read by READ requests (several), with the right bytes.

    Objects are served in the kernel's no-open mode: OPEN is answered
    ENOSYS once, after which the kernel sends no OPEN, FLUSH or RELEASE for
    the mount and keeps an object's pages between opens. So the mount sees
    at most one OPEN and one FLUSH in all, not per object. (Under pyfuse3
    a cold object cost LOOKUP + OPEN + RELEASE, its bytes pushed into the
    page cache at open; in no-open mode there is no OPEN to push them at.)
    The names are never listed before (READDIRPLUS would hand the kernel
    their entries, and no LOOKUP would follow)."""
    path, small, large, objects = sized
    point = mounter.mount(path, tmp_path / "m")
    before = requests(point)
    for key in small:
        assert _read_with_syscalls(point / key) == objects[key], len(objects[key])
    grown = _grown(before, requests(point))
    assert grown.pop("open", 0) <= 1, grown
    assert grown.pop("flush", 0) <= 1, grown
    assert grown == {"lookup": len(small), "read": len(small)}
    # Warm: names, attributes and pages cached, and no OPEN asked.
    before = requests(point)
    for key in small:
        assert _read_with_syscalls(point / key) == objects[key]
    assert _grown(before, requests(point)) == {}
    # CPython's buffered open() asks isatty(): an IOCTL (answered ENOTTY by
    # C), and nothing else.
    before = requests(point)
    for key in small:
        with open(point / key, "rb") as f:
            assert f.read() == objects[key]
    assert _grown(before, requests(point)) == {"ioctl": len(small)}
    # Larger than one READ: several, each of at most 128 KiB; right bytes.
    for key in large:
        size = len(objects[key])
        before = requests(point)
        assert _read_with_syscalls(point / key) == objects[key]
        grown = _grown(before, requests(point))
        assert grown.pop("lookup") == 1, grown
        reads = grown.pop("read")
        assert -(-size // (128 * 1024)) <= reads <= -(-size // 4096), (size, reads)
        assert grown == {}, grown
        before = requests(point)
        assert _read_with_syscalls(point / key) == objects[key]
        assert _grown(before, requests(point)) == {}
    totals = requests(point)
    assert totals.get("open", 0) == 1 and totals.get("flush", 0) <= 1, totals
    assert "release" not in totals, totals


def test_python_open_of_a_cold_object_costs_no_read(sized, mounter, tmp_path):
    """CPython's buffered open() asks every file whether it is a terminal
    (an IOCTL); the mount pushes the object's first 128 KiB into the
    kernel's page cache before it answers, so a cold object of at most 128
    KiB read by Python costs LOOKUP + IOCTL and no READ, and a larger one
    READs only for what lies past 128 KiB; the bytes are right, at every
    size around the page and push boundaries. With one thread per worker,
    nothing is pushed (a push may wait for a READ that another thread of
    the process must serve) and READ serves the bytes."""
    path, small, large, objects = sized
    point = mounter.mount(path, tmp_path / "m")
    before = requests(point)
    for key in small:
        with open(point / key, "rb") as f:
            assert f.read() == objects[key], len(objects[key])
    grown = _grown(before, requests(point))
    grown.pop("open", None), grown.pop("flush", None)
    assert grown == {"lookup": len(small), "ioctl": len(small)}, grown
    for key in large:
        size = len(objects[key])
        before = requests(point)
        with open(point / key, "rb") as f:
            assert f.read() == objects[key]
        grown = _grown(before, requests(point))
        assert grown.pop("lookup") == 1 and grown.pop("ioctl") == 1, grown
        reads = grown.pop("read")
        assert 1 <= reads <= -(-(size - 128 * 1024) // 4096), (size, reads)
        assert grown == {}, grown
    # Part of an object, then the rest from another open: same bytes.
    key = large[-1]
    point = mounter.mount(path, tmp_path / "m2", "-o", "workers=1")
    with open(point / key, "rb") as f:
        f.seek(200_000)
        assert f.read(1000) == objects[key][200_000:201_000]
    with open(point / key, "rb") as f:
        assert f.read() == objects[key]


def test_pushes_and_reads_of_the_same_objects_from_many_threads(mounter, tmp_path):
    """16 threads of one process read the same cold objects in the same
    order, half through CPython's open() (an IOCTL: a push into the page
    cache, which waits for the pages' locks) and half with os.pread (READs,
    which hold those locks until answered), through one worker: every
    thread finishes and every byte is right. (What makes a hang impossible
    is the bound on threads pushing at once, shardfs/c/py_ll_ops.c: this
    drives pushes and READs of the same pages against each other under
    load, which a missing bound needs before it can hang.)"""
    blobs = make_blobs(51, 400, 1, 20_000)
    objects = build_shard(tmp_path / "s.shard", blobs)
    point = mounter.mount(tmp_path / "s.shard", tmp_path / "m", "-o", "workers=1")
    keys = sorted(objects)
    errors: list = []

    def reader(i: int) -> None:
        for key in keys:
            try:
                if i % 2:
                    with open(point / key, "rb") as f:
                        data = f.read()
                else:
                    fd = os.open(point / key, os.O_RDONLY)
                    try:
                        data = os.pread(fd, 1 << 20, 0)
                    finally:
                        os.close(fd)
            except OSError as exc:
                errors.append(f"{key}: {exc}")
                continue
            if data != objects[key]:
                errors.append(f"{key}: wrong bytes")

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    assert errors == []
    assert requests(point).get("ioctl", 0) >= len(keys)


def test_reads_in_listing_order_are_pushed_ahead(mounter, tmp_path):
    """Objects read whole in the flat root's listing order (slot order, as
    tar and find | xargs read them), in name order (rsync sorts names), or
    in a fan-out directory's listing order (names) are pushed into the page
    cache ahead of the reads, so most of them send no READ; every byte is
    right, objects above 128 KiB and empty ones included. In random order
    the bytes are as right and no object costs more than its one READ (in
    a shard this small, runs of reads fall in order by chance and are
    pushed ahead too). One worker, so that every read is seen by the
    process that follows the streams (with several, each follows the reads
    it serves; bench/results/mount.md measures that). A sparse reader in
    order (every 20th object) is not pushed objects it does not read
    (every 40th object). A push the kernel refuses (it dropped the listed
    name's inode: memory reclaim, drop_caches) costs that object its READ
    and is counted in the stats (`push_refused`); the READs allowed are a
    third of the objects plus those."""
    rng = random.Random(61)
    sizes = [rng.randint(1, 9000) for _ in range(600)] + [0, 200_000, 4096, 131072, 131073]
    blobs = [i.to_bytes(4, "big") + rng.randbytes(n - 4) if n >= 4 else rng.randbytes(n)
             for i, n in enumerate(sizes)]
    objects = build_shard(tmp_path / "s.shard", blobs)

    def read_all(point: Path, paths: list) -> int:
        """READs sent for reading `paths` whole, less the pushes the kernel
        refused (each of those objects is READ: not a miss of the streams).
        A millisecond between two objects, as a tool does some work per
        file (tar writes, rsync compares): the pushes run after the READ
        they follow is answered, and this checks that the streams are
        followed, not who wins that race on a loaded machine (how fast real
        tools go: bench/bench_mount.py)."""
        before, refused = requests(point), stats(point)["push_refused"]
        for path in paths:
            assert _read_with_syscalls(path) == objects[path.name], len(objects[path.name])
            time.sleep(0.001)
        return _grown(before, requests(point)).get("read", 0) - (stats(point)["push_refused"] - refused)

    flat = mounter.mount(tmp_path / "s.shard", tmp_path / "m", "--layout", "flat", "-o", "workers=1")
    assert wait_until(lambda: stats(flat)["sidecars"] == 1)  # key order needs the sidecar
    names = os.listdir(flat)
    assert sorted(names) == sorted(objects)
    reads = read_all(flat, [flat / n for n in names])
    assert reads <= len(names) // 3, f"{reads} READs for {len(names)} objects read in listing order"
    assert stats(flat)["pushed"] >= len(names) // 2
    by_name = mounter.mount(tmp_path / "s.shard", tmp_path / "m2", "--layout", "flat", "-o", "workers=1")
    assert wait_until(lambda: stats(by_name)["sidecars"] == 1)
    reads = read_all(by_name, [by_name / n for n in sorted(os.listdir(by_name))])
    assert reads <= len(names) // 3, f"{reads} READs for {len(names)} objects read in name order"
    fan = mounter.mount(tmp_path / "s.shard", tmp_path / "m3", "--layout", "fanout", "--slicing", "0:1", "-o", "workers=1")
    assert wait_until(lambda: stats(fan)["sidecars"] == 1)
    paths = [fan / d / n for d in sorted(os.listdir(fan)) for n in os.listdir(fan / d)]
    assert len(paths) == len(names)
    reads = read_all(fan, paths)
    assert reads <= len(names) // 3, f"{reads} READs for {len(names)} objects read in fan-out listing order"
    shuffled = mounter.mount(tmp_path / "s.shard", tmp_path / "m4", "--layout", "flat", "-o", "workers=1")
    os.listdir(shuffled)
    order = sorted(names)
    rng.shuffle(order)
    assert read_all(shuffled, [shuffled / n for n in order]) <= len(names)
    # A sparse reader in order (every 40th name, every 40th of the
    # listing) is not a stream: nothing is pushed for it, each read READs.
    sparse = mounter.mount(tmp_path / "s.shard", tmp_path / "m5", "--layout", "flat", "-o", "workers=1")
    assert wait_until(lambda: stats(sparse)["sidecars"] == 1)
    listed = os.listdir(sparse)
    wanted = list(dict.fromkeys([n for n in sorted(listed)[::40] if objects[n]]
                                + [n for n in listed[20::40] if objects[n]]))
    pushed = stats(sparse)["pushed"]
    assert read_all(sparse, [sparse / n for n in wanted]) == len(wanted)
    assert stats(sparse)["pushed"] == pushed


def test_pushes_the_kernel_refuses_are_counted(mounter, tmp_path):
    """Objects are pushed ahead into the inodes the kernel made for the
    listed names; once it dropped them (here drop_caches; memory reclaim
    in life), a push is refused: counted in the stats as `push_refused`,
    and the object's read costs a READ that returns the right bytes."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop the kernel's inode cache")
    blobs = [i.to_bytes(4, "big") * 300 for i in range(200)]
    objects = build_shard(tmp_path / "s.shard", blobs)
    point = mounter.mount(tmp_path / "s.shard", tmp_path / "m", "--layout", "flat", "-o", "workers=1")
    names = os.listdir(point)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")  # dentries and inodes: the listed names' inodes go
    before = requests(point)
    for name in names:
        assert _read_with_syscalls(point / name) == objects[name]
    after = stats(point)
    assert after["push_refused"] > 0, after
    # every object not pushed was READ (an object may be refused by several
    # pushes ahead: the refusals can outnumber the objects)
    assert _grown(before, requests(point)).get("read", 0) >= len(names) - after["pushed"], after


#: Test-only fault injection (shardfs/c/ll_fast.c, push): every push of the
#: mount's workers sleeps this long between reading an object's slot and
#: bytes and storing them into the kernel's page cache.
PUSH_DELAY_MS = 3000


def _sleepers(point: Path) -> dict:
    """{(pid, tid): voluntary context switches} of the threads of the
    mount's workers asleep in nanosleep now."""
    asleep = {}
    for pid in worker_pids(point):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                    if "nanosleep" not in f.read():
                        continue
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    switches = next(line for line in f if line.startswith("voluntary_ctxt_switches:"))
                asleep[pid, tid] = switches
            except (OSError, StopIteration):
                continue
    return asleep


def _push_waiting(point: Path) -> bool:
    """True while a thread of the mount's workers sleeps in a push (the
    test-only delay: its object's slot and bytes read, not stored yet):
    asleep in nanosleep and not woken for 0.15 s. (ThreadSanitizer's
    runtime, `make test-tsan`, has a thread of its own in each process
    that sleeps in nanosleep and wakes every 100 ms.)"""
    before = _sleepers(point)
    if not before:
        return False
    time.sleep(0.15)
    after = _sleepers(point)
    return any(after.get(thread) == switches for thread, switches in before.items())


def _mapped_bytes(fd: int, size: int) -> subprocess.CompletedProcess:
    """Read `size` bytes of the open object `fd` through a mapping, in a
    child (a page the mount cannot READ kills the reader with SIGBUS): a
    page fault is served from the page cache without asking the mount,
    and unlike read(2) it does not revalidate the attributes first."""
    code = ("import mmap, sys; m = mmap.mmap(%d, %d, prot=mmap.PROT_READ); "
            "sys.stdout.buffer.write(m[:])" % (fd, size))
    return subprocess.run([sys.executable, "-c", code], pass_fds=(fd,), capture_output=True, timeout=60)


@pytest.mark.parametrize("path", ["ahead", "ioctl"])
def test_takedown_during_a_push_leaves_no_bytes(mounter, tmp_path, monkeypatch, path):
    """A takedown that lands while a push holds an object's slot and bytes
    (between their reading and FUSE_NOTIFY_STORE, widened here by the
    test-only $SHARDFS_TEST_PUSH_DELAY_MS) must not leave the object's old
    or zeroed bytes in the page cache the coordinator just invalidated: a
    file open on it before the takedown then cannot get them, not even
    through a mapping (which read(2) is not: it asks for the invalidated
    attributes first, GETATTR, refused). Both pushes: ahead of reads in
    listing order ("ahead": objects read in slot order until one read's
    push ahead waits; the object after it, the first it stores, is taken
    down) and at CPython's isatty ioctl ("ioctl")."""
    blobs = [bytes([65 + i]) * (6000 + i) for i in range(6)]  # two pages each
    shard = tmp_path / "s.shard"
    objects = build_shard(shard, blobs)
    monkeypatch.setenv("SHARDFS_TEST_PUSH_DELAY_MS", str(PUSH_DELAY_MS))
    point = mounter.mount(shard, tmp_path / "m", "--layout", "flat", "-o", "workers=1")
    assert wait_until(lambda: stats(point)["sidecars"] == 1)  # no table change meanwhile
    names = os.listdir(point)  # slot order; the kernel has every inode
    before = stats(point)
    pusher = None
    if path == "ahead":
        # A push ahead follows the answer to a READ, so a thread that lags
        # may see this process's reads out of order and miss the stream:
        # read on until one read's push waits.
        victim = None
        for i, name in enumerate(names[:-1]):
            assert _read_with_syscalls(point / name) == objects[name]
            if i >= 2 and wait_until(lambda: _push_waiting(point), timeout=0.5):
                victim = names[i + 1]
                break
        assert victim, "no read in slot order was pushed ahead"
        held = os.open(point / victim, os.O_RDONLY)
    else:
        victim = names[3]
        held = os.open(point / victim, os.O_RDONLY)
        # The coordinator looks for open files every KEEP_INTERVAL and holds
        # the shard of this one: a new table, which the worker applies at
        # its next Python request; until then its C path pushes nothing.
        from shardfs.fuse.coordinator import KEEP_INTERVAL

        time.sleep(2 * KEEP_INTERVAL)
        stats(point)
        pusher = threading.Thread(target=os.isatty, args=(held,), daemon=True)
        pusher.start()  # answered once its push is stored
        assert wait_until(lambda: _push_waiting(point))
    try:
        proc = run(SHARDFS + ["delete", "--yes", str(shard), victim])
        # (other mounts of the host, of other tests, may not answer)
        assert proc.returncode == 0 and f"{point} not told" not in proc.stderr, proc.stderr
        # the takedown landed while the push waited between its reads and its store
        if pusher is None:
            assert stats(point)["pushed"] == before["pushed"], "the push ended before the takedown"
            assert wait_until(lambda: stats(point)["pushed"] > before["pushed"], timeout=PUSH_DELAY_MS / 1000 + 10)
        else:
            assert pusher.is_alive(), "the push ended before the takedown"
            pusher.join(PUSH_DELAY_MS / 1000 + 10)
            assert not pusher.is_alive()
        mapped = _mapped_bytes(held, len(objects[victim]))
        assert mapped.stdout == b"", (
            f"a taken-down object's pushed bytes were served: {len(mapped.stdout)} bytes, "
            f"old: {mapped.stdout == objects[victim]}, zeros: {mapped.stdout.count(0) == len(mapped.stdout)}")
        assert mapped.returncode != 0
        with pytest.raises(OSError):
            os.pread(held, 100, 0)
    finally:
        os.close(held)
    with pytest.raises(FileNotFoundError):
        os.open(point / victim, os.O_RDONLY)
    for name in names[:3]:  # (no CPython open: its ioctl's push would sleep)
        assert _read_with_syscalls(point / name) == objects[name]


def test_no_open_mode_after_the_first_open(mixed, mounter, tmp_path):
    """The kernel's no-open mode: once the mount answered its first OPEN
    (ENOSYS), opening more objects, cold ones, several at once, with
    os.open or Python's open(), for reading in full or in part, sends no
    OPEN, FLUSH or RELEASE at all."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3")
    keys = sorted(objects)
    first = keys[0]
    assert _read_with_syscalls(point / first) == objects[first]
    start = requests(point)
    assert start.get("open", 0) == 1, start
    assert start.get("flush", 0) <= 1 and "release" not in start, start
    cold = keys[1:61]
    held = [os.open(point / k, os.O_RDONLY) for k in cold[:20]]  # open together
    try:
        for fd, key in zip(held, cold[:20]):
            assert os.pread(fd, 1 << 20, 0) == objects[key]
    finally:
        for fd in held:
            os.close(fd)
    for key in cold[20:40]:
        assert _read_with_syscalls(point / key) == objects[key]
    for key in cold[40:]:
        with open(point / key, "rb") as f:
            assert f.read(10) == objects[key][:10]
    grown = _grown(start, requests(point))
    for kind in ("open", "flush", "release"):
        assert kind not in grown, grown
    assert grown["lookup"] == len(cold)


def _block_device_shard(tmp_path: Path, loop_device: str, mounter) -> "tuple[Path, list]":
    """A shard of 30 small objects written to `loop_device`, mounted flat:
    (mount point, the objects' bytes)."""
    src = tmp_path / "src"
    src.mkdir()
    blobs = make_blobs(21, 30, 1, 3000)
    for i, b in enumerate(blobs):
        (src / str(i)).write_bytes(b)
    proc = run(SHARDFS + ["create", "--force", loop_device, str(src)])
    assert proc.returncode == 0, proc.stderr
    point = mounter.mount(loop_device, tmp_path / "m", "--layout", "flat")
    return point, blobs


def test_takedown_on_a_block_device_after_sighup(mounter, tmp_path, loop_device):
    """A shard on a block device taken down without telling the mounts (the
    Python API's `shardfs.delete`, as a writer on another host would): the
    reads of an object whose bytes the kernel has not cached are refused at
    once (READ reads the slot); after SIGHUP the object's cached attributes
    and pages are invalidated too (a device gets no inotify event), so an
    object read before cannot be stat'ed or read either. In no-open mode an
    open is not asked to the mount: until SIGHUP it reads its cached bytes."""
    import shardfs

    point, blobs = _block_device_shard(tmp_path, loop_device, mounter)
    victim, uncached = key_of(blobs[0]), key_of(blobs[2])
    assert (point / victim).read_bytes() == blobs[0]
    assert os.stat(point / uncached).st_size == len(blobs[2])  # name cached, bytes not
    held = os.open(point / victim, os.O_RDONLY)
    try:
        assert wait_until(lambda: stats(point)["sidecars"] == 1)
        assert shardfs.delete(loop_device, [victim, uncached]) == 2
        with pytest.raises(FileNotFoundError):
            (point / uncached).read_bytes()
        _read_gone(point / victim, blobs[0])  # its cached bytes or ENOENT, never other bytes
        os.fstat(held)  # no event for a device: still cached...
        os.kill(daemon_pids(point)[0], signal.SIGHUP)

        assert wait_until(lambda: _fstat_fails(held), timeout=LIVE_BOUND), "...and after SIGHUP still cached"
        assert wait_until(lambda: _read_gone(point / victim, blobs[0]), timeout=LIVE_BOUND)
    finally:
        os.close(held)
    assert (point / key_of(blobs[1])).read_bytes() == blobs[1]


def test_takedown_refuses_cached_objects_at_once(mounter, tmp_path, loop_device):
    """The guarantee the README gives for takedowns: once `shardfs delete`
    returns on this host, the object cannot be opened, read or stat'ed
    again through the mount, even though the kernel cached its name and
    bytes (no-open mode: such an open never reaches the mount). A block
    device, which raises no inotify event, shows it without a race: nothing
    else would invalidate the object in time."""
    point, blobs = _block_device_shard(tmp_path, loop_device, mounter)
    victim = key_of(blobs[0])
    assert (point / victim).read_bytes() == blobs[0]
    held = os.open(point / victim, os.O_RDONLY)
    try:
        assert os.pread(held, 10, 0) == blobs[0][:10]
        proc = run(SHARDFS + ["delete", "--yes", loop_device, victim])
        assert proc.returncode == 0, proc.stderr
        assert "not told" not in proc.stderr, proc.stderr
        with pytest.raises(FileNotFoundError):
            (point / victim).read_bytes()
        with pytest.raises(FileNotFoundError):
            os.stat(point / victim)
        assert _fstat_fails(held)
        with pytest.raises(FileNotFoundError):
            os.pread(held, 10, 0)
    finally:
        os.close(held)
    assert (point / key_of(blobs[1])).read_bytes() == blobs[1]


def test_takedown_told_to_every_mount_of_the_shard(mounter, tmp_path):
    """`shardfs delete` on a shard file served by two mounts (flat, and
    fan-out where the name is in a leaf directory too) and not by a third:
    both forget the cached object before the command returns (no waiting
    for inotify), the third is told and unaffected."""
    blobs = make_blobs(31, 20, 1, 2000)
    shard = tmp_path / "s.shard"
    objects = build_shard(shard, blobs)
    other = tmp_path / "o.shard"
    other_objects = build_shard(other, make_blobs(32, 5, 1, 100))
    flat = mounter.mount(shard, tmp_path / "flat", "--layout", "flat")
    fan = mounter.mount(shard, tmp_path / "fan", "--layout", "fanout", "--slicing", "0:2")
    third = mounter.mount(other, tmp_path / "third", "--layout", "flat")
    victim = key_of(blobs[0])
    leaf = fan / victim[:2] / victim
    for path in (flat / victim, fan / victim, leaf):
        assert path.read_bytes() == objects[victim]
    third_key = next(iter(other_objects))
    assert (third / third_key).read_bytes() == other_objects[third_key]
    proc = run(SHARDFS + ["-v", "delete", "--yes", str(shard), victim])
    assert proc.returncode == 0, proc.stderr
    assert "not told" not in proc.stderr, proc.stderr
    for path in (flat / victim, fan / victim, leaf):
        with pytest.raises(FileNotFoundError):
            path.read_bytes()
        with pytest.raises(FileNotFoundError):
            os.stat(path)
    assert (third / third_key).read_bytes() == other_objects[third_key]
    survivor = key_of(blobs[1])
    assert (flat / survivor).read_bytes() == objects[survivor]


def test_takedown_does_not_warn_of_a_dead_mount(mounter, tmp_path):
    """A mount whose processes were killed (kill -9: "Transport endpoint is
    not connected") serves nothing, so `shardfs delete` has nothing to tell
    it: no warning line for it (its point is named once, at -v, as dead),
    while a live mount of the shard is told and forgets the object."""
    dead_blobs = make_blobs(35, 5, 1, 100)
    build_shard(tmp_path / "d.shard", dead_blobs)
    dead = mounter.mount(tmp_path / "d.shard", tmp_path / "dead", "--layout", "flat")
    kill_every_process(dead)

    def stale() -> bool:
        try:
            os.statvfs(dead)
        except OSError as exc:
            return exc.errno == errno.ENOTCONN
        return False

    assert wait_until(stale)
    blobs = make_blobs(36, 5, 1, 100)
    shard = tmp_path / "s.shard"
    objects = build_shard(shard, blobs)
    live = mounter.mount(shard, tmp_path / "live", "--layout", "flat")
    victim = key_of(blobs[0])
    assert (live / victim).read_bytes() == objects[victim]
    proc = run(SHARDFS + ["-v", "delete", "--yes", str(shard), victim])
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert f"{dead}: its server is gone" in proc.stderr, proc.stderr
    with pytest.raises(FileNotFoundError):
        (live / victim).read_bytes()


def _ask(point: Path, payload: bytes, uid: int = 0, pause: float = 0) -> dict:
    """Send `payload` to the takedown listener of the mount at `point` (as
    `uid`, from a child process, `pause` seconds after connecting) and
    return its answer."""
    from shardfs.fuse import control

    mount = next(m for m in control.shardfs_mounts() if m.point == str(point))
    address = mount.address  # here: uid 65534 cannot reach the mount point to ask the kernel
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        reply = b""
        try:
            os.close(r)
            if uid:
                os.setgid(uid)
                os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(address)
                time.sleep(pause)
                sock.sendall(payload)
                while not reply.endswith(b"\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
        except BaseException as exc:  # told to the parent, which fails the test with it
            reply = json.dumps({"child_error": repr(exc), "got": reply.decode("latin-1")}).encode()
        finally:
            os.write(w, reply or b'{"child_error": "no answer"}')
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        reply = f.read()
    os.waitpid(pid, 0)
    answer = json.loads(reply)
    assert "child_error" not in answer, answer
    return answer


def test_takedown_listener_refuses_bad_requests_and_other_users(mounter, tmp_path):
    """The coordinator's takedown listener answers a malformed request and
    a request from another (non-root) user with an error, invalidates
    nothing for a shard it does not serve, and keeps serving."""
    import shardfs.fuse.control as control

    objects = build_shard(tmp_path / "s.shard", make_blobs(41, 5, 1, 100))
    point = mounter.mount(tmp_path / "s.shard", tmp_path / "m", "--layout", "flat")
    key = next(iter(objects))
    assert (point / key).read_bytes() == objects[key]
    assert "error" in _ask(point, b"not json\n")
    assert "error" in _ask(point, b'{"op": "takedown", "shard": {"dev": 1}, "keys": []}\n')
    request = json.dumps({"op": "takedown", "shard": control.file_identity(os.stat(tmp_path / "s.shard")),
                          "keys": [key]}).encode() + b"\n"
    assert "error" in _ask(point, request, uid=65534)
    # a client slow to send still reads the refusal (the listener reads the
    # request before it answers: a refusal sent at once met the client's
    # write, EPIPE, and was never read)
    assert "error" in _ask(point, request, uid=65534, pause=0.5)
    assert (point / key).read_bytes() == objects[key]  # still served
    elsewhere = json.dumps({"op": "takedown", "shard": {"dev": 1, "ino": 1}, "keys": [key]}).encode() + b"\n"
    assert _ask(point, elsewhere) == {"shards": 0, "invalidated": 0}
    assert _ask(point, request)["shards"] == 1  # the object is live: its cache is dropped, nothing more
    assert (point / key).read_bytes() == objects[key]


def _holds(pids: list, path: str) -> list:
    """The processes among `pids` whose descriptors or mappings still reach
    the file `path` (unlinked: the kernel shows it "(deleted)")."""
    holders = []
    for pid in pids:
        try:
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if any(t.startswith(path) for t in fds) or path in maps:
            holders.append(pid)
    return holders


def test_a_removed_shard_is_let_go_under_c_only_traffic(mounter, tmp_path):
    """A shard removed from a shard directory is unmapped and closed by
    every process of the mount within the live bound (5 s), and its disk
    space comes back, while the only traffic is answered in C (lookups of
    absent names and cold reads of another shard, from 4 threads): the last
    request that used the snapshot holding it lets it go, whatever follows.
    The directory is a tmpfs of its own, so its free space is exact."""
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    bash(f"mount -t tmpfs -o size=256m shardfs-test {shard_dir}")
    try:
        a = build_shard(shard_dir / "a.shard", make_blobs(71, 20000, 1, 2000))
        b = build_shard(shard_dir / "b.shard", [i.to_bytes(4, "big") + os.urandom(1 << 20) for i in range(48)])
        point = mounter.mount([], tmp_path / "m", "--shard-dir", str(shard_dir), "-o", "workers=2")
        assert wait_until(lambda: stats(point)["sidecars"] == 2, timeout=30)
        for key in b:  # the workers open b: a READ needs it (a lookup is answered from its record)
            assert (point / key).read_bytes() == b[key]
        keys = list(a)
        stop = threading.Event()
        errors: list = []

        def traffic(i: int) -> None:
            rng = random.Random(i)
            k = i
            while not stop.is_set():
                try:
                    os.stat(point / os.urandom(32).hex())
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    errors.append(exc)
                if k < len(keys):
                    with open(point / keys[k], "rb", buffering=0) as f:
                        if f.read() != a[keys[k]]:
                            errors.append(f"{keys[k]}: wrong bytes")
                    k += 4
                rng.random()

        threads = [threading.Thread(target=traffic, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        time.sleep(1)
        free_with_b = os.statvfs(shard_dir).f_bfree
        path_b = str(shard_dir / "b.shard")
        assert _holds(mount_processes(point), path_b), "no process of the mount held b"
        os.unlink(path_b)

        def space_back() -> bool:
            return (os.statvfs(shard_dir).f_bfree - free_with_b) * os.statvfs(shard_dir).f_frsize >= 40 << 20

        freed = wait_until(lambda: not _holds(mount_processes(point), path_b) and space_back(), timeout=5)
        holders = _holds(mount_processes(point), path_b)
        stop.set()
        for t in threads:
            t.join(30)
        assert errors == []
        assert freed, f"after 5 s, processes {holders} still hold the removed shard, or its space is not back"
    finally:
        force_unmount(tmp_path / "m")
        bash(f"umount -l {shard_dir}")


def test_takedown_reaches_the_mount_that_took_a_lingering_ones_mount_id(mounter, tmp_path, monkeypatch):
    """A mount whose coordinator outlives it (unmounted while a worker
    thread still sleeps in a push: the test-only delay) frees its mount ID,
    which the kernel gives to the next mount. `shardfs delete` on the next
    mount's shard must reach the next mount's coordinator, not the
    lingering one (which serves another shard: it would answer "0 shards"
    and the object would stay readable from the kernel's cache)."""
    from shardfs.fuse.openfiles import mount_id

    old_objects = build_shard(tmp_path / "old.shard", [bytes([65 + i]) * (6000 + i) for i in range(6)])
    new_objects = build_shard(tmp_path / "new.shard", make_blobs(42, 5, 1, 3000))
    monkeypatch.setenv("SHARDFS_TEST_PUSH_DELAY_MS", str(PUSH_DELAY_MS))
    old = mounter.mount(tmp_path / "old.shard", tmp_path / "old", "--layout", "flat", "-o", "workers=1")
    monkeypatch.delenv("SHARDFS_TEST_PUSH_DELAY_MS")
    assert wait_until(lambda: stats(old)["sidecars"] == 1)
    old_id, coordinators = mount_id(str(old)), daemon_pids(old)
    for name in os.listdir(old):  # in slot order, until a push ahead waits
        assert _read_with_syscalls(old / name) == old_objects[name]
        if wait_until(lambda: _push_waiting(old), timeout=0.3):
            break
    else:
        raise AssertionError("no push ahead started")
    assert run(["umount", str(old)]).returncode == 0
    point = mounter.mount(tmp_path / "new.shard", tmp_path / "new", "--layout", "flat")
    assert mount_id(str(point)) == old_id, "the kernel did not give the freed mount ID again"
    assert all(not gone(pid) for pid in coordinators), "the unmounted mount's coordinator left already"
    victim = next(iter(new_objects))
    assert (point / victim).read_bytes() == new_objects[victim]
    proc = run(SHARDFS + ["delete", "--yes", str(tmp_path / "new.shard"), victim])
    assert proc.returncode == 0 and "not told" not in proc.stderr, proc.stderr
    with pytest.raises(FileNotFoundError):
        (point / victim).read_bytes()


#: Objects of the shard whose takedown check must not stall the coordinator:
#: enough that checking every slot in Python (the code before) held its
#: loop about 2 s on this 2-core machine when idle (0.65 s for a million),
#: several times LISTENER_BOUND.
SCAN_OBJECTS = 3_000_000
#: Longest a request to the takedown listener may wait while that check
#: runs: a small fraction of what the check took in Python.
LISTENER_BOUND = 0.5


def _probe_listener(point: Path, stop: threading.Event, latencies: list, errors: list) -> None:
    """Until `stop`: ask the takedown listener of the mount at `point` about
    a shard it does not serve (it answers at once, invalidating nothing),
    one request after the other, appending each answer's wait in seconds."""
    from shardfs.fuse import control

    mount = next(m for m in control.shardfs_mounts() if m.point == str(point))
    request = json.dumps({"op": "takedown", "shard": {"dev": 1, "ino": 1}, "keys": []}).encode() + b"\n"
    while not stop.is_set():
        start = time.monotonic()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(30)
                sock.connect(mount.address)
                sock.sendall(request)
                reply = b""
                while not reply.endswith(b"\n"):
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
            assert json.loads(reply) == {"shards": 0, "invalidated": 0}, reply
        except Exception as exc:  # failed by the test
            errors.append(exc)
            return
        latencies.append(time.monotonic() - start)
        time.sleep(0.005)


def test_takedown_check_leaves_the_coordinator_responsive(mounter, tmp_path):
    """A write to a served shard (here a takedown not told to the mount,
    as a writer on another host or the Python API makes) has the
    coordinator check every slot its sidecar lists against the index and
    invalidate the objects deleted since. On a shard of a million objects
    that check must not stall the coordinator: its takedown listener keeps
    answering within LISTENER_BOUND while it runs (the check runs in C,
    off the coordinator's loop), and the deleted object is still
    invalidated within the live bound."""
    import shardfs

    path = tmp_path / "big.shard"
    blobs = [i.to_bytes(4, "big") for i in range(SCAN_OBJECTS)]
    with shardfs.ShardWriter(str(path)) as w:  # streamed: no dict of every key
        for data in blobs:
            w.add(bytes.fromhex(key_of(data)), data)
    point = mounter.mount(path, tmp_path / "m", "--layout", "flat")
    victim, other = key_of(blobs[0]), key_of(blobs[1])
    assert (point / victim).read_bytes() == blobs[0]
    held = os.open(point / victim, os.O_RDONLY)  # attributes cached for a year
    stop, latencies, errors = threading.Event(), [], []
    probe = threading.Thread(target=_probe_listener, args=(point, stop, latencies, errors), daemon=True)
    try:
        assert wait_until(lambda: stats(point)["sidecars"] == 1, timeout=60)
        probe.start()
        assert wait_until(lambda: len(latencies) >= 5), errors
        idle = max(latencies)
        started = time.monotonic()
        assert shardfs.delete(path, [victim]) == 1
        # Invalidated by the check (nothing told the mount): it ran.
        assert wait_until(lambda: _fstat_fails(held), timeout=30), "the deleted object was never invalidated"
        took = time.monotonic() - started
        time.sleep(0.2)  # a request in flight when the check ended
    finally:
        stop.set()
        probe.join(60)
        os.close(held)
    assert not errors, errors
    slowest = max(latencies)
    print(f"listener: {len(latencies)} answers, slowest {slowest:.3f} s (idle: {idle:.3f} s); "
          f"deleted object invalidated {took:.2f} s after the delete")
    assert slowest < LISTENER_BOUND, \
        f"the takedown listener waited {slowest:.2f} s while the takedown check ran ({took:.2f} s in all)"
    assert took < LIVE_BOUND * SLOWDOWN  # the check's own time: C, instrumented under make test-tsan
    assert (point / other).read_bytes() == blobs[1]
