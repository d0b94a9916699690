"""The ``shardfs`` command line: create, inspect, read, check, delete from and
mount Software Heritage Read Shards.

Entry point: :func:`main` (console script ``shardfs``; ``python -m shardfs``).

Exit status, for every command:

- 0   success;
- 1   failure: key not found, corrupt shard, failed check, an OS error (file
      missing, permission denied, disk full...);
- 2   usage error: bad arguments, a key that is not 64 hexadecimal digits;
- 130 interrupted (Ctrl-C);
- 141 (128 + SIGPIPE) when the reader of stdout went away (``shardfs ls X |
      head``); nothing is printed then.

An error is reported as exactly one line ``shardfs: <message>`` on stderr; run
with ``--debug`` to get the Python traceback as well.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import os
import shutil
import stat
import sys
import threading
import time
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

logger = logging.getLogger("shardfs")

#: Exit statuses (see the module docstring).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

#: Files up to this many bytes are read once into memory (hashed and added
#: from the same buffer); larger ones are hashed, then streamed by the writer.
SMALL_FILE = 1 << 20  # bytes

#: Chunk size for streaming an object to stdout in ``get``.
READ_CHUNK = 1 << 20  # bytes


class UsageError(Exception):
    """A command line that cannot be acted upon (exit status 2)."""


class Failure(Exception):
    """A reported failure (exit status 1); the message is printed as is."""


# --------------------------------------------------------------------- helpers


def parse_key(text: str) -> bytes:
    """Parse a key given on the command line.

    :param text: 64 hexadecimal digits (any case).
    :returns: the key as 32 raw bytes.
    :raises UsageError: for anything else.
    """
    from shardfs import normalize_key

    try:
        if len(text) != 64:  # 32 raw bytes are no command-line key
            raise ValueError(text)
        return normalize_key(text)
    except ValueError:
        raise UsageError(f"{text!r}: not a key (expected 64 hexadecimal digits)") from None


def parse_keys(texts: Iterable[str]) -> List[bytes]:
    """Parse keys (see :func:`parse_key`), dropping repeats, keeping order.

    :returns: a list of distinct 32-byte keys.
    """
    seen = set()
    keys = []
    for text in texts:
        key = parse_key(text)
        if key not in seen:
            seen.add(key)
            keys.append(key)
    return keys


def format_size(n: int) -> str:
    """A byte count for humans, in decimal (SI) units: ``56.7 MB``."""
    if n < 1000:
        return f"{n} B"
    value = float(n)
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        value /= 1000.0
        if value < 999.95 or unit == "PB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def one_line(text: str) -> str:
    """Collapse a message to a single line (errors are printed on one line)."""
    return " ".join(str(text).split())


def describe_oserror(exc: OSError) -> str:
    """``<file>: <reason>`` for an OSError, naming the file when known."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is not None:
        if exc.filename2 is not None:
            return f"{exc.filename} -> {exc.filename2}: {reason}"
        return f"{exc.filename}: {reason}"
    return reason


class _NoBar:
    """What _progress_bar gives when stderr is no terminal: counts like a
    tqdm bar (``n``, ``update``, ``close``, ``with``), draws nothing, and
    spares the import of tqdm (20-odd ms at each start)."""

    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc) -> None:
        pass


def _progress_bar(**kwargs):
    """A tqdm progress bar on stderr when stderr is a terminal, else a
    _NoBar."""
    if not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    size = {}  # by default tqdm asks the terminal
    try:
        columns, lines = os.get_terminal_size(sys.stderr.fileno())
    except OSError:
        columns = lines = 0
    # A terminal of unknown size (0 x 0: `script`, a bare pty) would make
    # tqdm draw nothing at all.
    if columns <= 0:
        size["ncols"] = 80
    if lines <= 0:
        size["nrows"] = 24
    return tqdm(file=sys.stderr, **size, **kwargs)


def _open_shard(path: str, writable: bool = False):
    """Open a shard for reading: a Read Shard (``Shard``), or a MOSAIC file
    (``shardfs.mosaic.MosaicFile``, told by its content) unless `writable`
    (shardfs writes Read Shards only). Raises ShardError / OSError."""
    from shardfs import Shard, mosaic

    if not path.startswith("rbd:") and os.path.exists(path) and mosaic.is_mosaic(path):
        if writable:
            raise Failure(f"{path}: a MOSAIC file: shardfs does not write MOSAIC files "
                          "(Software Heritage's MosaicUpdater does)")
        return mosaic.MosaicFile(path)
    return Shard(path, writable=writable)


# ----------------------------------------------------------- collecting files


class _Excluder:
    """What ``create`` leaves out of the shard it writes when it lies among
    its sources: the writer's temporary files beside it (``.<name>.tmp-*``,
    and ``<name>.tmp-*`` to be safe), by name; the shard file itself (when it
    exists, to be replaced) is left out by the writer, by ``(st_dev,
    st_ino)`` (:attr:`file`). Only names with the temporary prefix cost a
    ``realpath``: no stat per file."""

    def __init__(self, shard: str):
        self.file: Optional[Tuple[int, int]] = None
        self.shard_dir = os.path.realpath(os.path.dirname(os.path.abspath(shard)))
        base = os.path.basename(shard)
        self.prefixes = (f".{base}.tmp-", f"{base}.tmp-")
        try:
            st = os.stat(shard)
            self.file = (st.st_dev, st.st_ino)
        except OSError:
            pass

    def temporary(self, directory: str, name: str) -> bool:
        """True for a writer's temporary file ``name`` in ``directory``."""
        return name.startswith(self.prefixes) and (
            os.path.realpath(os.path.abspath(directory)) == self.shard_dir
        )


def walk_files(top: str, excluder: Optional[_Excluder] = None) -> Iterator[str]:
    """The regular files found below the directory ``top``, recursively,
    streamed: in each directory its files in sorted name order, then each
    subdirectory in sorted order (``os.walk`` top-down order), so that a tree
    always gives the same shard. Types come from the directory entries
    (``d_type``): no stat per file. Symbolic links (to files or to
    directories) and special files are skipped with a debug message;
    ``top`` itself is followed if it is a link.

    :param excluder: the writer's temporary files it names are left out.
    :raises OSError: a directory that cannot be listed.
    """
    debug = logger.isEnabledFor(logging.DEBUG)
    stack = [top]
    while stack:
        directory = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=_entry_name)
        subdirs = []
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                if excluder is None or not excluder.temporary(directory, entry.name):
                    yield entry.path
            elif entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.path)
            elif debug:
                if entry.is_symlink() and entry.is_dir():
                    logger.debug("%s: symbolic link to a directory, not followed", entry.path)
                else:
                    logger.debug("%s: not a regular file, skipped", entry.path)
        stack.extend(reversed(subdirs))


def _entry_name(entry: os.DirEntry) -> str:
    return entry.name


def read_names(stream, null: bool = False) -> Iterator[str]:
    """File names from a binary stream (``--files-from``), streamed: one per
    line, or NUL-terminated with ``null``; as GNU tar does, empty names are
    skipped, the last name needs no terminator and nothing else is
    stripped (spaces, a carriage return are part of the name).

    :yields: names as ``str`` (undecodable bytes kept as surrogates, like
        command-line arguments).
    :raises UsageError: a NUL byte in a newline-separated name.
    """
    sep = b"\0" if null else b"\n"
    read = getattr(stream, "read1", stream.read)
    rest = b""
    while True:
        chunk = read(1 << 16)
        if not chunk:
            break
        names = (rest + chunk).split(sep)
        rest = names.pop()
        for name in names:
            if name:
                yield _name(name, null)
    if rest:
        yield _name(rest, null)


