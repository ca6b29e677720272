"""The client's TTFT of an LLM job split into the server's queue and prefill and the rest (network and client).

The figures are p50s, ms, from the row's typed columns:

- **queue**: the server's queue-time histogram (``server_queue_p50_ms``: vLLM's
  ``vllm:request_queue_time_seconds``) where it has one; else, from the server's own requests-waiting gauge
  scraped through the windows (``server_requests_waiting_mean``, llama-server's ``requests_deferred``, vLLM's
  ``num_requests_waiting``), Little's law: mean wait = mean requests waiting / completed requests per second (a
  mean, said so).
- **prefill**: the server's prefill histogram (``server_prefill_p50_ms``: vLLM's
  ``vllm:request_prefill_time_seconds``) where stored; else ``server_ttft_p50_ms``: llama.cpp's per-request
  ``timings.prompt_ms`` (its prompt processing), or, for vLLM, its own TTFT histogram, which holds the queue too
  (so its queue is taken off it).
- **rest**: the client's TTFT p50 less both: the network, HTTP and the client's own handling.

Percentiles do not add: where the server's figures sum past the client's TTFT p50 the rest is 0 and a note says
so. A server that gives neither figure (llama-cpp-python's, an endpoint without ``/metrics``) gets no split, and
the reason instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from farm.readers.rows import ResultRow

#: servers whose ``server_ttft_p50_ms`` is their own TTFT histogram (queue + prefill), not a prefill time
TTFT_HISTOGRAM_SERVERS = ("vllm", "sglang")
NO_SPLIT = ("the server gives no queue or prefill time (no /metrics queue gauge or histogram and no per-request "
            "timings)")
LITTLE = "mean, Little's law: requests waiting / requests per s"
QUEUE_HIST = "the server's queue-time histogram, p50"
PREFILL_HIST = "the server's prefill histogram, p50"
TTFT_LESS_QUEUE = "the server's TTFT histogram p50 less its queue"
TIMINGS = "the server's per-request prompt time (timings), p50"
#: each source, short, as ``farm report``'s line says it
SHORT = {LITTLE: "Little's law mean", QUEUE_HIST: "histogram p50", PREFILL_HIST: "histogram p50",
         TTFT_LESS_QUEUE: "TTFT histogram p50 less queue", TIMINGS: "timings p50"}


@dataclass(frozen=True)
class TtftSplit:
    """One job's TTFT p50 (``ttft_ms``) as ``queue_ms`` + ``prefill_ms`` + ``rest_ms`` (ms; a part the server
    does not give is None), where each server figure came from (``queue_from``, ``prefill_from``) and a note
    (``note``); ``missing``: why there is no split (then only ``ttft_ms`` is set)."""

    ttft_ms: float
    queue_ms: float | None = None
    prefill_ms: float | None = None
    rest_ms: float | None = None
    queue_from: str | None = None
    prefill_from: str | None = None
    note: str | None = None
    missing: str | None = None

    def text(self) -> str:
        """``TTFT p50 120.0 ms = queue 80.0 (Little's law mean) + prefill 30.0 (timings p50) + rest 10.0 ms`` (or
        why there is no split)."""
        if self.missing:
            return f"TTFT p50 {self.ttft_ms:,.1f} ms: no split: {self.missing}"
        parts = [f"{name} {v:,.1f} ({SHORT.get(src or '', src)})" if v is not None else f"{name} not given"
                 for name, v, src in (("queue", self.queue_ms, self.queue_from),
                                      ("prefill", self.prefill_ms, self.prefill_from))]
        tail = f" ({self.note})" if self.note else ""
        return f"TTFT p50 {self.ttft_ms:,.1f} ms = {' + '.join(parts)} + rest {self.rest_ms or 0.0:,.1f} ms{tail}"

    def as_json(self) -> dict[str, object]:
        """The split as ``farm report --json`` prints it."""
        return {k: getattr(self, k) for k in ("ttft_ms", "queue_ms", "prefill_ms", "rest_ms", "queue_from",
                                              "prefill_from", "note", "missing")}


def _num(row: ResultRow, name: str) -> float | None:
    v = row.get(name)
    return None if v is None or isinstance(v, bool) else float(v)


def server_queue_ms(row: ResultRow) -> tuple[float | None, str | None]:
    """(the server's queue time, ms, where it came from) of ``row``; (None, None) when the server gives none."""
    hist = _num(row, "server_queue_p50_ms")
    if hist is not None:
        return hist, QUEUE_HIST
    waiting, rate = _num(row, "server_requests_waiting_mean"), _num(row, "requests_per_s")
    if waiting is not None and rate and (row.get("server_scrapes") or 0) > 0:
        return 1e3 * waiting / rate, LITTLE
    return None, None


def server_prefill_ms(row: ResultRow, queue_ms: float | None = None) -> tuple[float | None, str | None]:
    """(the server's prefill time, ms, where it came from) of ``row`` (``queue_ms``: its queue, taken off a TTFT
    histogram that holds it); (None, None) when the server gives none."""
    hist = _num(row, "server_prefill_p50_ms")
    if hist is not None:
        return hist, PREFILL_HIST
    ttft = _num(row, "server_ttft_p50_ms")
    if ttft is None:
        return None, None
    server = str(row.get("server") or row.get("engine") or "").lower()
    if server.startswith(TTFT_HISTOGRAM_SERVERS):
        return max(ttft - (queue_ms or 0.0), 0.0), TTFT_LESS_QUEUE
    return ttft, TIMINGS


def ttft_split(row: ResultRow) -> TtftSplit | None:
    """The TTFT split of one LLM row (None: the row has no client TTFT)."""
    ttft = _num(row, "ttft_p50_ms")
    if ttft is None:
        return None
    queue, queue_from = server_queue_ms(row)
    prefill, prefill_from = server_prefill_ms(row, queue)
    if queue is None and prefill is None:
        why = NO_SPLIT + (f"; it served as {row['server']}" if row.get("server") else "")
        return TtftSplit(ttft, missing=why)
    server = (queue or 0.0) + (prefill or 0.0)
    note = None
    if server > ttft:
        note = f"the server's figures sum to {server:,.1f} ms, past it: they do not add exactly, rest taken as 0"
    return TtftSplit(ttft, queue, prefill, max(ttft - server, 0.0), queue_from, prefill_from, note)
