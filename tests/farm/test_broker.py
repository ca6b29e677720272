"""The broker adapter against Celery's own task messages and a real Redis.

These tests guard the wire format: farm writes Celery protocol-2 messages onto kombu's Redis lists itself,
so a Celery or kombu upgrade that changes either must fail here (the versions are bounded in pyproject.toml).
"""
from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from farm.broker import RUN_JOB_TASK, Broker, TaskMessage, get_app, job_id_of_task, task_id_for

# What Celery's worker reads from a message; farm's must match Celery's in each (delivery_tag is random per
# message; reply_to is the sending app's id, unused for tasks that ignore results; origin names the sender).
PROPERTY_KEYS = ("correlation_id", "delivery_mode", "delivery_info", "priority", "body_encoding")


@pytest.fixture
def redis_broker(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """FARM_BROKER_URL on the test Redis db (flushed), a fresh Celery app, and a raw Redis client."""
    import redis

    from farm.settings import reset_settings

    monkeypatch.setenv("FARM_BROKER_URL", redis_url)
    reset_settings()
    get_app.cache_clear()
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()
    get_app.cache_clear()


def _lists(client: Any) -> dict[bytes, list[dict[str, Any]]]:
    """Every Redis list in the db and its entries (parsed), kombu's bindings left out."""
    return {k: [json.loads(v) for v in client.lrange(k, 0, -1)] for k in client.keys()
            if client.type(k) == b"list"}


def _body(envelope: dict[str, Any]) -> Any:
    assert envelope["properties"]["body_encoding"] == "base64"
    return json.loads(base64.b64decode(envelope["body"]))


def test_task_ids_name_their_job() -> None:
    a, b = task_id_for("j-1"), task_id_for("j-1")
    assert a != b and job_id_of_task(a) == job_id_of_task(b) == "j-1"


def test_headers_and_body_match_celerys_as_task_v2() -> None:
    m = TaskMessage("job-1", "farm.cpu")
    celery = get_app().amqp.as_task_v2(m.task_id, RUN_JOB_TASK, args=[m.job_id], kwargs={}, origin=m.origin,
                                       ignore_result=True)
    assert m.headers() == celery.headers
    assert _body(m.encode()) == json.loads(json.dumps(celery.body))
    env = m.encode()
    assert {k: env["properties"][k] for k in celery.properties if k != "reply_to"} == \
        {k: v for k, v in celery.properties.items() if k != "reply_to"}


def test_message_round_trips_and_garbage_is_refused() -> None:
    m = TaskMessage("job-2", "farm.gpu.a100", priority=6)
    assert TaskMessage.decode(m.to_json()) == m
    assert TaskMessage.decode(m.encode()) == m
    for bad in ("not json", "{}", json.dumps({"headers": {}, "body": "e30="}), b"[1, 2]"):
        with pytest.raises(ValueError):
            TaskMessage.decode(bad)


@pytest.mark.parametrize("priority", [0, 6])
def test_sent_messages_match_celerys_send_task_on_redis(redis_broker: Any, priority: int) -> None:
    app = get_app()
    ours = TaskMessage("job-3", "farm.cpu", priority=priority)
    app.send_task(RUN_JOB_TASK, args=["job-3"], queue="farm.cpu", routing_key="farm.cpu", task_id=ours.task_id,
                  priority=priority, ignore_result=True)
    (key, (celery,)), = _lists(redis_broker).items()
    redis_broker.delete(key)
    assert Broker().send_many([ours]) == 1
    (our_key, (farm,)), = _lists(redis_broker).items()
    assert our_key == key, "farm's queue-list name differs from kombu's"
    for k in ("content-type", "content-encoding"):
        assert farm[k] == celery[k]
    assert {k: v for k, v in farm["headers"].items() if k != "origin"} == \
        {k: v for k, v in celery["headers"].items() if k != "origin"}
    assert _body(farm) == _body(celery)
    assert {k: farm["properties"][k] for k in PROPERTY_KEYS} == {k: celery["properties"][k] for k in PROPERTY_KEYS}


def test_farm_reads_celerys_messages_and_finds_queued_job_ids(redis_broker: Any) -> None:
    app = get_app()
    for job, pri in (("a", 0), ("b", 9)):
        app.send_task(RUN_JOB_TASK, args=[job], queue="farm.cpu", routing_key="farm.cpu",
                      task_id=task_id_for(job), priority=pri, ignore_result=True)
    broker = Broker()
    broker.send_many([("c", "farm.cpu"), ("d", "farm.other")])
    queued = broker.queued(["farm.cpu"])
    assert queued is not None
    assert sorted((m.job_id, m.queue, m.priority, m.task) for m in queued) == \
        [("a", "farm.cpu", 0, RUN_JOB_TASK), ("b", "farm.cpu", 9, RUN_JOB_TASK), ("c", "farm.cpu", 0, RUN_JOB_TASK)]
    assert broker.queued_job_ids(["farm.cpu", "farm.other"]) == {"a", "b", "c", "d"}
    redis_broker.lpush("farm.cpu", b"garbage")
    assert broker.queued_job_ids(["farm.cpu"]) == {"a", "b", "c"}


def test_drain_hands_over_job_ids_queue_by_queue_and_skips_unknown_tasks(redis_broker: Any) -> None:
    broker = Broker()
    broker.send_many([("a", "q1"), ("b", "q1"), ("c", "q2")])
    get_app().send_task("other.task", args=["x"], queue="q2", routing_key="q2", ignore_result=True)
    seen: list[str] = []
    assert broker.drain(["q1", "q2"], seen.append, max_jobs=1) == 1
    assert broker.drain(["q1", "q2"], seen.append) == 3  # b, c and the unknown task (acked, not handed over)
    assert seen == ["a", "b", "c"]
    assert broker.queued_job_ids(["q1", "q2"]) == set()
    broker.send("d", "q1")
    assert broker.drain(["q1"], seen.append, stopping=lambda: True) == 0
    assert broker.queued_job_ids(["q1"]) == {"d"}


def test_a_celery_worker_runs_farms_messages_with_the_registered_handler(redis_broker: Any) -> None:
    from celery.contrib.testing.worker import start_worker

    broker = Broker()
    broker.register(lambda job_id: "first")
    ran: list[str] = []

    def handle(job_id: str) -> str:
        ran.append(job_id)
        return "succeeded"

    broker.register(handle)  # a second registration replaces the first (no global)
    assert broker.app.tasks[RUN_JOB_TASK]("x") == "succeeded" and ran == ["x"]
    broker.send_many([("j1", "farm.cpu"), ("j2", "farm.cpu")])
    with start_worker(broker.app, pool="solo", perform_ping_check=False, queues=["farm.cpu"],
                      shutdown_timeout=10):
        import time

        deadline = time.monotonic() + 20
        while len(ran) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert sorted(ran) == ["j1", "j2", "x"]


def test_a_registration_stays_on_its_own_app(redis_broker: Any) -> None:
    """Registering is per app (``shared=False``): a new app starts without ``farm.run_job`` and with no
    handler left over from an earlier app (Celery's shared tasks would install the FIRST one ever
    registered, with a DuplicateTaskNameWarning, and route every call there)."""
    import warnings

    Broker().register(lambda job_id: "old")
    get_app.cache_clear()
    fresh = Broker()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert RUN_JOB_TASK not in fresh.app.tasks
        fresh.register(lambda job_id: "new")
        assert fresh.app.tasks[RUN_JOB_TASK]("x") == "new"
