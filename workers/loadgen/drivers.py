"""Where load workers run: one thread of this process, or several processes. Context managers, so a
failed measurement never leaves a worker behind."""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import os
import queue
import signal
import threading
import time
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection, wait
from typing import Any

from workers.loadgen.kserve.messages import ControlMessage, Go, Stop, WorkerDone, WorkerError, WorkerMessage
from workers.loadgen.kserve.worker import Control, WorkerConfig, run_worker

JOIN_TIMEOUT_S = 10.0  # how long a stopped worker may take to close its channel and exit
_FINAL = (WorkerDone, WorkerError)  # a worker sends nothing after these
#: pids of the load processes alive in this process's drivers: a job counts their CPU time as its own, not as
#: foreign load on its cores (their fork server reaps them, so this process's ``os.times`` never includes them)
_LIVE_PIDS: set[int] = set()
_LIVE_LOCK = threading.Lock()


def load_process_pids() -> list[int]:
    """The pids of every live load process started by this process's drivers, and of their fork server: it
    starts with a job's first load process and spends a few hundred ms of CPU importing the load worker
    (``process_context``), work of that job, not foreign load on its cores (measured: a quiet host's first job
    of a request read 12-13 % foreign load in 1 s windows without it, the next ones 1 %)."""
    with _LIVE_LOCK:
        pids = set(_LIVE_PIDS)
    server = _fork_server_pid()
    return sorted(pids | ({server} if server is not None else set()))


