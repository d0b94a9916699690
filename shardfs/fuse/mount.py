"""Mounting and unmounting shards: checks, serving, the daemon.

`mount_shards()` checks what it can before touching the kernel (the
options, the mount point, the shard directory, the layout), then either
serves in the foreground (`foreground=True`, until SIGINT/SIGTERM or an
external unmount) or starts a detached daemon process and returns once the
filesystem answers. The process that serves opens and validates the shards
(`shardfs.shardset.open_shard_set`): an error there fails the mount with one line.

The daemon is a fresh interpreter (``python -m shardfs.fuse.mount --serve``),
not a fork of the caller (a command line, a test, a library user whose
threads and state a fork would copy half-way). It
reports readiness (or the error that stopped it) on a pipe whose descriptor
it receives with ``--ready-fd``; its stderr stays a pipe to the parent until
then, so libfuse's own messages reach the user too.

`umount()` unmounts with ``fusermount3 -u`` (``umount`` when fusermount3 is
missing) and clears a stale mount left by a killed daemon ("Transport
endpoint is not connected") with a lazy unmount.

Errors the user can fix (bad mount point, bad option, not a mount) raise
`shardfs.ShardError` with a one-line message.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # imported lazily at run time: the mount's modules and trio are heavy
    from shardfs.fuse.layout import Layout
    from shardfs.shardset import ShardSet

log = logging.getLogger("shardfs.fuse")

#: Seconds `mount_shards()` waits for the daemon to answer before giving up.
READY_TIMEOUT = 10.0
#: Seconds between two progress lines of a daemon opening its shards.
PROGRESS_SECONDS = 1.0

#: Mount options always given (the user may add more, never "rw").
BASE_OPTIONS = ("ro", "subtype=shardfs", "default_permissions", "nosuid", "nodev")

#: The filesystem type a shardfs mount shows in /proc/self/mountinfo.
FSTYPE = "fuse.shardfs"


def _shard_error(message: str) -> Exception:
    from shardfs import ShardError

    return ShardError(message)


# ------------------------------------------------------------- mount table


def _unescape_mountinfo(field: str) -> str:
    """Decode the octal escapes (\\040 for a space, ...) of a mountinfo field."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_entry(path: str) -> Optional[dict]:
    """The mount table entry whose mount point is `path`, or None.

    Reads /proc/self/mountinfo, so a stale FUSE mount (whose mount point
    cannot even be stat'ed) is found too; `os.path.ismount` misses those.
    Returns a dict with keys mountpoint, fstype, source; the last mount
    stacked on `path` wins.
    """
    target = _canonical(path)
    found = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                if "-" not in fields:
                    continue
                sep = fields.index("-")
                if len(fields) < sep + 3:
                    continue
                if _unescape_mountinfo(fields[4]) == target:
                    found = {
                        "mountpoint": target,
                        "fstype": fields[sep + 1],
                        "source": _unescape_mountinfo(fields[sep + 2]),
                    }
    except OSError:
        return {"mountpoint": target, "fstype": "?", "source": "?"} if _ismount(path) else None
    return found


def is_mounted(path: str) -> bool:
    """True when something is mounted on `path` (stale FUSE mounts included)."""
    return mount_entry(path) is not None


