"""Which shards have files open on a mount, found in /proc.

Objects are served in the kernel's no-open mode (``shardfs/c/ll.h``): the
kernel sends no OPEN or RELEASE, so the mount is never told that a file is
opened or closed. Yet a shard must stay open while a file of it is: its
reads reach the mount by inode, and once a shard is replaced or removed
under the mount, its file (and the bytes of that open file) can only be
read through a descriptor still open on it.

So the processes of a mount look at the open files themselves: every
process's ``/proc/PID/fdinfo/N`` gives the mount ID (``mnt_id``) and the
inode (``ino``) of descriptor N, without touching the file; an object's
inode names its shard (``shardfs.fuse.layout``). That reads one small
file per descriptor of the machine (milliseconds for a few thousand), so
the answer is kept for
`MAX_AGE` seconds where a slightly old one is fine (deciding which shard a
process may close when it has too many open) and looked up afresh where it
is not (closing a removed shard). Processes this one may not look into
(another user's, without root) are not seen.
"""

from __future__ import annotations

import os
import time
from typing import Optional, Set

from shardfs.fuse.layout import DB_INODE_FLAG, OBJECT_SHIFT

#: Seconds an answer is reused by `OpenFiles.in_use`: for a shard with no
#: file open, and for one with a file open.
MAX_AGE = 1.0
FRESH = 0.05


def mount_id(mountpoint: str) -> Optional[int]:
    """The mount ID (/proc/self/mountinfo's first field, fdinfo's mnt_id)
    of the filesystem mounted last on `mountpoint`, None if none is."""
    found = None
    target = os.path.abspath(mountpoint)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4].replace("\\040", " ") == target:
                found = int(fields[0])
    return found


def open_inodes(mnt_id: int) -> Set[int]:
    """Inodes of the files any process has open on mount `mnt_id`."""
    inodes: Set[int] = set()
    want = b"mnt_id:\t%d\n" % mnt_id
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fdinfo = f"/proc/{pid}/fdinfo"
        try:
            fds = os.listdir(fdinfo)
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"{fdinfo}/{fd}", "rb") as f:
                    text = f.read()
            except OSError:
                continue
            if want not in text:
                continue
            at = text.find(b"\nino:\t")
            if at >= 0:
                inodes.add(int(text[at + 6:text.index(b"\n", at + 6)]))
    return inodes


class OpenFiles:
    """The shards with object files open on the mount at `mountpoint`."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        self.mnt_id: Optional[int] = None
        self._shards: Set[int] = set()
        self._at = -1e9

    def shards(self, max_age: float = MAX_AGE) -> Set[int]:
        """Numbers of the shards some process has an object file open on,
        looked up again when the last answer is older than `max_age`
        seconds. When the mount cannot be found in /proc/self/mountinfo
        (it is gone), none."""
        now = time.monotonic()
        if now - self._at > max_age:
            if self.mnt_id is None:
                self.mnt_id = mount_id(self.mountpoint)
            inodes = open_inodes(self.mnt_id) if self.mnt_id is not None else set()
            self._shards = {(ino >> OBJECT_SHIFT) - 1 for ino in inodes
                            if ino >> OBJECT_SHIFT and not ino & DB_INODE_FLAG}
            self._at = now
        return self._shards

    def in_use(self, number: int) -> bool:
        """Whether a file of shard `number` is open, for
        `shardfs.shardset.ShardSet.in_use`: a "no" may be MAX_AGE
        seconds old (the coordinator keeps such a shard open meanwhile),
        a "yes" is checked again unless it is FRESH seconds old (a shard is
        not kept open past the bound on a file closed since)."""
        return number in self.shards() and number in self.shards(max_age=FRESH)
