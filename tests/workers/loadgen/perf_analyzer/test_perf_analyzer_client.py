"""NVIDIA perf_analyzer as farm's load client (``client="perf_analyzer"``, or ``auto`` where it can) against
farm's server: its per-request export read into farm's windows, histogram and metrics. scripts/test installs it."""
from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from schemas.input_data import DataArray, InputData
from schemas.load_levels import ClosedLoop, ConstantRate, PoissonRate, load_level
from schemas.metrics import BY_NAME
from tests.helpers import gather_model
from tests.workers.loadgen.conftest import serve_subprocess
from workers.loadgen import stats
from workers.loadgen.clients import AUTO, CLIENTS, run_load
from workers.loadgen.contract import LoadJob, LoadSpec, LoadTarget
from workers.loadgen.kserve.request import input_tensor
from workers.loadgen.perf_analyzer.client import PerfAnalyzerClient, data_file, job_command, unfit
from workers.loadgen.perf_analyzer.tool import BINARY_ENV, load_args, missing, shape_args
from workers.loadgen.plan import WindowPlan

INPUTS = [TensorSpec(name="x", shape=(16,))]


def _job(settings: MeasurementSettings, concurrency: int = 1, url: str = "127.0.0.1:1") -> LoadJob:
    return LoadJob(url=url, model_name="m", inputs=tuple(INPUTS), batch_size=1,
                   load=load_level(settings.mode, concurrency, settings.rate), settings=settings)


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
    r = run_load(LoadTarget(farm_server_url, "model"), LoadSpec.from_settings(INPUTS, 2, 2, settings))
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
    x = [TensorSpec(name="x", shape=(128, 128))]
    assert shape_args(x, 8, 64) == ["-b", "8", "--shape", "x:128,128"]
    assert shape_args(x, 8, 0) == ["--shape", "x:8,128,128"]
    with pytest.raises(LoadGenError, match="max_batch_size 4"):
        shape_args(x, 8, 4)


def test_perf_analyzer_client_refuses_streams() -> None:
    settings = MeasurementSettings(client="perf_analyzer", rpc="stream")
    with pytest.raises(LoadGenError, match="unary"):
        run_load(LoadTarget("127.0.0.1:1", "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings))


def test_absent_perf_analyzer_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "perf_analyzer"))
    with pytest.raises(LoadGenError, match="--install"):
        run_load(LoadTarget("127.0.0.1:1", "model"),
                 LoadSpec.from_settings(INPUTS, 1, 1, MeasurementSettings(client="perf_analyzer")))


def test_auto_measures_with_perf_analyzer_where_it_can(farm_server_url: str, perf_analyzer: None) -> None:
    """The default client (auto) hands a unary job of random or zero float data to perf_analyzer; zeros go
    to it as ``--input-data zero`` and the result records the data it sent."""
    settings = MeasurementSettings(window_s=0.3, duration_s=0.9)
    assert settings.client == "auto"
    r = run_load(LoadTarget(farm_server_url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings))
    assert r.details["client"] == "perf_analyzer" and r.metrics["requests_per_s"] > 0
    assert r.details["input_data"] == {"kind": "random"}
    z = run_load(LoadTarget(farm_server_url, "model"),
                 LoadSpec.from_settings(INPUTS, 1, 1, settings, data=InputData(kind="zeros")))
    assert z.details["client"] == "perf_analyzer" and "--input-data zero" in z.details["command"]
    assert z.details["input_data"] == {"kind": "zeros"}


def test_auto_falls_back_to_farms_generator_and_says_why(farm_server_url: str) -> None:
    """A job perf_analyzer cannot send as farm specifies it (here: streams) is measured by farm's own
    generator under auto, with the reason in the notes; asked for by name, perf_analyzer refuses it."""
    settings = MeasurementSettings(rpc="stream", warmup_s=0.1, window_s=0.3, min_windows=2, max_windows=2)
    r = run_load(LoadTarget(farm_server_url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings))
    assert r.details["client"] == "farm" and r.metrics["requests_per_s"] > 0
    assert any("not perf_analyzer: it sends unary calls only" in n for n in r.details["notes"]), r.details["notes"]
    with pytest.raises(LoadGenError, match="cannot measure this job: it sends unary calls only.*; use --client farm$"):
        run_load(LoadTarget(farm_server_url, "model"),
                 LoadSpec.from_settings(INPUTS, 1, 1, settings.model_copy(update={"client": "perf_analyzer"})))


