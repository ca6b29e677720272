"""Triton Model Analyzer (PyPI ``triton-model-analyzer``) drives ``farm serve`` in its remote mode: it
loads the model (RepositoryModelLoad with its config), measures it with perf_analyzer (which reads the
``/metrics`` endpoint), unloads it, and writes its CSV and HTML reports.

Model Analyzer lives in its own virtual environment (``scripts/test`` makes it at
``~/.cache/farm/model-analyzer``, or ``$FARM_MODEL_ANALYZER`` names its executable): its pins (optuna,
numba, a PyPI ``perf_analyzer`` package) stay out of farm's environment."""
from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest

from tests.workers.engines.test_engine_repository import _free_port, farm_serve
from workers.loadgen.perf_analyzer import tool as pa

pytestmark = pytest.mark.slow

MODEL_ANALYZER = Path(os.environ.get("FARM_MODEL_ANALYZER")
                      or Path.home() / ".cache/farm/model-analyzer/bin/model-analyzer")


def test_model_analyzer_profiles_farm_serve_in_remote_mode(mlp_onnx: Path, tmp_path: Path) -> None:
    if not MODEL_ANALYZER.exists():
        pytest.skip(f"Model Analyzer is not installed at {MODEL_ANALYZER} (scripts/test installs it)")
    if pa.missing():
        pytest.skip(pa.missing() or "")
    metrics_port = _free_port()
    (tmp_path / "repo").mkdir()
    export = tmp_path / "export"
    with farm_serve(mlp_onnx, "--metrics-port", str(metrics_port)) as url:
        env = pa.env()
        env["PATH"] = os.pathsep.join([str(pa.binary().parent), env.get("PATH", "")])
        done = subprocess.run(
            [str(MODEL_ANALYZER), "profile", "--triton-launch-mode", "remote", "--client-protocol", "grpc",
             "--triton-grpc-endpoint", url, "--triton-metrics-url", f"http://127.0.0.1:{metrics_port}/metrics",
             "--model-repository", str(tmp_path / "repo"), "--profile-models", "mlp",
             "--output-model-repository-path", str(tmp_path / "out"), "--override-output-model-repository",
             "--checkpoint-directory", str(tmp_path / "ckpt"), "--export-path", str(export),
             "--run-config-search-disable", "--concurrency", "1,2", "--batch-sizes", "1"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
        )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "load failed" not in log and "UNIMPLEMENTED" not in log
    with open(export / "results" / "metrics-model-inference.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("Model") == "mlp"]
    assert sorted(int(r["Concurrency"]) for r in rows) == [1, 2]
    for r in rows:
        assert r["Instance Group"] == "1:CPU" and int(r["Max Batch Size"]) == 64
        assert float(r["Throughput (infer/sec)"]) > 0 and float(r["p99 Latency (ms)"]) > 0
    assert (export / "reports" / "summaries" / "mlp" / "result_summary.html").stat().st_size > 0
    assert any((export / "reports" / "detailed").glob("*/detailed_report.html"))
