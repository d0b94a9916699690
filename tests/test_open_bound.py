"""More shards than a process may keep open: shards open on demand through
a bounded cache (least recently used closed first), in the Python set and
in a real mount run under a low descriptor limit (RLIMIT_NOFILE). Every
object is still found and read, absent keys are not, each process of the
mount stays within its bound, a file open on a shard keeps reading it
while other shards push it out of the cache, and a shard replaced while
closed everywhere is served from its new file."""

from __future__ import annotations

import json
import os
import random
import resource
import sys
from pathlib import Path

import pytest

from mounting import SHARDFS, daemon_pids, mount_processes, needs_fuse, run, wait_until, worker_pids
from shardfs import ShardWriter
from shardfs import shard as shard_mod
from shardfs.shardset import FD_RESERVE, ShardSet, default_max_open
from shardfs.fuse.coordinator import KEEP_INTERVAL
from shardfs.gindex import IndexSet, index_dir

from test_global_index import sha

#: Shards of the mount test, objects in each.
SHARDS = 300
OBJECTS = 5
#: RLIMIT_NOFILE of the mount's processes: each keeps at most
#: LIMIT - LIMIT // 4 = 120 shards open (`default_max_open`).
LIMIT = 160
BOUND = LIMIT - min(FD_RESERVE, LIMIT // 4)


def objects_of(seed: int, n: int = OBJECTS) -> dict:
    rnd = random.Random(seed)
    blobs = [rnd.randbytes(rnd.randint(1, 64)) + b"#%d/%d" % (seed, i) for i in range(n)]
    return {sha(b): b for b in blobs}


def write(path: Path, objects: dict) -> None:
    with ShardWriter(path) as w:
        for key, data in objects.items():
            w.add(key, data)


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory):
    """SHARDS shards of OBJECTS objects in one directory: (directory,
    {file name: {key: bytes}})."""
    base = tmp_path_factory.mktemp("bound") / "shards"
    base.mkdir()
    contents = {}
    for i in range(SHARDS):
        name = f"s{i:04d}.shard"
        contents[name] = objects_of(i)
        write(base / name, contents[name])
    return base, contents


