"""How fast do the two CPU LLM engines serve the tiny-llama example, launched by farm?

Method: ``farm example-model --kind tiny-llama`` into a temporary folder; llama.cpp (llama-cpp-python's server)
on the GGUF file and ``transformers serve`` on the Hugging Face folder, each launched by farm's process runner
(``Runner.serve``) on a 1-core lease (the first CPU), so farm's lease wrapper sets their threads and its thread
check runs. One streamed chat completion per engine per round, the engines interleaved (A, B, A, B ...), a
different prompt each time (llama.cpp caches prompt prefixes). Per engine: decode tokens/s (content chunks
after the first, over the time from the first chunk to the last; both servers send one token per chunk here)
and the time to the first chunk, median with the range. Host load moves these figures 2x within minutes:
read the ratio of the two engines within one run, not a single figure across runs.

Run: ``python benchmarks/llm_tiny_engines.py [--quick] [--rounds 6] [--tokens 256]`` (needs ``farm[llm]``).
Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.models.llm_examples import build_tiny_llama  # noqa: E402
from schemas import JobSpec, MeasurementSettings  # noqa: E402
from schemas.engines import SERVED_MODEL_NAME  # noqa: E402
from workers.runners.process import ProcessRunner  # noqa: E402

ENGINES = {"llama.cpp": ("gguf", "llama_cpp"), "transformers": ("hf", "transformers")}


def _spec(engine: str) -> JobSpec:
    return JobSpec(job_id="b" * 32, request_id="bench", model_sha256="0" * 64, model_format=ENGINES[engine][0],
                   inputs=[], device="cpu", engine=engine, batch_size=1, concurrency=1, queue="farm.cpu",
                   measurement=MeasurementSettings())


def stream(url: str, i: int, max_tokens: int) -> tuple[int, float, float]:
    """(content chunks, seconds to the first, decode tokens/s) of one streamed chat completion."""
    body = {"model": SERVED_MODEL_NAME, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": f"request {i}: how fast is server {i * 7}?"}]}
    req = urllib.request.Request(f"http://{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    n, first, last = 0, 0.0, 0.0
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data: ") and b'"content"' in line:
                last = time.perf_counter()
                first = first or last
                n += 1
    return n, first - t0, (n - 1) / (last - first) if n > 1 and last > first else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 64 tokens")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    rounds, tokens = (2, 64) if args.quick else (args.rounds, args.tokens)
    missing = [m for _, m in ENGINES.values() if importlib.util.find_spec(m) is None]
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (pip install 'farm[llm]')")
        return 0
    core = min(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="farm-bench-llm-") as tmp, ExitStack() as stack:
        os.environ.setdefault("FARM_HOME", str(Path(tmp) / "home"))
        os.environ.setdefault("FARM_LLAMA_SERVER", "off")  # llama-cpp-python's (llama-server: llama_server.py)
        model = build_tiny_llama(Path(tmp) / "m")
        paths = {"llama.cpp": model.gguf, "transformers": model.hf}
        urls = {e: stack.enter_context(ProcessRunner().serve(_spec(e), paths[e], cpus={core})).url for e in ENGINES}
        for url in urls.values():
            stream(url, 0, 8)  # warm-up
        rows: dict[str, list[tuple[int, float, float]]] = {e: [] for e in ENGINES}
        for r in range(rounds):
            for engine, url in urls.items():
                rows[engine].append(stream(url, r + 1, tokens))
    print(f"tiny-llama, 1-core lease (cpu {core}), {rounds} rounds x {tokens} tokens, engines interleaved; "
          f"load average {os.getloadavg()[0]:.1f}")
    for engine, got in rows.items():
        tps, ttft = [g[2] for g in got], [g[1] * 1000 for g in got]
        print(f"  {engine:13s} tokens/request {got[0][0]:4d}  decode tokens/s median {statistics.median(tps):6.0f} "
              f"(range {min(tps):.0f}-{max(tps):.0f})  TTFT median {statistics.median(ttft):6.1f} ms "
              f"(range {min(ttft):.1f}-{max(ttft):.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
