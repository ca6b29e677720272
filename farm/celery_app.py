"""The Celery application. Redis is transport only: the database is the ledger of jobs.

Late acknowledgement, prefetch 1, requeue on lost worker, and a visibility timeout above the longest job,
so a job whose worker dies is delivered again and the database claim makes the second delivery safe.
"""
from __future__ import annotations

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
    get_app().send_task(RUN_JOB_TASK, args=[job_id], queue=queue, routing_key=queue)
