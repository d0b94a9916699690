"""One mount, several worker processes: real mounts, real shards, real tools.

What must hold whatever worker a request reaches: every byte read is right
under many interleaved readers (OPEN, READ and RELEASE of one file land in
different workers), a listing resumes exactly across workers, live pickup
never makes one inode name two objects, a shard replaced in place is served
from its new file while files opened on the old one keep their bytes, a
takedown reaches the mount (kernel caches included), and killing a worker
or the coordinator leaves no reader hanging and no process behind.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
from mounting import (
    SHARDFS,
    build_shard,
    daemon_pids,
    default_workers,
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
    READ requests: above the size pushed at open)."""
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
    assert len(worker_pids(point)) == default_workers()
    one = mounter.mount(path, tmp_path / "one", "-o", "workers=1")
    assert len(worker_pids(one)) == 1
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
    reading its bytes; the old shard is closed once that file is closed."""
    path = tmp_path / "a.shard"
    rng = random.Random(5)
    big = rng.randbytes(3_000_000)
    old = build_shard(path, make_blobs(7, 50, 1, 900, tag=b"old") + [big])
    log = tmp_path / "log"
    point = mounter.mount(path, tmp_path / "m", "--log-file", str(log), "-o", "workers=3")
    big_key = key_of(big)
    old_key = next(k for k in old if k != big_key)
    assert (point / old_key).read_bytes() == old[old_key]
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
    finally:
        f.close()
    assert wait_until(lambda: "closed: no file open on it" in log.read_text(), timeout=10)
    assert sorted(os.listdir(point)) == sorted(key_of(b) for b in newblobs)


@pytest.mark.parametrize("layout", ["flat", "shard-dir"])
def test_takedown_reaches_the_mount(mounter, tmp_path, layout):
    """`shardfs delete` in place on a served shard: within the live bound
    the object cannot be stat'ed, opened or listed through the mount, even
    though the kernel had its name, attributes and bytes cached; a file
    already open gets errors or its cached bytes, never new ones; the other
    objects are untouched."""
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
    victim, other = sorted(objects)[:2]
    where = point if layout == "flat" else point / victim[:2] / victim[2:4]
    for _ in range(2):  # names, attributes and bytes in the kernel's caches
        assert (where / victim).read_bytes() == objects[victim]
    held = os.open(where / victim, os.O_RDONLY)  # attributes cached for a year
    try:
        assert os.fstat(held).st_size == len(objects[victim])
        assert os.pread(held, 100, 0) == objects[victim][:100]
        # Wait for the sidecar, so the deletion can be told apart.
        assert wait_until(lambda: stats(point)["sidecars"] == 1)
        proc = run(SHARDFS + ["delete", "--yes", str(path), victim])
        assert proc.returncode == 0, proc.stderr
        with pytest.raises(FileNotFoundError):
            (where / victim).read_bytes()  # OPEN reads the slot: refused at once

        # Only an invalidation by the mount drops attributes cached for a year.
        assert wait_until(lambda: _fstat_fails(held), timeout=LIVE_BOUND), \
            "the kernel still has the object's attributes"
        with pytest.raises(OSError):
            os.pread(held, 100, 0)  # its cached pages are gone too
    finally:
        os.close(held)
    with pytest.raises(FileNotFoundError):
        os.stat(where / victim)
    assert victim not in os.listdir(where)
    other_path = point / other if layout == "flat" else point / other[:2] / other[2:4] / other
    assert other_path.read_bytes() == objects[other]


def test_killed_worker_is_replaced_and_no_reader_hangs(mixed, mounter, tmp_path):
    """kill -9 of one worker while 8 readers run: every reader finishes (a
    request the dead worker held fails with an error, never hangs), a new
    worker takes its place, and the mount keeps serving right bytes."""
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
    # Only the requests the killed worker held may fail, and only with the
    # errors the kernel gives a request whose server went away: ECONNABORTED
    # (its /dev/fuse clone was closed), EIO or ENOTCONN.
    allowed = ("ECONNABORTED", "EIO", "ENOTCONN")
    assert [e for e in errors if not any(f": {name} [Errno" in e for name in allowed)] == [], errors
    assert gone(victim)
    assert wait_until(lambda: len(worker_pids(point)) == 3), "no replacement worker"
    assert victim not in worker_pids(point)
    for key in keys[:50] + keys[-10:]:
        assert (point / key).read_bytes() == objects[key]


def test_killed_coordinator_leaves_no_worker(mixed, mounter, tmp_path):
    """kill -9 of the coordinator: every worker dies with it (no orphan),
    and `shardfs umount` clears the stale mount."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3")
    processes = mount_processes(point)
    assert len(processes) >= 4
    (coordinator,) = daemon_pids(point)
    os.kill(coordinator, signal.SIGKILL)
    assert wait_until(lambda: all(gone(p) for p in processes)), "orphan workers"
    proc = run(SHARDFS + ["umount", str(point)])
    assert proc.returncode == 0, proc.stderr
    assert not mounted(point)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_every_process(mixed, mounter, tmp_path, sig):
    """SIGTERM or SIGINT to the coordinator unmounts and ends every process."""
    path, _ = mixed
    point = mounter.mount(path, tmp_path / "m", "-o", "workers=3")
    processes = mount_processes(point)
    os.kill(daemon_pids(point)[0], sig)
    assert wait_until(lambda: not mounted(point)), "still mounted"
    assert wait_until(lambda: all(gone(p) for p in processes)), "a process is left"


