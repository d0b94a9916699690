"""Exceptions raised by shardfs.

Every message names the file and the problem, on one line, so that the
command line can print it as is.
"""

import errno

#: What an open that fails with these errno values says: not that the
#: shard is unreadable, but that the process is out of descriptors or
#: memory for now. Such a failure is raised to the caller, never taken for
#: a shard to pass over (which would answer that a present key is absent).
RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


class ShardError(Exception):
    """Base class of shardfs errors (also raised for a perfect hash that
    cannot be built, a read outside an object, a mount that cannot start)."""


class CorruptShardError(ShardError):
    """The file's bytes contradict the Read Shard format: bad magic, a header
    field out of range, a truncated section, a slot or object size pointing
    outside the objects section. The message names the field or slot."""


class DuplicateKeyError(ShardError, KeyError):
    """ShardWriter.add() of a key that was added already. Nothing was
    written; the writer stays usable."""

    def __str__(self):  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StaleSidecarError(ShardError):
    """A sidecar file (shardfs/sidecar.py) that cannot be used for this
    shard: built for another shard (identity or slot count differ) or
    damaged (magic, version, size). It is a cache: rebuild it."""


class MissingDependencyError(ImportError):
    """An optional dependency of the feature asked for is not installed.
    The message is one line naming the module and the extra that installs
    it (``pip install 'shardfs[winery]'``)."""


def require(modules, extra: str, feature: str) -> None:
    """Import each of `modules` (names), or raise MissingDependencyError
    naming the first one missing and ``shardfs[extra]``, for `feature`."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingDependencyError(
                f"{feature} needs the Python module {name}, which is not installed: "
                f"pip install 'shardfs[{extra}]'") from None