def _name(raw: bytes, null: bool) -> str:
    if not null and b"\0" in raw:
        start = os.fsdecode(raw.partition(b"\0")[0])
        raise UsageError(f"{start!r}...: a listed name contains a NUL byte (use -0 for "
                         f"NUL-separated names)")
    return os.fsdecode(raw)


class _InThread:
    """``fn(*args, **kwargs)`` run in a new thread; :meth:`result` waits
    for it (even through Ctrl-C) and returns its value or raises its
    exception. (Waited for through an Event the call sets when it ends, not
    Thread.join: a join interrupted by Ctrl-C may take a running thread for
    a finished one, and the call uses the writer.)"""

    def __init__(self, fn, *args, **kwargs):
        self._value = self._error = None
        self._done = threading.Event()

        def run():
            try:
                self._value = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the caller of result()
                self._error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, daemon=True).start()

    def join(self) -> None:
        """Wait for the call to end; a Ctrl-C meanwhile is raised after."""
        interrupted = False
        while True:
            try:
                if self._done.wait():
                    break
            except KeyboardInterrupt:
                interrupted = True
        if interrupted:
            raise KeyboardInterrupt

    def result(self):
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


class _Adder:
    """``create``'s loop: listed paths (files or directories) and the files
    of the directories among them, handed to ``ShardWriter.add_files`` in
    batches sized to take about BATCH_SECONDS each (so that Ctrl-C and the
    progress bar are served), duplicates counted and logged. While the
    writer's threads add a batch (the GIL released), this thread walks or
    reads the list for the next one."""

    BATCH_SECONDS = 0.05
    BATCH_MIN, BATCH_MAX = 16, 8192  # files

    def __init__(self, writer, excluder: _Excluder, bar):
        self.writer = writer
        self.excluder = excluder
        self.bar = bar
        self.duplicates = 0
        self.size = 256  # files in a batch, the first time
        self.debug = logger.isEnabledFor(logging.DEBUG)

    def add_listed(self, paths: Iterable[str]) -> None:
        """Add each path: a regular file, a directory (walked) or, skipped
        with a debug message, anything else. ``paths`` is streamed."""
        self._add(paths, listed=True)

    def _next(self, it: Iterator[str], listed: bool) -> List[str]:
        batch = list(itertools.islice(it, self.size))
        if listed:
            batch = [p for p in batch if not self.excluder.temporary(
                os.path.dirname(p) or ".", os.path.basename(p))]
        return batch

    def _add_files(self, batch: List[str]):
        return self.writer.add_files(batch, small=SMALL_FILE, exclude=self.excluder.file)

    def _add(self, paths: Iterable[str], listed: bool) -> None:
        from shardfs.shard import FILE_DIRECTORY

        it = iter(paths)
        batch = self._next(it, listed)
        while batch:
            start = time.monotonic()
            job = _InThread(self._add_files, batch)
            try:
                following = self._next(it, listed)
            finally:
                job.join()  # the writer is in use until then
            done, stopped, dups = job.result()
            while True:
                self.duplicates += len(dups)
                if self.debug:
                    for index, key in dups:
                        logger.debug("%s: duplicate of %s, skipped", batch[index], key.hex())
                self.bar.update(done)
                if not stopped:
                    break
                path = batch[done]
                if listed and stopped == FILE_DIRECTORY:
                    self._add(walk_files(path, self.excluder), listed=False)
                else:
                    logger.debug("%s: not a regular file%s, skipped", path,
                                 " or a directory" if listed else "")
                batch = batch[done + 1:]
                done, stopped, dups = self._add_files(batch)
            elapsed = time.monotonic() - start
            target = int(self.size * self.BATCH_SECONDS / elapsed) if elapsed > 0 else self.BATCH_MAX
            self.size = max(self.BATCH_MIN, min(self.BATCH_MAX, target))
            batch = following


def _count_files(tops: Sequence[str], excluder: _Excluder) -> int:
    """Regular files ``create`` will read from ``tops`` (a directory walk,
    no stat per file): the progress bar's total."""
    total = 0
    for top in tops:
        if os.path.isdir(top):
            total += sum(1 for _ in walk_files(top, excluder))
        elif os.path.isfile(top):
            total += 1
    return total


# ------------------------------------------------------------------- commands


def cmd_create(args: argparse.Namespace) -> int:
    """Build a shard from files; every object is keyed by its SHA-256."""
    from shardfs import ShardWriter

    shard = args.shard
    if not args.paths and args.files_from is None:
        raise UsageError("create: no PATH and no --files-from: nothing to store")
    if os.path.lexists(shard) and not args.force:
        try:
            is_device = stat.S_ISBLK(os.stat(shard).st_mode)
        except OSError:
            is_device = False
        if is_device:
            raise Failure(f"{shard}: is a block device; writing a shard onto it overwrites its "
                          f"first bytes (use --force to write it)")
        raise Failure(f"{shard}: already exists (use --force to replace it)")
    for top in args.paths:  # a missing source fails before anything is written
        os.stat(top)
    names = None
    if args.files_from is not None:
        names = sys.stdin.buffer if args.files_from == "-" else open(args.files_from, "rb")
    excluder = _Excluder(shard)
    total = None
    if sys.stderr.isatty() and names is None:
        total = _count_files(args.paths, excluder)  # a first walk, for the progress bar

    try:
        with _progress_bar(total=total, unit=" files", desc="create") as bar:
            with ShardWriter(shard) as writer:
                adder = _Adder(writer, excluder, bar)
                adder.add_listed(args.paths)
                if names is not None:
                    adder.add_listed(read_names(names, args.null))
                n_objects = len(writer)
                n_bytes = writer.bytes_added
    finally:
        if names is not None and names is not sys.stdin.buffer:
            names.close()
    print(
        f"created {shard}: {n_objects} objects, {format_size(n_bytes)}, "
        f"{adder.duplicates} duplicates skipped"
    )
    return EXIT_OK


def cmd_info(args: argparse.Namespace) -> int:
    """Print the header and derived figures, one ``name: value`` per line."""
    from shardfs.mosaic import MosaicFile

    with _open_shard(args.shard) as s:
        if isinstance(s, MosaicFile):
            _print_lines(s.summary() + [("live_objects", len(s))])
            return EXIT_OK
        h = s.header
        live = 0
        object_bytes = 0
        for _key, size in s.items_sizes():
            live += 1
            object_bytes += size
        lines = [
            ("path", s.path),
            ("version", h.version),
            ("objects_count", h.objects_count),
            ("objects_position", h.objects_position),
            ("objects_size", h.objects_size),
            ("index_position", h.index_position),
            ("index_size", h.index_size),
            ("hash_position", h.hash_position),
            ("slots", s.slot_count),
            ("live_objects", live),
            ("extent", s.extent),
            ("hash_size", s.extent - h.hash_position),
            ("object_bytes", object_bytes),
        ]
    _print_lines(lines)
    return EXIT_OK


def _print_lines(lines) -> None:
    out = sys.stdout
    for name, value in lines:
        out.write(f"{name}: {value}\n")
    out.flush()


def cmd_ls(args: argparse.Namespace) -> int:
    """Print every live object's 64-hex key, one per line (with ``-l``:
    ``<64-hex key> <size in bytes>``)."""
    out = sys.stdout
    with _open_shard(args.shard) as s:
        if args.long:
            for key, size in s.items_sizes():
                out.write(f"{key.hex()} {size}\n")
        else:
            for key in s.keys():
                out.write(key.hex() + "\n")
    out.flush()
    return EXIT_OK


def parse_digest(text: str, name: str) -> bytes:
    """A sha1 or sha1_git given on the command line: 40 hexadecimal digits
    (any case), or for sha1_git a content SWHID (``swh:1:cnt:<40 hex>``).
    Raises UsageError for anything else."""
    from shardfs import hashes

    if name == "sha1_git":
        found = hashes.parse_swhid(text)
        if found is not None:
            return found
    try:
        return hashes.parse_digest(text)
    except ValueError:
        also = " or a SWHID swh:1:cnt:<40 hex>" if name == "sha1_git" else ""
        raise UsageError(f"{text!r}: not a {name} (expected 40 hexadecimal digits{also})") from None


