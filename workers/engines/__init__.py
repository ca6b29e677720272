"""Model serving engines: backends (ONNX Runtime, TorchScript), farm's built-in KServe v2 gRPC server,
readiness polling, and the Triton adapter.

Public API: ``base.Backend``/``IOSpec``/``make_backend``, ``server.ServerConfig``/``run_server``,
``ready.wait_ready``, ``triton.build_repository``/``tritonserver_command``/``docker_run_kwargs``/``attach``.
"""
from __future__ import annotations

from workers.engines.base import BACKEND_ENGINES, Backend, InputError, IOSpec, make_backend

__all__ = ["BACKEND_ENGINES", "Backend", "IOSpec", "InputError", "make_backend"]
