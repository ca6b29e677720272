"""The ``triton`` engine on farm's runners: the official Triton server in a container (Docker runner), or a
Triton server that is already running (``FARM_TRITON_URL``, any runner). farm's load generator drives both
with the same KServe v2 gRPC calls it uses for its own server."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from farm.settings import get_settings
from schemas import JobSpec
from workers.engines.base import IOSpec
from workers.engines.triton import REPO_MOUNT, TRITON_GRPC_PORT, attach, build_repository, tritonserver_command
from workers.runners.base import ServingTarget

MODEL_NAME = "model"


def triton_inputs(spec: JobSpec) -> list[IOSpec]:
    """The job's inputs with the batch dimension (-1) in front, as Triton's config wants them."""
    return [IOSpec(t.name, t.dtype, (-1, *t.shape)) for t in spec.inputs]


def prepare_repository(spec: JobSpec, model_path: Path) -> Path:
    """A Triton model repository for the job under ``<home>/triton-repos/<key>`` (world-readable)."""
    m = spec.measurement
    key = hashlib.sha256(f"{spec.model_sha256}|{spec.device}|{m.instances}|{m.threads}|{m.max_queue_delay_us}|"
                         f"{m.preferred_batch_size}".encode()).hexdigest()[:16]
    repo = get_settings().home / "triton-repos" / key
    build_repository(repo, model_path, spec.model_format, MODEL_NAME,
                     inputs=triton_inputs(spec) if spec.model_format == "torchscript" else None,
                     instances=m.instances, device=spec.device, threads=m.threads,
                     max_queue_delay_us=m.max_queue_delay_us, preferred_batch_size=m.preferred_batch_size)
    for root, _dirs, files in os.walk(repo):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(Path(root) / f, 0o644)
    return repo


@dataclass(frozen=True)
class TritonContainer:
    """What differs from farm's own serving container: image, command, repository mount, port inside."""

    image: str
    command: list[str]
    volumes: dict[str, dict[str, str]]
    port: int
    shm_size: str = "1g"


def container_args(repo: Path) -> TritonContainer:
    """Triton's container for the model repository ``repo`` (mounted read-only)."""
    return TritonContainer(image=get_settings().triton_image,
                           command=list(tritonserver_command(REPO_MOUNT, TRITON_GRPC_PORT)),
                           volumes={str(repo.resolve()): {"bind": REPO_MOUNT, "mode": "ro"}}, port=TRITON_GRPC_PORT)


@contextmanager
def attached(spec: JobSpec) -> Iterator[ServingTarget]:
    """Use the running Triton at ``FARM_TRITON_URL`` (model ``FARM_TRITON_MODEL``); nothing to stop after."""
    settings = get_settings()
    assert settings.triton_url
    server = attach(settings.triton_url, settings.triton_model, settings.server_ready_timeout_s)
    host, _, port = settings.triton_url.rpartition(":")
    yield ServingTarget(host=host, port=int(port), model_name=settings.triton_model,
                        notes=[f"attached to running {server.server_name} {server.server_version} at "
                               f"{settings.triton_url}; server resources not sampled"])
