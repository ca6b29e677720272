"""What a worker node advertises about its hardware."""
from __future__ import annotations

from pydantic import BaseModel, Field


class CpuInfo(BaseModel):
    """Host CPU: model name, logical/physical cores, and memory in bytes."""

    model: str = "unknown"
    logical_cores: int = Field(ge=1)
    physical_cores: int | None = None
    memory_bytes: int = Field(ge=0)
    arch: str = ""


class GpuInfo(BaseModel):
    """One GPU as NVML reports it; memory in bytes."""

    index: int
    uuid: str
    name: str
    slug: str
    memory_total_bytes: int
    driver_version: str | None = None
    cuda_compute_capability: str | None = None


class WorkerHardware(BaseModel):
    """The hardware JSON a worker registers with; ``queues`` are the Celery queues it consumes."""

    hostname: str
    cpu: CpuInfo
    gpus: list[GpuInfo] = Field(default_factory=list)
    docker: bool = False
    queues: list[str] = Field(default_factory=list)
