"""Foreign load on a job's leased cores: CPU time that processes outside the job used on them while it was measured.

A core lease keeps other farm jobs off a job's cores, but not the rest of the host (a build, a backup, another
tenant's process pinned there). The kernel counts busy time per CPU (``/proc/stat``: user, nice, system, irq,
softirq; steal is the hypervisor's and is reported apart, ``cpu_steal_pct``); the job's own CPU time is what its
server's sampler reads (its cgroup or process tree, ``cpu_s``) plus the measuring process (the load generator and
the samplers, ``os.times``; for a serving job also its reaped children, e.g. perf_analyzer, and the load
generator's own processes, which a fork server starts and reaps, so ``os.times`` never sees them:
``ProcessesCpu``). What is left is
foreign: ``foreign_cpu_pct`` = (busy time of the leased cores - the job's own CPU time) / their capacity, in % (0
when the job's own time covers it all; the job's time on cores outside the lease makes the figure an under-
rather than an over-estimate). Per-CPU busy time is counted in clock ticks (10 ms), the job's in ns, so a quiet
run reads within a few % of 0.

Where the kernel offers pressure stall information (``/proc/pressure/cpu``, Linux 4.20+ with PSI on), the share of
time some runnable task on the host waited for a CPU is kept as detail (``psi_cpu_some_pct``: host-wide, so a
busy host shows there even when the job's cores were quiet).
"""
from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from farm.steal import PROC_STAT
from schemas.cpus import cpu_list
from schemas.metrics import MetricValues
from workers.samplers.base import Sampler
from workers.samplers.process import monotonic_cumulative

PROC_PSI_CPU = Path("/proc/pressure/cpu")
BUSY_FIELDS = (0, 1, 2, 5, 6)  # user nice system [idle iowait] irq softirq [steal]: time spent running something
ALL_FIELDS = 8  # user .. steal: a CPU's whole time (guest is inside user)


