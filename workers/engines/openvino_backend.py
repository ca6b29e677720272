"""OpenVINO backend: one compiled model (CPU plugin) and infer request per instance; loads ONNX files
(its card, ``schemas.engines.CARDS``, says which formats). Needs the ``openvino`` package (``pip install
'farm[openvino]'``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import ModelError, ServerError
from schemas.engines import CARDS
from workers.engines.base import V2_TO_NP, Backend, InputError, IOSpec, Package, lease_threads, parse_device
from workers.signal_stack import keep_alternate_stack

#: OpenVINO element type name -> KServe v2 datatype
OV_TO_V2: dict[str, str] = {
    "f32": "FP32", "f16": "FP16", "f64": "FP64", "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
    "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64", "boolean": "BOOL", "bf16": "BF16",
}


def _spec(port: Any) -> IOSpec:
    etype = port.get_element_type().get_type_name()
    shape = port.get_partial_shape()
    dims = None if shape.rank.is_dynamic else tuple(-1 if d.is_dynamic else d.get_length() for d in shape)
    return IOSpec(port.get_any_name(), OV_TO_V2.get(etype, etype.upper()), dims)


class OpenVinoBackend(Backend):
    """An OpenVINO compiled model on the CPU plugin; ``threads`` sets INFERENCE_NUM_THREADS (0: the process's
    cores, ``lease_threads``), one stream per instance (latency hint), no CPU pinning of its own."""

    engine = "openvino"
    platform = "openvino"
    package = Package("openvino", ("openvino", "openvino-telemetry"), extra=CARDS[engine].extra)

    def __init__(self) -> None:
        super().__init__()
        self._request: Any = None
        self._ports: dict[str, Any] = {}

    def load(self, model_path: Path, device: str, threads: int) -> None:
        try:
            import openvino as ov  # noqa: PLC0415 - optional heavy engine (farm[openvino])
        except ImportError as exc:
            raise ServerError("engine openvino needs the openvino package: pip install 'farm[openvino]'") from exc
        if parse_device(device)[0] != "cpu":
            raise ServerError(f"engine openvino runs on cpu in farm, not {device!r}; pick onnxruntime for GPUs")
        path = Path(model_path)
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist; check the path the job was given")
        # f32: the model's own precision, as ONNX Runtime computes it. OpenVINO's CPU plugin otherwise drops to
        # bf16 on CPUs with bf16 instructions (avx512_bf16, AMX): outputs 3-4 % off ONNX Runtime's on an AMD
        # EPYC here, and a speed that depends on which host the job landed on
        # threads from the lease; ENABLE_CPU_PINNING off: its threads inherit the process's affinity (the lease)
        # and the kernel schedules them there, instead of the plugin pinning them itself by its own CPU map
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32",
                                  "INFERENCE_NUM_THREADS": lease_threads(threads), "ENABLE_CPU_PINNING": False}
        if self.profile_prefix:  # an op-profiling pass (workers.profiling): per-layer counters on each request
            config["PERF_COUNT"] = True
        try:
            core = ov.Core()
            compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        except Exception as exc:  # OpenVINO raises RuntimeError/GeneralFailure with multi-line texts
            raise ModelError(f"OpenVINO cannot load {path.name}: {str(exc).strip().splitlines()[0]}; "
                             "check the file is a valid ONNX model (onnx.checker.check_model)") from exc
        finally:
            # the CPU plugin just gave this thread an alternate signal stack that it unmaps when freed, wherever
            # that happens: the thread gets farm's own back, or its next signal would be a SIGSEGV (issue 36)
            keep_alternate_stack()
        self._request = compiled.create_infer_request()
        self._inputs = [_spec(p) for p in compiled.inputs]
        self._outputs = [_spec(p) for p in compiled.outputs]
        self._ports = {p.get_any_name(): p for p in compiled.outputs}

    def infer(self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        req = self._request
        if req is None:
            raise ServerError("the OpenVINO backend is not loaded; call load() first")
        names = outputs or list(self._ports)
        unknown = [n for n in names if n not in self._ports]
        if unknown:
            raise InputError(f"unknown output(s) {', '.join(unknown)}; the model's outputs are "
                             f"{', '.join(self._ports)}")
        feed = {}
        for spec in self._inputs:
            arr = inputs.get(spec.name)
            if arr is None:
                raise InputError(f"missing input {spec.name!r}; the model needs "
                                 f"{', '.join(s.name for s in self._inputs)}")
            want = V2_TO_NP.get(spec.datatype)
            if want is not None and arr.dtype != want:
                raise InputError(f"input {spec.name!r} is {arr.dtype}, the model expects {spec.datatype}")
            feed[spec.name] = arr
        try:
            results = req.infer(feed)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InputError(f"OpenVINO rejected the inputs: {str(exc).strip().splitlines()[0]}") from exc
        return {n: np.array(results[self._ports[n]], copy=True) for n in names}

    @property
    def request(self) -> Any:
        """The infer request (None before ``load``): an op-profiling pass reads its profiling info."""
        return self._request

    def close(self) -> None:
        self._request = None
        self._ports = {}
