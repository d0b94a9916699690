"""A mount's metrics in Prometheus's text format (``-o metrics=HOST:PORT``).

The coordinator serves ``http://HOST:PORT/metrics`` with
`prometheus_client` (its HTTP server thread and text exposition: nothing
here formats the protocol). Every scrape reads the figures as they are
then: the requests counted by the workers in the mount's shared memory
(`shardfs.fuse.shared`: every worker process, the C request path and
the Python handlers), and what the coordinator keeps (shards and objects
served as of its last publication, worker restarts). Names and units
follow node_exporter's conventions: a ``shardfs_`` prefix, ``_total``
for counters, base units.

Metrics (labels in braces):

- ``shardfs_requests_total{operation}``: FUSE requests served, by kind
  (lookup, getattr, read, ioctl — reads of whole small objects come as
  ioctl: docs/workers.md —, readdir, getxattr, forget...), every kind
  shown from the start.
- ``shardfs_python_requests_total{handler}``: those of them that reached
  the Python handlers (the rest were answered by C alone).
- ``shardfs_request_duration_seconds{operation}``: a histogram of the
  time from a request's start in a worker to its answer (buckets 10 µs to
  10 s; kinds not seen yet left out), counted by the C request path.
- ``shardfs_lookups_total``, ``shardfs_index_probes_total``,
  ``shardfs_hash_index_probes_total``: key lookups and the index probes
  they made.
- ``shardfs_pushed_objects_total``, ``shardfs_push_refused_total``:
  objects written into the kernel's page cache ahead of their reads, and
  pushes the kernel refused.
- ``shardfs_answered_bytes_total``, ``shardfs_pushed_bytes_total``:
  bytes of answers (after their headers: objects' bytes, entries,
  listings) and of objects pushed into the page cache, written by C
  where they are written; ``shardfs_errors_total``: error answers, but
  the normal ones (ENOENT of an absent name, ENODATA, ERANGE, ENOTTY,
  ENOSYS, EROFS).
- ``shardfs_shards``, ``shardfs_objects``: shards and objects (header
  counts) served.
- ``shardfs_workers``, ``shardfs_worker_restarts_total``: worker
  processes, and workers that died and were replaced;
  ``shardfs_coordinator_restarts_total``: coordinators started after one
  died (`shardfs.fuse.supervisor`).
- ``shardfs_build_info{version}``: 1.

Not yet: bytes served and errors answered (the C request path does not
count them).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable, Dict, Iterator, Tuple

import shardfs

#: The default host when ``metrics=PORT`` names none: this host only.
DEFAULT_HOST = "127.0.0.1"


def parse_address(text: str) -> Tuple[str, int]:
    """(host, port) of ``HOST:PORT``, ``[IPV6]:PORT`` or ``PORT`` (host
    `DEFAULT_HOST`). Raises ValueError with a one-line message."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = DEFAULT_HOST, text
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{text}: not an IPv6 address in brackets") from None
    if not host:
        raise ValueError(f"{text}: expected HOST:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text}: the port must be 1 to 65535")
    return host, int(port)


class MountCollector:
    """A `prometheus_client` collector of one mount's figures (module
    docstring). `state` is the mount's `SharedState`; `figures()` gives the
    coordinator's own: {"shards", "objects", "workers", "restarts",
    "coordinator_restarts"}."""

    def __init__(self, state: Any, figures: Callable[[], Dict[str, int]]) -> None:
        self.state = state
        self.figures = figures

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily,
                                            InfoMetricFamily)

        from shardfs.fuse.shared import HIST_BOUNDS_NS, PYTHON_KINDS, REQUEST_KINDS

        # every kind, 0 included: a series that appears late breaks rate()
        for name, text, label, kinds, counts in (
                ("shardfs_requests", "FUSE requests served, by kind", "operation", REQUEST_KINDS,
                 self.state.requests()),
                ("shardfs_python_requests", "FUSE requests that reached the Python handlers, by handler",
                 "handler", PYTHON_KINDS, self.state.python_requests())):
            family = CounterMetricFamily(name, text, labels=[label])
            for kind in kinds:
                family.add_metric([kind], counts.get(kind, 0))
            yield family
        durations = HistogramMetricFamily("shardfs_request_duration_seconds",
                                          "Time from a FUSE request's start to its answer, by kind",
                                          labels=["operation"])
        bounds = [f"{ns / 1e9:g}" for ns in HIST_BOUNDS_NS] + ["+Inf"]
        for kind, (buckets, total_ns) in self.state.durations().items():
            cumulative, running = [], 0
            for bound, n in zip(bounds, buckets):
                running += n
                cumulative.append((bound, running))
            durations.add_metric([kind], cumulative, total_ns / 1e9)
        yield durations
        lookups, probes = self.state.lookups()
        yield CounterMetricFamily("shardfs_lookups", "Key lookups", value=lookups)
        yield CounterMetricFamily("shardfs_index_probes", "Index probes made by key lookups", value=probes)
        yield CounterMetricFamily("shardfs_hash_index_probes", "Probes of the sha1/sha1_git hash indexes",
                                  value=self.state.hash_probes())
        pushed, refused = self.state.pushes()
        yield CounterMetricFamily("shardfs_pushed_objects",
                                  "Objects written into the kernel's page cache ahead of their reads", value=pushed)
        yield CounterMetricFamily("shardfs_push_refused", "Pushes into the page cache the kernel refused",
                                  value=refused)
        written = self.state.written()
        yield CounterMetricFamily("shardfs_answered_bytes", "Bytes of answers to FUSE requests, after their headers",
                                  value=written["reply_bytes"])
        yield CounterMetricFamily("shardfs_pushed_bytes", "Bytes of objects written into the kernel's page cache",
                                  value=written["pushed_bytes"])
        yield CounterMetricFamily("shardfs_errors",
                                  "Error answers (not counting ENOENT, ENODATA, ERANGE, ENOTTY, ENOSYS, EROFS: normal answers)",
                                  value=written["errors"])
        own = self.figures()
        yield GaugeMetricFamily("shardfs_shards", "Shards served", value=own["shards"])
        yield GaugeMetricFamily("shardfs_objects", "Objects served (the shards' header counts)",
                                value=own["objects"])
        yield GaugeMetricFamily("shardfs_workers", "Worker processes", value=own["workers"])
        yield CounterMetricFamily("shardfs_worker_restarts", "Worker processes that died and were replaced",
                                  value=own["restarts"])
        yield CounterMetricFamily("shardfs_coordinator_restarts",
                                  "Coordinators started after the one before died", value=own["coordinator_restarts"])
        yield InfoMetricFamily("shardfs_build", "The shardfs serving this mount",
                               value={"version": shardfs.__version__})


def serve(address: str, collector: MountCollector) -> Any:
    """Serve `collector` at http://`address`/metrics (`parse_address`) on
    a daemon thread; returns the server (``shutdown()`` stops it). Raises
    OSError when the address cannot be bound (in use: EADDRINUSE), and
    ImportError when prometheus_client is not installed."""
    from prometheus_client import CollectorRegistry, start_http_server

    host, port = parse_address(address)
    registry = CollectorRegistry()
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
