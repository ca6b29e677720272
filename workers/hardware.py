"""What this worker node has: CPU, NVIDIA GPUs (through NVML), and the Celery queues it should consume.

Queue names come from ``schemas.queues``.
"""
from __future__ import annotations

import logging
import platform
import socket
from pathlib import Path

import psutil

from schemas import CpuInfo, GpuInfo, WorkerHardware
from schemas.queues import CPU_QUEUE, EDGE_QUEUE, gpu_queue
from schemas.request import device_slug

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but a stripped install should still start
    pynvml = None

log = logging.getLogger(__name__)


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU model name from /proc/cpuinfo (x86 ``model name``, ARM ``Model``/``CPU part``), else
    ``platform.processor()``, else ``unknown``."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for key in ("model name", "Model", "Hardware", "cpu model", "Processor"):
        for line in text.splitlines():
            k, sep, v = line.partition(":")
            if sep and k.strip() == key and v.strip():
                return v.strip()
    return platform.processor() or "unknown"


def detect_cpu() -> CpuInfo:
    """The host CPU: model name, logical/physical core counts, total memory (bytes), architecture."""
    return CpuInfo(
        model=_cpu_model(),
        logical_cores=psutil.cpu_count(logical=True) or 1,
        physical_cores=psutil.cpu_count(logical=False),
        memory_bytes=int(psutil.virtual_memory().total),
        arch=platform.machine(),
    )


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def detect_gpus() -> list[GpuInfo]:
    """Every NVIDIA GPU NVML reports, in NVML index order.

    Returns ``[]`` (never raises) when the NVML library is missing, the driver is not loaded, or NVML
    fails to initialise; a field NVML cannot report for one device (driver version, compute
    capability) is left ``None``; a device that cannot be queried at all is skipped with a warning.
    """
    try:
        return _detect_gpus()
    except Exception as exc:  # a worker must start even when NVML misbehaves in an unforeseen way
        log.warning("GPU detection failed (%s: %s); reporting no GPUs", type(exc).__name__, exc)
        return []


def _detect_gpus() -> list[GpuInfo]:
    if pynvml is None:
        log.warning("nvidia-ml-py is not installed; reporting no GPUs")
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if not isinstance(exc, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded)):
            log.warning("NVML failed to initialise (%s); reporting no GPUs", exc)
        return []
    except OSError as exc:  # a broken libnvidia-ml.so.1 that fails to load
        log.warning("NVML library could not be loaded (%s); reporting no GPUs", exc)
        return []
    gpus: list[GpuInfo] = []
    try:
        try:
            driver: str | None = _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            driver = None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            log.warning("NVML could not count devices (%s); reporting no GPUs", exc)
            return []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                name = _text(pynvml.nvmlDeviceGetName(handle))
                total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            except pynvml.NVMLError as exc:
                log.warning("skipping GPU %d: NVML could not query it (%s)", index, exc)
                continue
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                cc: str | None = f"{major}.{minor}"
            except pynvml.NVMLError:
                cc = None
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=uuid,
                    name=name,
                    slug=device_slug(name),
                    memory_total_bytes=total,
                    driver_version=driver,
                    cuda_compute_capability=cc,
                )
            )
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return gpus


def queues_for(cpu: CpuInfo, gpus: list[GpuInfo]) -> list[str]:
    """The Celery queues a worker with this hardware consumes: ``farm.cpu``, ``farm.edge`` and one
    ``farm.gpu.<slug>`` per distinct GPU product (in first-seen order)."""
    del cpu  # every worker with a CPU serves the CPU and edge queues; kept for future CPU classes
    queues = [CPU_QUEUE, EDGE_QUEUE]
    for gpu in gpus:
        q = gpu_queue(gpu.slug)
        if q not in queues:
            queues.append(q)
    return queues


def gpu_uuids_for(gpus: list[GpuInfo], device: str) -> list[str]:
    """The UUID of the GPU among ``gpus`` that serves a job on ``device``: the first whose slug matches
    ``gpu:<slug>`` (or starts with it), the first GPU for a bare ``gpu``; empty for ``cpu`` or no match."""
    if not device.startswith("gpu"):
        return []
    slug = device[4:] if device.startswith("gpu:") else ""
    for g in gpus:
        if not slug or g.slug == slug or g.slug.startswith(slug):
            return [g.uuid]
    return []


def detect_hardware(docker: bool) -> WorkerHardware:
    """This node's hardware JSON for registration; ``docker`` says whether a Docker daemon is usable."""
    cpu = detect_cpu()
    gpus = detect_gpus()
    return WorkerHardware(
        hostname=socket.gethostname(),
        cpu=cpu,
        gpus=gpus,
        docker=docker,
        queues=queues_for(cpu, gpus),
    )
