"""The load generator's part of a result's details (``details["load"]``), typed for its readers.

The stored JSON is the dict the load client wrote (``workers.loadgen.result``), unchanged; :class:`LoadDetails`
is its typed view: the fields readers use are declared (the search's ``slo_met_share``, the HTML report's
``latency_histogram``, ...), every other entry (a client's own: perf_analyzer's server breakdown, the OpenAI
client's API and workload, ...) is kept as an extra field."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict  # pydantic validates typing.TypedDict only on Python 3.12+


class Histogram(TypedDict, total=False):
    """A stored latency histogram (``farm.histogram.histogram``, ms): ``counts[j]`` values in
    ``[bounds_ms[j], bounds_ms[j+1])``, bucket ``first_index`` of the grid of ``per_decade`` buckets per factor
    of 10 first; ``count`` values in all, summing to ``sum_ms``, between ``min_ms`` and ``max_ms`` (None: none).
    Every key is there in a histogram farm built; an edge run stores none (``{}``)."""

    per_decade: int
    first_index: int
    bounds_ms: list[float]
    counts: list[int]
    count: int
    sum_ms: float
    min_ms: float | None
    max_ms: float | None


class LoadDetails(BaseModel):
    """A load run's details. Every field has the value a result without it reads as (an edge run stores none):
    ``client`` (``farm``, ``perf_analyzer``, ``openai``; None: not stored), ``notes`` (the run's warnings, the
    choice of client's first), ``latency_histogram`` (``farm.histogram``'s JSON; empty: none),
    ``windows`` (per-window figures) and ``metrics_windows`` (the first and last window the metrics use);
    the OpenAI client's ``slo_met_share`` (measured requests within the SLO, 0..1; None: no SLO),
    ``oversaturated`` (stopped early: the server fell behind its arrivals; ``oversaturated_why``: why) and
    ``token_sources`` (request counts by where token counts came from, per token kind)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    client: str | None = None
    notes: list[str] = Field(default_factory=list)
    latency_histogram: Histogram = Field(default_factory=lambda: Histogram())
    windows: list[dict[str, Any]] = Field(default_factory=list)
    metrics_windows: list[int] | None = None
    slo_met_share: float | None = None
    oversaturated: bool = False
    oversaturated_why: str | None = None
    token_sources: dict[str, dict[str, int]] | None = None

    @classmethod
    def of(cls, details: dict[str, Any] | None) -> LoadDetails:
        """The load part of a result's whole ``details`` (None or without ``load``: an empty one)."""
        return cls.model_validate((details or {}).get("load") or {})
