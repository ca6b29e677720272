"""farm's contract: pydantic models shared by the CLI, scheduler and workers.

This package imports nothing else of farm's.
"""
from __future__ import annotations

from schemas.engines import ENGINES, MODEL_FORMATS
from schemas.hardware import CpuInfo, GpuInfo, WorkerHardware
from schemas.job import JobSpec, JobStatus
from schemas.request import (
    COORDINATE_KEYS,
    LOAD_KEYS,
    MEASUREMENT_KEYS,
    SERVING_KEYS,
    MeasurementSettings,
    ProfileRequest,
)
from schemas.result import JobResult, Placement
from schemas.specs import EdgeProfile, TensorSpec
from schemas.worker import WorkerStatus

__all__ = [
    "COORDINATE_KEYS",
    "ENGINES",
    "LOAD_KEYS",
    "MEASUREMENT_KEYS",
    "SERVING_KEYS",
    "MODEL_FORMATS",
    "CpuInfo",
    "EdgeProfile",
    "GpuInfo",
    "JobResult",
    "JobSpec",
    "JobStatus",
    "MeasurementSettings",
    "Placement",
    "ProfileRequest",
    "TensorSpec",
    "WorkerHardware",
    "WorkerStatus",
]
