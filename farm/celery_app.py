"""The Celery application. Redis is transport only: the database is the ledger of jobs.

Late acknowledgement, prefetch 1, requeue on lost worker, and a visibility timeout above the longest job,
so a job whose worker dies is delivered again and the database claim makes the second delivery safe.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from collections.abc import Iterable
from functools import lru_cache

from celery import Celery

from farm.settings import get_settings

RUN_JOB_TASK = "farm.run_job"


@lru_cache(maxsize=1)
def get_app() -> Celery:
    """The Celery app configured from settings (``FARM_BROKER_URL``)."""
    settings = get_settings()
    app = Celery("farm", broker=settings.broker_url or "memory://")
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_default_queue="farm.cpu",
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


def enqueue_job(job_id: str, queue: str) -> None:
    """Send one job to its queue (the message carries only the job id)."""
    enqueue_many([(job_id, queue)])


def task_id_for(job_id: str) -> str:
    """A Celery task id naming its job: ``<job id>.<random>`` (each send is a distinct message)."""
    return f"{job_id}.{uuid.uuid4().hex[:12]}"


def job_id_of_task(task_id: str) -> str:
    """The job id a task id names (see ``task_id_for``)."""
    return task_id.split(".", 1)[0]


def enqueue_many(jobs: Iterable[tuple[str, str]]) -> int:
    """Send (job id, queue) pairs to the broker; returns how many were sent.

    On Redis the messages go straight onto the queues' lists in one pipeline (no exchange routing, so a
    flushed or restarted Redis that lost kombu's bindings still gets them); other brokers use send_task.
    """
    pairs = list(jobs)
    if not pairs:
        return 0
    app = get_app()
    url = get_settings().broker_url or ""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        for job_id, queue in pairs:
            app.send_task(RUN_JOB_TASK, args=[job_id], queue=queue, routing_key=queue, task_id=task_id_for(job_id))
        return len(pairs)
    origin = f"{os.getpid()}@{socket.gethostname()}"
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel.client
        with client.pipeline(transaction=False) as pipe:
            for i, (job_id, queue) in enumerate(pairs, 1):
                pipe.lpush(channel._q_for_pri(queue, 0), json.dumps(_redis_message(job_id, queue, origin)))
                if i % 2000 == 0:
                    pipe.execute()
            pipe.execute()
    return len(pairs)


def _redis_message(job_id: str, queue: str, origin: str) -> dict[str, object]:
    """A Celery protocol-2 task message in kombu's Redis envelope, as ``send_task`` would write it."""
    task_id = task_id_for(job_id)
    body = json.dumps([[job_id], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    headers = {"lang": "py", "task": RUN_JOB_TASK, "id": task_id, "shadow": None, "eta": None, "expires": None,
               "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
               "parent_id": None, "argsrepr": repr([job_id]), "kwargsrepr": "{}", "origin": origin,
               "ignore_result": True, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {}}
    return {"body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
            "content-type": "application/json", "headers": headers,
            "properties": {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2,
                           "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
                           "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())}}


def broker_job_ids(queues: Iterable[str]) -> set[str] | None:
    """Job ids of the messages waiting in ``queues`` on the broker (all priority lists), or None when the
    broker cannot be inspected (not Redis)."""
    url = get_settings().broker_url or ""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    found: set[str] = set()
    with get_app().connection_for_read() as conn:
        channel = conn.default_channel
        client = channel.client
        for queue in queues:
            for pri in channel.priority_steps:
                for raw in client.lrange(channel._q_for_pri(queue, pri), 0, -1):
                    try:
                        found.add(job_id_of_task(json.loads(raw)["headers"]["id"]))
                    except (ValueError, KeyError, TypeError):
                        continue
    return found