def _get_keys(texts: List[str], parse: Callable[[str], bytes] = parse_key) -> List[bytes]:
    """The keys of ``get``: each KEY, and for ``-`` the lines of stdin (one
    key per line; blank lines and surrounding spaces ignored), in order,
    each read by `parse`. Raises UsageError naming a malformed stdin line
    by its number."""
    keys: List[bytes] = []
    for text in texts:
        if text != "-":
            keys.append(parse(text))
            continue
        for number, line in enumerate(sys.stdin, 1):
            line = line.strip()
            if not line:
                continue
            try:
                keys.append(parse(line))
            except UsageError as exc:
                raise UsageError(f"stdin line {number}: {exc}") from None
    return keys


def _copy_object(s, data_offset: int, size: int, out, what: str) -> None:
    """Write an object's bytes to the binary file `out`, READ_CHUNK at a
    time (an object may be 100 MB)."""
    done = 0
    while done < size:
        chunk = s.pread(data_offset, size, done, min(READ_CHUNK, size - done))
        if not chunk:  # cannot happen on a validated shard
            raise Failure(f"{what}: short read at byte {done}")
        out.write(chunk)
        done += len(chunk)


def _write_object_file(s, directory: str, key: bytes, data_offset: int, size: int) -> None:
    """Write an object to ``directory/<hex key>``: a temporary file beside
    it, renamed into place once whole, so that an error (a full disk)
    leaves no partial file under the key's name."""
    import tempfile

    name = key.hex()
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            _copy_object(s, data_offset, size, f, f"{directory}/{name}")
        os.chmod(tmp, 0o666 & ~_umask())  # as open(2) would have made it
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def cmd_get(args: argparse.Namespace) -> int:
    """Write the objects' bytes, in the order given, to stdout (or with -o,
    each to DIR/<key>). With --hash, the keys are sha1 or sha1_git digests
    found through the shard's hash index."""
    name = args.hash
    if name is not None:
        keys = _get_keys(args.keys, functools.partial(parse_digest, name=name))
    else:
        keys = _get_keys(args.keys)
    directory = args.output_dir
    if directory is not None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise Failure(describe_oserror(exc)) from None
        if not os.path.isdir(directory):
            raise Failure(f"{directory}: not a directory")
    out = sys.stdout.buffer
    missing = 0
    with _open_shard(args.shard) as s:
        locate = s.locate if name is None else _hash_locator(s, name, args.cache_dir, args.shard)
        bar = _progress_bar(total=len(keys), unit="obj", desc="get") if directory is not None else None
        try:
            for key in keys:
                where = locate(key)
                if where is None:
                    missing += 1
                    report(f"{key.hex()}: not found in {args.shard}")
                elif directory is None:
                    _copy_object(s, where[0], where[1], out, f"{args.shard}: {key.hex()}")
                else:
                    try:
                        _write_object_file(s, directory, key, where[0], where[1])
                    except OSError as exc:
                        raise Failure(describe_oserror(exc)) from None
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
    out.flush()
    return EXIT_FAILURE if missing else EXIT_OK


def _hash_locator(s, name: str, cache_dir: Optional[str], path: str) -> Callable[[bytes], Optional[Tuple[int, int]]]:
    """``digest -> (data_offset, size) or None`` through shard `s`'s `name`
    index (each object hashed again before it is given). Failure when the
    shard has none."""
    from shardfs import hashes

    from shardfs.mosaic import MosaicFile

    if isinstance(s, MosaicFile):  # the file's own index by that hash
        if name not in s.indexes:
            raise Failure(f"{path}: MOSAIC file without a {name} index (it has: {', '.join(s.indexes) or 'none'})")
        return lambda digest: s.locate(digest, name)
    index = hashes.open_index(s, name, cache_dir)
    if index is None:
        raise Failure(f"{path}: no {name} index: build it with 'shardfs index --hashes {name} {path}'")

    def locate(digest: bytes) -> Optional[Tuple[int, int]]:
        found = hashes.find(s, index, digest)
        return None if found is None else found[1:]

    return locate


def cmd_index(args: argparse.Namespace) -> int:
    """Build (or import from a mapping) the hash indexes of shards."""
    from shardfs import hashes

    try:
        names = hashes.parse_names(args.hashes)
    except ValueError as exc:
        raise UsageError(f"--hashes: {exc}") from None
    shards = [_open_shard(path) for path in args.shards]
    try:
        if args.mapping is not None:
            return _import_mapping(args, shards, names)
        for path, s in zip(args.shards, shards):
            total = s.header.objects_size
            with _progress_bar(total=total, unit="B", unit_scale=True, desc=os.path.basename(path)) as bar:
                def progress(done: int, bar=bar) -> None:
                    bar.update(done - bar.n)

                built = hashes.build(s, names, args.cache_dir, progress=progress, force=args.force)
            print(f"{path}: {', '.join(names)} indexed" + ("" if built else " (already)"))
    finally:
        for s in shards:
            s.close()
    return EXIT_OK


