"""The worker's connection to the job ledger: each ``farm.lifecycle`` change in its own short transaction.

The state changes themselves live in ``farm.lifecycle``; this module only chooses how a worker talks to
the database: one statement per transaction, Postgres in autocommit on a small pool of its own (a worker
handles hundreds of jobs per second in the dispatch benchmark), with relaxed commits for claims and starts.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Connection, Engine, create_engine

from farm import lifecycle
from farm.db.session import get_engine
from farm.hooks import search_step_done
from farm.settings import get_settings
from schemas import JobResult, JobSpec
from schemas.job import JobStatus

log = logging.getLogger("farm.worker")


@lru_cache(maxsize=8)
def _ledger_engine(url: str, relaxed: bool) -> Engine:
    """The worker's Postgres engine for ledger writes: no pre-ping (a dropped connection fails the statement,
    the pool discards it and the caller's retry gets a fresh one), and with ``relaxed`` commits that do not
    wait for the WAL flush."""
    options = "-c synchronous_commit=off" if relaxed else ""
    return create_engine(url, pool_size=2, max_overflow=2, isolation_level="AUTOCOMMIT",
                         connect_args={"options": options} if options else {})


@contextmanager
def _tx(relaxed: bool = False) -> Iterator[Connection]:
    """A connection for ONE statement, which is its own transaction (Postgres: autocommit, one round trip;
    SQLite: a transaction committed on success).

    ``relaxed``: commit without waiting for the WAL flush (Postgres). Used for claims and the running mark
    only: if Postgres crashes and loses one, the job is queued again (the worker's result write is refused
    and the reconciler re-sends it). Result writes stay fully durable."""
    url = get_settings().db_url
    if url.startswith("postgresql"):
        with _ledger_engine(url, relaxed).connect() as conn:
            yield conn
    else:
        with get_engine(url).begin() as conn:
            yield conn


def claim(job_id: str, worker_id: str) -> JobSpec | None:
    """``lifecycle.claim``: the job's spec, or None when another delivery or worker already has it."""
    with _tx(relaxed=True) as conn:
        return lifecycle.claim(conn, job_id, worker_id)


def start(job_id: str, worker_id: str) -> bool:
    """``lifecycle.start``: False when this worker no longer holds the job."""
    with _tx(relaxed=True) as conn:
        return lifecycle.start(conn, job_id, worker_id)


def finish(spec: JobSpec, worker_id: str, result: JobResult, status: JobStatus | str = JobStatus.succeeded,
           error: str | None = None) -> bool:
    """``lifecycle.finish`` (fully durable): False when the job was no longer this worker's."""
    with _tx() as conn:
        done = lifecycle.finish(conn, spec, worker_id, result, status, error)
    if done and spec.measurement.search != "brute" and not spec.is_edge:
        _advance_search(spec.request_id)
    return done


def _advance_search(request_id: str) -> None:
    """The result of a search step (quick or max-goodput) landed: raise ``farm.hooks.search_step_done``, whose
    handler (the scheduler's ``advance``, registered by the CLI at start-up) enqueues the search's next step now.
    A failure here is only logged: reconciliation advances searches too, so the job's result stands."""
    try:
        search_step_done.fire(request_id)
    except Exception:
        log.warning("could not enqueue the next search step of request %s; reconciliation will", request_id,
                    exc_info=True)


def release(job_id: str, worker_id: str, reason: str) -> bool:
    """``lifecycle.release``: False when this worker no longer holds the job."""
    with _tx() as conn:
        return lifecycle.release(conn, job_id, worker_id, reason)


def job_status(job_id: str) -> str | None:
    """The job's status (None when there is no such job)."""
    with get_engine().connect() as conn:
        return lifecycle.status_of(conn, job_id)
