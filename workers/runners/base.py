"""The runner interface: every external resource a job uses sits behind a context manager. A runner places
the launch its job's engine declares (``workers.serving``) on its ``site``; it never names an engine."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from farm.hooks import announce
from schemas import JobResult, JobSpec
from schemas.op_profile import OpProfile
from workers.profiling.job import profile_job
from workers.serving.base import Launch, ServingTarget, Site
from workers.serving.confine import check_threads
from workers.serving.registry import serving_engine

__all__ = ["Runner", "ServingTarget"]


class Runner(ABC):
    """Starts serving engines and edge runs for jobs. Implementations: process, docker."""

    name: str = "base"
    site: Site  # where this runner's servers run, as engines must know it

    @contextmanager
    def serve(self, spec: JobSpec, model_path: Path, cpus: set[int] | None = None) -> Iterator[ServingTarget]:
        """Serve ``model_path`` for ``spec``: the running server its engine attaches to, else the engine's
        launch placed on cores ``cpus`` (None: anywhere), waited for until ServerReady/ModelReady, then every
        thread of it checked to be on ``cpus`` (``workers.serving.confine``: LeaseError otherwise). Yields the
        target, and stops a server it started (freeing its port) on exit, also when the body raised."""
        engine = serving_engine(spec.engine)
        attached = engine.attach(spec, model_path)
        if attached is not None:
            with attached as target:
                yield target
            return
        announce(f"starting the {spec.engine} server, loading the model")
        launch = engine.launch(spec, model_path, self.site)
        with self.place(spec, launch, cpus) as target:
            if cpus:
                check_threads(target, cpus)
            if launch.server is not None and target.server is None:  # which program the engine ran, and its version
                target.server = dict(launch.server)
                if "why" in launch.server:
                    target.notes.append(launch.server["why"])
            yield target

    @abstractmethod
    def place(self, spec: JobSpec, launch: Launch, cpus: set[int] | None) -> AbstractContextManager[ServingTarget]:
        """Start ``launch`` for ``spec`` on cores ``cpus``, wait until it is ready, yield its target, and stop
        it on exit (also when the body raised)."""

    @abstractmethod
    def run_edge(self, spec: JobSpec, model_path: Path) -> JobResult:
        """Run an edge job under the profile's CPU/memory limits and return its result."""

    def profile_pass(self, spec: JobSpec, model_path: Path, cpus: set[int] | None) -> tuple[OpProfile, bytes | None]:
        """The op-profiling pass of served job ``spec`` after its measurement (``--op-profile``), on cores ``cpus``:
        here a process on the host (``workers.profiling.job``); the Docker runner takes it in a container."""
        return profile_job(spec, model_path, cpus)

    def cleanup_dead(self, worker_ids: list[str]) -> list[str]:
        """Remove what workers that died on this host left behind (e.g. their containers); returns ids."""
        return []

    def close(self) -> None:  # noqa: B027 (optional hook: a no-op by default)
        """Release anything kept between jobs (e.g. reused containers)."""
