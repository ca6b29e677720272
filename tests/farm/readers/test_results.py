"""farm.readers.results.merge_repeats: result rows of repeated runs merged per job config."""
from __future__ import annotations

from typing import Any

import pytest

from farm.readers.results import JOB_COLUMNS, METRIC_NAMES, merge_repeats


def _row(job_id: str, batch: int, status: str = "succeeded", **metrics: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(JOB_COLUMNS + METRIC_NAMES)
    row.update(job_id=job_id, device="cpu", engine="onnxruntime", batch_size=batch, concurrency=1,
               edge_profile=None, status=status, attempts=1, rpc="unary", client="farm", **metrics)
    return row


def test_rows_of_one_config_merge_by_declared_aggregation() -> None:
    rows = [_row("a1", 1, throughput_infer_per_s=10.0, latency_max_ms=5.0, error_count=1, stable=True),
            _row("b1", 2, throughput_infer_per_s=99.0),
            _row("a2", 1, throughput_infer_per_s=30.0, latency_max_ms=7.0, error_count=2, stable=False),
            _row("a3", 1, "failed", throughput_infer_per_s=1000.0, error="boom")]
    merged = merge_repeats(rows)
    assert [r["job_id"] for r in merged] == ["a1", "b1"]
    a, b = merged
    assert a["repeats"] == 2 and a["status"] == "mixed" and a["attempts"] == 3 and a["error"] == "boom"
    assert a["throughput_infer_per_s"] == 20.0 and a["latency_max_ms"] == 7.0  # mean, max; failed run left out
    assert a["error_count"] == 3 and a["stable"] is False and a["latency_p50_ms"] is None  # sum, all, unmeasured
    assert b["repeats"] == 1 and b["status"] == "succeeded" and b["throughput_infer_per_s"] == 99.0


def test_a_repeat_that_shared_its_host_without_isolation_marks_the_merged_row_and_the_table() -> None:
    from farm.cli.views import SHARED_MARK, job_label, shared_lines

    rows = [_row("a1", 1, throughput_infer_per_s=10.0, host_shared=True, isolated=True),
            _row("a2", 1, throughput_infer_per_s=30.0, host_shared=True, isolated=False),
            _row("b1", 2, throughput_infer_per_s=99.0, host_shared=False, isolated=True)]
    assert [job_label(r) for r in rows] == ["a1", "a2" + SHARED_MARK, "b1"]  # shared on own cores: fine
    assert len(shared_lines(rows)) == 1 and "a2" in shared_lines(rows)[0] and "a1" not in shared_lines(rows)[0]
    a, b = merge_repeats(rows)
    assert job_label(a) == "a1" + SHARED_MARK and job_label(b) == "b1"
    assert shared_lines([b]) == []


def test_repeats_of_different_serving_configurations_stay_apart() -> None:
    rows = [_row("i1", 1, throughput_infer_per_s=10.0, instances=1, max_queue_delay_us=None),
            _row("i2", 1, throughput_infer_per_s=30.0, instances=2, max_queue_delay_us=None),
            _row("q5", 1, throughput_infer_per_s=50.0, instances=1, max_queue_delay_us=500),
            _row("i1b", 1, throughput_infer_per_s=20.0, instances=1, max_queue_delay_us=None)]
    merged = merge_repeats(rows)
    assert [(r["job_id"], r["repeats"], r["throughput_infer_per_s"]) for r in merged] == [
        ("i1", 2, 15.0), ("i2", 1, 30.0), ("q5", 1, 50.0)]


def test_client_limited_runs_are_marked_and_repeats_judged_on_their_mean_late_sends() -> None:
    from farm.cli.views import CLIENT_LIMITED_MARK, client_limited_lines, job_label

    rows = [_row("a1", 1, throughput_infer_per_s=10.0, late_send_pct=0.2),
            _row("a2", 1, throughput_infer_per_s=30.0, late_send_pct=3.0),
            _row("b1", 2, throughput_infer_per_s=99.0)]  # closed loop: no late count
    assert [job_label(r) for r in rows] == ["a1", "a2" + CLIENT_LIMITED_MARK, "b1"]
    lines = client_limited_lines(rows)
    assert len(lines) == 1 and "a2" in lines[0] and "a1" not in lines[0] and "client-limited" in lines[0]
    a, b = merge_repeats(rows)
    assert a["late_send_pct"] == 1.6 and job_label(a) == "a1" + CLIENT_LIMITED_MARK
    assert client_limited_lines([b]) == []


def test_repeats_at_different_open_loop_rates_stay_apart() -> None:
    """The rate is a coordinate: two rates never merge, two runs at one rate do; the table shows the rate."""
    from farm.cli.views import load_label

    rows = [_row("r50", 1, throughput_infer_per_s=50.0, rate=50.0), _row("r100", 1, throughput_infer_per_s=99.0,
                                                                         rate=100.0),
            _row("r50b", 1, throughput_infer_per_s=48.0, rate=50.0)]
    merged = merge_repeats(rows)
    assert [(r["job_id"], r["repeats"], r["throughput_infer_per_s"]) for r in merged] == [
        ("r50", 2, 49.0), ("r100", 1, 99.0)]
    assert [load_label(r) for r in merged] == ["1x1@50/s", "1x1@100/s"]
    assert load_label(_row("c", 4)) == "4x1"  # closed loop: no rate


def test_repeats_of_a_request_merge_to_their_median_with_the_spread_and_the_table_shows_both() -> None:
    from farm.cli.views import metric_cell, results_table

    rows = [_row(f"a{k}", 1, throughput_infer_per_s=t, latency_p50_ms=p, latency_max_ms=m, repeat=k)
            for k, (t, p, m) in enumerate([(100.0, 2.0, 5.0), (90.0, 2.4, 9.0), (300.0, 1.0, 4.0)])]
    declared, = merge_repeats(rows)
    a, = merge_repeats(rows, center="median")
    assert declared["throughput_infer_per_s"] == pytest.approx(490 / 3)  # the mean: one fast run drags it
    assert a["throughput_infer_per_s"] == 100.0 and a["latency_p50_ms"] == 2.0 and a["latency_max_ms"] == 9.0
    assert a["repeats"] == 3 and a["spread"]["throughput_infer_per_s"] == [90.0, 300.0]
    assert metric_cell(a, "throughput_infer_per_s") == "100 ±105%"
    assert metric_cell(a, "latency_max_ms") == "9"  # no range for the metrics outside RANGE_METRICS
    assert merge_repeats(rows[:1])[0]["spread"] == {}  # one run: no spread
    table = results_table([a], wide=True)  # the wide table: serving, edge, client and status always
    assert [c.header for c in table.columns][6:9] == ["client", "status", "n"]
    assert [c.header for c in results_table([a]).columns][:5] == ["job", "device", "engine", "b x c", "n"]


def test_the_results_table_names_the_client_of_each_row() -> None:
    from farm.cli.views import client_label, repeat_lines, results_table

    rows = [_row("a1", 1), {**_row("a2", 2), "client": "perf_analyzer"}, {**_row("e1", 1), "edge_profile": "pi"},
            {**_row("q1", 4), "client": "auto", "status": "queued"}]
    assert [client_label(r) for r in rows] == ["farm", "pa", "-", "-"]
    assert "client" in [c.header for c in results_table(rows, wide=True).columns]
    assert "client" not in [c.header for c in results_table(rows).columns]  # 80 columns: in the title instead
    assert repeat_lines(rows) == ["client pa: perf_analyzer"]


def test_rows_measured_by_another_client_say_why() -> None:
    """Under --client auto, a row measured by farm's generator because perf_analyzer could not be had names
    its client and says why, once per reason."""
    from farm.cli.views import client_label, client_note_lines

    why = ("measured by farm's own generator, not perf_analyzer: perf_analyzer not found at /x; installing it on "
           "first use failed: RuntimeError: apt-get download exited 100")
    rows = [{"job_id": "a1" + "0" * 30, "client": "farm", "client_note": why},
            {"job_id": "b2" + "0" * 30, "client": "farm", "client_note": why},
            {"job_id": "c3" + "0" * 30, "client": "perf_analyzer", "client_note": None}]
    assert client_note_lines(rows) == [f"a10000, b20000: {why}"]
    assert [client_label(r) for r in rows] == ["farm", "farm", "pa"]
