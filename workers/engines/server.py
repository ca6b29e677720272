"""farm's lean built-in model server: the KServe v2 / Triton gRPC protocol over one model.

The protocol comes from the stubs generated in ``tritonclient.grpc`` (service_pb2, service_pb2_grpc).
Inference runs off the event loop on ``instances`` threads, each owning its own backend session and
taking requests from one shared queue. Both ModelInfer (unary) and ModelStreamInfer (a bidirectional
stream, requests answered as they finish, failures as ``error_message``) are served. Every inference
response carries int64 parameters ``farm_queue_ns`` (waiting for a free instance) and
``farm_compute_ns`` (the engine call), in ns.

Run: ``python -m workers.engines.server MODEL --format onnx --engine onnxruntime --port 0``; once bound
it prints ``farm-serve listening HOST:PORT`` on stdout. Exit codes: 0 clean stop, 2 model load error,
3 port bind error.
"""
from __future__ import annotations

import argparse
import asyncio
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from farm.errors import FarmError, NotFoundError, ServerError
from schemas.dtypes import parse_input_spec
from schemas.engines import FORMAT_ENGINE, IN_PROCESS, MODEL_FORMATS, SERVED_MODEL_NAME, incompatibility
from workers import grpc_env, signal_stack
from workers.engines.backends import make_backend
from workers.engines.base import (
    COMPUTE_PARAM,
    QUEUE_PARAM,
    Backend,
    InputError,
    IOSpec,
    lease_threads,
    np_to_v2,
)
from workers.engines.decode import decode_inputs
from workers.engines.holder import ModelHolder, ModelUnavailable
from workers.engines.repository import MODEL_VERSION, RepositoryServicer, served_config
from workers.engines.triton_metrics import METRICS_PREFIX, metrics_server

SERVER_NAME = "farm"
SERVER_VERSION = "0.1.0"
MAX_MESSAGE_BYTES = (1 << 30) - 1  # gRPC caps lengths at INT32_MAX
GRACE_S = 5.0
LISTEN_PREFIX = "farm-serve listening"


@dataclass
class ServerConfig:
    """How to serve one model. ``threads``: intra-op threads per instance (0: the cores it may run on);
    ``instances``: parallel backend sessions; ``port`` 0 picks a free port."""

    model_path: Path
    model_format: str
    engine: str
    host: str = "127.0.0.1"
    port: int = 0
    device: str = "cpu"
    threads: int = 0
    instances: int = 1
    model_name: str = SERVED_MODEL_NAME
    inputs: list[IOSpec] | None = None  # declared input specs, for TorchScript (ONNX reads its own)
    max_queue_delay_us: int | None = None  # dynamic batching (workers.engines.batcher), µs; None = off
    preferred_batch_size: int | None = None  # rows; the largest merged batch is batcher.MAX_BATCH
    metrics_port: int | None = None  # Triton-style /metrics (workers.engines.triton_metrics); None = off


class _Stats:
    """Cumulative Triton-style statistics of the one model (updated on the event loop thread only)."""

    def __init__(self) -> None:
        self.success_count = self.success_ns = 0  # each success is one engine execution
        self.fail_count = self.fail_ns = 0
        self.queue_ns = self.input_ns = self.infer_ns = self.output_ns = 0  # over successes
        self.inference_count = 0  # samples (batch rows)
        self.last_inference_ms = 0


