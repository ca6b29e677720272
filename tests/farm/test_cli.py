"""The front door, as a user meets it: the embedded default and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import FAST, farm, farm_env


@pytest.mark.slow
def test_embedded_default_runs_jobs_in_process_and_prints_results(tmp_path: Path) -> None:
    model = tmp_path / "convnet.onnx"
    farm("example-model", str(model), "--kind", "convnet")
    out = farm("submit", str(model), "--batch-sizes", "1,2", *FAST)
    assert "embedded mode" in out.stderr and "2 jobs" in out.stderr
    assert out.stderr.count("✓ ") == 2, out.stdout + out.stderr  # a headline per job as it finished
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]
    assert all(r["throughput_infer_per_s"] > 0 and r["latency_p99_ms"] > 0 for r in rows)
    csv = farm("results", rid, "--format", "csv").stdout.splitlines()
    assert csv[0].startswith("request_id,model,model_sha256,job_id,device,engine") and len(csv) == 3  # as with -o
    assert (Path(farm_env()["FARM_HOME"]) / "farm.db").is_file()
    rep = json.loads(farm("report", rid, "--p99", "100000", "--json").stdout)
    assert len(rep["ranked"]) == 2 and rep["constraints"] == ["latency_p99_ms <= 100000"]
    tputs = [r["throughput_infer_per_s"] for r in rep["ranked"]]
    assert tputs == sorted(tputs, reverse=True)
    assert rep["model"]["macs_per_sample"] > 0  # static metrics stored once with the artifact


@pytest.mark.slow
def test_embedded_quick_search_runs_its_steps_and_status_shows_it(example_onnx: Path) -> None:
    """``--search quick --p99``: the embedded loop runs the steps the scheduler adds as results land (a
    bisection over 1,2,4 starts at 2); status says where each serving configuration's search ended."""
    out = farm("submit", str(example_onnx), "-c", "1,2,4", "--instances", "1,2", "--search", "quick",
               "--p99", "100000", *FAST)
    assert "2 jobs" in out.stderr, out.stderr
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    status = json.loads(farm("status", rid, "--json").stdout)
    assert [s["config"]["instances"] for s in status["searches"]] in ([1, 2], [2, 1])
    for search in status["searches"]:
        assert search["done"] and search["measured"] == [2, 4]  # within the budget at 2, then at 4: the top
        assert search["best"]["concurrency"] in (2, 4)
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    assert sorted((r["instances"], r["concurrency"]) for r in rows) == [(1, 2), (1, 4), (2, 2), (2, 4)]
    assert "search cpu onnxruntime b=1 i=2: stopped" in farm("status", rid).stdout


@pytest.mark.slow
def test_embedded_open_loop_quick_search_bisects_the_rates(example_onnx: Path) -> None:
    """``--mode poisson --rate 50:150:50 --search quick --p99``: the scheduler bisects the three rates (two
    steps, whatever their p99: the middle one, then one side); results keep each rate as a coordinate and
    ``farm status`` shows the search in rates."""
    out = farm("submit", str(example_onnx), "--mode", "poisson", "--rate", "50:150:50", "--search", "quick",
               "--p99", "100000", "--windows", "3", "--window", "0.25", "--warmup", "0.2")
    assert "1 jobs" in out.stderr, out.stderr
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    (search,) = json.loads(farm("status", rid, "--json").stdout)["searches"]
    assert search["load"] == "rate" and search["done"]
    assert 100.0 in search["measured"] and len(search["measured"]) == 2 < 3  # fewer jobs than rates
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    assert sorted(r["rate"] for r in rows) == search["measured"] and len({r["job_id"] for r in rows}) == 2
    assert all(r["status"] == "succeeded" and r["throughput_infer_per_s"] > 0 for r in rows)
    status = farm("status", rid).stdout
    assert "search cpu onnxruntime b=1: stopped" in status and "rate=" in status and "c=" not in status
    rep = json.loads(farm("report", rid, "--json").stdout)  # client-limited steps (a busy host) are left out
    assert sorted(r["rate"] for r in rep["ranked"] + rep["rejected"]) == search["measured"]


