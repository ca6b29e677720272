"""``farm results``' output: the table (80 columns by default, ``--wide``, ``--columns``) or an export (CSV, JSON,
Parquet), to the terminal or to a file with ``-o``: one column set per format wherever it goes
(``farm.readers.export.EXPORT_COLUMNS``; docs/cli.md lists them with their units)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.measure import Measurement

from farm.cli import events_cmd, views
from farm.errors import RequestError
from farm.readers import export
from farm.readers.results import find_request, merge_repeats, result_rows
from farm.readers.rows import ResultRow

FORMATS = ("table", "wide", "csv", "json", "parquet")
#: the widest the wide table may get, columns
WIDE_MAX = 400
#: a file's table width, columns: the wide table's widest row fits
FILE_TABLE_WIDTH = 240


def parse_output(fmt: str, output: Path | None, wide: bool) -> tuple[str, Path | None, bool]:
    """(format, file, wide) from ``--format``, ``-o`` and ``--wide``: ``--format wide`` and kubectl's ``-o wide``
    are the wide table (a file called ``wide`` needs a path: ``-o ./wide.txt``)."""
    if fmt not in FORMATS:
        raise RequestError(f"--format {fmt!r} is unknown; use one of {', '.join(FORMATS)}")
    if output is not None and str(output) == "wide" and fmt == "table":
        return "table", None, True
    if fmt == "wide":
        return "table", output, True
    if fmt == "parquet" and output is None:
        raise RequestError("Parquet is binary and is not written to a terminal: give a file with "
                           "-o results.parquet (or use --format csv or json on stdout)")
    return fmt, output, wide


def rows_for(request_id: str, fmt: str, merge_with: list[str] | None) -> list[ResultRow]:
    """The rows a format shows: exports have ``EXPORT_COLUMNS`` (the same to stdout and to a file); with
    ``merge_with`` (``--merge-repeats``) and in the table, repeats of one configuration merged into one row."""
    if merge_with is not None:
        return merge_repeats(result_rows(request_id) + [r for rid in merge_with for r in result_rows(rid)])
    if fmt != "table":
        return export.export_rows(request_id)
    rows = result_rows(request_id)
    if any(r["repeat"] for r in rows):  # the request's --repeats: median and range per cell
        return merge_repeats(rows, center="median")
    return rows


def show(request_id: str, fmt: str, output: Path | None = None, *, wide: bool = False,
         metrics: tuple[str, ...] | None = None, merge_with: list[str] | None = None, with_id: bool = False) -> None:
    """Print (or with ``output`` write) the request's results as ``fmt``."""
    rows = rows_for(request_id, fmt, merge_with)
    if fmt == "table":
        title = results_title(request_id, rows, merge_with)
        if output is None:
            print_table(views.console, rows, title, metrics, wide)
            return
        with output.open("w", encoding="utf-8") as fh:
            print_table(Console(file=fh, width=FILE_TABLE_WIDTH, no_color=True, emoji=False), rows, title, metrics,
                        wide)
        return
    if fmt == "json" and with_id:
        text: str | None = json.dumps({"request_id": find_request(request_id).id,
                                       "results": json.loads(views.to_json(rows))}, indent=2) + "\n"
    else:
        text = export.write(rows, fmt, output)
    if text is not None:
        sys.stdout.write(text)


def print_table(console: Console, rows: list[ResultRow], title: str, metrics: tuple[str, ...] | None,
                wide: bool) -> None:
    """The results table and its footnotes (how measured, errors, host notes) on ``console``."""
    table = views.results_table(rows, title=title, metrics=metrics, wide=wide)
    # the wide table is never squeezed into the terminal (kubectl's -o wide): long lines wrap or scroll there
    if wide:
        width = Measurement.get(console, console.options.update_width(WIDE_MAX), table).maximum
        if width > console.width:
            console = Console(file=console.file, width=width, force_terminal=console.is_terminal,
                              color_system=console.color_system, no_color=console.no_color)  # type: ignore[arg-type]
    console.print(table)
    for line in (views.measured_lines(rows) + views.repeat_lines(rows) + views.turn_lines(rows)
                 + (events_cmd.wide_lines(rows) if wide else [])):
        views.say(line, to=console)
    for line in views.error_lines(rows):
        views.say(line, style="red", to=console)
    for line in (views.steal_lines(rows) + views.host_lines(rows) + views.shared_lines(rows)
                 + views.client_limited_lines(rows)):
        views.say(line, style="yellow", to=console)


def results_title(request_id: str, rows: list[ResultRow], merge_with: list[str] | None) -> str:
    """The results table's title: the request, what it was merged with, and what all its rows share."""
    title = f"request {find_request(request_id).id}"
    if merge_with:
        title += f" merged with {', '.join(find_request(rid).id for rid in merge_with)}"
    if rows and rows[0]["rpc"] == "stream":
        title += " (load over ModelStreamInfer streams)"
    clients = sorted({r.get("client") or "farm" for r in rows} - {"auto"})  # auto: not measured yet
    if clients and clients != ["farm"]:
        title += f" (load sent by {' and '.join(clients)})"
    if rows and rows[0].get("server"):
        title += f"; server {rows[0]['server']}"
    if rows and rows[0].get("input_data", "random") != "random":
        title += f"; input data {rows[0]['input_data']}"
    return title
