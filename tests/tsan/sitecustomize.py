"""`make test-tsan` copies this file beside the package built with
-fsanitize=thread (build/tsan/py, on PYTHONPATH), so every Python of that
run imports it at startup.

ThreadSanitizer's runtime is preloaded into the Pythons alone, never into
the tools the tests run (bash, find, tar, rsync, mount): bash defines its
own getenv(), which the runtime calls while it starts, before bash is
ready, and bash dies of SIGSEGV; others (rsync) stop with TSan's exit code
on reports about their own signal handlers. So: the Python is started by
the wrapper tests/tsan/python (LD_PRELOAD set for that exec only), takes
LD_PRELOAD out of the environment its children inherit, and names the
wrapper as sys.executable, which the tests and shardfs use to start every
Python child (`python -m shardfs`, the mount daemon).
"""
import os
import sys

_wrapper = os.environ.get("SHARDFS_TSAN_WRAPPER")
if _wrapper:
    _runtime = os.environ.get("SHARDFS_TSAN_RUNTIME", "")
    _rest = [p for p in os.environ.get("LD_PRELOAD", "").split() if p != _runtime]
    if _rest:
        os.environ["LD_PRELOAD"] = " ".join(_rest)
    else:
        os.environ.pop("LD_PRELOAD", None)
    sys.executable = _wrapper
