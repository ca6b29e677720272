"""Synthetic but realistic stored results for report, export, view and compare tests.

``measurement`` draws what the load generator stores for one run (metrics, per-window figures, latency and
server-compute histograms) from a simple closed-loop model with run-to-run and window-to-window noise;
``seed_request`` writes a whole request (model, jobs, results) into the configured database.
"""
from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from workers.loadgen import stats

RUN_SD = 0.01  # run-to-run spread of the true throughput, relative (1 %)
WINDOW_SD = 0.03  # window-to-window spread within one run, relative (3 %)


def measurement(rng: np.random.Generator, throughput: float, batch: int = 1, concurrency: int = 1,
                windows: int = 8, slowdown: float = 1.0, window_s: float = 1.0,
                run_sd: float = RUN_SD) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, details) of one closed-loop run whose true throughput is ``throughput / slowdown``
    inferences/s, moved by the run's own host state (relative spread ``run_sd``, between runs); latency follows
    (concurrency x batch / throughput) with a log-normal spread."""
    run = rng.normal(1.0, run_sd) / slowdown
    per_window = throughput * run * rng.normal(1.0, WINDOW_SD, windows)
    # closed loop: a window's latency is (concurrency x batch / its throughput), spread log-normally
    per_req = max(1, int(min(per_window.sum() * window_s / batch, 20000)) // windows)
    lats = [rng.lognormal(np.log(1000.0 * concurrency * batch / t), 0.25, per_req) for t in per_window]
    lat = np.concatenate(lats)
    n = lat.size
    compute = lat * rng.uniform(0.55, 0.65)
    wins = [{"k": k, "t_s": k * window_s, "length_s": window_s, "requests": int(t * window_s / batch), "errors": 0,
             "requests_per_s": t / batch, "throughput_infer_per_s": float(t),
             "p50_ms": float(np.median(w)), "p99_ms": float(np.percentile(w, 99))}
            for k, (t, w) in enumerate(zip(per_window, lats, strict=True))]
    metrics: dict[str, Any] = {
        **stats.latency_metrics(lat, batch, n * batch / float(per_window.mean())),
        "throughput_infer_per_s": float(per_window.mean()),
        "server_compute_p50_ms": float(np.median(compute)), "server_compute_p99_ms": float(np.percentile(compute, 99)),
        "stable": True, "windows": windows, "error_count": 0, "duration_s": windows * window_s,
        "cpu_pct_avg": float(60 + 20 * np.log2(batch) + rng.normal(0, 2)), "cpu_pct_peak": 190.0,
        "mem_peak_bytes": int(200 * 2**20 + batch * 2**20), "mem_avg_bytes": int(190 * 2**20), "cpu_steal_pct": 0.5,
    }
    details = {"load": {"mode": "closed", "windows": wins, "metrics_windows": [0, windows - 1],
                        "latency_histogram": stats.histogram(lat),
                        "server_compute_histogram": stats.histogram(compute)}}
    return metrics, details  # as workers.execute stores them: the load generator's part under "load"


def seed_request(rng: np.random.Generator, *, slowdown: float = 1.0, model: str = "mlp.onnx",
                 devices: tuple[str, ...] = ("cpu", "gpu:t4"), batches: tuple[int, ...] = (1, 4, 16),
                 concurrencies: tuple[int, ...] = (1, 4), edge: bool = True, failed: bool = True,
                 repeats: int = 1, run_sd: float = RUN_SD) -> str:
    """Write one request with a job per device x engine x batch x concurrency (``repeats`` runs of each, the
    between-run spread ``run_sd``; plus two edge runs, one OOM-killed, and one failed job) and results into the
    configured database; returns the request id."""
    from farm.db.models import ModelArtifact, Request
    from farm.db.session import session_scope

    rid = str(uuid.uuid4())
    sha = "ab" * 32
    with session_scope() as s:
        if s.get(ModelArtifact, sha) is None:
            s.add(ModelArtifact(sha256=sha, filename=model, format="onnx", size_bytes=1234, location="", inputs=[],
                                static_metrics={"params": 12345, "macs_per_sample": 67890,
                                                "flops_per_sample": 135780, "size_bytes": 1234}))
        s.add(Request(id=rid, model_sha256=sha, spec={"model": model, "measurement": {"rpc": "unary"}}, excluded=[]))
        s.flush()
        for device in devices:
            base = 800.0 if device == "cpu" else 5000.0
            for engine in ("onnxruntime", "torchscript"):
                for b in batches:
                    for c in concurrencies:
                        dims = {"instances": 1, "threads": 2} | ({"max_queue_delay_us": 100} if b > 1 else {})
                        tput = base * (1.3 if engine == "onnxruntime" else 1.0) * b ** 0.5 * min(c, 2) ** 0.4
                        for r in range(repeats):
                            metrics, details = measurement(rng, tput, b, c, slowdown=slowdown, run_sd=run_sd)
                            if device != "cpu":
                                metrics |= {"gpu_mem_peak_bytes": 900 * 2**20 + b * 2**22,
                                            "gpu_util_avg_pct": 20.0 * c, "gpu_power_avg_w": 70.0 + 5 * b}
                            _job(s, rid, device, engine, b, c, None, dims, "succeeded", metrics, details, repeat=r)
        if failed:
            _job(s, rid, "cpu", "tensorrt", 1, 1, None, {"instances": 1, "threads": 2}, "failed", None, None,
                 error="engine tensorrt needs a GPU; pick a GPU device")
        if edge:
            m, _ = measurement(rng, 4000.0, 1, 1, slowdown=slowdown)
            m |= {"mem_limit_bytes": 512 * 2**20, "cpu_limit": 1.0, "oom_killed": False, "limits_enforced": True}
            _job(s, rid, "cpu", "onnxruntime", 1, 1, "pi4", {"instances": 1, "threads": 1}, "succeeded", m,
                 {"kind": "edge"})
            oom = {"mem_limit_bytes": 64 * 2**20, "cpu_limit": 1.0, "oom_killed": True, "mem_peak_bytes": 64 * 2**20}
            _job(s, rid, "cpu", "onnxruntime", 1, 1, "tiny", {"instances": 1, "threads": 1}, "succeeded", oom,
                 {"kind": "edge"})
    return rid


def _job(s: Any, rid: str, device: str, engine: str, b: int, c: int, edge: str | None, dims: dict[str, Any],
         status: str, metrics: dict[str, Any] | None, details: dict[str, Any] | None, error: str | None = None,
         repeat: int = 0) -> None:
    from farm.db.models import Job, Result

    jid = uuid.uuid4().hex
    spec: dict[str, Any] = {"measurement": {"rpc": "unary", **dims}, **({"repeat": repeat} if repeat else {})}
    s.add(Job(id=jid, request_id=rid, device=device, engine=engine, batch_size=b, concurrency=c, edge_profile=edge,
              queue="q", spec=spec, status=status, attempts=1, error=error, worker_id="w1"))
    s.flush()
    if metrics is not None:
        s.add(Result(job_id=jid, request_id=rid, worker_id="w1", host="h1", slot=0, server_cpus="0",
                     loadgen_cpus="1", host_shared=False, isolated=True, details=details or {}, **metrics))


#: an LLM sweep's configurations: (engine, knobs asked, peak output tok/s, unloaded TTFT ms, ITL ms)
LLM_CONFIGS = (("llama.cpp", {"n_parallel": 1}, 420.0, 40.0, 9.0), ("llama.cpp", {"n_parallel": 4}, 1250.0, 45.0, 11.0),
               ("transformers", {}, 700.0, 90.0, 14.0))
LLM_SLO = {"ttft_ms": 200.0, "tpot_ms": 30.0}


def llm_metrics(rng: np.random.Generator, peak: float, ttft0: float, itl0: float, load: float,
                out_tokens: int = 64) -> dict[str, Any]:
    """The OpenAI client's metrics of one LLM run at ``load`` (0..; 1: the server's capacity), drawn from a
    saturating model: output tokens/s climbs as ``peak * load / (1 + load)``-ish, TTFT and ITL grow with load."""
    noise = rng.normal(1.0, 0.02)
    tps = peak * (1 - np.exp(-1.6 * load)) * noise
    ttft = ttft0 * (1 + load ** 2.2) * noise
    itl = itl0 * (1 + 0.35 * load) * noise
    tpot = itl * 1.02
    e2e = ttft + tpot * (out_tokens - 1)
    req_s = tps / out_tokens
    within = float(np.clip(1.15 - 0.25 * load ** 2, 0.0, 1.0))
    return {"output_tokens_per_s": float(tps), "requests_per_s": float(req_s), "throughput_infer_per_s": float(req_s),
            "ttft_p50_ms": float(ttft), "ttft_p90_ms": float(ttft * 1.6), "ttft_p99_ms": float(ttft * 2.4),
            "itl_p50_ms": float(itl), "itl_p90_ms": float(itl * 1.3), "itl_p99_ms": float(itl * 1.9),
            "tpot_p50_ms": float(tpot), "tpot_p90_ms": float(tpot * 1.25), "tpot_p99_ms": float(tpot * 1.6),
            "latency_p50_ms": float(e2e), "latency_p90_ms": float(e2e * 1.3), "latency_p99_ms": float(e2e * 1.8),
            "mean_output_tokens": float(out_tokens), "mean_input_tokens": 128.0,
            "input_tokens_per_s": float(req_s * 128),
            "goodput_req_per_s": float(req_s * within), "error_count": 0, "stable": True, "windows": 4,
            "duration_s": 8.0, "cpu_pct_avg": 150.0, "mem_peak_bytes": int(700 * 2**20)}


def seed_llm_request(rng: np.random.Generator, *, slowdown: float = 1.0,
                     concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16),
                     rates: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0), edge: bool = True,
                     configs: tuple[tuple[str, dict[str, Any], float, float, float], ...] = LLM_CONFIGS) -> str:
    """Write one LLM request (``tiny.gguf``, an SLO of :data:`LLM_SLO`): for each of ``configs`` a closed-loop
    concurrency sweep and an open-loop (Poisson) rate sweep, with the LLM facts as columns; with ``edge``, a
    llama.cpp run under edge profile ``pi4`` (1 CPU, 512 MiB) that meets the SLO and one under ``tiny`` (64 MiB)
    killed out of memory. ``slowdown`` divides every rate and multiplies every latency. Returns the request id."""
    from farm.db.session import session_scope

    with session_scope() as s:
        rid = _llm_request(s)
        for engine, knobs, peak, ttft0, itl0 in configs:
            facts = {"knobs": {**knobs, "n_threads": 2}, "n_threads": 2, "token_source": "usage", "input_tokens": "128",
                     "output_tokens": "64", "prefix_tokens": 0, "workload_seed": 0}
            cap = peak / 64 / slowdown  # requests/s at capacity
            for c in concurrencies:
                m = llm_metrics(rng, peak / slowdown, ttft0 * slowdown, itl0 * slowdown, c / 4)
                _llm_job(s, rid, engine, knobs, c, None, None, m, facts)
            for rate in rates:
                m = llm_metrics(rng, peak / slowdown, ttft0 * slowdown, itl0 * slowdown, rate / cap)
                within = m["goodput_req_per_s"] / m["requests_per_s"]  # the share of requests inside the SLO
                done = min(rate, cap) * rng.normal(1.0, 0.01)  # open loop: what is offered, up to the capacity
                m |= {"requests_per_s": done, "goodput_req_per_s": done * within, "late_send_pct": 0.0}
                _llm_job(s, rid, engine, knobs, 1, rate, None, m, facts)
        if edge:
            m = llm_metrics(rng, 90.0, 120.0, 20.0, 0.3)
            m |= {"mem_peak_bytes": 300 * 2**20, "mem_limit_bytes": 512 * 2**20, "cpu_limit": 1.0, "oom_killed": False,
                  "limits_enforced": True, "goodput_req_per_s": m["requests_per_s"]}
            facts = {"knobs": {"n_threads": 1}, "n_threads": 1, "token_source": "usage", "input_tokens": "128",
                     "output_tokens": "64", "prefix_tokens": 0, "workload_seed": 0}
            _llm_job(s, rid, "llama.cpp", {}, 1, None, "pi4", m, facts)
            oom = {"mem_limit_bytes": 64 * 2**20, "cpu_limit": 1.0, "oom_killed": True, "mem_peak_bytes": 64 * 2**20,
                   "limits_enforced": True}
            _llm_job(s, rid, "llama.cpp", {}, 1, None, "tiny", oom, facts)
    return rid


def _llm_request(s: Any) -> str:
    """Add one LLM request (``tiny.gguf``, an SLO of :data:`LLM_SLO`) in session ``s``; its id."""
    from farm.db.models import ModelArtifact, Request

    rid = str(uuid.uuid4())
    sha = "cd" * 32
    llm = {"input_tokens": {"kind": "fixed", "a": 128.0, "b": 0.0}, "output_tokens": {"kind": "fixed", "a": 64.0,
                                                                                        "b": 0.0}, "slo": LLM_SLO}
    if s.get(ModelArtifact, sha) is None:
        s.add(ModelArtifact(sha256=sha, filename="tiny.gguf", format="gguf", size_bytes=999, location="", inputs=[]))
    s.add(Request(id=rid, model_sha256=sha, spec={"model": "tiny.gguf", "measurement": {"llm": llm}}, excluded=[]))
    s.flush()
    return rid


def seed_llm_rows(jobs: list[tuple[str, dict[str, Any], int, float | None, dict[str, Any]]]) -> str:
    """Write one LLM request whose jobs are ``jobs``: (engine, knobs asked, concurrency, open-loop rate or None,
    the stored metrics: a server's own view as its server_* columns, the ``server`` that ran among them). Returns
    the request id."""
    from farm.db.session import session_scope

    with session_scope() as s:
        rid = _llm_request(s)
        for engine, knobs, c, rate, metrics in jobs:
            facts = {"knobs": {**knobs, "n_threads": 2}, "n_threads": 2, "token_source": "usage", "input_tokens": "128",
                     "output_tokens": "64", "prefix_tokens": 0, "workload_seed": 0}
            _llm_job(s, rid, engine, knobs, c, rate, None, metrics, facts)
    return rid


def _llm_job(s: Any, rid: str, engine: str, knobs: dict[str, Any], c: int, rate: float | None, edge: str | None,
             metrics: dict[str, Any], facts: dict[str, Any]) -> None:
    from farm.db.models import Job, Result

    jid = uuid.uuid4().hex
    measurement = {"mode": "poisson" if rate else "closed", "rate": rate, "llm": {"slo": LLM_SLO}}
    s.add(Job(id=jid, request_id=rid, device="cpu", engine=engine, batch_size=1, concurrency=c, rate=rate,
              edge_profile=edge, queue="q", spec={"measurement": measurement, "knobs": knobs}, status="succeeded",
              attempts=1, worker_id="w1"))
    s.flush()
    s.add(Result(job_id=jid, request_id=rid, worker_id="w1", host="h1", slot=0, server_cpus="0-1", loadgen_cpus="2",
                 host_shared=False, isolated=True, details={"load": {"slo": LLM_SLO}}, **facts, **metrics))
