"""``S3Store``: the model store as an S3-compatible bucket (SeaweedFS, MinIO, AWS) through boto3; blobs are objects
``PREFIX/sha256/DIGEST``. A blob is sent as a multipart upload, one ``PART_BYTES`` part in memory at a time and
hashed as it passes; S3 makes the object visible only when the upload completes, which it does only when the sha256
and size match (else, and on any failure or Ctrl-C, the upload is aborted)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from farm.errors import BlobMissing, StoreUnavailable
from farm.store.checked import Checked, check_digest

#: one part of a multipart upload, bytes (S3's minimum is 5 MiB for all but the last part)
PART_BYTES = 16 << 20
_ABSENT = ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


class S3Store:
    """Blobs as objects ``PREFIX/sha256/DIGEST`` in an S3-compatible bucket (boto3)."""

    def __init__(self, bucket: str, prefix: str = "", endpoint: str | None = None, region: str | None = None,
                 access_key: str | None = None, secret_key: str | None = None) -> None:
        self.bucket, self.prefix, self.endpoint = bucket, prefix.strip("/"), endpoint
        self.url = f"s3://{bucket}" + (f"/{self.prefix}" if self.prefix else "")
        config = Config(connect_timeout=5, read_timeout=120, retries={"max_attempts": 3, "mode": "standard"},
                        s3={"addressing_style": "path"})
        self.client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=region, aws_access_key_id=access_key,
            aws_secret_access_key=secret_key, config=config)
        self._bucket_checked = False

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
        key = self.key(digest)
        if self.exists(digest):
            return
        self._ensure_bucket()
        with self._calls():
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts = self._parts(digest, key, upload_id, src, size)
            with self._calls():
                self.client.complete_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                                      MultipartUpload={"Parts": parts})
        except BaseException:
            self._abort(key, upload_id)
            raise

    def _parts(self, digest: str, key: str, upload_id: str, src: BinaryIO, size: int) -> list[dict[str, Any]]:
        """Send ``src`` as the upload's parts, one ``PART_BYTES`` buffer in memory at a time; their list."""
        check, parts = Checked(digest, size), list[dict[str, Any]]()
        for part in check.pieces(src, PART_BYTES, at_least_one=True):
            with self._calls():
                etag = self.client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                               PartNumber=len(parts) + 1, Body=part)["ETag"]
            parts.append({"ETag": etag, "PartNumber": len(parts) + 1})
        check.verify(src)
        return parts

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
