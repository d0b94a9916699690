"""A throw-away PostgreSQL server for the tests, run from the Debian binaries.

`PostgresServer` runs ``initdb`` into a fresh temporary directory, then
starts ``postgres`` (through ``pg_ctl``) listening on 127.0.0.1 on a free
TCP port and on a Unix socket in that directory. It can be stopped and
started again on the same port with the same data (`stop`, `start`,
`restart`), so a test can check that a client survives a server restart.
`destroy` stops it and removes the directory.

PostgreSQL refuses to run as root: when the tests run as root (CI does), every
server command runs as the ``postgres`` system user (``runuser -u postgres``),
and the temporary directory is made over to that user; otherwise the commands
run as the current user.

Authentication: Unix socket connections are trusted (any role, no password);
TCP connections need the role's password (scram-sha-256). The superuser is
``postgres`` with password ``postgres``.

A server whose test process died without its teardown (killed) is stopped
and removed by the next `PostgresServer` made in the same base directory
(`reap_stale`).

The binaries are looked up in $SHARDFS_PG_BINDIR, then the newest
/usr/lib/postgresql/<version>/bin, then ``pg_config --bindir``, then $PATH.
"""

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time

SUPERUSER = "postgres"
SUPERUSER_PASSWORD = "postgres"


class PostgresError(RuntimeError):
    """A server command failed; the message carries its output and the log's tail."""


def find_bindir():
    """The directory of initdb, pg_ctl and postgres (str), or raise PostgresError."""
    candidates = []
    if os.environ.get("SHARDFS_PG_BINDIR"):
        candidates.append(os.environ["SHARDFS_PG_BINDIR"])

    def version(path):
        try:
            return float(path.split("/")[-2])
        except ValueError:
            return 0.0

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    try:
        candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True,
                                         text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    for d in candidates:
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return d
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(found))
    raise PostgresError("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found: "
                        "install the Debian package postgresql (make apt)")


DIR_PREFIX = "shardfs-pg-"
OWNER_FILE = "owner.pid"  # the pid of the process that made the server


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale(base_dir=None):
    """Stop and remove the servers left by dead test processes (killed by a
    timeout, say, so that no teardown ran): the DIR_PREFIX directories of
    `base_dir` (default: the temporary directory) whose OWNER_FILE names a
    process that no longer exists. Directories without one are left alone."""
    base_dir = base_dir or tempfile.gettempdir()
    for d in glob.glob(os.path.join(base_dir, DIR_PREFIX + "*")):
        try:
            with open(os.path.join(d, OWNER_FILE)) as f:
                owner = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        data = os.path.join(d, "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            cmd = [os.path.join(find_bindir(), "pg_ctl"), "-D", data, "-m", "immediate",
                   "-w", "stop"]
            if os.geteuid() == 0:
                cmd = ["runuser", "-u", SUPERUSER, "--"] + cmd
            subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd="/", timeout=60)
        shutil.rmtree(d, ignore_errors=True)


