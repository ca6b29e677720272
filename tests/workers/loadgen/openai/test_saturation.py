"""The over-saturation rule (``workers.loadgen.openai.saturation``) on synthetic samples: a queue growing with a
climbing TTFT is over-saturated; a steady server, Poisson-like noise, or only one of the two signals is not.
And the share of a step's requests within the SLO (``openai_client.slo_share``) the max-goodput search reads."""
from __future__ import annotations

import math
import random

from schemas.llm import Slo
from workers.loadgen.openai.client import slo_share
from workers.loadgen.openai.saturation import slope, verdict
from workers.loadgen.openai.stream import Outcome


def _series(f: object, n: int = 40, dt: float = 0.1) -> list[tuple[float, float]]:
    return [(i * dt, f(i * dt)) for i in range(n)]  # type: ignore[operator]


def test_slope_fits_a_line_and_its_error() -> None:
    b, se = slope(_series(lambda t: 3.0 * t + 1.0))
    assert math.isclose(b, 3.0) and se < 1e-9
    assert slope([(0.0, 1.0), (1.0, 2.0)])[1] == math.inf  # too few points


def test_growing_queue_and_climbing_ttft_is_oversaturated() -> None:
    why = verdict(_series(lambda t: 2 + 10 * t), _series(lambda t: 50 + 200 * t), now=3.9)
    assert why is not None and why.startswith("over-saturated") and "grew 10.0/s" in why


def test_steady_or_noisy_server_is_not() -> None:
    rng = random.Random(1)
    flat = _series(lambda t: 5 + rng.choice((-2, -1, 0, 1, 2)))
    ttft = _series(lambda t: 40 + rng.uniform(-10, 10))
    assert verdict(flat, ttft, now=3.9) is None


def test_one_signal_alone_is_not_enough() -> None:
    grow, climb = _series(lambda t: 2 + 10 * t), _series(lambda t: 50 + 200 * t)
    flat_n, flat_t = _series(lambda t: 5.0 + (t * 10) % 2), _series(lambda t: 40.0 + (t * 10) % 3)
    assert verdict(grow, flat_t, now=3.9) is None  # in flight grows but TTFT does not climb
    assert verdict(flat_n, climb, now=3.9) is None  # TTFT climbs but the queue does not grow
    assert verdict(_series(lambda t: 2 + 0.5 * t), climb, now=3.9) is None  # growth under 4 requests in the window


def test_too_few_samples_say_nothing() -> None:
    assert verdict(_series(lambda t: 10 * t, n=5), _series(lambda t: 200 * t), now=0.4) is None


def _outcome(ttft_ms: float) -> Outcome:
    return Outcome(end=0.0, ttft_ms=ttft_ms, e2e_ms=ttft_ms + 50, tpot_ms=5.0, itl_ms=[5.0], input_tokens=1,
                   input_source="words", output_tokens=2, output_source="usage", chunks=2, overrun=False,
                   server_ttft_ms=None, server_tpot_ms=None)


def test_slo_share_counts_failures_and_requests_cut_off_past_their_goal() -> None:
    slo = Slo(ttft_ms=100, e2e_ms=1000)
    done = [_outcome(50), _outcome(50), _outcome(150)]  # two met, one missed
    assert slo_share(done, 0, [], slo) == 2 / 3
    assert slo_share(done, 1, [], slo) == 2 / 4  # a failed request counts against it
    # in flight at the end: no first chunk after 300 ms (missed), first chunk at 40 ms and 200 ms old (may still
    # meet it: left out), 1500 ms old (missed on e2e), 60 ms old without a first chunk (left out)
    cut = [(300.0, None), (200.0, 40.0), (1500.0, 40.0), (60.0, None)]
    assert slo_share(done, 0, cut, slo) == 2 / 5
    assert slo_share(done, 0, [], None) is None and slo_share([], 0, [], slo) is None


def test_growth_under_a_fifth_of_the_arrival_rate_is_not_enough() -> None:
    grow, climb = _series(lambda t: 2 + 10 * t), _series(lambda t: 50 + 200 * t)
    assert verdict(grow, climb, now=3.9, rate=40.0) is not None  # 10/s of 40/s arriving: behind by a quarter
    assert verdict(grow, climb, now=3.9, rate=100.0) is None  # 10/s of 100/s: a stall's worth, not a trend
