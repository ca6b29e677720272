"""Model artifacts: a model's metadata lives in the database (``ModelArtifact``), its bytes in the model store
(``farm.store``: a folder under ``FARM_HOME``, an S3 bucket or a shared volume), content-addressed by sha256 and
streamed in (a file as one blob, a folder file by file with its ``Manifest``; a submit reads the model once, storing
its bytes as its inspection hashes them: ``Intake``); workers cache them on disk under
``<home>/artifacts/<sha256>/<filename>``."""
from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from farm.db.models import ModelArtifact
from farm.db.session import session_scope
from farm.errors import ArtifactError, DigestMismatch, RequestError
from farm.models.analysis import analyze
from farm.models.llm_info import folder_manifest, weights_bytes
from farm.models.spec import hashing_by
from farm.settings import get_settings
from farm.store.backends import free_bytes, open_store
from farm.store.base import BlobStore, Staged
from farm.store.cache import Layout, ModelCache
from schemas import TensorSpec
from schemas.llm import WORKLOAD_FORMATS

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_filename(name: str) -> str:
    """A file name safe to create in the cache: no path separators, no leading dots."""
    cleaned = _SAFE_NAME.sub("_", Path(name).name).lstrip(".")
    return cleaned[:200] or "model"


def artifact_filename(path: Path) -> str:
    """The name a model is stored and cached under (a folder, a Hugging Face model: the folder's name)."""
    return safe_filename(path.name)


def check_storable(path: Path, size: int | None = None, store: BlobStore | None = None) -> int:
    """The bytes the model at ``path`` brings (``size`` where known); RequestError (one line) when it is above
    ``FARM_MAX_MODEL_BYTES``, ArtifactError when a local ``store`` has not that much free space."""
    if size is None:  # from the file system: nothing is read yet
        size = weights_bytes(path)
    cap = get_settings().max_model_bytes
    if size > cap:
        raise RequestError(f"{path.name} is {size / 2**30:.2f} GiB, above the {cap / 2**30:.2f} GiB a model may be "
                           "here (FARM_MAX_MODEL_BYTES)")
    free = free_bytes(store) if store is not None else None
    if free is not None and size > free:
        raise ArtifactError(f"the model store {store.url if store else ''} has {free / 2**30:.2f} GiB free, "
                            f"{path.name} needs {size / 2**30:.2f} GiB; free space there or set FARM_STORE_URL")
    return size


def static_metrics(path: Path, model_format: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """``farm analyze`` of the model (params, size, MACs/FLOPs, activation memory), JSON-ready; a model
    the analyser cannot count gets ``{"error": ...}`` rather than blocking the submission."""
    if model_format == "endpoint":  # a running server's descriptor (farm.endpoint): no graph to count
        return {"error": "a running server's model: no model file to analyse"}
    if model_format in ("gguf", "hf"):  # LLM weights: farm's graph analyser counts ONNX/TorchScript graphs
        return {"error": f"an LLM model ({model_format}): no graph to analyse"}
    if model_format in WORKLOAD_FORMATS.values():  # a request's prompt, trace or tokenizer file (workload_files)
        return {"error": f"a workload file ({model_format}), not a model"}
    try:
        report = analyze(path, model_format, [TensorSpec.model_validate(t) for t in inputs])
    except Exception as exc:  # analysis is informative; a model that serves must not be refused for it
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}
    metrics: dict[str, Any] = json.loads(json.dumps(report, default=str))
    return metrics


class Intake:
    """A submit's model, read once: each file its inspection hashes (``hashing``) is staged in the model store
    as it is hashed (``BlobStore.stage``: a temporary name, invisible); ``store_model`` publishes them by
    digest, and ``take_in``'s block end drops what was not published."""

    def __init__(self, store: BlobStore, stack: ExitStack) -> None:
        self.store, self._stack = store, stack
        self._staged: dict[tuple[Path, int, int, int], Staged] = {}

    def hashing(self) -> AbstractContextManager[None]:
        """For the block, every ``sha256_file`` (the model's inspection) stages the file it hashes."""
        return hashing_by(self.hash_file)

    def hash_file(self, path: Path) -> str:
        """The sha256 of the file at ``path``, learnt while its bytes are staged in the store (once per state
        of the file: its size, mtime and inode)."""
        key = _identity(path)
        if key not in self._staged:
            with path.open("rb") as src:
                self._staged[key] = self._stack.enter_context(self.store.stage(src, key[1]))
        return self._staged[key].digest

    def staged(self, path: Path, digest: str) -> Staged | None:
        """The staged bytes of the file at ``path`` if they are blob ``digest`` (None: not staged, or the file
        changed since)."""
        found = self._staged.get(_identity(path))
        return found if found is not None and found.digest == digest else None


