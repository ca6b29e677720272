"""How exact is farm's OpenAI streaming client? Its TTFT, ITL and token counts against the truth a scripted
fake server logs (``tests/fake_openai.py``: per request, by its X-Request-Id, the time each token's chunk was
written; one monotonic clock for both processes).

The fake server runs in its own process pinned to one half of the CPUs, farm's client (its load process, the
code ``OpenAIClient`` runs: ``openai.load_loop.load_process``, ``openai.stream.account``) to the other half. For each
concurrency (1, 64, 256) and chunking (1 token a chunk; 4 a chunk without usage, counted by a tokenizer of the
fake's words, so the client splits each chunk's gap over its tokens): a closed loop for a fixed time (at least
3 requests long, after a warm-up of 2). Each measured request is paired with the server's log. The true TTFT
is the server's first token write minus the client's request write (its ``send lag`` after its
scheduled send), so the error is what farm adds: its send lag and its delay in reading the first token. The
true ITL is the server's own gap per token. Printed: farm's TTFT p50 and ITL p50, the true ones, their
difference (targets: TTFT < 1 ms, ITL < 0.5 ms), whether every measured request's output count is exact, and
the client's CPU share (its load process's busy %). ``srv lag``, the yardstick: how far the fake server's own
per-token gap ran over its script (a loaded host delays its timers); ``loop lag``, the client's: the p50
lateness of a 5 ms timer in farm's load loop (what delays it delays every chunk's stamp).

Rounds (3, ``--quick`` 1) run every case in turn, each round headed by the host's load average and farm's
yardstick (``workers.samplers.calibrate``: passes/s of a fixed numpy kernel on the benchmark's CPUs; a quiet
2-core host gives ~80): the figures of a round with a low yardstick measure the host, not farm.

Run: ``python benchmarks/llm_client.py [--quick] [--rounds N]``. Prints each round's rows, then a Markdown table
(medians, each round's value in brackets) ready to paste; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from _serve import pin, split_cpus  # noqa: I001 (sets sys.path)

from schemas.llm import LlmSettings
from tests.fake_openai import fake_server, read_log, word_tokenizer
from workers.loadgen.openai.load_loop import HttpJob, HttpRun, load_process, request_seq
from workers.loadgen.openai.stream import account
from workers.loadgen.openai.workload import Tokenizer, synthetic_prompts
from workers.loadgen.patterns import ClosedLoop
from workers.loadgen.plan import WindowPlan
from workers.samplers.calibrate import calibrate

TTFT_MS, OUTPUT = 20.0, 64
#: (concurrency, inter-token gap ms, tokens per chunk)
CASES = ((1, 5.0, 1), (64, 10.0, 1), (256, 20.0, 1), (64, 10.0, 4))


def server_itl(tokens: list[float]) -> list[float]:
    """Per-token gaps (ms) of one request's logged send times; a chunk of k tokens is logged k times at one
    time and its gap counts k intervals of gap/k, as farm's ITL does."""
    out: list[float] = []
    i = 1
    while i < len(tokens):
        j = i
        while j < len(tokens) and tokens[j] == tokens[i]:
            j += 1
        out.extend([(tokens[i] - tokens[i - 1]) * 1e3 / (j - i)] * (j - i))
        i = j
    return out


@dataclass(frozen=True)
class Case:
    """One case's figures (ms, %, requests/s)."""

    concurrency: int
    per_chunk: int
    itl_ms: float
    farm_ttft: float
    true_ttft: float
    farm_itl: float
    true_itl: float
    srv_lag: float
    send_lag: float
    loop_lag: float
    exact: bool
    source: str
    busy_pct: float
    req_s: float
    errors: int

    @property
    def ttft_err(self) -> float:
        return self.farm_ttft - self.true_ttft

    @property
    def itl_err(self) -> float:
        return self.farm_itl - self.true_itl

    def line(self) -> str:
        return (f"{self.concurrency:>5} {self.per_chunk:>5} {self.itl_ms:>6g} {self.farm_ttft:>9.3f} "
                f"{self.true_ttft:>9.3f} {self.ttft_err:>+8.3f} {self.farm_itl:>8.3f} {self.true_itl:>8.3f} "
                f"{self.itl_err:>+8.3f} {self.srv_lag:>+8.3f} {self.send_lag:>8.3f} {self.loop_lag:>8.3f} "
                f"{'yes' if self.exact else 'NO':>6} {self.source:>9} {self.busy_pct:>7.1f} {self.req_s:>7.1f} "
                f"{self.errors:>5}")


