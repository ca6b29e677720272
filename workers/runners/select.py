"""Choosing a worker's runner: ``docker``, ``process``, or ``auto`` (Docker when an engine answers)."""
from __future__ import annotations

from farm.errors import ConfigError, ContainerError
from schemas import GpuInfo
from workers.runners.base import Runner
from workers.runners.process import ProcessRunner

RUNNERS = ("auto", "docker", "process")


def docker_available() -> tuple[bool, str]:
    """Whether a Docker engine answers here, and why not."""
    try:
        import docker  # noqa: PLC0415 - docker SDK (~0.2 s, ~16 MiB) only when auto probes for an engine

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
        return True, "Docker engine answered"
    except Exception as exc:  # DockerException, connection errors, missing socket
        return False, f"no Docker engine answered ({type(exc).__name__})"


def make_runner(name: str, worker_id: str, gpus: list[GpuInfo] | None = None) -> tuple[Runner, str]:
    """Build the runner called ``name``; returns it with a sentence saying why it was chosen. ``gpus``: the
    GPUs its jobs may use (a slot's one GPU), bound by a container's device request or a server process's
    ``CUDA_VISIBLE_DEVICES``."""
    if name not in RUNNERS:
        raise ConfigError(f"runner {name!r} is unknown; use one of: {', '.join(RUNNERS)} (FARM_RUNNER)")
    if name == "auto":
        ok, why = docker_available()
        name = "docker" if ok else "process"
        reason = f"runner {name}: {why}"
    else:
        reason = f"runner {name}: chosen explicitly"
    if name == "docker":
        try:  # the docker SDK is optional: a worker without it still runs the process runner
            from workers.runners.docker import DockerRunner  # noqa: PLC0415 - loads the optional docker SDK
        except ImportError as exc:
            raise ContainerError(f"the Docker runner is not available ({exc})") from None
        return DockerRunner(worker_id=worker_id, gpus=gpus or []), reason
    return ProcessRunner(gpus=gpus), reason
