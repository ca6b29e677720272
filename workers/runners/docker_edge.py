"""Edge runs: the model (or a user's command) in a container limited like the edge box.

The container gets the job's edge profile as hard limits: ``nano_cpus`` from ``cpus`` (CFS quota),
``mem_limit`` = ``memswap_limit`` = ``memory`` (no swap), optional ``cpuset_cpus``; no network at all,
every capability dropped, read-only root, user nobody. By default it runs ``python -m
workers.edge_bench`` (batch loop in-process, one JSON line of latency/throughput); like Auptimizer it can
instead run a user's ``command`` in a user's ``image`` (``EdgeCommand``). The container's cgroup is
sampled at 20 Hz while it runs (CPU average/peak, memory average and true peak, block I/O).

An OOM kill is a result, not a crash: metrics ``oom_killed=True`` and details ``error`` = ``killed: out
of memory (limit N MiB) ...``. A crash (non-zero exit for another reason) or a timeout raises
ContainerError with the container's last log lines.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import ContainerError, UnsupportedError
from schemas import JobResult, JobSpec
from workers.runners import hardening as hd
from workers.runners.docker_stats import container_sampler, sampler_details
from workers.runners.edge_result import edge_result

MODEL_PLACEHOLDER = "{model}"


@dataclass(frozen=True)
class EdgeCommand:
    """A user's command for an edge run (Auptimizer style).

    ``image``: the image to run (None = the runner's image; it must already be on this Docker host, no
    pull); ``command``: argv, where ``{model}`` is replaced by the model's path inside the container
    (``/model/<file>``); ``environment``: extra variables. The hardening and limits are the same as for
    the built-in bench. If the command prints an ``edge_bench`` JSON line, its metrics are used.
    """

    command: list[str]
    image: str | None = None
    environment: dict[str, str] = field(default_factory=dict)


def edge_threads(spec: JobSpec) -> int:
    """Intra-op threads for an edge run: the job's setting, else ceil(cpus) capped by the cpuset size
    and this host's cores (a 0.5-core box gets one thread, not one per host core)."""
    if spec.measurement.threads > 0:
        return spec.measurement.threads
    prof = spec.edge_profile
    assert prof is not None
    n = max(1, math.ceil(prof.cpus))
    if prof.cpuset:
        cores = 0
        for part in prof.cpuset.split(","):
            lo, _, hi = part.partition("-")
            cores += int(hi or lo) - int(lo) + 1
        n = min(n, cores)
    return min(n, os.cpu_count() or n)


def edge_duration_s(spec: JobSpec) -> float:
    """Measured time of the batch loop: ``duration_s`` if set, else ``window_s * min_windows``."""
    m = spec.measurement
    return m.duration_s if m.duration_s is not None else m.window_s * m.min_windows


def bench_command(spec: JobSpec, model_inside: str) -> list[str]:
    """argv of the built-in edge bench for ``spec``."""
    inputs = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in spec.inputs]
    return [
        "python", "-m", "workers.edge_bench", "--model", model_inside, "--format", spec.model_format,
        "--engine", spec.engine, "--batch-size", str(spec.batch_size),
        "--warmup-s", f"{spec.measurement.warmup_s:g}", "--duration-s", f"{edge_duration_s(spec):g}",
        "--threads", str(edge_threads(spec)), "--inputs", json.dumps(inputs, separators=(",", ":")),
    ]


def _limits_enforced(container: Any, cg: Path | None, cpus: float, memory: int) -> tuple[bool, list[str]]:
    """True when Docker applied both limits: HostConfig says so and, where readable, the kernel too."""
    notes: list[str] = []
    hc = container.attrs.get("HostConfig", {})
    ok = hc.get("NanoCpus") == int(cpus * 1e9) and hc.get("Memory") == memory
    if not ok:
        notes.append(f"Docker did not record the limits (NanoCpus={hc.get('NanoCpus')}, Memory={hc.get('Memory')})")
    mem_k = cpu_k = None
    if cg is not None:
        try:
            from workers.samplers.cgroup import CgroupSet, read_limits

            lim = read_limits(CgroupSet.from_path(cg))
            mem_k, cpu_k = lim.get("memory_bytes"), lim.get("cpus")
        except (OSError, ValueError) as exc:  # the cgroup vanished or is unreadable: noted below
            notes.append(f"cgroup {cg} unreadable ({exc})")
    if mem_k is None or cpu_k is None:
        notes.append("limits could not be read back from the container's cgroup; trusting Docker's HostConfig")
    else:
        if mem_k != memory:
            ok = False
            notes.append(f"cgroup memory limit is {mem_k} B, not {memory} B")
        if abs(cpu_k - cpus) > 0.01:
            ok = False
            notes.append(f"cgroup CPU quota is {cpu_k:g} cores, not {cpus:g}")
    return ok, notes


