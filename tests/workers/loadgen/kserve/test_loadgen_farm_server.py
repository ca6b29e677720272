"""run_load against farm's own built-in server (workers.engines.server) serving an identity model."""
from __future__ import annotations

import pytest

from schemas import MeasurementSettings, TensorSpec
from tests.workers.loadgen.stallwatch import StallWatch
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget

INPUTS = [TensorSpec(name="x", shape=(16,))]


@pytest.mark.parametrize("rpc", ["unary", "stream"])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_closed_loop_against_farm_server(farm_server_url: str, concurrency: int, rpc: str) -> None:
    settings = MeasurementSettings(client="farm", warmup_s=0.5, window_s=0.5, min_windows=2, max_windows=4,
                                   stability_pct=50, rpc=rpc)
    r = run_load(LoadTarget(farm_server_url, "model"), LoadSpec.from_settings(INPUTS, 2, concurrency, settings))
    m = r.metrics
    first, last = r.details["metrics_windows"]
    n_ok = sum(w["requests"] for w in r.details["windows"] if first <= w["k"] <= last)
    assert n_ok > 10
    assert m["requests_per_s"] * m["duration_s"] == pytest.approx(n_ok)
    assert m["throughput_infer_per_s"] == pytest.approx(2 * m["requests_per_s"])
    assert r.details["latency_histogram"]["count"] == n_ok
    assert m["error_count"] == 0, r.details["errors"]
    assert m["server_compute_p50_ms"] is not None, "farm's server must send farm_compute_ns"
    assert m["server_queue_p50_ms"] is not None
    assert m["server_compute_p50_ms"] <= m["latency_p50_ms"]
    assert m["latency_p50_ms"] <= m["latency_p99_ms"] <= m["latency_max_ms"]
    assert r.details["concurrency"] == concurrency and r.details["rpc"] == rpc


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_open_loop_against_farm_server(farm_server_url: str, rpc: str) -> None:
    settings = MeasurementSettings(client="farm", mode="poisson", rate=100, warmup_s=0.3, window_s=0.5,
                                   duration_s=1.5, rpc=rpc)
    with StallWatch() as stalls:
        r = run_load(LoadTarget(farm_server_url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings))
    assert r.metrics["late_send_pct"] is not None
    assert r.metrics["error_count"] == 0
    assert r.metrics["server_compute_p50_ms"] is not None
    stalls.require_quiet()
    assert r.metrics["requests_per_s"] == pytest.approx(100, rel=0.3)
