"""What a worker node advertises about its hardware."""
from __future__ import annotations

from typing import TypedDict

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


class SlotJson(TypedDict):
    """A worker's slot as its row's hardware JSON keeps it (``workers.slots.Slot.describe``)."""

    index: int
    gpu_uuid: str | None
    gpu_index: int | None
    gpu_name: str | None
    product: str | None
    queues: list[str]


class HardwareJson(TypedDict, total=False):
    """A worker row's hardware JSON (``workers.node.Node.registered_hardware``): ``WorkerHardware`` dumped (its
    ``cpu`` and ``gpus`` as their models' JSON), the slot it runs (absent: one slot with all of it) and the names
    (never the values) of the endpoint credentials its operator set up."""

    hostname: str
    cpu: dict[str, object]
    gpus: list[dict[str, object]]
    docker: bool
    queues: list[str]
    slot: SlotJson
    credentials: list[str]