def test_rate_lists_and_ranges_from_the_command_line() -> None:
    """``--rate`` takes one rate, a list or START:END:STEP; it replaces a request file's rates and rate."""
    from farm.cli.request_options import build_request_dict, parse_rates
    from schemas import ProfileRequest

    assert parse_rates("100") == [100.0] and parse_rates("50, 100") == [50.0, 100.0]
    assert parse_rates("50:200:50") == [50.0, 100.0, 150.0, 200.0] and parse_rates("0.1:0.3:0.1") == [0.1, 0.2, 0.3]
    assert parse_rates("10,50:120:50") == [10.0, 50.0, 100.0]  # the end is kept only when a step reaches it
    base = {"model": "m.onnx", "rates": [7], "measurement": {"rate": 7, "window_s": 0.5}}
    data = build_request_dict(base, None, None, None, None, None, None, None, None, None,
                              {"rate": "50:100:50", "mode": "poisson"})
    req = ProfileRequest.model_validate(data)
    assert req.rates == [50.0, 100.0] and req.rate_levels() == [50.0, 100.0]
    assert req.measurement.mode == "poisson" and req.measurement.window_s == 0.5
    kept = build_request_dict({"model": "m.onnx", "measurement": {"rate": 80}}, None, None, None, None, None,
                              None, None, None, None, {"rate": None})
    assert ProfileRequest.model_validate(kept).rate_levels() == [80.0]


JSON_FIELDS = ("requests_per_s", "latency_mean_ms", "latency_p90_ms", "latency_p999_ms", "latency_max_ms",
               "server_compute_p50_ms", "server_compute_p99_ms", "stable", "windows", "gpu_mem_peak_bytes",
               "gpu_util_avg_pct", "gpu_power_avg_w", "cpu_pct_avg", "mem_peak_bytes", "rpc", "cpu_steal_pct")


def test_stream_rpc_request_runs_and_says_so(tmp_path: Path) -> None:
    """``--rpc stream``: the jobs are measured over ModelStreamInfer and every result row says so."""
    model = tmp_path / "demo.onnx"
    farm("example-model", str(model))
    farm("submit", str(model), "--concurrency", "2", "--rpc", "stream", *FAST)
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    assert len(rows) == 1 and rows[0]["status"] == "succeeded", rows
    row = rows[0]
    assert set(JSON_FIELDS) <= set(row)
    assert row["rpc"] == "stream" and row["requests_per_s"] > 0 and row["error_count"] == 0
    assert row["server_compute_p50_ms"] is not None and row["server_compute_p50_ms"] <= row["latency_p50_ms"]
    assert row["gpu_mem_peak_bytes"] is None  # not measured on a CPU job: null, never 0
    assert 0 <= row["cpu_steal_pct"] <= 100  # what the hypervisor took meanwhile (Linux reports it)
    assert row["host"] and row["server_cpus"] and row["loadgen_cpus"] and row["slot"] == 0  # where it ran
    assert row["isolated"] is True  # its cores were its own (other jobs on this host may have run beside it)
    assert "ModelStreamInfer" in farm("results", rid).stdout


def test_perf_analyzer_client_request_runs_and_says_so(tmp_path: Path) -> None:
    """The default client (auto) where perf_analyzer is installed: NVIDIA perf_analyzer sends the load, farm
    reads it; each row names the client that measured it, and the table says so."""
    from workers.loadgen.perf_analyzer.tool import missing

    if why := missing():
        pytest.skip(why)
    model = tmp_path / "demo.onnx"
    farm("example-model", str(model))
    farm("submit", str(model), *FAST)
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    assert len(rows) == 1 and rows[0]["status"] == "succeeded", rows[0]["error"]
    row = rows[0]
    assert row["client"] == "perf_analyzer" and row["rpc"] == "unary" and row["requests_per_s"] > 0
    assert row["latency_p50_ms"] is not None and row["latency_p50_ms"] <= row["latency_p99_ms"]
    assert row["loadgen_cpus"] and row["server_cpus"]
    assert "perf_analyzer" in farm("results", rid).stdout


def test_results_merge_repeats_of_two_requests(tmp_path: Path) -> None:
    """Two requests of the same matrix read as one: each metric combined by its declared aggregation."""
    model = tmp_path / "demo.onnx"
    farm("example-model", str(model))
    for _ in range(2):
        farm("submit", str(model), *FAST)
    rids = [r["request_id"] for r in json.loads(farm("status", "--json").stdout)[:2]]
    runs = [json.loads(farm("results", rid, "--format", "json").stdout)[0] for rid in rids]
    rows = json.loads(farm("results", *rids, "--merge-repeats", "--format", "json").stdout)
    assert len(rows) == 1 and rows[0]["repeats"] == 2 and rows[0]["status"] == "succeeded"
    assert rows[0]["windows"] == runs[0]["windows"] + runs[1]["windows"]  # sum
    assert rows[0]["latency_max_ms"] == max(r["latency_max_ms"] for r in runs)  # max
    assert rows[0]["stable"] == (runs[0]["stable"] and runs[1]["stable"])  # all
    assert rows[0]["latency_p50_ms"] == pytest.approx((runs[0]["latency_p50_ms"] + runs[1]["latency_p50_ms"]) / 2)


