"""One edge run's outcome, the same for every runner: failure checks, metrics and details, OOM wording."""
from __future__ import annotations

from typing import Any

from farm import op_profile
from farm.errors import WorkerError
from schemas import JobResult, JobSpec, Placement
from schemas.metrics import BY_NAME, MetricValues
from workers.edge_bench import parse_report
from workers.limits import LimitMetrics
from workers.measure import HOST_METRICS
from workers.profiling.process import edge_profile

RESOURCE_METRICS = ("cpu_pct_avg", "cpu_pct_peak", "mem_avg_bytes", "mem_peak_bytes", *HOST_METRICS)


def edge_result(spec: JobSpec, *, where: str, error: type[WorkerError], stdout: str, tail: str,
                exit_code: int | None, oom: bool, custom: bool, summary: dict[str, Any], limits: LimitMetrics,
                total_s: float, details: dict[str, Any], placement: Placement | None = None) -> JobResult:
    """The JobResult of a finished edge run, or ``error`` when it failed for any reason but an OOM kill.

    ``summary``: the sampler's metrics; ``limits``: ``mem_limit_bytes``, ``cpu_limit``, ``limits_enforced``;
    ``custom``: a user's command ran instead of farm's edge bench (its JSON line is used when printed);
    ``details``: runner-specific facts, completed here; ``placement``: where it ran. Times in seconds.
    """
    prof = spec.edge_profile
    assert prof is not None
    report = parse_report(stdout)
    if not oom and exit_code != 0:
        reason = (report or {}).get("error") or f"exit code {exit_code}"
        raise error(f"{where} failed: {reason}; last log lines:\n{tail}")
    if not oom and not custom and (report is None or "metrics" not in report):
        raise error(f"{where} printed no edge_bench result; last log lines:\n{tail}")
    metrics: MetricValues = {}
    if report and not oom and isinstance(report.get("metrics"), dict):
        metrics.update(report["metrics"])
    elif custom and not oom:
        metrics["duration_s"] = total_s
    metrics.update({k: summary[k] for k in RESOURCE_METRICS if summary.get(k) is not None})
    metrics.update(**limits, oom_killed=oom, total_time_s=total_s)
    details = {**details, "kind": "edge", "edge_profile": prof.model_dump(), "exit_code": exit_code,
               "total_time_s": total_s}
    if report:
        details["bench"] = {k: v for k, v in report.items() if k not in ("metrics", "edge_bench")}
    if spec.measurement.op_profile and not custom:
        op_profile.attach(details, *edge_profile(stdout, spec.engine))
    if oom:
        details["error"] = (
            f"killed: out of memory (limit {prof.memory / 2**20:g} MiB) after {total_s:.1f} s; the model "
            f"needs more memory than edge profile {prof.name!r} allows at batch size {spec.batch_size}: "
            "raise the profile's memory or lower the batch size")
        details["log_tail"] = tail
    elif custom:
        details["stdout_tail"] = "\n".join(stdout.splitlines()[-20:])
    job_metrics = {k: v for k, v in metrics.items() if k in BY_NAME and BY_NAME[k].scope == "job"}
    return JobResult(job_id=spec.job_id, metrics=job_metrics, details=details, placement=placement)
