"""Model serving engines: backends (ONNX Runtime, TorchScript, OpenVINO) and their registry, farm's built-in
KServe v2 gRPC server, readiness polling, and the Triton adapter. How each engine's server is launched is
``workers.serving``.

Public API: ``base.Backend``/``IOSpec``, ``backends.make_backend``, ``server.ServerConfig``/``run_server``,
``ready.wait_ready``, ``triton.build_repository``/``tritonserver_command``/``docker_run_kwargs``/``attach``.
"""
from __future__ import annotations

from workers.engines.backends import BACKEND_ENGINES, make_backend
from workers.engines.base import Backend, InputError, IOSpec

__all__ = ["BACKEND_ENGINES", "Backend", "IOSpec", "InputError", "make_backend"]
