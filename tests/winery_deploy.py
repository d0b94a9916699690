"""Real Software Heritage winery deployments for the tests.

A `Deployment` is a winery object storage as swh-objstorage 7.4.1 runs it
(``swh.objstorage.backends.winery``): a PostgreSQL database holding the
``shards`` and ``signature2shard`` tables and one ``shard_<name>`` table per
write shard, and a *directory* shards pool (``ShardBackedPool``) where packed
shards become Read Shard image files ``<pools_dir>/<pool_name>/<name>``.

Everything that writes goes through swh-objstorage's own code: objects are
added with ``WineryObjStorage.add``, write shards are released with the
writer's ``release_shard``, packed with ``housekeeping.shard_packer``,
cleaned with ``housekeeping.rw_shard_cleaner``, objects are deleted with
``WineryObjStorage.delete`` and purged with
``housekeeping.deleted_objects_cleaner``. This module only *reads* the
tables (`Deployment.shards`, `Deployment.signature`, ...).

The life of a shard (``shards.state``), as swh drives it::

    writing --add() fills it, or release()--> full --pack_full()--> packing
            --> packed (image written, write table still there)
            --clean()--> cleaning --> readonly (shard_<name> table dropped)

An image is created mode 0600 while packing, then "remapped read-only":
mode 0000 then 0400 (swh's directory pool emulates Ceph RBD mapping with file
modes, ``use_permissions=True`` by default). `clean_deleted` maps it 0600,
zeroes the deleted objects in it, and maps it back 0400.

The database: each deployment gets its own database, a copy (``CREATE
DATABASE ... TEMPLATE``) of one initialised once per server with swh's
``initialize_database_for_module("objstorage.backends.winery", version=5)``.
Two roles:

* the server's superuser ``postgres`` (`Deployment.dsn`): what swh's writer,
  packer and cleaners use (they CREATE and DROP the ``shard_<name>`` tables,
  which needs CREATE on schema public; PostgreSQL 15 grants it to the
  database owner only);
* ``guest``/``guest`` (`Deployment.readonly_dsn`): a LOGIN role with SELECT
  on every table, including the ``shard_<name>`` tables created later (``ALTER
  DEFAULT PRIVILEGES ... GRANT SELECT ON TABLES``: that covers tables created
  by ``postgres``, the writer role here), and nothing else (no INSERT, UPDATE,
  DELETE, no CREATE).

Both DSNs are libpq key=value strings over TCP (127.0.0.1, password
checked with scram-sha-256).
"""

import os
import uuid

import psycopg

from swh.core.db.db_utils import initialize_database_for_module
from swh.objstorage.backends.winery import housekeeping
from swh.objstorage.backends.winery.objstorage import WineryObjStorage
from swh.objstorage.backends.winery.pools import pool_from_settings
from swh.objstorage.backends.winery.sharedbase import ShardState, SharedBase
from swh.objstorage.objstorage import objid_for_content

from pg_server import PostgresServer

__all__ = ["Deployment", "PostgresServer", "winery_template", "DEFAULT_SHARD_MAX_SIZE",
           "DEFAULT_POOL_NAME", "READONLY_USER", "READONLY_PASSWORD"]

READONLY_USER = "guest"
READONLY_PASSWORD = "guest"
TEMPLATE_DB = "winery_template"
DEFAULT_SHARD_MAX_SIZE = 4096  # bytes of object contents per write shard
DEFAULT_POOL_NAME = "shards"  # swh's default directory pool name


class _NothingLeft(Exception):
    """Raised by our wait_for_shard callbacks: swh's housekeeping loops would
    sleep and poll forever once no shard is left to process."""


def _no_more_shards(_attempt):
    raise _NothingLeft