def read_cpu_ticks(cores: Iterable[int], path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(busy ticks, all ticks) summed over ``cores`` since boot, from the per-CPU lines of /proc/stat; None when
    a core has no line (offline, or not Linux)."""
    want = {f"cpu{c}" for c in cores}
    busy = total = 0
    seen = 0
    try:
        with open(path) as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                parts = line.split()
                if parts[0] not in want:
                    continue
                ticks = [int(v) for v in parts[1:1 + ALL_FIELDS]]
                busy += sum(ticks[i] for i in BUSY_FIELDS if i < len(ticks))
                total += sum(ticks)
                seen += 1
    except (OSError, ValueError):
        return None
    return (busy, total) if want and seen == len(want) else None


def read_psi_some_us(path: Path = PROC_PSI_CPU) -> int | None:
    """The host's cumulative CPU pressure stall time (``some total``, µs); None without PSI."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def measuring_cpu_s(children: bool = True) -> float:
    """CPU seconds of this process (every thread: the load generator and the samplers) and, with ``children``,
    of its reaped child processes."""
    t = os.times()
    return t.user + t.system + ((t.children_user + t.children_system) if children else 0.0)


class ProcessesCpu:
    """CPU seconds (user + system) used so far by processes this job started but does not reap itself (farm's
    load processes come from a fork server, which reaps them): ``pids()`` names the live ones; each one's last
    reading is kept after it exits, so the total never drops (what it used between its last reading and its exit,
    at most one sampling interval, is missed: foreign load is then over- rather than under-estimated by that)."""

    def __init__(self, pids: Callable[[], Iterable[int]], proc: Path = Path("/proc")) -> None:
        self.pids = pids
        self.proc = proc
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self._last: dict[tuple[int, int], float] = {}  # (pid, start time in ticks): CPU seconds last read

    def _read(self, pid: int) -> tuple[int, float] | None:
        """(start time in ticks, user + system CPU seconds) of ``pid`` from /proc/PID/stat; None once gone."""
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state is field 3, utime 14, stime 15, start 22
        return int(fields[19]), (int(fields[11]) + int(fields[12])) * self.tick_s

    def __call__(self) -> float:
        for pid in list(self.pids()):
            got = self._read(pid)
            if got is not None:
                self._last[(pid, got[0])] = got[1]
        return sum(self._last.values())


def job_cpu_s(children: bool = True, others: ProcessesCpu | None = None) -> float:
    """The measuring side's CPU seconds: this process and its reaped children (``measuring_cpu_s``) plus the
    processes of ``others`` (e.g. the load generator's; only with ``children``)."""
    return measuring_cpu_s(children) + (others() if children and others is not None else 0.0)


def at(series: Sequence[dict[str, float]], key: str, t: float) -> float | None:
    """The cumulative counter ``key`` of a sampler's ``series`` at time ``t`` (linear between samples, the first
    or last value outside them; drops treated as 0, ``monotonic_cumulative``); None without two samples."""
    pts = [s for s in series if key in s]
    if len(pts) < 2:
        return None
    ts = [s["t"] for s in pts]
    cum = monotonic_cumulative([s[key] for s in pts])
    i = bisect.bisect_left(ts, t)
    if i <= 0:
        return cum[0]
    if i >= len(ts):
        return cum[-1]
    span = ts[i] - ts[i - 1]
    frac = (t - ts[i - 1]) / span if span > 0 else 1.0
    return cum[i - 1] + frac * (cum[i] - cum[i - 1])


def foreign_pct(busy_s: float, own_s: float, capacity_s: float) -> float | None:
    """The foreign share of ``capacity_s`` CPU seconds, %: busy time not accounted for by the job's own time
    (floored at 0); None when no time passed."""
    if capacity_s <= 0:
        return None
    return 100.0 * max(0.0, busy_s - own_s) / capacity_s


class ForeignLoadSampler(Sampler):
    """Busy time of ``cores`` against the job's own CPU time (``server``: the sampler of the job's server or run,
    whose samples carry cumulative ``cpu_s``; ``own``: the measuring process's CPU seconds), a few times a
    second; counters are cumulative, so the figure covers the whole sampled span whatever the interval."""

    name = "foreign"

    def __init__(self, cores: Iterable[int], server: Sampler | None, own: Callable[[], float] = measuring_cpu_s,
                 interval_s: float = 0.25, stat: Path = PROC_STAT, psi: Path = PROC_PSI_CPU) -> None:
        super().__init__(interval_s)
        self.cores = sorted(set(cores))
        self.server = server
        self.own = own
        self.stat, self.psi = stat, psi
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")

    def sample(self) -> dict[str, float] | None:
        ticks = read_cpu_ticks(self.cores, self.stat)
        if ticks is None:
            return None
        s = {"busy_ticks": float(ticks[0]), "total_ticks": float(ticks[1]), "own_s": self.own()}
        psi = read_psi_some_us(self.psi)
        if psi is not None:
            s["psi_some_us"] = float(psi)
        return s

    def figures(self) -> dict[str, float | None]:
        """Over the sampled span: busy, own (measuring process and server) and capacity CPU seconds of the cores,
        and the foreign share (%); empty without two samples or when the server's CPU time is unknown."""
        if len(self.samples) < 2:
            return {}
        first, last = self.samples[0], self.samples[-1]
        server_s = 0.0
        if self.server is not None:
            start, end = at(self.server.samples, "cpu_s", first["t"]), at(self.server.samples, "cpu_s", last["t"])
            if start is None or end is None:
                return {}
            server_s = end - start
        busy = (last["busy_ticks"] - first["busy_ticks"]) * self.tick_s
        capacity = (last["total_ticks"] - first["total_ticks"]) * self.tick_s
        own = max(0.0, last["own_s"] - first["own_s"]) + server_s
        return {"busy_cpu_s": busy, "own_cpu_s": own, "server_cpu_s": server_s, "capacity_cpu_s": capacity,
                "foreign_cpu_pct": foreign_pct(busy, own, capacity)}

    def summary(self) -> MetricValues:
        pct = self.figures().get("foreign_cpu_pct")
        return {} if pct is None else {"foreign_cpu_pct": round(pct, 2)}

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cores": cpu_list(self.cores), "source": str(self.stat)}
        out.update({k: (round(v, 3) if v is not None else None) for k, v in self.figures().items()})
        psi = [s for s in self.samples if "psi_some_us" in s]
        if len(psi) >= 2 and psi[-1]["t"] > psi[0]["t"]:
            out["psi_cpu_some_pct"] = round(
                100.0 * (psi[-1]["psi_some_us"] - psi[0]["psi_some_us"]) / 1e6 / (psi[-1]["t"] - psi[0]["t"]), 2)
        return out
