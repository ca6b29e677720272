"""``S3Store``: the model store as an S3-compatible bucket (SeaweedFS, MinIO, AWS) through boto3; blobs are objects
``PREFIX/sha256/DIGEST``. A blob is sent as a multipart upload, one ``PART_BYTES`` part in memory at a time and
hashed as it passes; S3 makes the object visible only when the upload completes, which it does only when the sha256
and size match (else, and on any failure or Ctrl-C, the upload is aborted).

A submit's blob (``stage``), whose sha256 it does not know yet: a file is hashed first (a read from the page cache,
far quicker than the store takes the bytes), then, unless the blob is there already (a model submitted again sends
nothing), sent as an upload to the digest's key that ``publish`` completes (no copy; unpublished: aborted). A stream
that cannot be read twice goes to an ``incoming/`` key as it is hashed, then is copied server-side to its digest's
key: on SeaweedFS that copy writes every byte again (benchmarks/store_submit.py: 1.6x boto3's own upload with it,
1.3x without)."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, BinaryIO

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from farm.errors import BlobMissing, StoreUnavailable
from farm.store.checked import CHUNK_BYTES, STALE_PART_S, Checked, check_digest

if TYPE_CHECKING:
    from farm.store.base import Staged

#: one part of a multipart upload, bytes (S3's minimum is 5 MiB for all but the last part)
PART_BYTES = 16 << 20
#: a server-side copy above this is made in parts of this size (S3 copies at most 5 GiB in one request), bytes
COPY_PART_BYTES = 1 << 30
_ABSENT = ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


class _S3Staged:
    """A staged blob of an ``S3Store``: its temporary object's key, sha256 and size (bytes)."""

    def __init__(self, store: S3Store, key: str, digest: str, size: int) -> None:
        self.store, self.key, self.digest, self.size = store, key, digest, size

    def publish(self) -> None:
        """Copy the temporary object to the blob's key, server-side (S3 makes a copy visible whole)."""
        self.store.copy_in(self.key, self.digest)


def _seekable(src: BinaryIO) -> bool:
    """Whether ``src`` can be read twice (a file; a duck-typed stream without ``seekable`` cannot)."""
    seekable = getattr(src, "seekable", None)
    return bool(seekable()) if callable(seekable) else False


class _S3Pending:
    """A file's blob sent to its digest's key as a multipart upload not yet completed (invisible); ``publish``
    completes it, and the stage's end aborts it where nobody did. ``upload`` (its id and parts) None: the blob was
    there already."""

    def __init__(self, store: S3Store, digest: str, size: int, upload: tuple[str, list[dict[str, Any]]] | None) -> None:
        self.store, self.digest, self.size, self.upload = store, digest, size, upload
        self.done = upload is None

    def publish(self) -> None:
        """Complete the upload: S3 makes the object visible whole (kept where a concurrent submit published it)."""
        if self.done or self.upload is None:
            return
        upload_id, parts = self.upload
        with self.store._calls():
            self.store.client.complete_multipart_upload(Bucket=self.store.bucket, Key=self.store.key(self.digest),
                                                        UploadId=upload_id, MultipartUpload={"Parts": parts})
        self.done = True


