"""One event log per LLM request (issue 41, point 6) and the TTFT, ITL and TPOT of four tools computed from it.

The OpenAI client (``workers.loadgen.openai.event_log``) keeps, per request of a job: when it was scheduled, sent
(the request's write), its first response byte (the HTTP head), every chunk with its arrival, tokens and kind
(``r`` reasoning, ``c`` content, ``t`` tool call), its end and its error. The log is columnar (a list per column,
times in integer microseconds from the run's start) and stored in the job's result details
(``details["load"]["event_log"]``); its chunk events are capped (``FARM_EVENT_LOG_MAX_CHUNKS``): past the cap a
request keeps its per-request columns (first and last chunk included) but none of its chunk events, and the log
says so (``cut``).

:func:`request_figures` computes each request's figures by the definitions of farm, ``vllm bench serve``, AIPerf and
GuideLLM (docs/llm.md has the table and the sources); :func:`tool_summary` their p50/p99/mean side by side.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace

import numpy as np

#: a chunk's kind as the log stores it (one letter a chunk)
KIND_LETTER = {"reasoning": "r", "content": "c", "tool": "t"}
KIND_NAME = {v: k for k, v in KIND_LETTER.items()}
#: a request still in flight when the run stopped (its chunks so far are logged)
IN_FLIGHT = "IN_FLIGHT_AT_END"
US = 1e-3  # ms per µs


@dataclass(frozen=True)
class EventLog:
    """The columnar log of one run's requests (``seq`` order): per request (every list ``len(seq)`` long) and per
    chunk (``chunk_us``/``chunk_tokens``/``chunk_kind``, grouped by request in order, ``kept[i]`` of request i's).
    Times: µs from the run's start (monotonic); None: it did not happen. ``cut``: a cap was reached: later requests'
    chunk events (``max_chunks``), or later requests (past ``FARM_EVENT_LOG_MAX_REQUESTS``), were left out."""

    seq: list[int] = field(default_factory=list)
    warm: list[bool] = field(default_factory=list)
    scheduled_us: list[int] = field(default_factory=list)
    sent_us: list[int] = field(default_factory=list)  # the request written to the socket (else when it was sent)
    first_byte_us: list[int | None] = field(default_factory=list)  # the response's first byte (its HTTP head)
    first_chunk_us: list[int | None] = field(default_factory=list)
    first_output_us: list[int | None] = field(default_factory=list)  # the first content or tool-call chunk
    last_chunk_us: list[int | None] = field(default_factory=list)
    end_us: list[int | None] = field(default_factory=list)  # finish reason, [DONE], the body's end or the error
    error: list[str | None] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)  # all generated tokens (reasoning ones included)
    reasoning_tokens: list[int] = field(default_factory=list)
    token_source: list[str] = field(default_factory=list)  # usage, tokenizer or chunks
    chunks: list[int] = field(default_factory=list)  # chunks the request received
    kept: list[int] = field(default_factory=list)  # of them, in the chunk columns (0 past the cap)
    chunk_us: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_kind: str = ""  # one letter a chunk (:data:`KIND_LETTER`)
    max_chunks: int = 0
    cut: bool = False
    requests_total: int = 0  # the run's requests (more than ``len(seq)`` where the log was cut at its request cap)
    version: int = 1

    @classmethod
    def of(cls, stored: Mapping[str, object] | None) -> EventLog | None:
        """The log as the result details hold it (None: none stored, or not a version-1 log)."""
        if not isinstance(stored, Mapping) or stored.get("version") != 1:
            return None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in stored.items() if k in names})  # type: ignore[arg-type]

    def chunk_slices(self) -> Iterator[slice]:
        """Each request's slice of the chunk columns."""
        at = 0
        for n in self.kept:
            yield slice(at, at + n)
            at += n

    def capped(self, max_chunks: int, max_requests: int | None = None) -> EventLog:
        """This log with its first ``max_requests`` requests (None: all) and at most ``max_chunks`` chunk events:
        whole requests' chunks in order, the rest keeping none."""
        log = self._first(max_requests) if max_requests is not None and max_requests < len(self.seq) else self
        kept, total = [], 0
        for n in log.chunks:
            take = n if total + n <= max_chunks else 0
            kept.append(take)
            total += take
        keep = [i for s, n in zip(log.chunk_slices(), kept, strict=True) if n for i in range(s.start, s.stop)]
        return replace(log, kept=kept, chunk_us=[log.chunk_us[i] for i in keep],
                       chunk_tokens=[log.chunk_tokens[i] for i in keep],
                       chunk_kind="".join(log.chunk_kind[i] for i in keep), max_chunks=max_chunks,
                       cut=log.cut or sum(kept) < sum(log.chunks))

    def _first(self, n: int) -> EventLog:
        """The log of its first ``n`` requests (flagged ``cut``; ``requests_total`` keeps the run's count)."""
        chunks = sum(self.kept[:n])
        per_request = {f.name: getattr(self, f.name)[:n] for f in fields(self)
                       if isinstance(getattr(self, f.name), list) and not f.name.startswith("chunk_")}
        return replace(self, **per_request, chunk_us=self.chunk_us[:chunks], chunk_tokens=self.chunk_tokens[:chunks],
                       chunk_kind=self.chunk_kind[:chunks], cut=True)


#: the tools whose definitions are computed, in the order shown
TOOLS = ("farm", "vllm", "aiperf", "guidellm")


@dataclass(frozen=True)
class ToolFigure:
    """One figure by one tool's definition over a job's measured requests (ms): its name in that tool, what it is
    taken over (``requests``, ``tokens`` or ``chunk gaps``) and p50, p99, mean (None: no value)."""

    figure: str  # ttft, itl or tpot
    tool: str
    name: str
    over: str
    p50: float | None
    p99: float | None
    mean: float | None
    n: int


def _ms(a: int | None, b: int | None) -> float | None:
    return None if a is None or b is None else (a - b) * US


def _per(span_ms: float | None, tokens: int) -> float | None:
    return None if span_ms is None or tokens <= 0 else span_ms / tokens


def request_figures(log: EventLog, i: int) -> dict[str, float | None]:
    """Request ``i``'s figures (ms) by each tool's definition (docs/llm.md, "TTFT, ITL and TPOT by tool"):
    farm from the scheduled send, the others from the actual send; N = the request's output tokens."""
    sched, sent, first, last = log.scheduled_us[i], log.sent_us[i], log.first_chunk_us[i], log.last_chunk_us[i]
    end = log.end_us[i]
    n = log.output_tokens[i]
    farm_end = max(end, last) if end is not None and last is not None else last
    return {
        "ttft_ms_farm": _ms(first, sched),
        "ttfot_ms_farm": _ms(log.first_output_us[i], sched),
        "e2e_ms_farm": _ms(farm_end, sched),
        "tpot_ms_farm": _per(_ms(farm_end, first), n - 1),
        "ttft_ms_vllm": _ms(first, sent),
        "tpot_ms_vllm": _per(_ms(last, first), n - 1),
        "e2el_ms_vllm": _ms(last, sent),
        "ttft_ms_aiperf": _ms(first, sent),
        "ttfo_ms_aiperf": _ms(log.first_output_us[i], sent),
        "itl_ms_aiperf": _per(_ms(last, first), n - 1),
        "request_latency_ms_aiperf": _ms(last, sent),
        "ttft_ms_guidellm": _ms(first, sent),
        "itl_ms_guidellm": _per(_ms(last, first), n - 1),
        "tpot_ms_guidellm": _per(_ms(last, sent), n),
        "request_latency_ms_guidellm": _ms(end, sent),
    }


def measured(log: EventLog) -> list[int]:
    """The requests the figures are over: complete, past the warm-up."""
    return [i for i in range(len(log.seq)) if not log.warm[i] and log.error[i] is None
            and log.first_chunk_us[i] is not None]


def chunk_gaps(log: EventLog, requests: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The logged chunks of ``requests``: every gap between consecutive chunks (ms; vLLM's ITL, AIPerf's ICL) and
    farm's per-token ITL (a gap g before a chunk of k tokens gives k values g/k; a chunk of no token adds its gap to
    the next one's)."""
    wanted = set(requests)
    t_all, k_all = np.asarray(log.chunk_us, dtype=float) * US, np.asarray(log.chunk_tokens, dtype=np.int64)
    gaps: list[np.ndarray] = []
    per_token: list[np.ndarray] = []
    for i, s in enumerate(log.chunk_slices()):
        if i not in wanted or s.stop - s.start < 2:
            continue
        ts, ks = t_all[s], k_all[s]
        gaps.append(np.diff(ts))
        at = np.concatenate(([0], 1 + np.flatnonzero(ks[1:] > 0)))  # the first chunk, then those with tokens
        per_token.append(np.repeat(np.diff(ts[at]) / ks[at[1:]], ks[at[1:]]))
    return (np.concatenate(gaps) if gaps else np.empty(0),
            np.concatenate(per_token) if per_token else np.empty(0))


#: (figure, tool, the tool's own name, the per-request column; None: pooled chunk gaps or tokens)
DEFINITIONS: tuple[tuple[str, str, str, str | None], ...] = (
    ("ttft", "farm", "ttft", "ttft_ms_farm"),
    ("ttft", "vllm", "TTFT", "ttft_ms_vllm"),
    ("ttft", "aiperf", "time_to_first_token", "ttft_ms_aiperf"),
    ("ttft", "guidellm", "time_to_first_token_ms", "ttft_ms_guidellm"),
    ("itl", "farm", "itl (per token)", None),
    ("itl", "vllm", "ITL (chunk gaps)", None),
    ("itl", "aiperf", "inter_token_latency", "itl_ms_aiperf"),
    ("itl", "guidellm", "inter_token_latency_ms", "itl_ms_guidellm"),
    ("tpot", "farm", "tpot", "tpot_ms_farm"),
    ("tpot", "vllm", "TPOT", "tpot_ms_vllm"),
    ("tpot", "aiperf", "inter_token_latency", "itl_ms_aiperf"),
    ("tpot", "guidellm", "time_per_output_token_ms", "tpot_ms_guidellm"),
)


def _stats(values: list[float] | np.ndarray) -> tuple[float | None, float | None, float | None]:
    if not len(values):
        return None, None, None
    arr = np.asarray(values, dtype=float)
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99)), float(arr.mean())


def tool_summary(log: EventLog) -> list[ToolFigure]:
    """TTFT, ITL and TPOT by each tool's definition over the log's measured requests (:data:`DEFINITIONS`); the
    pooled ITLs (farm's per token, vLLM's chunk gaps) over the requests whose chunks the log kept."""
    reqs = measured(log)
    per_request = [request_figures(log, i) for i in reqs]
    gaps, per_token = chunk_gaps(log, reqs)
    out = []
    for figure, tool, name, column in DEFINITIONS:
        values: list[float] | np.ndarray
        if column is None:
            values, over = (per_token, "tokens") if tool == "farm" else (gaps, "chunk gaps")
        else:
            values, over = [v for f in per_request if (v := f[column]) is not None], "requests"
        out.append(ToolFigure(figure, tool, name, over, *_stats(values), n=len(values)))
    return out
