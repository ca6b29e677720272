"""Exports of a request's results: CSV, JSON and Parquet files with every coordinate and metric column.

The rows come from ``farm.readers.results.result_rows`` (the one reader of results); metric columns, their types and
units come from the metric registry (``schemas.metrics``). Parquet is written with pyarrow; each metric field
carries its unit, direction and description as field metadata, so pandas, DuckDB or Spark read it typed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import RequestError
from farm.formatting import to_csv, to_json
from farm.readers.results import JOB_COLUMNS, MEASUREMENT_COLUMNS, METRIC_NAMES, find_request, result_rows
from farm.readers.rows import ResultRow
from schemas.llm_facts import LLM_FACT_COLUMNS, LLM_FACT_INTS
from schemas.metrics import BY_NAME
from schemas.result import PLACEMENT_COLUMNS

if TYPE_CHECKING:
    import pyarrow as pa

FORMATS = ("csv", "json", "parquet")
#: the request's own columns, added in front of every exported row
REQUEST_COLUMNS = ("request_id", "model", "model_sha256")
#: how the request drove its jobs (``farm.readers.results.result_rows``): call kind, load client, input values, the
#: server (``NAME VERSION``: the endpoint's, or the program an LLM engine ran; empty otherwise)
HOW_DRIVEN = ("rpc", "client", "input_data", "server")
#: every exported column, in order: request, job coordinates, how and where measured, an LLM job's facts (knobs
#: as JSON text in CSV and Parquet, an object in JSON; ``schemas.llm_facts``; its ``server`` is HOW_DRIVEN's), metrics
EXPORT_COLUMNS: tuple[str, ...] = (REQUEST_COLUMNS + JOB_COLUMNS[:6] + HOW_DRIVEN + MEASUREMENT_COLUMNS
                                   + JOB_COLUMNS[6:] + ("measured",) + PLACEMENT_COLUMNS
                                   + tuple(c for c in LLM_FACT_COLUMNS if c not in HOW_DRIVEN) + METRIC_NAMES)
#: the open-loop rate, requests/s (the other measurement columns are integers), and an LLM job's shared prefix, %
_FLOAT_COLUMNS = {"rate", "shared_prefix_pct"}
_INT_COLUMNS = {"batch_size", "concurrency", "attempts", "slot", "repeat", *MEASUREMENT_COLUMNS,
                *LLM_FACT_INTS} - _FLOAT_COLUMNS
_JSON_COLUMNS = {"knobs"}  # objects: JSON text where the format has no objects (CSV, Parquet)
_BOOL_COLUMNS = {"host_shared", "isolated"}


def export_rows(request_id: str) -> list[ResultRow]:
    """The request's result rows with :data:`EXPORT_COLUMNS` as keys, in that order."""
    req = find_request(request_id)
    head = {"request_id": req.id, "model": req.spec.get("model"), "model_sha256": req.model_sha256}
    return [ResultRow({c: {**head, **r}.get(c) for c in EXPORT_COLUMNS}) for r in result_rows(req.id)]


def arrow_schema() -> pa.Schema:
    """The Parquet schema: typed coordinates, and one field per registered metric with its unit as metadata."""
    import pyarrow as pa  # noqa: PLC0415 - 0.2-0.4 s to import, measured: only Parquet exports pay it

    fields = []
    for c in EXPORT_COLUMNS:
        m = BY_NAME.get(c) if c in METRIC_NAMES else None
        if m is not None:
            typ = {"float": pa.float64(), "int": pa.int64(), "bool": pa.bool_()}[m.kind]
            meta = {"unit": m.unit, "higher_is_better": str(m.higher_is_better).lower(),
                    "description": m.description}
            fields.append(pa.field(c, typ, metadata=meta))
        else:
            typ = (pa.int64() if c in _INT_COLUMNS else pa.float64() if c in _FLOAT_COLUMNS
                   else pa.bool_() if c in _BOOL_COLUMNS else pa.string())
            fields.append(pa.field(c, typ))
    return pa.schema(fields)


def to_parquet(rows: list[ResultRow], path: Path) -> None:
    """Write ``rows`` (keys: :data:`EXPORT_COLUMNS`) to a Parquet file at ``path``."""
    try:
        import pyarrow as pa  # noqa: PLC0415 - as in arrow_schema
        import pyarrow.parquet as pq  # noqa: PLC0415 - as in arrow_schema
    except ImportError:  # pragma: no cover - a runtime dependency; a broken install says so
        raise RequestError("Parquet export needs pyarrow: pip install pyarrow") from None
    schema = arrow_schema()
    table = pa.Table.from_pylist([{c: _cell(c, r.get(c)) for c in EXPORT_COLUMNS} for r in rows], schema=schema)
    pq.write_table(table, path)


def _flat(row: ResultRow) -> dict[str, Any]:
    """``row`` with its object columns (knobs) as compact JSON text, keys sorted (CSV and Parquet cells)."""
    return {k: json.dumps(v, sort_keys=True) if k in _JSON_COLUMNS and v is not None else v for k, v in row.items()}


def _cell(column: str, value: Any) -> Any:
    """A value as its Parquet column's type takes it (integral floats of int metrics become ints; knobs as JSON
    text)."""
    if value is None:
        return None
    if column in _JSON_COLUMNS:
        return json.dumps(value, sort_keys=True)
    m = BY_NAME.get(column)
    if m is not None and m.kind == "int":
        return int(value)
    if m is not None and m.kind == "float":
        return float(value)
    return value


def write(rows: list[ResultRow], fmt: str, path: Path | None) -> str | None:
    """Write ``rows`` as ``fmt`` to ``path``; with no path, return the text (CSV and JSON only)."""
    if fmt not in FORMATS:
        raise RequestError(f"--format {fmt!r} is unknown; use one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if path is None:
            raise RequestError("Parquet is binary: give a file with -o results.parquet")
        to_parquet(rows, path)
        return None
    text = to_csv([_flat(r) for r in rows]) if fmt == "csv" else to_json(rows) + "\n"
    if path is None:
        return text
    path.write_text(text)
    return None
