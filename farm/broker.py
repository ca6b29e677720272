"""The broker adapter: the one place that knows Celery's task message, kombu's Redis lists and the task.

Redis is transport only: the database is the ledger of jobs. ``TaskMessage`` owns the wire format (a Celery
protocol-2 task message in kombu's Redis envelope, encode/decode); ``Broker`` sends, inspects and drains
messages and runs the Celery worker with farm's one task registered. Late acknowledgement, prefetch 1,
requeue on lost worker, and a visibility timeout above the longest job, so a job whose worker dies is
delivered again and the database claim makes the second delivery safe.

The supported celery/kombu versions are bounded in ``pyproject.toml``; ``tests/farm/test_broker.py`` checks
``TaskMessage`` against Celery's own ``as_task_v2``/``send_task`` so an upgrade that changes the format fails.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypedDict, cast

from farm.settings import get_settings
from schemas.queues import CPU_QUEUE

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger("farm.broker")


@contextmanager
def quiet_root_warning() -> Iterator[None]:
    """Celery's SecurityWarning for a worker running as root, replaced by one log line of farm's own. Celery warns
    because a root worker that accepts pickle runs whatever a message holds; farm's app accepts JSON only
    (``accept_content``), so that risk is absent. What remains (a root process) is said once, with what to do
    about it, instead of Celery's multi-line warning from every worker."""
    import warnings  # noqa: PLC0415 - only a worker needs it

    from celery.exceptions import SecurityWarning  # noqa: PLC0415 - as in get_app

    if hasattr(os, "geteuid") and os.geteuid() == 0:
        log.warning("worker runs as root: farm accepts only JSON task messages (no pickle), so Celery's root "
                    "warning does not apply; run workers as a non-root user in the docker group where you can")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SecurityWarning, module=r"celery\.platforms")
        yield

RUN_JOB_TASK = "farm.run_job"
"""The one Celery task farm sends: ``farm.run_job(job_id)``."""

_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@lru_cache(maxsize=1)
def get_app() -> Celery:
    """The Celery app configured from settings (``FARM_BROKER_URL``)."""
    from celery import Celery  # noqa: PLC0415 - celery.app: +0.1 s on every CLI start (scheduler.enqueue), measured

    settings = get_settings()
    app = Celery("farm", broker=settings.broker_url or "memory://")
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_default_queue=CPU_QUEUE,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        worker_hijack_root_logger=False,
        # Flower and `celery events` see workers and jobs: task events (sent/received/started/succeeded/...)
        worker_send_task_events=True,
        task_send_sent_event=True,
    )
    return app


def task_id_for(job_id: str) -> str:
    """A Celery task id naming its job: ``<job id>.<random>`` (each send is a distinct message)."""
    return f"{job_id}.{uuid.uuid4().hex[:12]}"


def job_id_of_task(task_id: str) -> str:
    """The job id a task id names (see ``task_id_for``)."""
    return task_id.split(".", 1)[0]


def _origin() -> str:
    return f"{os.getpid()}@{socket.gethostname()}"


class TaskHeaders(TypedDict):
    """Celery protocol-2 task headers (``app.amqp.as_task_v2``; tests/farm/test_broker.py compares them)."""

    lang: str
    task: str
    id: str
    shadow: str | None
    eta: str | None
    expires: str | None
    group: str | None
    group_index: int | None
    retries: int
    timelimit: list[float | None]
    root_id: str
    parent_id: str | None
    argsrepr: str
    kwargsrepr: str
    origin: str
    ignore_result: bool
    replaced_task_nesting: int
    stamped_headers: list[str] | None
    stamps: dict[str, list[str]]


class DeliveryInfo(TypedDict):
    exchange: str
    routing_key: str


class Properties(TypedDict):
    """kombu's message properties in its Redis envelope."""

    correlation_id: str
    reply_to: str
    delivery_mode: int
    delivery_info: DeliveryInfo
    priority: int
    body_encoding: str
    delivery_tag: str


#: kombu's Redis envelope: the JSON object LPUSHed onto a queue's list (its keys are not identifiers)
Envelope = TypedDict("Envelope", {"body": str, "content-encoding": str, "content-type": str, "headers": TaskHeaders,
                                  "properties": Properties})


