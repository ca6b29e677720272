"""Running one job: claim it, fetch the model, serve it, drive it, sample it, write one result."""
from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from typing import Any

from farm.artifacts import fetch_model
from farm.errors import FarmError
from schemas import JobResult, JobSpec
from workers import ledger
from workers.runners.base import Runner, ServingTarget
from workers.samplers.base import Sampler

log = logging.getLogger("farm.worker")


def _samplers(target: ServingTarget, gpu_uuids: list[str]) -> list[Sampler]:
    """The samplers that fit the target: cgroup (container), process tree (subprocess), NVML (GPU)."""
    samplers: list[Sampler] = []
    if target.cgroup_path is not None:
        from workers.samplers.cgroup import CgroupSampler

        samplers.append(CgroupSampler(target.cgroup_path))
    elif target.pid is not None:
        from workers.samplers.process import ProcessTreeSampler

        samplers.append(ProcessTreeSampler(target.pid))
    if gpu_uuids:
        from workers.samplers.nvml import NvmlSampler

        samplers.append(NvmlSampler(gpu_uuids))
    return samplers


def measure(spec: JobSpec, runner: Runner, gpu_uuids: list[str] | None = None) -> JobResult:
    """Measure one serving job (or run one edge job) and return its result; raises FarmError on failure."""
    from workers.loadgen import run_load

    model_path = fetch_model(spec.model_sha256, spec.model_filename)
    if spec.is_edge:
        return runner.run_edge(spec, model_path)
    started = time.monotonic()
    with ExitStack() as stack:
        target = stack.enter_context(runner.serve(spec, model_path))
        samplers = [stack.enter_context(s) for s in _samplers(target, gpu_uuids or [])]
        load = run_load(target.url, target.model_name, spec.inputs, spec.batch_size, spec.concurrency,
                        spec.measurement)
    metrics: dict[str, Any] = dict(load.metrics)
    details: dict[str, Any] = {"load": load.details, "runner": runner.name, "notes": list(target.notes),
                               "wall_s": round(time.monotonic() - started, 3)}
    for sampler in samplers:
        metrics.update({k: v for k, v in sampler.summary().items() if v is not None})
        details[f"sampler.{sampler.name}"] = {"series": sampler.series()[-2000:], "error": sampler.error}
    return JobResult(job_id=spec.job_id, metrics=metrics, details=details)


def run_job(job_id: str, worker_id: str, runner: Runner, gpu_uuids: list[str] | None = None) -> str:
    """Claim and run one job; returns its final status, or ``skipped`` when it was not ours to run.

    A second delivery of a job already claimed does nothing. Any failure ends the job ``failed`` with a
    one-line reason; the worker goes on with the next job.
    """
    spec = ledger.claim(job_id, worker_id)
    if spec is None:
        log.info("job %s already claimed or finished; skipping this delivery", job_id)
        return "skipped"
    ledger.set_status(job_id, worker_id, "running")
    try:
        result = measure(spec, runner, gpu_uuids)
    except FarmError as exc:
        log.warning("job %s failed: %s", job_id, exc)
        ledger.set_status(job_id, worker_id, "failed", error=str(exc))
        return "failed"
    except Exception as exc:  # a bug or an unexpected library error: record it, keep the worker alive
        log.error("job %s crashed: %s: %s", job_id, type(exc).__name__, exc,
                  exc_info=log.isEnabledFor(logging.DEBUG))
        ledger.set_status(job_id, worker_id, "failed", error=f"internal error: {type(exc).__name__}: {exc}")
        return "failed"
    error = result.details.get("error")
    status = "failed" if error else "succeeded"
    if not ledger.finish(spec, worker_id, result, status=status, error=error):
        return "skipped"
    return status
