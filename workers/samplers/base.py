"""The sampler interface."""
from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

#: sampler threads run at the lowest priority: they share the load generator's cores (a job's samplers are
#: part of the measurement, as in any real job), and a sampler tick (psutil walking a process tree: 1-5 ms)
#: must never hold back a load process that is due to send; at nice 19 the scheduler hands the core to
#: the load process the moment it wakes. Sampling is cheap enough to fit in what is left.
SAMPLER_NICE = 19


def lower_priority() -> int | None:
    """Put the calling thread at :data:`SAMPLER_NICE` (Linux: ``setpriority`` of its thread id); returns
    the thread id, or None where threads have no priority of their own."""
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, SAMPLER_NICE)
    except (AttributeError, OSError):
        return None
    return tid


class Sampler(ABC):
    """Samples one resource in a background thread while used as a context manager.

    ``summary()`` returns metric values keyed by ``schemas.metrics`` names (absent when not measured);
    ``series()`` returns the raw samples for the result's details.
    """

    name: str = "sampler"

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[dict[str, float]] = []
        self.error: str | None = None
        self.thread_id: int | None = None  # the sampling thread's id once it runs at SAMPLER_NICE

    def before(self) -> None:  # noqa: B027 (optional hook: a no-op by default)
        """Called once before sampling starts (e.g. take an idle baseline)."""

    @abstractmethod
    def sample(self) -> dict[str, float] | None:
        """Take one sample; keys are sampler-specific, ``t`` is added (monotonic seconds)."""

    @abstractmethod
    def summary(self) -> dict[str, Any]:
        """Metric values from the samples taken."""

    def series(self) -> list[dict[str, float]]:
        return list(self.samples)

    def details(self) -> dict[str, Any]:
        """Sampler-specific facts for the result's details (baseline, sources, I/O totals)."""
        return {}

    def _loop(self) -> None:
        self.thread_id = lower_priority()
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                s = self.sample()
            except Exception as exc:  # a sampler never kills the measurement; it reports why it stopped
                self.error = f"{type(exc).__name__}: {exc}"
                return
            if s is not None:
                s["t"] = time.monotonic()
                self.samples.append(s)
            next_t += self.interval_s
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def __enter__(self) -> Sampler:
        self.before()
        self._thread = threading.Thread(target=self._loop, name=f"farm-{self.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            s = self.sample()  # one closing sample so short runs still have an end point
            if s is not None:
                s["t"] = time.monotonic()
                self.samples.append(s)
        except Exception:
            pass
