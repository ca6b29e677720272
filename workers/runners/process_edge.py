"""Edge runs without Docker: the edge benchmark (or the profile's command) as a local process in a cgroup
limited like the edge box. Where cgroups cannot be created or limited (no permission, controller missing),
the run still happens and the result says plainly that the limits were not enforced, unless the worker's own
cgroup carries exactly the profile's limits (an edge pool's pod): then the run is held to them too."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from farm.errors import UnsupportedError, WorkerError
from farm.sandbox import jail_argv, model_jail
from farm.secrets import clean_env
from schemas import JobResult, JobSpec
from workers.limits import LimitedCgroup, Limits
from workers.measure import Measurement, Served
from workers.runners.common import MODEL_PLACEHOLDER, bench_command, edge_input_file
from workers.runners.edge_result import edge_result


def edge_argv(spec: JobSpec, model_path: Path, data: Path | None = None) -> tuple[list[str], bool]:
    """The argv of the edge run on this host and whether it is a user's command (``data``: the request's input
    data file for the built-in bench, :func:`workers.runners.common.edge_input_file`)."""
    prof = spec.edge_profile
    assert prof is not None
    if prof.image:
        raise UnsupportedError(f"edge profile {prof.name!r} names an image ({prof.image}); images need the Docker "
                               "runner (farm worker --runner docker)")
    if prof.command:
        return [a.replace(MODEL_PLACEHOLDER, str(model_path)) for a in prof.command], True
    argv = bench_command(spec, str(model_path), str(data) if data is not None else None)
    argv = [sys.executable, *argv[1:]]  # argv[0] is the container's "python"
    if model_jail(spec.model_format, f"the model {model_path.name}"):  # no network, the model and data read-only
        argv = jail_argv(argv, network=False, read_only=[model_path, *([data] if data is not None else [])])
    return argv, False


def limits_state(cg: LimitedCgroup, limits: Limits) -> tuple[bool, list[str]]:
    """Whether an edge run in ``cg`` is held to ``limits`` and the notes saying how (or why not): its own cgroup,
    else the worker's cgroup when it carries exactly the profile's limits (an edge pool's pod)."""
    notes = list(cg.notes)
    if cg.enforced:
        return True, notes
    around = limits.enforced_around()
    if around:  # no cgroup of its own (a pod's read-only cgroupfs), but the pod is sized to the profile
        return True, [*notes, around]
    return False, [*notes, f"limits NOT enforced: {cg.reason}"]


def run_edge_process(spec: JobSpec, model_path: Path) -> JobResult:
    """Run edge job ``spec`` as a cgroup-limited process and return its result (OOM kills reported)."""
    with edge_input_file(spec) as data:
        return _run_edge_process(spec, model_path, data)


def _run_edge_process(spec: JobSpec, model_path: Path, data: Path | None) -> JobResult:
    prof = spec.edge_profile
    if prof is None:
        raise UnsupportedError(f"job {spec.job_id} has no edge profile")
    argv, custom = edge_argv(spec, model_path, data)
    m = Measurement(spec)
    assert m.limits is not None
    started = time.monotonic()
    with m, m.limits.cgroup(name=f"farm-edge-{spec.job_id[:12]}") as cg:
        enforced, notes = limits_state(cg, m.limits)
        cores = m.server_cpus  # pinned also where the cgroup's cpuset could not be set
        proc = subprocess.Popen(cg.command(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env(), start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, cores))
        with m.watch(Served(pid=proc.pid, cgroup=cg.cgroups if cg.created else None)):
            try:
                out, err = proc.communicate(timeout=spec.measurement.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise WorkerError(f"edge run {prof.name} did not finish within {spec.measurement.timeout_s:g} s; "
                                  "raise measurement.timeout_s or shorten the run") from None
        total_s = time.monotonic() - started
        summary = m.metrics()
        limits = m.limits.metrics(enforced)
    oom = bool(summary.get("oom_killed"))
    tail = "\n".join(err.strip().splitlines()[-8:])
    return edge_result(spec, where=f"edge run {prof.name}", error=WorkerError, stdout=out, tail=tail,
                       exit_code=proc.returncode, oom=oom, custom=custom, summary=summary, limits=limits,
                       total_s=total_s, details={"runner": "process", "command": argv, "notes": [*notes, *m.notes],
                                                 **m.details()}, placement=m.placement)
