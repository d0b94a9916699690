"""Shared pytest setup: sidecars go to a per-session temporary cache
directory (mount daemons inherit the environment), never to ~/.cache."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _sidecar_cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SHARDFS_CACHE_DIR", str(tmp_path_factory.mktemp("sidecar-cache")))
    yield
    mp.undo()
