"""The op-profiling pass of a served job under the Docker runner (``--op-profile``): inside a container, so that
the profile is taken under the job's own limits, as its server ran.

After the load measurement, with the serving container stopped, a one-shot container of the same image runs
``python -m workers.profiling`` with the serving container's cpuset (the job's server cores), the same GPU, the
same hardening (``hardening.hardening``: read-only root, user nobody, every capability dropped, pids limit) and no
network at all. The model (and the request's input data file) are mounted read-only as for serving; a host
directory is mounted writable at ``/out`` for the raw trace, read back here. The pass records where it ran
(``OpProfile.site``: its hostname and pid); the container's id is added, so the profile says which box it
describes. The container is always removed; a crash, a time-out or an error of the pass gives a ``failed``
profile with the reason, and the job keeps its load figures.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import docker
from schemas import JobSpec
from schemas.op_profile import PROFILED_ENGINES, OpProfile, missing, no_profiler
from workers.cores import cpu_list
from workers.profiling.job import pass_options
from workers.profiling.process import PASS_TIMEOUT_S, pass_argv, read_pass, read_report, result_file_name
from workers.runners import hardening as hd
from workers.runners.common import DATA_INSIDE, edge_input_file, job_inputs

#: where the pass writes its trace inside the container (a host directory, writable)
OUT_INSIDE = "/out"


def profile_in_container(client: Any, spec: JobSpec, model_path: Path, cpus: set[int] | None, *, image: str,
                         worker_id: str, pids_limit: int, gpu_uuids: list[str]) -> tuple[OpProfile, bytes | None]:
    """The op profile of served job ``spec``, taken in a one-shot container of ``image`` on cores ``cpus``, and
    its raw trace (gzip; None: none kept). Never raises for the pass's own failures."""
    if spec.engine not in PROFILED_ENGINES:
        return no_profiler(spec.engine), None
    timeout = min(PASS_TIMEOUT_S, spec.measurement.timeout_s)
    with tempfile.TemporaryDirectory(prefix="farm-op-profile-") as tmp, edge_input_file(spec) as data:
        os.chmod(tmp, 0o777)  # noqa: S103 - the container's user (nobody) writes the trace here; the dir is ours
        volumes, inside = hd.model_mount(model_path)
        if data is not None:
            volumes.update(hd.mount(data, DATA_INSIDE))
        volumes[tmp] = {"bind": OUT_INSIDE, "mode": "rw"}
        result = result_file_name()  # the pass's own channel: its stdout is the model's as much as its own
        argv = ["python", *pass_argv(Path(inside), spec.engine, spec.batch_size, spec.measurement.threads,
                                     spec.device, job_inputs(spec), Path(OUT_INSIDE),
                                     Path(DATA_INSIDE) if data is not None else None, pass_options())[1:],
                "--result-file", f"{OUT_INSIDE}/{result}"]
        kwargs: dict[str, Any] = dict(image=image, command=argv, volumes=volumes, network_mode="none",
                                      name=hd.container_name("profile", worker_id, spec.job_id),
                                      labels=hd.labels(worker_id, spec.job_id, "profile"),
                                      init=True,  # tini as pid 1: the pass gets signals' default actions
                                      **hd.hardening(pids_limit), **hd.NO_ENTRYPOINT)
        if cpus:
            kwargs["cpuset_cpus"] = cpu_list(cpus)
        if gpu_uuids:
            kwargs["device_requests"] = [docker.types.DeviceRequest(device_ids=gpu_uuids, capabilities=[["gpu"]])]
        try:
            container = client.containers.create(**kwargs)
        except Exception as exc:
            return missing(spec.engine, "failed", f"the profiling container could not be created from {image}: "
                                                  f"{exc}"[:500]), None
        try:
            code, stderr = _run(container, timeout)
        finally:
            hd.remove(container, stop_timeout_s=1)
        if code is None:
            return missing(spec.engine, "failed", f"the profiling pass took over {timeout:g} s and was stopped"), None
        prof, trace = read_pass(spec.engine, code, read_report(Path(tmp), result), stderr, Path(tmp),
                                inside=OUT_INSIDE)
    where = f"container {container.short_id} of {image}" + (f", cpuset {cpu_list(cpus)}" if cpus else "")
    return prof.model_copy(update={"site": f"{where}: {prof.site}" if prof.site else where}), trace


def _run(container: Any, timeout: float) -> tuple[int | None, str]:
    """Start ``container`` and wait for it: its exit status (None: killed at ``timeout`` s) and its stderr's last
    lines (its stdout, the model's as much as the pass's, is not read)."""
    try:
        container.start()
    except Exception as exc:
        return 125, f"the profiling container did not start: {exc}"
    try:
        code = int(container.wait(timeout=timeout).get("StatusCode", 1))
    except Exception:  # requests' ReadTimeout / ConnectionError: it overran
        container.kill()
        return None, ""
    # a pass killed by a signal: the init reports 128 + signal; read_pass reads negatives as signals
    code = -(code - 128) if 128 < code < 160 else code
    return code, container.logs(stdout=False, stderr=True, tail=20).decode("utf-8", "replace")
