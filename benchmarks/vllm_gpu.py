"""vLLM on a GPU, launched by farm: TTFT, ITL, output tokens/s and the GPU's own figures (NVML: memory peak of
the server process, utilization, power) for the tiny-llama example, one farm LLM job per concurrency.

Method: ``farm example-model --kind tiny-llama`` into a temporary folder (nothing downloaded: random weights,
a tokenizer trained from text shipped with farm), then ``farm submit <folder>/tiny-llama-hf --engine vllm
--device gpu:<slug of the first GPU>`` embedded, on the process runner, in a fresh ``FARM_HOME``: farm starts
``vllm.entrypoints.openai.api_server`` on that GPU (bound by ``CUDA_VISIBLE_DEVICES``, its index in PCI bus
order), waits for a one-token completion, drives it with its OpenAI streaming client (closed loop, synthetic
prompts of ``--input-tokens``, ``--output-tokens`` each), samples the GPU through NVML, and stores one row per
concurrency; this prints them. The tiny model measures vLLM's and farm's own per-request cost, not a GPU's
arithmetic: read tokens/s as a floor of the serving path.

Needs: an NVIDIA GPU and driver, and vLLM in this Python, offline. On a GPU host, once, where pip can reach
its index (or a wheel mirror)::

    python3.11 -m venv /opt/vllm && /opt/vllm/bin/pip install -e ".[gpu]" "gguf==0.19.0"
    /opt/vllm/bin/python benchmarks/vllm_gpu.py            # a few minutes: vLLM compiles and captures graphs

Where vLLM or a GPU is missing it says which and exits 0 (CI runs every benchmark with ``--quick``).
Run: ``python benchmarks/vllm_gpu.py [--quick] [--concurrency 1,8,32] [--json OUT.json]``.
Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workers.hardware import detect_gpus  # noqa: E402
from workers.serving.vllm import INSTALL, VLLM_PIN  # noqa: E402

#: the row's figures printed, in order (name, header, scale)
COLUMNS = (("concurrency", "c", 1), ("ttft_p50_ms", "TTFT p50 ms", 1), ("ttft_p99_ms", "TTFT p99 ms", 1),
           ("itl_p50_ms", "ITL p50 ms", 1), ("itl_p99_ms", "ITL p99 ms", 1),
           ("output_tokens_per_s", "out tok/s", 1), ("requests_per_s", "req/s", 1),
           ("gpu_mem_peak_bytes", "GPU mem MiB", 1 / (1 << 20)), ("gpu_util_avg_pct", "GPU %", 1),
           ("gpu_power_avg_w", "GPU W", 1))


def why_not() -> str | None:
    """Why this host cannot run it (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed in this Python ({sys.executable}): {INSTALL}"
    if importlib.util.find_spec("gguf") is None:
        return "the tiny-llama example needs gguf: pip install 'gguf==0.19.0'"
    if not detect_gpus():
        return "NVML finds no NVIDIA GPU on this host"
    return None


def farm(env: dict[str, str], *args: str, timeout: float = 1800) -> str:
    """``farm ARGS`` in this Python; its stdout (exit status and stderr raised on failure)."""
    proc = subprocess.run([sys.executable, "-m", "farm", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"farm {' '.join(args[:2])} ... exited {proc.returncode}: {proc.stderr.strip()[-3000:]}")
    return proc.stdout


def run(concurrency: str, seconds: float, knobs: list[str], tokens: tuple[int, int]) -> list[dict[str, Any]]:
    """The stored rows of one ``farm submit --engine vllm`` on the first GPU."""
    gpu = detect_gpus()[0]
    with tempfile.TemporaryDirectory(prefix="farm-vllm-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        env.update(FARM_HOME=f"{tmp}/home", FARM_RUNNER="process", FARM_SERVER_READY_TIMEOUT_S="900",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])))
        farm(env, "example-model", f"{tmp}/m", "--kind", "tiny-llama")
        knob_args = [a for k in knobs for a in ("--knob", k)]
        out = farm(env, "submit", f"{tmp}/m/tiny-llama-hf", "--engine", "vllm", "--device", f"gpu:{gpu.slug}",
                   *knob_args, "--concurrency", concurrency, "--duration", str(seconds), "--window", str(seconds / 3),
                   "--warmup", "2", "--input-tokens", str(tokens[0]), "--output-tokens", str(tokens[1]), "--json")
        rid = json.loads(out)["request_id"]
        rows: list[dict[str, Any]] = json.loads(farm(env, "results", rid, "--format", "json"))
        for r in rows:
            r["gpu"] = f"{gpu.name} ({gpu.uuid})"
        return rows


def show(rows: list[dict[str, Any]]) -> None:
    print(" ".join(f"{h:>12}" for _, h, _ in COLUMNS) + "  status")
    for r in sorted(rows, key=lambda r: r.get("concurrency") or 0):
        cells = [f"{r[k] * s:>12.1f}" if isinstance(r.get(k), int | float) else f"{'-':>12}" for k, _, s in COLUMNS]
        print(" ".join(cells) + f"  {r.get('status')} {r.get('error') or ''}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="concurrency 1,8 and 6 s per job")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--duration", type=float, default=15.0, help="seconds measured per job")
    p.add_argument("--knob", action="append", default=None, help="a vLLM knob (default gpu_memory_utilization=0.3)")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = p.parse_args()
    reason = why_not()
    if reason is not None:
        print(f"vllm_gpu: skipped: {reason}")
        return 0
    conc, seconds = ("1,8", 6.0) if a.quick else (a.concurrency, a.duration)
    t0 = time.monotonic()
    rows = run(conc, seconds, a.knob or ["gpu_memory_utilization=0.3"], (a.input_tokens, a.output_tokens))
    print(f"vLLM ({VLLM_PIN}) on {rows[0]['gpu'] if rows else '?'}, tiny-llama, {a.input_tokens} in / "
          f"{a.output_tokens} out tokens, {seconds:g} s per job ({time.monotonic() - t0:.0f} s in all, with start-up)")
    show(rows)
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0 if rows and all(r.get("status") == "succeeded" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
