"""Test isolation: no test leaves a thread, timer, signal handler, child process or container behind.

A pytest plugin (loaded by tests/conftest.py). It takes a snapshot of this process before each test's setup and
checks it again after the test's teardown: a thread or timer still alive, a signal handler changed, a child
process still running, or (for tests marked ``docker``) a container of farm's still there, is left behind.
Leftovers get ``GRACE_S`` to end on their own (a server that was asked to stop takes a moment); what is left then
fails that test's teardown, naming what leaked, so the run fails and names the test.

A test that set up a fixture of a wider scope (module, session: a server shared by a module's tests) may leave
that fixture's resources alive on purpose: its leftovers are checked again once every such fixture it set up has
been torn down, and reported then, naming the test that started them.

What lives for the whole process by design is not a leak, and is named here with the reason (``LIFELONG_*``).
``FARM_TEST_LEAKS=report`` appends leaks to ``FARM_TEST_LEAKS_LOG`` (default /tmp/farm-test-leaks.log) instead of
failing (to survey them, also under pytest-xdist, whose workers' output is not shown); ``off`` turns the check off.
"""
from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

import docker
from workers.runners.hardening import OWNER, OWNER_LABEL, OWNER_PID_LABEL, owner_alive

#: how long a test's leftovers may take to end after its teardown (s)
GRACE_S = 5.0
POLL_S = 0.05

#: child processes that live as long as the test process by design: multiprocessing's fork server (started once,
#: on the first load-client process, so that later ones fork from a small clean process) and its resource tracker
LIFELONG_CHILDREN = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
#: threads that live as long as the test process by design (name prefixes)
LIFELONG_THREADS = (
    "pytest_timeout",  # pytest-timeout's own timer thread (thread method)
    "tqdm_monitor",  # tqdm's monitor: one per process, started by the first progress bar (transformers, gguf)
)

_SIGNALS = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})
_MODE = os.environ.get("FARM_TEST_LEAKS", "fail")
_BEFORE = pytest.StashKey["Snapshot"]()
_WIDE = pytest.StashKey[set[int]]()  # ids of the wider-scoped fixtures a test set up
_CURRENT: list[pytest.Item] = []  # the test being set up, run or torn down


@dataclass
class Snapshot:
    """What this process holds at one moment: its threads, signal handlers, children and farm's containers."""

    threads: set[threading.Thread]
    handlers: dict[int, object]
    children: set[tuple[int, float]]
    containers: set[str] | None = None  # None: not looked at (tests not marked docker)


@dataclass
class Leftovers:
    """What a test started and had not ended after its teardown."""

    nodeid: str
    threads: list[threading.Thread] = field(default_factory=list)
    children: set[tuple[int, float]] = field(default_factory=set)
    handlers: dict[int, object] = field(default_factory=dict)  # signal -> the handler before the test
    containers: set[str] = field(default_factory=set)

    def still_there(self) -> Leftovers:
        return Leftovers(self.nodeid, [t for t in self.threads if t.is_alive()], self.children & _children(),
                         {s: h for s, h in self.handlers.items() if _handler(s) != h},
                         self.containers & (_containers() or set()) if self.containers else set())

    def __bool__(self) -> bool:
        return bool(self.threads or self.children or self.handlers or self.containers)

    def describe(self) -> list[str]:
        found = [f"thread {t.name!r} ({type(t).__name__}, daemon={t.daemon})" for t in self.threads]
        found += [f"child process {_describe_child(pid)}" for pid, _ in sorted(self.children)]
        found += [f"signal handler of {signal.Signals(s).name}: {h!r} -> {_handler(s)!r}"
                  for s, h in self.handlers.items()]
        return found + [f"container {cid[:12]}" for cid in sorted(self.containers)]


def _children() -> set[tuple[int, float]]:
    out: set[tuple[int, float]] = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue  # ended; only its exit status is left to collect
            if any(name in " ".join(child.cmdline()) for name in LIFELONG_CHILDREN):
                continue
            out.add((child.pid, child.create_time()))
        except psutil.Error:
            continue
    return out


def _started_by_the_test(key: tuple[int, float], before: set[tuple[int, float]]) -> bool:
    """A new process none of whose ancestors (up to this process) was there before the test: one a process that
    outlives the test (a module's server) started for it belongs to that process, not to the test."""
    me = os.getpid()
    try:
        for parent in psutil.Process(key[0]).parents():
            if parent.pid == me:
                return True
            if (parent.pid, parent.create_time()) in before:
                return False
    except psutil.Error:
        return False
    return True


def _describe_child(pid: int) -> str:
    try:
        return f"pid {pid}: {' '.join(psutil.Process(pid).cmdline())[:160]}"
    except psutil.Error:
        return f"pid {pid}"


