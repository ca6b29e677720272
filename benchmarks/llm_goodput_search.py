"""Does the max-goodput search (``--search max-goodput``: ``scheduler.goodput_rules``, the over-saturation stop
of ``workers.loadgen.openai.saturation``) find what a brute-force rate sweep finds, in far fewer steps?

Server: the scripted fake OpenAI server (``tests/fake_openai.py``) with a known capacity: ``SLOTS`` answers
stream at once, the others queue; each answer is a TTFT of ``TTFT_MS`` then ``OUTPUT - 1`` tokens ``ITL_MS``
apart (``SLOTS / service time`` requests/s at most). SLO: TTFT <= ``SLO_TTFT_MS``; a rate passes when >= 95 %
of its measured requests meet it. Every step is one run of farm's OpenAI client (``OpenAIClient``, the code a
job runs) at a Poisson rate: warm-up ``WARMUP_S`` then ``STEP_S`` measured. Client and server are pinned to
separate CPUs.

* brute force: every rate of a fine grid (5 % apart, geometric) from ``--low`` to ``--high``, each run to its
  end (no over-saturation stop, as a plain ``--rate LIST`` sweep); its answer: the highest passing rate (also
  shown: the highest passing rate below the lowest failing one, the search's own reading; the two differ
  where a noisy step near the edge failed).
* search: the rule from ``--start``, each step stopped early when over-saturated, as a job of the search runs.

Order: yardstick, search, yardstick, brute force, yardstick (and without ``--quick``: a second search and a
last yardstick). Printed: each method's answer, steps and measuring time; the search's rate / the
brute-force rate (target: within 5 %) and its steps / brute-force steps (target: <= 1/3); the host load
before and after; the yardstick between the phases: the server's measured capacity (closed loop at
``SLOTS`` concurrency, requests/s) against its nominal one (a host whose speed changes between the phases
moves the answers apart).
``--quick`` (CI): 1 s steps (else 3 s) and a grid over a narrower range (24..40 req/s, 11 steps around the
capacity), so "a third of its steps" is a harder target there.

Run: ``python benchmarks/llm_goodput_search.py [--quick]``. Asserts nothing.
"""
from __future__ import annotations

import argparse
import math
import os
import time

from _serve import pin, split_cpus  # noqa: I001 (sets sys.path)

from scheduler.goodput_rules import BRACKET, RateStep, decide_rate, round_rate
from schemas import MeasurementSettings
from schemas.llm import LlmSettings
from schemas.load_levels import load_level
from tests.fake_openai import fake_server
from workers.loadgen.contract import LoadJob
from workers.loadgen.openai.client import OpenAIClient
from workers.loadgen.plan import WindowPlan

SLOTS, TTFT_MS, ITL_MS, OUTPUT = 2, 20.0, 5.0, 8
SLO_TTFT_MS = 150.0
WARMUP_S = 0.5
STEP_S = 3.0  # measured per step, s (--quick: 1, a smoke run)
NOMINAL = SLOTS / ((TTFT_MS + (OUTPUT - 1) * ITL_MS) / 1e3)  # requests/s on an idle host


def settings(rate: float | None, stop_oversaturated: bool, step_s: float) -> MeasurementSettings:
    """One step's measurement: Poisson at ``rate`` (None: closed loop), the SLO, the over-saturation stop on
    for the search's steps (``search: max-goodput``) and off for brute force."""
    llm = LlmSettings(input_tokens=16, output_tokens=OUTPUT, slo={"ttft_ms": SLO_TTFT_MS})  # type: ignore[arg-type]
    if rate is None:
        return MeasurementSettings(warmup_s=WARMUP_S, duration_s=step_s, llm=llm)
    return MeasurementSettings(mode="poisson", rate=rate, warmup_s=WARMUP_S, duration_s=step_s, llm=llm,
                               search="max-goodput" if stop_oversaturated else "brute")


def measure(url: str, rate: float | None, stop_oversaturated: bool, seed: int) -> tuple[RateStep, float]:
    """One step against the server at ``url``: its :class:`RateStep` and completed requests/s."""
    s = settings(rate, stop_oversaturated, STEP_S)
    job = LoadJob(url=url.removeprefix("http://"), model_name="fake", inputs=(), batch_size=1,
                  load=load_level(s.mode, SLOTS, s.rate), settings=s, seed=seed)
    rec = OpenAIClient().run(job, WindowPlan.of(s))
    own = rec.own
    done = rec.totals.lat_ms.size / rec.totals.duration_s
    share = getattr(own, "slo_met_share", None)
    return RateStep(rate or 0.0, share, bool(getattr(own, "oversaturated", False)), None), done


