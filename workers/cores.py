"""CPU isolation on one host: the cores a job measures on, leased so that no other farm job on the same
host measures on them at the same time, and the host journal that says whether any farm job overlapped.

Every farm process on a host shares one directory (``FARM_HOST_LOCK_DIR``, default ``/tmp/farm-host``):

- ``cpu<N>.lock``: one advisory ``flock`` per core. A job holds the locks of its cores for its whole
  measurement; the kernel drops them when the process dies (even by SIGKILL), so no lease goes stale.
- ``alloc.lock``: held for a moment while a job takes its cores, so two jobs never grab half each.
- ``wait/<ns>-<pid>``: a waiting job's ticket (flocked while it waits); the oldest live ticket goes first
  (strictly: a later job waits behind it even when its own cores are free), so two workers on one host
  take turns instead of one starving the other.
- ``journal/<job>-<pid>.json``: one entry per lease (job, pid, cores, start and end wall time, whether
  its cores were leased), kept a day; ``CoreLease.shared_with()`` lists the other jobs that overlapped.

How many cores a job takes (``cores_for``) depends on the job and the host, never on contention, so a job
measures the same alone or among others: a serving job takes ``FARM_JOB_CORES`` (0: all cores allowed to
this process, divided among the worker's slots, at least 2); an edge job its profile's cpuset, or
``ceil(cpus)`` cores. When fewer are free, the job waits. Within a lease of 2 or more cores the load
generator gets its own ``ceil(n/4)`` (``split``), disjoint from the server's; a 1-core lease is shared.
``FARM_ISOLATION=off`` takes no core locks (the
journal still records the job, so results say they shared the host).
"""
from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from schemas import JobSpec
from schemas.cpus import cpu_list

JOURNAL_KEEP_S = 86400.0  # journal entries of finished leases are kept this long, s
POLL_MIN_S, POLL_MAX_S = 0.02, 0.5  # waiting for cores: first and longest pause between attempts, s
MIN_SERVING_CORES = 2  # a serving job's lease when the host's cores are divided among slots


def host_cores() -> list[int]:
    """The cores this process may run on (its affinity, e.g. a container's cpuset), sorted."""
    return sorted(os.sched_getaffinity(0))


