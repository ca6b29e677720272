"""Surviving a database outage: retry with backoff, then spool finished results to local disk.

A worker that finished a job but cannot reach the database keeps the result in ``<home>/spool/<job>.json``
(written atomically) and replays it when the database answers again. The write it replays is the ledger's
idempotent ``finish``: a result is never written twice, and a spooled result whose job was meanwhile
handed to another worker is dropped (that worker writes the job's one result).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError

from schemas import JobResult, JobSpec

log = logging.getLogger("farm.worker")
T = TypeVar("T")

#: errors that mean "the database is unreachable or restarting", worth retrying
TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, DisconnectionError)


def is_transient(exc: BaseException) -> bool:
    """True for connection-level database errors (server down, restarting, connection dropped)."""
    if isinstance(exc, TRANSIENT_DB_ERRORS):
        return True
    return isinstance(exc, DBAPIError) and bool(getattr(exc, "connection_invalidated", False))


def retry_db(fn: Callable[[], T], budget_s: float, what: str = "database call", first_s: float = 0.2,
             max_s: float = 5.0, sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn`` until it succeeds, retrying transient database errors with exponential backoff
    (``first_s`` doubling up to ``max_s`` seconds) for at most ``budget_s`` seconds; then re-raise."""
    deadline = time.monotonic() + budget_s
    delay = first_s
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            wait = min(delay, left)
            log.warning("%s failed (database unreachable, attempt %d): %s; retrying in %.1f s", what, attempt,
                        " ".join(str(getattr(exc, "orig", None) or exc).split())[:200], wait)
            sleep(wait)
            delay = min(delay * 2, max_s)


@dataclass(frozen=True)
class SpooledResult:
    """A finished job's outcome waiting for the database: the spec, the worker that holds the claim, the
    result and the final status."""

    spec: JobSpec
    worker_id: str
    result: JobResult
    status: str
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec.model_dump(mode="json"), "worker_id": self.worker_id,
                "result": self.result.model_dump(mode="json"), "status": self.status, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpooledResult:
        return cls(spec=JobSpec.model_validate(data["spec"]), worker_id=data["worker_id"],
                   result=JobResult.model_validate(data["result"]), status=data["status"], error=data.get("error"))


class Spool:
    """A directory of spooled results, one JSON file per job (the job id names it, so a job is spooled
    at most once)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, job_id: str) -> Path:
        if not job_id.isalnum():
            raise ValueError(f"job id {job_id!r} is not alphanumeric")
        return self.directory / f"{job_id}.json"

    def put(self, item: SpooledResult) -> Path:
        """Write ``item`` durably (temp file, fsync, rename) and return its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path_for(item.spec.job_id)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            json.dump(item.to_json(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        log.warning("database unreachable: result of job %s spooled to %s; it is written when the database "
                    "answers again", item.spec.job_id, target)
        return target

    def pending(self) -> list[Path]:
        """Spooled files, oldest first."""
        if not self.directory.is_dir():
            return []
        files = [p for p in self.directory.glob("*.json") if not p.name.startswith(".")]
        return sorted(files, key=lambda p: p.stat().st_mtime if p.exists() else 0.0)

    def __len__(self) -> int:
        return len(self.pending())

    def replay(self, write: Callable[[SpooledResult], bool]) -> int:
        """Write every spooled result with ``write`` (True: written, False: the job is no longer this
        worker's), deleting each file once the database has answered; stops at the first transient error.
        Returns how many files were settled."""
        settled = 0
        for path in self.pending():
            try:
                item = SpooledResult.from_json(json.loads(path.read_text()))
            except FileNotFoundError:
                continue  # another process on this host replayed it
            except (ValueError, KeyError) as exc:
                bad = path.with_suffix(".corrupt")
                os.replace(path, bad)
                log.error("spooled result %s is unreadable (%s); moved to %s", path, exc, bad)
                continue
            try:
                written = write(item)
            except Exception as exc:
                if is_transient(exc):
                    return settled
                raise
            path.unlink(missing_ok=True)
            settled += 1
            if written:
                log.info("spooled result of job %s written", item.spec.job_id)
            else:
                log.warning("spooled result of job %s dropped: the job was meanwhile requeued, cancelled or "
                            "finished elsewhere", item.spec.job_id)
        return settled