def _ismount(path: str) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def _canonical(path: str) -> str:
    """Absolute path with the parent's symlinks resolved, without stat-ing
    `path` itself (a stale mount point cannot be stat'ed)."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if not name:
        return path
    return os.path.join(os.path.realpath(parent), name)


def is_stale(path: str) -> bool:
    """True when `path` is a FUSE mount whose process is gone.

    statvfs always reaches the filesystem (a stat may be answered from the
    kernel's attribute cache), so a dead connection shows as ENOTCONN.
    """
    try:
        os.statvfs(path)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


# ----------------------------------------------------------------- checks


def check_mountpoint(mountpoint: str) -> str:
    """Return the canonical mount point path if one can mount there.

    It must exist, be a directory, be empty and not be a mount point
    already; a stale shardfs mount (its daemon was killed) is unmounted
    first. Raises ShardError with a one-line message otherwise.
    """
    path = _canonical(mountpoint)
    entry = mount_entry(path)
    if entry is not None:
        if is_stale(path):
            if entry["fstype"] != FSTYPE:
                raise _shard_error(
                    f"mount point {mountpoint} holds a stale {entry['fstype']} mount "
                    f"(its filesystem process died); unmount it first")
            # A shardfs daemon was killed (kill -9, OOM): clear its mount
            # and mount again, as 'shardfs umount' would.
            log.warning("mount point %s holds a stale shardfs mount: unmounting it", mountpoint)
            ok, message = _run_unmount(path, lazy=True)
            if not ok or is_mounted(path):
                raise _shard_error(f"mount point {mountpoint} holds a stale mount that cannot be "
                                   f"unmounted: {message or 'still mounted'}")
        else:
            raise _shard_error(f"mount point {mountpoint} is already a mount point")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _shard_error(f"mount point {mountpoint} does not exist") from None
    except OSError as exc:
        raise _shard_error(f"mount point {mountpoint}: {exc.strerror}") from None
    import stat as stat_mod

    if not stat_mod.S_ISDIR(st.st_mode):
        raise _shard_error(f"mount point {mountpoint} is not a directory")
    try:
        with os.scandir(path) as it:
            if any(True for _ in it):
                raise _shard_error(f"mount point {mountpoint} is not empty")
    except PermissionError:
        raise _shard_error(f"mount point {mountpoint}: permission denied") from None
    return path


#: ``-o`` options shardfs reads itself (never given to libfuse):
#: owner of every file, layout, slicing, sidecar cache directory, number
#: of worker processes.
OWN_OPTIONS = ("uid", "gid", "layout", "slicing", "cache_dir", "workers", "metrics", "winery_pools_dir", "hashes",
               "ceph_conf", "ceph_id", "ceph_timeout", "winery_rbd", "s3_endpoint", "s3_region", "s3_timeout")

#: Options mount(8) and mount.fuse3 pass by default (``rw,dev,suid`` for
#: an fstab line with ``defaults``), accepted and ignored when shardfs runs
#: as a mount helper: a shardfs mount is always ro, nosuid and nodev.
HELPER_IGNORED = ("rw", "dev", "suid", "exec", "auto", "noauto", "user", "nouser",
                  "users", "_netdev", "nofail", "defaults")


def build_options(shard_paths: Sequence[str], user_options: Optional[Iterable[str]],
                  helper: bool = False) -> "Tuple[List[str], Dict[str, str]]":
    """Split ``-o`` options into (libfuse options, shardfs's own options).

    `user_options` items may be comma-separated lists. The libfuse list is
    ours (`BASE_OPTIONS`, fsname) plus the user's; a user fsname= or
    subtype= replaces ours. Own options (`OWN_OPTIONS`) come back as a dict
    of strings. "rw", "suid" and "dev" are refused (shardfs is read-only,
    nosuid, nodev), except with `helper` (run by mount.fuse3), where they
    and the other `HELPER_IGNORED` options are dropped. Raises ShardError
    for a refused or malformed option.
    """
    extra: List[str] = []
    own: Dict[str, str] = {}
    for item in user_options or ():
        for opt in str(item).split(","):
            opt = opt.strip()
            if not opt:
                continue
            if helper and opt in HELPER_IGNORED:
                continue
            if opt in ("rw", "suid", "dev"):
                raise _shard_error(f"mount option '{opt}' is not allowed: shardfs is always ro,nosuid,nodev")
            if not opt.isascii() or any(c.isspace() for c in opt):
                raise _shard_error(f"invalid mount option {opt!r}")
            key, eq, value = opt.partition("=")
            if key in OWN_OPTIONS:
                if not eq or not value:
                    raise _shard_error(f"mount option {key} needs a value ({key}=...)")
                own[key] = value
                continue
            extra.append(opt)
    for key in ("uid", "gid", "workers"):
        if key in own and not own[key].isdigit():
            raise _shard_error(f"mount option {key}={own[key]}: expected a number")
    if "workers" in own:
        from shardfs.fuse.shared import MAX_WORKERS

        if not 1 <= int(own["workers"]) <= MAX_WORKERS:
            raise _shard_error(f"mount option workers={own['workers']}: expected 1 to {MAX_WORKERS}")
    name = os.path.basename(os.path.abspath(shard_paths[0])) if shard_paths else "shard"
    # libfuse splits options on commas and wants ASCII: keep the name tame.
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", name) or "shard"
    options = [f"fsname=shardfs:{name}"] + list(BASE_OPTIONS)
    for opt in extra:
        key = opt.split("=", 1)[0]
        if key in ("fsname", "subtype"):
            options = [o for o in options if not o.startswith(key + "=")]
        if opt not in options:
            options.append(opt)
    return options, own


# ---------------------------------------------------------------- logging


def setup_logging(debug: bool, log_file: Optional[str], stream: Optional[IO[str]] = None) -> None:
    """Send the "shardfs.fuse" logger to `log_file`, else to
    `stream` (stderr by default). Levels: DEBUG with `debug`; else INFO
    (mount, unmount, signals) into a log file, WARNING to a terminal."""
    if log_file:
        handler: logging.Handler = logging.FileHandler(log_file)
    else:
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(name)s[%(process)d] %(levelname)s: %(message)s")
    )
    for name in ("shardfs.fuse",):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
        if debug:
            logger.setLevel(logging.DEBUG)
        elif name == "shardfs.fuse" and log_file:
            logger.setLevel(logging.INFO)  # a log file gets mount/unmount events
        else:
            logger.setLevel(logging.WARNING)  # a terminal only gets problems


# ------------------------------------------------------------------ serve


#: The default layout lists every object at the root ("flat") when the
#: mount holds at most this many objects when it starts, else "fanout".
AUTO_FLAT_LIMIT = 100_000


def open_winery(dsn: str, pools_dir: Optional[str], cache_dir: Optional[str]) -> "Tuple[ShardSet, object, object]":
    """Open a winery deployment for a mount: (shard set of its images,
    the coordinator's `shardfs.winery.Catalog`, the workers'
    `shardfs.fuse.winery.WineryView`). Raises WineryError (one line) when
    the database is not a usable winery database or is down."""
    from shardfs.shardset import ShardSet, use_global_index
    from shardfs.fuse.winery import WineryView
    from shardfs.winery import Catalog, Database, Reader, check, describe

    check(dsn)
    shards = ShardSet(cache_dir=cache_dir)
    use_global_index(shards, f"winery {describe(dsn)} {pools_dir}")
    try:
        catalog = Catalog(Database(dsn, max_size=1, name="shardfs coordinator"), pools_dir)
        catalog.sync(shards)
        if shards.known is not None:  # for the next start (see open_shard_set)
            shards.known.save(m.path for m in shards.served())
            shards.known = None
        # Its pool is made by each worker on first use (never across a fork).
        view = WineryView(Reader(shards, Database(dsn, max_size=2, name="shardfs worker")))
        view.reader.update(catalog.tables, catalog.hidden)
    except BaseException:
        shards.close()
        raise
    return shards, catalog, view


#: The names `--layout` takes.
LAYOUTS = ("auto", "flat", "fanout")


def check_layout(name: str, slicing: Optional[str]) -> None:
    """Raise ShardError (one line) when `name` is not one of LAYOUTS or
    `slicing` (None: the default) is not a valid slicing."""
    from shardfs.fuse.layout import parse_slicing

    if name not in LAYOUTS:
        raise _shard_error(f"unknown layout {name!r}: expected auto, flat or fanout")
    if slicing is not None:
        try:
            parse_slicing(slicing)
        except ValueError as exc:
            raise _shard_error(str(exc)) from None


def choose_layout(name: str, slicing: Optional[str], shards: "ShardSet") -> "Layout":
    """The Layout for `--layout NAME` ("auto", "flat" or "fanout") and
    `--slicing`. "auto" is flat up to AUTO_FLAT_LIMIT objects, else fan-out.
    Raises ShardError for an unknown name or a bad slicing (`check_layout`)."""
    from shardfs.fuse.layout import DEFAULT_SLICING, Layout

    check_layout(name, slicing)
    if name == "auto":
        total = sum(m.objects_count for m in shards.served())
        followed = shards.shard_dir is not None or getattr(shards, "followed", False)
        name = "flat" if total <= AUTO_FLAT_LIMIT and not followed else "fanout"
    if name == "flat":
        return Layout.flat()
    return Layout.fanout(slicing or DEFAULT_SLICING)


def serve(
    shards: "ShardSet",
    mountpoint: str,
    options: Sequence[str],
    layout: Optional["Layout"] = None,
    uid: Optional[int] = None,
    gid: Optional[int] = None,
    ready_fd: Optional[int] = None,
    on_ready: Optional[Callable[[], None]] = None,
    workers: Optional[int] = None,
    winery: "Optional[Tuple[object, object]]" = None,
    metrics: Optional[str] = None,
    supervisor: Any = None,
    handover: Any = None,
    state: Any = None,
) -> int:
    """Mount the shard set on `mountpoint` and serve until unmounted or
    signalled, with `workers` worker processes (default:
    `shardfs.fuse.coordinator.default_workers()`); see
    `shardfs.fuse.coordinator`. `winery`: (catalog, view) of
    `open_winery`, for a mount of a winery deployment. `metrics`:
    HOST:PORT where the coordinator serves Prometheus metrics
    (`shardfs.fuse.metrics`), None for none. `supervisor`, `handover`,
    `state`: see `shardfs.fuse.coordinator.Coordinator` (a mount run by
    `shardfs.fuse.supervisor`).

    SIGINT and SIGTERM unmount and end every process; SIGHUP rescans the
    shards and checks them for takedowns. The filesystem is unmounted on the way out whatever happens.
    When `ready_fd` is given, "ok\\n" is written to it once the mount
    answers a stat, or "error: <message>\\n" if mounting failed, and it is
    closed; `on_ready` is called before the workers start. Returns the exit
    status (0 = clean unmount). Raises ShardError when libfuse refuses.
    """
    from shardfs.fuse.coordinator import Coordinator, default_workers
    from shardfs.fuse.handlers import ShardFS

    catalog, view = winery if winery is not None else (None, None)
    fs = ShardFS(shards, layout=layout, uid=uid, gid=gid, winery=view)
    if catalog is not None:
        what = f"winery database {catalog.db.where}"
    else:
        what = shards.shard_dir or ", ".join(m.path for m in shards.served())
    description = (f"{what} on {mountpoint} ({len(shards)} shard(s), layout {fs.layout.describe()}, "
                   f"options {','.join(options)})")
    coordinator = Coordinator(fs, mountpoint, options, workers or default_workers(),
                              report=lambda message: _report(ready_fd, message), on_ready=on_ready,
                              description=description,
                              private_fds=(ready_fd,) if ready_fd is not None else (),
                              catalog=catalog, metrics=metrics, supervisor=supervisor, handover=handover,
                              state=state)
    try:
        status = coordinator.serve()
    except (KeyboardInterrupt, SystemExit):
        _report(ready_fd, "error: interrupted")
        raise
    finally:
        if catalog is not None:
            catalog.db.close()
    if coordinator.leaving:
        log.info("left %s to the next coordinator", mountpoint)
    else:
        log.info("unmounted %s", mountpoint)
    return status


def _report(ready_fd: Optional[int], message: str) -> None:
    """Write one status line to the parent (once), then close the pipe."""
    global _reported
    if ready_fd is None or _reported:
        return
    _reported = True
    try:
        os.write(ready_fd, (message.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        os.close(ready_fd)
    except OSError:
        pass


_reported = False


def _progress_reporter(ready_fd: Optional[int]) -> Callable[[int, int], None]:
    """A `progress(done, total)` for `open_shard_set` that tells the parent
    ("progress DONE TOTAL" lines, at most one per PROGRESS_SECONDS, each
    giving it READY_TIMEOUT seconds more), so that a mount of very many
    shards is not taken for a hung one."""
    last = [time.monotonic()]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if ready_fd is None or _reported or now - last[0] < PROGRESS_SECONDS:
            return
        last[0] = now
        try:
            os.write(ready_fd, b"progress %d %d\n" % (done, total))
        except OSError:
            pass

    return progress


# ------------------------------------------------------------------ mount


def mount_shards(
    shard_paths: Sequence[str],
    mountpoint: str,
    foreground: bool = False,
    options: Optional[Sequence[str]] = None,
    debug: bool = False,
    log_file: Optional[str] = None,
    shard_dir: Optional[str] = None,
    layout: Optional[str] = None,
    slicing: Optional[str] = None,
    cache_dir: Optional[str] = None,
    helper: bool = False,
    workers: Optional[int] = None,
    winery: Optional[str] = None,
    winery_pools_dir: Optional[str] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> int:
    """Mount shards read-only on `mountpoint`; return an exit status.

    `winery`, a libpq DSN, mounts a winery object storage instead of shard
    files (`shardfs.winery`): its images from `winery_pools_dir` (a
    directory pool's base directory; default: Ceph images under /dev/rbd)
    and the objects still in its database, followed live. The DSN never
    reaches a command line or the log (the daemon reads it on its stdin);
    the database is checked here first (WineryError, one line).

    `shard_paths` (files or block devices) and/or `shard_dir` (a directory
    whose shards are served and followed live) name what to serve.
    `layout` is "auto" (default), "flat" or "fanout" with `slicing`
    (default "0:2/2:4"); `cache_dir` holds the sidecars (default
    `shardfs.sidecar.default_cache_dir()`). The same settings may come as
    ``-o layout=,slicing=,cache_dir=``, and ``-o uid=,gid=`` set the owner
    of every file, ``-o workers=N`` the number of worker processes (1 to
    64; default: the CPUs, at least 2), ``-o metrics=HOST:PORT`` where
    Prometheus metrics are served (``/metrics``: `shardfs.fuse.metrics`);
    arguments win over ``-o``. `helper`: run by mount.fuse3
    (see `build_options`).

    Checked before anything is mounted: the options, the mount point
    (exists, directory, empty, not a mount point), the shard directory, the
    layout. The shards are opened and validated by the process that serves
    them: a corrupt or missing shard fails the mount with a one-line
    ShardError (CorruptShardError / OSError in the foreground).

    Foreground: serves in this process until SIGINT/SIGTERM or an external
    unmount, then returns 0 (the mount is always removed).
    Background: starts a detached daemon, waits until the filesystem answers
    (at most READY_TIMEOUT seconds) and returns 0; raises ShardError with
    the daemon's error if it could not mount.
    """
    from shardfs import rbd
    from shardfs.shard import is_remote_source

    shard_paths = [p if is_remote_source(p) else os.path.abspath(p) for p in shard_paths]
    options, upgrading = _take_upgrade(options)
    if upgrading and is_mounted(_canonical(mountpoint)):
        workers, seconds = upgrade(mountpoint)
        log.info("upgraded %s: %d worker(s) replaced in %.2f s", mountpoint, workers, seconds)
        return 0
    if winery is not None and (shard_paths or shard_dir is not None):
        raise _shard_error("--winery mounts a winery database: give no SHARD paths nor --shard-dir with it")
    if winery is not None:
        return _mount_winery(winery, mountpoint, foreground, options, debug, log_file, layout, slicing,
                             cache_dir, helper, workers, winery_pools_dir)
    if shard_dir is not None and not is_remote_source(shard_dir):
        shard_dir = os.path.abspath(shard_dir)
        if not os.path.isdir(shard_dir):
            raise _shard_error(f"shard directory {shard_dir} is not a directory")
    if not shard_paths and shard_dir is None:
        raise _shard_error("no shard to mount: give SHARD paths or --shard-dir")
    opts, own = build_options(shard_paths or [shard_dir or "shards"], options, helper=helper)
    settings = _settings(own, layout, slicing, cache_dir, workers, default_layout="auto")
    mp = check_mountpoint(mountpoint)
    check_rbd_sources(shard_paths, shard_dir, settings)
    if not foreground:
        return _spawn_daemon(shard_paths, mp, opts, debug, log_file, progress=progress, shard_dir=shard_dir,
                             **settings)
    setup_logging(debug, log_file)
    from shardfs.shardset import open_shard_set

    configure_remote(settings)
    return _serve_foreground(open_shard_set(shard_paths, shard_dir, settings["cache_dir"]), mp, opts,
                             settings)


def _take_upgrade(options: Optional[Sequence[str]]) -> "Tuple[Optional[List[str]], bool]":
    """(`options` without "upgrade", whether it was there): ``-o upgrade``
    asks `mount_shards` to upgrade a mount point already mounted in place
    (`upgrade`) instead of failing; on a point not mounted it mounts."""
    if options is None:
        return None, False
    kept, found = [], False
    for item in options:
        parts = item.split(",")
        found = found or "upgrade" in parts
        rest = ",".join(p for p in parts if p != "upgrade")
        if rest:
            kept.append(rest)
    return kept, found


def _settings(own: Dict[str, str], layout: Optional[str], slicing: Optional[str],
              cache_dir: Optional[str], workers: Optional[int], default_layout: str) -> Dict[str, object]:
    """The settings of a mount (the daemon's options): each argument, else
    its ``-o`` option (`own`, from `build_options`), else its default.
    Raises ShardError for a bad layout or slicing (`check_layout`)."""
    layout = layout or own.get("layout") or default_layout
    slicing = slicing or own.get("slicing")
    check_layout(layout, slicing)
    hashes = own.get("hashes")
    if hashes is not None:
        from shardfs.hashes import parse_names

        try:
            hashes = ":".join(parse_names(hashes, sep=":"))
        except ValueError as exc:
            raise _shard_error(f"mount option hashes={hashes}: {exc} (several: hashes=sha1:sha1_git)") from None
    timeout = own.get("ceph_timeout")
    if timeout is not None and (not timeout.isdigit() or int(timeout) < 1):
        raise _shard_error(f"mount option ceph_timeout={timeout}: expected whole seconds, at least 1")
    s3_timeout = own.get("s3_timeout")
    if s3_timeout is not None and (not s3_timeout.isdigit() or int(s3_timeout) < 1):
        raise _shard_error(f"mount option s3_timeout={s3_timeout}: expected whole seconds, at least 1")
    metrics = own.get("metrics")
    if metrics is not None:
        from shardfs.fuse.metrics import parse_address

        try:
            parse_address(metrics)
        except ValueError as exc:
            raise _shard_error(f"mount option metrics={exc} (metrics=HOST:PORT)") from None
    conf = own.get("ceph_conf")
    if conf is not None:
        conf = os.path.abspath(conf)
        if not os.path.isfile(conf):
            raise _shard_error(f"mount option ceph_conf={conf}: no such file")
    return {
        "ceph_conf": conf,
        "ceph_id": own.get("ceph_id"),
        "ceph_timeout": int(timeout) if timeout is not None else None,
        "s3_endpoint": own.get("s3_endpoint"),
        "s3_region": own.get("s3_region"),
        "s3_timeout": int(s3_timeout) if s3_timeout is not None else None,
        "layout": layout,
        "slicing": slicing,
        "cache_dir": os.path.abspath(cache_dir or own.get("cache_dir") or _default_cache_dir()),
        "uid": int(own["uid"]) if "uid" in own else None,
        "gid": int(own["gid"]) if "gid" in own else None,
        "workers": workers or (int(own["workers"]) if "workers" in own else None),
        "metrics": metrics,
        "hashes": hashes,
    }


def configure_remote(settings: Dict[str, object]) -> None:
    """Apply a mount's settings of remote sources to this process: Ceph's
    (``-o ceph_conf=,ceph_id=,ceph_timeout=``; isolated, since the
    coordinator forks its workers and builders after opening the shards:
    `shardfs.rbd`), S3's (``-o s3_endpoint=,s3_region=,s3_timeout=``, over
    the AWS_* variables: `shardfs.s3`), and the cache directory of both
    kinds' local copies."""
    from shardfs import rbd, s3

    rbd.configure(conf=settings.get("ceph_conf"), client_id=settings.get("ceph_id"),
                  cache_dir=settings.get("cache_dir"), timeout=settings.get("ceph_timeout"), isolate=True)
    s3.configure(endpoint=settings.get("s3_endpoint"), region=settings.get("s3_region"),
                 timeout=settings.get("s3_timeout"), cache_dir=settings.get("cache_dir"))


def check_rbd_sources(shard_paths: Sequence[str], shard_dir: Optional[str], settings: Dict[str, object]) -> None:
    """Before mounting: every rbd: source's pool can be listed with the
    mount's settings (so a wrong ceph_conf, a refused client or an
    unreachable cluster fail here, in one line) and holds the named
    images. Raises ShardError."""
    from shardfs import rbd

    wanted = [p for p in shard_paths if rbd.is_source(p)] + ([shard_dir] if shard_dir and rbd.is_source(shard_dir) else [])
    if not wanted:
        return
    if not rbd.available():
        raise _shard_error(f"{wanted[0]}: this shardfs was built without librbd: install librbd-dev (Debian) "
                           f"and reinstall shardfs")
    configure_remote(settings)
    pools: Dict[str, List[str]] = {}
    for source in wanted:
        try:
            pool, image = rbd.parse(source)
        except ValueError as exc:
            raise _shard_error(str(exc)) from None
        if pool not in pools:
            try:
                pools[pool] = rbd.list_images(pool)
            except OSError as exc:
                raise _shard_error(exc.strerror or str(exc)) from None
        if image is not None and image not in pools[pool]:
            raise _shard_error(f"{source}: no such image in pool {pool}")


def _serve_foreground(shards: "ShardSet", mountpoint: str, options: List[str], settings: Dict[str, object],
                      winery: "Optional[Tuple[object, object]]" = None) -> int:
    """Serve `shards` in this process (`serve`) until unmounted, then close
    them; returns the exit status."""
    try:
        use_hashes(shards, settings["hashes"])
        layout = choose_layout(settings["layout"], settings["slicing"], shards)
        return serve(shards, mountpoint, options, layout, settings["uid"], settings["gid"],
                     workers=settings["workers"], winery=winery, metrics=settings["metrics"])
    finally:
        shards.close()


def _mount_winery(dsn: str, mountpoint: str, foreground: bool, options: Optional[Sequence[str]],
                  debug: bool, log_file: Optional[str], layout: Optional[str], slicing: Optional[str],
                  cache_dir: Optional[str], helper: bool, workers: Optional[int],
                  pools_dir: Optional[str]) -> int:
    """`mount_shards()` of a winery deployment."""
    from shardfs.winery import check, database_name

    from shardfs import rbd
    from shardfs.winery import LIBRBD

    opts, own = build_options([f"winery-{database_name(dsn)}"], options, helper=helper)
    pools_dir = pools_dir or own.get("winery_pools_dir")
    how = own.get("winery_rbd", "mapped")
    if how not in ("mapped", "librbd"):
        raise _shard_error(f"mount option winery_rbd={how}: expected mapped (/dev/rbd) or librbd")
    if how == "librbd":
        if pools_dir is not None:
            raise _shard_error("mount options winery_rbd=librbd and winery_pools_dir= exclude each other")
        if not rbd.available():
            raise _shard_error("winery_rbd=librbd: this shardfs was built without librbd: install librbd-dev "
                               "(Debian) and reinstall shardfs")
        pools_dir = LIBRBD
    elif pools_dir is not None:
        pools_dir = os.path.abspath(pools_dir)
        if not os.path.isdir(pools_dir) and not os.path.isfile(pools_dir):
            raise _shard_error(f"winery pools directory {pools_dir} is neither a directory nor swh's winery "
                               "settings file")
    settings = _settings(own, layout, slicing, cache_dir, workers, default_layout="fanout")
    mp = check_mountpoint(mountpoint)
    check(dsn)  # a wrong DSN or a database that is not winery's: one line, now
    if pools_dir == LIBRBD:
        configure_remote(settings)
    if not foreground:
        return _spawn_daemon([], mp, opts, debug, log_file, stdin_data=dsn.encode(), winery_stdin=True,
                             winery_pools_dir=pools_dir, **settings)
    setup_logging(debug, log_file)
    shards, catalog, view = open_winery(dsn, pools_dir, settings["cache_dir"])
    shards.followed = True
    return _serve_foreground(shards, mp, opts, settings, winery=(catalog, view))


def use_hashes(shards: "ShardSet", hashes: Optional[str]) -> None:
    """Find the objects of `shards` by the hashes named in `hashes` too
    (``"sha1:sha1_git"``; None: by their keys only): the indexes already
    in the cache directory are used at once, the others built by the
    mount's builder (`shardfs.hashes.HashSet`)."""
    if not hashes:
        return
    from shardfs.hashes import HashSet, parse_names

    shards.hashes = HashSet(shards, parse_names(hashes, sep=":"))
    shards.hashes.scan()


def _default_cache_dir() -> str:
    from shardfs.sidecar import default_cache_dir

    return default_cache_dir()


def _spawn_daemon(shard_paths: List[str], mountpoint: str, options: List[str], debug: bool,
                  log_file: Optional[str], stdin_data: Optional[bytes] = None,
                  progress: Optional[Callable[[int, int], None]] = None, **settings: object) -> int:
    """Start the daemon and wait for its status line. `settings` become
    ``--name value`` arguments (``--name`` alone when True, left out when
    None or False); `stdin_data` is written to its stdin (a secret such as
    a DSN, kept off its command line)."""
    rfd, wfd = os.pipe()
    cmd = [sys.executable, "-m", "shardfs.fuse.mount", "--serve", "--ready-fd", str(wfd), "--mountpoint", mountpoint]
    for opt in options:
        cmd += ["--option", opt]
    for name, value in settings.items():
        if value is True:
            cmd.append("--" + name.replace("_", "-"))
        elif value is not None and value is not False:
            cmd += ["--" + name.replace("_", "-"), str(value)]
    if debug:
        cmd.append("--debug")
    if log_file:
        cmd += ["--log-file", os.path.abspath(log_file)]
    cmd.append("--")
    cmd += shard_paths
    env = dict(os.environ)
    # Make the package importable in the child even when not installed.
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    try:
        child = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(wfd,),
            start_new_session=True,
            cwd="/",
            env=env,
        )
    finally:
        os.close(wfd)
    if stdin_data is not None:
        try:
            child.stdin.write(stdin_data)
            child.stdin.close()
        except OSError:
            pass  # it died: its status says why
    try:
        status = _wait_ready(rfd, child, progress)
    finally:
        os.close(rfd)
    if status == "ok":
        if child.stderr is not None:
            child.stderr.close()
        return 0
    # Failed: collect what the child said on stderr (libfuse messages).
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    detail = ""
    if child.stderr is not None:
        lines = [l.strip() for l in child.stderr.read().decode("utf-8", "replace").splitlines() if l.strip()]
        child.stderr.close()
        if lines:
            detail = lines[-1]
    if is_mounted(mountpoint):  # never leave a half-started mount behind
        _run_unmount(mountpoint, lazy=True)
    if status is None:
        message = f"the filesystem did not answer within {READY_TIMEOUT:g} s; gave up"
    elif status == "":
        message = f"the filesystem process exited with status {child.returncode} before the mount was ready"
    else:
        message = status[len("error: "):] if status.startswith("error: ") else status
    if detail and detail not in message:
        message += f" ({detail})"
    raise _shard_error(message)


def _wait_ready(rfd: int, child: subprocess.Popen,
                progress: Optional[Callable[[int, int], None]] = None) -> Optional[str]:
    """Read the daemon's status line: "ok", "error: ...", "" if the pipe
    closed without a word (the child died), None on timeout (child killed).
    Each "progress DONE TOTAL" line before it (shards opened so far) gives
    the daemon READY_TIMEOUT seconds more, and is passed to `progress`."""
    deadline = time.monotonic() + READY_TIMEOUT
    data = b""
    while True:
        while b"\n" in data:
            line, rest = data.split(b"\n", 1)
            if not line.startswith(b"progress "):
                return line.decode("utf-8", "replace").strip()
            data = rest
            deadline = time.monotonic() + READY_TIMEOUT
            fields = line.split()
            if progress is not None and len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit():
                progress(int(fields[1]), int(fields[2]))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            child.terminate()
            try:
                child.wait(timeout=3)
            except subprocess.TimeoutExpired:
                child.kill()
            return None
        ready, _, _ = select.select([rfd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(rfd, 4096)
        if not chunk:
            return data.decode("utf-8", "replace").strip()
        data += chunk


def _daemon_main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the background daemon (``python -m shardfs.fuse.mount``)."""
    parser = argparse.ArgumentParser(prog="python -m shardfs.fuse.mount", description="shardfs mount daemon (internal)")
    parser.add_argument("--serve", action="store_true", required=True)
    parser.add_argument("--ready-fd", type=int)
    parser.add_argument("--mountpoint", required=True)
    parser.add_argument("--option", action="append", default=[])
    parser.add_argument("--shard-dir")
    parser.add_argument("--layout", default="auto")
    parser.add_argument("--slicing")
    parser.add_argument("--cache-dir")
    parser.add_argument("--uid", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--metrics")
    parser.add_argument("--hashes")
    parser.add_argument("--ceph-conf")
    parser.add_argument("--ceph-id")
    parser.add_argument("--ceph-timeout", type=int)
    parser.add_argument("--s3-endpoint")
    parser.add_argument("--s3-region")
    parser.add_argument("--s3-timeout", type=int)
    parser.add_argument("--winery-stdin", action="store_true", help="read a winery DSN on stdin")
    parser.add_argument("--winery-pools-dir")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--log-file")
    parser.add_argument("--upgrade-from", help="resume a supervisor after an upgrade in place (JSON)")
    parser.add_argument("shards", nargs="*")
    args = parser.parse_args(argv)

    ready_fd = args.ready_fd
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the coordinator handles it
    # Logging: the log file, else nowhere (stderr goes away once detached).
    devnull = open(os.devnull, "w")
    setup_logging(args.debug, args.log_file, stream=devnull if not args.log_file else None)
    if args.winery_stdin or os.environ.get("SHARDFS_NO_SUPERVISOR"):
        # A winery mount is not supervised yet: its coordinator's death ends it.
        # (SHARDFS_NO_SUPERVISOR: TEST ONLY, the structure of a foreground mount.)
        return _coordinator_main(args, ready_fd)
    from shardfs.fuse.supervisor import Supervisor
    # What a coordinator runs, imported once here: one forked after a
    # death takes the mount over sooner (the pages are shared, copy on write).
    import trio  # noqa: F401

    import shardfs.fuse.coordinator  # noqa: F401
    import shardfs.shardset  # noqa: F401

    def start(handover: Any, sock: Any, ready: Optional[int]) -> None:
        os._exit(_coordinator_main(args, ready, handover=handover, supervisor=sock))

    supervisor = Supervisor(start, args.mountpoint, ready_fd)
    if args.upgrade_from:
        supervisor.resume(json.loads(args.upgrade_from))
        return supervisor.run()
    return supervisor.run(on_started=lambda: _detach_stderr(args.log_file))


def adopted_shard_set(args: argparse.Namespace, table: Dict[str, Any]) -> "ShardSet":
    """The shard set of a coordinator taking over a mount: described from
    the last shard table its predecessor published (the same numbers for
    the same shards, the numbering continued after them), nothing opened;
    the coordinator's first rescan then finds what changed since."""
    from shardfs.fuse.worker import apply_table
    from shardfs.shardset import ShardSet, use_global_index

    shards = ShardSet(cache_dir=args.cache_dir, shard_dir=args.shard_dir)
    shards.pinned = list(dict.fromkeys(args.shards))
    use_global_index(shards, args.shard_dir or "\n".join(shards.pinned))
    shards.known = None
    use_hashes(shards, args.hashes)
    apply_table(shards, table, table.get("pid", 0))
    for member in shards.shards.values():
        member.source = None  # descriptors of a process that is gone
    shards.reserve_numbers(table.get("next", 0))
    return shards


def _coordinator_main(args: argparse.Namespace, ready_fd: Optional[int], handover: Any = None,
                      supervisor: Any = None) -> int:
    """The coordinator's part of `_daemon_main`: open the shards (or, with
    `handover`, take over the mount from the shared state), serve."""
    if handover is not None:
        from shardfs.fuse.layout import Layout
        from shardfs.fuse.shared import SharedState

        try:
            state = SharedState.attach(os.dup(handover.state_fd))
            _seq, table = state.read_last()
            state.take_over(table)
            shards = adopted_shard_set(args, table)
            layout = Layout.flat() if table.get("layout") == "flat" else Layout.fanout(table["slicing"])
        except Exception as exc:
            log.error("cannot take %s over: %s", args.mountpoint, exc)
            return 1
        try:
            return serve(shards, args.mountpoint, args.option, layout=layout, uid=args.uid, gid=args.gid,
                         workers=state.workers, metrics=args.metrics, supervisor=supervisor, handover=handover,
                         state=state)
        finally:
            shards.close()
    winery = None
    try:
        if args.winery_stdin:
            dsn = sys.stdin.read().strip()
            sys.stdin.close()
            configure_remote(vars(args))
            shards, catalog, view = open_winery(dsn, args.winery_pools_dir, args.cache_dir)
            shards.followed = True
            winery = (catalog, view)
        else:
            from shardfs.shardset import open_shard_set

            configure_remote(vars(args))
            shards = open_shard_set(args.shards, args.shard_dir, args.cache_dir,
                                    progress=_progress_reporter(ready_fd))
    except Exception as exc:
        _report(ready_fd, f"error: {exc}")
        return 1
    try:
        try:
            check_mountpoint(args.mountpoint)
            use_hashes(shards, args.hashes)
            layout = choose_layout(args.layout, args.slicing, shards)
        except Exception as exc:
            _report(ready_fd, f"error: {exc}")
            return 1
        try:
            return serve(
                shards,
                args.mountpoint,
                args.option,
                layout=layout,
                uid=args.uid,
                gid=args.gid,
                ready_fd=ready_fd,
                on_ready=lambda: _detach_stderr(args.log_file),
                workers=args.workers,
                winery=winery,
                metrics=args.metrics,
                supervisor=supervisor,
            )
        except Exception as exc:
            _report(ready_fd, f"error: {exc}")
            return 1
    finally:
        shards.close()


def _detach_stderr(log_file: Optional[str]) -> None:
    """Point fds 1 and 2 at the log file (or /dev/null) instead of the
    parent's pipe, which goes away once the parent returns.

    Done once the mount answers, just before reporting "ok": libfuse's
    early errors still reach the parent, later ones must not hit a closed
    pipe.
    """
    target = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if log_file else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
    finally:
        os.close(target)


# ---------------------------------------------------------------- umount


def shardfs_mount(mountpoint: str) -> Tuple[str, dict]:
    """(canonical path, `mount_entry`) of the shardfs mount at
    `mountpoint`. Raises ShardError with a one-line message when it is not
    a mount point or not a shardfs mount."""
    path = _canonical(mountpoint)
    entry = mount_entry(path)
    if entry is None:
        raise _shard_error(f"{mountpoint} is not a mount point")
    if entry["fstype"] not in (FSTYPE, "?"):
        raise _shard_error(f"{mountpoint} is not a shardfs mount (it is {entry['fstype']})")
    return path, entry


#: The extended attribute of a mount's root that `status` reads
#: (`shardfs.fuse.handlers.ShardFS.getxattr`).
STATS_XATTR = "user.shardfs.stats"


def status(mountpoint: str) -> dict:
    """What the shardfs mount at `mountpoint` says of itself: the JSON of
    its root's ``user.shardfs.stats`` (`shardfs.fuse.handlers.ShardFS.
    stats`: shards served, global index, lookup records, sidecars, the
    answering worker's pool...), plus "mountpoint" and "source" (the mount
    table's). Raises ShardError with a one-line message when `mountpoint`
    is not a mount point, not a shardfs mount, or its processes are gone."""
    path, entry = shardfs_mount(mountpoint)
    try:
        raw = os.getxattr(path, STATS_XATTR)
    except OSError as exc:
        if exc.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            raise _shard_error(f"{mountpoint}: the mount's processes are gone (stale mount): "
                               f"'shardfs umount {mountpoint}' clears it") from None
        raise _shard_error(f"{mountpoint}: cannot read its status: {exc.strerror or exc}") from None
    try:
        out = json.loads(raw)
    except ValueError:
        raise _shard_error(f"{mountpoint}: its status is not JSON (another shardfs version?)") from None
    out["mountpoint"] = path
    out["source"] = entry.get("source")
    return out


#: Seconds `upgrade` waits for the new processes to have replaced the old ones.
UPGRADE_TIMEOUT = 30.0


def supervisor_of(path: str) -> Optional[int]:
    """The pid of the supervisor (`shardfs.fuse.supervisor`) of the mount
    at canonical `path`, found in /proc (its name and command line), or
    None (a foreground or winery mount has none)."""
    from shardfs.fuse.supervisor import SUPERVISOR_NAME

    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", "rb") as f:
                if f.read().strip() != SUPERVISOR_NAME:
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--mountpoint" in argv and argv.index(b"--mountpoint") + 1 < len(argv) and \
                argv[argv.index(b"--mountpoint") + 1] == os.fsencode(path):
            return int(entry)
    return None


def _state_of(supervisor: int) -> "Any":
    """The shared state (`shardfs.fuse.shared.SharedState`) of the mount
    whose supervisor is `supervisor`, opened through /proc/PID/fd; raises
    ShardError (one line) when it cannot be read, ValueError when this
    shardfs cannot read its layout (`SharedState.attach`)."""
    from shardfs.fuse.shared import SharedState

    fds = f"/proc/{supervisor}/fd"
    try:
        for name in os.listdir(fds):
            if os.readlink(f"{fds}/{name}").startswith("/memfd:shardfs-state"):
                return SharedState.attach(os.open(f"{fds}/{name}", os.O_RDWR | os.O_CLOEXEC))
    except OSError as exc:
        raise _shard_error(f"cannot read the mount's state through {fds}: {exc.strerror or exc}") from None
    raise _shard_error("the mount's supervisor holds no state yet (it is still starting)")


def upgrade(mountpoint: str, timeout: float = UPGRADE_TIMEOUT) -> Tuple[int, float]:
    """Hand the shardfs mount at `mountpoint` to the shardfs installed now,
    in place (`shardfs.fuse.supervisor`): its supervisor runs the new code,
    a new coordinator takes over and the workers are replaced one by one;
    the requests of each worker replaced are resent to the others, so no
    reader sees an error, and the kernel's cached names and pages stay
    valid. Returns (workers replaced, seconds it took).

    Raises ShardError (one line) when `mountpoint` is not a shardfs mount,
    has no supervisor (mounted with --foreground, or a winery mount), keeps
    its state in a layout this shardfs cannot take (the old processes keep
    serving: nothing was changed), or the new processes did not finish
    within `timeout` seconds."""
    from shardfs.fuse.shared import UPGRADES, WORKERS

    path, _entry = shardfs_mount(mountpoint)
    supervisor = supervisor_of(path)
    if supervisor is None:
        raise _shard_error(f"{mountpoint} has no supervisor to hand it over (mounted with --foreground, or a "
                           "winery mount): unmount and mount it again")
    try:
        state = _state_of(supervisor)
    except ValueError as exc:
        raise _shard_error(f"{mountpoint}: {exc}: not upgraded (its processes keep serving it)") from None
    try:
        before = state.words[UPGRADES]
        workers = state.words[WORKERS]
        started = time.monotonic()
        os.kill(supervisor, signal.SIGUSR2)
        deadline = started + timeout
        while state.words[UPGRADES] == before:
            if time.monotonic() > deadline:
                raise _shard_error(f"{mountpoint}: the upgrade did not end within {timeout:g} s (see the mount's log)")
            if not os.path.exists(f"/proc/{supervisor}"):
                raise _shard_error(f"{mountpoint}: its supervisor died during the upgrade (see the mount's log)")
            time.sleep(0.01)
        return workers, time.monotonic() - started
    finally:
        state.close()


def umount(mountpoint: str) -> int:
    """Unmount a shardfs mount; return 0.

    Uses ``fusermount3 -u`` (``umount`` if fusermount3 is missing). A stale
    mount whose daemon was killed is detached with a lazy unmount. Raises
    ShardError with a one-line message when `mountpoint` is not a mount
    point, is not a shardfs mount, or cannot be unmounted (e.g. busy).
    """
    path, entry = shardfs_mount(mountpoint)
    stale = is_stale(path)
    ok, message = _run_unmount(path, lazy=False)
    if not ok and (stale or is_stale(path)):
        ok, message = _run_unmount(path, lazy=True)
    if not ok:
        raise _shard_error(f"cannot unmount {mountpoint}: {message}")
    # The daemon leaves once the kernel tells it; wait briefly for the table.
    deadline = time.monotonic() + 5
    while is_mounted(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    if is_mounted(path):
        raise _shard_error(f"cannot unmount {mountpoint}: still mounted")
    return 0


def _run_unmount(path: str, lazy: bool) -> "tuple[bool, str]":
    """Run fusermount3 -u[z] (or umount [-l]); (success, last error line)."""
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    if fusermount:
        cmd = [fusermount, "-uz" if lazy else "-u", path]
    else:
        umount_bin = shutil.which("umount") or "umount"
        cmd = [umount_bin] + (["-l"] if lazy else []) + [path]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if proc.returncode == 0:
        return True, ""
    lines = [l.strip() for l in (proc.stderr + proc.stdout).splitlines() if l.strip()]
    message = lines[-1] if lines else f"{os.path.basename(cmd[0])} exited with status {proc.returncode}"
    # "fusermount3: failed to unmount /x: Device or resource busy" -> keep the cause.
    m = re.search(r"failed to unmount [^:]*: (.*)$", message)
    return False, (m.group(1) if m else message)


if __name__ == "__main__":
    sys.exit(_daemon_main())
