"""farm's OpenAI streaming client against AIPerf (issue 29 point 7), the same workload (synthetic prompts of 32
tokens from the tiny-llama's own tokenizer, 64 output tokens, ``max_tokens`` sent, closed loop at concurrency c),
the two tools interleaved round by round (their order alternating: servers drift within a minute). Per
concurrency it prints the medians over rounds of each tool's output tokens/s and TTFT p50, the median (range) over
rounds of each round's ratio farm / AIPerf (target: within 5 %), and how many requests AIPerf kept in flight on
average by its own stamps (a closed loop of c that never idles keeps c).

``--server llama`` (default): llama-cpp-python's server on the tiny-llama GGUF (one thread, pinned to the last
CPU; the tools on the others). Neither tool knows the truth there. ``--shape tiny`` (default) answers 64 tokens
in ~30 ms, so a client's own turnaround between requests (AIPerf's: 5-9 ms) is a large share of a request;
``--shape small`` (the same tokenizer, 12 layers of width 256: 5-7 ms a token, ~400 ms a request) spends the
server's time on the model, as a real model does, and is where two correct clients should agree. With llama.cpp
the benchmark also reads the server's log (its prompt evaluation, prompt tokens evaluated and ms per token in
each tool's runs), prints AIPerf's TTFT p50 without its first c requests (``steady``: the ramp after its warm-up
drained) and each ratio at the server's speed (the host moves that speed by up to 30 % between runs).

``--server fake``: the scripted fake server (``tests/fake_openai.py``: TTFT 4 ms, a token every 1 ms, on the last
CPU), which logs when it read each request and wrote each token: the truth. Per run, over the server's steady
state (the requests it read from 1 s after its first one to its last one): ``srv tok/s``, the tokens it wrote
per second of that span (what that tool's load made it deliver); ``srv ttft``, the p50 of first token write
minus request read. Each tool's figure is then compared with the truth of its own run (``/srv``), and ``gap``
(c=1 only) is the server's idle time between one request's last token and the next request's arrival: the
tool's turnaround, which at c=1 decides how many tokens per second the server can deliver; ``held``, how many
requests the server held on average (a closed loop of c that never idles holds c: the fewer, the shorter the
queue a request waits in where the server serializes them, ``--slots 1`` as llama-cpp-python does).

Both tools define output tokens/s as output tokens over a span of the run (farm: the tokens that arrived within
the measured windows, by each chunk's arrival, over the windows' length; AIPerf's ``output_token_throughput``:
every profiling request's tokens over its ``benchmark_duration``, from the phase's start to the last response's
end, grace period included). At concurrency 1 the benchmark also prints AIPerf's turnaround from its own
per-request export: the p50 from one request's end to the next one's start.

AIPerf (`pip install aiperf`, ~6 min) lives in a venv of its own: ``--aiperf PATH`` or ``$AIPERF``, default
``~/.cache/farm/aiperf-venv/bin/aiperf``. Without it the benchmark says so and measures nothing (exit 0).

    python benchmarks/llm_vs_aiperf.py [--server llama|fake] [--shape tiny|small] [--quick] [--rounds 4]
        [--concurrency 1,4,16] [--seconds S]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _serve import stored_upload  # noqa: E402

from farm.models.llm_examples import SHAPES, build_tiny_llama  # noqa: E402
from schemas import MeasurementSettings  # noqa: E402
from schemas.engines import SERVED_MODEL_NAME  # noqa: E402
from schemas.llm import LlmSettings  # noqa: E402
from tests.fake_openai import fake_server, read_log  # noqa: E402
from tests.llm_servers import llama_cpp_server  # noqa: E402
from workers.loadgen.clients import run_load  # noqa: E402
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.samplers.calibrate import calibrate  # noqa: E402

DEFAULT_AIPERF = Path.home() / ".cache/farm/aiperf-venv/bin/aiperf"
IN_TOKENS, OUT_TOKENS = 32, 64
FAKE_TTFT_MS, FAKE_ITL_MS = 4.0, 1.0
STEADY_AFTER_S = 1.0  # the server's steady state starts this long after the first request it read


@dataclass(frozen=True)
class Figures:
    """One run: the tool's output tokens/s and TTFT p50 (ms); with the fake server its truth: tokens/s it
    wrote, its TTFT p50 (ms) and its idle gap between requests (ms, c=1), else None."""

    tok_s: float
    ttft: float
    srv_tok_s: float | None = None
    srv_ttft: float | None = None
    gap: float | None = None
    srv_held: float | None = None  # fake server: requests it held on average over its steady state (read to last token)
    turnaround: float | None = None  # AIPerf's own records (c=1): p50 from a request's end to the next's start
    in_flight: float | None = None  # AIPerf's own records: requests in flight on average
    steady_ttft: float | None = None  # AIPerf's own records: TTFT p50 (ms) without its first c requests (its ramp)
    srv_prompt_ms: float | None = None  # llama.cpp's log: p50 of its prompt evaluation per request (ms)
    srv_prompt_tokens: float | None = None  # llama.cpp's log: p50 of the prompt tokens it evaluated (after its cache)
    srv_token_ms: float | None = None  # llama.cpp's log: p50 of its time per generated token (ms)


def hostport(url: str) -> str:
    """``127.0.0.1:PORT`` of a base URL ``http://127.0.0.1:PORT/v1``."""
    return url.split("://", 1)[-1].removesuffix("/v1")


