"""Submitting a model puts its bytes in the model store, never in the database: a file as one blob, a folder file
by file with its manifest; on the embedded default (a folder under FARM_HOME) and on a real SeaweedFS. A model
over the limit or the store's free space, a store that is down, or Ctrl-C mid-upload: one line, nothing visible,
no row naming missing bytes."""
from __future__ import annotations

import io
import json
import os
import socket
import sqlite3
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from sqlalchemy import func, inspect, select

from farm.artifacts import fetch_model
from farm.db.models import ModelArtifact, Request
from farm.db.session import get_engine, session_scope
from farm.errors import ArtifactError, RequestError
from farm.models.llm_info import folder_manifest
from farm.settings import reset_settings
from farm.store.backends import LocalStore, open_store
from farm.store.base import BlobStore
from farm.store.fetch import read_manifest
from scheduler.enqueue import submit
from schemas import ProfileRequest
from tests.helpers import FAST, farm, farm_env
from tests.seaweedfs import SeaweedFS


def _hf_folder(root: Path) -> Path:
    """A Hugging Face-shaped folder (config, weights, tokenizer, a nested file): what a submit stores of it."""
    folder = root / "my-model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 128}))
    (folder / "model.safetensors").write_bytes(os.urandom(3 << 20))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "sub" / "extra.txt").write_text("x")
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _read(store: BlobStore, digest: str) -> bytes:
    with store.get(digest) as src:
        return src.read()


@pytest.mark.slow
def test_farm_submit_of_a_file_stores_its_bytes_in_the_store_not_the_database(tmp_path: Path) -> None:
    """The embedded default end to end: `farm submit` stores the model under FARM_HOME/store, the job fetches it
    from there and succeeds, and the database has no bytes column."""
    model = tmp_path / "convnet.onnx"
    env = farm_env()
    farm("example-model", str(model), "--kind", "convnet", env=env)
    out = farm("submit", str(model), "--batch-sizes", "1", *FAST, "--json", env=env)
    rid = json.loads(out.stdout)["request_id"]
    assert [r["status"] for r in json.loads(farm("results", rid, "--format", "json", env=env).stdout)] == [
        "succeeded"]
    home = Path(env["FARM_HOME"])
    with sqlite3.connect(home / "farm.db") as con:
        columns = [r[1] for r in con.execute("PRAGMA table_info(model_artifacts)")]
        sha, location, layout, size = con.execute("SELECT sha256, location, layout, size_bytes FROM "
                                                  "model_artifacts").fetchone()
    assert "content" not in columns
    store = LocalStore(home / "store")
    assert (location, layout, size) == (store.url, "file", model.stat().st_size)
    assert store.path(sha).read_bytes() == model.read_bytes()


def _use_store(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, kind: str) -> BlobStore:
    if kind == "s3":
        server: SeaweedFS = request.getfixturevalue("seaweedfs")
        for key, value in server.env(f"farm-test/submit-{uuid.uuid4().hex[:12]}").items():
            monkeypatch.setenv(key, value)
        reset_settings()
    return open_store()


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_folder_is_stored_file_by_file_and_fetched_whole(kind: str, tmp_path: Path, sqlite_url: str,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           request: pytest.FixtureRequest) -> None:
    store = _use_store(monkeypatch, request, kind)
    folder = _hf_folder(tmp_path)
    job = submit(ProfileRequest(model=str(folder)), send=False).expansion.jobs[0]
    with session_scope() as s:
        row = s.get(ModelArtifact, job.model_sha256)
        assert row is not None
        assert (row.layout, row.filename, row.location) == ("folder", "my-model", store.url)
        assert row.size_bytes == sum(len(b) for b in _files(folder).values())
    manifest = read_manifest(store, job.model_sha256)
    assert manifest.digest() == job.model_sha256
    assert {e.path: _read(store, e.sha256) for e in manifest.files} == _files(folder)
    fetched = fetch_model(job.model_sha256, job.model_filename)
    assert fetched.is_dir() and _files(fetched) == _files(folder)


def test_the_same_model_twice_is_stored_once(tmp_path: Path, sqlite_url: str, example_onnx: Path) -> None:
    first = submit(ProfileRequest(model=str(example_onnx)), send=False).expansion.jobs[0]
    second = submit(ProfileRequest(model=str(example_onnx)), send=False).expansion.jobs[0]
    assert first.model_sha256 == second.model_sha256
    store = open_store()
    assert isinstance(store, LocalStore)
    assert [p.name for p in (store.root / "sha256").rglob("*") if p.is_file()] == [first.model_sha256]
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(ModelArtifact)) == 1


def _nothing_stored(store: BlobStore, sha: str | None = None) -> None:
    """No request or model row; no blob at all (a local store), or not blob ``sha``."""
    with session_scope() as s:
        assert s.scalar(select(func.count()).select_from(Request)) == 0
        assert s.scalar(select(func.count()).select_from(ModelArtifact)) == 0
    if isinstance(store, LocalStore) and sha is None:
        assert [p for p in store.root.rglob("*") if p.is_file()] == []
    elif sha is not None:
        assert not store.exists(sha)


