"""run_load against a scripted KServe v2 test server (a subprocess): counts, modes, stalls, errors."""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import pytest

from farm.errors import LoadGenError
from schemas import MeasurementSettings, TensorSpec
from schemas.metrics import BY_NAME
from tests.workers.loadgen.stallwatch import StallWatch
from workers.loadgen import stats
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadResult, LoadSpec, LoadTarget

INPUTS = [TensorSpec(name="x", shape=(16,))]
QUICK = dict(warmup_s=0.3, window_s=0.3, min_windows=2, max_windows=4)
PCTS = ("latency_p50_ms", "latency_p90_ms", "latency_p95_ms", "latency_p99_ms", "latency_p999_ms",
        "latency_max_ms")


def _metric_windows(r: LoadResult) -> list[dict[str, Any]]:
    first, last = r.details["metrics_windows"]
    return [w for w in r.details["windows"] if first <= w["k"] <= last]


def _latency(r: LoadResult) -> dict[str, Any]:
    """The metrics with the latency a client-limited run keeps in its details put back (this host is shared:
    an open-loop test run may send late)."""
    return {**r.metrics, **(r.details["client_limited_latency"] or {})}


def _check_consistent(r: LoadResult, batch: int) -> None:
    """Counts agree across metrics, windows and the histogram; keys are registry names."""
    m = _latency(r)
    assert set(m) <= set(BY_NAME), set(m) - set(BY_NAME)
    used = _metric_windows(r)
    n_ok = sum(w["requests"] for w in used)
    assert n_ok > 0
    assert r.details["latency_histogram"]["count"] == n_ok
    assert m["requests_per_s"] * m["duration_s"] == pytest.approx(n_ok)
    assert m["throughput_infer_per_s"] == pytest.approx(m["requests_per_s"] * batch)
    assert m["duration_s"] == pytest.approx(sum(w["length_s"] for w in used))
    values = [m[k] for k in PCTS]
    assert values == sorted(values)
    assert m["latency_mean_ms"] > 0 and m["latency_std_ms"] >= 0
    assert m["windows"] == len(r.details["windows"])
    assert 0 < m["client_busy_pct"] < 1000
    hist_p50 = stats.histogram_quantile(r.details["latency_histogram"], 50)
    assert hist_p50 == pytest.approx(m["latency_p50_ms"], rel=0.1)
    assert json.loads(json.dumps({"metrics": r.metrics, "details": r.details}))["metrics"] == r.metrics  # storable


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_closed_loop_counts_and_server_params(fake_server, rpc: str) -> None:
    with fake_server("--params", "--compute-ms", "0.5") as url:
        r = run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings(INPUTS, 3, 2, MeasurementSettings(client="farm", **QUICK,
                                            stability_pct=50, rpc=rpc)))
    _check_consistent(r, batch=3)
    m = r.metrics
    assert m["error_count"] == 0 and m["late_send_pct"] is None
    assert m["server_compute_p50_ms"] is not None and m["server_queue_p50_ms"] is not None
    assert m["server_compute_p50_ms"] >= 0.4  # the server sleeps 0.5 ms per request
    assert m["server_compute_p50_ms"] <= m["latency_p50_ms"]
    assert m["server_compute_p99_ms"] >= m["server_compute_p50_ms"]
    assert r.details["mode"] == "closed" and r.details["concurrency"] == 2 and r.details["rpc"] == rpc
    assert r.details["processes"] == 1 and r.details["batch_size"] == 3
    assert r.details["server_compute_histogram"]["count"] > 0


def test_server_without_params_reports_none(fake_server) -> None:
    with fake_server() as url:
        r = run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings(INPUTS, 1, 1, MeasurementSettings(client="farm", **QUICK,
                                            stability_pct=50)))
    for key in ("server_queue_p50_ms", "server_compute_p50_ms", "server_compute_p99_ms"):
        assert r.metrics[key] is None
    assert r.details["server_compute_histogram"] is None
    _check_consistent(r, batch=1)


