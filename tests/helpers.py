"""Helpers for tests that run the real ``farm`` command in subprocesses."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

FAST = ["--windows", "3", "--window", "0.3", "--warmup", "0.2"]


def farm_env(**extra: str) -> dict[str, str]:
    """The current environment plus ``extra`` (settings already isolated by the autouse fixture)."""
    env = {k: v for k, v in os.environ.items()}
    env.update(extra)
    env.setdefault("FARM_RUNNER", "process")
    return env


def farm(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m farm.cli ARGS`` and return the finished process."""
    proc = subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True,
                          env=env or farm_env(), timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"farm {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def assert_refused(cases: list[tuple[list[str], str]], base: list[str], env: dict[str, str]) -> None:
    """Each of ``cases`` (``farm submit`` arguments after ``base``, a text its error must hold) is a one-line usage
    error (exit 2, no traceback), and no job was stored."""
    import sqlite3  # noqa: PLC0415 - the embedded database, these checks only

    for args, text in cases:
        proc = farm("submit", *base, *args, check=False, env=env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert text in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for db in Path(env["FARM_HOME"]).rglob("*.db"):  # refused before any job
        with sqlite3.connect(db) as con:
            tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert "jobs" not in tables or con.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def start_worker(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[str]:
    """Start a real ``farm worker`` process."""
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "farm", "worker", *args], env=env, stdout=out,
                            stderr=subprocess.STDOUT, text=True)


def wait_done(request_id: str, env: dict[str, str], timeout: float = 240) -> dict[str, int]:
    """Poll ``farm status --json`` until every job is final; returns the counts."""
    deadline = time.monotonic() + timeout
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = json.loads(farm("status", request_id, "--json", env=env).stdout)["counts"]
        if counts and all(k in ("succeeded", "failed", "cancelled") for k in counts):
            return counts
        time.sleep(1)
    raise AssertionError(f"request {request_id} not done after {timeout} s: {counts}")


def results_json(request_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    return json.loads(farm("results", request_id, "--format", "json", env=env).stdout)


def submit_to_worker(env: dict[str, str], submit_args: list[str], log: Path
                     ) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Run one real ``farm worker`` (process runner, output in ``log``), ``farm submit SUBMIT_ARGS --json``
    to it, wait for every job and stop the worker; returns (status counts, ``farm results`` rows)."""
    worker = start_worker(env, "--runner", "process", log=log)
    try:
        out = farm("submit", *submit_args, "--json", *FAST, env=env)
        request_id = json.loads(out.stdout)["request_id"]
        counts = wait_done(request_id, env)
        rows = results_json(request_id, env)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    return counts, rows


def gather_model(path: Path, rows: int, width: int, seq: int, out_name: str = "y") -> Path:
    """An embedding lookup: ids INT64 [N, seq] -> Gather over a [rows, width] table (values 0, 1, ...) ->
    ``out_name`` FP32 [N, seq, width]; an id outside 0..rows-1 fails the inference."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(rows * width, dtype=np.float32).reshape(rows, width), "table")
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], [out_name], axis=0)], "lookup",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", seq])],
                          [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["N", seq, width])], [table])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def start_submit(model: Path, err_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start a real ``farm submit MODEL ARGS`` (embedded when no broker is set), stderr to ``err_path``."""
    with open(err_path, "w") as err:
        return subprocess.Popen([sys.executable, "-m", "farm", "submit", str(model), *args], env=env or farm_env(),
                                stdout=subprocess.DEVNULL, stderr=err, text=True)


def running_job(db_path: Path) -> str | None:
    """The id of a job ``running`` in the SQLite file ``db_path`` (read-only; None when none, or not yet)."""
    import sqlite3

    if not db_path.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute("SELECT id FROM jobs WHERE status = 'running' LIMIT 1").fetchone()
    except sqlite3.OperationalError:  # not migrated yet, or locked by the writer
        return None
    return None if row is None else str(row[0])


def signal_when(proc: subprocess.Popen[str], err_path: Path, ready: Callable[[], T | None], signum: int,
                timeout: float = 180) -> tuple[int, T]:
    """Poll ``ready()`` until it returns something, then send ``signum`` to ``proc`` and wait for it to exit;
    (exit code, what ``ready`` returned). Fails when ``proc`` exits first or nothing is ready in time
    (its stderr, in ``err_path``, in the message); ``proc`` is killed if it does not exit."""
    deadline = time.monotonic() + timeout
    try:
        while (found := ready()) is None:
            assert proc.poll() is None, f"exited {proc.returncode} before the signal: {err_path.read_text()}"
            assert time.monotonic() < deadline, f"not ready after {timeout} s: {err_path.read_text()}"
            time.sleep(0.1)
        proc.send_signal(signum)
        return proc.wait(timeout=90), found
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop_group(proc: subprocess.Popen[Any], timeout_s: float = 15.0) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session``): SIGTERM, then SIGKILL after
    ``timeout_s`` seconds; nothing when it has already exited."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)


def servers_of(model: Path, since: float) -> list[str]:
    """The command lines of live processes serving ``model`` started at or after ``since`` (epoch s; a session
    fixture's server of the same model, e.g. ``llama_cpp_url``, is older); zombies count as gone."""
    out = []
    for p in psutil.process_iter(["cmdline", "status", "create_time"]):
        cmd = " ".join(p.info["cmdline"] or [])
        young = (p.info["create_time"] or 0.0) >= since - 1.0  # create_time's resolution: a clock tick
        if str(model) in cmd and young and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(cmd)
    return out
