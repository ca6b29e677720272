"""The server's own view of an LLM run through its measured windows: its Prometheus ``/metrics`` scraped every
``PERIOD_S`` from before the load starts until after it ends, on a thread of the client's side (the load itself
runs in its own process). Each scrape keeps the samples farm reads (``GAUGES``, ``COUNTERS``: the names each
server uses, summed over label sets), timed on the monotonic clock the windows are cut on.

Over the measured windows: a counter as its increase (the value at the last scrape at or before the windows' end
less the one at the last scrape at or before their start; a reset starts it again from 0), a gauge as the mean
and max of its scrapes inside them. The whole scrape span's counter increases are kept too: they cover every
request of the run, so they must equal the client's own totals (tests compare them). A server without
``/metrics`` (llama-cpp-python's) gives no scrape: the row says so and nothing else changes. Parsing is
prometheus_client's (``text_string_to_metric_families``)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from workers.loadgen.openai.http_once import exchange

PERIOD_S = 0.25  # 4 Hz: at least 2 Hz whatever a scrape costs (one scrape of llama-server's takes ~2 ms)
TIMEOUT_S = 2.0
LIMIT = 8 << 20  # the most bytes of one /metrics answer read
#: gauges farm reads, by figure: the sample names each server uses (the first one present is read)
GAUGES: dict[str, tuple[str, ...]] = {
    "requests_running": ("llamacpp:requests_processing", "vllm:num_requests_running"),
    "requests_waiting": ("llamacpp:requests_deferred", "vllm:num_requests_waiting"),
    "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "busy_slots_per_decode": ("llamacpp:n_busy_slots_per_decode",),
}
#: samples read for one label value only, named ``NAME{LABEL=VALUE}``: vLLM's ``prompt_tokens_total`` counts the
#: prompt tokens taken from its prefix cache too; those it computed are its ``local_compute`` source
LABELLED: dict[str, tuple[str, str]] = {"vllm:prompt_tokens_by_source_total": ("source", "local_compute")}
VLLM_COMPUTED = "vllm:prompt_tokens_by_source_total{source=local_compute}"
#: counters farm reads, by figure (sample names, ``_total`` included); prompt tokens are those the server computed
#: (cached ones are ``cached_prompt_tokens``), as llama-server counts them
COUNTERS: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("llamacpp:prompt_tokens_total", VLLM_COMPUTED, "vllm:prompt_tokens_total"),
    "generation_tokens": ("llamacpp:tokens_predicted_total", "vllm:generation_tokens_total"),
    "cached_prompt_tokens": ("llamacpp:prompt_tokens_cached_total", "vllm:prompt_tokens_cached_total",
                             "vllm:prefix_cache_hits_total"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_seconds": ("llamacpp:prompt_seconds_total",),
    "generation_seconds": ("llamacpp:tokens_predicted_seconds_total",),
    "decode_calls": ("llamacpp:n_decode_total",),
}
#: the headline metrics (``schemas.metrics``) each summary figure fills; the KV-cache ratio (0..1) is stored in %
HEADLINE: dict[str, str] = {
    "requests_running_mean": "server_requests_running_mean", "requests_running_max": "server_requests_running_max",
    "requests_waiting_mean": "server_requests_waiting_mean", "requests_waiting_max": "server_requests_waiting_max",
    "kv_cache_usage_mean": "server_kv_cache_usage_mean_pct", "kv_cache_usage_max": "server_kv_cache_usage_max_pct",
    "prompt_tokens": "server_prompt_tokens", "generation_tokens": "server_generation_tokens",
    "cached_prompt_tokens": "server_cached_prompt_tokens", "preemptions": "server_preemptions",
    "prefix_cache_queries": "server_prefix_cache_queries",
}
NO_METRICS_NOTE = "the server exposes no Prometheus /metrics ({why}): no server-side figures"
_WANTED = frozenset(n for names in (*GAUGES.values(), *COUNTERS.values()) for n in names)


def parse(text: str) -> dict[str, float]:
    """The samples of ``text`` (Prometheus exposition) that farm reads, summed over their label sets."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in LABELLED:
                label, value = LABELLED[name]
                if sample.labels.get(label) != value:
                    continue
                name = f"{name}{{{label}={value}}}"
            if name in _WANTED:
                out[name] = out.get(name, 0.0) + float(sample.value)
    return out


@dataclass
class Scrapes:
    """What a :class:`Scraper` collected: (monotonic s, samples) per answered scrape, and why none answered."""

    url: str
    points: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    failures: int = 0
    why: str | None = None