def _import_mapping(args: argparse.Namespace, shards, names) -> int:
    from shardfs import hashes

    try:
        stream = sys.stdin if args.mapping == "-" else open(args.mapping, newline="", encoding="ascii")
    except OSError as exc:
        raise Failure(describe_oserror(exc)) from None
    with stream, _progress_bar(unit=" rows", desc="mapping") as bar:
        try:
            counts = hashes.import_mapping(shards, hashes.read_mapping(stream, names), names, args.cache_dir,
                                           progress=lambda n: bar.update(n - bar.n))
        except (ValueError, UnicodeDecodeError) as exc:
            raise Failure(f"{args.mapping}: {exc}") from None
    print(f"{args.mapping}: {counts['rows']} rows, {counts['found']} of the shards' {counts['objects']} objects "
          f"indexed by {', '.join(names)}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    """Verify a shard's structure (and with --hash, every object's SHA-256)."""
    shard = args.shard
    bar = None

    def progress(done: int, total: int) -> None:
        """Called by Shard.check with bytes hashed so far and in all."""
        nonlocal bar
        if bar is None:
            bar = _progress_bar(
                total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="check"
            )
        bar.update(done - bar.n)

    try:
        with _open_shard(shard) as s:
            problems = s.check(hash=args.hash, progress=progress)
            count = len(s)
    finally:
        if bar is not None:
            bar.close()
    if problems:
        out = sys.stdout
        for problem in problems:
            out.write(f"{shard}: {one_line(problem)}\n")
        out.flush()
        raise Failure(f"{shard}: check failed, {len(problems)} problem(s)")
    what = "structure and hashes" if args.hash else "structure"
    print(f"{shard}: OK, {count} objects ({what} checked)")
    return EXIT_OK


def _confirm(question: str) -> bool:
    """Ask a yes/no question on the terminal; only ``y``/``yes`` is yes."""
    sys.stdout.flush()
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def cmd_delete(args: argparse.Namespace) -> int:
    """Take objects down in place: their bytes are zeroed, slots emptied."""
    import shardfs

    from shardfs import mosaic

    keys = parse_keys(args.keys)
    if not args.yes and not sys.stdin.isatty():
        raise UsageError("refusing to delete without --yes when stdin is not a terminal")
    shard = args.shard
    if os.path.isfile(shard) and mosaic.is_mosaic(shard):
        raise Failure(f"{shard}: a MOSAIC file: shardfs does not write MOSAIC files "
                      "(Software Heritage's MosaicUpdater does)")
    if not args.yes:
        with _open_shard(shard) as s:
            sizes = []
            for key in keys:
                if key not in s:
                    raise Failure(f"{key.hex()}: not found in {shard}")
                sizes.append(s.size(key))
        print(f"about to delete {len(keys)} object(s) from {shard}:")
        for key, size in zip(keys, sizes):
            print(f"  {key.hex()} {size}")
        if not _confirm("delete them?"):
            raise Failure("not confirmed: nothing deleted")
    try:
        n = shardfs.delete(shard, keys)
    except KeyError as exc:
        missing = exc.args[0] if exc.args else None
        if isinstance(missing, (bytes, bytearray)) and len(missing) == 32:
            missing = missing.hex()
        if isinstance(missing, str) and len(missing) == 64:
            raise Failure(f"{missing}: not found in {shard} (nothing deleted)") from exc
        raise Failure(f"{shard}: {one_line(exc)} (nothing deleted)") from exc
    print(f"deleted {n} object(s) from {shard}")
    _tell_mounts(shard, keys)
    return EXIT_OK


def _tell_mounts(shard: str, keys: List[bytes]) -> None:
    """Have the shardfs mounts of this host forget `keys` of `shard` now
    (`shardfs.fuse.control`): a mount whose kernel cached an object would
    otherwise serve it until it learns of the takedown itself. A mount that
    cannot be told gets a warning line."""
    from shardfs.fuse import control

    try:
        results = control.tell_takedown(shard, keys)
    except OSError as exc:
        logger.warning("cannot tell the mounts of this host: %s", one_line(exc))
        return
    for mount, answer, error in results:
        if error is not None:
            logger.warning("mount %s not told of the takedown (%s): it shows there within the live "
                           "bound if it serves this shard", mount.point, error)
        elif answer.get("dead"):
            logger.info("mount %s: its server is gone (Transport endpoint is not connected), it serves "
                        "nothing: `shardfs umount %s` clears it", mount.point, mount.point)
        elif answer.get("shards"):
            logger.info("mount %s: %d object(s) invalidated", mount.point, answer.get("invalidated", 0))


def _winery_config_dsn(args: argparse.Namespace) -> Optional[str]:
    """The DSN of --winery-config's settings (None without it). Raises
    WineryError (one line) for a file that is not swh's winery settings, or
    ShardError when --winery or --winery-pools-dir is given too."""
    from shardfs.errors import ShardError

    if not getattr(args, "winery_config", None):
        return None
    if args.winery or args.winery_pools_dir:
        raise ShardError("--winery-config names the database and the pools: give no --winery nor "
                         "--winery-pools-dir with it")
    from shardfs.winery import pool_sources

    return pool_sources(args.winery_config)[0]


def cmd_mount(args: argparse.Namespace) -> int:
    """Mount shards read-only through FUSE (shardfs.fuse.mount.mount_shards)."""
    if not args.paths:
        raise UsageError("mount: the following arguments are required: MOUNTPOINT (see 'shardfs mount --help')")
    shards, mountpoint = args.paths[:-1], args.paths[-1]
    if getattr(args, "winery_config", None):  # swh's settings: the database and the pools
        dsn = _winery_config_dsn(args)
        args.winery_pools_dir = os.path.abspath(args.winery_config)
        args.winery = dsn
    if args.winery is not None:
        from shardfs.winery import require_psycopg

        require_psycopg()
        _hide_password(args.winery)
        if shards or args.shard_dir:
            raise UsageError("mount: --winery mounts a winery database; give no SHARD paths nor --shard-dir "
                             "with it (see 'shardfs mount --help')")
    elif not shards and not args.shard_dir:
        raise UsageError("mount: give SHARD paths, --shard-dir DIR, or both (see 'shardfs mount --help')")
    options: List[str] = []
    for group in args.options or []:
        options.extend(o for o in group.split(",") if o)
    for name in ("ceph_conf", "ceph_id", "ceph_timeout"):  # the common options, as -o would give them
        if getattr(args, name, None) is not None:
            value = getattr(args, name)
            options.append(f"{name}={os.path.abspath(value) if name == 'ceph_conf' else value}")
    try:
        from shardfs.fuse import mount as fuse_mount
    except ImportError as exc:
        raise Failure(f"mount is unavailable: {one_line(exc)}") from exc
    bar = None

    def progress(done: int, total: int) -> None:
        """Shards the mount's daemon has opened so far, and in all."""
        nonlocal bar
        if bar is None:
            bar = _progress_bar(total=total, unit=" shards", desc="opening")
        bar.update(done - bar.n)

    try:
        return fuse_mount.mount_shards(
            shard_paths=shards,
            mountpoint=mountpoint,
            foreground=args.foreground,
            options=options,
            debug=args.debug,
            log_file=args.log_file,
            shard_dir=args.shard_dir,
            layout=args.layout,
            slicing=args.slicing,
            cache_dir=args.cache_dir,
            helper=getattr(args, "helper", False),
            winery=args.winery,
            winery_pools_dir=args.winery_pools_dir,
            progress=progress,
        )
    finally:
        if bar is not None:
            bar.close()


def _hide_password(dsn: str) -> None:
    """Take a password in the DSN off this process's command line
    (/proc/PID/cmdline, ps): the title becomes the command with the DSN
    described without it (setproctitle rewrites the argument memory)."""
    from shardfs.winery import describe, has_password

    if not has_password(dsn):
        return
    try:
        import setproctitle
    except ImportError:  # pragma: no cover - installed with the winery extra
        logger.warning("setproctitle is missing: the DSN's password shows in ps until the mount is ready; "
                       "keep it in a password file (~/.pgpass) instead")
        return
    setproctitle.setproctitle(f"shardfs mount --winery {describe(dsn)} ...")