def test_unstable_run_is_kept_at_max_windows(fake_server) -> None:
    with fake_server() as url:
        r = run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings(INPUTS, 1, 1, MeasurementSettings(client="farm", **QUICK,
                                            stability_pct=0.001)))
    assert r.metrics["stable"] is False
    assert r.metrics["windows"] == 4
    assert r.details["metrics_windows"] == [2, 3]
    assert any("not stable" in n for n in r.details["notes"])
    _check_consistent(r, batch=1)


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_open_loop_stall_shows_in_tail(fake_server, rpc: str) -> None:
    """A 200 ms server stall delays every request scheduled during it: counted from the schedule,
    the tail shows the stall (no coordinated omission), over calls and over one stream alike."""
    settings = MeasurementSettings(client="farm", mode="constant", rate=200, warmup_s=0.5, window_s=0.5, duration_s=2.5,
                                   rpc=rpc)
    with fake_server("--stall-after-s", "1.2", "--stall-ms", "200") as url, StallWatch() as stalls:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings))
    m = _latency(r)
    assert m["latency_max_ms"] >= 150
    assert m["latency_p99_ms"] >= 150
    assert m["late_send_pct"] is not None and 0 <= m["late_send_pct"] <= 100
    assert r.details["mode"] == "constant" and r.details["rate"] == 200
    _check_consistent(r, batch=1)
    stalls.require_quiet()
    assert m["requests_per_s"] == pytest.approx(200, rel=0.15)


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_closed_loop_stall_only_hits_one_request(fake_server, rpc: str) -> None:
    """The contrast: a closed loop with one outstanding request waits out the stall, so only one
    latency carries it (this is why open-loop runs count from the schedule)."""
    settings = MeasurementSettings(client="farm", warmup_s=0.5, window_s=0.5, duration_s=2.5, rpc=rpc)
    with fake_server("--stall-after-s", "1.2", "--stall-ms", "200") as url, StallWatch() as stalls:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings))
    assert r.metrics["latency_max_ms"] >= 150
    stalls.require_quiet()
    assert r.metrics["latency_p99_ms"] < 100


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_poisson_rate(fake_server, rpc: str) -> None:
    settings = MeasurementSettings(client="farm", mode="poisson", rate=300, warmup_s=0.3, window_s=0.5, duration_s=2.0,
                                   rpc=rpc)
    with fake_server() as url, StallWatch() as stalls:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 2, 1, settings))
    assert r.metrics["throughput_infer_per_s"] == pytest.approx(2 * r.metrics["requests_per_s"])
    assert r.details["mode"] == "poisson"
    stalls.require_quiet()
    assert r.metrics["requests_per_s"] == pytest.approx(300, rel=0.2)


@pytest.mark.parametrize("rpc, status", [("unary", "RESOURCE_EXHAUSTED"), ("stream", "STREAM_ERROR")])
def test_errors_counted_by_status(fake_server, rpc: str, status: str) -> None:
    """Unary calls fail with a gRPC status; a Triton-style stream answers with a bare error_message
    (no status), counted as STREAM_ERROR, and the stream goes on."""
    settings = MeasurementSettings(client="farm", warmup_s=0.3, window_s=0.5, duration_s=1.5, rpc=rpc)
    with fake_server("--error-every", "4", "--error-code", "RESOURCE_EXHAUSTED") as url:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 2, settings))
    errors = r.details["errors"]
    assert set(errors) == {status}
    assert r.metrics["error_count"] == errors[status]
    ok = sum(w["requests"] for w in r.details["windows"])
    assert r.metrics["error_count"] / (ok + r.metrics["error_count"]) == pytest.approx(0.25, abs=0.05)
    assert "scripted error" in r.details["first_error"]


@pytest.mark.parametrize("rpc, status", [("unary", "INVALID_ARGUMENT"), ("stream", "STREAM_ERROR")])
def test_all_requests_failing_raises(fake_server, rpc: str, status: str) -> None:
    with fake_server("--error-every", "1", "--error-code", "INVALID_ARGUMENT") as url:
        with pytest.raises(LoadGenError, match=f"no request succeeded.*{status}.*scripted error"):
            run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings(INPUTS, 1, 1, MeasurementSettings(client="farm", **QUICK, rpc=rpc)))


@pytest.mark.parametrize("mode", ["closed", "constant"])
def test_stream_rpc_on_a_server_without_streams_raises(fake_server, mode: str) -> None:
    settings = MeasurementSettings(client="farm", **QUICK, rpc="stream", mode=mode,
                                   rate=100 if mode != "closed" else None)
    with fake_server("--no-stream") as url:
        with pytest.raises(LoadGenError, match="does not serve ModelStreamInfer.*--rpc unary"):
            run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 2, settings))


def test_model_not_ready_raises(fake_server) -> None:
    with fake_server() as url:
        with pytest.raises(LoadGenError, match="'other' is not ready"):
            run_load(LoadTarget(url, "other"),
                     LoadSpec.from_settings(INPUTS, 1, 1, MeasurementSettings(client="farm", **QUICK)))