def farm_run(url: str, hf: Path, concurrency: int, seconds: float, out: Path) -> tuple[float, float]:
    """(output tokens/s, TTFT p50 ms) of farm's OpenAI client, closed loop; the tokenizer uploaded as a request's
    (a job reads only uploads, and parses a tokenizer in the jail)."""
    tokenizer = stored_upload("tokenizer", hf, out / "farm-home")
    llm = LlmSettings.model_validate({"input_tokens": IN_TOKENS, "output_tokens": OUT_TOKENS, "tokenizer": tokenizer})
    settings = MeasurementSettings(client="openai", llm=llm, duration_s=seconds, warmup_s=1.0)
    res = run_load(LoadTarget(hostport(url), SERVED_MODEL_NAME), LoadSpec.from_settings([], 1, concurrency, settings))
    tok_s, ttft = res.metrics["output_tokens_per_s"], res.metrics["ttft_p50_ms"]
    if not isinstance(tok_s, float | int) or not isinstance(ttft, float | int):
        raise RuntimeError(f"farm measured no tokens/s or TTFT: {res.details.get('notes')}")
    return float(tok_s), float(ttft)


def aiperf_argv(aiperf: Path, url: str, hf: Path, concurrency: int, seconds: float, out: Path) -> list[str]:
    """AIPerf's command line for the workload (max_tokens sent too: llama.cpp ignores max_completion_tokens)."""
    return [str(aiperf), "profile", "-m", SERVED_MODEL_NAME, "--url", hostport(url), "--endpoint-type",
            "chat", "--streaming", "--tokenizer", str(hf), "--synthetic-input-tokens-mean", str(IN_TOKENS),
            "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(OUT_TOKENS),
            "--output-tokens-stddev", "0", "--extra-inputs", f"max_tokens:{OUT_TOKENS}", "--concurrency",
            str(concurrency), "--benchmark-duration", str(seconds), "--warmup-request-count", str(concurrency),
            "--random-seed", "7", "--artifact-dir", str(out), "--ui-type", "none"]


