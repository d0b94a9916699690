"""A winery object storage read as one set of objects: its Read Shards, and
the objects still in its PostgreSQL database.

winery is Software Heritage's object storage (PyPI ``swh-objstorage``, module
``swh.objstorage.backends.winery``); docs/winery.md tells how it works and
what shardfs relies on. In short, from its schema (``sql/30-schema.sql``,
database schema versions 4 and 5):

* table ``shards(id, name, state, pool_name, ...)``: a shard's objects are in
  its *write shard*, table ``shard_<name>(key bytea, content bytea)``, until
  it is packed into a Read Shard *image*: ``<pool_name>/<name>`` in a shards
  pool (``/dev/rbd/<pool_name>/<name>`` for a Ceph pool mapped on this
  host, ``<base_directory>/<pool_name>/<name>`` for a directory pool). An
  image exists in states packed, cleaning and readonly; the write shard
  table is dropped when the shard becomes readonly.
* table ``signature2shard(signature, state, shard)``: every object's key
  (its SHA-256, 32 bytes), its shard, and whether it is ``present``,
  ``inflight`` (being written) or ``deleted`` (taken down; the bytes may
  still be in an image until winery's cleaner erases them).

What shardfs serves (the same rules for the FUSE mount and `WineryStore`):
a key is an object when its ``signature2shard`` row says ``present``; its
bytes come from the first served image that holds it, else from its write
shard table. A key found in an image is served without asking the
database: the images' keys are known from their index, and the keys the
database hides (``deleted`` ever, ``inflight`` in an image) are polled
every `POLL_SECONDS` into `Catalog.hidden`, as (key, shard id) pairs. A key
no image holds costs one indexed query (``signature2shard`` by primary
key), and one more on its write shard table when it is present.

Connections: `Database` keeps a psycopg 3 pool of at most a few
connections per process (never shared across a fork), opened on first
use, every session read-only (``default_transaction_read_only``) with
timeouts, so that a database that is down costs an error within
`DB_TIMEOUT` seconds, never a hang. A login with SELECT rights on
``dbversion``, ``shards``, ``signature2shard`` and the ``shard_*`` tables
is all it needs. The password of a DSN is never logged: `describe()` names
a database without it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

from shardfs.errors import ShardError, require
from shardfs.shard import KEY_SIZE, SLOT_SIZE, normalize_key

log = logging.getLogger("shardfs.winery")

#: Database schema versions (table ``dbversion``) this module reads:
#: swh-objstorage 7.x writes 5; 4 differs only by lacking the ``importing``
#: shard state. Version 3 and older have no ``shards.pool_name``.
SUPPORTED_SCHEMAS = (4, 5)
#: Shard states in which its Read Shard image exists (swh-objstorage's
#: ``ShardState.image_available``).
IMAGE_STATES = frozenset({"packed", "cleaning", "readonly"})
#: Shard states without a write shard table to read from.
NO_TABLE_STATES = frozenset({"readonly", "importing"})
#: Seconds between two polls of the database for shards and takedowns: a
#: new shard, a state change or a takedown is seen within this bound plus
#: the time of one poll.
POLL_SECONDS = 1.0
#: Seconds a query may take (statement_timeout), and a caller may wait for
#: a pooled connection, before the database counts as unavailable.
DB_TIMEOUT = 4.0
#: Seconds libpq may take to connect (connect_timeout; its minimum is 2).
CONNECT_TIMEOUT = 2
#: Where a Ceph RBD pool's images are mapped (``rbd device map``).
RBD_DIR = "/dev/rbd"
#: `pools_dir` meaning: read the Ceph pools' images through librbd
#: (``rbd:<pool_name>/<name>`` sources, `shardfs.rbd`), nothing mapped.
LIBRBD = "rbd:"


class WineryError(ShardError):
    """A winery database that cannot be used: unreachable, refusing the
    login, or not a winery database (a one-line message)."""


class DatabaseUnavailable(WineryError):
    """A query failed for want of the database (down, unreachable, timed
    out): the caller answers EIO and tries again later."""


class ImageNotMapped(DatabaseUnavailable):
    """An object is present in a shard whose write shard table is gone
    and whose image is not served here (not mapped on this host yet, or
    not picked up yet by the last poll): it exists but cannot be read
    now."""


# ------------------------------------------------------------------ DSN


def describe(dsn: str) -> str:
    """``user@host:port/dbname`` of a libpq DSN (key=value or URI), for
    logs and messages: never the password. Unparsable: "the database"."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        info = conninfo_to_dict(dsn)
    except Exception:
        return "the database"
    user = info.get("user") or os.environ.get("PGUSER") or ""
    host = info.get("host") or info.get("hostaddr") or os.environ.get("PGHOST") or "local socket"
    port = info.get("port") or os.environ.get("PGPORT") or ""
    db = info.get("dbname") or os.environ.get("PGDATABASE") or user
    where = f"{host}:{port}" if port else host
    return f"{user + '@' if user else ''}{where}/{db}"


