"""Edge runs: the model (or a user's command) in a container limited like the edge box.

The container gets the job's edge profile as hard limits: ``nano_cpus`` from ``cpus`` (CFS quota),
``mem_limit`` = ``memswap_limit`` = ``memory`` (no swap), optional ``cpuset_cpus``; no network at all,
every capability dropped, read-only root, user nobody. By default it runs ``python -m
workers.edge_bench`` (batch loop in-process, one JSON line of latency/throughput); like Auptimizer it can
instead run a user's ``command`` in a user's ``image`` (``EdgeCommand``). The limits and samplers come
from ``workers.measure``: the container's cgroup is sampled at 20 Hz while it runs (CPU average/peak,
memory average and true peak, block I/O), or Docker's stats API (~1 Hz, noted) when it is not found.

An OOM kill is a result, not a crash: metrics ``oom_killed=True`` and details ``error`` = ``killed: out
of memory (limit N MiB) ...``. A crash (non-zero exit for another reason) or a timeout raises
ContainerError with the container's last log lines.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from farm.errors import ContainerError, UnsupportedError
from schemas import EdgeProfile, JobResult, JobSpec
from workers.limits import Limits
from workers.measure import Measurement, Served
from workers.runners import hardening as hd
from workers.runners.common import DATA_INSIDE, MODEL_PLACEHOLDER, bench_command, edge_input_file
from workers.runners.edge_result import edge_result


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


@dataclass
class _Ended:
    """How an edge container ended: its final ``state`` (Docker's), output, wall time (s), whether it was
    killed at the job's timeout, whether Docker applied the limits, and notes for the result."""

    state: dict[str, Any]
    stdout: str
    tail: str
    total_s: float
    timed_out: bool
    enforced: bool
    notes: list[str]


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
    with edge_input_file(spec) as data:
        volumes, inside = hd.model_mount(model_path)
        if data is not None and not command:  # the request's input data file, for the built-in bench
            volumes.update(hd.mount(data, DATA_INSIDE))
        argv = ([a.replace(MODEL_PLACEHOLDER, inside) for a in command] if command
                else bench_command(spec, inside, DATA_INSIDE if data is not None else None))
        _require_image(client, image)
        with Measurement(spec) as m:
            assert m.limits is not None
            container = _create(client, prof, m.limits, image=image, command=argv, environment=environment or {},
                                name=hd.container_name("edge", worker_id, spec.job_id),
                                labels=hd.labels(worker_id, spec.job_id, "edge"), volumes=volumes, network_mode="none",
                                **hd.hardening(pids_limit), **({} if command else dict(hd.NO_ENTRYPOINT)))
            try:
                ended = _run(container, spec, prof, m)
            finally:
                hd.remove(container, stop_timeout_s=1)
        return _result(spec, prof, m, ended, image=image, argv=argv, custom=command is not None)


def _require_image(client: Any, image: str) -> None:
    """ContainerError unless ``image`` is on this Docker host (farm never pulls)."""
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ContainerError(
            f"image {image!r} is not on this Docker host and farm never pulls; docker load or build it first"
        ) from None


def _create(client: Any, prof: EdgeProfile, limits: Limits, **kwargs: Any) -> Any:
    """The edge container (created, not started) with ``limits`` as its hard limits."""
    try:
        return client.containers.create(**kwargs, **limits.docker_kwargs())
    except docker.errors.APIError as exc:
        raise ContainerError(f"could not create the edge container for {prof.name}: {exc.explanation or exc}; "
                             "check the profile's cpuset against this host's CPUs") from exc


def _run(container: Any, spec: JobSpec, prof: EdgeProfile, m: Measurement) -> _Ended:
    """Start ``container``, check its limits, sample it until it exits (killed at the job's timeout)."""
    assert m.limits is not None
    t0 = time.monotonic()
    try:
        container.start()
    except docker.errors.APIError as exc:
        raise ContainerError(f"could not start the edge container for {prof.name}: {exc.explanation or exc}; "
                             "check the profile's cpuset and memory against this host") from exc
    cg = hd.cgroup_path(container.id)
    enforced, notes = m.limits.check_container(container, cg)  # while the cgroup exists
    timed_out = False
    with m.watch(Served(cgroup=cg, container=container)):
        try:
            container.wait(timeout=spec.measurement.timeout_s)
        except Exception:  # requests' ReadTimeout / ConnectionError: the job overran its limit
            timed_out = True
            container.kill()
            container.wait(timeout=30)
    total_s = time.monotonic() - t0
    container.reload()
    return _Ended(state=container.attrs.get("State", {}), tail=hd.log_tail(container),
                  stdout=container.logs(stdout=True, stderr=False).decode("utf-8", "replace"),
                  total_s=total_s, timed_out=timed_out, enforced=enforced, notes=notes)


def _result(spec: JobSpec, prof: EdgeProfile, m: Measurement, ended: _Ended, *, image: str, argv: list[str],
            custom: bool) -> JobResult:
    """The edge run's JobResult; ContainerError when it was killed at the timeout (not for an OOM kill)."""
    assert m.limits is not None
    summary = m.metrics()
    oom = bool(ended.state.get("OOMKilled")) or bool(summary.get("oom_killed"))
    where = f"edge container ({prof.name}, {image})"
    if ended.timed_out and not oom:
        raise ContainerError(f"{where} did not finish within the job's timeout of {spec.measurement.timeout_s:g} s "
                             f"and was killed; raise measurement.timeout_s or shorten the run. "
                             f"last log lines:\n{ended.tail}")
    return edge_result(
        spec, where=where, error=ContainerError, stdout=ended.stdout, tail=ended.tail,
        exit_code=ended.state.get("ExitCode"), oom=oom, custom=custom, summary=summary, total_s=ended.total_s,
        limits=m.limits.metrics(ended.enforced),
        details={"runner": "docker", "image": image, "command": argv, "notes": [*ended.notes, *m.notes],
                 **m.details()}, placement=m.placement)
