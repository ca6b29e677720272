"""The job limit is checked on a count computed from the request's dimension lengths, before expansion
(issue 27, point 6): ``job_count`` equals ``len(expand(...).jobs)``, and a matrix bomb (batch 1..1000 x
concurrency 1..1000, 65536 x 4096) is refused by ``plan`` without expanding anything."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scheduler.enqueue as enqueue
from farm.errors import RequestError
from scheduler.expand import ModelRef, expand, job_count
from schemas import ProfileRequest, TensorSpec
from schemas.engines import ENGINES

ONNX = ModelRef(sha256="a" * 64, format="onnx", filename="m.onnx", inputs=(TensorSpec(name="input", shape=(256,)),))
TS = ModelRef(sha256="b" * 64, format="torchscript", filename="m.pt", inputs=(TensorSpec(name="x", shape=(8,)),),
              static_batch=4)


def _small(lo: int, hi: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(lo, hi), min_size=1, max_size=4)


@st.composite
def requests(draw: st.DrawFn) -> ProfileRequest:
    quick = draw(st.booleans())
    rates = draw(st.none() | st.lists(st.sampled_from([10.0, 50.0, 100.0]), min_size=1, max_size=3))
    data = dict(model="m.onnx", devices=draw(st.lists(st.sampled_from(["cpu", "gpu", "gpu:t4", "gpu:a100"]),
                                                       min_size=1, max_size=3)),
                engines=draw(st.lists(st.sampled_from(list(ENGINES)), min_size=1, max_size=3)),
                batch_sizes=draw(_small(1, 8)), concurrency=draw(_small(1, 8)),
                instances=draw(st.none() | _small(1, 3)), threads=draw(st.none() | _small(0, 3)),
                max_queue_delay_us=draw(st.none() | _small(0, 2)), rates=rates,
                edge=[{"cpus": 1, "memory": "512m", "name": f"e{i}"} for i in range(draw(st.integers(0, 2)))],
                measurement={"search": "quick"} if quick and not (rates and draw(st.booleans())) else {})
    if quick and rates:
        data["concurrency"] = [1]
    return ProfileRequest.model_validate(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=requests(), model=st.sampled_from([ONNX, TS]), products=st.sampled_from([None, [], ["NVIDIA T4"],
                                                                                    ["Tesla T4", "A100-SXM4"]]))
def test_job_count_is_the_expansion_length(req: ProfileRequest, model: ModelRef, products: list[str] | None) -> None:
    assert job_count(req, model, products) == len(expand(req, "r", model, products).jobs)


def test_matrix_bombs_are_counted_without_allocating() -> None:
    big = ProfileRequest(model="m.onnx", batch_sizes=list(range(1, 1001)), concurrency=list(range(1, 1001)))
    assert job_count(big, ONNX) == 1_000_000
    huge = ProfileRequest(model="m.onnx", batch_sizes=list(range(1, 65537)), concurrency=list(range(1, 4097)),
                          devices=["cpu", "gpu:t4"], engines=["onnxruntime", "triton"], rates=[1.0, 2.0])
    assert job_count(huge, ONNX) == 2 * 2 * 65536 * 4096 * 2


@pytest.mark.parametrize(("batches", "concurrency"), [(1000, 1000), (65536, 4096)])
def test_plan_refuses_a_matrix_bomb_before_expanding(batches: int, concurrency: int, sqlite_url: str,
                                                      example_onnx: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_expansion(*_: object, **__: object) -> None:
        raise AssertionError("expand() called for a request above the job limit")

    monkeypatch.setattr(enqueue, "expand", no_expansion)
    req = ProfileRequest(model=str(example_onnx), batch_sizes=list(range(1, batches + 1)),
                         concurrency=list(range(1, concurrency + 1)))
    with pytest.raises(RequestError, match=f"expands to {batches * concurrency} jobs.*FARM_JOB_LIMIT"):
        enqueue.plan(req)
