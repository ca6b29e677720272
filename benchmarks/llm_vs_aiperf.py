"""farm's OpenAI streaming client against AIPerf on a real server (issue 29 point 7): llama-cpp-python's server
on the tiny-llama GGUF (one thread, pinned to the last CPU), the same workload (synthetic prompts of N tokens from
the model's own tokenizer, M output tokens, closed loop at concurrency c), farm and AIPerf interleaved round by
round (llama.cpp's speed drifts 20-30 % within a minute). Prints, per concurrency, the medians over rounds of
output tokens/s and TTFT p50 for each tool and their ratio farm / AIPerf (target: within 5 %).

AIPerf (`pip install aiperf`, ~6 min) lives in a venv of its own: ``--aiperf PATH`` or ``$AIPERF``, default
``~/.cache/farm/aiperf-venv/bin/aiperf``. Without it the benchmark says so and measures nothing (exit 0).

    python benchmarks/llm_vs_aiperf.py [--quick] [--rounds 3] [--concurrency 1,4,16] [--seconds 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.models.llm_examples import build_tiny_llama  # noqa: E402
from schemas import MeasurementSettings  # noqa: E402
from schemas.engines import SERVED_MODEL_NAME  # noqa: E402
from schemas.llm import LlmSettings  # noqa: E402
from tests.llm_servers import llama_cpp_server  # noqa: E402
from workers.loadgen.clients import run_load  # noqa: E402
from workers.samplers.calibrate import calibrate  # noqa: E402

DEFAULT_AIPERF = Path.home() / ".cache/farm/aiperf-venv/bin/aiperf"
IN_TOKENS, OUT_TOKENS = 32, 64


def hostport(url: str) -> str:
    """``127.0.0.1:PORT`` of a base URL ``http://127.0.0.1:PORT/v1``."""
    return url.split("://", 1)[-1].removesuffix("/v1")


def farm_run(url: str, hf: Path, concurrency: int, seconds: float) -> tuple[float, float]:
    """(output tokens/s, TTFT p50 ms) of farm's OpenAI client, closed loop."""
    llm = LlmSettings(input_tokens=IN_TOKENS, output_tokens=OUT_TOKENS, tokenizer=str(hf))
    settings = MeasurementSettings(client="openai", llm=llm, duration_s=seconds, warmup_s=1.0)
    res = run_load(hostport(url), SERVED_MODEL_NAME, [], 1, concurrency, settings)
    return float(res.metrics["output_tokens_per_s"]), float(res.metrics["ttft_p50_ms"])


def aiperf_run(aiperf: Path, url: str, hf: Path, concurrency: int, seconds: float, out: Path) -> tuple[float, float]:
    """(output tokens/s, TTFT p50 ms) of AIPerf on the same workload (max_tokens sent too: llama.cpp ignores
    max_completion_tokens)."""
    cmd = [str(aiperf), "profile", "-m", SERVED_MODEL_NAME, "--url", hostport(url), "--endpoint-type",
           "chat", "--streaming", "--tokenizer", str(hf), "--synthetic-input-tokens-mean", str(IN_TOKENS),
           "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(OUT_TOKENS),
           "--output-tokens-stddev", "0", "--extra-inputs", f"max_tokens:{OUT_TOKENS}", "--concurrency",
           str(concurrency), "--benchmark-duration", str(seconds), "--warmup-request-count", str(concurrency),
           "--random-seed", "7", "--artifact-dir", str(out), "--ui-type", "none"]
    # no HF_HUB_OFFLINE: in offline mode AIPerf looks a tokenizer up in the hub cache only, never at a local folder
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not found:
        raise RuntimeError(f"aiperf exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    data = json.loads(found[-1].read_text())
    return float(data["output_token_throughput"]["avg"]), float(data["time_to_first_token"]["p50"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round, concurrency 1 and 4, 4 s each")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--aiperf", type=Path, default=Path(os.environ.get("AIPERF") or DEFAULT_AIPERF))
    a = p.parse_args()
    if not a.aiperf.is_file():
        print(f"AIPerf not found at {a.aiperf} (python3 -m venv ~/.cache/farm/aiperf-venv && "
              "~/.cache/farm/aiperf-venv/bin/pip install aiperf): nothing measured")
        return 0
    rounds, levels, seconds = (1, [1, 4], 4.0) if a.quick else (a.rounds, [int(c) for c in a.concurrency.split(",")],
                                                                a.seconds)
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="farm-vs-aiperf-") as tmp:
        tiny = build_tiny_llama(Path(tmp) / "model")
        os.sched_setaffinity(0, {cpus[-1]})  # the server inherits the last CPU; the clients get the others
        with llama_cpp_server(tiny.gguf) as url:
            os.sched_setaffinity(0, set(cpus[:-1]) or set(cpus))
            print(f"llama.cpp on CPU {cpus[-1]}, clients on {cpus[:-1] or cpus}; {IN_TOKENS} tokens in, {OUT_TOKENS} "
                  f"out; {seconds:g} s per run, {rounds} round(s)")
            got: dict[tuple[str, int], list[tuple[float, float]]] = {}
            for r in range(rounds):
                for c in levels:
                    order = ("farm", "aiperf") if (r + c) % 2 == 0 else ("aiperf", "farm")
                    for tool in order:
                        run = (farm_run(url, tiny.hf, c, seconds) if tool == "farm" else
                               aiperf_run(a.aiperf, url, tiny.hf, c, seconds, Path(tmp) / f"ai-{r}-{c}"))
                        got.setdefault((tool, c), []).append(run)
                print(f"round {r + 1}: host yardstick {calibrate(cpus).speed:.1f} passes/s (server and client CPUs)")
    print(f"{'conc':>5} {'farm tok/s':>11} {'aiperf tok/s':>13} {'ratio':>6} {'farm ttft50':>12} "
          f"{'aiperf ttft50':>14} {'ratio':>6}")
    for c in levels:
        f_tok, f_ttft = (statistics.median(v[i] for v in got[("farm", c)]) for i in (0, 1))
        a_tok, a_ttft = (statistics.median(v[i] for v in got[("aiperf", c)]) for i in (0, 1))
        print(f"{c:>5} {f_tok:>11.1f} {a_tok:>13.1f} {f_tok / a_tok:>6.3f} {f_ttft:>12.2f} {a_ttft:>14.2f} "
              f"{f_ttft / a_ttft:>6.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
