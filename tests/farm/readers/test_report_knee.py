"""``farm report`` (text, ``--json``, HTML) on stored LLM rows with the server's own view
(``tests.farm.results_data.seed_llm_rows``): what bounds each sweep at its knee, one sweep per cause and one whose
server has no ``/metrics``, and each job's TTFT split as a line and as a stacked bar, checked in the rendered
HTML (and as laid out by headless Chromium)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.farm.readers.test_report_html import Chromium, page_requests
from tests.farm.results_data import seed_llm_rows
from tests.helpers import farm

CURVE = ((1, 100.0), (2, 190.0), (4, 200.0))  # the knee at c=2: 2 -> 4 gains 5 %
CALM = {"server": "llama-server b6000", "server_scrapes": 8, "server_requests_running_max": 4.0,
        "server_requests_running_mean": 2.0, "server_requests_waiting_mean": 0.0,
        "server_kv_cache_usage_max_pct": 30.0, "client_busy_pct": 20.0,
        "server_ttft_p50_ms": 10.0}
ONE_SLOT = {"server_requests_running_max": 1.0, "server_requests_running_mean": 1.0}
#: (engine, knobs, the figures at c=1, 2, 4 over CALM) of one sweep per cause, and one without the server's view
SWEEPS: tuple[tuple[str, dict[str, Any], tuple[dict[str, Any], ...]], ...] = (
    ("llama.cpp", {"n_parallel": 1}, ({"server_requests_running_max": 1.0, "server_requests_running_mean": 0.75},
                                      {**ONE_SLOT, "server_requests_waiting_mean": 0.9},
                                      {**ONE_SLOT, "server_requests_waiting_mean": 2.8})),
    ("vllm", {"max_num_seqs": 8}, ({"server": "vllm 0.32.0", "server_queue_p50_ms": 1.0, "server_ttft_p50_ms": 9.0},
                                   {"server": "vllm 0.32.0", "server_queue_p50_ms": 2.0, "server_ttft_p50_ms": 10.0,
                                    "server_kv_cache_usage_max_pct": 90.0},
                                   {"server": "vllm 0.32.0", "server_queue_p50_ms": 2.0, "server_ttft_p50_ms": 11.0,
                                    "server_kv_cache_usage_max_pct": 99.5, "server_preemptions": 4.0})),
    ("llama.cpp", {"n_parallel": 4}, ({"server_requests_running_max": 1.0},
                                      {"server_ttft_p50_ms": 12.0, "server_requests_running_max": 2.0},
                                      {"server_ttft_p50_ms": 40.0})),
    ("llama.cpp", {"n_parallel": 8}, ({}, {"client_busy_pct": 60.0}, {"client_busy_pct": 98.0})),
    ("llama.cpp", {"n_parallel": 2}, tuple({"server": "llama-cpp-python 0.3.16", "server_scrapes": 0,
                                            "server_requests_running_max": None, "server_requests_waiting_mean": None,
                                            "server_kv_cache_usage_max_pct": None, "server_ttft_p50_ms": None}
                                           for _ in range(3))),
)


@pytest.fixture
def knee_request(sqlite_url: str) -> str:
    jobs = []
    for engine, knobs, figures in SWEEPS:
        for (c, tps), f in zip(CURVE, figures, strict=True):
            metrics = {"output_tokens_per_s": tps, "requests_per_s": tps / 64, "ttft_p50_ms": 30.0 * c,
                       "tpot_p50_ms": 10.0, "stable": True, "windows": 2, "duration_s": 4.0, "error_count": 0,
                       **CALM, **f}
            jobs.append((engine, knobs, c, None, metrics))
    return seed_llm_rows(jobs)


def test_the_text_report_names_each_sweeps_bound_and_splits_each_ttft(knee_request: str) -> None:
    out = " ".join(farm("report", knee_request).stdout.split())
    assert ("cpu llama.cpp n_parallel=1: knee at c=2: 190 tok/s; bounded by: the queue grows at constant running "
            "requests (slots / max_num_seqs): requests running (mean/max) 1/1 → 1/1 of 1 slots, waiting (mean) 0.9 → "
            "2.8 (c=2 → c=4)") in out
    assert ("cpu vllm max_num_seqs=8: knee at c=2: 190 tok/s; bounded by: the KV cache is full or preempting "
            "(memory): KV cache used (max) 90 → 99.5 %, preemptions - → 4 (c=2 → c=4)") in out
    assert "cpu llama.cpp n_parallel=4: knee at c=2: 190 tok/s; bounded by: prefill time rises (compute): server " \
           "prefill p50 12 → 40 ms, requests running (max) 2 → 4 (c=2 → c=4)" in out
    assert "cpu llama.cpp n_parallel=8: knee at c=2: 190 tok/s; bounded by: the client (its own measured cost): its " \
           "process 60 → 98 % busy (c=2 → c=4)" in out
    assert re.search(r"cpu llama\.cpp n_parallel=2: knee at c=2: 190 tok/s; no cause found among those judged: "
                     r"client: [^;]+; the queue grows at constant running requests \(slots / max_num_seqs\) cannot "
                     r"be judged: the server's own view is missing \(no /metrics scraped\); the KV cache is full or "
                     r"preempting \(memory\) cannot be judged: the server's own view is missing", out), out
    # llama-server: queue by Little's law (2.8 waiting / (200/64) req/s = 896 ms) + its prompt time + the rest
    assert ("TTFT split, cpu llama.cpp n_parallel=1 c=4: TTFT p50 120.0 ms = queue 896.0 (Little's law mean) + "
            "prefill 10.0 (timings p50) + rest 0.0 ms (the server's figures sum to 906.0 ms, past it") in out
    assert ("TTFT split, cpu vllm max_num_seqs=8 c=1: TTFT p50 30.0 ms = queue 1.0 (histogram p50) + prefill 8.0 "
            "(TTFT histogram p50 less queue) + rest 21.0 ms") in out
    assert "TTFT split, cpu llama.cpp n_parallel=2: no split: the server gives no queue or prefill time" in out
    data = json.loads(farm("report", knee_request, "--json").stdout)
    bound = {c["sweep"]: [b["cause"] for b in c["bound_by"]] for c in data["knee_causes"]}
    assert bound == {"cpu llama.cpp n_parallel=1": ["slots"], "cpu vllm max_num_seqs=8": ["memory"],
                     "cpu llama.cpp n_parallel=4": ["compute"], "cpu llama.cpp n_parallel=8": ["client"],
                     "cpu llama.cpp n_parallel=2": []}
    blind = next(c for c in data["knee_causes"] if c["sweep"] == "cpu llama.cpp n_parallel=2")
    assert [c["cause"] for c in blind["cannot_judge"]] == ["slots", "memory", "compute"]
    assert len(data["ttft_split"]) == 15 and sum(s["missing"] is not None for s in data["ttft_split"]) == 3


def _bars(page: str) -> dict[str, dict[str, float]]:
    """Each TTFT-split row's parts as drawn: {job id: {part: width %}} (and its ``outer`` width %)."""
    out: dict[str, dict[str, float]] = {}
    table = page[page.index('id="ttft-split"'):]
    for jid, cells in re.findall(r'<tr data-job="([\w-]+)">(.*?)</tr>', table[:table.index("</table>")], flags=re.S):
        outer = re.search(r'<div class="tbar"><div style="width:([\d.]+)%">', cells)
        parts = dict(re.findall(r'data-part="(\w+)" style="width:([\d.]+)%"', cells))
        out[jid] = {k: float(v) for k, v in parts.items()} | ({"outer": float(outer.group(1))} if outer else {})
    return out


