"""The one served model as the KServe v2 repository extension sees it: loaded or unloaded, and
reloadable with another serving configuration (instance count, dynamic batching) taken from the
``config`` parameter of ``RepositoryModelLoad`` — how Triton Model Analyzer's remote mode drives a
server (load, wait for ready, measure with perf_analyzer, unload).

Loading and closing run off the event loop (a model loads in seconds); requests arriving while the
model is unloaded get UNAVAILABLE. Only the fields a farm server can honour are taken from a config;
one that asks for anything else (another backend, a different model) is refused, not ignored.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from farm.errors import ServerError
from workers.engines.base import InputError
from workers.engines.batcher import DynamicBatcher, batcher_for


class ModelUnavailable(ServerError):
    """The model is unloaded (RepositoryModelUnload): UNAVAILABLE until the next RepositoryModelLoad."""


def config_overrides(config_json: str, served: mc.ModelConfig) -> dict[str, Any]:
    """The ServerConfig fields a ``RepositoryModelLoad`` config asks for (``instances``,
    ``max_queue_delay_us``, ``preferred_batch_size``), checked against what is served.

    Raises InputError for a config that is not a ModelConfig or asks for what this server cannot do."""
    try:
        want = json_format.Parse(config_json, mc.ModelConfig(), ignore_unknown_fields=True)
    except (json_format.ParseError, json.JSONDecodeError, TypeError) as exc:
        raise InputError(f"the load's config is not a Triton ModelConfig in JSON: {exc}") from None
    if want.name and want.name != served.name:
        raise InputError(f"the load's config names model {want.name!r}; this server serves {served.name!r}")
    if want.backend and want.backend != served.backend:
        raise InputError(f"the load's config asks for backend {want.backend!r}; this server runs "
                         f"{served.backend!r} (start farm serve with another --engine)")
    if want.max_batch_size and want.max_batch_size > served.max_batch_size:
        raise InputError(f"the load's config asks for max_batch_size {want.max_batch_size}; this model "
                         f"takes at most {served.max_batch_size}")
    out: dict[str, Any] = {}
    if want.instance_group:
        out["instances"] = max(1, sum(g.count or 1 for g in want.instance_group))
    if want.HasField("dynamic_batching"):
        db = want.dynamic_batching
        out["max_queue_delay_us"] = int(db.max_queue_delay_microseconds)
        out["preferred_batch_size"] = int(db.preferred_batch_size[0]) if db.preferred_batch_size else None
    else:
        out["max_queue_delay_us"] = out["preferred_batch_size"] = None
    return out


class ModelHolder:
    """Holds the served model and its dynamic batcher; ``load``/``unload`` swap them under requests.

    ``model`` is a ``workers.engines.server._Model`` (anything with ``cfg``, ``submit``, ``batched``,
    ``close``); ``load_fn`` builds one from a ServerConfig."""

    def __init__(self, model: Any, load_fn: Callable[[Any], Any]) -> None:
        self._load_fn = load_fn
        self._stack = ExitStack()
        self.model: Any = None
        self.batcher: DynamicBatcher | None = None
        self._lock = asyncio.Lock()
        self._install(model)

    @property
    def ready(self) -> bool:
        return self.model is not None

    def _install(self, model: Any) -> None:
        stack = ExitStack()
        self.batcher = stack.enter_context(batcher_for(model.cfg, model.submit, model.batched))
        self._stack, self.model = stack, model

    def release(self) -> Callable[[], None]:
        """Detach the current model and stop its batcher (here, on the event loop: the batcher's timers and
        futures live there); returns what closes the model (blocking: run it off the loop)."""
        stack, model = self._stack, self.model
        self._stack, self.model, self.batcher = ExitStack(), None, None
        stack.close()
        return model.close if model is not None else (lambda: None)

    async def run(self, feed: dict[str, np.ndarray], out_names: list[str] | None,
                  t_submit: int) -> tuple[dict[str, np.ndarray], int, int]:
        """One inference on the current model (through its batcher when it has one)."""
        model, batcher = self.model, self.batcher
        if model is None:
            raise ModelUnavailable(f"model {self.name!r} is not loaded; load it with RepositoryModelLoad")
        if batcher is not None:
            return await batcher.infer(feed, out_names, t_submit)
        return await model.submit(feed, out_names, t_submit)

    def statistics(self) -> tuple[str, Any, int | None]:
        """(model name, the loaded model's cumulative statistics or None, the batcher's executions or None)."""
        model, batcher = self.model, self.batcher
        return self.name, model.stats if model is not None else None, batcher.executions if batcher else None

    name = ""  # set by the servicer: the served model's name, for messages

    async def load(self, cfg: Any, overrides: dict[str, Any]) -> None:
        """(Re)load the model with ``cfg`` changed by ``overrides``; a load that changes nothing on a loaded
        model keeps it (Triton reloads; farm keeps its warm sessions). A failed load leaves the old model."""
        async with self._lock:
            new_cfg = dataclasses.replace(cfg, **overrides)
            if self.model is not None and new_cfg == self.model.cfg:
                return
            model = await asyncio.to_thread(self._load_fn, new_cfg)
            close = self.release()
            self._install(model)
            await asyncio.to_thread(close)

    async def unload(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self.release())

    def close(self) -> None:
        self.release()()
