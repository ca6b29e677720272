"""The one place where what farm's readers return (result rows, status counts, reports) becomes JSON for the
API. The readers' rows are dicts today and typed models tomorrow (issue 37); ``to_jsonable_python`` takes both,
and datetimes become ISO 8601 strings."""
from __future__ import annotations

from typing import Any

from pydantic_core import to_jsonable_python


def jsonable(value: Any) -> Any:
    """``value`` (rows, models, dataclasses, datetimes, sets) as plain JSON values."""
    return to_jsonable_python(value, fallback=str)


def rows(values: list[Any]) -> list[dict[str, Any]]:
    """Reader rows as JSON objects."""
    out: list[dict[str, Any]] = jsonable(values)
    return out


def obj(value: Any) -> dict[str, Any]:
    """One reader value (a dict, model or dataclass) as a JSON object."""
    out: dict[str, Any] = jsonable(value)
    return out
