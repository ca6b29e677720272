"""The job's stolen CPU share (steal time), sampled from /proc/stat while it is measured.

Reading the counters and judging a share (``read_steal``, ``steal_pct``, ``steal_note``) is ``farm.steal``,
which the core's telemetry and reports use too; its names are re-exported here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from farm.steal import PROC_STAT, STEAL_NOTE_PCT, read_steal, steal_note, steal_pct
from schemas.metrics import MetricValues
from workers.samplers.base import Sampler

__all__ = ["PROC_STAT", "STEAL_NOTE_PCT", "HostSampler", "read_steal", "steal_note", "steal_pct"]


class HostSampler(Sampler):
    """The machine's stolen CPU share, read a few times a second (the counter is cumulative, so the
    job's figure is exact whatever the interval)."""

    name = "host"

    def __init__(self, interval_s: float = 0.25, path: Path = PROC_STAT) -> None:
        super().__init__(interval_s)
        self.path = path

    def sample(self) -> dict[str, float] | None:
        got = read_steal(self.path)
        if got is None:
            return None
        return {"steal_ticks": float(got[0]), "total_ticks": float(got[1])}

    def summary(self) -> MetricValues:
        if len(self.samples) < 2:
            return {}
        first, last = self.samples[0], self.samples[-1]
        pct = steal_pct((int(first["steal_ticks"]), int(first["total_ticks"])),
                        (int(last["steal_ticks"]), int(last["total_ticks"])))
        return {} if pct is None else {"cpu_steal_pct": round(pct, 2)}

    def details(self) -> dict[str, Any]:
        return {"source": str(self.path), "note_above_pct": STEAL_NOTE_PCT}

