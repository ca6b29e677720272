"""Who sees which request through the API: ids resolved for the caller (``latest`` is the newest request *they*
may read), requests they may not read reported as absent (404, never 403: an id's existence is not leaked), and
the recent requests they may read with their owners and progress."""
from __future__ import annotations

from sqlalchemy import ColumnElement, false, or_, select, true

from farm.db.models import Request, RequestOwner
from farm.db.session import session_scope
from farm.errors import NotFoundError
from farm.identity import Principal, may_read
from farm.payloads import RequestSummary
from farm.readers.results import RECENT_RE, find_request, request_model, status_counts_of
from farm.settings import get_settings


def _readable(who: Principal) -> ColumnElement[bool]:
    """SQL: the request (outer-joined with its owner) is readable by ``who`` (``farm.identity.may_read``)."""
    scope = get_settings().read_scope
    if who.admin or scope == "all":
        return true()
    mine = RequestOwner.owner == who.name
    if scope == "team" and who.team is not None:
        return or_(mine, RequestOwner.team == who.team)
    return mine if scope == "own" or who.team is None else false()


def resolve(who: Principal, ref: str) -> Request:
    """The request ``ref`` names (an id, a prefix, ``latest`` or ``-N``) among those ``who`` may read."""
    recent = RECENT_RE.match(ref.strip())
    if recent:
        nth = int(recent.group(1) or 1)
        with session_scope() as s:
            req = s.execute(select(Request).outerjoin(RequestOwner, RequestOwner.request_id == Request.id)
                            .where(_readable(who)).order_by(Request.created_at.desc(), Request.id)
                            .offset(nth - 1).limit(1)).scalar_one_or_none()
        if req is None:
            raise NotFoundError(f"no request {ref!r}: you may read fewer than {nth} request(s)")
        return req
    req = find_request(ref)
    with session_scope() as s:
        owner = s.get(RequestOwner, req.id)
    if not may_read(who, owner):
        raise NotFoundError(f"no request {ref!r}; `farm status` lists requests")
    return req


def recent(who: Principal, limit: int = 20) -> list[RequestSummary]:
    """The newest requests ``who`` may read: id, name, owner, model, created, job counts by status."""
    with session_scope() as s:
        reqs = s.execute(select(Request.id, Request.name, Request.created_at, Request.spec, RequestOwner.owner,
                                RequestOwner.team)
                         .outerjoin(RequestOwner, RequestOwner.request_id == Request.id).where(_readable(who))
                         .order_by(Request.created_at.desc()).limit(limit)).all()
        counts = status_counts_of(s, [r.id for r in reqs])
    return [RequestSummary(request_id=r.id, name=r.name, created_at=r.created_at, owner=r.owner, team=r.team,
                           model=request_model(r.spec), counts=dict(counts[r.id])) for r in reqs]
