"""The serving layer's contract. Each engine declares once how its server comes to be: a ``Launch`` (command
line, image, mounts, environment, port, repository preparation, readiness check) that a runner places on its
``Site``, or a running server farm attaches to. Runners (``workers.runners``) place launches and never name
an engine; engines are found by name in ``workers.serving.registry``."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from schemas import JobSpec
from schemas.engines import SERVED_MODEL_NAME
from workers.engines.base import Package
from workers.engines.ready import wait_ready

#: how a process runner confines a launched server (``workers.serving.jail``)
Sandbox = Literal["server", "host-network", "none"]
#: ``check(url, model_name, timeout_s, alive=callable)``: returns once the server serves the model, else
#: raises ServerError (``workers.engines.ready.wait_ready``: KServe v2 ServerReady and ModelReady)
ReadyCheck = Callable[..., None]


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
    authority: str | None = None  # an endpoint's name (Host header, TLS) where ``host`` is its pinned address
    in_flight_cap: int | None = None  # an endpoint job's cap on requests in flight (FARM_ENDPOINT_MAX_IN_FLIGHT)

    @property
    def url(self) -> str:
        """``HOST:PORT`` (``[V6]:PORT``)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Site:
    """Where a runner places a launch, as far as the engine must know it.

    ``container``: in a container (farm's image or the launch's own), else a local process; ``python``: the
    interpreter farm's own servers run under; ``host``/``port``: the address the server binds (port 0: it
    picks a free one and prints it, see ``Launch.listen_prefix``); ``model_dir``: where a container sees
    a mounted model file (None: files are seen at their host paths)."""

    container: bool
    python: str
    host: str
    port: int
    model_dir: str | None = None

    def path(self, host_path: Path) -> str:
        """Where the server sees the file ``host_path``."""
        if self.model_dir is None:
            return str(host_path)
        return f"{self.model_dir}/{Path(host_path).resolve().name}"

    def mounts(self, host_path: Path) -> dict[str, str]:
        """The read-only mount that makes ``host_path`` visible at :meth:`path` (none for a process)."""
        return {str(Path(host_path).resolve()): self.path(host_path)} if self.model_dir is not None else {}


@dataclass(frozen=True)
class Launch:
    """One server to start for a job, declared by its engine, placed by a runner.

    ``argv``: its command line (in a container: the command, farm's image with no entrypoint); ``port``: the
    port it listens on (0: read from its ``listen_prefix HOST:PORT`` line on stdout); ``model``: the model's
    path as the server sees it; ``image``: the image a container runs (None: farm's runtime image, with the
    engine's ``package``), ``image_help`` how to get it onto a host (farm never pulls); ``mounts``: host path
    -> path inside, read-only; ``prepare``: what to write before a new server starts (a model repository);
    ``ready``: the readiness check; ``cwd``: the directory the server starts in (None: the runner's);
    ``sandbox``: how a runner without containers confines it (``workers.serving.jail``): ``server``, the default
    every launch gets unless it says otherwise, is the jail with a network of its own reached only through farm's
    relay; ``host-network`` the jail keeping the host's network; ``none`` no jail (farm's own server on a format that
    runs no code); ``entrypoint``: the entrypoint of the launch's own ``image`` (None: the image's; ``[""]``: none,
    ``argv`` is the whole command); ``server``: which server program runs and its version (``name``,
    ``version``; ``why``: the reason for a fallback), the result's ``server`` (None: the engine's own, unnamed);
    ``read_only``: further host paths a jailed server reads (its own Python environment, e.g. vLLM CPU's venv).
    """

    argv: list[str]
    port: int
    model_name: str = SERVED_MODEL_NAME
    model: str = ""
    image: str | None = None
    image_help: str = "load it (docker load)"
    mounts: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    shm_size: str | None = None
    listen_prefix: str | None = None
    sandbox: Sandbox = "server"  # jailed with a private network unless the engine says less (workers.serving.jail)
    prepare: Callable[[], object] | None = None
    ready: ReadyCheck = wait_ready
    cwd: str | None = None
    entrypoint: list[str] | None = None
    server: dict[str, str] | None = None
    read_only: tuple[str, ...] = ()


class ServingEngine(ABC):
    """How one engine's server comes to be for a job: attached (a running server), else launched by a runner.

    ``package``: the Python package farm's runtime image must carry for it (built-in server, edge runs)."""

    name: str = "base"
    package: Package | None = None

    def attach(self, spec: JobSpec, model_path: Path) -> AbstractContextManager[ServingTarget] | None:
        """The running server to drive for ``spec`` instead of launching one; None: a runner launches it."""
        return None

    @abstractmethod
    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        """The server to start for ``spec`` serving ``model_path`` on ``site``; UnsupportedError (saying what
        to do) when this site cannot run it. Has no side effect: writing files is ``Launch.prepare``."""
