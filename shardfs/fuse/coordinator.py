"""The coordinator: owns a mount's global state and keeps its workers alive.

One process per mount mounts the filesystem, answers the kernel's INIT
request, then forks the worker processes (`shardfs.fuse.worker`) that
serve every other request, and from then on serves none itself. It owns
what must be decided in one place:

* **The shard set.** Shards are numbered here only; the table of served
  shards is published in shared memory (`shardfs.fuse.shared`) and every
  worker brings its copy up to date before its next request, so an inode
  names the same object in every worker at every moment.
* **Following the files.** inotify on the shard directory and on the
  directories of the shards named at mount, and SIGHUP: new shards are
  served, vanished ones removed, a shard replaced in place (renamed over)
  is served from the new file while files opened on the old one keep
  reading it; the old one is closed once no process has a file open on it
  (objects are served in no-open mode, so the mount is not told when a
  file is opened or closed: `open_object_inodes` looks at every process's
  open files instead).
* **Takedowns.** When a served shard file is written (``shardfs delete``
  works in place), its sidecar's slots are checked against the index (in
  C, in a thread: the loop goes on meanwhile) and
  the inode of every object deleted since is invalidated in the kernel
  (attributes and cached pages), so it is gone from the mount within the
  live bound; the workers read the index slot at every OPEN and READ, so
  a deleted object cannot be opened or read again even before that. Block
  devices get no inotify event for writes made elsewhere (and their page
  cache does not see a remote writer): SIGHUP drops the device's cached
  pages and checks every shard. ``shardfs delete`` on this host does not
  wait for either: it tells the coordinator the keys it took down
  (`shardfs.fuse.control`) and returns once they are invalidated.
* **An RBD pool** (``--shard-dir rbd:POOL``): listed every
  `shardfs.rbd.POLL_SECONDS` in a child process (this process never starts
  librados's threads: it forks), images added and removed like files.
* **A winery database** (`catalog`, a `shardfs.winery.Catalog`), polled
  every `shardfs.winery.POLL_SECONDS` instead of following files: images of
  shards that reached an image state are served, and the keys it takes
  down are published to the workers (who refuse them from their next
  request on), then invalidated in the kernel (their names in every
  directory where they can be looked up, the inodes the mount gave them),
  so a takedown is gone from the mount within about two polls. A database
  that is down changes nothing: what is served stays served.
* **Sidecar builds**, one after the other in one forked process, which
  reports each on a pipe (a build may read a whole index: the coordinator
  keeps going meanwhile, and publishes the sidecars that are ready once per
  turn of its loop).
* **Workers.** A worker that dies is replaced at once; the requests it had
  read are first queued again for the others (the mount's supervisor,
  `shardfs.fuse.supervisor`, holds a copy of each worker's clone of the
  FUSE device, so the kernel keeps them until asked to resend; without a
  supervisor the coordinator does: `_release_clone`); SIGINT, SIGTERM
  and ``shardfs umount`` end every process and remove the mount. Workers
  are the supervisor's children and die with it (``PR_SET_PDEATHSIG``;
  without one, with the coordinator).

A background mount's coordinator can die and be replaced: the next one
takes the mount over from the state the supervisor keeps (`Handover`,
`_serve_adopted`); SIGUSR2 makes it leave the mount to a successor of the
code installed now (an upgrade in place: `_stop`, `_replace_workers`).

Why fork only after INIT: a libfuse session that has not processed INIT
answers EIO to everything. So the coordinator reads and answers INIT
itself (``Session.answer_init``: nothing after it is read, the next
request is left in the kernel for a worker), then forks. It never serves
a request itself.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import stat
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set

from shardfs import rbd
from shardfs.shard import is_remote_source
from shardfs import sidecar as sidecar_mod
from shardfs.errors import RESOURCE_ERRORS, ShardError
from shardfs.fuse import service
from shardfs.fuse import supervisor as supervisor_mod
from shardfs.fuse import worker as worker_mod
from shardfs.fuse.handlers import ShardFS
from shardfs.fuse.layout import object_inode
from shardfs.fuse.openfiles import OpenFiles
from shardfs.shardset import CACHE_DIR_ERRNOS, MountedShard, ShardSet, file_ident
from shardfs.fuse.shared import COORDINATOR_RESTARTS, PID, RESTARTS, SEQ, TAKEN_OVER_NS, UPGRADES, SharedState

log = logging.getLogger("shardfs.fuse")

#: Signals the coordinator's loop acts on (see `Coordinator._take`).
LOOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR2)
#: Seconds to wait for INIT, and for the new mount to answer a stat.
READY_TIMEOUT = 10.0
#: Seconds file events are left to settle before a rescan.
SETTLE_SECONDS = 0.2
#: Seconds after its removal before a shard with no open file is closed.
CLOSE_GRACE = 1.0
#: Seconds between two looks for the shards with files open on the mount
#: (`Coordinator._keep_open_files`), at least.
KEEP_INTERVAL = 1.0
#: Most threads serving in each worker process (started as requests wait:
#: reads that wait for the device do not stall the others).
WORKER_THREADS = 4
#: A worker position restarted more often than this within
#: RESTART_WINDOW seconds makes the coordinator give up the mount.
MAX_RESTARTS = 5
RESTART_WINDOW = 10.0
#: Seconds workers get to leave after the unmount before being killed.
STOP_GRACE = 2.0
#: Names of a removed shard invalidated per turn of the loop (the loop
#: keeps turning, without waiting, until all are done).
FORGET_BATCH = 4096
#: Seconds between two publications of sidecars built (`_publish_later`)
#: per PUBLISH_SHARDS shards served.
PUBLISH_INTERVAL = 1.0
PUBLISH_SHARDS = 10_000
#: Added shards named one by one in the log, at most, per rescan.
LOG_NAMES = 20
#: Sidecar positions a written shard is checked for takedowns at, per call
#: of `Shard.deleted_slots` in a thread (`Coordinator._invalidate_deleted`;
#: about 15 ms each when the index is cached): between two, the check stops
#: if the mount is being unmounted.
CHECK_POSITIONS = 1 << 20
#: Inodes invalidated in a row before the loop's other tasks get a turn
#: (the takedown listener, signals), when a check finds many deleted.
INVALIDATE_BATCH = 1024
#: Most shards whose lookup records the builder writes into one pack.
RECORD_BATCH_SHARDS = 16384
#: Most shards, and objects, the global index builder indexes in one level
#: (see `index_batches`).
INDEX_BATCH_SHARDS = 4096
INDEX_BATCH_OBJECTS = 1 << 24


def default_workers() -> int:
    """Workers of a mount by default: $SHARDFS_WORKERS when set (1 to
    MAX_WORKERS), else the number of CPUs this process may use, at least 2
    (so that one request waiting for the device never stalls the others)."""
    from shardfs.fuse.shared import MAX_WORKERS

    env = os.environ.get("SHARDFS_WORKERS", "")
    if env.isdigit() and 1 <= int(env) <= MAX_WORKERS:
        return int(env)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(2, cpus)


def index_batches(members: Sequence[MountedShard]) -> "Iterator[List[MountedShard]]":
    """`members` in batches for the global index builder: at most
    INDEX_BATCH_SHARDS shards and INDEX_BATCH_OBJECTS objects each (a
    larger shard alone), so that its memory (8 bytes per object of a
    batch) stays bounded and the first shards are indexed early."""
    batch: List[MountedShard] = []
    objects = 0
    for member in members:
        if batch and (len(batch) >= INDEX_BATCH_SHARDS or objects + member.objects_count > INDEX_BATCH_OBJECTS):
            yield batch
            batch, objects = [], 0
        batch.append(member)
        objects += member.objects_count
    if batch:
        yield batch


def record_batches(members: Sequence[MountedShard]) -> "Iterator[List[MountedShard]]":
    """`members` in batches for the lookup record builder, one pack each:
    at most RECORD_BATCH_SHARDS shards, so that the first records serve
    early and a mount of 100,000 shards writes a handful of packs."""
    for start in range(0, len(members), RECORD_BATCH_SHARDS):
        yield list(members[start:start + RECORD_BATCH_SHARDS])


def _closing(fd: int) -> None:
    """Tell trio that `fd` is about to be closed (a task waiting for it
    gets ClosedResourceError), when trio runs."""
    try:
        import trio

        trio.lowlevel.notify_closing(fd)
    except RuntimeError:  # not in trio: nothing waits for it
        pass


class Coordinator:
    """Serve `fs` (whose shard set it owns from now on) on `mountpoint`
    with `workers` worker processes; see the module's docstring.

    `options` are libfuse's; `ready_fd` and `on_ready` as in
    `shardfs.fuse.mount.serve`; `report(message)` writes the readiness line;
    `description` says what is mounted, for the log; `private_fds` are
    descriptors of this process the workers must not keep; `catalog` a
    `shardfs.winery.Catalog` to follow (a winery mount) instead of files;
    `metrics` HOST:PORT where Prometheus metrics are served
    (`shardfs.fuse.metrics`), None for none.

    `supervisor`: the socket to the mount's supervisor
    (`shardfs.fuse.supervisor`), None when there is none (a foreground
    mount: the workers are this process's children and die with it). With
    one, the workers are forked as the supervisor's children, it gets a copy
    of each worker's clone and, once the first table is published, the
    connection and the shared state. `handover` (a
    `shardfs.fuse.supervisor.Handover`) and `state` (the `SharedState`
    attached from it): this coordinator takes over a mount whose
    coordinator died; `fs`'s shard set was made from the state's last
    table (`shardfs.fuse.mount.adopted_shard_set`).
    """

    def __init__(self, fs: ShardFS, mountpoint: str, options: Sequence[str], workers: int,
                 report: Callable[[str], None], on_ready: Optional[Callable[[], None]] = None,
                 description: str = "", private_fds: Sequence[int] = (),
                 catalog: object = None, metrics: Optional[str] = None,
                 supervisor: Optional[socket.socket] = None, handover: Any = None,
                 state: Optional[SharedState] = None) -> None:
        self.fs = fs
        self.shards: ShardSet = fs.shards
        self.mountpoint = mountpoint
        self.options = list(options)
        self.nworkers = workers
        self.report = report
        self.on_ready = on_ready
        self.description = description or mountpoint
        self.private_fds = tuple(private_fds)
        self.pid = os.getpid()
        self.supervisor = supervisor
        if supervisor is not None:
            supervisor.setblocking(False)
        #: The supervisor's pid (this process's parent), with a supervisor.
        self._supervisor_pid = os.getppid() if supervisor is not None else 0
        self.handover = handover
        self.state: Optional[SharedState] = state
        self.session: Any = None  # shardfs._shardfs.Session, once mounted
        self._positions: Dict[int, int] = {}  # worker pid -> position
        #: worker pid -> the coordinator's copy of the clone it serves (`_spawn`)
        self._clones: Dict[int, int] = {}
        #: Whether the kernel resends requests (`worker.resend`): None until asked.
        self._resends: Optional[bool] = None
        self._restarts: Dict[int, List[float]] = {}
        #: This coordinator took over from one that died (`_serve_adopted`).
        self._adopted = False
        #: It leaves the mount to the next coordinator (SIGUSR2: an upgrade).
        self._leaving = False
        #: Workers of the version before an upgrade, being replaced: pids.
        self._retiring: Set[int] = set()
        self.metrics = metrics
        self._metrics_server: Any = None
        #: Shards and objects served as of the last publication (for the metrics thread).
        self._served = (0, 0)
        self._builder: Optional[dict] = None  # the sidecar builder: see _start_builder
        self._removed_at: Dict[int, float] = {}  # number -> monotonic time of the removal
        self._close_check_at = 0.0
        #: Which shards have files open on the mount (set once mounted).
        self.open_files: Optional[OpenFiles] = None
        self._keep_at = 0.0  # when `_keep_open_files` looks again
        self._deleted: Dict[int, Set[int]] = {}  # number -> slots found deleted
        self._signals: List[int] = []
        self._interrupts = 0
        self._wake: Any = None  # trio.Event: set to make the loop turn
        self._inotify = None
        self._control: Optional[socket.socket] = None  # the takedown listener (`_listen_control`)
        self._control_fd: Optional[int] = None
        self._watched: Dict[int, str] = {}  # watch descriptor -> directory
        self._rescan_at: Optional[float] = None
        self._check_all = False
        self._dirty: Set[str] = set()  # paths of served shards written to
        #: Served shards written to, to be checked for takedowns by the
        #: `_check_written` task (by number, in the order they came).
        self._to_check: Dict[int, MountedShard] = {}
        self._check_wake: Any = None  # trio.Event: set when `_to_check` gains a shard
        #: Removed shards whose names the kernel may still cache: [member, next slot].
        self._forget: List[list] = []
        self._stopping = False
        self._ended = False
        self._mounted = False
        self.catalog = catalog
        self._poll_at = time.monotonic()
        #: The shard directory is an RBD pool (rbd:POOL) or an S3 prefix
        #: (s3://BUCKET/PREFIX), listed every `shardfs.rbd.POLL_SECONDS`
        #: (the same 2 s as `shardfs.s3.POLL_SECONDS`: no inotify there).
        self._polls_pool = self.shards.shard_dir is not None and is_remote_source(self.shards.shard_dir)
        #: Building the global index failed once: not tried again.
        self._index_failed = False
        #: Shard numbers a builder was asked to index.
        self._index_tried: Set[int] = set()
        #: Shard numbers a builder was asked to write lookup records of.
        self._record_tried: Set[int] = set()
        #: Shards given to a builder to add to the hash levels (once each).
        self._hash_level_tried: Set[int] = set()
        #: The shard set's version when the builder last found nothing to do.
        self._idle_at = -1
        #: When the table was last published, when it is due (`_publish_later`).
        self._published_at = 0.0
        self._publish_at: Optional[float] = None

    # ------------------------------------------------------------- serve

    def serve(self) -> int:
        """Mount, serve until unmounted or signalled, unmount; returns the
        exit status (0: clean). Raises ShardError when libfuse refuses to
        mount."""
        from shardfs import ShardError
        from shardfs._shardfs import Session
        from shardfs.fuse.handlers import CACHE_TIMEOUT, ENTRY_TIMEOUT

        if self.handover is not None:
            return self._serve_adopted()
        try:
            self.session = Session(self.fs, self.mountpoint, self.options, self.fs.uid, self.fs.gid,
                                   CACHE_TIMEOUT, ENTRY_TIMEOUT)
        except RuntimeError as exc:
            message = f"cannot mount on {self.mountpoint}: {exc}; check the -o options"
            self.report("error: " + message)
            raise ShardError(message) from None
        self.fs.republish = self.session.refresh
        self._mounted = True
        status = 1
        try:
            if not self.session.answer_init(READY_TIMEOUT):
                raise RuntimeError(f"the kernel sent no INIT request within {READY_TIMEOUT:g} s")
            # Files opened on the mount keep their shard open in every
            # process (the workers inherit the set: see OpenFiles).
            self.open_files = OpenFiles(self.mountpoint)
            self.shards.in_use = self.open_files.in_use
            log.info("mounted %s", self.description)
            self.state = SharedState(self.nworkers)
            # The first table (100,000 shards: a second to write) is
            # written once the mount answers: the workers are forked with
            # the set it describes, so they serve meanwhile. A winery
            # mount's workers read its catalog from it: written first.
            later = self.catalog is None
            if not later:
                self._publish()
            self._install_signals()
            self._watch_files()
            self._listen_control()
            if self.on_ready is not None:
                self.on_ready()
            published = self.state.words[SEQ] + (2 if later else 0)  # the workers start from that table
            for position in range(self.nworkers):
                self._spawn(position, published)
            if not self._answers():
                self.report("error: the new mount does not answer")
                return 1
            if self.metrics is not None:
                self._serve_metrics()
            # Told before the command that started the mount exits (on "ok"):
            # with a supervisor, it is the service's main process from now on.
            main = f"MAINPID={self._supervisor_pid}\n" if self._supervisor_pid else ""
            service.notify(f"READY=1\n{main}STATUS=serving {len(self.shards.served())} shard(s) on {self.mountpoint}")
            self.report("ok")
            # The report closed the private descriptors (the readiness
            # pipe): their numbers are free for this process's next
            # descriptors (a replacement worker's clone), which a worker
            # must not close as private.
            self.private_fds = ()
            if later:
                self._publish()
            self._hand_over()
            log.info("serving %s with %d worker(s)", self.mountpoint, self.nworkers)
            status = self._loop()
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                log.exception("coordinator failed")
            self.report(f"error: {exc}")
            raise
        finally:
            self._stop()
            self._close()
        return status

    def _serve_adopted(self) -> int:
        """`serve` for a coordinator taking over (`handover`): the
        connection is served already, the workers alive are kept, the
        shard table is published again (the sequence its predecessor may
        have left odd made even) and every shard is rescanned and checked
        for takedowns it may not have acted on."""
        from shardfs._shardfs import Session
        from shardfs.fuse.handlers import CACHE_TIMEOUT, ENTRY_TIMEOUT

        fd = os.dup(self.handover.session_fd)
        self.session = Session(self.fs, self.mountpoint, self.options, self.fs.uid, self.fs.gid,
                               CACHE_TIMEOUT, ENTRY_TIMEOUT, fd=fd, init=self.state.init())
        self.fs.republish = self.session.refresh
        self._mounted = True
        self._adopted = True
        status = 1
        try:
            self.open_files = OpenFiles(self.mountpoint)
            self.shards.in_use = self.open_files.in_use
            self.state.words[COORDINATOR_RESTARTS] += 1
            self._publish()
            self.state.words[TAKEN_OVER_NS] = time.monotonic_ns()  # the workers have the table: taken over
            self._install_signals()
            self._watch_files()
            self._listen_control()
            for position in range(self.nworkers):
                pid = self.state.words[self.state.row(position) + PID]
                if pid > 0 and worker_mod.is_worker(pid):
                    self._positions[pid] = position
                else:
                    self._spawn(position)
            self._hold([m for m in self.shards.shards.values() if m.removed])
            self._check_all = True  # takedowns its predecessor may not have acted on
            self._rescan_at = time.monotonic()
            if self.metrics is not None:
                try:
                    self._serve_metrics()
                except OSError as exc:
                    log.warning("cannot serve metrics at %s: %s", self.metrics, exc)
            log.info("took over %s: %d worker(s) kept, %d shard(s)", self.mountpoint, len(self._positions),
                     len(self.shards.served()))
            if self.handover.upgrade:
                self._retiring = set(self._positions)
            status = self._loop()
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                log.exception("coordinator failed")
            raise
        finally:
            self._stop()
            self._close()
        return status

    def _hand_over(self) -> None:
        """Give the supervisor the connection, its INIT request and the
        shared state, once the first table is published: from then on a
        coordinator that dies is replaced (`shardfs.fuse.supervisor`)."""
        if self.supervisor is None:
            return
        self.state.set_init(self.session.init_request() or b"")
        try:
            supervisor_mod.send(self.supervisor, b"session", (self.session.fileno(), self.state.fd))
        except OSError as exc:
            log.warning("cannot hand the connection to the supervisor: %s", exc)

    @property
    def leaving(self) -> bool:
        """It left the mount to the next coordinator (an upgrade in place)."""
        return self._leaving

    def _answers(self) -> bool:
        """True once a stat of the mount point is answered (by a worker)."""
        result: List[bool] = []

        def probe() -> None:
            try:
                os.stat(self.mountpoint)
                result.append(True)
            except OSError as exc:
                log.error("the new mount does not answer: %s", exc)

        t = threading.Thread(target=probe, daemon=True)
        t.start()
        t.join(READY_TIMEOUT)
        return bool(result)

    # ----------------------------------------------------------- workers

    def _spawn(self, position: int, published: int = -1) -> None:
        """Fork the worker of `position`. `published`: the sequence of the
        table the coordinator's shard set matches now (it published it and
        changed nothing since), which the worker then need not read (with
        100,000 shards, 34 MB of JSON: a second or two before it answers);
        -1: it reads the newest table whole."""
        try:
            clone = worker_mod.open_clone(self.session.fileno())
        except OSError as exc:  # the worker tries itself; what it reads is not kept if it dies
            log.warning("cannot make a clone of the FUSE connection for worker position %d: %s", position, exc)
            clone = -1
        fds = tuple(fd for fd in self.private_fds if fd != clone) + tuple(self._clones.values())
        if self._inotify is not None:
            fds += (self._inotify.fileno(),)
        if self._control_fd is not None:
            fds += (self._control_fd,)
        if self._metrics_server is not None:
            fds += (self._metrics_server.fileno(),)
        if self.supervisor is not None:
            fds += (self.supervisor.fileno(),)
        try:
            pid = self._fork_worker(position, published, clone, fds)
        except BaseException:
            if clone >= 0:
                os.close(clone)
            raise
        self._positions[pid] = position
        self.state.words[self.state.row(position) + PID] = pid
        if clone >= 0 and self.supervisor is not None:
            try:
                supervisor_mod.send(self.supervisor, b"worker %d" % pid, (clone,))
            except OSError as exc:
                log.warning("cannot give the supervisor worker %d's clone: %s", pid, exc)
            os.close(clone)
        elif clone >= 0:
            self._clones[pid] = clone
        log.debug("worker %d started at position %d", pid, position)

    def _fork_worker(self, position: int, published: int, clone: int, fds: "tuple[int, ...]") -> int:
        """Fork the worker of `position`; its pid. Without a supervisor, a
        child of this process; with one, a child of the supervisor: forked
        by a child of this process that exits at once, having written the
        worker's pid in the row's PID word (the kernel gives an orphan to
        the nearest subreaper). Raises OSError when no worker was forked."""
        if self.supervisor is None:
            pid = os.fork()
            if pid == 0:
                worker_mod.run(self.fs, self.session, self.state, position, self.pid, WORKER_THREADS,
                               close_fds=fds, published=published, clone=clone)
            return pid
        word = self.state.row(position) + PID
        self.state.words[word] = 0
        middle = os.fork()
        if middle == 0:
            try:
                middle = os.getpid()
                pid = os.fork()
                if pid == 0:
                    worker_mod.run(self.fs, self.session, self.state, position, self.pid, WORKER_THREADS,
                                   close_fds=fds, published=published, clone=clone,
                                   supervisor=self._supervisor_pid, middle=middle)
                self.state.words[word] = pid  # no descriptor needed: this may run out of them
            finally:
                os._exit(0)
        os.waitpid(middle, 0)
        pid = self.state.words[word]
        if pid <= 0:
            raise OSError(errno.ECHILD, "the worker of position %d was not started" % position)
        return pid

    def _release_clone(self, pid: int, died: bool) -> None:
        """Let go of the copy of the connection's clone that worker `pid`
        served. When it `died`, first ask the kernel to queue again what
        it had read and not answered (`worker.resend`), so that its
        callers get their answers from the other workers; where the kernel
        cannot (before Linux 6.9), closing the copy ends them with
        ECONNABORTED, said once."""
        clone = self._clones.pop(pid, None)
        if clone is None:
            return
        if died and self._resends is not False:
            try:
                self._resends = supervisor_mod.resend(self.session.fileno())
            except OSError as exc:
                log.warning("cannot ask the kernel to resend the requests of worker %d: %s", pid, exc)
            else:
                if self._resends:
                    log.info("requests worker %d held were queued again for the other workers", pid)
                else:
                    log.warning("this kernel cannot resend requests (FUSE_NOTIFY_RESEND: Linux 6.9 and later): "
                                "those a dead worker held end with ECONNABORTED")
        os.close(clone)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self._builder is not None and pid == self._builder["pid"]:
                self._read_builder(exited=os.waitstatus_to_exitcode(status))
                continue
            self._worker_exited(pid, os.waitstatus_to_exitcode(status))

    def _read_supervisor(self) -> None:
        """Take the supervisor's messages ("exit PID CODE": a worker
        exited; its requests were queued again, its clone let go)."""
        while self.supervisor is not None:
            try:
                message, fds = supervisor_mod.receive(self.supervisor)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("supervisor: %s", exc)
                message, fds = b"", []
            for fd in fds:
                os.close(fd)
            if not message:  # gone: PR_SET_PDEATHSIG ends this process too
                self.supervisor.close()
                self.supervisor = None
                return
            words = message.split()
            if len(words) == 3 and words[0] == b"exit":
                self._worker_exited(int(words[1]), int(words[2]))

    def _worker_exited(self, pid: int, code: int) -> None:
        """Worker `pid` (or another process) exited with `code` (negative:
        the signal): replace it unless the mount is ending or it was
        retired (an upgrade: its replacement runs already)."""
        position = self._positions.pop(pid, None)
        if position is None:
            return
        word = self.state.row(position) + PID
        if self.state.words[word] == pid:
            self.state.words[word] = 0
        self._release_clone(pid, died=code != 0)
        if pid in self._retiring:
            self._retiring.discard(pid)
            return
        if code == 0:
            if not self._ended:
                log.info("the FUSE session of %s ended", self.mountpoint)
            self._ended = True
            return
        how = f"signal {-code}" if code < 0 else f"status {code}"
        if self._stopping or self._ended:
            return
        now = time.monotonic()
        recent = [t for t in self._restarts.get(position, []) if now - t < RESTART_WINDOW]
        if len(recent) >= MAX_RESTARTS:
            log.error("worker position %d died %d times within %g s: unmounting", position,
                      len(recent) + 1, RESTART_WINDOW)
            self._stopping = True
            return
        self._restarts[position] = recent + [now]
        self.state.words[RESTARTS] += 1
        log.warning("worker %d (position %d) died (%s): starting another", pid, position, how)
        self._spawn(position)

    def _unmount(self) -> None:
        """Unmount (lazily, as libfuse does: nothing waits on a busy mount)
        and release the session, once."""
        if self._mounted:
            self._mounted = False
            try:
                if self._adopted:  # libfuse did not mount it here: it cannot unmount it
                    from shardfs.fuse.mount import _run_unmount

                    _run_unmount(self.mountpoint, lazy=True)
                self.session.unmount()
            except Exception:  # pragma: no cover - close() only logs in practice
                log.exception("unmount failed")

    def _stop(self) -> None:
        """Unmount and end every child process: the workers leave when the
        kernel ends the session; any still there after STOP_GRACE is
        killed. Leaving the mount to the next coordinator (`_leaving`):
        neither; only this process's own children (the sidecar builder)
        end."""
        self._stopping = True
        if self._leaving:
            self._mounted = False
            self.session.disown()
            self._positions.clear()
            if self._builder is not None:
                try:
                    os.kill(self._builder["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(self._builder["pid"], 0)
                self._builder = None
            return
        service.notify("STOPPING=1")
        self._unmount()
        deadline = time.monotonic() + STOP_GRACE
        signalled = False
        children = lambda: list(self._positions) + ([self._builder["pid"]] if self._builder else [])  # noqa: E731
        while children():
            self._reap()
            if self.supervisor is not None:
                self._read_supervisor()
            for pid in list(self._positions):
                if not worker_mod.is_worker(pid):  # reaped by someone else (the supervisor died)
                    self._positions.pop(pid, None)
            if not children():
                break
            if time.monotonic() > deadline:
                sig = signal.SIGKILL if signalled else signal.SIGTERM
                for pid in children():
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                signalled = True
                deadline = time.monotonic() + STOP_GRACE
            time.sleep(0.02)

    # ---------------------------------------------------------- the loop

    def _install_signals(self) -> None:
        """Until the loop runs: remember the signals that stop the mount or
        ask for a rescan (the loop takes them over, and these, at start)."""

        def handler(signum: int, frame: object) -> None:
            self._signals.append(signum)

        for signum in LOOP_SIGNALS:
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, supervisor_mod.HELD_SIGNALS)  # held at a takeover

    def _loop(self) -> int:
        """Run the coordinator's loop (`_main`) on trio; returns the exit
        status."""
        import trio

        return trio.run(self._main)

    async def _main(self) -> int:
        """Until the session ends or a signal stops it: reap children, do
        what is due (rescan, winery poll, names to forget, shards to close,
        the next sidecar or index build, a publication), then wait for a
        signal, a file event, the builder's report or the next deadline.
        One nursery holds the tasks that wait: signals, the takedown
        listener, inotify readiness, the builder's pipe, and the check of
        written shards for takedowns (`_check_written`: its slots are read
        in a thread). The work comes before the wait, so a build
        finishing starts the next one at once."""
        import trio

        self._wake = trio.Event()
        self._check_wake = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._take_signals)
            nursery.start_soon(self._serve_control)
            nursery.start_soon(self._check_written)
            if self._retiring:
                nursery.start_soon(self._replace_workers)
            if self._inotify is not None:
                nursery.start_soon(self._when_readable, self._inotify.fileno(), self._read_events,
                                   lambda: self._inotify is not None)
            if self.supervisor is not None:
                self.supervisor.setblocking(False)
                nursery.start_soon(self._when_readable, self.supervisor.fileno(), self._read_supervisor,
                                   lambda: self.supervisor is not None)
            watched = None
            while True:
                self._take(self._signals)
                self._reap()
                if self._ended and not self._positions:
                    status = 0
                    break
                if self._stopping:
                    status = 0 if self._interrupts else 1
                    break
                # Each step may take a second or more with 100,000 shards
                # (a rescan stats every file, a publication writes the
                # table): a takedown told meanwhile (`_control_client`) is
                # answered between two steps, not after all of them.
                if self._rescan_at is not None and time.monotonic() >= self._rescan_at:
                    self._rescan_at = None
                    self._follow()
                    await trio.lowlevel.checkpoint()
                if self.catalog is not None and time.monotonic() >= self._poll_at:
                    self._sync_catalog()
                    await trio.lowlevel.checkpoint()
                if self._polls_pool and time.monotonic() >= self._poll_at:
                    self._poll_at = time.monotonic() + rbd.POLL_SECONDS
                    self._follow()  # the pool's images listed again
                    await trio.lowlevel.checkpoint()
                self._forget_names()
                self._keep_open_files()
                self._close_unused()
                await trio.lowlevel.checkpoint()
                self._start_builder()
                if self._builder is not None and self._builder["fd"] != watched:
                    watched = self._builder["fd"]
                    nursery.start_soon(self._when_readable, watched, self._read_builder,
                                       lambda fd=watched: self._builder is not None and self._builder["fd"] == fd)
                if self._publish_at is not None and time.monotonic() >= self._publish_at:
                    await trio.lowlevel.checkpoint()
                    self._publish()
                deadlines = [time.monotonic() + (0.0 if self._forget else 1.0), self._keep_at]
                deadlines += [t for t in (self._publish_at, self._rescan_at) if t is not None]
                if self.catalog is not None or self._polls_pool:
                    deadlines.append(self._poll_at)
                with trio.move_on_after(max(0.0, min(deadlines) - time.monotonic())):
                    await self._wake.wait()
                self._wake = trio.Event()
            nursery.cancel_scope.cancel()
        return status

    async def _replace_workers(self) -> None:
        """After an upgrade in place: replace the workers of the version
        before, one at a time: the new one is forked first, then the old
        one killed; the supervisor has the kernel resend what it held, so
        no reader sees an error. Counts the upgrade once all are replaced."""
        import trio

        started = time.monotonic()
        old = sorted(self._retiring)
        for pid in old:
            position = self._positions.get(pid)
            if position is None or self._stopping:
                continue
            self._spawn(position)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 10
            while pid in self._positions and time.monotonic() < deadline and not self._stopping:
                await trio.sleep(0.005)
        if not self._stopping:
            self.state.words[UPGRADES] += 1
            log.info("upgrade of %s done: %d worker(s) replaced in %.2f s", self.mountpoint, len(old),
                     time.monotonic() - started)

    async def _take_signals(self) -> None:
        import trio

        with trio.open_signal_receiver(*LOOP_SIGNALS) as signals:
            async for signum in signals:
                self._signals.append(signum)
                self._wake.set()

    async def _when_readable(self, fd: int, read: Callable[[], None], open_: Callable[[], bool]) -> None:
        """Call `read()` whenever `fd` is readable, while `open_()` says
        it is still open: checked before each wait and before each read
        (other tasks run between the wake-up and the read: the loop may
        have closed it; `_closing` before `os.close` ends a wait in
        progress)."""
        import trio

        try:
            while open_():
                await trio.lowlevel.wait_readable(fd)
                if not open_():
                    break
                read()
                self._wake.set()
        except trio.ClosedResourceError:
            pass

    def _take(self, signals: List[int]) -> None:
        """Act on `signals` (emptied): SIGINT and SIGTERM stop the mount,
        SIGHUP asks for a rescan and a check of every shard; SIGCHLD only
        wakes the loop (which reaps)."""
        for signum in signals:
            if signum in (signal.SIGINT, signal.SIGTERM):
                self._interrupts += 1
                log.info("got signal %d: unmounting", signum)
                self._stopping = True
            elif signum == signal.SIGHUP:
                log.info("got SIGHUP: rescanning the shards")
                self._check_all = True
                self._rescan_at = time.monotonic()
            elif signum == signal.SIGUSR2 and self._supervisor_pid and not self._stopping:
                # An upgrade in place (`shardfs.fuse.supervisor`): the next
                # coordinator takes the mount and the workers over.
                log.info("got SIGUSR2: leaving the mount to the next coordinator")
                self._leaving = self._stopping = True
                self._interrupts += 1
        signals.clear()

    # ------------------------------------------------- takedowns told here

    def _listen_control(self) -> None:
        """Bind the listener for the takedowns ``shardfs delete`` tells this
        host's mounts (`shardfs.fuse.control`), before the mount is said to
        be ready: a delete that follows the mount finds it."""
        from shardfs.fuse import control
        from shardfs.fuse.openfiles import mount_id

        mnt_id = mount_id(self.mountpoint)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            if mnt_id is None:
                raise OSError("the mount is not in /proc/self/mountinfo")
            sock.bind(control.address(mnt_id, control.unique_mount_id(self.mountpoint, mnt_id)))
            sock.listen(16)
        except OSError as exc:
            sock.close()
            log.warning("cannot listen for takedowns (%s): `shardfs delete` on this host will not "
                        "wait for this mount; takedowns show within the live bound", exc)
            return
        self._control = sock
        self._control_fd = sock.fileno()

    async def _serve_control(self) -> None:
        """Answer the takedowns told on the listener, until the loop ends."""
        import trio

        if self._control is None:
            return
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._control))
        try:
            await trio.serve_listeners(self._control_client, [listener])
        except Exception as exc:  # the mount keeps serving; takedowns fall back to the live bound
            log.warning("takedown listener stopped: %s; takedowns show within the live bound", exc)

    async def _control_client(self, stream: Any) -> None:
        """Read one request from `stream`, act, answer one line."""
        import trio

        from shardfs.fuse import control

        async with stream:
            try:
                # The request is read first, whoever sends it: a refusal
                # written and the connection closed before the client's
                # request is in would meet the client's write (EPIPE), and
                # the client would never read why.
                line = b""
                with trio.fail_after(control.TIMEOUT):
                    while not line.endswith(b"\n") and len(line) <= control.MAX_REQUEST:
                        chunk = await stream.receive_some(65536)
                        if not chunk:
                            return
                        line += chunk
                if control.peer_uid(stream.socket) not in (0, os.getuid()):
                    reply = {"error": "only root or the mount's owner may tell takedowns"}
                elif len(line) > control.MAX_REQUEST:
                    reply = {"error": f"request over {control.MAX_REQUEST} bytes"}
                else:
                    reply = self._takedown(*control.parse_request(line))
                await stream.send_all(json.dumps(reply).encode("ascii") + b"\n")
            except ValueError as exc:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(json.dumps({"error": f"bad request: {exc}"}).encode("ascii") + b"\n")
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.debug("takedown request dropped: %s", exc)
            except Exception:  # never let one request end the listener (or the coordinator)
                log.exception("takedown request failed")
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    await stream.send_all(b'{"error": "internal error: see the mount\'s log"}\n')

    def _takedown(self, ident: Dict[str, int], keys: List[bytes]) -> Dict[str, int]:
        """Make the kernel forget `keys` in every shard served from the file
        `ident` names (`shardfs.fuse.control.file_identity`): their names
        where they can be looked up, the inodes of their slots (cached
        pages included). Returns {"shards": N, "invalidated": K}."""
        from shardfs.fuse import control

        members = []  # (member, its open Shard, or None when it could not be opened)
        for member in self.shards.served():
            # what it was when it joined first (no open: with 100,000
            # shards, opening each took longer than `shardfs delete` waits),
            # then the file open now
            dev, ino, rdev = member.ident
            if ident != ({"rdev": rdev} if "rdev" in ident else {"dev": dev, "ino": ino}):
                continue
            try:
                shard = member.shard
                if control.file_identity(os.fstat(shard.fileno())) != ident:
                    continue
            except (OSError, ValueError) as exc:
                if getattr(exc, "errno", None) not in RESOURCE_ERRORS:
                    continue  # replaced or gone since it joined: not the file told of
                # Out of descriptors (shards held for open files): the file
                # it joined as is the one told of; its keys are hidden unchecked.
                log.warning("takedown in %s: cannot open it to check the keys (%s): hidden unchecked",
                            member.path, exc)
                shard = None
            members.append((member, shard))
        invalidated = 0
        if members and self.shards.records is not None:
            for member, shard in members:  # before the kernel forgets: its next lookup must not find them
                # only what the file no longer holds: a key told of but live
                # (a request for a key another shard held) stays found
                gone = keys if shard is None else [key for key in keys if key not in shard]
                if gone:
                    self.shards.records.delete(member, keys=gone)
        if members:
            for key in keys:
                name = key.hex().encode("ascii")
                for parent in self.fs.layout.parents_of(key.hex()):
                    invalidated += self._quiet_invalidate(self.session.invalidate_entry, parent, name)
            for member, shard in members:
                if shard is None:
                    continue  # its names are forgotten; its inodes' pages expire with the live bound
                known = self._deleted.setdefault(member.number, set())
                for key in keys:
                    slot = shard.slot_of(key)
                    known.add(slot)
                    invalidated += self._quiet_invalidate(self.session.invalidate_inode,
                                                          object_inode(member.number, slot))
            log.info("takedown of %d key(s) told by shardfs delete: %d shard(s), invalidated in the kernel",
                     len(keys), len(members))
        return {"shards": len(members), "invalidated": invalidated}

    @staticmethod
    def _quiet_invalidate(call: Callable[..., None], *args: Any) -> int:
        """1 when `call(*args)` invalidated something, 0 when the kernel
        did not have it (ENOENT) or could not (logged)."""
        try:
            call(*args)
            return 1
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("cannot invalidate a taken-down object: %s", exc)
            return 0

    # ---------------------------------------------------- following files

    def _watch_files(self) -> None:
        directories = []
        if self.shards.shard_dir is not None and not is_remote_source(self.shards.shard_dir):
            directories.append(self.shards.shard_dir)
        for path in self.shards.pinned:
            if is_remote_source(path):
                continue  # an RBD image or an S3 object: no file to watch (a pool is polled: _poll_pool)
            d = os.path.dirname(path)
            if d not in directories:
                try:
                    if stat.S_ISBLK(os.stat(path).st_mode):
                        continue  # a device: SIGHUP only (see the module's docstring)
                except OSError:
                    pass
                directories.append(d)
        if not directories:
            return
        try:
            import inotify_simple
        except ImportError:  # pragma: no cover - a dependency
            log.warning("inotify_simple is missing: shard changes show after SIGHUP only")
            return
        flags = inotify_simple.flags
        mask = (flags.CREATE | flags.CLOSE_WRITE | flags.MOVED_TO | flags.MOVED_FROM | flags.DELETE
                | flags.ATTRIB | flags.MODIFY)
        self._inotify = inotify_simple.INotify(nonblocking=True)
        os.set_inheritable(self._inotify.fileno(), False)
        for d in directories:
            try:
                self._watched[self._inotify.add_watch(d, mask)] = d
            except OSError as exc:
                log.warning("cannot watch %s (%s): its changes show after SIGHUP only", d, exc)

    def _read_events(self) -> None:
        try:
            events = self._inotify.read(timeout=0)
        except BlockingIOError:
            return
        import inotify_simple

        written = inotify_simple.flags.MODIFY | inotify_simple.flags.CLOSE_WRITE
        for event in events:
            path = os.path.join(self._watched.get(event.wd, ""), event.name)
            if event.mask & written and path in self.shards.by_path:
                self._dirty.add(path)
        if events and self._rescan_at is None:
            self._rescan_at = time.monotonic() + SETTLE_SECONDS

    def _follow(self) -> None:
        """Rescan the files, check written shards for takedowns, publish."""
        if self._check_all:
            for member in self.shards.served():
                self._drop_device_cache(member)
        if self.catalog is not None:
            self._check_all = False
            self._dirty.clear()
            self._sync_catalog()
            return
        try:
            added, gone = self.shards.rescan()
        except OSError as exc:
            log.warning("cannot rescan %s: %s", self.shards.shard_dir, exc)
            added, gone = [], []
            if self._polls_pool:  # the cluster is away: a listing waits for the timeout, not every poll
                self._poll_at = time.monotonic() + rbd.POLL_FAILED_SECONDS
        if added or gone:
            log.info("rescan of %s: %d shard(s) added, %d removed",
                     self.shards.shard_dir or "the shards named at mount", len(added), len(gone))
            for member in added[:LOG_NAMES]:
                log.info("serving shard %s as number %d (%d objects)", member.path, member.number,
                         member.objects_count)
            self._hold(gone)
            self._publish()
            for member in gone:
                self._removed_at[member.number] = time.monotonic()
                self._forget.append([member, 0])
        dirty = [m for m in self.shards.served() if self._check_all or m.path in self._dirty]
        self._dirty.clear()
        self._check_all = False
        for member in dirty:  # checked by `_check_written`, while the loop goes on
            self._to_check[member.number] = member
        if dirty:
            self._check_wake.set()

    def _sync_catalog(self) -> None:
        """Poll the winery database (`shardfs.winery.Catalog.sync`):
        publish what changed, then invalidate in the kernel the names and
        inodes of the keys it newly hides."""
        from shardfs.winery import POLL_SECONDS, DatabaseUnavailable

        self._poll_at = time.monotonic() + POLL_SECONDS
        try:
            change = self.catalog.sync(self.shards)
        except DatabaseUnavailable:
            return  # logged once per outage; keep serving what is open
        except Exception:
            log.exception("cannot poll the winery database")
            return
        if not change.changed:
            return
        self._hold(change.removed)
        self._publish()
        for member in change.removed:
            self._removed_at[member.number] = time.monotonic()
            self._forget.append([member, 0])
        if change.added or change.removed:
            log.info("winery: %d image(s) added, %d removed", len(change.added), len(change.removed))
        if change.hidden:
            self._invalidate_keys(change.hidden)

    def _invalidate_keys(self, pairs: List[tuple]) -> None:
        """Make the kernel forget keys the database took down: their names
        in every directory where they are looked up, the inode of their
        slot in the shard they are hidden in, and the inodes workers gave
        them as database objects (cached pages included)."""
        from shardfs.fuse.layout import db_inode

        images = {m.winery_shard: m for m in self.shards.served()}
        for key, shard_id in pairs:
            name = key.hex()
            for parent in self.fs.layout.parents_of(name):
                self._quiet_invalidate(self.session.invalidate_entry, parent, name.encode("ascii"))
            member = images.get(shard_id)
            if member is not None:
                try:
                    hit = member.shard.find(key)
                except Exception:
                    hit = None
                if hit is not None:
                    self._quiet_invalidate(self.session.invalidate_inode, object_inode(member.number, hit[0]))
            for position, number in self.state.ring_find(key):
                self._quiet_invalidate(self.session.invalidate_inode, db_inode(position, number))
        log.info("winery: %d key(s) taken down: invalidated in the kernel", len(pairs))

    @staticmethod
    def _drop_device_cache(member: MountedShard) -> None:
        """A block device's cached pages may predate writes made by
        another host: drop them, so the next reads see the device."""
        if not member.ident[2]:
            return  # not a device (st_rdev 0): its cache is the file's own
        try:
            fd = member.shard.fileno()
            if stat.S_ISBLK(os.fstat(fd).st_mode):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot drop its cached pages: %s", member.path, exc)

    async def _check_written(self) -> None:
        """Check the shards `_follow` found written for takedowns, one
        after the other (`_invalidate_deleted`), while the loop goes on:
        reaping workers, answering the takedown listener, following files."""
        import trio

        while True:
            await self._check_wake.wait()
            self._check_wake = trio.Event()
            while self._to_check:
                number = next(iter(self._to_check))
                member = self._to_check.pop(number)
                if member.removed or self.shards.get(number) is not member:
                    continue
                try:
                    await self._invalidate_deleted(member)
                except Exception:  # never let one check end the coordinator
                    log.exception("%s: the check for takedowns failed", member.path)

    async def _invalidate_deleted(self, member: MountedShard) -> None:
        """Invalidate in the kernel the inodes of the objects of `member`
        deleted since its sidecar was built (a takedown): the slots its
        sidecar lists that are empty in the index now, but those known
        already (invalidated before, or told by `shardfs delete`).

        The slots are read in C without the GIL (`Shard.deleted_slots`),
        CHECK_POSITIONS sidecar positions per call, in a thread: a shard
        of millions of objects takes tens of milliseconds or more (its
        index read in the sidecar's order), during which the loop keeps
        going. The invalidations are made here, INVALIDATE_BATCH at a time."""
        import trio

        sc = member.sidecar
        if sc is None:
            log.warning("%s was written to but has no sidecar yet: deleted objects cannot be "
                        "opened, their cached attributes expire with the kernel's caches", member.path)
            return
        try:
            shard = member.shard
        except Exception:  # cannot be opened now: no slot of it can be read (its readers get errors)
            return
        count = sc.count
        deleted: List[int] = []
        started = time.monotonic()
        for begin in range(0, count, CHECK_POSITIONS):
            if self._stopping:
                return
            try:
                deleted += await trio.to_thread.run_sync(shard.deleted_slots, sc, begin,
                                                         min(begin + CHECK_POSITIONS, count))
            except (OSError, ValueError) as exc:  # shrank under its mapping; closed as it was removed
                if not member.removed:
                    log.warning("%s: cannot check it for takedowns: %s", member.path, exc)
                return
        if member.removed or self.shards.get(member.number) is not member:
            return  # removed meanwhile: its names and inodes are forgotten with it
        known = self._deleted.setdefault(member.number, set())
        found = [slot for slot in deleted if slot not in known]
        known.update(found)
        if self.shards.records is not None:
            self.shards.records.delete(member, slots=deleted)
        log.debug("%s: checked for takedowns in %.3f s: %d slot(s) listed, %d deleted, %d not known before",
                  member.path, time.monotonic() - started, count, len(deleted), len(found))
        for done, slot in enumerate(found, 1):
            try:
                self.session.invalidate_inode(object_inode(member.number, slot))
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: the kernel does not know it
                    log.warning("cannot invalidate an object of %s: %s", member.path, exc)
            if done % INVALIDATE_BATCH == 0:
                await trio.sleep(0)
        if found:
            log.info("%s: %d object(s) deleted: invalidated in the kernel", member.path, len(found))

    def _forget_names(self) -> None:
        """Invalidate in the kernel the names of the objects of removed
        shards (cached for a year), FORGET_BATCH slots per turn of the loop,
        over as many shards as that covers (100 removed shards of a few
        objects each are one turn, not 100: each turn also does the rest of
        the loop's work, about a second with 100,000 shards): the next
        access to such a name asks the workers again, who answer from the
        shards served now (another copy, the new file of a replaced shard,
        or no such object). A shard whose file no process holds any more
        (its keys cannot be read) gets the attributes of its slots' inodes
        invalidated instead: the next access to a name the kernel still
        has asks for them, is answered ESTALE, and the kernel looks the
        name up again."""
        budget = FORGET_BATCH
        while self._forget and budget > 0:
            budget = self._forget_some(self._forget[0], budget)

    def _forget_some(self, item: list, budget: int) -> int:
        """`_forget_names` for `item` ([member, first slot not done]), at
        most `budget` slots; pops it from `_forget` when done. Returns the
        budget left."""
        member, first = item
        try:
            shard = member.shard
        except (OSError, ShardError) as exc:
            if first == 0:
                log.info("%s: its file is gone (%s): invalidating the inodes of its %d slots",
                         member.path, exc, member.slot_count)
            end = min(first + budget, member.slot_count)
            for slot in range(first, end):
                try:
                    self.session.invalidate_inode(object_inode(member.number, slot))
                except OSError as exc:
                    if exc.errno != errno.ENOENT:  # ENOENT: the kernel does not have it
                        log.warning("cannot invalidate an object of %s: %s", member.path, exc)
                        end = member.slot_count
                        break
            budget -= end - first
            item[1] = end
            if end < member.slot_count:
                return budget
            self._forget.pop(0)
            return budget
        try:
            for slot, key, _, _ in shard.scan(first, budget, on_corrupt=lambda n: None):
                name = key.hex()
                for parent in self.fs.layout.parents_of(name):
                    try:
                        self.session.invalidate_entry(parent, name.encode("ascii"))
                    except OSError as exc:
                        if exc.errno != errno.ENOENT:  # ENOENT: the kernel does not have it
                            raise
                item[1] = slot + 1
                budget -= 1
                if budget <= 0:
                    return 0
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot invalidate the names of its objects: %s", member.path, exc)
        self._forget.pop(0)
        log.debug("names of shard %s (number %d) invalidated", member.path, member.number)
        return budget - 1  # the scan's turn

    # ----------------------------------------------------- shard lifetime

    def _keep_open_files(self) -> None:
        """Keep open here every served shard some process has a file open
        on (looked up in /proc every KEEP_INTERVAL seconds, or 50 times as
        long as the look takes, whichever is longer): if that shard is then
        replaced or removed, `_hold` finds it open and the file keeps
        reading it. The workers may have closed it long ago (a file read
        from the page cache sends no request), and once its path names
        another file it cannot be opened again."""
        now = time.monotonic()
        if now < self._keep_at or self.open_files is None:
            return
        numbers = self.open_files.shards(max_age=0.0)
        took = time.monotonic() - now
        self._keep_at = now + max(KEEP_INTERVAL, 50 * took)
        for number in numbers:
            member = self.shards.get(number)
            if member is None or member.removed:
                continue
            try:
                self.shards.open_shard(member)  # kept past the bound while in use
            except (OSError, ShardError) as exc:
                log.debug("%s: cannot keep it open: %s", member.path, exc)

    def _close_unused(self) -> None:
        """Close removed shards on which no process has a file open, once
        their names are invalidated (at most once per CLOSE_GRACE)."""
        if not self._removed_at:
            return
        now = time.monotonic()
        if now < self._close_check_at:
            return
        self._close_check_at = now + CLOSE_GRACE
        open_shards: Optional[Set[int]] = None
        closed = False
        forgetting = {item[0].number for item in self._forget}
        for number, when in list(self._removed_at.items()):
            member = self.shards.get(number)
            if member is None:
                del self._removed_at[number]
                continue
            if number in forgetting:
                continue
            if now - when < CLOSE_GRACE:
                continue
            if open_shards is None:
                open_shards = self.open_files.shards(max_age=0.0)
            if number in open_shards:
                continue
            del self._removed_at[number]
            self._deleted.pop(number, None)
            self.shards.discard(member)
            closed = True
            log.info("shard %s (number %d) closed: no file open on it", member.path, number)
        if closed:
            self._publish()

    def table(self) -> Dict[str, object]:
        """The shard table workers follow (`shardfs.fuse.worker.apply_table`),
        with what a winery mount's readers need under "winery". A shard is
        described (path, ident, counts, identity), not opened; "fd" is the
        coordinator's descriptor of a shard it holds open (removed, with
        names or files the kernel may still use), else None."""
        table: Dict[str, object] = {"shards": [
            {"number": m.number, "path": m.path, "ident": m.ident, "objects_count": m.objects_count,
             "slot_count": m.slot_count, "extent": m.extent, "mtime": m.mtime, "identity": m.identity.hex(),
             "removed": m.removed, "fd": m.held.fileno() if m.held is not None and not is_remote_source(m.path) else None,
             "sidecar_dir": m.sidecar_dir, "live_count": m.live_count, "hashes": list(m.hashes),
             "winery_shard": m.winery_shard}
            for _, m in sorted(self.shards.shards.items())
        ]}
        # What a coordinator taking over needs beside the shards: whose
        # descriptors "fd" are, the next shard number (never reused), the layout.
        layout = self.fs.layout
        table.update({"pid": self.pid, "next": self.shards.next_number(),
                      "layout": "flat" if layout.is_flat else "fanout", "slicing": layout.slicing})
        if self.shards.hashes is not None:
            table["hashing"] = list(self.shards.hashes.progress)
            table["hash_levels"] = self.shards.hashes.level_names()
        if self.shards.index is not None:
            table["index"] = self.shards.index.names()
        if self.shards.records is not None:
            table["records"] = self.shards.records.names()
        if self.catalog is not None:
            table["winery"] = self.catalog.table()
        return table

    def _hold(self, members: Sequence[MountedShard]) -> None:
        """Keep the files of removed `members` open until they are
        discarded: their names in the kernel are invalidated from their
        keys, and files open on them keep reading them, while their paths
        may name other files or none. The coordinator's open copy is kept,
        else a worker's descriptor of the file is reopened
        (``/proc/<worker>/fd/<n>``; the workers' descriptors are looked at
        once per call). A shard no process has open any more is left to
        `_forget_names`, which invalidates its inodes instead (logged)."""
        missing = []
        for member in members:
            if member.held is None:
                member.held = self.shards.open_shards.get(member.number)
                if member.held is None:
                    missing.append(member)
        if not missing:
            return
        found: Dict[tuple, str] = {}
        for pid in list(self._positions):
            fd_dir = "/proc/%d/fd" % pid
            try:
                names = os.listdir(fd_dir)
            except OSError:
                continue
            for name in names:
                path = os.path.join(fd_dir, name)
                try:
                    found.setdefault(file_ident(os.stat(path)), path)
                except OSError:
                    continue
        for member in missing:
            member.source = found.get(member.ident)
            try:
                if member.source is not None:
                    member.held = self.shards.open_shard(member)
            except (OSError, ShardError) as exc:
                log.debug("%s: cannot reopen it through %s: %s", member.path, member.source, exc)
            finally:
                member.source = None
            if member.held is None:
                log.warning("%s (number %d) was replaced or removed while no process had it open: "
                            "the inodes of its objects are invalidated instead of their names",
                            member.path, member.number)

    def _publish(self) -> int:
        """Publish the table (`table`); returns its sequence number."""
        served = self.shards.served()
        self._served = (len(served), sum(m.objects_count for m in served))
        seq = self.state.publish(self.table())
        self._publish_at = None
        self._published_at = time.monotonic()
        return seq

    def _serve_metrics(self) -> None:
        """Serve the mount's metrics at `metrics` (`shardfs.fuse.metrics`:
        a thread of prometheus_client's). Raises OSError when the address
        cannot be bound, ImportError without prometheus_client."""
        from shardfs.fuse import metrics

        def figures() -> Dict[str, int]:
            shards, objects = self._served
            return {"shards": shards, "objects": objects, "workers": len(self._positions),
                    "restarts": self.state.words[RESTARTS],
                    "coordinator_restarts": self.state.words[COORDINATOR_RESTARTS]}

        self._metrics_server = metrics.serve(self.metrics, metrics.MountCollector(self.state, figures))
        log.info("metrics of %s at http://%s/metrics", self.mountpoint, self.metrics)

    def _publish_later(self) -> None:
        """Publish a change workers need not see at once (a sidecar built)
        within `publish_interval()` seconds of the last publication: each
        table is read whole by every worker, so with many shards it is not
        written for every sidecar."""
        if self._publish_at is None:
            self._publish_at = self._published_at + self.publish_interval()

    def publish_interval(self) -> float:
        """PUBLISH_INTERVAL seconds per PUBLISH_SHARDS shards: what reading
        the table costs a worker grows with it (a mount of a few shards
        publishes at once)."""
        return PUBLISH_INTERVAL * len(self.shards.shards) / PUBLISH_SHARDS

    # ----------------------------------------------------------- sidecars

    def _start_builder(self) -> None:
        """Fork one process that indexes the shards the global index lacks,
        in batches (reporting "index N" or "index_failed N" after each),
        then builds the sidecars of the shards that lack one, in turn
        (reporting "ok N", "failed N", or "cache_dir N": the cache
        directory cannot be written, it stops)."""
        if self._builder is not None or self._stopping or self._idle_at == self.shards.version:
            return
        if os.environ.get("SHARDFS_TEST_NO_BUILDS"):
            # TEST ONLY, never set in production: no sidecar, index or hash
            # index is built, so every shard stays a candidate of every key
            # (tests/test_open_bound.py makes handlers open many shards).
            return
        todo = self.shards.needs_sidecar()
        index = self.shards.index
        unindexed = []
        if index is not None and not self._index_failed:
            unindexed = [m for m in self.shards.served()
                         if not m.indexed and m.identity and m.number not in self._index_tried]
        hashes = self.shards.hashes
        unhashed, unlevelled = [], []
        if hashes is not None:
            unhashed = hashes.pending()
            asked = {m.number for n in hashes.names for m in hashes.unlevelled(n)} if hashes.levels else set()
            unlevelled = [m for m in self.shards.served() if m.number in asked and m.number not in self._hash_level_tried]
            unlevelled = list({m.number: m for m in unlevelled + unhashed}.values())
        unrecorded = [m for m in self.shards.needs_record() if m.number not in self._record_tried]
        if not todo and not unindexed and not unhashed and not unlevelled and not unrecorded:
            self._idle_at = self.shards.version  # nothing to do until the set changes
            return
        directory = self.shards.sidecar_dir
        r, w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                if self._control_fd is not None:
                    os.close(self._control_fd)  # the name must go with the coordinator
                worker_mod._die_with(self.pid, worker_mod.BUILDER_NAME)
                os.close(self.session.fileno())
                for clone in self._clones.values():
                    os.close(clone)
                if self._metrics_server is not None:
                    os.close(self._metrics_server.fileno())
                if self.supervisor is not None:
                    self.supervisor.close()
                served = [m.identity for m in self.shards.served() if m.identity]
                # Shards opened one at a time, as the index and the records read them.
                _build_batches(w, b"index", index_batches(unindexed), "build the global index in %s" % (
                    index.directory if index is not None else None),
                    lambda batch: index.add_shards(((m.identity, m.shard) for m in batch), served))
                records = self.shards.records
                _build_batches(w, b"records", record_batches(unrecorded), "write lookup records in %s" % (
                    records.directory if records is not None else None),
                    lambda batch: records.add_shards(((m, m.shard) for m in batch), self.shards.served()))
                for member in todo:
                    word = "failed"
                    try:
                        sidecar_mod.build(member.shard, directory, member.identity or None).close()
                        word = "ok"
                    except OSError as exc:
                        if exc.errno in CACHE_DIR_ERRNOS and directory == self.shards.cache_dir:
                            os.write(w, b"cache_dir %d\n" % member.number)
                            break
                        log.warning("%s: cannot build its sidecar, probing it directly: %s", member.path, exc)
                    except Exception as exc:
                        log.warning("%s: cannot build its sidecar, probing it directly: %s", member.path, exc)
                    os.write(w, b"%s %d\n" % (word.encode(), member.number))
                for member in unhashed:
                    _build_hashes(member, hashes.names, directory, w)
                if unlevelled:
                    hashes.scan(unlevelled)
                    for batch in index_batches([m for m in unlevelled if m.hashes]):
                        try:
                            hashes.add_to_levels(batch, served)
                        except Exception as exc:
                            log.warning("cannot add shards to the sha1/sha1_git indexes: %s", exc)
                            break
                        os.write(w, b"hash_levels %d\n" % len(batch))
            finally:
                os._exit(0)
        os.close(w)
        # Each shard is indexed once per mount: one the index fails to
        # hold stays on its own filter rather than forking builds forever.
        self._index_tried.update(m.number for m in unindexed)
        self._record_tried.update(m.number for m in unrecorded)
        self._hash_level_tried.update(m.number for m in unlevelled)
        os.set_blocking(r, False)
        self._builder = {"pid": pid, "fd": r, "directory": directory, "todo": todo,
                         "done": set(), "partial": b""}

    def _read_builder(self, exited: Optional[int] = None) -> None:
        """Take the builder's reports (all of them once it `exited`, with
        that exit code): publish new index levels at once, new sidecars at
        the next `_publish_later` turn (or now, when the builder is done)."""
        b = self._builder
        data = b["partial"]
        while True:
            try:
                chunk = os.read(b["fd"], 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        *lines, b["partial"] = data.split(b"\n")
        published = False
        for line in lines:
            word, number, *more = line.split()
            if word == b"hash_levels":
                self.shards.hashes.reload()
                published = True
                continue
            if word == b"hashing":
                self.shards.hashes.progress = (int(more[0]), int(more[1]))
                self._publish_later()
                continue
            if word in (b"hashed", b"hash_failed"):
                member = self.shards.get(int(number))
                self.shards.hashes.progress = (0, 0)
                if member is not None and not member.removed:
                    if word == b"hash_failed" or not self.shards.hashes.scan([member]):
                        member.hashes_failed = True  # not tried again in this mount
                    self._publish_later()
                continue
            if word in (b"records", b"records_failed"):
                self.shards.reload_records()
                published = True
                continue
            if word in (b"index", b"index_failed"):
                if word == b"index_failed":
                    self._index_failed = True  # the shards keep their own filters
                self.shards.reload_index()
                published = True
                continue
            member = self.shards.get(int(number))
            b["done"].add(int(number))
            if member is None or member.removed:
                continue
            if word == b"cache_dir":
                self.shards.use_private_sidecar_dir()  # built again there by the next builder
            elif word == b"failed":
                member.sidecar_failed = True
            elif self.shards.sidecar_built(member, b["directory"]):
                self._publish_later()
            else:
                member.sidecar_failed = True
        if exited is not None:
            if exited != 0:  # died on a shard: do not try that one again
                for member in b["todo"]:
                    if member.number not in b["done"]:
                        member.sidecar_failed = True
                        log.warning("%s: the sidecar builder died (%d) on it", member.path, exited)
                        break
            _closing(b["fd"])
            os.close(b["fd"])
            self._builder = None
            published = published or self._publish_at is not None
        if published:
            self._publish()

    # ------------------------------------------------------------ closing

    def _close(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        if self._control is not None:
            if self._control.fileno() >= 0:
                _closing(self._control.fileno())
            self._control.close()
            self._control = self._control_fd = None
        if self._inotify is not None:
            _closing(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
        if self.state is not None:
            self.state.close()
            self.state = None
        self.fs.close()


def _build_batches(report_fd: int, word: bytes, batches: "Iterable[List[MountedShard]]", what: str,
                   build: Callable[[List[MountedShard]], object]) -> None:
    """In the builder: `build` each batch in turn, reporting "WORD N" (N
    shards done) on `report_fd`, or, at the first that fails (logged:
    "cannot WHAT"), "WORD_failed N" and stop."""
    for batch in batches:
        done = word
        try:
            build(batch)
        except Exception as exc:
            log.warning("cannot %s: %s", what, exc)
            done = word + b"_failed"
        os.write(report_fd, b"%s %d\n" % (done, len(batch)))
        if done != word:
            break


def _build_hashes(member: MountedShard, names: Sequence[str], directory: str, report_fd: int) -> None:
    """In the builder: build `member`'s hash indexes by `names` in
    `directory` (`shardfs.hashes.build`), reporting "hashing NUMBER DONE
    TOTAL" (object bytes hashed) at most twice a second, then "hashed
    NUMBER" or "hash_failed NUMBER" (logged) on `report_fd`."""
    from shardfs import hashes as hashes_mod

    shard = member.shard
    total = shard.header.objects_size
    told = [0.0]

    def progress(done: int) -> None:
        now = time.monotonic()
        if now - told[0] >= 0.5:
            told[0] = now
            os.write(report_fd, b"hashing %d %d %d\n" % (member.number, done, total))

    started = time.monotonic()
    log.info("%s: indexing by %s (%d bytes to hash)", member.path, ", ".join(names), total)
    try:
        hashes_mod.build(shard, names, directory, progress=progress)
    except Exception as exc:
        log.warning("%s: cannot index it by %s: %s", member.path, ", ".join(names), exc)
        os.write(report_fd, b"hash_failed %d\n" % member.number)
        return
    log.info("%s: indexed by %s in %.1f s", member.path, ", ".join(names), time.monotonic() - started)
    os.write(report_fd, b"hashed %d\n" % member.number)

