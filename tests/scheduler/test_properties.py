"""Property-based tests (hypothesis) of request validation and expansion."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from scheduler.enqueue import job_rows, spec_json
from scheduler.expand import ModelRef, edge_engines, expand, resolve_devices
from schemas import ENGINES, ProfileRequest, TensorSpec
from schemas.engines import incompatibility
from schemas.queues import queue_for
from schemas.request import device_slug

MODELS = {
    "onnx": ModelRef(sha256="a" * 64, format="onnx", filename="m.onnx", inputs=(TensorSpec(name="x", shape=(4,)),)),
    "torchscript": ModelRef(sha256="b" * 64, format="torchscript", filename="m.pt",
                            inputs=(TensorSpec(name="x", shape=(2, 3), dtype="FP16"),)),
}
SLUG = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,12}", fullmatch=True)
DEVICE = st.one_of(st.just("cpu"), SLUG.map(lambda s: f"gpu:{s}"))
SIZES = st.lists(st.integers(1, 65536), min_size=1, max_size=6)
CONC = st.lists(st.integers(1, 4096), min_size=1, max_size=4)
EDGE = st.lists(st.builds(lambda c, m: {"cpus": c, "memory": f"{m}m"}, st.sampled_from([0.5, 1, 2]),
                          st.integers(4, 4096)), max_size=3, unique_by=lambda e: (e["cpus"], e["memory"]))
REQUEST = st.builds(
    lambda devices, engines, b, c, edge: ProfileRequest(model="m", devices=devices, engines=engines, batch_sizes=b,
                                                        concurrency=c, edge=edge),
    st.lists(DEVICE, min_size=1, max_size=4), st.lists(st.sampled_from(ENGINES), min_size=1, max_size=3), SIZES,
    CONC, EDGE)
FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(REQUEST, st.sampled_from(sorted(MODELS)))
def test_job_count_is_the_product_over_compatible_combinations(req: ProfileRequest, fmt: str) -> None:
    exp = expand(req, "r", MODELS[fmt], gpu_products=[])
    devices, _ = resolve_devices(req.devices, [])  # gpu:<name> becomes gpu:<slug> (names may merge)
    compatible = [(d, e) for d in devices for e in req.engines if incompatibility(e, fmt, d) is None]
    serving = [j for j in exp.jobs if not j.is_edge]
    assert len(serving) == len(compatible) * len(req.batch_sizes) * len(req.concurrency)
    edge = [j for j in exp.jobs if j.is_edge]  # one per edge profile x in-process engine x batch size
    assert len(edge) == len(req.edge) * len(edge_engines(req.engines, fmt)) * len(req.batch_sizes)
    assert {j.engine for j in edge} <= set(edge_engines(req.engines, fmt))
    assert len(exp.excluded) == len(devices) * len(req.engines) - len(compatible)
    assert {(j.device, j.engine) for j in serving} == set(compatible)


@FAST
@given(REQUEST, st.sampled_from(sorted(MODELS)), st.uuids(), st.uuids())
def test_job_ids_are_unique_and_deterministic(req: ProfileRequest, fmt: str, rid1: object, rid2: object) -> None:
    a = expand(req, str(rid1), MODELS[fmt])
    ids = [j.job_id for j in a.jobs]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and i.isalnum() for i in ids)
    assert ids == [j.job_id for j in expand(req, str(rid1), MODELS[fmt]).jobs]
    if rid1 != rid2:
        assert not set(ids) & {j.job_id for j in expand(req, str(rid2), MODELS[fmt]).jobs}


@FAST
@given(REQUEST, st.lists(st.sampled_from(["NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA H100 80GB HBM3",
                                          "GeForce RTX 4090"]), max_size=4))
def test_every_job_queue_matches_its_device(req: ProfileRequest, products: list[str]) -> None:
    exp = expand(req, "r", MODELS["onnx"], gpu_products=products)
    for job in exp.jobs:
        if job.is_edge:
            assert job.queue == "farm.edge" and job.device == "cpu"
        else:
            assert job.queue == queue_for(job.device)
            assert job.queue == ("farm.cpu" if job.device == "cpu" else f"farm.gpu.{job.device[4:]}")


@FAST
@given(st.lists(st.sampled_from(["cpu", "gpu", "gpu:a100", "gpu:t4", "gpu:h100"]), min_size=1, max_size=5),
       st.lists(st.sampled_from(["NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-80GB", "Tesla T4"]), max_size=4))
def test_resolved_devices_are_unique_and_backed_by_live_products(devices: list[str], products: list[str]) -> None:
    resolved, excluded = resolve_devices(devices, products)
    assert len(resolved) == len(set(resolved))
    slugs = {device_slug(p) for p in products}
    for d in resolved:
        assert d == "cpu" or d.startswith("gpu:")
    if "gpu" in devices:
        assert {f"gpu:{s}" for s in slugs} <= set(resolved)
        assert bool(excluded) == (not slugs)


@FAST
@given(REQUEST)
def test_bulk_job_rows_equal_the_full_dump(req: ProfileRequest) -> None:
    jobs = expand(req, "r", MODELS["onnx"]).jobs
    rows = job_rows("r", jobs)
    assert [r["id"] for r in rows] == [j.job_id for j in jobs]
    for row, job in zip(rows, jobs, strict=True):
        assert row["spec"] == spec_json(job) == job.model_dump(mode="json")
        assert row["queue"] == job.queue and row["status"] == "queued"


@FAST
@given(st.lists(st.one_of(st.integers(max_value=0), st.integers(min_value=65537)), min_size=1, max_size=3),
       SIZES)
def test_out_of_range_batch_sizes_are_refused(bad: list[int], good: list[int]) -> None:
    with pytest.raises(ValidationError, match="batch_sizes"):
        ProfileRequest(model="m", batch_sizes=good + bad)
    assert ProfileRequest(model="m", batch_sizes=good).batch_sizes == sorted(set(good))


@FAST
@given(st.text(max_size=30))
def test_any_device_string_is_either_valid_or_a_validation_error(text: str) -> None:
    try:
        req = ProfileRequest(model="m", devices=[text])
    except ValidationError as exc:
        assert "device" in str(exc)
        return
    (device,) = req.devices
    assert device == "cpu" or device == "gpu" or device.startswith("gpu:")
    if device.startswith("gpu:"):
        assert queue_for(device) == f"farm.gpu.{device[4:]}"


@FAST
@given(st.dictionaries(st.sampled_from(["batch_sizes", "concurrency", "devices", "engines", "measurement", "edge"]),
                       st.one_of(st.none(), st.text(max_size=5), st.floats(allow_nan=True), st.booleans(),
                                 st.lists(st.text(max_size=3), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                            st.integers(), max_size=2)),
                       min_size=1, max_size=3))
def test_wrongly_typed_fields_raise_validation_errors_only(fields: dict[str, object]) -> None:
    try:
        ProfileRequest.model_validate({"model": "m", **fields})
    except ValidationError:
        pass  # the CLI turns this into one line; any other exception type would be a crash
