"""How exact is farm's OpenAI streaming client? Its TTFT, ITL and token counts against the truth a scripted
fake server logs (``tests/fake_openai.py``: per request the time its body was read and the time each token's
chunk was written, same monotonic clock).

The fake server runs in its own process pinned to one half of the CPUs, farm's client (``run_load`` with
``measurement.llm``: its own load process) to the other half. For each concurrency (1, 64, 256) and token
chunking (1 token a chunk; 4 a chunk without usage, counted by a tokenizer of the fake's words, so the client
splits each chunk's gap over its tokens):
a closed loop for a fixed time (at least 3 requests long, after a warm-up of 2); printed: farm's TTFT p50 and
ITL p50, the server's true ones over the same span, their difference (targets: TTFT < 1 ms, ITL < 0.5 ms),
whether every measured request's output count is exact, and the client's CPU share (its load process's
busy %). ``srv lag``, the yardstick: how far the fake server's own per-token gap ran over its script (a host
that delays the server's timers delays its reading of requests too, which farm's TTFT includes and the
server's log cannot see). ``send lag``: farm's own p50 delay from a request's scheduled send to aiohttp's write
of it, the client's share of the TTFT error.

Run: ``python benchmarks/llm_client.py [--quick]``. Prints the table, asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from _serve import pin, split_cpus  # noqa: I001 (sets sys.path)

from farm.errors import LoadGenError
from schemas import MeasurementSettings
from tests.fake_openai import fake_server, read_log, word_tokenizer
from workers.loadgen import run_load

TTFT_MS, OUTPUT = 20.0, 64
#: (concurrency, inter-token gap ms, tokens per chunk)
CASES = ((1, 5.0, 1), (64, 10.0, 1), (256, 20.0, 1), (64, 10.0, 4))


def truth(log: Path, t_from: float, t_to: float) -> tuple[float, float, set[int]]:
    """The server's TTFT p50 and per-token ITL p50 (ms) over requests read within [t_from, t_to], and their
    output counts (streams sent to their end)."""
    rows = [r for r in read_log(log) if t_from <= r["recv"] <= t_to and r["done"]]
    ttft = [(r["tokens"][0] - r["recv"]) * 1e3 for r in rows]
    itl: list[float] = []
    for r in rows:
        t = r["tokens"]
        # a chunk of k tokens is logged k times at one time: its gap counts k intervals of gap/k, as farm's
        i = 1
        while i < len(t):
            j = i
            while j < len(t) and t[j] == t[i]:
                j += 1
            itl.extend([(t[i] - t[i - 1]) * 1e3 / (j - i)] * (j - i))
            i = j
    return statistics.median(ttft), statistics.median(itl), {r["n"] for r in rows}


def one(concurrency: int, itl_ms: float, per_chunk: int, seconds: float, client_cpus: set[int] | None,
        server_cpus: set[int] | None) -> str:
    import time

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "fake.jsonl"
        cpus = ",".join(map(str, sorted(server_cpus))) if server_cpus else ""
        fault = "no_usage" if per_chunk > 1 else "none"
        with fake_server(log=log, cpus=cpus, model="fake", ttft_ms=TTFT_MS, itl_ms=itl_ms, per_chunk=per_chunk,
                         fault=fault) as url:
            nominal_s = (TTFT_MS + OUTPUT * itl_ms) / 1e3  # one request on an idle server
            seconds = max(seconds, 3 * nominal_s)
            settings = MeasurementSettings(duration_s=seconds, warmup_s=max(1.0, 2 * nominal_s), window_s=seconds,
                                           llm={"api": "openai-chat", "input_tokens": 64, "output_tokens": OUTPUT,
                                                # no usage: the tokenizer counts (the fake's words)
                                                **({"tokenizer": str(word_tokenizer(Path(tmp)))} if fault != "none"
                                                   else {})})
            t0 = time.monotonic()
            r = run_load(url.split("//")[1], "fake", [], 1, concurrency, settings)
            t1 = time.monotonic()
        # the measured span: the last `seconds` before the run ended (its windows, give or take the stop)
        ttft, itl, counts = truth(log, max(t0, t1 - seconds - 0.3), t1)
    m, d = r.metrics, r.details
    exact = m["mean_output_tokens"] == OUTPUT and counts == {OUTPUT} and not m["output_overrun_count"]
    src = "/".join(sorted(d["token_sources"]["output"]))
    return (f"{concurrency:>5} {per_chunk:>5} {itl_ms:>6g} {m['ttft_p50_ms']:>9.3f} {ttft:>9.3f} "
            f"{m['ttft_p50_ms'] - ttft:>+8.3f} {m['itl_p50_ms']:>8.3f} {itl:>8.3f} {m['itl_p50_ms'] - itl:>+8.3f} "
            f"{itl - itl_ms / per_chunk:>+8.3f} {d['send_lag_ms']['p50']:>8.3f} "
            f"{'yes' if exact else 'NO':>6} {src:>9} {m['client_busy_pct']:>7.1f} {m['requests_per_s']:>7.1f} "
            f"{m['error_count']:>5}")


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
          f"{'true':>8} {'err ms':>8} {'srv lag':>8} {'send lag':>8} {'exact':>6} {'tok from':>9} {'cli %':>7} "
          f"{'req/s':>7} {'errs':>5}")
    for concurrency, itl_ms, per_chunk in CASES:
        try:
            print(one(concurrency, itl_ms, per_chunk, seconds, client_cpus, server_cpus), flush=True)
        except LoadGenError as exc:
            print(f"{concurrency:>5} {per_chunk:>5} {itl_ms:>6g}  failed: {exc}", flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs "
          "(a busy host delays both processes: the errors then measure the host as much as farm)")


if __name__ == "__main__":
    main()
