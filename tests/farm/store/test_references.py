"""A model named by reference: ``store:sha256:HEX`` (already in the model store) and ``s3://BUCKET/KEY`` (only
where the operator allows, FARM_S3_ALLOWED), copied in with its digest computed and checked."""
from __future__ import annotations

import hashlib
import io
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from farm.db.models import ModelArtifact
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.settings import get_settings, reset_settings
from farm.store.backends import open_store
from scheduler.enqueue import submit
from schemas import ProfileRequest
from tests.seaweedfs import SeaweedFS


def _rows() -> dict[str, str]:
    with session_scope() as s:
        return {a.sha256: a.filename for a in s.query(ModelArtifact)}


def test_a_stored_model_is_submitted_again_by_its_digest(sqlite_url: str, example_onnx: Path) -> None:
    first = submit(ProfileRequest(model=str(example_onnx)), send=False).expansion.jobs[0]
    shutil.rmtree(get_settings().cache_dir, ignore_errors=True)  # nothing local: it comes from the store
    again = submit(ProfileRequest(model=f"store:sha256:{first.model_sha256}"), send=False).expansion.jobs[0]
    assert (again.model_sha256, again.model_filename) == (first.model_sha256, first.model_filename)
    assert again.inputs == first.inputs and again.model_format == first.model_format
    assert _rows() == {first.model_sha256: example_onnx.name}


def test_a_bare_blob_in_the_store_is_submitted_by_its_digest(sqlite_url: str, example_onnx: Path) -> None:
    data = example_onnx.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    open_store().put(digest, io.BytesIO(data), len(data))  # put there by an operator, no row yet
    job = submit(ProfileRequest(model=f"store:sha256:{digest}"), send=False).expansion.jobs[0]
    assert job.model_sha256 == digest and _rows() == {digest: "model"}


@pytest.mark.parametrize("ref, message", [("store:sha256:" + "0" * 64, "no such model in the model store"),
                                          ("store:sha256:abc", "not a sha256"),
                                          ("s3://bucket/m.onnx", r"not a location this farm reads models from "
                                                                 r"\(FARM_S3_ALLOWED: none\)")])
def test_a_bad_reference_is_one_line(sqlite_url: str, ref: str, message: str) -> None:
    with pytest.raises(RequestError, match=message) as err:
        submit(ProfileRequest(model=ref), send=False)
    assert "\n" not in str(err.value) and _rows() == {}


def test_an_allowed_s3_object_is_copied_in_and_checked(sqlite_url: str, example_onnx: Path, seaweedfs: SeaweedFS,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"s3://farm-test/refs-{uuid.uuid4().hex[:8]}"
    for key, value in seaweedfs.env("farm-test").items():
        if key != "FARM_STORE_URL":  # the store stays the local default; the S3 endpoint serves the references
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("FARM_S3_ALLOWED", f"s3://other/x, {prefix}")
    reset_settings()
    from farm.store.s3 import S3Store

    s = get_settings()
    bucket: Any = S3Store("farm-test", "", s.s3_endpoint, s.s3_region, s.s3_access_key_id,
                          s.s3_secret_access_key.get_secret_value() if s.s3_secret_access_key else None)
    bucket._ensure_bucket()
    key = prefix.removeprefix("s3://farm-test/") + "/m.onnx"
    bucket.client.put_object(Bucket="farm-test", Key=key, Body=example_onnx.read_bytes())
    job = submit(ProfileRequest(model=f"{prefix}/m.onnx"), send=False).expansion.jobs[0]
    digest = hashlib.sha256(example_onnx.read_bytes()).hexdigest()
    assert job.model_sha256 == digest and _rows() == {digest: "m.onnx"}
    with open_store().get(digest) as blob:
        assert blob.read() == example_onnx.read_bytes()
    for outside in (f"{prefix}x/m.onnx", f"{prefix}/../m.onnx"):
        with pytest.raises(RequestError):
            submit(ProfileRequest(model=outside), send=False)
    with pytest.raises(Exception, match="absent.onnx: no such object"):
        submit(ProfileRequest(model=f"{prefix}/absent.onnx"), send=False)