def test_a_model_over_the_limit_or_the_free_space_is_refused_before_a_byte_is_written(
        tmp_path: Path, sqlite_url: str, example_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_MAX_MODEL_BYTES", "1000")
    reset_settings()
    for model in (example_onnx, _hf_folder(tmp_path)):
        with pytest.raises(RequestError, match=r"above the .* GiB a model may be here \(FARM_MAX_MODEL_BYTES\)") as err:
            submit(ProfileRequest(model=str(model)), send=False)
        assert "\n" not in str(err.value)
    monkeypatch.delenv("FARM_MAX_MODEL_BYTES")
    reset_settings()
    monkeypatch.setattr(LocalStore, "free_bytes", lambda self: 100)  # a nearly full disk
    with pytest.raises(ArtifactError, match=r"has 0.00 GiB free, .* needs .*; free space there or set FARM_STORE_URL"):
        submit(ProfileRequest(model=str(example_onnx)), send=False)
    _nothing_stored(open_store())


def test_farm_submit_to_a_store_that_is_down_is_one_line(tmp_path: Path, example_onnx: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = farm_env(FARM_STORE_URL="s3://models", FARM_S3_ENDPOINT=f"http://127.0.0.1:{port}",
                   FARM_S3_REGION="us-east-1", FARM_S3_ACCESS_KEY_ID="k", FARM_S3_SECRET_ACCESS_KEY="s")
    out = farm("submit", str(example_onnx), *FAST, env=env, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    line = [ln for ln in out.stderr.splitlines() if "model store" in ln]
    assert len(line) == 1 and f"127.0.0.1:{port}" in line[0] and "start it" in line[0], out.stderr
    with sqlite3.connect(Path(env["FARM_HOME"]) / "farm.db") as con:
        assert con.execute("SELECT count(*) FROM requests").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM model_artifacts").fetchone() == (0,)


class _CtrlC(io.RawIOBase):
    """A model file whose reading is interrupted (Ctrl-C) after ``after`` bytes."""

    def __init__(self, src: BinaryIO, after: int) -> None:
        self.src, self.after, self.done = src, after, 0

    def read(self, n: int = -1) -> bytes:
        if self.done >= self.after:
            raise KeyboardInterrupt
        chunk = self.src.read(n)
        self.done += len(chunk)
        return chunk


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_ctrl_c_mid_upload_leaves_no_row_and_no_blob(kind: str, tmp_path: Path, sqlite_url: str,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     request: pytest.FixtureRequest) -> None:
    store = _use_store(monkeypatch, request, kind)
    folder = _hf_folder(tmp_path)
    stage = type(store).stage

    def interrupted(self: Any, src: BinaryIO, size: int) -> Any:
        return stage(self, _CtrlC(src, 1 << 20), size)  # type: ignore[arg-type]

    monkeypatch.setattr(type(store), "stage", interrupted)
    with pytest.raises(KeyboardInterrupt):
        submit(ProfileRequest(model=str(folder)), send=False)
    monkeypatch.undo()
    big = next(e for e in folder_manifest(folder).files if e.path == "model.safetensors")
    _nothing_stored(store, big.sha256)  # nothing is published before the whole folder is staged
    assert not store.exists(folder_manifest(folder).digest())
    assert _incoming(store) == []  # the files staged before the interrupted one are gone too


def _incoming(store: BlobStore) -> list[str]:
    """Temporary files (local) or objects (S3) a submit's staging left."""
    if isinstance(store, LocalStore):
        return [p.name for p in (store.root / "incoming").glob("*")]
    s3: Any = store
    return [o["Key"] for o in s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=f"{s3.prefix}/incoming/")
            .get("Contents", [])]


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_submit_reads_the_model_once(kind: str, tmp_path: Path, sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                     request: pytest.FixtureRequest) -> None:
    """Each file of the model is read once, by its staging (hashed while it is written): no separate hashing
    read, no second read to store it; the blobs and the manifest are published and nothing temporary stays."""
    import farm.models.spec as spec

    store = _use_store(monkeypatch, request, kind)
    folder = _hf_folder(tmp_path)
    hashed: list[Path] = []
    staged: list[int] = []
    put: list[str] = []
    read_sha256, stage_, put_ = spec.read_sha256, type(store).stage, type(store).put
    monkeypatch.setattr(spec, "read_sha256", lambda path, *a: hashed.append(path) or read_sha256(path, *a))
    monkeypatch.setattr(type(store), "stage", lambda self, src, size: staged.append(size) or stage_(self, src, size))
    monkeypatch.setattr(type(store), "put", lambda self, digest, *a: put.append(digest) or put_(self, digest, *a))
    job = submit(ProfileRequest(model=str(folder)), send=False).expansion.jobs[0]
    monkeypatch.undo()
    assert hashed == [] and sorted(staged) == sorted(len(b) for b in _files(folder).values())
    assert put == [job.model_sha256]  # the manifest only: the files' bytes were not read a second time
    manifest = read_manifest(store, job.model_sha256)
    assert {e.path: _read(store, e.sha256) for e in manifest.files} == _files(folder)
    assert _incoming(store) == []


def test_fetch_of_a_model_whose_bytes_are_gone_is_one_line(sqlite_url: str, example_onnx: Path,
                                                           tmp_path: Path) -> None:
    job = submit(ProfileRequest(model=str(example_onnx)), send=False).expansion.jobs[0]
    store = open_store()
    assert isinstance(store, LocalStore)
    store.path(job.model_sha256).unlink()
    with pytest.raises(ArtifactError, match="not in the model store .*; submit the request again"):
        fetch_model(job.model_sha256, job.model_filename, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / job.model_sha256 / job.model_filename).exists()
    assert "content" not in {c["name"] for c in inspect(get_engine(sqlite_url)).get_columns("model_artifacts")}
