"""Does farm's API hold a shared farm's load: 50 submitters and 200 status pollers at once, for a minute, without
an error, and how long does a call take at the 99th percentile?

Method: a real ``farm server`` process (uvicorn, one process) on a throw-away Postgres database and Redis db; 50
identities each submit in a loop (stream the model upload, then the idempotent submit with a new client id: two
calls per request, back to back), while 200 pollers each call every POLL_S (1 s, as ``farm submit --wait``
polls) ``GET /api/v1/requests/{id}`` (a request's status with every job) or ``GET /api/v1/requests`` (the
list). All clients are asyncio tasks of this process (httpx, one connection each), on loopback. Every answer
that is not a success, and every transport error, counts as an error.

Target: 0 errors; the p99 of each call kind is reported (no target: it depends on the host, measured here on a
2-core VM shared with the test suite; the server and the 250 clients share those cores).

Run: python benchmarks/api_load.py [--quick] [--submitters 50] [--pollers 200] [--seconds 60]
Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx
from _scale_common import scratch_cluster

REPO = Path(__file__).resolve().parent.parent


#: a poller's wait between two calls, s (`farm submit --wait` polls every 1-2 s)
POLL_S = 1.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tally:
    """Latencies (s) by call kind, and the errors."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)
        self.errors: list[str] = []

    async def timed(self, kind: str, call: object) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            res: httpx.Response = await call  # type: ignore[misc]
        except httpx.HTTPError as exc:
            self.errors.append(f"{kind}: {type(exc).__name__}")
            return None
        self.times[kind].append(time.perf_counter() - started)
        if not res.is_success:
            self.errors.append(f"{kind}: HTTP {res.status_code} {res.text[:120]}")
            return None
        return res


async def submitter(url: str, token: str, model: bytes, until: float, tally: Tally, ids: list[str]) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url + "/api/v1", headers=auth, timeout=120) as http:
        while time.monotonic() < until:
            up = await tally.timed("upload", http.put("/uploads/mlp.onnx", content=model))
            if up is None:
                continue
            body = {"client_id": str(uuid.uuid4()), "model_upload": up.json()["upload"],
                    "request": {"model": "mlp.onnx", "batch_sizes": [1], "concurrency": [1]}}
            res = await tally.timed("submit", http.post("/requests", json=body))
            if res is not None:
                ids.append(res.json()["request_id"])


async def poller(url: str, token: str, until: float, tally: Tally, ids: list[str], n: int) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url + "/api/v1", headers=auth, timeout=120) as http:
        i = n
        await asyncio.sleep(POLL_S * n / 200)  # spread the pollers over one interval
        while time.monotonic() < until:
            i += 1
            if ids and i % 4:
                await tally.timed("status", http.get(f"/requests/{ids[i % len(ids)]}"))
            else:
                await tally.timed("list", http.get("/requests", params={"limit": 20}))
            await asyncio.sleep(POLL_S)


async def load(url: str, tokens: list[str], model: bytes, submitters: int, pollers: int, seconds: float) -> Tally:
    tally, ids = Tally(), []  # type: ignore[var-annotated]
    until = time.monotonic() + seconds
    tasks = [submitter(url, tokens[i], model, until, tally, ids) for i in range(submitters)]
    tasks += [poller(url, tokens[i % len(tokens)], until, tally, ids, i) for i in range(pollers)]
    await asyncio.gather(*tasks)
    return tally


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 s instead of a minute (CI's smoke run)")
    ap.add_argument("--submitters", type=int, default=50)
    ap.add_argument("--pollers", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--workers", type=int, default=2, help="farm server --workers (processes)")
    args = ap.parse_args()
    seconds = args.seconds or (20.0 if args.quick else 60.0)
    from farm.db.session import session_scope
    from farm.identity import create_token
    from farm.models.examples import build_example

    with scratch_cluster() as env, tempfile.TemporaryDirectory() as tmp:
        model = build_example("mlp", Path(tmp) / "mlp.onnx").read_bytes()
        with session_scope() as s:
            tokens = [create_token(s, f"user{i}") for i in range(args.submitters)]
        port = free_port()
        log = Path(os.environ.get("FARM_BENCH_LOG") or Path(tmp) / "server.log")
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "farm", "server", "--port", str(port), "--loglevel", "WARNING", "--workers",
                str(args.workers)]
        server = subprocess.Popen(argv, env={**os.environ, **env, "PYTHONPATH": path}, cwd=REPO, stdout=log.open("wb"),
                                  stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"farm server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            print(f"api_load: {args.submitters} submitters + {args.pollers} pollers for {seconds:g} s against "
                  f"{url} ({args.workers} uvicorn process(es), Postgres), {os.cpu_count()} CPUs, load average "
                  f"{os.getloadavg()[0]:.1f} at start")
            started = time.monotonic()
            tally = asyncio.run(load(url, tokens, model, args.submitters, args.pollers, seconds))
            took = time.monotonic() - started
        finally:
            server.terminate()
            server.wait(30)
    calls = sum(len(v) for v in tally.times.values())
    print(f"{calls} calls in {took:.1f} s ({calls / took:.0f}/s); errors: {len(tally.errors)}"
          + (f" (first: {tally.errors[0]})" if tally.errors else "") + ("  ok" if not tally.errors else "  MISS"))
    print(f"{'call':8} {'n':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    every: list[float] = []
    for kind in ("upload", "submit", "status", "list"):
        values = tally.times.get(kind, [])
        every += values
        if values:
            print(f"{kind:8} {len(values):7d} {statistics.median(values) * 1000:8.1f} {pct(values, 0.99):8.1f} "
                  f"{max(values) * 1000:8.1f}")
    if every:
        print(f"{'all':8} {len(every):7d} {statistics.median(every) * 1000:8.1f} {pct(every, 0.99):8.1f} "
              f"{max(every) * 1000:8.1f}   <- p99 API latency")


if __name__ == "__main__":
    main()
