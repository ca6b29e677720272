"""The vLLM part of ``benchmarks/real_traffic.py`` (its docstring): one vLLM CPU server, farm's random workload
beside ``vllm bench serve``'s, and the trace, by the server's own counters."""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from real_traffic import (
    PLAN,
    SCALE,
    counters,
    delta,
    event_times,
    farm_rows,
    implied_pct,
    implied_timed_pct,
    server,
    trace_args,
)
from vllm_cpu import BENCH, vllm_python

from workers.serving.lease_exec import free_port

IN_TOKENS, OUT_TOKENS = 128, 16
LEVELS = (1, 4)
PROMPTS = 24  # vllm bench serve's requests per run
DURATION_S = 6.0  # farm's measured seconds per run


def _figures(label: str, before: dict[str, float], after: dict[str, float], own: str) -> str:
    """A table row of the server's counter deltas over one client run."""
    n = delta(before, after, "vllm:request_success_total")
    tokens = delta(before, after, "vllm:prompt_tokens_total")
    hits, queries = (delta(before, after, f"vllm:prefix_cache_{k}_total") for k in ("hits", "queries"))
    per = f"{tokens / n:.1f}" if n else "n/a"
    rate = f"{100.0 * hits / queries:.2f}" if queries else "n/a"
    return f"| {label} | {n:.0f} | {per} | {own} | {rate} ({hits:.0f} of {queries:.0f}) |"


def _bench(python: str, root: str, model: Path, c: int, out: Path) -> dict[str, Any]:
    """``vllm bench serve``'s saved result at concurrency ``c`` (SystemExit, with its output's tail, on failure)."""
    name = f"bench-{c}-{time.monotonic_ns()}.json"
    argv = [python, "-c", BENCH, "--backend", "openai", "--base-url", root, "--endpoint", "/v1/completions",
            "--model", "model", "--tokenizer", str(model), "--dataset-name", "random",
            "--random-input-len", str(IN_TOKENS), "--random-output-len", str(OUT_TOKENS),
            "--num-prompts", str(PROMPTS), "--max-concurrency", str(c), "--ignore-eos", "--seed",
            str(int(time.time())), "--save-result", "--result-dir", str(out), "--result-filename", name]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed: {(done.stdout + done.stderr).strip()[-1500:]}")
    got: dict[str, Any] = json.loads((out / name).read_text())
    return got


def _random(python: str, work: Path, root: str, model: Path) -> list[str]:
    lines = []
    for c in LEVELS:
        before = counters(root)
        (row,) = farm_rows(work / "home", "--endpoint", root, "--api", "openai-completions", "--model-name", "model",
                           "--concurrency", str(c), "--input-tokens", str(IN_TOKENS), "--output-tokens",
                           str(OUT_TOKENS), "--duration", str(DURATION_S), "--warmup", "1")
        lines.append(_figures(f"farm c={c}", before, counters(root),
                              f"{row.get('mean_input_tokens') or float('nan'):.1f} (usage)"))
        before = counters(root)
        res = _bench(python, root, model, c, work)
        own = f"{res['total_input_tokens'] / max(1, res['completed']):.1f} (its tokenizer)"
        lines.append(_figures(f"vllm bench serve c={c}", before, counters(root), own))
    return lines


def _trace(work: Path, root: str, speed: float) -> list[str]:
    """The trace part's replays (``PLAN``) on vLLM: its cold is a real reset (``POST /reset_prefix_cache``)."""
    lines = []
    for label, which, state, implied in PLAN:
        path = work / ("trace.jsonl" if which == "shared" else "unshared.jsonl")
        if not path.is_file():
            continue
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        want = implied if implied is not None else implied_pct(rows)
        before = counters(root)
        (row,) = farm_rows(work / "home", "--endpoint", root, "--api", "openai-completions", "--model-name", "model",
                           *trace_args(path, speed), "--prefix-cache", state)
        timed = implied_timed_pct(rows, *event_times(work / "home", str(row["job_id"]), len(rows))) \
            if implied is None else want  # warm: every block was put in the cache before the replay
        lines.append(_figures(f"farm: {label} (trace-tokens {SCALE:g}; implied {want:.1f} %, {timed:.1f} % given "
                              "when each prefill ended)", before, counters(root),
                              f"{row.get('mean_input_tokens') or float('nan'):.1f} (usage)"))
    return lines


def vllm_part(work: Path, model: Path, speed: float = 2.0) -> None:
    """Prints the vLLM part's table, or why it was skipped."""
    python = vllm_python()
    if python is None:
        print("vLLM part skipped: no vLLM CPU environment (FARM_VLLM_PYTHON, or run scripts/vllm_cpu_env)")
        return
    port = free_port("127.0.0.1")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}"}
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            "model", "--port", str(port), "--block-size", "32", "--enable-prefix-caching",
            "--disable-uvicorn-access-log", "--optimization-level", "0"]
    t0 = time.monotonic()
    with server(argv, port, work / "vllm.log", env) as root:
        print(f"vLLM CPU ready in {time.monotonic() - t0:.0f} s (prefix caching on, block 32, -O0)")
        lines = _random(python, work, root, model) + _trace(work, root, speed)
    print(f"random {IN_TOKENS} in / {OUT_TOKENS} out, completions; the server's counters over each client's run")
    print("| client | requests (server) | prompt tokens a request (server) | the client's own count | "
          "prefix-cache hit % (server) |")
    print("| --- | --- | --- | --- | --- |")
    for line in lines:
        print(line)
