"""The contract between docker/Dockerfile, the chart and the CLI (no base image can be pulled in CI): the
images' ENTRYPOINT plus each rendered container's args is a command the installed CLI accepts."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.chart import REPO, ci_values, pod_specs, render

DOCKERFILE = REPO / "docker" / "Dockerfile"
#: farm's runtime image as ``python -m workers.images`` builds it on this host (no registry, no base image)
LOCAL_RUNTIME = "farm-runtime:local"


def stages() -> dict[str, dict[str, Any]]:
    """Each ``FROM ... AS name`` stage of the Dockerfile: its base (ARG defaults resolved) and instructions."""
    args: dict[str, str] = {}
    out: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "ARG" and current is None and "=" in rest:
            k, _, v = rest.partition("=")
            args[k] = v
        elif op == "FROM":
            base, _, name = rest.partition(" AS ")
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base.strip())
            current = out[name.strip()] = {"base": base, "lines": []}
        elif current is not None:
            current["lines"].append((op, rest))
    return out


def instruction(stage: dict[str, Any], op: str) -> str | None:
    """The last ``op`` of ``stage`` (as Docker applies it)."""
    found = [rest for o, rest in stage["lines"] if o == op]
    return found[-1] if found else None


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_runtime_targets_run_farm_as_nobody_from_pinned_bases(target: str) -> None:
    all_stages = stages()
    stage = all_stages[target]
    assert json.loads(instruction(stage, "ENTRYPOINT") or "null") == ["farm"]
    assert instruction(stage, "USER") == "65534:65534"
    assert any(o == "COPY" and rest.startswith("--from=build-") for o, rest in stage["lines"])  # multi-stage
    for s in all_stages.values():  # a fixed release tag, never latest (or farm's runtime image, built here)
        if s["base"] == LOCAL_RUNTIME:
            continue
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+(\.\d+)?[\w.-]*", s["base"]), s["base"]
    builds = " ".join(rest for _, rest in all_stages[f"build-{target}"]["lines"])
    if target == "gpu":
        assert all_stages["gpu"]["base"].startswith("nvidia/cuda:") and "cudnn-runtime" in all_stages["gpu"]["base"]
        assert "onnxruntime-gpu==" in builds and "pip uninstall -y onnxruntime" in builds
        assert "CUDAExecutionProvider" in builds
    else:
        assert "download.pytorch.org/whl/cpu" in builds  # the torch extra takes the CPU wheel
    assert "-c constraints.txt" in builds or "-c gpu-constraints.txt" in builds
    # perf_analyzer, the default load client: installed into the venv, its library in the runtime, checked there
    assert "workers.loadgen.perf_analyzer --install" in builds
    runtime = " ".join(rest for o, rest in stage["lines"] if o in ("ENV", "RUN"))
    assert "FARM_PERF_ANALYZER=/opt/venv/bin/perf_analyzer" in runtime and "libb64-0d" in runtime
    assert re.search(r"-m workers\.loadgen\.perf_analyzer\s*$", instruction(stage, "RUN") or ""), stage["lines"]


def test_the_model_store_image_pulls_nothing() -> None:
    """The seaweedfs target (compose's model store) is farm's locally built runtime image plus the host's ``weed``
    that docker/seaweedfs/prepare.sh stages in the build context: no registry, no pip at build time."""
    stage = stages()["seaweedfs"]
    assert stage["base"] == LOCAL_RUNTIME
    assert not [rest for op, rest in stage["lines"] if op == "RUN"]
    assert ("COPY", "docker/seaweedfs/weed /usr/local/bin/weed") in stage["lines"]
    assert json.loads(instruction(stage, "ENTRYPOINT") or "null") == ["/usr/local/bin/weed"]
    assert instruction(stage, "USER") == "65534:65534" and instruction(stage, "WORKDIR") == "/data"
    prepare = (REPO / "docker" / "seaweedfs" / "prepare.sh").read_text()
    assert "docker/seaweedfs/weed" in prepare and "docker/build-local-image.sh" in prepare
    assert "/docker/seaweedfs/weed" in (REPO / ".gitignore").read_text().splitlines()


def test_the_default_target_is_the_cpu_image() -> None:
    assert list(stages())[-1] == "cpu"


def test_entrypoint_is_the_packages_console_script() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["farm"] == "farm.cli.main:main"


def test_constraints_pin_every_runtime_dependency_within_its_bounds() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (REPO / "docker" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    for dep in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in docker/constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {req.specifier}"


def _farm_argvs() -> list[list[str]]:
    """ENTRYPOINT + args of every farm container the chart renders (defaults, CI values, bundled)."""
    entry = json.loads(instruction(stages()["cpu"], "ENTRYPOINT") or "[]")
    argvs: list[list[str]] = []
    for values in ({}, ci_values(), {"bundled": {"enabled": True}}):
        for spec in pod_specs(render(values)).values():
            for c in spec["containers"] + spec.get("initContainers", []):
                if c["image"].startswith("farm:"):
                    assert "command" not in c, "the image's ENTRYPOINT must stay in charge"
                    argv = entry + list(c["args"])
                    if argv not in argvs:
                        argvs.append(argv)
    return argvs


def test_every_rendered_farm_container_is_a_command_the_cli_accepts(tmp_path: Path) -> None:
    argvs = _farm_argvs()
    assert {tuple(a[:2]) for a in argvs} >= {("farm", "worker"), ("farm", "scheduler"), ("farm", "db")}
    for argv in argvs:
        assert argv[0] == "farm"
        proc = subprocess.run([sys.executable, "-m", "farm", *argv[1:], "--help"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, (argv, proc.stderr[-1500:])
        assert "Usage:" in proc.stdout


def test_migration_and_wait_commands_work_on_a_real_database(tmp_path: Path) -> None:
    """``db check`` (the pods' init container) fails on an empty database, ``db upgrade`` (the migration
    job) migrates it, then ``db check`` passes."""
    import os

    migrate = next(a for a in _farm_argvs() if a[1:3] == ["db", "upgrade"])
    check = next(a for a in _farm_argvs() if a[1:3] == ["db", "check"])
    env = {**os.environ, "FARM_DATABASE_URL": f"sqlite:///{tmp_path / 'farm.db'}"}

    def run(argv: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "farm", *argv[1:], *extra], capture_output=True, text=True,
                              env=env, timeout=120)

    before = run(check[:3], "--wait", "0")
    assert before.returncode == 1 and "run `farm db upgrade`" in before.stderr and "Traceback" not in before.stderr
    assert run(migrate).returncode == 0
    after = run(check)
    assert after.returncode == 0, after.stderr
