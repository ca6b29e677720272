"""Result rows as text, shared by the CLI (``farm.cli.views``), the HTML report and the exports: a metric
value for humans, a row's open-loop rate, the rows as CSV or JSON (exact stored values), and user strings
made safe for a terminal (``safe_text``)."""
from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from rich.text import Text

from schemas.metrics import BY_NAME

#: what a terminal would act on rather than show: C0 controls but tab (ESC starts CSI/OSC sequences, CR and
#: BS overwrite), DEL, C1 controls (U+0080-U+009F, CSI/OSC in 8 bits) and the bidirectional overrides and
#: isolates that reorder what follows them ("Trojan Source")
_CONTROL_RE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape_control(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """``value`` as text with every control character shown as an escape (``\\x1b``, ``\\u202e``), so that
    a name, path or error text a user chose reaches a terminal (or a log line) as the characters it holds and
    never as a cursor move, colour, hyperlink (OSC 8) or title change."""
    return _CONTROL_RE.sub(_escape_control, str(value))


def safe_text(value: object, style: str = "") -> Text:
    """A user string (request name, model or input file name, stored error, worker id, hostname) as Rich text
    shown literally: a ``Text`` is never parsed as markup, so ``[/bold]`` or ``[link=...]`` print as written
    instead of raising MarkupError or styling the terminal, and its control characters are escaped
    (``printable``). The one way user strings reach a Rich console, table cell or title."""
    return Text(printable(value), style=style)


def knobs_text(knobs: dict[str, Any] | None) -> str:
    """An LLM job's knobs compactly, by name: ``n_parallel=4 n_threads=2`` (``-``: none)."""
    if not knobs:
        return "-"
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(knobs.items()))


def fmt_value(name: str, value: Any) -> str:
    """A metric value for humans, in its registry unit (bytes shown in MiB)."""
    if value is None:
        return "-"
    if isinstance(value, dict):  # an LLM job's knobs: ``n_parallel=4 n_threads=2``
        return knobs_text(value)
    m = BY_NAME.get(name)
    if isinstance(value, bool) or (m is not None and m.kind == "bool"):
        return "yes" if value else "no"
    if m is not None and m.unit == "B":
        return f"{value / 2**20:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def rate_text(row: Mapping[str, Any]) -> str:
    """A row's open-loop rate, ``@100/s`` (empty in closed loop and for edge rows, which send no load)."""
    rate = row.get("rate")
    return "" if rate is None or row.get("edge_profile") else f"@{rate:g}/s"


def _jsonable(v: Any) -> Any:
    return v.isoformat() if isinstance(v, datetime) else v


def to_json(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a JSON array (timestamps in ISO 8601)."""
    return json.dumps([{k: _jsonable(v) for k, v in r.items()} for r in rows], indent=2)


#: the first characters that make a spreadsheet read a cell as a formula (OWASP's CSV injection)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A value as a CSV cell: text that a spreadsheet would run as a formula (a server's name like
    ``=HYPERLINK(...)``) gets a leading ``'`` so it stays text; numbers (a negative one too) and other text as
    they are."""
    value = _jsonable(value)
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as CSV with a header of the first row's keys (None as an empty cell; text cells neutralized:
    :func:`csv_cell`)."""
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=[csv_cell(k) for k in rows[0]])
        writer.writeheader()
        for r in rows:
            writer.writerow({csv_cell(k): "" if v is None else csv_cell(v) for k, v in r.items()})
    return buf.getvalue()
