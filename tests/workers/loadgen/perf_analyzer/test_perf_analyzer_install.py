"""perf_analyzer on first use: installed once without root into farm's cache (a one-line notice), a failure
remembered and said on the row instead of retried by every job, and never when switched off; the real install
(a PyPI wheel's binary and libcudart, Debian's libb64 unpacked without apt install) in a scratch directory."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from schemas.result import client_limited_note
from workers.loadgen import stats
from workers.loadgen.perf_analyzer import tool as pa

WORKS = "#!/bin/sh\n[ \"$1\" = --version ] && exit 0\nexit 1\n"


@pytest.fixture
def scratch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """perf_analyzer's path in a scratch directory, first-use install allowed."""
    monkeypatch.setenv(pa.BINARY_ENV, str(tmp_path / "pa" / "perf_analyzer"))
    monkeypatch.setenv(pa.INSTALL_ENV, "1")
    return tmp_path / "pa" / "perf_analyzer"


def test_first_use_installs_once_with_a_notice(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_install(system_libs: bool = True) -> None:
        calls.append(1)
        scratch.write_text(WORKS)
        scratch.chmod(0o755)

    monkeypatch.setattr(pa, "install", fake_install)
    notices: list[str] = []
    assert pa.ensure(notices.append) is None
    assert pa.ensure(notices.append) is None  # there now: nothing to do
    assert calls == [1] and len(notices) == 1 and "installing NVIDIA perf_analyzer" in notices[0]
    assert pa.INSTALL_ENV in notices[0]


def test_a_failed_install_is_said_and_not_retried(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def broken(system_libs: bool = True) -> None:
        calls.append(1)
        raise RuntimeError("apt-get download exited 100: E: Unable to locate package libb64-0d")

    monkeypatch.setattr(pa, "install", broken)
    why = pa.ensure(lambda line: None)
    assert why is not None and "installing it on first use failed" in why and "libb64-0d" in why
    again = pa.ensure(lambda line: None)
    assert calls == [1] and again is not None and "libb64-0d" in again  # remembered, not retried


def test_switched_off_it_never_installs(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pa.INSTALL_ENV, "0")
    monkeypatch.setattr(pa, "install", lambda system_libs=True: pytest.fail("installed although switched off"))
    why = pa.ensure(lambda line: None)
    assert why is not None and "--install" in why


def test_no_hint_advises_the_client_that_just_ran() -> None:
    assert "--client perf_analyzer" in client_limited_note("farm")
    assert "--client" not in client_limited_note("perf_analyzer")
    share = stats.client_share_note(40.0, 1, "perf_analyzer")
    assert share is not None and "--client" not in share
    farm_share = stats.client_share_note(40.0, 1, "farm's generator")
    assert farm_share is not None and "--client perf_analyzer" in farm_share


@pytest.mark.slow
def test_real_install_needs_no_root_and_no_system_library(scratch: Path) -> None:
    """The real thing into a scratch directory, its libraries beside it even where the system has libb64
    (``system_libs=False``): the binary starts with only farm's ``LD_LIBRARY_PATH``."""
    try:
        pa.install(system_libs=False)
    except RuntimeError as exc:
        pytest.skip(f"a package registry is not reachable here: {exc}")
    assert (pa.lib_dir() / "libb64.so.0d").is_file() and (pa.lib_dir() / "libcudart.so.12").is_file()
    assert pa.missing() is None
    out = subprocess.run(["ldd", str(scratch)], env=pa.env(), capture_output=True, text=True).stdout
    assert f"libb64.so.0d => {pa.lib_dir()}" in out and "not found" not in out
