"""``farm report`` on LLM rows (fabricated: ``tests.farm.results_data.seed_llm_request``): the knees of the
concurrency sweeps, the LLM edge verdicts (SLO, memory peak against the limit, OOM) and, in the HTML report, the
LLM plots with their registry axis labels, SLO lines and knee marks, read well in headless Chromium."""
from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.farm.readers.test_report_html import Chromium, page_requests
from tests.farm.results_data import seed_llm_request
from tests.helpers import farm

LLM_PLOTS = {"llm-latency-concurrency", "llm-latency-rate", "llm-tokens-knee", "llm-goodput", "llm-engines"}


@pytest.fixture
def llm_report(sqlite_url: str, tmp_path: Path) -> tuple[str, Path]:
    """(request id, report file) of a seeded LLM request: three engine x knob sweeps, two edge runs."""
    rid = seed_llm_request(np.random.default_rng(3))
    out = tmp_path / "report.html"
    farm("report", rid, "-o", str(out))
    return rid, out


def test_the_text_report_ranks_by_tokens_and_gives_knees_and_llm_edge_verdicts(sqlite_url: str) -> None:
    rid = seed_llm_request(np.random.default_rng(3))
    out = farm("report", rid).stdout
    assert "best by output tokens/s" in out
    assert re.search(r"cpu llama\.cpp n_parallel=4: knee at c=8: 1,\d{3} tok/s", out), out
    assert re.search(r"edge pi4 llama\.cpp \(served over HTTP\): fits; .* 100 % of requests inside the SLO, "
                     r"memory peak 300\.0 of 512\.0 MiB", " ".join(out.split())), out
    assert "edge tiny llama.cpp (served over HTTP): does not fit (killed: out of memory)" in " ".join(out.split())
    data = json.loads(farm("report", rid, "--json").stdout)
    assert {k["sweep"] for k in data["knees"]} == {"cpu llama.cpp n_parallel=1", "cpu llama.cpp n_parallel=4",
                                                   "cpu transformers"}
    edge = {e["edge_profile"]: e for e in data["edge"]}
    assert edge["pi4"]["fits"] is True and edge["pi4"]["within_slo_pct"] == 100.0 and not edge["pi4"]["oom"]
    assert edge["tiny"]["fits"] is False and edge["tiny"]["oom"] is True
    assert edge["tiny"]["mem_peak_bytes"] == edge["tiny"]["mem_limit_bytes"] == 64 * 2**20
    status = farm("status", rid).stdout
    assert "knee at c=8" in status


def test_the_html_report_draws_the_llm_plots_with_slo_lines_and_knees(llm_report: tuple[str, Path]) -> None:
    _, path = llm_report
    page = path.read_text()
    figures = dict(re.findall(r'<figure class="plot" id="plot-([\w-]+)">(.*?)</figure>', page, flags=re.S))
    assert LLM_PLOTS <= set(figures)
    texts = {fid: html.unescape(" ".join(re.findall(r"<text[^>]*>([^<]*)</text>", svg)))
             for fid, svg in figures.items()}
    # registry axis labels (schemas.metrics LABELS), the SLO goals as lines, the knee marked and labelled
    assert "p50 TTFT (ms)" not in texts["llm-latency-concurrency"] and "TTFT (ms)" in texts["llm-latency-concurrency"]
    assert "TPOT (ms)" in texts["llm-latency-rate"] and "SLO 200 ms" in texts["llm-latency-rate"]
    assert "SLO 30 ms" in texts["llm-latency-concurrency"] and "concurrency (requests in flight)" in texts[
        "llm-latency-concurrency"]
    assert "offered rate (requests/s, Poisson)" in texts["llm-latency-rate"]
    assert "output tokens/s (tok/s)" in texts["llm-tokens-knee"]
    assert re.search(r"knee c=8: [\d,]+ tok/s", texts["llm-tokens-knee"]), texts["llm-tokens-knee"]
    assert "goodput (req/s)" in texts["llm-goodput"] and "offered rate (all requests inside the SLO)" in texts[
        "llm-goodput"] and "SLO goal: 95 % of requests inside it" in texts["llm-goodput"]
    assert "TTFT ≤ 200 ms" in texts["llm-goodput"]
    assert "LLM servers held to the limits" in texts["edge"] and "output tokens/s (tok/s)" in texts["edge"]
    for name in ("cpu llama.cpp n_parallel=1", "cpu llama.cpp n_parallel=4", "cpu transformers"):
        assert name in texts["llm-engines"] and name in texts["llm-tokens-knee"]
    shown = html.unescape(page)
    assert 'id="knees"' in page and "knee at c=8" in shown
    fit = shown[shown.index('id="edge-fit"'):]
    assert "killed: out of memory" in fit and "% of requests inside the SLO" in fit
    assert "held to the edge profile's CPU and memory limits" in shown  # how the LLM edge rows were measured
    summary = page[page.index('id="jobs-summary"'):page.index('id="all-metrics"')]
    assert ">out tok/s<" in summary and "n_parallel=4 n_threads=2" in summary


