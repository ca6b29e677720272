"""CPU and memory of a process tree (a server and all its children) through psutil.

CPU comes from cumulative CPU seconds, not from per-sample ``cpu_percent`` (which at 20 Hz has a
resolution of one clock tick, 10 ms = 20 %), kept per process so that children coming and going are
counted once: the tree's total is the own user+system time of every process ever seen in it (its last
reading once it is gone) plus, per process, the time of reaped children that were never seen or that
ran on after their last reading (its ``children_*`` times less those of its seen children that are
gone). Each part only grows, so a child reaped between reading its parent and reading itself (missing
from one sample, back in its parent's ``children_*`` in the next) is not counted twice.
Memory is the summed RSS (pages shared between forked workers count once per process).
"""
from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

import psutil

from farm.errors import SamplerError
from schemas.metrics import MetricValues
from workers.samplers.base import Sampler

PEAK_WINDOW_S = 0.5


def monotonic_cumulative(values: Sequence[float]) -> list[float]:
    """A cumulative counter with any drop (a counter reset, a child leaving the tree) treated as 0."""
    out: list[float] = []
    acc = 0.0
    for i, v in enumerate(values):
        if i:
            acc += max(0.0, v - values[i - 1])
        out.append(acc)
    return out


def rate_avg(ts: Sequence[float], cum: Sequence[float]) -> float | None:
    """Average rate of a cumulative counter over the whole span (units of ``cum`` per second)."""
    if len(ts) < 2 or ts[-1] <= ts[0]:
        return None
    return (cum[-1] - cum[0]) / (ts[-1] - ts[0])


def rate_peak(ts: Sequence[float], cum: Sequence[float], window_s: float = PEAK_WINDOW_S) -> float | None:
    """Highest rate of a cumulative counter over any window of at least ``window_s`` seconds (shorter
    windows alias with scheduler ticks and CFS quota periods); the whole-span average if shorter."""
    avg = rate_avg(ts, cum)
    if avg is None:
        return None
    best: float | None = None
    j = 0
    for i in range(len(ts)):
        while j + 1 < i and ts[i] - ts[j + 1] >= window_s:
            j += 1
        dt = ts[i] - ts[j]
        if dt >= window_s:
            r = (cum[i] - cum[j]) / dt
            best = r if best is None else max(best, r)
    return avg if best is None else best


def _vm_hwm(pid: int) -> int:
    """The process's peak RSS (``VmHWM``, bytes) from /proc/<pid>/status; 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tree_pids(root: int) -> list[int] | None:
    """``root`` and its descendants, parents first, from ``/proc/PID/task/TID/children`` (Linux 3.5+ with
    CONFIG_PROC_CHILDREN); None where the kernel has no such lists. A process that exits during the walk is
    left out with its children."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return None
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    todo += map(int, f.read().split())
            except OSError:
                continue
    return out


