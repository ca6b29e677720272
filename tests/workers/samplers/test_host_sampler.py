"""HostSampler: the machine's stolen CPU share, from the real /proc/stat and from prepared files."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from schemas.metrics import BY_NAME
from workers.samplers.host import PROC_STAT, STEAL_NOTE_PCT, HostSampler, read_steal, steal_note, steal_pct


def _stat_line(user: int, idle: int, steal: int) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {user} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 {user} 0 0 {idle} 0 0 0 {steal} 0 0\n"


@pytest.mark.skipif(not PROC_STAT.exists(), reason="no /proc/stat (not Linux)")
def test_real_proc_stat_gives_a_share_between_0_and_100() -> None:
    first = read_steal()
    assert first is not None and first[1] > 0 and 0 <= first[0] <= first[1]
    with HostSampler(interval_s=0.05) as s:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # keep a CPU busy so ticks pass
            pass
    summary = s.summary()
    assert set(summary) == {"cpu_steal_pct"}
    assert 0.0 <= summary["cpu_steal_pct"] <= 100.0
    assert len(s.samples) >= 3 and s.error is None
    assert set(summary) <= set(BY_NAME)


def test_prepared_counters_give_the_stolen_share(tmp_path: Path) -> None:
    """30 of 100 ticks stolen while sampling (the counters written by a thread, as a kernel would)."""
    stat = tmp_path / "stat"
    stat.write_text(_stat_line(user=1000, idle=5000, steal=200))

    def advance() -> None:
        time.sleep(0.15)
        stat.write_text(_stat_line(user=1050, idle=5020, steal=230))

    writer = threading.Thread(target=advance)
    with HostSampler(interval_s=0.02, path=stat) as s:
        writer.start()
        writer.join()
        time.sleep(0.05)
    assert s.summary() == {"cpu_steal_pct": 30.0}
    assert s.details()["source"] == str(stat)


def test_no_steal_column_means_not_measured(tmp_path: Path) -> None:
    old = tmp_path / "stat"
    old.write_text("cpu  10 0 5 100 0 0 0\n")  # a kernel without the steal field
    assert read_steal(old) is None
    assert read_steal(tmp_path / "missing") is None
    with HostSampler(interval_s=0.02, path=old) as s:
        time.sleep(0.05)
    assert s.summary() == {}  # null in results, never 0


def test_steal_share_and_note() -> None:
    assert steal_pct((10, 1000), (40, 1100)) == 30.0
    assert steal_pct((10, 1000), (10, 1000)) is None  # no time passed
    assert steal_note(None) is None and steal_note(STEAL_NOTE_PCT - 0.1) is None
    note = steal_note(31.4)
    assert note is not None and "31.4 %" in note and "rerun" in note