def winery_template(server):
    """The name (str) of the initialised winery template database on `server`.

    Made once per server: creates the read-only role (LOGIN, password) if
    missing, a database initialised with swh's own
    ``initialize_database_for_module`` (needs ``psql`` on $PATH; the schema of
    ``SharedBase.current_version``), SELECT on its tables for the read-only role
    and default privileges so that tables created later by ``postgres`` are
    readable by it too.
    """
    if getattr(server, "_winery_template", None):
        return server._winery_template
    with psycopg.connect(server.socket_dsn("postgres"), autocommit=True) as c:
        exists = c.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                           (READONLY_USER,)).fetchone()
        if not exists:
            c.execute(f"CREATE ROLE {READONLY_USER} LOGIN PASSWORD '{READONLY_PASSWORD}'")
        c.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB}")
        c.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    initialize_database_for_module(modname="objstorage.backends.winery",
                                   version=SharedBase.current_version,
                                   conninfo=server.socket_dsn(TEMPLATE_DB))
    with psycopg.connect(server.socket_dsn(TEMPLATE_DB), autocommit=True) as c:
        c.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        c.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READONLY_USER}")
        c.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public "
                  f"GRANT SELECT ON TABLES TO {READONLY_USER}")
    server._winery_template = TEMPLATE_DB
    return TEMPLATE_DB


