"""The Docker runner: serve each job's model from a hardened container, and run edge jobs in
containers limited like the edge box (``workers.runners.docker_edge``).

Serving: one container per job runs the launch its engine declares (``workers.serving``: farm's built-in
server in farm's image, or the engine's own image) with the model (or model repository) bind-mounted
read-only, on farm's internal network (``hardening.SERVING_NETWORK``: no egress, no traffic between its
containers); farm talks to its gRPC port 8001 at the container's address on that network, from the host.
Consecutive jobs with the same launch (image, command, mounts), model sha and
device reuse the running container (the server is stateless between jobs); a reused container is removed
after ``idle_timeout_s`` seconds without a job (a timer), at ``close()``, or when the next job needs other
settings. An LLM job with a cold prefix cache and a shared prefix gets a server of its own (a reused one may hold
the prefix from an earlier job: ``LlmSettings.fresh_server``).

Every container carries ``farm.owner=farm``, ``farm.worker_id`` and ``farm.job_id`` labels; the
constructor removes the worker's own leftovers from a previous crash (``cleanup_orphans``).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import socket
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from farm.errors import ContainerError, ServerError
from farm.hooks import announce
from farm.settings import get_settings
from schemas import GpuInfo, JobResult, JobSpec
from schemas.op_profile import OpProfile, missing
from workers.cores import cpu_list
from workers.hardware import gpu_uuids_for
from workers.images import DEFAULT_TAG, build_local_image, image_exists, requirement_closure
from workers.runners import hardening as hd
from workers.runners.base import Runner
from workers.runners.common import MODEL_PLACEHOLDER, server_memory
from workers.runners.docker_edge import run_edge
from workers.runners.docker_profile import profile_in_container
from workers.serving.base import Launch, ReadyCheck, ServingTarget, Site
from workers.serving.registry import serving_engine

SERVER_PORT = 8001
DEFAULT_IDLE_TIMEOUT_S = 120.0
#: a container: farm's own servers run under the image's ``python``, bind the container's interfaces on
#: SERVER_PORT (its own network namespace: loopback and the internal network), and see a model file under ``/model``
SITE = Site(container=True, python="python", host="0.0.0.0", port=SERVER_PORT, model_dir=hd.MODEL_DIR)


def sweep_dead_owners(docker_client: Any) -> list[str]:
    """Remove farm's containers on this host whose starting process is gone (a SIGKILLed embedded run);
    returns their ids. Containers of live processes, of other hosts and without owner labels stay."""
    found = docker_client.containers.list(all=True, ignore_removed=True, filters={"label": [
        f"{hd.OWNER_LABEL}={hd.OWNER}", f"{hd.OWNER_HOST_LABEL}={socket.gethostname()}"]})
    dead = [c for c in found if not hd.owner_alive(c.labels or {})]
    for c in dead:
        hd.remove(c, stop_timeout_s=1)
    return [c.id for c in dead]


@dataclass
class _Kept:
    """A serving container kept for reuse."""

    key: str
    container: Any
    target: ServingTarget
    last_used: float
    ready: ReadyCheck


class DockerRunner(Runner):
    """Runs serving engines and edge jobs in containers of ``image``.

    ``worker_id`` scopes labels and orphan cleanup; ``gpus`` are this node's GPUs (a ``gpu:<slug>`` job
    gets the first one whose slug matches, by UUID); ``ready_timeout_s`` defaults to the
    ``FARM_SERVER_READY_TIMEOUT_S`` setting; ``reuse`` keeps a serving container for the next job with
    identical settings for up to ``idle_timeout_s`` seconds; ``build_image`` builds the local runtime
    image (``workers.images``, a no-op when its content hash is unchanged) so containers run this
    checkout's code, and, at the first job of an engine whose backend needs a package of its own, its
    variant with the host's copy (``<image>-<extra>``, e.g. ``farm-runtime:local-torch``); an image given by
    name is used as it is for every launch in farm's image. ``server_command`` replaces the argv of a
    launch in farm's image (``{model}`` = the model's path inside the container; it must serve KServe v2
    gRPC on port 8001).
    """

    name = "docker"
    site = SITE

    def __init__(
        self,
        worker_id: str = "local",
        image: str | None = None,
        *,
        gpus: Sequence[GpuInfo] = (),
        ready_timeout_s: float | None = None,
        reuse: bool = True,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        pids_limit: int = hd.PIDS_LIMIT,
        build_image: bool = True,
        cleanup: bool = True,
        server_command: Sequence[str] | None = None,
        docker_client: Any | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.image = image or DEFAULT_TAG
        self._builds_images = build_image and self.image == DEFAULT_TAG
        self._variant_images: dict[str, str] = {}  # farm extra -> local image with its Python package
        self.gpus = list(gpus)
        if ready_timeout_s is None:
            ready_timeout_s = get_settings().server_ready_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.reuse = reuse
        self.idle_timeout_s = idle_timeout_s
        self.pids_limit = pids_limit
        self.server_command = list(server_command) if server_command is not None else None
        self.client = hd.client(docker_client)
        self._lock = threading.RLock()
        self._kept: _Kept | None = None
        self._timer: threading.Timer | None = None
        ref = weakref.ref(self)

        def close_if_alive() -> None:  # no kept container outlives us
            runner = ref()
            if runner is not None:
                runner.close()

        atexit.register(close_if_alive)
        self.orphans_removed: list[str] = (hd.cleanup_orphans(self.client, worker_id)
                                           + sweep_dead_owners(self.client)) if cleanup else []
        if build_image and self.image == DEFAULT_TAG:
            announce(f"image {self.image}: built if farm's code changed, else cached")
            build_local_image(self.image, client=self.client)  # cached: ~2 s unless the code changed
        elif not image_exists(self.image, client=self.client):
            raise ContainerError(
                f"image {self.image!r} is not on this Docker host; build it (python -m workers.images "
                f"--tag {self.image}, or docker build -f docker/Dockerfile) or load it with docker load")

    # -- serving ----------------------------------------------------------------------------------

    def _gpu_uuids(self, device: str) -> list[str]:
        """The UUID a job on ``device`` gets as its container's device request (this worker's or slot's GPU)."""
        uuids = gpu_uuids_for(self.gpus, device)
        if uuids or not device.startswith("gpu"):
            return uuids
        raise ContainerError(
            f"job wants device {device!r} but this worker has no such GPU "
            f"(has: {', '.join(g.slug for g in self.gpus) or 'none'}); it was routed to the wrong queue")

    @staticmethod
    def reuse_key(spec: JobSpec, launch: Launch, image: str, cpus: set[int] | None = None) -> str:
        """What must match for a job to reuse a serving container: its image, launch, model, device, cores
        (``cpus``) and memory limit; an LLM job with a cold prefix cache and a shared prefix matches none (its own
        id: the server is restarted for it, its cache empty)."""
        parts = [image, spec.model_sha256, spec.device, cpu_list(cpus or ()), str(launch.shm_size),
                 str(server_memory(spec)),
                 json.dumps([launch.argv, launch.mounts, launch.env], sort_keys=True)]
        if spec.measurement.llm is not None and spec.measurement.llm.fresh_server():
            parts.append(spec.job_id)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]

    def _require_image(self, launch: Launch) -> str:
        """The launch's own image; ContainerError unless it is on this Docker host (farm never pulls)."""
        assert launch.image is not None
        if not image_exists(launch.image, client=self.client):
            raise ContainerError(f"image {launch.image!r} is not on this Docker host and farm never pulls; "
                                 f"{launch.image_help}")
        return launch.image

    def image_for(self, spec: JobSpec) -> str:
        """The image farm's own servers and edge runs of ``spec`` run in: this runner's, or on farm's own
        local image its variant with the Python package the job's engine needs, built from the host's copy
        on first use (cached like the base image). ContainerError when the host has no such package."""
        package = serving_engine(spec.engine).package
        if package is None or package.extra is None or not self._builds_images:
            return self.image
        with self._lock:
            if package.extra not in self._variant_images:
                why = package.missing(spec.job_id, spec.engine)
                if why is not None:
                    raise ContainerError(why)
                tag = f"{self.image}-{package.extra}"
                announce(f"image {tag}: built if farm's code changed, else cached")
                dists = requirement_closure(package.distributions) if package.closure else package.distributions
                build_local_image(tag, client=self.client, extra_distributions=list(dists))
                self._variant_images[package.extra] = tag
            return self._variant_images[package.extra]

    def _command(self, launch: Launch) -> tuple[list[str], dict[str, Any]]:
        """The container's command and entrypoint arguments: the launch's, or this runner's ``server_command``
        for a launch in farm's image."""
        if launch.image is not None:
            return launch.argv, ({"entrypoint": launch.entrypoint} if launch.entrypoint is not None else {})
        if self.server_command:
            return [a.replace(MODEL_PLACEHOLDER, launch.model) for a in self.server_command], {}
        return launch.argv, dict(hd.NO_ENTRYPOINT)

    def _start_server(self, spec: JobSpec, launch: Launch, image: str, key: str,
                      cpus: set[int] | None) -> tuple[Any, ServingTarget]:
        uuids = self._gpu_uuids(spec.device)
        if launch.prepare is not None:
            launch.prepare()
        if launch.image is not None:
            self._require_image(launch)
        command, extra = self._command(launch)
        volumes: dict[str, dict[str, str]] = {}
        for host_path, inside in launch.mounts.items():
            volumes.update(hd.mount(Path(host_path), inside))
        if launch.shm_size:
            extra["shm_size"] = launch.shm_size
        if launch.env:
            extra["environment"] = dict(launch.env)
        if launch.cwd:
            extra["working_dir"] = launch.cwd
        kwargs: dict[str, Any] = dict(
            image=image,
            command=command,
            name=hd.container_name("serve", self.worker_id, spec.job_id),
            labels=hd.labels(self.worker_id, spec.job_id, "serve", **{hd.KEY_LABEL: key}),
            volumes=volumes,
            network=hd.serving_network(self.client),
            **hd.hardening(self.pids_limit),
            **extra,
        )
        if cpus:
            kwargs["cpuset_cpus"] = cpu_list(cpus)
        kwargs["mem_limit"] = kwargs["memswap_limit"] = server_memory(spec)  # no swap beyond it
        if uuids:
            kwargs["device_requests"] = [docker.types.DeviceRequest(device_ids=uuids, capabilities=[["gpu"]])]
        try:
            container = self.client.containers.create(**kwargs)
        except Exception as exc:
            raise ContainerError(
                f"could not create the serving container for job {spec.job_id} from {image}: {exc}; "
                "check dockerd's log and the image") from exc
        try:
            try:
                container.start()
            except Exception as exc:
                raise ContainerError(
                    f"could not start the serving container for job {spec.job_id} from {image}: {exc}; "
                    "check dockerd's log, and for GPU jobs the NVIDIA container toolkit") from exc
            target = ServingTarget(host=hd.container_address(container), port=launch.port, model_name=launch.model_name,
                                   container_id=container.id, cgroup_path=hd.cgroup_path(container.id),
                                   gpu_uuids=uuids)
            self._wait_ready(container, target, self.ready_timeout_s, launch.ready)
        except BaseException:
            hd.remove(container, stop_timeout_s=1)
            raise
        return container, target

    @staticmethod
    def _wait_ready(container: Any, target: ServingTarget, timeout_s: float, ready: ReadyCheck) -> None:
        def alive() -> bool:
            try:
                container.reload()
            except Exception:
                return False
            return container.status in ("created", "running")

        try:
            ready(target.url, target.model_name, timeout_s, alive=alive)
        except ServerError as exc:
            container.reload()
            what = hd.exit_state(container) or f"was not ready within {timeout_s:g} s"
            image = container.attrs.get("Config", {}).get("Image", "?")
            raise ContainerError(
                f"serving container {container.short_id} ({image}) {what}; {exc}\n"
                f"last log lines:\n{hd.log_tail(container)}") from exc

    def _take_kept(self, key: str) -> _Kept | None:
        """The kept container if it matches ``key`` and still answers; drops a stale one."""
        with self._lock:
            kept, self._kept = self._kept, None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if kept is None:
            return None
        expired = time.monotonic() - kept.last_used > self.idle_timeout_s
        if kept.key != key or expired:
            hd.remove(kept.container)
            return None
        try:
            self._wait_ready(kept.container, kept.target, min(5.0, self.ready_timeout_s), kept.ready)
        except ContainerError:
            hd.remove(kept.container, stop_timeout_s=1)
            return None
        return kept

    def _keep(self, kept: _Kept) -> None:
        with self._lock:
            old, self._kept = self._kept, kept
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(self.idle_timeout_s, self._expire, args=(kept,))
            self._timer.daemon = True
            self._timer.start()
        if old is not None and old is not kept:
            hd.remove(old.container)

    def _expire(self, kept: _Kept) -> None:
        with self._lock:
            if self._kept is not kept:
                return
            self._kept = None
            self._timer = None
        hd.remove(kept.container)

    @contextmanager
    def place(self, spec: JobSpec, launch: Launch, cpus: set[int] | None) -> Iterator[ServingTarget]:
        """Run ``launch`` for ``spec`` in a container (new or reused) limited to cores ``cpus``
        (``cpuset_cpus``); yields the ready target (its address on the internal network). The container is
        removed on exit unless kept for reuse; after an error in the body it is always removed."""
        if spec.is_edge:
            raise ContainerError(f"job {spec.job_id} is an edge job; call run_edge(), not serve()")
        image = launch.image or self.image_for(spec)
        key = self.reuse_key(spec, launch, image, cpus)
        kept = self._take_kept(key) if self.reuse else None
        if kept is not None:
            container, target = kept.container, kept.target
            target.reused = True
            target.notes = ["served by a reused container (model already loaded); memory peak reset for this job"]
        else:
            container, target = self._start_server(spec, launch, image, key, cpus)
        ok = False
        try:
            yield target
            ok = True
        finally:
            if ok and self.reuse:
                self._keep(_Kept(key, container, target, time.monotonic(), launch.ready))
            else:
                hd.remove(container)

    # -- edge -------------------------------------------------------------------------------------

    def run_edge(self, spec: JobSpec, model_path: Path, **kwargs: Any) -> JobResult:
        """Run ``spec`` as an edge job; see ``workers.runners.docker_edge.run_edge`` for ``kwargs``
        (``image``, ``command``, ``edge_command``)."""
        return run_edge(self.client, spec, model_path, image=kwargs.pop("image", None) or self.image_for(spec),
                        worker_id=self.worker_id, pids_limit=self.pids_limit, **kwargs)

    def profile_pass(self, spec: JobSpec, model_path: Path, cpus: set[int] | None) -> tuple[OpProfile, bytes | None]:
        """The pass in a one-shot container of the job's image, with its cpuset and GPU
        (``workers.runners.docker_profile``): the profile is taken under the limits the job was served with."""
        try:
            image = self.image_for(spec)
            uuids = self._gpu_uuids(spec.device)
        except ContainerError as exc:
            return missing(spec.engine, "failed", f"the profiling pass did not run: {exc}"[:500]), None
        return profile_in_container(self.client, spec, model_path, cpus, image=image, worker_id=self.worker_id,
                                    pids_limit=self.pids_limit, gpu_uuids=uuids)

    # -- lifecycle --------------------------------------------------------------------------------

    def cleanup_orphans(self) -> list[str]:
        """Remove this worker's leftover containers (any state); returns their ids. Called by the
        constructor; call it again only when no job of this runner is running."""
        with self._lock:
            self._kept = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        return hd.cleanup_orphans(self.client, self.worker_id)

    def cleanup_dead(self, worker_ids: list[str]) -> list[str]:
        """Remove the containers of workers on this host that died (kill -9, crash) before cleaning up."""
        removed: list[str] = []
        for wid in worker_ids:
            if wid != self.worker_id:
                removed += hd.cleanup_orphans(self.client, wid)
        return removed

    def close(self) -> None:
        """Remove the container kept for reuse (if any)."""
        with self._lock:
            kept, self._kept = self._kept, None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if kept is not None:
            hd.remove(kept.container)

    def __enter__(self) -> DockerRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
