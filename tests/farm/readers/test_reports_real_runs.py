"""Reports, exports, the view and compare over real measurements: two embedded requests of farm's example
model (real server, real load generator), so what the loaders store is what the readers expect."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from farm.db.session import get_engine
from farm.readers.compare import INCONCLUSIVE
from tests.helpers import FAST, farm, farm_env


@pytest.mark.slow
def test_report_export_view_and_compare_read_what_real_runs_stored(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    model = tmp_path / "demo.onnx"
    farm("example-model", str(model))
    for _ in range(2):
        farm("submit", str(model), "--batch-sizes", "1,2", *FAST)
    new, old = (r["request_id"] for r in json.loads(farm("status", "--json").stdout)[:2])

    rows = {r["job_id"]: r for r in json.loads(farm("results", old, "--format", "json").stdout)}
    farm("results", old, "--format", "parquet", "-o", str(tmp_path / "r.parquet"))
    for r in pq.read_table(tmp_path / "r.parquet").to_pylist():
        assert r["throughput_infer_per_s"] == rows[r["job_id"]]["throughput_infer_per_s"] > 0
        assert r["instances"] == 1 and "over gRPC" in r["measured"]

    db = f"sqlite:///{Path(farm_env()['FARM_HOME']) / 'farm.db'}"
    with get_engine(db).connect() as conn:
        view = conn.execute(text("SELECT job_id, latency_p99_ms, instances, threads FROM job_results "
                                 "WHERE request_id = :r"), {"r": old}).mappings().all()
    assert {v["job_id"]: v["latency_p99_ms"] for v in view} == {j: r["latency_p99_ms"] for j, r in rows.items()}

    farm("report", old, "-o", str(tmp_path / "report.html"))
    page = (tmp_path / "report.html").read_text()
    for fig in ("throughput-p99", "batch", "e2e-compute", "resources", "cdf"):
        assert f'id="plot-{fig}"' in page
    assert all(f'data-job="{j}"' in page for j in rows)

    out = json.loads(farm("compare", old, new, "--json").stdout)
    assert len(out["matches"]) == 2 and out["only_in_a"] == out["only_in_b"] == []
    for m in out["matches"]:
        assert m["verdict"] == INCONCLUSIVE and m["reason"].startswith("n=1")  # one run a side: no verdict
        assert {t["metric"] for t in m["tests"]} == {"throughput_infer_per_s", "latency_p50_ms"}
        assert all(0.0 <= t["p_value"] <= 1.0 for t in m["tests"])
