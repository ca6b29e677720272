"""Container hardening, labels and small Docker helpers shared by the serving and edge runners.

Every farm container: all capabilities dropped, ``no-new-privileges``, read-only root filesystem with a
64 MiB tmpfs on ``/tmp``, a pids limit, user ``nobody`` (65534:65534), the model bind-mounted read-only
under ``/model``, no variable of the worker's environment. Edge containers have no network at all; serving
containers sit on farm's internal network (``SERVING_NETWORK``: no route out of it, containers on it cannot
reach each other), where only the worker's host reaches their port, at the container's address.
"""
from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from typing import Any, TypedDict

import psutil

import docker
from farm.errors import ContainerError
from workers.samplers.cgroup import find_container_cgroup

OWNER_LABEL = "farm.owner"
OWNER = "farm"
JOB_LABEL = "farm.job_id"
WORKER_LABEL = "farm.worker_id"
ROLE_LABEL = "farm.role"  # serve | edge
KEY_LABEL = "farm.reuse_key"
USER = "65534:65534"
PIDS_LIMIT = 256
TMPFS = {"/tmp": "size=64m"}
MODEL_DIR = "/model"
#: the Docker network of serving containers: internal (no egress, no NAT), no traffic between its containers
SERVING_NETWORK = "farm-serving"
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}


#: ``containers.create`` argument for farm's own commands (``python -m workers...``): an image built from
#: docker/Dockerfile has ``ENTRYPOINT ["farm"]``, which would otherwise prefix them; [""] resets it (Docker API)
class EntrypointReset(TypedDict):
    entrypoint: list[str]


NO_ENTRYPOINT = EntrypointReset(entrypoint=[""])


class Hardening(TypedDict):
    """``containers.create`` arguments that lock a container down: no capabilities, no privilege gain, a read-only
    root with tmpfs mounts (path -> options), a pid cap and an unprivileged user."""

    cap_drop: list[str]
    security_opt: list[str]
    read_only: bool
    tmpfs: dict[str, str]
    pids_limit: int
    user: str


def hardening(pids_limit: int = PIDS_LIMIT) -> Hardening:
    """Keyword arguments for ``containers.create`` that lock a container down (network not included)."""
    return Hardening(cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True, tmpfs=dict(TMPFS),
                     pids_limit=pids_limit, user=USER)


#: labels naming the process that started a container (``farm submit`` in an embedded run, or a worker), its
#: start time (a reused pid is told apart) and host: a container whose process is gone (SIGKILL leaves no time to
#: remove it) is removed by the next farm process that runs jobs on the host (``docker.sweep_dead_owners``)
OWNER_PID_LABEL, OWNER_STARTED_LABEL, OWNER_HOST_LABEL = "farm.owner_pid", "farm.owner_started", "farm.owner_host"


def owner_labels() -> dict[str, str]:
    """This process's owner labels (``OWNER_PID_LABEL`` and the rest)."""
    me = psutil.Process()
    return {OWNER_PID_LABEL: str(me.pid), OWNER_STARTED_LABEL: f"{me.create_time():.2f}",
            OWNER_HOST_LABEL: socket.gethostname()}


def owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process that started a container (its owner labels) still runs."""
    try:
        return f"{psutil.Process(int(labels[OWNER_PID_LABEL])).create_time():.2f}" == labels.get(OWNER_STARTED_LABEL)
    except (KeyError, ValueError, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:  # someone else's live process: not ours to judge
        return True


def labels(worker_id: str, job_id: str, role: str, **extra: str) -> dict[str, str]:
    """The labels that mark a container as farm's, owned by ``worker_id`` and this process, for ``job_id``."""
    out = {OWNER_LABEL: OWNER, WORKER_LABEL: worker_id, JOB_LABEL: job_id, ROLE_LABEL: role, **owner_labels()}
    out.update(extra)
    return out


