"""A tiny KServe v2 gRPC test server with scripted misbehaviour, run as a subprocess by the tests.

Usage: ``python fake_server.py [--compute-ms X] [--params] [--stall-after-s T --stall-ms M]
[--error-every N] [--error-code NAME] [--not-ready] [--no-stream]``; prints
``fake-serve listening HOST:PORT``. One request is served at a time (a lock), like a single model
instance: a stall blocks everyone. ModelStreamInfer answers each stream's requests in order and, like
Triton, reports a failed request as a response whose ``error_message`` is the bare error text;
``--no-stream`` leaves the method unimplemented.
"""
from __future__ import annotations

import argparse
import signal
import threading
import time
from concurrent import futures

import grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc


class Scripted(Exception):
    """A scripted failure: (status code, text)."""


class FakeService(pb_grpc.GRPCInferenceServiceServicer):
    """ServerReady/ModelReady/ModelInfer/ModelStatistics with optional compute, stall and errors."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.count = 0
        self.first_t: float | None = None
        self.stalled = False

    def ServerReady(self, request, context):  # noqa: N802 - gRPC method name
        return pb.ServerReadyResponse(ready=True)

    def ServerLive(self, request, context):  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    def ModelReady(self, request, context):  # noqa: N802
        return pb.ModelReadyResponse(ready=not self.args.not_ready and request.name == self.args.model_name)

    def ModelStatistics(self, request, context):  # noqa: N802
        return pb.ModelStatisticsResponse()

    def ModelInfer(self, request, context):  # noqa: N802
        try:
            return self._answer(request)
        except Scripted as exc:
            context.abort(*exc.args)

    def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        if self.args.no_stream:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        for request in request_iterator:
            try:
                yield pb.ModelStreamInferResponse(infer_response=self._answer(request))
            except Scripted as exc:
                yield pb.ModelStreamInferResponse(
                    error_message=exc.args[1], infer_response=pb.ModelInferResponse(id=request.id))

    def _answer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        arrived = time.monotonic_ns()
        a = self.args
        with self.lock:
            started = time.monotonic_ns()
            self.count += 1
            n = self.count
            now = time.monotonic()
            if self.first_t is None:
                self.first_t = now
            if a.stall_ms and not self.stalled and now - self.first_t >= a.stall_after_s:
                self.stalled = True
                time.sleep(a.stall_ms / 1000.0)
            if a.compute_ms:
                time.sleep(a.compute_ms / 1000.0)
            done = time.monotonic_ns()
        if a.error_every and n % a.error_every == 0:
            raise Scripted(getattr(grpc.StatusCode, a.error_code), f"scripted error on request {n}")
        if request.model_name != a.model_name:
            raise Scripted(grpc.StatusCode.NOT_FOUND, f"unknown model {request.model_name!r}")
        resp = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=False):
            out = resp.outputs.add()
            out.name = "echo_" + tensor.name
            out.datatype = tensor.datatype
            out.shape.extend(tensor.shape)
            resp.raw_output_contents.append(raw)
        if a.params:
            resp.parameters["farm_queue_ns"].int64_param = started - arrived
            resp.parameters["farm_compute_ns"].int64_param = done - started
        return resp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-name", default="model")
    ap.add_argument("--compute-ms", type=float, default=0.0)
    ap.add_argument("--params", action="store_true")
    ap.add_argument("--stall-after-s", type=float, default=0.0)
    ap.add_argument("--stall-ms", type=float, default=0.0)
    ap.add_argument("--error-every", type=int, default=0)
    ap.add_argument("--error-code", default="RESOURCE_EXHAUSTED")
    ap.add_argument("--not-ready", action="store_true")
    ap.add_argument("--no-stream", action="store_true")
    args = ap.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64),
                         options=[("grpc.max_send_message_length", -1),
                                  ("grpc.max_receive_message_length", -1)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(FakeService(args), server)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"fake-serve listening 127.0.0.1:{port}", flush=True)
    try:
        signal.sigwait({signal.SIGTERM, signal.SIGINT})  # runs until the test stops it
    finally:
        server.stop(0)


if __name__ == "__main__":
    main()
