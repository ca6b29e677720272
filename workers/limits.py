"""The limits a run gets: ``Limits`` (what to apply, from the job's edge profile; as Docker settings, as
a cgroup, as result metrics; checked back on a container) and ``LimitedCgroup`` (applies them without Docker).

``LimitedCgroup`` is a throw-away child cgroup with CPU/memory limits for one server or edge run, used as
a context manager: entering creates the cgroup and applies the limits, ``add_pid`` (or
``command`` for a process not started yet) puts a process in, exiting removes the cgroup (processes
still inside are moved to the parent first; nothing is killed). When the limits cannot be applied
(not root, controller not available, no delegation) nothing raises: ``enforced`` is False and
``reason`` says why and what to do, so the result can state ``limits_enforced = False``.

v2: the cgroup is ``<mount>/farm/<name>`` (``cpu.max``, ``memory.max``, ``memory.swap.max = 0``,
``cpuset.cpus``). v1: one directory per hierarchy, nested under this process's own cgroup there
(``cpu.cfs_quota_us``, ``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes`` = the same limit,
``cpuset.cpus``/``cpuset.mems``).
"""
from __future__ import annotations

import logging
import os
import shlex
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from farm.errors import SamplerError
from schemas import JobSpec
from workers.samplers.cgroupfs import (
    CgroupMount,
    CgroupSet,
    cgroup_mounts,
    cgroup_set_of_pid,
    memory_on_v1,
    pid_cgroups,
    read_limits,
    v1_mount,
    v2_mount,
)

log = logging.getLogger(__name__)

CFS_PERIOD_US = 100_000


def _swap_in_use() -> bool:
    """True when the host has any swap device configured."""
    try:
        return len(Path("/proc/swaps").read_text().splitlines()) > 1
    except OSError:
        return False


def _quota_us(cpus: float) -> int:
    """CFS quota per 100 ms period for ``cpus`` cores (the kernel's minimum is 1 ms)."""
    return max(1000, round(cpus * CFS_PERIOD_US))


class DockerLimits(TypedDict):
    """Limits as docker-py's ``containers.create`` takes them: CPU in nano-CPUs, memory (and memory + swap) in
    bytes, and the cores (``cpuset_cpus``) where pinned."""

    nano_cpus: int
    mem_limit: int
    memswap_limit: int
    cpuset_cpus: NotRequired[str]


class LimitMetrics(TypedDict, total=False):
    """The limits as a result's metrics: memory limit (bytes), CPU limit (cores), whether they were enforced."""

    mem_limit_bytes: int
    cpu_limit: float
    limits_enforced: bool


