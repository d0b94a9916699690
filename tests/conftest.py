"""Shared pytest setup: sidecars go to a per-session temporary cache
directory (mount daemons inherit the environment), never to ~/.cache; the
`mounter` fixtures unmount whatever a test mounted."""

import pytest
from mounting import Mounter


@pytest.fixture
def mounter():
    """A Mounter for one test; everything it mounted is unmounted after."""
    m = Mounter()
    yield m
    m.cleanup()


@pytest.fixture(scope="module")
def module_mounter():
    """A Mounter shared by a module's tests, unmounted at its end."""
    m = Mounter()
    yield m
    m.cleanup()


@pytest.fixture(autouse=True, scope="session")
def _sidecar_cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SHARDFS_CACHE_DIR", str(tmp_path_factory.mktemp("sidecar-cache")))
    yield
    mp.undo()
