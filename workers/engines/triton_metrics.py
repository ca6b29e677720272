"""A Triton-style Prometheus ``/metrics`` endpoint for ``farm serve`` (Triton serves it on port 8002).

Model Analyzer's remote mode polls it for GPU metrics, and the perf_analyzer it launches passes
``--collect-metrics``, which fails without it. Samples carry Triton's names and labels: per model the
cumulative request, inference and execution counts and durations (µs), as ModelStatistics reports
them; for the host, CPU utilization (0-1) and memory (bytes). GPU metrics (``nv_gpu_*``) are not
exported: farm measures GPUs in its own jobs (NVML), and a farm serve without them tells Model
Analyzer nothing false about a GPU.

Served by prometheus_client's own HTTP server on a daemon thread, started only by ``farm serve`` (the
servers of farm's measured jobs never run it, so it takes no CPU from a measurement).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

METRICS_PREFIX = "farm-serve metrics"

#: Triton's per-model counters: name -> (help, the _Stats field it reads, scale to the unit)
COUNTERS: dict[str, tuple[str, str, float]] = {
    "nv_inference_request_success": ("Number of successful inference requests", "success_count", 1),
    "nv_inference_request_failure": ("Number of failed inference requests", "fail_count", 1),
    "nv_inference_count": ("Number of inferences performed (batch rows)", "inference_count", 1),
    "nv_inference_exec_count": ("Number of model executions performed", "success_count", 1),
    "nv_inference_request_duration_us": ("Cumulative inference request duration in microseconds",
                                         "success_ns", 1e-3),
    "nv_inference_queue_duration_us": ("Cumulative inference queuing duration in microseconds", "queue_ns", 1e-3),
    "nv_inference_compute_input_duration_us": ("Cumulative compute input duration in microseconds",
                                               "input_ns", 1e-3),
    "nv_inference_compute_infer_duration_us": ("Cumulative compute inference duration in microseconds",
                                               "infer_ns", 1e-3),
    "nv_inference_compute_output_duration_us": ("Cumulative inference compute output duration in microseconds",
                                                "output_ns", 1e-3),
}


class TritonCollector(Collector):
    """Reads the served model's statistics at each scrape. ``current`` returns (model name, stats object
    or None while the model is unloaded, executions or None when every request is one execution)."""

    def __init__(self, current: Callable[[], tuple[str, Any, int | None]]) -> None:
        self._current = current

    def collect(self) -> Iterator[Metric]:
        name, stats, executions = self._current()
        labels = {"model": name, "version": "1"}
        for metric, (text, field, scale) in COUNTERS.items():
            family = Metric(metric, text, "counter")
            if stats is not None:
                value = getattr(stats, field) * scale
                if metric == "nv_inference_exec_count" and executions is not None:
                    value = executions  # dynamic batching: merged batches, as the batcher ran them
                family.add_sample(metric, labels, float(value))
            yield family
        cpu = GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]")
        cpu.add_metric([], psutil.cpu_percent(interval=None) / 100.0)
        yield cpu
        mem = psutil.virtual_memory()
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=mem.total)
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=mem.used)


@contextmanager
def metrics_server(host: str, port: int, current: Callable[[], tuple[str, Any, int | None]]) -> Iterator[int]:
    """Serve ``/metrics`` on ``host:port`` (0: a free port) until the block ends; yields the bound port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TritonCollector(current))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise OSError(f"cannot bind the metrics endpoint {host}:{port}: {exc}") from exc
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
