"""An LLM through the cluster path with SeaweedFS as the model store (issue 38, point 6, at a size CI runs in
seconds): ``farm submit model.gguf --engine llama.cpp`` streams a 29 MB GGUF (``write_large_gguf``, written one
tensor at a time, as the 2.16 GB one of benchmarks/big_gguf.py) into a real SeaweedFS, a real ``farm worker``
(Celery on Redis, Postgres) fetches it into its empty cache, verified, and llama.cpp's llama-server serves it."""
from __future__ import annotations

import hashlib
import json
import signal
import uuid
from pathlib import Path

import pytest

from farm.db.models import ModelArtifact
from farm.db.session import session_scope
from farm.models.llm_examples import LlamaShape, write_large_gguf
from farm.settings import reset_settings
from farm.store.backends import open_store
from tests.helpers import farm, farm_env, results_json, start_worker, wait_done
from tests.seaweedfs import SeaweedFS

pytestmark = [pytest.mark.slow, pytest.mark.llm]

#: 2 layers of hidden 512, F32: 29 MB, served at tens of tokens/s on one core
SHAPE = LlamaShape(hidden=512, layers=2, heads=8, kv_heads=4, ffn=1536)
LOAD = ["--concurrency", "1", "--input-tokens", "16", "--output-tokens", "8", "--requests", "3",
        "--warmup-requests", "1"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_a_gguf_goes_through_seaweedfs_to_a_worker_that_serves_it(
        cluster_env: dict[str, str], seaweedfs: SeaweedFS, llama_server: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_large_gguf(tmp_path / "model" / "mid.gguf", SHAPE)
    size, sha = model.stat().st_size, _sha256(model)
    assert size > 25_000_000
    store_env = seaweedfs.env(f"farm-test/gguf-{uuid.uuid4().hex[:12]}")
    submitter, worker_home = tmp_path / "submitter", tmp_path / "worker"
    env = farm_env(**cluster_env, **store_env, FARM_HOME=str(submitter))
    worker = start_worker({**env, "FARM_HOME": str(worker_home)}, "--runner", "process", log=tmp_path / "worker.log")
    try:
        out = farm("submit", str(model), "--engine", "llama.cpp", *LOAD, "--json", env=env, timeout=300)
        request_id = json.loads(out.stdout)["request_id"]
        counts = wait_done(request_id, env, timeout=300)
        rows = results_json(request_id, env)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert counts == {"succeeded": 1}, (tmp_path / "worker.log").read_text()[-3000:]
    row = rows[0]
    assert row["server"].startswith("llama-server") and row["error_count"] == 0
    assert row["output_tokens_per_s"] > 0 and row["ttft_p50_ms"] > 0
    for key, value in store_env.items():
        monkeypatch.setenv(key, value)
    reset_settings()
    store = open_store()
    with session_scope() as s:  # the database holds where the bytes are, never the bytes
        artifact = s.get(ModelArtifact, sha)
        assert artifact is not None
        assert (artifact.location, artifact.layout, artifact.size_bytes) == (store.url, "file", size)
    assert store.size(sha) == size  # the whole blob in SeaweedFS
    assert not (submitter / "store").exists()  # a cluster's submit keeps no local copy
    cached = worker_home / "artifacts" / sha / model.name
    assert cached.stat().st_size == size and _sha256(cached) == sha  # the worker's verified copy