def container_name(role: str, worker_id: str, job_id: str) -> str:
    """A readable, unique, Docker-valid container name: ``farm-<role>-<worker>-<job>-<random>``."""
    def clean(s: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", s)[:24].strip("-.") or "x"

    return f"farm-{role}-{clean(worker_id)}-{clean(job_id)}-{os.urandom(3).hex()}"


def mount(path: Path, inside: str) -> dict[str, dict[str, str]]:
    """Bind-mount the file or directory ``path`` read-only at ``inside``; ContainerError when it is missing
    or the containers' user cannot read it."""
    p = Path(path).resolve()
    what = "model repository" if p.is_dir() else "model file"
    if not p.exists():
        raise ContainerError(f"{what} {p} does not exist; fetch the artifact before starting the job")
    if not os.stat(p).st_mode & 0o004:
        raise ContainerError(
            f"{what} {p} is not readable by others (mode {os.stat(p).st_mode & 0o777:o}); containers run "
            f"as user nobody (65534): chmod o+r it, or keep the artifact cache at umask 022")
    return {str(p): {"bind": inside, "mode": "ro"}}


def model_mount(model_path: Path) -> tuple[dict[str, dict[str, str]], str]:
    """Bind-mount one model file read-only at ``/model/<name>``; returns (volumes, path in container)."""
    p = Path(model_path).resolve()
    if not p.is_file():
        raise ContainerError(f"model file {p} does not exist; fetch the artifact before starting the job")
    inside = f"{MODEL_DIR}/{p.name}"
    return mount(p, inside), inside


def client(docker_client: Any | None = None) -> Any:
    """A Docker client that answered a ping; ContainerError saying how to start Docker otherwise."""
    if docker_client is not None:
        return docker_client
    try:
        c = docker.from_env(timeout=120)
        c.ping()
        return c
    except Exception as exc:
        raise ContainerError(
            f"no Docker daemon answers ({type(exc).__name__}: {exc}); start dockerd, set DOCKER_HOST, "
            "or use FARM_RUNNER=process") from exc


def log_tail(container: Any, lines: int = 20) -> str:
    """The container's last ``lines`` log lines (stdout+stderr), or a note why there are none."""
    try:
        text = container.logs(stdout=True, stderr=True, tail=lines).decode("utf-8", "replace").strip()
    except Exception as exc:
        return f"(logs unavailable: {type(exc).__name__})"
    return text or "(no output)"


def remove(container: Any, stop_timeout_s: float = 5.0) -> None:
    """Stop (SIGTERM, then SIGKILL after ``stop_timeout_s``) and remove a container; never raises."""
    try:
        container.reload()
        if container.status == "running":
            container.stop(timeout=int(max(1, stop_timeout_s)))
    except docker.errors.NotFound:
        return
    except Exception:
        pass
    for _ in range(3):
        try:
            container.remove(force=True, v=True)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as exc:
            if "already in progress" in str(exc):
                return
            time.sleep(0.2)
        except Exception:
            time.sleep(0.2)


def cleanup_orphans(docker_client: Any, worker_id: str) -> list[str]:
    """Remove every container labelled as ``worker_id``'s (left over by a crashed worker); returns
    their ids. Only this worker's containers are touched, never another worker's or anyone else's."""
    found = docker_client.containers.list(  # ignore_removed: one may go while we list (an idle timer)
        all=True, ignore_removed=True, filters={"label": [f"{OWNER_LABEL}={OWNER}", f"{WORKER_LABEL}={worker_id}"]})
    for c in found:
        remove(c, stop_timeout_s=1)
    return [c.id for c in found]


def cgroup_path(container_id: str) -> Path | None:
    """The container's cgroup directory: the v2 unified directory, or on v1 the ``memory`` controller's
    directory (``cpuacct``/``blkio`` sit beside it under the same relative path). None when not found."""
    try:
        return find_container_cgroup(container_id)
    except OSError:
        return None


def serving_network(docker_client: Any, name: str = SERVING_NETWORK) -> str:
    """The internal network serving containers join (created on first use: ``internal``, no traffic
    between containers); its name. ContainerError when it exists but is not internal (an operator's
    network of that name must not give jobs a way out)."""
    found = docker_client.networks.list(names=[name])
    if not found:
        try:
            docker_client.networks.create(name, driver="bridge", internal=True, check_duplicate=True,
                                          options=dict(NETWORK_OPTIONS), labels={OWNER_LABEL: OWNER})
        except docker.errors.APIError as exc:
            if "already exists" not in str(exc):
                raise ContainerError(f"could not create Docker network {name}: {exc}") from exc
        found = docker_client.networks.list(names=[name])
    net = next((n for n in found if n.name == name), None)
    if net is None or not net.attrs.get("Internal"):
        raise ContainerError(f"Docker network {name} exists but is not internal, so jobs on it could reach out; "
                             f"remove it (docker network rm {name}) and farm creates it internal")
    return name


def exit_state(container: Any) -> str | None:
    """How a reloaded container that no longer runs ended ("exited with code N", "was killed: out of memory"),
    None while it is created or running."""
    if container.status in ("created", "running"):
        return None
    state = container.attrs.get("State") or {}
    if state.get("OOMKilled"):
        return "was killed: out of memory"
    return f"exited with code {state.get('ExitCode')}"


def container_address(container: Any, network: str = SERVING_NETWORK, timeout_s: float = 5.0) -> str:
    """The container's IP address on ``network`` (polls until set); ContainerError when it exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        container.reload()
        ip = ((container.attrs.get("NetworkSettings", {}).get("Networks") or {}).get(network) or {}).get("IPAddress")
        if ip:
            return str(ip)
        if container.status not in ("created", "running") or time.monotonic() > deadline:
            how = exit_state(container) or f"status {container.status}"
            raise ContainerError(
                f"container {container.short_id} has no address on network {network} ({how}); "
                f"last log lines:\n{log_tail(container)}")
        time.sleep(0.05)
