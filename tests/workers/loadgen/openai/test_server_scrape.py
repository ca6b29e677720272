"""The server's /metrics through the measured windows (``server_scrape``): counters as increases, gauges as mean and
max, the whole span kept beside; a live scrape at >= 2 Hz; a server without /metrics answered once, said so."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from workers.loadgen.openai.server_scrape import PERIOD_S, Scrapes, parse, scraping, summarise

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
