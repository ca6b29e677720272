"""farm turns gRPC's EventEngine endpoints off in its server and its load generator (workers/grpc_env.py).

Checked through gRPC itself: with ``GRPC_TRACE=event_engine_endpoint`` gRPC logs every EventEngine
endpoint it creates, so a process that runs farm's setting logs none, and one that loaded gRPC before
farm could set it logs them (the control that shows the check can fail) and gets a note on its result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.workers.loadgen.conftest import ROOT, identity_onnx
from workers.grpc_env import ENV, EVENT_ENGINE_OFF, LATE_NOTE, merged

EE_LINES = ("EventEngine::Endpoint", "posix_endpoint.cc")  # gRPC's trace of its EventEngine endpoints
TRACE = {"GRPC_TRACE": "event_engine_endpoint", "GRPC_VERBOSITY": "debug"}

CLIENT = """
import json, sys
if sys.argv[2] == "grpc-first":
    import grpc  # loaded before farm can configure it
from schemas import MeasurementSettings, TensorSpec
from workers import grpc_env
from schemas.load_levels import ClosedLoop
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget

s = MeasurementSettings(client="farm", warmup_s=0.2, window_s=0.3, min_windows=3, max_windows=3)
spec = LoadSpec((TensorSpec(name="x", shape=(16,)),), 1, ClosedLoop(concurrency=2), s)
r = run_load(LoadTarget(sys.argv[1], "model"), spec, processes=1, in_process=True)
print(json.dumps({"effective": grpc_env.EFFECTIVE, "notes": r.details["notes"],
                  "requests": r.metrics["requests_per_s"]}))
"""


def _env(**extra: str) -> dict[str, str]:
    """This environment without farm's GRPC_EXPERIMENTS (pytest's own process has it), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(extra)
    return env


@contextmanager
def traced_server(model: Path, stderr: Path) -> Iterator[str]:
    """farm's server started without GRPC_EXPERIMENTS in its environment, gRPC's endpoint trace on."""
    cmd = [sys.executable, "-m", "workers.engines.server", str(model), "--format", "onnx", "--engine",
           "onnxruntime", "--host", "127.0.0.1", "--port", "0", "--model-name", "model"]
    with stderr.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=_env(**TRACE))
        try:
            deadline = time.monotonic() + 60
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("farm-serve listening "):
                    yield line.split()[-1]
                    break
                assert time.monotonic() < deadline, "farm's server did not start"
            else:
                pytest.fail(f"farm's server exited: {stderr.read_text()[-800:]}")
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def _ee(log: str) -> int:
    """How many trace lines of ``log`` come from an EventEngine endpoint."""
    return sum(1 for line in log.splitlines() if any(m in line for m in EE_LINES))


def _client(url: str, order: str) -> tuple[dict[str, object], str]:
    out = subprocess.run([sys.executable, "-c", CLIENT, url, order], capture_output=True, text=True,
                         env=_env(**TRACE), timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_merged_adds_farms_setting_and_keeps_the_users() -> None:
    assert merged(None) == ",".join(f"-{n}" for n in EVENT_ENGINE_OFF)
    # an experiment the user names, on or off, stays as the user set it; others are kept too
    got = merged(" event_engine_client, -tcp_rcv_lowat ").split(",")
    assert got[:2] == ["event_engine_client", "-tcp_rcv_lowat"]
    assert "-event_engine_client" not in got
    assert {"-event_engine_listener", "-event_engine_for_all_other_endpoints"} <= set(got)
    assert merged(merged(None)) == merged(None)


@pytest.mark.slow
def test_server_and_load_generator_run_without_event_engine_endpoints(tmp_path: Path) -> None:
    model = identity_onnx(tmp_path / "identity.onnx")
    server_log = tmp_path / "server.stderr"
    with traced_server(model, server_log) as url:
        farm_first, farm_first_log = _client(url, "farm-first")
        grpc_first, grpc_first_log = _client(url, "grpc-first")
    # farm's order: the load generator ran on the classic endpoints, with no note
    assert farm_first["effective"] is True and float(farm_first["requests"]) > 0  # type: ignore[arg-type]
    assert _ee(farm_first_log) == 0
    assert LATE_NOTE not in farm_first["notes"]  # type: ignore[operator]
    # control: gRPC loaded first keeps its EventEngine endpoints (the trace shows them) and says so
    assert grpc_first["effective"] is False
    assert _ee(grpc_first_log) > 0
    assert LATE_NOTE in grpc_first["notes"]  # type: ignore[operator]
    # the server configured itself (its environment had no GRPC_EXPERIMENTS) and served both clients
    server_trace = server_log.read_text()
    assert "gRPC Tracers" in server_trace  # the trace was on in the server too
    assert _ee(server_trace) == 0
    assert LATE_NOTE not in server_trace
