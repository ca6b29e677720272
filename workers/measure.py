"""How every job is measured, whatever its runner: the limits its run gets, the samplers that watch it
(chosen in one place, ``choose``) and the one way a sampler's series is stored in the result.

Serving jobs: NVML on the job's GPUs (idle baseline read before the server starts), the server's cgroup
(a container) or else its process tree, and the host's CPU (steal). Edge jobs: the run's cgroup, else its
container through the Docker stats API (~1 Hz, noted), else its process tree; limits are the edge
profile's (``workers.limits.Limits``). Use::

    with Measurement(spec, gpu_uuids) as m:      # GPU baseline now; apply m.limits when starting the run
        ... start the server, container or process ...
        with m.watch(Served(pid=..., cgroup=..., container=...)):
            ... drive it, or wait for it ...
    m.metrics(), m.details(), m.notes
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas import JobSpec
from workers.limits import Limits
from workers.samplers.base import Sampler

if TYPE_CHECKING:
    from workers.samplers.cgroupfs import CgroupSet
    from workers.samplers.nvml import NvmlSampler

SERIES_MAX_POINTS = 2000  # samples of one sampler kept in a result's details (20 Hz: 100 s at full rate)
STATS_API_NOTE = "resources sampled via the Docker stats API (~1 Hz) because cgroup not found"


@dataclass(frozen=True)
class Served:
    """What a job's run is, as its samplers see it: the root ``pid`` of its process tree (host pid), its
    ``cgroup`` (a path or a ``CgroupSet``), its docker-py ``container``; ``reused``: the cgroup outlives
    earlier jobs (its memory peak is reset when sampling starts)."""

    pid: int | None = None
    cgroup: Path | CgroupSet | None = None
    container: Any = None
    reused: bool = False


def tree_pids(pid: int | None) -> set[int]:
    """The process ``pid`` and its descendants (host pids, as NVML reports them); empty when gone."""
    if pid is None:
        return set()
    import psutil

    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


def choose(spec: JobSpec, served: Served, gpu: NvmlSampler | None = None) -> tuple[list[Sampler], list[str]]:
    """The samplers for job ``spec`` running as ``served`` (``gpu``: NVML on its GPUs, baseline taken), and
    notes for the result (e.g. a coarse fallback). The only place samplers are picked."""
    samplers: list[Sampler] = []
    notes: list[str] = []
    if gpu is not None:
        gpu.pids = lambda: tree_pids(served.pid)
        samplers.append(gpu)
    if served.cgroup is not None:
        from workers.samplers.cgroup import CgroupSampler

        samplers.append(CgroupSampler(served.cgroup, pid=served.pid, reset_peak=served.reused))
    elif served.container is not None:
        from workers.samplers.docker_stats import DockerStatsSampler

        samplers.append(DockerStatsSampler(served.container))
        notes.append(STATS_API_NOTE)
    elif served.pid is not None:
        from workers.samplers.process import ProcessTreeSampler

        samplers.append(ProcessTreeSampler(served.pid))
    if not spec.is_edge:
        from workers.samplers.host import HostSampler

        samplers.append(HostSampler())
    return samplers, notes


def thin(series: Sequence[dict[str, float]], max_points: int = SERIES_MAX_POINTS) -> list[dict[str, float]]:
    """At most ``max_points`` samples of ``series``, evenly spaced over the whole run (every n-th)."""
    step = max(1, math.ceil(len(series) / max_points))
    return list(series[::step])


def stored(sampler: Sampler) -> dict[str, Any]:
    """A sampler as a result stores it: its name, its own details, its series (``thin``), sample count,
    rate (Hz) and error."""
    series = sampler.series()
    out: dict[str, Any] = {"sampler": sampler.name, "samples": len(series), "error": sampler.error}
    try:
        out.update(sampler.details())
    except Exception as exc:  # the details are extras: never lose the series over them
        out["details_error"] = f"{type(exc).__name__}: {exc}"
    out["series"] = thin(series)
    if len(series) >= 2 and out.get("rate_hz") is None:
        span = series[-1]["t"] - series[0]["t"]
        out["rate_hz"] = (len(series) - 1) / span if span > 0 else None
    return out


class Measurement(AbstractContextManager["Measurement"]):
    """The measurement of one job: ``limits`` to apply (None: serving, unlimited), the samplers watching
    its run (``watch``), and what they found (``metrics``, ``details``, ``notes``). Entering reads the GPUs'
    idle baseline (serving jobs with ``gpu_uuids``); leaving releases NVML even when the run never started."""

    def __init__(self, spec: JobSpec, gpu_uuids: Sequence[str] = ()) -> None:
        self.spec = spec
        self.limits = Limits.of(spec)
        self.gpu_uuids = list(gpu_uuids)
        self.gpu: NvmlSampler | None = None
        self.samplers: list[Sampler] = []
        self.notes: list[str] = []

    def __enter__(self) -> Measurement:
        if self.gpu_uuids and not self.spec.is_edge:
            from workers.samplers.nvml import NvmlSampler

            self.gpu = NvmlSampler(self.gpu_uuids)
            try:
                self.gpu.take_baseline()
            except BaseException:
                self.gpu.close()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.gpu is not None:
            self.gpu.close()

    @contextmanager
    def watch(self, served: Served) -> Iterator[Measurement]:
        """Sample ``served`` (samplers from ``choose``) for the body's duration; every sampler is stopped
        on exit. An edge run's sampler that cannot start (the run already exited) becomes a note."""
        samplers, notes = choose(self.spec, served, self.gpu)
        self.notes += notes
        with ExitStack() as stack:
            for sampler in samplers:
                try:
                    stack.enter_context(sampler)
                except Exception as exc:
                    if not self.spec.is_edge:
                        raise
                    self.notes.append(f"no resource samples: {type(exc).__name__}: {exc}")
                    continue
                self.samplers.append(sampler)
            yield self

    def metrics(self) -> dict[str, Any]:
        """Every sampler's summary (metric names of ``schemas.metrics``), values that were measured only."""
        out: dict[str, Any] = {}
        for sampler in self.samplers:
            out.update({k: v for k, v in sampler.summary().items() if v is not None})
        return out

    def details(self) -> dict[str, Any]:
        """The samplers for the result's details (``stored``): ``sampler.<name>`` each for a serving job,
        ``resources`` for an edge run (empty when it could not be sampled)."""
        if self.spec.is_edge:
            return {"resources": stored(self.samplers[0]) if self.samplers else {}}
        return {f"sampler.{s.name}": stored(s) for s in self.samplers}
