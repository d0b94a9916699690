"""Memory shared by a mount's coordinator and its worker processes.

One shared mapping of a memory file (``memfd_create``), made by the first
coordinator before it forks the workers, so every process of the mount
sees the same bytes; the mount's supervisor (`shardfs.fuse.supervisor`)
keeps the file, so that a coordinator started after the first one died
(`SharedState.attach`) finds the table, the counters and the workers'
process IDs where they were. Nothing in it needs a lock: each word has one
writer. Its layout is versioned (`STATE_VERSION`, in the header): a
process that does not know the version refuses to attach.

* The **shard table**, written by the coordinator only, read by the
  workers before each request when its sequence number changed: which
  shards are served, under which numbers, which are removed but still
  readable through open files, where their sidecars are. It is JSON, behind
  a sequence lock (the sequence is odd while the coordinator writes; a
  reader that saw it change retries), so a worker never acts on a torn copy.
  It is written into one of two regions in turn and the region is switched
  only once written (`_ACTIVE`): a coordinator killed while writing leaves
  the sequence odd and the table before intact, which the next one reads
  (`read_last`) and publishes again.
  Beside it, the **change** from the table before: the entries of shards
  added or changed, the numbers of shards gone, and the table's other
  parts. A worker that applied the table before reads the change alone
  (`read_change`): with 100,000 shards, a sidecar built costs it one
  entry, not a parse of the whole table.
* A **row per worker position** (a replacement worker takes over the row of
  the one it replaces): requests served by kind (counted by the C request
  path of every thread of the worker, atomically), the shard set's lookups
  and index probes, objects pushed ahead into the kernel's page cache and
  pushes the kernel refused, and the requests that reached the worker's
  Python handlers, by handler (written by those handlers, which run one at
  a time in a worker: one writer). Lookups, index probes and hash probes
  are counted by both sides of a worker, each in words of its own: the C
  request path adds atomically to its words from every thread, the Python
  handlers (one request at a time) to theirs; `lookups` and `hash_probes`
  add the two up. (A read-modify-write from Python of a word C adds to
  would lose every C add landing between its read and its write.)
* **Request durations per worker position**: for each request kind, a
  count per duration bucket and the sum of nanoseconds (counted by the
  C request path, atomically: shardfs/c/ll.h), for the mount's metrics.
* **A ring of inodes per worker position**, for objects read from a winery
  database (`shardfs.fuse.winery`): such an object has no shard slot to
  name it, so the worker that first answers for it gives it the next
  number of its ring and writes (number, key, size) there; any process
  resolves the inode from that entry. An entry is overwritten
  `RING_ENTRIES` numbers later: an inode older than that answers ESTALE
  and the kernel looks the name up again.

Words are native 64-bit integers; positions are in words unless said.
"""

from __future__ import annotations

import json
import mmap
import os
import time
from typing import Any, Dict, List, Tuple

from shardfs import _shardfs

#: Request kinds counted per worker, in this order: the names of enum
#: ll_kind in shardfs/c/ll.h, where they are counted.
REQUEST_KINDS = _shardfs.REQUEST_KINDS

#: Requests that reached the Python handlers (shardfs.fuse.handlers.ShardFS:
#: what the C request path does not answer alone), counted per worker by
#: handler name, in this order; "other" for a handler not listed.
PYTHON_KINDS = ("lookup", "getattr", "read", "readdir", "statfs", "access", "getxattr", "listxattr", "other")

#: Upper bounds of the request duration buckets, nanoseconds (shardfs/c/ll.h).
HIST_BOUNDS_NS = _shardfs.HIST_BOUNDS_NS
#: Words per request kind of a duration histogram: a count per bucket
#: (the bounds, then above the last), then the sum of nanoseconds.
HIST_WORDS = len(HIST_BOUNDS_NS) + 2
HIST_ROW_WORDS = HIST_WORDS * len(REQUEST_KINDS)

#: Most worker processes a mount may have.
MAX_WORKERS = 64
#: Bytes the shard table may take (JSON; ~200 bytes per shard).
TABLE_BYTES = 64 << 20
#: Entries of each worker position's inode ring (see the module's
#: docstring), of RING_WORDS words: number, key (4 words), size.
RING_ENTRIES = 1 << 18
RING_WORDS = 6

