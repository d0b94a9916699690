"""Helpers shared by the test suites that mount shards through the command
line: running commands with timeouts, reading the mount table, unmounting
whatever the state, finding the daemon, building shards, and a Mounter
that remembers what to tear down.

Nothing here mocks shardfs: mounts are made with ``python -m shardfs
mount`` and checked with /proc/self/mountinfo and ordinary tools.

The test modules import these names (``from mounting import ...``; pytest
puts tests/ on sys.path). shardfs itself is imported only when a shard is
built, so a module that skips without shardfs still skips cleanly.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

import pytest

SHARDFS = [sys.executable, "-m", "shardfs"]
TIMEOUT = 60  # seconds for an ordinary command; a hang must fail, not wedge the run
#: How many times slower than a plain build the C code runs here:
#: $SHARDFS_TEST_SLOWDOWN, set by `make test-tsan` (ThreadSanitizer's
#: instrumentation of every memory access). It multiplies the bounds on how
#: long C code takes to do its work (a scan of millions of slots), never
#: the bounds on whether it makes something else wait.
SLOWDOWN = float(os.environ.get("SHARDFS_TEST_SLOWDOWN", "1"))

#: Mark for tests (or ``pytestmark`` of modules) that mount: skipped where
#: FUSE is not usable.
needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3 (fuse3)",
)


def run(args: Sequence[str], check: bool = False, timeout: float = TIMEOUT, **kw) -> subprocess.CompletedProcess:
    """Run a command with a timeout, capturing text output."""
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def bash(script: str, *args: object, timeout: float = TIMEOUT) -> str:
    """Run a bash script (pipefail on) with positional arguments; its stdout."""
    proc = run(["bash", "-o", "pipefail", "-c", script, "bash", *map(str, args)], timeout=timeout)
    assert proc.returncode == 0, f"{script!r} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}"
    return proc.stdout


def _abs(path: os.PathLike) -> str:
    """`path` made absolute with its parent's symbolic links resolved."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def mount_info(path: os.PathLike) -> Optional[Dict[str, object]]:
    """The /proc/self/mountinfo entry of `path`: mount options, fstype,
    source and super options (FUSE's allow_other shows there)."""
    target = _abs(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4].replace("\\040", " ") == target:
                sep = fields.index("-")
                return {
                    "options": fields[5].split(","),
                    "fstype": fields[sep + 1],
                    "source": fields[sep + 2],
                    "super": fields[sep + 3].split(",") if len(fields) > sep + 3 else [],
                }
    return None


def mounted(path: os.PathLike) -> bool:
    """True when something is mounted on `path`, stale FUSE mounts included
    (os.path.ismount cannot stat a dead mount point and says False)."""
    return mount_info(path) is not None


def force_unmount(path: os.PathLike) -> None:
    """Unmount `path` whatever its state: shardfs umount, then the hammer."""
    if not mounted(path):
        return
    run(SHARDFS + ["umount", path])
    if mounted(path):
        run(["fusermount3", "-u", path])
    if mounted(path):
        run(["fusermount3", "-uz", path])
    assert not mounted(path), f"could not unmount {path}"


def daemon_pids(mountpoint: os.PathLike) -> List[int]:
    """Pids of the coordinators serving `mountpoint`: the processes named
    shardfs-coord (a background mount's coordinator, a child of its
    supervisor), else the mount's processes whose parent is not one of
    them (a mount without a supervisor); workers left out (see
    `mount_processes`)."""
    pids = mount_processes(mountpoint)
    return coordinator_pids(mountpoint) or [p for p in pids if _ppid(p) not in pids]


def coordinator_pids(mountpoint: os.PathLike) -> List[int]:
    """Pids of the processes named shardfs-coord serving `mountpoint` (a
    background mount's coordinator; none between one's death and the next
    one's start). A child it just forked, not named yet (a worker, the
    sidecar builder), is left out."""
    return [p for p in mount_processes(mountpoint)
            if _comm(p) == "shardfs-coord" and _comm(_ppid(p)) != "shardfs-coord"]


def supervisor_pids(mountpoint: os.PathLike) -> List[int]:
    """Pids of the supervisors of `mountpoint` (shardfs.fuse.supervisor:
    the background daemon, parent of the coordinator and the workers)."""
    return [p for p in mount_processes(mountpoint) if _comm(p) == "shardfs-mount"]


def kill_every_process(mountpoint: os.PathLike) -> List[int]:
    """kill -9 of every process of the mount at once (each stopped first,
    so that none acts on the death of another: a coordinator told of its
    supervisor's death would unmount); returns their pids."""
    pids = mount_processes(mountpoint)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    return pids


def default_workers() -> int:
    """Workers a mount gets when the test does not say: $SHARDFS_WORKERS,
    else the CPUs, at least 2 (as documented)."""
    env = os.environ.get("SHARDFS_WORKERS")
    return int(env) if env else max(2, len(os.sched_getaffinity(0)))


