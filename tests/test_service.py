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
from mounting import SHARDFS, build_shard, make_blobs, mounted, needs_fuse, run


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    """The unit names this shardfs command (an absolute, executable path),
    runs it in the foreground with Type=notify, and systemd's own checker
    finds nothing to say about it as an instance for /mnt/archive."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    proc = run(SHARDFS + ["systemd-unit"])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    unit = proc.stdout
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert lines["Type"] == "notify" and lines["Restart"] == "on-failure"
    executable = lines["ExecStart"].split()[0]
    assert os.path.isabs(executable) and os.access(executable, os.X_OK), executable
    assert lines["ExecStart"].split()[1:] == ["mount", "--foreground", "$SHARDFS_ARGS", "%f"]
    instance = subprocess.run(["systemd-escape", "--path", "/mnt/archive"], capture_output=True, text=True)
    path = tmp_path / f"shardfs@{instance.stdout.strip()}.service"
    path.write_text(unit)
    checked = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0 and path.name not in checked.stderr + checked.stdout, checked.stderr
    # the checker is not blind: a unit naming no executable fails it
    bad = tmp_path / "shardfs@x.service"
    bad.write_text(unit.replace(executable, str(tmp_path / "none"), 1))
    assert subprocess.run([analyze, "verify", str(bad)], capture_output=True, timeout=60).returncode != 0


@needs_fuse
def test_foreground_mount_tells_the_service_manager_ready_and_stopping(tmp_path):
    """With NOTIFY_SOCKET set, `shardfs mount --foreground` sends READY=1
    once the mount answers, and STOPPING=1 when SIGTERM (systemctl stop)
    unmounts it; it then exits 0 and leaves no mount."""
    pytest.importorskip("systemd.daemon")
    objects = build_shard(tmp_path / "a.shard", make_blobs(31, 20))
    point = tmp_path / "m"
    point.mkdir()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(120)
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"))
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
