"""The model store's backends against real storage: a local folder and a real SeaweedFS (S3 API). A blob is
published whole or not at all: a wrong digest or size, Ctrl-C or SIGKILL mid-upload leave nothing visible; a store
that is down is one line saying which store to start."""
from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from farm.errors import ArtifactError, BlobMissing, DigestMismatch, StoreUnavailable
from farm.settings import Settings
from farm.store.backends import CHUNK_BYTES, STALE_PART_S, LocalStore, open_store
from farm.store.base import BlobStore
from tests.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedFS


def _s3(seaweedfs: SeaweedFS) -> BlobStore:
    """A store of its own: a fresh prefix of the session's bucket (SeaweedFS gives each bucket its own volumes)."""
    env = seaweedfs.env(f"farm-test/t-{uuid.uuid4().hex[:12]}")
    return open_store(Settings(**{k[5:].lower(): v for k, v in env.items()}))


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    """Each backend: a local folder, and a fresh prefix in the session's SeaweedFS."""
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return _s3(request.getfixturevalue("seaweedfs"))


def _blob(size: int, seed: int = 0) -> tuple[bytes, str]:
    data = os.urandom(size) if seed == 0 else bytes([seed % 256]) * size
    return data, hashlib.sha256(data).hexdigest()


def _read(store: BlobStore, digest: str) -> bytes:
    with store.get(digest) as src:
        return src.read()


@pytest.mark.parametrize("size", [0, 1, 3 * CHUNK_BYTES + 17, 17 << 20])
def test_put_get_exists_size(store: BlobStore, size: int) -> None:
    """Round trip, in several chunks (and, on S3, several parts of a multipart upload: 17 MiB)."""
    data, digest = _blob(size)
    assert not store.exists(digest) and store.size(digest) is None
    store.put(digest, io.BytesIO(data), size)
    assert store.exists(digest) and store.size(digest) == size
    assert _read(store, digest) == data
    store.put(digest, io.BytesIO(data), size)  # content-addressed: a second put is a no-op
    assert _read(store, digest) == data


def test_a_missing_blob_is_blob_missing(store: BlobStore) -> None:
    with pytest.raises(BlobMissing, match="not in the model store"), store.get("0" * 64):
        pass


@pytest.mark.parametrize("how", ["digest", "short", "long"])
def test_wrong_bytes_publish_nothing(store: BlobStore, how: str) -> None:
    data, digest = _blob(2 * CHUNK_BYTES + 5)
    other, _ = _blob(len(data), seed=7)
    src, size = {"digest": (other, len(data)), "short": (data[:-1], len(data)), "long": (data, len(data) - 1)}[how]
    with pytest.raises(DigestMismatch) as err:
        store.put(digest, io.BytesIO(src), size)
    assert "\n" not in str(err.value) and "submit it again" in str(err.value)
    assert not store.exists(digest)
    _nothing_pending(store, digest)


def _nothing_pending(store: BlobStore, digest: str) -> None:
    """No temporary file (local) or unfinished multipart upload (S3) left for ``digest``."""
    if isinstance(store, LocalStore):
        assert [p.name for p in store.path(digest).parent.glob("*")] == []
    else:
        s3: Any = store
        uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])
        assert [u["Key"] for u in uploads if u["Key"] == s3.key(digest)] == []


class _Interrupted(io.RawIOBase):
    """A stream that raises KeyboardInterrupt (Ctrl-C) after ``after`` bytes."""

    def __init__(self, data: bytes, after: int) -> None:
        self.src, self.after = io.BytesIO(data), after

    def read(self, n: int = -1) -> bytes:
        if self.src.tell() >= self.after:
            raise KeyboardInterrupt
        return self.src.read(n)


def test_ctrl_c_mid_upload_leaves_nothing_visible(store: BlobStore) -> None:
    data, digest = _blob(18 << 20)
    src: Any = _Interrupted(data, 17 << 20)  # on S3: after its first part is sent
    with pytest.raises(KeyboardInterrupt):
        store.put(digest, src, len(data))
    assert not store.exists(digest) and store.size(digest) is None
    _nothing_pending(store, digest)


_KILLED = """
import sys, time
from farm.settings import Settings
from farm.store.backends import open_store
class Slow:
    sent = 0
    def read(self, n):
        if self.sent >= 20 << 20:
            print("sent", flush=True)
            time.sleep(600)
        self.sent += n
        return b"x" * n
store = open_store(Settings(store_url=sys.argv[1], s3_endpoint=sys.argv[2] or None, s3_region="us-east-1",
                            s3_access_key_id="k", s3_secret_access_key="s"))
if sys.argv[3] == "put":
    store.put("ab" * 32, Slow(), 64 << 20)
else:
    with store.stage(Slow(), 64 << 20) as staged:
        staged.publish()
"""


