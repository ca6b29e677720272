"""The foreign load on a job's leased cores, from controlled counters: per-CPU busy time less the job's own CPU
time, PSI as detail, and the "host busy" flag judged on the measured figure."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from schemas.result import host_busy, host_flags, host_notes
from workers.samplers.base import Sampler
from workers.samplers.foreign import (
    ForeignLoadSampler,
    ProcessesCpu,
    at,
    foreign_pct,
    job_cpu_s,
    measuring_cpu_s,
    read_cpu_ticks,
    read_psi_some_us,
)

HZ = os.sysconf("SC_CLK_TCK")


def _stat(path: Path, cpu0: tuple[int, int], cpu1: tuple[int, int]) -> None:
    """A /proc/stat with cpu0 and cpu1 at (busy, idle) ticks: busy split as user 2/3, system 1/3, plus steal on
    cpu1 that must count as neither busy nor foreign."""
    def line(name: str, busy: int, idle: int, steal: int = 0) -> str:
        return f"{name} {busy * 2 // 3} 0 {busy - busy * 2 // 3} {idle} 0 0 0 {steal} 0 0\n"

    total = (cpu0[0] + cpu1[0], cpu0[1] + cpu1[1])
    path.write_text(line("cpu", *total) + line("cpu0", *cpu0) + line("cpu1", *cpu1, steal=5) + "intr 1 2 3\n")


class _Server(Sampler):
    """A server sampler whose cumulative ``cpu_s`` is set by the test."""

    name = "server"

    def sample(self) -> dict[str, float] | None:
        return None

    def summary(self) -> dict[str, Any]:
        return {}


def _measured(tmp_path: Path, busy_ticks: int, server_s: float, own_s: float) -> ForeignLoadSampler:
    """A sampler over cpu0 for 1 s of capacity (HZ ticks) with ``busy_ticks`` busy, the server using
    ``server_s`` and the measuring process ``own_s`` CPU seconds meanwhile."""
    stat, psi = tmp_path / "stat", tmp_path / "cpu.pressure"
    own = iter([10.0, 10.0 + own_s])
    server = _Server()
    s = ForeignLoadSampler([0], server, own=lambda: next(own), stat=stat, psi=psi)
    _stat(stat, (1000, 5000), (7, 7))
    psi.write_text("some avg10=1.00 avg60=0.50 avg300=0.10 total=1000000\nfull avg10=0 avg60=0 avg300=0 total=0\n")
    first = s.sample()
    _stat(stat, (1000 + busy_ticks, 5000 + HZ - busy_ticks), (7 + HZ, 7))  # cpu1 busy: not leased, not counted
    psi.write_text("some avg10=1.00 avg60=0.50 avg300=0.10 total=1250000\nfull avg10=0 avg60=0 avg300=0 total=0\n")
    last = s.sample()
    assert first is not None and last is not None
    first["t"], last["t"] = 100.0, 101.0
    s.samples = [first, last]
    server.samples = [{"t": 99.5, "cpu_s": 1.0}, {"t": 101.5, "cpu_s": 1.0 + 2 * server_s}]  # linear in between
    return s


def test_per_cpu_ticks_count_busy_time_of_the_leased_cores_only(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, (300, 700), (30, 70))
    assert read_cpu_ticks([0], stat) == (300, 1000)
    assert read_cpu_ticks([0, 1], stat) == (330, 1105)  # cpu1's 5 steal ticks are capacity, not busy
    assert read_cpu_ticks([2], stat) is None  # a core the kernel does not list
    assert read_cpu_ticks([0], tmp_path / "missing") is None


def test_psi_is_read_where_the_kernel_offers_it(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=4242\nfull avg10=0 avg60=0 avg300=0 total=0\n")
    assert read_psi_some_us(psi) == 4242
    assert read_psi_some_us(tmp_path / "none") is None


def test_a_cumulative_counter_is_interpolated_between_samples() -> None:
    series = [{"t": 0.0, "cpu_s": 1.0}, {"t": 2.0, "cpu_s": 3.0}, {"t": 4.0, "cpu_s": 3.5}]
    assert at(series, "cpu_s", 1.0) == 1.0 and at(series, "cpu_s", 3.0) == 2.25
    assert at(series, "cpu_s", -1.0) == 0.0 and at(series, "cpu_s", 9.0) == 2.5  # clamped to the series
    assert at(series[:1], "cpu_s", 0.0) is None
    assert foreign_pct(1.0, 0.4, 2.0) == 30.0 and foreign_pct(0.5, 0.9, 2.0) == 0.0 and foreign_pct(1, 0, 0) is None


def test_a_quiet_run_measures_near_zero_and_is_not_flagged(tmp_path: Path) -> None:
    """Busy time of the leased core = the server's + the load generator's own: nothing foreign, no note."""
    s = _measured(tmp_path, busy_ticks=HZ * 7 // 10, server_s=0.5, own_s=0.19)
    figures = s.figures()
    assert abs(figures["busy_cpu_s"] - 0.7) < 0.02 and abs(figures["server_cpu_s"] - 0.5) < 1e-9  # type: ignore[operator]
    metrics = s.summary()
    assert metrics["foreign_cpu_pct"] < 2.0
    assert host_busy(metrics, 10.0) is None and host_notes(metrics, 10.0, 10.0) == []
    assert s.details()["psi_cpu_some_pct"] == 25.0 and s.details()["cores"] == "0"


def test_a_hog_on_the_leased_core_is_measured_and_flagged_host_busy(tmp_path: Path) -> None:
    """The same run with another process taking 0.6 s of the core's second: 60 % foreign, flagged."""
    s = _measured(tmp_path, busy_ticks=HZ, server_s=0.25, own_s=0.15)
    metrics = s.summary()
    assert 55.0 <= metrics["foreign_cpu_pct"] <= 62.0
    assert host_busy(metrics, 10.0) == metrics["foreign_cpu_pct"] and host_flags(metrics, 10.0, 10.0) == [
        f"busy {metrics['foreign_cpu_pct']:.0f}%"]
    assert "host busy" in host_notes(metrics, 10.0, 10.0)[0]
    assert host_busy(metrics, 70.0) is None  # the bound is a setting


