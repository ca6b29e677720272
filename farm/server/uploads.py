"""Streamed uploads: a model or data file arrives as the raw body of ``PUT /api/v1/uploads/{filename}`` and is
written to disk chunk by chunk while its sha256 is computed, so the server's memory stays constant whatever
the size (bounded by ``FARM_MAX_UPLOAD_BYTES``). A finished upload lies at
``<uploads>/<identity>/<sha256>/<filename>`` (one identity never names another's upload) until a submit names
it; it then enters the model store through ``scheduler.enqueue.submit`` (``farm.artifacts.store_model``, the one
way into the store). An upload is content-addressed: sending the same file again (a client retrying after a
crash, or submitting the same model twice at once) lands in the same place, so no submit removes an upload
another may be using; ``sweep`` removes those older than ``STALE_S``.

A folder (a Hugging Face model, a tokenizer's folder) comes file by file, each an upload as above, then is put
together by ``assemble`` from its listing (relative path -> sha256): the files linked (or copied) into
``<uploads>/<identity>/<listing's sha256>/<folder name>/``, so a folder's id names its exact contents."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath

from farm.artifacts import safe_filename
from farm.errors import NotFoundError, RequestError, TooLargeError
from farm.models.llm_info import MAX_FOLDER_FILES
from farm.settings import get_settings

_SHA = re.compile(r"^[0-9a-f]{64}$")
#: an upload is removed this long after it arrived (``sweep``): its submit has long stored it, s
STALE_S = 3600.0
#: one part of a path inside a folder upload (hidden files kept: the folder's sha256 must be the one a local submit
#: computes, ``farm.models.llm_info.folder_manifest``)
_PART = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


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


def _relative(path: str) -> PurePosixPath:
    """``path`` as a safe relative path inside a folder; RequestError for an absolute path, ``..``, ``.``, an empty
    part or another character than letters, digits and ``._-``."""
    parts = path.split("/")
    if len(path) > 4096 or any(p in (".", "..") or not _PART.match(p) for p in parts):
        raise RequestError(f"files: {path[:80]!r} is not a plain relative path inside the folder (letters, digits "
                           "and ._- in each part, no '..')")
    return PurePosixPath(path)


def assemble(owner: str, name: str, files: dict[str, str]) -> tuple[str, int]:
    """The folder ``name`` put together from ``owner``'s uploads (relative path -> sha256); its upload id (the
    sha256 of its listing) and its size in bytes. RequestError for a bad listing, NotFoundError for a file not
    uploaded (send it again)."""
    if not files or len(files) > MAX_FOLDER_FILES:
        raise RequestError(f"files: a folder lists 1 to {MAX_FOLDER_FILES} files, not {len(files)}")
    if safe_filename(name) != name:
        raise RequestError(f"name: {name[:80]!r} is not a plain folder name (letters, digits, ._-, no leading dot)")
    listing = {str(_relative(p)): sha for p, sha in sorted(files.items())}
    sha = hashlib.sha256(json.dumps({"name": name, "files": listing}, sort_keys=True).encode()).hexdigest()
    root = _root(owner)
    if (root / sha / name).is_dir():  # sent before (a retry): the same contents
        return sha, _size(root / sha / name)
    tmp = root / f".{uuid.uuid4().hex}.part"
    try:
        for rel, file_sha in listing.items():
            src = path_of(owner, file_sha)
            if not src.is_file():
                raise RequestError(f"files: {rel!r} names {file_sha[:12]}, a folder's upload; list each file's own")
            target = tmp / name / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            _link(src, target)
        try:
            os.replace(tmp, root / sha)
        except OSError:  # a concurrent try put the same folder there first
            if not (root / sha / name).is_dir():
                raise
        return sha, _size(root / sha / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _link(src: Path, dst: Path) -> None:
    """``dst`` as a hard link of the uploaded ``src`` (no copy; a sweep of ``src`` leaves it whole), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


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
