"""Pure helpers of the load generator: percentiles, histograms, stability, planning, request building."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from schemas import MeasurementSettings, TensorSpec
from schemas import load_levels as levels
from schemas.metrics import BY_NAME
from workers.loadgen import stats
from workers.loadgen.kserve.client import auto_process_cap, escalation
from workers.loadgen.kserve.messages import WarmupReport
from workers.loadgen.kserve.request import V2_NUMPY, build_request, random_tensor, serialized_request
from workers.loadgen.kserve.worker import _stream_error_name, with_id
from workers.loadgen.patterns import ClosedLoop, ConstantRate, PoissonRate, pattern_of
from workers.loadgen.plan import WindowPlan

QS = (0, 1, 25, 50, 90, 95, 99, 99.9, 100)


# ----------------------------------------------------------------------------- percentiles

@pytest.mark.parametrize("sample", [
    [1.0], [3.0, 1.0], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5.5, 0.1, 0.1, 9.0, 2.25, 100.0, 7.0],
    list(np.random.default_rng(1).lognormal(0, 1, 1001)),
])
def test_percentiles_match_numpy_linear(sample: list[float]) -> None:
    for q in QS:
        assert stats.percentile(sample, q) == pytest.approx(float(np.percentile(sample, q, method="linear")))
    assert stats.percentiles(sample, QS) == pytest.approx([float(np.percentile(sample, q)) for q in QS])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False), min_size=1, max_size=300),
       st.floats(min_value=0, max_value=100))
def test_percentile_matches_numpy_on_random_samples(sample: list[float], q: float) -> None:
    assert stats.percentile(sample, q) == pytest.approx(float(np.percentile(sample, q)), rel=1e-9, abs=1e-9)


def test_percentile_empty_and_out_of_range() -> None:
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError, match="0..100"):
        stats.percentile([1.0], 101)


def test_summarize_latencies() -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    s = stats.summarize_latencies(a)
    assert s["mean"] == pytest.approx(22.0)
    assert s["p50"] == 3.0 and s["max"] == 100.0
    assert s["std"] == pytest.approx(float(np.std(a)))
    assert s["p99"] == pytest.approx(float(np.percentile(a, 99)))
    assert all(v is None for v in stats.summarize_latencies(np.array([])).values())


# ----------------------------------------------------------------------------- histograms

def test_histogram_counts_and_bounds_are_consistent() -> None:
    values = [0.5, 0.5, 1.0, 2.0, 10.0, 10.5, 250.0]
    h = stats.histogram(values)
    assert h["count"] == 7 and sum(h["counts"]) == 7
    assert len(h["bounds_ms"]) == len(h["counts"]) + 1
    assert h["min_ms"] == 0.5 and h["max_ms"] == 250.0
    assert h["sum_ms"] == pytest.approx(sum(values))
    bounds = h["bounds_ms"]
    for v in values:  # every value falls inside exactly one stored bucket
        j = stats.bucket_index(v) - h["first_index"]
        assert bounds[j] <= v * (1 + 1e-12) and v < bounds[j + 1] * (1 + 1e-12)
        assert h["counts"][j] >= 1
    assert json.loads(json.dumps(h)) == h  # storable as JSON


def test_histogram_edge_values() -> None:
    h = stats.histogram([0.0, -1.0, float("inf"), 1.0])
    assert h["count"] == 4 and sum(h["counts"]) == 4
    assert stats.bucket_index(0.0) == stats.HIST_MIN_INDEX
    assert stats.bucket_index(float("inf")) == stats.HIST_MAX_INDEX
    empty = stats.histogram([])
    assert empty["count"] == 0 and stats.histogram_quantile(empty, 50) is None


def test_histogram_merge_equals_histogram_of_union() -> None:
    rng = np.random.default_rng(7)
    a, b, c = rng.lognormal(0, 1, 500), rng.lognormal(2, 0.5, 300), rng.lognormal(-1, 2, 50)
    merged = stats.merge_histograms([stats.histogram(a), stats.histogram(b), stats.histogram(c)])
    whole = stats.histogram(np.concatenate([a, b, c]))
    assert merged["counts"] == whole["counts"]
    assert merged["first_index"] == whole["first_index"]
    assert merged["count"] == 850
    assert merged["min_ms"] == whole["min_ms"] and merged["max_ms"] == whole["max_ms"]
    assert merged["sum_ms"] == pytest.approx(whole["sum_ms"])
    assert stats.histogram_mean(merged) == pytest.approx(float(np.concatenate([a, b, c]).mean()))
    # merging round-trips through JSON too
    again = stats.merge_histograms([json.loads(json.dumps(merged)), stats.histogram([])])
    assert again["counts"] == merged["counts"]


def test_histogram_merge_rejects_other_grid() -> None:
    h = stats.histogram([1.0])
    h["per_decade"] = 10
    with pytest.raises(ValueError, match="per decade"):
        stats.merge_histograms([h])


def test_histogram_quantile_within_one_bucket() -> None:
    rng = np.random.default_rng(3)
    values = rng.lognormal(1, 0.8, 20000)
    h = stats.histogram(values)
    width = 10 ** (1 / stats.HIST_PER_DECADE) - 1  # relative bucket width
    for q in (10, 50, 90, 99, 99.9):
        exact = float(np.percentile(values, q))
        assert stats.histogram_quantile(h, q) == pytest.approx(exact, rel=width)
    assert stats.histogram_quantile(h, 0) == values.min()
    assert stats.histogram_quantile(h, 100) == values.max()


# ----------------------------------------------------------------------------- stability

P99_RULE = stats.stability_keys("p99")


def _series(throughputs: list[float], p99s: list[float]) -> list[dict[str, float]]:
    return [{"throughput_infer_per_s": t, "p99_ms": p} for t, p in zip(throughputs, p99s, strict=True)]


def test_default_rule_is_throughput_and_mean_latency() -> None:
    """perf_analyzer's rule: a tail that wobbles while throughput and mean latency hold is stable; under
    the p99 rule it is not."""
    w = [{"throughput_infer_per_s": 1000.0, "mean_ms": 2.0, "p99_ms": p} for p in (5.0, 9.0, 5.0)]
    assert stats.stability_keys("mean") == ("throughput_infer_per_s", "mean_ms")
    assert stats.is_stable(w, 3, 10.0)
    assert not stats.is_stable(w, 3, 10.0, P99_RULE)
    w[1]["mean_ms"] = 2.5
    assert not stats.is_stable(w, 3, 10.0)


def test_stable_series() -> None:
    w = _series([1000, 1010, 995, 1003], [5.0, 5.1, 4.9, 5.05])
    assert stats.is_stable(w, 3, 5.0, P99_RULE)
    assert stats.stable_since(w, 3, 5.0, P99_RULE) == 3


def test_unstable_series_throughput_or_p99() -> None:
    assert not stats.is_stable(_series([1000, 1300, 700, 1000], [5, 5, 5, 5]), 3, 10.0, P99_RULE)
    assert not stats.is_stable(_series([1000, 1000, 1000], [5, 9, 5]), 3, 10.0, P99_RULE)  # p99 alone disagrees
    assert stats.stable_since(_series([1000, 1300, 700, 1000, 1250], [5] * 5), 3, 10.0, P99_RULE) is None


def test_stabilizing_late() -> None:
    w = _series([400, 700, 900, 1000, 990, 1005, 1002], [20, 12, 8, 5.0, 5.1, 5.0, 4.95])
    assert not stats.is_stable(w[:5], 3, 5.0, P99_RULE)
    assert stats.is_stable(w, 3, 5.0, P99_RULE)
    assert stats.stable_since(w, 3, 5.0, P99_RULE) == 6


def test_stability_edge_cases() -> None:
    assert not stats.is_stable(_series([1000, 1000], [5, 5]), 3, 10.0, P99_RULE)  # too few windows
    assert not stats.is_stable([{"throughput_infer_per_s": 0.0, "p99_ms": None}] * 3, 3, 10.0, P99_RULE)
    assert not stats.is_stable(_series([0, 0, 0], [1, 1, 1]), 3, 10.0, P99_RULE)  # nothing completed
    assert stats.is_stable(_series([100], [2]), 1, 1.0, P99_RULE)
    with pytest.raises(ValueError):
        stats.is_stable([], 0, 10.0)


# ----------------------------------------------------------------------------- planning

def window_lengths(settings: MeasurementSettings, extendable: bool = True) -> tuple[float, ...]:
    return WindowPlan.of(settings, extendable=extendable).lengths_s


def test_window_lengths() -> None:
    assert window_lengths(MeasurementSettings(window_s=2, max_windows=4)) == (2, 2, 2, 2)
    assert window_lengths(MeasurementSettings(window_s=1, duration_s=3)) == (1, 1, 1)
    assert window_lengths(MeasurementSettings(window_s=1, duration_s=2.5)) == (1, 1, 0.5)
    assert window_lengths(MeasurementSettings(window_s=5, duration_s=2)) == (2,)


def test_window_plan_for_a_client_that_cannot_stop_early() -> None:
    """A fixed plan runs ``min_windows`` (or ``duration_s``) and its metrics use every window; one that runs
    until stable uses the last ``min_windows``."""
    fixed = WindowPlan.of(MeasurementSettings(warmup_s=0.5, window_s=1, min_windows=3, max_windows=9), extendable=False)
    assert fixed.lengths_s == (1, 1, 1) and fixed.span_s == 3.5 and fixed.edges_s() == (0.5, 1.5, 2.5, 3.5)
    assert fixed.metric_windows(3) == slice(0, 3)
    extendable = WindowPlan.of(MeasurementSettings(window_s=1, min_windows=3, max_windows=9))
    assert len(extendable.lengths_s) == 9 and extendable.metric_windows(5) == slice(2, 5)
    assert window_lengths(MeasurementSettings(window_s=1, duration_s=2.5), extendable=False) == (1, 1, 0.5)


def test_split_work() -> None:
    assert ClosedLoop(5).split(2) == [ClosedLoop(3), ClosedLoop(2)]
    assert ClosedLoop(1).split(4) == [ClosedLoop(1)]  # cannot split one outstanding request
    plan = ConstantRate(300.0).split(3)
    assert [p.rate for p in plan] == pytest.approx([100.0] * 3)
    assert [p.phase_s for p in plan] == pytest.approx([0, 1 / 300, 2 / 300])  # type: ignore[attr-defined]
    assert all(type(p) is PoissonRate for p in PoissonRate(300.0).split(2))


def test_patterns_from_load_levels() -> None:
    """One pattern per load level, each with its send schedule."""
    closed = pattern_of(levels.ClosedLoop(concurrency=4))
    assert closed == ClosedLoop(4) and closed.rate is None and closed.late_pct(10, 1) is None
    assert closed.outstanding(3) == 1 and closed.max_processes(8) == 4
    poisson = pattern_of(levels.PoissonRate(rate=200))
    assert poisson == PoissonRate(200) and poisson.late_pct(10, 1) == 10.0 and poisson.outstanding(1) is None
    times = ConstantRate(100.0, phase_s=0.005).send_times(10.0, seed=0)
    assert [next(times) for _ in range(3)] == pytest.approx([10.005, 10.015, 10.025])
    arrivals = PoissonRate(1000.0).send_times(0.0, seed=1)
    gaps = np.diff([0.0, *(next(arrivals) for _ in range(5000))])
    assert gaps.min() > 0 and gaps.mean() == pytest.approx(1e-3, rel=0.1)


def test_auto_process_cap() -> None:
    assert auto_process_cap(2) == 1
    assert auto_process_cap(16) == 8
    assert auto_process_cap(64) == 8
    assert auto_process_cap(1) == 1


# ----------------------------------------------------------------------------- requests

@pytest.mark.parametrize("dtype", sorted(V2_NUMPY))
def test_random_tensor_dtype_and_shape(dtype: str) -> None:
    spec = TensorSpec(name="x", dtype=dtype, shape=(3, 2))
    a = random_tensor(spec, 4)
    assert a.shape == (4, 3, 2) and a.dtype == V2_NUMPY[dtype]
    assert np.array_equal(a, random_tensor(spec, 4))  # same seed, same data


def test_serialized_request_round_trips() -> None:
    inputs = [TensorSpec(name="a", shape=(8,)), TensorSpec(name="ids", dtype="INT64", shape=(2, 3))]
    raw = serialized_request("m", inputs, 5)
    req = pb.ModelInferRequest.FromString(raw)
    assert req.model_name == "m"
    assert [t.name for t in req.inputs] == ["a", "ids"]
    assert list(req.inputs[1].shape) == [5, 2, 3] and req.inputs[1].datatype == "INT64"
    assert len(req.raw_input_contents[0]) == 5 * 8 * 4
    assert len(req.raw_input_contents[1]) == 5 * 6 * 8
    assert raw == build_request("m", inputs, 5).SerializeToString()
    with pytest.raises(ValueError):
        build_request("m", [], 1)


@pytest.mark.parametrize("request_id", ["0", "12345", "x" * 200, "ünï"])
def test_with_id_sets_the_id_without_reencoding(request_id: str) -> None:
    raw = serialized_request("m", [TensorSpec(name="a", shape=(4,))], 2)
    tagged = with_id(raw, request_id)
    assert tagged.startswith(raw)
    want = pb.ModelInferRequest.FromString(raw)
    want.id = request_id
    assert pb.ModelInferRequest.FromString(tagged) == want
    assert pb.ModelInferRequest.FromString(with_id(tagged, "again")).id == "again"  # the last one wins


@pytest.mark.parametrize(("text", "name"), [
    ("INVALID_ARGUMENT: unknown input 'z'", "INVALID_ARGUMENT"),  # farm's server
    ("UNAVAILABLE:server is shutting down", "UNAVAILABLE"),
    ("Error: not a status", "STREAM_ERROR"),
    ("Request for unknown model: 'x' is not found", "STREAM_ERROR"),  # Triton: bare text
    ("", "STREAM_ERROR"),
])
def test_stream_error_names(text: str, name: str) -> None:
    assert _stream_error_name(text) == name


def test_escalation_rule() -> None:
    busy = WarmupReport(ok=1000, errors={}, busy_pct=95.0, late=0, sent=1000)
    calm = WarmupReport(ok=1000, errors={}, busy_pct=30.0, late=0, sent=1000)
    lagging = WarmupReport(ok=1000, errors={}, busy_pct=50.0, late=200, sent=1000)
    busier = dataclasses.replace(busy, busy_pct=190.0)
    assert escalation([busy], ClosedLoop(16), cap=8) == 2
    assert escalation([busier], ClosedLoop(16), cap=8) == 4
    assert escalation([busier], ClosedLoop(3), cap=8) == 3  # never above concurrency
    assert escalation([busy], ClosedLoop(1), cap=8) is None  # one outstanding request cannot be split
    assert escalation([busy], ClosedLoop(16), cap=1) is None  # not allowed to (e.g. a 2-core machine)
    assert escalation([calm], ConstantRate(100.0), cap=8) is None
    assert escalation([lagging], PoissonRate(100.0), cap=8) == 2  # open loop: late sends trigger it too
    assert escalation([lagging], ClosedLoop(4), cap=8) is None
    assert escalation([busy, busy], ClosedLoop(16), cap=8) is None  # already spread


def test_messages_survive_the_process_pipe() -> None:
    """Worker processes send these pickled; a window's arrays and counts must come back equal."""
    import pickle

    from workers.loadgen.kserve.messages import Go, Ready, Samples, Stop, WindowReport, WorkerDone, WorkerError

    samples = Samples(lat_ms=np.array([1.0, 2.5]), queue_ms=np.array([0.1]), compute_ms=np.array([]),
                      errors={"UNAVAILABLE": 2}, sent=4, late=1)
    window = WindowReport(k=3, t0=1.0, t1=2.0, samples=samples, cpu_s=0.2, wall_s=1.0, first_error="x")
    back = pickle.loads(pickle.dumps(window))
    assert np.array_equal(back.samples.lat_ms, samples.lat_ms) and back.samples.errors == samples.errors
    assert (back.k, back.cpu_s, back.first_error) == (3, 0.2, "x")
    for msg in (Ready(), Go(12.5), Stop(), WorkerDone(None), WorkerError("boom")):
        assert pickle.loads(pickle.dumps(msg)) == msg


def test_latency_metrics_maps_latencies_to_metric_names() -> None:
    lat = [4.0, 1.0, 2.0, 3.0]
    m = stats.latency_metrics(lat, batch_size=8, duration_s=2.0)
    assert m["requests_per_s"] == 2.0 and m["throughput_infer_per_s"] == 16.0
    assert m["latency_p50_ms"] == pytest.approx(np.percentile(lat, 50)) and m["latency_max_ms"] == 4.0
    assert m["latency_mean_ms"] == 2.5 and m["latency_std_ms"] == pytest.approx(np.std(lat))
    assert set(m) <= set(BY_NAME)
