"""Every metric farm reports, declared once: name, unit, higher-is-better, and how it aggregates.

Results (``schemas.result.JobResult`` accepts only these names), the results table columns, the CLI and
reports all read this registry; :func:`merge_repeats` applies each metric's declared aggregation.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Aggregation = Literal["mean", "max", "min", "sum", "last", "all", "extreme"]
#: Metric values by registry name (a sampler's summary, a load client's figures): None where not measured.
MetricValues = dict[str, float | int | bool | None]


@dataclass(frozen=True)
class Metric:
    """One metric. ``aggregation`` says how repeated runs of a job combine (``all``: true only if all are;
    ``extreme``: the value farthest from 0, so a signed change of +15 and one of -15 do not cancel)."""

    name: str
    unit: str
    higher_is_better: bool
    aggregation: Aggregation
    kind: Literal["float", "int", "bool"] = "float"
    description: str = ""
    scope: Literal["job", "model"] = "job"

    @property
    def title(self) -> str:
        """A human name for axes and headers, e.g. ``p99 latency``; from :data:`LABELS`."""
        return LABELS.get(self.name, (self.name.replace("_", " "), ""))[0]

    @property
    def label(self) -> str:
        """A short column header with its unit (at most 10 characters), e.g. ``p99 ms``; from :data:`LABELS`."""
        return LABELS.get(self.name, ("", self.name))[1] or self.name

    @property
    def axis_label(self) -> str:
        """The plot axis label: title and unit, e.g. ``p99 latency (ms)``."""
        return f"{self.title} ({self.unit})" if self.unit not in ("bool", "") else self.title


_M = Metric
#: the turns of a session whose figures are metrics of their own (``turn{k}_*``); every turn's are in the details
TURN_METRICS = 8
METRICS: tuple[Metric, ...] = (
    _M("throughput_infer_per_s", "infer/s", True, "mean", description="inferences (samples) per second"),
    _M("requests_per_s", "req/s", True, "mean", description="completed requests per second"),
    _M("latency_mean_ms", "ms", False, "mean", description="end-to-end latency, mean"),
    _M("latency_p50_ms", "ms", False, "mean", description="end-to-end latency, 50th percentile"),
    _M("latency_p90_ms", "ms", False, "mean", description="end-to-end latency, 90th percentile"),
    _M("latency_p95_ms", "ms", False, "mean", description="end-to-end latency, 95th percentile"),
    _M("latency_p99_ms", "ms", False, "mean", description="end-to-end latency, 99th percentile"),
    _M("latency_p999_ms", "ms", False, "mean", description="end-to-end latency, 99.9th percentile"),
    _M("latency_max_ms", "ms", False, "max", description="end-to-end latency, maximum"),
    _M("latency_std_ms", "ms", False, "mean", description="end-to-end latency, standard deviation"),
    _M("server_queue_p50_ms", "ms", False, "mean", description="server-side queue time, p50"),
    _M("server_compute_p50_ms", "ms", False, "mean", description="server-side compute time, p50"),
    _M("server_compute_p99_ms", "ms", False, "mean", description="server-side compute time, p99"),
    _M("error_count", "requests", False, "sum", "int", "requests that failed, any gRPC status"),
    _M("late_send_pct", "%", False, "mean", description="open loop: sends that left >1 ms after schedule"),
    _M("client_busy_pct", "%", False, "mean", description="load generator CPU busy share"),
    _M("stable", "bool", True, "all", "bool", "last windows agreed within the stability bound"),
    _M("windows", "windows", False, "sum", "int", "measurement windows used"),
    _M("gpu_mem_peak_bytes", "B", False, "max", "int", "GPU memory used by the server, peak"),
    _M("gpu_util_avg_pct", "%", True, "mean", description="GPU utilization, average while measuring"),
    _M("gpu_power_avg_w", "W", False, "mean", description="GPU power draw, average while measuring"),
    _M("cpu_steal_pct", "%", False, "mean",
       description="share of the machine's CPU time the hypervisor took while measuring (steal)"),
    _M("host_speed_index", "pass/s", True, "mean",
       description="host yardstick: calibration passes per second on the job's cores before measuring"),
    _M("host_speed_change_pct", "%", False, "extreme",
       description="host yardstick after measuring vs before (+: the host got faster)"),
    _M("foreign_cpu_pct", "%", False, "max",
       description="share of the job's leased cores used by processes outside the job while measuring"),
    _M("cpu_pct_avg", "%", False, "mean", description="server/container CPU, average (100 = one core)"),
    _M("cpu_pct_peak", "%", False, "max", description="server/container CPU, peak (100 = one core)"),
    _M("mem_avg_bytes", "B", False, "mean", "int", "server/container memory, average"),
    _M("mem_peak_bytes", "B", False, "max", "int", "server/container memory, true peak"),
    _M("mem_limit_bytes", "B", False, "last", "int", "memory limit applied to the run"),
    _M("cpu_limit", "cores", False, "last", description="CPU limit applied to the run"),
    _M("oom_killed", "bool", False, "all", "bool", "the run was killed for exceeding its memory limit"),
    _M("limits_enforced", "bool", True, "all", "bool", "the CPU/memory limits were actually enforced"),
    _M("duration_s", "s", False, "sum", description="measured time, warm-up excluded"),
    _M("total_time_s", "s", False, "sum", description="edge run: container start to exit"),
    # generative (LLM) serving over the OpenAI API (workers.loadgen.openai.client); e2e latency is latency_*
    *(_M(f"{fig}_{q}_ms", "ms", False, "mean", description=f"{what}, {q}")
      for fig, what in (("ttft", "time to first token"), ("itl", "inter-token latency, per token"),
                        ("tpot", "time per output token after the first")) for q in ("p50", "p90", "p99")),
    *(_M(f"ttfot_{q}_ms", "ms", False, "mean", description=f"time to first output (content or tool-call) token, "
         f"reasoning left out, {q}") for q in ("p50", "p90", "p99")),
    _M("output_tokens_per_s", "tok/s", True, "mean",
       description="generated tokens (reasoning, content, tool calls) that arrived in the measured span, per second"),
    _M("reasoning_tokens_per_s", "tok/s", True, "mean",
       description="reasoning tokens (reasoning_content/reasoning deltas) that arrived in the measured span, per s"),
    _M("answer_tokens_per_s", "tok/s", True, "mean",
       description="content and tool-call tokens that arrived in the measured span, per second (reasoning left out)"),
    _M("mean_reasoning_tokens", "tokens", False, "mean", description="reasoning tokens per request, mean"),
    _M("requested_input_tokens_mean", "tokens", False, "mean",
       description="prompt tokens per request the workload meant, mean (compare mean_input_tokens: the server's)"),
    _M("requested_output_tokens_mean", "tokens", False, "mean",
       description="output tokens per request asked (max_tokens), mean"),
    _M("input_tokens_off_pct", "%", False, "extreme",
       description="prompt tokens by the server's count (usage) vs the workload's, mean, signed %"),
    _M("output_tokens_off_pct", "%", False, "extreme",
       description="output tokens generated vs asked (max_tokens), mean, signed %"),
    _M("cached_prompt_tokens_pct", "%", False, "mean",
       description="share of prompt tokens the server served from its prefix cache (its usage or timings)"),
    _M("workload_as_asked", "bool", True, "all", "bool",
       "prompt and output lengths within 2 % of the request by the server's own counts"),
    _M("prefix_hit_intended_pct", "%", False, "mean",
       description="share of the measured prompt tokens a prefix cache in the job's state (cold, warm) can serve, "
                   "from the workload's shared prefix"),
    _M("prefix_hit_pct", "%", False, "mean",
       description="share of the measured prompt tokens the server served from its prefix cache: its counters "
                   "(hits / queries) where it has them, else its usage"),
    _M("prefix_hit_as_intended", "bool", True, "all", "bool",
       "the server's prefix-cache hit rate within 10 points of the intended one"),
    _M("output_tokens_per_s_per_user", "tok/s", True, "mean",
       description="generated tokens per second of one stream after its first token (median request)"),
    _M("input_tokens_per_s", "tok/s", True, "mean", description="prompt tokens per second, all requests"),
    _M("mean_input_tokens", "tokens", False, "mean", description="prompt tokens per request, mean"),
    _M("mean_output_tokens", "tokens", False, "mean", description="generated tokens per request, mean"),
    _M("goodput_req_per_s", "req/s", True, "mean", description="completed requests per second within the SLO"),
    _M("output_overrun_count", "requests", False, "sum", "int",
       "requests that generated more tokens than their max_tokens"),
    _M("server_ttft_p50_ms", "ms", False, "mean", description="server-side prompt (prefill) time, p50"),
    _M("server_tpot_p50_ms", "ms", False, "mean", description="server-side time per output token, p50"),
    # the server's own view (its Prometheus /metrics scraped through the measured windows at 4 Hz:
    # workers.loadgen.openai.server_scrape): gauges as mean and max, counters as increases over the windows
    _M("server_requests_running_mean", "requests", False, "mean",
       description="requests the server was decoding (its slots/batch in use), mean over the windows"),
    _M("server_requests_running_max", "requests", False, "max",
       description="requests the server was decoding, the most seen in the windows"),
    _M("server_requests_waiting_mean", "requests", False, "mean",
       description="requests queued in the server for a slot, mean over the windows"),
    _M("server_requests_waiting_max", "requests", False, "max",
       description="requests queued in the server for a slot, the most seen in the windows"),
    _M("server_kv_cache_usage_mean_pct", "%", False, "mean", description="the server's KV cache in use, mean"),
    _M("server_kv_cache_usage_max_pct", "%", False, "max", description="the server's KV cache in use, max"),
    _M("server_prompt_tokens", "tokens", False, "mean",
       description="prompt tokens the server processed in the windows (its counter, cached ones excluded)"),
    _M("server_generation_tokens", "tokens", True, "mean",
       description="tokens the server generated in the windows (its counter)"),
    _M("server_cached_prompt_tokens", "tokens", True, "mean",
       description="prompt tokens the server reused from its cache in the windows (its counter)"),
    _M("server_preemptions", "requests", False, "mean",
       description="requests the server preempted in the windows (its counter)"),
    _M("server_scrapes", "scrapes", True, "mean", "int",
       "scrapes of the server's /metrics inside the measured windows (none: it has no /metrics)"),
    _M("server_prefill_p50_ms", "ms", False, "mean",
       description="the server's prefill time per request, p50, from its histogram (vLLM's "
                   "request_prefill_time_seconds; the reports' TTFT split)"),
    # sessions (--sessions): per turn index k (1..TURN_METRICS), over every session's k-th turn
    *(m for k in range(1, TURN_METRICS + 1) for m in (
        _M(f"turn{k}_ttft_p50_ms", "ms", False, "mean", description=f"sessions: time to first token of turn {k}, p50"),
        _M(f"turn{k}_cached_prompt_tokens_pct", "%", True, "mean",
           description=f"sessions: share of turn {k}'s prompt tokens the server served from its prefix cache"))),
    # the server's own per-request histograms (vLLM's), read before and after the measured span: p50s
    # (workers.loadgen.openai.server_metrics; prefill above), and its prefix-cache lookups (a counter, like the
    # figures above)
    _M("server_decode_p50_ms", "ms", False, "mean", description="the server's decode time per request, p50"),
    _M("server_e2e_p50_ms", "ms", False, "mean", description="the server's end-to-end time per request, p50"),
    _M("server_itl_p50_ms", "ms", False, "mean", description="the server's inter-token latency, p50"),
    _M("server_prefix_cache_queries", "tokens", False, "mean",
       description="prompt tokens the server looked up in its prefix cache in the windows (its counter)"),
    # static metrics of the model artifact (farm analyze), stored once per artifact
    _M("params", "params", False, "last", "int", "trainable and constant parameters", "model"),
    _M("size_bytes", "B", False, "last", "int", "model file size", "model"),
    _M("macs_per_sample", "MAC", False, "last", "int", "multiply-accumulates per sample", "model"),
    _M("flops_per_sample", "FLOP", False, "last", "int", "floating-point operations per sample", "model"),
    _M("activation_bytes_per_sample", "B", False, "last", "int",
       "sum of intermediate tensor sizes per sample (no buffer reuse)", "model"),
    _M("activation_peak_bytes_per_sample", "B", False, "last", "int",
       "peak of live intermediate tensors per sample", "model"),
)

# name -> (title, short label): the human names shown by tables (80 columns), reports and plot axes, declared once
LABELS: dict[str, tuple[str, str]] = {
    "throughput_infer_per_s": ("throughput", "infer/s"),
    "requests_per_s": ("request rate", "req/s"),
    "latency_mean_ms": ("mean latency", "mean ms"),
    "latency_p50_ms": ("p50 latency", "p50 ms"),
    "latency_p90_ms": ("p90 latency", "p90 ms"),
    "latency_p95_ms": ("p95 latency", "p95 ms"),
    "latency_p99_ms": ("p99 latency", "p99 ms"),
    "latency_p999_ms": ("p99.9 latency", "p99.9 ms"),
    "latency_max_ms": ("max latency", "max ms"),
    "latency_std_ms": ("latency std dev", "std ms"),
    "server_queue_p50_ms": ("server queue p50", "queue ms"),
    "server_compute_p50_ms": ("server compute p50", "comp ms"),
    "server_compute_p99_ms": ("server compute p99", "comp99 ms"),
    "error_count": ("errors", "errors"),
    "late_send_pct": ("late sends", "late %"),
    "client_busy_pct": ("load client CPU", "client %"),
    "stable": ("stable", "stable"),
    "windows": ("windows", "windows"),
    "gpu_mem_peak_bytes": ("GPU memory peak", "GPU mem"),
    "gpu_util_avg_pct": ("GPU utilization", "GPU %"),
    "gpu_power_avg_w": ("GPU power", "GPU W"),
    "cpu_steal_pct": ("CPU steal", "steal %"),
    "host_speed_index": ("host speed index", "host idx"),
    "host_speed_change_pct": ("host speed change", "drift %"),
    "foreign_cpu_pct": ("foreign CPU on leased cores", "foreign %"),
    "cpu_pct_avg": ("CPU, average", "CPU %"),
    "cpu_pct_peak": ("CPU, peak", "CPU pk %"),
    "mem_avg_bytes": ("memory, average", "mem avg"),
    "mem_peak_bytes": ("memory peak", "mem peak"),
    "mem_limit_bytes": ("memory limit", "mem lim"),
    "cpu_limit": ("CPU limit", "CPU lim"),
    "oom_killed": ("OOM killed", "OOM"),
    "limits_enforced": ("limits enforced", "enforced"),
    "duration_s": ("measured time", "dur s"),
    "total_time_s": ("total time", "total s"),
    **{f"{fig}_{q}_ms": (f"{q} {fig.upper()}", f"{fig}{q[1:]} ms") for fig in ("ttft", "itl", "tpot")
       for q in ("p50", "p90", "p99")},
    **{f"ttfot_{q}_ms": (f"{q} TTFOT", f"ttfot{q[1:]} ms") for q in ("p50", "p90", "p99")},
    "output_tokens_per_s": ("output tokens/s", "out tok/s"),
    "reasoning_tokens_per_s": ("reasoning tokens/s", "rsn tok/s"),
    "answer_tokens_per_s": ("answer tokens/s", "ans tok/s"),
    "mean_reasoning_tokens": ("reasoning tokens per request", "rsn tok"),
    "requested_input_tokens_mean": ("input tokens asked", "in asked"),
    "requested_output_tokens_mean": ("output tokens asked", "out asked"),
    "input_tokens_off_pct": ("prompt length off", "in off %"),
    "output_tokens_off_pct": ("output length off", "out off %"),
    "cached_prompt_tokens_pct": ("prompt tokens from cache", "cached %"),
    "workload_as_asked": ("workload as asked", "as asked"),
    "prefix_hit_intended_pct": ("prefix-cache hits intended", "hit want %"),
    "prefix_hit_pct": ("prefix-cache hits measured", "hit %"),
    "prefix_hit_as_intended": ("prefix-cache hits as intended", "hit ok"),
    "output_tokens_per_s_per_user": ("output tokens/s per user", "user tok/s"),
    "input_tokens_per_s": ("input tokens/s", "in tok/s"),
    "mean_input_tokens": ("input tokens per request", "in tok"),
    "mean_output_tokens": ("output tokens per request", "out tok"),
    "goodput_req_per_s": ("goodput", "good r/s"),
    "output_overrun_count": ("output limit overruns", "overruns"),
    "server_ttft_p50_ms": ("server prefill p50", "srv pf ms"),
    "server_tpot_p50_ms": ("server TPOT p50", "srv tpot"),
    "server_requests_running_mean": ("server requests running, mean", "srv run"),
    "server_requests_running_max": ("server requests running, max", "srv run mx"),
    "server_requests_waiting_mean": ("server requests waiting, mean", "srv wait"),
    "server_requests_waiting_max": ("server requests waiting, max", "srv wt mx"),
    "server_kv_cache_usage_mean_pct": ("server KV cache used, mean", "kv %"),
    "server_kv_cache_usage_max_pct": ("server KV cache used, max", "kv max %"),
    "server_prompt_tokens": ("server prompt tokens", "srv in tok"),
    "server_generation_tokens": ("server generated tokens", "srv gen"),
    "server_cached_prompt_tokens": ("server cached prompt tokens", "srv cached"),
    "server_preemptions": ("server preemptions", "preempts"),
    "server_scrapes": ("server /metrics scrapes", "scrapes"),
    "server_prefill_p50_ms": ("server prefill time p50", "srv pre ms"),
    **{f"turn{k}_ttft_p50_ms": (f"turn {k} p50 TTFT", f"t{k} ttft") for k in range(1, TURN_METRICS + 1)},
    **{f"turn{k}_cached_prompt_tokens_pct": (f"turn {k} prompt tokens from cache", f"t{k} cach%")
       for k in range(1, TURN_METRICS + 1)},
    "server_decode_p50_ms": ("server decode time p50", "srv dec ms"),
    "server_e2e_p50_ms": ("server end-to-end p50", "srv e2e ms"),
    "server_itl_p50_ms": ("server inter-token p50", "srv itl ms"),
    "server_prefix_cache_queries": ("server prefix-cache lookups", "pc looked"),
    "params": ("parameters", "params"),
    "size_bytes": ("model file size", "size"),
    "macs_per_sample": ("MACs per sample", "MACs"),
    "flops_per_sample": ("FLOPs per sample", "FLOPs"),
    "activation_bytes_per_sample": ("activation bytes per sample", "act B"),
    "activation_peak_bytes_per_sample": ("activation peak per sample", "act peak"),
}

JOB_METRICS: tuple[Metric, ...] = tuple(m for m in METRICS if m.scope == "job")
MODEL_METRICS: tuple[Metric, ...] = tuple(m for m in METRICS if m.scope == "model")

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def metric(name: str) -> Metric:
    """The metric called ``name``; KeyError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; known: {', '.join(BY_NAME)}") from None


