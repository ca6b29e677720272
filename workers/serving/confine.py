"""Every thread of a served model stays inside its job's core lease. Once a server farm placed is ready (its
model loaded, its engine's thread pools started), farm reads the CPU affinity of every thread of its processes
(``Cpus_allowed_list`` of ``/proc/PID/task/TID/status``) and refuses to measure when one may run on a core
outside the lease: an engine that pins its own threads (ONNX Runtime left to its default thread count does)
would otherwise measure cores the job never leased. The one check, for every engine and runner
(``workers.runners.base.Runner.serve``): the process runner's server is the process tree of its pid, a
container's processes are those in its cgroup (``cgroup.procs``, host pids)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from farm.errors import LeaseError
from schemas.cpus import cpu_list, parse_cpu_list
from workers.measure import tree_pids
from workers.serving.base import ServingTarget

PROC = Path("/proc")
SHOWN = 4  # threads named in the error; the rest are counted


@dataclass(frozen=True)
class ThreadCpus:
    """One thread of a server process and the cores it may run on."""

    pid: int
    tid: int
    name: str
    cpus: frozenset[int]

    def describe(self) -> str:
        return f"thread {self.tid} ({self.name}) of process {self.pid} may run on cpus {cpu_list(self.cpus)}"


def _field(status: str, key: str) -> str:
    for line in status.splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise ValueError(f"no {key} line")


def thread_cpus(pids: Iterable[int], proc: Path = PROC) -> list[ThreadCpus]:
    """Every thread of the processes ``pids`` with its affinity; threads (and processes) that end while they
    are read are left out."""
    out: list[ThreadCpus] = []
    for pid in sorted(set(pids)):
        try:
            tids = sorted(int(t.name) for t in (proc / str(pid) / "task").iterdir())
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            continue
        for tid in tids:
            try:
                status = (proc / str(pid) / "task" / str(tid) / "status").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue
            out.append(ThreadCpus(pid, tid, _field(status, "Name"), frozenset(parse_cpu_list(
                _field(status, "Cpus_allowed_list")))))
    return out


def server_pids(target: ServingTarget) -> tuple[set[int], str | None]:
    """The host pids of ``target``'s server (its process tree, else the processes of its cgroup), or none and
    why they cannot be read."""
    if target.pid is not None:
        pids = tree_pids(target.pid)
        return pids, None if pids else f"its process {target.pid} is gone"
    if target.cgroup_path is None:
        return set(), "farm knows neither its process nor its cgroup"
    try:
        pids = {int(p) for p in (target.cgroup_path / "cgroup.procs").read_text().split()} - {0}
    except (OSError, ValueError) as exc:
        return set(), f"its cgroup's processes cannot be read ({exc})"
    return pids, None if pids else "its cgroup lists no process this worker can see (another pid namespace)"


def check_threads(target: ServingTarget, lease: Iterable[int], proc: Path = PROC) -> list[ThreadCpus]:
    """Every thread of ``target``'s server, each inside the cores ``lease``; LeaseError naming the threads that
    may run elsewhere and what to do. Where the threads cannot be read, a note on ``target`` says so."""
    cores = frozenset(lease)
    pids, why = server_pids(target)
    threads = thread_cpus(pids, proc) if pids else []
    if not threads:
        target.notes.append(f"the server's thread affinities were not checked against the lease "
                            f"(cpus {cpu_list(cores)}): {why or 'its threads cannot be read'}")
        return []
    outside = [t for t in threads if not t.cpus <= cores]
    if outside:
        more = f" and {len(outside) - SHOWN} more" if len(outside) > SHOWN else ""
        raise LeaseError(
            f"{'; '.join(t.describe() for t in outside[:SHOWN])}{more}: outside the job's lease (cpus "
            f"{cpu_list(cores)}), so farm refuses to measure it. The engine set its threads' affinity itself: "
            "give the job an explicit threads setting or turn the engine's own CPU pinning off, and run the "
            "worker where it can create cgroups (root, or a delegated cgroup v2) so the server is held in a "
            "cpuset")
    return threads
