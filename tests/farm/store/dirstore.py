"""A directory-backed ``BlobStore`` for the cache's tests (the real ``LocalStore`` is ``farm.store.backends``'s):
blobs as files named by their sha256, with what the tests need to watch and break it: every ``get`` appended to a
log file (shared by processes), a store that is down for its first N calls, a slow stream (to kill a fetch midway).
"""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from farm.errors import ArtifactError, BlobMissing, StoreUnavailable
from farm.store.base import Manifest, ManifestEntry


class SlowReader:
    """A file read in at most ``chunk``-byte steps, ``delay_s`` apart."""

    def __init__(self, f: BinaryIO, delay_s: float, chunk: int = 64 << 10) -> None:
        self.f, self.delay_s, self.chunk = f, delay_s, chunk

    def read(self, n: int = -1) -> bytes:
        time.sleep(self.delay_s)
        return self.f.read(self.chunk if n < 0 else min(n, self.chunk))


class DirStore:
    """Blobs under ``root``; ``down_calls``: the first that many calls raise StoreUnavailable (this process's
    calls); ``delay_s``: a pause per read step; gets logged to ``root/gets.log``."""

    def __init__(self, root: Path, down_calls: int = 0, delay_s: float = 0.0) -> None:
        self.root = root
        self.url = f"file://{root}"
        self.down_calls = down_calls
        self.delay_s = delay_s
        self.calls = 0
        root.mkdir(parents=True, exist_ok=True)

    def _call(self) -> None:
        self.calls += 1
        if self.calls <= self.down_calls:
            raise StoreUnavailable(f"connection refused: {self.url}")

    def put(self, digest: str, src: BinaryIO, size: int) -> None:
        self._call()
        data = src.read()
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise ArtifactError(f"blob {digest[:12]} does not match its digest")
        tmp = self.root / f".{digest}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.root / digest)

    @contextmanager
    def get(self, digest: str) -> Iterator[BinaryIO]:
        self._call()
        if not (self.root / digest).is_file():
            raise BlobMissing(f"no blob {digest[:12]}")
        with open(self.root / "gets.log", "a") as log:
            log.write(digest + "\n")
        with open(self.root / digest, "rb") as f:
            yield SlowReader(f, self.delay_s) if self.delay_s else f  # type: ignore[misc]

    def exists(self, digest: str) -> bool:
        self._call()
        return (self.root / digest).is_file()

    def size(self, digest: str) -> int | None:
        self._call()
        path = self.root / digest
        return path.stat().st_size if path.is_file() else None

    def gets(self) -> list[str]:
        """Every blob fetched so far, in order, by any process."""
        log = self.root / "gets.log"
        return log.read_text().split() if log.exists() else []

    def add(self, data: bytes) -> str:
        """Store ``data``; its sha256."""
        digest = hashlib.sha256(data).hexdigest()
        (self.root / digest).write_bytes(data)
        return digest

    def add_folder(self, files: dict[str, bytes]) -> str:
        """Store a folder (path -> bytes) file by file plus its manifest; the manifest's sha256 (the model's id)."""
        entries = tuple(ManifestEntry(path=p, sha256=self.add(b), size=len(b)) for p, b in files.items())
        return self.add(Manifest(files=entries).canonical())