_HEADER_WORDS = 512  # [SEQ] table sequence, [1] unused, [2] change's length, [3] its base,
# [RESTARTS] workers that died and were replaced (the coordinator's), [VERSION], [WORKERS], [COORDINATOR_RESTARTS],
# [_ACTIVE] the region of the table last written whole, [_REGION_LEN + r] its length in bytes
#: Word of the table's sequence number (even; odd while it is written).
SEQ = 0
# (word 1, the table's length before it had two regions, is not used)
_CHANGE_LEN = 2
_CHANGE_BASE = 3
#: Word of the count of workers that died and were replaced (written by the coordinator).
RESTARTS = 4
#: Word of the layout's version (`STATE_VERSION`), and of the worker positions it has.
VERSION = 5
WORKERS = 6
#: Word of the count of coordinators started after one died (written by each coordinator).
COORDINATOR_RESTARTS = 7
_ACTIVE = 8
_REGION_LEN = 9  # and 10
#: Word of the count of upgrades in place done (`shardfs upgrade`: written by the coordinator that did it).
UPGRADES = 11
#: Word of the CLOCK_MONOTONIC time (ns) at which the last coordinator taking over published its table.
TAKEN_OVER_NS = 13
_INIT_LEN = 12  # the kernel's INIT request's length in bytes, then its bytes from word _INIT
_INIT = 16
_INIT_BYTES = 8 * 240
#: The version of this layout: a process of another version does not attach.
STATE_VERSION = 1
ROW_WORDS = 64
# Row layout: LOOKUPS..HASH_PROBES are the words the C request path
# counts in (shardfs/c/ll_fast.c, atomically: lookups, index probes,
# objects pushed into the kernel's page cache ahead of their reads, pushes
# the kernel refused, hash index probes of lookups by sha1 or sha1_git);
# RING_NEXT is the worker's ring's last number; KINDS.. the requests by
# kind (C, atomically); PY_LOOKUPS, PY_PROBES, PY_HASH_PROBES the lookups,
# index probes and hash probes of the Python handlers (WorkerHooks.end).
STATS = 2  # the C request path's enum ll_stat (ll.h), from here on
LOOKUPS, PROBES, PUSHED, PUSH_REFUSED, HASH_PROBES = (
    STATS + _shardfs.STAT_WORDS.index(name) for name in ("lookups", "probes", "pushed", "push_refused", "hash_probes"))
RING_NEXT = STATS + len(_shardfs.STAT_WORDS)
KINDS = RING_NEXT + 1
PY_LOOKUPS, PY_PROBES, PY_HASH_PROBES = 36, 37, 38
assert KINDS + len(REQUEST_KINDS) <= PY_LOOKUPS
#: First word of a row's PYTHON_KINDS counters (after the Python handlers' lookups and probes).
PYTHON = PY_HASH_PROBES + 1
#: First of a row's IO_WORDS words (bytes answered, bytes pushed, error
#: answers: counted by C where they are written, atomically: shardfs/c/ll.h).
IO = PYTHON + len(PYTHON_KINDS)
IO_WORDS = _shardfs.IO_WORDS
#: Word of a row holding its worker's process ID (written by the coordinator
#: that forks it; 0: none), read by a coordinator taking over.
PID = ROW_WORDS - 1
assert IO + len(IO_WORDS) <= PID