def test_an_unknown_server_time_gives_no_figure(tmp_path: Path) -> None:
    s = _measured(tmp_path, busy_ticks=HZ // 2, server_s=0.1, own_s=0.1)
    assert s.server is not None
    s.server.samples = []  # e.g. the Docker stats fallback, which has no cpu_s
    assert s.summary() == {} and "foreign_cpu_pct" not in s.details()


def test_the_real_counters_sample_this_hosts_cores() -> None:
    s = ForeignLoadSampler(sorted(os.sched_getaffinity(0)), None, interval_s=0.05)
    with s:
        time.sleep(0.3)
    assert len(s.samples) >= 2 and s.error is None
    assert 0.0 <= s.summary()["foreign_cpu_pct"] <= 100.0
    assert measuring_cpu_s(children=False) <= measuring_cpu_s()


def test_the_load_processes_cpu_time_is_the_jobs_own(tmp_path: Path) -> None:
    """farm's load processes (a fork server reaps them, so ``os.times`` never sees them) count as the job's own
    CPU time, and what one used is kept after it exited."""
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\n"
                             "while time.process_time() - t < 0.3:\n    pass\ntime.sleep(30)\n"])
    try:
        live = {spin.pid}
        tracker = ProcessesCpu(lambda: sorted(live))
        deadline = time.monotonic() + 20
        while tracker() < 0.25 and time.monotonic() < deadline:
            time.sleep(0.05)
        used = tracker()
        assert used >= 0.25
        assert job_cpu_s(True, tracker) >= used and job_cpu_s(False, tracker) < job_cpu_s(True, tracker)
    finally:
        spin.kill()
        spin.wait()
    live.clear()
    assert tracker() == pytest.approx(used, abs=0.05)  # gone, its time kept