def test_default_bound_follows_the_descriptor_limit():
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    bound = default_max_open()
    assert 16 <= bound <= soft - min(FD_RESERVE, soft // 4)


def test_set_with_a_small_bound_finds_every_key(small_shards, tmp_path):
    base, contents = small_shards
    shards = ShardSet(cache_dir=str(tmp_path / "cache"), max_open=8)
    shards.index = IndexSet(index_dir(str(tmp_path / "cache"), "bound"))
    shards.index.load()
    names = sorted(contents)[:40]
    for name in names:
        shards.add(str(base / name))
    assert len(shards.open_shards) == 8  # the last 8 added
    # Not indexed yet: every shard is a candidate, opened in turn.
    for name in names[::9]:
        key, data = next(iter(contents[name].items()))
        member, _, _, size = shards.find(key)
        assert member.path == str(base / name) and size == len(data)
        assert len(shards.open_shards) <= 8
    shards.index.add_shards(((m.identity, m.shard) for m in shards.served()),
                            [m.identity for m in shards.served()])
    shards.reload_index()
    reopens = shards.reopens
    for name in names:
        for key, data in contents[name].items():
            member, _, data_offset, size = shards.find(key)
            assert member.shard.pread(data_offset, size, 0, size) == data
            assert len(shards.open_shards) <= 8
    assert shards.reopens > reopens  # the cache was too small: shards were opened again
    assert shards.find(sha(b"absent")) is None
    shards.close()


def test_lookups_open_shards_in_c_within_the_pool_bound(small_shards, tmp_path):
    """Past the bound, `find` opens the shard of a present key in C (the
    set's ShardPool), never through Python's cache of open shards, and
    stays within the pool's bound; a shard file replaced under its name
    while the pool had it closed is not opened in its place (its old keys
    are absent, the new file's keys too: it was never added), and a
    removed shard is never opened again."""
    base, contents = small_shards
    work = tmp_path / "shards"
    work.mkdir()
    for name in contents:
        os.link(base / name, work / name)
    shards = ShardSet(cache_dir=str(tmp_path / "cache"), max_open=32)
    pool_bound = shards.pool.stats()["bound"]
    assert pool_bound == 32 - 16 and shards.open_shards.capacity == 16
    shards.index = IndexSet(index_dir(str(tmp_path / "cache"), "pool"))
    shards.index.load()
    members = {name: shards.add(str(work / name)) for name in sorted(contents)}
    shards.index.add_shards(((m.identity, m.shard) for m in shards.served()),
                            [m.identity for m in shards.served()])
    shards.reload_index()
    reopens, opened = shards.reopens, len(shards.open_shards)
    for name in sorted(contents):
        for key, data in contents[name].items():
            member, _, _, size = shards.find(key)
            assert member is members[name] and size == len(data)
        assert shards.pool.stats()["open"] <= pool_bound
    stats = shards.pool.stats()
    assert shards.reopens == reopens and len(shards.open_shards) == opened  # not one open through Python
    assert stats["opens"] >= SHARDS - opened - pool_bound and stats["evictions"] > 0, stats
    assert stats["open"] == pool_bound

    # Replaced while the pool has it closed (every other shard read since).
    victim = sorted(contents)[3]
    replacement = objects_of(50_000)
    write(tmp_path / "new.shard", replacement)
    for name in sorted(contents)[10:10 + 2 * pool_bound]:
        shards.find(next(iter(contents[name])))
    os.rename(tmp_path / "new.shard", work / victim)
    shards.open_shards.clear()  # Python's copy, were it open, would read the old file
    opens = shards.pool.stats()["opens"]
    for key in contents[victim]:
        assert shards.find(key) is None
    assert shards.find(next(iter(replacement))) is None
    assert shards.pool.stats()["opens"] == opens  # the new file was opened, and refused, every time

    # Removed: never opened again.
    gone = members[sorted(contents)[5]]
    shards.remove(gone)
    for key in contents[sorted(contents)[5]]:
        assert shards.find(key) is None
    assert shards.pool.stats()["opens"] == opens
    shards.close()
    assert shards.pool.stats()["open"] == 0


def test_a_shard_directory_opens_with_every_shard_indexed(small_shards, tmp_path, monkeypatch):
    """`open_shard_set` (what a mount opens before it answers) indexes the
    shards as it opens them, so a lookup asks the one shard holding its
    key from the first lookup on, not every shard not yet indexed by the
    background builder; with the index left by that open, a second open
    indexes nothing again and finds the same."""
    from shardfs.shardset import open_shard_set

    monkeypatch.delenv("SHARDFS_TEST_NO_BUILDS", raising=False)
    base, contents = small_shards
    levels = []
    for attempt in range(2):
        shards = open_shard_set([], str(base), str(tmp_path / "cache"))
        assert shards.index.stats()["indexed_shards"] == SHARDS
        assert all(m.indexed for m in shards.served())
        shards.probes = 0
        for name in sorted(contents)[::7]:
            for key, data in contents[name].items():
                member, _, _, size = shards.find(key)
                assert member.path == str(base / name) and size == len(data)
        assert shards.find(sha(b"absent")) is None
        assert shards.probes <= len(sorted(contents)[::7]) * OBJECTS + 1
        levels.append(sorted(os.listdir(shards.index.directory)))
        shards.close()
    assert levels[0] == levels[1]  # the second open wrote nothing


def test_a_process_forked_while_lookups_open_shards_can_open_them(small_shards, tmp_path):
    """A mount forks its workers from the coordinator, and the workers keep
    its pool of shards: a fork while other threads open and close shards in
    the pool (a pool of 4 for 300 shards: every lookup opens one) must leave
    the child a pool it can use, never a lock another thread held."""
    base, contents = small_shards
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, sys, threading\n"
        "from shardfs.shardset import ShardSet\n"
        "from shardfs.gindex import IndexSet, index_dir\n"
        f"shards = ShardSet(cache_dir={str(tmp_path / 'cache')!r}, max_open=20)\n"
        f"shards.index = IndexSet(index_dir({str(tmp_path / 'cache')!r}, 'fork'))\n"
        "shards.index.load()\n"
        "keys = [bytes.fromhex(k) for k in sys.argv[2:]]\n"
        "for p in sorted(os.listdir(sys.argv[1])):\n"
        "    shards.add(os.path.join(sys.argv[1], p))\n"
        "shards.index.add_shards(((m.identity, m.shard) for m in shards.served()), [m.identity for m in shards.served()])\n"
        "shards.reload_index()\n"
        "resolver = shards.resolver()\n"
        "stop = False\n"
        "def hammer():\n"
        "    i = 0\n"
        "    while not stop:\n"
        "        assert resolver.find(keys[i % len(keys)])[0] == 0\n"
        "        i += 7\n"
        "threads = [threading.Thread(target=hammer) for _ in range(3)]\n"
        "for t in threads: t.start()\n"
        "for n in range(150):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        ok = all(resolver.find(k)[0] == 0 for k in keys[n % 50::50])\n"
        "        os._exit(0 if ok else 1)\n"
        "    assert os.waitpid(pid, 0)[1] == 0, n\n"
        "stop = True\n"
        "for t in threads: t.join()\n"
        "print('ok', shards.pool.stats()['evictions'] > 0)\n")
    keys = [k.hex() for name in sorted(contents) for k in contents[name]]
    proc = run([sys.executable, str(script), str(base), *keys], check=False, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok True", proc.stdout + proc.stderr


def test_set_never_holds_more_than_its_bound_even_for_a_moment(small_shards, tmp_path):
    """A shard is opened only once there is room for it: with descriptors
    for exactly `max_open` shards left, a set opens every shard in turn (an
    open before the eviction would fail with EMFILE)."""
    base, contents = small_shards
    script = tmp_path / "bound.py"
    script.write_text(
        "import os, resource, sys\n"
        "from shardfs.shardset import ShardSet\n"
        f"shards = ShardSet(cache_dir={str(tmp_path / 'cache')!r}, max_open=8)\n"
        "paths = sys.argv[1:]\n"
        "members = [shards.add(p) for p in paths[:8]]\n"  # opens 8: the bound
        "free = os.open('/dev/null', os.O_RDONLY)\n"  # the lowest free descriptor
        "os.close(free)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (free, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "for p in paths[8:]:\n"  # each open must first close one
        "    member = shards.add(p)\n"
        "    assert len(shards.open_shards) <= 8\n"
        "for member in members:\n"  # closed since: opened again
        "    shards.open_shard(member)\n"
        "    assert len(shards.open_shards) <= 8\n"
        "print('ok')\n")
    names = sorted(contents)[:40]
    proc = run([sys.executable, str(script), *(str(base / n) for n in names)], check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_out_of_descriptors_is_an_error_never_an_absent_key(small_shards, tmp_path):
    """A shard that cannot be opened for want of descriptors (EMFILE) is no
    reason to answer that a present key is absent: the API raises OSError
    and the handlers EIO (the kernel caches no negative entry), and both
    find the key once descriptors are free again."""
    base, contents = small_shards
    name = sorted(contents)[0]
    key, data = next(iter(contents[name].items()))
    script = tmp_path / "emfile.py"
    script.write_text(
        "import errno, os, resource, sys\n"
        "from shardfs.shardset import ShardSet\n"
        "from shardfs.fuse.handlers import FUSEError, ShardFS\n"
        "from shardfs.fuse.layout import ROOT_INODE\n"
        f"shards = ShardSet(cache_dir={str(tmp_path / 'cache')!r}, max_open=2)\n"
        "members = [shards.add(p) for p in sys.argv[2:]]\n"  # shards 4 and 5 stay open
        "shards.open_shards.capacity = 100\n"  # no room to make: the open needs a new descriptor
        "fs = ShardFS(shards)\n"
        "key = bytes.fromhex(sys.argv[1])\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "free = os.open('/dev/null', os.O_RDONLY)\n"
        "os.close(free)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (free, hard))\n"
        "try:\n"
        "    shards.find(key)\n"
        "    print('find: no error')\n"
        "except OSError as exc:\n"
        "    print('find:', errno.errorcode[exc.errno])\n"
        "try:\n"
        "    print('lookup:', fs.lookup(ROOT_INODE, sys.argv[1].encode()))\n"
        "except FUSEError as exc:\n"
        "    print('lookup:', errno.errorcode[exc.errno])\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
        "print('found:', shards.find(key)[0].path == sys.argv[2])\n"
        "print('lookup again:', fs.lookup(ROOT_INODE, sys.argv[1].encode()) is not None)\n")
    paths = [str(base / n) for n in sorted(contents)[:6]]
    proc = run([sys.executable, str(script), key.hex(), *paths], check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["find: EMFILE", "lookup: EIO", "found: True", "lookup again: True"], \
        proc.stdout + proc.stderr


@needs_fuse
def test_shards_closed_by_one_handler_are_let_go_at_once(small_shards, mounter, tmp_path):
    """A lookup that opens many shards in one handler call (no sidecar nor
    index yet: every shard is a candidate) closes as many to stay within
    the bound; the snapshot of the requests answered in C must not keep
    them open until the handler returns, or the process runs out of
    descriptors and present keys fail."""
    _, contents = small_shards
    shard_dir, point = _mount_limited(small_shards, mounter, tmp_path,
                                      dict(os.environ, SHARDFS_TEST_NO_BUILDS="1", SHARDFS_WORKERS="1"))
    names = sorted(contents)
    # The last shard's key: every shard opened in turn, the last BOUND kept
    # (and published to the requests answered in C).
    for name in (names[-1], names[SHARDS // 2], names[0], names[-1]):
        key, data = next(iter(contents[name].items()))
        assert (point / key.hex()).read_bytes() == data, name
    for pid in worker_pids(point):
        assert _open_shard_files(pid, shard_dir) <= BOUND


def _stats(point: Path) -> dict:
    return json.loads(os.getxattr(point, "user.shardfs.stats"))


def _open_shard_files(pid: int, shard_dir: Path) -> int:
    """Descriptors of process `pid` open on files of `shard_dir`."""
    fd_dir = f"/proc/{pid}/fd"
    count = 0
    for name in os.listdir(fd_dir):
        try:
            count += os.readlink(os.path.join(fd_dir, name)).startswith(str(shard_dir) + "/")
        except OSError:
            pass
    return count


def _has_open(pid: int, path: Path) -> bool:
    """Whether process `pid` has a descriptor open on `path`."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(os.path.join(fd_dir, name)) == str(path):
                return True
        except OSError:
            pass
    return False


def _mapped_shard_files(pid: int, shard_dir: Path) -> int:
    """Distinct files of `shard_dir` mapped by process `pid`."""
    with open(f"/proc/{pid}/maps") as f:
        return len({line.split(None, 5)[5].strip() for line in f
                    if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith(str(shard_dir) + "/")})


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _mount_limited(small_shards, mounter, tmp_path: Path, env=None) -> tuple:
    """Mount a directory of links to the SHARDS shards (flat layout) under
    RLIMIT_NOFILE LIMIT: (its shard directory, the mount point)."""
    base, contents = small_shards
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for name in contents:
        os.link(base / name, shard_dir / name)
    point = tmp_path / "m"
    proc = mounter.command(SHARDFS + ["mount", "--shard-dir", str(shard_dir), "--layout", "flat",
                                      "--cache-dir", str(tmp_path / "cache"), str(point)],
                           point, preexec_fn=_limit_descriptors, env=env)
    assert proc.returncode == 0, proc.stderr
    return shard_dir, point


@needs_fuse
def test_mount_serves_more_shards_than_it_may_open(small_shards, mounter, tmp_path):
    _, contents = small_shards
    shard_dir, point = _mount_limited(small_shards, mounter, tmp_path)
    assert wait_until(lambda: (_stats(point)["index"] or {}).get("indexed_shards") == SHARDS, timeout=60), \
        _stats(point)

    # Every object of every shard, by name; absent names are not there.
    for name in sorted(contents):
        for key, data in contents[name].items():
            assert (point / key.hex()).read_bytes() == data
    for i in range(200):
        with pytest.raises(FileNotFoundError):
            os.stat(point / sha(b"absent %d" % i).hex())
    processes = mount_processes(point)
    assert len(processes) >= 2
    for pid in processes:
        assert len(os.listdir(f"/proc/{pid}/fd")) <= LIMIT
        assert _open_shard_files(pid, shard_dir) <= BOUND, pid
        assert _mapped_shard_files(pid, shard_dir) <= BOUND, pid
    # The workers opened more shards than they may keep: the bound was used
    # (a worker's pool evicted; the stats come from whichever answers).
    pool = _stats(point)["pool"]
    assert pool["opens"] > pool["bound"] and pool["evictions"] > 0, pool

    # A file open on a shard keeps reading it while every other shard is
    # read (pushing it out of any cache), and after its file is replaced.
    # (In no-open mode the mount learns of open files from /proc, every
    # KEEP_INTERVAL seconds, longer when the look is slow (a loaded
    # machine): then the coordinator keeps the shard open; a worker may
    # have it open before, and close it to open others.)
    victim = sorted(contents)[7]
    key, data = next(iter(contents[victim].items()))
    with open(point / key.hex(), "rb", buffering=0) as held:
        for name in sorted(contents):
            for k in contents[name]:
                os.stat(point / k.hex())
        assert os.pread(held.fileno(), len(data) + 10, 0) == data
        assert wait_until(lambda: any(_has_open(pid, shard_dir / victim) for pid in daemon_pids(point)),
                          timeout=30 * KEEP_INTERVAL), "the coordinator does not keep open the shard of an open file"
        replacement = objects_of(10_000)
        write(tmp_path / "replacement.shard", replacement)
        os.rename(tmp_path / "replacement.shard", shard_dir / victim)
        new_key = next(iter(replacement))
        assert wait_until(lambda: (point / new_key.hex()).exists(), timeout=10)
        assert wait_until(lambda: not (point / key.hex()).exists(), timeout=10)
        assert os.pread(held.fileno(), len(data) + 10, 0) == data
    assert (point / new_key.hex()).read_bytes() == replacement[new_key]

    # A shard replaced while no process has it open: its new objects are
    # served, its old ones are gone.
    cold = sorted(contents)[150]
    for name in sorted(contents)[200:]:  # push it out of every cache
        for k in contents[name]:
            os.stat(point / k.hex())
    fresh = objects_of(20_000)
    kept_key, kept = next(iter(contents[cold].items()))
    fresh[kept_key] = kept  # also in the new file: a new inode, the same bytes
    write(tmp_path / "fresh.shard", fresh)
    os.rename(tmp_path / "fresh.shard", shard_dir / cold)
    fresh_key = next(iter(fresh))
    assert wait_until(lambda: (point / fresh_key.hex()).exists(), timeout=10)
    assert (point / fresh_key.hex()).read_bytes() == fresh[fresh_key]
    # The kernel cached the old names: they are looked up again, not
    # answered from the old shard's inodes.
    assert (point / kept_key.hex()).read_bytes() == kept
    # The coordinator publishes the new file, then invalidates the old
    # names (in that order, so that no lookup caches them again from the
    # old table): they go within moments of the new file being served.
    old_keys = [k for k in contents[cold] if k != kept_key]
    assert wait_until(lambda: not any((point / k.hex()).exists() for k in old_keys), timeout=10)
    assert run(SHARDFS + ["umount", str(point)]).returncode == 0


def test_progress_lines_keep_a_slow_start_alive(monkeypatch):
    """A daemon that reports progress (as one opening 100,000 shards does)
    is waited for past READY_TIMEOUT; each report reaches the caller."""
    import subprocess
    import threading
    import time

    from shardfs.fuse import mount as mount_mod

    monkeypatch.setattr(mount_mod, "READY_TIMEOUT", 1.5)
    rfd, wfd = os.pipe()
    child = subprocess.Popen(["sleep", "30"])
    seen = []

    def daemon():
        for done in (100, 200, 300, 400):
            time.sleep(0.5)  # 2 s in all: more than READY_TIMEOUT, 1 s spare each (a loaded machine)
            os.write(wfd, b"progress %d 400\n" % done)
        os.write(wfd, b"ok\n")

    writer = threading.Thread(target=daemon)
    writer.start()
    try:
        assert mount_mod._wait_ready(rfd, child, lambda d, t: seen.append((d, t))) == "ok"
        assert seen == [(100, 400), (200, 400), (300, 400), (400, 400)]
        assert child.poll() is None  # never taken for a hung daemon
    finally:
        writer.join()
        child.kill()
        child.wait()
        os.close(rfd)
        os.close(wfd)
    # Without reports, the same wait gives up after READY_TIMEOUT.
    rfd, wfd = os.pipe()
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert mount_mod._wait_ready(rfd, child) is None
        assert child.wait(timeout=5) is not None  # terminated
    finally:
        child.kill()
        os.close(rfd)
        os.close(wfd)


@needs_fuse
def test_lookups_of_shards_not_open_are_answered_from_their_records(small_shards, mounter, tmp_path):
    """Once the builder wrote the lookup records, a mount whose processes
    may each open BOUND of the SHARDS shards stats every present name, and
    answers every absent one, without opening a shard (the pool's opens
    do not move), reads open them, and a takedown told by `shardfs
    delete` is gone from the records at once."""
    _, contents = small_shards
    shard_dir, point = _mount_limited(small_shards, mounter, tmp_path, dict(os.environ, SHARDFS_WORKERS="1"))
    assert wait_until(lambda: (_stats(point)["records"] or {}).get("recorded_shards") == SHARDS, timeout=60), \
        _stats(point)
    before = _stats(point)["pool"]
    names = sorted(contents)
    for name in names:
        for key, data in contents[name].items():
            assert os.stat(point / key.hex()).st_size == len(data)
    for i in range(200):
        with pytest.raises(FileNotFoundError):
            os.stat(point / sha(b"absent %d" % i).hex())
    after = _stats(point)["pool"]
    assert after["opens"] == before["opens"], (before, after)
    for pid in worker_pids(point):
        assert _open_shard_files(pid, shard_dir) <= BOUND
    # Deleted under the mount without telling it (the API, not `shardfs
    # delete`): a file opened before reads no zeros in place of the object.
    quiet = names[200]
    key, data = next(iter(contents[quiet].items()))
    fd = os.open(point / key.hex(), os.O_RDONLY)  # not Python's open(): its ioctl would store the object
    try:
        assert shard_mod.delete(shard_dir / quiet, [key]) == 1
        try:
            got = os.pread(fd, len(data), 0)
        except OSError:
            got = None
        assert got is None, got
    finally:
        os.close(fd)
    del contents[quiet][key]

    # Reads open the shard's file, and only that (read by offset: no
    # mapping, no perfect hash): every byte is right.
    for name in names:
        for key, data in contents[name].items():
            assert (point / key.hex()).read_bytes() == data
    pool = _stats(point)["pool"]
    assert pool["opens"] > after["opens"] and pool["mapped"] == 0, pool
    for pid in worker_pids(point):
        assert _open_shard_files(pid, shard_dir) <= BOUND
        # what Python's own cache of open shards holds (its start's), not the pool's
        assert _mapped_shard_files(pid, shard_dir) <= max(min(BOUND, 16), BOUND // 4), pid

    # A takedown: gone for names the kernel did not cache, and for those it did.
    victim = names[100]
    gone, kept = list(contents[victim])[:2], list(contents[victim])[2:]
    os.stat(point / gone[0].hex())
    r = run(SHARDFS + ["delete", "--yes", str(shard_dir / victim)] + [k.hex() for k in gone])
    assert r.returncode == 0, r.stderr
    for key in gone:
        assert not (point / key.hex()).exists()
    for key in kept:
        assert (point / key.hex()).read_bytes() == contents[victim][key]
    assert run(SHARDFS + ["umount", str(point)]).returncode == 0
