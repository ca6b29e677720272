"""The process runner: a job's launch (``workers.serving``) as a local subprocess (hosts without Docker, pods)."""
from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil

from farm.errors import ServerError
from farm.secrets import clean_env
from farm.settings import get_settings
from schemas import GpuInfo, JobResult, JobSpec
from schemas.cpus import cpu_list
from workers.hardware import gpu_uuids_for
from workers.limits import LimitedCgroup
from workers.runners.base import Runner
from workers.runners.common import server_memory
from workers.runners.process_edge import run_edge_process
from workers.serving.base import Launch, ServingTarget, Site
from workers.serving.jail import confined

#: a Python exception's last line (``ValueError: ...``), after a prefix a server may put on its lines (a process's
#: name and pid, ``(EngineCore pid=12) ``, or with a level and a time, ``(Worker-0 pid=33) ERROR 11-29 07:19:03
#: [executor.py:953] ``): group 1 is the exception and its message
EXCEPTION_LINE = re.compile(r"(?:^|[)\]]\s+)((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): \S.*?)\s*$")
#: a local process on the loopback interface: it picks a free port and prints it
SITE = Site(container=False, python=sys.executable, host="127.0.0.1", port=0)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the worker that started it dies (even by kill -9), so no
    server outlives its worker. Linux only; elsewhere a no-op."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child_setup(cpu_set: set[int] | None) -> Callable[[], None]:
    def setup() -> None:
        _die_with_parent()
        if cpu_set:
            os.sched_setaffinity(0, cpu_set)

    return setup


class ServerProcess:
    """A model server subprocess; a context manager that always stops it.

    Reads the bound port from the server's ``<listen_prefix>HOST:PORT`` line on stdout (e.g. the built-in
    server's ``farm-serve listening HOST:PORT``: it binds port 0, so there is no race for a free port; None:
    no such line) and keeps the last stderr lines for error messages, and the first Python exception line it printed
    (``first_error``: the root cause of a chained traceback, which a long one pushes out of the tail, e.g. an engine
    core's reason before its API server's "Engine core initialization failed"). ``cpu_set`` pins the server's
    CPUs.
    """

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, listen_prefix: str | None = None,
                 cpu_set: set[int] | None = None, cwd: str | None = None, pass_fds: tuple[int, ...] = ()) -> None:
        self.argv = argv
        self.pass_fds = pass_fds
        self.cwd = cwd
        self.env = env
        self.listen_prefix = listen_prefix
        self.cpu_set = cpu_set
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.address: str | None = None  # HOST:PORT as the server printed it
        self._stderr: deque[str] = deque(maxlen=20)
        self.first_error: str | None = None
        self._port_ready = threading.Event()

    def tail(self) -> str:
        """The server's last stderr lines, one string."""
        return " | ".join(line.strip() for line in self._stderr if line.strip())[-1500:]

    def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.listen_prefix is not None and line.startswith(self.listen_prefix) and self.port is None:
                self.address = line.split()[-1]
                self.port = int(self.address.rsplit(":", 1)[1])
                self._port_ready.set()
        self._port_ready.set()

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)
            if self.first_error is None and (found := EXCEPTION_LINE.search(line)) is not None:
                self.first_error = found.group(1)[:500]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> ServerProcess:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=self.env, cwd=self.cwd,
                                     start_new_session=True, pass_fds=self.pass_fds,
                                     preexec_fn=_child_setup(self.cpu_set))
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        return self

    @property
    def pid(self) -> int:
        """The server's process id (it is started)."""
        assert self.proc is not None, "ServerProcess used outside its with-block"
        return self.proc.pid

    def wait_port(self, timeout_s: float) -> int:
        """Wait for the server to report its port; ServerError with its stderr when it dies or times out."""
        self._port_ready.wait(timeout_s)
        if self.port is None:
            code = self.proc.poll() if self.proc else None
            state = f"exited with code {code}" if not self.alive() else f"did not bind in {timeout_s:g} s"
            raise ServerError(f"model server {state}: {self.tail() or 'no output'}")
        return self.port

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the server's process group, then SIGKILL after ``grace_s``; returns once every process of its
        tree has ended (a jailed server's root, bubblewrap, ends before the jail's processes do: the next job must
        not start beside a server still dying)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tree = _tree(self.proc.pid)
        deadline = time.monotonic() + grace_s
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=5)
        _wait_gone(tree, deadline)


