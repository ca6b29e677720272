"""Streamed uploads: a model or data file arrives as the raw body of ``PUT /api/v1/uploads/{filename}`` and is
written to disk chunk by chunk while its sha256 is computed, so the server's memory stays constant whatever
the size (bounded by ``FARM_MAX_UPLOAD_BYTES``). A finished upload lies at
``<uploads>/<identity>/<sha256>/<filename>`` (one identity never names another's upload) until a submit names
it; it then enters the model store through ``scheduler.enqueue.submit`` (``farm.artifacts.store_model``, the one
way into the store). An upload is content-addressed: sending the same file again (a client retrying after a
crash, or submitting the same model twice at once) lands in the same place, so no submit removes an upload
another may be using; ``sweep`` removes those older than ``STALE_S``."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from farm.artifacts import safe_filename
from farm.errors import NotFoundError, TooLargeError
from farm.settings import get_settings

_SHA = re.compile(r"^[0-9a-f]{64}$")
#: an upload is removed this long after it arrived (``sweep``): its submit has long stored it, s
STALE_S = 3600.0


def _root(owner: str | None = None) -> Path:
    root = get_settings().uploads
    if owner is not None:
        root = root / safe_filename(owner)
    root.mkdir(parents=True, exist_ok=True)
    return root


async def receive(owner: str, filename: str, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
    """Write the streamed ``chunks`` of file ``filename`` to the upload area; (sha256, size in bytes).
    LimitError past ``FARM_MAX_UPLOAD_BYTES`` (nothing is kept)."""
    limit = get_settings().max_upload_bytes
    root = _root(owner)
    tmp = root / f".{uuid.uuid4().hex}.part"
    digest, size = hashlib.sha256(), 0
    try:
        with tmp.open("wb") as fh:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise TooLargeError(f"the upload passes the server's limit of {limit} bytes "
                                        "(FARM_MAX_UPLOAD_BYTES)")
                digest.update(chunk)
                fh.write(chunk)
        sha = digest.hexdigest()
        target = root / sha / safe_filename(filename)
        target.parent.mkdir(exist_ok=True)
        os.replace(tmp, target)
        return sha, size
    finally:
        tmp.unlink(missing_ok=True)


def path_of(owner: str, sha256: str) -> Path:
    """The file ``owner`` uploaded as ``sha256``; NotFoundError when there is none (never uploaded, or swept)."""
    if not _SHA.match(sha256):
        raise NotFoundError(f"upload {sha256!r} is not a sha256; PUT the file to /api/v1/uploads/NAME first")
    folder = _root(owner) / sha256
    files = sorted(folder.iterdir()) if folder.is_dir() else []
    if not files:
        raise NotFoundError(f"no upload {sha256[:12]}: send the file again (PUT /api/v1/uploads/NAME)")
    return files[0]


def sweep(max_age_s: float = STALE_S) -> int:
    """Remove uploads (and broken partial ones) that arrived more than ``max_age_s`` ago; returns how many."""
    cutoff = time.time() - max_age_s
    gone = 0
    for entry in (e for owner in _root().iterdir() if owner.is_dir() for e in owner.iterdir()):
        try:
            if entry.stat().st_mtime < cutoff:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
                gone += 1
        except FileNotFoundError:  # removed meanwhile (another server's sweep)
            continue
    return gone
