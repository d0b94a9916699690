"""Takedowns told to the mounts of this host at once.

Objects are served in the kernel's no-open mode (``shardfs/c/ll.h``): once
the kernel has an object's name and pages, an ``open`` and a ``read`` of it
never reach the mount, so reading the index slot at every request cannot
refuse a taken-down object by itself. The coordinator invalidates the
object in the kernel when it learns of the takedown (inotify on a shard
file, SIGHUP for a block device), but that is within the live bound, not
at once.

So ``shardfs delete`` tells every shardfs mount of this host itself, and
returns only once they answered: each coordinator listens on an abstract
Unix stream socket named after its mount's unique ID (``statx(2)``'s
``STATX_MNT_ID_UNIQUE``, Linux 6.8 and later: never given to another mount
until the host restarts), ``\\0shardfs-control-u<unique mount ID>``; on an
older kernel, after the mount ID of ``/proc/self/mountinfo``,
``\\0shardfs-control-<mount ID>``, which the kernel gives again as soon as a
mount is gone: a coordinator that outlives its mount (a worker still busy
with a slow read) would then be asked in place of the next mount's. A
request is one line of JSON::

    {"op": "takedown", "shard": {"dev": D, "ino": I} or {"rdev": R}, "keys": ["<64 hex>", ...]}

naming the shard by its file (device and inode numbers of a regular file,
the device number of a block device). The coordinator invalidates, in
every shard it serves from that file, the names of the keys in every
directory where they can be looked up and the inodes of their slots
(attributes and cached pages), with no scan of the shard, then
answers one line, ``{"shards": N, "invalidated": K}`` (N: shards it serves
from that file, 0 when none), or ``{"error": "..."}``.

Who may ask: the coordinator answers only a peer (``SO_PEERCRED``) of uid
0 or its own uid; the client speaks only to a listener of uid 0 or the
mount's ``user_id`` (from ``mountinfo``), so a squatter on the name is
neither believed nor told which keys were taken down.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import socket
import stat
import struct
import threading
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

#: Prefix of a coordinator's abstract socket name; the mount ID follows.
ADDRESS_PREFIX = b"\0shardfs-control-"
#: Seconds `tell_takedown` waits for each mount's answer.
TIMEOUT = 10.0
#: Largest request line a coordinator reads, in bytes (about 240,000 keys).
MAX_REQUEST = 16 << 20


@dataclass(frozen=True)
class Mount:
    """A shardfs mount of this host, from ``/proc/self/mountinfo``."""
    point: str     # the mount point, as mountinfo shows it
    mnt_id: int    # the mount ID (first field)
    user_id: int   # the FUSE ``user_id`` option: the uid that mounted it

    @property
    def address(self) -> bytes:
        """The abstract socket name its coordinator listens on."""
        return address(self.mnt_id, unique_mount_id(self.point, self.mnt_id))


#: statx(2): its system call number by machine, flags and mask bits
#: (include/uapi/linux/stat.h, fcntl.h), and where `stx_mnt_id` lies in
#: struct statx (bytes 144..152).
_SYS_STATX = {"x86_64": 332, "aarch64": 291}
_AT_FDCWD, _AT_NO_AUTOMOUNT, _AT_STATX_DONT_SYNC = -100, 0x800, 0x4000
_STATX_MNT_ID, _STATX_MNT_ID_UNIQUE = 0x1000, 0x4000
_STX_MNT_ID_OFFSET = 144


def _statx_mount_id(path: str, mask: int) -> Optional[int]:
    """`stx_mnt_id` of `path` for `mask`, asked without a request to the
    filesystem (AT_STATX_DONT_SYNC: a hung mount does not hang this), or
    None when the kernel does not give it."""
    number = _SYS_STATX.get(platform.machine())
    if number is None:
        return None
    buf = ctypes.create_string_buffer(256)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, _AT_FDCWD, os.fsencode(path), _AT_NO_AUTOMOUNT | _AT_STATX_DONT_SYNC,
                    ctypes.c_uint(mask), buf) != 0:
        return None
    if not struct.unpack_from("I", buf, 0)[0] & mask:
        return None
    return struct.unpack_from("Q", buf, _STX_MNT_ID_OFFSET)[0]


def unique_mount_id(point: str, mnt_id: int) -> Optional[int]:
    """The unique mount ID of mount `mnt_id` at `point`, or None (a kernel
    before 6.8, or another mount on top of it at `point`)."""
    if _statx_mount_id(point, _STATX_MNT_ID) != mnt_id:
        return None
    return _statx_mount_id(point, _STATX_MNT_ID_UNIQUE)


def address(mnt_id: int, unique: Optional[int] = None) -> bytes:
    """The abstract socket name of the coordinator of mount `mnt_id` whose
    unique mount ID is `unique` (None: the kernel gives none)."""
    if unique is not None:
        return ADDRESS_PREFIX + b"u%d" % unique
    return ADDRESS_PREFIX + str(mnt_id).encode("ascii")


def shardfs_mounts(mountinfo: str = "/proc/self/mountinfo") -> List[Mount]:
    """The mounts of type ``fuse.shardfs`` in `mountinfo` (none when it
    cannot be read)."""
    found = []
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        tail = line.split(" - ", 1)[1].split()
        if len(tail) < 3 or tail[0] != "fuse.shardfs":
            continue
        options = dict(o.split("=", 1) for o in tail[2].split(",") if "=" in o)
        try:
            found.append(Mount(fields[4].replace("\\040", " "), int(fields[0]), int(options.get("user_id", "0"))))
        except ValueError:
            continue
    return found


def file_identity(st: os.stat_result) -> Dict[str, int]:
    """How a request names a shard: ``{"rdev": N}`` for a block device,
    else ``{"dev": N, "ino": N}`` (of `st`, an ``os.stat`` of the shard)."""
    if stat.S_ISBLK(st.st_mode):
        return {"rdev": st.st_rdev}
    return {"dev": st.st_dev, "ino": st.st_ino}


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of Unix socket `sock`."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[2]


def tell_takedown(shard_path: str, keys: Iterable[bytes], timeout: float = TIMEOUT,
                  mountinfo: str = "/proc/self/mountinfo") -> List[Tuple[Mount, Optional[dict], Optional[str]]]:
    """Tell every shardfs mount of this host that `keys` (32-byte raw
    keys) were taken down from the shard at `shard_path`, and wait for
    each to invalidate them (up to `timeout` seconds each).

    Returns one ``(mount, answer, error)`` per mount: `answer` the
    coordinator's reply (``{"shards": N, "invalidated": K}``; N = 0 when
    it does not serve that shard; ``{"shards": 0, "invalidated": 0,
    "dead": True}`` for a mount whose server is gone, which serves
    nothing), or `error` a one-line reason (no coordinator listening: a
    mount of an older shardfs, or one being torn down; a timeout; a
    listener of the wrong uid). Raises OSError when
    `shard_path` cannot be stat'ed.
    """
    request = (json.dumps({"op": "takedown", "shard": file_identity(os.stat(shard_path)),
                           "keys": [bytes(k).hex() for k in keys]}) + "\n").encode("ascii")
    results = []
    for mount in shardfs_mounts(mountinfo):
        answer, error = None, None
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(timeout)
                sock.connect(mount.address)
                uid = peer_uid(sock)
                if uid not in (0, mount.user_id):
                    raise PermissionError(f"the listener is uid {uid}, the mount's is {mount.user_id}")
                sock.sendall(request)
                reply = b""
                while not reply.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("the coordinator closed the connection without answering")
                    reply += chunk
            answer = json.loads(reply)
            if "error" in answer:
                answer, error = None, str(answer["error"])
        except socket.timeout:
            error = f"no answer within {timeout:g} s"
        except ConnectionRefusedError:
            if _dead(mount.point):
                answer = {"shards": 0, "invalidated": 0, "dead": True}
            else:
                error = "no coordinator listening (a mount by an older shardfs, or one being unmounted)"
        except (OSError, ValueError) as exc:
            error = str(exc) or type(exc).__name__
        results.append((mount, answer, error))
    return results


def _dead(point: str, timeout: float = 1.0) -> bool:
    """True when the mount at `point` has lost its server (its processes
    died: `shardfs.fuse.mount.is_stale`), so it serves nothing. The probe
    runs in a daemon thread so that a mount whose server is alive but stuck
    cannot hang the caller: it counts as not dead after `timeout` seconds."""
    from shardfs.fuse.mount import is_stale

    found: List[bool] = []
    thread = threading.Thread(target=lambda: found.append(is_stale(point)), name="shardfs-mount-probe",
                              daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(found and found[0])


def parse_request(line: bytes) -> Tuple[Dict[str, int], List[bytes]]:
    """(shard identity, raw keys) of a request line; ValueError when it is
    not one (see the module's docstring)."""
    request = json.loads(line)
    if not isinstance(request, dict) or request.get("op") != "takedown":
        raise ValueError("unknown request")
    ident = request.get("shard")
    if not isinstance(ident, dict) or not (set(ident) in ({"rdev"}, {"dev", "ino"})) \
            or not all(isinstance(v, int) for v in ident.values()):
        raise ValueError("bad shard identity")
    keys = request.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) and len(k) == 64 for k in keys):
        raise ValueError("keys: expected a list of 64-hex keys")
    return ident, [bytes.fromhex(k) for k in keys]