def _fork_server_pid() -> int | None:
    """The pid of this process's multiprocessing fork server, None when none runs. multiprocessing keeps it in a
    private attribute and has no public accessor, so it is read defensively."""
    pid = getattr(getattr(mp_forkserver, "_forkserver", None), "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


class Driver(ABC):
    """Runs one or more load workers and relays their messages to the coordinator."""

    def __init__(self, configs: list[WorkerConfig]) -> None:
        if not configs:
            raise ValueError("a driver needs at least one worker config")
        self.configs = configs

    @property
    def n(self) -> int:
        """Number of workers."""
        return len(self.configs)

    @abstractmethod
    def go(self, t_start: float) -> None:
        """Tell every worker to start its schedule at monotonic time ``t_start``."""

    @abstractmethod
    def recv(self, timeout_s: float) -> list[tuple[int, WorkerMessage]]:
        """Messages that arrived within ``timeout_s``, as (worker index, message); may be empty."""

    @abstractmethod
    def stop(self) -> None:
        """Ask every worker to stop (non-blocking, idempotent)."""

    @abstractmethod
    def close(self) -> None:
        """Stop and reap every worker."""

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- in-process thread

class _ThreadControl(Control):
    def __init__(self, index: int, out: queue.Queue[tuple[int, WorkerMessage]]) -> None:
        self.index = index
        self.out = out
        self.go_ev = threading.Event()
        self.stop_ev = threading.Event()
        self.t_start: float | None = None

    def send(self, msg: WorkerMessage) -> None:
        self.out.put((self.index, msg))

    def wait_go(self, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        while not self.go_ev.wait(0.05):
            if self.stop_ev.is_set() or time.monotonic() > deadline:
                return None
        return None if self.stop_ev.is_set() else self.t_start

    def stop_requested(self) -> bool:
        return self.stop_ev.is_set()


class ThreadDriver(Driver):
    """Each worker runs its own event loop in a daemon thread of this process."""

    def __init__(self, configs: list[WorkerConfig]) -> None:
        super().__init__(configs)
        self._out: queue.Queue[tuple[int, WorkerMessage]] = queue.Queue()
        self._controls = [_ThreadControl(i, self._out) for i in range(self.n)]
        self._threads = [
            threading.Thread(target=run_worker, args=(cfg, ctl), name=f"farm-loadgen-{i}", daemon=True)
            for i, (cfg, ctl) in enumerate(zip(configs, self._controls, strict=True))
        ]
        for t in self._threads:
            t.start()

    def go(self, t_start: float) -> None:
        for ctl in self._controls:
            ctl.t_start = t_start
            ctl.go_ev.set()

    def recv(self, timeout_s: float) -> list[tuple[int, WorkerMessage]]:
        try:
            first = self._out.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            return []
        got = [first]
        while True:
            try:
                got.append(self._out.get_nowait())
            except queue.Empty:
                return got

    def stop(self) -> None:
        for ctl in self._controls:
            ctl.stop_ev.set()

    def close(self) -> None:
        self.stop()
        for t in self._threads:
            t.join(JOIN_TIMEOUT_S)


# --------------------------------------------------------------------------- processes

class _PipeControl(Control):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._stopped = False

    def send(self, msg: WorkerMessage) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError):
            self._stopped = True

    def wait_go(self, timeout_s: float) -> float | None:
        if not self.conn.poll(timeout_s):
            return None
        msg = self.conn.recv()
        if isinstance(msg, Go):
            return msg.t_start
        self._stopped = True
        return None

    def stop_requested(self) -> bool:
        if self._stopped:
            return True
        try:
            if self.conn.poll():
                self.conn.recv()  # the only message after Go is Stop
                self._stopped = True
        except (EOFError, OSError):
            self._stopped = True
        return self._stopped


def _process_main(cfg: WorkerConfig, conn: Connection, cpus: set[int] | None) -> None:
    # Ctrl-C signals the terminal's whole process group: the parent alone handles it (it stops this process
    # with Stop, then SIGTERM), so a KeyboardInterrupt here would only print a traceback per load process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cpus:  # a forked child has its fork server's CPUs, not those of the thread that asked for it
        os.sched_setaffinity(0, cpus)
    run_worker(cfg, _PipeControl(conn))
    conn.close()


def start(proc: Any) -> None:
    """Start a load process and count it as the job's own (``load_process_pids``) until :func:`reap`."""
    proc.start()
    with _LIVE_LOCK:
        _LIVE_PIDS.add(proc.pid)


def reap(proc: Any, grace_s: float = 2.0) -> None:
    """End a load process that did not exit when asked: SIGTERM, then SIGKILL, each given ``grace_s``; it no
    longer counts as the job's own."""
    if proc.is_alive():
        proc.terminate()
        proc.join(grace_s)
    if proc.is_alive():
        proc.kill()
        proc.join(grace_s)
    with _LIVE_LOCK:
        _LIVE_PIDS.discard(proc.pid)


def process_context() -> Any:
    """Where load processes come from: a fork server that has imported the load worker once (a fresh
    process per measurement then starts in milliseconds instead of the ~0.7 s a spawned one spends
    importing gRPC, numpy and farm's schemas, paid by every configuration of a sweep); plain spawn where
    there is no fork server. Never a fork of the caller: gRPC's core does not survive fork, and the fork
    server never opens a channel."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


class ProcessDriver(Driver):
    """Each worker runs in its own process (:func:`process_context`) with its own event loop and gRPC
    channel, on the CPUs of the thread that creates the driver (e.g. a job's load-generator cores)."""

    def __init__(self, configs: list[WorkerConfig]) -> None:
        super().__init__(configs)
        ctx = process_context()
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        self._gone: set[int] = set()
        self._finished: set[int] = set()
        try:
            for i, cfg in enumerate(configs):
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=_process_main, args=(cfg, child, cpus), name=f"farm-loadgen-{i}",
                                   daemon=True)
                start(proc)
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise
        self._stopped = False

    def _send_all(self, msg: ControlMessage) -> None:
        for conn in self._conns:
            try:
                conn.send(msg)
            except (BrokenPipeError, OSError):
                pass

    def go(self, t_start: float) -> None:
        self._send_all(Go(t_start))

    def recv(self, timeout_s: float) -> list[tuple[int, WorkerMessage]]:
        got: list[tuple[int, WorkerMessage]] = []
        active = {id(c): i for i, c in enumerate(self._conns) if i not in self._gone}
        if not active:
            time.sleep(max(timeout_s, 0.0))
            return got
        for readable in wait([self._conns[i] for i in active.values()], timeout=max(timeout_s, 0.0)):
            i = active[id(readable)]
            conn = self._conns[i]
            try:
                while conn.poll():
                    got.append((i, conn.recv()))
            except (EOFError, OSError):
                self._gone.add(i)
                if not any(isinstance(m, _FINAL) for j, m in got if j == i) and i not in self._finished:
                    self._procs[i].join(1.0)
                    got.append((i, WorkerError(f"load process {i} exited early (exit code "
                                               f"{self._procs[i].exitcode}); see its stderr")))
            for j, m in got:
                if isinstance(m, _FINAL):
                    self._finished.add(j)
        return got

    def stop(self) -> None:
        if not getattr(self, "_stopped", False):
            self._stopped = True
            self._send_all(Stop())

    def close(self) -> None:
        self.stop()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            reap(proc)
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