def cmd_umount(args: argparse.Namespace) -> int:
    """Unmount a shardfs mount point."""
    try:
        from shardfs.fuse import mount as fuse_mount
    except ImportError as exc:
        raise Failure(f"umount is unavailable: {one_line(exc)}") from exc
    return fuse_mount.umount(args.mountpoint)


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Hand a live mount to the shardfs installed now."""
    try:
        from shardfs.fuse import mount as fuse_mount
    except ImportError as exc:
        raise Failure(f"upgrade is unavailable: {one_line(exc)}") from exc
    workers, seconds = fuse_mount.upgrade(args.mountpoint, timeout=args.timeout)
    from shardfs import __version__

    print(f"upgraded {args.mountpoint} to shardfs {__version__}: {workers} worker(s) replaced in {seconds:.2f} s")
    return 0


def _build_progress(st: dict) -> Tuple[int, int]:
    """(done, total) of what a mount builds in the background for its
    shards (`shardfs.fuse.mount.status`): a place in the global index and
    a lookup record each (sidecars serve listings only: not counted)."""
    shards = st.get("shards", 0)
    done = total = 0
    if st.get("index") is not None:
        done += min(st["index"].get("indexed_shards", 0), shards)
        total += shards
    records = st.get("records")
    if records is not None:
        done += records.get("recorded_shards", 0)
        total += records.get("recorded_shards", 0) + records.get("pending_shards", 0)
    return done, total


def _format_status(st: dict) -> str:
    """`shardfs status`'s lines for a mount's status dict."""
    n = st.get("shards", 0)
    lines = [("mount point", st["mountpoint"]), ("source", st.get("source") or "?"),
             ("shards", f"{n:,} ({st.get('objects', 0):,} objects)")]
    index = st.get("index")
    if index is not None:
        levels = index.get("levels", [])
        lines.append(("global index", f"{min(index.get('indexed_shards', 0), n):,} of {n:,} shards indexed "
                                      f"({len(levels)} level(s), {sum(levels):,} entries)"))
    else:
        lines.append(("global index", "none (every shard found through its own sidecar)"))
    records = st.get("records")
    if records is not None:
        recorded, pending = records.get("recorded_shards", 0), records.get("pending_shards", 0)
        lines.append(("lookup records", f"{recorded:,} shards, {pending:,} to write "
                                        f"({records.get('packs', 0)} pack(s))"))
    lines.append(("sidecars", f"{st.get('sidecars', 0):,} of {n:,} shards"))
    workers = st.get("workers") or []
    lines.append(("workers", f"{len(workers)}, requests served: " + ", ".join(f"{w:,}" for w in workers)
                  + f"; {st.get('restarts', 0):,} restarted"))
    lines.append(("coordinator", f"restarted {st.get('coordinator_restarts', 0):,} time(s) after it died"))
    lines.append(("answered", f"{st.get('reply_bytes', 0):,} bytes, {st.get('pushed_bytes', 0):,} bytes pushed into "
                              f"the page cache; {st.get('errors', 0):,} error answers"))
    python = st.get("python") or {}
    lines.append(("lookups", f"{st.get('lookups', 0):,} ({st.get('index_probes', 0):,} index probes); "
                             f"{sum(python.values()):,} requests reached Python"))
    pool = st.get("pool")
    if pool:
        lines.append(("open shards", f"{pool.get('open', 0):,} of {pool.get('bound', 0):,} in the answering "
                                     f"worker ({pool.get('opens', 0):,} opens, {pool.get('evictions', 0):,} "
                                     f"evictions)"))
    done, total = _build_progress(st)
    lines.append(("background build", "complete" if done >= total else f"{done:,} of {total:,} steps done"))
    lines.append(("version", f"shardfs {st.get('version', '?')}"))
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in lines)


def cmd_systemd_unit(args: argparse.Namespace) -> int:
    """Print the systemd template unit for this shardfs command."""
    from shardfs.errors import ShardError
    from shardfs.fuse.service import unit_text

    # the script run; under `python -m shardfs`, the one beside that
    # Python (a venv's), else the one on PATH
    beside = os.path.join(os.path.dirname(sys.executable), "shardfs")
    for executable in (sys.argv[0], beside, shutil.which("shardfs")):
        if executable and os.path.basename(executable) == "shardfs" and os.path.isfile(executable) \
                and os.access(executable, os.X_OK):
            sys.stdout.write(unit_text(executable))
            return 0
    raise ShardError("cannot find the shardfs command (not beside this Python, nor on PATH)")


def cmd_status(args: argparse.Namespace) -> int:
    """Show what a mount serves and how far its background build is."""
    import json

    from shardfs.fuse import mount as fuse_mount

    st = fuse_mount.status(args.mountpoint)
    if args.wait:
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        done, total = _build_progress(st)
        with _progress_bar(total=total, initial=done, unit="step", desc="background build",
                           leave=False) as bar:
            while done < total:
                if deadline is not None and time.monotonic() >= deadline:
                    raise Failure(f"{args.mountpoint}: background build not complete after {args.timeout:g} s "
                                  f"({done:,} of {total:,} steps done)")
                time.sleep(0.5)
                st = fuse_mount.status(args.mountpoint)
                done, total = _build_progress(st)
                bar.total = total  # records to write are learnt as shards come
                bar.update(done - bar.n)
    if args.json:
        print(json.dumps(st, sort_keys=True))
    else:
        print(_format_status(st))
    return 0


# --------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors become :class:`UsageError` (one line)."""

    def error(self, message):  # noqa: D102 - argparse API
        # prog is "shardfs" or "shardfs COMMAND"; report() adds "shardfs: "
        command = self.prog.partition(" ")[2]
        prefix = f"{command}: " if command else ""
        raise UsageError(f"{prefix}{message} (see '{self.prog} --help')")


_FORMATTER = argparse.RawDescriptionHelpFormatter


class _VersionAction(argparse.Action):
    """``--version``: prints ``shardfs.__version__``, the one place the
    version is written (pyproject.toml reads it from there too)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from shardfs import __version__

        parser._print_message(f"shardfs {__version__}\n", sys.stdout)
        parser.exit()


def _configure_ceph(args: argparse.Namespace) -> None:
    """Apply --ceph-conf/--ceph-id/--ceph-timeout and --cache-dir to the
    rbd: sources this command opens (`shardfs.rbd.configure`)."""
    conf, client_id = getattr(args, "ceph_conf", None), getattr(args, "ceph_id", None)
    timeout = getattr(args, "ceph_timeout", None)
    if timeout is not None and timeout < 1:
        raise UsageError(f"--ceph-timeout must be at least 1 second, got {timeout}")
    if conf is not None and not os.path.isfile(conf):
        raise UsageError(f"--ceph-conf {conf}: no such file")
    if (conf is None and client_id is None and timeout is None and getattr(args, "cache_dir", None) is None) \
            or args.func is cmd_mount:  # the mount's processes configure their own (isolated)
        return
    from shardfs import rbd

    rbd.configure(conf=conf, client_id=client_id, cache_dir=getattr(args, "cache_dir", None), timeout=timeout)


def _common_options() -> argparse.ArgumentParser:
    """Options accepted both before and after the command name (a parent
    parser); SUPPRESS keeps a subcommand's default from overwriting what
    the main parser parsed."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS,
        help="debug logging, and a Python traceback on errors",
    )
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
        help="informational logging",
    )
    ceph = common.add_argument_group("Ceph (shards in RBD images: rbd:POOL/IMAGE sources)")
    ceph.add_argument("--ceph-conf", metavar="FILE", default=argparse.SUPPRESS,
                      help="ceph.conf of the cluster (default: $CEPH_CONF, else /etc/ceph/ceph.conf)")
    ceph.add_argument("--ceph-id", metavar="NAME", default=argparse.SUPPRESS,
                      help="Ceph client name without 'client.' (default: admin)")
    ceph.add_argument("--ceph-timeout", metavar="SECONDS", type=int, default=argparse.SUPPRESS,
                      help="seconds before a cluster operation fails (default: 30)")
    return common


def _main_parser(common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser of ``shardfs`` itself, without its commands."""
    parser = _Parser(
        prog="shardfs",
        formatter_class=_FORMATTER,
        parents=[common],
        description=(
            "Create, inspect, read, check and mount Software Heritage Read Shards:\n"
            "immutable files of objects found through a perfect hash of their\n"
            "32-byte keys (SHA-256 of the content)."
        ),
        epilog=(
            "examples:\n"
            "  shardfs create my.shard ./files/\n"
            "  shardfs info my.shard\n"
            "  shardfs ls my.shard | head\n"
            "  shardfs get my.shard 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"
            "  shardfs check --hash my.shard\n"
            "  shardfs mount my.shard /mnt/shard\n"
            "\n"
            "exit status: 0 success, 1 failure (not found, corrupt, I/O error),\n"
            "2 usage error, 130 interrupted.\n"
            "Run 'shardfs COMMAND --help' for the options of a command."
        ),
    )
    parser.add_argument("--version", action=_VersionAction)
    return parser


def _command(sub, common: argparse.ArgumentParser, name: str, func, help: str, description: str,
             examples: str) -> argparse.ArgumentParser:
    """Add command `name` (run by `func`) to `sub`, with the common options
    and its help, description and examples; returns its parser."""
    p = sub.add_parser(
        name, help=help, description=description, parents=[common],
        formatter_class=_FORMATTER, epilog="examples:\n" + examples,
    )
    p.set_defaults(func=func)
    return p


def _add_create_parser(command) -> None:
    """``shardfs create``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_create,
        "build a shard from files and directories",
        "Build a shard from the regular files given or found (recursively) in the\n"
        "directories given. Each object is keyed by the SHA-256 of its content;\n"
        "identical contents are stored once. Symbolic links and special files\n"
        "inside directories are skipped. Objects are stored in the order given,\n"
        "directories walked in sorted order (the same tree gives the same shard);\n"
        "files are read and hashed by as many threads as there are CPUs.\n"
        "\n"
        "--files-from FILE reads more paths (files or directories) from FILE, or\n"
        "from stdin for '-', after the PATHs given: one per line, or NUL-terminated\n"
        "with -0; as with tar, empty names are skipped and nothing else is stripped.\n"
        "The list is read as it is used: it may hold millions of paths.\n"
        "\n"
        "A missing or unreadable file is an error. On any error, or on Ctrl-C, no\n"
        "shard is left behind.",
        "  shardfs create my.shard ./objects/\n"
        "  shardfs create my.shard a.txt b.bin more-files/\n"
        "  find . -type f -print0 | shardfs create my.shard --files-from - -0\n"
        "  shardfs create my.shard --files-from list.txt extra-dir/\n"
        "  shardfs create --force my.shard ./objects/   # replace my.shard\n"
        "  shardfs create --force /dev/rbd0 ./objects/  # onto a block device, in place\n",
    )
    p.add_argument("shard", metavar="SHARD", help="the shard file to create")
    p.add_argument("paths", metavar="PATH", nargs="*", help="files and directories to store")
    p.add_argument("-T", "--files-from", metavar="FILE",
                   help="also store the files and directories listed in FILE ('-': stdin)")
    p.add_argument("-0", "--null", action="store_true",
                   help="names in --files-from end with a NUL byte, not a newline "
                        "(find -print0, xargs -0)")
    p.add_argument("--force", action="store_true", help="replace SHARD if it exists")


