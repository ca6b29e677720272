"""The JSON API, ``/api/v1``: every route authenticated by an HTTP Bearer token (``farm.identity``), reads
limited by ``FARM_READ_SCOPE``, changes limited to the owner or an admin and audited."""
from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import delete

from farm import lifecycle
from farm.db.models import Request as RequestRow
from farm.db.models import utcnow
from farm.db.session import session_scope
from farm.errors import RequestError
from farm.identity import Principal, audit, authenticate, check_write, owner_of
from farm.payloads import CancelAnswer, DeleteAnswer, FolderAnswer, UploadAnswer
from farm.readers import export
from farm.readers.knee import knees
from farm.readers.results import (
    job_times,
    model_static_metrics,
    request_slo,
    result_rows,
    waiting_queues,
    workers_table,
)
from farm.server import access, serialize, uploads
from farm.server.submit import FolderBody, SubmitBody, submit_request
from scheduler.reconcile import cancel_request
from scheduler.search import search_report

router = APIRouter(prefix="/api/v1")
_bearer = HTTPBearer(auto_error=False, description="an API token from `farm token create`")


def principal(cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    """The caller, from its Bearer token (AuthError: 401)."""
    with session_scope() as s:
        return authenticate(s, cred.credentials if cred else None)


Who = Annotated[Principal, Depends(principal)]


@router.get("/whoami")
def whoami(who: Who) -> dict[str, Any]:
    """The caller's identity."""
    return serialize.obj(who)


@router.put("/uploads/{filename}", status_code=status.HTTP_201_CREATED, response_model=None)
async def upload(filename: str, request: Request, who: Who) -> UploadAnswer:
    """Stream a model or data file (the raw body) to the server; answers its sha256, which a submit names."""
    sha, size = await uploads.receive(who.name, filename, request.stream())
    return UploadAnswer(upload=sha, size_bytes=size, filename=filename)


@router.post("/folders", status_code=status.HTTP_201_CREATED, response_model=None)
def folder(body: FolderBody, who: Who) -> FolderAnswer:
    """Put a folder together from files uploaded before (``PUT /uploads/NAME`` each); answers its upload id, which
    a submit names like a file's (``model_upload``, ``workload_uploads``)."""
    sha, size = uploads.assemble(who.name, body.name, body.files)
    return FolderAnswer(upload=sha, size_bytes=size, files=len(body.files), name=body.name)


@router.post("/requests", status_code=status.HTTP_201_CREATED)
def submit(body: SubmitBody, who: Who, response: Response) -> dict[str, Any]:
    """Submit a request (idempotent by ``client_id``: 200 with ``existing: true`` when it was stored before)."""
    done = submit_request(who, body)
    if done.existing:
        response.status_code = status.HTTP_200_OK
    return serialize.obj(done)


@router.get("/requests")
def list_requests(who: Who, limit: Annotated[int, Query(ge=1, le=500)] = 20) -> list[dict[str, Any]]:
    """The newest requests the caller may read, with their owners and job counts by status."""
    return serialize.rows(access.recent(who, limit))


@router.get("/requests/{ref}")
def show_request(ref: str, who: Who) -> dict[str, Any]:
    """One request: owner, job counts, every job (status, coordinates, start and end), searches, waiting queues."""
    req = access.resolve(who, ref)
    rows = result_rows(req.id)
    with session_scope() as s:
        owner = owner_of(s, req.id)
    times = {j: {"started_at": a, "finished_at": b} for j, (a, b) in job_times(req.id).items()}
    return serialize.obj({
        "request_id": req.id, "name": req.name, "created_at": req.created_at,
        "owner": owner.owner if owner else None, "team": owner.team if owner else None,
        "counts": dict(Counter(str(r["status"]) for r in rows)), "waiting": waiting_queues(req.id),
        "searches": search_report(req.id),
        "knees": [k.as_json(label) for label, k in knees(rows)], "rows": rows, "times": times})


@router.get("/requests/{ref}/results")
def results(ref: str, who: Who) -> dict[str, Any]:
    """The request's result rows (``farm.readers.results.result_rows``), its SLO and the model's static metrics:
    what the CLI's tables, reports and comparisons are made from."""
    req = access.resolve(who, ref)
    return {"request_id": req.id, "rows": serialize.rows(result_rows(req.id)), "slo": request_slo(req),
            "static": serialize.jsonable(model_static_metrics(req.model_sha256))}


@router.get("/requests/{ref}/export", response_class=Response)
def export_results(ref: str, who: Who, fmt: Annotated[str, Query(alias="format")] = "csv") -> Response:
    """The export (``farm results --format csv|json|parquet``): every coordinate and metric column."""
    req = access.resolve(who, ref)
    return export_response(req.id, fmt)


def export_response(request_id: str, fmt: str) -> Response:
    """An export file of the request as an HTTP answer (Parquet through a temporary file)."""
    if fmt not in export.FORMATS:
        raise RequestError(f"format: {fmt!r} is unknown; use one of {', '.join(export.FORMATS)}")
    rows = export.export_rows(request_id)
    media = {"csv": "text/csv", "json": "application/json", "parquet": "application/vnd.apache.parquet"}[fmt]
    headers = {"Content-Disposition": f'attachment; filename="{request_id}.{fmt}"'}
    if fmt != "parquet":
        return Response(export.write(rows, fmt, None), media_type=media, headers=headers)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.parquet"
        export.write(rows, fmt, path)
        return Response(path.read_bytes(), media_type=media, headers=headers)


@router.get("/requests/{ref}/report.html", response_class=Response)
def report_html(ref: str, who: Who, objective: str | None = None, p99: float | None = None,
                stable: bool = False) -> Response:
    """``farm report -o report.html``: the self-contained HTML report."""
    from farm.readers.report import Constraint  # noqa: PLC0415 - with report_html, below
    from farm.readers.report_html import render  # noqa: PLC0415 - matplotlib: +1.2 s at start, measured; reports only

    req = access.resolve(who, ref)
    constraints = [Constraint("latency_p99_ms", p99)] if p99 is not None else []
    return Response(render(req.id, objective, constraints, stable), media_type="text/html")


@router.post("/requests/{ref}/cancel", response_model=None)
def cancel(ref: str, who: Who) -> CancelAnswer:
    """Cancel the request's jobs not final yet (its owner or an admin)."""
    return cancel_owned(who, ref)[1]


def cancel_owned(who: Principal, ref: str) -> tuple[str, CancelAnswer]:
    """Cancel request ``ref`` for ``who`` (its owner or an admin: ForbiddenError otherwise), audited; its id and
    what was cancelled (the API's cancel and the web view's button)."""
    req = access.resolve(who, ref)
    with session_scope() as s:
        check_write(who, owner_of(s, req.id), req.id, "cancel")
    out = cancel_request(req.id)
    with session_scope() as s:
        audit(s, who.name, "request.cancel", req.id, {k: v for k, v in out.items() if k != "running_ids"})
    return req.id, out


@router.delete("/requests/{ref}", response_model=None)
def delete_request(ref: str, who: Who) -> DeleteAnswer:
    """Delete the request with its jobs and results (its owner or an admin); jobs still running are cancelled
    first, so their workers stop them."""
    req = access.resolve(who, ref)
    with session_scope() as s:
        check_write(who, owner_of(s, req.id), req.id, "delete")
        lifecycle.cancel(s, req.id, "cancelled: the request was deleted", utcnow())
        s.execute(delete(RequestRow).where(RequestRow.id == req.id))
        audit(s, who.name, "request.delete", req.id, None)
    return DeleteAnswer(request_id=req.id, deleted=True)


@router.get("/workers")
def workers(who: Who) -> list[dict[str, Any]]:
    """Registered workers (``farm workers``)."""
    return serialize.rows(workers_table())
