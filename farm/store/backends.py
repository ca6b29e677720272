"""The model store's backends (``farm.store.base.BlobStore``): ``LocalStore`` (a folder: the embedded default
under ``FARM_HOME/store``, or a shared volume) and ``farm.store.s3.S3Store`` (an S3-compatible bucket: SeaweedFS,
MinIO, AWS), chosen by ``open_store`` from ``FARM_STORE_URL``.

Both stream in fixed pieces, hash while streaming (``Checked``) and publish only a whole blob whose sha256 and size
are what the caller named: ``LocalStore`` writes a temporary file beside the blob, fsyncs and renames it;
``S3Store`` uploads in parts and completes the multipart upload (S3 makes the object visible only then, whole) or
aborts it. A submit does not know the sha256 before it reads the model (``stage``): ``LocalStore`` writes it to
``ROOT/incoming`` while hashing (one read), then renames it to the digest's name; ``S3Store`` hashes a file first,
then sends it (unless there already) as an upload to the digest's key that publishing completes (see its module)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import urlparse

from farm.errors import ArtifactError, BlobMissing, StoreUnavailable
from farm.settings import Settings, get_settings
from farm.store.checked import CHUNK_BYTES, STALE_PART_S, Checked, check_digest

if TYPE_CHECKING:
    from farm.store.base import BlobStore, Staged



class LocalStore:
    """Blobs as files ``ROOT/sha256/XX/DIGEST`` (XX: the digest's first two digits)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"

    def path(self, digest: str) -> Path:
        """Where blob ``digest`` is (or would be) published."""
        return self.root / "sha256" / check_digest(digest)[:2] / digest

    def _folder(self, digest: str | None) -> Path:
        """The folder blob ``digest`` goes in (None: ``incoming``, where staged blobs wait), created."""
        folder = self.path(digest).parent if digest else self.root / "incoming"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"the model store {self.root} cannot be written ({exc.strerror}); fix its "
                                   "permissions or mount, or set FARM_STORE_URL") from None
        return folder

    def free_bytes(self) -> int:
        """Free space on the store's file system, bytes."""
        self.root.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.root).free

    def put(self, digest: str, src: BinaryIO, size: int) -> None:
        """Copy ``size`` bytes of ``src`` to a temporary file beside the blob, checking the sha256 as they pass,
        fsync and rename it into place; the temporary file is removed on any failure."""
        if self.path(digest).is_file():
            return
        with self._written(self._folder(digest), src, Checked(digest, size)) as tmp:
            self._publish(tmp, digest)

    @contextmanager
    def stage(self, src: BinaryIO, size: int) -> Iterator[Staged]:
        """``size`` bytes of ``src`` in a temporary file under ``ROOT/incoming``, hashed as they are written and
        fsynced; removed at the block's end unless published (renamed to the blob's name)."""
        check = Checked(None, size)
        with self._written(self._folder(None), src, check) as tmp:
            yield _LocalStaged(self, tmp, check.hexdigest(), size)

    @contextmanager
    def _written(self, folder: Path, src: BinaryIO, check: Checked) -> Iterator[Path]:
        """A temporary file in ``folder`` holding ``src``'s bytes, checked (``check``) and fsynced, for the block;
        removed at its end unless the block renamed it (Ctrl-C included: the partial file never stays)."""
        _sweep_parts(folder)
        tmp = tempfile.NamedTemporaryFile(dir=folder, prefix=f".{(check.digest or 'incoming')[:12]}.", suffix=".part",
                                          delete=False)
        path = Path(tmp.name)
        try:
            with tmp:  # closed before the block: a folder's many staged files hold no descriptor
                for chunk in check.pieces(src, CHUNK_BYTES):
                    tmp.write(chunk)
                check.verify(src)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.chmod(path, 0o644)
            yield path
        finally:
            path.unlink(missing_ok=True)

    def _publish(self, tmp: Path, digest: str) -> None:
        """Rename the whole, fsynced file ``tmp`` to blob ``digest`` (kept where one is already there) and make
        the rename durable."""
        target = self.path(digest)
        self._folder(digest)
        if target.is_file():
            return
        os.replace(tmp, target)
        _fsync_dir(target.parent)

    @contextmanager
    def get(self, digest: str) -> Iterator[BinaryIO]:
        """The blob's file, open for reading; BlobMissing when it is absent."""
        try:
            f = self.path(digest).open("rb")
        except FileNotFoundError:
            raise BlobMissing(f"model {digest[:12]} is not in the model store {self.root}; submit it again") from None
        with f:
            yield f

    def exists(self, digest: str) -> bool:
        """Whether blob ``digest`` is published."""
        return self.path(digest).is_file()

    def size(self, digest: str) -> int | None:
        """The published blob's size, bytes; None when absent."""
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return None


class _LocalStaged:
    """A staged blob of a ``LocalStore``: its fsynced temporary file, sha256 and size (bytes)."""

    def __init__(self, store: LocalStore, tmp: Path, digest: str, size: int) -> None:
        self.store, self.tmp, self.digest, self.size = store, tmp, digest, size

    def publish(self) -> None:
        """Rename the file to the blob's name (same file system: atomic)."""
        self.store._publish(self.tmp, self.digest)


def _sweep_parts(folder: Path) -> None:
    """Remove the temporary files of uploads killed in ``folder`` (older than ``STALE_PART_S``; never visible)."""
    cutoff = time.time() - STALE_PART_S
    for part in folder.glob(".*.part"):
        try:
            if part.stat().st_mtime < cutoff:
                part.unlink()
        except FileNotFoundError:  # removed meanwhile by another upload's sweep
            continue


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (its directory entry)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_store(settings: Settings | None = None) -> BlobStore:
    """The model store ``FARM_STORE_URL`` names (``file://PATH``, a plain path, or ``s3://BUCKET[/PREFIX]``
    with ``FARM_S3_ENDPOINT``/``FARM_S3_REGION`` and the S3 credentials); default ``FARM_HOME/store``.
    Opening touches nothing: an unreachable store fails at its first call (StoreUnavailable)."""
    s = settings or get_settings()
    url = s.store_url or str(s.home / "store")
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ArtifactError(f"FARM_STORE_URL={url} names no bucket; write s3://BUCKET[/PREFIX]")
        secret = s.s3_secret_access_key.get_secret_value() if s.s3_secret_access_key else None
        from farm.store.s3 import S3Store  # noqa: PLC0415 - boto3: +160 ms at import, measured; S3 stores only

        return S3Store(parsed.netloc, parsed.path, s.s3_endpoint, s.s3_region, s.s3_access_key_id, secret)
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.path))
    if parsed.scheme == "" and url.strip():
        return LocalStore(Path(url).expanduser().absolute())
    raise ArtifactError(f"FARM_STORE_URL={url}: farm's model store is file://PATH, a path, or s3://BUCKET[/PREFIX]")


def free_bytes(store: BlobStore) -> int | None:
    """The free space a local store's file system has, bytes; None for a bucket (no such limit)."""
    return store.free_bytes() if isinstance(store, LocalStore) else None
