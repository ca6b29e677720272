"""``farm submit --wait`` rides out a database blip (issue 27, point 7): its status reads are retried with
backoff for FARM_DB_RETRY_S (it exited 1 on the first failed read, although the jobs finished)."""
from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

import farm.cli.main as cli_main


def _blip() -> OperationalError:
    return OperationalError("SELECT status FROM jobs", {}, Exception("server closed the connection unexpectedly"))


def test_wait_retries_the_database_until_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[object] = [{"running": 2}, _blip(), _blip(), {"succeeded": 2}]
    calls: list[str] = []

    def status_counts(request_id: str) -> dict[str, int]:
        calls.append(request_id)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, dict)
        return answer

    monkeypatch.setattr(cli_main, "status_counts", status_counts)
    monkeypatch.setattr(cli_main, "searches_done", lambda request_id: True)
    monkeypatch.setattr(cli_main, "result_rows", lambda request_id: [])  # the headlines' read: no job here
    monkeypatch.setattr(cli_main, "job_times", lambda request_id: {})
    cli_main._wait("r1", quiet=True, poll_s=0.01)
    assert answers == [] and calls == ["r1"] * 4


def test_wait_gives_up_after_the_retry_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_DB_RETRY_S", "0.3")
    from farm.settings import reset_settings

    reset_settings()

    def down(request_id: str) -> dict[str, int]:
        raise _blip()

    monkeypatch.setattr(cli_main, "status_counts", down)
    with pytest.raises(OperationalError):
        cli_main._wait("r1", quiet=True, poll_s=0.01)
