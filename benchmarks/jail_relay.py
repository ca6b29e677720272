"""What does the jail's relay cost an LLM stream? A jailed server (``workers.serving.jail``: its own network
namespace, reached through ``workers.serving.relay``) against the same server unjailed, on the process runner.

Method: the fake OpenAI server (``tests/fake_openai.py``: a known 20 ms TTFT and a token every 5 ms, one token a
chunk, its own log of when it sent each token) is launched like an LLM engine (``workers.serving.lease_exec``
picks its port) through ``ProcessRunner.place``, once with the launch's default sandbox (jailed, relayed) and
once with ``sandbox="none"`` (unjailed), in interleaved rounds (A, B, B, A, ...), a fresh server each run, on the
last CPU; farm's OpenAI client drives it closed loop from the other CPUs. Per run: TTFT p50 and ITL p50/p99 as
farm measured them, and the relay's own CPU time (its process's, from ``/proc``) per token. The table gives, per
concurrency, the median over rounds of the jailed - unjailed difference (ms) with its range, and the relay's CPU
per token (us).

Target: the relay adds well under 1 % of a token's time (50 us at a 5 ms ITL).

Run: ``python benchmarks/jail_relay.py [--quick] [--rounds 6] [--concurrency 1,16] [--seconds 4]``. Prints
figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import psutil
from _serve import ROOT, pin  # noqa: I001 (sets sys.path)

from farm.sandbox import jail_unavailable
from schemas import JobSpec, MeasurementSettings
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.runners.process import ProcessRunner
from workers.serving.base import Launch
from workers.serving.lease_exec import LISTEN_LINE, PORT
from workers.serving.llm import wait_openai_ready

TTFT_MS, ITL_MS, OUT = 20.0, 5.0, 32


def _launch(sandbox: str) -> Launch:
    argv = [sys.executable, "-m", "workers.serving.lease_exec", "--bind", "127.0.0.1", "--", sys.executable, "-m",
            "tests.fake_openai", "--port", PORT, "--model", "model", "--ttft-ms", str(TTFT_MS), "--itl-ms",
            str(ITL_MS)]
    return replace(Launch(argv=argv, port=0, model=str(Path(__file__)), listen_prefix=LISTEN_LINE,
                          ready=wait_openai_ready), sandbox=sandbox)  # type: ignore[arg-type]


def _spec() -> JobSpec:
    return JobSpec(job_id="b" * 32, request_id="r", model_sha256="0" * 64, model_format="gguf", inputs=[],
                   device="cpu", engine="llama.cpp", batch_size=1, concurrency=1, queue="farm.cpu",
                   measurement=MeasurementSettings(llm={"api": "openai-chat"}))


def _relay_cpu_s(pid: int) -> float:
    """CPU time (s) of the relay processes in the server's tree."""
    total = 0.0
    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            if "workers.serving.relay" in p.cmdline() and p.name() != "bwrap":
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def one(sandbox: str, concurrency: int, seconds: float, server_cpu: int) -> dict[str, float]:
    settings = MeasurementSettings(duration_s=seconds, warmup_s=1.0, window_s=seconds,
                                   llm={"api": "openai-chat", "input_tokens": 16, "output_tokens": OUT})
    with ProcessRunner().place(_spec(), _launch(sandbox), {server_cpu}) as target:
        assert target.pid is not None
        cpu0 = _relay_cpu_s(target.pid)
        r = run_load(LoadTarget(target.url, target.model_name), LoadSpec.from_settings([], 1, concurrency, settings))
        cpu = _relay_cpu_s(target.pid) - cpu0
    m = r.metrics
    tokens = float(m["output_tokens_per_s"] or 0) * float(m["duration_s"] or seconds)
    return {"ttft": float(m["ttft_p50_ms"] or 0), "itl50": float(m["itl_p50_ms"] or 0),
            "itl99": float(m["itl_p99_ms"] or 0), "relay_us_per_token": 1e6 * cpu / max(tokens, 1.0)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI: 2 rounds at concurrency 1, 2 s each")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--seconds", type=float, default=4.0)
    a = p.parse_args()
    if jail_unavailable() is not None:
        print(f"no jail on this host ({jail_unavailable()}): nothing measured")
        return 0
    rounds, levels, seconds = (2, [1], 2.0) if a.quick else (a.rounds, [int(c) for c in a.concurrency.split(",")],
                                                             a.seconds)
    os.environ["PYTHONPATH"] = str(ROOT)  # the server (tests.fake_openai) imports from this checkout, jailed or not
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[-1]
    pin(set(cpus[:-1]) or set(cpus))
    print(f"fake server (TTFT {TTFT_MS:g} ms, a token every {ITL_MS:g} ms, {OUT} tokens) on CPU {server_cpu}, client "
          f"on {cpus[:-1] or cpus}; {seconds:g} s per run, {rounds} rounds; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    got: dict[tuple[str, int], list[dict[str, float]]] = {}
    for r in range(rounds):
        for c in levels:
            for sandbox in (("server", "none") if (r + c) % 2 == 0 else ("none", "server")):
                fig = one(sandbox, c, seconds, server_cpu)
                got.setdefault((sandbox, c), []).append(fig)
                print(f"  round {r + 1} c={c:<3} {'jailed' if sandbox == 'server' else 'unjailed':<8} TTFT p50 "
                      f"{fig['ttft']:7.2f} ms  ITL p50 {fig['itl50']:6.3f} p99 {fig['itl99']:6.3f} ms"
                      + (f"  relay {fig['relay_us_per_token']:.1f} us/token" if sandbox == "server" else ""),
                      flush=True)
    print("\nc    | TTFT p50: jailed - unjailed, ms | ITL p50, ms | ITL p99, ms | relay CPU us/token")
    for c in levels:
        pairs = list(zip(got[("server", c)], got[("none", c)], strict=True))

        def cell(key: str, pairs: list[tuple[dict[str, float], dict[str, float]]] = pairs) -> str:
            d = [j[key] - u[key] for j, u in pairs]
            return f"{statistics.median(d):+.3f} ({min(d):+.3f}, {max(d):+.3f})"

        relay = [j["relay_us_per_token"] for j, _ in pairs]
        print(f"{c:<4} | {cell('ttft'):>31} | {cell('itl50'):>11} | {cell('itl99'):>11} | "
              f"{statistics.median(relay):.1f} ({min(relay):.1f}-{max(relay):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