class Deployment:
    """A winery object storage on `server` (a `pg_server.PostgresServer`).

    Arguments:
      server: the PostgreSQL server; a fresh database is created on it.
      pools_dir: the directory pool's base directory (str or path; created if
        missing); images go to ``<pools_dir>/<pool_name>/<shard name>``.
      shard_max_size: bytes of object contents after which swh's writer
        declares a write shard full (its last object may overshoot it).
      pool_name: the name of the directory pool (``shards.pool_name``).
      use_permissions: swh's directory pool setting (default True, as swh):
        image file modes emulate RBD mapping (0600 rw, 0400 ro, 0000 unmapped).
      rw_idle_timeout: seconds after which swh's writer puts an idle writing
        shard back to ``standby`` (large by default: tests decide).
      dbname: the database name (default: a new unique name).
      pool_type: "directory" (Read Shard images, swh's ``ShardBackedPool``)
        or "mosaic" (MOSAIC file images, swh's ``MosaicBackedPool``, with
        ``compression_level``: None for raw, else zstd's level); either way
        images are ``<pools_dir>/<pool_name>/<shard name>``; or
        "mosaic-s3" (swh's ``MosaicS3BackedPool``: MOSAIC files packed in
        `pools_dir`, then uploaded to ``<base_url>/<pool_name>/<shard
        name>``, `base_url` an ``s3://BUCKET[/PREFIX]`` URL, swh's boto3
        client made with `boto3_config` and the ``AWS_*`` variables).

    Attributes: ``server``, ``dbname``, ``dsn``, ``readonly_dsn``,
    ``pools_dir`` (str), ``pool_name``, ``shard_max_size``, ``pool_settings``
    (swh's shards pool settings dict), ``settings`` (the keyword arguments of
    ``WineryObjStorage``, without ``allow_delete``), ``storage`` (the
    ``WineryObjStorage``, writable, ``allow_delete=True``).

    Call `close` (then `drop` to remove the database) at the end.
    """

    def __init__(self, server, pools_dir, *, shard_max_size=DEFAULT_SHARD_MAX_SIZE,
                 pool_name=DEFAULT_POOL_NAME, use_permissions=True, rw_idle_timeout=3600,
                 dbname=None, pool_type="directory", compression_level=None, base_url=None,
                 boto3_config=None):
        self.server = server
        self.dbname = dbname or f"winery_{uuid.uuid4().hex[:16]}"
        self.pools_dir = str(pools_dir)
        self.pool_name = pool_name
        self.shard_max_size = shard_max_size
        os.makedirs(self.pools_dir, exist_ok=True)
        template = winery_template(server)
        with psycopg.connect(server.socket_dsn("postgres"), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.dbname}" TEMPLATE {template}')
        self.dsn = server.dsn(self.dbname)
        self.readonly_dsn = server.dsn(self.dbname, user=READONLY_USER,
                                       password=READONLY_PASSWORD)
        self.pool_settings = {
            "type": pool_type,
            "pool_name": pool_name,
            "base_directory": self.pools_dir,
            "shard_max_size": shard_max_size,
            "use_permissions": use_permissions,
        }
        if pool_type in ("mosaic", "mosaic-s3"):
            self.pool_settings["compression_level"] = compression_level
        if pool_type == "mosaic-s3":
            # swh's MosaicS3BackedPool: images packed in <pools_dir>/<pool_name>/,
            # then uploaded to <base_url>/<pool_name>/<name> (S3 settings from
            # the AWS_* variables and `boto3_config`).
            del self.pool_settings["base_directory"], self.pool_settings["use_permissions"]
            self.pool_settings.update(base_url=base_url, tmp_directory=self.pools_dir,
                                      boto3_config=dict(boto3_config or {}))
        self.settings = {
            "database": {"db": self.dsn},
            "shards_pools": [self.pool_settings],
            "shards_active_pool": pool_name,
            "packer": {"create_images": True},
        }
        self.storage = WineryObjStorage(**self.settings, allow_delete=True,
                                        rw_idle_timeout=rw_idle_timeout)
        self._closed = False

    # ------------------------------------------------------------- writing
    def add(self, content):
        """Add `content` (bytes) through swh's ``WineryObjStorage.add``; return
        its key, the 32-byte SHA-256 (``objid_for_content(content)["sha256"]``).

        When the write shard's contents reach `shard_max_size`, swh marks it
        ``full`` and the next add starts a new shard. Adding content already
        present (and not deleted) does nothing.
        """
        obj_id = objid_for_content(content)
        self.storage.add(content, obj_id=obj_id)
        return obj_id["sha256"]

    def add_many(self, contents):
        """`add` each of `contents` (iterable of bytes) in order, one at a time
        (so shards fill and rotate as with single adds); return the list of
        keys (bytes), in the same order."""
        return [self.add(c) for c in contents]

    def release(self):
        """Mark the shard the writer is filling as ``full`` (swh's
        ``writer.release_shard(new_state=FULL)``) so `pack_full` packs it even
        if it is below `shard_max_size`. Return its name (str), or None when
        the writer holds no shard (nothing added since the last rotation)."""
        shard = self.storage.writer._shard
        if shard is None:
            return None
        self.storage.writer.release_shard(new_state=ShardState.FULL)
        return shard.name

    def pack_full(self):
        """Pack every ``full`` shard of the pool into a Read Shard image with
        swh's ``housekeeping.shard_packer`` (images created by swh, in
        process); they end ``packed`` (write tables still present). Return the
        names (list of str, sorted) of the shards packed.

        Raises ValueError, before packing anything, if a full shard's write
        table is empty (all its objects deleted): swh.shard 2.2.1's
        ShardCreator loops forever (100% CPU) on a shard of 0 objects."""
        before = {name for (_id, name, state, _pool) in self.shards() if state == "full"}
        with self.connect() as c:
            empty = [n for n in sorted(before)
                     if not c.execute(f"SELECT EXISTS (SELECT FROM shard_{n})").fetchone()[0]]
        if empty:
            # swh.shard's ShardCreator spins forever building a 0-key index
            raise ValueError(f"full shards with no object left (all deleted?) {empty}: "
                             "swh's packer would hang on them")
        packed = []
        try:
            housekeeping.shard_packer(
                **self.settings,
                stop_packing=lambda n: packed.append(n) and False,
                wait_for_shard=_no_more_shards)
        except _NothingLeft:
            pass
        after = {name: state for (_id, name, state, _pool) in self.shards()}
        names = sorted(n for n in before if after.get(n) == "packed")
        assert len(names) == packed[-1], (names, packed)
        return names

    def clean(self):
        """Clean every ``packed`` shard with swh's
        ``housekeeping.rw_shard_cleaner`` (no mapping host required): its
        ``shard_<name>`` table is dropped and it becomes ``readonly``. Return
        the names (list of str, sorted) of the shards cleaned."""
        before = {name for (_id, name, state, _pool) in self.shards() if state == "packed"}
        count = []
        try:
            housekeeping.rw_shard_cleaner(
                database=self.settings["database"], min_mapped_hosts=0,
                stop_cleaning=lambda n: count.append(n) and False,
                wait_for_shard=_no_more_shards)
        except _NothingLeft:
            pass
        after = {name: state for (_id, name, state, _pool) in self.shards()}
        names = sorted(n for n in before if after.get(n) == "readonly")
        assert len(names) == count[-1], (names, count)
        return names

    def delete(self, key):
        """Delete the object `key` (32-byte SHA-256) with swh's
        ``WineryObjStorage.delete``: its ``signature2shard`` row becomes
        ``deleted``; if its shard has no image yet, the row of its
        ``shard_<name>`` table goes too. Raises swh's ObjNotFoundError if it
        is absent."""
        self.storage.delete({"sha256": key})

    def clean_deleted(self):
        """Purge the deleted objects of the pool with swh's
        ``housekeeping.deleted_objects_cleaner``: in a ``readonly`` (or
        ``cleaning``) shard the object is zeroed in the image (image remapped
        0600, then 0400), and its ``signature2shard`` row is removed. Return
        the number of rows removed (int).

        swh's cleaner "maps" the image of every shard holding a deleted
        object; with the directory pool that chmods the image file, so a
        deleted object in a shard that has no image yet (not packed) makes it
        fail with FileNotFoundError: pack and clean first.
        """
        base = SharedBase(base_dsn=self.dsn, application_name="shardfs tests cleaner")
        n = len(list(base.deleted_objects(pool_name=self.pool_name)))
        try:
            housekeeping.deleted_objects_cleaner(
                base=base, pool=pool_from_settings(self.pool_settings),
                stop_running=lambda: False)
            left = len(list(base.deleted_objects(pool_name=self.pool_name)))
        finally:
            _close_database(base)
        return n - left

    # ------------------------------------------------------------- reading
    def connect(self, readonly=False):
        """A new psycopg connection (autocommit) to the deployment's database,
        as ``postgres``, or as the read-only role if `readonly`; close it."""
        return psycopg.connect(self.readonly_dsn if readonly else self.dsn, autocommit=True)

    def _query(self, sql, args=()):
        with self.connect() as c:
            return c.execute(sql, args).fetchall()

    def shards(self):
        """The ``shards`` table: list of (id: int, name: str, state: str,
        pool_name: str), by id."""
        return [(i, name.strip(), state, pool) for (i, name, state, pool) in
                self._query("SELECT id, name, state::text, pool_name FROM shards ORDER BY id")]

    def shard_state(self, name):
        """The state (str) of shard `name`, or None if there is none."""
        rows = self._query("SELECT state::text FROM shards WHERE name = %s", (name,))
        return rows[0][0] if rows else None

    def signature(self, key):
        """The ``signature2shard`` row of `key`: (shard name: str, state: str,
        one of inflight, present, deleted), or None if there is none."""
        rows = self._query(
            "SELECT s.name, o.state::text FROM signature2shard o JOIN shards s "
            "ON s.id = o.shard WHERE o.signature = %s", (key,))
        return (rows[0][0].strip(), rows[0][1]) if rows else None

    def shard_tables(self):
        """Names (list of str, sorted) of the shards whose ``shard_<name>``
        write table exists."""
        rows = self._query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename LIKE 'shard\\_%%' AND tablename <> 'shard_template'")
        return sorted(r[0][len("shard_"):] for r in rows)

    def image_path(self, name):
        """The path (str) of shard `name`'s image in the directory pool (it
        exists once the shard has been packed)."""
        return os.path.join(self.pools_dir, self.pool_name, name)

    # ------------------------------------------------------------- the end
    def close(self):
        """Shut the storage down (swh's ``on_shutdown``: the writing shard goes
        back to ``standby``) and close its connection pools (idempotent)."""
        if self._closed:
            return
        self._closed = True
        reader, writer = self.storage.reader, self.storage.writer
        rw_shards = list(reader.rw_shards.values())
        try:
            self.storage.on_shutdown()
        finally:
            for db in [reader.base] + rw_shards + ([writer.base] if writer else []):
                _close_database(db)

    def drop(self):
        """Drop the database, closing whatever connections it still has."""
        with psycopg.connect(self.server.socket_dsn("postgres"), autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')


def _close_database(db):
    """Close the connection pool of a swh winery ``Database`` (SharedBase,
    RWShard) now rather than when it is garbage-collected."""
    pool = getattr(db, "_pool", None)
    if pool is not None:
        db._pool = None
        pool.close()