@dataclass(frozen=True)
class Limits:
    """Hard limits of one run, the edge box's: ``cpus`` cores (CFS quota), ``memory_bytes`` B (no extra
    swap) and optionally the CPU list ``cpuset`` (``"0"``, ``"0-1"``)."""

    cpus: float
    memory_bytes: int
    cpuset: str | None = None

    @classmethod
    def of(cls, spec: JobSpec) -> Limits | None:
        """The limits of job ``spec``: its edge profile's; None for a serving job (not limited)."""
        prof = spec.edge_profile
        return None if prof is None else cls(cpus=prof.cpus, memory_bytes=prof.memory, cpuset=prof.cpuset)

    def docker_kwargs(self) -> DockerLimits:
        """The limits as docker-py ``containers.create`` arguments (memory+swap = memory: no swap)."""
        out = DockerLimits(nano_cpus=int(self.cpus * 1e9), mem_limit=self.memory_bytes,
                           memswap_limit=self.memory_bytes)
        if self.cpuset:
            out["cpuset_cpus"] = self.cpuset
        return out

    def cgroup(self, name: str | None = None) -> LimitedCgroup:
        """A ``LimitedCgroup`` applying these limits (enter it to create the cgroup)."""
        return LimitedCgroup(cpus=self.cpus, memory_bytes=self.memory_bytes, cpuset_cpus=self.cpuset, name=name)

    def metrics(self, enforced: bool) -> LimitMetrics:
        """``mem_limit_bytes``, ``cpu_limit`` (cores) and ``limits_enforced`` for the result."""
        return LimitMetrics(mem_limit_bytes=self.memory_bytes, cpu_limit=self.cpus, limits_enforced=enforced)

    def enforced_around(self, pid: int | None = None) -> str | None:
        """A note when the cgroup process ``pid`` (default: this one) runs in already has exactly these CPU and
        memory limits (a Kubernetes edge pool's pod, a container started with them), else None. A run started
        from it is then held to them, sharing them with the worker: if it fits, the box fits."""
        if self.cpuset:
            return None  # a CPU list cannot be checked this way
        try:
            lim = read_limits(cgroup_set_of_pid(pid or os.getpid()))
        except (SamplerError, OSError):
            return None
        cpus, mem = lim.get("cpus"), lim.get("memory_bytes")
        if cpus is None or mem is None or abs(cpus - self.cpus) > 0.01 or mem != self.memory_bytes:
            return None
        return (f"limits enforced by the worker's own cgroup ({cpus:g} cores, {mem} B: its pod's or container's "
                "limits equal the profile); the worker process shares them, so the run had slightly less")

    def check_container(self, container: Any, cg: Path | None) -> tuple[bool, list[str]]:
        """True when Docker applied the CPU and memory limits to ``container``: HostConfig says so and, where
        its cgroup ``cg`` is readable, the kernel too; plus notes saying what could not be confirmed."""
        notes: list[str] = []
        hc = container.attrs.get("HostConfig", {})
        ok = hc.get("NanoCpus") == int(self.cpus * 1e9) and hc.get("Memory") == self.memory_bytes
        if not ok:
            notes.append(f"Docker did not record the limits (NanoCpus={hc.get('NanoCpus')}, "
                         f"Memory={hc.get('Memory')})")
        mem_k = cpu_k = None
        if cg is not None:
            try:
                lim = read_limits(CgroupSet.from_path(cg))
                mem_k, cpu_k = lim.get("memory_bytes"), lim.get("cpus")
            except (OSError, ValueError) as exc:  # the cgroup vanished or is unreadable: noted below
                notes.append(f"cgroup {cg} unreadable ({exc})")
        if mem_k is None or cpu_k is None:
            notes.append("limits could not be read back from the container's cgroup; trusting Docker's HostConfig")
        else:
            if mem_k != self.memory_bytes:
                ok = False
                notes.append(f"cgroup memory limit is {mem_k} B, not {self.memory_bytes} B")
            if abs(cpu_k - self.cpus) > 0.01:
                ok = False
                notes.append(f"cgroup CPU quota is {cpu_k:g} cores, not {self.cpus:g}")
        return ok, notes