def _add_copy_dir(p) -> None:
    """--cache-dir of a read verb: where an rbd: source's local copy is."""
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where local copies of rbd:POOL/IMAGE shards are kept (default: $SHARDFS_CACHE_DIR, "
                        "else ~/.cache/shardfs)")


def _add_info_parser(command) -> None:
    """``shardfs info``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_info,
        "show a shard's header and sizes",
        "Print the seven header fields, the slot count, the number of live\n"
        "objects, the shard's extent and hash section size (bytes) and the total\n"
        "bytes of the live objects, one 'name: value' per line.",
        "  shardfs info my.shard\n"
        "  shardfs info rbd:shards/my-image   # a shard in a Ceph RBD image\n",
    )
    p.add_argument("shard", metavar="SHARD")
    _add_copy_dir(p)


def _add_ls_parser(command) -> None:
    """``shardfs ls``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_ls,
        "list the objects of a shard",
        "Print one line per live object, in slot order: its key (64 hexadecimal\n"
        "digits), and with -l its size in bytes. The keys are the objects' paths\n"
        "in a flat mount, so the output is an rsync --files-from list.",
        "  shardfs ls my.shard\n"
        "  shardfs ls -l my.shard | sort -k2 -n | tail   # the largest objects\n"
        "  shardfs ls my.shard > list && rsync -a --files-from=list /mnt/shard/ copy/\n",
    )
    p.add_argument("shard", metavar="SHARD")
    p.add_argument("-l", "--long", action="store_true", help="also print each object's size in bytes")
    _add_copy_dir(p)


def _add_get_parser(command) -> None:
    """``shardfs get``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_get,
        "write objects to stdout",
        "Write the bytes of the objects named by KEY (64 hexadecimal digits) to\n"
        "stdout, one after the other; KEY '-' reads keys from stdin, one per line.\n"
        "With -o DIR, each object goes to the file DIR/<key> instead (written under\n"
        "a temporary name, then renamed: an error leaves no partial file). A key\n"
        "that is not in the shard is reported and the exit status is 1; the\n"
        "objects found are still written.",
        "  shardfs get my.shard 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 > obj\n"
        "  shardfs ls my.shard | shardfs get my.shard - | wc -c\n"
        "  shardfs ls my.shard | shardfs get my.shard - -o objects/\n",
    )
    p.add_argument("shard", metavar="SHARD")
    p.add_argument("keys", metavar="KEY", nargs="+", help="a key, or - for keys read from stdin")
    p.add_argument("-o", "--output-dir", metavar="DIR",
                   help="write each object to DIR/<key> (DIR created if missing) instead of stdout")
    p.add_argument("--hash", metavar="NAME", choices=("sha1", "sha1_git"),
                   help="the KEYs are this hash of the objects (sha1 or sha1_git: 40 hexadecimal "
                        "digits; sha1_git also as a SWHID swh:1:cnt:...), found through the "
                        "shard's index ('shardfs index')")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where the hash indexes are (default: $SHARDFS_CACHE_DIR, else ~/.cache/shardfs)")


def _add_index_parser(command) -> None:
    """``shardfs index``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_index,
        "index shards by sha1 and sha1_git",
        "Build each shard's indexes by the hashes named with --hashes: sha1 (SHA-1\n"
        "of the bytes) and sha1_git (git's blob hash, which a content SWHID\n"
        "swh:1:cnt:<hex> names), so that 'shardfs get --hash' and mounts with\n"
        "-o hashes=... find objects by them. Every object is read once, in file\n"
        "order; an index that exists already is kept (--force builds it again).\n"
        "The indexes go to the cache directory, next to the shards' sidecars\n"
        "(8 bytes per object and hash), written whole: an interrupted build leaves\n"
        "nothing.\n"
        "\n"
        "--mapping FILE reads the digests from a CSV or TSV file ('-': stdin)\n"
        "whose header names a sha256 column and one per hash, such as an export\n"
        "of Software Heritage's content table, instead of reading the objects.\n"
        "Rows are not trusted: an object is hashed again whenever it is found\n"
        "by sha1 or sha1_git, so a wrong row can hide an object, never serve\n"
        "another one.",
        "  shardfs index --hashes sha1,sha1_git my.shard\n"
        "  shardfs index --hashes sha1_git /srv/shards/*.shard\n"
        "  shardfs index --hashes sha1,sha1_git --mapping content.csv /srv/shards/*.shard\n",
    )
    p.add_argument("shards", metavar="SHARD", nargs="+")
    p.add_argument("--hashes", metavar="NAMES", required=True,
                   help="the hashes to index by, comma-separated: sha1, sha1_git")
    p.add_argument("--mapping", metavar="FILE",
                   help="take the digests from FILE's rows (CSV or TSV, columns sha256 and each hash) "
                        "instead of reading the objects")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where the indexes go (default: $SHARDFS_CACHE_DIR, else ~/.cache/shardfs)")
    p.add_argument("--force", action="store_true", help="build indexes that exist already again")


