"""NVIDIA perf_analyzer run directly, as a user would, for ``vs_perf_analyzer.py``: its figures and its
process's CPU time. Installing and finding it is ``workers.loadgen.perf_analyzer``'s (``python3 -m
workers.loadgen.perf_analyzer --install``; ``.ci/run`` does it before the benchmarks).
"""
from __future__ import annotations

import csv
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import _serve  # noqa: F401 (puts the repository on sys.path)

from schemas import TensorSpec
from schemas.load_levels import load_level
from workers.loadgen.perf_analyzer.tool import (
    VERSION,
    binary,
    command,
    ensure,
    late_pct,
    launch,
    max_batch_size,
    missing,
)

__all__ = ["VERSION", "PaFigures", "binary", "ensure", "late_pct", "missing", "run"]
TIMEOUT_S = 300.0  # one measurement's limit (10 trials of a few seconds at most)


@dataclass(frozen=True)
class PaFigures:
    """One perf_analyzer measurement: requests/s, client-side p50/p99 latency (ms), its process's CPU
    seconds per request (us), and its late-send note (open loop) if it printed one."""

    requests_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_request: float
    warning: str | None


def run(url: str, model: str, inputs: list[TensorSpec], batch: int, *, concurrency: int | None = None,
        rate: float | None = None, distribution: str = "constant", window_ms: int = 2000,
        cpu_set: set[int] | None = None, use_async: bool = False) -> PaFigures:
    """Measure ``model`` at ``url`` with ``inputs`` (shapes without the batch) in batches of ``batch``
    (``-b`` where the model declares a max batch size, else the shape's first dimension) over unary gRPC
    (``-i grpc``, non-streaming; its sync API, its async one with ``use_async``): closed loop at ``concurrency``
    or open loop at ``rate`` req/s (``distribution`` constant|poisson), ``window_ms`` per window; the command
    line is farm's backend's (``workers.loadgen.perf_analyzer.tool.command``) but for its outputs. The figures are its
    first 3 windows' (``ALWAYS_STABLE_PCT``: it always reports them, as farm's fixed-duration runs do)."""
    level = load_level("closed" if rate is None else distribution, concurrency or 1, rate)
    with tempfile.TemporaryDirectory() as tmp:
        out_csv = Path(tmp) / "pa.csv"
        max_batch = max_batch_size(url, model) or 0
        cmd = command(url, model, inputs, batch, max_batch, level, interval_ms=window_ms, trials=10,
                      options=["--percentile", "50", "-f", str(out_csv)], async_api=use_async)
        ran = launch(cmd, TIMEOUT_S, cpu_set)
        text, cpu = ran.output, ran.cpu_s
        if ran.returncode != 0 or not out_csv.is_file():
            raise RuntimeError(f"perf_analyzer failed (exit {ran.returncode}): {text.strip()[-400:]}")
        row = next(csv.DictReader(io.StringIO(out_csv.read_text())))
    # perf_analyzer counts a request of batch b as b inferences where the model declares batching
    rps = float(row["Inferences/Second"]) / (batch if max_batch > 0 else 1)
    warn = next((ln.strip() for ln in text.splitlines() if "WARNING" in ln.upper() and "delay" in ln.lower()), None)
    # perf_analyzer's CPU covers every trial; its requests: windows x rate; the CPU per request is
    # therefore its whole CPU over (all trials' requests) -- approximated by the number of windows run
    # (it measures 3 windows at least, and stops there: ALWAYS_STABLE_PCT; verbose output counts the passes)
    trials = max(3, sum(1 for ln in text.splitlines() if ln.strip().startswith("Pass [")))
    requests = rps * window_ms / 1e3 * trials
    return PaFigures(requests_per_s=rps, p50_ms=float(row["p50 latency"]) / 1e3,
                     p99_ms=float(row["p99 latency"]) / 1e3, cpu_us_per_request=cpu / max(requests, 1) * 1e6,
                     warning=warn)
