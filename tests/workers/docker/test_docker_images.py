"""The locally built runtime image: contents, caching by content hash, rebuild on code change."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from tests.workers.docker.conftest import REPO

pytestmark = pytest.mark.docker


def _run(client: Any, image: str, code: str) -> str:
    from workers.runners import hardening as hd

    out = client.containers.run(image, ["python", "-c", code], remove=True, network_mode="none",
                                stdout=True, stderr=True, **hd.hardening())
    return out.decode().strip()


def test_image_exists_and_carries_its_content_hash(docker_client: Any, runtime_image: str) -> None:
    from workers.images import HASH_LABEL, image_exists, image_label

    assert image_exists(runtime_image, client=docker_client)
    assert not image_exists(f"farm-runtime:absent-{uuid.uuid4().hex[:6]}", client=docker_client)
    assert len(image_label(runtime_image, HASH_LABEL, client=docker_client) or "") == 64


def test_image_runs_farm_code_as_nobody_on_a_read_only_root(docker_client: Any, runtime_image: str) -> None:
    code = (
        "import os, sys, numpy, onnxruntime, grpc, psutil, pydantic, tritonclient.grpc\n"
        "import workers.engines.server, workers.engines.ready, workers.edge_bench, schemas.metrics, schemas\n"
        "print(os.getuid(), sys.prefix, onnxruntime.get_device(), 'torch' in sys.modules)\n"
    )
    out = _run(docker_client, runtime_image, code).splitlines()[-1]
    assert out == "65534 /usr/local CPU False"


def test_image_is_lean(docker_client: Any, runtime_image: str) -> None:
    size = docker_client.images.get(runtime_image).attrs["Size"]
    assert size < 600 * 2**20  # host Python + numpy + onnxruntime + grpc, no torch
    out = _run(docker_client, runtime_image,
               "import importlib.util as u; print([m for m in ('torch', 'sympy', 'pip', 'celery') if u.find_spec(m)])")
    assert out.splitlines()[-1] == "[]"


@pytest.mark.slow
def test_build_is_cached_and_a_code_change_rebuilds(docker_client: Any, runtime_image: str,
                                                     tmp_path: Path) -> None:
    from workers.images import build_local_image

    repo = tmp_path / "checkout"  # a frozen copy: the real checkout may change while the test runs
    for pkg in ("schemas", "farm", "workers"):
        shutil.copytree(REPO / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    tag = f"farm-runtime:pytest-{uuid.uuid4().hex[:8]}"
    ids: list[str] = []
    try:
        ids.append(build_local_image(tag, repo, client=docker_client))
        assert build_local_image(tag, repo, client=docker_client) == ids[0]
        (repo / "farm" / "marker_for_test.py").write_text("VALUE = 'rebuilt'\n")
        ids.append(build_local_image(tag, repo, client=docker_client))
        assert ids[1] != ids[0]
        out = _run(docker_client, tag, "import farm.marker_for_test as m; print(m.VALUE)")
        assert out.splitlines()[-1] == "rebuilt"
        with pytest.raises(docker.errors.ImageNotFound):  # the replaced build was removed
            docker_client.images.get(ids[0])
    finally:
        for i in reversed(ids):
            try:
                docker_client.images.remove(i, force=True)
            except Exception:
                pass