def _add_check_parser(command) -> None:
    """``shardfs check``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_check,
        "verify a shard",
        "Verify a shard's structure: header, perfect hash, every index slot and\n"
        "object size. With --hash, also verify that every object's SHA-256 is\n"
        "its key (reads every byte). Prints 'SHARD: OK, N objects' and exits 0\n"
        "when clean; prints each problem on its own line and exits 1 otherwise.",
        "  shardfs check my.shard\n"
        "  shardfs check --hash my.shard\n",
    )
    p.add_argument("shard", metavar="SHARD")
    p.add_argument("--hash", action="store_true", help="also verify every object's SHA-256")
    _add_copy_dir(p)


def _add_delete_parser(command) -> None:
    """``shardfs delete``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_delete,
        "take objects down from a shard, in place",
        "Remove objects from a shard in place, as the reference implementation\n"
        "does for legal takedowns: the object's bytes and size are zeroed and its\n"
        "index slot emptied. The file does not shrink. If any KEY is not in the\n"
        "shard, nothing is deleted. Asks for confirmation unless --yes; without\n"
        "--yes, stdin must be a terminal. Every shardfs mount of this host that\n"
        "serves the shard forgets the objects before this returns, even where\n"
        "the kernel cached them.",
        "  shardfs delete my.shard 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"
        "  shardfs delete --yes my.shard KEY1 KEY2\n",
    )
    p.add_argument("shard", metavar="SHARD")
    p.add_argument("keys", metavar="KEY", nargs="+")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _add_mount_parser(command) -> None:
    """``shardfs mount``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_mount,
        "mount shards read-only as one tree (FUSE)",
        "Mount the SHARDs (files or block devices) and/or every shard of\n"
        "--shard-dir read-only at MOUNTPOINT through FUSE. Each object is a file\n"
        "named by its 64-hex key; a key in several shards shows once. Shards\n"
        "added to or removed from --shard-dir, replaced in place, or objects\n"
        "deleted (shardfs delete) show within seconds (inotify; SIGHUP forces a\n"
        "rescan). Served by a coordinator and worker processes (-o workers=N,\n"
        "default: the CPUs, at least 2). Runs in the background unless -f;\n"
        "unmount with 'shardfs umount MOUNTPOINT'.\n"
        "\n"
        "Layouts: 'flat' lists every object at the root; 'fanout' lists\n"
        "directories sliced from the key (--slicing 0:2/2:4 gives ab/cd/<key>);\n"
        "'auto' is flat up to 100,000 objects, else fanout (always fanout with\n"
        "--shard-dir). MOUNTPOINT/<key> always works, listed or not.\n"
        "\n"
        "Each shard's sidecar (a filter over its keys, and its keys in order)\n"
        "is built in the background on first mount and kept in --cache-dir.\n"
        "\n"
        "-o takes FUSE options (allow_other, default_permissions, fsname=...),\n"
        "uid=N and gid=N (owner of every file), layout=, slicing=, cache_dir=,\n"
        "workers=N (1 to 64), metrics=HOST:PORT (Prometheus metrics at\n"
        "http://HOST:PORT/metrics), hashes=sha1:sha1_git (also find objects as\n"
        "MOUNT/sha1/<hex>, MOUNT/sha1_git/<hex> and MOUNT/swh:1:cnt:<hex>; the\n"
        "shards are indexed by those in the background, see 'shardfs index'),\n"
        "upgrade (MOUNTPOINT already mounted: hand it to this shardfs in place, as\n"
        "'shardfs upgrade' does, instead of failing).\n"
        "\n"
        "Shards in Ceph RBD images: a SHARD rbd:POOL/IMAGE, --shard-dir rbd:POOL\n"
        "(every image of the pool, listed again every 2 s), read through librbd\n"
        "(nothing mapped); -o ceph_conf=FILE,ceph_id=NAME,ceph_timeout=SECONDS\n"
        "(default: $CEPH_CONF, admin, 30). A winery deployment's rbd pools:\n"
        "-o winery_rbd=librbd instead of /dev/rbd/<pool>/<image>.\n"
        "\n"
        "Shards in S3: a SHARD s3://BUCKET/KEY, --shard-dir s3://BUCKET/PREFIX\n"
        "(every object under it, listed again every 2 s), read with ranged GETs;\n"
        "server and keys from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,\n"
        "AWS_SECRET_ACCESS_KEY (none, or AWS_SKIP_SIGNATURE=true: anonymous);\n"
        "-o s3_endpoint=URL,s3_region=NAME,s3_timeout=SECONDS (default 30).\n"
        "\n"
        "The mount is always ro,nosuid,nodev. As an fstab line (mount.fuse3\n"
        "runs 'shardfs SOURCE MOUNTPOINT -o OPTIONS'; a directory SOURCE is a\n"
        "--shard-dir):\n"
        "  /srv/shards  /mnt/shards  fuse.shardfs  ro,allow_other,layout=fanout  0 0\n"
        "\n"
        "--winery DSN mounts a winery object storage (Software Heritage): its\n"
        "Read Shards (images in packed, cleaning or readonly shards) and the\n"
        "objects still in its PostgreSQL write shards; only keys the database\n"
        "says are present show, and new objects, new shards and takedowns show\n"
        "within 5 s. Layout: fanout unless asked. As an fstab line, the source\n"
        "is the DSN as a URI (the password in root's ~/.pgpass):\n"
        "  postgresql://reader@db/winery  /mnt/winery  fuse.shardfs  ro,allow_other,winery_pools_dir=/srv/pools  0 0",
        "  shardfs mount my.shard /mnt/shard\n"
        "  shardfs mount a.shard b.shard /dev/rbd0 /mnt/shards\n"
        "  shardfs mount --shard-dir /srv/shards --layout fanout /mnt/shards\n"
        "  shardfs mount -f --log-file fuse.log my.shard /mnt/shard\n"
        "  shardfs mount -o allow_other,uid=1000,gid=1000 my.shard /mnt/shard\n"
        "  shardfs mount -o workers=4 my.shard /mnt/shard\n"
        "  mount -t fuse.shardfs -o ro,allow_other /srv/shards /mnt/shards\n"
        "  shardfs mount --winery 'host=db dbname=winery user=reader' /mnt/winery\n"
        "  shardfs mount --winery postgresql://reader@db/winery --winery-pools-dir /srv/pools /mnt/winery\n"
        "  shardfs mount -o ceph_id=shardfs rbd:shards/2026-11-a /mnt/shard\n"
        "  shardfs mount --shard-dir rbd:shards -o ceph_conf=/etc/ceph/ceph.conf /mnt/shards\n"
        "  shardfs mount --winery postgresql://reader@db/winery -o winery_rbd=librbd /mnt/winery\n"
        "  AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\\n"
        "    shardfs mount --shard-dir s3://shards/2026 -o s3_endpoint=http://rgw:7480 /mnt/shards\n",
    )
    # One positional list, SHARD... MOUNTPOINT (split in cmd_mount), so that
    # options may come anywhere among them.
    p.usage = "%(prog)s [-h] [-f] [-o OPTIONS] [--shard-dir DIR] [--layout L] [--slicing S]\n" \
              "       [--cache-dir DIR] [--log-file FILE] [--debug] [SHARD ...] MOUNTPOINT\n" \
              "       %(prog)s [options] --winery DSN [--winery-pools-dir DIR] MOUNTPOINT\n" \
              "       %(prog)s [options] --winery-config FILE MOUNTPOINT"
    p.add_argument("paths", metavar="[SHARD ...] MOUNTPOINT", nargs="*",
                   help="shard files, block devices or RBD images (rbd:POOL/IMAGE), then an existing empty "
                        "directory")
    p.add_argument("--shard-dir", metavar="DIR",
                   help="serve every shard in DIR (or every image of an RBD pool, rbd:POOL), and follow "
                        "it (shards added or removed)")
    p.add_argument("--winery", metavar="DSN",
                   help="mount a winery object storage: its Read Shards and the objects still in its "
                        "PostgreSQL database, named by DSN (a libpq connection string; SELECT rights "
                        "suffice; keep the password in ~/.pgpass), followed live")
    p.add_argument("--winery-config", metavar="FILE",
                   help="mount the winery deployment Software Heritage's settings FILE describe (its YAML: "
                        "database: {db: DSN}, shards_pools: directory, mosaic, rbd and mosaic-s3 pools, each "
                        "image read where its pool puts it); instead of --winery and --winery-pools-dir")
    p.add_argument("--winery-pools-dir", metavar="DIR",
                   help="with --winery: the base directory of a directory shards pool (images in "
                        "DIR/<pool>/<shard>; default: Ceph images mapped under /dev/rbd/<pool>/<shard>)")
    p.add_argument("--layout", choices=("auto", "flat", "fanout"), default=None,
                   help="directory layout (default: auto)")
    p.add_argument("--slicing", metavar="SLICES",
                   help="fan-out directory levels as hex slices of the key (default 0:2/2:4)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where sidecars are kept (default: $SHARDFS_CACHE_DIR, else "
                        "$XDG_CACHE_HOME/shardfs, else ~/.cache/shardfs)")
    p.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground")
    p.add_argument(
        "-o", dest="options", metavar="OPTIONS", action="append",
        help="mount options, comma-separated (may be repeated)",
    )
    p.add_argument("--log-file", metavar="FILE",
                   help="write the filesystem's log to FILE (INFO; DEBUG with --debug)")


def _add_umount_parser(command) -> None:
    """``shardfs umount``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_umount,
        "unmount a shardfs mount point",
        "Unmount a filesystem mounted with 'shardfs mount'.",
        "  shardfs umount /mnt/shard\n",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT")


