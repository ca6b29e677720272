"""GPU sampler through NVML (nvidia-ml-py's ``pynvml``): memory, utilization and power of given GPUs.

Enter the sampler *before* starting the model server: ``before()`` takes the idle baseline (device
memory used, utilization, power), so that when the driver cannot attribute memory to processes
(containers without host PID visibility, some MIG/vGPU setups) the server's memory is still known as
device used minus baseline. Alternatively call ``take_baseline()`` early and enter the sampler later;
``before()`` then keeps that baseline.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from farm.errors import SamplerError
from schemas.metrics import MetricValues
from workers.samplers.base import Sampler

try:
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency; NvmlSampler says so when used
    pynvml = None


def _pynvml() -> Any:
    if pynvml is None:  # pragma: no cover
        raise SamplerError("nvidia-ml-py is not installed; pip install nvidia-ml-py")
    return pynvml


class NvmlSampler(Sampler):
    """Samples the GPUs ``gpu_uuids`` at ``interval_s`` (default 0.05 s = 20 Hz).

    ``pids`` returns the server's process ids (host PID namespace, as NVML reports them) at each sample;
    their compute memory is summed from ``nvmlDeviceGetComputeRunningProcesses``. With several GPUs a
    sample sums memory and power and averages utilization over the devices.

    Sample keys: ``mem_used`` (B, device used, all GPUs), ``proc_mem`` (B, the pids' memory; absent when
    not reported), ``util`` (%), ``mem_util`` (%), ``power_w`` (W; absent when not supported).
    """

    name = "nvml"

    def __init__(
        self,
        gpu_uuids: list[str],
        pids: Callable[[], set[int]] | None = None,
        interval_s: float = 0.05,
    ) -> None:
        super().__init__(interval_s)
        if not gpu_uuids:
            raise SamplerError("NvmlSampler needs at least one GPU UUID; pass the job's gpu_uuids")
        self.gpu_uuids = list(gpu_uuids)
        self.pids = pids
        self.baseline: dict[str, float] | None = None
        self._handles: list[Any] = []
        self._inited = False
        self._power_supported = True

    # -- NVML session -------------------------------------------------------------------------------
    def _open(self) -> None:
        if self._inited:
            return
        nv = _pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise SamplerError(
                f"NVML failed to initialise ({exc}); check the NVIDIA driver (nvidia-smi) on this worker"
            ) from exc
        self._inited = True
        try:
            self._handles = [nv.nvmlDeviceGetHandleByUUID(u) for u in self.gpu_uuids]
        except nv.NVMLError as exc:
            self._close()
            raise SamplerError(
                f"GPU {self.gpu_uuids} not found by NVML ({exc}); check the job's GPU UUIDs: nvidia-smi -L"
            ) from exc

    def close(self) -> None:
        """Shut NVML down if this sampler opened it (after ``take_baseline`` when sampling never started)."""
        self._close()

    def _close(self) -> None:
        if not self._inited:
            return
        nv = _pynvml()
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self._inited = False
        self._handles = []

    # -- reading ------------------------------------------------------------------------------------
    def _read(self, with_procs: bool) -> dict[str, float]:
        nv = _pynvml()
        mem_used = 0.0
        utils: list[float] = []
        mem_utils: list[float] = []
        power_w: float | None = 0.0
        proc_mem: float | None = None
        wanted: set[int] | None = None
        if with_procs and self.pids is not None:
            try:
                wanted = set(self.pids())
            except Exception:  # the server tree changing under us must not stop GPU sampling
                wanted = set()
        for h in self._handles:
            mem_used += float(nv.nvmlDeviceGetMemoryInfo(h).used)
            u = nv.nvmlDeviceGetUtilizationRates(h)
            utils.append(float(u.gpu))
            mem_utils.append(float(u.memory))
            if self._power_supported and power_w is not None:
                try:
                    power_w += nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW -> W
                except nv.NVMLError_NotSupported:
                    self._power_supported = False
                    power_w = None
            if wanted:
                try:
                    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
                except nv.NVMLError:
                    procs = []
                for p in procs:
                    if p.pid in wanted and p.usedGpuMemory is not None:
                        proc_mem = (proc_mem or 0.0) + float(p.usedGpuMemory)
        s: dict[str, float] = {
            "mem_used": mem_used,
            "util": sum(utils) / len(utils),
            "mem_util": sum(mem_utils) / len(mem_utils),
        }
        if power_w is not None and self._power_supported:
            s["power_w"] = power_w
        if proc_mem is not None:
            s["proc_mem"] = proc_mem
        return s

    def take_baseline(self, reads: int = 3, gap_s: float = 0.02) -> dict[str, float]:
        """Read the idle GPUs ``reads`` times ``gap_s`` apart and keep the mean as the baseline
        (``mem_used`` B, ``util`` %, ``power_w`` W). Call before the server starts."""
        self._open()
        rows = []
        for i in range(reads):
            if i:
                time.sleep(gap_s)
            rows.append(self._read(with_procs=False))
        self.baseline = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
        return dict(self.baseline)

    # -- Sampler ------------------------------------------------------------------------------------
    def before(self) -> None:
        self._open()
        if self.baseline is None:
            try:
                self.take_baseline()
            except Exception as exc:
                self._close()
                msg = f"NVML could not read GPU {self.gpu_uuids} ({exc}); check nvidia-smi"
                raise SamplerError(msg) from exc

    def sample(self) -> dict[str, float] | None:
        if not self._inited:
            return None
        return self._read(with_procs=True)

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._close()

    def summary(self) -> MetricValues:
        """``gpu_mem_peak_bytes`` (peak of the pids' memory when the driver reports it, else peak device
        used minus the idle baseline), ``gpu_util_avg_pct``, ``gpu_power_avg_w``; absent when no samples."""
        if not self.samples:
            return {}
        out: MetricValues = {}
        proc = [s["proc_mem"] for s in self.samples if "proc_mem" in s]
        if proc:
            out["gpu_mem_peak_bytes"] = int(max(proc))
        else:
            base = self.baseline["mem_used"] if self.baseline else 0.0
            out["gpu_mem_peak_bytes"] = int(max(0.0, max(s["mem_used"] for s in self.samples) - base))
        out["gpu_util_avg_pct"] = statistics.fmean(s["util"] for s in self.samples)
        power = [s["power_w"] for s in self.samples if "power_w" in s]
        if power:
            out["gpu_power_avg_w"] = statistics.fmean(power)
        return out

    def details(self) -> dict[str, Any]:
        """Facts behind the summary: the idle baseline, how memory was attributed, sample count/rate."""
        n = len(self.samples)
        span = self.samples[-1]["t"] - self.samples[0]["t"] if n > 1 else 0.0
        proc = any("proc_mem" in s for s in self.samples)
        return {
            "gpu_uuids": list(self.gpu_uuids),
            "baseline": dict(self.baseline) if self.baseline else None,
            "mem_source": "processes" if proc else "device_minus_baseline",
            "device_mem_peak_bytes": int(max((s["mem_used"] for s in self.samples), default=0)),
            "mem_util_avg_pct": statistics.fmean(s["mem_util"] for s in self.samples) if n else None,
            "power_supported": self._power_supported,
            "samples": n,
            "rate_hz": (n - 1) / span if span > 0 else None,
            "error": self.error,
        }
