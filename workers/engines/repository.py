"""What farm's built-in server tells Triton's tools about its one model: the ModelConfig (with
``max_batch_size`` and per-sample dims when every tensor has a dynamic batch axis, as Triton reports a
batching model; ``max_batch_size 0`` and full dims otherwise), and the model-repository extension
(RepositoryIndex, RepositoryModelLoad, RepositoryModelUnload) that Model Analyzer's remote mode drives.

Kept apart from ``server.py`` so that the protocol module stays about serving.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from schemas.engines import CARDS
from workers.engines.base import InputError, IOSpec
from workers.engines.holder import ModelHolder, config_overrides
from workers.engines.triton import DEFAULT_MAX_BATCH, model_config

READY = "READY"
MODEL_VERSION = "1"


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
    instances: int, device: str, threads: int, max_queue_delay_us: int | None = None,
    preferred_batch_size: int | None = None,
) -> mc.ModelConfig:
    """The ModelConfig Triton would report for this model: ``max_batch_size`` DEFAULT_MAX_BATCH and
    dims without the batch axis when :func:`batch_axis` holds, else ``max_batch_size 0`` and full dims.
    Tensors whose datatype or shape the engine cannot tell (undeclared TorchScript inputs) are left out."""
    max_batch = DEFAULT_MAX_BATCH if batch_axis(inputs, outputs) else 0
    ins, outs = _known(inputs), _known(outputs)
    if len(ins) != len(inputs):
        ins, max_batch = [], 0
    batching = max_queue_delay_us if max_batch else None  # the server batches only along a batch axis
    cfg = model_config(name, model_format, ins, outs, max_batch_size=max_batch,
                       instances=instances, device=device, threads=threads, max_queue_delay_us=batching,
                       preferred_batch_size=preferred_batch_size if batching is not None else None)
    card = CARDS.get(engine)  # Triton's backend name of the engine (ModelConfig ``backend``)
    cfg.backend = card.triton_backend if card is not None and card.triton_backend else engine
    return cfg


def repository_index(name: str, version: str, ready: bool) -> pb.RepositoryIndexResponse:
    """The RepositoryIndex of a one-model repository: the model, its version and state."""
    entry = pb.RepositoryIndexResponse.ModelIndex(
        name=name, version=version, state=READY if ready else "UNAVAILABLE",
        reason="" if ready else "the model is not loaded",
    )
    return pb.RepositoryIndexResponse(models=[entry])


class RepositoryServicer:
    """The KServe v2 model-repository extension (RepositoryIndex, RepositoryModelLoad,
    RepositoryModelUnload) over the one served model, mixed into the server's servicer, which provides
    ``holder`` (a :class:`ModelHolder`), ``name``, ``cfg`` (the configuration it started with) and
    ``config_of`` (the ModelConfig of a loaded model).

    A load without a config reloads nothing when the model is loaded (Triton would reload the same
    files); with a ``config`` parameter (a ModelConfig in JSON, as Model Analyzer sends) it reloads the
    model with that config's instance count and dynamic batching."""

    holder: ModelHolder
    name: str
    cfg: Any  # the ServerConfig farm serve started with
    base_config: mc.ModelConfig  # the ModelConfig it started with (tensors, max_batch_size, backend)

    async def _in_repository(self, name: str, context: Any) -> None:
        if name != self.name:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no model {name!r} in this repository; "
                                f"this server serves {self.name!r}")

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:  # noqa: N802 (protocol names)
        return repository_index(self.name, MODEL_VERSION, ready=self.holder.ready)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:  # noqa: N802
        await self._in_repository(request.model_name, context)
        cfg = self.holder.model.cfg if self.holder.ready else self.cfg
        overrides: dict[str, Any] = {}
        if "config" in request.parameters and request.parameters["config"].string_param:
            try:
                overrides = config_overrides(request.parameters["config"].string_param, self.base_config)
            except InputError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            await self.holder.load(cfg, overrides)
        except Exception as exc:  # the old model stays served; the client learns why the load failed
            await context.abort(grpc.StatusCode.INTERNAL, f"load of {self.name!r} failed: {exc}")
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:  # noqa: N802
        await self._in_repository(request.model_name, context)
        await self.holder.unload()
        return pb.RepositoryModelUnloadResponse()
