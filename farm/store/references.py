"""Models named by reference rather than by a path on the submitter's disk: ``store:sha256:HEX`` (a model already
in the model store) or ``s3://BUCKET/KEY`` (an object at a location the operator allows, ``FARM_S3_ALLOWED``).
``resolve`` makes the model a local file (or folder) the submit inspects like any other: a stored model through
``farm.artifacts.fetch_model`` (verified), a bare blob or an S3 object copied into the artifact cache in chunks,
its sha256 computed while it is copied (the cache entry is named by it, and the store's ``put`` checks it again)."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import urlparse

from farm.artifacts import artifact_path, fetch_model, safe_filename
from farm.db.models import ModelArtifact
from farm.db.session import session_scope
from farm.errors import ArtifactError, RequestError
from farm.settings import get_settings
from farm.store.backends import CHUNK_BYTES, check_digest, open_store
from farm.store.base import STORE_PREFIX, is_reference

__all__ = ["is_reference", "resolve"]



def resolve(model: str) -> Path:
    """The local file (or folder) of the model ``model`` references; RequestError (one line) when it is not
    there or not allowed."""
    if model.startswith(STORE_PREFIX):
        return _from_store(model[len(STORE_PREFIX):])
    return _from_s3(model)


def _from_store(digest: str) -> Path:
    try:
        check_digest(digest)
    except ArtifactError:
        raise RequestError(f"{STORE_PREFIX}{digest}: not a sha256 (64 lowercase hex digits)") from None
    with session_scope() as s:
        row = s.get(ModelArtifact, digest)
        filename = row.filename if row is not None and row.location else None
    if filename is not None:
        return fetch_model(digest, filename)
    store = open_store()
    if not store.exists(digest):
        raise RequestError(f"{STORE_PREFIX}{digest[:12]}...: no such model in the model store {store.url}; submit "
                           "the model file itself")
    with store.get(digest) as src:
        return _copy_in(src, "model", digest)


def allowed_prefixes() -> list[str]:
    """The ``s3://BUCKET/PREFIX`` locations models may be referenced at (``FARM_S3_ALLOWED``)."""
    return [p.strip().rstrip("/") for p in (get_settings().s3_allowed or "").split(",") if p.strip()]


def _from_s3(url: str) -> Path:
    allowed = allowed_prefixes()
    parsed = urlparse(url)
    key = parsed.path.lstrip("/")
    if not parsed.netloc or not key or ".." in PurePosixPath(key).parts:
        raise RequestError(f"{url}: write s3://BUCKET/KEY")
    if not any(url == p or url.startswith(p + "/") for p in allowed):
        raise RequestError(f"{url} is not a location this farm reads models from (FARM_S3_ALLOWED: "
                           f"{', '.join(allowed) or 'none'}); ask its operator, or submit the file itself")
    from farm.store.s3 import S3Store  # noqa: PLC0415 - boto3: +160 ms at import, measured; s3:// models only

    s = get_settings()
    secret = s.s3_secret_access_key.get_secret_value() if s.s3_secret_access_key else None
    bucket = S3Store(parsed.netloc, "", s.s3_endpoint, s.s3_region, s.s3_access_key_id, secret)
    with bucket.open_key(key, f"{url}: no such object; check the URL") as src:
        return _copy_in(src, PurePosixPath(key).name, None)


def _copy_in(src: BinaryIO, name: str, digest: str | None) -> Path:
    """Copy ``src`` into the artifact cache in chunks, hashing it; the entry (named by the sha256) is published
    by rename, and only when it is ``digest`` where given."""
    cache = get_settings().cache_dir
    cache.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=cache, prefix=".ref.", suffix=".part", delete=False) as tmp:
        try:
            while chunk := src.read(CHUNK_BYTES):
                h.update(chunk)
                tmp.write(chunk)
            if digest is not None and h.hexdigest() != digest:
                raise ArtifactError(f"model {digest[:12]} in the model store does not match its sha256; resubmit it")
            target = artifact_path(h.hexdigest(), safe_filename(name))
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(tmp.name, 0o644)
            os.replace(tmp.name, target)
        except BaseException:
            Path(tmp.name).unlink(missing_ok=True)
            raise
    return target
