"""A single-host Ceph cluster for the tests: one monitor, one OSD on the
memstore object store, no authentication, pools of size 1, no manager.

Debian 12's Ceph 16 (``ceph-mon ceph-osd ceph-common rbd-fuse``, installed
by ``make test``). What makes it start reliably and fast (measured here):
CRUSH updates at OSD start are off and the OSD is placed by hand (else it
dies at boot about a third of the time), paxos waits are short (start in
under a second instead of 7), clients have no admin socket (they would
collide on one), and every command runs under a timeout (a client waits
for ever for an OSD that is gone). The daemons are children of the test
process, stopped by PID, and their directory removed, whatever happens.

    with CephCluster(tmp_path) as ceph:
        ceph.rbd("import", "a.shard", "shards/a")
        ceph.env  # CEPH_CONF for clients
        endpoint = ceph.start_rgw()  # an S3 server (radosgw) on the cluster
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Dict, List

#: Seconds any ceph/rbd command may take.
COMMAND_TIMEOUT = 30
#: Seconds the cluster may take to have its OSD up.
START_TIMEOUT = 60
#: The pool the tests keep shards in.
POOL = "shards"


def available() -> bool:
    """Whether the Ceph daemons and tools are installed."""
    return all(shutil.which(t) for t in ("ceph-mon", "ceph-osd", "ceph", "rbd", "monmaptool"))


def rgw_available() -> bool:
    """Whether Ceph's S3 server (Debian's ``radosgw``) is installed too."""
    return available() and all(shutil.which(t) for t in ("radosgw", "radosgw-admin"))


#: The S3 user the tests' radosgw has (`CephCluster.start_rgw`).
S3_ACCESS_KEY, S3_SECRET_KEY = "shardfs-test", "shardfs-test-secret"


def _free_port_range(count: int) -> int:
    """A port P with P..P+count free now (best effort)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count < 65000:
            ok = True
            for p in range(port, port + count):
                with socket.socket() as t:
                    try:
                        t.bind(("127.0.0.1", p))
                    except OSError:
                        ok = False
                        break
            if ok:
                return port
    raise RuntimeError("no free range of ports for the Ceph cluster")


class CephCluster:
    """A running cluster under `directory` (created), with pool POOL."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory) / "ceph"
        self.procs: Dict[str, subprocess.Popen] = {}
        self.port = 0
        self.conf = self.dir / "ceph.conf"

    # ------------------------------------------------------------ commands

    @property
    def env(self) -> Dict[str, str]:
        """The environment of the daemons and tools: CEPH_CONF, and no
        LD_PRELOAD (the sanitizer runtime the ASan run preloads into the
        test's Python is not the daemons')."""
        env = dict(os.environ, CEPH_CONF=str(self.conf))
        env.pop("LD_PRELOAD", None)
        return env

    def run(self, *argv: str, timeout: float = COMMAND_TIMEOUT, check: bool = True) -> subprocess.CompletedProcess:
        """A ceph tool (`argv`) against this cluster, under a timeout."""
        proc = subprocess.run(["timeout", "-k", "5", str(timeout), *argv], env=self.env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return proc

    def ceph(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run("ceph", *args, **kw)

    def rbd(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run("rbd", *args, **kw)

    # ------------------------------------------------------------ lifecycle

    def _write_conf(self, fsid: str) -> None:
        d = self.dir
        p = self.port
        self.conf.write_text(f"""[global]
fsid = {fsid}
mon_host = v1:127.0.0.1:{p}/0
public_network = 127.0.0.1/32
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
keyring = /dev/null
run_dir = {d}/run
log_file = {d}/log/$name.log
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
ms_bind_port_min = {p + 1}
ms_bind_port_max = {p + 40}
osd_pool_default_pg_autoscale_mode = off
# A PG's read lease is derived from this (0.8 x it): after a stop of the OSD
# (SIGSTOP in the fault tests) with reads arriving meanwhile, its PGs were
# found laggy when it resumed, and with no peer to renew the lease (one OSD)
# the queued reads waited "for readable" for ever. At 600 s they do not.
osd_heartbeat_grace = 600

[mon]
mon_data = {d}/mon/$id
mon_data_avail_crit = 0
mon_data_avail_warn = 0
paxos_propose_interval = 0.01
paxos_min_wait = 0.01

[osd]
osd_data = {d}/osd/$id
osd_objectstore = memstore
memstore_device_bytes = 4G
osd_crush_update_on_start = false
osd_class_update_on_start = false

