"""The model store's contract: content-addressed blobs (by sha256) beside the database, never inside it.

The database keeps a model's metadata (sha256, size, format, name, static metrics) and where its bytes are;
the bytes live in a ``BlobStore``: a folder under ``FARM_HOME`` (embedded default), an S3-compatible bucket or a
shared volume (cluster). A Hugging Face folder is stored file by file: each file a blob, plus a ``Manifest``
blob listing them; the model's sha256 is the manifest's (``Manifest.digest``), so equal folders share one id.
Workers materialise blobs into their cache (``farm.store.cache``), verifying every digest before first use.
"""
from __future__ import annotations

import hashlib
import json
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_FORMAT = "farm-folder-manifest/1"
#: ``farm submit store:sha256:HEX``: a model already in the model store (``farm.store.references``)
STORE_PREFIX = "store:sha256:"


def is_reference(model: str) -> bool:
    """Whether ``model`` (``farm submit``'s MODEL) names a model by reference (``store:sha256:HEX``, ``s3://...``)
    rather than by a path (``farm.store.references.resolve`` makes it local)."""
    return model.startswith((STORE_PREFIX, "s3://"))


class Staged(Protocol):
    """A blob written to the store under a temporary name while it was hashed (``BlobStore.stage``): complete,
    fsynced or uploaded, and invisible until ``publish`` makes it blob ``digest``."""

    digest: str  # the sha256 of the bytes written (64 lowercase hex digits)
    size: int  # bytes

    def publish(self) -> None:
        """Make the bytes blob ``digest``, atomically (a rename, a completed upload, or a server-side copy); a
        blob already there is kept and the staged bytes dropped."""
        ...


class BlobStore(Protocol):
    """Where model bytes live, addressed by their sha256 (64 lowercase hex digits).

    ``put`` publishes atomically: a reader sees the whole blob or none (an interrupted upload leaves nothing
    visible). Raises ``farm.errors.StoreUnavailable`` when the store is down, ``BlobMissing`` for an absent blob.
    """

    url: str  # where it is, for messages and the database's ``location`` (no credentials in it)

    def put(self, digest: str, src: BinaryIO, size: int) -> None:
        """Store ``size`` bytes read from ``src`` under ``digest``, streaming (constant memory); the digest is
        checked while streaming and nothing is published on a mismatch (ArtifactError)."""
        ...

    def stage(self, src: BinaryIO, size: int) -> AbstractContextManager[Staged]:
        """Write ``size`` bytes of ``src`` under a temporary name, hashing them as they pass (one read of
        ``src``: a submit learns the model's sha256 as it stores it); the block's end removes them unless
        published. DigestMismatch when ``src`` does not hold exactly ``size`` bytes."""
        ...

    def get(self, digest: str) -> AbstractContextManager[BinaryIO]:
        """A stream of the blob's bytes (the caller verifies the digest while reading)."""
        ...

    def exists(self, digest: str) -> bool:
        """Whether the blob is published."""
        ...

    def size(self, digest: str) -> int | None:
        """The published blob's size in bytes; None when absent."""
        ...


class ManifestEntry(BaseModel):
    """One file of a stored folder: its path inside the folder (POSIX, relative), sha256 and size (bytes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class Manifest(BaseModel):
    """A folder model (Hugging Face layout: config, tokenizer, safetensors shards) as its files' digests."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: str = MANIFEST_FORMAT
    files: tuple[ManifestEntry, ...]

    def canonical(self) -> bytes:
        """The bytes stored as the manifest blob: sorted by path, compact JSON."""
        files = sorted(self.files, key=lambda f: f.path)
        body = {"format": self.format, "files": [f.model_dump() for f in files]}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        """The folder model's sha256: that of ``canonical()``."""
        return hashlib.sha256(self.canonical()).hexdigest()

    @property
    def size(self) -> int:
        """The folder's total size, bytes."""
        return sum(f.size for f in self.files)
