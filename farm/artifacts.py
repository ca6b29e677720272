"""Model artifact store: model files live in the database, content-addressed by sha256, and are cached
on each worker's disk under ``<home>/artifacts/<sha256>/<filename>``."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from farm.db.models import ModelArtifact
from farm.db.session import session_scope
from farm.errors import ArtifactError
from farm.models.analysis import analyze
from farm.models.llm_info import folder_tar
from farm.settings import get_settings
from schemas import TensorSpec

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_filename(name: str) -> str:
    """A file name safe to create in the cache: no path separators, no leading dots."""
    cleaned = _SAFE_NAME.sub("_", Path(name).name).lstrip(".")
    return cleaned[:200] or "model"


def artifact_filename(path: Path) -> str:
    """The name a model is stored and cached under: a folder (a Hugging Face model) is stored as ``NAME.tar``."""
    return safe_filename(path.name + ".tar" if path.is_dir() else path.name)


def model_bytes(path: Path) -> bytes:
    """What the store holds of the model at ``path``: the file, or a folder's deterministic tar."""
    return folder_tar(path) if path.is_dir() else path.read_bytes()


def static_metrics(path: Path, model_format: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """``farm analyze`` of the model (params, size, MACs/FLOPs, activation memory), JSON-ready; a model
    the analyser cannot count gets ``{"error": ...}`` rather than blocking the submission."""
    if model_format == "endpoint":  # a running server's descriptor (farm.endpoint): no graph to count
        return {"error": "a running server's model: no model file to analyse"}
    if model_format in ("gguf", "hf"):  # LLM weights: farm's graph analyser counts ONNX/TorchScript graphs
        return {"error": f"an LLM model ({model_format}): no graph to analyse"}
    try:
        report = analyze(path, model_format, [TensorSpec.model_validate(t) for t in inputs])
    except Exception as exc:  # analysis is informative; a model that serves must not be refused for it
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    metrics: dict[str, Any] = json.loads(json.dumps(report, default=str))
    return metrics


def store_model(session: Session, path: Path, sha256: str, model_format: str,
                inputs: list[dict[str, Any]]) -> ModelArtifact:
    """Put the model at ``path`` in the store (once per sha256) within ``session``'s transaction, with its
    static metrics computed once per artifact."""
    existing = session.get(ModelArtifact, sha256)
    if existing is not None:
        if existing.static_metrics is None:
            existing.static_metrics = static_metrics(path, model_format, inputs)
        return existing
    data = model_bytes(path)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ArtifactError(f"{path} changed while it was being submitted; submit it again")
    artifact = ModelArtifact(sha256=sha256, filename=artifact_filename(path), format=model_format,
                             size_bytes=len(data), content=data, inputs=inputs,
                             static_metrics=static_metrics(path, model_format, inputs))
    session.add(artifact)
    return artifact


def artifact_path(sha256: str, filename: str, cache_dir: Path | None = None) -> Path:
    """Where the cached copy of an artifact lives; refuses anything that is not a sha256."""
    if not _SHA_RE.match(sha256):
        raise ArtifactError(f"{sha256!r} is not a sha256 artifact id")
    root = (cache_dir or get_settings().cache_dir).resolve()
    return root / sha256 / safe_filename(filename)


def ensure_in_store(path: Path, cache_dir: Path | None = None) -> Path:
    """``path`` resolved, if it lies inside the artifact cache; ArtifactError otherwise (workers run
    only models from the store, never arbitrary paths)."""
    root = (cache_dir or get_settings().cache_dir).resolve()
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ArtifactError(f"refusing model path {path}: outside the artifact store {root}")
    return resolved


def fetch_model(sha256: str, filename: str, cache_dir: Path | None = None) -> Path:
    """The local path of artifact ``sha256``, fetched from the database and verified on first use."""
    target = artifact_path(sha256, filename, cache_dir)
    if target.is_file():
        return target
    with session_scope() as s:
        row = s.execute(select(ModelArtifact.content).where(ModelArtifact.sha256 == sha256)).scalar_one_or_none()
    if row is None:
        raise ArtifactError(f"model {sha256[:12]} is not in the artifact store; submit the request again")
    if hashlib.sha256(row).hexdigest() != sha256:
        raise ArtifactError(f"model {sha256[:12]} in the database does not match its sha256; resubmit it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(row)
    os.chmod(tmp, 0o644)  # containers read the model as an unprivileged user through a read-only mount
    os.replace(tmp, target)
    return target