def test_unreachable_server_raises() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LoadGenError, match="cannot connect.*check that the server is running"):
        run_load(LoadTarget(f"127.0.0.1:{port}", "model"),
                 LoadSpec.from_settings(INPUTS, 1, 1, MeasurementSettings(client="farm", **QUICK)),
                                        connect_timeout_s=1.0)


def test_bad_arguments_raise() -> None:
    with pytest.raises(LoadGenError):
        run_load(LoadTarget("127.0.0.1:1", "model"),
                 LoadSpec.from_settings(INPUTS, 0, 1, MeasurementSettings(client="farm")))
    with pytest.raises(LoadGenError):
        run_load(LoadTarget("127.0.0.1:1", "model"),
                 LoadSpec.from_settings(INPUTS, 1, 1, MeasurementSettings(client="farm")), processes=0)
    with pytest.raises(LoadGenError, match="cannot build the request"):
        run_load(LoadTarget("127.0.0.1:1", "model"),
                 LoadSpec.from_settings([], 1, 1, MeasurementSettings(client="farm")))


def test_two_processes_closed_loop_merge(fake_server) -> None:
    with fake_server("--params") as url:
        r = run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings(INPUTS, 1, 4, MeasurementSettings(client="farm", **QUICK,
                                            stability_pct=50)), processes=2)
    assert r.details["processes"] == 2
    assert len(r.details["client_busy_pct_by_process"]) == 2
    assert r.metrics["client_busy_pct"] == max(r.details["client_busy_pct_by_process"])
    _check_consistent(r, batch=1)


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_two_processes_open_loop_rate(fake_server, rpc: str) -> None:
    settings = MeasurementSettings(client="farm", mode="constant", rate=200, warmup_s=0.3, window_s=0.5, duration_s=1.5,
                                   rpc=rpc)
    with fake_server() as url, StallWatch() as stalls:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings), processes=2)
    assert r.details["processes"] == 2
    _check_consistent(r, batch=1)
    stalls.require_quiet()
    assert r.metrics["requests_per_s"] == pytest.approx(200, rel=0.1)


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_hung_server_raises_after_first_window(fake_server, rpc: str) -> None:
    """A server that accepts requests but never answers: the run stops after the first empty window."""
    with fake_server("--compute-ms", "60000") as url:
        with pytest.raises(LoadGenError, match="no request succeeded.*no responses at all"):
            run_load(LoadTarget(url, "model"),
                     LoadSpec.from_settings(INPUTS, 1, 2, MeasurementSettings(client="farm", **QUICK, rpc=rpc)))


def test_client_limited_threshold() -> None:
    """More than 1 % late sends flags a run; closed loop (no late count) never is."""
    from schemas.result import CLIENT_LIMITED_PCT, client_limited

    assert client_limited({"late_send_pct": CLIENT_LIMITED_PCT + 0.5})
    assert not client_limited({"late_send_pct": CLIENT_LIMITED_PCT}) and not client_limited({"late_send_pct": None})
    assert not client_limited({})


def test_open_loop_beyond_the_client_is_flagged_client_limited(fake_server) -> None:
    """An open-loop rate one client process cannot send on time: the run is flagged client-limited, its
    latency is not reported as the server's (kept in the details) and a note says what to do."""
    # 8000 req/s: beyond one Python process's ~100 us of CPU per request, below the 10000 in flight allowed
    settings = MeasurementSettings(client="farm", mode="constant", rate=8000, warmup_s=0.2, window_s=0.3,
                                   duration_s=0.6)
    with fake_server() as url:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings), processes=1)
    m = r.metrics
    assert m["late_send_pct"] is not None and m["late_send_pct"] > 1.0
    assert r.details["client_limited"] is True
    assert all(m[name] is None for name in PCTS) and m["latency_mean_ms"] is None
    kept = r.details["client_limited_latency"]
    assert kept["latency_p50_ms"] > 0 and m["requests_per_s"] == kept["requests_per_s"]
    assert any("client-limited:" in n for n in r.details["notes"])
    assert r.details["client"] == "farm" and r.details["rpc"] == "unary"
    assert r.details["client_process"] == "own process"


def test_closed_loop_is_never_client_limited(fake_server) -> None:
    settings = MeasurementSettings(client="farm", warmup_s=0.2, window_s=0.3, duration_s=0.6)
    with fake_server() as url:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings), in_process=True)
    assert r.details["client_limited"] is False and r.metrics["latency_p50_ms"] is not None
    assert r.details["client_limited_latency"] is None
    assert r.details["client_process"] == "thread of the measuring process"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell them apart")