class _Model:
    """The served model: ``instances`` backends, each bound to one worker thread."""

    def __init__(self, cfg: ServerConfig) -> None:
        if cfg.instances < 1:
            raise ServerError(f"instances must be >= 1, got {cfg.instances}")
        why = incompatibility(cfg.engine, cfg.model_format, cfg.device) if cfg.engine in IN_PROCESS else None
        if why is not None:
            raise ServerError(f"{why}; pass --engine {FORMAT_ENGINE.get(cfg.model_format, 'onnxruntime')}")
        self.cfg = cfg
        self.threads = lease_threads(cfg.threads)  # intra-op threads per instance: the knob, else the lease's cores
        self.backends: list[Backend] = []
        try:
            for _ in range(cfg.instances):
                b = make_backend(cfg.engine)
                if cfg.inputs:
                    b.declare_inputs(list(cfg.inputs))
                b.load(Path(cfg.model_path), cfg.device, self.threads)
                self.backends.append(b)
        except BaseException:
            self.close()
            raise
        first = self.backends[0]
        self.platform = first.platform
        self.inputs: list[IOSpec] = first.inputs()
        self.outputs: list[IOSpec] = first.outputs()
        self.input_by_name = {s.name: s for s in self.inputs}
        self.output_by_name = {s.name: s for s in self.outputs}
        # batch dimension: every input's first dim dynamic -> count rows of the first input as samples
        self.batched = bool(self.inputs) and all(
            s.shape is None or (len(s.shape) > 0 and s.shape[0] == -1) for s in self.inputs
        )
        self.stats = _Stats()
        self._jobs: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, args=(b,), name=f"farm-infer-{i}", daemon=True)
            for i, b in enumerate(self.backends)
        ]
        for t in self._threads:
            t.start()

    def config(self) -> object:
        """A Triton-style ModelConfig of what is served (see workers.engines.repository.served_config)."""
        c = self.cfg
        return served_config(c.model_name, c.model_format, c.engine, self.inputs, self.outputs,
                             instances=c.instances, device=c.device, threads=self.threads,
                             max_queue_delay_us=c.max_queue_delay_us if self.batched else None,
                             preferred_batch_size=c.preferred_batch_size)

    def _work(self, backend: Backend) -> None:
        """One instance's thread: take the next request, run it on this thread's own backend, hand the
        result (outputs, queue_ns, compute_ns) back to the event loop."""
        jobs = self._jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            loop, fut, feed, out_names, t_submit = job
            t0 = time.perf_counter_ns()
            done: Callable[[Any, Any], None]
            value: object
            try:
                out = backend.infer(feed, out_names)
                t1 = time.perf_counter_ns()
                done, value = _set_result, (out, t0 - t_submit, t1 - t0)
            except BaseException as exc:  # handed to the request's coroutine, which maps it to a status
                done, value = _set_exception, exc
            try:
                loop.call_soon_threadsafe(done, fut, value)
            except RuntimeError:  # the event loop is already closed: nobody waits for this answer
                pass

    def submit(
        self, feed: dict[str, np.ndarray], out_names: list[str] | None, t_submit: int
    ) -> asyncio.Future[tuple[dict[str, np.ndarray], int, int]]:
        """Queue one inference for the next free instance; the future gives (outputs, queue_ns, compute_ns)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._jobs.put((loop, fut, feed, out_names, t_submit))
        return fut

    def close(self) -> None:
        threads = getattr(self, "_threads", [])
        for _ in threads:
            self._jobs.put(None)
        for t in threads:
            t.join(timeout=60)
        self._threads = []
        for b in self.backends:
            try:
                b.close()
            except Exception:
                pass
        self.backends = []


def _status(exc: Exception, engine: str) -> tuple[grpc.StatusCode, str]:
    """The gRPC status of a failed inference: an unknown model is NOT_FOUND, bad inputs are the client's
    fault, the rest ours."""
    if isinstance(exc, NotFoundError):
        return grpc.StatusCode.NOT_FOUND, str(exc)
    if isinstance(exc, ModelUnavailable):
        return grpc.StatusCode.UNAVAILABLE, str(exc)
    if isinstance(exc, InputError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, FarmError):
        return grpc.StatusCode.INTERNAL, str(exc)
    return grpc.StatusCode.INTERNAL, f"{engine} failed: {type(exc).__name__}: {exc}"


def _set_result(fut: asyncio.Future, value: object) -> None:
    if not fut.done():  # the RPC may have been cancelled meanwhile
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class _Servicer(RepositoryServicer, pb_grpc.GRPCInferenceServiceServicer):
    """The KServe v2 gRPC service over one model (unloadable and reloadable: workers.engines.holder)."""

    def __init__(self, holder: ModelHolder) -> None:
        self.holder = holder
        self.cfg: ServerConfig = holder.model.cfg
        self.base_config = holder.model.config()
        self.name = holder.name = self.cfg.model_name
        self.run = holder.run

    @property
    def model(self) -> _Model:  # ModelUnavailable while unloaded
        if self.holder.model is None:
            raise ModelUnavailable(f"model {self.name!r} is not loaded; load it with RepositoryModelLoad")
        return self.holder.model

    async def _loaded(self, context: grpc.aio.ServicerContext) -> _Model:
        if self.holder.model is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"model {self.name!r} is not loaded")
        return self.model

    def _known(self, name: str, version: str) -> bool:
        return name == self.name and version in ("", MODEL_VERSION)

    def _unknown_text(self, name: str) -> str:
        return f"unknown model {name!r}; this server serves {self.name!r} version {MODEL_VERSION}"

    async def _not_found(self, context: grpc.aio.ServicerContext, name: str) -> None:
        await context.abort(grpc.StatusCode.NOT_FOUND, self._unknown_text(name))

    async def ServerLive(self, request, context):  # noqa: N802 (protocol names)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):  # noqa: N802
        return pb.ModelReadyResponse(ready=self._known(request.name, request.version) and self.holder.ready)

    async def ServerMetadata(self, request, context):  # noqa: N802
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION,
                                         extensions=["statistics", "model_repository"])

    async def ModelMetadata(self, request, context):  # noqa: N802
        if not self._known(request.name, request.version):
            await self._not_found(context, request.name)
        m = await self._loaded(context)
        tm = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.name,
            versions=[MODEL_VERSION],
            platform=m.platform,
            inputs=[tm(name=s.name, datatype=s.datatype, shape=s.metadata_shape()) for s in m.inputs],
            outputs=[tm(name=s.name, datatype=s.datatype, shape=s.metadata_shape()) for s in m.outputs],
        )

    async def ModelConfig(self, request, context):  # noqa: N802
        if not self._known(request.name, request.version):
            await self._not_found(context, request.name)
        return pb.ModelConfigResponse(config=(await self._loaded(context)).config())

    async def ModelStatistics(self, request, context):  # noqa: N802
        if request.name and not self._known(request.name, request.version):
            await self._not_found(context, request.name)
        s = (await self._loaded(context)).stats
        d = pb.StatisticDuration
        n = s.success_count
        infer = pb.InferStatistics(
            success=d(count=n, ns=s.success_ns),
            fail=d(count=s.fail_count, ns=s.fail_ns),
            queue=d(count=n, ns=s.queue_ns),
            compute_input=d(count=n, ns=s.input_ns),
            compute_infer=d(count=n, ns=s.infer_ns),
            compute_output=d(count=n, ns=s.output_ns),
        )
        ms = pb.ModelStatistics(
            name=self.name,
            version=MODEL_VERSION,
            last_inference=s.last_inference_ms,
            inference_count=s.inference_count,
            execution_count=n,
            inference_stats=infer,
        )
        if self.holder.batcher is not None:  # executions and their batch sizes, as the batcher ran them
            self.holder.batcher.report(ms)
        return pb.ModelStatisticsResponse(model_stats=[ms])

    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        """Run one request and record its statistics; raises on unknown models and failed inferences
        (NotFoundError, InputError, engine errors), counting the failure."""
        t_recv = time.perf_counter_ns()
        model = self.model
        stats = model.stats
        if not self._known(request.model_name, request.model_version):
            raise NotFoundError(self._unknown_text(request.model_name))
        try:
            feed = decode_inputs(request, model.input_by_name)
            out_names: list[str] | None = None
            if request.outputs:
                out_names = [o.name for o in request.outputs]
                unknown = [n for n in out_names if model.output_by_name and n not in model.output_by_name]
                if unknown:
                    raise InputError(
                        f"unknown output(s) {', '.join(unknown)}; the model's outputs are "
                        f"{', '.join(model.output_by_name)}"
                    )
            t_submit = time.perf_counter_ns()
            outputs, queue_ns, compute_ns = await self.run(feed, out_names, t_submit)
            t_out = time.perf_counter_ns()
            resp = pb.ModelInferResponse(model_name=self.name, model_version=MODEL_VERSION, id=request.id)
            for name, arr in outputs.items():
                o = resp.outputs.add()
                o.name = name
                o.datatype = _v2(arr.dtype)
                o.shape.extend(arr.shape)
                resp.raw_output_contents.append(arr.tobytes())
            resp.parameters[QUEUE_PARAM].int64_param = queue_ns
            resp.parameters[COMPUTE_PARAM].int64_param = compute_ns
        except Exception:
            stats.fail_count += 1
            stats.fail_ns += time.perf_counter_ns() - t_recv
            raise
        t_end = time.perf_counter_ns()
        stats.success_count += 1
        stats.success_ns += t_end - t_recv
        stats.queue_ns += queue_ns
        stats.input_ns += t_submit - t_recv
        stats.infer_ns += compute_ns
        stats.output_ns += t_end - t_out
        shape = request.inputs[0].shape if request.inputs else ()
        stats.inference_count += shape[0] if model.batched and shape else 1
        stats.last_inference_ms = time.time_ns() // 1_000_000
        return resp

    def _failure(self, exc: Exception) -> tuple[grpc.StatusCode, str]:
        return _status(exc, self.cfg.engine)

    async def ModelInfer(self, request, context):  # noqa: N802
        try:
            return await self._infer(request)
        except Exception as exc:
            await context.abort(*self._failure(exc))

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
        """Bidirectional stream: requests are read as they come and run concurrently (up to the
        instances); each response goes back when ready, tagged with its request's ``id``. A failed
        request gets a response with ``error_message`` ("<STATUS>: <text>") and the stream goes on."""
        answers: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        pending: set[asyncio.Task[None]] = set()

        async def answer(request: pb.ModelInferRequest) -> None:
            try:
                answers.put_nowait(pb.ModelStreamInferResponse(infer_response=await self._infer(request)))
            except Exception as exc:
                code, text = self._failure(exc)
                answers.put_nowait(pb.ModelStreamInferResponse(
                    error_message=f"{code.name}: {text}",
                    infer_response=pb.ModelInferResponse(model_name=request.model_name, id=request.id)))

        async def read_all() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(answer(request))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                if pending:
                    await asyncio.wait(set(pending))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read_all())
        try:
            while (item := await answers.get()) is not None:
                yield item
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()


_V2_CACHE: dict[np.dtype, str] = {}


def _v2(dtype: np.dtype) -> str:
    v = _V2_CACHE.get(dtype)
    if v is None:
        v = _V2_CACHE[dtype] = np_to_v2(dtype)
    return v


def load_model(cfg: ServerConfig) -> _Model:
    """Load ``cfg.instances`` backend sessions (raises ServerError/ModelError on failure)."""
    return _Model(cfg)


async def serve(cfg: ServerConfig, model: _Model, stop: asyncio.Event, on_bound=None) -> None:
    """Serve ``model`` until ``stop`` is set, then stop gracefully (in-flight requests finish).
    ``on_bound(host, port)`` is called once the port accepts connections."""
    server = grpc.aio.server(options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)])
    holder = ModelHolder(model, load_model)  # the dynamic batcher, if any, lives with the model it batches
    try:
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(holder), server)
        if cfg.metrics_port is None:
            await _serve_until(cfg, server, stop, on_bound)
            return
        with metrics_server(cfg.host, cfg.metrics_port, holder.statistics) as metrics_port:
            def bound(host: str, port: int) -> None:
                if on_bound is not None:
                    on_bound(host, port)
                    print(f"{METRICS_PREFIX} http://{host}:{metrics_port}/metrics", flush=True)
            await _serve_until(cfg, server, stop, bound)
    finally:  # a model loaded by RepositoryModelLoad is closed here; the first one also by its owner
        await asyncio.to_thread(holder.release())


async def _serve_until(cfg: ServerConfig, server: grpc.aio.Server, stop: asyncio.Event, on_bound=None) -> None:
    host = cfg.host
    addr = f"[{host}]:{cfg.port}" if ":" in host and not host.startswith("[") else f"{host}:{cfg.port}"
    try:
        port = server.add_insecure_port(addr)
    except RuntimeError as exc:
        raise OSError(f"cannot bind {addr}: {exc}") from exc
    if port == 0:
        raise OSError(f"cannot bind {addr}; is the port in use?")
    await server.start()
    if on_bound is not None:
        on_bound(host, port)
    try:
        await stop.wait()
    finally:
        await server.stop(GRACE_S)


def _print_bound(host: str, port: int) -> None:
    sys.stdout.write(f"{LISTEN_PREFIX} {host}:{port}\n")
    sys.stdout.flush()


def _block(cfg: ServerConfig, model: _Model) -> None:
    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, stop.set)
                signal_stack.deliver_on_thread_stack(sig)  # an OpenVINO model may leave the alternate stack unmapped
            except (RuntimeError, ValueError):  # not the main thread: serve until cancelled
                pass
        await serve(cfg, model, stop, _print_bound)

    try:
        asyncio.run(run())
    finally:
        model.close()


def run_server(cfg: ServerConfig) -> None:
    """Load the model, serve it, print the listening line, and block until SIGTERM/SIGINT.
    Raises ServerError/ModelError when the model does not load, OSError when the port cannot be bound."""
    if not grpc_env.EFFECTIVE:
        print(f"farm server: warning: {grpc_env.LATE_NOTE}", file=sys.stderr, flush=True)
    _block(cfg, load_model(cfg))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workers.engines.server", description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="model file")
    p.add_argument("--format", dest="model_format", default="onnx", choices=list(MODEL_FORMATS))
    p.add_argument("--engine", default="onnxruntime", choices=list(IN_PROCESS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    p.add_argument("--device", default="cpu", help="cpu or gpu:<slug>")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads per instance, 0 = its CPU affinity's cores")
    p.add_argument("--instances", type=int, default=1, help="parallel model instances")
    p.add_argument("--model-name", default=SERVED_MODEL_NAME)
    p.add_argument("--max-queue-delay-us", type=int, default=None, help="dynamic batching delay, µs (default off)")
    p.add_argument("--preferred-batch-size", type=int, default=None, help="dynamic batching: send at this many rows")
    p.add_argument("--metrics-port", type=int, default=None, help="Triton-style /metrics port (default off; 0: free)")
    p.add_argument(
        "--input", action="append", default=[], metavar="NAME:DTYPE:DIMS",
        help="declare an input (TorchScript), e.g. x:FP32:-1x16; repeat per input",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    p = _parser()
    a = p.parse_args(argv)
    try:
        declared = [IOSpec(*parse_input_spec(t)) for t in a.input] or None
    except ValueError as exc:
        p.error(str(exc))
    cfg = ServerConfig(
        model_path=a.model, model_format=a.model_format, engine=a.engine, host=a.host, port=a.port,
        device=a.device, threads=a.threads, instances=a.instances, model_name=a.model_name,
        inputs=declared, max_queue_delay_us=a.max_queue_delay_us, preferred_batch_size=a.preferred_batch_size,
        metrics_port=a.metrics_port,
    )
    try:
        model = load_model(cfg)
    except FarmError as exc:
        print(f"farm-serve: cannot load model: {exc}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:
        print(f"farm-serve: cannot load model: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2

    try:
        _block(cfg, model)
    except OSError as exc:
        print(f"farm-serve: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
