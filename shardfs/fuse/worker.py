"""A worker process: serves requests of the mount's FUSE connection.

The coordinator (`shardfs.fuse.coordinator`) forks the workers once the
kernel's INIT request was answered, so each inherits the FUSE session, the
filesystem and the shard set as they were then. A worker:

1. asks the kernel to end it with its coordinator (``PR_SET_PDEATHSIG``):
   no worker outlives a killed coordinator;
2. serves its own clone of the FUSE device (``FUSE_DEV_IOC_CLONE`` on a
   fresh ``/dev/fuse``, made by the coordinator before the fork and put
   over the session's descriptor with ``dup2``), read by every thread of
   its loop. The coordinator keeps a copy: if the worker dies, the
   requests it had read stay with the kernel, which the coordinator asks
   to queue them again (``FUSE_NOTIFY_RESEND``, `shardfs.fuse.supervisor.resend`) for the other
   workers before it lets its copy go; on a kernel without it, letting go
   ends them with ECONNABORTED (no caller waits for ever);
3. runs the C request path (``Session.serve``: libfuse's multithreaded
   loop, the GIL released) until the mount ends. Requests C cannot answer
   alone call the handlers (`shardfs.fuse.handlers.ShardFS`), one at a
   time in this process.

Before each request that reaches Python, `WorkerHooks.begin` brings the
worker's shard set up to date with the table the coordinator publishes
(`shardfs.fuse.shared`) when its sequence changed: shards added
(described: a worker opens a shard when it first uses one, by path, and
checks that the path still names the file the coordinator validated),
removed, closed, and sidecars built. The worker exits 0 when the session
ends (the filesystem was unmounted).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import struct
import sys
from typing import Any, Dict

from shardfs.fuse import supervisor as supervisor_mod
from shardfs.fuse.handlers import RequestHooks, ShardFS
from shardfs.shardset import MountedShard, ShardSet
from shardfs.fuse.shared import (HASH_PROBES, LOOKUPS, PY_HASH_PROBES, PY_LOOKUPS, PY_PROBES, PYTHON, PYTHON_KINDS,
                                 COORDINATOR_RESTARTS, RESTARTS, SEQ, SharedState)

log = logging.getLogger("shardfs.fuse")

#: ioctl(2) request attaching a /dev/fuse descriptor to the FUSE connection
#: of another one (its number as a u32): _IOR(229, 0, uint32_t), from the
#: kernel's include/uapi/linux/fuse.h.
FUSE_DEV_IOC_CLONE = 0x8004E500

#: Word of each handler's counter in a row's PYTHON_KINDS counters.
_PYTHON_INDEX = {kind: i for i, kind in enumerate(PYTHON_KINDS)}
_PYTHON_OTHER = _PYTHON_INDEX["other"]

#: Process names (/proc/PID/comm, what ps and top show) of a mount's
#: workers and of its sidecar builder; the coordinator keeps its own.
WORKER_NAME = b"shardfs-worker"
BUILDER_NAME = b"shardfs-sidecar"


class WorkerHooks(RequestHooks):
    """The hooks of a worker: its shard set follows the published table,
    its counters live in its row of the shared state."""

    def __init__(self, shards: ShardSet, state: SharedState, position: int, coordinator: int) -> None:
        super().__init__(shards)
        self.state = state
        self.position = position
        self.coordinator = coordinator
        self.words = state.words
        self.row = state.row(position)
        self.seen = -1  # the table sequence the shard set matches
        #: The shard set's lookups and probes already added to the row.
        self.last_lookups = self.last_probes = 0
        #: A winery mount's `shardfs.fuse.winery.WineryView`, which follows
        #: the table's "winery" part.
        self.winery: Any = None

    def begin(self, kind: str) -> None:
        # Requests are counted by the C request path, in this row; those
        # that reach the handlers once more, by handler. The handlers of a
        # worker run one at a time (the C side's lock): these words have one
        # writer, so a plain += loses nothing.
        words = self.words
        words[self.row + PYTHON + _PYTHON_INDEX.get(kind, _PYTHON_OTHER)] += 1
        if words[SEQ] > self.seen:  # below it: the first table is still being written (`run`)
            self.sync()

    def end(self) -> None:
        # Add what the shard set counted since the last request to the
        # row's Python words: the C request path adds to words of its own
        # (LOOKUPS, PROBES, HASH_PROBES) from its threads meanwhile, and
        # the readers add the two up (shared.py).
        words = self.words
        row = self.row
        lookups, probes = self.shards.lookups, self.shards.probes
        words[row + PY_LOOKUPS] += lookups - self.last_lookups
        words[row + PY_PROBES] += probes - self.last_probes
        self.last_lookups, self.last_probes = lookups, probes
        if self.shards.hashes is not None:
            hashed = self.shards.hashes.probes
            words[row + PY_HASH_PROBES] += hashed - self.last_hash_probes
            self.last_hash_probes = hashed

    def requests(self) -> Dict[str, int]:
        return self.state.requests()

    def python_requests(self) -> Dict[str, int]:
        return self.state.python_requests()

    def lookups(self) -> "tuple[int, int]":
        return self.state.lookups()

    def pushes(self) -> "tuple[int, int]":
        return self.state.pushes()

    def hash_probes(self) -> int:
        return self.state.hash_probes()

    def per_process(self) -> "list[int]":
        return self.state.per_position()

    def restarts(self) -> int:
        return self.state.words[RESTARTS]

    def coordinator_restarts(self) -> int:
        return self.state.words[COORDINATOR_RESTARTS]

    def written(self) -> Dict[str, int]:
        return self.state.written()

    def start(self) -> None:
        """Take over the row (a replacement keeps counting from the totals
        of the worker it replaces: only what its shard set counts from now
        on is added)."""
        self.last_lookups, self.last_probes = self.shards.lookups, self.shards.probes
        self.last_hash_probes = self.shards.hashes.probes if self.shards.hashes is not None else 0

    def wait_for_publish(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds for the coordinator to publish a
        table newer than the one served, and take it; True if it did."""
        import time

        deadline = time.monotonic() + timeout
        while self.words[SEQ] <= self.seen:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        self.sync()
        return True

    def sync(self) -> None:
        """Make the shard set what the coordinator last published."""
        seq, table, change = self.state.read_change(self.seen)
        apply_table(self.shards, table, self.coordinator, change=change)
        if self.winery is not None:
            self.winery.update_from_table(table.get("winery", {}))
        self.seen = seq