MetricValue = float | int | bool | None


def aggregate(name: str, values: Iterable[MetricValue]) -> MetricValue:
    """Combine one metric's values from repeated runs of a job by its declared aggregation.

    Missing values (None) are skipped; None when no run measured it. ``mean`` of an ``int`` metric
    stays a float; ``all`` is true only when every run's value is.
    """
    m = metric(name)
    present = [v for v in values if v is not None]
    if not present:
        return None
    if m.aggregation == "all":
        return all(bool(v) for v in present)
    if m.aggregation == "last":
        return present[-1]
    if m.aggregation == "max":
        return max(present)
    if m.aggregation == "min":
        return min(present)
    if m.aggregation == "sum":
        return sum(present)
    if m.aggregation == "extreme":
        return max(present, key=lambda v: abs(float(v)))
    return sum(float(v) for v in present) / len(present)


def merge_repeats(runs: Iterable[Mapping[str, MetricValue]]) -> dict[str, MetricValue]:
    """One metrics dict from the metrics of repeated runs of the same job config (in run order):
    each metric present in any run is combined by its declared aggregation (see :func:`aggregate`)."""
    runs = list(runs)
    names = list(dict.fromkeys(name for run in runs for name in run))
    return {name: aggregate(name, (run.get(name) for run in runs)) for name in names}