@dataclass(frozen=True)
class TaskMessage:
    """One ``farm.run_job(job_id)`` message bound for ``queue`` (priority 0-9, kombu's Redis steps)."""

    job_id: str
    queue: str
    priority: int = 0
    task_id: str = ""
    task: str = RUN_JOB_TASK
    origin: str = field(default_factory=_origin)

    def __post_init__(self) -> None:
        if not self.task_id:
            object.__setattr__(self, "task_id", task_id_for(self.job_id))

    def headers(self) -> TaskHeaders:
        """Celery protocol-2 headers, as ``app.amqp.as_task_v2`` writes them."""
        tid = self.task_id
        return TaskHeaders(lang="py", task=self.task, id=tid, shadow=None, eta=None, expires=None, group=None,
                           group_index=None, retries=0, timelimit=[None, None], root_id=tid, parent_id=None,
                           argsrepr=repr([self.job_id]), kwargsrepr="{}", origin=self.origin, ignore_result=True,
                           replaced_task_nesting=0, stamped_headers=None, stamps={})

    def encode(self) -> Envelope:
        """The message in kombu's Redis envelope (the JSON object kombu LPUSHes onto the queue's list)."""
        body = json.dumps([[self.job_id], {}, _EMBED])
        return {"body": base64.b64encode(body.encode()).decode(), "content-encoding": "utf-8",
                "content-type": "application/json", "headers": self.headers(),
                "properties": Properties(correlation_id=self.task_id, reply_to="", delivery_mode=2,
                                         delivery_info={"exchange": "", "routing_key": self.queue},
                                         priority=self.priority, body_encoding="base64",
                                         delivery_tag=str(uuid.uuid4()))}

    def to_json(self) -> str:
        """``encode()`` as the string stored in Redis."""
        return json.dumps(self.encode())

    @classmethod
    def decode(cls, raw: str | bytes | Envelope) -> TaskMessage:
        """The message from a Redis list entry (JSON text or its parsed envelope); ValueError if it is not
        a Celery protocol-2 task message."""
        try:
            env = json.loads(raw) if isinstance(raw, str | bytes) else raw
            props = env.get("properties") or {}
            body = env["body"]
            if props.get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args = json.loads(body)[0]
            queue = (props.get("delivery_info") or {}).get("routing_key") or ""
            return cls._of(env["headers"], args, queue, props.get("priority") or 0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"not a Celery task message: {exc!r}") from exc

    @classmethod
    def from_kombu(cls, message: Any) -> TaskMessage:
        """The message from a kombu ``Message`` (as ``basic_get`` returns it)."""
        info = message.delivery_info or {}
        queue = info.get("routing_key") or ""
        headers = cast("TaskHeaders", message.headers or {})  # kombu's message is untyped (none: KeyError)
        return cls._of(headers, message.decode()[0], queue,
                       (message.properties or {}).get("priority") or 0)

    @classmethod
    def _of(cls, headers: TaskHeaders, args: list[Any], queue: str, priority: int) -> TaskMessage:
        task_id = str(headers["id"])
        job_id = str(args[0]) if args else job_id_of_task(task_id)
        return cls(job_id=job_id, queue=queue, priority=int(priority), task_id=task_id,
                   task=str(headers.get("task")), origin=str(headers.get("origin") or ""))


def _queue_key(channel: Any, queue: str, priority: int) -> str:
    """The Redis list holding ``queue``'s messages of ``priority``.

    kombu's Redis transport keeps one list per (queue, priority step) and names it with the private
    ``Channel._q_for_pri``. farm writes and reads those lists directly (LPUSH in a pipeline without exchange
    routing, so a flushed Redis that lost kombu's bindings still gets resends; LRANGE to see what is
    queued), so it must use kombu's names: this is the only call of that private method.
    ``tests/farm/test_broker.py`` checks that Celery's ``send_task`` lands where this says.
    """
    return str(channel._q_for_pri(queue, priority))


