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

import errno
import os
from typing import Dict, List, Optional, Tuple

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
    _settings.update({k: v for k, v in (("endpoint", endpoint), ("region", region), ("timeout", timeout))
                      if v is not None})
    _shardfs.s3_configure(endpoint=endpoint, region=region, timeout=int(timeout or DEFAULT_TIMEOUT),
                          cache_dir=os.fspath(cache_dir or default_cache_dir()))
    _configured = True


def ensure_configured() -> None:
    """`configure()` with the defaults unless it was called already."""
    if not _configured:
        configure()


#: Seconds between two listings of a mount's ``--shard-dir s3://BUCKET/PREFIX``:
#: an object added, replaced or removed there is followed within this bound
#: plus the copy of a new object's index.
POLL_SECONDS = 2.0

_settings: dict = {}
#: The identity (`identity`) of every object the last listings saw, by source.
_listed: Dict[str, Tuple[int, int, int]] = {}


def identity(etag: str, size: int) -> Tuple[int, int, int]:
    """An S3 object's identity as a shard set compares files' (three ints,
    the last 0: not a device): from its ETag and size."""
    import hashlib  # not at import: _hashlib loads OpenSSL (~2 MB) into every process

    return (int.from_bytes(hashlib.sha256(etag.strip('"').encode()).digest()[:8], "big"), size, 0)


def listed_identity(source: str) -> Optional[Tuple[int, int, int]]:
    """The identity of `source` at the last listing that saw it, or None."""
    return _listed.get(source)


def parse_dir(directory: str) -> Tuple[str, str]:
    """(bucket, prefix) of ``s3://BUCKET[/PREFIX]``; the prefix ends with
    "/" unless empty. ValueError when malformed."""
    rest = directory[len(PREFIX):]
    bucket, _, prefix = rest.partition("/")
    if not is_source(directory) or not bucket:
        raise ValueError(f"{directory}: not an S3 directory: write s3://BUCKET[/PREFIX]")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


def _client():
    """A boto3 S3 client with this process's settings (AWS_* variables,
    `configure`'s endpoint and region); unsigned without keys or with
    AWS_SKIP_SIGNATURE."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    anonymous = (not os.environ.get("AWS_ACCESS_KEY_ID")
                 or os.environ.get("AWS_SKIP_SIGNATURE", "").lower() in ("1", "true", "yes"))
    timeout = _settings.get("timeout") or DEFAULT_TIMEOUT
    config = Config(signature_version=UNSIGNED if anonymous else "s3v4", connect_timeout=timeout,
                    read_timeout=timeout, retries={"max_attempts": 1}, s3={"addressing_style": "path"})
    return boto3.client("s3", endpoint_url=_settings.get("endpoint") or os.environ.get("AWS_ENDPOINT_URL")
                        or os.environ.get("AWS_ENDPOINT") or None,
                        region_name=_settings.get("region") or os.environ.get("AWS_REGION")
                        or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1", config=config)


def list_sources(directory: str) -> List[str]:
    """``s3://BUCKET/KEY`` of every object under ``s3://BUCKET/PREFIX``
    (directly or below; names starting with "." and "directory" markers
    ending with "/" left out), sorted; their identities are kept for
    `listed_identity`. OSError when the server cannot be listed
    (ENOENT: no such bucket; ETIMEDOUT; EACCES; EIO)."""
    import botocore.exceptions

    bucket, prefix = parse_dir(directory)
    found = {}
    try:
        pages = _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                key = item["Key"]
                if key.endswith("/") or os.path.basename(key).startswith("."):
                    continue
                found[f"{PREFIX}{bucket}/{key}"] = identity(item.get("ETag", ""), int(item.get("Size", 0)))
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise OSError(errno.ENOENT if code == "NoSuchBucket" else errno.EACCES if code in ("AccessDenied", "403")
                      else errno.EIO, f"{directory}: {code or exc}") from None
    except (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError) as exc:
        raise OSError(errno.ETIMEDOUT, f"{directory}: {exc}") from None
    except botocore.exceptions.BotoCoreError as exc:
        raise OSError(errno.EIO, f"{directory}: {exc}") from None
    for source in [s for s in _listed if s.startswith(f"{PREFIX}{bucket}/{prefix}")]:
        _listed.pop(source, None)
    _listed.update(found)
    return sorted(found)