def test_what_perf_analyzer_cannot_send() -> None:
    """Streams stay with farm's generator; any data farm sends, perf_analyzer sends too (``data_file``)."""
    assert unfit("unary") is None
    assert "streams" in (unfit("stream") or "")
    assert "unary calls only" in (PerfAnalyzerClient().why_not(_job(MeasurementSettings(rpc="stream"))) or "")
    assert CLIENTS["farm"]().why_not(_job(MeasurementSettings(rpc="stream"))) is None  # farm's sends anything
    assert AUTO == ("perf_analyzer", "farm")  # auto: perf_analyzer where it can, else farm's generator


@pytest.mark.parametrize("max_batch", [8, 0])
def test_data_file_holds_farms_own_tensors(tmp_path: Path, max_batch: int) -> None:
    """perf_analyzer's input data is what farm's generator sends: index-safe random integers, values in a
    given range, a data file's rows in turn (one entry per row where the model batches, else one per
    request); zeros as perf_analyzer's own ``zero``."""
    ids = TensorSpec(name="ids", shape=(3,), dtype="INT64")
    x = TensorSpec(name="x", shape=(2,), value_range=(-5.0, -4.0))
    path = tmp_path / "in.json"
    assert data_file(path, [ids, x], 2, max_batch, InputData(kind="zeros")) == ["--input-data", "zero"]
    assert data_file(path, [ids, x], 2, max_batch, None, seed=7) == ["--input-data", str(path)]
    (sent,) = _entries(path, max_batch)  # random data: one request, sent again and again
    assert np.array_equal(sent["ids"], input_tensor(ids, 2, None, seed=7))
    assert np.array_equal(sent["x"], input_tensor(x, 2, None, seed=8))
    assert sent["ids"].min() >= 0 and sent["ids"].max() <= 99 and sent["x"].max() < -4.0
    rows = np.arange(5 * 3, dtype=np.int64).reshape(5, 3)
    arr = DataArray(dtype="INT64", shape=(5, 3), b64=base64.b64encode(rows.tobytes()).decode())
    file_data = InputData(kind="file", source="d.npz", arrays={"ids": arr})
    data_file(path, [ids], 2, max_batch, file_data)
    got = np.concatenate([e["ids"] for e in _entries(path, max_batch)])
    assert (got[:5] == rows).all() and (got[5] == rows[0]).all()  # 5 rows in turn, cycled to fill 3 batches of 2


def _entries(path: Path, max_batch: int) -> list[dict[str, np.ndarray]]:
    """The requests a perf_analyzer data file holds, each input as [batch, ...] (rows regrouped in twos
    where the model batches: the batch of 2 these tests use)."""
    raw = json.loads(path.read_text())["data"]
    arrays = [{n: np.frombuffer(base64.b64decode(v["content"]["b64"]), dtype=np.int64 if n == "ids" else np.float32)
               .reshape(v["shape"]) for n, v in e.items()} for e in raw]
    if max_batch == 0:
        return arrays
    return [{n: np.stack([arrays[i][n], arrays[i + 1][n]]) for n in arrays[i]} for i in range(0, len(arrays), 2)]


@pytest.fixture(scope="module")
def gather_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """farm's server serving an embedding lookup of 100 rows named ``model``: ids outside 0..99 fail."""
    model = gather_model(tmp_path_factory.mktemp("gather") / "gather.onnx", rows=100, width=4, seq=8)
    cmd = [sys.executable, "-m", "workers.engines.server", str(model), "--format", "onnx", "--engine",
           "onnxruntime", "--host", "127.0.0.1", "--port", "0", "--threads", "1", "--model-name", "model"]
    with serve_subprocess(cmd, "farm-serve listening") as url:
        yield url


def test_auto_sends_index_safe_integers_with_perf_analyzer(gather_url: str, perf_analyzer: None) -> None:
    """An INT64 id input (a BERT's input_ids, an embedding lookup) goes to perf_analyzer with farm's own
    index-safe values: every request succeeds, where perf_analyzer's own random integers would index past
    the table; the warm-up is cut off and farm's windows follow it."""
    settings = MeasurementSettings(warmup_s=0.4, window_s=0.3, min_windows=3, max_windows=5)
    r = run_load(LoadTarget(gather_url, "model"),
                 LoadSpec.from_settings([TensorSpec(name="ids", shape=(8,), dtype="INT64")], 4, 2, settings))
    d, m = r.details, r.metrics
    assert d["client"] == "perf_analyzer" and "--input-data" in d["command"], d["notes"]
    assert m["error_count"] == 0 and m["requests_per_s"] > 0
    assert m["windows"] == 3 and [w["k"] for w in d["windows"]] == [0, 1, 2]
    assert [w["length_s"] for w in d["windows"]] == pytest.approx([0.3] * 3)
    assert d["warmup_requests"] > 0 and d["windows"][0]["t_s"] == 0.0
    assert m["duration_s"] == pytest.approx(0.9)