def test_a_classic_report_gets_no_llm_plot(sqlite_url: str, tmp_path: Path) -> None:
    from tests.farm.results_data import seed_request

    rid = seed_request(np.random.default_rng(1), batches=(1,), devices=("cpu",))
    out = tmp_path / "r.html"
    farm("report", rid, "-o", str(out))
    assert "plot-llm-" not in out.read_text()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (scripts/test "
                                                                "installs it)")
def test_the_llm_plots_read_well_in_a_1400_px_window(llm_report: tuple[str, Path], tmp_path: Path) -> None:
    """As rendered in Chromium at 1,400 px: each LLM plot drawn, its smallest text at least 11 px, none wider
    than the window."""
    _, path = llm_report
    with Chromium(tmp_path) as chromium:
        dom, netlog = chromium.run(path, "--dump-dom")
    assert page_requests(netlog) == [] and 'data-checked="1"' in dom
    rendered = {f: (int(w), int(h)) for f, w, h in re.findall(
        r'<figure class="plot" id="plot-([\w-]+)" data-rendered="(\d+)x(\d+)"', dom)}
    fonts = dict(re.findall(r'<figure class="plot" id="plot-([\w-]+)"[^>]*data-min-font="([\d.]+)"', dom))
    marks = dict(re.findall(r'<figure class="plot" id="plot-([\w-]+)"[^>]*data-marks="(\d+)"', dom))
    for fid in LLM_PLOTS:
        width, height = rendered[fid]
        assert 300 < width <= 1400 - 40 and height > 150, (fid, rendered[fid])
        assert float(fonts[fid]) >= 11.0, (fid, fonts[fid])
        assert int(marks[fid]) > 20, (fid, marks[fid])


def test_llm_facts_export_as_typed_columns_in_csv_json_and_parquet(sqlite_url: str, tmp_path: Path) -> None:
    import csv
    import io

    import pyarrow.parquet as pq

    rid = seed_llm_request(np.random.default_rng(4), edge=False)
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    assert {json.dumps(r["knobs"], sort_keys=True) for r in rows} == {
        '{"n_parallel": 1, "n_threads": 2}', '{"n_parallel": 4, "n_threads": 2}', '{"n_threads": 2}'}
    assert all(r["n_threads"] == 2 and r["output_tokens"] == "64" and r["token_source"] == "usage" for r in rows)
    table = list(csv.DictReader(io.StringIO(farm("results", rid, "--format", "csv").stdout)))
    assert json.loads(table[0]["knobs"])["n_threads"] == 2 and table[0]["workload_seed"] == "0"
    out = tmp_path / "r.parquet"
    farm("results", rid, "--format", "parquet", "-o", str(out))
    t = pq.read_table(out)
    assert str(t.schema.field("n_threads").type) == "int64" and str(t.schema.field("knobs").type) == "string"
    assert {json.loads(k)["n_threads"] for k in t.column("knobs").to_pylist()} == {2}
    wide = farm("results", rid, "--wide").stdout
    assert "n_parallel=4 n_threads=2" in wide and "in 128 out 64 seed 0" in wide
