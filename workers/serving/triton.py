"""The ``triton`` engine: the official Triton server in a container (Docker runner) serving a model repository
farm writes for the job, or a Triton server that is already running (``FARM_TRITON_URL``, any runner).
farm's load generator drives both with the same KServe v2 gRPC calls it uses for its own server."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from farm.errors import UnsupportedError
from farm.settings import get_settings
from schemas import JobSpec
from schemas.engines import SERVED_MODEL_NAME
from workers.engines.base import IOSpec
from workers.engines.triton import REPO_MOUNT, attach, build_repository, tritonserver_command
from workers.serving.base import Launch, ServingEngine, ServingTarget, Site

SHM_SIZE = "1g"  # Triton's shared memory inside the container


def triton_inputs(spec: JobSpec) -> list[IOSpec]:
    """The job's inputs with the batch dimension (-1) in front, as Triton's config wants them."""
    return [IOSpec(t.name, t.dtype, (-1, *t.shape)) for t in spec.inputs]


def repository_dir(spec: JobSpec) -> Path:
    """Where the job's Triton model repository goes: ``<home>/triton-repos/<key of what it holds>``."""
    m = spec.measurement
    key = hashlib.sha256(f"{spec.model_sha256}|{spec.device}|{m.instances}|{m.threads}|{m.max_queue_delay_us}|"
                         f"{m.preferred_batch_size}".encode()).hexdigest()[:16]
    return get_settings().home / "triton-repos" / key


def prepare_repository(spec: JobSpec, model_path: Path) -> Path:
    """Write the job's Triton model repository (world-readable) at :func:`repository_dir`; returns it."""
    m = spec.measurement
    repo = repository_dir(spec)
    build_repository(repo, model_path, spec.model_format, SERVED_MODEL_NAME,
                     inputs=triton_inputs(spec) if spec.model_format == "torchscript" else None,
                     instances=m.instances, device=spec.device, threads=m.threads,
                     max_queue_delay_us=m.max_queue_delay_us, preferred_batch_size=m.preferred_batch_size)
    for root, _dirs, files in os.walk(repo):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(Path(root) / f, 0o644)
    return repo


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


class Triton(ServingEngine):
    """Triton: attached at ``FARM_TRITON_URL`` when set, else its image (``FARM_TRITON_IMAGE``) in a container
    with the job's model repository mounted read-only."""

    name = "triton"

    def attach(self, spec: JobSpec, model_path: Path) -> AbstractContextManager[ServingTarget] | None:
        return attached(spec) if get_settings().triton_url else None

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        if not site.container:
            raise UnsupportedError("the triton engine needs the Docker runner (farm worker --runner docker) "
                                   "or a running Triton server (FARM_TRITON_URL=host:port)")
        return Launch(argv=tritonserver_command(REPO_MOUNT, site.port), port=site.port, model=REPO_MOUNT,
                      image=get_settings().triton_image,
                      image_help="load it (docker load) or set FARM_TRITON_IMAGE / FARM_TRITON_URL",
                      mounts={str(repository_dir(spec).resolve()): REPO_MOUNT}, shm_size=SHM_SIZE,
                      prepare=lambda: prepare_repository(spec, model_path))
