"""Identities of farm's API: tokens, who may read or change a request, and the audit log.

An operator creates an identity with ``farm token create NAME [--team T] [--admin]``; its token is printed once
and kept only as a sha256. A plain sha256 (no salt, no slow KDF) is enough here because the token is 32 random
bytes (``secrets.token_urlsafe``): nobody can guess it or search a dictionary for it, so a leaked table gives no
token back, and one unsalted digest lets the server find the identity with one indexed lookup per call. Slow
password hashes (bcrypt, argon2) exist for low-entropy human passwords; they would cost every API call
milliseconds of CPU and protect nothing more.

Rules (one place, used by the API server and its web view):

* every call is authenticated (a revoked or unknown token: ``AuthError``, HTTP 401);
* a request is read by everyone, by its owner's team, or by its owner only (``FARM_READ_SCOPE``); admins read
  everything;
* only its owner or an admin cancels or deletes it (``ForbiddenError``, HTTP 403);
* every change is one audit line: a row in ``audit_log`` and a ``farm.audit`` log record.
"""
from __future__ import annotations

import hashlib
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from farm.db.models import AuditEntry, Identity, RequestOwner, utcnow
from farm.errors import AuthError, ForbiddenError, RequestError
from farm.settings import get_settings

log = logging.getLogger("farm.audit")

TOKEN_PREFIX = "farm_"
"""Tokens start with this, so secret scanners and people recognise one."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,119}$")
#: the operator's own identity in the audit log (``farm token`` run with the database's credentials)
OPERATOR = "operator"


@dataclass(frozen=True)
class Principal:
    """The identity a call is made as."""

    name: str
    team: str | None = None
    admin: bool = False
    priority: int = 0
    max_queued_jobs: int | None = None
    max_running_jobs: int | None = None
    max_request_jobs: int | None = None

    @property
    def limits_key(self) -> tuple[str, str]:
        """What fair-share limits count by: ("team", T) under ``FARM_LIMITS_BY=team`` for a member of T, else
        ("owner", NAME)."""
        if get_settings().limits_by == "team" and self.team:
            return "team", self.team
        return "owner", self.name


def token_digest(token: str) -> str:
    """The stored form of a token: its sha256, hex (see the module docstring for why no salt or slow hash)."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_name(name: str, what: str = "identity name") -> str:
    """``name`` if it is 1-120 letters, digits and ``_.@-`` starting with a letter or digit."""
    if not _NAME.match(name):
        raise RequestError(f"{what} {name!r} must be 1-120 letters, digits or _.@- starting with a letter or digit")
    return name


def create_token(session: Session, name: str, team: str | None = None, admin: bool = False, priority: int = 0,
                 limits: dict[str, int | None] | None = None, actor: str = OPERATOR) -> str:
    """A new token for identity ``name`` (created, or re-created after a revocation), returned once; refused
    while the identity has a live token (revoke it first: ``farm token revoke``)."""
    check_name(name)
    if team is not None:
        check_name(team, "team name")
    if not 0 <= priority <= 9:
        raise RequestError(f"--priority must be 0-9 (9 first), got {priority}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = session.get(Identity, name)
    if row is not None and row.revoked_at is None:
        raise RequestError(f"identity {name!r} has a live token; `farm token revoke {name}` first to replace it")
    fields: dict[str, Any] = dict(team=team, admin=admin, priority=priority, token_sha256=token_digest(token),
                                  created_at=utcnow(), revoked_at=None, **(limits or {}))
    if row is None:
        session.add(Identity(name=name, **fields))
    else:
        for key, value in fields.items():
            setattr(row, key, value)
    audit(session, actor, "token.create", name, {"team": team, "admin": admin, "priority": priority,
                                                  **(limits or {})})
    return token


def revoke_token(session: Session, name: str, actor: str = OPERATOR) -> bool:
    """Revoke identity ``name``'s token; False when it had none live. Its requests keep their owner."""
    row = session.get(Identity, name)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    audit(session, actor, "token.revoke", name, None)
    return True


def identities(session: Session) -> list[Identity]:
    """Every identity, live and revoked, by name."""
    return list(session.execute(select(Identity).order_by(Identity.name)).scalars())


def authenticate(session: Session, token: str | None) -> Principal:
    """The identity whose live token ``token`` is; AuthError otherwise."""
    if not token:
        raise AuthError("no API token: set FARM_TOKEN to the token `farm token create` printed")
    row = session.execute(select(Identity).where(Identity.token_sha256 == token_digest(token))).scalar_one_or_none()
    if row is None or row.revoked_at is not None:
        raise AuthError("the API token is unknown or revoked: ask your operator for a new one (`farm token create`)")
    return Principal(row.name, row.team, row.admin, row.priority, row.max_queued_jobs, row.max_running_jobs,
                     row.max_request_jobs)


def owner_of(session: Session, request_id: str) -> RequestOwner | None:
    """Who submitted the request through the API (None: an operator, on the database)."""
    return session.get(RequestOwner, request_id)


def may_read(who: Principal, owner: RequestOwner | None) -> bool:
    """Whether ``who`` may read a request owned by ``owner`` under ``FARM_READ_SCOPE``."""
    scope = get_settings().read_scope
    if who.admin or scope == "all":
        return True
    if owner is None:  # an operator's request: readable by all only
        return False
    if owner.owner == who.name:
        return True
    return scope == "team" and who.team is not None and owner.team == who.team


def check_write(who: Principal, owner: RequestOwner | None, request_id: str, action: str) -> None:
    """ForbiddenError unless ``who`` owns the request or is an admin."""
    if who.admin or (owner is not None and owner.owner == who.name):
        return
    holder = f"identity {owner.owner!r}" if owner is not None else "an operator"
    raise ForbiddenError(f"request {request_id} belongs to {holder}: only its owner or an admin may {action} it")


def audit(session: Session, actor: str, action: str, target: str | None, detail: dict[str, Any] | None) -> None:
    """One audit line for a change: a row in ``audit_log`` (in the caller's transaction) and a log record."""
    session.add(AuditEntry(at=utcnow(), actor=actor, action=action, target=target, detail=detail))
    log.info("audit actor=%s action=%s target=%s detail=%s", actor, action, target, detail or {})