def test_load_process_runs_on_the_cpus_of_the_thread_that_started_it() -> None:
    """Load processes come from a fork server started once, with its own CPUs: each sets the CPUs of the
    thread that asked for it (a job's load-generator cores), not the fork server's."""
    import psutil

    from workers.cores import pinned
    from workers.loadgen.drivers import ProcessDriver, process_context
    from workers.loadgen.kserve.worker import WorkerConfig
    from workers.loadgen.patterns import ClosedLoop
    from workers.loadgen.plan import WindowPlan

    assert process_context().get_start_method() == "forkserver"
    cfg = WorkerConfig(url="127.0.0.1:1", model_name="model", request=b"", pattern=ClosedLoop(1),
                       plan=WindowPlan(0.1, (0.1,), 1, False), connect_timeout_s=5.0)
    target = {min(os.sched_getaffinity(0))}
    seen: list[int] = []
    for cpus in (target, os.sched_getaffinity(0) - target):
        with pinned(cpus), ProcessDriver([cfg]) as driver:
            proc = psutil.Process(driver._procs[0].pid)
            deadline = time.monotonic() + 10
            while set(proc.cpu_affinity()) != cpus and time.monotonic() < deadline:
                time.sleep(0.01)
            assert set(proc.cpu_affinity()) == cpus
            seen.append(proc.pid)
    assert seen[0] != seen[1]


def test_the_fork_server_counts_as_the_jobs_own_load_process() -> None:
    """The fork server the load processes come from is this process's child, never reaped while it runs, so
    ``os.times`` never sees its CPU (its start-up imports on a job's first run): ``load_process_pids`` names it
    beside the live load processes, so the foreign-load sampler counts it as the job's own."""
    import psutil

    from workers.loadgen.drivers import ProcessDriver, load_process_pids
    from workers.loadgen.kserve.worker import WorkerConfig
    from workers.loadgen.patterns import ClosedLoop
    from workers.loadgen.plan import WindowPlan

    cfg = WorkerConfig(url="127.0.0.1:1", model_name="model", request=b"", pattern=ClosedLoop(1),
                       plan=WindowPlan(0.1, (0.1,), 1, False), connect_timeout_s=5.0)
    with ProcessDriver([cfg]) as driver:
        load_pid = driver._procs[0].pid
        pids = load_process_pids()
        assert load_pid in pids
        server = psutil.Process(load_pid).parent()
        assert server is not None and server.pid in pids and server.pid != os.getpid()
        assert server.parent() is not None and server.parent().pid == os.getpid()
    assert load_pid not in load_process_pids() and server.pid in load_process_pids()


def test_the_schema_names_every_registered_client_and_auto() -> None:
    """A request may name exactly the registered clients and ``auto``: schemas and the registry agree."""
    from schemas.request import LOAD_CLIENTS
    from workers.loadgen.clients import AUTO, CLIENTS

    assert set(LOAD_CLIENTS) == set(CLIENTS) | {"auto"}
    assert set(AUTO) <= set(CLIENTS)


def test_unary_open_loop_sends_from_a_thread_of_its_own(fake_server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unary open-loop sends leave from the sender thread (a sync channel, no event-loop turn between the
    schedule and the send): every scheduled send is made, each answer recorded once, none lost to the window
    cuts that the event loop makes meanwhile."""
    from workers.loadgen.kserve import worker

    made: list[int] = []

    class Counted(worker._ThreadSender):
        def __init__(self, *args: Any) -> None:
            made.append(1)
            super().__init__(*args)

    monkeypatch.setattr(worker, "_ThreadSender", Counted)
    settings = MeasurementSettings(client="farm", mode="constant", rate=200, warmup_s=0.3, window_s=0.5,
                                   duration_s=1.5)
    with fake_server() as url, StallWatch() as stalls:
        r = run_load(LoadTarget(url, "model"), LoadSpec.from_settings(INPUTS, 1, 1, settings), in_process=True)
    assert made == [1]
    assert r.metrics["error_count"] == 0
    assert r.details["sent"] == pytest.approx(200 * 1.5, abs=2)  # every send of the windows made
    stalls.require_quiet()
    assert sum(w["requests"] for w in r.details["windows"]) == pytest.approx(200 * 1.5, rel=0.2)
