"""Shared pytest setup: sidecars go to a per-session temporary cache
directory (mount daemons inherit the environment), never to ~/.cache; the
`mounter` fixtures unmount whatever a test mounted. SHARDFS_WORKERS, when
set, is the worker count of every mount the tests make (``make test`` runs
the mounting suites with the default and with 1)."""

import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from mounting import Mounter, run


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


@pytest.fixture
def loop_device(tmp_path):
    """A read-write loop device over a 16 MiB sparse image (detached after)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for losetup")
    if shutil.which("losetup") is None:
        pytest.skip("needs losetup")
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    proc = run(["losetup", "--find", "--show", image])
    if proc.returncode != 0:
        pytest.skip(f"cannot attach a loop device: {proc.stderr.strip()}")
    dev = proc.stdout.strip()
    yield dev
    for _ in range(50):  # the mount may take a moment to let go of it
        if run(["losetup", "-d", dev]).returncode == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"could not detach {dev}")


@pytest.fixture(autouse=True, scope="session")
def _sidecar_cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SHARDFS_CACHE_DIR", str(tmp_path_factory.mktemp("sidecar-cache")))
    yield
    mp.undo()


def _fail_skip_under_ci(report) -> None:
    """Under CI (CI set in the environment), turn a skip `report` into a
    failure that gives the skip's reason: a green run must mean that the
    mounts, root-only and tool-dependent tests ran. Elsewhere (a developer
    machine without FUSE or root) a skip stays a skip."""
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which must run every test: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped by a mark (needs_fuse), a fixture (loop_device) or its
    body (pytest.skip) fails under CI."""
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """So does a whole module skipped as it is collected
    (pytest.importorskip at module level)."""
    outcome = yield
    _fail_skip_under_ci(outcome.get_result())


# ------------------------------------------------------------------ winery
# A real PostgreSQL server for the session and a real swh-objstorage winery
# deployment per test (tests/pg_server.py, tests/winery_deploy.py). Imported
# lazily: sessions that use neither load neither psycopg nor swh.objstorage.

def pytest_configure(config):
    config.addinivalue_line(
        "markers", "winery(**kwargs): keyword arguments of the `winery` fixture's "
        "winery_deploy.Deployment (shard_max_size, pool_name, use_permissions, ...)")


@pytest.fixture(scope="session")
def postgres_server():
    """A pg_server.PostgresServer started for the session (127.0.0.1, a free
    port), destroyed at its end. Tests may stop(), start() and restart() it;
    the `winery` fixture starts it again if a test left it stopped. If it
    cannot start, the tests using it error out (never skip)."""
    from pg_server import PostgresServer
    server = PostgresServer()
    yield server
    server.destroy()


@pytest.fixture
def winery(postgres_server, tmp_path, request):
    """A winery_deploy.Deployment on its own new database, images under
    tmp_path/"pools"; closed and its database dropped after the test.
    Options: @pytest.mark.winery(shard_max_size=..., ...)."""
    from winery_deploy import Deployment
    marker = request.node.get_closest_marker("winery")
    kwargs = dict(marker.kwargs) if marker else {}
    if not postgres_server.running:
        postgres_server.start()
    deployment = Deployment(postgres_server, tmp_path / "pools", **kwargs)
    yield deployment
    if not postgres_server.running:
        postgres_server.start()
    try:
        deployment.close()
    finally:
        deployment.drop()


#: PATH mount.fuse3 searches for the "shardfs" helper.
HELPER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def shardfs_helper_in_path():
    """`shardfs` in mount.fuse3's PATH: a temporary /usr/local/bin/shardfs
    wrapper unless that path exists already."""
    if os.geteuid() != 0:
        pytest.skip("mount -t fuse.shardfs needs root")
    if shutil.which("mount.fuse3", path=HELPER_PATH) is None or shutil.which("mount") is None:
        pytest.skip("needs mount and mount.fuse3")
    wrapper = Path("/usr/local/bin/shardfs")
    created = False
    if not os.path.lexists(wrapper):
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        wrapper.write_text(
            "#!/bin/sh\n"
            "# temporary wrapper made by tests/conftest.py; removed after the test\n"
            f"PYTHONPATH='{repo}'${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH\n"
            f"exec '{sys.executable}' -m shardfs \"$@\"\n"
        )
        wrapper.chmod(0o755)
        created = True
    yield wrapper
    if created:
        wrapper.unlink()
