"""Worker node: hardware discovery, registration, claiming, runners, engines, load generator, samplers."""
from __future__ import annotations

from workers import grpc_env as _grpc_env  # noqa: E402,F401 (configures gRPC before anything loads it)