class ProcessTreeSampler(Sampler):
    """Samples process ``pid`` and its descendants at ``interval_s`` (default 0.05 s = 20 Hz).

    Sample keys: ``cpu_s`` (cumulative CPU seconds of the tree), ``rss`` (B, summed; absent from the last sample
    of a run that exited unreaped: its CPU times are final, its RSS reads 0), ``nprocs``. A run never seen
    running is not sampled at all.
    ``mem_peak_bytes`` is the larger of the sampled peak and the highest per-process ``VmHWM`` seen (the
    kernel's own peak RSS of any single process), so a short spike in the main process is not missed.
    """

    name = "process"

    def __init__(self, pid: int, interval_s: float = 0.05, peak_window_s: float = PEAK_WINDOW_S) -> None:
        super().__init__(interval_s)
        self.pid = pid
        self.peak_window_s = peak_window_s
        self._root: psutil.Process | None = None
        self._hwm = 0
        self.gone = False
        # per process (psutil.Process: pid + start time, so a reused pid is another key)
        self._own: dict[psutil.Process, float] = {}       # last own user+system, s
        self._kids: dict[psutil.Process, float] = {}      # last children_user+children_system, s
        self._parent: dict[psutil.Process, psutil.Process | None] = {}  # in the tree, when first seen
        self._unseen: dict[psutil.Process, float] = {}    # most reaped-children time not seen otherwise, s
        self._tree: list[psutil.Process] = []             # the tree as last listed, root first

    def before(self) -> None:
        try:
            self._root = psutil.Process(self.pid)
        except psutil.NoSuchProcess as exc:
            raise SamplerError(f"process {self.pid} does not exist; the server exited early") from exc

    def sample(self) -> dict[str, float] | None:
        if self._root is None:
            self.before()
        root = self._root
        assert root is not None
        if self.gone:
            return None
        try:
            procs = self._list(root)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self.gone = True
            return None
        taken = self._read_all(procs, root)
        if taken is None:  # never seen running: nothing of the run to sample
            self.gone = True
            return None
        read, rss, exited = taken
        if not read:
            self.gone = True
            return None
        now = set(read)
        gone_by_parent: dict[psutil.Process, float] = {}
        for c, parent in self._parent.items():
            if parent is not None and c not in now:
                gone_by_parent[parent] = gone_by_parent.get(parent, 0.0) + self._own[c] + self._kids[c]
        for p in read:
            unseen = self._kids[p] - gone_by_parent.get(p, 0.0)
            self._unseen[p] = max(self._unseen.get(p, 0.0), unseen)
        cpu_s = sum(self._own.values()) + sum(self._unseen.values())
        n = len(read)
        if exited:
            return {"cpu_s": cpu_s, "nprocs": float(n)}
        return {"cpu_s": cpu_s, "rss": float(rss), "nprocs": float(n)}

    def _read_all(self, procs: list[psutil.Process], root: psutil.Process
                  ) -> tuple[list[psutil.Process], int, bool] | None:
        """Read every process of the tree: those read, their summed RSS (B) and whether the root has exited
        unreaped (its CPU times final, its RSS not read); None when the root has exited before any sample.
        Parents before their children (psutil walks down from the root): a child reaped between the two
        readings is then missing from this sample, never counted twice in it."""
        by_pid = {p.pid: p for p in procs}
        rss, exited = 0, False
        read: list[psutil.Process] = []
        for p in procs:
            try:
                rss += self._read(p, root, by_pid)
            except psutil.ZombieProcess:
                if p != root:
                    continue
                if not self.samples:
                    return None
                exited = self.gone = True
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            read.append(p)
        return read, rss, exited

    def _read(self, p: psutil.Process, root: psutil.Process, by_pid: dict[int, psutil.Process]) -> int:
        """Record process ``p``'s CPU times and peak RSS; its RSS (B). A zombie root raises ZombieProcess."""
        with p.oneshot():
            zombie = p == root and p.status() == psutil.STATUS_ZOMBIE
            if zombie and not self.samples:
                raise psutil.ZombieProcess(p.pid)
            t = p.cpu_times()
            m = None if zombie else p.memory_info()
            if p not in self._parent:
                self._parent[p] = by_pid.get(p.ppid()) if p != root else None
        self._own[p] = t.user + t.system
        self._kids[p] = t.children_user + t.children_system
        if m is None:
            raise psutil.ZombieProcess(p.pid)  # its CPU times recorded: the caller takes a CPU-only last sample
        self._hwm = max(self._hwm, _vm_hwm(p.pid))
        return int(m.rss)

    def _list(self, root: psutil.Process) -> list[psutil.Process]:
        """The tree, parents before their children: from the kernel's per-thread ``children`` lists where it
        has them, else psutil's ``children(recursive=True)``. psutil reads every process's
        ``/proc/PID/stat`` on the host to find children (about 1.3-2 ms with 85 processes here, 3-5 % of a
        core at 20 Hz, and that core is the load generator's); the per-thread lists cost 0.1 ms for a
        10-thread server. A process in the last listing under the same pid is kept as the same one."""
        pids = _tree_pids(root.pid)
        if pids is None:
            self._tree = [root, *root.children(recursive=True)]
            return self._tree
        known = {p.pid: p for p in self._tree}
        tree = [root]
        for pid in pids[1:]:
            proc = known.get(pid)
            if proc is None:
                try:
                    proc = psutil.Process(pid)
                except psutil.NoSuchProcess:
                    continue
            tree.append(proc)
        self._tree = tree
        return tree

    def summary(self) -> MetricValues:
        """``cpu_pct_avg``, ``cpu_pct_peak`` (% of one core, peak over >= ``peak_window_s`` windows),
        ``mem_avg_bytes``, ``mem_peak_bytes``; absent when there are too few samples."""
        if not self.samples:
            return {}
        ts = [s["t"] for s in self.samples]
        cum = monotonic_cumulative([s["cpu_s"] for s in self.samples])
        out: MetricValues = {}
        avg = rate_avg(ts, cum)
        if avg is not None:
            out["cpu_pct_avg"] = 100.0 * avg
            out["cpu_pct_peak"] = 100.0 * (rate_peak(ts, cum, self.peak_window_s) or avg)
        rss = [s["rss"] for s in self.samples if "rss" in s]
        if rss:
            out["mem_avg_bytes"] = int(statistics.fmean(rss))
            out["mem_peak_bytes"] = int(max(max(rss), self._hwm))
        return out

    def details(self) -> dict[str, Any]:
        """Sample count and rate, the sampled vs. VmHWM peaks, the most processes seen at once."""
        n = len(self.samples)
        span = self.samples[-1]["t"] - self.samples[0]["t"] if n > 1 else 0.0
        return {
            "pid": self.pid,
            "samples": n,
            "rate_hz": (n - 1) / span if span > 0 else None,
            "mem_peak_sampled_bytes": int(max((s["rss"] for s in self.samples if "rss" in s), default=0)) or None,
            "vm_hwm_max_bytes": self._hwm,
            "nprocs_max": int(max(s["nprocs"] for s in self.samples)) if n else None,
            "exited": self.gone,
            "error": self.error,
        }

