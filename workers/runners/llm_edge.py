"""An LLM engine on an edge box (``farm submit tiny.gguf --edge cpus=1,memory=512m --slo ttft=MS,tpot=MS``): the
engine's server (its serving module's launch, as for a serving job) started inside a cgroup limited like the
edge profile (CPU quota, memory without swap, the leased cpuset), driven over HTTP by the OpenAI client from
outside the limits (a remote client; pinned to the host's other cores where there are any), sampled by its
cgroup from start to end, so the memory peak includes loading the model.

The result is an LLM row with the limits (``mem_limit_bytes``, ``cpu_limit``, ``limits_enforced``) and
``oom_killed``: a server killed for memory while loading or serving gives an OOM result (``details.error`` says
so), not a crash. ``farm.readers.report`` judges it against the request's SLO (``LLM_FIT_PCT`` of requests inside).
The process runner only: the Docker runner refuses with the reason."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from farm.errors import FarmError, ServerError, UnsupportedError
from farm.settings import get_settings
from schemas import JobResult, JobSpec
from schemas.llm_facts import LlmFacts
from schemas.metrics import MetricValues
from workers.cores import host_cores, pinned
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadResult, LoadSpec, LoadTarget
from workers.measure import Measurement, Served
from workers.runners.edge_result import RESOURCE_METRICS
from workers.runners.process import SITE, ServerProcess, server_env
from workers.runners.process_edge import limits_state
from workers.serving.base import Launch
from workers.serving.jail import confined
from workers.serving.registry import serving_engine

CLIENT_NOTE = "the OpenAI client ran outside the edge limits (as a remote client), on cores {cores}"


def run_llm_edge(spec: JobSpec, model_path: Path, runner: str) -> JobResult:
    """Run LLM edge job ``spec`` (its engine's server under the profile's limits) on runner ``runner``; its
    result, OOM kills included. UnsupportedError on another runner than ``process``; ServerError (with the
    server's last output) when the server failed for another reason than memory."""
    prof = spec.edge_profile
    if prof is None:
        raise UnsupportedError(f"job {spec.job_id} has no edge profile")
    if runner != "process":
        raise UnsupportedError(f"job {spec.job_id} runs the {spec.engine} engine under edge profile {prof.name!r}: "
                               "LLM edge runs need the process runner (farm worker --runner process)")
    launch = serving_engine(spec.engine).launch(spec, model_path, SITE)
    env = server_env(spec, None, launch.env)
    started = time.monotonic()
    m = Measurement(spec)
    assert m.limits is not None
    with m, m.limits.cgroup(name=f"farm-edge-{spec.job_id[:12]}") as cg, confined(launch, env) as jail:
        enforced, notes = limits_state(cg, m.limits)
        cores = m.server_cpus
        with ServerProcess(cg.command(jail.argv), env=env, listen_prefix=launch.listen_prefix,
                           cpu_set=cores, cwd=launch.cwd, pass_fds=jail.pass_fds) as server:
            with m.watch(Served(pid=server.pid, cgroup=cg.cgroups if cg.created else None)):
                load, failure, client = _drive(spec, launch, server, cores, jail.port)
            tail = server.tail()
        notes += jail.notes
        summary, limits = m.metrics(), m.limits.metrics(enforced)
    oom = bool(summary.get("oom_killed"))
    if failure is not None and not oom:
        raise ServerError(f"edge run {prof.name} of {spec.engine} failed: {failure}; server output: {tail or 'none'}")
    metrics: MetricValues = {**(load.metrics if load is not None else {}),
                             **{k: summary[k] for k in RESOURCE_METRICS if summary.get(k) is not None}}
    metrics.update(**limits, oom_killed=oom, total_time_s=time.monotonic() - started)
    details: dict[str, Any] = {"load": load.details if load is not None else {}, "runner": "process", "kind": "edge",
                               "edge_profile": prof.model_dump(), "notes": [*notes, *client, *m.notes],
                               **m.details()}
    if oom:
        details["error"] = (f"killed: out of memory (limit {prof.memory / 2**20:g} MiB) while "
                            f"{'loading the model' if load is None and failure else 'serving'}: the {spec.engine} "
                            f"server needs more memory than edge profile {prof.name!r} allows; give a smaller "
                            "(quantized) model, a smaller n_ctx, or raise the profile's memory")
        details["log_tail"] = tail
    if launch.server is not None:
        details["server"] = dict(launch.server)
        details["notes"] += [launch.server["why"]] if "why" in launch.server else []
    facts = LlmFacts.of(spec, len(cores), load.typed.token_sources if load is not None else None, launch.server)
    return JobResult(job_id=spec.job_id, metrics=metrics, details=details, placement=m.placement, llm=facts)


def _drive(spec: JobSpec, launch: Launch, server: ServerProcess, server_cores: set[int], jail_port: int | None
           ) -> tuple[LoadResult | None, str | None, list[str]]:
    """Wait for the server, then measure it with the job's load: (load, None, notes), or (None, why it failed,
    notes) when the server never answered or the load failed (an OOM kill shows here first)."""
    timeout = get_settings().server_ready_timeout_s
    others = sorted(set(host_cores()) - server_cores)
    try:
        port = server.wait_port(timeout) if launch.listen_prefix is not None else (jail_port or launch.port)
        url = f"{SITE.host}:{port}"
        launch.ready(url, launch.model_name, timeout, alive=server.alive)
        with pinned(others or host_cores()):
            load = run_load(LoadTarget(url, launch.model_name), LoadSpec.of(spec))
    except FarmError as exc:
        return None, str(exc), []
    where = ",".join(map(str, others)) if others else "shared with the server (the host has no other core)"
    return load, None, [CLIENT_NOTE.format(cores=where)]
