"""Celery queue naming: which queue a job goes to and which queues a worker consumes.

``farm.cpu`` (CPU serving jobs) and ``farm.edge`` (edge runs) are consumed by every worker; each distinct
GPU product has its own ``farm.gpu.<slug>`` (slug from ``schemas.request.device_slug``, e.g.
``farm.gpu.a100-sxm4-40gb``).
"""
from __future__ import annotations

CPU_QUEUE = "farm.cpu"
EDGE_QUEUE = "farm.edge"
GPU_QUEUE_PREFIX = "farm.gpu."


def gpu_queue(slug: str) -> str:
    """The Celery queue of one GPU product slug, e.g. ``farm.gpu.a100-sxm4-40gb``."""
    return f"{GPU_QUEUE_PREFIX}{slug}"


def queue_for(device: str) -> str:
    """The Celery queue serving ``device`` (``cpu`` or ``gpu:<slug>``)."""
    if device == "cpu":
        return CPU_QUEUE
    kind, _, slug = device.partition(":")
    if kind != "gpu" or not slug:
        raise ValueError(f"device {device!r} has no queue; resolve 'gpu' to 'gpu:<product>' first")
    return gpu_queue(slug)
