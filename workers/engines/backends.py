"""The backends of the in-process engines (``schemas.engines.IN_PROCESS``), by engine name: one entry per
engine. farm's built-in server and edge runs load models through :func:`make_backend`.

The backend modules import their engine's package (torch, openvino) only when a model loads, so listing
them here costs no heavy import."""
from __future__ import annotations

from farm.errors import ServerError
from schemas.engines import RULES
from workers.engines.base import Backend
from workers.engines.onnxruntime_backend import OnnxRuntimeBackend
from workers.engines.openvino_backend import OpenVinoBackend
from workers.engines.torchscript_backend import TorchScriptBackend

BACKENDS: dict[str, type[Backend]] = {b.engine: b for b in (OnnxRuntimeBackend, TorchScriptBackend, OpenVinoBackend)}
BACKEND_ENGINES: tuple[str, ...] = tuple(BACKENDS)


def make_backend(engine: str) -> Backend:
    """A fresh, unloaded backend for ``engine`` (one of :data:`BACKEND_ENGINES`)."""
    e = engine.strip().lower()
    backend = BACKENDS.get(e)
    if backend is not None:
        return backend()
    if e in RULES:
        raise ServerError(f"engine {e!r} is served by its own server (workers.serving), not farm's built-in one; "
                          f"the built-in server runs {', '.join(BACKEND_ENGINES)}")
    raise ServerError(f"engine {engine!r} is unknown; the built-in server runs {', '.join(BACKEND_ENGINES)}")
