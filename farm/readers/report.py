"""Ranking and reporting: the best configurations under constraints, and whether each edge box fits.

Pure functions over ``farm.readers.results.result_rows`` output; directions come from the metric registry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from farm.errors import RequestError
from farm.formatting import fmt_value
from farm.readers.knee import Knee, knees
from farm.readers.knee_cause import KneeCause, knee_causes
from farm.readers.results import llm_rows
from farm.readers.rows import ResultRow, as_row, as_rows
from schemas import COORDINATE_KEYS, LOAD_KEYS
from schemas.llm import Slo
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

    def holds(self, row: ResultRow) -> bool:
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
    ranked: list[ResultRow] = field(default_factory=list)
    rejected: list[tuple[ResultRow, str]] = field(default_factory=list)
    best_per_device: dict[str, ResultRow] = field(default_factory=dict)
    #: the best ranked row of each serving configuration (``SERVING_GROUP``), in rank order
    best_per_serving: list[ResultRow] = field(default_factory=list)
    edge: list[ResultRow] = field(default_factory=list)
    #: the knee of each LLM concurrency sweep (``farm.readers.knee``): (sweep label, knee), serving rows only
    knees: list[tuple[str, Knee]] = field(default_factory=list)
    #: what bounds each LLM concurrency sweep, then each rate sweep, at its knee (``farm.readers.knee_cause``)
    knee_causes: list[KneeCause] = field(default_factory=list)


def _why_not(row: ResultRow, constraints: list[Constraint], require_stable: bool) -> str | None:
    if not row.succeeded:
        return f"{row.status}: {row.error or 'no result'}"
    if require_stable and row.get("stable") is False:
        return "measurement did not stabilise"
    if client_limited(row):
        return (f"client-limited: over {CLIENT_LIMITED_PCT:g} % of its open-loop sends left late, so its latency "
                "is not the server's")
    failed = [str(c) for c in constraints if not c.holds(row)]
    return f"violates {', '.join(failed)}" if failed else None


#: the reason an edge run that passed gets no verdict: it ran without its profile's limits
LIMITS_NOT_ENFORCED = "limits not enforced: verdict unknown"


#: the share of an LLM edge run's requests that must meet the SLO for the box to fit it, % (the max-goodput
#: search's goal: goodput >= 95 % of the completed requests)
LLM_FIT_PCT = 95.0


def within_slo_pct(row: ResultRow) -> float | None:
    """The share of an LLM row's completed requests inside its SLO (goodput over request rate), %; None without
    an SLO (no goodput measured) or without requests."""
    good, done = row.get("goodput_req_per_s"), row.get("requests_per_s")
    return None if good is None or not done else min(100.0, 100.0 * float(good) / float(done))


def _slo_miss(row: ResultRow, slo: Slo | None) -> str | None:
    """Why an LLM edge run misses the SLO (``ttft_ms``/``tpot_ms``/``e2e_ms`` goals, ms), or None when it meets
    it: fewer than :data:`LLM_FIT_PCT` % of its requests inside, said with its p90 figures against the goals."""
    share = within_slo_pct(row)
    if share is None:
        return None if not slo else "no goodput measured: the SLO was not applied to this run"
    if share >= LLM_FIT_PCT:
        return None
    goals = {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms} if slo else {}
    figures = [f"{key.upper()} p90 {row[f'{key}_p90_ms']:.0f} ms vs goal {goal:g} ms"
               for key, goal in goals.items() if goal and row.get(f"{key}_p90_ms") is not None]
    return (f"{share:.0f} % of requests inside the SLO (needs {LLM_FIT_PCT:g} %)"
            + (f": {', '.join(figures)}" if figures else ""))


#: an LLM edge run's figures beside its verdict (``--json``, the verdict line)
LLM_EDGE_FIGURES = ("output_tokens_per_s", "ttft_p90_ms", "tpot_p90_ms")


def llm_edge(row: ResultRow) -> bool:
    """Whether an edge row is an LLM engine's run (served over HTTP, measured by the OpenAI client), even one
    killed before it measured anything."""
    return as_row(row).protocol == "openai"


def llm_edge_figures(e: ResultRow) -> str:
    """An LLM edge run's figures for its verdict: tokens/s, TTFT and TPOT p90, the share of requests inside the
    SLO, the memory peak against the limit (MiB)."""
    share = within_slo_pct(e)
    tps, ttft, tpot = (fmt_value(k, e.get(k)) for k in LLM_EDGE_FIGURES)
    peak, limit = fmt_value("mem_peak_bytes", e.get("mem_peak_bytes")), fmt_value("mem_limit_bytes",
                                                                                  e.get("mem_limit_bytes"))
    inside = "-" if share is None else f"{share:.0f}"
    return (f"{tps} tok/s, TTFT p90 {ttft} ms, TPOT p90 {tpot} ms, {inside} % of requests inside the SLO, "
            f"memory peak {peak} of {limit} MiB")


def _edge_verdict(row: ResultRow, constraints: list[Constraint], slo: Slo | None = None
                  ) -> ResultRow:
    """``row`` plus ``fits`` (True, False, or None when unknown) and ``reason``. A run that failed or missed
    a constraint does not fit even unlimited (limits only take resources away); a run that passed fits only
    when its limits were enforced: without them it measured a bigger box than the profile. An LLM run (the
    OpenAI client's) also needs :data:`LLM_FIT_PCT` % of its requests inside the request's ``slo``; one
    OOM-killed (while loading its model or serving) gets ``oom`` True."""
    reason = _why_not(row, constraints, False)
    if reason is None and row.get("output_tokens_per_s") is not None:
        reason = _slo_miss(row, slo)
    if row.get("oom_killed"):
        reason = "killed: out of memory"
    fits: bool | None = reason is None
    if fits and row.get("limits_enforced") is not True:
        fits, reason = None, LIMITS_NOT_ENFORCED
    return ResultRow({**row, "fits": fits, "reason": reason, "oom": bool(row.get("oom_killed"))})


#: the objective of a report on LLM rows when none is named, and their ranked table's columns after it
LLM_OBJECTIVE = "output_tokens_per_s"
LLM_RANKED = ("output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms", "goodput_req_per_s")


def default_objective(rows: list[ResultRow], objective: str | None) -> str:
    """``objective``, else output tokens/s for LLM rows (``farm.readers.results.llm_rows``), else inferences/s."""
    return objective or (LLM_OBJECTIVE if llm_rows(rows) else "throughput_infer_per_s")


def build_report(rows: list[ResultRow], objective: str | None = None,
                 constraints: list[Constraint] | None = None, require_stable: bool = False,
                 slo: Slo | None = None) -> Report:
    """Rank serving jobs that meet every constraint by ``objective`` (its registry direction); judge edge
    jobs: an edge profile fits when its runs succeeded, were not OOM-killed, meet the constraints (an LLM run:
    and the request's ``slo``, ``schemas.llm.Slo`` fields) and ran under enforced limits (``fits`` is None,
    "verdict unknown", when they passed without them). No ``objective``: :func:`default_objective`."""
    rows = as_rows(rows)
    objective = default_objective(rows, objective)
    if objective not in BY_NAME or BY_NAME[objective].scope != "job":
        raise RequestError(f"objective {objective!r} is unknown; use a result metric such as throughput_infer_per_s")
    constraints = constraints or []
    report = Report(objective, constraints)
    better = BY_NAME[objective].higher_is_better
    for row in rows:
        if row.is_edge:
            report.edge.append(_edge_verdict(row, constraints, slo))
            continue
        reason = _why_not(row, constraints, require_stable)
        if reason is None and row.get(objective) is None:
            reason = f"{objective} not measured"
        if reason:
            report.rejected.append((row, reason))
        else:
            report.ranked.append(row)
    report.ranked.sort(key=lambda r: r[objective], reverse=better)
    groups: dict[tuple[Any, ...], ResultRow] = {}
    for row in report.ranked:
        report.best_per_device.setdefault(row["device"], row)
        groups.setdefault(tuple(row.get(c) for c in SERVING_GROUP), row)
    report.best_per_serving = list(groups.values())
    report.knees = knees(r for r in rows if not r.is_edge)
    report.knee_causes = knee_causes(r for r in rows if not r.is_edge)
    return report