def grid(low: float, high: float) -> list[float]:
    """Rates from ``low`` to ``high``, 5 % apart (geometric), rounded as the search rounds them."""
    n = math.ceil(math.log(high / low) / math.log(1 + BRACKET))
    return sorted({round_rate(low * (1 + BRACKET) ** i) for i in range(n + 1)})


def answer(steps: list[RateStep], below_failure: bool = False) -> float | None:
    """The highest passing rate (``below_failure``: below the lowest failing one); None: none passed."""
    bad = min((s.rate for s in steps if not s.passed), default=math.inf) if below_failure else math.inf
    return max((s.rate for s in steps if s.passed and s.rate < bad), default=None)


def brute(url: str, rates: list[float]) -> tuple[list[RateStep], float]:
    t0, steps = time.monotonic(), []
    for i, r in enumerate(rates):
        steps.append(measure(url, r, False, seed=i)[0])
    return steps, time.monotonic() - t0


def search(url: str, start: float) -> tuple[list[RateStep], str, float]:
    t0, steps = time.monotonic(), []
    while (d := decide_rate(start, steps)).next is not None:
        steps.append(measure(url, d.next, True, seed=len(steps))[0])
    return steps, d.reason, time.monotonic() - t0


def _trace(steps: list[RateStep]) -> str:
    return " ".join(f"{s.rate:g}{'' if s.passed else ('!' if s.oversaturated else 'x')}" for s in steps)


def _capacity(url: str) -> float:
    """The yardstick: the server's completed requests/s in a closed loop at ``SLOTS`` concurrency."""
    return measure(url, None, False, 0)[1]


def _report(label: str, found: list[RateStep], why: str, secs: float, best: float | None, n_brute: int) -> None:
    got = answer(found)
    print(f"{label}: {len(found)} steps in {secs:.0f} s: {_trace(found)}")
    print(f"  -> {why}")
    if best and got:
        print(f"  search / brute force: rate {got:g} / {best:g} = {got / best:.3f} (target 0.95..1.05); "
              f"steps {len(found)} / {n_brute} = {len(found) / n_brute:.2f} (target <= 0.33)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI: one search, a brute-force grid over 24..40 req/s")
    p.add_argument("--start", type=float, default=8.0, help="the search's first rate, req/s")
    p.add_argument("--low", type=float, default=None, help="the grid's lowest rate (default 4, --quick 24)")
    p.add_argument("--high", type=float, default=None, help="the grid's highest rate (default 64, --quick 40)")
    args = p.parse_args()
    global STEP_S  # noqa: PLW0603 - one setting for every step of the run
    STEP_S = 1.0 if args.quick else STEP_S
    low, high = args.low or (24.0 if args.quick else 4.0), args.high or (40.0 if args.quick else 64.0)
    client_cpus, server_cpus = split_cpus()
    pin(client_cpus)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    print(f"fake server: {SLOTS} slots, TTFT {TTFT_MS:g} ms + {OUTPUT - 1} x {ITL_MS:g} ms (nominal capacity "
          f"{NOMINAL:.1f} req/s); SLO ttft<={SLO_TTFT_MS:g} ms for 95 %; steps {WARMUP_S:g} s + {STEP_S:g} s")
    yard: list[float] = []
    searches = []
    with fake_server(model="fake", ttft_ms=TTFT_MS, itl_ms=ITL_MS, slots=SLOTS,
                     cpus=",".join(map(str, sorted(server_cpus or [])))) as url:
        yard.append(_capacity(url))
        searches.append(search(url, args.start))
        yard.append(_capacity(url))
        swept, brute_s = brute(url, grid(low, high))
        yard.append(_capacity(url))
        if not args.quick:  # a second search after the sweep: the host's drift shows between the two
            searches.append(search(url, args.start))
            yard.append(_capacity(url))
    best, monotone = answer(swept), answer(swept, below_failure=True)
    print(f"yardstick: the server's capacity (closed loop, concurrency {SLOTS}) before/between the phases: "
          f"{' / '.join(f'{y:.1f}' for y in yard)} req/s (nominal {NOMINAL:.1f}): a host that changes speed "
          "moves the answer with it")
    print(f"brute force {low:g}..{high:g}/s 5 % apart: {len(swept)} steps in {brute_s:.0f} s: {_trace(swept)}")
    print(f"  -> highest passing rate {best} (below its first failure: {monotone})")
    for k, (found, why, secs) in enumerate(searches):
        _report(f"search {k + 1} from {args.start:g}/s ({'before' if k == 0 else 'after'} the sweep)", found, why,
                secs, best, len(swept))
    print("(x: under 95 % within the SLO; !: stopped as over-saturated)")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
