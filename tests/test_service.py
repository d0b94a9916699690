"""shardfs under systemd: the template unit `shardfs systemd-unit` prints
passes `systemd-analyze verify`, and a foreground mount tells the service
manager it is ready once it answers, and that it stops (sd_notify through
systemd-python, received here on a socket of our own as systemd would)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
from mounting import (SHARDFS, build_shard, coordinator_pids, gone, make_blobs, mount_processes, mounted, needs_fuse, run,
                      supervisor_pids, wait_until)


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    """The unit names this shardfs command (an absolute, executable path),
    runs a background mount with Type=notify (ready told by the mount's
    coordinator: NotifyAccess=all), and systemd's own checker finds nothing
    to say about it as an instance for /mnt/archive."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    proc = run(SHARDFS + ["systemd-unit"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    unit = proc.stdout
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert lines["Type"] == "notify" and lines["Restart"] == "on-failure" and lines["NotifyAccess"] == "all"
    executable = lines["ExecStart"].split()[0]
    assert os.path.isabs(executable) and os.access(executable, os.X_OK), executable
    assert lines["ExecStart"].split()[1:] == ["mount", "$SHARDFS_ARGS", "%f"]
    instance = subprocess.run(["systemd-escape", "--path", "/mnt/archive"], capture_output=True, text=True)
    path = tmp_path / f"shardfs@{instance.stdout.strip()}.service"
    path.write_text(unit)
    checked = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and path.name not in checked.stderr + checked.stdout, checked.stderr
    # the checker is not blind: a unit naming no executable fails it
    bad = tmp_path / "shardfs@x.service"
    bad.write_text(unit.replace(executable, str(tmp_path / "none"), 1))
    assert subprocess.run([analyze, "verify", str(bad)], capture_output=True, timeout=60).returncode != 0


def _service_setup(tmp_path, seed: int):
    """(objects of a shard at tmp_path/a.shard, an empty mount point, a
    datagram socket bound as the service manager's, the environment that
    names it in NOTIFY_SOCKET); skips without systemd-python."""
    pytest.importorskip("systemd.daemon")
    objects = build_shard(tmp_path / "a.shard", make_blobs(seed, 20))
    point = tmp_path / "m"
    point.mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(120)
    return objects, point, sock, dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"))


@needs_fuse
def test_foreground_mount_tells_the_service_manager_ready_and_stopping(tmp_path):
    """With NOTIFY_SOCKET set, `shardfs mount --foreground` sends READY=1
    once the mount answers, and STOPPING=1 when SIGTERM (systemctl stop)
    unmounts it; it then exits 0 and leaves no mount."""
    objects, point, sock, env = _service_setup(tmp_path, 31)
    proc = subprocess.Popen(SHARDFS + ["mount", "--foreground", str(tmp_path / "a.shard"), str(point)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said = sock.recv(4096).decode()
        assert "READY=1" in said.splitlines() and "STATUS=serving 1 shard(s)" in said, said
        key = sorted(objects)[0]
        assert (point / key).read_bytes() == objects[key]  # ready means it answers
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in sock.recv(4096).decode().splitlines()
        assert proc.wait(60) == 0, proc.stderr.read()
        assert not mounted(point)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            time.sleep(0.1)
            if mounted(point):
                run(SHARDFS + ["umount", str(point)])
        sock.close()


def _told(sock: socket.socket, line: str) -> list:
    """The lines of the first notification on `sock` that has `line`
    (others before it, STATUS= alone say, are passed over)."""
    while True:
        said = sock.recv(4096).decode().splitlines()
        if line in said:
            return said


@needs_fuse
def test_background_mount_under_systemd_survives_its_coordinator(tmp_path):
    """What the unit runs: a background `shardfs mount` with NOTIFY_SOCKET
    set sends READY=1 with MAINPID= its supervisor (the service's main
    process from then on) before the command exits; kill -9 of the
    coordinator leaves the mount serving; SIGTERM to the supervisor
    (systemctl stop) sends STOPPING=1, unmounts and ends every process."""
    objects, point, sock, env = _service_setup(tmp_path, 32)
    done = subprocess.run(SHARDFS + ["mount", str(tmp_path / "a.shard"), str(point)], env=env,
                          capture_output=True, text=True, timeout=120)
    try:
        assert done.returncode == 0, done.stderr
        said = _told(sock, "READY=1")
        (supervisor,) = supervisor_pids(point)
        assert f"MAINPID={supervisor}" in said, said
        (coordinator,) = coordinator_pids(point)
        os.kill(coordinator, signal.SIGKILL)
        assert wait_until(lambda: coordinator_pids(point) not in ([], [coordinator]))
        key = sorted(objects)[0]
        assert (point / key).read_bytes() == objects[key]
        processes = mount_processes(point)
        os.kill(supervisor, signal.SIGTERM)
        _told(sock, "STOPPING=1")
        assert wait_until(lambda: not mounted(point) and all(gone(p) for p in processes))
    finally:
        if mounted(point):
            run(SHARDFS + ["umount", str(point)])
        sock.close()
