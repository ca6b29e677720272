"""Op profiles (issue 26): every engine's own profiler read into one schema, on farm's small example models."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from farm.models.examples import build_example
from farm.op_profile import by_op_type
from schemas import JobSpec
from schemas.op_profile import OVERHEAD, OpProfile
from workers.profiling.collect import Collected, NodeAcc
from workers.profiling.job import profile_job
from workers.profiling.process import edge_profile, edge_profile_line
from workers.profiling.run import run_pass, summarize

SHORT = {"warmup": 2, "iterations": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("op-models")
    out = {k: build_example(k, d / f"{k}.onnx") for k in ("mlp", "convnet")}
    pytest.importorskip("torch")
    out["torchscript-mlp"] = build_example("torchscript-mlp", d / "mlp.pt")
    return out


def _check(prof: OpProfile) -> None:
    """What every profile of every engine holds."""
    assert prof.status == "ok", prof.reason
    assert prof.iterations == SHORT["iterations"] and prof.nodes
    assert prof.node_sum_ms is not None and prof.compute_ms is not None and prof.node_sum_ms > 0
    assert prof.overhead_ms == pytest.approx(prof.compute_ms - prof.node_sum_ms)  # the remainder, never spread
    assert sum(n.share for n in prof.nodes) == pytest.approx(1.0)
    times = [n.self_ms_p50 for n in prof.nodes]
    zero_from = next((i for i, t in enumerate(times) if t <= 0), len(times))
    assert times[:zero_from] == sorted(times[:zero_from], reverse=True)  # the most time first
    assert all(t <= 0 for t in times[zero_from:])  # zero-time nodes kept, last
    assert all(n.self_ms_p90 >= n.self_ms_p50 for n in prof.nodes)


def test_onnxruntime_profile_names_graph_nodes_and_maps_fusions_back(models: dict[str, Path], tmp_path: Path) -> None:
    prof, trace = run_pass(models["mlp"], "onnxruntime", 2, 1, tmp_path, **SHORT)
    _check(prof)
    assert trace is not None and trace.is_file() and prof.trace_format == "chrome"
    fused = {n.op_type: n for n in prof.nodes}
    assert fused["FusedGemm"].provider == "CPUExecutionProvider"
    # the optimizer folded Gemm+Relu; the graph's own names come back as the fused list
    assert {"Gemm_0", "Relu_1"} <= {f for n in prof.nodes for f in n.fused}
    assert all(n.calls == 1 for n in prof.nodes)
    assert "float[2,256]" in next(n for n in prof.nodes if "Gemm_0" in n.fused).input_shapes


def test_constant_folded_nodes_are_marked_optimized_out(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    c = helper.make_tensor("c", TensorProto.FLOAT, [4], [1, 2, 3, 4])
    nodes = [helper.make_node("Mul", ["c", "c"], ["cc"], name="fold_me"),
             helper.make_node("Add", ["x", "cc"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [c])
    path = tmp_path / "fold.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    prof, _ = run_pass(path, "onnxruntime", 1, 1, tmp_path, **SHORT)
    rows = {n.name: n for n in prof.nodes}
    assert rows["add"].status == "executed" and rows["add"].calls == 1
    assert rows["fold_me"].status == "optimized_out" and rows["fold_me"].self_ms_p50 == 0
    assert prof.nodes[-1].name == "fold_me"  # zero time: last


def test_torchscript_profile_reads_aten_ops_with_shapes(models: dict[str, Path], tmp_path: Path) -> None:
    inputs = [{"name": "input", "dtype": "FP32", "shape": [256]}]
    prof, trace = run_pass(models["torchscript-mlp"], "torchscript", 2, 1, tmp_path, inputs=inputs, **SHORT)
    _check(prof)
    assert trace is not None and trace.is_file()
    types = {n.op_type for n in prof.nodes}
    assert "aten::addmm" in types or "aten::linear" in types
    assert "forward" not in types  # the interpreter's own time is overhead, not a node
    assert any("[2,256]" in n.input_shapes for n in prof.nodes)


def test_openvino_profile_has_exec_types_fusions_and_statuses(models: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    prof, trace = run_pass(models["convnet"], "openvino", 1, 1, tmp_path, **SHORT)
    _check(prof)
    assert trace is not None and trace.is_file()  # farm's trace of its counters
    executed = [n for n in prof.nodes if n.status == "executed"]
    assert executed and all(n.exec_type for n in executed)
    assert {n.status for n in prof.nodes} <= {"executed", "not_run", "optimized_out"}
    assert any(n.fused for n in prof.nodes)  # the runtime model's originalLayersNames


def test_the_event_bound_caps_the_profile_and_says_so(models: dict[str, Path], tmp_path: Path) -> None:
    whole, _ = run_pass(models["mlp"], "onnxruntime", 1, 1, tmp_path / "a", **SHORT)
    per_iter = len([n for n in whole.nodes if n.status == "executed"])
    capped, _ = run_pass(models["mlp"], "onnxruntime", 1, 1, tmp_path / "b", max_events=2 * per_iter, **SHORT)
    assert capped.status == "ok" and capped.capped and capped.iterations == 2
    assert capped.reason is not None and "capped" in capped.reason
    none_fit, _ = run_pass(models["mlp"], "onnxruntime", 1, 1, tmp_path / "c", max_events=1, **SHORT)
    assert none_fit.status == "failed" and "capped" in (none_fit.reason or "")


def _spec(model: Path, engine: str = "onnxruntime", **measurement: object) -> JobSpec:
    return JobSpec.model_validate({
        "job_id": "a" * 32, "request_id": "r" * 32, "model_sha256": "0" * 64, "model_filename": model.name,
        "model_format": "onnx", "device": "cpu", "engine": engine, "batch_size": 1, "concurrency": 1,
        "queue": "cpu", "inputs": [{"name": "input", "dtype": "FP32", "shape": [256]}],
        "measurement": {"op_profile": True, **measurement}})


@pytest.mark.parametrize("engine", ["onnxruntime", "openvino"])
def test_a_served_jobs_pass_runs_on_its_cores_as_a_process(models: dict[str, Path], engine: str) -> None:
    if engine == "openvino":
        pytest.importorskip("openvino")
    core = sorted(os.sched_getaffinity(0))[-1]
    prof, trace = profile_job(_spec(models["mlp"], engine=engine), models["mlp"], {core})
    assert prof.status == "ok" and prof.nodes and trace is not None and trace[:2] == b"\x1f\x8b"  # gzip
    assert prof.cpus == str(core)  # every thread of the pass, the engine's pool included, stayed on the lease


def test_engines_without_a_profiler_say_so(models: dict[str, Path]) -> None:
    prof, trace = profile_job(_spec(models["mlp"], engine="triton"), models["mlp"], None)
    assert prof.status == "none" and trace is None and "triton" in (prof.reason or "")


def test_a_profiler_crash_becomes_a_reason(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.settings import reset_settings

    monkeypatch.setenv("FARM_OP_PROFILE_CRASH", "1")
    reset_settings()
    prof, trace = profile_job(_spec(models["mlp"]), models["mlp"], None)
    assert prof.status == "failed" and trace is None
    assert "signal 6" in (prof.reason or ""), prof.reason  # SIGABRT, a real crash of the pass's process


def test_an_edge_runs_profile_line_round_trips() -> None:
    prof = OpProfile(engine="onnxruntime", status="ok", iterations=1, node_sum_ms=1.0, compute_ms=1.0)
    import json
    line = json.dumps(edge_profile_line(prof, b"\x1f\x8bxyz"))
    got, trace = edge_profile(f'{{"edge_bench": 1}}\n{line}\n', "onnxruntime")
    assert got == prof and trace == b"\x1f\x8bxyz"
    missing, none = edge_profile('{"edge_bench": 1}\n', "onnxruntime")
    assert missing.status == "failed" and none is None


def test_summary_by_op_type_keeps_zero_time_types_last_and_overhead_apart() -> None:
    accs = {"a": NodeAcc(op_type="MatMul"), "b": NodeAcc(op_type="Shape"), "c": NodeAcc(op_type="MatMul")}
    for i in range(3):
        accs["a"].per_iter[i] += 300.0
        accs["c"].per_iter[i] += 100.0
        accs["b"].per_iter[i] += 0.0
    prof = summarize("onnxruntime", Collected(accs, 3, 9, False, None, [0.5, 0.5, 0.5]), [0.5, 0.5, 0.5],
                     batch_size=1, threads=1, warmup=0)
    rows = by_op_type(prof)
    assert [r["op_type"] for r in rows] == ["MatMul", "Shape", OVERHEAD]
    assert rows[0]["self_ms"] == pytest.approx(0.4) and rows[0]["nodes"] == 2
    assert rows[-1]["self_ms"] == pytest.approx(0.1) and rows[-1]["share"] is None
    assert np.isclose(prof.node_sum_ms or 0, 0.4)


def test_a_pass_that_cannot_load_the_model_says_why(tmp_path: Path) -> None:
    gone = tmp_path / "gone.onnx"
    prof, trace = profile_job(_spec(gone), gone, None)
    assert prof.status == "failed" and trace is None
    assert "does not exist" in (prof.reason or ""), prof.reason  # the pass's own one-line error


def test_torchscript_layers_join_the_pass_by_node_name(models: dict[str, Path], tmp_path: Path) -> None:
    """farm analyze --layers of a TorchScript model (jailed, as farm analyze) names its static costs as the pass
    names the profiled nodes: every counted op joins, its kernels' time is its own, the totals are analyze's."""
    from farm.models.torch_counter import analyze_torchscript
    from farm.models.torch_layers import torchscript_layers
    from farm.op_profile import achieved, join_layers
    from schemas import TensorSpec

    conv = build_example("torchscript-convnet", tmp_path / "convnet.pt")
    inputs = [TensorSpec(name="input", dtype="FP32", shape=(3, 32, 32))]
    prof, _ = run_pass(conv, "torchscript", 2, 1, tmp_path / "out",
                       inputs=[{"name": "input", "dtype": "FP32", "shape": [3, 32, 32]}], **SHORT)
    layers = torchscript_layers(conv, inputs, batch=2)
    names = {n.name for n in prof.nodes}
    counted = [r for r in layers if r["covers_subtree"]]
    assert counted and all(r["name"] in names for r in counted)  # the same names on both sides
    assert achieved(layers, prof, None)["flops"] == 2 * analyze_torchscript(conv, inputs)["flops_per_sample"]
    rows = {r["name"]: r for r in join_layers(layers, prof)}
    convs = [r for r in rows.values() if r["op_type"] == "aten::convolution"]
    assert len(convs) == 2 and all(r["flops"] > 0 and r["gflops_per_s"] > 0 and r["params"] > 0 for r in convs)
    for r in convs:  # its kernels (aten::mkldnn_convolution ...) have no row: their time is the convolution's
        below = [n for n in prof.nodes if n.name.startswith(r["name"] + "/")]
        assert below and not any(n.name in rows for n in below)
        own = next(n for n in prof.nodes if n.name == r["name"])
        assert r["self_ms"] == pytest.approx(own.self_ms_p50 + sum(n.self_ms_p50 for n in below))
    total = achieved(layers, prof, None)
    assert total["gflops_per_s"] > 0 and total["peak_gflops"] == prof.peak_gflops and total["of_peak"] > 0


def test_device_peaks_come_from_the_datasheet_table_by_nvml_name_or_are_unknown() -> None:
    from farm.peaks import gpu_peak, measure_cpu_peak

    assert gpu_peak("NVIDIA H100 80GB HBM3").gflops == 67_000  # type: ignore[union-attr]
    assert gpu_peak("NVIDIA H100 PCIe", half=True).gflops == 756_000  # type: ignore[union-attr]
    assert gpu_peak("NVIDIA A100-SXM4-80GB").gflops == 19_500  # type: ignore[union-attr]
    assert gpu_peak("Tesla T4").gflops == 8_100  # type: ignore[union-attr]
    assert gpu_peak("NVIDIA L40S").gflops == 91_600 and gpu_peak("NVIDIA L4").gflops == 30_300  # type: ignore[union-attr]
    assert gpu_peak("NVIDIA A10G") is None and gpu_peak("NVIDIA GeForce RTX 4090") is None  # unknown, not guessed
    peak = measure_cpu_peak(1, "0")
    assert peak.gflops > 0 and "measured" in peak.source and "1 thread" in peak.source
    from farm.peaks import Peak
    from workers.profiling.run import best_of

    both = best_of(Peak(10.0, "measured: x"), Peak(12.0, "measured: x"))
    assert both is not None and both.gflops == 12.0 and "10.0 and 12.0" in both.source  # the better, both said
    assert best_of(Peak(5.0, "datasheet"), Peak(5.0, "datasheet")) == Peak(5.0, "datasheet")
