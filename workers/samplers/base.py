"""The sampler interface."""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from schemas.metrics import MetricValues


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

    def before(self) -> None:  # noqa: B027 (optional hook: a no-op by default)
        """Called once before sampling starts (e.g. take an idle baseline)."""

    @abstractmethod
    def sample(self) -> dict[str, float] | None:
        """Take one sample; keys are sampler-specific, ``t`` is added (monotonic seconds)."""

    @abstractmethod
    def summary(self) -> MetricValues:
        """Metric values from the samples taken."""

    def series(self) -> list[dict[str, float]]:
        return list(self.samples)

    def details(self) -> dict[str, Any]:
        """Sampler-specific facts for the result's details (baseline, sources, I/O totals)."""
        return {}

    def _loop(self) -> None:
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
