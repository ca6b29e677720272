from __future__ import annotations

import pytest

from schemas import ENGINES, MODEL_FORMATS
from schemas.engines import CARDS, FORMAT_ENGINE, incompatibility
from schemas.queues import CPU_QUEUE, EDGE_QUEUE, gpu_queue, queue_for


def test_queue_names() -> None:
    assert (CPU_QUEUE, EDGE_QUEUE) == ("farm.cpu", "farm.edge")
    assert gpu_queue("t4") == "farm.gpu.t4"
    assert queue_for("cpu") == CPU_QUEUE and queue_for("gpu:t4") == "farm.gpu.t4"
    for device in ("gpu", "tpu:x", "gpu:"):
        with pytest.raises(ValueError, match="has no queue"):
            queue_for(device)


def test_each_format_engine_can_load_its_format_on_every_device_class() -> None:
    assert MODEL_FORMATS == ("onnx", "torchscript")
    assert ENGINES == ("onnxruntime", "torchscript", "triton", "openvino", "llama.cpp", "transformers", "vllm")
    for fmt, engine in FORMAT_ENGINE.items():
        assert fmt in CARDS[engine].formats
        assert incompatibility(engine, fmt, "cpu") is None and incompatibility(engine, fmt, "gpu:t4") is None
    assert "cannot load onnx" in (incompatibility("torchscript", "onnx", "cpu") or "")
    assert "unknown engine" in (incompatibility("tvm", "onnx", "cpu") or "")
    assert incompatibility("openvino", "onnx", "cpu") is None  # OpenVINO loads ONNX files, on CPUs
    assert "cannot load torchscript" in (incompatibility("openvino", "torchscript", "cpu") or "")
    assert "does not run on gpu" in (incompatibility("openvino", "onnx", "gpu:t4") or "")
    assert "endpoint" not in ENGINES and incompatibility("endpoint", "endpoint", "cpu") is None
