"""Finding and reading cgroups (v2 and v1): mounts, a process's cgroup, a container's cgroup, limits.

A cgroup is a ``CgroupSet``: on v2 one directory; on v1 one directory per controller hierarchy
(``cpuacct``, ``memory``, ``blkio``, ...), which may sit at different relative paths. A single ``Path``
(``cgroup_of_pid``, ``find_container_cgroup``, ``ServingTarget.cgroup_path``) resolves to a set with
``CgroupSet.from_path``. Public names are re-exported by ``workers.samplers.cgroup``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import SamplerError

V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "blkio", "cpuset")


# -- finding cgroups --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CgroupMount:
    """One cgroup hierarchy mount: where, which part of the hierarchy (``root``), v1/v2, controllers."""

    mountpoint: Path
    root: str
    version: int
    controllers: frozenset[str]

    def dir_for(self, cgpath: str) -> Path:
        """The directory of cgroup ``cgpath`` (as in /proc/<pid>/cgroup) under this mount."""
        rel = cgpath
        if self.root != "/" and (rel == self.root or rel.startswith(self.root + "/")):
            rel = rel[len(self.root):]
        return self.mountpoint / rel.lstrip("/")


def cgroup_mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[CgroupMount]:
    """Every cgroup v1/v2 mount of this mount namespace."""
    mounts: list[CgroupMount] = []
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3 or rf[0] not in ("cgroup", "cgroup2"):
            continue
        root, mountpoint = lf[3], lf[4].replace("\\040", " ")
        if rf[0] == "cgroup2":
            ctrl_file = Path(mountpoint) / "cgroup.controllers"
            try:
                ctrls = frozenset(ctrl_file.read_text().split())
            except OSError:
                ctrls = frozenset()
            mounts.append(CgroupMount(Path(mountpoint), root, 2, ctrls))
        else:
            opts = set(rf[2].split(","))
            mounts.append(CgroupMount(Path(mountpoint), root, 1, frozenset(opts & set(V1_CONTROLLERS))))
    return mounts


def v1_mount(mounts: list[CgroupMount], controller: str) -> CgroupMount | None:
    return next((m for m in mounts if m.version == 1 and controller in m.controllers), None)


def v2_mount(mounts: list[CgroupMount]) -> CgroupMount | None:
    return next((m for m in mounts if m.version == 2), None)


def memory_on_v1(mounts: list[CgroupMount] | None = None) -> bool:
    """True when the memory controller is on a v1 hierarchy (v1-only or hybrid hosts)."""
    return v1_mount(mounts if mounts is not None else cgroup_mounts(), "memory") is not None


def pid_cgroups(pid: int) -> dict[str, str]:
    """/proc/<pid>/cgroup as controller -> cgroup path; the v2 entry's key is ``""``."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError as exc:
        raise SamplerError(f"cannot read the cgroup of pid {pid} ({exc}); is it still alive?") from exc
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if ctrls == "":
            out[""] = path
        for c in ctrls.split(","):
            if c in V1_CONTROLLERS:
                out[c] = path
    return out


@dataclass(frozen=True)
class CgroupSet:
    """One cgroup: ``unified`` directory on v2, or a directory per v1 controller in ``v1``."""

    version: int
    unified: Path | None = None
    v1: dict[str, Path] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        """The one directory that names this cgroup: the v2 directory, or the v1 memory directory."""
        if self.version == 2 and self.unified is not None:
            return self.unified
        for c in ("memory", "cpuacct", "cpu"):
            if c in self.v1:
                return self.v1[c]
        raise SamplerError("empty cgroup set; resolve it with cgroup_set_of_pid or CgroupSet.from_path")

    def dir(self, controller: str) -> Path | None:
        """The directory holding ``controller``'s files (v2: the unified directory)."""
        return self.unified if self.version == 2 else self.v1.get(controller)

    def dirs(self) -> list[Path]:
        """Distinct directories of this cgroup (one on v2, one per v1 hierarchy)."""
        if self.version == 2:
            return [self.unified] if self.unified is not None else []
        seen: list[Path] = []
        for d in self.v1.values():
            if d not in seen:
                seen.append(d)
        return seen

    def pids(self) -> list[int]:
        """Processes in this cgroup (its own ``cgroup.procs``, not descendants')."""
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    @classmethod
    def from_path(cls, path: Path, pid: int | None = None) -> CgroupSet:
        """Resolve a cgroup directory. On v1 the other controllers' directories are found at the same
        relative path (Docker's layout) or, failing that, from the cgroup of ``pid`` or of a process in
        ``path``; a controller that cannot be found is left out."""
        real = Path(os.path.realpath(path))
        if (real / "cgroup.controllers").exists():
            return cls(version=2, unified=real)
        mounts = cgroup_mounts()
        own = max(
            (m for m in mounts if m.version == 1 and real.is_relative_to(m.mountpoint)),
            key=lambda m: len(str(m.mountpoint)),
            default=None,
        )
        if own is None:
            raise SamplerError(f"{path} is not inside a mounted cgroup hierarchy; pass a /sys/fs/cgroup path")
        rel = real.relative_to(own.mountpoint)
        dirs: dict[str, Path] = {c: real for c in own.controllers}
        probe_pid = pid
        for c in V1_CONTROLLERS:
            if c in dirs:
                continue
            m = v1_mount(mounts, c)
            if m is None:
                continue
            cand = m.mountpoint / rel
            if cand.is_dir():
                dirs[c] = cand
                continue
            if probe_pid is None:
                procs = cls(version=1, v1={"memory": real}).pids()
                probe_pid = procs[0] if procs else None
            if probe_pid is not None:
                try:
                    cg = pid_cgroups(probe_pid)
                except SamplerError:
                    continue
                if c in cg and m.dir_for(cg[c]).is_dir():
                    dirs[c] = m.dir_for(cg[c])
        return cls(version=1, v1=dirs)