class Scraper:
    """Scrapes ``url`` every ``period_s`` on a thread of its own between ``start`` and ``stop``."""

    def __init__(self, url: str, authority: str | None = None, period_s: float = PERIOD_S) -> None:
        self.got = Scrapes(url)
        self.authority, self.period_s = authority, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="farm-server-scrape", daemon=True)

    def scrape_once(self) -> bool:
        """One scrape, kept when it answers; False when the server has no ``/metrics`` (or did not answer)."""
        try:
            status, raw = exchange(self.got.url, timeout_s=TIMEOUT_S, limit=LIMIT, authority=self.authority)
            if status != 200:
                raise ValueError(f"HTTP {status}")
            samples = parse(raw.decode("utf-8", errors="replace"))
        except (OSError, ValueError) as exc:
            self.got.failures += 1
            self.got.why = self.got.why or (str(exc)[:200] or type(exc).__name__)
            return False
        self.got.points.append((time.monotonic(), samples))
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.scrape_once()

    def start(self) -> None:
        """The first scrape, now; the thread only where it answered (no ``/metrics``: one try only)."""
        if self.scrape_once():
            self._thread.start()

    def stop(self) -> Scrapes:
        """Stop, take one last scrape (after the load ended) where the server has ``/metrics``; what was kept.
        Idempotent."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread.is_alive():
                self._thread.join(TIMEOUT_S * 2)
            if self.got.points:
                self.scrape_once()
        return self.got


@contextmanager
def scraping(url: str, authority: str | None = None) -> Iterator[Scraper]:
    """A :class:`Scraper` of ``url`` running for the block (its first scrape taken before the block starts)."""
    scraper = Scraper(url, authority)
    scraper.start()
    try:
        yield scraper
    finally:
        scraper.stop()


def _first(names: tuple[str, ...], points: list[tuple[float, dict[str, float]]]) -> str | None:
    return next((n for n in names if any(n in s for _, s in points)), None)


def _increase(points: list[tuple[float, dict[str, float]]], name: str) -> float:
    """A counter's increase over ``points`` (a drop is a reset: counted again from 0)."""
    values = [s[name] for _, s in points if name in s]
    return sum(b - a if b >= a else b for a, b in zip(values, values[1:], strict=False))


def _at_or_before(points: list[tuple[float, dict[str, float]]], t: float) -> int:
    """The index of the last point at or before ``t`` (0 when none is)."""
    return max([k for k, (pt, _) in enumerate(points) if pt <= t] or [0])


def summarise(got: Scrapes, windows: list[tuple[float, float]]) -> tuple[dict[str, float | int | None], dict[str, Any]]:
    """The headline metrics (``HEADLINE``'s names) and the details of ``got`` over the measured ``windows``
    (contiguous, monotonic s): counters' increases, gauges' mean and max, the whole span's increases and the
    series (s from the windows' start)."""
    points = got.points
    if not points:
        return {"server_scrapes": 0}, {"url": got.url, "available": False, "why": got.why}
    lo, hi = windows[0][0], windows[-1][1]
    inside = points[_at_or_before(points, lo):_at_or_before(points, hi) + 1]
    figures: dict[str, float | None] = {}
    names: dict[str, str] = {}
    for figure, candidates in COUNTERS.items():
        name = _first(candidates, points)
        if name is not None:
            names[figure] = name
            figures[figure] = _increase(inside, name)
    for figure, candidates in GAUGES.items():
        name = _first(candidates, points)
        values = [s[name] for t, s in points if name is not None and lo <= t <= hi and name in s]
        if name is not None:
            names[figure] = name
            figures[f"{figure}_mean"] = sum(values) / len(values) if values else None
            figures[f"{figure}_max"] = max(values, default=None)
    measured = [t for t, _ in points if lo <= t <= hi]
    metrics: dict[str, float | int | None] = {HEADLINE[k]: v for k, v in figures.items() if k in HEADLINE}
    for key in ("server_kv_cache_usage_mean_pct", "server_kv_cache_usage_max_pct"):
        value = metrics.get(key)
        if value is not None and names.get("kv_cache_usage", "").endswith("ratio"):
            metrics[key] = value * 100.0
        elif value is not None and value <= 1.0:  # vLLM's "perc" gauges are a fraction too
            metrics[key] = value * 100.0
    metrics["server_scrapes"] = len(measured)
    span = max(hi - lo, 1e-9)
    details = {"url": got.url, "available": True, "names": names, "windows": figures,
               "scrape_hz": len(measured) / span, "failures": got.failures,
               "run": {f: _increase(points, n) for f, n in names.items() if f in COUNTERS},
               "series": {n: [[round(t - lo, 3), s[n]] for t, s in points if n in s] for n in names.values()}}
    return metrics, details