def run_edge(
    client: Any,
    spec: JobSpec,
    model_path: Path,
    *,
    image: str,
    worker_id: str = "local",
    pids_limit: int = hd.PIDS_LIMIT,
    command: list[str] | None = None,
    edge_command: EdgeCommand | None = None,
    environment: dict[str, str] | None = None,
) -> JobResult:
    """Run edge job ``spec`` in a limited, hardened container and return its result.

    ``command`` (argv, ``{model}`` substituted) or ``edge_command`` replace the built-in bench;
    ``image`` is the image (``edge_command.image`` wins). The container is always removed.
    """
    prof = spec.edge_profile
    if prof is None:
        raise UnsupportedError(f"job {spec.job_id} has no edge profile; serve it with serve() instead")
    if edge_command is None and command is None and prof.command:
        edge_command = EdgeCommand(command=list(prof.command), image=prof.image)
    if edge_command is not None:
        command = list(edge_command.command)
        image = edge_command.image or image
        environment = {**edge_command.environment, **(environment or {})}
    volumes, inside = hd.model_mount(model_path)
    custom = command is not None
    argv = [a.replace(MODEL_PLACEHOLDER, inside) for a in command] if command else bench_command(spec, inside)
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ContainerError(
            f"image {image!r} is not on this Docker host and farm never pulls; docker load or build it first"
        ) from None
    kwargs: dict[str, Any] = dict(
        image=image, command=argv, environment=environment or {},
        name=hd.container_name("edge", worker_id, spec.job_id),
        labels=hd.labels(worker_id, spec.job_id, "edge"), volumes=volumes, network_mode="none",
        nano_cpus=int(prof.cpus * 1e9), mem_limit=prof.memory, memswap_limit=prof.memory,
        **hd.hardening(pids_limit),
    )
    if prof.cpuset:
        kwargs["cpuset_cpus"] = prof.cpuset
    try:
        container = client.containers.create(**kwargs)
    except docker.errors.APIError as exc:
        raise ContainerError(f"could not create the edge container for {prof.name}: {exc.explanation or exc}; "
                             "check the profile's cpuset against this host's CPUs") from exc
    notes: list[str] = []
    try:
        t0 = time.monotonic()
        try:
            container.start()
        except docker.errors.APIError as exc:
            raise ContainerError(f"could not start the edge container for {prof.name}: {exc.explanation or exc}; "
                                 "check the profile's cpuset and memory against this host") from exc
        cg = hd.cgroup_path(container.id)
        enforced, lim_notes = _limits_enforced(container, cg, prof.cpus, prof.memory)  # while cg exists
        notes.extend(lim_notes)
        sampler, note = container_sampler(container, cg)
        if note:
            notes.append(note)
        timed_out = False
        try:
            sampler.__enter__()
            sampling = True
        except Exception as exc:  # exited before the first sample: keep the run, say why there is no data
            notes.append(f"no resource samples: {type(exc).__name__}: {exc}")
            sampling = False
        try:
            try:
                container.wait(timeout=spec.measurement.timeout_s)
            except Exception:  # requests' ReadTimeout / ConnectionError: the job overran its limit
                timed_out = True
                container.kill()
                container.wait(timeout=30)
        finally:
            if sampling:
                sampler.__exit__(None, None, None)
        total_s = time.monotonic() - t0
        container.reload()
        state = container.attrs.get("State", {})
        stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
        tail = hd.log_tail(container)
    finally:
        hd.remove(container, stop_timeout_s=1)

    summary = sampler.summary() if sampling else {}
    oom = bool(state.get("OOMKilled")) or bool(summary.get("oom_killed"))
    exit_code = state.get("ExitCode")
    where = f"edge container ({prof.name}, {image})"
    if timed_out and not oom:
        raise ContainerError(f"{where} did not finish within the job's timeout of {spec.measurement.timeout_s:g} s "
                             f"and was killed; raise measurement.timeout_s or shorten the run. "
                             f"last log lines:\n{tail}")
    return edge_result(
        spec, where=where, error=ContainerError, stdout=stdout, tail=tail, exit_code=exit_code, oom=oom,
        custom=custom, summary=summary, total_s=total_s,
        limits=dict(mem_limit_bytes=prof.memory, cpu_limit=prof.cpus, limits_enforced=enforced),
        details={"runner": "docker", "image": image, "command": argv, "notes": notes,
                 "resources": sampler_details(sampler) if sampling else {}})
