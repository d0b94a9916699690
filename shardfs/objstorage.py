"""shardfs as a Software Heritage object storage: ``cls: shardfs``.

A read-only backend of swh-objstorage (the interface of
``swh.objstorage.interface.ObjStorageInterface``, swh-objstorage 7.4),
registered in the entry-point group ``swh.objstorage.classes`` (installed
with ``pip install 'shardfs[swh]'``), so that ``get_objstorage("shardfs",
**config)``, swh's RPC server, its ``multiplexer`` and the tools built on
them read Read Shards. A configuration, as ``objstorage:`` holds it::

    cls: shardfs
    shards: [/srv/shards/a.shard, /dev/rbd/pool/image]  # files or block devices
    shard_dir: /srv/shards        # every shard in it, followed live
    cache_dir: /var/cache/shardfs # sidecars and global index (default: ~/.cache/shardfs)
    primary_hash: sha256

or ``winery: {dsn: "postgresql://reader@db/winery", pools_dir: /srv/pools}``
(``pools_dir`` optional: images under /dev/rbd/<pool>/<name>) instead of
``shards``/``shard_dir``. Object ids are swh ``HashDict``s (a dict of
hash name to digest bytes); objects are found by their ``sha256``.

Semantics (those of swh's read-only backends): ``get`` raises
``ObjNotFoundError(obj_id)``; ``get_batch`` yields bytes or None in order
(one C batch per shard); ``check`` re-hashes the bytes against every hash
the id carries (``ObjCorruptedError``); ``add``, ``restore`` and
``delete`` raise ``ReadOnlyObjStorageError``; ``check_config(check_write=
True)`` is False. A takedown (``shardfs delete``) is seen by the next
call; shards added to, replaced in or removed from ``shard_dir`` within
RESCAN_SECONDS; a winery deployment's catalog as by
`shardfs.winery.WineryStore` (polled every POLL_SECONDS).

Threads share one set of open shards behind a lock (the RPC server runs
one thread per request). After a fork (gunicorn loads the app, then forks
its workers), the first call in the new process opens its own shards and
database pool; what the parent opened is left alone.
"""
import logging
import os
import threading
import time
import weakref
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

from swh.objstorage.exc import ObjNotFoundError, ReadOnlyObjStorageError
from swh.objstorage.interface import HashDict
from swh.objstorage.objstorage import ObjStorage, timed

from shardfs.errors import ShardError
from shardfs.shardset import CACHE_DIR_ERRNOS, open_shard_set

log = logging.getLogger("shardfs.objstorage")

#: Seconds between two rescans of `shard_dir` (made by the next call).
RESCAN_SECONDS = 1.0


class ConfigError(ShardError, ValueError):
    """A configuration the objstorage cannot use; the message says which key
    and why, on one line."""


