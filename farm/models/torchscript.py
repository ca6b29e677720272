"""TorchScript helpers and example models (torch is imported lazily; a clear ModelError when missing).

The example modules mirror the ONNX ``mlp`` and ``convnet`` examples layer for layer and copy their
seeded weights, so both formats compute the same function. Saved files declare their inputs for farm
twice: in the zip's ``extra/farm_inputs.json`` (readable without torch) and as the ``farm_inputs``
module attribute.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

from farm.errors import ModelError, RequestError
from farm.models.spec import (
    FARM_INPUTS_ATTR,
    FARM_INPUTS_EXTRA,
    INPUT_HINT,
    ModelInfo,
    format_input_spec,
    one_line,
    onnx_modules,
    sha256_file,
    tensor_spec,
)
from farm.sandbox import model_jail, run_jailed
from schemas import TensorSpec
from schemas.dtypes import TORCH_TO_V2, V2_NUMPY_NAME

TORCHSCRIPT_EXAMPLES: tuple[str, ...] = ("mlp", "convnet")
PROBE_MODULE = "farm.models.probe"  # the jailed side of a parse or analysis (run by module name)
_INPUTS: dict[str, list[str]] = {"mlp": ["input:FP32:256"], "convnet": ["input:FP32:3x32x32"]}


def _try_torch() -> Any:
    try:
        import torch  # noqa: PLC0415 - torch is an optional extra (farm[torch])
    except ImportError:
        return None
    return torch


def require_torch() -> Any:
    """The ``torch`` module, or ModelError saying how to install it."""
    torch = _try_torch()
    if torch is None:
        raise ModelError("TorchScript needs PyTorch, which is not installed; pip install torch==2.13.0")
    return torch


def load_torchscript(path: Path) -> Any:
    """``torch.jit.load`` on CPU, in eval mode; ModelError when torch is missing or the file is bad."""
    torch = require_torch()
    try:
        module = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        msg = " ".join(str(exc).split())[:160]
        raise ModelError(f"{path} could not be loaded as TorchScript: {msg}; re-export it") from None
    module.eval()
    return module


def forward_arg_names(module: Any) -> list[str]:
    """Names of a scripted module's ``forward`` arguments, ``self`` excluded."""
    return [a.name for a in list(module.forward.schema.arguments)[1:]]


def torch_inputs(inputs: list[TensorSpec], batch: int = 1, fill: float = 0.0) -> list[Any]:
    """CPU tensors of shape ``[batch, *spec.shape]`` filled with ``fill``, one per spec."""
    import numpy as np  # noqa: PLC0415 - numpy: +0.08 s on every CLI start (this module is on its path), measured

    torch = require_torch()
    return [torch.from_numpy(np.full((batch, *s.shape), fill, dtype=V2_NUMPY_NAME[s.dtype])) for s in inputs]


def torchscript_declared_inputs(path: Path) -> list[TensorSpec] | None:
    """Input specs a TorchScript file declares for farm: ``extra/farm_inputs.json`` in the zip (read
    without torch) or a ``farm_inputs`` module attribute (needs torch). None when it declares none."""
    try:
        with zipfile.ZipFile(path) as z:
            extra = [n for n in z.namelist() if n.endswith(f"extra/{FARM_INPUTS_EXTRA}")]
            if extra:
                items = json.loads(z.read(extra[0]).decode("utf-8"))
                return [tensor_spec(s) for s in items]
    except (zipfile.BadZipFile, OSError, ValueError, RequestError) as exc:
        raise ModelError(f"{path}: unreadable {FARM_INPUTS_EXTRA} ({one_line(exc, 120)}); re-export it") from None
    if _try_torch() is None:
        return None
    module = load_torchscript(path)
    declared = getattr(module, FARM_INPUTS_ATTR, None)
    if not declared:
        return None
    try:
        return [tensor_spec(str(s)) for s in declared]
    except RequestError as exc:
        raise ModelError(f"{path}: bad {FARM_INPUTS_ATTR} attribute: {exc}") from None


def inspect_torchscript(path: Path, given: list[TensorSpec] | None) -> ModelInfo:
    """:func:`inspect_torchscript_here`, in the sandbox unless the operator trusts this host's models
    (``farm.sandbox``: loading a TorchScript file runs its code)."""
    if model_jail("torchscript", Path(path).name):
        return ModelInfo.from_json(run_jailed(PROBE_MODULE, probe_args("inspect", path, given), read_only=[path],
                                              what=f"the check of {Path(path).name}"))
    return inspect_torchscript_here(path, given)


def probe_args(op: str, path: Path, inputs: list[TensorSpec] | None) -> list[str]:
    """The arguments of ``python -m farm.models.probe`` for ``op`` (inspect, analyze, report) on ``path``."""
    given = None if inputs is None else [t.model_dump(mode="json") for t in inputs]
    return [op, str(Path(path).resolve()), json.dumps(given)]


