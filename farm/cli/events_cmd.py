"""``farm events JOB``: an LLM job's event log (one per request) and its TTFT, ITL and TPOT by farm's, ``vllm bench
serve``'s, AIPerf's and GuideLLM's definitions side by side; ``--parquet``/``--requests-parquet`` write it out."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich import box
from rich.table import Table

from farm.cli.prepare import prepare_db
from farm.cli.views import console, err_console, safe_row, say
from farm.errors import RequestError
from farm.llm_events import TOOLS, ToolFigure, measured
from farm.readers.events import job_events, side_by_side, stored_figures, write_parquet
from farm.readers.rows import ResultRow
from farm.settings import get_settings

FIGURES = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT"}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f}"


def figures_table(figures: list[ToolFigure], title: str) -> Table:
    """Each figure's p50 and p99 (ms) by each tool's definition, one row per figure and statistic."""
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("ms")
    for tool in TOOLS:
        table.add_column(tool, justify="right")
    for stat in ("p50", "p99"):
        for figure, by_tool in side_by_side(figures, stat).items():
            safe_row(table, f"{FIGURES[figure]} {stat}", *(_ms(by_tool[t]) for t in TOOLS))
    return table


def figure_lines(figures: list[ToolFigure]) -> list[str]:
    """What each tool's figure is taken over, where the tools differ in kind."""
    return [f"{FIGURES[f.figure]} {f.tool}: {f.name} over {f.n} {f.over}" for f in figures if f.over != "requests"]


def events_cmd(
    job_id: str = typer.Argument(..., help="The job id (`farm results` shows it; a unique prefix will do)."),
    parquet: Path | None = typer.Option(None, "--parquet", help="Write every event (one row each: scheduled, sent, "
                                        "first_byte, chunk, end, error) as Parquet; units in the column names and "
                                        "field metadata."),
    requests_parquet: Path | None = typer.Option(None, "--requests-parquet", help="Write one row per request with "
                                                 "its TTFT, ITL and TPOT by each tool's definition as Parquet."),
    as_json: bool = typer.Option(False, "--json", help="The tools' figures and the log's counts as JSON."),
) -> None:
    """An LLM job's event log: TTFT, ITL and TPOT by farm's, vllm bench's, AIPerf's and GuideLLM's definitions
    side by side (docs/llm.md), and the log itself as Parquet."""
    if get_settings().remote:
        raise RequestError("farm events reads the farm's database: run it on a farm host (FARM_DATABASE_URL), not "
                           "through FARM_API_URL")
    prepare_db()
    job = job_events(job_id)
    for path in (parquet, requests_parquet):
        if path is not None and not path.parent.is_dir():
            raise RequestError(f"no folder {path.parent} for {path}; create it or give another path")
    write_parquet(job, parquet, requests_parquet)
    for path in (parquet, requests_parquet):
        if path is not None:
            say(f"wrote {path}", to=err_console)
    log = job.log
    if as_json:
        print(json.dumps({"job_id": job.job_id, "requests": len(log.seq), "requests_total": log.requests_total,
                          "measured": len(measured(log)),
                          "chunks": sum(log.chunks), "chunks_logged": len(log.chunk_us), "cut": log.cut,
                          "figures": [asdict(f) for f in job.figures]}, indent=2))
        return
    console.print(figures_table(job.figures, f"job {job.job_id}: {len(measured(log))} measured requests of "
                                f"{len(log.seq)}, {sum(log.chunks)} chunks"))
    for line in figure_lines(job.figures):
        say(line)
    if log.cut:
        say(f"the log was cut: it keeps {len(log.seq)} of {log.requests_total} requests (FARM_EVENT_LOG_MAX_REQUESTS)"
            f" and {len(log.chunk_us)} of their {sum(log.chunks)} chunk events (FARM_EVENT_LOG_MAX_CHUNKS="
            f"{log.max_chunks}); the figures above are over every request", style="yellow")


def register(app: typer.Typer) -> None:
    app.command("events")(events_cmd)


def wide_lines(rows: list[ResultRow]) -> list[str]:
    """``farm results --wide``: per LLM job, its TTFT, ITL and TPOT p50 by each tool's definition (stored by the
    worker with its result; ``farm events JOB`` for the p99s and the log)."""
    if get_settings().remote:  # the API's rows: the figures are in each job's details there (`farm events` on a host)
        return []
    figures = stored_figures([r.job_id for r in rows if r.llm is not None])
    lines = []
    for jid, figs in figures.items():
        parts = [f"{FIGURES[figure]} " + " | ".join(_ms(by_tool[t]) for t in TOOLS)
                 for figure, by_tool in side_by_side(figs).items()]
        lines.append(f"job {jid[:8]} p50 ms by {' | '.join(TOOLS)}: " + "; ".join(parts))
    return lines