def _procs(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


class LimitedCgroup(AbstractContextManager["LimitedCgroup"]):
    """A child cgroup limited to ``cpus`` cores, ``memory_bytes`` bytes (no extra swap) and optionally
    the CPU list ``cpuset_cpus`` (e.g. ``"0"`` or ``"0-1"``). ``None`` leaves that resource unlimited;
    with no limit at all the cgroup still isolates the run for ``CgroupSampler``."""

    def __init__(
        self,
        cpus: float | None = None,
        memory_bytes: int | None = None,
        cpuset_cpus: str | None = None,
        name: str | None = None,
    ) -> None:
        if cpus is not None and cpus <= 0:
            raise SamplerError(f"cpus must be > 0, got {cpus}")
        if memory_bytes is not None and memory_bytes <= 0:
            raise SamplerError(f"memory_bytes must be > 0, got {memory_bytes}")
        self.cpus = cpus
        self.memory_bytes = memory_bytes
        self.cpuset_cpus = cpuset_cpus
        self.name = name or f"farm-{uuid.uuid4().hex[:12]}"
        self.cgroups: CgroupSet | None = None
        self.enforced = False
        self.reason = "not entered"
        self.notes: list[str] = []
        self.cleanup_error: str | None = None
        self._created: list[Path] = []  # creation order; removed in reverse

    # -- public -------------------------------------------------------------------------------------
    @property
    def created(self) -> bool:
        """True when the cgroup exists (processes can be put in it and sampled)."""
        return self.cgroups is not None

    @property
    def path(self) -> Path | None:
        """The directory naming the cgroup (v2 directory, v1 memory directory); None if not created."""
        return self.cgroups.path if self.cgroups else None

    def add_pid(self, pid: int) -> bool:
        """Move process ``pid`` (and its future children) into the cgroup; False if not created. On v1,
        memory the process already touched stays charged to its old cgroup: prefer ``command``."""
        if self.cgroups is None:
            return False
        for d in self.cgroups.dirs():
            try:
                (d / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                raise SamplerError(f"cannot move pid {pid} into {d} ({exc}); is it still running?") from exc
        return True

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` wrapped so the process enters the cgroup before it execs (all its memory is charged
        to the cgroup); ``argv`` unchanged when the cgroup was not created."""
        if self.cgroups is None:
            return list(argv)
        files = " ".join(shlex.quote(str(d / "cgroup.procs")) for d in self.cgroups.dirs())
        script = f'for f in {files}; do echo $$ > "$f" || exit 97; done; exec "$@"'
        return ["/bin/sh", "-c", script, "farm-cgexec", *argv]

    def metrics(self) -> LimitMetrics:
        """``limits_enforced`` plus ``cpu_limit`` (cores) / ``mem_limit_bytes`` when requested."""
        out = LimitMetrics(limits_enforced=self.enforced)
        if self.cpus is not None:
            out["cpu_limit"] = self.cpus
        if self.memory_bytes is not None:
            out["mem_limit_bytes"] = self.memory_bytes
        return out

    # -- context manager ----------------------------------------------------------------------------
    def __enter__(self) -> LimitedCgroup:
        try:
            mounts = cgroup_mounts()
            if memory_on_v1(mounts):
                self._create_v1(mounts)
            elif v2_mount(mounts) is not None:
                self._create_v2(mounts)
            else:
                self._fail("no cgroup hierarchy is mounted at /sys/fs/cgroup; limits cannot be applied")
        except PermissionError as exc:
            self._fail(
                f"no permission to create cgroups ({exc}); run the worker as root or in a delegated cgroup"
            )
        except (OSError, SamplerError) as exc:
            self._fail(f"cannot create the cgroup ({exc}); limits are not applied")
        return self

    def __exit__(self, *exc: object) -> None:
        self._remove()

    # -- internals ----------------------------------------------------------------------------------
    def _fail(self, reason: str) -> None:
        self._remove()
        self.cgroups = None
        self.enforced = False
        self.reason = reason
        log.warning("LimitedCgroup: %s", reason)

    def _mkdir(self, d: Path) -> None:
        d.mkdir()
        self._created.append(d)

    def _set(self, f: Path, value: str, what: str, problems: list[str]) -> bool:
        """Write one limit file; a refusal becomes a problem (limits not enforced), not an exception."""
        try:
            f.write_text(value)
            return True
        except OSError as exc:
            problems.append(f"{what}: writing {value!r} to {f.name} failed ({exc.strerror})")
            return False

    def _create_v1(self, mounts: list[CgroupMount]) -> None:
        dirs = self._v1_dirs(mounts)
        if "memory" not in dirs:
            self._fail("the v1 memory controller is not mounted; limits cannot be applied")
            return
        self.cgroups = CgroupSet(version=1, v1=dirs)
        problems: list[str] = []
        if self.cpus is not None:
            self._limit_v1_cpu(dirs.get("cpu"), self.cpus, problems)
        if self.memory_bytes is not None:
            self._limit_v1_memory(dirs["memory"], self.memory_bytes, problems)
        if self.cpuset_cpus:
            self._limit_v1_cpuset(dirs.get("cpuset"), self.cpuset_cpus, problems)
        self._finish(problems)

    def _v1_dirs(self, mounts: list[CgroupMount]) -> dict[str, Path]:
        """The run's v1 cgroup directory per controller, created under this process's own cgroups (memory and
        cpuacct must be created; another controller that cannot be is noted and left out)."""
        wanted = ["memory", "cpuacct", "cpu", "blkio"] + (["cpuset"] if self.cpuset_cpus else [])
        own = pid_cgroups(os.getpid())
        dirs: dict[str, Path] = {}
        for c in wanted:
            m = v1_mount(mounts, c)
            if m is None or c not in own:
                continue
            d = m.dir_for(own[c]) / self.name
            if d not in dirs.values():
                try:
                    self._mkdir(d)
                except OSError:
                    if c in ("memory", "cpuacct"):
                        raise
                    self.notes.append(f"v1 {c} cgroup could not be created")
                    continue
            dirs[c] = d
        return dirs

    def _limit_v1_cpu(self, cpu: Path | None, cpus: float, problems: list[str]) -> None:
        if cpu is None:
            problems.append("no v1 cpu controller for the CPU limit")
        elif self._set(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US), "cpus", problems):
            self._set(cpu / "cpu.cfs_quota_us", str(_quota_us(cpus)), "cpus", problems)

    def _limit_v1_memory(self, mem: Path, memory_bytes: int, problems: list[str]) -> None:
        if self._set(mem / "memory.limit_in_bytes", str(memory_bytes), "memory", problems):
            memsw = mem / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                self._set(memsw, str(memory_bytes), "memory+swap", problems)
            elif _swap_in_use():
                self._set(mem / "memory.swappiness", "0", "swappiness", problems)
                self.notes.append("swap accounting is off: swap discouraged (swappiness 0), not forbidden")

    def _limit_v1_cpuset(self, cs: Path | None, cpuset_cpus: str, problems: list[str]) -> None:
        if cs is None:
            problems.append("no v1 cpuset controller for cpuset_cpus")
            return
        parent = cs.parent
        mems = (parent / "cpuset.mems").read_text().strip()
        self._set(cs / "cpuset.mems", mems, "cpuset", problems)
        if not self._set(cs / "cpuset.cpus", cpuset_cpus, "cpuset", problems):
            (cs / "cpuset.cpus").write_text((parent / "cpuset.cpus").read_text().strip())

    def _create_v2(self, mounts: list[CgroupMount]) -> None:
        m = v2_mount(mounts)
        assert m is not None
        need = {"memory"} | ({"cpu"} if self.cpus is not None else set())
        if self.cpuset_cpus:
            need.add("cpuset")
        missing = need - set(m.controllers)
        if missing:
            self._fail(
                f"cgroup v2 controllers {sorted(missing)} are not available at {m.mountpoint} "
                "(not delegated to this cgroup namespace); limits cannot be applied"
            )
            return
        parent = m.mountpoint / "farm"  # shared by all runs; left in place
        if not parent.is_dir():
            parent.mkdir()
        if not self._enable_v2(m, parent, need):
            return
        d = parent / self.name
        self._mkdir(d)
        self.cgroups = CgroupSet(version=2, unified=d)
        problems: list[str] = []
        if self.cpus is not None:
            self._set(d / "cpu.max", f"{_quota_us(self.cpus)} {CFS_PERIOD_US}", "cpus", problems)
        if self.memory_bytes is not None:
            self._limit_v2_memory(d, self.memory_bytes, problems)
        if self.cpuset_cpus:
            self._set(d / "cpuset.cpus", self.cpuset_cpus, "cpuset", problems)
        self._finish(problems)

    def _enable_v2(self, m: CgroupMount, parent: Path, need: set[str]) -> bool:
        """Enable the ``need``ed controllers (and io where there is one) for the children of the mount's root
        and of ``parent``; False (the run failed, said why) when a needed one is refused."""
        optional = {"io"} & set(m.controllers)
        for d in (m.mountpoint, parent):
            for c in sorted(need | optional):
                try:
                    (d / "cgroup.subtree_control").write_text(f"+{c}")
                except OSError as exc:
                    if c in optional:
                        continue
                    self._fail(
                        f"cannot enable +{c} in {d}/cgroup.subtree_control ({exc.strerror}); processes in "
                        "that cgroup block delegation: run the worker in a leaf cgroup"
                    )
                    return False
        return True

    def _limit_v2_memory(self, d: Path, memory_bytes: int, problems: list[str]) -> None:
        if self._set(d / "memory.max", str(memory_bytes), "memory", problems):
            swap = d / "memory.swap.max"
            if swap.exists():
                self._set(swap, "0", "swap", problems)
            elif _swap_in_use():
                self.notes.append("memory.swap.max is missing: swap is not limited")

    def _finish(self, problems: list[str]) -> None:
        self.enforced = not problems
        self.reason = "; ".join(problems) if problems else "limits applied"

    def _remove(self) -> None:
        for d in reversed(self._created):
            for pid in _procs(d):  # move leftovers out so the directory can go; never kill
                try:
                    (d.parent / "cgroup.procs").write_text(str(pid))
                except OSError:
                    pass
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        self.cleanup_error = f"could not remove {d} ({exc.strerror}); remove it with rmdir"
                        log.warning("LimitedCgroup: %s", self.cleanup_error)
                        break
                    time.sleep(0.02)
        self._created.clear()