def inspect_torchscript_here(path: Path, given: list[TensorSpec] | None) -> ModelInfo:
    """Inspect a TorchScript file: inputs from ``given`` or the file's declaration, outputs from a dry run
    on a batch of 1 zeros (skipped, with a note, when torch is not installed). Outputs are named
    ``output__<i>`` (Triton's convention); the batch dimension is assumed dynamic (first dim of every input).
    """
    notes: list[str] = []
    declared = torchscript_declared_inputs(path)
    inputs = list(given) if given else declared
    if not inputs:
        raise ModelError(f"TorchScript models carry no input shapes; give every forward() input of {path.name} "
                         f"with {INPUT_HINT}")
    outputs: list[TensorSpec] = []
    torch = _try_torch()
    if torch is None:
        notes.append("PyTorch is not installed here, so the inputs were not checked by a dry run")
    else:
        module = load_torchscript(path)
        names = forward_arg_names(module)
        if len(names) != len(inputs):
            raise ModelError(f"{path.name} forward() takes {len(names)} inputs ({', '.join(names)}), "
                             f"given {len(inputs)}; give one {INPUT_HINT} per argument")
        try:
            with torch.no_grad():
                out = module(*torch_inputs(inputs, batch=1))
        except Exception as exc:
            raise ModelError(f"{path.name} failed on a batch of 1 with the inputs "
                             f"{', '.join(format_input_spec(s) for s in inputs)}: {one_line(exc, 160)}; "
                             "check the --input shapes and dtypes") from None
        outs = out if isinstance(out, (tuple, list)) else [out]
        for i, t in enumerate(outs):
            if not isinstance(t, torch.Tensor):
                notes.append(f"output {i} is a {type(t).__name__}, not a tensor")
                continue
            dtype = TORCH_TO_V2.get(str(t.dtype).replace("torch.", ""))
            if dtype is None:
                raise ModelError(f"{path.name} output {i} has dtype {t.dtype}, which farm cannot serve")
            outputs.append(TensorSpec(name=f"output__{i}", dtype=dtype, shape=tuple(t.shape[1:])))
    return ModelInfo(format="torchscript", sha256=sha256_file(path), size_bytes=path.stat().st_size,
                     inputs=inputs, outputs=outputs, dynamic_batch=True, notes=notes)


def _modules() -> dict[str, type]:
    """The example nn.Module classes (defined on first use so importing this file never needs torch)."""
    torch = require_torch()
    nn: Any = torch.nn

    class MLP(nn.Module):
        """Linear(256,512)/ReLU/Linear(512,256)/ReLU/Linear(256,10), like the ONNX ``mlp``."""

        def __init__(self) -> None:
            super().__init__()
            self.fc0 = nn.Linear(256, 512)
            self.fc1 = nn.Linear(512, 256)
            self.fc2 = nn.Linear(256, 10)
            self.farm_inputs = list(_INPUTS["mlp"])

        def forward(self, input):  # noqa: ANN001, ANN201 (TorchScript: Tensor -> Tensor)
            return self.fc2(torch.relu(self.fc1(torch.relu(self.fc0(input)))))

    class ConvNet(nn.Module):
        """Conv/ReLU/MaxPool/Conv/ReLU/GlobalAvgPool/Flatten/Linear, like the ONNX ``convnet``."""

        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.fc = nn.Linear(32, 10)
            self.farm_inputs = list(_INPUTS["convnet"])

        def forward(self, input):  # noqa: ANN001, ANN201 (TorchScript: Tensor -> Tensor)
            x = torch.max_pool2d(torch.relu(self.conv1(input)), 2, 2)
            x = torch.relu(self.conv2(x))
            x = torch.flatten(torch.mean(x, dim=(2, 3), keepdim=True), 1)
            return self.fc(x)

    # No annotations on purpose: with postponed evaluation TorchScript cannot resolve them here; it
    # types the unannotated ``input`` as Tensor and ``farm_inputs`` as List[str] from its value.
    return {"mlp": MLP, "convnet": ConvNet}


def example_module(kind: str, onnx_model: Any) -> Any:
    """An eval-mode nn.Module for ``kind`` with the seeded weights of ``onnx_model``, the ONNX example of the
    same kind (``farm.models.examples``, which passes it in: it imports this module, not the reverse)."""
    if kind not in TORCHSCRIPT_EXAMPLES:
        raise RequestError(f"unknown TorchScript example {kind!r}; choose one of {', '.join(TORCHSCRIPT_EXAMPLES)}")
    torch = require_torch()
    _, _, numpy_helper = onnx_modules()
    module = _modules()[kind]()
    state = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in onnx_model.graph.initializer}
    module.load_state_dict(state, strict=True)
    return module.eval()


def build_torchscript(kind: str, out: Path, onnx_model: Any) -> Path:
    """Script example ``kind`` (``mlp`` or ``convnet``) with ``onnx_model``'s weights (see ``example_module``)
    and save it to ``out``; returns ``out``."""
    torch = require_torch()
    module = example_module(kind, onnx_model)
    scripted = torch.jit.script(module)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    extra = {"farm_inputs.json": json.dumps(_INPUTS[kind])}
    torch.jit.save(scripted, str(out), _extra_files=extra)
    return out
