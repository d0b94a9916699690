"""The SIGBUS guard (shardfs/c/guard.h) through the Python extension.

A shard is read through a shared mapping; when its file shrinks, touching
a page past the new end raises SIGBUS, which would kill the process. Every
Shard call that touches the mapping runs under the guard and answers
OSError(EIO) instead. No mount, no root: this module runs everywhere, and
`make test-asan` runs it against the sanitized extension (AddressSanitizer
has a SIGBUS handler of its own). The same through a mount is in
test_hardening.py.
"""

from __future__ import annotations

import errno
import os

import pytest
from mounting import build_shard, make_blobs

shardfs = pytest.importorskip("shardfs")


def test_truncated_shard_api_raises_eio(tmp_path):
    """Every Shard call that touches the mapping of a truncated file raises
    OSError(EIO) instead of killing the process with SIGBUS."""
    path = tmp_path / "t.shard"
    objects = build_shard(path, make_blobs(1, 3000, 100, 3000))
    with shardfs.Shard(str(path)) as s:
        keys = list(objects)
        assert s[keys[0]] == objects[keys[0]]
        os.truncate(path, 4096)
        calls = [
            lambda: s.get(keys[1]),
            lambda: s.find(keys[2]),
            lambda: s.locate(keys[3]),
            lambda: s.slot_of(keys[4]),
            lambda: s.slot(s.slot_count - 1),
            lambda: list(s.scan(0, 100)),
            lambda: len(s),
            lambda: s.check(),
        ]
        for call in calls:
            with pytest.raises(OSError) as exc:
                call()
            assert exc.value.errno == errno.EIO
            # The cause the C side knows, and the file, are in the message.
            assert exc.value.strerror.startswith(f"{path}: the file shrank under its mapping"), exc.value
    # The process is alive and a valid shard still works.
    other = tmp_path / "u.shard"
    fine = build_shard(other, make_blobs(2, 10))
    with shardfs.Shard(str(other)) as s:
        assert all(s[k] == v for k, v in fine.items())


def test_truncated_sidecar_and_level_name_the_file(tmp_path):
    """A sidecar or a global index level truncated while open: their calls
    raise OSError(EIO) naming the file and the cause, not SIGBUS."""
    from shardfs import _shardfs

    path = tmp_path / "t.shard"
    keys = [bytes.fromhex(k) for k in build_shard(path, make_blobs(6, 3000, 100, 3000))]
    identity = bytes(range(32))
    side, level = tmp_path / "t.sidecar", tmp_path / "t.level"
    with shardfs.Shard(str(path)) as s:
        _shardfs.build_sidecar(s._reader, str(side), identity)
        sc = _shardfs.Sidecar(str(side), identity, s.slot_count)
        _shardfs.write_global_index(str(level), [(identity, _shardfs.key_prefixes(s))])
    g = _shardfs.GlobalIndex(str(level))
    os.truncate(side, 0)
    os.truncate(level, 0)
    for call, name in [(lambda: [sc.may_contain(k) for k in keys], side),
                       (lambda: [g.lookup(k) for k in keys], level)]:
        with pytest.raises(OSError) as exc:
            call()
        assert exc.value.errno == errno.EIO
        assert exc.value.strerror == f"{name}: the file shrank under its mapping (SIGBUS)"



def test_deleted_slots_of_a_truncated_shard_or_sidecar(tmp_path):
    """Shard.deleted_slots reads the shard's index and the sidecar's slots
    through their mappings: either file truncated makes it raise
    OSError(EIO) naming both, not SIGBUS."""
    from shardfs import sidecar

    for victim in ("shard", "sidecar"):
        path = tmp_path / f"{victim}.shard"
        build_shard(path, make_blobs(7, 3000, 1, 30))
        with shardfs.Shard(str(path)) as s:
            sc = sidecar.build(s, tmp_path / f"cache-{victim}")
            assert s.deleted_slots(sc) == []
            side = sidecar.sidecar_path(tmp_path / f"cache-{victim}", sidecar.identity(s))
            os.truncate(path if victim == "shard" else side, 0)
            with pytest.raises(OSError) as exc:
                s.deleted_slots(sc)
            assert exc.value.errno == errno.EIO
            assert exc.value.strerror == (f"{path}: the shard or its sidecar {side} shrank under its "
                                          "mapping (SIGBUS)")
