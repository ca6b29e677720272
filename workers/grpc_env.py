"""gRPC process settings that must be in place before gRPC loads; ``workers/__init__`` applies them,
so every farm process that serves a model or drives load gets them (no other farm package imports
gRPC), and so does every process farm starts from one of those (they inherit the environment).

The setting: gRPC's "EventEngine" endpoints, its default TCP I/O layer on grpcio 1.85.1, are turned
off, so gRPC uses its older iomgr endpoints. The measured reason: on the 2-core test VM, in interleaved
A/B runs (same host, same minutes), every client and farm's server carried more requests per CPU
without them:
- ``benchmarks/stability.py --only identity`` (c=4, the server's core saturated): +5.5-6.3 % infer/s
  in 3 of 3 pairs;
- ``benchmarks/harness_overhead.py --quick``: +12-27 % req/s at c=1 and +6-12 % at c=16, for farm's
  generator and tritonclient alike, in 2 of 2 pairs.
farm sets it at both ends, in its server and in its load generator.

It also removed a transport stall seen with gRPC's defaults: whole runs in which requests of 256 KiB
were held 13-19 ms between the client's send and the server's handler, about every 70 ms, while the
server idled (``benchmarks/transport_stalls.py``). In an interleaved A/B (12 blocks of 5 runs of 3 s
per mode), 10 of 60 runs with gRPC's defaults had 21-48 stalled requests each; with this setting none
had more than 14 (44 stalled requests in all, against 355). Shorter episodes remain; their cause is
not known.

``GRPC_EXPERIMENTS`` is read once, when gRPC's core loads: setting it after ``import grpc`` does nothing.
"""
from __future__ import annotations

import os
import sys

ENV = "GRPC_EXPERIMENTS"
# experiments turned off ("-name" in GRPC_EXPERIMENTS); a value the user set for one of them wins
EVENT_ENGINE_OFF: tuple[str, ...] = (
    "event_engine_listener",  # accepted (server) connections
    "event_engine_client",  # outgoing (client) connections
    "event_engine_for_all_other_endpoints",
)


def _items(value: str | None) -> list[str]:
    return [s.strip() for s in (value or "").split(",") if s.strip()]


def merged(current: str | None) -> str:
    """``current`` (a ``GRPC_EXPERIMENTS`` value, comma-separated, ``-name`` turns one off) with farm's
    settings added; an experiment the value already names, on or off, keeps the user's setting."""
    named = {s.lstrip("+-") for s in _items(current)}
    return ",".join(_items(current) + [f"-{name}" for name in EVENT_ENGINE_OFF if name not in named])


def configure() -> bool:
    """Put farm's gRPC settings into this process's environment, for it and its children. Returns
    whether this process runs with them: gRPC was not loaded yet, or the environment it loaded with
    already named every experiment farm sets."""
    before = os.environ.get(ENV)
    os.environ[ENV] = merged(before)
    return "grpc" not in sys.modules or _items(merged(before)) == _items(before)


# set once, by workers/__init__ (the first import of this package): False when this process had loaded
# gRPC before farm could configure it
EFFECTIVE: bool = configure()

LATE_NOTE = ("gRPC was loaded in this process before farm could configure it, so its EventEngine endpoints "
             "stayed on and each request cost this process more CPU than with farm's setting; import workers "
             "before grpc or tritonclient, or start the process with GRPC_EXPERIMENTS=" + merged(None))
