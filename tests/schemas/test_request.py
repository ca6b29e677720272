from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import EdgeProfile, MeasurementSettings, ProfileRequest, TensorSpec
from schemas.request import device_slug
from schemas.specs import parse_memory


def _errors(**kw: object) -> str:
    with pytest.raises(ValidationError) as info:
        ProfileRequest.model_validate({"model": "m.onnx", **kw})
    return str(info.value)


def test_defaults_are_one_cpu_onnxruntime_job() -> None:
    r = ProfileRequest(model="m.onnx")
    assert (r.devices, r.engines, r.batch_sizes, r.concurrency, r.edge) == (["cpu"], ["onnxruntime"], [1], [1], [])


def test_lists_are_normalised_sorted_and_deduplicated() -> None:
    r = ProfileRequest(model="m.onnx", devices=["CPU", "cpu", "gpu:a100"], engines=["OnnxRuntime"],
                       batch_sizes=[16, 1, 4, 4], concurrency=[4, 1])
    assert r.devices == ["cpu", "gpu:a100"]
    assert r.engines == ["onnxruntime"]
    assert r.batch_sizes == [1, 4, 16]
    assert r.concurrency == [1, 4]


@pytest.mark.parametrize("field,value,needle", [
    ("engines", ["tensorrt"], "allowed: onnxruntime, torchscript, triton"),
    ("devices", ["tpu"], "allowed: cpu, gpu, gpu:<product>"),
    ("batch_sizes", [0], "batch_sizes must be whole numbers from 1 to"),
    ("batch_sizes", [-4], "batch_sizes must be whole numbers from 1 to"),
    ("batch_sizes", [], "batch_sizes must not be empty"),
    ("concurrency", [0], "concurrency must be whole numbers"),
    ("engines", [], "engines must not be empty"),
])
def test_invalid_fields_name_the_field_and_allowed_values(field: str, value: object, needle: str) -> None:
    msg = _errors(**{field: value})
    assert field in msg
    assert needle in msg


def test_unknown_field_is_rejected() -> None:
    assert "batchsize" in _errors(batchsize=[1])


def test_edge_profile_parses_memory_and_names_itself() -> None:
    p = EdgeProfile(cpus=1, memory="512m")
    assert p.memory == 512 * 2**20
    assert p.name == "cpus1-mem512m"
    assert EdgeProfile(cpus=0.5, memory="1g", name="pi4", cpuset="0-1").cpuset == "0-1"


@pytest.mark.parametrize("kw,needle", [
    ({"cpus": 0, "memory": "512m"}, "greater than 0"),
    ({"cpus": 1, "memory": "lots"}, "is not a size"),
    ({"cpus": 1, "memory": "1k"}, "below 4 MiB"),
    ({"cpus": 1, "memory": "512m", "cpuset": "0;1"}, "is not a CPU list"),
    ({"cpus": 1, "memory": "512m", "name": "bad name; drop table"}, "must be 1-63 characters"),
])
def test_bad_edge_profiles(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        EdgeProfile(**kw)
    assert needle in str(info.value)


def test_duplicate_edge_names_rejected() -> None:
    assert "repeated: a" in _errors(edge=[{"cpus": 1, "memory": "512m", "name": "a"},
                                          {"cpus": 2, "memory": "1g", "name": "a"}])


def test_measurement_rate_switches_to_open_loop_and_checks_windows() -> None:
    assert MeasurementSettings(rate=100).mode == "constant"
    with pytest.raises(ValidationError, match="needs a rate"):
        MeasurementSettings(mode="poisson")
    with pytest.raises(ValidationError, match="max_windows"):
        MeasurementSettings(min_windows=5, max_windows=3)


def test_tensor_spec_validates_dtype_and_shape() -> None:
    assert TensorSpec(name="x", dtype="fp32", shape=(3, 4)).dtype == "FP32"
    with pytest.raises(ValidationError, match="allowed: FP32"):
        TensorSpec(name="x", dtype="float", shape=(3,))
    with pytest.raises(ValidationError, match="dimension <= 0"):
        TensorSpec(name="x", shape=(3, -1))


def test_memory_and_slug_helpers() -> None:
    assert parse_memory("1.5GiB") == int(1.5 * 2**30)
    assert parse_memory(2**30) == 2**30
    assert device_slug("NVIDIA A100-SXM4-40GB") == "a100-sxm4-40gb"
    assert device_slug("Tesla T4") == "t4"