def _shard_paths(value: Any) -> List[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not all(isinstance(p, str) for p in value):
        raise ConfigError("shardfs objstorage: 'shards' must be a list of paths (files or block devices)")
    return list(value)


class ShardfsObjStorage(ObjStorage):
    """Read Shards (files, block devices, a directory of them, or a winery
    deployment's) as a read-only swh objstorage; see the module docstring.

    Raises, at construction: ConfigError (a ValueError, one line) for a
    wrong configuration; OSError (FileNotFoundError, ...) or ShardError
    (CorruptShardError, WineryError) when a shard, the shard directory or
    the database cannot be opened."""

    name = "shardfs"
    primary_hash = "sha256"

    def __init__(self, shards: Optional[Sequence[str]] = None, shard_dir: Optional[str] = None,
                 winery: Optional[Dict[str, Any]] = None, cache_dir: Optional[str] = None,
                 primary_hash: str = "sha256", **kwargs: Any) -> None:
        if primary_hash != "sha256":
            raise ConfigError(f"shardfs objstorage: primary_hash {primary_hash!r} is not supported: "
                              "shards are keyed by sha256")
        kwargs.pop("name", None)  # always "shardfs"
        super().__init__(primary_hash="sha256", **kwargs)
        self._paths = _shard_paths(shards)
        self._shard_dir = shard_dir
        self._cache_dir = cache_dir
        self._winery = dict(winery) if winery is not None else None
        if self._winery is not None:
            if self._paths or shard_dir:
                raise ConfigError("shardfs objstorage: 'winery' stands alone: give no 'shards' nor 'shard_dir' "
                                  "with it")
            unknown = set(self._winery) - {"dsn", "pools_dir"}
            if not self._winery.get("dsn") or unknown:
                raise ConfigError("shardfs objstorage: 'winery' needs 'dsn' (and optionally 'pools_dir')"
                                  + (f"; unknown: {', '.join(sorted(unknown))}" if unknown else ""))
        elif not self._paths and not shard_dir:
            raise ConfigError("shardfs objstorage: give 'shards', 'shard_dir' (or both), or 'winery'")
        self._lock = threading.Lock()
        self._pid = os.getpid()
        this = weakref.ref(self)  # a new lock in a forked child: one copied may be held by a thread that is gone
        os.register_at_fork(after_in_child=lambda: this() is not None and this()._new_lock())
        self._orphans: List[Any] = []  # what a parent process opened (never touched after a fork)
        self._backend = self._open()

    # ------------------------------------------------------------ backend

    def _open(self) -> Any:
        """The shard set (or WineryStore) of this process, opened now."""
        if self._winery is not None:
            from shardfs.winery import WineryStore

            return WineryStore(self._winery["dsn"], self._winery.get("pools_dir"), self._cache_dir)
        shards = open_shard_set(self._paths, self._shard_dir, self._cache_dir)
        self._build_sidecars(shards)
        self._rescanned = time.monotonic()
        return shards

    @staticmethod
    def _build_sidecars(shards: Any) -> None:
        """Sidecars of the shards the global index does not hold (a filter
        each, so that a lookup does not probe every shard's index)."""
        for member in shards.needs_sidecar():
            try:
                try:
                    shards.build_sidecar(member)
                except OSError as exc:
                    if exc.errno not in CACHE_DIR_ERRNOS or shards.sidecar_dir != shards.cache_dir:
                        raise
                    shards.use_private_sidecar_dir()  # a cache directory this login cannot write
                    shards.build_sidecar(member)
            except (OSError, ShardError) as exc:
                member.sidecar_failed = True
                log.warning("%s: no sidecar (%s): probed for every lookup", member.path, exc)

    def _use(self) -> Any:
        """This process's backend, with the lock held by the caller: opened
        again after a fork; `shard_dir` rescanned when due."""
        if self._pid != os.getpid():
            self._orphans.append(self._backend)
            self._pid, self._backend = os.getpid(), self._open()
        backend = self._backend
        if self._winery is None and self._shard_dir is not None \
                and time.monotonic() - self._rescanned >= RESCAN_SECONDS:
            self._rescanned = time.monotonic()
            try:
                _, gone = backend.rescan()
            except OSError as exc:
                log.warning("shard directory %s: %s", self._shard_dir, exc)
            else:
                for member in gone:
                    backend.discard(member)
                self._build_sidecars(backend)
        return backend

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    @staticmethod
    def _key(obj_id: HashDict) -> Optional[bytes]:
        key = obj_id.get("sha256") if isinstance(obj_id, dict) else None
        return key if isinstance(key, bytes) and len(key) == 32 else None

    # ------------------------------------------------------------ reads

    @timed
    def get(self, obj_id: HashDict) -> bytes:
        """The object's bytes. Raises ObjNotFoundError(obj_id) when no shard
        holds its sha256 (or the id carries none)."""
        key = self._key(obj_id)
        data = None
        if key is not None:
            with self._lock:
                data = self._use().get_batch([key])[0]
        if data is None:
            raise ObjNotFoundError(obj_id)
        return data

    def get_batch(self, obj_ids: Iterable[HashDict]) -> Iterator[Optional[bytes]]:
        """The bytes of each id's object, or None, in order (the shards'
        C batch reads: one call per shard holding some of them)."""
        ids = list(obj_ids)
        keys = [self._key(i) for i in ids]
        wanted = [k for k in keys if k is not None]
        with self._lock:
            datas = iter(self._use().get_batch(wanted))
        for k in keys:
            yield None if k is None else next(datas)

    @timed
    def __contains__(self, obj_id: HashDict) -> bool:
        key = self._key(obj_id)
        if key is None:
            return False
        with self._lock:
            backend = self._use()
            if self._winery is not None:
                return key in backend
            return backend.find(key) is not None

    def check_config(self, *, check_write):
        """True for reads; False when asked for writes (read-only)."""
        return not check_write

    # ------------------------------------------------------------ writes

    @timed
    def add(self, content: bytes, obj_id: HashDict, check_presence: bool = True) -> None:
        raise ReadOnlyObjStorageError("add")

    def restore(self, content: bytes, obj_id: HashDict) -> None:
        raise ReadOnlyObjStorageError("restore")

    def delete(self, obj_id: HashDict):
        raise ReadOnlyObjStorageError("delete")

    def close(self) -> None:
        """Close this process's shards (or database pool)."""
        with self._lock:
            if self._pid == os.getpid():
                self._backend.close()
