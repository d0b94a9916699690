"""Read and write Software Heritage Read Shards (format v1) from Python.

The work is done by the C extension ``shardfs._shardfs`` (see
``shardfs/c/shard.h``), which releases the GIL during lookups, reads, scans
and builds: a ``Shard`` can be shared by any number of threads.

Keys are SHA-256 digests: 32 raw bytes, or 64 hexadecimal characters (str or
bytes, either case). Anything else raises ``ValueError``.
"""

from __future__ import annotations

import os
from collections import namedtuple
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import _shardfs, rbd, s3
from .errors import CorruptShardError, DuplicateKeyError, ShardError

#: Format constants, defined once in the C core (``shardfs/c/shard.h``):
#: bytes in a key (SHA-256); in an index slot (key + big-endian u64
#: offset); of the magic and header (the header ends there); of the
#: big-endian u64 size field before each object's bytes.
KEY_SIZE = _shardfs.KEY_SIZE
SLOT_SIZE = _shardfs.SLOT_SIZE
HEADER_END = _shardfs.HEADER_END
SIZE_FIELD_SIZE = _shardfs.SIZE_FIELD_SIZE

Key = Union[bytes, bytearray, memoryview, str]

#: The seven header fields (big-endian u64 from byte 32 to HEADER_END),
#: positions and sizes in bytes. Source: Software Heritage swh-shard format.
Header = namedtuple(
    "Header",
    "version objects_count objects_position objects_size index_position index_size hash_position",
)

_HEX = frozenset(b"0123456789abcdefABCDEF")

#: ``ShardWriter.add_files`` stopped before a directory / another kind of
#: non-regular file (the ``stopped`` it returns; 0 when it did not stop).
FILE_DIRECTORY = 1
FILE_OTHER = 2