def _tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and its descendants (those readable now)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _wait_gone(procs: list[psutil.Process], deadline: float) -> None:
    """Wait until each of ``procs`` has ended (a zombie counts as ended), SIGKILLing those left at ``deadline``."""
    killed = False
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                continue
        if not alive or (killed and time.monotonic() > deadline + 5):
            return
        if time.monotonic() > deadline and not killed:
            for p in alive:
                try:
                    p.kill()
                except psutil.Error:
                    continue
            killed = True
        time.sleep(0.02)


def server_env(spec: JobSpec, gpus: Sequence[GpuInfo] | None, launch_env: dict[str, str] | None = None
               ) -> dict[str, str]:
    """The server's environment: the allowlist of ``farm.secrets.clean_env`` (never the worker's secrets), the
    launch's own ``launch_env``, and ``CUDA_VISIBLE_DEVICES`` set to the UUID of the GPU among ``gpus`` (the
    worker's or its slot's) that serves a GPU job (``gpus`` None: as the worker has it)."""
    env = clean_env(launch_env)
    if gpus is None or not spec.device.startswith("gpu"):
        return env
    uuids = gpu_uuids_for(list(gpus), spec.device)
    if not uuids:
        raise ServerError(f"job wants device {spec.device!r} but this worker has no such GPU "
                          f"(has: {', '.join(g.slug for g in gpus) or 'none'}); it was routed to the wrong queue")
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(uuids)}


def confine(stack: ExitStack, argv: list[str], cpus: set[int] | None, memory_bytes: int | None = None
            ) -> tuple[list[str], list[str]]:
    """``argv`` wrapped to start in a cgroup whose cpuset is ``cpus`` and whose memory is at most ``memory_bytes``
    (entered on ``stack``): no thread of the server can then run elsewhere, whatever affinity it sets itself, and
    it is killed for memory past its limit. Where the cgroup cannot be made (not root, no delegated controllers),
    ``argv`` as it is and notes saying the server is pinned by sched_setaffinity only (``ServerProcess`` pins it
    either way) and its memory is not limited."""
    if not cpus and memory_bytes is None:
        return argv, []
    cg = stack.enter_context(LimitedCgroup(cpuset_cpus=cpu_list(cpus) if cpus else None, memory_bytes=memory_bytes))
    if cg.enforced:
        return cg.command(argv), []
    notes = [] if not cpus else [
        f"server confined to cpus {cpu_list(cpus)} by sched_setaffinity only, not by a cgroup cpuset "
        f"({cg.reason}): its threads could set their own affinity, so farm checks each one's"]
    if memory_bytes is not None:
        notes.append(f"server memory not limited to {memory_bytes / 2**20:.0f} MiB: no cgroup ({cg.reason})")
    return argv, notes


class ProcessRunner(Runner):
    """Runs each job's launch as a subprocess on 127.0.0.1, held in a cgroup cpuset of its leased cores where the
    kernel allows (``confine``), and edge runs in a limited cgroup where permitted.

    ``gpus``: the GPUs a GPU job may use (a slot's one GPU), bound by ``CUDA_VISIBLE_DEVICES``; None leaves
    the environment as it is."""

    name = "process"
    site = SITE

    def __init__(self, gpus: Sequence[GpuInfo] | None = None) -> None:
        self.gpus = list(gpus) if gpus is not None else None

    @contextmanager
    def place(self, spec: JobSpec, launch: Launch, cpus: set[int] | None) -> Iterator[ServingTarget]:
        timeout = get_settings().server_ready_timeout_s
        env = server_env(spec, self.gpus, launch.env)
        if launch.prepare is not None:
            launch.prepare()
        with ExitStack() as stack:
            jail = stack.enter_context(confined(launch, env))  # every launch: jailed unless it runs no code
            argv, notes = confine(stack, jail.argv, cpus, server_memory(spec))
            server = stack.enter_context(ServerProcess(argv, env=env, listen_prefix=launch.listen_prefix,
                                                       cpu_set=cpus, cwd=launch.cwd, pass_fds=jail.pass_fds))
            notes += jail.notes
            port = server.wait_port(timeout) if launch.listen_prefix is not None else (jail.port or launch.port)
            url = f"{SITE.host}:{port}"
            try:
                launch.ready(url, launch.model_name, timeout, alive=server.alive)
            except ServerError as exc:
                cause = f"; its first error: {server.first_error}" if server.first_error else ""
                raise ServerError(f"{exc}{cause}; server output: {server.tail() or 'none'}") from None
            yield ServingTarget(host=SITE.host, port=port, model_name=launch.model_name, pid=server.pid, notes=notes)

    def run_edge(self, spec: JobSpec, model_path: Path) -> JobResult:
        return run_edge_process(spec, model_path)
