"""Request traces an LLM job replays (``--trace FILE``): parsed with strict validation, scaled, and turned into a
send schedule. Pure functions of the file's bytes and the request's ``trace_*`` settings, used at submit (where a
bad trace is a one-line ``RequestError`` naming its line, before any job) and on the worker (which reads the copy
uploaded with the request).

Formats, told apart by their first line:

- Mooncake JSONL: one object a line with ``timestamp`` (ms), ``input_length``, ``output_length`` and optional
  ``hash_ids`` (one id per ``BLOCK_TOKENS``-token block of the prompt: equal ids, equal blocks);
- BurstGPT CSV: ``Timestamp`` (s), ``Model``, ``Request tokens``, ``Response tokens``, ``Total tokens``,
  ``Log Type``;
- the Azure LLM inference trace CSV: ``TIMESTAMP`` (a date and time), ``ContextTokens``, ``GeneratedTokens``.

Any other key or column is an error, as are timestamps that are negative or go back, and lengths that are not
whole numbers of at least 1 token. ``trace_tokens`` scales every length and the block size; ``trace_speed``
divides the gaps (2: twice as fast); ``trace_limit`` keeps the first N requests. The stdlib's ``csv`` and ``json``
read the files; the checks are farm's own (no library knows these formats).
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from farm.errors import RequestError

BLOCK_TOKENS = 512  # Mooncake's block: the tokens one hash id stands for
#: the most prompt tokens a replayed trace may hold in all after scaling and limit (what the worker builds)
MAX_TRACE_TOKENS = 4_000_000
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: its ``line`` in the file, arrival (ms from the trace's start), prompt and output
    tokens, and the hash ids of its prompt's blocks (empty: unique content)."""

    line: int
    t_ms: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Trace:
    """A parsed trace, scaled and limited: its rows in order and the block size (tokens) of their hash ids."""

    rows: tuple[TraceRow, ...]
    block_tokens: int
    format: str

    def offsets_s(self, speed: float = 1.0) -> tuple[float, ...]:
        """Each row's send time (s after the first row's), the gaps divided by ``speed``."""
        return schedule([r.t_ms for r in self.rows], speed)

    def rate(self, speed: float = 1.0) -> float:
        """The mean offered rate (requests/s) at ``speed``: the rows after the first over the span (all at once: the
        row count)."""
        offsets = self.offsets_s(speed)
        span = offsets[-1] if offsets else 0.0
        return (len(offsets) - 1) / span if span > 0 else float(max(1, len(offsets)))

    def tokens(self) -> int:
        """The prompt tokens of all rows together."""
        return sum(r.input_tokens for r in self.rows)


def schedule(times_ms: list[float], speed: float = 1.0) -> tuple[float, ...]:
    """Send offsets (s from the first) of arrivals at ``times_ms`` (ms, non-decreasing), gaps divided by ``speed``."""
    if speed <= 0:
        raise ValueError(f"trace speed must be above 0, got {speed:g}")
    t0 = times_ms[0] if times_ms else 0.0
    return tuple((t - t0) / 1e3 / speed for t in times_ms)


def scale_tokens(n: int, scale: float) -> int:
    """``n`` tokens at token scale ``scale``: rounded, at least 1."""
    return max(1, round(n * scale))


def scaled(rows: list[TraceRow], tokens: float, limit: int | None) -> list[TraceRow]:
    """The first ``limit`` rows (None: all), every length times ``tokens`` (at least 1 token)."""
    kept = rows[:limit] if limit is not None else rows
    if tokens == 1.0:
        return list(kept)
    return [TraceRow(r.line, r.t_ms, scale_tokens(r.input_tokens, tokens), scale_tokens(r.output_tokens, tokens),
                     r.hash_ids) for r in kept]


def _bad(label: str, line: int, what: str) -> RequestError:
    return RequestError(f"--trace {label}: line {line}: {what}")


def _count(label: str, line: int, name: str, value: Any) -> int:
    """A length field: a whole number of at least 1 (a CSV's text too)."""
    if isinstance(value, str):
        try:
            value = float(value.strip()) if "." in value else int(value.strip())
        except ValueError:
            raise _bad(label, line, f"{name} {value[:40]!r} is not a number of tokens") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(label, line, f"{name} {str(value)[:40]!r} is not a whole number of tokens of at least 1")
    return value


