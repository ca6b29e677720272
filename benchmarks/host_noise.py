"""How steady is this machine? Its own speed, timed in short blocks, and how much it moves.

Two fixed workloads alternate on one CPU: a pure-Python counting loop (compute-bound, fits in L1) and a
numpy random gather over a 16 MB array (bound by the last-level cache and memory, which neighbours on a
shared host also use). A pair of blocks takes 50-90 ms here; the CV of the blocks is printed at several
time scales (1, 10 and 40 blocks averaged). A serving benchmark cannot repeat more closely than the
machine under it: if these CVs exceed a target, so will any harness's figures. The hypervisor does not
report all of this as steal (``/proc/stat``), so steal alone does not tell.

The stability benchmark also times these workloads right after each job (``machine_speed`` in
``_serve.py``, via ``--once``).

Run: ``python benchmarks/host_noise.py [--quick] [--seconds 30] [--cpu N]``. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

GATHER_MB = 16
BLOCK_LOOPS = 600_000      # 20-50 ms of counting at the 12-30 M it/s seen on these VMs
GATHER_REPEATS = 25        # 25 gathers of 200,000 elements: 25-60 ms here


def _gather_setup() -> tuple[np.ndarray, np.ndarray]:
    arr = np.arange(GATHER_MB * 1024 * 1024 // 8, dtype=np.int64)
    idx = np.random.default_rng(0).integers(0, arr.size, 200_000)
    return arr, idx


def sample(seconds: float) -> tuple[list[float], list[float]]:
    """Alternate the two workloads for ``seconds``; returns (loop rates in M it/s, gather rates in
    M gathered elements/s), one per block."""
    arr, idx = _gather_setup()
    loop: list[float] = []
    gather: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not loop:
        t0 = time.perf_counter()
        n = 0
        for _ in range(BLOCK_LOOPS):
            n += 1
        loop.append(n / (time.perf_counter() - t0) / 1e6)
        t0 = time.perf_counter()
        for _ in range(GATHER_REPEATS):
            arr[idx].sum()
        gather.append(GATHER_REPEATS * idx.size / (time.perf_counter() - t0) / 1e6)
    return loop, gather


def cv_pct(x: list[float] | np.ndarray) -> float:
    """Coefficient of variation in % (sample standard deviation); NaN under two values."""
    a = np.asarray(x, dtype=float)
    return float(100 * a.std(ddof=1) / a.mean()) if a.size > 1 else float("nan")


def blocks(x: list[float], k: int) -> list[float]:
    """Means of consecutive groups of ``k`` values (the last partial group dropped)."""
    return [float(np.mean(x[i:i + k])) for i in range(0, len(x) - k + 1, k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to sample (default 30)")
    ap.add_argument("--quick", action="store_true", help="5 s, for a CI smoke run")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU (default: the last one)")
    ap.add_argument("--once", type=float, default=None, metavar="S",
                    help="sample for S seconds and print only the two mean rates (used by stability.py)")
    ap.add_argument("--cpus", default="", help="with --once: pin to these CPUs, e.g. 0,1")
    args = ap.parse_args()
    if args.once is not None:
        if args.cpus:
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
        loop, gather = sample(args.once)
        print(f"{np.mean(loop):.4f} {np.mean(gather):.4f}")
        return
    seconds = 5.0 if args.quick else args.seconds
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    from _serve import Steal

    with Steal() as steal:
        loop, gather = sample(seconds)
    pair_s = seconds / len(loop)
    print(f"CPU {cpu}, {seconds:g} s, {len(loop)} blocks of each workload ({pair_s * 1e3:.0f} ms a pair); "
          f"loop {np.mean(loop):.2f} M it/s, gather {np.mean(gather):.1f} M elements/s; "
          f"the hypervisor took {steal.pct:.1f} % of the CPU time (steal)")
    for k in (1, 10, 40):
        if len(loop) >= 3 * k:
            print(f"  averaged over {k:3d} blocks (~{k * pair_s:5.2f} s): CV loop {cv_pct(blocks(loop, k)):5.2f} %, "
                  f"random gather {GATHER_MB} MB {cv_pct(blocks(gather, k)):5.2f} %")
    print("  a serving benchmark cannot repeat more closely than these at its own time scale")


if __name__ == "__main__":
    main()
