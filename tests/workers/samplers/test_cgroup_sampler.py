"""CgroupSampler against real cgroups (made here with LimitedCgroup; skipped only when this machine
cannot create them), plus the v2 file formats read from a directory laid out like cgroupfs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from workers.limits import LimitedCgroup
from workers.samplers.cgroup import (
    CgroupSampler,
    CgroupSet,
    cgroup_of_pid,
    cgroup_set_of_pid,
    find_container_cgroup,
    read_limits,
)

MIB = 1 << 20
PY = sys.executable


def _kernel_peak(cg: CgroupSet) -> int:
    if cg.version == 2:
        return int((cg.path / "memory.peak").read_text())
    return int((cg.path / "memory.max_usage_in_bytes").read_text())


def test_memory_peak_is_the_kernels_peak(limited: type[LimitedCgroup]) -> None:
    code = "import time\nb = bytearray(b'x') * (200 * 1024 * 1024)\ntime.sleep(0.6)\ndel b\ntime.sleep(0.6)"
    with limited(memory_bytes=1024 * MIB) as lc:
        assert lc.cgroups is not None
        p = subprocess.Popen(lc.command([PY, "-c", code]))
        with CgroupSampler(lc.cgroups) as s:
            assert p.wait(timeout=60) == 0
        kernel = _kernel_peak(lc.cgroups)
        summary, details = s.summary(), s.details()
    assert kernel >= 200 * MIB
    assert summary["mem_peak_bytes"] == kernel
    assert summary["mem_avg_bytes"] < summary["mem_peak_bytes"]
    assert details["mem_peak_sampled_bytes"] <= kernel
    assert summary["oom_killed"] is False
    assert details["limits"]["memory_bytes"] == pytest.approx(1024 * MIB, abs=4096)
    assert details["samples"] >= 10 and details["error"] is None
    assert not lc.cgroups.path.exists()  # removed on exit


def test_cpu_limit_holds_a_busy_loop_near_half_a_core(limited: type[LimitedCgroup]) -> None:
    # Burns 1 CPU-second; at 0.5 cpu that takes >= 2 s of wall time.
    code = "import time\nwhile time.process_time() < 1.0: pass\nprint(time.process_time())"
    with limited(cpus=0.5) as lc:
        assert lc.cgroups is not None and lc.enforced
        assert lc.metrics() == {"limits_enforced": True, "cpu_limit": 0.5}
        t0 = time.monotonic()
        p = subprocess.Popen(lc.command([PY, "-c", code]), stdout=subprocess.PIPE, text=True)
        with CgroupSampler(lc.cgroups) as s:
            out, _ = p.communicate(timeout=60)
        wall = time.monotonic() - t0
        summary, details = s.summary(), s.details()
    avg, peak = summary["cpu_pct_avg"], summary["cpu_pct_peak"]
    print(f"cpu.max 0.5: avg {avg:.1f} %, peak {peak:.1f} %, {wall:.2f} s wall")
    assert details["limits"]["cpus"] == pytest.approx(0.5)
    assert wall >= 1.8  # 1 CPU-second at half a core
    # The quota caps it from above; a busy shared machine may push it well below 50 %.
    assert 5.0 < summary["cpu_pct_avg"] <= 58.0
    assert summary["cpu_pct_peak"] <= 65.0
    series = s.series()
    cg_cpu_s = series[-1]["cpu_s"] - series[0]["cpu_s"]
    assert cg_cpu_s == pytest.approx(float(out), abs=0.25)  # what the cgroup charged = what it burned


def test_oom_kill_is_detected(limited: type[LimitedCgroup]) -> None:
    code = "b = bytearray(b'x') * (512 * 1024 * 1024)"
    with limited(memory_bytes=64 * MIB) as lc:
        assert lc.cgroups is not None
        p = subprocess.Popen(lc.command([PY, "-c", code]), stderr=subprocess.DEVNULL)
        with CgroupSampler(lc.cgroups) as s:
            rc = p.wait(timeout=60)
        summary, details = s.summary(), s.details()
    assert rc == -signal.SIGKILL
    assert summary["oom_killed"] is True
    assert details["oom_kills"] >= 1
    assert summary["mem_peak_bytes"] <= 64 * MIB


def test_paths_resolve_from_a_pid_and_a_single_path(limited: type[LimitedCgroup]) -> None:
    with limited() as lc:
        assert lc.cgroups is not None and lc.path is not None
        p = subprocess.Popen(lc.command([PY, "-c", "import time; time.sleep(3)"]))
        try:
            deadline = time.monotonic() + 10
            while cgroup_of_pid(p.pid) != lc.path and time.monotonic() < deadline:
                time.sleep(0.02)  # the wrapper shell moves itself in, then execs
            assert cgroup_of_pid(p.pid) == lc.path
            of_pid = cgroup_set_of_pid(p.pid)
            for controller in ("memory", "cpuacct", "cpu", "blkio"):
                if lc.cgroups.dir(controller) is not None:
                    assert of_pid.dir(controller) == lc.cgroups.dir(controller)
            resolved = CgroupSet.from_path(lc.path)  # v1: other hierarchies found through a member pid
            assert resolved.version == lc.cgroups.version
            assert resolved.dir("cpuacct") == lc.cgroups.dir("cpuacct")
            assert resolved.dir("memory") == lc.cgroups.dir("memory")
        finally:
            p.kill()
            p.wait()


def test_sampler_stops_cleanly_when_the_cgroup_disappears(limited: type[LimitedCgroup]) -> None:
    lc = limited().__enter__()
    assert lc.path is not None
    p = subprocess.Popen(lc.command([PY, "-c", "import time; time.sleep(0.5)"]))
    with CgroupSampler(lc.path) as s:
        p.wait(timeout=60)
        lc.__exit__(None, None, None)  # like a container removed while sampling
        time.sleep(0.2)
    assert s.details()["exited"] is True, (s.details(), lc.cleanup_error, lc.path.exists())
    assert s.error is None
    assert s.summary()["mem_peak_bytes"] > 0


def test_find_container_cgroup_both_drivers() -> None:
    own = cgroup_set_of_pid(os.getpid()).path
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    made: list[Path] = []
    try:
        for d in (own / "docker", own / "docker" / cid, own / f"docker-{cid[::-1]}.scope"):
            d.mkdir()
            made.append(d)
    except OSError as exc:
        for d in reversed(made):
            d.rmdir()
        pytest.skip(f"cannot create cgroups under {own}: {exc}")
    try:
        assert find_container_cgroup(cid) == own / "docker" / cid  # cgroupfs driver, full id
        assert find_container_cgroup(cid[:12]) == own / "docker" / cid  # short id
        assert find_container_cgroup(cid[::-1][:12]) == own / f"docker-{cid[::-1]}.scope"  # systemd driver
        assert find_container_cgroup("0" * 64) is None
    finally:
        for d in reversed(made):
            d.rmdir()


def test_v2_files_are_read(tmp_path: Path) -> None:
    """A directory laid out like a cgroup v2 one (written here): counters change while sampling."""
    d = tmp_path / "cg"
    d.mkdir()

    def put(usage_usec: int, current: int, peak: int, oom_kill: int, rbytes: int, wbytes: int) -> None:
        (d / "cgroup.controllers").write_text("cpu io memory\n")
        (d / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec {usage_usec}\nsystem_usec 0\n")
        (d / "memory.current").write_text(f"{current}\n")
        (d / "memory.peak").write_text(f"{peak}\n")
        (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kill}\n")
        (d / "io.stat").write_text(f"8:0 rbytes={rbytes} wbytes={wbytes} rios=1 wios=1 dbytes=0 dios=0\n"
                                   f"259:0 rbytes=1 wbytes=1 rios=1 wios=1 dbytes=0 dios=0\n")
        (d / "memory.max").write_text(f"{512 * MIB}\n")
        (d / "cpu.max").write_text("150000 100000\n")

    put(1_000_000, 100 * MIB, 300 * MIB, 0, 10, 20)
    with CgroupSampler(CgroupSet(version=2, unified=d), net=False, interval_s=0.02) as s:
        time.sleep(0.2)
        put(1_500_000, 120 * MIB, 350 * MIB, 1, 4096 + 10, 8192 + 20)
        time.sleep(0.2)
    summary, details = s.summary(), s.details()
    assert summary["mem_peak_bytes"] == 350 * MIB  # the kernel's peak, above anything sampled
    assert details["mem_peak_sampled_bytes"] == 120 * MIB
    assert summary["oom_killed"] is True
    assert details["block_read_bytes"] == 4096 and details["block_write_bytes"] == 8192
    assert details["limits"] == {"cpus": 1.5, "memory_bytes": 512 * MIB}
    assert summary["cpu_pct_avg"] > 0
    assert read_limits(CgroupSet.from_path(d)) == {"cpus": 1.5, "memory_bytes": 512 * MIB}


@pytest.fixture
def v2_cgroup() -> Iterator[Path]:
    """A fresh cgroup in this machine's real cgroup v2 hierarchy (the unified mount of a hybrid host, or
    /sys/fs/cgroup on a v2 host); removed afterwards. Skipped only where there is no v2 mount or it is
    not writable."""
    from workers.samplers.cgroupfs import cgroup_mounts, v2_mount

    m = v2_mount(cgroup_mounts())
    if m is None:
        pytest.skip("no cgroup v2 hierarchy is mounted here")
    d = m.mountpoint / f"farm-test-{uuid.uuid4().hex[:8]}"
    try:
        d.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {m.mountpoint}: {exc}")
    try:
        yield d
    finally:
        for pid in CgroupSet(version=2, unified=d).pids():  # anything left: back to the root, then gone
            try:
                (m.mountpoint / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        deadline = time.monotonic() + 10
        while d.exists():
            try:
                d.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_real_v2_cgroup_cpu_and_unknown_memory(v2_cgroup: Path) -> None:
    """A busy loop moved into a real v2 cgroup: CPU comes from the kernel's ``cpu.stat``; memory and OOM
    are reported when the memory controller is enabled there, and absent (never 0) when it is not, as on a
    hybrid host whose memory controller is on v1."""
    busy = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.5:\n    pass"
    p = subprocess.Popen([PY, "-c", busy])
    try:
        (v2_cgroup / "cgroup.procs").write_text(str(p.pid))
        cg = CgroupSet.from_path(v2_cgroup)
        assert cg.version == 2 and cg.pids() == [p.pid]
        child = psutil.Process(p.pid)
        t0, c0 = time.monotonic(), sum(child.cpu_times()[:2])
        with CgroupSampler(cg, net=False, interval_s=0.05) as s:
            time.sleep(0.8)
        own_pct = (sum(child.cpu_times()[:2]) - c0) / (time.monotonic() - t0) * 100
        summary, details = s.summary(), s.details()
    finally:
        p.kill()
        p.wait()
    assert details["cgroup_version"] == 2 and details["error"] is None and details["samples"] >= 10
    # one busy loop, measured by the kernel: what the process itself was given (a busy host gives it less than a
    # core, so the figure is checked against the process's own CPU time, not against one whole core)
    assert own_pct > 1 and abs(summary["cpu_pct_avg"] - own_pct) <= max(5.0, 0.25 * own_pct), (summary, own_pct)
    if (v2_cgroup / "memory.current").exists():
        assert summary["mem_peak_bytes"] > 0 and summary["oom_killed"] is False
    else:
        assert "mem_peak_bytes" not in summary and "mem_avg_bytes" not in summary
        assert "oom_killed" not in summary
        assert details["mem_peak_sampled_bytes"] is None and details["oom_kills"] is None


def test_reset_peak_measures_from_sampling_start(limited: type[LimitedCgroup]) -> None:
    # 200 MiB touched and freed before sampling starts must not count when the peak is reset.
    code = ("import sys, time\nb = bytearray(b'x') * (200 * 1024 * 1024)\ndel b\n"
            "print('ready', flush=True)\ntime.sleep(0.8)")
    with limited(memory_bytes=1024 * MIB) as lc:
        assert lc.cgroups is not None
        p = subprocess.Popen(lc.command([PY, "-c", code]), stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        lifetime_peak = _kernel_peak(lc.cgroups)
        with CgroupSampler(lc.cgroups, reset_peak=True) as s:
            p.wait(timeout=60)
    assert lifetime_peak >= 200 * MIB
    if s.details()["peak_scope"] != "since_sampling":
        pytest.skip("this kernel cannot reset the cgroup memory peak")
    assert s.summary()["mem_peak_bytes"] < 100 * MIB


def test_summaries_use_registry_metric_names(limited: type[LimitedCgroup]) -> None:
    from schemas.metrics import BY_NAME

    with limited(cpus=1.0, memory_bytes=512 * MIB) as lc:
        assert lc.cgroups is not None
        p = subprocess.Popen(lc.command([PY, "-c", "import time; time.sleep(0.4)"]))
        with CgroupSampler(lc.cgroups) as s:
            p.wait(timeout=60)
        keys = set(s.summary()) | set(lc.metrics())
    assert keys == {"cpu_pct_avg", "cpu_pct_peak", "mem_avg_bytes", "mem_peak_bytes", "oom_killed",
                    "limits_enforced", "cpu_limit", "mem_limit_bytes"}
    assert keys <= set(BY_NAME)


def test_mountinfo_layouts_other_hosts_use(tmp_path: Path) -> None:
    """Co-mounted v1 controllers (Docker's usual v1 host) and a v2 mount seen from a container."""
    from workers.samplers.cgroupfs import cgroup_mounts, v1_mount, v2_mount

    v2 = tmp_path / "unified"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    info = tmp_path / "mountinfo"
    info.write_text(
        "30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
        "31 25 0:27 /docker/abc /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
        "32 25 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
        f"33 25 0:29 /system.slice/docker-abc.scope {v2} rw - cgroup2 cgroup2 rw,nsdelegate\n"
        "34 25 0:30 / /proc rw - proc proc rw\n"
    )
    mounts = cgroup_mounts(info)
    assert len(mounts) == 4
    cpu, acct = v1_mount(mounts, "cpu"), v1_mount(mounts, "cpuacct")
    assert cpu is not None and cpu is acct and cpu.mountpoint == Path("/sys/fs/cgroup/cpu,cpuacct")
    mem = v1_mount(mounts, "memory")
    assert mem is not None and mem.dir_for("/docker/abc/child") == Path("/sys/fs/cgroup/memory/child")
    assert v1_mount(mounts, "blkio") is None
    m2 = v2_mount(mounts)
    assert m2 is not None and m2.controllers == frozenset({"cpuset", "cpu", "io", "memory", "pids"})
    assert m2.dir_for("/system.slice/docker-abc.scope") == v2