class SharedState:
    """The shared mapping of one mount for `workers` positions.

    Made by the coordinator before forking (the mapping is inherited), in
    a memory file whose descriptor is `fd` (`attach` maps it in another
    process). Virtual size is about ``8 * RING_WORDS * RING_ENTRIES *
    workers + 2 * TABLE_BYTES`` bytes; only the pages written take memory.
    Raises ValueError when `workers` is out of 1..MAX_WORKERS.
    """

    def __init__(self, workers: int, fd: int = -1) -> None:
        if not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}")
        self.workers = workers
        self._rows = _HEADER_WORDS
        self._rings = self._rows + ROW_WORDS * workers
        self._hists = self._rings + RING_WORDS * RING_ENTRIES * workers
        self._regions = (8 * (self._hists + HIST_ROW_WORDS * workers),)
        self._regions += (self._regions[0] + TABLE_BYTES,)
        size = self._regions[1] + TABLE_BYTES
        made = fd < 0
        if made:
            fd = os.memfd_create("shardfs-state", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        elif os.fstat(fd).st_size != size:
            raise ValueError("the shared state's file is not of this layout")
        self.fd = fd
        self.mm = mmap.mmap(fd, size)
        self.words = memoryview(self.mm)[: self._regions[0]].cast("q")
        if made:
            self.words[VERSION] = STATE_VERSION
            self.words[WORKERS] = workers
        self._last: Tuple[int, Any] = (-1, None)
        #: A hash of each entry of the last table published, by number
        #: (coordinator): what the next change leaves out.
        self._published: Dict[int, int] = {}

    @classmethod
    def attach(cls, fd: int) -> "SharedState":
        """The state in memory file `fd` (its `fd`, handed over by the
        mount's supervisor), as its maker laid it out. Raises ValueError
        when its version is not STATE_VERSION (a shardfs of another
        layout made it) or its size does not match."""
        with mmap.mmap(fd, 8 * _HEADER_WORDS, prot=mmap.PROT_READ) as head:
            words = memoryview(head).cast("q")
            version, workers = words[VERSION], words[WORKERS]
            words.release()
        if version != STATE_VERSION:
            raise ValueError(f"the mount's shared state is of version {version}, this shardfs knows {STATE_VERSION}")
        return cls(workers, fd=fd)

    def set_init(self, request: bytes) -> None:
        """Keep the kernel's INIT request (`Session.init_request`, at most
        _INIT_BYTES bytes): what a process serving the connection after the
        one that mounted needs (`Session(..., fd=, init=)`). Raises
        ValueError when it is longer."""
        if len(request) > _INIT_BYTES:
            raise ValueError(f"INIT request of {len(request)} bytes")
        self.mm[8 * _INIT:8 * _INIT + len(request)] = request
        self.words[_INIT_LEN] = len(request)

    def init(self) -> bytes:
        """The INIT request `set_init` kept (b"" if none)."""
        return bytes(self.mm[8 * _INIT:8 * _INIT + self.words[_INIT_LEN]])

    # ------------------------------------------------------------- table

    def read_last(self) -> Tuple[int, Dict[str, Any]]:
        """(sequence, table) of the last table written whole, for a
        coordinator taking over: the one being read if the sequence is
        even, else the one before the write its predecessor did not end
        (which it then publishes again, making the sequence even)."""
        words = self.words
        region = self._regions[words[_ACTIVE]]
        data = bytes(self.mm[region:region + words[_REGION_LEN + words[_ACTIVE]]])
        return words[SEQ], json.loads(data)

    def take_over(self, table: Dict[str, Any]) -> None:
        """Remember `table` (`read_last`) as the last published by this
        process, so that the next `publish` writes the change from it."""
        self._published = {entry["number"]: hash(json.dumps(entry, separators=(",", ":")))
                           for entry in table["shards"]}

    @property
    def sequence(self) -> int:
        """The table's sequence number: even, and +2 with every publish."""
        return self.words[SEQ]

    def publish(self, table: Dict[str, Any]) -> int:
        """Write a new table (coordinator only), and its change from the
        one before; returns its sequence number. `table["shards"]` is a
        list of entries, each a dict with a "number". Raises ValueError
        when the two do not fit TABLE_BYTES."""
        texts = [json.dumps(entry, separators=(",", ":")) for entry in table["shards"]]
        marks = {entry["number"]: hash(text) for entry, text in zip(table["shards"], texts)}
        before = self._published
        rest = json.dumps({key: value for key, value in table.items() if key != "shards"}, separators=(",", ":"))
        tail = "}" if rest == "{}" else "," + rest[1:]
        changed = [text for entry, text in zip(table["shards"], texts)
                   if before.get(entry["number"]) != marks[entry["number"]]]
        gone = [number for number in before if number not in marks]
        data = ('{"shards":[' + ",".join(texts) + "]" + tail).encode()
        delta = ('{"shards":[' + ",".join(changed) + '],"gone":' + json.dumps(gone) + tail).encode()
        if len(data) > TABLE_BYTES:
            raise ValueError(f"shard table of {len(data)} bytes does not fit {TABLE_BYTES}")
        if len(data) + len(delta) > TABLE_BYTES:
            delta = b""  # no room for the change beside the table: workers read the whole table
        words = self.words
        seq = words[SEQ]
        seq -= seq & 1  # odd: a predecessor was killed writing the table after that of seq - 1
        words[SEQ] = seq + 1  # odd: being written
        active = 1 - words[_ACTIVE]  # the region not holding the last table whole
        table = self._regions[active]
        self.mm[table:table + len(data)] = data
        self.mm[table + len(data):table + len(data) + len(delta)] = delta
        words[_REGION_LEN + active] = len(data)
        words[_ACTIVE] = active
        words[_CHANGE_LEN] = len(delta)
        words[_CHANGE_BASE] = seq if seq > 0 and delta else -1  # none before the first table
        words[SEQ] = seq + 2
        self._published = marks
        return seq + 2

    def read_change(self, seen: int) -> Tuple[int, Dict[str, Any], bool]:
        """(sequence, table or change, is_change) as last published, for a
        reader that applied the table of sequence `seen`: the change alone
        (its "shards": the entries added or changed, "gone": the numbers no
        longer listed, and the table's other parts) when the table is the
        one right after `seen`, else the whole table. Never a torn copy."""
        words = self.words
        while True:
            seq = words[SEQ]
            if seq & 1:
                time.sleep(0.0001)
                continue
            if seen < 0 or words[_CHANGE_BASE] != seen:
                full = self.read()
                return full[0], full[1], False
            active = words[_ACTIVE] & 1
            start = self._regions[active] + words[_REGION_LEN + active]
            data = bytes(self.mm[start:start + words[_CHANGE_LEN]])
            if words[SEQ] != seq:
                continue
            return seq, json.loads(data), True

    def read(self) -> Tuple[int, Dict[str, Any]]:
        """(sequence, table) as last published, never a torn copy."""
        words = self.words
        while True:
            seq = words[SEQ]
            if seq == self._last[0]:
                return self._last
            if seq & 1:
                time.sleep(0.0001)
                continue
            active = words[_ACTIVE] & 1
            table = self._regions[active]
            data = bytes(self.mm[table:table + words[_REGION_LEN + active]])
            if words[SEQ] != seq:
                continue
            self._last = (seq, json.loads(data))
            return self._last

    # -------------------------------------------------------------- rows

    def row(self, position: int) -> int:
        """Word index of the row of worker `position`."""
        return self._rows + ROW_WORDS * position

    def hist(self, position: int) -> memoryview:
        """The request duration counters of worker `position` (native int64
        words: HIST_WORDS per kind of REQUEST_KINDS, shardfs/c/ll.h), for
        the C request path to count in."""
        base = self._hists + HIST_ROW_WORDS * position
        return self.words[base:base + HIST_ROW_WORDS]

    def durations(self) -> Dict[str, Tuple[List[int], int]]:
        """Request durations over every worker, by kind (kinds never seen
        left out): (requests per bucket, in the order of HIST_BOUNDS_NS
        then one above the last bound; the sum of their nanoseconds)."""
        out: Dict[str, Tuple[List[int], int]] = {}
        for i, kind in enumerate(REQUEST_KINDS):
            buckets, total = [0] * (HIST_WORDS - 1), 0
            for position in range(self.workers):
                base = self._hists + HIST_ROW_WORDS * position + HIST_WORDS * i
                words = self.words[base:base + HIST_WORDS]
                for b in range(HIST_WORDS - 1):
                    buckets[b] += words[b]
                total += words[HIST_WORDS - 1]
            if any(buckets):
                out[kind] = (buckets, total)
        return out

    def counts(self, position: int) -> memoryview:
        """The request counters of worker `position` (native int64 words,
        REQUEST_KINDS order), for the C request path to count in."""
        base = self.row(position) + KINDS
        return self.words[base:base + len(REQUEST_KINDS)]

    def _sum_counts(self, offset: int, kinds: Tuple[str, ...]) -> Dict[str, int]:
        """The counters of `kinds` at word `offset` of every worker's row,
        summed by kind (kinds never seen left out)."""
        out: Dict[str, int] = {}
        for position in range(self.workers):
            base = self.row(position) + offset
            for i, kind in enumerate(kinds):
                n = self.words[base + i]
                if n:
                    out[kind] = out.get(kind, 0) + n
        return out

    def requests(self) -> Dict[str, int]:
        """Requests served by every worker, by kind (kinds never seen left out)."""
        return self._sum_counts(KINDS, REQUEST_KINDS)

    def python_requests(self) -> Dict[str, int]:
        """Requests that reached the Python handlers of every worker, by
        handler (PYTHON_KINDS; kinds never seen left out)."""
        return self._sum_counts(PYTHON, PYTHON_KINDS)

    def per_position(self) -> List[int]:
        """Requests served at each worker position."""
        n = len(REQUEST_KINDS)
        return [sum(self.words[self.row(p) + KINDS:self.row(p) + KINDS + n]) for p in range(self.workers)]

    def lookups(self) -> Tuple[int, int]:
        """(lookups, index probes) over every worker, of C and Python."""
        words = self.words
        rows = [self.row(p) for p in range(self.workers)]
        return (sum(words[r + LOOKUPS] + words[r + PY_LOOKUPS] for r in rows),
                sum(words[r + PROBES] + words[r + PY_PROBES] for r in rows))

    def hash_probes(self) -> int:
        """Hash indexes asked by lookups by sha1 or sha1_git, over every
        worker, of C and Python."""
        words = self.words
        return sum(words[r + HASH_PROBES] + words[r + PY_HASH_PROBES]
                   for r in (self.row(p) for p in range(self.workers)))

    def io(self, position: int) -> memoryview:
        """The IO_WORDS counters of worker `position` (native int64 words),
        for the C request path to count in."""
        base = self.row(position) + IO
        return self.words[base:base + len(IO_WORDS)]

    def written(self) -> Dict[str, int]:
        """What every worker wrote to the FUSE device: {"reply_bytes",
        "pushed_bytes", "errors"} (IO_WORDS; bytes, answers)."""
        return {name: sum(self.words[self.row(p) + IO + i] for p in range(self.workers))
                for i, name in enumerate(IO_WORDS)}

    def pushes(self) -> Tuple[int, int]:
        """(objects pushed ahead of their reads into the kernel's page
        cache, pushes the kernel refused) over every worker."""
        rows = [self.row(p) for p in range(self.workers)]
        return (sum(self.words[r + PUSHED] for r in rows), sum(self.words[r + PUSH_REFUSED] for r in rows))

    # ------------------------------------------------------------- rings

    def ring_put(self, position: int, key: bytes, size: int) -> int:
        """Give (`key`, `size` in bytes) the next number of `position`'s
        ring (that worker only); returns the number (>= 1)."""
        words = self.words
        row = self.row(position)
        number = words[row + RING_NEXT] + 1
        words[row + RING_NEXT] = number
        at = self._rings + (position * RING_ENTRIES + number % RING_ENTRIES) * RING_WORDS
        words[at] = -1  # being written
        words[at + 1:at + 5] = memoryview(key).cast("q")
        words[at + 5] = size
        words[at] = number
        return number

    def ring_get(self, position: int, number: int) -> "Tuple[bytes, int] | None":
        """(key, size) given `number` in `position`'s ring, or None when
        the entry was overwritten since (or `number` was never given)."""
        if not 0 <= position < self.workers or number < 1:
            return None
        words = self.words
        at = self._rings + (position * RING_ENTRIES + number % RING_ENTRIES) * RING_WORDS
        if words[at] != number:
            return None
        key = words[at + 1:at + 5].tobytes()
        size = words[at + 5]
        if words[at] != number:
            return None
        return key, size

    def ring_find(self, key: bytes) -> "List[Tuple[int, int]]":
        """(position, number) of every ring entry holding `key` now."""
        out = []
        entry = 8 * RING_WORDS
        for position in range(self.workers):
            # Only the entries given out so far: usually a small part.
            used = min(self.words[self.row(position) + RING_NEXT] + 1, RING_ENTRIES)
            start = 8 * (self._rings + position * RING_ENTRIES * RING_WORDS)
            end = start + used * entry
            at = self.mm.find(key, start, end)
            while at >= 0:
                offset = at - start
                if offset % entry == 8:  # the key field of an entry
                    number = self.words[(start + offset - 8) // 8]
                    if number > 0:
                        out.append((position, number))
                at = self.mm.find(key, at + 1, end)
        return out

    def close(self) -> None:
        """Unmap (after every view of it is gone)."""
        self.words.release()
        self.mm.close()
