"""Shards that change under a mount or an open Shard, and faults.

A shard is read through a shared mapping; when its file shrinks, touching a
page past the new end raises SIGBUS, which would kill the FUSE daemon and
every mount it serves. These tests truncate and overwrite shards while they
are mounted and check that the vanished bytes answer EIO while everything
else keeps working (the same through an open Shard: test_sigbus_guard.py);
then 32 readers at once, signals, a full disk and kill -9 during create and
delete, and the mount's permissions. The tests that mount are marked
needs_fuse; the others need no kernel support and run everywhere.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import stat
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from mounting import (SHARDFS, build_shard, daemon_pids, default_workers, key_of, make_blobs, mounted, needs_fuse,
                      run, wait_until, worker_pids)

shardfs = pytest.importorskip("shardfs")


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@needs_fuse
@pytest.mark.parametrize("how", ["truncate", "overwrite"])
def test_shard_changed_under_a_mount(tmp_path, mounter, how):
    """Two shards mounted; one is truncated (or its index and hash
    overwritten with random bytes) while mounted: its objects answer EIO
    (or are not found), the other shard's objects read correctly, the
    daemon survives and unmounts cleanly."""
    a, b = tmp_path / "a.shard", tmp_path / "b.shard"
    objects_a = build_shard(a, make_blobs(3, 2000, 100, 5000, tag=b"a"))
    objects_b = build_shard(b, make_blobs(4, 2000, 100, 5000, tag=b"b"))
    point = mounter.mount([a, b], tmp_path / "mnt", "--layout", "flat",
                          "--cache-dir", str(tmp_path / "cache"))
    pids = daemon_pids(point)
    assert len(pids) == 1
    keys_a = list(objects_a)
    # Some objects of A read before the change (their pages may stay cached
    # by the kernel: keep_cache), the rest never touched.
    for key in keys_a[:20]:
        assert _read(point / key) == objects_a[key]
    assert _stats(point)["errors"] == 0
    with shardfs.Shard(str(a)) as s:
        index_position = s.header.index_position
    if how == "truncate":
        os.truncate(a, 4096)
    else:
        size = os.path.getsize(a)
        with open(a, "r+b") as f:
            f.seek(index_position)
            f.write(random.Random(5).randbytes(size - index_position))
    outcomes = {"ok": 0, "eio": 0, "enoent": 0, "estale": 0, "wrong": 0}
    names = {errno.EIO: "eio", errno.ENOENT: "enoent", errno.ESTALE: "estale"}
    for key in keys_a[100:400]:
        try:
            data = _read(point / key)
        except OSError as exc:
            # ESTALE, ENOENT: the coordinator found the changed file no
            # longer a valid shard (its rescan, 0.2 s after the change) and
            # removed it between the lookup and the read, or before the lookup
            assert exc.errno in names, exc
            outcomes[names[exc.errno]] += 1
        else:
            outcomes["ok" if data == objects_a[key] else "wrong"] += 1
    assert outcomes["wrong"] == 0, outcomes
    if how == "truncate":
        assert outcomes["ok"] == 0, outcomes  # every byte of A's index is gone
    # each EIO or ESTALE came from an error answer (one or more: the kernel
    # may ask again), counted where it is written; an absent name's ENOENT
    # and the ERANGE that sizes the xattr read here are not errors
    failed = outcomes["eio"] + outcomes["estale"]
    errors = _stats(point)["errors"]
    assert failed <= errors <= 3 * failed and (errors > 0) == (failed > 0), (errors, outcomes)
    # B is untouched and served as before.
    for key in list(objects_b)[:500]:
        assert _read(point / key) == objects_b[key]
    assert daemon_pids(point) == pids
    requests = json.loads(os.getxattr(point, "user.shardfs.requests"))
    assert requests["lookup"] > 0
    proc = run(SHARDFS + ["umount", point])
    assert proc.returncode == 0, proc.stderr
    assert not mounted(point)


def _stats(point) -> dict:
    return json.loads(os.getxattr(point, "user.shardfs.stats"))


# ------------------------------------------------------------ concurrency

#: Seconds each stress test runs (the issue asks for 60; SHARDFS_STRESS_SECONDS
#: shortens it for a quick local run).
STRESS_SECONDS = float(os.environ.get("SHARDFS_STRESS_SECONDS", "60"))
READERS = 32


def _stress_objects(tmp_path: Path) -> Tuple[Path, Dict[str, bytes]]:
    rng = random.Random(11)
    sizes = [rng.choice((0, 1, 100, 4095, 4096, 4097, 65536, 131073)) for _ in range(1500)]
    sizes += [rng.randrange(1, 300_000) for _ in range(1500)]
    blobs = [i.to_bytes(4, "big") + rng.randbytes(n) for i, n in enumerate(sizes)]
    path = tmp_path / "stress.shard"
    return path, build_shard(path, blobs)


def _rss_anon(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


def _reader_loop(read_one, keys: List[str], seed: int, deadline: float, errors: list, counts: list) -> None:
    """Until `deadline`: whole objects verified by SHA-256 (random order,
    then runs in key order) and random ranges compared with the source."""
    rng = random.Random(seed)
    n = 0
    try:
        while time.monotonic() < deadline:
            mode = rng.random()
            if mode < 0.4:
                picks = [rng.choice(keys)]
            elif mode < 0.7:
                start = rng.randrange(len(keys))
                picks = keys[start:start + 20]  # sequential: neighbours in name order
            else:
                picks = None
            if picks is not None:
                for key in picks:
                    data = read_one(key, None)
                    if key_of(data) != key:
                        errors.append(f"{key}: SHA-256 mismatch ({len(data)} bytes)")
                    n += 1
            else:
                key = rng.choice(keys)
                data = read_one(key, rng)
                n += 1
                if data is not None and data[0] is False:
                    errors.append(f"{key}: range mismatch at {data[1]}")
    except Exception as exc:  # any exception is a failure of the test
        errors.append(repr(exc))
    counts.append(n)


@needs_fuse
def test_32_readers_through_a_mount(tmp_path, mounter):
    """32 threads read one mount for STRESS_SECONDS: random and sequential
    whole-object reads verified by SHA-256, random ranges compared with the
    source bytes, with the default worker count (at least 2) or
    SHARDFS_WORKERS. Zero errors, and the anonymous memory of every
    process of the mount stays flat (compared after a warm-up to the end)."""
    path, objects = _stress_objects(tmp_path)
    point = mounter.mount([path], tmp_path / "mnt", "--cache-dir", str(tmp_path / "cache"))
    pid = daemon_pids(point)[0]
    processes = daemon_pids(point) + worker_pids(point)  # not a sidecar builder, which leaves
    assert len(processes) == 1 + default_workers()
    keys = sorted(objects)

    def read_one(key, rng):
        if rng is None:
            with open(point / key, "rb") as f:
                return f.read()
        src = objects[key]
        off = rng.randrange(len(src) + 1)
        length = rng.randrange(1, 200_000)
        fd = os.open(point / key, os.O_RDONLY)
        try:
            got = os.pread(fd, length, off)
        finally:
            os.close(fd)
        return None if got == src[off:off + length] else (False, off)

    errors: list = []
    counts: list = []
    warm = time.monotonic() + min(10.0, STRESS_SECONDS / 4)
    deadline = time.monotonic() + STRESS_SECONDS
    threads = [threading.Thread(target=_reader_loop, args=(read_one, keys, i, deadline, errors, counts))
               for i in range(READERS)]
    for t in threads:
        t.start()
    while time.monotonic() < warm:
        time.sleep(0.2)
    rss_warm = {p: _rss_anon(p) for p in processes}
    for t in threads:
        t.join(timeout=STRESS_SECONDS + 120)
    rss_end = {p: _rss_anon(p) for p in processes}
    assert not errors, errors[:5]
    assert len(counts) == READERS and sum(counts) > READERS
    for p in processes:
        assert rss_end[p] - rss_warm[p] < 8 << 20, (p, rss_warm[p], rss_end[p])
    assert daemon_pids(point) == [pid]
    assert sorted(daemon_pids(point) + worker_pids(point)) == sorted(processes)  # no worker died
    print(f"\n  mount: {READERS} readers x {STRESS_SECONDS:g} s, {sum(counts):,} reads verified, "
          f"{len(processes) - 1} workers, RssAnon MiB " +
          ", ".join(f"{rss_warm[p] >> 20}->{rss_end[p] >> 20}" for p in processes))


def test_32_threads_through_the_python_api(tmp_path):
    """The same through one shardfs.Shard shared by 32 threads: zero errors."""
    path, objects = _stress_objects(tmp_path)
    keys = sorted(objects)
    with shardfs.Shard(str(path)) as s:

        def read_one(key, rng):
            if rng is None:
                return s[key]
            src = objects[key]
            data_offset, size = s.locate(key)
            off = rng.randrange(size + 1)
            length = rng.randrange(1, 200_000)
            got = s.pread(data_offset, size, off, length)
            return None if got == src[off:off + length] else (False, off)

        errors: list = []
        counts: list = []
        deadline = time.monotonic() + STRESS_SECONDS
        threads = [threading.Thread(target=_reader_loop, args=(read_one, keys, 100 + i, deadline, errors, counts))
                   for i in range(READERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=STRESS_SECONDS + 120)
    assert not errors, errors[:5]
    assert len(counts) == READERS
    print(f"\n  API: {READERS} threads x {STRESS_SECONDS:g} s, {sum(counts):,} reads verified")


# ----------------------------------------------------------------- faults


def _tree(path: Path) -> Dict[str, str]:
    """{relative path: sha256} of every file under `path`."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            p = Path(root) / name
            out[str(p.relative_to(path))] = key_of(p.read_bytes())
    return out


