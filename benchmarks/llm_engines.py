"""Which LLM engine and which of its knobs serve the tiny-llama example best, when farm launches them? For each
engine x knob setting: the knee of a concurrency sweep, the most load within an SLO, the server's memory peak.

Method: ``farm example-model --kind tiny-llama`` into a scratch folder, then only farm's own commands, embedded
(no broker: SQLite in a scratch ``FARM_HOME``), on the process runner, as a user runs them:

1. **Sweep**: per configuration, ``farm submit MODEL --engine E --knob K=V --concurrency 1,2,4,8`` (closed loop,
   synthetic prompts of ``--input-tokens``, ``--output-tokens`` each); the knee (the concurrency past which
   more concurrency buys under 10 % more output tokens/s per doubling, ``farm.readers.knee``) and its tokens/s are
   read from ``farm status ID --json`` (``knees``).
2. **Search**: ``farm submit MODEL ... --search max-goodput --slo ttft=MS,tpot=MS --rate START``; the best rate
   (``max_goodput_rate``) and the steps are read from ``farm status ID --json`` (``searches``). The SLO is set per
   engine from its *first* configuration's c=1 row: TTFT goal ``TTFT_X`` x its TTFT p50 (at least
   ``TTFT_FLOOR_MS``), tpot goal ``TPOT_X`` x its tpot p50 (at least ``TPOT_FLOOR_MS``), so every knob setting
   of one engine is held to the same goals. The search starts at half the configuration's own c=1 requests/s.
   A search reaching ``--max-steps`` measured steps is stopped (SIGINT: farm cancels the step in hand and the
   search answers with the best step so far; the table marks it ``capped``).
3. **Memory**: the server's memory peak (``mem_peak_bytes``, RSS of the server's process tree sampled by farm)
   over every row of the configuration, sweep and search.

Each row also carries farm's yardstick, ``host_speed_index`` (calibration passes/s on the job's cores before
it measured: a lower figure means a slower host at that moment), and the hypervisor's steal; the benchmark
adds the load average before and after each configuration's phases. The configurations are interleaved
ABBA: sweeps in the listed order, searches in the reverse order, so a host that drifts during the run
favours no configuration; every submit has its own workload seed (llama.cpp caches prompt prefixes; each
request's prompt differs).

llama.cpp here is llama-cpp-python's server (no ``llama-server`` on this host): it decodes one request at a
time, so ``n_parallel`` above 1 is refused by farm; its knobs that change behaviour are ``n_batch`` (prompt
tokens per decode call: 16 splits a 128-token prompt into 8 calls, which costs TTFT; it also sizes the
compute buffers, so memory) and ``n_ctx`` (the KV cache). transformers: ``continuous_batching`` (paged
attention, requests batched per step) against one ``generate`` per request.

``--quick`` (CI, <= 60 s on 2 cores): llama.cpp with one knob value, c=1,2, short steps, the search capped at
2 steps. Run: ``python benchmarks/llm_engines.py [--quick] [--config ENGINE:KNOB=V ...] [--max-steps N]``
(needs ``farm[llm]``). Prints its figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: (engine, knob) in run order; the first of an engine sets its SLO
CONFIGS = (("llama.cpp", "n_batch=512"), ("llama.cpp", "n_batch=16"),
           ("transformers", "continuous_batching=false"), ("transformers", "continuous_batching=true"))
QUICK_CONFIGS = (("llama.cpp", "n_batch=512"),)
MODULES = {"llama.cpp": "llama_cpp", "transformers": "transformers"}
TTFT_X, TTFT_FLOOR_MS = 5.0, 50.0  # TTFT goal: x the engine's c=1 TTFT p50, at least this, ms
TPOT_X, TPOT_FLOOR_MS = 2.0, 5.0  # tpot goal: x the engine's c=1 tpot p50, at least this, ms


@dataclass(frozen=True)
class Timing:
    """Per job: warm-up and measured seconds of a sweep point and of a search step; tokens in and out."""

    concurrency: str
    sweep_warmup: float
    sweep_s: float
    step_warmup: float
    step_s: float
    tokens: tuple[int, int]


FULL = Timing("1,2,4,8", 1.0, 3.0, 1.0, 3.0, (128, 32))
QUICK = Timing("1,2", 0.5, 1.5, 0.5, 1.5, (64, 16))


@dataclass
class Config:
    """One engine x knob setting and what the run found for it."""

    engine: str
    knob: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    knee: dict[str, Any] | None = None
    search: dict[str, Any] | None = None
    capped: bool = False
    slo: tuple[float, float] | None = None
    load: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.engine} {self.knob}"

    def c1(self) -> dict[str, Any] | None:
        """This configuration's succeeded c=1 sweep row."""
        return next((r for r in self.rows if r.get("rate") is None and r.get("concurrency") == 1
                     and r.get("status") == "succeeded"), None)