def worker_pids(mountpoint: os.PathLike) -> List[int]:
    """Pids of the worker processes serving `mountpoint` (the children,
    named shardfs-worker, of its supervisor or of its coordinator; the
    sidecar builder is left out)."""
    pids = mount_processes(mountpoint)
    return [p for p in pids if _ppid(p) in pids and _comm(p) == "shardfs-worker"]


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def mount_processes(mountpoint: os.PathLike) -> List[int]:
    """Pids of every shardfs process serving `mountpoint` (coordinator,
    workers, and the sidecar builder while it runs)."""
    want = _abs(mountpoint).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"shardfs.fuse.mount" in argv and want in argv:
            pids.append(int(entry))
    return pids


def gone(pid: int) -> bool:
    """True when process `pid` has exited (or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll `predicate` until it holds or `timeout` seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The only line of a failed command's stderr."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def mount_fails(args: Sequence[str], *needles: str) -> str:
    """Run ``shardfs mount ARGS``: it must fail with one stderr line holding
    every needle; that line."""
    proc = run(SHARDFS + ["mount", *args])
    assert proc.returncode != 0
    line = one_error_line(proc)
    for needle in needles:
        assert needle in line, line
    return line


def files_by_key(sources: Sequence[str]) -> Dict[str, str]:
    """{SHA-256 hex: path} of the regular files under the directories
    `sources` (symbolic links left out): what `shardfs create` of them
    holds."""
    out = {}
    for source in sources:
        for root, _, names in os.walk(source):
            for name in names:
                path = os.path.join(root, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    out[hashlib.sha256(Path(path).read_bytes()).hexdigest()] = path
    return out


def key_of(data: bytes) -> str:
    """The shard key of `data`: its SHA-256, in hex."""
    return hashlib.sha256(data).hexdigest()


def make_blobs(seed: int, count: int, low: int = 0, high: int = 64, tag: bytes = b"") -> List[bytes]:
    """`count` distinct blobs of low..high-1 random bytes after a tag and
    a 4-byte counter (so they never collide)."""
    rng = random.Random(seed)
    return [tag + i.to_bytes(4, "big") + rng.randbytes(rng.randrange(low, high)) for i in range(count)]


def prefixed_blobs(prefix: str, count: int, tag: bytes = b"") -> List[bytes]:
    """`count` distinct blobs (`tag` and a 4-byte counter) whose keys start
    with the hex `prefix` (about 16**len(prefix) tries each)."""
    out, i = [], 0
    while len(out) < count:
        data = tag + i.to_bytes(4, "big")
        if key_of(data).startswith(prefix):
            out.append(data)
        i += 1
    return out


def build_shard(path: Path, blobs: Iterable[bytes]) -> Dict[str, bytes]:
    """Write a shard of `blobs` keyed by SHA-256; returns hex key -> bytes."""
    import shardfs  # here, not at the top: see the module docstring

    objects: Dict[str, bytes] = {}
    with shardfs.ShardWriter(str(path)) as w:
        for data in blobs:
            key = key_of(data)
            if key not in objects:
                w.add(bytes.fromhex(key), data)
                objects[key] = data
    return objects


Sources = Union[os.PathLike, str, Sequence[Union[os.PathLike, str]]]


def _paths(sources: Sources) -> List[str]:
    """One shard path or a sequence of them, as a list of strings."""
    if isinstance(sources, (str, bytes, os.PathLike)):
        return [os.fsdecode(sources)]
    return [os.fsdecode(s) for s in sources]


class Mounter:
    """Mounts through the command line and remembers what to clean up."""

    def __init__(self) -> None:
        self.points: List[Path] = []
        self.procs: List[subprocess.Popen] = []

    def mount(self, sources: Sources, mountpoint: Path, *extra: str) -> Path:
        """``shardfs mount EXTRA... SOURCES... MOUNTPOINT`` (one shard or a
        sequence, possibly empty); asserts success, returns the mount point."""
        proc = self.command(SHARDFS + ["mount", *extra, *_paths(sources), str(mountpoint)], mountpoint)
        assert proc.returncode == 0, f"mount failed: {proc.stderr.strip()}"
        assert mounted(mountpoint)
        return mountpoint

    def foreground(self, sources: Sources, mountpoint: Path, *extra: str) -> subprocess.Popen:
        """``shardfs mount -f ...`` left running; returns it once it serves."""
        self._claim(mountpoint)
        proc = subprocess.Popen(
            SHARDFS + ["mount", "-f", *extra, *_paths(sources), str(mountpoint)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        assert wait_until(lambda: mounted(mountpoint) or proc.poll() is not None), "foreground mount never appeared"
        assert proc.poll() is None, f"foreground mount exited: {proc.communicate()}"
        os.listdir(mountpoint)  # answers: the filesystem is serving
        return proc

    def command(self, argv: Sequence[str], mountpoint: Path, **kw) -> subprocess.CompletedProcess:
        """Run any command that mounts on `mountpoint` (created if missing);
        the mount point is unmounted at cleanup whatever happens."""
        self._claim(mountpoint)
        return run(argv, **kw)

    def _claim(self, mountpoint: Path) -> None:
        """Create `mountpoint` if missing and remember it for cleanup."""
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.points.append(mountpoint)

    def cleanup(self) -> None:
        """Stop foreground mounts (SIGTERM, then SIGKILL), then unmount every
        mount point, newest first; raises the first failure at the end."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        errors = []
        for point in reversed(self.points):
            try:
                force_unmount(point)
            except Exception as exc:  # keep unmounting the others
                errors.append(exc)
        if errors:
            raise errors[0]
