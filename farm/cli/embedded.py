"""The embedded default: ``farm submit`` and ``farm resume`` run a request's jobs in this process.

SIGINT (Ctrl-C) and SIGTERM raise ``Signalled`` in the main thread while the jobs run (``stop_signals``), so
the job's context managers unwind as on any failure: the model server or container is stopped and removed,
the worker row goes offline. Then the job that was running ends ``cancelled`` with the signal as its reason
(``farm.lifecycle.interrupt``) and the command exits 128 + the signal number with a ``farm resume`` hint.
A second signal while that cleanup runs is ignored (SIGKILL still ends the process).
"""
from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from farm import lifecycle
from farm.cli.hooks import register_hooks
from farm.cli.live import LiveRun
from farm.cli.views import err_console, load_label, rate_text, say
from farm.db.models import Job
from farm.db.session import session_scope
from farm.errors import RunInterrupted, SandboxError
from farm.readers.results import result_rows
from farm.readers.rows import ResultRow
from farm.settings import get_settings
from schemas import ProfileRequest
from workers import signal_stack

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Signalled(BaseException):
    """Raised in the main thread by SIGINT or SIGTERM during an embedded run (a BaseException, so code
    catching ``Exception`` lets it through)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stop_signals() -> Iterator[None]:
    """While the body runs, the first SIGINT or SIGTERM raises ``Signalled``; later ones are ignored, so
    they cannot cut the cleanup short. The previous handlers come back on exit. Outside the main thread
    (where Python delivers no signals) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise Signalled(signum)

    previous: dict[int, Any] = {s: signal_stack.install(s, on_signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal_stack.restore(s, handler)


def local_gpu_products() -> list[str] | None:
    """In an embedded run, this host's GPU products (its jobs run here, so ``gpu`` means these); in a cluster
    None: the GPUs its live workers advertise."""
    from workers.hardware import detect_gpus  # noqa: PLC0415 - NVML: +0.02 s on every CLI start, measured

    return [g.name for g in detect_gpus()] if get_settings().embedded else None


def refuse_commands(request: ProfileRequest) -> None:
    """In an embedded run, SandboxError before anything is stored when an edge profile brings its own
    ``command:`` and ``FARM_ALLOW_COMMANDS`` is off (a worker would fail the job: this says it up front)."""
    settings = get_settings()
    named = [p.name for p in request.edge if p.command]
    if settings.embedded and named and not settings.allow_commands:
        raise SandboxError(f"edge profile(s) {', '.join(named)} bring their own command, which farm runs only where "
                           "the operator allows it: set FARM_ALLOW_COMMANDS=1 if you trust this request, or drop "
                           "`command:` to run farm's edge benchmark")


def run_embedded(request_id: str, job_ids: list[str], quiet: bool, command: str = "farm submit") -> None:
    """Run the jobs in this process with the same job runner a worker uses, each job's headline printed as it
    finishes (``farm.cli.live``); on SIGINT/SIGTERM stop, cancel the job in hand with the reason (``command``
    stopped by the signal) and raise RunInterrupted naming ``farm resume``."""
    from workers.hardware import detect_gpus  # noqa: PLC0415 - psutil: +0.02 s on every CLI start, measured
    from workers.node import new_worker_id  # noqa: PLC0415 - celery, prometheus_client, psutil: +0.11 s on every CLI start, measured
    from workers.runners.select import make_runner  # noqa: PLC0415 - the serving stack: +0.26 s on every CLI start, measured

    register_hooks()
    worker_id = f"embedded-{new_worker_id()}"
    current: list[str] = []  # the job in hand (a list, so the interrupt handler below sees the last one)
    with stop_signals():
        try:
            with LiveRun(len(job_ids), quiet) as live:
                live.step("preparing the runner")
                runner, why = make_runner(get_settings().runner, worker_id, detect_gpus())
                if not quiet:
                    live.console.print(f"embedded mode (no FARM_BROKER_URL): jobs run in this process; {why}",
                                       highlight=False)
                _run_jobs(runner, worker_id, request_id, job_ids, current, live)
        except (Signalled, KeyboardInterrupt) as exc:  # the server/container is stopped by now
            signum = exc.signum if isinstance(exc, Signalled) else int(signal.SIGINT)
            _interrupted(request_id, worker_id, current[-1] if current else None, f"{command} stopped", signum)


def _run_jobs(runner: Any, worker_id: str, request_id: str, job_ids: list[str], current: list[str],
              live: LiveRun) -> None:
    """Run ``job_ids``, then the jobs the request gained meanwhile (the next steps of its quick searches,
    which the scheduler enqueues as each result lands) until none is left."""
    from workers.hardware import detect_hardware  # noqa: PLC0415 - as in run_embedded
    from workers.node import WorkerNode  # noqa: PLC0415 - as in run_embedded

    node = WorkerNode(runner=runner, hardware=detect_hardware(docker=runner.name == "docker"), worker_id=worker_id)
    with node:
        todo, ran = list(job_ids), set(job_ids)
        while todo:
            job_id = todo.pop(0)
            current.append(job_id)
            row = _row(request_id, job_id)
            edge = f" edge {row.edge_profile}" if row.is_edge else ""
            live.started(f"job {len(ran) - len(todo)}/{len(ran)} {row.device} {row.engine} "
                         f"{load_label(row)}{edge}")
            t0 = time.monotonic()
            node.run(job_id)
            live.finished(_row(request_id, job_id), time.monotonic() - t0)
            if not todo:
                todo = [j for j in _queued(request_id) if j not in ran]
                ran.update(todo)
                live.set_total(len(ran))


def _row(request_id: str, job_id: str) -> ResultRow:
    """The job's results row (``farm.readers.results.result_rows``, the one reader)."""
    return next(r for r in result_rows(request_id) if r["job_id"] == job_id)


def _queued(request_id: str) -> list[str]:
    with session_scope() as s:
        return [j for j, _ in lifecycle.resumable(s, request_id)]


def _interrupted(request_id: str, worker_id: str, job_id: str | None, what: str, signum: int) -> None:
    """Cancel the job in hand (if it was still active) with the signal as its reason; raise RunInterrupted."""
    name = signal.Signals(signum).name
    with session_scope() as s:
        stopped = job_id is not None and lifecycle.interrupt(s, job_id, worker_id, f"{what} by {name}")
        job = s.get(Job, job_id) if stopped else None
        left = len(lifecycle.resumable(s, request_id))
    if job is not None:
        rate = rate_text({"rate": job.rate, "edge_profile": job.edge_profile})
        say(f"{name}: job {job.id[:8]} ({job.device} {job.engine} b={job.batch_size} "
            f"c={job.concurrency}{rate}{' edge=' + job.edge_profile if job.edge_profile else ''}) "
            "cancelled, its server stopped", to=err_console, soft_wrap=True)
    raise RunInterrupted(f"interrupted by {name}; `farm resume {request_id}` runs the request's {left} remaining "
                         "job(s)", signum)
