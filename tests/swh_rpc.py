"""swh-objstorage's RPC server around an objstorage config, for the tests
(tests/test_objstorage.py) and the winery benchmark (bench/bench_winery.py).

`objstorage_server(config, workdir)` writes ``{"objstorage": config}`` to
`workdir` (JSON, which swh's YAML reader takes), starts swh's WSGI app
under gunicorn (``--preload -w 2``: the app loaded once, then the workers
forked, as in production) or swh's development server (``rpc-serve``) on
a free port of 127.0.0.1, and yields swh's ``remote`` client once the
server answers.
"""
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

BIN = os.path.dirname(sys.executable)


def _argv(server: str, config: str, port: int) -> list:
    if server == "gunicorn":
        return [os.path.join(BIN, "gunicorn"), "--preload", "-w", "2", "-b", f"127.0.0.1:{port}",
                "swh.objstorage.api.server:make_app_from_configfile()"]
    return [os.path.join(BIN, "swh"), "--config-file", config, "objstorage", "rpc-serve",
            "--host", "127.0.0.1", "--port", str(port), "--no-debug"]


@contextlib.contextmanager
def objstorage_server(config: dict, workdir, server: str = "gunicorn", timeout: float = 60):
    """Yield a ``remote`` objstorage client of swh's RPC server (`server`:
    "gunicorn" or "rpc-serve") serving `config`; the server is stopped at
    the end. Raises RuntimeError (with the end of its stderr) when it does
    not answer within `timeout` seconds."""
    from swh.objstorage.factory import get_objstorage

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = os.path.join(str(workdir), f"objstorage-{config['cls']}.yml")
    with open(path, "w") as f:
        json.dump({"objstorage": config}, f)
    proc = subprocess.Popen(_argv(server, path, port), env=dict(os.environ, SWH_CONFIG_FILENAME=path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        remote = get_objstorage("remote", url=f"http://127.0.0.1:{port}/")
        deadline = time.monotonic() + timeout
        while True:
            try:
                remote.check_config(check_write=False)
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{server} did not answer: {proc.stderr.read()[-800:]}") from None
                time.sleep(0.1)
        yield remote
    finally:
        proc.terminate()
        proc.wait(timeout=30)