class Farm:
    """farm's CLI, embedded, in a scratch ``FARM_HOME`` (no FARM_* setting of the caller leaks in)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        self.env.update(FARM_HOME=str(home), FARM_RUNNER="process", FARM_PERF_ANALYZER_INSTALL="0",
                        FARM_SERVER_READY_TIMEOUT_S="300",  # transformers serve imports torch: slow on a busy host
                        FARM_LLAMA_SERVER="off",  # llama-cpp-python's server, as measured (llama_server.py: both)
                        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])))

    def run(self, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "farm", *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)

    def json(self, *args: str) -> Any:
        """``farm ARGS`` parsed as JSON (None when it failed)."""
        proc = self.run(*args)
        return json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else None

    def latest(self) -> tuple[str | None, int]:
        """The newest request's id and how many of its jobs finished (read from the embedded database)."""
        try:
            with sqlite3.connect(f"file:{self.home / 'farm.db'}?mode=ro", uri=True, timeout=2) as con:
                row = con.execute("SELECT r.id, (SELECT count(*) FROM jobs j WHERE j.request_id = r.id AND "
                                  "j.finished_at IS NOT NULL) FROM requests r ORDER BY r.created_at DESC "
                                  "LIMIT 1").fetchone()
        except sqlite3.Error:
            return None, 0
        return (row[0], int(row[1])) if row else (None, 0)

    def submit(self, *args: str, cap: int = 0, timeout: float = 1800) -> tuple[str | None, bool, str]:
        """``farm submit ARGS --json``; with ``cap``, stopped by SIGINT once ``cap`` of its jobs finished.
        Returns (request id, stopped at the cap, stderr's tail)."""
        before, _ = self.latest()
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen([sys.executable, "-m", "farm", "submit", *args, "--json"], env=self.env,
                                    stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=ROOT)
            capped, t0 = False, time.monotonic()
            while proc.poll() is None and time.monotonic() - t0 < timeout:
                time.sleep(0.5)
                rid, done = self.latest()
                if cap and rid != before and done >= cap and not capped:
                    proc.send_signal(signal.SIGINT)
                    capped = True
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            err.seek(0)
            tail = err.read().strip().splitlines()[-1:] if proc.returncode else []
        rid, _ = self.latest()
        return (rid if rid != before else None), capped, " ".join(tail)


def workload(t: Timing, seed: int, warmup: float, seconds: float) -> list[str]:
    return ["--input-tokens", str(t.tokens[0]), "--output-tokens", str(t.tokens[1]), "--seed", str(seed),
            "--warmup", f"{warmup:g}", "--duration", f"{seconds:g}", "--window", f"{seconds / 2:g}"]


def rows_of(farm: Farm, rid: str) -> list[dict[str, Any]]:
    return farm.json("results", rid, "--format", "json") or []


def sweep(farm: Farm, cfg: Config, model: str, t: Timing, seed: int) -> None:
    """The configuration's closed-loop concurrency sweep and its knee, as farm reports it."""
    cfg.load.append(os.getloadavg()[0])
    rid, _, err = farm.submit(model, "--engine", cfg.engine, "--knob", cfg.knob, "--concurrency", t.concurrency,
                              *workload(t, seed, t.sweep_warmup, t.sweep_s))
    cfg.load.append(os.getloadavg()[0])
    if rid is None:
        cfg.errors.append(f"sweep: {err or 'no request'}")
        return
    cfg.rows += rows_of(farm, rid)
    status = farm.json("status", rid, "--json") or {}
    cfg.knee = next(iter(status.get("knees") or []), None)
    cfg.errors += [f"c={r['concurrency']}: {r.get('error')}" for r in cfg.rows if r.get("status") != "succeeded"]
    print(f"[{time.strftime('%H:%M:%S')}] sweep {cfg.label}: {cfg.knee}", flush=True)


