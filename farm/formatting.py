"""Result rows as text, shared by the CLI (``farm.cli.views``), the HTML report and the exports: a metric
value for humans, a row's open-loop rate, and the rows as CSV or JSON (exact stored values)."""
from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from typing import Any

from schemas.metrics import BY_NAME


def fmt_value(name: str, value: Any) -> str:
    """A metric value for humans, in its registry unit (bytes shown in MiB)."""
    if value is None:
        return "-"
    m = BY_NAME.get(name)
    if isinstance(value, bool) or (m is not None and m.kind == "bool"):
        return "yes" if value else "no"
    if m is not None and m.unit == "B":
        return f"{value / 2**20:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def rate_text(row: dict[str, Any]) -> str:
    """A row's open-loop rate, ``@100/s`` (empty in closed loop and for edge rows, which send no load)."""
    rate = row.get("rate")
    return "" if rate is None or row.get("edge_profile") else f"@{rate:g}/s"


def _jsonable(v: Any) -> Any:
    return v.isoformat() if isinstance(v, datetime) else v


def to_json(rows: list[dict[str, Any]]) -> str:
    """The rows as a JSON array (timestamps in ISO 8601)."""
    return json.dumps([{k: _jsonable(v) for k, v in r.items()} for r in rows], indent=2)


def to_csv(rows: list[dict[str, Any]]) -> str:
    """The rows as CSV with a header of the first row's keys (None as an empty cell)."""
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if v is None else _jsonable(v) for k, v in r.items()})
    return buf.getvalue()
