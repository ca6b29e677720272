"""A newcomer's first hour (issue 28): live headlines, 80-column tables, follow-ups, exports, help texts."""
from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path

import pytest

from farm.cli.live import eta_text
from farm.cli.views import TABLE_METRICS, headline, parse_columns, results_table
from farm.errors import RequestError
from schemas.metrics import BY_NAME
from tests.helpers import FAST, farm, farm_env

NARROW = {"COLUMNS": "80"}


def test_eta_uses_the_median_measured_job_time_and_the_jobs_running_at_once() -> None:
    assert eta_text([], 3) == "ETA ?" and eta_text([5.0], 0) == ""
    assert eta_text([4.0, 6.0, 100.0], 10) == "ETA 1:00"  # median 6 s x 10 jobs
    assert eta_text([6.0], 10, parallel=2) == "ETA 0:30"


def test_columns_take_metric_names_or_labels_and_refuse_others() -> None:
    assert parse_columns("infer/s, P99 ms,latency_p90_ms") == (
        "throughput_infer_per_s", "latency_p99_ms", "latency_p90_ms")
    with pytest.raises(RequestError, match="'bogus' is neither"):
        parse_columns("infer/s,bogus")


def _row(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {"job_id": "abcdef123456", "device": "cpu", "engine": "onnxruntime", "batch_size": 1,
                               "concurrency": 4, "rate": None, "edge_profile": None, "status": "succeeded",
                               "error": None, "throughput_infer_per_s": 1537.2, "latency_p50_ms": 0.505,
                               "latency_p99_ms": 4.45, "stable": True, "windows": 3}
    return {**base, **kw}


def test_headline_says_the_figures_and_stable_or_why_not() -> None:
    assert headline(_row()).plain == "✓ abcdef cpu onnxruntime 1x4  1,537 infer/s  p50 0.505 ms  p99 4.45 ms  stable"
    assert headline(_row(stable=False, windows=10)).plain.endswith("unstable after 10 windows")
    assert "host busy 40%" in headline(_row(foreign_cpu_pct=40.0)).plain
    failed = headline(_row(status="failed", error="server did not start\nin 60 s")).plain
    assert failed == "✗ abcdef cpu onnxruntime 1x4  failed: server did not start in 60 s"


def test_an_llm_rows_headline_says_tokens_per_second_and_its_token_latencies() -> None:
    """The headline picks its metrics as the results table does: an LLM row (the OpenAI client's) its own."""
    row = _row(engine="llama.cpp", throughput_infer_per_s=None, output_tokens_per_s=1200.0, ttft_p50_ms=7.3,
               itl_p50_ms=0.45)
    assert headline(row).plain == "✓ abcdef cpu llama.cpp 1x4  1,200 tok/s  ttft50 7.3 ms  itl50 0.45 ms  stable"


def test_the_default_table_is_labelled_and_the_wide_one_has_more() -> None:
    narrow = [c.header for c in results_table([_row()]).columns]
    assert narrow == ["job", "device", "engine", "b x c", *(BY_NAME[m].label for m in TABLE_METRICS)]
    wide = [c.header for c in results_table([_row(cpu_pct_avg=80.0)], wide=True).columns]
    assert {"serving", "edge", "client", "status", "CPU %"} <= set(wide) and "GPU %" not in wide  # measured only


@pytest.mark.slow
def test_submit_prints_live_headlines_an_80_column_table_and_next_steps(tmp_path: Path) -> None:
    """A real embedded run at COLUMNS=80: a headline per job as it finishes, the results table with every
    headline metric uncut, the quick search's answer, the ``next:`` hint; then the follow-up commands."""
    model = tmp_path / "convnet.onnx"
    farm("example-model", str(model), "--kind", "convnet")
    env = farm_env(**NARROW)
    out = farm("submit", str(model), "-c", "1,2", "--search", "quick", "--p99", "100000", *FAST, env=env)
    heads = [ln for ln in out.stderr.splitlines() if ln.startswith("✓ ")]
    assert len(heads) == 2 and all("infer/s" in h and "p99" in h for h in heads), out.stderr  # both steps
    assert "job(s) in" in out.stderr and "next: farm report" in out.stderr
    lines = out.stdout.splitlines()
    assert all(len(ln) <= 80 for ln in lines), out.stdout
    header = next(ln for ln in lines if "infer/s" in ln)
    for label in (BY_NAME[m].label for m in TABLE_METRICS):
        assert label in header, header  # every headline metric, uncut
    assert "…" not in out.stdout.split("serving rows")[0]
    assert "search cpu onnxruntime b=1: " in out.stdout and "best c=" in out.stdout  # the search's answer

    status = farm("status", "latest", env=env)
    assert "elapsed" in status.stdout and "succeeded" in status.stdout and "best c=" in status.stdout
    assert all(len(ln) <= 80 for ln in status.stdout.splitlines()), status.stdout
    assert farm("status", "-1", "--json").stdout == farm("status", "latest", "--json").stdout
    jobs = json.loads(farm("status", "-1", "--json").stdout)["jobs"]
    assert len(jobs) == 2 and all(j["started_at"] and j["finished_at"] for j in jobs)
    report = farm("report", "-1", env=env)
    assert "infer/s" in report.stdout and "throughput_infer_per_s" not in report.stdout

    wide = farm("results", "-1", "--wide", env=env).stdout
    assert "windows" in wide and "client" in wide and max(len(ln) for ln in wide.splitlines()) > 80
    assert farm("results", "-1", "-o", "wide", env=env).stdout == wide  # kubectl's spelling
    some = farm("results", "-1", "--columns", "p90 ms,CPU %", env=env).stdout
    assert "p90 ms" in some and "CPU %" in some and "infer/s" not in some


@pytest.mark.slow
def test_exports_have_one_column_set_wherever_they_go(tmp_path: Path) -> None:
    model = tmp_path / "convnet.onnx"
    farm("example-model", str(model), "--kind", "convnet")
    farm("submit", str(model), "--json", *FAST)
    on_stdout = farm("results", "latest", "--format", "csv").stdout
    farm("results", "latest", "--format", "csv", "-o", str(tmp_path / "r.csv"))
    assert (tmp_path / "r.csv").read_text() == on_stdout
    header = next(csv.reader(io.StringIO(on_stdout)))
    assert {"request_id", "model_sha256", "client", "input_data", "throughput_infer_per_s"} <= set(header)
    as_json = json.loads(farm("results", "latest", "--format", "json").stdout)
    assert list(as_json[0]) == header
    farm("results", "latest", "--format", "parquet", "-o", str(tmp_path / "r.parquet"))
    import pyarrow.parquet as pq

    assert pq.read_schema(tmp_path / "r.parquet").names == header
    farm("results", "latest", "--format", "table", "-o", str(tmp_path / "r.txt"))
    assert "infer/s" in (tmp_path / "r.txt").read_text()
    refused = farm("results", "latest", "--format", "parquet", check=False)
    assert refused.returncode == 2 and "-o results.parquet" in refused.stderr


def test_dry_run_prints_the_matrix_and_writes_nothing(example_onnx: Path) -> None:
    home = Path(farm_env()["FARM_HOME"])
    out = farm("submit", str(example_onnx), "-b", "1,2", "-c", "1,4", "--dry-run")
    text = " ".join(out.stderr.split())
    assert "dry run: 4 job(s)" in text and "estimated time" in text and "nothing was written" in text
    assert not (home / "farm.db").exists()
    plan = json.loads(farm("submit", str(example_onnx), "-c", "1,2,4,8", "--search", "quick", "--p99", "50",
                           "--dry-run", "--json").stdout)
    assert len(plan["jobs"]) == 1 and plan["searches"] == 1 and plan["max_steps_per_search"] == 3
    low, high = plan["estimated_s"]
    assert 0 < low <= high
    assert not (home / "farm.db").exists()


def test_request_ids_by_recency_and_unknown_options(example_onnx: Path) -> None:
    missing = farm("status", "-3", check=False)
    assert missing.returncode == 3 and "fewer than 3 request(s)" in missing.stderr
    bad = farm("report", "-x", check=False)
    assert bad.returncode == 2 and "No such option: -x" in bad.stderr


def test_submit_help_shows_defaults_and_no_emoji() -> None:
    text = farm("submit", "--help", env=farm_env(COLUMNS="200")).stdout
    assert "START:END:STEP" in text and "🔚" not in text
    assert "e.g. 1,4,16" not in text and "(default 1)" in text and "(default 10)" in text


def test_compare_of_single_runs_raises_no_runtime_warning() -> None:
    """Two sides of one run each (and a constant sample): the test is skipped or exact, never a scipy warning."""
    from farm.readers.compare import mann_whitney_p

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mann_whitney_p([1.0], [2.0]) == 1.0
        assert mann_whitney_p([5.0, 5.0, 5.0], [5.0, 5.0, 5.0]) == 1.0
        assert mann_whitney_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(0.1)


def test_dockerignore_leaves_user_files_at_the_root_out() -> None:
    lines = (Path(__file__).parents[2] / ".dockerignore").read_text().splitlines()
    assert {"*.onnx", "*.pt", "*.gguf", "*.parquet"} <= set(lines)
    assert not any(ln.startswith(("farm", "workers", "schemas", "**/*.onnx")) for ln in lines)


@pytest.mark.slow
def test_wait_on_a_cluster_prints_headlines_and_the_worker_no_celery_banner(
        cluster_env: dict[str, str], example_onnx: Path, tmp_path: Path) -> None:
    """``submit --wait`` against a real worker (Postgres, Redis, Celery): a headline per job as results land, then
    the table and the hints; the worker's log has farm's own lines, not Celery's banner or SecurityWarning."""
    import signal

    from tests.helpers import start_worker

    env = farm_env(**cluster_env, **NARROW)
    log = tmp_path / "worker.log"
    worker = start_worker(env, "--worker-id", "w-ux", "--runner", "process", log=log)
    try:
        out = farm("submit", str(example_onnx), "-c", "1,2", "--wait", *FAST, env=env)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert len([ln for ln in out.stderr.splitlines() if ln.startswith("✓ ")]) == 2, out.stderr
    assert "next: farm report" in out.stderr and "infer/s" in out.stdout
    text = log.read_text()
    assert "ready." in text and "w-ux" in text  # it ran
    assert "[config]" not in text and "-------------- " not in text  # Celery's banner
    assert "SecurityWarning" not in text and "superuser privileges" not in text


@pytest.mark.slow
def test_an_embedded_run_announces_its_long_steps(sqlite_url: str, example_onnx: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The worker's steps reach whoever listens on ``farm.hooks.job_step`` (the CLI's spinner) in order, and the
    CLI's own handler is gone once the run ends."""
    from farm.cli.main import main
    from farm.hooks import job_step
    from farm.settings import reset_settings

    monkeypatch.setenv("FARM_RUNNER", "process")
    reset_settings()  # the settings may be read already (migrating the test's database opens the model store)
    seen: list[str] = []
    job_step.register(seen.append)
    try:
        main(["submit", str(example_onnx), *FAST])
    finally:
        job_step.unregister(seen.append)
    steps = [s.split(",")[0].split(" (")[0] for s in seen]
    assert steps == ["host yardstick", "starting the onnxruntime server", "measuring b=1 c=1", "host yardstick"], seen
    assert job_step.handlers == ()  # the spinner's handler left with the run
    assert "✓ " in capsys.readouterr().err


def test_the_live_display_shows_a_step_beside_the_job_in_hand() -> None:
    from rich.console import Console

    from farm.cli.live import LiveRun
    from farm.hooks import announce

    buf = io.StringIO()
    with LiveRun(2, console=Console(file=buf, width=80)) as live:
        live.started("job 1/2 cpu onnxruntime 1x1")
        announce("starting the onnxruntime server, loading the model" + " and more" * 10)
        text = live.spinner.text.plain
        live.finished(_row(), 1.5)
        assert live.progress.tasks[0].fields["eta"] == "ETA 0:01"
    assert text.startswith("job 1/2 cpu onnxruntime 1x1: starting") and len(text) <= 76 and text.endswith("…")
    assert "✓ abcdef" in buf.getvalue() and "1 job(s) in" in buf.getvalue()