@pytest.mark.parametrize("how", ["put", "stage"])
def test_sigkill_mid_upload_leaves_nothing_visible(store: BlobStore, how: str) -> None:
    """A submit killed (SIGKILL: no cleanup runs) after 20 MiB were sent: no blob is visible."""
    s3: Any = store
    url, endpoint = (store.url, "") if isinstance(store, LocalStore) else (store.url, s3.endpoint)
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, url, endpoint, how], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"sent\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not store.exists("ab" * 32) and store.size("ab" * 32) is None and _blobs(store) == []
    with pytest.raises(BlobMissing), store.get("ab" * 32):
        pass
    if isinstance(store, LocalStore) and how == "stage":  # its temporary file goes once stale, at the next stage
        parts = _incoming(store)
        assert len(parts) == 1
        os.utime(store.root / "incoming" / parts[0], (time.time() - STALE_PART_S - 1,) * 2)
        with store.stage(io.BytesIO(b"x"), 1):
            pass
        assert _incoming(store) == []
    if isinstance(store, LocalStore) and how == "put":  # the killed upload's temporary file goes once stale
        parts = list(store.path("ab" * 32).parent.glob(".*.part"))
        assert len(parts) == 1
        os.utime(parts[0], (time.time() - STALE_PART_S - 1,) * 2)
        with pytest.raises(DigestMismatch):  # an upload into the same folder (its bytes wrong: it leaves none)
            store.put("ab" * 32, io.BytesIO(b"x"), 1)
        assert list(store.path("ab" * 32).parent.glob(".*.part")) == []


def _blobs(store: BlobStore) -> list[str]:
    """The names of every published blob."""
    if isinstance(store, LocalStore):
        return [p.name for p in (store.root / "sha256").rglob("*") if p.is_file() and not p.name.startswith(".")]
    s3: Any = store
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=f"{s3.prefix}/sha256/").get("Contents", [])
    return [o["Key"].rsplit("/", 1)[-1] for o in listed]


def _incoming(store: BlobStore) -> list[str]:
    """What staged uploads left: temporary files (local), or objects under incoming/ and unfinished uploads
    anywhere (S3)."""
    if isinstance(store, LocalStore):
        return sorted(p.name for p in (store.root / "incoming").glob("*"))
    s3: Any = store
    prefix = f"{s3.prefix}/incoming/"
    listed = s3.client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])
    uploads = s3.client.list_multipart_uploads(Bucket=s3.bucket, Prefix=f"{s3.prefix}/").get("Uploads", [])
    return sorted([o["Key"] for o in listed] + [u["Key"] for u in uploads])


@pytest.mark.parametrize("size", [0, 3 * CHUNK_BYTES + 17, 17 << 20])
def test_stage_hashes_while_writing_and_publishes_by_digest(store: BlobStore, size: int) -> None:
    """A submit's one pass: the bytes are written under a temporary name as they are hashed, invisible until
    published under their digest; staging them again publishes nothing new and leaves no temporary behind."""
    data, digest = _blob(size)
    with store.stage(io.BytesIO(data), size) as staged:
        assert (staged.digest, staged.size) == (digest, size)
        assert not store.exists(digest) and _blobs(store) == []
        staged.publish()
        assert store.exists(digest) and store.size(digest) == size
    assert _read(store, digest) == data and _incoming(store) == []
    with store.stage(io.BytesIO(data), size) as again:
        again.publish()
    assert _blobs(store) == [digest] and _read(store, digest) == data and _incoming(store) == []


def test_staged_bytes_not_published_leave_nothing(store: BlobStore) -> None:
    """A request refused after its model was staged (or a wrong size, or Ctrl-C mid-stage): no blob, no
    temporary file or object."""
    data, digest = _blob(2 * CHUNK_BYTES + 5)
    with store.stage(io.BytesIO(data), len(data)) as staged:
        assert staged.digest == digest
    with pytest.raises(RuntimeError), store.stage(io.BytesIO(data), len(data)):
        raise RuntimeError("refused")
    for src, size in ((data[:-1], len(data)), (data, len(data) - 1)):
        with pytest.raises(DigestMismatch, match="being stored .*submit it again"), \
                store.stage(io.BytesIO(src), size):
            pass
    with pytest.raises(KeyboardInterrupt), store.stage(_Interrupted(_blob(18 << 20)[0], 17 << 20), 18 << 20):  # type: ignore[arg-type]
        pass
    assert not store.exists(digest) and _blobs(store) == [] and _incoming(store) == []


