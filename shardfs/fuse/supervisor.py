"""The supervisor of a mount: keeps the FUSE connection while the
coordinator that serves it dies and is started again.

A background mount (``shardfs mount`` without ``--foreground``) is three
kinds of process: this supervisor, the coordinator it forks
(`shardfs.fuse.coordinator`), and the workers the coordinator forks, which
become this process's children (``PR_SET_CHILD_SUBREAPER``; the
coordinator forks each through a child that exits at once). The supervisor
knows nothing of shards. It holds:

* the connection's /dev/fuse descriptor and the memory file of the
  mount's shared state (`shardfs.fuse.shared`), handed over by the first
  coordinator once the mount serves (a message "session"): the state holds
  the kernel's INIT request, so that the next coordinator can serve the
  same connection without a new INIT (`shardfs._shardfs.Session(..., fd=,
  init=)`), the last shard table (the shard numbers that inode numbers
  encode), the counters, the workers' process IDs;
* a copy of each worker's clone of the connection (a message "worker PID"
  with the descriptor): when a worker dies, it asks the kernel to queue
  again what the worker had read and not answered (``FUSE_NOTIFY_RESEND``,
  `resend`), then closes the copy, and tells the
  coordinator ("exit PID CODE"), which starts a replacement.

When the coordinator dies (``kill -9``, a crash) after the handover, the
workers go on serving from the last table and the supervisor forks a new
coordinator at once, which takes the connection, the state and the live
workers over (`shardfs.fuse.coordinator.Coordinator` with a `Handover`).
`MAX_FAILED_STARTS` coordinators in a row that die before they took the
mount over (before publishing the shard table: a crash at start, which
starting another would only repeat), or a death before the handover, end
the mount (lazy unmount, every
process killed). When the supervisor itself dies, its children are told by
the kernel (``PR_SET_PDEATHSIG``): the workers are killed and the
coordinator gets SIGTERM, unmounts and leaves, so no stale mount and no
orphan remain. SIGTERM, SIGINT and SIGHUP sent to the supervisor are passed
to the coordinator (which unmounts, or rescans).

The messages are datagrams on a ``SOCK_SEQPACKET`` socket pair, one pair
per coordinator; descriptors travel as ``SCM_RIGHTS``.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import signal
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Set

log = logging.getLogger("shardfs.fuse")

#: Coordinators in a row that die before publishing their first table end the mount.
MAX_FAILED_STARTS = 5
#: Seconds the remaining processes get to leave once the mount ends.
STOP_GRACE = 2.0
#: The process names of a mount's supervisor and coordinator (/proc/PID/comm, what ps shows).
SUPERVISOR_NAME = b"shardfs-mount"
COORDINATOR_NAME = b"shardfs-coord"

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36
#: The notify code of FUSE_NOTIFY_RESEND (include/uapi/linux/fuse.h, protocol 7.40).
FUSE_NOTIFY_RESEND = 7
#: The daemon's argument that resumes a supervisor after an upgrade (JSON of what it hands over).
UPGRADE_ARGUMENT = "--upgrade-from"
#: Signals a coordinator started to take over holds until it can act on them.
HELD_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)
#: Most descriptors one message carries.
_MAX_FDS = 4


@dataclass
class Handover:
    """What a coordinator started by the supervisor after another died
    takes over: the connection's /dev/fuse descriptor `session_fd` and the
    shared state's memory file `state_fd` (which holds the connection's
    INIT request: `shardfs.fuse.shared.SharedState.init`). The descriptors
    are the supervisor's (inherited by the fork): the coordinator
    duplicates what it keeps."""

    session_fd: int
    state_fd: int
    #: The coordinator before it left for an upgrade in place: replace its workers.
    upgrade: bool = False


def resend(session_fd: int) -> bool:
    """Ask the kernel to queue again every request of the connection that
    servers have read but not answered (``FUSE_NOTIFY_RESEND``, protocol
    7.40, Linux >= 6.9): any server of the connection reads them again,
    their ``unique`` marked with bit 63; a late answer to the first copy
    is refused (ENOENT), which libfuse ignores. True when the kernel took
    it; False when it does not know the notification (EINVAL). Other
    OSError is raised."""
    try:
        os.write(session_fd, struct.pack("<IiQ", 16, FUSE_NOTIFY_RESEND, 0))
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    return True


def prctl(option: int, arg: int) -> None:
    """prctl(2) with one argument; raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")


