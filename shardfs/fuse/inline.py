"""pyfuse3 without an event loop, for the worker processes.

pyfuse3 reaches its event loop only through its module attribute
``pyfuse3.trio`` (pyfuse3.asyncio replaces it the same way to run on
asyncio), and uses little of it: a Lock, a nursery, ``wait_readable`` before
each blocking read of the FUSE device, ``current_task``,
``current_trio_token``, ``notify_closing`` and ``ClosedResourceError``.

This module is such a replacement, with two modes:

* ``"trio"`` (the default): everything is trio's own, except the Lock, which
  never yields. The coordinator runs this way to answer INIT under
  ``trio.run`` (`shardfs.fuse.coordinator`).
* ``"inline"`` (`serve`): no event loop at all. ``wait_readable`` returns at
  once, so pyfuse3 goes straight to its blocking read of the device, and
  tasks are coroutines driven to their end in the calling thread. A worker
  serves one request at a time and must never wait for anything but the
  device (`shardfs.fuse.worker`), so nothing is lost, and what trio would do
  around every request (a scheduler turn, an epoll call) is saved. A
  handler that awaits something that really suspends is a programming
  error: RuntimeError.

Why a process blocked in ``read(2)`` and not in epoll: the kernel wakes one
reader of a FUSE device per request (exclusive wait), but every process
polling it; with several workers on one connection, polling would wake them
all for each request.

`install()` must run before ``pyfuse3.init()``: pyfuse3 makes its Lock there.
"""

from __future__ import annotations

import sys
from typing import Any, Awaitable, Callable, Coroutine, List, Optional

import trio as _trio

#: "trio" or "inline" (see the module's docstring).
mode = "trio"

ClosedResourceError = _trio.ClosedResourceError

lowlevel = sys.modules[__name__]


class Lock:
    """A lock that is never contended (pyfuse3 takes it around waiting for
    the device; one task at a time reads here) and never yields."""

    async def __aenter__(self) -> "Lock":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class _Task:
    name = "shardfs-inline"


def current_task() -> Any:
    return _trio.lowlevel.current_task() if mode == "trio" else _Task


def current_trio_token() -> Any:
    return _trio.lowlevel.current_trio_token() if mode == "trio" else None


async def wait_readable(fd: int) -> None:
    if mode == "trio":
        await _trio.lowlevel.wait_readable(fd)


def notify_closing(fd: int) -> None:
    if mode == "trio":
        _trio.lowlevel.notify_closing(fd)


class _Nursery:
    """Runs the coroutines started in it to their end, one after the other,
    when the ``async with`` block ends."""

    def __init__(self) -> None:
        self._queue: List[Coroutine[Any, Any, Any]] = []

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: Optional[str] = None) -> None:
        self._queue.append(fn(*args))

    async def __aenter__(self) -> "_Nursery":
        return self

    async def __aexit__(self, *exc: object) -> None:
        while self._queue:
            run(self._queue.pop(0))


def open_nursery() -> Any:
    return _trio.open_nursery() if mode == "trio" else _Nursery()


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Drive `coro` to its end in this thread; returns its result. Raises
    RuntimeError if it suspends (it would need an event loop)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a coroutine waited for an event loop in a shardfs worker")


def install() -> None:
    """Make pyfuse3 use this module (in "trio" mode until `serve`)."""
    import pyfuse3

    pyfuse3.trio = sys.modules[__name__]


def serve(main: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    """Switch to "inline" mode and run ``main(*args)`` (pyfuse3.main) to its
    end in this thread."""
    global mode
    mode = "inline"
    return run(main(*args))
