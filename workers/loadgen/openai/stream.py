"""One streamed OpenAI completion, as the client saw it and as farm accounts for it: the server-sent-event
parser (:func:`feed_line`: one ``data:`` line at a time, stamped with the arrival time of the bytes that
completed it, :func:`replay` after the run), the raw record of a request (:class:`RawRequest`, what crosses the
process pipe) and :func:`account`, which turns
it into the request's figures (TTFT, per-token ITL, TPOT, e2e, token counts with where they came from).

Token truth: output tokens from the server's ``usage`` (``stream_options.include_usage``), else the
tokenizer on the generated text, else one per content chunk (``chunks``, what llama.cpp sends); per-chunk
counts from per-chunk cumulative usage where the server gives it, else the total spread over the chunks in
proportion to each chunk's tokenizer count (or evenly). A chunk of k tokens after a gap g counts k
inter-token intervals of g/k. Times: monotonic s in records, ms in figures.

Reasoning: each chunk has a kind: ``reasoning`` (``delta.reasoning_content`` or ``delta.reasoning``), ``content``
or ``tool`` (``delta.tool_calls``, counted as output). Output tokens are all the generated ones; the reasoning
ones are those of reasoning chunks (or the server's ``completion_tokens_details.reasoning_tokens``). TTFT is to
the first chunk of any kind, TTFOT (time to first output token) to the first content or tool-call chunk.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: error names a request may end with (``RawRequest.error``; HTTP errors are ``HTTP_<status>``)
CONNECT_ERROR = "CONNECT_ERROR"  # no connection (refused, unreachable, reset before an answer)
BAD_HTTP = "BAD_HTTP"  # an answer that is not HTTP/1.x
NOT_STREAMING = "NOT_STREAMING"  # an answer that is not text/event-stream
MALFORMED_SSE = "MALFORMED_SSE"  # a data line that is not JSON
STREAM_ERROR = "STREAM_ERROR"  # an {"error": ...} event inside the stream
TRUNCATED = "TRUNCATED"  # the stream ended without [DONE] or a finish_reason
NO_TOKENS = "NO_TOKENS"  # a complete stream without any generated text
TIMEOUT = "TIMEOUT"  # no end within the request timeout


@dataclass(slots=True)
class RawRequest:
    """One request as sent and received: scheduled and actual send times, whether it is warm-up, the prompt's
    token count (and its source) and the output tokens asked for; per content chunk its arrival time, text and
    cumulative ``completion_tokens`` where the chunk carried usage; the final usage, llama.cpp's ``timings``,
    the finish reason, the end time and the error (None: complete)."""

    scheduled: float
    sent: float
    warm: bool
    prompt_tokens: int
    prompt_source: str
    max_tokens: int
    chunk_t: list[float] = field(default_factory=list)
    chunk_text: list[str] = field(default_factory=list)
    chunk_usage: list[int | None] = field(default_factory=list)
    chunk_kind: list[str] = field(default_factory=list)  # per chunk: ``reasoning``, ``content`` or ``tool``
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False
    end: float = 0.0
    pieces: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival time, bytes) as read, unparsed
    eof: float = 0.0  # when the response body ended
    wrote: float = 0.0  # when the client wrote the request's headers (0: not known)
    seq: int = 0  # the request's number in its run (sent as X-Request-Id)
    turn: int = 0  # its turn in a session (1, 2, ...; 0: a request of its own)
    first_byte: float = 0.0  # when the response's first byte (its HTTP head) arrived (0: none came)
    error: str | None = None
    error_text: str | None = None

    def fail(self, name: str, text: str, now: float) -> None:
        """End the request with error ``name`` (the first one wins)."""
        if self.error is None:
            self.error, self.error_text, self.end = name, text[:300], now


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _tool_text(calls: object) -> str:
    """The generated text of a delta's ``tool_calls``: each call's function name and arguments, as streamed."""
    if not isinstance(calls, list):
        return ""
    fns = [c.get("function") for c in calls if isinstance(c, dict)]
    return "".join(_str(f.get("name")) + _str(f.get("arguments")) for f in fns if isinstance(f, dict))


def _content(choice: dict[str, Any]) -> tuple[str, str]:
    """The generated text of one choice and its kind: chat ``delta.content`` (``content``), ``delta.tool_calls``
    (``tool``: names and arguments) or ``delta.reasoning_content``/``delta.reasoning`` (``reasoning``, vLLM's
    and llama.cpp's reasoning parsers); completions ``text`` (``content``). A delta holding reasoning and
    output both is one output chunk with all its text."""
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return _str(choice.get("text")), "content"
    out = _str(delta.get("content")) + _tool_text(delta.get("tool_calls"))
    thought = _str(delta.get("reasoning_content")) or _str(delta.get("reasoning"))
    if not out:
        return thought, "reasoning"
    return thought + out, "content" if delta.get("content") else "tool"


def feed_line(rec: RawRequest, line: bytes, now: float) -> bool:
    """Read one SSE line into ``rec`` at ``now``; True once the stream is over ([DONE] or an error). Comment,
    ``event:``/``id:`` and blank lines are skipped."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return False
    payload = line[5:].strip()
    if payload == b"[DONE]":
        rec.done, rec.end = True, now
        return True
    try:
        event = json.loads(payload)
    except ValueError:
        rec.fail(MALFORMED_SSE, f"{MALFORMED_SSE}: a data line is not JSON: {payload[:80]!r}", now)
        return True
    if not isinstance(event, dict):
        rec.fail(MALFORMED_SSE, f"{MALFORMED_SSE}: a data line is not a JSON object: {payload[:80]!r}", now)
        return True
    if "error" in event:
        rec.fail(STREAM_ERROR, f"{STREAM_ERROR}: {json.dumps(event['error'])[:250]}", now)
        return True
    _read_event(rec, event, now)
    return False


def _read_event(rec: RawRequest, event: dict[str, Any], now: float) -> None:
    usage = event.get("usage")
    usage = usage if isinstance(usage, dict) else None
    if usage is not None:
        rec.usage = usage
    if isinstance(event.get("timings"), dict):
        rec.timings = event["timings"]
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return
    choice = choices[0]
    text, kind = _content(choice)
    if text:
        rec.chunk_t.append(now)
        rec.chunk_text.append(text)
        rec.chunk_kind.append(kind)
        done = usage.get("completion_tokens") if usage is not None else None
        rec.chunk_usage.append(done if isinstance(done, int) else None)
    if choice.get("finish_reason"):
        rec.finish_reason = str(choice["finish_reason"])
        rec.end = now


def close_stream(rec: RawRequest, now: float) -> None:
    """The stream closed: a request that saw neither [DONE] nor a finish reason is truncated; a complete one
    without generated text failed with NO_TOKENS."""
    if rec.error is not None:
        return
    if not rec.done and rec.finish_reason is None:
        rec.fail(TRUNCATED, f"{TRUNCATED}: the stream ended after {len(rec.chunk_t)} chunks without [DONE]", now)
    elif not rec.chunk_t:
        rec.fail(NO_TOKENS, f"{NO_TOKENS}: the stream ended without generated text", now)
    elif not rec.end:
        rec.end = now


def replay(rec: RawRequest) -> None:
    """Parse the bytes a request received (``rec.pieces``, as the load loop read them, unparsed so that
    the loop does nothing per chunk but stamp it) into its events: each line takes the arrival time of the
    read that completed it. Then close the stream (``close_stream``) at the body's end."""
    buf = b""
    for t, piece in rec.pieces:
        buf += piece
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if feed_line(rec, line, t):
                rec.pieces = []
                return close_stream(rec, t)
    if buf:
        feed_line(rec, buf, rec.eof)
    rec.pieces = []
    close_stream(rec, rec.eof)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A complete request's figures (ms): TTFT from its scheduled send, e2e, TPOT (None with one token), its
    per-token inter-token latencies; input and output tokens and where each came from; the tokens each chunk
    carried; whether output overran ``max_tokens``; the server's own prefill and per-token times (llama.cpp
    ``timings``; None otherwise)."""

    end: float
    ttft_ms: float
    e2e_ms: float
    tpot_ms: float | None
    itl_ms: list[float]
    input_tokens: int
    input_source: str
    output_tokens: int
    output_source: str
    chunks: int
    overrun: bool
    server_ttft_ms: float | None
    server_tpot_ms: float | None
    send_lag_ms: float | None = None  # from the scheduled send to the request's write: the client's own delay
    ttfot_ms: float | None = None  # to the first output (content or tool-call) chunk; None: only reasoning came
    reasoning_tokens: int = 0  # of ``output_tokens``, those in reasoning chunks
    input_requested: int | None = None  # the prompt tokens the workload meant (its tokenizer's or words' count)
    output_requested: int | None = None  # the request's max_tokens
    cached_tokens: int | None = None  # prompt tokens the server served from its prefix cache (None: not said)
    turn: int = 0  # its turn in a session (1, 2, ...; 0: a request of its own)


def _spread(total: int, weights: list[int]) -> list[int]:
    """``total`` tokens over chunks in proportion to ``weights`` (evenly when all are 0), whole numbers
    summing to ``total`` (largest remainders)."""
    w = [max(x, 0) for x in weights]
    s = sum(w) or len(w)
    if not sum(w):
        w = [1] * len(w)
    raw = [total * x / s for x in w]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[:total - sum(out)]:
        out[i] += 1
    return out


def chunk_tokens(rec: RawRequest, count: Callable[[str], int] | None) -> tuple[list[int], int, str]:
    """Tokens per content chunk, the output total and its source (``usage``, ``tokenizer`` or ``chunks``)."""
    n = len(rec.chunk_t)
    per_chunk = rec.chunk_usage
    if n and all(u is not None for u in per_chunk) and len({*per_chunk}) == n:  # cumulative usage per chunk
        counts = [int(u) - int(p) for u, p in zip(per_chunk, [0, *per_chunk[:-1]], strict=True)]  # type: ignore[arg-type]
        return counts, int(per_chunk[-1]), "usage"  # type: ignore[arg-type]
    total = rec.usage.get("completion_tokens") if rec.usage else None
    source = "usage"
    if not isinstance(total, int):
        if count is not None:
            total, source = count("".join(rec.chunk_text)), "tokenizer"
        else:
            return [1] * n, n, "chunks"
    weights = [count(t) for t in rec.chunk_text] if count is not None else [1] * n
    return _spread(total, weights), total, source


def itl_values(chunk_t: list[float], counts: list[int]) -> list[float]:
    """Per-token inter-token latencies (ms): chunk i>0 after gap g with k tokens gives k values g/k (a chunk
    with no token adds its gap to the next one's)."""
    out: list[float] = []
    prev = chunk_t[0] if chunk_t else 0.0
    for t, k in zip(chunk_t[1:], counts[1:], strict=False):
        if k <= 0:
            continue
        out.extend([(t - prev) * 1e3 / k] * k)
        prev = t
    return out


def _server_times(timings: dict[str, Any] | None) -> tuple[float | None, float | None]:
    """llama.cpp's per-request ``timings``: prompt (prefill) ms and ms per predicted token."""
    if not timings:
        return None, None
    prompt = timings.get("prompt_ms")
    per = timings.get("predicted_per_token_ms")
    return (float(prompt) if isinstance(prompt, int | float) else None,
            float(per) if isinstance(per, int | float) else None)


def kinds(rec: RawRequest) -> list[str]:
    """Each chunk's kind (``RawRequest.chunk_kind``; all ``content`` where a record holds none)."""
    return rec.chunk_kind if len(rec.chunk_kind) == len(rec.chunk_t) else ["content"] * len(rec.chunk_t)


def cached_tokens(rec: RawRequest) -> int | None:
    """The prompt tokens the server says it took from its prefix cache: ``usage.prompt_tokens_details.cached_tokens``
    (OpenAI, vLLM with ``--enable-prompt-tokens-details``, llama.cpp's server), else llama.cpp's ``timings.cache_n``;
    None where it says neither."""
    details = rec.usage.get("prompt_tokens_details") if rec.usage else None
    got = details.get("cached_tokens") if isinstance(details, dict) else None
    if got is None and rec.timings:
        got = rec.timings.get("cache_n")
    return got if isinstance(got, int) and not isinstance(got, bool) else None


def account(rec: RawRequest, count: Callable[[str], int] | None) -> Outcome:
    """The figures of a complete request (``rec.error`` None, at least one chunk); ``count``: the
    tokenizer's token count of a text, None without one."""
    counts, n_out, out_source = chunk_tokens(rec, count)
    ttft = (rec.chunk_t[0] - rec.scheduled) * 1e3
    e2e = (max(rec.end, rec.chunk_t[-1]) - rec.scheduled) * 1e3
    prompt = rec.usage.get("prompt_tokens") if rec.usage else None
    n_in, in_source = (prompt, "usage") if isinstance(prompt, int) else (rec.prompt_tokens, rec.prompt_source)
    server_ttft, server_tpot = _server_times(rec.timings)
    kind = kinds(rec)
    said = (rec.usage or {}).get("completion_tokens_details")
    thought = said.get("reasoning_tokens") if isinstance(said, dict) and out_source == "usage" else None
    first_out = next((t for t, k in zip(rec.chunk_t, kind, strict=True) if k != "reasoning"), None)
    return Outcome(end=max(rec.end, rec.chunk_t[-1]), ttft_ms=ttft, e2e_ms=e2e,
                   tpot_ms=(e2e - ttft) / (n_out - 1) if n_out > 1 else None,
                   itl_ms=itl_values(rec.chunk_t, counts), input_tokens=n_in, input_source=in_source,
                   output_tokens=n_out, output_source=out_source, chunks=len(rec.chunk_t),
                   overrun=_overrun(rec, n_out, out_source), server_ttft_ms=server_ttft, server_tpot_ms=server_tpot,
                   send_lag_ms=(rec.wrote - rec.scheduled) * 1e3 if rec.wrote else None,
                   ttfot_ms=None if first_out is None else (first_out - rec.scheduled) * 1e3,
                   reasoning_tokens=thought if isinstance(thought, int) and thought >= 0 else
                   sum(c for c, k in zip(counts, kind, strict=True) if k == "reasoning"),
                   input_requested=rec.prompt_tokens, output_requested=rec.max_tokens,
                   cached_tokens=cached_tokens(rec), turn=rec.turn)


def _overrun(rec: RawRequest, n_out: int, source: str) -> bool:
    """Whether the server generated more than ``max_tokens``: by its own usage; without usage only when the
    chunks alone outnumber the limit (each holds at least one token). A client tokenizer re-tokenizing the
    text counts differently from the server (byte-level pieces merge), so its count never flags a server."""
    return n_out > rec.max_tokens if source == "usage" else len(rec.chunk_t) > rec.max_tokens
