"""An idempotent submit through the API.

The client makes up an id for each submission (``client_id``, a UUID) and sends it with every try. The request's
id is derived from the caller and that id (``request_id_for``), so a submit repeated after a lost answer or a
server restart finds the request the first try stored instead of storing a second one; and one transaction
stores the model, the request, its owner, its jobs and the audit line (``scheduler.enqueue.submit``), so a
crash in the middle leaves nothing. Two tries racing each other: the second one's insert fails on the primary
key and it answers with the first one's request.

Paths in a request are the submitter's, not the server's: the model (a file, or a folder put together from its
files' uploads), the input data file and an LLM workload's prompt, trace and tokenizer files come as uploads
(``farm.server.uploads``), and a request naming any other file on the server is refused.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError

from farm.cli.llm_options import attach_for
from farm.db.models import Job, Request, RequestOwner
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.identity import Principal
from farm.server import uploads
from farm.store.base import is_reference
from scheduler.enqueue import submit
from scheduler.fairshare import release
from schemas import ProfileRequest
from schemas.llm import WorkloadKind
from schemas.request import MeasurementSettings
from workers.engines.triton import attach

log = logging.getLogger("farm.server")
#: request ids derived from (identity, client id): a fixed namespace, so every server derives the same
NAMESPACE = uuid.UUID("5b0f2f7e-4d0e-4c43-9a53-43a1f0a6b9d2")


class SubmitBody(BaseModel):
    """``POST /api/v1/requests``: the request, the idempotency key and the uploads it uses."""

    client_id: str = Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$",
                           description="the submitter's id for this submission (a UUID); the same on every retry")
    request: ProfileRequest
    model_upload: str | None = Field(default=None, description="sha256 of the uploaded model file")
    input_data_upload: str | None = Field(default=None, description="sha256 of the uploaded input data file")
    workload_uploads: dict[WorkloadKind, str] = Field(
        default_factory=dict, description="the upload of each file the LLM workload names (prompts, trace, tokenizer): "
        "a file's sha256 (PUT /uploads/NAME) or a folder's id (POST /folders)")


class FolderBody(BaseModel):
    """``POST /api/v1/folders``: a folder (a Hugging Face model, a tokenizer's folder) from its files' uploads."""

    name: str = Field(min_length=1, max_length=200, description="the folder's name (the model's name in results)")
    files: dict[str, str] = Field(description="each file's path inside the folder (a/b.json) -> the sha256 its PUT "
                                  "/uploads/NAME answered")


@dataclass
class Submitted:
    """What a submit answers: the request, its job count, left-out combinations, and whether it existed."""

    request_id: str
    jobs: int
    excluded: list[Any]
    existing: bool


def request_id_for(who: Principal, client_id: str) -> str:
    """The request id of submission ``client_id`` by ``who`` (the same on every try; distinct per identity)."""
    return str(uuid.uuid5(NAMESPACE, f"{who.name}\0{client_id}"))


def _existing(who: Principal, request_id: str) -> Submitted | None:
    with session_scope() as s:
        req = s.get(Request, request_id)
        if req is None:
            return None
        owner = s.get(RequestOwner, request_id)
        if owner is None or owner.owner != who.name:  # a uuid5 collision with another's: not theirs to see
            raise RequestError("client_id: this id names another submission; make up a new UUID")
        jobs = s.query(Job).filter(Job.request_id == request_id).count()
        return Submitted(request_id, jobs, list(req.excluded or []), True)


def _server_request(who: Principal, body: SubmitBody) -> ProfileRequest:
    """The request with the uploads' paths on this server in place of the submitter's paths."""
    req = body.request
    update: dict[str, Any] = {}
    measurement = _workload_files(who, body)
    if measurement is not None:
        update["measurement"] = measurement
    if req.endpoint is None and req.model is not None and is_reference(req.model):
        if body.model_upload is not None:
            raise RequestError("model_upload: a model named by reference (store:sha256:..., s3://...) has no upload")
    elif req.endpoint is None:
        if body.model_upload is None:
            raise RequestError("model_upload: a model file request needs its upload (PUT /api/v1/uploads/NAME)")
        update["model"] = str(uploads.path_of(who.name, body.model_upload))
    elif body.model_upload is not None:
        raise RequestError("model_upload: an endpoint request has no model file")
    data = req.input_data
    if data is not None and data.kind == "file" and data.arrays is None:
        if body.input_data_upload is None:
            raise RequestError("input_data_upload: an input data file needs its upload (PUT /api/v1/uploads/NAME)")
        source = uploads.path_of(who.name, body.input_data_upload)
        update["input_data"] = data.model_copy(update={"source": str(source)})
    return req.model_copy(update=update)


def _workload_files(who: Principal, body: SubmitBody) -> MeasurementSettings | None:
    """The request's measurement with each LLM workload file's path on this server in place of the submitter's
    (None: it names none); RequestError for a file without its upload, an upload without its file, or a stored
    file's reference (a submitter names only what it uploaded)."""
    llm = body.request.measurement.llm
    given = {str(k): v for k, v in body.workload_uploads.items()}
    paths: dict[str, str] = {}
    for kind, value in (llm.files() if llm is not None else {}).items():
        if not isinstance(value, str):
            raise RequestError(f"request.measurement.llm.{kind}: a stored file's reference is not taken over the API; "
                               "upload the file and name it in workload_uploads")
        upload = given.pop(kind, None)
        if upload is None:
            raise RequestError(f"workload_uploads.{kind}: the request's {kind} file needs its upload (PUT "
                               "/api/v1/uploads/NAME; a folder: POST /api/v1/folders)")
        paths[kind] = str(uploads.path_of(who.name, upload))
    if given:
        raise RequestError(f"workload_uploads: {', '.join(given)} given, but the request names no such file")
    if llm is None or not paths:
        return None
    return body.request.measurement.model_copy(update={"llm": llm.model_copy(update=paths)})


def submit_request(who: Principal, body: SubmitBody) -> Submitted:
    """Store (or find again) ``who``'s submission ``body``; its held jobs are released at once where there is
    room (``scheduler.fairshare.release``)."""
    rid = request_id_for(who, body.client_id)
    found = _existing(who, rid)
    if found is not None:
        return found
    request = _server_request(who, body)
    for attempt in range(3):
        try:
            sub = submit(request, attach=attach_for(request, attach), owner=who, request_id=rid,
                         client_id=body.client_id)
            break
        except IntegrityError:
            again = _existing(who, rid)  # the same submission, stored by a concurrent try a moment ago
            if again is not None:
                return again
            if attempt == 2:  # else: the same model stored by another submit at the same moment: now it is there
                raise
    _name_as_submitted(sub.request_id, body)
    try:
        release()
    except Exception as exc:  # the scheduler's next pass releases them
        log.warning("release after submit failed (%s: %s)", type(exc).__name__, exc)
    return Submitted(sub.request_id, len(sub.expansion.jobs), list(sub.expansion.excluded), False)




def _name_as_submitted(request_id: str, body: SubmitBody) -> None:
    """The stored request names its model and its workload files as the submitter did (``mlp.onnx``), not by the
    server's upload paths (reports and the web view show them; workers fetch both from the store by their sha256;
    an input data file is kept by its name already, ``farm.input_data.resolve_input_data``). Its jobs are held
    until ``release``, so none has been sent with the server's paths."""
    llm = body.request.measurement.llm
    labels = {k: v for k, v in (llm.files() if llm is not None else {}).items() if isinstance(v, str)}
    with session_scope() as s:
        req = s.get(Request, request_id)
        if req is None:
            return
        if body.request.model is not None:
            req.spec = {**req.spec, "model": body.request.model}
        if labels:
            req.spec = _relabelled(req.spec, labels)
            for job in s.query(Job).filter(Job.request_id == request_id):
                job.spec = _relabelled(job.spec, labels)


def _relabelled(spec: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """``spec`` (a request's or a job's) with its workload files' labels set to ``labels`` (by kind)."""
    measurement = dict(spec.get("measurement") or {})
    llm = dict(measurement.get("llm") or {})
    for kind, label in labels.items():
        if isinstance(llm.get(kind), dict):
            llm[kind] = {**llm[kind], "label": label}
    return {**spec, "measurement": {**measurement, "llm": llm}}
