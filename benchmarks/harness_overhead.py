"""How much does the load generator itself cost? farm's generator vs other gRPC clients, same server.

An identity ONNX model (input FP32 [1, 16]) served by farm's built-in server; the client runs pinned to
half of the CPUs, the server to the other half. For concurrency 1 and 16, each client runs a closed
loop for the same time; printed: end-to-end p50 latency and achieved requests/s.

Clients, each over unary ModelInfer calls and over ModelStreamInfer streams (one stream per outstanding
request): farm (``workers.loadgen.clients.run_load``: grpc.aio, request serialized once, ``rpc`` unary or
stream), ``tritonclient.grpc`` sync client (one client and thread per outstanding request; streams via
``start_stream``/``async_stream_infer``), ``tritonclient.grpc.aio`` (one client, N coroutines; streams
via ``stream_infer``), and a bare ``grpc.aio`` generated stub (request object, serialized per call).
"vs tritonclient" divides by the better of the two tritonclient clients over unary calls (what the
issue's target names); "same RPC" by the better tritonclient client over the row's own RPC.

Clients run in interleaved rounds (3, quick: 1); each figure is the median over the rounds.

Run: ``python benchmarks/harness_overhead.py [--quick]``. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import queue
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import numpy as np
from _serve import Steal, farm_server, identity_model, pin, split_cpus, steal_flag  # noqa: I001 (sets sys.path)

from schemas import MeasurementSettings, TensorSpec
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.stats import percentile

SHAPE = (16,)


Figures = tuple[float, float, float]  # (p50 ms, requests/s, client CPU us per request)


class CpuWindow:
    """Process CPU seconds spent between two monotonic times (sampled by a helper thread)."""

    def __init__(self, t_from: float, t_to: float) -> None:
        self.cpu = float("nan")
        self._thread = threading.Thread(target=self._run, args=(t_from, t_to), daemon=True)
        self._thread.start()

    def _run(self, t_from: float, t_to: float) -> None:
        time.sleep(max(0.0, t_from - time.monotonic()))
        c0 = time.process_time()
        time.sleep(max(0.0, t_to - time.monotonic()))
        self.cpu = time.process_time() - c0

    def join(self) -> float:
        self._thread.join()
        return self.cpu


def _summarize(records: list[tuple[float, float]], t_from: float, t_to: float, cpu_s: float) -> Figures:
    """Figures of (done time, latency s) records completed within [t_from, t_to)."""
    lat = [lat for done, lat in records if t_from <= done < t_to]
    n = max(len(lat), 1)
    return (percentile(np.array(lat) * 1e3, 50) or float("nan")), len(lat) / (t_to - t_from), cpu_s / n * 1e6


def bench_threads(make_call: Callable[[], Callable[[], object]], conc: int, warmup: float,
                  duration: float) -> Figures:
    """Closed loop with one thread (and one client from ``make_call``) per outstanding request."""
    calls = [make_call() for _ in range(conc)]
    records: list[tuple[float, float]] = []
    lock = threading.Lock()
    t0 = time.monotonic() + 0.1
    end = t0 + warmup + duration
    cpu = CpuWindow(t0 + warmup, end)

    def loop(call: Callable[[], object]) -> None:
        mine: list[tuple[float, float]] = []
        while time.monotonic() < t0:
            time.sleep(0.001)
        while True:
            a = time.monotonic()
            call()
            b = time.monotonic()
            mine.append((b, b - a))
            if b >= end:
                break
        with lock:
            records.extend(mine)

    threads = [threading.Thread(target=loop, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return _summarize(records, t0 + warmup, end, cpu.join())


async def bench_coroutines(calls: list[Callable[[], Awaitable[object]]], warmup: float,
                           duration: float) -> Figures:
    """Closed loop with one coroutine per entry of ``calls`` (the outstanding requests), each making
    its own call over and over."""
    records: list[tuple[float, float]] = []
    t0 = time.monotonic()
    end = t0 + warmup + duration
    cpu = CpuWindow(t0 + warmup, end)

    async def loop(call: Callable[[], Awaitable[object]]) -> None:
        while True:
            a = time.monotonic()
            await call()
            b = time.monotonic()
            records.append((b, b - a))
            if b >= end:
                return

    await asyncio.gather(*(loop(call) for call in calls))
    return _summarize(records, t0 + warmup, end, cpu.join())


def client_farm(url: str, conc: int, warmup: float, duration: float, rpc: str = "unary") -> Figures:
    settings = MeasurementSettings(client="farm", warmup_s=warmup, window_s=min(1.0, duration), duration_s=duration,
                                   rpc=rpc)  # farm's own generator is what this benchmark weighs
    r = run_load(LoadTarget(url, "model"),
                 LoadSpec.from_settings([TensorSpec(name="x", shape=SHAPE)], 1, conc, settings), processes=1)
    m = r.metrics
    busy, rps = float(m["client_busy_pct"]), float(m["requests_per_s"])  # type: ignore[arg-type]
    cpu_us = busy / 100 / rps * 1e6  # CPU share of wall time / requests per wall second
    return float(m["latency_p50_ms"]), rps, cpu_us  # type: ignore[arg-type]


def triton_input() -> object:
    """tritonclient's InferInput ``x``: FP32 [1, *SHAPE] of fixed random data."""
    import tritonclient.grpc as tg

    inp = tg.InferInput("x", [1, *SHAPE], "FP32")
    inp.set_data_from_numpy(np.random.default_rng(0).random((1, *SHAPE), dtype=np.float32))
    return inp


def client_triton_sync(url: str, conc: int, warmup: float, duration: float) -> Figures:
    import tritonclient.grpc as tg

    def make() -> Callable[[], object]:
        client = tg.InferenceServerClient(url)
        inp = triton_input()
        return lambda: client.infer("model", [inp])

    return bench_threads(make, conc, warmup, duration)