def slo_from(first: Config) -> tuple[float, float] | None:
    """(TTFT, tpot) goals, ms, from the engine's first configuration's c=1 row (None: it has none)."""
    c1 = first.c1()
    if c1 is None or not c1.get("ttft_p50_ms") or not c1.get("tpot_p50_ms"):
        return None
    return (round(max(TTFT_X * c1["ttft_p50_ms"], TTFT_FLOOR_MS), 1),
            round(max(TPOT_X * c1["tpot_p50_ms"], TPOT_FLOOR_MS), 2))


def search(farm: Farm, cfg: Config, model: str, t: Timing, seed: int, cap: int) -> None:
    """The configuration's max-goodput search under ``cfg.slo``, from half its c=1 requests/s."""
    c1 = cfg.c1()
    if cfg.slo is None or c1 is None or not c1.get("requests_per_s"):
        cfg.errors.append("search: not run (no c=1 row to set the SLO and the start rate)")
        return
    start = max(float(f"{c1['requests_per_s'] / 2:.2g}"), 0.1)
    cfg.load.append(os.getloadavg()[0])
    rid, cfg.capped, err = farm.submit(
        model, "--engine", cfg.engine, "--knob", cfg.knob, "--search", "max-goodput",
        "--slo", f"ttft={cfg.slo[0]:g},tpot={cfg.slo[1]:g}", "--rate", f"{start:g}",
        *workload(t, seed, t.step_warmup, t.step_s), cap=cap)
    cfg.load.append(os.getloadavg()[0])
    if rid is None:
        cfg.errors.append(f"search: {err or 'no request'}")
        return
    cfg.rows += rows_of(farm, rid)
    status = farm.json("status", rid, "--json") or {}
    cfg.search = next(iter(status.get("searches") or []), None)
    print(f"[{time.strftime('%H:%M:%S')}] search {cfg.label} from {start:g}/s: {(cfg.search or {}).get('state')}",
          flush=True)


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return statistics.median(vals) if vals else None


def _f(v: float | None, fmt: str = ",.0f") -> str:
    return "-" if v is None else format(v, fmt)


def table_row(cfg: Config) -> str:
    """One Markdown row of the configuration's figures."""
    ok = [r for r in cfg.rows if r.get("status") == "succeeded"]
    knee = cfg.knee or {}
    s = cfg.search or {}
    measured = sum(1 for r in cfg.rows if r.get("rate") is not None and r.get("status") in ("succeeded", "failed"))
    steps = f"{measured}{' capped' if cfg.capped else ''}" if cfg.search else "-"
    peaks = [r["mem_peak_bytes"] for r in ok if isinstance(r.get("mem_peak_bytes"), int | float)]
    c1 = cfg.c1() or {}
    knee_c = "-" if not knee else f"{knee['concurrency']:g}{'' if knee.get('saturated') else '+'}"
    slo = "-" if cfg.slo is None else f"{cfg.slo[0]:g} / {cfg.slo[1]:g}"
    load = "-" if not cfg.load else f"{min(cfg.load):.1f}-{max(cfg.load):.1f}"
    return (f"| {cfg.engine} | {cfg.knob} | {knee_c} | {_f(knee.get('output_tokens_per_s'))} | "
            f"{_f(s.get('max_goodput_rate'), 'g')} | {steps} | {_f(max(peaks) / 2**20 if peaks else None, '.0f')} | "
            f"{_f(c1.get('ttft_p50_ms'), '.1f')} / {_f(c1.get('tpot_p50_ms'), '.2f')} | {slo} | "
            f"{_f(_median(ok, 'host_speed_index'), '.1f')} | {load} | {_f(_median(ok, 'cpu_steal_pct'), '.1f')} |")