def cores_for(spec: JobSpec, allowed: list[int], slots: int = 1, job_cores: int = 0) -> int | list[int]:
    """How many of the ``allowed`` cores job ``spec`` leases on a host shared by ``slots`` slots, or the
    exact cores: an edge profile's cpuset (those of it this process may use; none: ``ceil(cpus)`` cores, and
    the run reports its cpuset not enforced). ``job_cores``: the operator's share per serving job (0: auto)."""
    prof = spec.edge_profile
    n = len(allowed)
    if prof is not None:
        exact = sorted(set(prof.cores) & set(allowed))
        return exact or min(n, max(1, math.ceil(prof.cpus)))
    if job_cores > 0:
        return min(n, job_cores)
    return min(n, max(MIN_SERVING_CORES, n // max(1, slots)))


def split(cores: list[int]) -> tuple[list[int], list[int]]:
    """(server cores, load-generator cores) of a lease: the last ``ceil(n/4)`` cores for the load generator
    when the lease has 2 or more (disjoint sets: a client sharing the server's cores charges its own CPU
    time to the server, ``benchmarks/vs_perf_analyzer.py``), else both share the one core."""
    if len(cores) < 2:
        return list(cores), list(cores)
    k = math.ceil(len(cores) / 4)
    return list(cores[:-k]), list(cores[-k:])


def _open_shared(path: Path) -> IO[str]:
    """``path`` opened for locking, created readable and writable by every user (workers may run as
    different users on one host)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)
    except OSError:  # someone else's file: it was made shared when created
        pass
    return os.fdopen(fd, "r+")


def _try_lock(f: IO[str], shared: bool = False) -> bool:
    try:
        fcntl.flock(f, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise


def _held(path: Path) -> bool:
    """True while some process holds a lock on ``path`` (a journal entry's holder is alive)."""
    try:
        with _open_shared(path) as f:
            return not _try_lock(f)
    except FileNotFoundError:
        return False


def lock_dir(path: Path) -> Path:
    """The host-wide directory ``path`` with its ``wait`` and ``journal`` folders, created sticky and
    writable by all (like /tmp) when it does not exist."""
    for d in (path, path / "wait", path / "journal"):
        if not d.is_dir():
            d.mkdir(parents=True, exist_ok=True)
            try:
                d.chmod(0o1777)
            except OSError:
                pass
    return path


@dataclass(frozen=True)
class JournalEntry:
    """One lease in the host journal: wall times in seconds since the epoch (``end`` None: still held or
    its process died), ``isolated``: it held locks on its cores."""

    job_id: str
    pid: int
    cores: list[int]
    start: float
    end: float | None
    isolated: bool

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and (self.end is None or self.end > start)


def read_journal(directory: Path) -> Iterator[tuple[Path, JournalEntry]]:
    """Every readable entry of the journal in ``directory`` (a half-written one is skipped)."""
    for p in sorted((directory / "journal").glob("*.json")):
        try:
            d = json.loads(p.read_text())
            yield p, JournalEntry(job_id=str(d["job_id"]), pid=int(d["pid"]), cores=list(d["cores"]),
                                  start=float(d["start"]), end=None if d.get("end") is None else float(d["end"]),
                                  isolated=bool(d.get("isolated")))
        except (OSError, ValueError, KeyError, TypeError):
            continue


def reap_dead(directory: Path) -> int:
    """Close the journal entries of holders that died (SIGKILL, power loss of a container): their end becomes
    now, so they stop overlapping later leases. Returns how many were closed."""
    closed = 0
    for path, e in read_journal(directory):
        if e.end is not None:
            continue
        try:
            with _open_shared(path) as f:
                if not _try_lock(f):
                    continue  # its holder is alive
                d = json.loads(f.read() or "{}")
                if d.get("end") is None and d:
                    d["end"] = time.time()
                    f.seek(0)
                    f.truncate()
                    f.write(json.dumps(d))
                    closed += 1
        except (OSError, ValueError):
            continue
    return closed


#: the leases this process holds, by job id: the worker takes a job's lease before the job starts running
#: and the job's measurement enters the same lease again (``held_lease``) instead of waiting a second time
_HELD: dict[str, CoreLease] = {}


def held_lease(job_id: str) -> CoreLease | None:
    """The lease this process holds for ``job_id``, if any."""
    return _HELD.get(job_id)


@dataclass
class CoreLease:
    """The cores of one job, held from ``__enter__`` (which waits for them) to ``__exit__``.

    ``want``: a number of cores (any free ones of ``allowed``) or the exact cores. ``isolation`` False:
    no core is locked (``cores`` are then all of ``allowed``). The wait ends early only by an exception
    (the worker's cancel, time limit and shutdown arrive as one, from a signal handler).
    """

    job_id: str
    want: int | list[int]
    directory: Path
    allowed: list[int] = field(default_factory=host_cores)
    isolation: bool = True
    cores: list[int] = field(default_factory=list)
    waited_s: float = 0.0
    start: float = 0.0
    end: float | None = None
    _stack: ExitStack = field(default_factory=ExitStack)
    _entry: Path | None = None
    _entry_file: IO[str] | None = None
    _ticket: Path | None = None  # our place in the wait queue while we wait
    _depth: int = 0  # entries of this lease in this process (the worker's, then the measurement's)

    def __post_init__(self) -> None:
        if isinstance(self.want, list) and not set(self.want) <= set(self.allowed):
            raise ValueError(f"cores {cpu_list(self.want)} are not all among {cpu_list(self.allowed)}")
        if not self.want:
            raise ValueError("a lease needs at least one core")

    @property
    def server_cores(self) -> list[int]:
        return split(self.cores)[0]

    @property
    def loadgen_cores(self) -> list[int]:
        return split(self.cores)[1]

    def __enter__(self) -> CoreLease:
        if self._depth:  # re-entered (``held_lease``): the cores are ours already
            self._depth += 1
            return self
        lock_dir(self.directory)
        t0 = time.monotonic()
        try:
            if self.isolation:
                self._wait_for_cores()
            else:
                self.cores = list(self.allowed)
            self.waited_s = time.monotonic() - t0
            reap_dead(self.directory)
            self.start = time.time()
            self._write_entry()
        except BaseException:
            self._stack.close()
            raise
        self._depth = 1
        _HELD[self.job_id] = self
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        _HELD.pop(self.job_id, None)
        self.end = time.time()
        try:
            self._write_entry()
        except OSError:
            pass
        self._stack.close()  # the core locks and the entry's lock go here

    # -- taking the cores --------------------------------------------------------------------------------
    def _wait_for_cores(self) -> None:
        pause = POLL_MIN_S
        with ExitStack() as ticket_stack:  # our place in the queue, from the first failed attempt on
            while not self._attempt(ticket_stack):
                time.sleep(pause)
                pause = min(POLL_MAX_S, pause * 1.5)
        self._ticket = None

    def _queue(self, ticket_stack: ExitStack) -> Path:
        """A ticket in the wait queue, locked while we wait (made under the allocation lock, so no one
        sees it unlocked and takes it for a dead waiter's)."""
        ticket = self.directory / "wait" / f"{time.time_ns():020d}-{os.getpid()}-{id(self):x}"
        f = ticket_stack.enter_context(_open_shared(ticket))
        fcntl.flock(f, fcntl.LOCK_EX)
        ticket_stack.callback(ticket.unlink, missing_ok=True)
        return ticket

    def _older_waiters(self, ticket: Path | None) -> bool:
        """True when a live waiter queued before ``ticket`` (None: before anyone now); dead tickets go."""
        for other in sorted((self.directory / "wait").iterdir()):
            if ticket is not None and other.name >= ticket.name:
                return False
            try:
                with _open_shared(other) as f:
                    if not _try_lock(f):
                        return True
                    other.unlink(missing_ok=True)  # its waiter died or left without cleaning up
            except FileNotFoundError:
                continue
        return False

    def _attempt(self, ticket_stack: ExitStack) -> bool:
        """Under the allocation lock: take the wanted cores if all are free and no older waiter is queued;
        else queue up (once) and return False."""
        with _open_shared(self.directory / "alloc.lock") as alloc:
            fcntl.flock(alloc, fcntl.LOCK_EX)
            if not self._older_waiters(self._ticket) and self._grab():
                return True
            if self._ticket is None:
                self._ticket = self._queue(ticket_stack)
            return False

    def _grab(self) -> bool:
        """Lock the wanted cores (the allocation lock is held); False, holding none, when too few are free."""
        got = ExitStack()
        taken: list[int] = []
        candidates = self.want if isinstance(self.want, list) else self.allowed
        need = len(candidates) if isinstance(self.want, list) else self.want
        for core in candidates:
            f = got.enter_context(_open_shared(self.directory / f"cpu{core}.lock"))
            if _try_lock(f):
                taken.append(core)
                if len(taken) == need:
                    break
        if len(taken) < need:
            got.close()
            return False
        self.cores = sorted(taken)
        self._stack.enter_context(got)
        return True

    # -- the journal -------------------------------------------------------------------------------------
    def _write_entry(self) -> None:
        if self._entry_file is None:
            self._entry = self.directory / "journal" / f"{self.job_id}-{os.getpid()}-{id(self):x}.json"
            self._entry_file = self._stack.enter_context(_open_shared(self._entry))
            fcntl.flock(self._entry_file, fcntl.LOCK_SH)  # held while the lease lives: free means a dead holder
        data = {"job_id": self.job_id, "pid": os.getpid(), "host": socket.gethostname(), "cores": self.cores,
                "start": self.start, "end": self.end, "isolated": self.isolation}
        f = self._entry_file  # rewritten in place: the lock stays on this file
        f.seek(0)
        f.truncate()
        f.write(json.dumps(data))
        f.flush()

    def shared_with(self) -> list[JournalEntry]:
        """Other farm jobs whose leases on this host overlapped this one in time (call after ``end`` is set,
        or during the lease: up to now). An entry whose holder died counts until it is found dead (then its
        end is set, ``reap_dead``); finished entries older than a day are removed."""
        now = time.time()
        start, end = self.start, self.end if self.end is not None else now
        out = []
        for path, e in read_journal(self.directory):
            if path == self._entry:
                continue
            if (e.end if e.end is not None else e.start) < now - JOURNAL_KEEP_S and (e.end is not None
                                                                                   or not _held(path)):
                path.unlink(missing_ok=True)
                continue
            if e.overlaps(start, end):
                out.append(e)
        return out

    def placement(self) -> dict[str, Any]:
        """Where this lease measured, as ``schemas.Placement`` fields: host, CPU lists, host_shared, isolated
        (our cores were ours alone: we locked them, and every overlapping job locked its own, so no two
        isolated leases ever hold a core at the same time)."""
        others = self.shared_with()
        return {"host": socket.gethostname(), "server_cpus": cpu_list(self.server_cores),
                "loadgen_cpus": cpu_list(self.loadgen_cores), "host_shared": bool(others),
                "isolated": self.isolation and all(e.isolated for e in others)}


@contextmanager
def pinned(cores: Iterable[int]) -> Iterator[None]:
    """Run this thread, and every thread and process it starts meanwhile, on ``cores``; its own CPU set is
    restored on exit (Linux: ``sched_setaffinity`` of the calling thread)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