def client_triton_aio(url: str, conc: int, warmup: float, duration: float) -> Figures:
    import tritonclient.grpc.aio as tga

    async def main() -> Figures:
        client = tga.InferenceServerClient(url)
        inp = triton_input()
        try:
            return await bench_coroutines([lambda: client.infer("model", [inp])] * conc, warmup, duration)
        finally:
            await client.close()

    return asyncio.run(main())


def client_farm_stream(url: str, conc: int, warmup: float, duration: float) -> Figures:
    return client_farm(url, conc, warmup, duration, rpc="stream")


def client_triton_sync_stream(url: str, conc: int, warmup: float, duration: float) -> Figures:
    import tritonclient.grpc as tg

    clients: list[tg.InferenceServerClient] = []

    def make() -> Callable[[], object]:
        client = tg.InferenceServerClient(url)
        answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        clients.append(client)
        inp = triton_input()

        def call() -> object:
            client.async_stream_infer("model", [inp])
            answer = answers.get()
            if isinstance(answer, Exception):
                raise answer
            return answer

        return call

    try:
        return bench_threads(make, conc, warmup, duration)
    finally:
        for client in clients:
            client.stop_stream()
            client.close()


def client_triton_aio_stream(url: str, conc: int, warmup: float, duration: float) -> Figures:
    import tritonclient.grpc.aio as tga

    async def main() -> Figures:
        client = tga.InferenceServerClient(url)
        inp = triton_input()
        streams = []

        def open_stream() -> Callable[[], Awaitable[object]]:
            """One ``stream_infer`` stream, fed one request per call; the call returns its answer."""
            requests: asyncio.Queue[dict[str, object]] = asyncio.Queue()

            async def feed() -> AsyncIterator[dict[str, object]]:
                while True:
                    yield await requests.get()

            answers = client.stream_infer(feed())
            streams.append(answers)

            async def call() -> object:
                await requests.put({"model_name": "model", "inputs": [inp]})
                result, error = await answers.__anext__()
                if error is not None:
                    raise error
                return result

            return call

        try:
            return await bench_coroutines([open_stream() for _ in range(conc)], warmup, duration)
        finally:
            for answers in streams:
                answers.cancel()
            await client.close()

    return asyncio.run(main())


def client_bare_aio(url: str, conc: int, warmup: float, duration: float) -> Figures:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    from workers.loadgen.kserve.request import build_request

    req = build_request("model", [TensorSpec(name="x", shape=SHAPE)], 1)

    async def main() -> Figures:
        async with grpc.aio.insecure_channel(url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            await stub.ServerReady(pb.ServerReadyRequest())
            return await bench_coroutines([lambda: stub.ModelInfer(req)] * conc, warmup, duration)

    return asyncio.run(main())


Client = Callable[[str, int, float, float], Figures]
# name -> (RPC, client); the tritonclient rows are the baselines
CLIENTS: dict[str, tuple[str, Client]] = {
    "farm loadgen": ("unary", client_farm),
    "farm loadgen --rpc stream": ("stream", client_farm_stream),
    "tritonclient.grpc (threads)": ("unary", client_triton_sync),
    "tritonclient.grpc.aio": ("unary", client_triton_aio),
    "tritonclient.grpc stream": ("stream", client_triton_sync_stream),
    "tritonclient.grpc.aio stream": ("stream", client_triton_aio_stream),
    "bare grpc.aio stub": ("unary", client_bare_aio),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short runs for a CI smoke test")
    ap.add_argument("--server-threads", type=int, default=1)
    args = ap.parse_args()
    warmup, duration, rounds = (0.3, 1.0, 1) if args.quick else (1.0, 4.0, 3)
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    print(f"client CPUs {sorted(client_cpus or [])}, server CPUs {sorted(server_cpus or [])}; "
          f"warm-up {warmup} s, measure {duration} s per client and round")
    with tempfile.TemporaryDirectory() as tmp:
        model = identity_model(Path(tmp) / "identity.onnx", SHAPE)
        with farm_server(model, threads=args.server_threads, cpu_set=server_cpus) as url:
            for conc in (1, 16):
                runs: dict[str, list[Figures]] = {name: [] for name in CLIENTS}
                with Steal() as steal:
                    for _ in range(rounds):  # interleaved rounds, so machine noise hits every client alike
                        for name, (_, fn) in CLIENTS.items():
                            runs[name].append(fn(url, conc, warmup, duration))
                rows = {name: tuple(float(np.median(col)) for col in zip(*r, strict=True)) for name, r in runs.items()}
                base = {rpc: max(rows[n][1] for n, (r, _) in CLIENTS.items() if r == rpc and "tritonclient" in n)
                        for rpc in ("unary", "stream")}
                print(f"\nconcurrency {conc} (median of {rounds} round(s); the hypervisor took {steal.pct:.1f} % "
                      "of the CPU time meanwhile)"
                      + steal_flag(steal.pct))
                print(f"  {'client':30s} {'p50 ms':>8s} {'req/s':>9s} {'vs tritonclient':>16s} {'same RPC':>9s} "
                      f"{'client CPU us/req':>18s} {'1-core capacity req/s':>22s}")
                for name, (p50, rps, cpu_us) in rows.items():
                    same = rps / base[CLIENTS[name][0]]
                    print(f"  {name:30s} {p50:8.3f} {rps:9.0f} {rps / base['unary']:15.2f}x {same:8.2f}x "
                          f"{cpu_us:18.1f} {1e6 / cpu_us:22.0f}")


if __name__ == "__main__":
    main()