def test_requests_per_cold_object(mixed, mounter, tmp_path):
    """A cold small object costs at most 3 requests (lookup, open, release:
    its bytes come with the open); one above the push size is read by READ
    requests, and its bytes are right."""
    path, objects = mixed
    point = mounter.mount(path, tmp_path / "m")
    small = [k for k, v in objects.items() if 0 < len(v) <= 4096][:30]
    before = requests(point)
    for key in small:
        with open(point / key, "rb") as f:
            assert f.read() == objects[key]
    after = requests(point)
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    grown.pop("getxattr", None)
    grown.pop("flush", None)
    assert sum(grown.values()) <= 3 * len(small), grown
    assert grown.get("read", 0) == 0
    large = next(k for k, v in objects.items() if len(v) > 150_000)
    assert (point / large).read_bytes() == objects[large]
    assert requests(point).get("read", 0) > 0


def test_takedown_on_a_block_device_after_sighup(mounter, tmp_path, loop_device):
    """A shard on a block device: `shardfs delete DEVICE KEY` on this host
    refuses new opens at once; after SIGHUP the object's cached attributes
    and pages are invalidated too (a device gets no inotify event)."""
    src = tmp_path / "src"
    src.mkdir()
    blobs = make_blobs(21, 30, 1, 3000)
    for i, b in enumerate(blobs):
        (src / str(i)).write_bytes(b)
    proc = run(SHARDFS + ["create", "--force", loop_device, str(src)])
    assert proc.returncode == 0, proc.stderr
    point = mounter.mount(loop_device, tmp_path / "m", "--layout", "flat")
    victim = key_of(blobs[0])
    assert (point / victim).read_bytes() == blobs[0]
    held = os.open(point / victim, os.O_RDONLY)
    try:
        assert wait_until(lambda: stats(point)["sidecars"] == 1)
        proc = run(SHARDFS + ["delete", "--yes", loop_device, victim])
        assert proc.returncode == 0, proc.stderr
        with pytest.raises(FileNotFoundError):
            (point / victim).read_bytes()
        os.fstat(held)  # no event for a device: still cached...
        os.kill(daemon_pids(point)[0], signal.SIGHUP)

        assert wait_until(lambda: _fstat_fails(held), timeout=LIVE_BOUND), "...and after SIGHUP still cached"
    finally:
        os.close(held)
    assert (point / key_of(blobs[1])).read_bytes() == blobs[1]
