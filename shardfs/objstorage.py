"""shardfs as a Software Heritage object storage: ``cls: shardfs``.

A read-only backend of swh-objstorage (the interface of
``swh.objstorage.interface.ObjStorageInterface``, swh-objstorage 7.4),
registered in the entry-point group ``swh.objstorage.classes`` (installed
with ``pip install 'shardfs[swh]'``), so that ``get_objstorage("shardfs",
**config)``, swh's RPC server, its ``multiplexer`` and the tools built on
them read Read Shards. A configuration, as ``objstorage:`` holds it::

    cls: shardfs
    shards: [/srv/shards/a.shard, /dev/rbd/pool/image, rbd:pool/image, s3://bucket/key]
                                  # files, block devices, RBD images, S3 objects; Read Shards or
                                  # MOSAIC files (those in files, told apart by content)
    shard_dir: /srv/shards        # every shard in it, followed live (or rbd:POOL: its images;
                                  # s3://BUCKET/PREFIX: the objects under it)
    ceph: {conf: /etc/ceph/ceph.conf, id: shardfs, timeout: 30}  # for rbd: sources (all optional)
    s3: {endpoint: "http://127.0.0.1:7480", region: us-east-1, timeout: 30}  # for s3:// sources (all
                                    # optional; keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)
    cache_dir: /var/cache/shardfs # sidecars, global index, hash indexes (default: ~/.cache/shardfs)
    primary_hash: sha256          # or sha1, sha1_git
    hashes: [sha1, sha1_git]      # also find ids by these (default: primary_hash, unless sha256)

or ``winery: {dsn: "postgresql://reader@db/winery", pools_dir: /srv/pools}``
(or ``winery: {config: /etc/swh/winery.yml}``: Software Heritage's own
winery settings, its database and ``shards_pools``)
(``pools_dir`` optional: images under /dev/rbd/<pool>/<name>; ``rbd: librbd``
instead: images read through librbd, nothing mapped) instead of
``shards``/``shard_dir``. Object ids are swh ``HashDict``s (a dict of
hash name to digest bytes); objects are found by their ``sha256``, or by
their ``sha1`` or ``sha1_git`` when the id carries no sha256 and the
storage indexes that hash (`shardfs.hashes`: the shards' indexes missing
from the cache directory are built at construction, reading every object
once; ``shardfs index --hashes`` builds them ahead). An object found by
sha1 or sha1_git is hashed again before it is returned, so a damaged index
never returns another object. Not with ``winery`` (its images are indexed
in a winery mount, ``-o hashes=``).

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

from shardfs import hashes as hashes_mod
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
                 primary_hash: str = "sha256", hashes: Optional[Sequence[str]] = None,
                 ceph: Optional[Dict[str, Any]] = None, s3: Optional[Dict[str, Any]] = None,
                 **kwargs: Any) -> None:
        if primary_hash not in ("sha256",) + hashes_mod.HASH_NAMES:
            raise ConfigError(f"shardfs objstorage: primary_hash {primary_hash!r} is not supported: "
                              f"choose sha256, {', '.join(hashes_mod.HASH_NAMES)}")
        if hashes is None:
            hashes = [] if primary_hash == "sha256" else [primary_hash]
        if isinstance(hashes, str) or any(h not in hashes_mod.HASH_NAMES for h in hashes):
            raise ConfigError(f"shardfs objstorage: 'hashes' must be a list of {', '.join(hashes_mod.HASH_NAMES)}")
        if primary_hash != "sha256" and primary_hash not in hashes:
            raise ConfigError(f"shardfs objstorage: primary_hash {primary_hash} needs {primary_hash} in 'hashes'")
        kwargs.pop("name", None)  # always "shardfs"
        super().__init__(primary_hash=primary_hash, **kwargs)
        self.primary_hash = primary_hash
        self._hashes = tuple(h for h in hashes_mod.HASH_NAMES if h in hashes)
        self._paths = _shard_paths(shards)
        self._shard_dir = shard_dir
        self._cache_dir = cache_dir
        self._winery = dict(winery) if winery is not None else None
        if self._winery is not None:
            if self._paths or shard_dir:
                raise ConfigError("shardfs objstorage: 'winery' stands alone: give no 'shards' nor 'shard_dir' "
                                  "with it")
            unknown = set(self._winery) - {"dsn", "pools_dir", "rbd", "config"}
            if self._winery.pop("rbd", "mapped") == "librbd":
                from shardfs.winery import LIBRBD

                self._winery["pools_dir"] = LIBRBD
            config = self._winery.pop("config", None)
            if config is not None:  # swh's own winery settings: the database and the pools
                from shardfs.winery import pool_sources

                self._winery.setdefault("dsn", pool_sources(config)[0])
                self._winery["pools_dir"] = os.path.abspath(config)
            if not self._winery.get("dsn") or unknown:
                raise ConfigError("shardfs objstorage: 'winery' needs 'dsn' (and optionally 'pools_dir', or "
                                  "'rbd: librbd'), or 'config': swh's winery settings file"
                                  + (f"; unknown: {', '.join(sorted(unknown))}" if unknown else ""))
            if self._hashes:
                raise ConfigError("shardfs objstorage: 'winery' finds objects by sha256 only (primary_hash "
                                  "sha256, no 'hashes')")
        elif not self._paths and not shard_dir:
            raise ConfigError("shardfs objstorage: give 'shards', 'shard_dir' (or both), or 'winery'")
        if ceph is not None:
            unknown = set(ceph) - {"conf", "id", "timeout"}
            if unknown:
                raise ConfigError(f"shardfs objstorage: 'ceph' takes conf, id and timeout; unknown: "
                                  f"{', '.join(sorted(unknown))}")
        from shardfs import rbd

        if ceph is not None or cache_dir is not None:
            ceph = ceph or {}
            try:
                rbd.configure(conf=ceph.get("conf"), client_id=ceph.get("id"), cache_dir=cache_dir,
                              timeout=ceph.get("timeout"))
            except ValueError as exc:
                raise ConfigError(f"shardfs objstorage: ceph: {exc}") from None
        if s3 is not None:
            unknown = set(s3) - {"endpoint", "region", "timeout"}
            if unknown:
                raise ConfigError(f"shardfs objstorage: 's3' takes endpoint, region and timeout; unknown: "
                                  f"{', '.join(sorted(unknown))}")
        if s3 is not None or cache_dir is not None:
            from shardfs import s3 as s3_mod

            s3 = s3 or {}
            try:
                s3_mod.configure(endpoint=s3.get("endpoint"), region=s3.get("region"), timeout=s3.get("timeout"),
                                 cache_dir=cache_dir)
            except ValueError as exc:
                raise ConfigError(f"shardfs objstorage: s3: {exc}") from None
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
        if self._hashes:
            shards.hashes = hashes_mod.HashSet(shards, self._hashes)
            self._build_hashes(shards)
        self._rescanned = time.monotonic()
        return shards

    @staticmethod
    def _build_hashes(shards: Any) -> None:
        """Hash indexes of the shards that lack one (each object read once)."""
        hashes = shards.hashes
        hashes.scan()
        for member in hashes.pending():
            started = time.monotonic()
            log.info("%s: indexing by %s", member.path, ", ".join(hashes.names))
            try:
                hashes_mod.build(member.shard, hashes.names, shards.sidecar_dir)
            except (OSError, ShardError) as exc:
                member.hashes_failed = True
                log.warning("%s: not indexed by %s (%s): its objects are found by sha256 only", member.path,
                            ", ".join(hashes.names), exc)
                continue
            hashes.scan([member])
            log.info("%s: indexed in %.1f s", member.path, time.monotonic() - started)
        asked = {m.number: m for n in hashes.names for m in hashes.unlevelled(n)}
        if hashes.levels and asked:
            try:
                hashes.add_to_levels(list(asked.values()), [m.identity for m in shards.served()])
                hashes.reload()
            except (OSError, ShardError) as exc:
                log.warning("sha1/sha1_git levels not updated (%s): each indexed shard is asked", exc)

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
                if backend.hashes is not None:
                    self._build_hashes(backend)
        return backend

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    @staticmethod
    def _key(obj_id: HashDict) -> Optional[bytes]:
        key = obj_id.get("sha256") if isinstance(obj_id, dict) else None
        return key if isinstance(key, bytes) and len(key) == 32 else None

    def _other(self, obj_id: HashDict) -> Optional[tuple]:
        """(hash name, digest) of an id without a sha256 by a hash this
        storage indexes (the primary hash first), else None."""
        if not isinstance(obj_id, dict):
            return None
        for name in sorted(self._hashes, key=lambda n: n != self.primary_hash):
            digest = obj_id.get(name)
            if isinstance(digest, bytes) and len(digest) == hashes_mod.DIGEST_SIZE:
                return name, digest
        return None

    def _read_other(self, backend: Any, obj_id: HashDict) -> Optional[bytes]:
        """The bytes of the object an id without sha256 names (lock held)."""
        other = self._other(obj_id)
        found = backend.hashes.find(*other) if other is not None and backend.hashes is not None else None
        if found is None:
            return None
        member, _, data_offset, size = found
        return member.shard.pread(data_offset, size, 0, size)

    # ------------------------------------------------------------ reads

    @timed
    def get(self, obj_id: HashDict) -> bytes:
        """The object's bytes. Raises ObjNotFoundError(obj_id) when no shard
        holds its sha256 (or, for an id without one, its sha1 or sha1_git
        by an indexed hash)."""
        key = self._key(obj_id)
        with self._lock:
            backend = self._use()
            data = backend.get_batch([key])[0] if key is not None else self._read_other(backend, obj_id)
        if data is None:
            raise ObjNotFoundError(obj_id)
        return data

    def get_batch(self, obj_ids: Iterable[HashDict]) -> Iterator[Optional[bytes]]:
        """The bytes of each id's object, or None, in order (the shards'
        C batch reads for the ids with a sha256: one call per shard holding
        some of them; the others one by one)."""
        ids = list(obj_ids)
        keys = [self._key(i) for i in ids]
        wanted = [k for k in keys if k is not None]
        with self._lock:
            backend = self._use()
            datas = iter(backend.get_batch(wanted))
            out = [next(datas) if k is not None else self._read_other(backend, i) for i, k in zip(ids, keys)]
        yield from out

    @timed
    def __contains__(self, obj_id: HashDict) -> bool:
        key = self._key(obj_id)
        with self._lock:
            backend = self._use()
            if key is None:
                other = self._other(obj_id)
                return other is not None and backend.hashes is not None and backend.hashes.find(*other) is not None
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