def show(configs: list[Config], t: Timing, secs: float) -> None:
    print(f"\ntiny-llama, {t.tokens[0]} tokens in / {t.tokens[1]} out; sweep c={t.concurrency} "
          f"({t.sweep_warmup:g} s + {t.sweep_s:g} s per point); search steps {t.step_warmup:g} s + {t.step_s:g} s; "
          f"SLO per engine: TTFT <= max({TTFT_X:g} x c=1 TTFT p50, {TTFT_FLOOR_MS:g} ms), tpot <= "
          f"max({TPOT_X:g} x c=1 tpot p50, {TPOT_FLOOR_MS:g} ms), of its first configuration; {secs:.0f} s in all")
    print("\n| engine | knobs | knee c | tok/s at knee | max goodput rate (req/s) | steps | memory peak MiB | "
          "c=1 TTFT / tpot p50 ms | SLO TTFT / tpot ms | host speed index | load avg | steal % |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cfg in configs:
        print(table_row(cfg))
    print("\n(knee c with +: the sweep was still climbing at its end; steps: measured search steps; host speed "
          "index: farm's yardstick, median over the rows, higher = faster host; load avg: 1-min load average before "
          "and after each phase, on", os.cpu_count(), "CPUs)")
    for cfg in configs:
        curve = sorted((r["concurrency"], r.get("output_tokens_per_s") or 0.0) for r in cfg.rows
                       if r.get("rate") is None and r.get("status") == "succeeded")
        steps = sorted((r["rate"], r.get("goodput_req_per_s"), r.get("status")) for r in cfg.rows
                       if r.get("rate") is not None)
        print(f"{cfg.label}: sweep tok/s " + " ".join(f"c={c}:{y:,.0f}" for c, y in curve))
        print(f"  search: {(cfg.search or {}).get('state', '-')}; steps (rate: goodput) "
              + " ".join(f"{r:g}:{_f(g, '.2f')}{'' if st == 'succeeded' else f'({st})'}" for r, g, st in steps))
        for e in cfg.errors:
            print(f"  error: {e[:300]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI: llama.cpp n_batch=512, c=1,2, 1.5 s steps, 2 search steps")
    p.add_argument("--config", action="append", default=None, metavar="ENGINE:KNOB=V",
                   help="a configuration (repeatable; default: llama.cpp n_batch=512,16 and transformers "
                        "continuous_batching=false,true)")
    p.add_argument("--max-steps", type=int, default=None, help="stop a search after this many steps (default 8, "
                                                                "--quick 2)")
    a = p.parse_args()
    t = QUICK if a.quick else FULL
    pairs = [tuple(c.split(":", 1)) for c in a.config] if a.config else list(QUICK_CONFIGS if a.quick else CONFIGS)
    cap = a.max_steps or (2 if a.quick else 8)
    configs = [Config(e, k) for e, k in pairs if importlib.util.find_spec(MODULES.get(e, e)) is not None]
    for e, _ in pairs:
        if importlib.util.find_spec(MODULES.get(e, e)) is None:
            print(f"{e}: skipped: {MODULES.get(e, e)} is not installed (pip install 'farm[llm]')")
    if not configs:
        return 0
    t0 = time.monotonic()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="farm-bench-engines-") as tmp:
        farm = Farm(Path(tmp) / "home")
        made = farm.run("example-model", f"{tmp}/m", "--kind", "tiny-llama")
        if made.returncode != 0:
            print(f"farm example-model failed: {made.stderr.strip()[-500:]}")
            return 1
        models = {"llama.cpp": f"{tmp}/m/tiny-llama.gguf", "transformers": f"{tmp}/m/tiny-llama-hf"}
        for i, cfg in enumerate(configs):  # A B C D ...
            sweep(farm, cfg, models[cfg.engine], t, seed=i + 1)
        for cfg in configs:
            first = next(c for c in configs if c.engine == cfg.engine)
            cfg.slo = slo_from(first)
        for i, cfg in enumerate(reversed(configs)):  # ... D C B A
            search(farm, cfg, models[cfg.engine], t, seed=100 + i, cap=cap)
    show(configs, t, time.monotonic() - t0)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