def apply_table(shards: ShardSet, table: Dict[str, Any], coordinator: int, change: bool = False) -> None:
    """Change `shards` to match a published shard table (see
    `shardfs.fuse.coordinator.Coordinator.table`): add the shards it serves
    or holds that `shards` lacks (described, not opened: they open when
    used; a file opened through another process may be read through this
    one), mark removed ones, take the sidecars it names, and forget the shards
    it no longer lists. A shard the coordinator holds open (removed, with
    files open on it) is opened again through the coordinator's own
    descriptor, ``/proc/<coordinator>/fd/<n>``: the very file it served,
    whatever its path names now. `change`: `table` is the change from the
    table `shards` matches (`shardfs.fuse.shared.SharedState.read_change`:
    the entries added or changed, and "gone", the numbers to forget)."""
    listed = set()
    for entry in table["shards"]:
        number = entry["number"]
        listed.add(number)
        member = shards.get(number)
        if member is None:
            if entry["removed"] and entry["fd"] is None:
                continue  # not held by the coordinator: no file is open on it
            # A removed shard the coordinator holds is added too: files
            # opened through another process are read through this one.
            member = shards.add_entry(MountedShard(
                number, entry["path"], tuple(entry["ident"]), entry["objects_count"], entry["slot_count"],
                entry["extent"], entry["mtime"], identity=bytes.fromhex(entry["identity"]),
                winery_shard=entry.get("winery_shard")))
        member.live_count = entry["live_count"]
        member.hashes = tuple(entry.get("hashes", ()))
        if entry["fd"] is not None:
            member.source = "/proc/%d/fd/%d" % (table.get("pid", coordinator), entry["fd"])
        if entry["removed"]:
            shards.remove(member)
        elif member.sidecar_dir is None and entry["sidecar_dir"]:
            if member.indexed:  # needed for listings only: loaded then
                member.sidecar_dir = entry["sidecar_dir"]
                shards.version += 1
            else:
                shards.sidecar_built(member, entry["sidecar_dir"])
    gone = (shards.get(number) for number in table["gone"]) if change else \
        (member for member in list(shards.shards.values()) if member.number not in listed)
    for member in list(gone):
        if member is not None:
            shards.discard(member)
    if "index" in table:
        shards.reload_index(table["index"])
    if "records" in table:
        shards.reload_records(table["records"])
    if shards.hashes is not None and "hashing" in table:
        shards.hashes.progress = tuple(table["hashing"])
        shards.hashes.reload(table["hash_levels"])
        shards.hashes.generation += 1  # shards' `hashes` may have changed


