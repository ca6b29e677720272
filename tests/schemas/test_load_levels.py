from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from scheduler.enqueue import job_rows
from scheduler.expand import ModelRef, expand
from schemas import JobSpec, ProfileRequest, TensorSpec
from schemas.load_levels import ClosedLoop, ConstantRate, PoissonRate, load_level

ONNX = ModelRef(sha256="a" * 64, format="onnx", filename="m.onnx", inputs=(TensorSpec(name="input", shape=(4,)),))


def _old(concurrency: int, measurement: dict[str, Any]) -> dict[str, Any]:
    """A job as serialized before ``load`` existed: its level split over ``concurrency`` and ``measurement``."""
    return {"job_id": "j", "request_id": "r", "model_sha256": "0" * 64, "model_format": "onnx", "inputs": [],
            "device": "cpu", "engine": "onnxruntime", "batch_size": 1, "concurrency": concurrency, "queue": "farm.cpu",
            "measurement": measurement}


def test_the_load_level_is_one_tagged_value() -> None:
    assert load_level("closed", 4, None) == ClosedLoop(concurrency=4)
    assert load_level("constant", 2, 50.0) == ConstantRate(rate=50.0, concurrency=2)
    assert load_level("poisson", 1, 7.5) == PoissonRate(rate=7.5)
    assert ClosedLoop(concurrency=3).rate is None
    with pytest.raises(ValueError, match="needs a rate"):
        load_level("poisson", 1, None)
    with pytest.raises(ValidationError):
        ClosedLoop(concurrency=0)
    with pytest.raises(ValidationError):
        ConstantRate(rate=0)


@pytest.mark.parametrize(("concurrency", "measurement", "level"), [
    (4, {}, ClosedLoop(concurrency=4)),
    (2, {"mode": "constant", "rate": 50.0}, ConstantRate(rate=50.0, concurrency=2)),
    (1, {"mode": "poisson", "rate": 7.5, "window_s": 2.0}, PoissonRate(rate=7.5)),
])
def test_a_job_serialized_before_load_existed_still_loads(concurrency: int, measurement: dict[str, Any],
                                                          level: ClosedLoop | ConstantRate | PoissonRate) -> None:
    job = JobSpec.model_validate(_old(concurrency, measurement))
    assert job.load == level
    assert (job.concurrency, job.rate) == (concurrency, measurement.get("rate"))  # the jobs columns' values
    assert (job.measurement.mode, job.measurement.rate) == (measurement.get("mode", "closed"), measurement.get("rate"))
    dumped = job.model_dump(mode="json")
    assert dumped["concurrency"] == concurrency and dumped["load"]["type"] == level.type  # the stored form keeps both
    assert JobSpec.model_validate(dumped) == job == JobSpec.model_validate_json(job.model_dump_json())


def test_a_job_whose_load_disagrees_with_its_concurrency_or_rate_is_refused() -> None:
    dumped = JobSpec.model_validate(_old(2, {"mode": "poisson", "rate": 10.0})).model_dump(mode="json")
    with pytest.raises(ValidationError, match="disagrees"):
        JobSpec.model_validate({**dumped, "concurrency": 3})
    with pytest.raises(ValidationError, match="disagrees"):
        JobSpec.model_validate({**dumped, "measurement": {**dumped["measurement"], "rate": 20.0}})


def test_the_measurement_mirrors_the_load() -> None:
    new = {k: v for k, v in _old(1, {}).items() if k != "concurrency"}  # as the expansion builds it: load alone
    job = JobSpec.model_validate({**new, "load": {"type": "constant", "rate": 5.0}})
    assert job.load == ConstantRate(rate=5.0)
    assert (job.measurement.mode, job.measurement.rate, job.concurrency, job.rate) == ("constant", 5.0, 1, 5.0)


@pytest.mark.parametrize(("request_", "mode", "levels"), [
    (ProfileRequest(model="m.onnx", concurrency=[1, 4], batch_sizes=[1, 2]), "closed", {(1, None), (4, None)}),
    (ProfileRequest(model="m.onnx", rates=[50, 100], concurrency=[2], measurement={"mode": "poisson"}), "poisson",
     {(2, 50.0), (2, 100.0)}),
    (ProfileRequest(model="m.onnx", rates=[50], edge=[{"cpus": 1, "memory": "512m"}]), "constant", {(1, 50.0)}),
], ids=["closed", "poisson", "constant-edge"])
def test_the_expansion_builds_the_level_with_the_same_columns(request_: ProfileRequest, mode: str,
                                                              levels: set[tuple[int, float | None]]) -> None:
    jobs = expand(request_, "r", ONNX).jobs
    assert {j.load.type for j in jobs} == {mode}
    assert all((j.measurement.mode, j.measurement.rate) == (j.load.type, j.load.rate) for j in jobs)
    rows = job_rows("r", jobs)
    assert {(r["concurrency"], r["rate"]) for r in rows} == levels  # the jobs columns, as before the union
    assert [JobSpec.model_validate(r["spec"]) for r in rows] == jobs  # the stored spec loads back to the same job
    assert all(r["spec"]["concurrency"] == r["concurrency"] for r in rows)  # the stored form keeps its concurrency
