"""Facts about this machine, and FUSE housekeeping, shared by the benchmark scripts."""
import os
import shutil


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def memory_bytes() -> int:
    """Physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def abort_fuse_connection(mountpoint: str) -> None:
    """Abort the FUSE connection of the mount at `mountpoint` (through
    fusectl, /sys/fs/fuse/connections), so that processes blocked on a hung
    daemon get ENOTCONN. Does nothing when it is not a FUSE mount."""
    target = os.path.realpath(mountpoint)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == target:
                    minor = fields[2].split(":")[1]
                    with open(f"/sys/fs/fuse/connections/{minor}/abort", "w") as a:
                        a.write("1")
    except OSError:
        pass


def can_mount() -> bool:
    """Whether this machine can make a shardfs mount: /dev/fuse and
    fusermount3 are there."""
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