def cgroup_set_of_pid(pid: int) -> CgroupSet:
    """The cgroup(s) process ``pid`` is in: v1 controller directories when memory is on v1, else v2."""
    mounts = cgroup_mounts()
    cg = pid_cgroups(pid)
    if memory_on_v1(mounts):
        dirs: dict[str, Path] = {}
        for c in V1_CONTROLLERS:
            m = v1_mount(mounts, c)
            if m is not None and c in cg:
                dirs[c] = m.dir_for(cg[c])
        return CgroupSet(version=1, v1=dirs)
    m2 = v2_mount(mounts)
    if m2 is None or "" not in cg:
        raise SamplerError(f"no cgroup hierarchy found for pid {pid}; is /sys/fs/cgroup mounted?")
    return CgroupSet(version=2, unified=m2.dir_for(cg[""]))


def cgroup_of_pid(pid: int) -> Path:
    """The directory naming the cgroup of ``pid`` (v2 directory, or the v1 memory-controller one)."""
    return cgroup_set_of_pid(pid).path


def find_container_cgroup(container_id: str, max_depth: int = 5) -> Path | None:
    """The cgroup directory of a Docker container (full or unique-prefix id), or None.

    Looks for ``docker-<id>.scope`` (systemd driver) and ``docker/<id>`` (cgroupfs driver) under the
    v1 memory hierarchy or the v2 mount, first at the usual places, then walking ``max_depth`` levels.
    The Docker runner can also use ``cgroup_of_pid(container.attrs["State"]["Pid"])``.
    """
    cid = container_id.strip().lower()
    if not cid:
        return None
    mounts = cgroup_mounts()
    m = v1_mount(mounts, "memory") or v2_mount(mounts)
    if m is None:
        return None
    base = m.mountpoint

    def matches(d: Path) -> bool:
        n = d.name
        if n.startswith("docker-") and n.endswith(".scope"):
            return n[len("docker-"):-len(".scope")].startswith(cid)
        return d.parent.name == "docker" and n.startswith(cid)

    for parent in ("system.slice", "docker", "machine.slice"):
        p = base / parent
        try:
            hits = [d for d in p.iterdir() if d.is_dir() and matches(d)]
        except OSError:
            continue
        if hits:
            return hits[0]
    for dirpath, dirnames, _ in os.walk(base):
        depth = len(Path(dirpath).relative_to(base).parts)
        for name in dirnames:
            if matches(Path(dirpath) / name):
                return Path(dirpath) / name
        if depth >= max_depth:
            dirnames[:] = []
    return None


# -- reading ------------------------------------------------------------------------------------------
def read_int(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    if raw == "max":
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def read_kv(path: Path | None) -> dict[str, int]:
    """A ``key value`` per line file (cpu.stat, memory.events, memory.oom_control)."""
    out: dict[str, int] = {}
    if path is None:
        return out
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def io_v2(path: Path) -> tuple[int, int] | None:
    """Summed (read, write) bytes over devices from a v2 ``io.stat``."""
    try:
        text = path.read_text()
    except OSError:
        return None
    r = w = 0
    for line in text.splitlines():
        for tok in line.split()[1:]:
            k, _, v = tok.partition("=")
            if k == "rbytes":
                r += int(v)
            elif k == "wbytes":
                w += int(v)
    return r, w


def io_v1(blkio: Path) -> tuple[int, int] | None:
    """Summed (read, write) bytes from v1 ``blkio.throttle.io_service_bytes[_recursive]``."""
    for name in ("blkio.throttle.io_service_bytes_recursive", "blkio.throttle.io_service_bytes",
                 "blkio.io_service_bytes_recursive"):
        try:
            text = (blkio / name).read_text()
        except OSError:
            continue
        r = w = 0
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in ("Read", "Write"):
                if parts[1] == "Read":
                    r += int(parts[2])
                else:
                    w += int(parts[2])
        return r, w
    return None


def net_bytes(pid: int) -> tuple[int, int] | None:
    """(rx, tx) bytes over the non-loopback interfaces of ``pid``'s network namespace."""
    try:
        text = Path(f"/proc/{pid}/net/dev").read_text()
    except OSError:
        return None
    rx = tx = 0
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        f = rest.split()
        if len(f) >= 9:
            rx += int(f[0])
            tx += int(f[8])
    return rx, tx


def read_limits(cg: CgroupSet) -> dict[str, Any]:
    """The CPU (cores) and memory (B) limits in force on ``cg``; None when unlimited or unreadable."""
    cpus: float | None = None
    mem: int | None = None
    if cg.version == 2 and cg.unified is not None:
        try:
            quota, _, period = (cg.unified / "cpu.max").read_text().strip().partition(" ")
            if quota != "max":
                cpus = int(quota) / int(period or "100000")
        except (OSError, ValueError):
            pass
        mem = read_int(cg.unified / "memory.max")
    else:
        cpu = cg.dir("cpu")
        if cpu is not None:
            q, p = read_int(cpu / "cpu.cfs_quota_us"), read_int(cpu / "cpu.cfs_period_us")
            if q is not None and q > 0 and p:
                cpus = q / p
        memd = cg.dir("memory")
        if memd is not None:
            mem = read_int(memd / "memory.limit_in_bytes")
            if mem is not None and mem >= 1 << 62:  # v1 "unlimited" is PAGE_COUNTER_MAX * page size
                mem = None
    return {"cpus": cpus, "memory_bytes": mem}
