"""Streaming, verified copies out of a ``BlobStore``: constant memory (one fixed chunk), the sha256 computed while
the bytes go by, the file fsynced before anyone renames it into place; a store that is down is retried with
backoff a bounded number of times (``Retry``), then a one-line error.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from farm.errors import ArtifactError, BlobMissing, StoreUnavailable
from farm.store.base import BlobStore, Manifest

CHUNK = 1 << 20  # bytes per read/hash/write step: the copy's whole buffer
MAX_MANIFEST_BYTES = 16 << 20  # a folder's manifest (tens of bytes per file) is read whole, up to this
T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """How a fetch rides out a store that is down: ``attempts`` tries, ``backoff_s`` before the second, doubling
    up to ``max_backoff_s`` (s)."""

    attempts: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def call(self, store: BlobStore, what: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried while it raises ``StoreUnavailable``; the last failure as a one-line error."""
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except StoreUnavailable as exc:
                if attempt == self.attempts:
                    raise StoreUnavailable(
                        f"model store {store.url} unreachable while fetching {what} ({attempt} tries over "
                        f"{self.total_wait_s():.0f} s: {' '.join(str(exc).split())[:200]}); start or fix the store, "
                        "then retry the job") from None
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        raise AssertionError("unreachable")  # attempts >= 1

    def total_wait_s(self) -> float:
        """The sleeps between all attempts (s)."""
        waits, delay = 0.0, self.backoff_s
        for _ in range(self.attempts - 1):
            waits, delay = waits + delay, min(delay * 2, self.max_backoff_s)
        return waits


def copy_blob(store: BlobStore, digest: str, dest: Path, size: int) -> None:
    """Write blob ``digest`` (``size`` bytes) to ``dest`` (a temporary name), verified and fsynced; ArtifactError
    (and ``dest`` removed) when the store's bytes do not match their digest: the stored blob is bad."""
    sha = hashlib.sha256()
    written = 0
    try:
        with store.get(digest) as src, open(dest, "wb", buffering=0) as out:
            while chunk := src.read(CHUNK):
                sha.update(chunk)
                out.write(chunk)
                written += len(chunk)
                if written > size:
                    break
            out.flush()
            os.fsync(out.fileno())
        if written != size or sha.hexdigest() != digest:
            got = f"{written} bytes" if written != size else f"sha256 {sha.hexdigest()[:12]}"
            raise ArtifactError(
                f"the model store's blob {digest[:12]} is corrupt (expected {size} bytes with that sha256, got {got}); "
                "submit the model again to replace it")
    except BaseException:
        dest.unlink(missing_ok=True)
        raise


def read_manifest(store: BlobStore, digest: str) -> Manifest:
    """The folder model ``digest``'s manifest, its digest checked; ArtifactError when it is corrupt or unsafe."""
    with store.get(digest) as src:
        raw = src.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES or hashlib.sha256(raw).hexdigest() != digest:
        raise ArtifactError(f"the model store's manifest {digest[:12]} is corrupt (its bytes do not match its "
                            "sha256); submit the model again")
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValueError as exc:
        raise ArtifactError(f"blob {digest[:12]} is not a folder manifest ({str(exc).splitlines()[0]}); "
                            "was the model submitted as a file?") from None
    check_paths(manifest, digest)
    return manifest


def check_paths(manifest: Manifest, digest: str) -> None:
    """Refuse a manifest whose paths would escape the folder, repeat, or make a file and a folder of one name."""
    seen: set[str] = set()
    for entry in manifest.files:
        parts = entry.path.split("/")
        if entry.path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in entry.path:
            raise ArtifactError(f"folder manifest {digest[:12]} names an unsafe path {entry.path!r}; submit the "
                                "folder again")
        seen.add(entry.path)
    parents = {"/".join(e.path.split("/")[:i]) for e in manifest.files for i in range(1, e.path.count("/") + 1)}
    if len(seen) != len(manifest.files) or seen & parents:
        raise ArtifactError(f"folder manifest {digest[:12]} names a path twice, or as both a file and a folder; "
                            "submit the folder again")


def blob_size(store: BlobStore, digest: str) -> int:
    """The published blob's size (bytes); BlobMissing when the store has no such blob."""
    size = store.size(digest)
    if size is None:
        raise BlobMissing(f"model {digest[:12]} is not in the model store {store.url}; submit the request again")
    return size


def hash_file(path: Path) -> str:
    """``path``'s sha256, read in ``CHUNK`` steps (constant memory)."""
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()