def _ours(labels: dict[str, str]) -> bool:
    """A container started by this process or one of its descendants, or by a process now gone (nobody is left
    to remove it); not one of a live process outside this test process's tree (another test process's)."""
    if not owner_alive(labels):
        return True
    pid = int(labels[OWNER_PID_LABEL])
    try:
        mine = psutil.Process()
        return pid == mine.pid or any(p.pid == mine.pid for p in psutil.Process(pid).parents())
    except psutil.Error:
        return True


def farm_containers(client: Any) -> set[str]:
    """Ids of farm's containers (label farm.owner=farm) that are this test process's: another test process's (a
    pytest-xdist worker beside it, another session on the host) are not."""
    found = client.containers.list(all=True, ignore_removed=True, filters={"label": f"{OWNER_LABEL}={OWNER}"})
    return {c.id for c in found if _ours(c.labels or {})}


def _containers() -> set[str] | None:
    """``farm_containers`` of a client of its own, or None where Docker does not answer."""
    try:
        client = docker.from_env(timeout=10)
        try:
            return farm_containers(client)
        finally:
            client.close()
    except Exception:
        return None


def _handler(signum: int) -> object:
    """The signal's handler; pytest-timeout's own (it sets and clears SIGALRM's around each test, and clears it
    early when a test fails) counts as the default."""
    handler = signal.getsignal(signum)
    return signal.SIG_DFL if getattr(handler, "__module__", None) == "pytest_timeout" else handler


def snapshot(item: pytest.Item) -> Snapshot:
    containers = _containers() if item.get_closest_marker("docker") is not None else None
    return Snapshot(threads=set(threading.enumerate()), handlers={s: _handler(s) for s in _SIGNALS},
                    children=_children(), containers=containers)


def _lifelong(thread: threading.Thread) -> bool:
    return thread.name.startswith(LIFELONG_THREADS)


def leftovers(nodeid: str, before: Snapshot) -> Leftovers:
    """What is left, after up to GRACE_S for it to end, of what the test started."""
    # objects only garbage holds (a gRPC aio channel in a reference cycle keeps gRPC's poller thread until it is
    # collected): collected first, as the cyclic collector would soon do anyway
    gc.collect()
    deadline = time.monotonic() + GRACE_S
    while True:
        threads = [t for t in threading.enumerate() if t not in before.threads and t.is_alive() and not _lifelong(t)]
        children = {c for c in _children() - before.children if _started_by_the_test(c, before.children)}
        if (not threads and not children) or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    left = Leftovers(nodeid, threads, children,
                     {s: h for s, h in before.handlers.items() if _handler(s) != h})
    if before.containers is not None:
        while True:
            left.containers = (_containers() or set()) - before.containers
            if not left.containers or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    return left


class _Tracker:
    """Leftovers kept while a wider-scoped fixture their test set up is alive, and those fixtures."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Leftovers, set[int]]] = []
        self.finished: set[int] = set()

    def due(self) -> list[Leftovers]:
        """The kept leftovers whose fixtures are all torn down, as they are now (after the grace time)."""
        ready = [left for left, fixtures in self.waiting if fixtures <= self.finished]
        self.waiting = [(left, fx) for left, fx in self.waiting if not fx <= self.finished]
        out = []
        for left in ready:
            deadline = time.monotonic() + GRACE_S
            while (now := left.still_there()) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if now:
                out.append(now)
        return out


_TRACKER = _Tracker()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if _MODE != "off":
        item.stash[_BEFORE] = snapshot(item)
        item.stash[_WIDE] = set()
        _CURRENT[:] = [item]
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any],
                         request: pytest.FixtureRequest) -> Generator[None, object, object]:
    if fixturedef.scope != "function":
        _TRACKER.finished.discard(id(fixturedef))  # set up again (another module's turn)
        if _CURRENT and _WIDE in _CURRENT[0].stash:
            _CURRENT[0].stash[_WIDE].add(id(fixturedef))
    return (yield)


def pytest_fixture_post_finalizer(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> None:
    if fixturedef.scope != "function":
        _TRACKER.finished.add(id(fixturedef))


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    result = yield
    before = item.stash.get(_BEFORE, None)
    if before is None:
        return result
    left = leftovers(item.nodeid, before)
    wide = item.stash[_WIDE] - _TRACKER.finished
    found: list[Leftovers] = []
    if left and wide:
        _TRACKER.waiting.append((left, wide))  # its module's or session's fixtures may still hold them
    elif left:
        found.append(left)
    found += _TRACKER.due()
    messages = [f"{left.nodeid} left behind: " + "; ".join(left.describe()) for left in found]
    if messages and _MODE == "report":
        with open(os.environ.get("FARM_TEST_LEAKS_LOG", "/tmp/farm-test-leaks.log"), "a") as log:
            log.write("".join(f"[leaks] {m}\n" for m in messages))
    elif messages:
        pytest.fail("\n".join(messages), pytrace=False)
    return result