@pytest.fixture(scope="module")
def source_tree(tmp_path_factory) -> Path:
    """6,000 files of up to 8 KiB (~24 MB): a create takes a few seconds."""
    src = tmp_path_factory.mktemp("source")
    rng = random.Random(21)
    for i in range(6000):
        d = src / f"d{i % 30}"
        d.mkdir(exist_ok=True)
        (d / f"f{i}").write_bytes(i.to_bytes(4, "big") + rng.randbytes(rng.randrange(8192)))
    return src


def _leftovers(directory: Path, name: str) -> List[str]:
    return sorted(p.name for p in directory.iterdir() if name in p.name)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_create_interrupted_leaves_nothing(tmp_path, source_tree, signum):
    """A create killed (kill -9), interrupted (Ctrl-C) or terminated half-way
    leaves no shard and no temporary file, and the source is untouched.
    Half-way for sure: the create reads its file names from a pipe
    (--files-from -), gets half of them, and is signalled once it has
    written objects and waits for more (a create of the whole tree takes a
    tenth of a second here: a signal sent after it started writing could
    find it done)."""
    before = _tree(source_tree)
    out = tmp_path / "out"
    out.mkdir()
    target = out / "x.shard"
    names = sorted(str(p) for p in source_tree.rglob("*") if p.is_file())
    # SIGINT as in a terminal's foreground job, whatever this runner was
    # started with (a background job of a shell ignores it, and so would
    # the create: Python keeps an ignored SIGINT ignored).
    proc = subprocess.Popen(SHARDFS + ["create", str(target), "--files-from", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.stdin.write("".join(f"{n}\n" for n in names[: len(names) // 2]).encode())
    proc.stdin.flush()

    def written() -> int:
        """Bytes of the shard being written (its file in `out`, unnamed)."""
        try:
            for fd in os.listdir(f"/proc/{proc.pid}/fd"):
                link = f"/proc/{proc.pid}/fd/{fd}"
                if os.readlink(link).startswith(str(out)):
                    return os.stat(link).st_size
        except OSError:
            pass
        return 0

    # Objects of the first half written, and no more coming: it waits for names.
    assert wait_until(lambda: written() > 0, timeout=30), "the create never started writing"
    size = -1
    while size != written():
        size = written()
        time.sleep(0.2)
    assert proc.poll() is None, "the create ended before the rest of its names"
    proc.send_signal(signum)
    try:
        proc.wait(timeout=60)  # stdin left open: the signal alone must end it
    finally:
        proc.kill()
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    err = proc.stderr.read().decode()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode != 0, err
    if signum == signal.SIGINT:
        assert proc.returncode == 130 and err.strip() == "shardfs: interrupted", err
    assert list(out.iterdir()) == [], list(out.iterdir())
    assert _tree(source_tree) == before


def test_create_on_a_full_disk(tmp_path, source_tree):
    """ENOSPC half-way (a 4 MiB tmpfs for ~24 MB of objects): one line
    naming the problem, exit 1, nothing left, the source untouched."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    if run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", small]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        before = _tree(source_tree)
        proc = run(SHARDFS + ["create", small / "x.shard", source_tree], timeout=120)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "No space left on device" in lines[0], proc.stderr
        assert list(small.iterdir()) == []
        assert shutil.disk_usage(small).used < 64 << 10  # the blocks were freed
        assert _tree(source_tree) == before
        # The same source fits elsewhere: nothing was wrong with it.
        proc = run(SHARDFS + ["create", tmp_path / "ok.shard", source_tree], timeout=120)
        assert proc.returncode == 0, proc.stderr
    finally:
        run(["umount", "-l", small])


def test_delete_killed_half_way_leaves_a_valid_shard(tmp_path):
    """kill -9 during a delete of many objects (docs/format.md, "Deleting"):
    the shard's structure checks out; every object is intact or gone,
    except at most the one being deleted, which may read as zeros of its
    size; running the same delete again finishes the job and the shard then
    passes check --hash."""
    path = tmp_path / "d.shard"
    objects = build_shard(path, make_blobs(31, 4000, 10, 2000))
    keys = list(objects)[:3000]
    proc = subprocess.Popen(SHARDFS + ["delete", "--yes", str(path), *keys],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Killed as soon as a key at either end of the list is gone (each delete
    # has its own fdatasync, so the rest is still to come): polled, not slept for.
    with shardfs.Shard(str(path)) as s:
        ends = [bytes.fromhex(k) for k in keys[:5] + keys[-5:]]
        started = wait_until(lambda: any(k not in s for k in ends) or proc.poll() is not None,
                             timeout=60, interval=0.0005)
    proc.kill()
    out, err = proc.communicate(timeout=60)
    assert started, "the delete deleted nothing in 60 s"
    assert proc.returncode == -signal.SIGKILL, f"the delete ended before the kill: {err.decode()}"
    check = run(SHARDFS + ["check", path])
    assert check.returncode == 0, check.stdout + check.stderr
    with shardfs.Shard(str(path)) as s:
        present = [k for k in objects if k in s]
        zeroed = [k for k in present if s[k] != objects[k]]
        assert len(zeroed) <= 1, zeroed
        assert all(s[k] == bytes(len(objects[k])) for k in zeroed)
        gone_keys = set(objects) - set(present)
        assert gone_keys <= set(keys)
    assert 0 < len(gone_keys) < len(keys), "the delete was not interrupted half-way"
    rest = [k for k in keys if k not in gone_keys]
    proc = run(SHARDFS + ["delete", "--yes", path, *rest], timeout=300)
    assert proc.returncode == 0, proc.stderr
    check = run(SHARDFS + ["check", "--hash", path])
    assert check.returncode == 0, check.stdout + check.stderr
    with shardfs.Shard(str(path)) as s:
        assert set(s.keys()) == {bytes.fromhex(k) for k in objects if k not in set(keys)}
    print(f"\n  delete killed after {len(gone_keys)} of {len(keys)} objects; shard valid")


# --------------------------------------------------------------- security


def _as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return run(["runuser", "-u", "nobody", "--", *argv])


@pytest.fixture
def public_dir():
    """A directory other users can traverse (pytest's tmp_path is 0700),
    for mount points; requested before `mounter` so it is removed after
    the unmounts."""
    top = Path(tempfile.mkdtemp(prefix="shardfs-perm-", dir="/tmp"))
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


@needs_fuse
def test_mount_is_private_read_only_and_fixed(tmp_path, public_dir, mounter):
    """Without allow_other only the mounting user gets in; with it, others
    read but never write. Modes are fixed (files 0444, directories 0555)
    whatever the shard file's mode; the mount is ro,nosuid,nodev; odd names
    never make the daemon open anything."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to act as another user")
    path = tmp_path / "p.shard"
    objects = build_shard(path, make_blobs(41, 300, 1, 3000))
    os.chmod(path, 0o600)
    key = next(iter(objects))
    top = public_dir
    private = mounter.mount([path], top / "private", "--layout", "fanout",
                            "--cache-dir", str(tmp_path / "cache"))
    assert "allow_other" not in run(["findmnt", "-no", "OPTIONS", private]).stdout
    proc = _as_nobody("cat", str(private / key))
    assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc
    shared = mounter.mount([path], top / "shared", "-o", "allow_other", "--layout", "fanout",
                           "--cache-dir", str(tmp_path / "cache"))
    proc = _as_nobody("sha256sum", str(shared / key))
    assert proc.returncode == 0 and proc.stdout.split()[0] == key, proc
    proc = _as_nobody("touch", str(shared / "x"))
    assert proc.returncode != 0 and "Read-only file system" in proc.stderr, proc
    for point in (private, shared):
        opts = set(run(["findmnt", "-no", "OPTIONS", point]).stdout.strip().split(","))
        assert {"ro", "nosuid", "nodev"} <= opts, opts
        assert stat.S_IMODE(os.stat(point).st_mode) == 0o555
        assert stat.S_IMODE(os.stat(point / key[:2]).st_mode) == 0o555
        assert stat.S_IMODE(os.stat(point / key).st_mode) == 0o444
    pid = daemon_pids(private)[0]
    fds_before = sorted(os.listdir(f"/proc/{pid}/fd"))
    for name in ["..", ".", "../../etc/passwd", "%2e%2e", "\\\\", key.upper(), key + "/", key[:-1],
                 "a" * 255, "00/../..", "-", "\n"]:
        for base in (private, private / key[:2], private / key[:2] / key[2:4]):
            try:
                os.stat(base / name)
            except OSError as exc:
                assert exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG), (name, exc)
    assert sorted(os.listdir(f"/proc/{pid}/fd")) == fds_before
    assert (private / key).read_bytes() == objects[key]
