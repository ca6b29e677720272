"""The engine backend interface: one loaded model session that turns numpy inputs into numpy outputs.

Datatypes are KServe v2 names (``FP32``, ``INT64``, ...); shapes use -1 for a dynamic dimension.
"""
from __future__ import annotations

import importlib.util
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from farm.errors import ServerError
from schemas.dtypes import V2_NUMPY_NAME

# int64 parameters of every response of farm's built-in server (read by the load generator), ns
QUEUE_PARAM = "farm_queue_ns"  # waiting for a free model instance
COMPUTE_PARAM = "farm_compute_ns"  # the engine call

# KServe v2 datatype -> numpy dtype (BYTES/BF16 have no fixed-width numpy twin and are not served).
V2_TO_NP: dict[str, np.dtype] = {name: np.dtype(np_name) for name, np_name in V2_NUMPY_NAME.items()}
NP_TO_V2: dict[np.dtype, str] = {v: k for k, v in V2_TO_NP.items()}


def np_to_v2(dtype: np.dtype) -> str:
    """The KServe v2 datatype of a numpy dtype; ServerError for one farm cannot send."""
    try:
        return NP_TO_V2[np.dtype(dtype)]
    except KeyError:
        raise ServerError(
            f"numpy dtype {np.dtype(dtype)} has no KServe v2 fixed-width datatype; "
            "make the model output a numeric or bool tensor"
        ) from None


@dataclass(frozen=True)
class Package:
    """The Python package an engine's backend imports, as farm's runtime image takes it from the host's
    Python (``workers.images``): ``module`` (checked on the host), its ``distributions``, and farm's pip
    ``extra`` that installs it (None: part of farm's base install and base image); ``closure``: the image
    also takes every distribution those require, as installed on the host (``workers.images.requirement_closure``)
    instead of a list kept by hand; ``install``: what to do when the host has none (None: install the extra,
    or use the onnxruntime engine)."""

    module: str
    distributions: tuple[str, ...]
    extra: str | None = None
    closure: bool = False
    install: str | None = None

    def missing(self, job_id: str, engine: str) -> str | None:
        """Why farm's image cannot carry this package for ``job_id`` (the host has none), else None."""
        if importlib.util.find_spec(self.module) is not None:
            return None
        todo = self.install or f"pip install 'farm[{self.extra}]' here, or run it with the onnxruntime engine"
        return (f"job {job_id} runs on the {engine} engine, and farm's image takes {self.module} from this "
                f"worker's Python, which has none; {todo}")


@dataclass(frozen=True)
class IOSpec:
    """One model input or output: name, KServe v2 datatype, shape (-1 = dynamic).

    ``datatype`` is ``""`` and ``shape`` is None when the engine cannot tell (TorchScript without
    declared inputs); the server then accepts any numeric dtype / any shape for it.
    """

    name: str
    datatype: str
    shape: tuple[int, ...] | None

    def metadata_shape(self) -> list[int]:
        """The shape as KServe metadata reports it (unknown rank -> ``[-1]``)."""
        return list(self.shape) if self.shape is not None else [-1]


class InputError(ValueError):
    """The request's tensors do not fit the model (name, dtype or shape); maps to INVALID_ARGUMENT."""


class Backend(ABC):
    """One model session of one engine. Not thread-safe: the server gives each instance its own.

    ``load`` fills ``_inputs`` and ``_outputs`` with the model's tensors, in the order it declares them."""

    engine: str = "base"
    platform: str = "unknown"  # Triton-style platform name reported in ModelMetadata
    package: Package | None = None  # the Python package it imports (None: farm's own dependencies only)

    def __init__(self) -> None:
        self._inputs: list[IOSpec] = []
        self._outputs: list[IOSpec] = []
        # set before ``load`` by an op-profiling pass (``workers.profiling``): the engine's own profiler on, its
        # trace written under this path prefix (ONNX Runtime) or kept per request (OpenVINO PERF_COUNT); never
        # set for a served or edge-measured session
        self.profile_prefix: str | None = None

    def declare_inputs(self, specs: list[IOSpec]) -> None:  # noqa: B027 (optional hook: a no-op by default)
        """Declare the inputs' datatypes and shapes for engines whose files carry none (TorchScript);
        call before ``load``. Engines that read them from the model ignore this."""

    @abstractmethod
    def load(self, model_path: Path, device: str, threads: int) -> None:
        """Load ``model_path`` on ``device`` ("cpu" or "gpu:<slug>") with ``threads`` intra-op threads
        (0: one per core of this process's affinity, ``lease_threads``) and one inter-op thread. Raises
        ServerError (or ModelError) saying what to fix."""

    def inputs(self) -> list[IOSpec]:
        """The model's inputs, in the order the model declares them."""
        return list(self._inputs)

    def outputs(self) -> list[IOSpec]:
        """The model's outputs, in the order the model declares them."""
        return list(self._outputs)

    @abstractmethod
    def infer(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run one inference. ``outputs`` restricts which outputs are computed (None = all).
        Raises InputError when the inputs do not fit the model."""

    def close(self) -> None:  # noqa: B027 (optional hook: a no-op by default)
        """Release the session (and its device memory)."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lease_threads(threads: int) -> int:
    """Intra-op threads of one session: ``threads`` when set (> 0: the job's knob, kept as asked), else the
    number of cores this process may run on (its CPU affinity: the job's core lease, as the runner placed the
    server). An engine left to its own default sizes its pool by the host's cores and may pin threads to cores
    outside the lease (ONNX Runtime does), so farm never leaves it to the default."""
    return threads if threads > 0 else len(os.sched_getaffinity(0))


def parse_device(device: str) -> tuple[str, str | None]:
    """Split ``cpu`` / ``gpu`` / ``gpu:<slug>`` into (kind, slug)."""
    d = device.strip().lower()
    if d == "cpu":
        return "cpu", None
    if d == "gpu" or d.startswith("gpu:"):
        return "gpu", (d[4:] or None)
    raise ServerError(f"device {device!r} is unknown; use cpu, gpu or gpu:<product>")
