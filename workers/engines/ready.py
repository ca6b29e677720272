"""Wait until a KServe v2 gRPC server (farm's own or Triton) says the server and the model are ready."""
from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from farm.errors import ServerError

POLL_S = 0.1  # seconds between polls
CALL_TIMEOUT_S = 2.0  # per-RPC deadline, seconds
# reconnect quickly: gRPC's default backoff grows to 120 s, which would hide a server that came up late
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


def _describe(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'error'}: {details}"


def wait_ready(
    url: str,
    model_name: str,
    timeout_s: float,
    alive: Callable[[], bool] | None = None,
) -> None:
    """Poll ServerReady then ModelReady at ``url`` (``host:port``) until both are true.

    Raises ServerError after ``timeout_s`` seconds, or as soon as ``alive()`` returns False (the server
    process died); the message says what was last seen and what to check.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    with grpc.insecure_channel(url, options=_CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while True:
            if alive is not None and not alive():
                raise ServerError(
                    f"the model server for {model_name!r} at {url} exited before it was ready "
                    f"(last seen: {last}); check its stderr for a model load or port error"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            call_timeout = max(0.05, min(CALL_TIMEOUT_S, remaining))
            try:
                if not stub.ServerReady(pb.ServerReadyRequest(), timeout=call_timeout).ready:
                    last = "ServerReady answered not ready"
                elif stub.ModelReady(pb.ModelReadyRequest(name=model_name), timeout=call_timeout).ready:
                    return
                else:
                    last = f"server ready but ModelReady({model_name!r}) answered not ready"
            except grpc.RpcError as exc:
                last = _describe(exc)
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    raise ServerError(
        f"the model server at {url} was not ready with model {model_name!r} within {timeout_s:g} s "
        f"(last seen: {last}); check that the server started on that port, that the model name matches, "
        "and its log for load errors, or raise FARM_SERVER_READY_TIMEOUT_S for large models"
    )
