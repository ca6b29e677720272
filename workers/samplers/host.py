"""How much CPU the hypervisor took from this machine while measuring (steal time), from /proc/stat.

On a virtual machine, a vCPU that the host hands to another guest is "stolen": the guest's clocks keep
running, so every latency and throughput measured meanwhile gets worse without any change in the model
or the server. farm records the stolen share over each job (``cpu_steal_pct``) and notes results taken
under heavy steal, so a noisy figure can be told from a real regression.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.samplers.base import Sampler

PROC_STAT = Path("/proc/stat")
STEAL_NOTE_PCT = 5.0  # above this share of stolen CPU time, a result carries a note
STEAL_FIELD = 7  # user nice system idle iowait irq softirq steal [guest guest_nice]; guest is inside user


def read_steal(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(stolen ticks, all ticks) summed over every CPU since boot; None when the kernel reports no steal
    column (not Linux, or a kernel older than 2.6.11)."""
    try:
        with open(path) as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu" or len(parts) < 1 + STEAL_FIELD + 1:
        return None
    ticks = [int(v) for v in parts[1:1 + STEAL_FIELD + 1]]
    return ticks[STEAL_FIELD], sum(ticks)


def steal_pct(first: tuple[int, int], last: tuple[int, int]) -> float | None:
    """The stolen share, %, of all CPU time between two :func:`read_steal` readings (None if no time
    passed)."""
    total = last[1] - first[1]
    if total <= 0:
        return None
    return 100.0 * max(0, last[0] - first[0]) / total


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

    def summary(self) -> dict[str, Any]:
        if len(self.samples) < 2:
            return {}
        first, last = self.samples[0], self.samples[-1]
        pct = steal_pct((int(first["steal_ticks"]), int(first["total_ticks"])),
                        (int(last["steal_ticks"]), int(last["total_ticks"])))
        return {} if pct is None else {"cpu_steal_pct": round(pct, 2)}

    def details(self) -> dict[str, Any]:
        return {"source": str(self.path), "note_above_pct": STEAL_NOTE_PCT}


def steal_note(pct: float | None) -> str | None:
    """The note a result gets when ``pct`` % of the machine's CPU time was stolen while measuring."""
    if pct is None or pct < STEAL_NOTE_PCT:
        return None
    return (f"measured while the hypervisor took {pct:.1f} % of the machine's CPU time (steal): "
            "rerun on a quieter host before comparing")
