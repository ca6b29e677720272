"""Op profiles from the front door (issue 26): `farm submit --op-profile`, `farm ops`, `farm compare --ops`, the
SQL view job_ops on both databases, and a failing pass that keeps the job's load figures."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from farm import lifecycle, op_profile
from farm.db.session import get_engine, session_scope
from schemas import JobResult, JobSpec
from schemas.op_profile import OVERHEAD, OpNode, OpProfile
from tests.farm.results_data import seed_request
from tests.helpers import FAST, farm, farm_env


def _jobs(rid: str) -> list[dict[str, Any]]:
    return list(json.loads(farm("results", rid, "--format", "json").stdout))


@pytest.mark.slow
def test_submit_op_profile_then_farm_ops_compare_and_the_trace(tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    farm("example-model", str(model), "--kind", "mlp")
    farm("submit", str(model), "--batch-sizes", "1,4", "--op-profile", "--edge", "cpus=1,memory=512m", *FAST)
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    rows = _jobs(rid)
    assert len(rows) == 4 and all(r["status"] == "succeeded" for r in rows), rows
    assert all(r["throughput_infer_per_s"] > 0 for r in rows)  # the load figures are there, profile or not
    served = sorted((r for r in rows if not r["edge_profile"]), key=lambda r: r["batch_size"])
    edge = next(r for r in rows if r["edge_profile"])
    table = farm("ops", served[0]["job_id"][:10]).stdout
    assert "FusedGemm" in table and OVERHEAD in table and "by op type" in table
    assert max(len(line) for line in table.splitlines()) <= 80, table
    got = json.loads(farm("ops", served[1]["job_id"], "--json").stdout)
    prof = OpProfile.model_validate(got["profile"])
    assert prof.status == "ok" and prof.batch_size == 4 and got["has_trace"]
    assert any("float[4,256]" in n.input_shapes for n in prof.nodes)  # the job's own batch
    csv = farm("ops", served[0]["job_id"], "--csv").stdout.splitlines()
    assert csv[0].startswith("rank,name,op_type") and csv[-1].startswith(f"-1,{OVERHEAD}")
    trace = tmp_path / "trace.json"
    farm("ops", served[0]["job_id"], "--trace", str(trace))
    events = json.loads(trace.read_text())
    assert any(e.get("cat") == "Node" for e in events)  # ORT's own Chrome trace, as Perfetto opens it
    edge_prof = json.loads(farm("ops", edge["job_id"], "--json").stdout)["profile"]
    assert edge_prof["status"] == "ok" and edge_prof["nodes"], edge_prof  # taken inside the edge run's limits
    joined = json.loads(farm("analyze", str(model), "--layers", "--job", served[1]["job_id"], "--json").stdout)
    assert joined["batch_size"] == 4  # the job's batch
    fused = [r for r in joined["layers"] if r["op_type"] == "FusedGemm"]
    assert fused and all(r["flops"] > 0 and r["gflops_per_s"] > 0 for r in fused)  # static meets measured
    assert joined["total"]["gflops_per_s"] > 0
    rep = json.loads(farm("report", rid, "--json").stdout)["op_profiles"]
    assert len(rep) == len(rows) and all(p["status"] == "ok" and p["op_types"][-1]["op_type"] == OVERHEAD for p in rep)
    assert "ops " in farm("report", rid).stdout
    html = tmp_path / "report.html"
    farm("report", rid, "-o", str(html))
    assert 'id="op-types"' in html.read_text() and "FusedGemm" in html.read_text()
    cmp = json.loads(farm("compare", "--ops", served[0]["job_id"], served[1]["job_id"], "--json").stdout)
    assert {r["op_type"] for r in cmp["op_types"]} >= {"FusedGemm", OVERHEAD}
    text = farm("compare", "--ops", served[0]["job_id"], served[1]["job_id"]).stdout
    assert "verdict" in text and max(len(line) for line in text.splitlines()) <= 80, text


@pytest.mark.slow
def test_a_crashing_profiler_keeps_the_load_figures_and_says_why(tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    farm("example-model", str(model), "--kind", "mlp")
    farm("submit", str(model), "--op-profile", *FAST, env=farm_env(FARM_OP_PROFILE_CRASH="1"))
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    (row,) = _jobs(rid)
    assert row["status"] == "succeeded" and row["throughput_infer_per_s"] > 0
    out = farm("ops", row["job_id"]).stdout
    assert "no op profile (failed)" in out and "signal 6" in out
    bad = farm("ops", "not-a-job", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("cluster_env")["FARM_DATABASE_URL"])


def test_finish_writes_the_profile_with_the_result_and_the_view_joins_it(db_url: str) -> None:
    rid = seed_request(np.random.default_rng(1), edge=False, failed=False)
    with get_engine(db_url).begin() as conn:
        conn.execute(text("DELETE FROM results WHERE request_id = :r"), {"r": rid})
        job_id = conn.execute(text("SELECT id FROM jobs WHERE request_id = :r LIMIT 1"),
                              {"r": rid}).scalar_one()
        conn.execute(text("UPDATE jobs SET status = 'running', worker_id = 'w1' WHERE id = :j"), {"j": job_id})
    nodes = [OpNode(name="Conv_0", op_type="Conv", calls=1, self_ms_p50=2.0, self_ms_p90=2.5, share=0.8,
                    fused=["Relu_1"]),
             OpNode(name="Shape_2", op_type="Shape", calls=1, self_ms_p50=0.0, self_ms_p90=0.0, share=0.0,
                    status="optimized_out")]
    prof = OpProfile(engine="onnxruntime", status="ok", iterations=20, node_sum_ms=2.5, compute_ms=3.0,
                     overhead_ms=0.5, nodes=nodes)
    details: dict[str, Any] = {"load": {}}
    op_profile.attach(details, prof, gzip.compress(b"[]"))
    result = JobResult(job_id=job_id, metrics={"throughput_infer_per_s": 10.0}, details=details)
    with get_engine(db_url).begin() as conn:
        assert lifecycle.finish(conn, JobSpec.model_construct(job_id=job_id, request_id=rid), "w1", result)
    with get_engine(db_url).connect() as conn:
        rows = [dict(r) for r in conn.execute(text("SELECT * FROM job_ops WHERE job_id = :j ORDER BY rank"),
                                              {"j": job_id}).mappings()]
        kept = conn.execute(text("SELECT details FROM results WHERE job_id = :j"), {"j": job_id}).scalar_one()
    assert [r["node"] for r in rows] == [OVERHEAD, "Conv_0", "Shape_2"]
    assert rows[0]["self_ms_p50"] == 0.5 and rows[1]["op_type"] == "Conv" and rows[2]["node_status"] == "optimized_out"
    assert all(r["engine"] and r["batch_size"] and r["request_id"] == rid for r in rows)
    kept = json.loads(kept) if isinstance(kept, str) else kept
    assert kept["op_profile"]["nodes"] == 2 and op_profile.TRACE_KEY not in kept  # the trace lives in op_profiles
    with session_scope() as s:
        stored = op_profile.load(s, job_id[:8])
        assert stored.profile.nodes[0].fused == ["Relu_1"] and stored.has_trace
        assert op_profile.trace(s, job_id) == b"[]"


def test_analyze_layers_gives_per_node_costs_under_the_names_the_engine_reports(example_onnx: Path) -> None:
    got = json.loads(farm("analyze", str(example_onnx), "--layers", "--batch", "2", "--json").stdout)
    rows = {r["name"]: r for r in got["layers"]}
    assert list(rows) == ["Gemm_0", "Relu_1", "Gemm_2", "Relu_3", "Gemm_4"]  # ONNX Runtime's names
    assert rows["Gemm_0"]["macs"] == 2 * 256 * 512 and rows["Gemm_0"]["params"] == 256 * 512 + 512
    assert rows["Relu_1"]["activation_bytes"] == 2 * 512 * 4 and got["total"] is None
    table = farm("analyze", str(example_onnx), "--layers").stdout
    assert "Gemm_0" in table and max(len(line) for line in table.splitlines()) <= 80


def test_analyze_layers_of_a_torchscript_model_in_the_jail(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = tmp_path / "mlp.pt"
    farm("example-model", str(model), "--kind", "torchscript-mlp")
    got = json.loads(farm("analyze", str(model), "--layers", "--batch", "2", "--json").stdout)
    rows = {r["name"]: r for r in got["layers"]}
    assert rows["aten::linear#0/aten::addmm#0"]["macs"] == 2 * 256 * 512  # the profile's node names
    assert rows["aten::linear#0/aten::addmm#0"]["params"] == 256 * 512 + 512 and rows["aten::linear#0"]["flops"] == 0
    whole = json.loads(farm("analyze", str(model), "--json").stdout)
    assert sum(r["flops"] for r in got["layers"]) == 2 * whole["flops_per_sample"]  # one rule table, same totals
    bad = farm("analyze", str(tmp_path / "x.gguf"), "--layers", check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
