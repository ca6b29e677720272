"""The op-profiling pass of a served job (``--op-profile``): after its load measurement, with the server
stopped, ``python -m workers.profiling`` runs on the job's server cores with the job's engine, device, batch,
threads and inputs. The pass never overlaps the measured windows, so the job's load figures are the same with
or without it (``benchmarks/op_profile.py`` shows it). This is the process runner's pass (``Runner.profile_pass``);
the Docker runner takes it in a container of the job's image on the same cpuset
(``workers.runners.docker_profile``); edge runs take theirs inside their limits (``workers.edge_bench``).

Whatever happens to the pass (no profiler for the engine, a crash, a time-out, a trace over the bound), the
job keeps its load figures; the profile says why it is missing (``schemas.op_profile``).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from farm.errors import SandboxError
from farm.sandbox import jail_argv, model_jail
from farm.secrets import clean_env
from farm.settings import get_settings
from schemas import JobSpec
from schemas.op_profile import PROFILED_ENGINES as PROFILED
from schemas.op_profile import OpProfile, missing, no_profiler
from workers.profiling.process import PASS_TIMEOUT_S, PassOptions, pass_argv, pass_process
from workers.runners.common import edge_input_file, job_inputs


def pass_options() -> PassOptions:
    """This worker's pass settings (``FARM_OP_PROFILE_ITERATIONS``, ``_MAX_EVENTS``, ``_CRASH``)."""
    s = get_settings()
    return PassOptions(s.op_profile_iterations, s.op_profile_max_events, s.op_profile_crash)


def profile_job(spec: JobSpec, model_path: Path, cpus: set[int] | None) -> tuple[OpProfile, bytes | None]:
    """The op profile of served job ``spec`` (taken on cores ``cpus``) and its raw trace, gzip-compressed (None:
    none kept). Never raises for the pass's own failures: they become a ``failed`` profile with the reason."""
    if spec.engine not in PROFILED:
        return no_profiler(spec.engine), None
    with tempfile.TemporaryDirectory(prefix="farm-op-profile-") as tmp, edge_input_file(spec) as data:
        argv = pass_argv(model_path, spec.engine, spec.batch_size, spec.measurement.threads, spec.device,
                         job_inputs(spec), Path(tmp), data, pass_options())
        try:  # the pass loads the untrusted model: a code-running format only in the jail, never with secrets
            if model_jail(spec.model_format, model_path.name):
                argv = jail_argv(argv, network=False, read_only=[model_path, *([data] if data else [])],
                                 writable=[tmp])
        except SandboxError as exc:
            return missing(spec.engine, "failed", f"the profiling pass did not run: {exc}"[:500]), None
        try:
            return pass_process(spec.engine, argv, min(PASS_TIMEOUT_S, spec.measurement.timeout_s), cpus,
                                env=clean_env())
        except (OSError, ValueError) as exc:  # no process, an unreadable trace or report: the load figures stay
            return missing(spec.engine, "failed", f"the profiling pass could not run: {type(exc).__name__}: "
                                                  f"{exc}"[:500]), None