def aiperf_run(aiperf: Path, url: str, hf: Path, concurrency: int, seconds: float, out: Path,
               server_counts: bool = False) -> Figures:
    """AIPerf on the same workload: output tokens/s, TTFT p50 (ms), turnaround p50 (ms, c=1), requests in flight
    on average and its steady-state TTFT p50 (``server_counts``: output tokens from the server's usage, which the
    fake server sends and llama.cpp does not)."""
    cmd = aiperf_argv(aiperf, url, hf, concurrency, seconds, out) + (["--use-server-token-count"] if server_counts
                                                                      else [])
    # no HF_HUB_OFFLINE: in offline mode AIPerf looks a tokenizer up in the hub cache only, never at a local folder
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if done.returncode != 0 or not found:
        raise RuntimeError(f"aiperf exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    data = json.loads(found[-1].read_text())
    records = _aiperf_records(out)
    rows = [r["metadata"] for r in records]
    return Figures(float(data["output_token_throughput"]["avg"]), float(data["time_to_first_token"]["p50"]),
                   turnaround=aiperf_turnaround(rows) if concurrency == 1 else None, in_flight=aiperf_in_flight(rows),
                   steady_ttft=aiperf_steady_ttft(records, concurrency))


def _aiperf_records(out: Path) -> list[dict[str, Any]]:
    """AIPerf's profiling requests from its per-request export (metadata and metrics), by start."""
    found = sorted(out.rglob("profile_export.jsonl"))
    if not found:
        return []
    recs = [json.loads(line) for line in found[-1].read_text().splitlines() if line.strip()]
    return sorted((r for r in recs if r.get("metadata", {}).get("benchmark_phase") == "profiling"
                   and r["metadata"].get("request_end_ns")), key=lambda r: r["metadata"]["request_start_ns"])


def aiperf_steady_ttft(records: list[dict[str, Any]], concurrency: int) -> float | None:
    """TTFT p50 (ms) of AIPerf's own records without its first ``concurrency`` profiling requests. AIPerf's
    profiling phase starts once its warm-up has drained, so its first c requests meet an empty server (at a
    serializing server they wait 0, 1, ..., c-1 requests instead of c-1): a ramp that farm's warm-up, which
    does not drain, leaves out. What remains is the steady state both tools then measure."""
    ttfts = [float(r["metrics"]["time_to_first_token"]["value"]) for r in records[concurrency:]
             if "time_to_first_token" in r.get("metrics", {})]
    return statistics.median(ttfts) if ttfts else None


PROMPT_EVAL = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
TOKEN_EVAL = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")


def llama_truth(fig: Figures, text: str) -> Figures:
    """``fig`` with, from llama.cpp's log of its run (``llama_perf_context_print``, a line pair per request),
    the p50s of its prompt evaluation (ms), of the prompt tokens it evaluated (those its prefix cache did not
    hold) and of its time per generated token (ms): what the server itself spent, whichever client sent the
    load."""
    prompts = [(float(ms), int(n)) for ms, n in PROMPT_EVAL.findall(text)]
    per_token = [float(ms) / int(n) for ms, n in TOKEN_EVAL.findall(text) if int(n) > 0]

    def p50(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None
    return replace(fig, srv_prompt_ms=p50([ms for ms, _ in prompts]),
                   srv_prompt_tokens=p50([float(n) for _, n in prompts]), srv_token_ms=p50(per_token))


def aiperf_in_flight(rows: list[dict[str, Any]]) -> float | None:
    """How many requests AIPerf had in flight on average (its own stamps): the requests' summed latencies over
    the span from the first start to the last end (AIPerf's ``rows``, by start). A closed loop of c that never
    idles holds c; each request's turnaround in the client lowers it, and with it the queue the others wait in at
    a serializing server; so does the phase's drain at its end (its last c requests finishing one by one)."""
    if not rows:
        return None
    span = max(m["request_end_ns"] for m in rows) - rows[0]["request_start_ns"]
    return sum(m["request_end_ns"] - m["request_start_ns"] for m in rows) / span if span > 0 else None


def aiperf_turnaround(rows: list[dict[str, Any]]) -> float | None:
    """From AIPerf's per-request export at concurrency 1: the p50 (ms) from one profiling request's end to the
    next one's start, as AIPerf itself stamped them: the time its closed loop leaves the server idle."""
    gaps = [(b["request_start_ns"] - a["request_end_ns"]) / 1e6 for a, b in zip(rows, rows[1:], strict=False)]
    return statistics.median(gaps) if gaps else None


def server_truth(log: Path) -> tuple[float, float, float | None, float]:
    """From the fake server's log of one run: tokens/s it wrote over its steady state (the requests it read from
    ``STEADY_AFTER_S`` after its first one to its last one: the warm-up and the end's drain left out), the p50 of
    first token write minus request read (ms), when requests never overlapped (c=1) the p50 of its idle gap
    from a request's last token to the next request's read (ms), and how many requests it held on average (from
    reading one to writing its last token; a closed loop of c that never idles holds c)."""
    rows = sorted((r for r in read_log(log) if r["tokens"]), key=lambda r: r["recv"])
    t0 = rows[0]["recv"] + STEADY_AFTER_S
    steady = [r for r in rows if r["recv"] >= t0]
    t1 = steady[-1]["recv"]
    tokens = sum(t0 <= t < t1 for r in rows for t in r["tokens"])
    ttft = statistics.median((r["tokens"][0] - r["recv"]) * 1e3 for r in steady)
    gaps = [(b["recv"] - a["tokens"][-1]) * 1e3 for a, b in zip(steady, steady[1:], strict=False)]
    held = sum(max(0.0, min(r["tokens"][-1], t1) - max(r["recv"], t0)) for r in rows)  # request-seconds in [t0, t1)
    return (tokens / (t1 - t0), ttft, statistics.median(gaps) if gaps and min(gaps) > 0 else None,
            held / (t1 - t0))


@contextmanager
def fake_llm(log: Path, cpu: int, slots: int = 0) -> Iterator[str]:
    with fake_server(log=log, cpus=str(cpu), model=SERVED_MODEL_NAME, ttft_ms=FAKE_TTFT_MS,
                     itl_ms=FAKE_ITL_MS, slots=slots) as url:
        yield url + "/v1"


def one_run(tool: str, a: argparse.Namespace, c: int, seconds: float, tmp: Path, r: int, hf: Path,
            llama_url: str | None) -> Figures:
    """One tool's run at concurrency ``c``; with the fake server, a fresh server and its truth."""
    out = tmp / f"{tool}-{r}-{c}"
    out.mkdir()
    if llama_url is not None:
        start = a.llama_log.stat().st_size
        fig = (Figures(*farm_run(llama_url, hf, c, seconds, out)) if tool == "farm" else
               aiperf_run(a.aiperf, llama_url, hf, c, seconds, out))
        with open(a.llama_log, errors="replace") as log_file:
            log_file.seek(start)
            return llama_truth(fig, log_file.read())
    log = out / "fake.jsonl"
    with fake_llm(log, a.server_cpu, a.slots) as url:
        fig = (Figures(*farm_run(url, hf, c, seconds, out)) if tool == "farm" else
               aiperf_run(a.aiperf, url, hf, c, seconds, out, server_counts=True))
    tok_s, ttft, gap, held = server_truth(log)
    return replace(fig, srv_tok_s=tok_s, srv_ttft=ttft, gap=gap, srv_held=held)


def med(runs: list[Figures], pick: Callable[[Figures], float | None]) -> float | None:
    values = [v for v in map(pick, runs) if v is not None]
    return statistics.median(values) if values else None


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def per_round(got: dict[tuple[str, int], list[Figures]], c: int, pick: Callable[[Figures], float]) -> str:
    """farm / AIPerf within each round (the two ran a minute apart), their median and range."""
    return _spread([pick(f) / pick(a) for f, a in zip(got[("farm", c)], got[("aiperf", c)], strict=True)])


def service(fig: Figures, concurrency: int) -> float | None:
    """What a TTFT p50 is made of on the server's side (ms, its log): at concurrency 1 its prompt evaluation;
    above, at a server that serves one request at a time (llama-cpp-python), mostly the wait behind the c-1
    requests ahead, each a prompt evaluation and ``OUT_TOKENS - 1`` token steps. The ratio of two runs' figures
    is how much faster the host let the server run in one than in the other."""
    if fig.srv_prompt_ms is None or fig.srv_token_ms is None:
        return None
    return fig.srv_prompt_ms if concurrency == 1 else fig.srv_prompt_ms + (OUT_TOKENS - 1) * fig.srv_token_ms


def _spread(rs: list[float]) -> str:
    """Median (range) of per-round ratios."""
    if len(rs) < 2:
        return f"{rs[0]:.3f}" if rs else "-"
    return f"{statistics.median(rs):.3f} ({min(rs):.2f}-{max(rs):.2f})"


def steady(levels: list[int], got: dict[tuple[str, int], list[Figures]]) -> None:
    """AIPerf's steady-state TTFT beside farm's, what llama.cpp itself spent in each tool's runs, and the two
    ratios with the server's own speed in each run taken out (the host moves it from run to run): tokens/s times
    farm's run's ms per token over AIPerf's, TTFT times AIPerf's run's ``service`` time over farm's."""
    print("\nTTFT in the steady state (AIPerf's records without its first c requests, its ramp after the warm-up "
          "drained) and llama.cpp's own times per request in each tool's runs (its log; medians over rounds)\n")
    print("| concurrency | farm TTFT p50 ms | AIPerf steady TTFT p50 ms | farm / AIPerf steady | prompt eval ms farm "
          "/ AIPerf | prompt tokens evaluated farm / AIPerf | ms a token farm / AIPerf | tok/s farm / AIPerf at the "
          "server's speed | TTFT farm / AIPerf steady at the server's speed |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in levels:
        f, ai = got[("farm", c)], got[("aiperf", c)]
        ratio = _spread([x.ttft / y.steady_ttft for x, y in zip(f, ai, strict=True) if y.steady_ttft])
        # the server's own time per token in each run is the yardstick of how fast the host let it decode
        same_speed = _spread([x.tok_s / y.tok_s * x.srv_token_ms / y.srv_token_ms for x, y in zip(f, ai, strict=True)
                              if x.srv_token_ms and y.srv_token_ms])
        ttft_same = _spread([x.ttft / y.steady_ttft * sy / sx for x, y in zip(f, ai, strict=True)
                             if y.steady_ttft and (sx := service(x, c)) and (sy := service(y, c))])

        def pair(pick: Callable[[Figures], float | None], fmt: str, f: list[Figures] = f,
                 ai: list[Figures] = ai) -> str:
            return f"{_f(med(f, pick), fmt)} / {_f(med(ai, pick), fmt)}"
        print(f"| {c} | {_f(med(f, lambda x: x.ttft), '.2f')} | {_f(med(ai, lambda x: x.steady_ttft), '.2f')} | "
              f"{ratio} | {pair(lambda x: x.srv_prompt_ms, '.1f')} | {pair(lambda x: x.srv_prompt_tokens, '.0f')} | "
              f"{pair(lambda x: x.srv_token_ms, '.2f')} | {same_speed} | {ttft_same} |")


def table(levels: list[int], got: dict[tuple[str, int], list[Figures]], fake: bool) -> None:
    """The medians over rounds, as a Markdown table ready to paste."""
    def m(tool: str, c: int, pick: Callable[[Figures], float | None]) -> float | None:
        return med(got[(tool, c)], pick)

    print("\n| concurrency | farm tok/s | AIPerf tok/s | farm / AIPerf | farm TTFT p50 ms | AIPerf TTFT p50 ms | "
          "farm / AIPerf | AIPerf in flight |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in levels:
        ft, at = m("farm", c, lambda f: f.tok_s), m("aiperf", c, lambda f: f.tok_s)
        fl, al = m("farm", c, lambda f: f.ttft), m("aiperf", c, lambda f: f.ttft)
        assert ft and at and fl and al
        in_flight = m("aiperf", c, lambda f: f.in_flight)
        print(f"| {c} | {ft:,.0f} | {at:,.0f} | {per_round(got, c, lambda f: f.tok_s)} | {fl:.2f} | {al:.2f} | "
              f"{per_round(got, c, lambda f: f.ttft)} | {_f(in_flight, '.2f')} |")
    if not fake:
        steady(levels, got)
    turn = m("aiperf", 1, lambda f: f.turnaround) if 1 in levels else None
    if turn is not None:
        print(f"\nAIPerf's turnaround at concurrency 1 (its own stamps, p50 from a request's end to the next one's "
              f"start): {turn:.2f} ms per request, during which the server idles")
    if not fake:
        return
    print("\nvs the fake server's truth (each tool's figure over the truth of its own runs; medians over rounds)\n")
    print("| concurrency | tool | tok/s | srv tok/s | tok/s / srv | TTFT p50 ms | srv TTFT p50 ms | TTFT − srv ms "
          "| srv gap ms | srv held |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in levels:
        for tool, name in (("farm", "farm"), ("aiperf", "AIPerf")):
            runs = got[(tool, c)]
            ratio = med(runs, lambda f: f.tok_s / f.srv_tok_s if f.srv_tok_s else None)
            err = med(runs, lambda f: f.ttft - f.srv_ttft if f.srv_ttft is not None else None)
            print(f"| {c} | {name} | {_f(med(runs, lambda f: f.tok_s), ',.0f')} | "
                  f"{_f(med(runs, lambda f: f.srv_tok_s), ',.0f')} | {_f(ratio, '.3f')} | "
                  f"{_f(med(runs, lambda f: f.ttft), '.2f')} | {_f(med(runs, lambda f: f.srv_ttft), '.2f')} | "
                  f"{_f(err, '+.2f')} | {_f(med(runs, lambda f: f.gap), '.2f')} | "
                  f"{_f(med(runs, lambda f: f.srv_held), '.2f')} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", choices=("llama", "fake"), default="llama")
    p.add_argument("--quick", action="store_true", help="CI: 1 round at concurrency 1, 4 s each")
    p.add_argument("--rounds", type=int, default=4, help="even: each tool goes first in half of them")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--seconds", type=float, default=None, help="per run (default 8; --shape small 24: at c=16 a "
                                                                  "serialized request waits ~6 s)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="llama.cpp's model (see above)")
    p.add_argument("--slots", type=int, default=0, help="fake server: answers streamed at once, the others queue "
                                                         "FIFO (1: serialized, as llama-cpp-python; 0: no limit)")
    p.add_argument("--aiperf", type=Path, default=Path(os.environ.get("AIPERF") or DEFAULT_AIPERF))
    a = p.parse_args()
    if not a.aiperf.is_file():
        print(f"AIPerf not found at {a.aiperf} (python3 -m venv ~/.cache/farm/aiperf-venv && "
              "~/.cache/farm/aiperf-venv/bin/pip install aiperf): nothing measured")
        return 0
    seconds = a.seconds or (24.0 if a.shape == "small" else 8.0)
    rounds, levels, seconds = (1, [1], 4.0) if a.quick else (a.rounds, [int(c) for c in a.concurrency.split(",")],
                                                                seconds)
    cpus = sorted(os.sched_getaffinity(0))
    a.server_cpu = cpus[-1]
    fake = a.server == "fake"
    with tempfile.TemporaryDirectory(prefix="farm-vs-aiperf-") as tmp_name:
        tmp = Path(tmp_name)
        tiny = build_tiny_llama(tmp / "model", SHAPES[a.shape])
        os.sched_setaffinity(0, {cpus[-1]})  # the server inherits the last CPU; the clients get the others
        a.llama_log = tmp / "llama.log"
        server: AbstractContextManager[str | None] = (llama_cpp_server(tiny.gguf, log_path=a.llama_log) if not fake
                                                      else _none())
        with server as llama_url:
            os.sched_setaffinity(0, set(cpus[:-1]) or set(cpus))
            what = (f"the fake server (TTFT {FAKE_TTFT_MS:g} ms, a token every {FAKE_ITL_MS:g} ms)" if fake
                    else f"llama.cpp ({a.shape} model)")
            print(f"{what} on CPU {cpus[-1]}, clients on {cpus[:-1] or cpus}; {IN_TOKENS} tokens in, {OUT_TOKENS} "
                  f"out; {seconds:g} s per run, {rounds} round(s); load average "
                  f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            got: dict[tuple[str, int], list[Figures]] = {}
            for r in range(rounds):
                for c in levels:
                    order = ("farm", "aiperf") if (r + c) % 2 == 0 else ("aiperf", "farm")
                    for tool in order:
                        fig = one_run(tool, a, c, seconds, tmp, r, tiny.hf, llama_url)
                        got.setdefault((tool, c), []).append(fig)
                        print(f"  round {r + 1} c={c:<3} {tool:<6} tok/s {fig.tok_s:8.1f}  TTFT p50 {fig.ttft:8.2f} ms"
                              + (f"  turnaround {fig.turnaround:.2f} ms" if fig.turnaround is not None else "")
                              + (f"  in flight {fig.in_flight:.2f}" if fig.in_flight is not None else "")
                              + (f"  steady TTFT p50 {fig.steady_ttft:.2f} ms" if fig.steady_ttft is not None else "")
                              + (f"  | llama.cpp: prompt {_f(fig.srv_prompt_ms, '.1f')} ms for "
                                 f"{_f(fig.srv_prompt_tokens, '.0f')} tokens, {_f(fig.srv_token_ms, '.2f')} ms a token"
                                 if fig.srv_token_ms is not None else "")
                              + (f"  | server: tok/s {fig.srv_tok_s:8.1f}  TTFT p50 {fig.srv_ttft:6.2f} ms  gap "
                                 f"{_f(fig.gap, '.2f')} ms  held {_f(fig.srv_held, '.2f')}" if fig.srv_tok_s else ""),
                              flush=True)
                print(f"round {r + 1}: host yardstick {calibrate(cpus).speed:.1f} passes/s (server and client CPUs), "
                      f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    table(levels, got, fake)
    return 0


@contextmanager
def _none() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    raise SystemExit(main())