def test_the_html_report_draws_a_stacked_ttft_bar_per_job_and_names_each_bound(knee_request: str,
                                                                               tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    farm("report", knee_request, "-o", str(path))
    page = path.read_text()
    knees = dict(re.findall(r'<li data-sweep="([^"]+)" data-bound-by="(\w*)">', page))
    assert knees == {"cpu llama.cpp n_parallel=1": "slots", "cpu vllm max_num_seqs=8": "memory",
                     "cpu llama.cpp n_parallel=4": "compute", "cpu llama.cpp n_parallel=8": "client",
                     "cpu llama.cpp n_parallel=2": ""}
    assert "cannot be judged: the server&#x27;s own view is missing" in page
    bars = _bars(page)
    assert len(bars) == 15
    drawn = [b for b in bars.values() if b]
    assert len(drawn) == 12  # the three llama-cpp-python jobs: no bar
    for b in drawn:  # parts fill their bar; bars on one scale (the widest TTFT, 120 ms: 100 %)
        assert sum(v for k, v in b.items() if k != "outer") == pytest.approx(100.0, abs=0.05)
    assert max(b["outer"] for b in drawn) == 100.0 and min(b["outer"] for b in drawn) == pytest.approx(25.0)
    vllm_c1 = next(b for b in drawn if b.get("queue") == pytest.approx(100 * 1.0 / 30, abs=0.01))
    assert vllm_c1["prefill"] == pytest.approx(100 * 8.0 / 30, abs=0.01)
    assert page.count("no split: the server gives no queue or prefill time") == 3


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (scripts/test "
                                                                "installs it)")
def test_the_ttft_bars_render_in_headless_chromium(knee_request: str, tmp_path: Path) -> None:
    """As laid out by Chromium: every drawn part has a width in pixels, the parts of a bar add up to it, and the
    page fetches nothing."""
    path = tmp_path / "report.html"
    farm("report", knee_request, "-o", str(path))
    with Chromium(tmp_path) as chromium:
        dom, netlog = chromium.run(path, "--dump-dom")
    assert page_requests(netlog) == [] and 'data-checked="1"' in dom
    bars = re.findall(r'<div class="tbar" data-px="(\d+)"><div style="[^"]*" data-px="(\d+)">(.*?)</div></div>', dom)
    assert len(bars) == 12
    for outer, inner, spans in bars:
        parts = [int(px) for px in re.findall(r'data-px="(\d+)"', spans)]
        assert int(outer) > 100 and 0 < int(inner) <= int(outer) and all(p > 0 for p in parts)
        assert abs(sum(parts) - int(inner)) <= len(parts)  # rounding: one px per part at most