def _identity(path: Path) -> tuple[Path, int, int, int]:
    st = path.stat()
    return path.resolve(), st.st_size, st.st_mtime_ns, st.st_ino


@contextmanager
def take_in() -> Iterator[Intake]:
    """An ``Intake`` into the configured model store for the block; what it staged and nobody published is
    removed at the block's end (an error, Ctrl-C, a refused request)."""
    with ExitStack() as stack:
        yield Intake(open_store(), stack)


def store_model(session: Session, path: Path, sha256: str, model_format: str,
                inputs: list[dict[str, Any]], intake: Intake | None = None) -> ModelArtifact:
    """Stream the model at ``path`` (sha256 ``sha256``, computed at inspection) into the model store, once per
    sha256, and add its row to ``session``'s transaction (committed by the caller after the bytes are
    published, so no row names missing bytes), with its static metrics computed once per artifact. Files the
    ``intake`` staged while the inspection hashed them are published, not read again."""
    existing = session.get(ModelArtifact, sha256)
    store = intake.store if intake is not None else open_store()
    if existing is not None and existing.location and store.exists(sha256):
        if existing.static_metrics is None:
            existing.static_metrics = static_metrics(path, model_format, inputs)
        return existing
    size = check_storable(path, store=store)
    layout = "folder" if path.is_dir() else "file"
    if layout == "folder":
        _put_folder(store, path, sha256, intake)
    else:
        _put_file(store, path, sha256, size, intake)
    if existing is not None:  # its bytes were lost (a migrated row without them, or a store emptied)
        existing.location, existing.layout = store.url, layout
        return existing
    artifact = ModelArtifact(sha256=sha256, filename=artifact_filename(path), format=model_format,
                             size_bytes=size, location=store.url, layout=layout, inputs=inputs,
                             static_metrics=static_metrics(path, model_format, inputs))
    session.add(artifact)
    return artifact


def _put_file(store: BlobStore, path: Path, sha256: str, size: int, intake: Intake | None) -> None:
    """Publish the file's bytes the ``intake`` staged, or stream the file into the store as blob ``sha256``
    (checked while it passes)."""
    staged = intake.staged(path, sha256) if intake is not None else None
    if staged is not None:
        staged.publish()
        return
    try:
        with path.open("rb") as src:
            store.put(sha256, src, size)
    except DigestMismatch:
        raise DigestMismatch(f"{path} changed while it was being submitted; submit it again") from None


def _put_folder(store: BlobStore, path: Path, sha256: str, intake: Intake | None) -> None:
    """Stream a folder's files into the store, then its manifest (blob ``sha256``): the manifest is published
    last, so a folder is complete in the store once its manifest is."""
    manifest = folder_manifest(path)
    if manifest.digest() != sha256:
        raise ArtifactError(f"{path} changed while it was being submitted; submit it again")
    for entry in manifest.files:
        if not store.exists(entry.sha256):
            _put_file(store, path / entry.path, entry.sha256, entry.size, intake)
    body = manifest.canonical()
    store.put(sha256, io.BytesIO(body), len(body))


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


@contextmanager
def using_model(sha256: str, filename: str, cache_dir: Path | None = None) -> Iterator[Path]:
    """The verified local copy of stored model ``sha256`` (a file, or a folder model's folder) in this host's
    cache (``farm.store.cache``), pinned for the block: no eviction removes it while a job uses it."""
    with session_scope() as s:
        layout = s.execute(select(ModelArtifact.layout).where(ModelArtifact.sha256 == sha256)).scalar_one_or_none()
    if layout not in ("file", "folder"):
        raise ArtifactError(f"model {sha256[:12]} is not in the artifact store; submit the request again")
    kind: Layout = "folder" if layout == "folder" else "file"
    settings = get_settings()
    cache = ModelCache(cache_dir or settings.cache_dir, open_store(), settings.cache_max_bytes)
    with cache.use(sha256, safe_filename(filename), kind) as path:
        yield ensure_in_store(path, cache_dir)


def fetch_model(sha256: str, filename: str, cache_dir: Path | None = None) -> Path:
    """The local path of stored model ``sha256``, fetched into this host's cache and verified, not pinned: for a
    short read (a submit's reference, an op profile's static costs); a job holds ``using_model`` instead."""
    with using_model(sha256, filename, cache_dir) as path:
        return path