def default_threads() -> int:
    """Threads ``ShardWriter.add_files`` reads with by default: the CPUs this
    process may run on, at least 2 (one reads while the other waits for the
    device)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(2, cpus)


def _key(key) -> bytes:
    # Fast path of normalize_key for the common case: 32 raw bytes.
    return key if type(key) is bytes and len(key) == KEY_SIZE else normalize_key(key)


def normalize_key(key: Key) -> bytes:
    """Return ``key`` as 32 raw bytes.

    Accepts 32 bytes (bytes, bytearray, memoryview) or 64 hex characters (str
    or bytes, any case). Raises ValueError for anything else.
    """
    if isinstance(key, str):
        if len(key) == 2 * KEY_SIZE and key.isascii() and _HEX.issuperset(key.encode()):
            return bytes.fromhex(key)
        raise ValueError(f"invalid key {key!r}: expected 64 hexadecimal characters")
    if isinstance(key, (bytes, bytearray, memoryview)):
        raw = bytes(key)
        if len(raw) == KEY_SIZE:
            return raw
        if len(raw) == 2 * KEY_SIZE and _HEX.issuperset(raw):
            return bytes.fromhex(raw.decode())
        raise ValueError(f"invalid key of {len(raw)} bytes: expected 32 bytes or 64 hex characters")
    raise ValueError(f"invalid key of type {type(key).__name__}: expected bytes or str")


def is_remote_source(path: object) -> bool:
    """Whether `path` names a shard read over a network (``rbd:POOL/IMAGE``,
    ``s3://BUCKET/KEY``) rather than a file or block device."""
    return isinstance(path, str) and path.startswith(_REMOTE_PREFIXES)


_REMOTE_PREFIXES = (rbd.PREFIX, s3.PREFIX)


class Shard:
    """A Read Shard opened for reading (``writable=True`` also allows delete),
    or a MOSAIC file (Software Heritage's format, recognized by its first
    bytes: `kind` is ``"mosaic"``) served by its sha256 index as a Read
    Shard of the same slots (docs/mosaic.md: object offsets are then a view,
    not bytes of the file; ``writable=True`` is refused).

    Opening validates the whole structure (magic, version, every header
    field, the perfect hash) and raises CorruptShardError naming the field;
    OSError (FileNotFoundError, PermissionError...) when the file cannot be
    opened. The shard's extent comes from its header, so ``path`` may be a
    block device larger than the shard, or an RBD image ``rbd:POOL/IMAGE``
    (`shardfs.rbd`: read-only; OSError with errno ENOENT for a missing pool
    or image, ETIMEDOUT when the cluster does not answer).
    """

    def __init__(self, path: Union[str, os.PathLike], writable: bool = False):
        self.path = os.fspath(path)
        if rbd.is_source(self.path):
            rbd.ensure_configured()
        elif s3.is_source(self.path):
            s3.ensure_configured()
        self._reader = _shardfs.Reader(self.path, writable)
        try:
            #: the file's mtime, seconds (an rbd: source: its local copy's)
            self.mtime = os.fstat(self._reader.fileno()).st_mtime
        except OSError:
            self._reader.close()
            raise

    # -- context manager --------------------------------------------------
    def __enter__(self) -> "Shard":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Unmap and close the file. Further use raises ValueError."""
        self._reader.close()

    def fileno(self) -> int:
        """The file descriptor the shard is read through (close-on-exec).
        Another process can reopen the very same file as
        ``/proc/<pid>/fd/<fileno>``, even once it was renamed over or
        unlinked. Raises ValueError when the shard is closed."""
        return self._reader.fileno()

    @property
    def closed(self) -> bool:
        """True once `close()` was called."""
        return self._reader.closed

    # -- structure ----------------------------------------------------------
    @property
    def header(self) -> Header:
        """The seven header fields (see Header)."""
        return Header(*self._reader.header)

    @property
    def slot_count(self) -> int:
        """Slots in the index: index_size / 40 (more than the objects)."""
        return self._reader.slot_count

    @property
    def extent(self) -> int:
        """Bytes of the shard, from byte 0 to the end of the hash section."""
        return self._reader.extent

    @property
    def kind(self) -> str:
        """Where the shard's bytes come from: ``"file"`` (a Read Shard in a
        file or block device), ``"rbd"`` (a Ceph RBD image) or ``"mosaic"``
        (a MOSAIC file)."""
        return self._reader.kind

    @property
    def hash_size(self) -> int:
        """Bytes of the perfect hash section."""
        return self._reader.hash_size

    def slot_of(self, key: Key) -> int:
        """Slot (0 .. slot_count-1) the key hashes to; any key maps to one."""
        return self._reader.slot_of(normalize_key(key))

    # -- mapping interface --------------------------------------------------
    def __len__(self) -> int:
        """Live objects: slots that are neither empty nor deleted (counted
        once, by a scan of the index)."""
        return self._reader.live_count()

    def __contains__(self, key: Key) -> bool:
        return self._reader.locate(_key(key)) is not None

    def __getitem__(self, key: Key) -> bytes:
        """The object's bytes. KeyError when absent or deleted."""
        raw = _key(key)
        data = self._reader.read(raw)
        if data is None:
            raise KeyError(raw.hex())
        return data

    def get(self, key: Key, default=None):
        """The object's bytes, or ``default`` when absent."""
        data = self._reader.read(_key(key))
        return default if data is None else data

    def get_batch(self, keys: Iterable[Key]) -> List[Optional[bytes]]:
        """The bytes of each key's object, or None where the key is absent
        (or deleted), in the order of ``keys`` (an iterable of keys, as
        ``get`` takes them). The whole batch is looked up and copied in C
        with the GIL released twice, whatever its length (once for every
        lookup, once for every copy, straight into the bytes objects):
        other threads run meanwhile, and a ``close()`` from one of them
        takes effect when the batch returns. When a lookup or a copy waits
        for the device, the rest of the batch is prefetched
        (posix_fadvise), so that a cold batch's reads overlap. The name
        follows swh-objstorage's ``get_batch``. Raises ValueError for a
        malformed key (before any lookup) or a closed shard,
        CorruptShardError for a corrupt slot, OSError when the file cannot
        be read, MemoryError."""
        return self._reader.get_batch([_key(k) for k in keys])

    def size(self, key: Key) -> int:
        """Size of the object in bytes. KeyError when absent."""
        raw = normalize_key(key)
        found = self._reader.locate(raw)
        if found is None:
            raise KeyError(raw.hex())
        return found[1]

    def locate(self, key: Key) -> Optional[Tuple[int, int]]:
        """``(data_offset, size)``: absolute byte offset of the object's first
        byte in the shard file and its size in bytes; None when absent."""
        return self._reader.locate(_key(key))

    @property
    def reader(self) -> "_shardfs.Reader":
        """The C reader of this shard (`shardfs._shardfs.Reader`): what
        `shardfs._shardfs.OpenShards` holds to probe it without Python."""
        return self._reader

    def find(self, key: Key, nowait: bool = False) -> Optional[Tuple[int, int, int]]:
        """``(slot, data_offset, size)`` of a live key, None when absent.

        With ``nowait=True`` the index slot and size field are read from the
        page cache only (preadv2 RWF_NOWAIT): the call never waits for the
        device, and raises BlockingIOError when a byte is not cached (then
        call again without nowait, from a thread that may block).
        """
        return self._reader.find(_key(key), nowait)

    def prefetch(self, data_offset: int, size: int, length: int) -> None:
        """Start reading the first ``length`` bytes (at most ``size``) of
        the object at ``data_offset`` into the page cache, without waiting
        (posix_fadvise WILLNEED)."""
        self._reader.prefetch(data_offset, size, length)

    def try_pread(self, data_offset: int, size: int, offset: int, length: int) -> bytes:
        """pread() from the page cache only: never waits for the device;
        BlockingIOError when a byte of the range is not cached."""
        return self._reader.try_pread(data_offset, size, offset, length)

    def pread(self, data_offset: int, size: int, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset + length)`` of the object that starts at
        ``data_offset`` and has ``size`` bytes (as given by locate), clipped
        at its end: b"" at or past the end. Releases the GIL."""
        return self._reader.pread(data_offset, size, offset, length)

    def slot(self, slot: int, nowait: bool = False) -> Optional[Tuple[bytes, int, int]]:
        """``(key, data_offset, size)`` of a live slot, None if empty.
        IndexError outside 0..slot_count-1; CorruptShardError when the slot
        points outside the objects section. With ``nowait=True`` the slot
        and size field are read from the page cache only, else
        BlockingIOError (as `find`)."""
        return self._reader.slot(slot, nowait)

    def deleted_slots(self, sidecar, begin: int = 0, end: Optional[int] = None) -> List[int]:
        """The slots that ``sidecar`` (this shard's `shardfs.sidecar.Sidecar`)
        lists at positions ``begin`` to ``end`` (default: all) and that are
        empty now: the objects taken down since the sidecar was built, in
        the sidecar's order. One C call (``sfs_sidecar_deleted``) that
        releases the GIL: it reads each listed slot's offset in the index
        (about 15 ns a slot when cached), so it may run in a thread while
        others work. IndexError outside ``[0, sidecar.count]``; ValueError
        for a sidecar of another slot count; OSError (EIO) when the shard or
        the sidecar shrank under its mapping."""
        return self._reader.deleted_slots(sidecar, begin, end)

    def scan(self, start_slot: int = 0, batch: int = 4096,
             on_corrupt: Optional[Callable[[int], None]] = None) -> Iterator[Tuple[int, bytes, int, int]]:
        """Live objects from ``start_slot`` on, in slot order, as
        ``(slot, key, data_offset, size)``.

        A slot that points outside the objects section raises
        CorruptShardError; with ``on_corrupt``, it is left out and
        ``on_corrupt(n)`` is called with the number of slots left out of a
        batch instead.
        """
        slot_count = self.slot_count
        while start_slot < slot_count:
            items, start_slot, skipped = self._reader.scan(start_slot, batch, on_corrupt is not None)
            if skipped:
                on_corrupt(skipped)
            yield from items

    def __iter__(self) -> Iterator[bytes]:
        """Live keys, 32 bytes each, in slot order."""
        for _slot, key, _offset, _size in self.scan():
            yield key

    def keys(self) -> Iterator[bytes]:
        return iter(self)

    def items_sizes(self) -> Iterator[Tuple[bytes, int]]:
        """``(key, size in bytes)`` for every live object, in slot order."""
        for _slot, key, _offset, size in self.scan():
            yield key, size

    # -- checks and takedowns -------------------------------------------------
    def check(self, hash: bool = False,
              progress: Optional[Callable[[int, int], None]] = None,
              max_reports: int = 1000) -> list:
        """Problems found, one string each (empty list = clean).

        Structure: every live slot's key hashes to its own slot, its offset
        and size lie inside the objects section, and there are no more live
        slots than header field objects_count. With ``hash=True``, also every
        object's SHA-256 equals its key. ``progress(done, total)`` is called
        with bytes hashed so far.
        """
        import hashlib

        count, problems = self._reader.check(max_reports)
        if count > len(problems):
            problems.append(f"... and {count - len(problems)} more problems (not listed)")
        if hash and count == 0:
            total = self.header.objects_size
            done = 0
            for _slot, key, offset, size in self.scan():
                h = hashlib.sha256()
                for start in range(0, size, 1 << 20):  # 1 MiB at a time: bounded memory
                    h.update(self._reader.pread(offset, size, start, 1 << 20))
                digest = h.digest()
                if digest != key:
                    problems.append(f"object {key.hex()}: SHA-256 of its {size} bytes is {digest.hex()}")
                done += SIZE_FIELD_SIZE + size
                if progress:
                    progress(done, total)
        return problems

    def delete(self, key: Key) -> None:
        """Take the object down in place: zero its size field and bytes, mark
        its slot empty, fdatasync. Needs ``writable=True``. KeyError when absent."""
        raw = normalize_key(key)
        if not self._reader.delete(raw):
            raise KeyError(raw.hex())

    def __repr__(self) -> str:
        return f"<shardfs.Shard {self.path!r}>"


def delete(path: Union[str, os.PathLike], keys: Iterable[Key]) -> int:
    """Delete ``keys`` from the shard at ``path``; returns how many.

    Every key is checked first: if one is absent, KeyError names it and
    nothing is deleted.
    """
    raws = [normalize_key(k) for k in keys]
    with Shard(path, writable=True) as shard:
        for raw in raws:
            if raw not in shard:
                raise KeyError(raw.hex())
        for raw in dict.fromkeys(raws):
            shard.delete(raw)
    return len(set(raws))


class ShardWriter:
    """Write a new Read Shard at ``path``, streaming.

    Objects are appended to a temporary file beside ``path`` as they come;
    memory grows with the number of keys only (about 40 bytes per key, plus
    the perfect hash build: see the README). On a clean exit from ``with``
    (or ``close()``) the perfect hash is built, the index, hash and header
    written, the file fsynced and renamed to ``path``. On an exception (or
    ``abort()``) the temporary file is removed: nothing appears at ``path``.
    OSError (e.g. ENOSPC) on write failures.
    """

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = os.fspath(path)
        self._writer = _shardfs.Writer(self.path)
        #: After close(): where finishing took its time, in seconds —
        #: {"hash_seconds": the perfect hash build, "check_seconds": every
        #: key checked against cmph_search and our evaluator,
        #: "index_seconds": index and hash written, "sync_seconds": header,
        #: fdatasync and rename, "slots": slots in the index, "builder":
        #: "shardfs" (our builder) or "cmph" (SHARDFS_CHD_BUILDER=cmph, or
        #: the fallback when ours finds no seed)}.
        self.build_stats: Optional[dict] = None

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def add(self, key: Key, data) -> None:
        """Append one object (any bytes-like ``data``). DuplicateKeyError if
        the key was added already (nothing written; the writer stays usable)."""
        self._writer.add(_key(key), data)

    def add_file(self, key: Key, path: Union[str, os.PathLike]) -> None:
        """Append the content of the file at ``path``, streamed in 1 MiB
        chunks (never read whole into memory). OSError if it cannot be read
        or shrinks while read; DuplicateKeyError as for add()."""
        raw = normalize_key(key)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._writer.add_fd(raw, f.fileno(), size)

    def add_files(self, paths: Sequence[Union[str, bytes, os.PathLike]], small: int,
                  threads: Optional[int] = None, exclude: Optional[Tuple[int, int]] = None,
                  ) -> Tuple[int, int, List[Tuple[int, bytes]]]:
        """Append the regular files at ``paths``, in that order, each keyed by
        the SHA-256 of its content; a content already added is skipped (a
        duplicate). The files are opened, read and hashed by ``threads``
        threads (default: the CPUs this process may use, at least 2) with
        the GIL released, and appended in order by the calling thread: the
        shard is the one ``add`` would give file after file. Files up to
        ``small`` bytes are read whole; larger ones are hashed, then read
        again and streamed. Memory stays bounded: the threads read at most
        1,024 files and about 16 MiB ahead of the writer (a larger file
        counts as 1 MiB), plus 1 MiB per thread. A file is read up to its
        size when opened (to its end when that size is 0, as /proc files
        say); fewer bytes is an error (it shrank).

        The shard's own file, and the file whose ``(st_dev, st_ino)`` is
        ``exclude`` (the shard being replaced), are skipped silently.

        :returns: ``(done, stopped, duplicates)``: ``paths[:done]`` were
            consumed; when ``done < len(paths)``, ``paths[done]`` was not,
            being a directory (``stopped == FILE_DIRECTORY``) or another kind
            of non-regular file (``FILE_OTHER``: FIFO, socket, device), and
            the caller may go on from ``paths[done + 1:]``. ``duplicates``
            lists ``(index in paths, key)`` of the files skipped as
            duplicates.
        :raises OSError: a file that cannot be opened or read, or that shrank,
            named in the message (the objects before it stay added), or a
            write error; ValueError for a path with a NUL byte.
        """
        if threads is None:
            threads = default_threads()
        return self._writer.add_files(paths, small, threads, exclude)

    def __contains__(self, key: Key) -> bool:
        return self._writer.contains(_key(key))

    def __len__(self) -> int:
        """Objects added so far."""
        return self._writer.count

    @property
    def bytes_added(self) -> int:
        """Object bytes added so far (size fields not counted)."""
        return self._writer.bytes

    def close(self) -> None:
        """Finalize: build the perfect hash, write, fsync, rename into place.
        On failure the temporary file is removed and ShardError / OSError
        raised. A second call does nothing."""
        if not self._writer.closed:
            self.build_stats = self._writer.finish()

    def abort(self) -> None:
        """Discard everything written; nothing is left at ``path``. Waits
        for an ``add_files`` running in another thread to return first."""
        self._writer.abort()


__all__ = [
    "KEY_SIZE", "SLOT_SIZE", "Header", "Shard", "ShardWriter", "delete", "normalize_key",
    "ShardError", "CorruptShardError", "DuplicateKeyError",
]