class S3Store:
    """Blobs as objects ``PREFIX/sha256/DIGEST`` in an S3-compatible bucket (boto3)."""

    def __init__(self, bucket: str, prefix: str = "", endpoint: str | None = None, region: str | None = None,
                 access_key: str | None = None, secret_key: str | None = None) -> None:
        self.bucket, self.prefix, self.endpoint = bucket, prefix.strip("/"), endpoint
        self.url = f"s3://{bucket}" + (f"/{self.prefix}" if self.prefix else "")
        # no CRC32 per request and no SHA-256 payload signature over plain HTTP: each blob's own sha256 is checked
        # as it is sent and before first use; these two added 35 % to an upload to SeaweedFS (17.8 s -> 12.8 s
        # for 200 MiB on the shared 2-core host, boto3's threaded upload_file: 13.9 s)
        config = Config(connect_timeout=5, read_timeout=120, retries={"max_attempts": 3, "mode": "standard"},
                        s3={"addressing_style": "path", "payload_signing_enabled": False},
                        request_checksum_calculation="when_required", response_checksum_validation="when_required")
        self.client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=access_key,
            aws_secret_access_key=secret_key, config=config)
        self._bucket_checked = False
        self._swept = False  # incoming/ swept once per store object (a folder stages many files)

    def key(self, digest: str) -> str:
        """The object key of blob ``digest``."""
        return "/".join(p for p in (self.prefix, "sha256", check_digest(digest)) if p)

    def _down(self, exc: BaseException) -> StoreUnavailable:
        where = f"{self.url} at {self.endpoint}" if self.endpoint else self.url
        return StoreUnavailable(f"the model store {where} cannot be reached ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:160]}); start it, or fix FARM_S3_ENDPOINT, "
                                "FARM_STORE_URL and the S3 credentials")

    @contextmanager
    def _calls(self) -> Iterator[None]:
        """boto3's connection, credential and server errors as StoreUnavailable (one line)."""
        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            raise self._down(exc) from None

    def _ensure_bucket(self) -> None:
        """Create the bucket on first write where it does not exist yet (a fresh SeaweedFS or MinIO)."""
        if self._bucket_checked:
            return
        with self._calls():
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in _ABSENT:
                    raise
                self.client.create_bucket(Bucket=self.bucket)
        self._bucket_checked = True

    def put(self, digest: str, src: BinaryIO, size: int) -> None:
        """Upload ``size`` bytes of ``src`` in ``PART_BYTES`` parts while hashing them; the multipart upload is
        completed (the object appears, whole) only when the sha256 and size match, and aborted otherwise."""
        if self.exists(digest):
            return
        self._ensure_bucket()
        self._upload(self.key(digest), src, Checked(digest, size))

    @contextmanager
    def stage(self, src: BinaryIO, size: int) -> Iterator[Staged]:
        """``size`` bytes of ``src``, invisible until published: a file hashed first, then sent to its digest's
        key unless there already (``_stage_file``); a stream uploaded to a key of its own under ``incoming/``,
        hashed as it passes, deleted at the block's end (published: copied to the digest's key first)."""
        self._ensure_bucket()
        self._sweep_incoming()
        if _seekable(src):
            with self._stage_file(src, size) as pending:
                yield pending
            return
        key = "/".join(p for p in (self.prefix, "incoming", uuid.uuid4().hex) if p)
        check = Checked(None, size)
        try:
            self._upload(key, src, check)
            yield _S3Staged(self, key, check.hexdigest(), size)
        finally:
            self._delete(key)

    @contextmanager
    def _stage_file(self, src: BinaryIO, size: int) -> Iterator[_S3Pending]:
        """Hash ``size`` bytes of ``src``, then (the blob absent) read them again into an upload to the digest's
        key, checked against the first pass (a file that changed in between: DigestMismatch); left uncompleted for
        ``publish``, aborted at the block's end otherwise."""
        start, first = src.tell(), Checked(None, size)
        for _ in first.pieces(src, CHUNK_BYTES):
            pass
        first.verify(src)
        digest = first.hexdigest()
        if self.exists(digest):
            yield _S3Pending(self, digest, size, None)
            return
        src.seek(start)
        key = self.key(digest)
        with self._calls():
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        pending: _S3Pending | None = None
        try:
            parts = self._parts(key, upload_id, src, Checked(digest, size))
            pending = _S3Pending(self, digest, size, (upload_id, parts))
            yield pending
        finally:
            if pending is None or not pending.done:
                self._abort(key, upload_id)

    def _upload(self, key: str, src: BinaryIO, check: Checked) -> None:
        """Send ``src`` to object ``key`` as a multipart upload, completed only when ``check`` passes (S3 makes
        the object visible only then, whole); aborted on any failure, Ctrl-C included."""
        with self._calls():
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = self._parts(key, upload_id, src, check)
            with self._calls():
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                      MultipartUpload={"Parts": parts})
        except BaseException:
            self._abort(key, upload_id)
            raise

    def _parts(self, key: str, upload_id: str, src: BinaryIO, check: Checked) -> list[dict[str, Any]]:
        """Send ``src`` as the upload's parts, one ``PART_BYTES`` buffer in memory at a time; their list."""
        parts = list[dict[str, Any]]()
        for part in check.pieces(src, PART_BYTES, at_least_one=True):
            with self._calls():
                etag = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                               PartNumber=len(parts) + 1, Body=part)["ETag"]
            parts.append({"ETag": etag, "PartNumber": len(parts) + 1})
        check.verify(src)
        return parts

    def copy_in(self, key: str, digest: str) -> None:
        """Copy object ``key`` to blob ``digest``'s key, server-side (no byte through this process; above
        ``COPY_PART_BYTES`` in parts, as S3 copies at most 5 GiB in one request); kept where it is there."""
        if self.exists(digest):
            return
        config = TransferConfig(multipart_threshold=COPY_PART_BYTES, multipart_chunksize=COPY_PART_BYTES,
                                max_concurrency=4, use_threads=True)
        with self._calls():
            self.client.copy({"Bucket": self.bucket, "Key": key}, self.bucket, self.key(digest), Config=config)

    def _delete(self, key: str) -> None:
        """Delete object ``key`` (best effort: a store that went down keeps it, under ``incoming/``, never a
        blob; ``_sweep_incoming`` removes it later)."""
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError):
            pass

    def _sweep_incoming(self) -> None:
        """Delete the ``incoming/`` objects and abort the uploads (there and under ``sha256/``) that killed submits
        left (SIGKILL: no cleanup ran), once older than ``STALE_PART_S`` (one listing of each, at most 1000
        entries, at the first stage)."""
        if self._swept:
            return
        prefix = "/".join(p for p in (self.prefix, "incoming", "") if p)
        cutoff = datetime.now(UTC) - timedelta(seconds=STALE_PART_S)
        with self._calls():
            listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix).get("Contents", [])
            uploads = [up for where in (prefix, self.key("0" * 64)[:-64])  # incoming/ and sha256/
                       for up in self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=where)
                       .get("Uploads", [])]
        for obj in listed:
            if obj["LastModified"] < cutoff:
                self._delete(obj["Key"])
        for up in uploads:
            if up["Initiated"] < cutoff:
                self._abort(up["Key"], up["UploadId"])
        self._swept = True

    def _abort(self, key: str, upload_id: str) -> None:
        """Drop an unfinished upload's parts (best effort: a store that went down keeps them, never visible)."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except (BotoCoreError, ClientError):
            pass

    def _head(self, digest: str) -> dict[str, Any] | None:
        with self._calls():
            try:
                head: dict[str, Any] = self.client.head_object(Bucket=self.bucket, Key=self.key(digest))
                return head
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _ABSENT:
                    return None
                raise

    def get(self, digest: str) -> AbstractContextManager[BinaryIO]:
        """The object's body, streamed; BlobMissing when it is absent."""
        return self.open_key(self.key(digest), f"model {digest[:12]} is not in the model store {self.url}; "
                                                "submit it again")

    @contextmanager
    def open_key(self, key: str, missing: str) -> Iterator[BinaryIO]:
        """The body of object ``key`` of the bucket, streamed; BlobMissing (message ``missing``) when it is
        absent."""
        with self._calls():
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _ABSENT:
                    raise BlobMissing(missing) from None
                raise
        try:
            with self._calls():
                yield body
        finally:
            body.close()

    def exists(self, digest: str) -> bool:
        """Whether object ``digest`` is published."""
        return self._head(digest) is not None

    def size(self, digest: str) -> int | None:
        """The published object's size, bytes; None when absent."""
        head = self._head(digest)
        return None if head is None else int(head["ContentLength"])
