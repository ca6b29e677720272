"""Running one job: claim it, fetch the model, serve it, drive it, sample it, write one result."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from farm import op_profile
from farm.artifacts import using_model
from farm.broker import Broker
from farm.errors import FarmError, SandboxError
from farm.hooks import announce
from farm.lifecycle import failure_result
from farm.models.llm_info import unpack_folder
from farm.secrets import scrub_text
from farm.settings import get_settings
from schemas import JobResult, JobSpec, Placement
from schemas.engines import FOLDER_FORMATS
from schemas.job import JobStatus
from schemas.llm_facts import LlmFacts
from schemas.metrics import MetricValues
from schemas.result import SHARED_NOTE, shared_unisolated
from workers import ledger
from workers.cancel import CANCELLED, SHUTDOWN, TIMEOUT, JobInterrupt, JobWatch
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.measure import Measurement, Served, lease_for
from workers.runners.base import Runner
from workers.runners.llm_edge import run_llm_edge
from workers.samplers.host import steal_note
from workers.spool import Spool, SpooledResult, is_transient, retry_db

log = logging.getLogger("farm.worker")


def refuse_command(spec: JobSpec) -> None:
    """SandboxError when ``spec``'s edge profile brings its own ``command:`` and this worker's operator has
    not allowed such commands (``FARM_ALLOW_COMMANDS``, ``farm worker --allow-commands``): a request's command
    is code from its submitter."""
    prof = spec.edge_profile
    if prof is not None and prof.command and not get_settings().allow_commands:
        raise SandboxError(
            f"edge profile {prof.name!r} brings its own command, and this worker does not run requests' commands; "
            "its operator can allow them (farm worker --allow-commands, or FARM_ALLOW_COMMANDS=1), or drop "
            "`command:` to run farm's edge benchmark")


def measure(spec: JobSpec, runner: Runner, gpu_uuids: list[str] | None = None, slots: int = 1) -> JobResult:
    """Measure one serving job (or run one edge job) and return its result; raises FarmError on failure.

    The job's cores on this host (``workers.cores``) are the lease ``run_job`` already holds for it, else
    one waited for here (``slots``: the worker's slots, which share the host's cores); the server (started
    by the runner, or the running one the job's engine attaches to: ``workers.serving``) runs on the lease's
    server cores, the load generator on its own.
    The GPU's idle baseline is read before the server starts, so the server's own memory is what remains.
    """
    # the worker opens only models from its artifact store (a symlink or path trick is refused), pinned in its
    # cache for the whole job: the edge run, or the measured windows and the op-profile pass
    with using_model(spec.model_sha256, spec.model_filename) as model_path:
        if spec.model_format in FOLDER_FORMATS and model_path.is_file():  # one tar, stored before issue 38
            model_path = unpack_folder(model_path)
        return _measure(spec, model_path, runner, gpu_uuids, slots)


def _measure(spec: JobSpec, model_path: Path, runner: Runner, gpu_uuids: list[str] | None, slots: int) -> JobResult:
    """``measure`` of the job's model at ``model_path`` (verified, pinned)."""
    if spec.is_edge:
        refuse_command(spec)
        announce(f"edge run under {spec.edge_profile.name if spec.edge_profile else 'its'} limits")
        if spec.speaks_openai:  # an LLM engine's server under the limits, driven over HTTP
            return run_llm_edge(spec, model_path, runner.name)
        return runner.run_edge(spec, model_path)
    started = time.monotonic()
    with Measurement(spec, gpu_uuids or [], slots) as m:
        with runner.serve(spec, model_path, m.server_cpus) as target:
            with m.watch(Served(pid=target.pid, cgroup=target.cgroup_path, reused=target.reused)):
                announce(f"measuring b={spec.batch_size} c={spec.concurrency} (warm-up, then windows)")
                load = run_load(LoadTarget(target.url, target.model_name, target.authority, target.in_flight_cap),
                                LoadSpec.of(spec))
        # after the measured windows, the server stopped, still on the job's cores: never inside the figures
        if spec.measurement.op_profile:
            announce("op profile pass (after the measurement)")
        profile = runner.profile_pass(spec, model_path, m.server_cpus) if spec.measurement.op_profile else None
    metrics: MetricValues = {**load.metrics, **m.metrics()}
    details: dict[str, Any] = {"load": load.details, "runner": runner.name, "notes": [*target.notes, *m.notes],
                               "wall_s": round(time.monotonic() - started, 3), **m.details()}
    if target.server is not None:
        details["server"] = target.server
    if profile is not None:
        op_profile.attach(details, *profile)
    shared = shared_unisolated(m.placement.model_dump())
    for note in (steal_note(metrics.get("cpu_steal_pct")), SHARED_NOTE if shared else None):
        if note is not None:
            details["notes"].append(note)
    facts = LlmFacts.of(spec, len(m.server_cpus) or None, load.typed.token_sources, target.server)
    return JobResult(job_id=spec.job_id, metrics=metrics, details=details, placement=m.placement, llm=facts)


def placed(result: JobResult, slot: int, gpu_uuid: str | None) -> JobResult:
    """``result`` with the worker's ``slot`` and the job's ``gpu_uuid`` in its typed ``placement`` (kept
    beside what the measurement recorded there: host, CPU sets, sharing)."""
    base = result.placement.model_dump() if result.placement is not None else {}
    return result.model_copy(update={"placement": Placement(**{**base, "slot": slot, "gpu_uuid": gpu_uuid})})


def noop_result(spec: JobSpec, sleep_s: float = 0.0) -> JobResult:
    """TEST/BENCHMARK HARNESS (FARM_NOOP_JOBS=1): complete the job without serving or measuring anything;
    the result carries no metric and says so in ``details``."""
    if sleep_s:
        time.sleep(sleep_s)
    return JobResult(job_id=spec.job_id, details={"noop": True, "note": "FARM_NOOP_JOBS harness: nothing was "
                                                  "served or measured"})


def record(spec: JobSpec, worker_id: str, result: JobResult, status: JobStatus, error: str | None,
           spool: Spool | None = None) -> bool:
    """Write the result and final status, retrying a database outage for ``db_retry_s``, then spooling the
    result to disk (replayed later). True when written or spooled; False when the job is no longer ours."""
    try:
        return retry_db(lambda: ledger.finish(spec, worker_id, result, status=status, error=error),
                        get_settings().db_retry_s, what=f"result write of job {spec.job_id}")
    except Exception as exc:
        if spool is None or not is_transient(exc):
            raise
        spool.put(SpooledResult(spec=spec, worker_id=worker_id, result=result, status=status, error=error))
        return True


def replay_spool(spool: Spool) -> int:
    """Write results spooled during a database outage; returns how many were settled."""
    return spool.replay(lambda item: ledger.finish(item.spec, item.worker_id, item.result, status=item.status,
                                                   error=item.error))


GpuLookup = Callable[[str], list[str]]


def run_job(job_id: str, worker_id: str, runner: Runner, gpu_uuids: list[str] | GpuLookup | None = None,
            watch: JobWatch | None = None, spool: Spool | None = None, slot: int = 0, slots: int = 1) -> str:
    """Claim and run one job; returns its final status, ``skipped`` when it was not ours to run, or
    ``released`` when it was handed back (worker shutting down).

    A second delivery of a job already claimed does nothing. Any failure ends the job ``failed`` with a
    one-line reason (and a result row holding it); the worker goes on with the next job. ``watch`` stops
    the job on ``farm cancel``, on its time limit and on shutdown; ``spool`` keeps results through a
    database outage. ``slot``: this worker's slot; ``slots``: how many jobs this worker runs at once (they
    share the host's cores). Every result records where it ran (``JobResult.placement``).

    The job stays ``claimed`` while it waits for its cores on this host (``workers.cores``; cancel and
    shutdown stop the wait), and turns ``running`` once they are leased: its time limit counts from then.
    """
    settings = get_settings()
    spec = retry_db(lambda: ledger.claim(job_id, worker_id), settings.db_retry_s, what=f"claim of job {job_id}")
    if spec is None:
        log.info("job %s already claimed or finished; skipping this delivery", job_id)
        return "skipped"
    uuids = gpu_uuids(spec.device) if callable(gpu_uuids) else (gpu_uuids or [])
    gpu_uuid = uuids[0] if uuids else None
    guard = watch.job(job_id, None) if watch is not None else nullcontext()
    try:  # a no-op job measures nothing, so it takes no cores
        with guard, (nullcontext() if settings.noop_jobs else lease_for(spec, slots)):
            if not retry_db(lambda: ledger.start(job_id, worker_id), settings.db_retry_s,
                            what=f"start of job {job_id}"):
                log.info("job %s was cancelled or requeued before it started", job_id)
                return "skipped"
            if watch is not None:
                watch.start_clock(spec.measurement.timeout_s)
            if settings.noop_jobs:
                result = noop_result(spec, settings.noop_sleep_s)
            else:
                result = measure(spec, runner, uuids, slots)
    except JobInterrupt as exc:
        return _interrupted(spec, worker_id, exc.reason, spool)
    except FarmError as exc:
        msg = scrub_text(str(exc))  # the log too: a server may echo a credential's value in its error
        log.warning("job %s failed: %s", job_id, msg)
        record(spec, worker_id, placed(_failed(spec, msg), slot, gpu_uuid), JobStatus.failed, msg, spool)
        return JobStatus.failed
    except Exception as exc:  # a bug or an unexpected library error: record it, keep the worker alive
        log.error("job %s crashed: %s: %s", job_id, type(exc).__name__, scrub_text(str(exc)),
                  exc_info=log.isEnabledFor(logging.DEBUG))
        msg = f"internal error: {type(exc).__name__}: {exc}"
        record(spec, worker_id, placed(_failed(spec, msg), slot, gpu_uuid), JobStatus.failed, msg, spool)
        return JobStatus.failed
    result = placed(result, slot, gpu_uuid)
    error = result.details.get("error")
    status = JobStatus.failed if error else JobStatus.succeeded
    if not record(spec, worker_id, result, status, error, spool):
        log.info("job %s was cancelled or requeued while it ran; its result is dropped", job_id)
        return "skipped"
    return status


def _failed(spec: JobSpec, reason: str) -> JobResult:
    """The result of a job that failed before it measured: ``reason``, and an LLM job's facts as asked (its
    knobs and workload; the effective thread count is unknown: the server may never have started)."""
    return failure_result(spec.job_id, reason).model_copy(update={"llm": LlmFacts.of(spec, None)})


def _interrupted(spec: JobSpec, worker_id: str, reason: str, spool: Spool | None) -> str:
    """Record a job stopped by its watch: cancelled (already recorded), timed out, or handed back."""
    if reason == CANCELLED:
        log.info("job %s cancelled; its server was stopped", spec.job_id)
        return JobStatus.cancelled
    if reason == TIMEOUT:
        msg = (f"time limit of {spec.measurement.timeout_s:g} s exceeded (measurement.timeout_s); raise it or "
               "shorten the measurement (fewer/shorter windows)")
        record(spec, worker_id, failure_result(spec.job_id, msg), JobStatus.failed, msg, spool)
        return JobStatus.failed
    assert reason == SHUTDOWN, reason
    settings = get_settings()
    if retry_db(lambda: ledger.release(spec.job_id, worker_id, "handed back: its worker shut down"),
                settings.db_retry_s, what=f"hand-back of job {spec.job_id}") and not settings.embedded:
        try:
            Broker().send(spec.job_id, spec.queue)
        except Exception as exc:  # the reconciler re-enqueues queued jobs missing from the broker
            log.warning("could not re-enqueue job %s (%s); `farm scheduler` will", spec.job_id, exc)
    log.warning("job %s handed back to queue %s (worker shutting down)", spec.job_id, spec.queue)
    return "released"
