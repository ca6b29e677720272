"""The host yardstick: a short fixed calibration on chosen cores, its cost, and the drift flag on its change."""
from __future__ import annotations

import os

import pytest

from schemas.result import host_drift, host_flags, host_notes
from workers.samplers.calibrate import CALIBRATION_REPS, Calibration, calibrate, speed_change_pct

CORES = sorted(os.sched_getaffinity(0))


def test_a_calibration_runs_on_the_cores_given_and_restores_the_threads_cpu_set() -> None:
    before = os.sched_getaffinity(0)
    c = calibrate(CORES[:1])
    assert os.sched_getaffinity(0) == before
    assert c.cores == str(CORES[0]) and len(c.reps_s) == CALIBRATION_REPS
    assert c.speed == 1.0 / min(c.reps_s) > 0
    assert sum(c.reps_s) <= c.cost_s < 2.0  # ~0.1 s on a quiet 2-core VM; generous for a loaded test host
    d = c.as_dict()
    assert d["cores"] == c.cores and len(d["reps_ms"]) == CALIBRATION_REPS  # type: ignore[arg-type]


def test_the_change_is_after_vs_before_and_a_drift_beyond_the_bound_is_noted() -> None:
    slow, fast = Calibration(40.0, (0.025,), "0", 0.1), Calibration(50.0, (0.02,), "0", 0.1)
    assert speed_change_pct(slow, fast) == pytest.approx(25.0) and speed_change_pct(fast, slow) == pytest.approx(-20.0)
    assert host_drift({"host_speed_change_pct": -20.0}, 10.0) == -20.0
    assert host_drift({"host_speed_change_pct": 4.0}, 10.0) is None and host_drift({}, 10.0) is None
    assert host_flags({"host_speed_change_pct": -20.0, "foreign_cpu_pct": 1.0}, 10.0, 10.0) == ["drift -20%"]
    assert "changed by -20.0 %" in host_notes({"host_speed_change_pct": -20.0}, 10.0, 10.0)[0]
