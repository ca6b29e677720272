"""The runner interface: every external resource a job uses sits behind a context manager."""
from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from schemas import JobResult, JobSpec


@dataclass
class ServingTarget:
    """A ready model server: where to send KServe v2 gRPC requests, and what to sample.

    ``pid`` is the server's root process (process runner); ``container_id`` the container (Docker runner).
    ``notes`` carry facts the result must state (e.g. a limit that could not be enforced); ``reused`` says
    the server was already running for an earlier job (samplers reset peak counters).
    """

    host: str
    port: int
    model_name: str
    pid: int | None = None
    container_id: str | None = None
    cgroup_path: Path | None = None
    gpu_uuids: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    reused: bool = False  # a kept container: its cgroup's peak counters cover earlier jobs
    server: dict[str, str] | None = None  # a server farm did not start: its name, version, url (endpoint)

    @property
    def url(self) -> str:
        return f"{self.host}:{self.port}"


class Runner(ABC):
    """Starts serving engines and edge runs for jobs. Implementations: process, docker."""

    name: str = "base"

    @abstractmethod
    def serve(self, spec: JobSpec, model_path: Path,
              cpus: set[int] | None = None) -> AbstractContextManager[ServingTarget]:
        """Start the job's engine serving ``model_path`` on cores ``cpus`` (None: anywhere), wait until
        ServerReady/ModelReady, yield the target, and stop the server (freeing its port) on exit, also
        when the body raised."""

    @abstractmethod
    def run_edge(self, spec: JobSpec, model_path: Path) -> JobResult:
        """Run an edge job under the profile's CPU/memory limits and return its result."""

    def cleanup_dead(self, worker_ids: list[str]) -> list[str]:
        """Remove what workers that died on this host left behind (e.g. their containers); returns ids."""
        return []

    def close(self) -> None:  # noqa: B027 (optional hook: a no-op by default)
        """Release anything kept between jobs (e.g. reused containers)."""
