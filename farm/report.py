"""Ranking and reporting: the best configurations under constraints, and whether each edge box fits.

Pure functions over ``farm.results.result_rows`` output; directions come from the metric registry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from farm.errors import RequestError
from schemas import COORDINATE_KEYS, LOAD_KEYS
from schemas.job import JobStatus
from schemas.metrics import BY_NAME
from schemas.result import CLIENT_LIMITED_PCT, client_limited

#: what a serving configuration is: a job's coordinates less its load (concurrency, open-loop rate) and edge
#: profile
SERVING_GROUP = tuple(k for k in COORDINATE_KEYS if k not in (*LOAD_KEYS, "edge_profile"))


@dataclass(frozen=True)
class Constraint:
    """``metric <= limit`` (or ``>=`` for higher-is-better metrics), e.g. latency_p99_ms <= 20."""

    metric: str
    limit: float

    def holds(self, row: dict[str, Any]) -> bool:
        value: float | None = row.get(self.metric)
        if value is None:
            return False
        return value >= self.limit if BY_NAME[self.metric].higher_is_better else value <= self.limit

    def __str__(self) -> str:
        op = ">=" if BY_NAME[self.metric].higher_is_better else "<="
        return f"{self.metric} {op} {self.limit:g}"


def parse_constraint(text: str) -> Constraint:
    """``latency_p99_ms=20`` or ``latency_p99_ms<=20`` → Constraint; the direction comes from the registry."""
    for sep in ("<=", ">=", "="):
        if sep in text:
            name, _, value = text.partition(sep)
            break
    else:
        raise RequestError(f"constraint {text!r} must look like latency_p99_ms=20")
    name = name.strip()
    if name not in BY_NAME or BY_NAME[name].scope != "job":
        raise RequestError(f"constraint metric {name!r} is unknown; use a result metric such as latency_p99_ms")
    try:
        limit = float(value)
    except ValueError:
        raise RequestError(f"constraint {text!r}: {value.strip()!r} is not a number") from None
    if not math.isfinite(limit):
        raise RequestError(f"constraint {text!r}: the limit must be a finite number")
    return Constraint(name, limit)


@dataclass
class Report:
    """Ranked serving configurations, the best one per device, and an edge verdict per profile."""

    objective: str
    constraints: list[Constraint]
    ranked: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    best_per_device: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the best ranked row of each serving configuration (``SERVING_GROUP``), in rank order
    best_per_serving: list[dict[str, Any]] = field(default_factory=list)
    edge: list[dict[str, Any]] = field(default_factory=list)


def _why_not(row: dict[str, Any], constraints: list[Constraint], require_stable: bool) -> str | None:
    if row["status"] != JobStatus.succeeded:
        return f"{row['status']}: {row.get('error') or 'no result'}"
    if require_stable and row.get("stable") is False:
        return "measurement did not stabilise"
    if client_limited(row):
        return (f"client-limited: over {CLIENT_LIMITED_PCT:g} % of its open-loop sends left late, so its latency "
                "is not the server's")
    failed = [str(c) for c in constraints if not c.holds(row)]
    return f"violates {', '.join(failed)}" if failed else None


#: the reason an edge run that passed gets no verdict: it ran without its profile's limits
LIMITS_NOT_ENFORCED = "limits not enforced: verdict unknown"


def _edge_verdict(row: dict[str, Any], constraints: list[Constraint]) -> dict[str, Any]:
    """``row`` plus ``fits`` (True, False, or None when unknown) and ``reason``. A run that failed or missed
    a constraint does not fit even unlimited (limits only take resources away); a run that passed fits only
    when its limits were enforced: without them it measured a bigger box than the profile."""
    reason = _why_not(row, constraints, False)
    if row.get("oom_killed"):
        reason = "killed: out of memory"
    fits: bool | None = reason is None
    if fits and row.get("limits_enforced") is not True:
        fits, reason = None, LIMITS_NOT_ENFORCED
    return {**row, "fits": fits, "reason": reason}


def build_report(rows: list[dict[str, Any]], objective: str = "throughput_infer_per_s",
                 constraints: list[Constraint] | None = None, require_stable: bool = False) -> Report:
    """Rank serving jobs that meet every constraint by ``objective`` (its registry direction); judge edge
    jobs: an edge profile fits when its runs succeeded, were not OOM-killed, meet the constraints and ran under
    enforced limits (``fits`` is None, "verdict unknown", when they passed without them)."""
    if objective not in BY_NAME or BY_NAME[objective].scope != "job":
        raise RequestError(f"objective {objective!r} is unknown; use a result metric such as throughput_infer_per_s")
    constraints = constraints or []
    report = Report(objective, constraints)
    better = BY_NAME[objective].higher_is_better
    for row in rows:
        if row.get("edge_profile"):
            report.edge.append(_edge_verdict(row, constraints))
            continue
        reason = _why_not(row, constraints, require_stable)
        if reason is None and row.get(objective) is None:
            reason = f"{objective} not measured"
        if reason:
            report.rejected.append((row, reason))
        else:
            report.ranked.append(row)
    report.ranked.sort(key=lambda r: r[objective], reverse=better)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in report.ranked:
        report.best_per_device.setdefault(row["device"], row)
        groups.setdefault(tuple(row.get(c) for c in SERVING_GROUP), row)
    report.best_per_serving = list(groups.values())
    return report
