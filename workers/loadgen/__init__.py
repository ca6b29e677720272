"""farm's load clients: KServe v2 gRPC inference traffic, closed or open loop, measured in windows.

``run_load(url, model_name, inputs, batch_size, concurrency, settings)`` returns a :class:`LoadResult`
whose ``metrics`` use ``schemas.metrics`` names. Modules: ``contract`` (the job, the typed records a client
returns, the ``LoadClient`` interface), ``clients`` (the registry, ``auto``'s choice, ``run_load``),
``patterns`` (closed loop, constant rate, Poisson: strategies every client shares), ``plan`` (the window
plan), ``result`` (records to metrics, notes and details, once for every client), ``stats`` (pure
percentile and stability helpers); farm's own generator: ``run`` (the coordinator), ``worker`` (one grpc.aio
event loop), ``drivers`` (workers in a thread or in processes), ``messages``, ``request`` (the request,
built and serialized once); NVIDIA perf_analyzer: ``perf_analyzer_client`` and ``perf_analyzer`` (the binary).

The names below load ``clients`` (and gRPC) on first use, so ``workers.loadgen.stats`` stays importable on
its own: the edge benchmark uses it inside memory-limited containers, where gRPC would cost ~15 MiB.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.loadgen.clients import run_load
    from workers.loadgen.contract import LoadResult

__all__ = ["LoadResult", "run_load"]
_HOME = {"LoadResult": "workers.loadgen.contract", "run_load": "workers.loadgen.clients"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
