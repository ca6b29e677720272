"""The over-saturation rule (``workers.loadgen.saturation``) on synthetic samples: a queue growing with a
climbing TTFT is over-saturated; a steady server, Poisson-like noise, or only one of the two signals is not."""
from __future__ import annotations

import math
import random

from workers.loadgen.saturation import slope, verdict


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