def one(concurrency: int, itl_ms: float, per_chunk: int, seconds: float, server_cpus: set[int] | None) -> Case:
    """One case: farm's client (its load process, the code ``OpenAIClient`` runs) against the fake server;
    each measured request paired with the server's log by its X-Request-Id."""
    nominal_s = (TTFT_MS + OUTPUT * itl_ms) / 1e3  # one request on an idle server
    seconds = max(seconds, 3 * nominal_s)
    warmup_s = max(1.0, 2 * nominal_s)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "fake.jsonl"
        cpus = ",".join(map(str, sorted(server_cpus))) if server_cpus else ""
        fault = "no_usage" if per_chunk > 1 else "none"  # then a tokenizer of the fake's words counts
        tok = Tokenizer(str(word_tokenizer(Path(tmp)))) if fault != "none" else None
        llm = LlmSettings(input_tokens=64, output_tokens=OUTPUT)
        with fake_server(log=log, cpus=cpus, model="fake", ttft_ms=TTFT_MS, itl_ms=itl_ms, per_chunk=per_chunk,
                         fault=fault) as url:
            job = HttpJob(base_url=url + "/v1", api="openai-chat", model="fake",
                          prompts=tuple(synthetic_prompts(llm, None, 64)), pattern=ClosedLoop(concurrency),
                          plan=WindowPlan(warmup_s, (seconds,), 1, False))
            with load_process(job) as (wait, t_start):
                run = wait(warmup_s + seconds + 60)
        assert isinstance(run, HttpRun) and t_start is not None, run
        # X-Request-Id: a UUID whose last group is the request's number in the run
        truth = {request_seq(r["rid"]): r for r in read_log(log) if r["done"] and r["rid"]}
    t0, t1 = t_start + warmup_s, t_start + warmup_s + seconds
    farm_ttft, true_ttft, farm_itl, true_itl, lag = [], [], [], [], []
    exact, errors = True, 0
    for rec in run.records:
        if rec.warm or not t0 <= rec.end <= t1:
            continue
        if rec.error is not None:
            errors += 1
            continue
        o = account(rec, tok.count if tok is not None else None)
        row = truth.get(rec.seq)
        if row is None:
            continue
        farm_ttft.append(o.ttft_ms)
        true_ttft.append((row["tokens"][0] - rec.wrote) * 1e3)  # the server's first write after the client's
        farm_itl.extend(o.itl_ms)
        true_itl.extend(server_itl(row["tokens"]))
        lag.append(o.send_lag_ms or 0.0)
        exact &= o.output_tokens == row["n"] == OUTPUT
    med = statistics.median
    return Case(concurrency, per_chunk, itl_ms, med(farm_ttft), med(true_ttft), med(farm_itl), med(true_itl),
                med(true_itl) - itl_ms / per_chunk, med(lag), med(run.loop_lag_ms), exact,
                "tokenizer" if tok is not None else "usage", run.busy_pct, len(farm_ttft) / seconds, errors)


HEADER = (f"{'conc':>5} {'k/chk':>5} {'itl':>6} {'farm ttft':>9} {'true':>9} {'err ms':>8} {'farm itl':>8} "
          f"{'true':>8} {'err ms':>8} {'srv lag':>8} {'send lag':>8} {'loop lag':>8} {'exact':>6} {'tok from':>9} "
          f"{'cli %':>7} {'req/s':>7} {'errs':>5}")


def _spread(values: list[float], fmt: str) -> str:
    """The median of ``values`` and, over several rounds, each round's value."""
    med = format(statistics.median(values), fmt)
    return med if len(values) == 1 else f"{med} ({', '.join(format(v, fmt) for v in values)})"


def table(cases: dict[tuple[int, float, int], list[Case]]) -> None:
    """The rounds' figures per case as a Markdown table ready to paste: medians, each round in brackets."""
    print("\n| concurrency | tokens/chunk | TTFT p50 error ms | ITL p50 error ms | counts exact | client CPU % | "
          "send lag ms | loop lag ms | srv lag ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (c, _, k), runs in cases.items():
        exact = ("yes" if all(r.exact for r in runs) else "NO") + (" (tokenizer)" if runs[0].source != "usage" else "")
        print(f"| {c} | {k} | {_spread([r.ttft_err for r in runs], '+.2f')} | "
              f"{_spread([r.itl_err for r in runs], '+.3f')} | {exact} | "
              f"{_spread([r.busy_pct for r in runs], '.1f')} | "
              f"{statistics.median(r.send_lag for r in runs):.3f} | "
              f"{statistics.median(r.loop_lag for r in runs):.2f} | {_spread([r.srv_lag for r in runs], '.2f')} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 round of 3 s per case (CI), else 3 rounds of 10 s")
    p.add_argument("--rounds", type=int, default=None, help="rounds over every case (default 3, --quick 1)")
    args = p.parse_args()
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    seconds = 3.0 if args.quick else 10.0
    rounds = args.rounds or (1 if args.quick else 3)
    every = sorted((client_cpus or set()) | (server_cpus or set())) or list(range(os.cpu_count() or 1))
    print(f"fake server: TTFT {TTFT_MS:g} ms, {OUTPUT} output tokens; client CPUs {sorted(client_cpus or [])}, "
          f"server CPUs {sorted(server_cpus or [])}; {seconds:g} s per case, {rounds} round(s), the cases "
          "interleaved")
    cases: dict[tuple[int, float, int], list[Case]] = {}
    for r in range(rounds):
        print(f"round {r + 1}: load average {_load()}, host yardstick {calibrate(every).speed:.1f} passes/s")
        print(HEADER)
        for concurrency, itl_ms, per_chunk in CASES:
            try:
                case = one(concurrency, itl_ms, per_chunk, seconds, server_cpus)
            except (AssertionError, statistics.StatisticsError) as exc:
                print(f"{concurrency:>5} {per_chunk:>5} {itl_ms:>6g}  failed: {exc}", flush=True)
                continue
            print(case.line(), flush=True)
            cases.setdefault((concurrency, itl_ms, per_chunk), []).append(case)
    print(f"after: load average {_load()}, host yardstick {calibrate(every).speed:.1f} passes/s on "
          f"{os.cpu_count()} CPUs (a busy host delays both processes: the errors then measure the host as much as "
          "farm; srv lag is the fake server's own lateness)")
    table(cases)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
