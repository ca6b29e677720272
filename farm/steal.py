"""How much CPU the hypervisor took from this machine while measuring (steal time), from /proc/stat.

On a virtual machine, a vCPU that the host hands to another guest is "stolen": the guest's clocks keep
running, so every latency and throughput measured meanwhile gets worse without any change in the model
or the server. farm records the stolen share over each job (``cpu_steal_pct``, sampled by
``workers.samplers.host``), exports the host's counters (``farm.telemetry``) and notes results taken under
heavy steal (``steal_note``, in results, the CLI and the HTML report).
"""
from __future__ import annotations

from pathlib import Path

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


def steal_note(pct: float | None) -> str | None:
    """The note a result gets when ``pct`` % of the machine's CPU time was stolen while measuring."""
    if pct is None or pct < STEAL_NOTE_PCT:
        return None
    return (f"measured while the hypervisor took {pct:.1f} % of the machine's CPU time (steal): "
            "rerun on a quieter host before comparing")
