"""What load workers and their coordinator tell each other.

Worker → coordinator: :class:`Ready`, one :class:`WarmupReport`, one :class:`WindowReport` per
measurement window, then :class:`WorkerDone` (or :class:`WorkerError` at any point). Coordinator →
worker process: :class:`Go`, :class:`Stop`. All are frozen dataclasses: they cross a thread queue or a
process pipe (pickled) once per window at most, never per request. Times are monotonic seconds,
latencies milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Samples:
    """Completions and errors a worker cut out of its buffers up to one edge: latencies, server queue
    and compute times (ms; requests without them left out), error counts by gRPC status name, and the
    sends (and late sends, open loop) since the previous cut."""

    lat_ms: np.ndarray
    queue_ms: np.ndarray
    compute_ms: np.ndarray
    errors: dict[str, int]
    sent: int
    late: int


# --------------------------------------------------------------------------- worker → coordinator

@dataclass(frozen=True, slots=True)
class Ready:
    """The worker is connected (and the server and model answered ready); it waits for :class:`Go`."""


@dataclass(frozen=True, slots=True)
class WarmupReport:
    """The warm-up of one worker: ``ok`` responses, error counts by status, sends, late sends and the
    worker's CPU busy % (CPU time over wall time) while warming up."""

    ok: int
    errors: dict[str, int]
    sent: int
    late: int
    busy_pct: float


@dataclass(frozen=True, slots=True)
class WindowReport:
    """Measurement window ``k`` of one worker, from ``t0`` to ``t1`` (monotonic s): its samples, the
    worker's CPU and wall seconds since the previous cut, and the worker's first error text so far."""

    k: int
    t0: float
    t1: float
    samples: Samples
    cpu_s: float
    wall_s: float
    first_error: str | None


@dataclass(frozen=True, slots=True)
class WorkerDone:
    """The worker stopped (last window or stop request) and closed its channel."""

    first_error: str | None


@dataclass(frozen=True, slots=True)
class WorkerError:
    """The worker cannot go on; ``text`` says why and what to check (raised as LoadGenError)."""

    text: str


WorkerMessage = Ready | WarmupReport | WindowReport | WorkerDone | WorkerError


# --------------------------------------------------------------------------- coordinator → process

@dataclass(frozen=True, slots=True)
class Go:
    """Start the schedule at monotonic time ``t_start`` (shared by every process on the machine)."""

    t_start: float


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop generating load and report :class:`WorkerDone`."""


ControlMessage = Go | Stop
