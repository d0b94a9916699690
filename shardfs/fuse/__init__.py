"""shardfs.fuse — serve Read Shards as a read-only FUSE filesystem.

- The request path is C on libfuse3's low-level API
  (``shardfs._shardfs.Session``, ``shardfs/c/ll.h``);
  `shardfs.fuse.handlers.ShardFS` holds the Python handlers it calls for
  what it does not answer alone (listings, xattrs, winery mounts).
- `shardfs.fuse.coordinator` and `shardfs.fuse.worker`: the processes that
  serve a mount (docs/workers.md); `shardfs.fuse.shared`: their shared
  memory.
- `shardfs.fuse.mount`: the module with `mount_shards()` and `umount()`,
  what ``shardfs mount`` and ``shardfs umount`` run (``from shardfs.fuse
  import mount`` gives the module: no function of the package is named
  ``mount``).

`ShardFS`, `mount_shards`, `umount` and `is_mounted` are also reachable
here, imported lazily: importing the package loads neither the mount's
modules nor trio, and ``python -m shardfs.fuse.mount`` (the mount daemon) does not
import its own module twice.
"""

import importlib
from typing import Any

__all__ = ["ShardFS", "mount_shards", "umount", "is_mounted"]


def __getattr__(name: str) -> Any:
    if name == "ShardFS":
        return importlib.import_module("shardfs.fuse.handlers").ShardFS
    if name in ("mount_shards", "umount", "is_mounted"):
        return getattr(importlib.import_module("shardfs.fuse.mount"), name)
    raise AttributeError(f"module 'shardfs.fuse' has no attribute {name!r}")
