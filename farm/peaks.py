"""A device's peak GFLOP/s, for the roofline-style line of an op profile (``farm ops``, ``farm analyze --layers
--job``): the model's achieved FLOP rate against what the device could do.

- **GPUs**: a table of the vendor's datasheet peaks, keyed by the NVML device name (``GPU_PEAKS``). A GPU the
  table does not know has no peak: "unknown", never a guess.
- **CPUs**: no datasheet is reliable for a leased share of a host (clocks, SIMD width, a CFS quota, noisy
  neighbours), so the peak is *measured*: :func:`measure_cpu_peak` times float32 matrix products (numpy's BLAS,
  its threads set to the pass's) on the cores and under the limits of the op-profiling pass, right after the
  profiled inferences. It is a practical peak (what a large GEMM reaches there), not the theoretical one; the
  profile says how it was taken. The pass measures it each time (about 1 s) rather than caching it per worker:
  the cores, thread count and limits differ between jobs and edge profiles, and a cached figure would be
  another box's.
- The user may give ``--peak-gflops N``: it wins over both, and is shown as given.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: (NVML name fragment, FP32 peak TFLOP/s, FP16 tensor-core dense peak TFLOP/s). The first fragment found as a
#: whole word in the device's NVML name wins (``L4`` is not ``L40S``, ``A10`` not ``A10G``: unknown), so more
#: specific names come first. Sources: NVIDIA's datasheets —
#: H100/H200: "NVIDIA H100 Tensor Core GPU" datasheet (SXM 67 / 989.4, PCIe 51 / 756, NVL 60 / 835; H200 SXM as
#: H100 SXM, "NVIDIA H200" datasheet); A100: "NVIDIA A100 Tensor Core GPU" datasheet (19.5 / 312, SXM and PCIe);
#: L40S: "NVIDIA L40S" datasheet (91.6 / 362.05); L40: "NVIDIA L40" datasheet (90.5 / 181.05);
#: L4: "NVIDIA L4 Tensor Core GPU" datasheet (30.3 / 121);
#: A10: "NVIDIA A10" datasheet (31.2 / 125); T4: "NVIDIA T4" datasheet (8.1 / 65, FP16 mixed precision);
#: V100: "NVIDIA V100" datasheet (SXM2 15.7 / 125, PCIe 14 / 112). Sparsity figures (2x) are not used.
GPU_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H100 PCIe", 51.0, 756.0),
    ("H100 NVL", 60.0, 835.0),
    ("H100", 67.0, 989.4),
    ("H200", 67.0, 989.4),
    ("A100", 19.5, 312.0),
    ("L40S", 91.6, 362.05),
    ("L40", 90.5, 181.05),
    ("L4", 30.3, 121.0),
    ("A10", 31.2, 125.0),
    ("T4", 8.1, 65.0),
    ("V100-PCIE", 14.0, 112.0),
    ("V100", 15.7, 125.0),
)
#: the matrix side of the CPU measurement (2 * N^3 FLOP per product: 2.1 GFLOP)
CPU_PEAK_N = 1024
#: each timed window runs products for at least this long, s (longer than a CFS period: a quota shows)
CPU_PEAK_WINDOW_S = 0.25
CPU_PEAK_WINDOWS = 3


@dataclass(frozen=True)
class Peak:
    """A peak FLOP rate, GFLOP/s, and where it comes from (one line, shown beside it)."""

    gflops: float
    source: str


def gpu_peak(nvml_name: str, half: bool = False) -> Peak | None:
    """The datasheet peak of the GPU NVML calls ``nvml_name`` (FP32, or FP16 tensor-core dense with ``half``);
    None when the table does not know it."""
    for fragment, fp32, fp16 in GPU_PEAKS:
        if re.search(rf"\b{re.escape(fragment)}\b", nvml_name, re.IGNORECASE):
            tflops = fp16 if half else fp32
            return Peak(tflops * 1000.0, f"datasheet {'FP16 tensor-core dense' if half else 'FP32'} peak of "
                                         f"{nvml_name} ({fragment}: {tflops:g} TFLOP/s)")
    return None


def measure_cpu_peak(threads: int, cores: str | None = None) -> Peak:
    """A practical CPU peak on this process's cores: the best of ``CPU_PEAK_WINDOWS`` windows of float32
    ``CPU_PEAK_N``-square matrix products (numpy's BLAS on ``threads`` threads; threadpoolctl sets them when
    installed), total FLOP over each window's wall time. ``cores``: the cores' list, for the source line."""
    import numpy as np  # noqa: PLC0415 - only the profiling pass measures

    rng = np.random.default_rng(0)
    a = rng.standard_normal((CPU_PEAK_N, CPU_PEAK_N), dtype=np.float32)
    b = rng.standard_normal((CPU_PEAK_N, CPU_PEAK_N), dtype=np.float32)
    flop = 2.0 * CPU_PEAK_N ** 3
    with _blas_threads(threads) as how:
        a @ b  # warm-up: the BLAS's threads start, the pages are touched
        best = 0.0
        for _ in range(CPU_PEAK_WINDOWS):
            n, start = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - start) < CPU_PEAK_WINDOW_S or n == 0:
                a @ b
                n += 1
            best = max(best, n * flop / elapsed / 1e9)
    where = f" on cores {cores}" if cores else ""
    return Peak(best, f"measured: best of {CPU_PEAK_WINDOWS} windows of float32 {CPU_PEAK_N}x{CPU_PEAK_N} "
                      f"matrix products (numpy BLAS, {how}){where}, in the profiling pass's limits")


@contextmanager
def _blas_threads(threads: int) -> Iterator[str]:
    """Numpy's BLAS limited to ``threads`` (0: as it is) while inside; yields what was set, in words."""
    if threads <= 0:
        yield "its default threads"
        return
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]  # noqa: PLC0415 - optional
    except ImportError:
        yield "its default threads (threadpoolctl missing)"
        return
    with threadpool_limits(limits=threads, user_api="blas"):
        yield f"{threads} thread{'s' if threads > 1 else ''}"
