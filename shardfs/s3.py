"""Read Shards kept as objects of an S3 bucket: sources ``s3://BUCKET/KEY``.

A source is read with ranged GETs (libcurl, ``shardfs/c/s3.h``); its
header, index and hash sections and each object's size are copied once into
the cache directory, named by the object's ETag and size, so that a lookup
never asks the server and an object costs one GET (docs/s3.md). The server
and credentials come from the usual variables: ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT``), ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``); without keys, or with
``AWS_SKIP_SIGNATURE=true``, requests are anonymous. `configure` overrides
the endpoint, region and timeout.
"""

from __future__ import annotations

import os
from typing import Optional

from shardfs import _shardfs

#: What starts an S3 source.
PREFIX = "s3://"
#: Seconds a request may take before it fails with ETIMEDOUT.
DEFAULT_TIMEOUT = 30

_configured = False


def is_source(path: object) -> bool:
    """Whether `path` names an S3 object (``s3://BUCKET/KEY``)."""
    return isinstance(path, str) and path.startswith(PREFIX)


def configure(endpoint: Optional[str] = None, region: Optional[str] = None, timeout: Optional[float] = None,
              cache_dir: Optional[str] = None) -> None:
    """Set this process's S3 settings for the connections made after it:
    `endpoint` the server's URL ("http://HOST:PORT"; None: $AWS_ENDPOINT_URL,
    else AWS's), `region` (None: $AWS_REGION, else us-east-1), `timeout`
    seconds before a request fails with ETIMEDOUT (None: 30), `cache_dir`
    where local copies live (None: `shardfs.sidecar.default_cache_dir()`).
    ValueError for a timeout under 1 second."""
    global _configured
    from shardfs.sidecar import default_cache_dir
    if timeout is not None and timeout < 1:
        raise ValueError(f"s3 timeout must be at least 1 second, got {timeout}")
    _shardfs.s3_configure(endpoint=endpoint, region=region, timeout=int(timeout or DEFAULT_TIMEOUT),
                          cache_dir=os.fspath(cache_dir or default_cache_dir()))
    _configured = True


def ensure_configured() -> None:
    """`configure()` with the defaults unless it was called already."""
    if not _configured:
        configure()
