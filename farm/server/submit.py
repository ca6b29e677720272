"""An idempotent submit through the API.

The client makes up an id for each submission (``client_id``, a UUID) and sends it with every try. The request's
id is derived from the caller and that id (``request_id_for``), so a submit repeated after a lost answer or a
server restart finds the request the first try stored instead of storing a second one; and one transaction
stores the model, the request, its owner, its jobs and the audit line (``scheduler.enqueue.submit``), so a
crash in the middle leaves nothing. Two tries racing each other: the second one's insert fails on the primary
key and it answers with the first one's request.

Paths in a request are the submitter's, not the server's: the model and the input data file come as uploads
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
    llm = req.measurement.llm
    if llm is not None and (llm.prompts or llm.tokenizer):
        raise RequestError("request.measurement.llm: prompt and tokenizer files are not uploaded through the API yet; "
                           "submit on a host with the database, or use generated prompts")
    update: dict[str, Any] = {}
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
    """The stored request names its model as the submitter did (``mlp.onnx``), not by the server's upload path
    (reports and the web view show it; workers fetch the model from the store by its sha256; an input data
    file is kept by its name already, ``farm.input_data.resolve_input_data``)."""
    if body.request.model is None:
        return
    with session_scope() as s:
        req = s.get(Request, request_id)
        if req is not None:
            req.spec = {**req.spec, "model": body.request.model}
