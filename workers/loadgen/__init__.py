"""farm's load generator: KServe v2 gRPC inference traffic (unary ModelInfer calls or ModelStreamInfer
streams), closed or open loop, measured in windows.

``run_load(url, model_name, inputs, batch_size, concurrency, settings)`` returns a :class:`LoadResult`
whose ``metrics`` use ``schemas.metrics`` names. Modules: ``stats`` (pure percentile, histogram and
stability helpers), ``request`` (the request, built and serialized once), ``worker`` (one grpc.aio
event loop), ``drivers`` (workers in a thread or in processes), ``run`` (the coordinator).
"""
from __future__ import annotations

from workers.loadgen.run import LoadResult, auto_process_cap, run_load, split_work, window_lengths

__all__ = ["LoadResult", "auto_process_cap", "run_load", "split_work", "window_lengths"]
