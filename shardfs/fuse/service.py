"""Running a mount under systemd: the unit template and readiness.

`unit_text(executable)` is the template unit ``shardfs@.service``
(``shardfs systemd-unit`` prints it): the instance is the mount point,
escaped as systemd escapes paths (``systemd-escape --path /mnt/archive``
gives ``mnt-archive``; ``%f`` gives the path back), and what to mount
comes from ``/etc/shardfs/<instance>.conf``, an environment file setting
``SHARDFS_ARGS`` (``SHARDFS_ARGS=--shard-dir /srv/shards -o workers=4``).
The service runs ``shardfs mount`` (a background mount, whose supervisor
keeps the FUSE connection while its coordinator dies and is started again:
`shardfs.fuse.supervisor`): the coordinator tells systemd it is ready once
the mount answers, and that the supervisor is the service's main process
from then on (``READY=1`` and ``MAINPID=``: ``Type=notify`` with
``NotifyAccess=all``, since the sender is not the process systemd
started, `notify`), before the command exits. ``systemctl stop`` sends
SIGTERM to the supervisor, which passes it to the coordinator: it
unmounts, every process leaves (``KillMode=mixed`` kills what is left).
``Restart=on-failure`` mounts again after the supervisor itself died (the
new process clears the stale mount point first). systemd's file
descriptor store (``FileDescriptorStoreMax=``) is not used: the supervisor
holds the connection.

`notify` uses the systemd project's Python binding (``systemd.daemon``,
package systemd-python: ``pip install shardfs[systemd]``); without it a
unit of ``Type=notify`` would never be told, so that is said in the log.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("shardfs.fuse")

#: The template; {executable} is the absolute path of the shardfs command.
UNIT_TEMPLATE = """\
# shardfs@.service: a shardfs mount at the path the instance names
# (systemd-escape --path /mnt/archive -> shardfs@mnt-archive.service).
# What it mounts: /etc/shardfs/<instance>.conf, an environment file, e.g.
#   SHARDFS_ARGS=--shard-dir /srv/shards -o workers=4,metrics=127.0.0.1:9464
# Made by `shardfs systemd-unit` (shardfs/fuse/service.py).
[Unit]
Description=shardfs mount at %f
After=local-fs.target network-online.target
Wants=network-online.target

[Service]
Type=notify
# READY=1 comes from the mount's coordinator, with MAINPID= its supervisor
NotifyAccess=all
EnvironmentFile=/etc/shardfs/%i.conf
ExecStart={executable} mount $SHARDFS_ARGS %f
ExecStop={executable} umount %f
Restart=on-failure
RestartSec=2s
KillMode=mixed
TimeoutStartSec=300s
TimeoutStopSec=30s

[Install]
WantedBy=multi-user.target
"""


def unit_text(executable: str) -> str:
    """The text of ``shardfs@.service`` for the shardfs command at
    `executable` (an absolute path: systemd runs no shell)."""
    return UNIT_TEMPLATE.format(executable=os.path.abspath(executable))


_warned = False


def notify(state: str) -> bool:
    """Tell the service manager `state` (``READY=1``, ``STOPPING=1``,
    ``STATUS=...``: sd_notify(3)) when it asked to be told ($NOTIFY_SOCKET
    set); True when sent. Without systemd-python, logged once."""
    global _warned
    if not os.environ.get("NOTIFY_SOCKET"):
        return False
    try:
        from systemd import daemon
    except ImportError:
        if not _warned:
            log.warning("NOTIFY_SOCKET is set but systemd-python is not installed (pip install "
                        "shardfs[systemd]): the service manager is not told the mount is ready")
            _warned = True
        return False
    return bool(daemon.notify(state))
