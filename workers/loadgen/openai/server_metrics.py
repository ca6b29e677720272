"""The server's own view of an LLM run, from its Prometheus ``/metrics`` (vLLM, SGLang, TGI): its per-request
histograms (TTFT, time per output token, inter-token latency, queue, prefill, decode and end-to-end time) read
before and after the measured span, and the p50 and p99 of the difference (the requests of that span only),
interpolated within the histogram's buckets. A quantile in the first bucket (from 0 to its bound, 300 ms wide for
vLLM's queue, prefill, decode and end-to-end histograms) says only "below the bound": interpolating would give half
the bound whatever the times were, so the span's mean (the histogram's ``_sum`` over its count) stands in there,
said so by ``first_bucket``. Parsing is prometheus_client's."""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from workers.loadgen.openai.http_once import exchange

#: what farm reads, by figure: the histogram names each server uses (seconds)
FAMILIES: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
             "vllm:inter_token_latency_seconds", "sglang:time_per_output_token_seconds",
             "sglang:inter_token_latency_seconds", "tgi_request_mean_time_per_token_duration"),
    "itl": ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds"),
    "queue": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
}
QUANTILES = {"p50": 0.5, "p99": 0.99}

Buckets = dict[float, float]  # upper bound (s) -> cumulative count


@dataclass(frozen=True)
class Scrape:
    """The cumulative buckets of each histogram farm reads, summed over label sets, by family name, and their
    ``_sum`` samples (s)."""

    histograms: dict[str, Buckets]
    sums: dict[str, float] = field(default_factory=dict)


def scrape(url: str, timeout_s: float = 2.0, authority: str | None = None) -> Scrape | None:
    """The server's histograms at ``url`` (``http://HOST:PORT/metrics``; ``authority``: the endpoint's name where
    the URL holds its pinned address); None when it has none or does not answer (most servers do not expose it:
    nothing to report)."""
    wanted = {name for names in FAMILIES.values() for name in names}
    try:
        status, raw = exchange(url, timeout_s=timeout_s, limit=8 << 20, authority=authority)
        if status != 200:
            return None
        text = raw.decode("utf-8", errors="replace")
        out: dict[str, Buckets] = {}
        sums: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name not in wanted or family.type != "histogram":
                continue
            buckets = out.setdefault(family.name, {})
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels.get("le", "inf"))
                    buckets[le] = buckets.get(le, 0.0) + float(sample.value)
                elif sample.name.endswith("_sum"):
                    sums[family.name] = sums.get(family.name, 0.0) + float(sample.value)
    except (OSError, ValueError):
        return None
    return Scrape(out, sums) if out else None


def bucket_quantile(buckets: Buckets, q: float) -> float | None:
    """The ``q`` quantile (0..1) of a cumulative histogram, interpolated within its bucket (Prometheus'
    histogram_quantile); None when empty."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = le, count
    return lower


def server_quantiles(before: Scrape | None, after: Scrape | None) -> dict[str, dict[str, float]]:
    """``{figure: {"p50": ms, "p99": ms}}`` of what the server recorded between the two scrapes (figures it does
    not expose are left out), and each figure's ``count`` of requests (or tokens, for inter-token latency)."""
    if after is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for figure, names in FAMILIES.items():
        name = next((n for n in names if n in after.histograms), None)
        if name is None:
            continue
        was = before.histograms.get(name, {}) if before is not None else {}
        delta = {le: n - was.get(le, 0.0) for le, n in after.histograms[name].items()}
        got = {k: bucket_quantile(delta, q) for k, q in QUANTILES.items()}
        if got["p50"] is None:
            continue
        count = max(delta.values(), default=0.0)
        total = after.sums.get(name, 0.0) - (before.sums.get(name, 0.0) if before is not None else 0.0)
        first = min((le for le in delta if le != float("inf")), default=float("inf"))
        out[figure] = {"count": count}
        for k, v in got.items():
            if v is not None and v <= first and count > 0 and name in after.sums:  # "below the first bound" only
                v = min(total / count, first)
                out[figure]["first_bucket"] = 1.0
            if v is not None:
                out[figure][k] = v * 1e3
    return out


def server_p50s(before: Scrape | None, after: Scrape | None) -> dict[str, float]:
    """``{"ttft": ms, "tpot": ms, ...}`` p50s of what the server recorded between the two scrapes (figures it does
    not expose are left out)."""
    return {figure: q["p50"] for figure, q in server_quantiles(before, after).items()}
