"""TorchScript backend: ``torch.jit.load`` per instance, CPU or CUDA. torch is optional (farm[torch]).

TorchScript files carry no tensor metadata: input names come from ``forward``'s signature, datatypes
and shapes are unknown (accepted as sent) unless declared with ``declare_inputs``; outputs are named
``output__0``, ``output__1``, ... (Triton's libtorch convention) or by dict key, and are discovered by a
warm-up inference when the declared inputs give every dimension.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import ModelError, ServerError
from schemas.engines import CARDS
from workers.engines.base import (
    V2_TO_NP,
    Backend,
    InputError,
    IOSpec,
    Package,
    lease_threads,
    np_to_v2,
    parse_device,
)


def _torch() -> Any:
    try:
        import torch  # noqa: PLC0415 - optional heavy engine (farm[torch])
    except ImportError as exc:
        raise ServerError(
            "the torchscript engine needs PyTorch, which is not installed here; install farm[torch] on "
            "this worker (in a container: an image with torch, python -m workers.images --extra torch), "
            "or use the onnxruntime engine"
        ) from exc
    return torch


class TorchScriptBackend(Backend):
    """A TorchScript module in eval/inference mode; ``threads`` sets torch's intra-op threads (0: the process's
    cores, ``lease_threads``), one inter-op thread."""

    engine = "torchscript"
    platform = "pytorch_libtorch"
    package = Package("torch", ("torch",), extra=CARDS[engine].extra)

    def __init__(self) -> None:
        super().__init__()
        self._module: Any = None
        self._torch: Any = None
        self._device: Any = None
        self._declared: dict[str, IOSpec] = {}

    def declare_inputs(self, specs: list[IOSpec]) -> None:
        """Give the inputs' datatypes/shapes (-1 = dynamic); call before ``load``."""
        self._declared = {s.name: s for s in specs}

    def load(self, model_path: Path, device: str, threads: int) -> None:
        torch = _torch()
        self._torch = torch
        kind, _slug = parse_device(device)
        if kind == "gpu":
            if not torch.cuda.is_available():
                raise ServerError(
                    f"device {device!r} needs CUDA, but this torch ({torch.__version__}) sees no GPU; "
                    "install a CUDA build of torch and check the driver, or run on cpu"
                )
            self._device = torch.device("cuda", 0)
        else:
            self._device = torch.device("cpu")
        torch.set_num_threads(lease_threads(threads))
        try:
            torch.set_num_interop_threads(1)  # before any parallel work; once per process
        except RuntimeError:  # set already (a second instance in this process) or parallel work began
            pass
        path = Path(model_path)
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist; check the path the job was given")
        try:
            module = torch.jit.load(str(path), map_location=self._device)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelError(
                f"torch.jit.load cannot read {path.name}: {first}; save the model with "
                "torch.jit.script(m).save(path) or torch.jit.trace(m, example).save(path)"
            ) from exc
        module.eval()
        self._module = module
        # inputs are made writable copies before torch sees them, so this warning never applies
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self._inputs = self._input_specs(module)
        self._outputs = []
        if self._inputs and all(s.shape is not None and s.datatype for s in self._inputs):
            self._warm_up()

    def _input_specs(self, module: Any) -> list[IOSpec]:
        try:
            args = list(module.forward.schema.arguments)[1:]  # [0] is self
        except Exception as exc:
            raise ModelError(f"the TorchScript module has no forward method farm can call: {exc}") from exc
        specs: list[IOSpec] = []
        for a in args:
            if a.type.kind() != "TensorType":
                if a.has_default_value():
                    continue
                raise ModelError(
                    f"forward argument {a.name!r} is {a.type}, not a Tensor; farm feeds tensors only: "
                    "give it a default or wrap the model"
                )
            d = self._declared.get(a.name)
            specs.append(IOSpec(a.name, d.datatype if d else "", d.shape if d else None))
        return specs

    def _warm_up(self) -> None:
        feed = {
            s.name: np.zeros(tuple(1 if d < 0 else d for d in s.shape or ()), V2_TO_NP[s.datatype])
            for s in self._inputs
        }
        out = self.infer(feed)
        self._outputs = [
            IOSpec(n, np_to_v2(a.dtype), tuple(-1 if i == 0 and a.ndim else d for i, d in enumerate(a.shape)))
            for n, a in out.items()
        ]

    def infer(
        self, inputs: dict[str, np.ndarray], outputs: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        torch = self._torch
        if self._module is None:
            raise ServerError("the TorchScript backend is not loaded; call load() first")
        args = []
        for spec in self._inputs:
            arr = inputs.get(spec.name)
            if arr is None:
                raise InputError(f"missing input {spec.name!r}")
            if not arr.flags.writeable:
                arr = arr.copy()  # request bytes are immutable; the model may write in place
            t = torch.from_numpy(arr)
            if self._device.type != "cpu":
                t = t.to(self._device, non_blocking=True)
            args.append(t)
        try:
            with torch.inference_mode():
                result = self._module(*args)
        except RuntimeError as exc:
            raise InputError(f"TorchScript rejected the inputs: {str(exc).strip().splitlines()[0]}") from exc
        named = self._name_outputs(result)
        if outputs:
            unknown = [n for n in outputs if n not in named]
            if unknown:
                raise InputError(f"unknown output(s) {', '.join(unknown)}; the model gives {', '.join(named)}")
            named = {n: named[n] for n in outputs}
        return {n: t.detach().cpu().numpy() for n, t in named.items()}

    def _name_outputs(self, result: Any) -> dict[str, Any]:
        torch = self._torch
        if isinstance(result, torch.Tensor):
            return {"output__0": result}
        if isinstance(result, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in result):
            return {f"output__{i}": t for i, t in enumerate(result)}
        if isinstance(result, dict) and all(isinstance(t, torch.Tensor) for t in result.values()):
            return {str(k): v for k, v in result.items()}
        raise ServerError(
            f"the model returned {type(result).__name__}, not a tensor, tuple/list or dict of tensors; "
            "wrap it so forward returns tensors"
        )

    def close(self) -> None:
        self._module = None
        if self._device is not None and self._device.type == "cuda":
            self._torch.cuda.empty_cache()