def test_auto_falls_back_when_perf_analyzer_fails(farm_server_url: str, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """A perf_analyzer that starts but fails its run: under auto farm's generator measures and the notes
    say why; asked for by name, the failure is the job's error."""
    fake = tmp_path / "perf_analyzer"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'error: Failed to init manager inputs' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(BINARY_ENV, str(fake))
    settings = MeasurementSettings(warmup_s=0.1, window_s=0.3, min_windows=2, max_windows=2)
    r = run_load(LoadTarget(farm_server_url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings))
    assert r.details["client"] == "farm" and r.metrics["requests_per_s"] > 0
    assert any("perf_analyzer failed" in n and "Failed to init manager inputs" in n for n in r.details["notes"])
    with pytest.raises(LoadGenError, match="measured nothing"):
        run_load(LoadTarget(farm_server_url, "model"),
                 LoadSpec.from_settings(INPUTS, 1, 1, settings.model_copy(update={"client": "perf_analyzer"})))


def test_absent_perf_analyzer_leaves_auto_to_farm(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "perf_analyzer"))
    client = PerfAnalyzerClient()
    why = client.why_not(_job(MeasurementSettings()))
    assert client.max_batch is None and why is not None and "--install" in why


def test_client_cost_is_flagged_in_closed_loop() -> None:
    """A client busy for more than 5 % of each outstanding request's cycle is flagged with its share."""
    note = stats.client_share_note(40.0, 1, "farm's generator")
    assert note is not None and "40 % busy at concurrency 1" in note and "up to about 40 %" in note
    assert "a lighter client (--client perf_analyzer)" in note
    pa_note = stats.client_share_note(40.0, 1, "perf_analyzer")
    assert pa_note is not None and "lighter client" not in pa_note and "a higher concurrency" in pa_note
    assert stats.client_share_note(40.0, 16, "farm's generator") is None  # 2.5 % each
    assert stats.client_share_note(40.0, None, "farm's generator") is None  # open loop: late sends flag it


def test_open_loop_uses_the_async_api_and_spans_warmup_and_windows(tmp_path: Path) -> None:
    """Open loop runs perf_analyzer's async API (its sync API delays sends in a burst, which hides the
    queueing); closed loop its sync API. Its three windows cover farm's warm-up and windows together."""
    closed = MeasurementSettings(warmup_s=0.5, window_s=1.0, min_windows=3)
    opened = MeasurementSettings(mode="poisson", rate=200, warmup_s=0.5, window_s=1.0, duration_s=4.0)
    c = job_command(_job(closed, 2), WindowPlan.of(closed, extendable=False), tmp_path / "e", tmp_path / "t")
    o = job_command(_job(opened), WindowPlan.of(opened, extendable=False), tmp_path / "e", tmp_path / "t")
    assert "--async" not in c and c[-2:] == ["--concurrency-range", "2"]
    assert "--async" in o and o[-4:] == ["--request-rate-range", "200", "--request-distribution", "poisson"]
    assert c[c.index("--measurement-interval") + 1] == "1167"  # (0.5 + 3 x 1.0) / 3 s
    assert o[o.index("--measurement-interval") + 1] == "1500"  # (0.5 + 4.0) / 3 s


def test_perf_analyzer_translates_the_load_level_into_its_options() -> None:
    """Its sync API for a closed loop, its async API for an open loop, unless forced."""
    assert load_args(ClosedLoop(concurrency=4)) == ["--concurrency-range", "4"]
    assert load_args(ClosedLoop(concurrency=4), async_api=True) == ["--async", "--concurrency-range", "4"]
    assert load_args(PoissonRate(rate=200)) == ["--async", "--request-rate-range", "200", "--request-distribution",
                                                "poisson"]
    assert load_args(ConstantRate(rate=12.5), async_api=False) == ["--request-rate-range", "12.5",
                                                                   "--request-distribution", "constant"]