def set_name(name: bytes) -> None:
    """Take the process name `name` (at most 15 bytes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def die_with_parent(sig: int, parent: int) -> None:
    """Be sent `sig` when the parent process dies; exit now if `parent`
    (the pid expected as parent) is not it any more."""
    prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(1)


def send(sock: socket.socket, message: bytes, fds: "tuple[int, ...]" = ()) -> None:
    """Send one message with descriptors `fds` (copies travel; the
    caller keeps its own). Raises OSError (the peer is gone: EPIPE,
    ECONNREFUSED)."""
    socket.send_fds(sock, [message], list(fds)) if fds else sock.send(message)


def receive(sock: socket.socket) -> "tuple[bytes, List[int]]":
    """One message and the descriptors it carries (b"" at end of stream)."""
    message, fds, _flags, _addr = socket.recv_fds(sock, 65536, _MAX_FDS)
    return message, list(fds)


class Supervisor:
    """Run a mount's coordinator, `start(handover, sock, ready)` in a
    forked child (never returns: it exits with the coordinator's status),
    and keep the connection alive across its deaths; see the module's
    docstring. `ready_fd`: the readiness pipe, given to the first
    coordinator only; `mountpoint`: unmounted if the mount must end."""

    def __init__(self, start: Callable[[Optional[Handover], socket.socket, Optional[int]], None],
                 mountpoint: str, ready_fd: Optional[int]) -> None:
        self.start = start
        self.mountpoint = mountpoint
        self.ready_fd = ready_fd
        self.pid = os.getpid()
        self.handover: Optional[Handover] = None
        self.coordinator = 0
        self.sock: Optional[socket.socket] = None
        self.clones: Dict[int, int] = {}  # worker pid -> the copy of its clone
        self.exited: Dict[int, int] = {}  # pid -> exit code, of processes whose clone has not come yet
        self.resends: Optional[bool] = None
        #: Coordinators in a row that died before taking over; the table
        #: sequence when the one running started (`_published`).
        self.failed_starts = 0
        self.started_at_sequence = -1
        self.signals: List[int] = []
        self.stopping = False
        #: The coordinator was asked to leave the mount to a successor (an upgrade).
        self.leaving = False

    # ------------------------------------------------------------ serve

    def run(self, on_started: Optional[Callable[[], None]] = None) -> int:
        """Serve until the mount ends; returns the exit status (that of
        the last coordinator: 0 on a clean unmount). `on_started` is
        called once the first coordinator is forked (the daemon points its
        own stderr away from the parent's pipe then: the coordinator keeps
        it until it reports)."""
        prctl(_PR_SET_CHILD_SUBREAPER, 1)
        set_name(SUPERVISOR_NAME)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR2):
            signal.signal(signum, lambda signum, frame: self.signals.append(signum))
        if self.coordinator:  # resumed after an upgrade: the coordinator before leaves, then the next starts
            self._ask_to_leave()
        else:
            self._fork()
        if on_started is not None:
            on_started()
        status = 1
        while True:
            try:
                done = self._turn(wake_r)
            except Exception:  # the supervisor must outlive its own faults: the mount depends on it
                log.exception("supervisor of %s", self.mountpoint)
                time.sleep(0.1)
                continue
            if done is not None:
                status = done
                break
        self._end_children()
        return status

    def _turn(self, wake_r: int) -> Optional[int]:
        """One turn of `run`'s loop: the mount's exit status once it is
        over, else None."""
        for signum in self._take_signals():
            if signum == signal.SIGUSR2:
                self._upgrade()
            elif signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) and self.coordinator:
                if signum != signal.SIGHUP:
                    self.stopping = True  # the coordinator's death then ends the mount
                log.debug("signal %d passed to the coordinator %d", signum, self.coordinator)
                try:
                    os.kill(self.coordinator, signum)
                except ProcessLookupError:
                    pass
        done = self._reap()
        if done is not None:
            return done
        waits = [wake_r] + ([self.sock.fileno()] if self.sock is not None else [])
        try:
            readable, _, _ = select.select(waits, [], [], 1.0)
        except InterruptedError:
            return None
        if wake_r in readable:
            try:
                while os.read(wake_r, 256):
                    pass
            except BlockingIOError:
                pass
        if self.sock is not None and self.sock.fileno() in readable:
            self._read_messages()
        return None

    # --------------------------------------------------------- upgrade

    def _upgrade(self) -> None:
        """SIGUSR2 (``shardfs upgrade``): run the shardfs installed now in
        this process (execve: the same pid, still the parent of every
        process of the mount), handing it the connection, the state, the
        clones and the coordinator (`UPGRADE_ARGUMENT`); it then has the
        coordinator leave and starts one of its own code, which replaces
        the workers one by one. Before the handover there is nothing to
        hand: said in the log, nothing done."""
        import json
        import sys

        if self.handover is None or self.leaving or not self.coordinator:
            log.warning("upgrade of %s asked before the mount served or while one runs: ignored", self.mountpoint)
            return
        handed = {"session": self.handover.session_fd, "state": self.handover.state_fd,
                  "coordinator": self.coordinator, "clones": {str(pid): fd for pid, fd in self.clones.items()}}
        for fd in [self.handover.session_fd, self.handover.state_fd] + list(self.clones.values()):
            os.set_inheritable(fd, True)
        dropped = ("--ready-fd", UPGRADE_ARGUMENT)  # and their values: not for the next
        argv = [arg for before, arg in zip(sys.argv, sys.argv[1:]) if arg not in dropped and before not in dropped]
        argv = [sys.executable, "-m", "shardfs.fuse.mount", UPGRADE_ARGUMENT, json.dumps(handed)] + argv
        log.info("upgrade of %s: running %s", self.mountpoint, " ".join(argv[:3]))
        logging.shutdown()
        try:
            os.execv(sys.executable, argv)
        except OSError as exc:
            log.error("upgrade of %s failed: cannot run %s: %s; the mount is served as before", self.mountpoint,
                      sys.executable, exc)

    def resume(self, handed: Dict[str, object]) -> None:
        """Take over what `_upgrade` handed (before `run`)."""
        self.handover = Handover(int(handed["session"]), int(handed["state"]))
        self.clones = {int(pid): int(fd) for pid, fd in dict(handed["clones"]).items()}
        self.coordinator = int(handed["coordinator"])
        for fd in [self.handover.session_fd, self.handover.state_fd] + list(self.clones.values()):
            os.set_inheritable(fd, False)

    def _ask_to_leave(self) -> None:
        """Have the coordinator leave the mount (SIGUSR2: it exits 0
        without unmounting nor stopping the workers); its successor is
        forked when it is reaped."""
        self.leaving = True
        try:
            os.kill(self.coordinator, signal.SIGUSR2)
        except ProcessLookupError:
            pass

    def _take_signals(self) -> List[int]:
        taken, self.signals = self.signals, []
        return taken

    def _fork(self) -> None:
        """Fork a coordinator: the first with the readiness pipe, the next
        ones with the handover."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                signal.set_wakeup_fd(-1)
                for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                if self.handover is not None:
                    # held until the coordinator acts on them (Coordinator._install_signals):
                    # a SIGTERM passed on during its takeover must unmount, not kill it
                    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
                for fd in self.clones.values():
                    os.close(fd)
                die_with_parent(signal.SIGTERM, self.pid)
                set_name(COORDINATOR_NAME)
                self.start(self.handover, theirs, self.ready_fd)
            except BaseException:  # (os._exit below: nothing would print it)
                log.exception("the coordinator of %s failed", self.mountpoint)
            finally:
                os._exit(1)
        theirs.close()
        if self.ready_fd is not None:  # the first coordinator reports; a death closes the pipe
            os.close(self.ready_fd)
            self.ready_fd = None
        if self.sock is not None:
            self.sock.close()
        self.sock = ours
        self.coordinator = pid
        # what this one publishes first moves it (the first one: -1, the handover comes after)
        self.started_at_sequence = self._sequence()
        log.debug("coordinator %d started%s", pid, " (taking over)" if self.handover else "")

    def _read_messages(self) -> None:
        """Take every message the coordinator sent."""
        while self.sock is not None:
            try:
                ready, _, _ = select.select([self.sock], [], [], 0)
                if not ready:
                    return
                message, fds = receive(self.sock)
            except OSError:
                return
            if not message:
                self.sock.close()
                self.sock = None
                return
            words = message.split(b" ", 1)
            if words[0] == b"session" and len(fds) == 2 and self.handover is None:
                self.handover = Handover(fds[0], fds[1])
                log.debug("the connection of %s is handed over", self.mountpoint)
            elif words[0] == b"worker" and len(fds) == 1 and len(words) == 2 and words[1].isdigit():
                pid = int(words[1])
                self.clones[pid] = fds[0]
                if pid in self.exited:  # it died before its clone came
                    self._worker_exited(pid, self.exited.pop(pid))
            else:
                for fd in fds:
                    os.close(fd)
                log.warning("supervisor: unknown message %r", message[:40])

    def _reap(self) -> Optional[int]:
        """Reap every child that exited; the mount's exit status once it
        is over, else None."""
        self._read_messages()  # clones sent before a death are known first
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 0 if self.stopping else None
            if pid == 0:
                return None
            code = os.waitstatus_to_exitcode(status)
            if pid != self.coordinator:
                self._worker_exited(pid, code)
                continue
            self.coordinator = 0
            if self.leaving and code == 0:  # it left for an upgrade: its successor, of the code now installed
                self.leaving = False
                self.handover.upgrade = True
                self._fork()
                self.handover.upgrade = False
                continue
            if code != 0 and self.handover is not None and not self.stopping and not self._mounted():
                log.warning("the coordinator of %s exited (%s) after the mount ended", self.mountpoint, _how(code))
                return code
            if code == 0 or self.handover is None or self.stopping:
                if code != 0:
                    log.error("the coordinator of %s exited (%s)%s", self.mountpoint, _how(code),
                              "" if self.handover else " before the mount served: ending it")
                return code
            took_over = self.started_at_sequence < 0 or self._sequence() != self.started_at_sequence
            self.failed_starts = 0 if took_over else self.failed_starts + 1
            if self.failed_starts >= MAX_FAILED_STARTS:
                log.error("%d coordinators of %s in a row died before taking it over: unmounting",
                          self.failed_starts, self.mountpoint)
                return 1
            log.warning("the coordinator of %s died (%s): starting another", self.mountpoint, _how(code))
            self._fork()

    def _mounted(self) -> bool:
        """The mount point is still mounted (else the mount ended: an
        unmount, the connection aborted) and there is nothing to restart."""
        from shardfs.fuse.mount import is_mounted

        return is_mounted(self.mountpoint)

    def _sequence(self) -> int:
        """The shard table's sequence number in the shared state (its
        first word, `shardfs.fuse.shared.SEQ`), -1 before the handover."""
        if self.handover is None:
            return -1
        import mmap

        with mmap.mmap(self.handover.state_fd, 8, prot=mmap.PROT_READ) as head:
            return struct.unpack("q", head[:8])[0]

    def _worker_exited(self, pid: int, code: int) -> None:
        """A worker (or another process left to this one) exited: if it
        held requests, have them queued again, then let its clone go, and
        tell the coordinator."""
        clone = self.clones.pop(pid, None)
        if clone is None:
            self.exited[pid] = code
            if len(self.exited) > 4096:  # pids of processes that were not workers
                self.exited.pop(next(iter(self.exited)))
        else:
            if code != 0 and self.resends is not False:
                self._resend(pid, clone)
            os.close(clone)
        if self.sock is not None:
            try:
                send(self.sock, b"exit %d %d" % (pid, code))
            except OSError:
                pass

    def _resend(self, pid: int, clone: int) -> None:
        """Have the kernel queue again what worker `pid` read and did not
        answer (written on its clone: any descriptor of the connection
        will do), so that the other workers answer it."""
        try:
            self.resends = resend(clone)
        except OSError as exc:
            log.warning("cannot ask the kernel to resend the requests of worker %d: %s", pid, exc)
            return
        if self.resends:
            log.info("requests worker %d held were queued again for the other workers", pid)
        else:
            log.warning("this kernel cannot resend requests (FUSE_NOTIFY_RESEND: Linux 6.9 and later): "
                        "those a dead worker held end with ECONNABORTED")

    def _end_children(self) -> None:
        """The mount is over: unmount if it is still there, end what is
        left (SIGTERM, then SIGKILL after STOP_GRACE), reap it."""
        from shardfs.fuse import service
        from shardfs.fuse.mount import _run_unmount, is_mounted

        self.stopping = True
        try:
            if is_mounted(self.mountpoint):
                service.notify("STOPPING=1")  # (a coordinator that unmounted said it already)
                _run_unmount(self.mountpoint, lazy=True)
        except Exception as exc:  # pragma: no cover - logged, the processes still end
            log.warning("cannot unmount %s: %s", self.mountpoint, exc)
        sig = signal.SIGTERM
        deadline = time.monotonic() + STOP_GRACE
        while True:
            children = _children(self.pid)
            if not children:
                break
            if time.monotonic() > deadline:
                for pid in children:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                sig = signal.SIGKILL
                deadline = time.monotonic() + STOP_GRACE
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                break
            time.sleep(0.02)
        for fd in self.clones.values():
            os.close(fd)
        self.clones.clear()


def _how(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"status {code}"


def _children(pid: int) -> Set[int]:
    """Process IDs of the children of `pid` (from /proc)."""
    out: Set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return out
