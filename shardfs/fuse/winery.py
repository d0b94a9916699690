"""A mount of a winery object storage: what a worker process needs.

`shardfs.winery` finds objects (`Reader`) and follows the database
(`Catalog`, run by the coordinator, which publishes the write shard tables
and the hidden keys with the shard table). This module adds what the FUSE
handlers (`shardfs.fuse.handlers`) need on top, per process:

* inodes for objects read from a write shard table, which have no shard
  slot: the worker gives each the next number of its inode ring in shared
  memory (`shardfs.fuse.shared.SharedState.ring_put`), so that any worker
  resolves it (`resolve`); a ring entry is overwritten after RING_ENTRIES
  newer ones, and its inode then answers ESTALE (the kernel looks the name
  up again);
* a short cache of where such objects are (`POLL_SECONDS`), so that the
  READ requests of a large object do not each ask the database where it
  is; a key hidden since is refused all the same;
* listings of the write shard tables for a key range (a fan-out leaf) or
  whole (a flat root);
* with ``-o hashes=``, the objects of the write shard tables by sha1 and
  sha1_git (`find_by_hash`: hashed here once each; the images have their
  hash indexes, `shardfs.hashes`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from shardfs import hashes
from shardfs.fuse.layout import db_inode, split_db_inode
from shardfs.shard import KEY_SIZE
from shardfs.winery import POLL_SECONDS, DatabaseUnavailable, ImageNotMapped, Location, Reader

log = logging.getLogger("shardfs.fuse")

#: Keys whose location a process remembers (for POLL_SECONDS).
LOCATION_CACHE = 4096


class WineryView:
    """One process's view of a winery deployment for the handlers.

    `reader` is this process's `shardfs.winery.Reader` (over the same
    ShardSet as the filesystem). Until `attach` gives it the shared state
    (in a worker), inodes are kept in a local table.
    """

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.state: Any = None
        self.position = 0
        self._numbers: Dict[bytes, int] = {}  # key -> ring number, this process's
        self._local: Dict[int, Tuple[bytes, int]] = {}  # without shared state
        self._locations: Dict[bytes, Tuple[float, Location]] = {}
        self._db_listing: Tuple[Any, List[Tuple[bytes, int]]] = (None, [])
        #: Waits (at most the seconds given) for the coordinator to publish
        #: a new table and takes it; True if it did (set by the worker).
        self.wait_for_table: Optional[Callable[[float], bool]] = None
        #: Objects of the write shard tables by another hash (`find_by_hash`):
        #: hash name -> {digest: key}, the keys hashed, when last listed.
        self._db_digests: Dict[str, Dict[bytes, bytes]] = {}
        self._db_hashed: Set[bytes] = set()
        self._db_hashed_at = -POLL_SECONDS

    def attach(self, state: Any, position: int) -> None:
        """Use worker `position`'s inode ring in `state` from now on."""
        self.state = state
        self.position = position
        self._numbers.clear()
        self._local.clear()

    def update_from_table(self, table: Dict[str, Any]) -> None:
        """Take the tables and hidden keys the coordinator published."""
        self.reader.update_from_table(table)
        self._locations.clear()
        self._db_listing = (None, [])

    def close(self) -> None:
        """Close this process's database connections."""
        self.reader.db.close()

    # -------------------------------------------------------------- inodes

    def inode_for(self, key: bytes, size: int) -> int:
        """The inode of database object `key` (`size` bytes), the same as
        last time while its ring entry lasts."""
        number = self._numbers.get(key)
        if number is not None:
            entry = self.resolve(db_inode(self.position, number))
            if entry is not None and entry[0] == key:
                return db_inode(self.position, number)
        if self.state is not None:
            number = self.state.ring_put(self.position, key, size)
        else:
            number = len(self._local) + 1
            self._local[number] = (key, size)
        if len(self._numbers) >= 1 << 16:
            self._numbers.clear()
        self._numbers[key] = number
        return db_inode(self.position, number)

    def resolve(self, inode: int) -> Optional[Tuple[bytes, int]]:
        """(key, size) of a database object's inode, None when its ring
        entry was overwritten (ESTALE) or it is not such an inode."""
        split = split_db_inode(inode)
        if split is None:
            return None
        if self.state is None:
            return self._local.get(split[1]) if split[0] == self.position else None
        return self.state.ring_get(*split)

    # ----------------------------------------------------------- locations

    def locate(self, key: bytes) -> Optional[Location]:
        """`Reader.locate`, remembered for POLL_SECONDS (a key hidden since
        is refused all the same). Raises DatabaseUnavailable."""
        now = time.monotonic()
        hit = self._locations.get(key)
        if hit is not None and now - hit[0] < POLL_SECONDS:
            loc = hit[1]
            if not self.reader.is_hidden(key, loc.shard_id) and (loc.member is None or not loc.member.removed):
                return loc
        try:
            loc = self.reader.locate(key)
        except ImageNotMapped:
            # Often a shard cleaned (its table dropped) since the last poll:
            # the next table serves its image.
            if self.wait_for_table is None or not self.wait_for_table(2 * POLL_SECONDS + 0.5):
                raise
            loc = self.reader.locate(key)
        if len(self._locations) >= LOCATION_CACHE:
            self._locations.clear()
        if loc is not None:
            self._locations[key] = (now, loc)
        else:
            self._locations.pop(key, None)
        return loc

    def read(self, key: bytes, offset: int, length: int) -> Optional[bytes]:
        """Bytes [offset, offset+length) of object `key`, None when it is
        not an object anymore. Raises DatabaseUnavailable."""
        hit = self._locations.get(key)
        if hit is None or time.monotonic() - hit[0] >= POLL_SECONDS:
            try:  # not located by this process lately: one query, if in a table
                return self.reader.fetch(key, offset, length)
            except KeyError:  # packed, or its table is gone: locate its image
                pass
        for _ in range(2):
            loc = self.locate(key)
            if loc is None:
                return None
            try:
                return self.reader.read(key, loc, offset, length)
            except KeyError:  # its row went away: packed and cleaned since
                self._locations.pop(key, None)
        return None

    # ------------------------------------------------------------ hashes

    def find_by_hash(self, names: Sequence[str], name: str, digest: bytes) -> Optional[bytes]:
        """The key of the object of a write shard table whose `name` digest
        (sha1 or sha1_git) is `digest`, or None. This process hashes each
        object of the tables once (its bytes read from PostgreSQL, 256
        rows per query); on a miss the tables' keys are listed again (one
        query per table, at most once per POLL_SECONDS), so an object
        written since is found within that bound. The digests are computed
        here from the bytes: the answer is right by construction. A
        database that cannot be asked finds nothing (logged)."""
        table = self._db_digests.setdefault(name, {})
        key = table.get(digest)
        if key is not None or time.monotonic() - self._db_hashed_at < POLL_SECONDS:
            return key
        self._db_hashed_at = time.monotonic()
        try:
            self._hash_tables(names)
        except DatabaseUnavailable as exc:
            log.warning("cannot list the write shards to find a %s: %s", name, exc)
        return table.get(digest)

    def _hash_tables(self, names: Sequence[str]) -> None:
        from psycopg import sql

        for shard_id, table in sorted(self.reader.tables.items()):
            ident = sql.Identifier("shard_" + table)
            try:
                keys = [bytes(k) for (k,) in self.reader.db.query(sql.SQL("SELECT key FROM {}").format(ident))]
            except DatabaseUnavailable:
                raise
            except Exception as exc:  # a table dropped meanwhile: it was packed
                log.debug("listing write shard %s: %s", table, exc)
                continue
            new = [k for k in keys if k not in self._db_hashed]
            for i in range(0, len(new), 256):
                rows = self.reader.db.query(sql.SQL("SELECT key, content FROM {} WHERE key = ANY(%s)").format(ident),
                                            (new[i:i + 256],))
                for key, content in rows:
                    key, content = bytes(key), bytes(content)
                    for name in names:
                        self._db_digests.setdefault(name, {})[hashes.digest(name, content)] = key
                    self._db_hashed.add(key)

    # ------------------------------------------------------------ listings

    def table_range(self, low: bytes, high: Optional[bytes]) -> List[Tuple[bytes, int]]:
        """(key, size) of the present objects of every write shard table
        with low <= key < high (no upper bound when `high` is None), by
        key, without hidden keys. A database that cannot be asked gives
        [] (logged): listings keep showing the images."""
        from psycopg import sql

        out: Dict[bytes, int] = {}
        for shard_id, name in sorted(self.reader.tables.items()):
            query = sql.SQL(
                "SELECT c.key, octet_length(c.content) FROM {} c JOIN signature2shard g "
                "ON g.signature = c.key AND g.state = 'present' AND g.shard = %s "
                "WHERE c.key >= %s" + (" AND c.key < %s" if high is not None else "")
            ).format(sql.Identifier("shard_" + name))
            params: Tuple[Any, ...] = (shard_id, low) + ((high,) if high is not None else ())
            try:
                rows = self.reader.db.query(query, params)
            except DatabaseUnavailable:
                return []
            except Exception as exc:  # a table dropped meanwhile: it was packed
                log.debug("listing write shard %s: %s", name, exc)
                continue
            for key, size in rows:
                key = bytes(key)
                if size is not None and not self.reader.is_hidden(key, shard_id):
                    out.setdefault(key, int(size))
        return sorted(out.items())

    def table_listing(self, version: Any) -> List[Tuple[bytes, int]]:
        """Every present object of the write shard tables that no served
        image holds, by key (for a flat root), computed once per `version`
        of the shard set and POLL_SECONDS."""
        now = time.monotonic()
        cached_at, listing = self._db_listing
        if cached_at is not None and cached_at[0] == version and now - cached_at[1] < POLL_SECONDS:
            return listing
        listing = [(k, s) for k, s in self.table_range(b"", None) if self.reader.find_image(k) is None]
        self._db_listing = ((version, now), listing)
        return listing


def key_range(hexprefix: str) -> Tuple[bytes, Optional[bytes]]:
    """The 32-byte keys spelling `hexprefix`: [low, high), high None when
    the range reaches the last key."""
    n = len(hexprefix)
    if n == 0:
        return bytes(KEY_SIZE), None
    value = int(hexprefix, 16)
    shift = 4 * (2 * KEY_SIZE - n)
    low = (value << shift).to_bytes(KEY_SIZE, "big")
    top = (value + 1) << shift
    return low, (top.to_bytes(KEY_SIZE, "big") if top < 1 << (8 * KEY_SIZE) else None)
