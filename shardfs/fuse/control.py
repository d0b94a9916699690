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
Unix stream socket named after its mount's ID (``/proc/self/mountinfo``'s
first field, unique on the host), ``\\0shardfs-control-<mount ID>``. A
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

import json
import os
import socket
import stat
import struct
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


def address(mnt_id: int) -> bytes:
    """The abstract socket name of the coordinator of mount `mnt_id`."""
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
    it does not serve that shard), or `error` a one-line reason (no
    coordinator listening: a mount of an older shardfs, or one being torn
    down; a timeout; a listener of the wrong uid). Raises OSError when
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
                sock.connect(address(mount.mnt_id))
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
            error = "no coordinator listening (a mount by an older shardfs, or one being unmounted)"
        except (OSError, ValueError) as exc:
            error = str(exc) or type(exc).__name__
        results.append((mount, answer, error))
    return results


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
