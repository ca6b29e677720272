"""NVIDIA perf_analyzer as farm's optional load client (``client="perf_analyzer"``) against farm's server:
its per-request export read into farm's windows, histogram and metrics. scripts/test installs it."""
from __future__ import annotations

import json

import pytest

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from schemas.metrics import BY_NAME
from workers.loadgen import run_load, stats
from workers.loadgen.perf_analyzer import BINARY_ENV, missing

INPUTS = [TensorSpec(name="x", shape=(16,))]


@pytest.fixture
def perf_analyzer() -> None:
    why = missing()
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("mode", ["closed", "poisson"])
def test_perf_analyzer_client_against_farm_server(farm_server_url: str, perf_analyzer: None, mode: str) -> None:
    settings = MeasurementSettings(client="perf_analyzer", mode=mode, rate=100 if mode != "closed" else None,
                                   window_s=0.5, duration_s=1.5)
    rows0, runs0 = _counts(farm_server_url)
    r = run_load(farm_server_url, "model", INPUTS, batch_size=2, concurrency=2, settings=settings)
    m, d = r.metrics, r.details
    assert d["client"] == "perf_analyzer" and d["rpc"] == "unary" and d["mode"] == mode
    assert set(m) <= set(BY_NAME), set(m) - set(BY_NAME)
    lat = {**m, **(d["client_limited_latency"] or {})}  # a shared host may make it send late
    first, last = d["metrics_windows"]
    n_ok = sum(w["requests"] for w in d["windows"][first:last + 1])
    assert n_ok > 10 and d["latency_histogram"]["count"] == n_ok
    assert m["requests_per_s"] * m["duration_s"] == pytest.approx(n_ok)
    assert m["throughput_infer_per_s"] == pytest.approx(2 * m["requests_per_s"])
    assert 0 < lat["latency_p50_ms"] <= lat["latency_p99_ms"] <= lat["latency_max_ms"]
    assert stats.histogram_quantile(d["latency_histogram"], 50) == pytest.approx(lat["latency_p50_ms"], rel=0.1)
    assert d["server_breakdown_avg_us"]["compute_infer_us"] > 0  # from the server's ModelStatistics
    assert (m["late_send_pct"] is None) == (mode == "closed")
    assert d["client_limited"] == (m["late_send_pct"] is not None and m["late_send_pct"] > 1.0)
    assert json.loads(json.dumps({"metrics": m, "details": d}))["metrics"] == m  # storable
    # the server ran rows in batches of 2 (it declares a max batch size: the batch goes in -b, not --shape)
    rows, runs = _counts(farm_server_url)
    assert runs - runs0 >= n_ok and rows - rows0 == 2 * (runs - runs0)


def _counts(url: str) -> tuple[int, int]:
    """farm's server's (rows inferred, executions) so far (its ModelStatistics)."""
    import tritonclient.grpc as tc

    st = tc.InferenceServerClient(url).get_inference_statistics("model").model_stats[0]
    return st.inference_count, st.execution_count


def test_perf_analyzer_batch_goes_where_the_model_config_says() -> None:
    """A model declaring max_batch_size takes the batch as -b and shapes without it (perf_analyzer ignores
    --shape for dimensions the config fixes); one declaring none takes it as the first dimension."""
    from workers.loadgen.perf_analyzer import shape_args

    x = [TensorSpec(name="x", shape=(128, 128))]
    assert shape_args(x, 8, 64) == ["-b", "8", "--shape", "x:128,128"]
    assert shape_args(x, 8, 0) == ["--shape", "x:8,128,128"]
    with pytest.raises(LoadGenError, match="max_batch_size 4"):
        shape_args(x, 8, 4)


def test_perf_analyzer_client_refuses_streams() -> None:
    settings = MeasurementSettings(client="perf_analyzer", rpc="stream")
    with pytest.raises(LoadGenError, match="unary"):
        run_load("127.0.0.1:1", "model", INPUTS, 1, 1, settings)


def test_absent_perf_analyzer_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "perf_analyzer"))
    with pytest.raises(LoadGenError, match="--install"):
        run_load("127.0.0.1:1", "model", INPUTS, 1, 1, MeasurementSettings(client="perf_analyzer"))