def test_s3_publishes_a_large_staged_blob_by_a_copy_in_parts(seaweedfs: SeaweedFS,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Above COPY_PART_BYTES (S3 copies at most 5 GiB in one request) the server-side copy goes in parts; a
    stale leftover of a killed submit under incoming/ (an object, an unfinished upload) goes at the next stage."""
    import farm.store.s3 as s3mod

    store: Any = _s3(seaweedfs)
    monkeypatch.setattr(s3mod, "COPY_PART_BYTES", 5 << 20)
    data, digest = _blob(17 << 20)
    with store.stage(_Piped(data), len(data)) as staged:  # read once: sent to incoming/, then copied
        staged.publish()
    assert _read(store, digest) == data and _incoming(store) == []
    store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/incoming/left", Body=b"x")
    store.client.create_multipart_upload(Bucket=store.bucket, Key=f"{store.prefix}/incoming/half")
    assert len(_incoming(store)) == 2
    monkeypatch.setattr(s3mod, "STALE_PART_S", -60.0)  # everything is stale
    later = s3mod.S3Store(store.bucket, store.prefix, store.endpoint, "us-east-1", ACCESS_KEY, SECRET_KEY)
    with later.stage(io.BytesIO(b"y"), 1):  # a later submit's store: it sweeps at its first stage
        pass
    assert _incoming(store) == []


class _Piped(io.RawIOBase):
    """A stream read once, front to back (an upload from a pipe or a socket): not seekable."""

    def __init__(self, data: bytes) -> None:
        self.src = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self.src.read(n)


def test_s3_stages_a_file_hashed_first_sending_nothing_it_has(seaweedfs: SeaweedFS,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A file (seekable) is hashed first, then sent straight to its digest's key as an upload that publish
    completes: no incoming/ object, no server-side copy; staged again, not one byte is sent; a file that changes
    between the two reads is refused and leaves nothing."""
    store: Any = _s3(seaweedfs)
    calls: list[str] = []
    for name in ("upload_part", "copy", "copy_object", "upload_part_copy"):
        real = getattr(store.client, name)
        monkeypatch.setattr(store.client, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
    data, digest = _blob(17 << 20)
    with store.stage(io.BytesIO(data), len(data)) as staged:
        assert staged.digest == digest and not store.exists(digest) and _blobs(store) == []
        staged.publish()
    assert _read(store, digest) == data and _incoming(store) == []
    assert calls == ["upload_part"] * 2  # two 16 MiB parts, nothing copied
    calls.clear()
    with store.stage(io.BytesIO(data), len(data)) as again:
        assert again.digest == digest
        again.publish()
    assert calls == [] and _blobs(store) == [digest]

    class Changing(io.BytesIO):
        """A file rewritten between the hash pass and the upload."""

        def seek(self, pos: int, whence: int = 0) -> int:
            self.getbuffer()[0] ^= 1
            return super().seek(pos, whence)

    other, other_digest = _blob(3 << 20, seed=5)
    with pytest.raises(DigestMismatch), store.stage(Changing(other), len(other)) as changed:
        changed.publish()
    assert not store.exists(other_digest) and _blobs(store) == [digest] and _incoming(store) == []


def test_a_store_that_is_down_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    down = open_store(Settings(store_url="s3://models", s3_endpoint=f"http://127.0.0.1:{port}", s3_region="us-east-1",
                               s3_access_key_id="k", s3_secret_access_key="s"))
    data, digest = _blob(10)
    def stage() -> None:
        with down.stage(io.BytesIO(data), 10):
            pass

    for call in (lambda: down.put(digest, io.BytesIO(data), 10), lambda: down.exists(digest), stage):
        with pytest.raises(StoreUnavailable) as err:
            call()
        msg = str(err.value)
        assert "\n" not in msg and f"127.0.0.1:{port}" in msg and "start it" in msg and "FARM_S3_ENDPOINT" in msg
    (tmp_path / "file").write_text("not a folder")
    unwritable = LocalStore(tmp_path / "file" / "store")
    with pytest.raises(StoreUnavailable, match=r"cannot be written .*FARM_STORE_URL"):
        unwritable.put(digest, io.BytesIO(data), 10)


def test_open_store_chooses_by_url(tmp_path: Path) -> None:
    home = tmp_path / "home"
    default = open_store(Settings(home=home))
    assert isinstance(default, LocalStore) and default.root == home / "store"
    assert open_store(Settings(store_url=f"file://{tmp_path}/v")).url == f"file://{tmp_path}/v"
    assert open_store(Settings(store_url=str(tmp_path / "shared"))).url == f"file://{tmp_path}/shared"
    s3: Any = open_store(Settings(store_url="s3://bucket/models/", s3_endpoint="http://127.0.0.1:1", s3_region="x"))
    assert (s3.url, s3.key("a" * 64)) == ("s3://bucket/models", f"models/sha256/{'a' * 64}")
    for bad in ("gs://bucket", "s3://"):
        with pytest.raises(ArtifactError, match="FARM_STORE_URL"):
            open_store(Settings(store_url=bad))


def test_s3_credentials_come_from_the_settings_or_aws_variables(seaweedfs: SeaweedFS,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Without FARM_S3_* credentials, boto3's own chain (AWS_ACCESS_KEY_ID...) signs the requests."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env-secret")
    url = f"s3://farm-test/t-{uuid.uuid4().hex[:12]}"
    store: Any = open_store(Settings(store_url=url, s3_endpoint=seaweedfs.endpoint, s3_region="us-east-1"))
    assert store.client._request_signer._credentials.access_key == "from-env"
    data, digest = _blob(100)
    store.put(digest, io.BytesIO(data), 100)
    assert _read(store, digest) == data
