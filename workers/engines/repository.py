"""What farm's built-in server tells Triton's tools about its one model: the ModelConfig (with
``max_batch_size`` and per-sample dims when every tensor has a dynamic batch axis, as Triton reports a
batching model; ``max_batch_size 0`` and full dims otherwise) and the RepositoryIndex.

Kept apart from ``server.py`` so that the protocol module stays about serving.
"""
from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from workers.engines.base import IOSpec
from workers.engines.triton import DEFAULT_MAX_BATCH, model_config

#: Triton's backend name of each in-process engine (ModelConfig ``backend``)
ENGINE_BACKEND: dict[str, str] = {"onnxruntime": "onnxruntime", "torchscript": "pytorch", "openvino": "openvino"}
READY = "READY"


def default_model_name(model_path: Path) -> str:
    """The name ``farm serve m.onnx`` gives its model: the file's stem (``m``)."""
    return Path(model_path).stem or "model"


def _known(specs: list[IOSpec]) -> list[IOSpec]:
    return [s for s in specs if s.shape is not None and s.datatype]


def batch_axis(inputs: list[IOSpec], outputs: list[IOSpec]) -> bool:
    """True when every input and every known output has a dynamic first dimension (a batch axis)."""
    known_out = _known(outputs)
    return bool(inputs) and all(
        s.shape is not None and len(s.shape) > 0 and s.shape[0] == -1 for s in [*inputs, *known_out]
    )


def served_config(
    name: str, model_format: str, engine: str, inputs: list[IOSpec], outputs: list[IOSpec], *,
    instances: int, device: str, threads: int,
) -> mc.ModelConfig:
    """The ModelConfig Triton would report for this model: ``max_batch_size`` DEFAULT_MAX_BATCH and
    dims without the batch axis when :func:`batch_axis` holds, else ``max_batch_size 0`` and full dims.
    Tensors whose datatype or shape the engine cannot tell (undeclared TorchScript inputs) are left out."""
    max_batch = DEFAULT_MAX_BATCH if batch_axis(inputs, outputs) else 0
    ins, outs = _known(inputs), _known(outputs)
    if len(ins) != len(inputs):
        ins, max_batch = [], 0
    cfg = model_config(name, model_format, ins, outs, max_batch_size=max_batch,
                       instances=instances, device=device, threads=threads)
    cfg.backend = ENGINE_BACKEND.get(engine, engine)
    return cfg


def repository_index(name: str, version: str, ready: bool) -> pb.RepositoryIndexResponse:
    """The RepositoryIndex of a one-model repository: the model, its version and state."""
    entry = pb.RepositoryIndexResponse.ModelIndex(
        name=name, version=version, state=READY if ready else "UNAVAILABLE",
        reason="" if ready else "the model is not loaded",
    )
    return pb.RepositoryIndexResponse(models=[entry])
