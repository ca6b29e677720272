"""How exact is farm's OpenAI streaming client? Its TTFT, ITL and token counts against the truth a scripted
fake server logs (``tests/fake_openai.py``: per request, by its X-Request-Id, the time each token's chunk was
written; one monotonic clock for both processes).

The fake server runs in its own process pinned to one half of the CPUs, farm's client (its load process, the
code ``OpenAIClient`` runs: ``openai_http.load_process``, ``llm_stream.account``) to the other half. For each
concurrency (1, 64, 256) and chunking (1 token a chunk; 4 a chunk without usage, counted by a tokenizer of the
fake's words, so the client splits each chunk's gap over its tokens): a closed loop for a fixed time (at least
3 requests long, after a warm-up of 2). Each measured request is paired with the server's log. The true TTFT
is the server's first token write minus the client's request write (aiohttp's, ``send lag`` after its
scheduled send), so the error is what farm adds: its send lag and its delay in reading the first token. The
true ITL is the server's own gap per token. Printed: farm's TTFT p50 and ITL p50, the true ones, their
difference (targets: TTFT < 1 ms, ITL < 0.5 ms), whether every measured request's output count is exact, and
the client's CPU share (its load process's busy %). ``srv lag``, the yardstick: how far the fake server's own
per-token gap ran over its script (a loaded host delays its timers); ``loop lag``, the client's: the p50
lateness of a 5 ms timer in farm's load loop (what delays it delays every chunk's stamp).

Run: ``python benchmarks/llm_client.py [--quick]``. Prints the table, asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from _serve import pin, split_cpus  # noqa: I001 (sets sys.path)

from schemas.llm import LlmSettings
from tests.fake_openai import fake_server, read_log, word_tokenizer
from workers.loadgen.llm_stream import account
from workers.loadgen.llm_workload import Tokenizer, synthetic_prompts
from workers.loadgen.openai_http import HttpJob, HttpRun, load_process, request_seq
from workers.loadgen.patterns import ClosedLoop
from workers.loadgen.plan import WindowPlan

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


def one(concurrency: int, itl_ms: float, per_chunk: int, seconds: float, server_cpus: set[int] | None) -> str:
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
    src = "tokenizer" if tok is not None else "usage"
    return (f"{concurrency:>5} {per_chunk:>5} {itl_ms:>6g} {med(farm_ttft):>9.3f} {med(true_ttft):>9.3f} "
            f"{med(farm_ttft) - med(true_ttft):>+8.3f} {med(farm_itl):>8.3f} {med(true_itl):>8.3f} "
            f"{med(farm_itl) - med(true_itl):>+8.3f} {med(true_itl) - itl_ms / per_chunk:>+8.3f} {med(lag):>8.3f} "
            f"{med(run.loop_lag_ms):>8.3f} "
            f"{'yes' if exact else 'NO':>6} {src:>9} {run.busy_pct:>7.1f} {len(farm_ttft) / seconds:>7.1f} "
            f"{errors:>5}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 s per case (CI), else 10 s")
    args = p.parse_args()
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    seconds = 3.0 if args.quick else 10.0
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"fake server: TTFT {TTFT_MS:g} ms, {OUTPUT} output tokens; client CPUs {sorted(client_cpus or [])}, "
          f"server CPUs {sorted(server_cpus or [])}; {seconds:g} s per case")
    print(f"{'conc':>5} {'k/chk':>5} {'itl':>6} {'farm ttft':>9} {'true':>9} {'err ms':>8} {'farm itl':>8} "
          f"{'true':>8} {'err ms':>8} {'srv lag':>8} {'send lag':>8} {'loop lag':>8} {'exact':>6} {'tok from':>9} "
          f"{'cli %':>7} {'req/s':>7} {'errs':>5}")
    for concurrency, itl_ms, per_chunk in CASES:
        try:
            print(one(concurrency, itl_ms, per_chunk, seconds, server_cpus), flush=True)
        except (AssertionError, statistics.StatisticsError) as exc:
            print(f"{concurrency:>5} {per_chunk:>5} {itl_ms:>6g}  failed: {exc}", flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs "
          "(a busy host delays both processes: the errors then measure the host as much as farm)")


if __name__ == "__main__":
    main()
