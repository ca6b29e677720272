"""ONNX Runtime backend: one InferenceSession per instance, CPU or CUDA execution provider."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from farm.errors import ModelError, ServerError
from schemas.dtypes import ORT_TO_V2
from workers.engines.base import Backend, InputError, IOSpec, Package, lease_threads, parse_device


def _spec(arg: object) -> IOSpec:
    dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)  # type: ignore[attr-defined]
    ort_type: str = arg.type  # type: ignore[attr-defined]
    return IOSpec(arg.name, ORT_TO_V2.get(ort_type, ort_type), dims)  # type: ignore[attr-defined]


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime session; intra-op threads from ``threads`` (0: the process's cores, ``lease_threads``),
    one inter-op thread, sequential execution."""

    engine = "onnxruntime"
    platform = "onnxruntime_onnx"
    package = Package("onnxruntime", ("onnxruntime",))

    def __init__(self) -> None:
        super().__init__()
        self._sess: object | None = None
        self._output_names: list[str] = []

    def load(self, model_path: Path, device: str, threads: int) -> None:
        import onnxruntime as ort  # noqa: PLC0415 - heavy engine (~20 MiB), loaded only when this engine serves

        kind, slug = parse_device(device)
        providers: list[object] = ["CPUExecutionProvider"]
        if kind == "gpu":
            available = ort.get_available_providers()
            if "CUDAExecutionProvider" not in available:
                raise ServerError(
                    f"device {device!r} needs ONNX Runtime's CUDAExecutionProvider, but this onnxruntime "
                    f"offers only {', '.join(available)}; install onnxruntime-gpu or run on cpu"
                )
            providers = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
        opts = ort.SessionOptions()
        # an explicit count: left at 0, ORT sizes its pool by the host's physical cores and pins each pool thread
        # to one of them, also to cores outside this process's affinity (issue 31: a thread of a 1-core lease
        # ran on the other core). With a count set, ORT pins nothing: its threads inherit the lease
        opts.intra_op_num_threads = lease_threads(threads)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.profile_prefix:  # an op-profiling pass (workers.profiling): Chrome trace + the optimized graph
            opts.enable_profiling = True
            opts.profile_file_prefix = self.profile_prefix
            opts.optimized_model_filepath = f"{self.profile_prefix}.optimized.onnx"
        path = Path(model_path)
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist; check the path the job was given")
        try:
            sess = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        except Exception as exc:  # ORT raises its own pybind types (Fail, InvalidGraph, NoSuchFile, ...)
            raise ModelError(
                f"ONNX Runtime cannot load {path.name}: {str(exc).strip().splitlines()[0]}; "
                "check the file is a valid ONNX model (onnx.checker.check_model)"
            ) from exc
        if kind == "gpu" and "CUDAExecutionProvider" not in sess.get_providers():
            raise ServerError(
                f"ONNX Runtime could not start CUDA for {device!r} (providers in use: "
                f"{', '.join(sess.get_providers())}); check the CUDA/cuDNN libraries and the GPU driver"
            )
        self._sess = sess
        self._inputs = [_spec(a) for a in sess.get_inputs()]
        self._outputs = [_spec(a) for a in sess.get_outputs()]
        self._output_names = [o.name for o in self._outputs]

    def infer(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        sess = self._sess
        if sess is None:
            raise ServerError("the ONNX Runtime backend is not loaded; call load() first")
        names = outputs or self._output_names
        try:
            results = sess.run(names, inputs)  # type: ignore[attr-defined]
        except Exception as exc:
            kind = type(exc).__name__
            msg = str(exc).strip()
            if kind in ("InvalidArgument", "InvalidProtobuf") or "Invalid" in msg[:120]:
                raise InputError(f"ONNX Runtime rejected the inputs: {msg}") from exc
            raise
        return dict(zip(names, results, strict=True))

    def end_profiling(self) -> str:
        """Stop the profiler of a session loaded with ``profile_prefix`` and return its trace file's path."""
        if self._sess is None:
            raise ServerError("the ONNX Runtime backend is not loaded; call load() first")
        return str(self._sess.end_profiling())  # type: ignore[attr-defined]

    def close(self) -> None:
        self._sess = None