def test_repeats_run_interleaved_and_results_show_median_and_spread(tmp_path: Path) -> None:
    """``--repeats 2``: every cell runs twice, round by round (not back to back); json lists every run with its
    repeat index, the table one row per cell with its run count and spread."""
    from sqlalchemy import text

    from farm.db.session import get_engine

    model = tmp_path / "demo.onnx"
    farm("example-model", str(model))
    out = farm("submit", str(model), "--batch-sizes", "1,2", "--repeats", "2", *FAST)
    assert "4 jobs" in out.stderr and " n " in out.stdout, out.stdout
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    assert sorted((r["batch_size"], r["repeat"]) for r in rows) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert len({r["job_id"] for r in rows}) == 4 and {r["status"] for r in rows} == {"succeeded"}
    db = f"sqlite:///{Path(farm_env()['FARM_HOME']) / 'farm.db'}"
    with get_engine(db).connect() as conn:
        ran = conn.execute(text("SELECT spec FROM jobs WHERE request_id = :r ORDER BY started_at"), {"r": rid})
        assert [json.loads(spec).get("repeat", 0) for (spec,) in ran] == [0, 0, 1, 1]  # rounds, not back to back
    table = farm("results", rid).stdout
    assert len([ln for ln in table.splitlines() if "x1 " in ln]) == 2  # one row per cell (status: all succeeded)
    assert "±" in table and "n: the succeeded runs of each cell" in table
    verdicts = json.loads(farm("compare", rid, rid, "--json").stdout)["matches"]
    assert {m["verdict"] for m in verdicts} == {"inconclusive"} and all(m["n_a"] == 2 for m in verdicts)


@pytest.mark.parametrize("args,needle", [
    (["submit", "MODEL", "--repeats", "0"], "repeats"),
    (["submit", "MODEL", "--repeats", "21"], "repeats"),
    (["submit", "MODEL", "--repeats", "3", "--search", "quick"], "repeats and a quick search"),
    (["submit", "/nonexistent/model.onnx"], "model"),
    (["submit", "MODEL", "--batch-sizes", "0"], "batch_sizes"),
    (["submit", "MODEL", "--batch-sizes", "a,b"], "--batch-sizes"),
    (["submit", "MODEL", "--engine", "tensorrt"], "engine"),
    (["submit", "MODEL", "--device", "tpu"], "device"),
    (["submit", "MODEL", "--edge", "cpus=1"], "memory"),
    (["submit", "MODEL", "--edge", "cpus=1,memory=lots"], "memory"),
    (["results", "no-such-request"], "no request"),
    (["results", "x", "--format", "xml"], "--format"),
    (["results", "x", "y"], "--merge-repeats"),
    (["submit", "MODEL", "--rpc", "grpc"], "rpc"),
    (["submit", "MODEL", "--instances", "1,two"], "--instances"),
    (["submit", "MODEL", "--threads", "300"], "threads"),
    (["submit", "MODEL", "--max-queue-delay-us", "0,5x"], "--max-queue-delay-us"),
    (["submit", "MODEL", "--search", "fast"], "search"),
    (["submit", "MODEL", "--search", "quick", "--rate", "50,100", "-c", "1,2"], "one concurrency"),
    (["submit", "MODEL", "--rate", "fast"], "--rate"),
    (["submit", "MODEL", "--rate", "50:100"], "--rate"),
    (["submit", "MODEL", "--rate", "200:50:50"], "--rate"),
    (["submit", "MODEL", "--rate", "0,50"], "rates"),
    (["submit", "MODEL", "--p99", "20"], "--search quick"),
])
def test_bad_input_gives_one_line_and_nonzero_exit(args: list[str], needle: str, example_onnx: Path) -> None:
    args = [str(example_onnx) if a == "MODEL" else a for a in args]
    proc = farm(*args, check=False)
    assert proc.returncode != 0
    assert proc.returncode == 2 or "--repeats" not in args  # a usage error
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr
