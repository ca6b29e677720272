"""The OpenAI client's recorder of one event log per request (``farm.llm_events``): built after the run from the
requests the load process kept (``HttpRun``), so the load loop does nothing more per chunk, and capped before it is
stored with the job's result (``FARM_EVENT_LOG_MAX_CHUNKS`` chunk events)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from farm.llm_events import IN_FLIGHT, KIND_LETTER, EventLog, ToolFigure, tool_summary
from workers.loadgen.openai.load_loop import HttpRun
from workers.loadgen.openai.stream import RawRequest, chunk_tokens, kinds


@dataclass
class _Columns:
    """The log's columns as they are filled."""

    per_request: dict[str, list[int | bool | str | None]] = field(default_factory=dict)
    chunk_us: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    chunk_kind: list[str] = field(default_factory=list)

    def add(self, **values: int | bool | str | None) -> None:
        for name, value in values.items():
            self.per_request.setdefault(name, []).append(value)


def _us(t: float, t0: float) -> int | None:
    """``t`` (monotonic s; 0: never) in µs from ``t0``."""
    return round((t - t0) * 1e6) if t else None


def _add(cols: _Columns, rec: RawRequest, t0: float, count: Callable[[str], int] | None, cut: bool) -> None:
    counts, total, source = chunk_tokens(rec, count) if rec.chunk_t else ([], 0, "chunks")
    kind = kinds(rec)
    out_t = next((t for t, k in zip(rec.chunk_t, kind, strict=True) if k != "reasoning"), 0.0)
    cols.add(seq=rec.seq, warm=rec.warm, scheduled_us=_us(rec.scheduled, t0) or 0,
             sent_us=_us(rec.wrote or rec.sent, t0) or 0, first_byte_us=_us(rec.first_byte, t0),
             first_chunk_us=_us(rec.chunk_t[0], t0) if rec.chunk_t else None, first_output_us=_us(out_t, t0),
             last_chunk_us=_us(rec.chunk_t[-1], t0) if rec.chunk_t else None,
             end_us=_us(rec.end or rec.eof, t0), error=IN_FLIGHT if cut else rec.error, output_tokens=total,
             reasoning_tokens=sum(c for c, k in zip(counts, kind, strict=True) if k == "reasoning"),
             token_source=source, chunks=len(rec.chunk_t), kept=len(rec.chunk_t))
    cols.chunk_us += [round((t - t0) * 1e6) for t in rec.chunk_t]
    cols.chunk_tokens += counts
    cols.chunk_kind += [KIND_LETTER.get(k, "c") for k in kind]


def event_log(run: HttpRun, count: Callable[[str], int] | None) -> EventLog:
    """Every request of ``run`` (those cut off in flight at its end too, marked :data:`IN_FLIGHT`) in send order,
    uncapped; ``count``: the tokenizer's count of a text (None: without one), as the accounting counts."""
    cols = _Columns()
    cut = {id(r) for r in run.cut}
    for rec in sorted((*run.records, *run.cut), key=lambda r: r.seq):
        _add(cols, rec, run.t_start, count, id(rec) in cut)
    return EventLog(**cols.per_request, chunk_us=cols.chunk_us, chunk_tokens=cols.chunk_tokens,  # type: ignore[arg-type]
                    chunk_kind="".join(cols.chunk_kind), max_chunks=len(cols.chunk_us),
                    requests_total=len(cols.per_request.get("seq", [])))


def recorded(run: HttpRun, count: Callable[[str], int] | None, max_chunks: int,
             max_requests: int | None = None) -> tuple[EventLog, list[ToolFigure]]:
    """The run's log capped at its first ``max_requests`` requests (None: all) and ``max_chunks`` chunk events, and
    the tools' figures over the whole (uncapped) log."""
    log = event_log(run, count)
    return log.capped(max_chunks, max_requests), tool_summary(log)
