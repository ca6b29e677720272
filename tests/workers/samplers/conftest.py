"""Fixtures for the hardware and sampler tests: a fake ``libnvidia-ml.so.1`` built from C, run through
the real pynvml binding in a subprocess, and a helper to run Python code there."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
FAKE_C = Path(__file__).with_name("fake_nvml") / "fake_nvml.c"

RunPy = Callable[..., Any]


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fake ``libnvidia-ml.so.1`` (put it on LD_LIBRARY_PATH of a subprocess)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc) to build the fake NVML library; apt-get install gcc")
    out = tmp_path_factory.mktemp("fake-nvml")
    proc = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Wl,-soname,libnvidia-ml.so.1",
         "-o", str(out / "libnvidia-ml.so.1"), str(FAKE_C)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the fake NVML library failed:\n{proc.stderr}")
    return out


def write_state(path: Path, text: str) -> None:
    """Replace the fake NVML state file atomically (the library re-reads it on every call)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_py(code: str, lib_dir: Path | None, state: Path | None = None, timeout: float = 300) -> Any:
    """Run ``code`` in a fresh Python whose dynamic loader looks in ``lib_dir`` first; the code prints
    one JSON document on its last stdout line, returned parsed. ``timeout`` (s) only guards against a hang: a
    loaded host (each Measurement runs the host yardstick) can take minutes."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_STATE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = str(lib_dir)
    if state is not None:
        env["FAKE_NVML_STATE"] = str(state)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
