"""CPU, memory, OOM and I/O of one cgroup (a container or a limited server), cgroup v2 and v1.

A cgroup is a ``CgroupSet`` (``workers.samplers.cgroupfs``): on v2 one directory; on v1 one directory
per controller hierarchy (``cpuacct``, ``memory``, ``blkio``, ...), which may sit at different relative
paths. A single ``Path`` (``cgroup_of_pid``, ``find_container_cgroup``, ``ServingTarget.cgroup_path``)
resolves to a set with ``CgroupSet.from_path``. ``workers.limits.LimitedCgroup`` creates one with
CPU/memory limits.
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from farm.errors import SamplerError
from schemas.metrics import MetricValues
from workers.samplers.base import Sampler
from workers.samplers.cgroupfs import (
    CgroupMount,
    CgroupSet,
    cgroup_mounts,
    cgroup_of_pid,
    cgroup_set_of_pid,
    find_container_cgroup,
    io_v1,
    io_v2,
    memory_on_v1,
    net_bytes,
    pid_cgroups,
    read_int,
    read_kv,
    read_limits,
)
from workers.samplers.process import PEAK_WINDOW_S, monotonic_cumulative, rate_avg, rate_peak

__all__ = [
    "CgroupMount",
    "CgroupSampler",
    "CgroupSet",
    "cgroup_mounts",
    "cgroup_of_pid",
    "cgroup_set_of_pid",
    "find_container_cgroup",
    "memory_on_v1",
    "net_bytes",
    "pid_cgroups",
    "read_limits",
]


class CgroupSampler(Sampler):
    """Samples one cgroup at ``interval_s`` (default 0.05 s = 20 Hz).

    Sample keys: ``cpu_s`` (cumulative CPU seconds), ``mem`` (B, current usage as the kernel charges it,
    page cache included, which is what the limit applies to), ``mem_peak_k`` (B, the kernel's peak when it
    provides one), ``oom_kill`` (count), ``io_r``/``io_w`` (B, cumulative block I/O), ``net_rx``/``net_tx``
    (B, cumulative, non-loopback interfaces of ``pid``'s or a member's network namespace).

    ``reset_peak``: reset the kernel peak when sampling starts (v1 ``memory.max_usage_in_bytes``, v2
    per-file ``memory.peak`` on kernels >= 6.12); use it when the cgroup outlives one job (a reused
    container). Otherwise the peak covers the cgroup's life (server start-up included). If the cgroup
    disappears (the container exited), sampling stops and the last values stand.
    """

    name = "cgroup"

    def __init__(
        self,
        cgroup: Path | CgroupSet,
        pid: int | None = None,
        interval_s: float = 0.05,
        reset_peak: bool = False,
        net: bool = True,
        peak_window_s: float = PEAK_WINDOW_S,
    ) -> None:
        super().__init__(interval_s)
        self._given = cgroup
        self.cg: CgroupSet | None = cgroup if isinstance(cgroup, CgroupSet) else None
        self.pid = pid
        self.reset_peak = reset_peak
        self.net = net
        self.peak_window_s = peak_window_s
        self.gone = False
        self.peak_scope = "cgroup_lifetime"
        self._peak_fd: int | None = None
        self._oom_base = 0
        self._net_pid: int | None = pid

    def _resolve(self) -> CgroupSet:
        if self.cg is None:
            assert isinstance(self._given, Path)
            if not self._given.is_dir():
                raise SamplerError(f"cgroup {self._given} does not exist; did the container/server exit?")
            self.cg = CgroupSet.from_path(self._given, self.pid)
        return self.cg

    def before(self) -> None:
        cg = self._resolve()
        if not cg.path.is_dir():
            raise SamplerError(f"cgroup {cg.path} does not exist; did the container/server exit?")
        if self.reset_peak:
            self._do_reset_peak(cg)
        first = self._read(cg)
        if first is not None:
            self._oom_base = int(first.get("oom_kill", 0))

    def _do_reset_peak(self, cg: CgroupSet) -> None:
        if cg.version == 1:
            mem = cg.dir("memory")
            try:
                if mem is not None:
                    (mem / "memory.max_usage_in_bytes").write_text("0")
                    self.peak_scope = "since_sampling"
            except OSError:
                pass
            return
        assert cg.unified is not None
        try:
            fd = os.open(cg.unified / "memory.peak", os.O_RDWR)
        except OSError:
            return
        try:
            os.write(fd, b"reset\n")
        except OSError:
            os.close(fd)
            return
        self._peak_fd = fd
        self.peak_scope = "since_sampling"

    def _peak_v2(self, d: Path) -> int | None:
        if self._peak_fd is not None:
            try:
                return int(os.pread(self._peak_fd, 64, 0).strip())
            except (OSError, ValueError):
                return None
        return read_int(d / "memory.peak")

    def _read(self, cg: CgroupSet) -> dict[str, float] | None:
        """One sample of the cgroup's counters (None: neither CPU nor memory is readable)."""
        got = self._read_v2(cg) if cg.version == 2 else self._read_v1(cg)
        if got is None:
            return None
        s, io = got
        if io is not None:
            s["io_r"], s["io_w"] = float(io[0]), float(io[1])
        if self.net:
            nb = self._net(cg)
            if nb is not None:
                s["net_rx"], s["net_tx"] = float(nb[0]), float(nb[1])
        return s

    def _read_v2(self, cg: CgroupSet) -> tuple[dict[str, float], tuple[int, int] | None] | None:
        d = cg.unified
        assert d is not None
        usage = read_kv(d / "cpu.stat").get("usage_usec")
        mem = read_int(d / "memory.current")
        if usage is None and mem is None:
            return None
        s: dict[str, float] = {}
        if usage is not None:
            s["cpu_s"] = usage / 1e6
        if mem is not None:
            s["mem"] = float(mem)
        peak = self._peak_v2(d)
        if peak is not None:
            s["mem_peak_k"] = float(peak)
        ev = read_kv(d / "memory.events")
        if "oom_kill" in ev:
            s["oom_kill"] = float(ev["oom_kill"])
        return s, io_v2(d / "io.stat")

    def _read_v1(self, cg: CgroupSet) -> tuple[dict[str, float], tuple[int, int] | None] | None:
        acct, memd = cg.dir("cpuacct"), cg.dir("memory")
        usage_ns = read_int(acct / "cpuacct.usage") if acct else None
        mem = read_int(memd / "memory.usage_in_bytes") if memd else None
        if usage_ns is None and mem is None:
            return None
        s: dict[str, float] = {}
        if usage_ns is not None:
            s["cpu_s"] = usage_ns / 1e9
        if mem is not None and memd is not None:
            s["mem"] = float(mem)
            s.update(_memory_v1(memd))
        blk = cg.dir("blkio")
        return s, (io_v1(blk) if blk else None)

    def _net(self, cg: CgroupSet) -> tuple[int, int] | None:
        if self._net_pid is not None:
            nb = net_bytes(self._net_pid)
            if nb is not None:
                return nb
        procs = cg.pids()
        self._net_pid = procs[0] if procs else None
        return net_bytes(self._net_pid) if self._net_pid is not None else None

    def sample(self) -> dict[str, float] | None:
        if self.gone:
            return None
        cg = self._resolve()
        if isinstance(self._given, Path) and cg.version == 1 and "cpuacct" not in cg.v1 and cg.pids():
            # Resolved from a bare path before any process joined: find the other hierarchies now.
            cg = self.cg = CgroupSet.from_path(self._given, self.pid)
        s = self._read(cg)
        if s is None:
            if not cg.path.is_dir():
                self.gone = True
                return None
            raise SamplerError(
                f"cgroup {cg.path} has no readable cpu/memory files; is the controller enabled?"
            )
        return s

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            if self._peak_fd is not None:
                os.close(self._peak_fd)
                self._peak_fd = None

    def summary(self) -> MetricValues:
        """``cpu_pct_avg``, ``cpu_pct_peak`` (% of one core), ``mem_avg_bytes``, ``mem_peak_bytes`` (the
        kernel's own peak when provided, else the sampled peak), ``oom_killed``; absent when unknown."""
        out: MetricValues = {}
        cpu = [s for s in self.samples if "cpu_s" in s]
        if len(cpu) >= 2:
            ts = [s["t"] for s in cpu]
            cum = monotonic_cumulative([s["cpu_s"] for s in cpu])
            avg = rate_avg(ts, cum)
            if avg is not None:
                out["cpu_pct_avg"] = 100.0 * avg
                out["cpu_pct_peak"] = 100.0 * (rate_peak(ts, cum, self.peak_window_s) or avg)
        mem = [s["mem"] for s in self.samples if "mem" in s]
        if mem:
            out["mem_avg_bytes"] = int(statistics.fmean(mem))
            kpeak = [s["mem_peak_k"] for s in self.samples if "mem_peak_k" in s]
            out["mem_peak_bytes"] = int(max(kpeak)) if kpeak else int(max(mem))
        ooms = [s["oom_kill"] for s in self.samples if "oom_kill" in s]
        if ooms:
            out["oom_killed"] = max(ooms) > self._oom_base
        return out

    def details(self) -> dict[str, Any]:
        """Block and network I/O over the sampled span (B), limits in force, peak scope, sample rate."""
        n = len(self.samples)
        span = self.samples[-1]["t"] - self.samples[0]["t"] if n > 1 else 0.0

        def delta(key: str) -> int | None:
            vals = [s[key] for s in self.samples if key in s]
            return int(monotonic_cumulative(vals)[-1]) if vals else None

        mem = [s["mem"] for s in self.samples if "mem" in s]
        ooms = [s["oom_kill"] for s in self.samples if "oom_kill" in s]
        cg = self.cg
        return {
            "cgroup": str(cg.path) if cg else str(self._given),
            "cgroup_version": cg.version if cg else None,
            "block_read_bytes": delta("io_r"),
            "block_write_bytes": delta("io_w"),
            "net_rx_bytes": delta("net_rx"),
            "net_tx_bytes": delta("net_tx"),
            "mem_peak_sampled_bytes": int(max(mem)) if mem else None,  # None: no memory files (unknown)
            "peak_scope": self.peak_scope,
            "oom_kills": int(max(ooms)) - self._oom_base if ooms else None,
            "limits": read_limits(cg) if cg else {},
            "samples": n,
            "rate_hz": (n - 1) / span if span > 0 else None,
            "exited": self.gone,
            "error": self.error,
        }


def _memory_v1(memd: Path) -> dict[str, float]:
    """cgroup v1 memory controller extras: peak (bytes), OOM kills and limit hits, where the kernel has them."""
    out: dict[str, float] = {}
    peak = read_int(memd / "memory.max_usage_in_bytes")
    if peak is not None:
        out["mem_peak_k"] = float(peak)
    oc = read_kv(memd / "memory.oom_control")
    if "oom_kill" in oc:
        out["oom_kill"] = float(oc["oom_kill"])
    fc = read_int(memd / "memory.failcnt")
    if fc is not None:
        out["failcnt"] = float(fc)
    return out
