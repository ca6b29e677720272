"""Readers of an LLM job's event log (``farm.llm_events``): the log as stored, its events as rows (one per event:
scheduled, sent, first byte, each chunk, end or error), its requests with each tool's TTFT/ITL/TPOT beside farm's,
and both as Parquet with the unit of every column in its name and its field metadata (``farm events``)."""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from farm.db.models import Result
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.llm_events import KIND_NAME, TOOLS, US, EventLog, ToolFigure, request_figures, tool_summary
from farm.op_profile import resolve_job

if TYPE_CHECKING:
    import pyarrow as pa

Cell = int | float | bool | str | None


@dataclass(frozen=True)
class JobEvents:
    """A job's event log and the tools' figures over it."""

    job_id: str
    log: EventLog
    figures: list[ToolFigure]


def job_events(job_id: str) -> JobEvents:
    """The event log of job ``job_id`` (a unique prefix will do); RequestError saying why when there is none."""
    with session_scope() as s:
        jid = resolve_job(s, job_id)
        details = s.execute(select(Result.details).where(Result.job_id == jid)).scalar()
    if details is None:
        raise RequestError(f"job {jid} has no result yet; `farm status` shows where it stands")
    load = details.get("load") if isinstance(details, dict) else None
    log = EventLog.of(load.get("event_log") if isinstance(load, dict) else None)
    if log is None:
        raise RequestError(f"job {jid} has no event log: only LLM jobs (--api openai-chat|openai-completions) "
                           "measured by this farm version keep one")
    stored = load.get("tool_figures") if isinstance(load, dict) else None  # over every request, the log capped or not
    figures = [ToolFigure(**f) for f in stored] if isinstance(stored, list) and stored else tool_summary(log)
    return JobEvents(jid, log, figures)


def stored_figures(job_ids: list[str]) -> dict[str, list[ToolFigure]]:
    """The tools' figures the worker stored with each LLM job's result (jobs without them left out)."""
    if not job_ids:
        return {}
    with session_scope() as s:
        got = s.execute(select(Result.job_id, Result.details[("load", "tool_figures")])
                        .where(Result.job_id.in_(job_ids))).all()
    return {jid: [ToolFigure(**f) for f in figs] for jid, figs in got if isinstance(figs, list) and figs}


#: the events table's columns: (name, Arrow type name, unit)
EVENT_COLUMNS = (("request_seq", "int64", ""), ("warm", "bool", ""), ("event", "string", ""),
                 ("t_ms", "float64", "ms"), ("since_sent_ms", "float64", "ms"), ("tokens", "int64", "tokens"),
                 ("kind", "string", ""), ("error", "string", ""))


def _request_events(log: EventLog, i: int, chunks: slice) -> Iterator[tuple[str, int | None, int | None, str | None]]:
    """Request ``i``'s events in time order: (event, µs, tokens, kind)."""
    yield "scheduled", log.scheduled_us[i], None, None
    yield "sent", log.sent_us[i], None, None
    if log.first_byte_us[i] is not None:
        yield "first_byte", log.first_byte_us[i], None, None
    for t, k, kind in zip(log.chunk_us[chunks], log.chunk_tokens[chunks], log.chunk_kind[chunks], strict=True):
        yield "chunk", t, k, KIND_NAME.get(kind, "content")
    yield ("end" if log.error[i] is None else "error"), log.end_us[i], None, None


def event_rows(log: EventLog) -> list[dict[str, Cell]]:
    """One row per event of every request (:data:`EVENT_COLUMNS`); times in ms from the run's start and from the
    request's send."""
    rows: list[dict[str, Cell]] = []
    for i, chunks in enumerate(log.chunk_slices()):
        for event, t, tokens, kind in _request_events(log, i, chunks):
            rows.append({"request_seq": log.seq[i], "warm": log.warm[i], "event": event,
                         "t_ms": None if t is None else t * US,
                         "since_sent_ms": None if t is None else (t - log.sent_us[i]) * US,
                         "tokens": tokens, "kind": kind, "error": log.error[i] if event == "error" else None})
    return rows