def _add_upgrade_parser(command) -> None:
    """``shardfs upgrade``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_upgrade,
        "hand a live mount to the shardfs installed now, without unmounting",
        "Hand the mount at MOUNTPOINT to the shardfs installed now (after 'pip install -U\n"
        "shardfs'): its processes are replaced one by one while it serves; requests in\n"
        "flight are resent to the processes still serving, so readers see no error, and\n"
        "the names and pages the kernel caches stay valid. A mount kept in a layout the\n"
        "new shardfs cannot take is left as it is (exit 1). Not for mounts made with\n"
        "--foreground nor winery mounts: unmount and mount those again.\n"
        "'shardfs mount -o upgrade ... MOUNTPOINT' does the same when MOUNTPOINT is mounted.",
        "  shardfs upgrade /mnt/archive\n",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="fail (exit 1) if the new processes have not taken over after SECONDS (default 30)")


def _add_systemd_unit_parser(command) -> None:
    """``shardfs systemd-unit``: `command(func, help, description, examples)` adds it."""
    command(
        cmd_systemd_unit,
        "print a systemd template unit that mounts shardfs at boot",
        "Print shardfs@.service, a systemd template unit whose instance is a mount point\n"
        "(systemd-escape --path): it runs 'shardfs mount' with the arguments\n"
        "SHARDFS_ARGS of /etc/shardfs/<instance>.conf, is ready once the mount answers\n"
        "(Type=notify: needs systemd-python, pip install shardfs[systemd]), survives the\n"
        "death of its coordinator (the mount's supervisor is the service's main process),\n"
        "unmounts on stop and mounts again after a crash. ExecStart names this shardfs\n"
        "command.",
        "  shardfs systemd-unit > /etc/systemd/system/shardfs@.service\n"
        "  echo 'SHARDFS_ARGS=--shard-dir /srv/shards' > /etc/shardfs/mnt-archive.conf\n"
        "  systemctl enable --now shardfs@$(systemd-escape --path /mnt/archive)\n",
    )


def _add_status_parser(command) -> None:
    """``shardfs status``: `command(func, help, description, examples)` adds it."""
    p = command(
        cmd_status,
        "show what a mount serves and how far its background build is",
        "Show what the shardfs mount at MOUNTPOINT serves (shards, objects, workers, the\n"
        "requests they served) and how far its background build is: shards in the global\n"
        "index and shards with a lookup record (what makes a lookup need no open shard).\n"
        "Read from the mount itself (its root's user.shardfs.stats attribute); the\n"
        "open-shard figures are those of the worker that answered.",
        "  shardfs status /mnt/archive\n"
        "  shardfs status --wait /mnt/archive     # a progress bar until the build is complete\n"
        "  shardfs status --json /mnt/archive | jq .records\n",
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.add_argument("--wait", action="store_true",
                   help="wait until the background build is complete (a progress bar on a terminal)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="with --wait: fail (exit 1) if it is not complete after SECONDS")


#: The commands, in the order ``shardfs --help`` lists them (anything
#: else first is a mount helper call), and the function that adds each
#: one's parser.
_COMMAND_PARSERS = {
    "create": _add_create_parser, "info": _add_info_parser, "ls": _add_ls_parser,
    "get": _add_get_parser, "index": _add_index_parser, "check": _add_check_parser,
    "delete": _add_delete_parser,
    "mount": _add_mount_parser, "umount": _add_umount_parser, "upgrade": _add_upgrade_parser,
    "status": _add_status_parser,
    "systemd-unit": _add_systemd_unit_parser,
}
COMMANDS = tuple(_COMMAND_PARSERS)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for the whole command line."""
    common = _common_options()
    parser = _main_parser(common)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, add in _COMMAND_PARSERS.items():
        add(functools.partial(_command, sub, common, name))
    return parser


# ----------------------------------------------------------------------- main


def report(message: str) -> None:
    """Print one error line, ``shardfs: <message>``, on stderr."""
    sys.stderr.write(f"shardfs: {one_line(message)}\n")
    sys.stderr.flush()


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _helper_argv(argv: List[str]) -> bool:
    """Rewrite a mount helper call in place; True if it was one.

    mount(8) and mount.fuse3 run ``shardfs SOURCE MOUNTPOINT -o OPTIONS``
    for an fstab line of type ``fuse.shardfs``. That becomes ``shardfs
    mount [--shard-dir] SOURCE MOUNTPOINT -o OPTIONS``: a directory SOURCE
    is a shard directory, and so is an RBD pool ``rbd:POOL`` (an image
    ``rbd:POOL/IMAGE`` is a shard). Only when SOURCE exists and ``-o`` is given (the
    helpers always pass options), so that a mistyped command is reported
    as one instead of being taken for a mount.
    """
    if (len(argv) >= 2 and argv[0].startswith(("postgresql://", "postgres://")) and "-o" in argv):
        argv[:1] = ["mount", "--winery", argv[0]]  # a winery database (fstab: a URI)
        return True
    if len(argv) >= 2 and argv[0].startswith("rbd:") and "-o" in argv:  # an RBD image, or a pool's images
        argv[:1] = ["mount", argv[0]] if "/" in argv[0] else ["mount", "--shard-dir", argv[0]]
        return True
    if (len(argv) < 2 or argv[0].startswith("-") or argv[0] in COMMANDS
            or "-o" not in argv or not os.path.exists(argv[0])):
        return False
    source = argv[0]
    argv[:1] = ["mount", "--shard-dir", source] if os.path.isdir(source) else ["mount", source]
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line.

    :param argv: the arguments without the program name (default:
        ``sys.argv[1:]``).
    :returns: the exit status (0, 1, 2, 130 or 141; see the module docstring).
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    helper = _helper_argv(argv)
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:
            # argparse cannot take positionals after options that follow
            # earlier positionals ("mount A --layout flat MP"): for mount,
            # the rest are paths too; anything else is an error.
            if getattr(args, "command", None) != "mount" or any(e.startswith("-") for e in extras):
                parser.error(f"unrecognized arguments: {' '.join(extras)}")
            args.paths += extras
        if helper:
            args.helper = True
    except UsageError as exc:
        report(str(exc))
        return EXIT_USAGE
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK

    debug = getattr(args, "debug", False)
    args.debug = debug
    level = logging.DEBUG if debug else logging.INFO if getattr(args, "verbose", False) else logging.WARNING
    logging.basicConfig(level=level, format="shardfs: %(levelname)s: %(message)s")

    from shardfs import ShardError  # after parsing: --help works without the extension
    from shardfs.errors import MissingDependencyError

    def fail(message: str, status: int) -> int:
        if debug:
            logger.exception("%s", message)
        report(message)
        return status

    try:
        _configure_ceph(args)
        return args.func(args)
    except UsageError as exc:
        return fail(str(exc), EXIT_USAGE)
    except Failure as exc:
        return fail(str(exc), EXIT_FAILURE)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)
    except (ShardError, MissingDependencyError) as exc:
        return fail(str(exc), EXIT_FAILURE)
    except OSError as exc:
        return fail(describe_oserror(exc), EXIT_FAILURE)
    except Exception as exc:  # a bug, or a corrupt input the core missed
        return fail(
            f"unexpected error: {type(exc).__name__}: {exc}"
            + ("" if debug else " (run with --debug for a traceback)"),
            EXIT_FAILURE,
        )


if __name__ == "__main__":
    sys.exit(main())