def _time(label: str, line: int, name: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _bad(label, line, f"{name} {value[:40]!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(label, line, f"{name} {str(value)[:40]!r} is not a number")
    if value < 0:
        raise _bad(label, line, f"{name} {value:g} is negative; give times from the trace's start")
    return float(value)


def _mooncake(label: str, text: str) -> Iterator[TraceRow]:
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _bad(label, i, f"not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise _bad(label, i, "not a JSON object")
        unknown = [k for k in item if k not in MOONCAKE_KEYS]
        if unknown:
            raise _bad(label, i, f"unknown key {unknown[0]!r} (a Mooncake line has {', '.join(MOONCAKE_KEYS)})")
        missing = [k for k in MOONCAKE_KEYS[:3] if k not in item]
        if missing:
            raise _bad(label, i, f"no {missing[0]!r} (a Mooncake line has {', '.join(MOONCAKE_KEYS)})")
        ids = item.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                for h in ids):
            raise _bad(label, i, "hash_ids is not a list of whole numbers of at least 0")
        yield TraceRow(i, _time(label, i, "timestamp", item["timestamp"]),
                       _count(label, i, "input_length", item["input_length"]),
                       _count(label, i, "output_length", item["output_length"]), tuple(ids))


def _azure_ms(label: str, line: int, value: str) -> float:
    """An Azure ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``) in ms since the epoch."""
    try:
        return datetime.fromisoformat(value.strip()).timestamp() * 1e3
    except ValueError:
        raise _bad(label, line, f"TIMESTAMP {value[:40]!r} is not a date and time (2023-11-16 18:15:46.680)") \
            from None


def _csv(label: str, text: str) -> Iterator[TraceRow]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header = [h.strip() for h in next(reader, [])]
    azure = "TIMESTAMP" in header
    known = AZURE_COLUMNS if azure else BURSTGPT_COLUMNS
    name = "Azure" if azure else "BurstGPT"
    unknown = [h for h in header if h not in known]
    if unknown:
        raise _bad(label, 1, f"unknown column {unknown[0]!r} (a {name} trace has {', '.join(known)})")
    need = AZURE_COLUMNS if azure else ("Timestamp", "Request tokens", "Response tokens")
    missing = [h for h in need if h not in header]
    if missing:
        raise _bad(label, 1, f"no {missing[0]!r} column (a {name} trace has {', '.join(known)})")
    at = {h: header.index(h) for h in header}
    t0: float | None = None
    for cells in reader:
        i = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise _bad(label, i, f"{len(cells)} cells where the header has {len(header)}")
        if azure:
            ms = _azure_ms(label, i, cells[at["TIMESTAMP"]])
            t0 = ms if t0 is None else t0
            yield TraceRow(i, ms - t0, _count(label, i, "ContextTokens", cells[at["ContextTokens"]]),
                           _count(label, i, "GeneratedTokens", cells[at["GeneratedTokens"]]))
        else:
            yield TraceRow(i, _time(label, i, "Timestamp", cells[at["Timestamp"]]) * 1e3,
                           _count(label, i, "Request tokens", cells[at["Request tokens"]]),
                           _count(label, i, "Response tokens", cells[at["Response tokens"]]))


def parse(text: str, label: str) -> tuple[list[TraceRow], str]:
    """The rows of trace ``text`` (ordered: a timestamp going back, or an Azure row before the first, is an error)
    and its format (``mooncake``, ``burstgpt``, ``azure``); RequestError (one line, naming the line) on bad input."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    if not first:
        raise RequestError(f"--trace {label}: holds no request")
    fmt = "mooncake" if first.lstrip().startswith("{") else "azure" if "TIMESTAMP" in first else "burstgpt"
    rows: list[TraceRow] = []
    for row in (_mooncake(label, text) if fmt == "mooncake" else _csv(label, text)):
        if row.t_ms < 0:  # an Azure row before the first
            raise _bad(label, row.line, "its time is before the first row's; sort the trace by time")
        if rows and row.t_ms < rows[-1].t_ms:
            raise _bad(label, row.line, f"its time ({row.t_ms:g} ms) is before line {rows[-1].line}'s "
                                        f"({rows[-1].t_ms:g} ms); sort the trace by time")
        rows.append(row)
    if not rows:
        raise RequestError(f"--trace {label}: holds no request")
    return rows, fmt


def read(path: Path, label: str, tokens: float = 1.0, limit: int | None = None,
         max_bytes: int | None = None) -> Trace:
    """The trace at ``path`` (at most ``max_bytes`` read), its first ``limit`` rows scaled by ``tokens`` (the block
    size too); RequestError (one line) on a file that cannot be read or holds a bad line."""
    try:
        with open(path, "rb") as f:
            data = f.read(-1 if max_bytes is None else max_bytes + 1)
        text = data.decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise RequestError(f"--trace {label}: cannot read it ({exc})") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise RequestError(f"--trace {label}: larger than the {max_bytes / 2**20:.0f} MiB a request may upload "
                           "(FARM_MAX_WORKLOAD_FILE_BYTES)")
    rows, fmt = parse(text, label)
    return Trace(tuple(scaled(rows, tokens, limit)), scale_tokens(BLOCK_TOKENS, tokens), fmt)


def check(trace: Trace, label: str, context: int | None, max_prompt_tokens: int, tokens: float) -> None:
    """RequestError (one line, naming the line) for a row over this host's prompt cap or, prompt and output
    together, the model's ``context`` (None: unknown), after token scale ``tokens``; or a trace over
    ``MAX_TRACE_TOKENS`` in all."""
    scale = f" after --trace-tokens {tokens:g}" if tokens != 1.0 else ""
    for r in trace.rows:
        if r.input_tokens > max_prompt_tokens:
            raise _bad(label, r.line, f"a prompt of {r.input_tokens} tokens{scale} is above the {max_prompt_tokens} "
                                      "a prompt may hold here (FARM_MAX_PROMPT_TOKENS); lower --trace-tokens")
        if context is not None and r.input_tokens + r.output_tokens > context:
            raise _bad(label, r.line, f"input {r.input_tokens} + output {r.output_tokens} tokens{scale} do not fit "
                                      f"the model's context of {context} tokens; lower --trace-tokens")
    if trace.tokens() > MAX_TRACE_TOKENS:
        raise RequestError(f"--trace {label}: {trace.tokens()} prompt tokens{scale} in all, above the "
                           f"{MAX_TRACE_TOKENS} a replay may build; use --trace-limit N or a lower --trace-tokens")