#: the requests table's own columns before the tools' figures: (name, Arrow type name, unit)
REQUEST_COLUMNS = (("request_seq", "int64", ""), ("warm", "bool", ""), ("error", "string", ""),
                   ("output_tokens", "int64", "tokens"), ("reasoning_tokens", "int64", "tokens"),
                   ("token_source", "string", ""), ("chunks", "int64", "count"), ("chunks_logged", "int64", "count"))


def request_rows(log: EventLog) -> list[dict[str, Cell]]:
    """One row per request: its counts and its figures (ms) by each tool's definition (``request_figures``)."""
    return [{"request_seq": log.seq[i], "warm": log.warm[i], "error": log.error[i],
             "output_tokens": log.output_tokens[i], "reasoning_tokens": log.reasoning_tokens[i],
             "token_source": log.token_source[i], "chunks": log.chunks[i], "chunks_logged": log.kept[i],
             **request_figures(log, i)} for i in range(len(log.seq))]


def _schema(columns: tuple[tuple[str, str, str], ...], meta: Mapping[str, str]) -> pa.Schema:
    import pyarrow as pa  # noqa: PLC0415 - 0.2-0.4 s to import, measured: only Parquet exports pay it

    types = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string()}
    return pa.schema([pa.field(name, types[typ], metadata={"unit": unit} if unit else None)
                      for name, typ, unit in columns], metadata=dict(meta))


def figure_columns() -> tuple[tuple[str, str, str], ...]:
    """The requests table's figure columns (every one in ms)."""
    probe = request_figures(EventLog(seq=[0], warm=[False], scheduled_us=[0], sent_us=[0], first_byte_us=[None],
                                     first_chunk_us=[None], first_output_us=[None], last_chunk_us=[None],
                                     end_us=[None], error=[None], output_tokens=[0]), 0)
    return tuple((name, "float64", "ms") for name in probe)


def _metadata(job: JobEvents) -> dict[str, str]:
    return {"farm.job_id": job.job_id, "farm.event_log_cut": str(job.log.cut).lower(),
            "farm.requests_total": str(job.log.requests_total),
            "farm.event_log_max_chunks": str(job.log.max_chunks), "farm.time_origin": "the run's start (monotonic)",
            "farm.tool_figures": json.dumps([asdict(f) for f in job.figures]),
            "farm.definitions": "docs/llm.md, 'TTFT, ITL and TPOT by tool'"}


def write_parquet(job: JobEvents, events: Path | None, requests: Path | None) -> None:
    """Write the job's events (one row per event) and requests (one per request, each tool's figures) as Parquet."""
    try:
        import pyarrow as pa  # noqa: PLC0415 - as in _schema
        import pyarrow.parquet as pq  # noqa: PLC0415 - as in _schema
    except ImportError:  # pragma: no cover - a runtime dependency; a broken install says so
        raise RequestError("Parquet export needs pyarrow: pip install pyarrow") from None
    meta = _metadata(job)
    if events is not None:
        pq.write_table(pa.Table.from_pylist(event_rows(job.log), schema=_schema(EVENT_COLUMNS, meta)), events)
    if requests is not None:
        schema = _schema(REQUEST_COLUMNS + figure_columns(), meta)
        pq.write_table(pa.Table.from_pylist(request_rows(job.log), schema=schema), requests)


def side_by_side(figures: list[ToolFigure], stat: str = "p50") -> dict[str, dict[str, float | None]]:
    """``stat`` of each figure by tool: {figure: {tool: ms}}, in :data:`TOOLS` order."""
    out: dict[str, dict[str, float | None]] = {}
    for f in figures:
        out.setdefault(f.figure, dict.fromkeys(TOOLS))[f.tool] = getattr(f, stat)
    return out