class Broker:
    """farm's broker: send, inspect and drain ``farm.run_job`` messages; run the Celery worker."""

    def __init__(self, app: Celery | None = None) -> None:
        self.app = app or get_app()
        self.url = str(self.app.conf.broker_url or "")

    @property
    def is_redis(self) -> bool:
        """Whether the broker is Redis (lists farm can write and inspect directly)."""
        return self.url.startswith(_REDIS_SCHEMES)

    @contextmanager
    def _channel(self, write: bool = False) -> Iterator[Any]:
        opener = self.app.connection_for_write if write else self.app.connection_for_read
        with opener() as conn:
            yield conn.default_channel

    def send(self, job_id: str, queue: str, priority: int = 0) -> None:
        """Send one job to its queue (the message carries only the job id)."""
        self.send_many([TaskMessage(job_id, queue, priority)])

    def send_many(self, messages: Iterable[TaskMessage | tuple[str, str]], batch: int = 2000) -> int:
        """Send messages (or (job id, queue) pairs); returns how many were sent.

        On Redis they go straight onto the queues' lists in pipelines of ``batch`` (no exchange routing, so a
        flushed or restarted Redis that lost kombu's bindings still gets them); other brokers use send_task.
        """
        msgs = [m if isinstance(m, TaskMessage) else TaskMessage(*m) for m in messages]
        if not msgs:
            return 0
        if not self.is_redis:
            for m in msgs:
                self.app.send_task(m.task, args=[m.job_id], queue=m.queue, routing_key=m.queue, task_id=m.task_id,
                                   priority=m.priority, ignore_result=True)
            return len(msgs)
        with self._channel(write=True) as channel, channel.client.pipeline(transaction=False) as pipe:
            for i, m in enumerate(msgs, 1):
                pipe.lpush(_queue_key(channel, m.queue, m.priority), m.to_json())
                if i % batch == 0:
                    pipe.execute()
            pipe.execute()
        return len(msgs)

    def queued(self, queues: Iterable[str]) -> list[TaskMessage] | None:
        """The messages waiting in ``queues`` (all priority lists; unreadable entries skipped), or None when
        the broker cannot be inspected (not Redis)."""
        if not self.is_redis:
            return None
        found: list[TaskMessage] = []
        with self._channel() as channel:
            for queue in queues:
                for pri in channel.priority_steps:
                    for raw in channel.client.lrange(_queue_key(channel, queue, pri), 0, -1):
                        try:
                            found.append(TaskMessage.decode(raw))
                        except ValueError:
                            continue
        return found

    def queued_job_ids(self, queues: Iterable[str]) -> set[str] | None:
        """Job ids of the messages waiting in ``queues``, or None when the broker cannot be inspected."""
        messages = self.queued(queues)
        return None if messages is None else {job_id_of_task(m.task_id) for m in messages}

    def drain(self, queues: list[str], handle: Callable[[str], object], max_jobs: int | None = None,
              stopping: Callable[[], bool] = lambda: False) -> int:
        """Burst mode: take messages from ``queues`` (in order, one at a time) and call ``handle(job_id)``
        for each, acking after it returns, until the queues are empty, ``max_jobs`` were handled or
        ``stopping()``; returns the number of messages handled (unknown tasks are acked and skipped)."""
        handled = 0
        idle = False
        with self._channel() as channel:
            while not idle and not stopping() and (max_jobs is None or handled < max_jobs):
                idle = True
                for queue in queues:
                    raw = channel.basic_get(queue, no_ack=False)
                    if raw is None:
                        continue
                    idle = False
                    message = TaskMessage.from_kombu(raw)
                    if message.task == RUN_JOB_TASK:
                        handle(message.job_id)
                    else:
                        log.warning("ignoring unknown task %r", message.task)
                    raw.ack()
                    handled += 1
                    break
        return handled

    def register(self, handle: Callable[[str], str]) -> None:
        """Register ``farm.run_job`` on the app, running ``handle(job_id)`` (replacing an earlier one)."""
        if RUN_JOB_TASK in self.app.tasks:
            self.app.tasks.unregister(RUN_JOB_TASK)

        @self.app.task(name=RUN_JOB_TASK, shared=False, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
        def _run_job(job_id: str) -> str:
            return handle(job_id)

    def serve(self, handle: Callable[[str], str], queues: list[str], hostname: str, loglevel: str = "INFO",
              on_shutdown: Callable[[], object] | None = None) -> None:
        """Run a Celery worker (solo pool, prefetch 1) on ``queues`` calling ``handle(job_id)`` per message,
        until stopped; ``on_shutdown`` runs when the worker starts its warm shutdown (SIGTERM)."""
        from celery.signals import worker_shutting_down  # noqa: PLC0415 - as in get_app

        self.register(handle)
        if on_shutdown is not None:
            worker_shutting_down.connect(lambda **_: on_shutdown(), weak=False)
        with quiet_root_warning():  # Celery checks the user as it builds the worker
            worker = self.app.Worker(queues=queues, concurrency=1, pool="solo", prefetch_multiplier=1,
                                     hostname=hostname, loglevel=loglevel, without_heartbeat=False,
                                     without_mingle=True, without_gossip=True,
                                     quiet=True)  # `farm worker` prints its own banner line
            worker.start()
