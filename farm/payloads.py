"""What farm's readers and its JSON API hand back beyond result rows: the typed shapes of the recent-requests
list, the workers table, and the API's answers (``farm.server.api``), which the CLI's client of the API
(``farm.cli.remote``) reads. Times are datetimes on the reader side, ISO 8601 strings once through the API."""
from __future__ import annotations

from datetime import datetime
from typing import Any, NotRequired, TypedDict

from schemas.hardware import SlotJson


class RequestSummary(TypedDict):
    """One recent request: its id, name, creation time, model (a file name, or ``NAME@ENDPOINT``) and job counts by
    status; ``owner`` and ``team`` where the API server lists it (``farm.server.access.recent``)."""

    request_id: str
    name: str | None
    created_at: datetime
    model: str
    counts: dict[str, int]
    owner: NotRequired[str | None]
    team: NotRequired[str | None]


class WorkerRow(TypedDict):
    """One registered worker (one slot of a GPU host): its id, host, runner, status, queues, last heartbeat, current
    job, its GPUs' names, its slot (None: a worker of one slot without GPUs) and its CPU (``CpuInfo`` JSON)."""

    worker_id: str
    hostname: str
    runner: str
    status: str
    queues: list[str]
    last_heartbeat: datetime
    current_job_id: str | None
    gpus: list[str]
    slot: SlotJson | None
    cpu: dict[str, object]


class CancelAnswer(TypedDict):
    """What cancelling a request did: jobs cancelled while queued, jobs stopped while running (their ids)."""

    request_id: str
    queued_cancelled: int
    running_cancelled: int
    running_ids: NotRequired[list[str]]
    still_stopping: NotRequired[int]  # ``farm cancel --wait``: jobs whose workers had not stopped them yet


class UploadAnswer(TypedDict):
    """An upload the server stored: its sha256 (a submit names it), size and file name."""

    upload: str
    size_bytes: int
    filename: str


class FolderAnswer(TypedDict):
    """A folder the server put together from uploaded files: its upload id (a submit names it), size, file count
    and name."""

    upload: str
    size_bytes: int
    files: int
    name: str


class DeleteAnswer(TypedDict):
    request_id: str
    deleted: bool


class SubmitAnswer(TypedDict):
    """A submit's answer (``farm.server.submit.Submitted``): the request, its job count, the combinations left out
    and whether it was stored before."""

    request_id: str
    jobs: int
    excluded: list[Any]
    existing: bool


class JobTimes(TypedDict):
    """When a job started running and finished (ISO 8601 through the API; None: not yet)."""

    started_at: str | None
    finished_at: str | None
