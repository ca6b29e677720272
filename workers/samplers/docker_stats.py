"""A container's resources through the Docker stats API (about 1 Hz, coarser than the cgroup sampler).

The fallback when a container's cgroup cannot be found (``workers.measure`` picks it and says so in a
note for the result's details); otherwise ``workers.samplers.cgroup.CgroupSampler`` reads the cgroup at 20 Hz.
"""
from __future__ import annotations

import itertools
from typing import Any

from schemas.metrics import MetricValues
from workers.samplers.base import Sampler


class DockerStatsSampler(Sampler):
    """Samples one container through ``GET /containers/{id}/stats`` (stream, ~1 Hz).

    Keys per sample: ``cpu_ns`` (cumulative CPU time), ``mem_bytes`` (usage minus page cache),
    ``mem_max_bytes`` (v1 max_usage when Docker reports it), ``blk_read_bytes``/``blk_write_bytes``,
    ``net_rx_bytes``/``net_tx_bytes``.
    """

    name = "docker-stats"

    def __init__(self, container: Any, interval_s: float = 0.0) -> None:
        super().__init__(interval_s=interval_s)
        self._container = container
        self._stream: Any = None

    def before(self) -> None:
        self._stream = self._container.stats(stream=True, decode=True)

    def sample(self) -> dict[str, float] | None:
        if self._stream is None or self._stop.is_set():
            return None
        try:
            s = next(self._stream)
        except StopIteration:
            self._stop.set()
            return None
        cpu = (s.get("cpu_stats") or {}).get("cpu_usage", {}).get("total_usage")
        mem = s.get("memory_stats") or {}
        if cpu is None or not mem:
            return None
        stats = mem.get("stats") or {}
        cache = stats.get("total_inactive_file", stats.get("inactive_file", 0))
        out: dict[str, float] = {"cpu_ns": float(cpu), "mem_bytes": float(max(0, mem.get("usage", 0) - cache))}
        if mem.get("max_usage"):
            out["mem_max_bytes"] = float(mem["max_usage"])
        blk = (s.get("blkio_stats") or {}).get("io_service_bytes_recursive") or []
        out["blk_read_bytes"] = float(sum(e.get("value", 0) for e in blk if e.get("op", "").lower() == "read"))
        out["blk_write_bytes"] = float(sum(e.get("value", 0) for e in blk if e.get("op", "").lower() == "write"))
        nets = (s.get("networks") or {}).values()
        out["net_rx_bytes"] = float(sum(n.get("rx_bytes", 0) for n in nets))
        out["net_tx_bytes"] = float(sum(n.get("tx_bytes", 0) for n in nets))
        return out

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._stream is not None:
            try:
                self._stream.close()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout=3)

    def summary(self) -> MetricValues:
        s = self.samples
        if len(s) < 2:
            return {}
        pcts = [100.0 * (b["cpu_ns"] - a["cpu_ns"]) / 1e9 / (b["t"] - a["t"])
                for a, b in itertools.pairwise(s) if b["t"] > a["t"]]
        total_s = s[-1]["t"] - s[0]["t"]
        out: MetricValues = {
            "cpu_pct_avg": 100.0 * (s[-1]["cpu_ns"] - s[0]["cpu_ns"]) / 1e9 / total_s if total_s > 0 else None,
            "cpu_pct_peak": max(pcts) if pcts else None,
            "mem_avg_bytes": int(sum(x["mem_bytes"] for x in s) / len(s)),
            "mem_peak_bytes": int(max(x.get("mem_max_bytes", x["mem_bytes"]) for x in s)),
        }
        return {k: v for k, v in out.items() if v is not None}

    def details(self) -> dict[str, float]:
        """Block and network bytes moved between the first and last sample."""
        if len(self.samples) < 2:
            return {}
        a, b = self.samples[0], self.samples[-1]
        return {"block_read_bytes": b["blk_read_bytes"] - a["blk_read_bytes"],
                "block_write_bytes": b["blk_write_bytes"] - a["blk_write_bytes"],
                "net_rx_bytes": b["net_rx_bytes"] - a["net_rx_bytes"],
                "net_tx_bytes": b["net_tx_bytes"] - a["net_tx_bytes"]}