def database_name(dsn: str) -> str:
    """The database name of a DSN, made of [A-Za-z0-9._+-] (for fsname=)."""
    import re

    try:
        from psycopg.conninfo import conninfo_to_dict

        name = conninfo_to_dict(dsn).get("dbname") or os.environ.get("PGDATABASE") or "db"
    except Exception:
        name = "db"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", str(name))


def has_password(dsn: str) -> bool:
    """Whether the DSN itself carries a password (else it comes from a
    password file or PGPASSWORD)."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        return bool(conninfo_to_dict(dsn).get("password"))
    except Exception:
        return "password" in dsn or "@" in dsn


def connection_kwargs(application_name: str) -> Dict[str, Any]:
    """Settings of every session: autocommit, read-only, timeouts."""
    return {
        "autocommit": True,
        "connect_timeout": CONNECT_TIMEOUT,
        "application_name": application_name,
        # Dropped packets must not hang a reader either (ms).
        "tcp_user_timeout": int(DB_TIMEOUT * 1000),
        "options": (f"-c statement_timeout={int(DB_TIMEOUT * 1000)} "
                    "-c default_transaction_read_only=on"),
    }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def require_psycopg() -> None:
    """Raise MissingDependencyError (one line: ``pip install
    'shardfs[winery]'``) unless psycopg and psycopg_pool are installed."""
    require(("psycopg", "psycopg_pool"), "winery", "reading a winery database")


def check(dsn: str) -> int:
    """Connect once and check that `dsn` names a winery database this
    module reads; returns its schema version. Raises WineryError (one
    line) when the database cannot be reached, refuses the login, lacks
    ``dbversion``, ``shards`` or ``signature2shard`` (or SELECT rights on
    them), or has an unsupported schema version."""
    require_psycopg()
    import psycopg

    where = describe(dsn)
    try:
        conn = psycopg.connect(dsn, **connection_kwargs("shardfs check"))
    except Exception as exc:
        raise WineryError(f"cannot connect to {where}: {_first_line(exc)}") from None
    try:
        try:
            row = conn.execute("SELECT version FROM dbversion ORDER BY version DESC LIMIT 1").fetchone()
        except psycopg.errors.UndefinedTable:
            raise WineryError(f"{where} is not a winery database (no table dbversion)") from None
        except psycopg.Error as exc:
            raise WineryError(f"{where}: cannot read dbversion: {_first_line(exc)}") from None
        version = row[0] if row else None
        if version not in SUPPORTED_SCHEMAS:
            raise WineryError(f"{where}: winery schema version {version} is not supported "
                              f"(supported: {', '.join(map(str, SUPPORTED_SCHEMAS))})")
        for query in ("SELECT id, name, state, pool_name FROM shards LIMIT 0",
                      "SELECT signature, state, shard FROM signature2shard LIMIT 0"):
            try:
                conn.execute(query)
            except psycopg.errors.UndefinedTable as exc:
                raise WineryError(f"{where} is not a winery database ({_first_line(exc)})") from None
            except psycopg.Error as exc:
                raise WineryError(f"{where} is not a readable winery database: {_first_line(exc)}") from None
        return int(version)
    finally:
        conn.close()


# ------------------------------------------------------------- database


class Database:
    """The connections of one process to a winery database: a psycopg
    pool of at most `max_size` read-only sessions, opened on first use
    (so an object made before a fork is usable in the child: each process
    must have its own), reconnecting by itself after the server restarts.

    `query()` raises DatabaseUnavailable within about DB_TIMEOUT seconds
    when the server is down or unreachable; other database errors
    propagate as psycopg.Error.
    """

    def __init__(self, dsn: str, max_size: int = 2, name: str = "shardfs") -> None:
        require_psycopg()
        self.dsn = dsn
        self.max_size = max_size
        self.name = name
        self.where = describe(dsn)
        self._pool = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.queries = 0
        self._failing_since: Optional[float] = None

    def _get_pool(self):
        if self._pool is not None and self._pid == os.getpid():
            return self._pool
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                from psycopg_pool import ConnectionPool

                # A pool inherited through fork belongs to the parent: never
                # touch (nor close) it here.
                self._pid = os.getpid()
                self._pool = ConnectionPool(
                    self.dsn, min_size=0, max_size=self.max_size, timeout=DB_TIMEOUT,
                    kwargs=connection_kwargs(self.name), name=self.name, open=True, max_idle=60.0,
                    reconnect_timeout=0)
            return self._pool

    def query(self, sql: Any, params: Sequence[Any] = ()) -> List[tuple]:
        """Rows of one read-only query. Raises DatabaseUnavailable when
        the database cannot be reached in time, psycopg.Error otherwise."""
        import psycopg
        from psycopg_pool import PoolTimeout

        self.queries += 1
        try:
            # A pooled session is not tested before use (that would cost a
            # round trip per query): one the server closed since (a restart)
            # fails here and leaves the pool; the next one is tried, up to
            # every session the pool may hold, then a new one.
            for attempt in range(self.max_size + 1):
                try:
                    rows = self._execute(sql, params)
                    break
                except psycopg.OperationalError as exc:
                    if attempt == self.max_size or not getattr(exc, "_shardfs_broken", False):
                        raise
        except (PoolTimeout, psycopg.OperationalError) as exc:
            if isinstance(exc, psycopg.errors.QueryCanceled):
                message = f"{self.where}: query timed out after {DB_TIMEOUT:g} s"
            else:
                message = f"{self.where} unavailable: {_first_line(exc)}"
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
                log.warning("%s", message)
            raise DatabaseUnavailable(message) from None
        if self._failing_since is not None:
            log.warning("%s: reachable again after %.1f s", self.where, time.monotonic() - self._failing_since)
            self._failing_since = None
        return rows

    def _execute(self, sql: Any, params: Sequence[Any]) -> List[tuple]:
        """Rows of `sql` on a pooled session; an OperationalError that
        broke the session is marked ``_shardfs_broken``."""
        import psycopg

        with self._get_pool().connection() as conn:
            try:
                return conn.execute(sql, params).fetchall()
            except psycopg.OperationalError as exc:
                exc._shardfs_broken = conn.broken and not isinstance(exc, psycopg.errors.QueryCanceled)
                raise

    def close(self) -> None:
        """Close the connections this process opened (none inherited)."""
        pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close(timeout=1.0)


# --------------------------------------------------------------- catalog


@dataclass(frozen=True)
class ShardRow:
    """One row of the ``shards`` table: `id` (bigint), `name` (32
    characters), `state` (a shard_state value), `pool_name`."""

    id: int
    name: str
    state: str
    pool_name: str


#: The pool name swh gives a pool of each type when its settings name none
#: (swh-objstorage 7.4.1, backends/winery/settings.py).
DEFAULT_POOL_NAMES = {"rbd": "shards", "directory": "shards", "mosaic": "mosaics", "mosaic-s3": "mosaics"}


def pool_sources(path: str) -> Tuple[str, Dict[str, str]]:
    """Read a winery deployment's settings as Software Heritage writes them
    (swh-objstorage 7.4's YAML: the winery objstorage's keys at the top or
    under ``objstorage:``, its ``database: {db: DSN}`` and ``shards_pools``):
    (the DSN, {pool name: where its images are, with ``{name}`` for the
    shard's name}). Pool types (swh's ``pools/``): ``directory`` and
    ``mosaic``, ``<base_directory>/<pool_name>/{name}``; ``rbd``,
    ``/dev/rbd/<pool_name>/{name}`` (mapped on this host);
    ``mosaic-s3``, ``<base_url>/<pool_name>/{name}<image_extension>`` (an
    ``s3://`` source). Raises WineryError (one line) for a file that is not
    such settings."""
    import yaml

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise WineryError(f"winery settings {path}: {' '.join(str(exc).split())}") from None
    if isinstance(doc, dict) and isinstance(doc.get("objstorage"), dict):
        doc = doc["objstorage"]
    pools = doc.get("shards_pools") if isinstance(doc, dict) else None
    dsn = (doc.get("database") or {}).get("db") if isinstance(doc, dict) else None
    if not isinstance(pools, list) or not isinstance(dsn, str):
        raise WineryError(f"winery settings {path}: expected swh's winery settings (database: {{db: DSN}}, "
                          "shards_pools: [...])")
    found = {}
    for pool in pools:
        kind = pool.get("type") if isinstance(pool, dict) else None
        if kind not in DEFAULT_POOL_NAMES:
            raise WineryError(f"winery settings {path}: unknown shards pool type {kind!r}")
        name = pool.get("pool_name", DEFAULT_POOL_NAMES[kind])
        where = {"directory": "base_directory", "mosaic": "base_directory", "mosaic-s3": "base_url"}.get(kind)
        if where and not isinstance(pool.get(where), str):
            raise WineryError(f"winery settings {path}: the {kind} pool {name!r} has no {where}")
        if kind in ("directory", "mosaic"):
            found[name] = os.path.join(pool["base_directory"], name, "{name}")
        elif kind == "rbd":
            found[name] = os.path.join(RBD_DIR, name, "{name}")
        else:
            found[name] = f"{pool['base_url'].rstrip('/')}/{name}/{{name}}{pool.get('image_extension') or ''}"
    return dsn, found


@dataclass
class CatalogChange:
    """What one `Catalog.sync` changed: shards added to and removed from
    the set, (key, shard id) pairs newly hidden, and whether the tables
    (`Catalog.tables`) changed."""

    added: List[Any]
    removed: List[Any]
    hidden: List[Tuple[bytes, int]]
    tables_changed: bool

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.hidden or self.tables_changed)


class Catalog:
    """What a winery deployment holds, as last polled: its shards, which
    of their images are served from a `shardfs.shardset.ShardSet`
    (numbered by shard id), the write shard tables, and the hidden
    (key, shard id) pairs.

    `pools_dir`: a directory pool's base directory (images at
    ``pools_dir/<pool_name>/<name>``); None: Ceph pools mapped under
    /dev/rbd; LIBRBD: Ceph pools read through librbd. The set is synced by `sync()`; a database that is down
    changes nothing (what is served stays served).
    """

    def __init__(self, db: Database, pools_dir: Optional[str] = None) -> None:
        self.db = db
        self.pools_dir = pools_dir
        #: Shard id -> its row, as last polled.
        self.rows: Dict[int, ShardRow] = {}
        #: Shard id -> name, for shards whose write shard table may exist.
        self.tables: Dict[int, str] = {}
        #: Key -> ids of the shards where it must not be served from.
        self.hidden: Dict[bytes, Set[int]] = {}
        #: Images that failed to open: id -> message (logged once).
        self._missing: Dict[int, str] = {}
        #: Pool name -> image source template, from a settings file (`pool_sources`).
        self._pools: Optional[Dict[str, str]] = None
        self.polled_at = 0.0
        self.polls = 0

    def image_path(self, row: ShardRow) -> str:
        """Where `row`'s image is on this host: a path, or with `pools_dir`
        LIBRBD the source ``rbd:<pool_name>/<name>``; with `pools_dir` a
        swh winery settings file (`pool_sources`), where its pool puts it."""
        if self._pools is None and self.pools_dir not in (None, LIBRBD) and os.path.isfile(self.pools_dir):
            self._pools = pool_sources(self.pools_dir)[1]
        if self._pools and row.pool_name in self._pools:
            return self._pools[row.pool_name].format(name=row.name)
        if self.pools_dir == LIBRBD:
            return f"{LIBRBD}{row.pool_name}/{row.name}"
        base = self.pools_dir if self.pools_dir is not None else RBD_DIR
        return os.path.join(base, row.pool_name, row.name)

    def poll(self) -> Tuple[Dict[int, ShardRow], List[Tuple[bytes, int]]]:
        """(shards by id, deleted (key, shard id) pairs) now. Raises
        DatabaseUnavailable."""
        rows = {r[0]: ShardRow(int(r[0]), r[1].strip(), r[2], r[3])
                for r in self.db.query("SELECT id, name, state::text, pool_name FROM shards")}
        deleted = [(bytes(r[0]), int(r[1])) for r in self.db.query(
            "SELECT signature, shard FROM signature2shard WHERE state = 'deleted'")]
        return rows, deleted

    def _hide(self, pairs: Iterable[Tuple[bytes, int]]) -> List[Tuple[bytes, int]]:
        new = []
        for key, shard_id in pairs:
            ids = self.hidden.setdefault(key, set())
            if shard_id not in ids:
                ids.add(shard_id)
                new.append((key, shard_id))
        return new

    def sync(self, shards: Any) -> CatalogChange:
        """Poll the database and bring `shards` (a ShardSet) in line:
        open the images of shards in an image state that are not served
        yet (one not there yet is tried again at the next sync), stop
        serving shards the database no longer lists, and hide the keys it
        says are deleted (for good: a deleted key stays hidden in that
        shard even once winery's cleaner removed its row) and the keys of
        a newly served image it does not list present there
        (`unlisted_keys`). Raises DatabaseUnavailable (nothing changed)."""
        rows, deleted = self.poll()
        self.polled_at = time.monotonic()
        self.polls += 1
        added, removed = [], []
        serving: Dict[int, Any] = {}
        for member in shards.served():
            if member.winery_shard not in rows:
                shards.remove(member)
                removed.append(member)
            else:
                serving[member.winery_shard] = member
        hidden = self._hide(deleted)
        for shard_id, row in sorted(rows.items()):
            if row.state not in IMAGE_STATES:
                continue
            path = self.image_path(row)
            member = serving.get(shard_id)
            if member is not None and member.path == path:
                continue
            # Not served yet, or its pool changed (swh's ``migrate-pool``
            # copied the image, then moved the row): the image in its new
            # pool replaces the old one in this very sync (one snapshot: no
            # key missing or doubled), once it opens; until then the old
            # one is served.
            try:
                shard, sidecar = shards.open_candidate(path)
            except Exception as exc:
                message = f"{exc}"
                if self._missing.get(shard_id) != message:
                    self._missing[shard_id] = message
                    log.info("shard %s (%s, pool %s): image not served yet: %s", row.name, row.state,
                             row.pool_name, message)
                continue
            try:
                unlisted = self.unlisted_keys(shard_id, shard)
            except BaseException:
                shard.close()
                if sidecar is not None:
                    sidecar.close()
                raise
            if member is not None:
                log.info("shard %s: its image moved to pool %s (%s)", row.name, row.pool_name, path)
                shards.remove(member)
                removed.append(member)
            hidden += self._hide((key, shard_id) for key in unlisted)
            self._missing.pop(shard_id, None)
            member = shards.add(path, shard=shard, sidecar=sidecar,
                                sidecar_dir=shards.cache_dir if sidecar is not None else None)
            member.winery_shard = shard_id
            added.append(member)
        tables = {i: r.name for i, r in rows.items() if r.state not in NO_TABLE_STATES}
        tables_changed = tables != self.tables
        self.tables = tables
        self.rows = rows
        return CatalogChange(added, removed, hidden, tables_changed)

    def unlisted_keys(self, shard_id: int, shard: Any) -> List[bytes]:
        """Keys of image `shard` (of shard `shard_id`) that must not be
        served from it: those in flight or deleted, and those the database
        does not list for this shard at all (winery's cleaner removes the
        row of an object deleted while its shard was packed without erasing
        it from the image; a key added again since is in another shard).

        Cost: index range queries on ``signature2shard(shard, state)`` for
        the counts and the few keys in flight or deleted, and a scan of the
        image's index; only when the counts disagree, the shard's present
        keys are read too (memory: 33 bytes per object)."""
        counts = dict(self.db.query(
            "SELECT state::text, count(*) FROM signature2shard WHERE shard = %s "
            "AND state IN ('present', 'inflight') GROUP BY state", (shard_id,)))
        odd = [bytes(r[0]) for r in self.db.query(
            "SELECT signature FROM signature2shard WHERE shard = %s AND state IN ('inflight', 'deleted')",
            (shard_id,))]
        odd_in_image = sum(1 for key in odd if shard.find(key) is not None)
        live = len(shard)
        if live == counts.get("present", 0) + odd_in_image:
            return odd
        present = {bytes(r[0]) for r in self.db.query(
            "SELECT signature FROM signature2shard WHERE shard = %s AND state = 'present'", (shard_id,))}
        extra = [key for _, key, _, _ in shard.scan(0, 65536) if key not in present]
        log.info("shard %d: %d object(s) of its image are not listed present for it: not served",
                 shard_id, len(extra))
        return extra

    def table(self) -> Dict[str, Any]:
        """What a reader in another process needs (JSON-ready): the write
        shard tables and the hidden pairs (keys in hex)."""
        return {"tables": {str(i): n for i, n in self.tables.items()},
                "hidden": {k.hex(): sorted(v) for k, v in self.hidden.items()}}


# ---------------------------------------------------------------- reader


@dataclass(frozen=True)
class Location:
    """Where an object's bytes are: in image `member` (a MountedShard) at
    `slot` / `data_offset`, or in the write shard table of shard
    `shard_id` (`member` None). `size` in bytes."""

    size: int
    member: Any = None
    slot: int = -1
    data_offset: int = -1
    shard_id: int = -1


class Reader:
    """Finds and reads objects for one process, from a ShardSet of images
    (numbered by winery shard id), the write shard tables and the hidden
    pairs a `Catalog` gives (`update`), and a `Database`.

    Keys are 32 raw bytes. Methods raise DatabaseUnavailable when the
    object is not in a served image and the database cannot be asked;
    CorruptShardError / OSError from an image propagate.
    """

    def __init__(self, shards: Any, db: Database) -> None:
        self.shards = shards
        self.db = db
        self.tables: Dict[int, str] = {}
        self.hidden: Dict[bytes, FrozenSet[int]] = {}
        self._present_sql: Optional[str] = None
        self._fetch_sql: Optional[str] = None

    def update(self, tables: Dict[int, str], hidden: Dict[bytes, Any]) -> None:
        """Take the write shard tables (id -> name) and hidden pairs."""
        self.tables = dict(tables)
        self.hidden = {k: frozenset(v) for k, v in hidden.items()}
        self._present_sql = self._fetch_sql = None  # rendered for these tables

    def update_from_table(self, table: Dict[str, Any]) -> None:
        """`update` from a `Catalog.table()`."""
        self.update({int(i): n for i, n in table.get("tables", {}).items()},
                    {bytes.fromhex(k): v for k, v in table.get("hidden", {}).items()})

    def is_hidden(self, key: bytes, shard_id: int) -> bool:
        """Whether `key` must not be served from shard `shard_id`."""
        ids = self.hidden.get(key)
        return ids is not None and shard_id in ids

    def find_image(self, key: bytes) -> Optional[Location]:
        """The first served image holding `key` where it is not hidden, or
        None. No database query."""
        found = self.shards.find(key)
        if found is None:
            return None
        member, slot, data_offset, size = found
        ids = self.hidden.get(key)
        if ids is None or member.winery_shard not in ids:
            return Location(size, member, slot, data_offset, member.winery_shard)
        for member in self.shards.served():  # rare: a copy is hidden
            if member.winery_shard in ids:
                continue
            hit = member.shard.find(key)
            if hit is not None:
                return Location(hit[2], member, hit[0], hit[1], member.winery_shard)
        return None

    def image_of(self, shard_id: int) -> Optional[Any]:
        """The served image (MountedShard) of winery shard `shard_id`, or
        None."""
        for member in self.shards.served():
            if member.winery_shard == shard_id:
                return member
        return None

    def _table_query(self, name: str, what: str):
        from psycopg import sql

        return sql.SQL("SELECT " + what + " FROM {} WHERE key = %s").format(sql.Identifier("shard_" + name))

    def locate(self, key: bytes) -> Optional[Location]:
        """Where `key`'s bytes are, or None when it is not an object.
        An image hit asks nothing of the database; a miss makes one
        indexed query (`present`), whether the key is absent, in a write
        shard table or packed. Raises ImageNotMapped when it is present in
        a shard with neither a table nor an image here,
        DatabaseUnavailable."""
        loc = self.find_image(key)
        if loc is not None:
            return loc
        found = self.present(key)
        if found is None:
            return None
        shard_id, size = found
        if self.is_hidden(key, shard_id):
            return None
        if size is None:
            member = self.image_of(shard_id)
            if member is not None:
                hit = member.shard.find(key)  # packed since the image lookup
                if hit is not None:
                    return Location(hit[2], member, hit[0], hit[1], shard_id)
            raise ImageNotMapped(f"object {key.hex()} is in shard {shard_id}, whose image is not "
                                 "served here (not mapped on this host?) and whose write shard is gone")
        return Location(size, shard_id=shard_id)

    def _row_query(self, what: str) -> str:
        """One query for a key (parameter ``%(key)s``): the shard
        signature2shard gives it (state present) and `what` (an SQL
        expression over ``content``) of its row in that shard's write table
        when the table is known here (a scalar subquery per table), else
        NULL. Rendered once per set of tables: composing costs more than
        the query's parsing."""
        from psycopg import sql

        cases = [sql.SQL("WHEN {} THEN (SELECT " + what + " FROM {} WHERE key = o.signature)").format(
            sql.Literal(shard_id), sql.Identifier("shard_" + name))
            for shard_id, name in sorted(self.tables.items())]
        row = sql.SQL("CASE o.shard {} END").format(sql.SQL(" ").join(cases)) if cases else sql.SQL("NULL")
        return sql.SQL("SELECT o.shard, {} FROM signature2shard o WHERE o.signature = %(key)s "
                       "AND o.state = 'present'").format(row).as_string(None)

    def fetch(self, key: bytes, offset: int, length: int) -> Optional[bytes]:
        """Bytes [offset, offset+length) of `key` (clipped at its end) where
        it is present in a write shard table known here, in one indexed
        query; None when the database says it is not an object (absent, in
        flight, deleted) or hidden. Raises KeyError when it is present
        elsewhere (packed: `locate` then `read` find its image),
        DatabaseUnavailable."""
        import psycopg

        if not self.tables:
            raise KeyError(key)
        if self._fetch_sql is None:
            self._fetch_sql = self._row_query("substring(content FROM %(start)s FOR %(length)s)")
        try:
            rows = self.db.query(self._fetch_sql, {"key": key, "start": offset + 1, "length": max(0, length)})
        except psycopg.errors.UndefinedTable:  # cleaned since the last poll
            raise KeyError(key) from None
        if not rows or self.is_hidden(key, int(rows[0][0])):
            return None
        if rows[0][1] is None:
            raise KeyError(key)
        return bytes(rows[0][1])

    def present(self, key: bytes) -> Optional[Tuple[int, Optional[int]]]:
        """(shard id, size in bytes of its row in that shard's write table,
        or None when the table is not known here or has no such row) of
        `key` where the database says it is present; None when it is
        absent, in flight or deleted. One indexed query (two when a write
        table was dropped since the last poll)."""
        import psycopg

        try:
            if self._present_sql is None:
                self._present_sql = self._row_query("octet_length(content)")
            rows = self.db.query(self._present_sql, {"key": key})
        except psycopg.errors.UndefinedTable:  # cleaned since the last poll: ask without tables
            rows = [(r[0], None) for r in self.db.query(
                "SELECT shard FROM signature2shard WHERE signature = %s AND state = 'present'", (key,))]
        if not rows:
            return None
        return int(rows[0][0]), (int(rows[0][1]) if rows[0][1] is not None else None)

    def read(self, key: bytes, loc: Location, offset: int = 0, length: Optional[int] = None) -> bytes:
        """Bytes [offset, offset+length) of `key` at `loc` (to the end
        when `length` is None), clipped at its end. Raises KeyError when
        its write shard row vanished (packed and cleaned since: locate
        again), DatabaseUnavailable."""
        import psycopg

        if length is None:
            length = max(0, loc.size - offset)
        if loc.member is not None:
            return loc.member.shard.pread(loc.data_offset, loc.size, offset, length)
        if offset >= loc.size or length <= 0:
            return b""
        name = self.tables.get(loc.shard_id)
        if name is None:
            raise KeyError(key)
        if offset == 0 and length >= loc.size:
            what, params = "content", (key,)
        else:
            what, params = "substring(content FROM %s FOR %s)", (offset + 1, length, key)
        try:
            rows = self.db.query(self._table_query(name, what), params)
        except psycopg.errors.UndefinedTable:
            raise KeyError(key) from None
        if not rows or rows[0][0] is None:
            raise KeyError(key)
        return bytes(rows[0][0])

    def get(self, key: bytes) -> Optional[bytes]:
        """The bytes of object `key`, or None when it is not one. An image
        hit asks nothing of the database; an object in a write shard table
        costs one query (`fetch`)."""
        loc = self.find_image(key)
        if loc is not None:
            return self.read(key, loc)
        try:
            return self.fetch(key, 0, (1 << 31) - 1)
        except KeyError:  # packed since, or in an image not served here
            pass
        for _ in range(2):
            loc = self.locate(key)
            if loc is None:
                return None
            try:
                return self.read(key, loc)
            except KeyError:
                continue  # its table went away meanwhile: it is in an image now
        return None

    def read_cached(self, keys: Sequence[bytes], data_bytes: int = 64 * 1024) -> Dict[int, bytes]:
        """Read from the page cache what it holds of `keys` in the served
        images, and start reading the rest without waiting: returns
        {position in keys: bytes} for the objects read.

        For each key, in the order `find_image` uses: the index slot and
        the object are read with RWF_NOWAIT. What is not cached is asked
        for with posix_fadvise(WILLNEED) (the slot; once all slots are
        asked for, the first `data_bytes` of each object they point to),
        so the device serves a cold batch's reads in parallel while a warm
        batch costs no extra call. A key hidden in a shard, or in no
        image, is left to the caller. Errors are left to the reads that
        follow."""
        done: Dict[int, bytes] = {}
        slots = []
        for i, key in enumerate(keys):
            hidden = self.hidden.get(key)
            for number in self.shards.filters.candidates(key):
                member = self.shards.get(number)
                if member is None or member.removed:
                    continue
                shard = member.shard
                try:
                    hit = shard.find(key, nowait=True)
                except BlockingIOError:
                    try:
                        at = shard.header.index_position + SLOT_SIZE * shard.slot_of(key)
                        os.posix_fadvise(shard.fileno(), at, SLOT_SIZE, os.POSIX_FADV_WILLNEED)
                        slots.append((shard, at, key))
                    except (OSError, ValueError):
                        pass
                    continue
                except Exception:
                    break  # a corrupt slot: the caller's read reports it
                if hit is None:
                    continue
                if hidden is None or member.winery_shard not in hidden:
                    try:
                        done[i] = shard.try_pread(hit[1], hit[2], 0, hit[2])
                    except BlockingIOError:
                        shard.prefetch(hit[1], hit[2], data_bytes)
                    except Exception:
                        pass
                break
        for shard, at, key in slots:
            try:
                entry = os.pread(shard.fileno(), SLOT_SIZE, at)
                if entry[:KEY_SIZE] != key:
                    continue  # not this shard's key: nothing to read
                offset = int.from_bytes(entry[KEY_SIZE:SLOT_SIZE], "big")
                if offset < shard.extent:
                    os.posix_fadvise(shard.fileno(), offset, min(data_bytes, shard.extent - offset),
                                     os.POSIX_FADV_WILLNEED)
            except (OSError, ValueError):
                continue
        return done

    def get_batch(self, keys: Sequence[bytes]) -> List[Optional[bytes]]:
        """`get` of many keys, in order: image hits read directly (what
        the page cache holds first, the rest asked for in parallel by
        `read_cached`), the rest in one query on ``signature2shard`` and
        one per write shard table they are in."""
        import psycopg

        out: List[Optional[bytes]] = [None] * len(keys)
        missing: Dict[bytes, List[int]] = {}
        cached = self.read_cached(keys) if len(keys) > 1 else {}
        for i, key in enumerate(keys):
            if i in cached:
                out[i] = cached[i]
                continue
            loc = self.find_image(key)
            if loc is not None:
                out[i] = self.read(key, loc)
            else:
                missing.setdefault(key, []).append(i)
        if not missing:
            return out
        rows = self.db.query(
            "SELECT signature, shard FROM signature2shard WHERE signature = ANY(%s) AND state = 'present'",
            (list(missing),))
        by_shard: Dict[int, List[bytes]] = {}
        for sig, shard_id in rows:
            sig = bytes(sig)
            if not self.is_hidden(sig, int(shard_id)):
                by_shard.setdefault(int(shard_id), []).append(sig)
        from psycopg import sql

        for shard_id, wanted in by_shard.items():
            name = self.tables.get(shard_id)
            got: Dict[bytes, bytes] = {}
            if name is not None:
                query = sql.SQL("SELECT key, content FROM {} WHERE key = ANY(%s)").format(
                    sql.Identifier("shard_" + name))
                try:
                    got = {bytes(k): bytes(c) for k, c in self.db.query(query, (wanted,)) if c is not None}
                except psycopg.errors.UndefinedTable:
                    got = {}
            for key in wanted:
                data = got.get(key)
                if data is None:
                    data = self.get(key)  # packed and cleaned meanwhile
                for i in missing[key]:
                    out[i] = data
        return out


# ------------------------------------------------------------ Python API


class WineryStore:
    """A winery deployment's objects, read without FUSE: what a shardfs
    mount of it shows, as a mapping from key to bytes.

    `dsn`: a libpq connection string (key=value or URI; SELECT rights
    suffice). `pools_dir`: a directory pool's base directory (default: Ceph
    images mapped under /dev/rbd; LIBRBD, ``"rbd:"``: Ceph images read
    through librbd, as configured by `shardfs.rbd.configure`). `cache_dir`: where sidecars of images
    are found (the mounts' cache; none is built here: an image without one
    is probed directly). Keys are 32 raw bytes or 64 hex characters.

    The catalog (shards, takedowns) is polled again when a call comes more
    than POLL_SECONDS after the last poll. Raises WineryError at
    construction when the database is not a usable winery database;
    methods raise DatabaseUnavailable when an object not in a served image
    needs the database and it cannot be reached, ValueError for a
    malformed key. Not thread-safe; use one per thread.
    """

    def __init__(self, dsn: str, pools_dir: Optional[str] = None, cache_dir: Optional[str] = None) -> None:
        from shardfs.shardset import ShardSet

        self.schema = check(dsn)
        self.db = Database(dsn, max_size=2, name="shardfs api")
        self.shards = ShardSet(cache_dir=cache_dir)
        self.catalog = Catalog(self.db, pools_dir)
        self.reader = Reader(self.shards, self.db)
        self.refresh()

    def refresh(self) -> None:
        """Poll the catalog now. Raises DatabaseUnavailable."""
        change = self.catalog.sync(self.shards)
        for member in change.removed:
            self.shards.discard(member)  # no file is open on it here
        self.reader.update(self.catalog.tables, self.catalog.hidden)

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self.catalog.polled_at >= POLL_SECONDS:
            try:
                self.refresh()
            except DatabaseUnavailable:
                pass  # keep serving what is known; Database logged it

    def _retry(self, call: Any) -> Any:
        """`call()`, once more after a poll if an image was missing (a
        shard cleaned since the last poll). Raises ImageNotMapped when it
        is still missing."""
        try:
            return call()
        except ImageNotMapped:
            self.refresh()
            return call()

    def get(self, key: Any) -> bytes:
        """The object's bytes. Raises KeyError when `key` is not an
        object of the deployment (absent, deleted, in flight),
        ImageNotMapped when it is in an image not mapped here."""
        raw = normalize_key(key)
        self._maybe_refresh()
        data = self._retry(lambda: self.reader.get(raw))
        if data is None:
            raise KeyError(key)
        return data

    def get_batch(self, keys: Iterable[Any]) -> List[Optional[bytes]]:
        """The bytes of each key, in order (None where not an object)."""
        raws = [normalize_key(k) for k in keys]
        self._maybe_refresh()
        return self._retry(lambda: self.reader.get_batch(raws))

    def __contains__(self, key: Any) -> bool:
        raw = normalize_key(key)
        self._maybe_refresh()
        try:
            return self.reader.locate(raw) is not None
        except ImageNotMapped:
            return True  # it is an object, only not readable here now

    def __getitem__(self, key: Any) -> bytes:
        return self.get(key)

    def close(self) -> None:
        """Close the images and the connections."""
        self.shards.close()
        self.db.close()

    def __enter__(self) -> "WineryStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
