"""The host notes (drift, busy) on result rows: in `farm results`' lines, the HTML report's job table and
`farm compare`'s matches, with the bounds as settings; repeats merged without cancelling a drift."""
from __future__ import annotations

import pytest

from farm.cli.views import host_lines
from farm.readers.compare import as_json, compare
from farm.readers.report_html import _jobs
from farm.readers.results import merge_repeats
from farm.settings import reset_settings
from tests.farm.readers.test_results import _row

DRIFTED = {"host_speed_index": 30.0, "host_speed_change_pct": -23.0, "foreign_cpu_pct": 2.0}
BUSY = {"host_speed_index": 30.0, "host_speed_change_pct": 1.0, "foreign_cpu_pct": 41.0}
STEADY = {"host_speed_index": 30.0, "host_speed_change_pct": 3.0, "foreign_cpu_pct": 4.0}


def test_results_lines_name_each_drifting_or_busy_job_and_follow_the_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [_row("aaaaaa1", 1, **DRIFTED), _row("bbbbbb1", 2, **BUSY), _row("cccccc1", 4, **STEADY),
            _row("dddddd1", 8)]  # not measured (an older row): no note
    lines = host_lines(rows)
    assert len(lines) == 2
    assert lines[0].startswith("aaaaaa: host drift:") and "-23.0 %" in lines[0] and "bound 10 %" in lines[0]
    assert lines[1].startswith("bbbbbb: host busy:") and "41.0 %" in lines[1]
    monkeypatch.setenv("FARM_HOST_DRIFT_PCT", "25")
    monkeypatch.setenv("FARM_HOST_BUSY_PCT", "50")
    reset_settings()
    try:
        assert host_lines(rows) == []
    finally:
        monkeypatch.undo()
        reset_settings()


def test_the_report_job_table_carries_the_host_notes() -> None:
    page = _jobs([_row("aaaaaa1", 1, **DRIFTED), _row("cccccc1", 4, **STEADY)])
    assert "<th class=l>flags</th>" in page  # the job table's flags column: short flag, its sentence on hover
    table = page.split('id="all-metrics"')[0]
    drifted, steady = table.split('<tr class="job" id="job-cccccc1">')
    assert ">host drift</abbr>" in drifted and "rerun it before comparing" in drifted
    assert "host drift" not in steady and "host busy" not in steady


def test_compare_marks_a_match_whose_runs_drifted_or_were_busy() -> None:
    a = [_row("aaaaaa1", 1, **STEADY), _row("aaaaaa2", 2, **STEADY)]
    b = [_row("bbbbbb1", 1, **BUSY), _row("bbbbbb2", 2, **STEADY)]
    c = compare(a, b, {})
    flags = {m.key["batch_size"]: m.flags for m in c.matches}
    assert flags == {1: ["B bbbbbb busy 41%"], 2: []}
    assert [m["flags"] for m in as_json(c, "A", "B")["matches"]] == [["B bbbbbb busy 41%"], []]


def test_merged_repeats_keep_the_largest_drift_either_way_and_the_busiest_run() -> None:
    merged = merge_repeats([_row("a1", 1, host_speed_change_pct=15.0, foreign_cpu_pct=3.0),
                            _row("a2", 1, host_speed_change_pct=-20.0, foreign_cpu_pct=30.0)])[0]
    assert merged["host_speed_change_pct"] == -20.0 and merged["foreign_cpu_pct"] == 30.0