def free_port():
    """A TCP port (int) free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, on 127.0.0.1:`port`.

    Arguments:
      port: the TCP port (int); default: a free one, picked once and kept
        across `restart`.
      base_dir: the parent of the temporary directory (default: the system's
        temporary directory; it must be traversable by the ``postgres`` user
        when running as root, and short: the socket path must fit in 107 bytes).
      settings: extra ``postgres -c`` settings (dict name -> value).

    Attributes: ``host`` ("127.0.0.1"), ``port``, ``dir`` (the temporary
    directory), ``data_dir``, ``socket_dir``, ``log_path``, ``bindir``.

    The constructor runs initdb and starts the server; use it as a context
    manager, or call `destroy` at the end.
    """

    host = "127.0.0.1"

    def __init__(self, port=None, base_dir=None, settings=None):
        self.bindir = find_bindir()
        self.port = port or free_port()
        self.settings = {
            # a test server: durability does not matter, speed does
            "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
            "max_connections": "300", "shared_buffers": "32MB",
            "listen_addresses": self.host,
            **(settings or {}),
        }
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            try:
                pw = pwd.getpwnam(SUPERUSER)
            except KeyError:
                raise PostgresError("running as root, but there is no 'postgres' system "
                                    "user to run PostgreSQL as (install the postgresql "
                                    "Debian package)") from None
        reap_stale(base_dir)
        self.dir = tempfile.mkdtemp(prefix=DIR_PREFIX, dir=base_dir)
        with open(os.path.join(self.dir, OWNER_FILE), "w") as f:
            f.write(f"{os.getpid()}\n")
        self.data_dir = os.path.join(self.dir, "data")
        self.socket_dir = os.path.join(self.dir, "sock")
        self.log_path = os.path.join(self.dir, "postgres.log")
        os.mkdir(self.socket_dir)
        if self._as_postgres:
            for p in (self.dir, self.socket_dir):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        self._destroyed = False
        atexit.register(self.destroy)  # in case the session dies before its teardown
        try:
            self._initdb()
            self.start()
        except BaseException:
            self.destroy()
            raise

    # ------------------------------------------------------------- commands
    def _run(self, argv, timeout=120):
        """Run a server binary (as ``postgres`` when root); raise PostgresError on failure."""
        cmd = [os.path.join(self.bindir, argv[0])] + list(argv[1:])
        if self._as_postgres:
            cmd = ["runuser", "-u", SUPERUSER, "--"] + cmd
        # output to a file, not a pipe: a daemon that inherited the pipe would
        # keep run() waiting for its end
        with tempfile.TemporaryFile() as out:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, cwd=self.dir, timeout=timeout)
            out.seek(0)
            text = out.read().decode(errors="replace")
        if proc.returncode != 0:
            raise PostgresError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text}"
                                f"\n--- tail of {self.log_path}:\n{self.log_tail()}")
        return text

    def log_tail(self, n=30):
        """The last `n` lines of the server log (str, empty if none)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def _initdb(self):
        pwfile = os.path.join(self.dir, "pwfile")
        with open(pwfile, "w") as f:
            f.write(SUPERUSER_PASSWORD + "\n")
        if self._as_postgres:
            pw = pwd.getpwnam(SUPERUSER)
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        try:
            self._run(["initdb", "-D", self.data_dir, "-U", SUPERUSER, f"--pwfile={pwfile}",
                       "--auth-local=trust", "--auth-host=scram-sha-256",
                       "--encoding=UTF8", "--no-locale", "--no-sync"])
        finally:
            os.unlink(pwfile)

    def start(self, timeout=60):
        """Start the server (on the same port as before); return once it accepts connections."""
        opts = " ".join([f"-p {self.port}", f"-k {self.socket_dir}"]
                        + [f"-c {k}={v}" for k, v in self.settings.items()])
        self._run(["pg_ctl", "-D", self.data_dir, "-l", self.log_path, "-w",
                   "-t", str(timeout), "-o", opts, "start"], timeout=timeout + 30)

    def stop(self, mode="fast", timeout=60):
        """Stop the server (`mode`: smart, fast or immediate); return once it is down."""
        self._run(["pg_ctl", "-D", self.data_dir, "-m", mode, "-w", "-t", str(timeout),
                   "stop"], timeout=timeout + 30)

    def restart(self, mode="fast"):
        """Stop then start the server, same port, same data."""
        self.stop(mode=mode)
        self.start()

    @property
    def running(self):
        """Whether the postmaster is up (bool)."""
        if not os.path.isdir(self.data_dir):
            return False
        cmd = [os.path.join(self.bindir, "pg_ctl"), "-D", self.data_dir, "status"]
        if self._as_postgres:
            cmd = ["runuser", "-u", SUPERUSER, "--"] + cmd
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              cwd=self.dir).returncode == 0

    def destroy(self):
        """Stop the server if it runs and remove its directory (idempotent)."""
        if self._destroyed:
            return
        self._destroyed = True
        atexit.unregister(self.destroy)
        try:
            if os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
                self.stop(mode="immediate")
        except (PostgresError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    # ---------------------------------------------------------------- DSNs
    def dsn(self, dbname="postgres", user=SUPERUSER, password=SUPERUSER_PASSWORD):
        """A libpq key=value DSN (str) over TCP to `dbname` as `user`."""
        return (f"host={self.host} port={self.port} dbname={dbname} user={user}"
                f" password={password}")

    def socket_dsn(self, dbname="postgres", user=SUPERUSER):
        """A libpq key=value DSN (str) over the Unix socket (trusted, no password)."""
        return f"host={self.socket_dir} port={self.port} dbname={dbname} user={user}"

    def wait_ready(self, timeout=30.0):
        """Wait until a TCP connection succeeds (after `start`, pg_ctl -w already did)."""
        import psycopg
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
