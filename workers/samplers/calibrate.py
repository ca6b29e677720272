"""The host yardstick: a short fixed CPU calibration that every job runs on its server cores before and after it
is measured, so that a result carries the host's own speed next to its figures.

A cloud host can run twice as fast or as slow from one minute to the next (a noisy neighbour on the same
physical cores, frequency changes) without any steal showing; two runs of the same request then differ by 2x and
nothing in the rows says why. ``calibrate`` times one fixed piece of work (``calibration_pass``: a pure-Python
integer loop, the interpreter's speed, and NumPy element-wise passes over a 128 KiB array, SIMD and cache speed;
no BLAS, which would start threads outside the job's cores) ``CALIBRATION_REPS`` times in the calling thread,
pinned to the cores given, and keeps the fastest repetition: a short interruption slows one repetition, a slower
host slows all of them. The same code runs everywhere, so the index (passes per second) compares hosts that run
the same Python and NumPy. It is farm's own code because no library measures a host's speed in ~0.1 s on chosen
cores (pyperf calibrates loops for a benchmark, over seconds, in new processes).

It runs strictly outside the measured windows: before the server (or edge run) starts and after it has stopped.
About 18 ms a repetition on a 2-core cloud VM, ~0.1 s a calibration, two per job.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from schemas.cpus import cpu_list
from workers.cores import pinned

CALIBRATION_LOOPS = 150_000  # pure-Python iterations of one pass
CALIBRATION_ARRAY = 32_768  # float32 elements of the NumPy part (128 KiB, fits L2)
CALIBRATION_SWEEPS = 600  # NumPy multiply-add sweeps over the array in one pass
CALIBRATION_REPS = 5  # passes per calibration; the fastest counts


def calibration_pass(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> int:
    """One pass of the fixed work (``a``, ``b``, ``out``: float32 arrays of ``CALIBRATION_ARRAY``); returns a
    checksum so the loop cannot be skipped."""
    acc = 0
    for i in range(CALIBRATION_LOOPS):
        acc = (acc * 31 + i) % 1_000_003
    for _ in range(CALIBRATION_SWEEPS):
        np.multiply(a, b, out=out)
        np.add(out, a, out=out)
    return acc


@dataclass(frozen=True)
class Calibration:
    """One calibration: ``speed`` (passes/s of the fastest repetition), each repetition's time (s), the cores it
    ran on (a CPU list) and its whole cost (s, wall time)."""

    speed: float
    reps_s: tuple[float, ...]
    cores: str
    cost_s: float

    def as_dict(self) -> dict[str, object]:
        return {"speed_pass_per_s": round(self.speed, 3), "reps_ms": [round(r * 1e3, 2) for r in self.reps_s],
                "cores": self.cores, "cost_ms": round(self.cost_s * 1e3, 1)}


def calibrate(cores: Iterable[int], reps: int = CALIBRATION_REPS) -> Calibration:
    """Time ``reps`` calibration passes in this thread pinned to ``cores`` (its CPU set is restored after)."""
    cores = sorted(set(cores))
    a = np.linspace(0.0, 1.0, CALIBRATION_ARRAY, dtype=np.float32)
    b, out = a[::-1].copy(), np.empty_like(a)
    t0 = time.perf_counter()
    times = []
    with pinned(cores):
        for _ in range(reps):
            start = time.perf_counter()
            calibration_pass(a, b, out)
            times.append(time.perf_counter() - start)
    return Calibration(speed=1.0 / min(times), reps_s=tuple(times), cores=cpu_list(cores),
                       cost_s=time.perf_counter() - t0)


def speed_change_pct(before: Calibration, after: Calibration) -> float:
    """The host's speed after vs before, % (+: faster after)."""
    return 100.0 * (after.speed / before.speed - 1.0)
