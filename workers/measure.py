"""How every job is measured, whatever its runner: the cores it gets (a ``workers.cores.CoreLease``: the one
the worker already holds for the job, else waited for on entering), the limits its run gets, the samplers
that watch it (chosen in one place, ``choose``), the one way a sampler's series is stored in the result, and
where it was measured (``placement``).

Serving jobs: NVML on the job's GPUs (idle baseline read before the server starts), the server's cgroup
(a container) or else its process tree, and the host's CPU (steal). Edge jobs: the run's cgroup, else its
container through the Docker stats API (~1 Hz, noted), else its process tree; limits are the edge
profile's (``workers.limits.Limits``). Both: the foreign load on the leased cores (``samplers.foreign``) and
the host yardstick (``samplers.calibrate``) on the server cores, before the run starts (entering) and after it
ended (leaving, for a serving job once its server stopped; at the end of ``watch`` for an edge run, which its
runner reads inside the block). Use::

    with Measurement(spec, gpu_uuids) as m:      # cores leased, GPU baseline now; apply m.limits (edge) or
        ... start the server, container or process ...  # m.server_cpus (serving) when starting the run
        with m.watch(Served(pid=..., cgroup=..., container=...)):   # this thread on m.loadgen_cpus
            ... drive it, or wait for it ...
    m.metrics(), m.details(), m.notes, m.placement
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from farm.hooks import announce
from farm.settings import get_settings
from schemas import JobSpec, Placement
from schemas.metrics import MetricValues
from schemas.result import host_notes
from workers.cores import CoreLease, cores_for, cpu_list, held_lease, host_cores, pinned
from workers.limits import Limits
from workers.loadgen.drivers import load_process_pids
from workers.samplers.base import Sampler
from workers.samplers.calibrate import Calibration, calibrate, speed_change_pct
from workers.samplers.cgroup import CgroupSampler
from workers.samplers.docker_stats import DockerStatsSampler
from workers.samplers.foreign import ForeignLoadSampler, ProcessesCpu, job_cpu_s
from workers.samplers.host import HostSampler
from workers.samplers.nvml import NvmlSampler
from workers.samplers.process import ProcessTreeSampler

if TYPE_CHECKING:
    from workers.samplers.cgroupfs import CgroupSet

SERIES_MAX_POINTS = 2000  # samples of one sampler kept in a result's details (20 Hz: 100 s at full rate)
STATS_API_NOTE = "resources sampled via the Docker stats API (~1 Hz) because cgroup not found"
#: the metrics of the job's host that every job reports, edge runs included (``metrics``)
HOST_METRICS = ("host_speed_index", "host_speed_change_pct", "foreign_cpu_pct")


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
    try:
        root = psutil.Process(pid)
        return {pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


def choose(spec: JobSpec, served: Served, gpu: NvmlSampler | None = None,
           cores: Sequence[int] = ()) -> tuple[list[Sampler], list[str]]:
    """The samplers for job ``spec`` running as ``served`` (``gpu``: NVML on its GPUs, baseline taken), and
    notes for the result (e.g. a coarse fallback). With its leased ``cores``, also the foreign load on them
    (where farm runs the server or the run: an attached server is not the job's, so it would count as
    foreign). The only place samplers are picked."""
    samplers: list[Sampler] = []
    notes: list[str] = []
    if gpu is not None:
        gpu.pids = lambda: tree_pids(served.pid)
        samplers.append(gpu)
    run: Sampler | None = None
    if served.cgroup is not None:
        run = CgroupSampler(served.cgroup, pid=served.pid, reset_peak=served.reused)
    elif served.container is not None:
        run = DockerStatsSampler(served.container)
        notes.append(STATS_API_NOTE)
    elif served.pid is not None:
        run = ProcessTreeSampler(served.pid)
    samplers += [run] if run is not None else []
    if not spec.is_edge:
        samplers.append(HostSampler())
    if cores and run is not None:  # an edge run is the worker's child: its time is the run sampler's already
        own = partial(job_cpu_s, not spec.is_edge, ProcessesCpu(load_process_pids))
        samplers.append(ForeignLoadSampler(cores, run, own=own))
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


def lease_for(spec: JobSpec, slots: int = 1) -> CoreLease:
    """The core lease of job ``spec`` on this host, from the settings (``host_lock_dir``, ``isolation``,
    ``job_cores``) and the worker's ``slots``; the one this process already holds for the job, if any (the
    worker waits for the cores before the job starts running; the measurement re-enters that lease)."""
    held = held_lease(spec.job_id)
    if held is not None:
        return held
    settings = get_settings()
    allowed = host_cores()
    return CoreLease(job_id=spec.job_id, want=cores_for(spec, allowed, slots, settings.job_cores),
                     directory=settings.host_lock_dir, allowed=allowed, isolation=settings.isolation)


class Measurement(AbstractContextManager["Measurement"]):
    """The measurement of one job: the ``lease`` of its cores (``server_cpus``, ``loadgen_cpus``), ``limits``
    to apply (None: serving, unlimited; an edge run is also pinned to its leased cores), the samplers
    watching its run (``watch``), what they found (``metrics``, ``details``, ``notes``) and where it ran
    (``placement``). Entering waits for the cores, then reads the GPUs' idle baseline (serving jobs with
    ``gpu_uuids``); leaving releases NVML and the cores even when the run never started."""

    def __init__(self, spec: JobSpec, gpu_uuids: Sequence[str] = (), slots: int = 1) -> None:
        self.spec = spec
        self.limits = Limits.of(spec)
        self.gpu_uuids = list(gpu_uuids)
        self.lease = lease_for(spec, slots)
        self.gpu: NvmlSampler | None = None
        self.samplers: list[Sampler] = []
        self.notes: list[str] = []
        self.calibration: dict[str, Calibration] = {}  # the host yardstick "before" and "after" the run
        self._placement: Placement | None = None

    @property
    def server_cpus(self) -> set[int]:
        """The cores the job's server (or edge run) runs on."""
        return set(self.lease.server_cores)

    @property
    def loadgen_cpus(self) -> set[int]:
        """The cores the load generator runs on (``watch`` pins the calling thread to them)."""
        return set(self.lease.loadgen_cores)

    def __enter__(self) -> Measurement:
        self.lease.__enter__()
        try:
            if self.lease.waited_s >= 1.0:
                self.notes.append(f"waited {self.lease.waited_s:.0f} s for cores {cpu_list(self.lease.cores)} "
                                  "(another farm job on this host held them)")
            announce("host yardstick, before measuring")
            self.calibration["before"] = calibrate(self.server_cpus)
            if self.limits is not None and self.lease.isolation and not self.limits.cpuset:
                self.limits = replace(self.limits, cpuset=cpu_list(self.lease.cores))
            if self.gpu_uuids and not self.spec.is_edge:
                self.gpu = NvmlSampler(self.gpu_uuids)
                try:
                    self.gpu.take_baseline()
                except BaseException:
                    self.gpu.close()
                    raise
        except BaseException:
            self.lease.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.gpu is not None:
                self.gpu.close()
            if exc[0] is None and not self.spec.is_edge:  # the server has stopped (its runner left first)
                self._after()
        finally:
            self.lease.__exit__(*exc)
            self._placement = self._where()

    def _where(self) -> Placement:
        gpu_uuid = self.gpu_uuids[0] if len(self.gpu_uuids) == 1 else None
        return Placement(slot=0, gpu_uuid=gpu_uuid, **self.lease.placement())

    @property
    def placement(self) -> Placement:
        """Where the job was measured and whether another farm job shared the host (after the with-block;
        during it: so far)."""
        return self._placement if self._placement is not None else self._where()

    @contextmanager
    def watch(self, served: Served) -> Iterator[Measurement]:
        """Sample ``served`` (samplers from ``choose``) for the body's duration; every sampler is stopped
        on exit. An edge run's sampler that cannot start (the run already exited) becomes a note."""
        samplers, notes = choose(self.spec, served, self.gpu, self.lease.cores)
        self.notes += notes
        with ExitStack() as stack:
            if not self.spec.is_edge:  # the load generator: this thread and what it starts
                stack.enter_context(pinned(self.loadgen_cpus))
            for sampler in samplers:
                if isinstance(sampler, ForeignLoadSampler) and sampler.server not in self.samplers:
                    continue  # the run's own sampler did not start: its CPU time is unknown
                try:
                    stack.enter_context(sampler)
                except Exception as exc:
                    if not self.spec.is_edge:
                        raise
                    self.notes.append(f"no resource samples: {type(exc).__name__}: {exc}")
                    continue
                self.samplers.append(sampler)
            yield self
        if self.spec.is_edge:  # the edge run has ended; its runner reads the metrics before leaving
            self.notes += [f"no resource samples: the run ended before the {s.name} sampler's first sample"
                           for s in self.samplers if not isinstance(s, ForeignLoadSampler) and not s.samples]
            self._after()

    def _after(self) -> None:
        """The host yardstick after the run, and the notes on a drifting or busy host (the worker's bounds,
        ``FARM_HOST_DRIFT_PCT`` and ``FARM_HOST_BUSY_PCT``)."""
        if "after" in self.calibration or "before" not in self.calibration:
            return
        announce("host yardstick, after measuring")
        self.calibration["after"] = calibrate(self.server_cpus)
        settings = get_settings()
        self.notes += host_notes(self.metrics(), settings.host_drift_pct, settings.host_busy_pct)

    def metrics(self) -> MetricValues:
        """Every sampler's summary (metric names of ``schemas.metrics``), values that were measured only."""
        out: MetricValues = {}
        for sampler in self.samplers:
            out.update({k: v for k, v in sampler.summary().items() if v is not None})
        before, after = self.calibration.get("before"), self.calibration.get("after")
        if before is not None:
            out["host_speed_index"] = round(before.speed, 3)
        if before is not None and after is not None:
            out["host_speed_change_pct"] = round(speed_change_pct(before, after), 2)
        return out

    def details(self) -> dict[str, Any]:
        """The samplers for the result's details (``stored``): ``sampler.<name>`` each for a serving job,
        ``resources`` for an edge run (empty when it could not be sampled)."""
        host = {"calibration": {k: c.as_dict() for k, c in self.calibration.items()}}
        if self.spec.is_edge:
            run = [s for s in self.samplers if not isinstance(s, ForeignLoadSampler)]
            foreign = {f"sampler.{s.name}": stored(s) for s in self.samplers if isinstance(s, ForeignLoadSampler)}
            return {"resources": stored(run[0]) if run else {}, **foreign, **host}
        return {**{f"sampler.{s.name}": stored(s) for s in self.samplers}, **host}