def open_clone(session_fd: int) -> int:
    """A new /dev/fuse descriptor (close-on-exec) attached to the
    connection of `session_fd` (``FUSE_DEV_IOC_CLONE``): requests read on
    it are answered on it, and the kernel ends those still unanswered
    when its last copy is closed. Raises OSError when the kernel
    refuses."""
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, FUSE_DEV_IOC_CLONE, struct.pack("I", session_fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_worker(pid: int) -> bool:
    """True when process `pid` runs and is a worker of a mount (by its
    name, WORKER_NAME): not a zombie, not another process that got the
    pid since."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    name, _, rest = stat.partition(b"(")[2].rpartition(b")")
    return name == WORKER_NAME and rest.split()[:1] != [b"Z"]


def _wait_adopted(middle: int, supervisor: int) -> None:
    """In a worker forked by `middle` (a child of the coordinator that
    exits at once): wait until the kernel gave this process to the mount's
    `supervisor` (its subreaper), at most 10 s; exit if it did not."""
    import time

    deadline = time.monotonic() + 10
    while os.getppid() == middle and time.monotonic() < deadline:
        time.sleep(0.0005)
    if os.getppid() != supervisor:
        os._exit(1)


def _die_with(parent: int, name: bytes) -> None:
    """Be killed when `parent` (this process's parent: the supervisor or
    the coordinator) dies, exit now if it already has, and take the
    process name `name` (at most 15 bytes)."""
    supervisor_mod.die_with_parent(signal.SIGKILL, parent)
    supervisor_mod.set_name(name)


def run(fs: ShardFS, session: Any, state: SharedState, position: int, coordinator: int, threads: int,
        close_fds: "tuple[int, ...]" = (), published: int = -1, clone: int = -1, supervisor: int = 0,
        middle: int = 0) -> None:
    """Body of a freshly forked worker; never returns (exits the process:
    0 when the session ended, 1 on error). `session` is the mount's
    `shardfs._shardfs.Session`; `threads` the most threads serving;
    `published` the sequence of the table the forked shard set matches
    (`Coordinator._spawn`), -1 when unknown; it may be ahead of the
    published sequence (a new mount writes its first table once the
    workers serve): the worker then waits for nothing, its set is that
    table's. `clone`: the worker's own descriptor of the connection
    (`open_clone`, made by the coordinator, which keeps a copy so that
    what this worker read is not lost if it dies), put in place of the
    session's; -1: the worker makes its own. `supervisor`: the pid of the
    mount's supervisor (`shardfs.fuse.supervisor`), whose child this
    process becomes (once `middle`, the child of the coordinator that forked
    it, exited) and with which it dies; 0: it dies with `coordinator`, its
    parent."""
    status = 1
    try:
        if supervisor:
            supervisor_mod.set_name(WORKER_NAME)  # at once: what ps shows while it waits
            _wait_adopted(middle, supervisor)
        _die_with(supervisor or coordinator, WORKER_NAME)
        for signum in (signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # the coordinator's business
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for fd in close_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if clone < 0:
            clone = open_clone(session.fileno())
        os.dup2(clone, session.fileno(), inheritable=False)
        os.close(clone)
        hooks = WorkerHooks(fs.shards, state, position, coordinator)
        fs.hooks = hooks
        if fs.winery is not None:
            fs.winery.attach(state, position)
            fs.winery.wait_for_table = hooks.wait_for_publish
            hooks.winery = fs.winery
        hooks.start()
        if fs.winery is None and published >= 0:
            hooks.seen = published  # forked with the set of that table: only what changed since is read
        if hooks.words[SEQ] > hooks.seen:
            hooks.sync()
        log.debug("worker %d (position %d) serving with up to %d threads", os.getpid(), position, threads)
        row = state.row(position)
        # The C request path's own words (stats[0..4] of ll_fast.c); the
        # handlers count in the row's PY_ words (end above).
        rc = session.serve(threads, counts=state.counts(position), seq=state.words[SEQ:SEQ + 1],
                           stats=state.words[row + LOOKUPS:row + HASH_PROBES + 1], hist=state.hist(position),
                           io=state.io(position))
        status = 0 if rc == 0 else 1
        if fs.winery is not None:
            fs.winery.close()  # this worker's database connections
    except OSError as exc:
        if exc.errno not in (errno.ENODEV, errno.ECONNABORTED):
            log.error("worker %d (position %d): %s", os.getpid(), position, exc)
        else:
            status = 0
    except BaseException:
        log.exception("worker %d (position %d) failed", os.getpid(), position)
    finally:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
