"""Streams checked as they are stored: a blob's bytes hashed and counted in fixed pieces (``Checked``), shared by
every backend of ``farm.store.backends`` (``LocalStore``, ``farm.store.s3.S3Store``)."""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import BinaryIO

from farm.errors import ArtifactError, DigestMismatch

#: the read/write piece of a local copy and of hashing, bytes
CHUNK_BYTES = 1 << 20
#: a temporary file or object older than this is a killed upload's (SIGKILL: no cleanup ran), removed, s
STALE_PART_S = 86400.0
_SHA = re.compile(r"^[0-9a-f]{64}$")


def check_digest(digest: str) -> str:
    """``digest`` when it is a sha256 (64 lowercase hex digits); ArtifactError otherwise."""
    if not _SHA.match(digest):
        raise ArtifactError(f"{digest!r} is not a sha256 (64 lowercase hex digits)")
    return digest


class Checked:
    """The pieces of a stream being stored, hashed and counted as they pass, and the check that they were the
    ``size`` bytes of sha256 ``digest`` (DigestMismatch: nothing may be published). ``digest`` None: not known
    yet (a submit hashes while it stores, ``BlobStore.stage``): only the size is checked, ``hexdigest`` tells."""

    def __init__(self, digest: str | None, size: int) -> None:
        self.digest, self.size, self.read, self.hash = digest, size, 0, hashlib.sha256()

    def hexdigest(self) -> str:
        """The sha256 of the bytes that passed so far."""
        return self.hash.hexdigest()

    def pieces(self, src: BinaryIO, piece: int, at_least_one: bool = False) -> Iterator[bytes]:
        """``src``'s bytes up to ``size``, in pieces of at most ``piece`` bytes (one empty piece for an empty
        stream where ``at_least_one``: an S3 upload has at least one part)."""
        sent = False
        while self.read < self.size:
            chunk = src.read(min(piece, self.size - self.read))
            if not chunk:
                break
            self.hash.update(chunk)
            self.read += len(chunk)
            sent = True
            yield chunk
        if at_least_one and not sent:
            yield b""

    def verify(self, src: BinaryIO) -> None:
        """DigestMismatch unless exactly ``size`` bytes of sha256 ``digest`` passed and ``src`` is at its end."""
        more = bool(src.read(1))
        got = self.hash.hexdigest()
        if more or self.read != self.size or got != (self.digest or got):
            what = f"more than {self.size} bytes" if more else f"{self.read} bytes, not {self.size}" \
                if self.read != self.size else f"sha256 {got[:12]}"
            stored = f"stored as {self.digest[:12]}" if self.digest else "being stored"
            raise DigestMismatch(f"the bytes {stored} are not it ({what}): the model changed while it was stored, "
                                 "or the reference names another; submit it again")
