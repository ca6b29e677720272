"""How long the host stalled a test: for timing checks that only mean something on a running machine."""
from __future__ import annotations

import threading
import time

import pytest


class StallWatch:
    """``with StallWatch() as w: ...``: a thread of this process asks to run every ``TICK_S``; ``w.max_s``
    is the longest it was kept waiting beyond that while the block ran (s), i.e. how long the host stalled
    this test (the vCPU taken away, everything descheduled). Rate checks over a 2 s run cannot hold across
    a stall of a good part of a second, and that would be the host's doing, not farm's."""

    TICK_S = 0.01

    def __init__(self) -> None:
        self.max_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            time.sleep(self.TICK_S)
            self.max_s = max(self.max_s, time.monotonic() - t - self.TICK_S)

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def require_quiet(self, limit_s: float = 0.15) -> None:
        """Skip the rest of the test (its timing checks) when the host stalled it for more than
        ``limit_s``; call it after the checks that hold whatever the host does."""
        if self.max_s > limit_s:
            pytest.skip(f"the host stalled this test for {self.max_s * 1e3:.0f} ms (limit "
                        f"{limit_s * 1e3:.0f} ms), so its timing checks would measure the host, not farm")
