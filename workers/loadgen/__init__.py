"""farm's load generator: KServe v2 gRPC inference traffic (unary ModelInfer calls or ModelStreamInfer
streams), closed or open loop, measured in windows.

``run_load(url, model_name, inputs, batch_size, concurrency, settings)`` returns a :class:`LoadResult`
whose ``metrics`` use ``schemas.metrics`` names. Modules: ``stats`` (pure percentile, histogram and
stability helpers), ``request`` (the request, built and serialized once), ``messages`` (typed messages
between workers and coordinator, and the merged window), ``worker`` (one grpc.aio event loop),
``drivers`` (workers in a thread or in processes), ``run`` (the coordinator).

The names below load ``run`` (and gRPC) on first use, so ``workers.loadgen.stats`` stays importable on
its own: the edge benchmark uses it inside memory-limited containers, where gRPC would cost ~15 MiB.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.loadgen.run import LoadResult, auto_process_cap, run_load, split_work, window_lengths

__all__ = ["LoadResult", "auto_process_cap", "run_load", "split_work", "window_lengths"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("workers.loadgen.run"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