[client]
admin_socket =
""")

    def _daemon(self, name: str, argv: List[str]) -> None:
        log = open(self.dir / "log" / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def start(self) -> "CephCluster":
        if self.dir.exists():
            shutil.rmtree(self.dir)
        for sub in ("run", "log", "mon/a", "osd/0"):
            (self.dir / sub).mkdir(parents=True)
        self.port = _free_port_range(41)
        fsid = str(uuid.uuid4())
        self._write_conf(fsid)
        try:
            self.run("monmaptool", "--create", "--fsid", fsid, "--add", "a", f"v1:127.0.0.1:{self.port}",
                     str(self.dir / "monmap"))
            self.run("ceph-mon", "--mkfs", "-i", "a", "--monmap", str(self.dir / "monmap"))
            self._daemon("mon", ["ceph-mon", "-f", "-i", "a"])
            osd_uuid = str(uuid.uuid4())
            self.ceph("osd", "new", osd_uuid)
            self.ceph("osd", "crush", "add", "osd.0", "1.0", "root=default")
            self.run("ceph-osd", "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
            self._daemon("osd", ["ceph-osd", "-f", "-i", "0"])
            self.wait_osd_up()
            self.ceph("osd", "pool", "create", POOL)
            self.rbd("pool", "init", POOL)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_osd_up(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.ceph("osd", "stat", "-f", "json", check=False, timeout=10)
            if proc.returncode == 0 and json.loads(proc.stdout or "{}").get("num_up_osds") == 1:
                return
            if self.procs["osd"].poll() is not None:
                raise RuntimeError(f"ceph-osd exited: {self.tail('osd')}")
            time.sleep(0.1)
        raise RuntimeError(f"the OSD did not come up within {timeout:g} s: {self.tail('osd')}")

    @contextlib.contextmanager
    def paused(self, name: str):
        """Daemon `name` ("osd" or "mon") stopped (SIGSTOP: it answers no
        one, as a hung or unreachable daemon) for the block, then resumed.
        memstore keeps its objects only while the OSD lives: a kill would
        lose them."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def rbd_fuse(self, point: Path, read_only: bool = True, wait_for: str = ""):
        """The pool's images as files under `point` (rbd-fuse, in the
        foreground as a child), once mounted (and image `wait_for` listed);
        unmounted and stopped after the block."""
        argv = ["rbd-fuse", "-f", "-p", POOL, str(point)] + (["-o", "ro"] if read_only else [])
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + COMMAND_TIMEOUT
            while not (os.path.ismount(point) and (not wait_for or os.path.exists(Path(point) / wait_for))):
                if proc.poll() is not None:
                    raise RuntimeError(f"rbd-fuse exited: {proc.stderr.read()[-500:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rbd-fuse did not mount {point} within {COMMAND_TIMEOUT} s")
                time.sleep(0.05)
            yield Path(point)
        finally:
            subprocess.run(["fusermount3", "-u", "-z", str(point)], capture_output=True)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def start_rgw(self, port: int = 0) -> str:
        """Ceph's S3 server on this cluster (radosgw's beast frontend on
        127.0.0.1, with tcp_nodelay=1: without it every request of a
        kept-alive client waits ~45 ms for a delayed ACK), its pools made on
        first start, and a user with keys S3_ACCESS_KEY/S3_SECRET_KEY;
        returns its endpoint URL once it answers. Stopped with the cluster
        (by PID). `port`: the port of a radosgw started before and killed
        (0: a free one); its buckets are in the cluster, kept."""
        if not port:
            with socket.socket() as t:
                t.bind(("127.0.0.1", 0))
                port = t.getsockname()[1]
        (self.dir / "rgw").mkdir(exist_ok=True)
        self._daemon("rgw", ["radosgw", "-f", "-n", "client.rgw.a", "--rgw-data", str(self.dir / "rgw"),
                             "--rgw-frontends", f"beast endpoint=127.0.0.1:{port} tcp_nodelay=1",
                             "--rgw-dns-name", "127.0.0.1"])
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if self.procs["rgw"].poll() is not None:
                    raise RuntimeError(f"radosgw exited: {self.tail('rgw')}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"radosgw did not answer within {START_TIMEOUT} s: {self.tail('rgw')}")
                time.sleep(0.1)
        if not self.run("radosgw-admin", "-n", "client.admin", "user", "info", "--uid", "shardfs-test",
                        check=False).returncode == 0:
            self.run("radosgw-admin", "-n", "client.admin", "user", "create", "--uid", "shardfs-test",
                     "--display-name", "shardfs tests", "--access-key", S3_ACCESS_KEY, "--secret", S3_SECRET_KEY)
        return endpoint

    def kill(self, name: str) -> None:
        """Daemon `name` killed (SIGKILL) and reaped: a server gone."""
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def tail(self, name: str) -> str:
        try:
            return (self.dir / "log" / f"{name}.out").read_text()[-800:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Kill the daemons (SIGKILL: memstore keeps nothing worth a clean
        stop, which takes seconds), reap them, remove the directory."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "CephCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
