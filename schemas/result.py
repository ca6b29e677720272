"""The outcome of one job: metric values keyed by the metric registry's names."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, field_validator

from schemas.llm_facts import LlmFacts
from schemas.metrics import JOB_METRICS

_JOB_METRIC_NAMES = frozenset(m.name for m in JOB_METRICS)


class Placement(BaseModel):
    """Where a job was measured: ``host`` (hostname), ``slot`` (the worker's slot, 0 for one slot), ``gpu_uuid``
    (the slot's GPU), ``server_cpus`` and ``loadgen_cpus`` (CPU lists such as ``0-1``), ``host_shared`` (another
    farm job's lease on the same host overlapped the measurement) and ``isolated`` (the job's cores were its
    own: locked by it, and every overlapping job held other cores). A result that shared its host without
    isolation (``shared_unisolated``) may be perturbed by that other job."""

    host: str | None = None
    slot: int | None = None
    gpu_uuid: str | None = None
    server_cpus: str | None = None
    loadgen_cpus: str | None = None
    host_shared: bool | None = None
    isolated: bool | None = None


#: the results-table columns a Placement fills (one column per field)
PLACEMENT_COLUMNS: tuple[str, ...] = tuple(Placement.model_fields)
SHARED_NOTE = ("another farm job ran on this host during the measurement without core isolation "
               "(FARM_ISOLATION=off or an older worker): rerun it before comparing")


CLIENT_LIMITED_PCT = 1.0  # open loop: more late sends (%) than this and the run measured its own client
CLIENT_LIMITED_NOTE = (f"client-limited: over {CLIENT_LIMITED_PCT:g} % of its open-loop sends left more than 1 ms "
                       "late, so its latency measured the load generator as much as the server and is not "
                       "reported; give the load generator its own cores or lower the rate")


def client_limited_note(client: str | None) -> str:
    """:data:`CLIENT_LIMITED_NOTE` with its advice for the load ``client`` that ran (``farm``,
    ``perf_analyzer``; None: unknown): the other client is advised only to a run that did not use it."""
    if client == "perf_analyzer":
        return CLIENT_LIMITED_NOTE
    return CLIENT_LIMITED_NOTE.replace(" or lower the rate", ", lower the rate or use --client perf_analyzer")


def client_limited(row: Mapping[str, Any]) -> bool:
    """True for a results row (or metrics) whose open-loop late sends (``late_send_pct``) exceed
    ``CLIENT_LIMITED_PCT``: latency counts from the schedule, so the client's lateness would be charged
    to the server. Derived from the stored metric, so merged repeats are judged on their mean."""
    late = row.get("late_send_pct")
    return late is not None and float(late) > CLIENT_LIMITED_PCT


def host_drift(row: Mapping[str, Any], bound_pct: float) -> float | None:
    """The host yardstick's change (``host_speed_change_pct``, after vs before measuring, %) of a results row
    (or metrics) when it exceeds ``bound_pct`` either way; None when within it or not measured."""
    change = row.get("host_speed_change_pct")
    return float(change) if change is not None and abs(float(change)) > bound_pct else None


def host_busy(row: Mapping[str, Any], bound_pct: float) -> float | None:
    """The share of a row's leased cores that processes outside the job used while it was measured
    (``foreign_cpu_pct``, %) when it exceeds ``bound_pct``; None when within it or not measured."""
    foreign = row.get("foreign_cpu_pct")
    return float(foreign) if foreign is not None and float(foreign) > bound_pct else None


def host_notes(row: Mapping[str, Any], drift_pct: float, busy_pct: float) -> list[str]:
    """The notes a row gets when its host drifted (beyond ``drift_pct``) or was busy on its cores (beyond
    ``busy_pct``, the settings ``FARM_HOST_DRIFT_PCT`` and ``FARM_HOST_BUSY_PCT``)."""
    notes = []
    drift = host_drift(row, drift_pct)
    if drift is not None:
        notes.append(f"host drift: the host's speed on the job's cores changed by {drift:+.1f} % from before to "
                     f"after measuring (bound {drift_pct:g} %): rerun it before comparing")
    busy = host_busy(row, busy_pct)
    if busy is not None:
        notes.append(f"host busy: processes outside the job used {busy:.1f} % of its leased cores while it was "
                     f"measured (bound {busy_pct:g} %): rerun it on a quiet host before comparing")
    return notes


def host_flags(row: Mapping[str, Any], drift_pct: float, busy_pct: float) -> list[str]:
    """The short form of ``host_notes``: ``drift +14%``, ``busy 38%`` (empty when the host was steady and quiet)."""
    drift, busy = host_drift(row, drift_pct), host_busy(row, busy_pct)
    return ([f"drift {drift:+.0f}%"] if drift is not None else []) + ([f"busy {busy:.0f}%"] if busy is not None else [])


def shared_unisolated(row: dict[str, Any]) -> bool:
    """True for a results row (or Placement fields) measured beside another farm job without isolation."""
    return bool(row.get("host_shared")) and row.get("isolated") is False


class JobResult(BaseModel):
    """One job's measured result.

    ``metrics`` maps job metric names (see ``schemas.metrics``) to values in the registry's units; a metric
    that was not measured is absent (reported as null), never 0. An unregistered name fails validation
    here, when the result is built. ``details`` holds the rest: latency histogram, per-window series,
    error counts by gRPC status, sampler series, notes on unenforced limits. ``placement``: where it was
    measured (None: it never ran, e.g. a failure recorded by the scheduler). ``llm``: what an LLM job ran with
    (knobs, token source, workload: ``schemas.llm_facts``), stored as columns; None for other jobs.
    """

    job_id: str
    metrics: dict[str, float | int | bool | None] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)
    placement: Placement | None = None
    llm: LlmFacts | None = None

    @field_validator("metrics")
    @classmethod
    def _registered(cls, v: dict[str, float | int | bool | None]) -> dict[str, float | int | bool | None]:
        unknown = sorted(set(v) - _JOB_METRIC_NAMES)
        if unknown:
            raise ValueError(
                f"metric(s) {', '.join(unknown)} are not job metrics of schemas.metrics; "
                f"register them there or use one of: {', '.join(sorted(_JOB_METRIC_NAMES))}"
            )
        return v
