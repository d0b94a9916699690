"""shardfs: serve Software Heritage Read Shards as files.

A Read Shard packs millions of immutable objects, each named by the SHA-256
of its content (its key), into one file whose index is laid out by a perfect
hash: any object is found in O(1) reads. This package reads and writes them
(``Shard``, ``ShardWriter``), checks and deletes objects, and mounts shards
as a read-only FUSE filesystem (``shardfs mount``).
"""

from .errors import CorruptShardError, DuplicateKeyError, ShardError
from .shard import KEY_SIZE, SLOT_SIZE, Header, Shard, ShardWriter, delete, normalize_key

#: The package's version, written only here (pyproject.toml reads it).
__version__ = "0.1.0"

__all__ = [
    "KEY_SIZE", "SLOT_SIZE", "Header", "Shard", "ShardWriter", "delete", "normalize_key",
    "ShardError", "CorruptShardError", "DuplicateKeyError", "__version__",
]
