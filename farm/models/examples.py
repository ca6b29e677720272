"""Example models for tests, demos and benchmarks, built from code with seeded random weights.

All ONNX examples use opset ``OPSET`` / IR ``IR_VERSION`` and a symbolic batch dimension ``batch``, so
the same file serves every batch size. Building an ONNX kind twice with the same arguments gives
identical bytes (same sha256), so the artifact cache de-duplicates them (not with ``calibrate=True``, and
not for TorchScript kinds: torch writes a random serialization id into every file).

Kinds (``EXAMPLE_KINDS``):

- ``mlp``: Gemm(256->512)/Relu/Gemm(512->256)/Relu/Gemm(256->10); input ``input`` FP32 [batch, 256].
- ``convnet``: Conv(3->16,3x3,pad 1)/Relu/MaxPool(2x2)/Conv(16->32,3x3,pad 1)/Relu/GlobalAveragePool/
  Flatten/Gemm(32->10); input ``input`` FP32 [batch, 3, 32, 32].
- ``identity``: one Identity op (harness overhead); input ``input`` FP32 [batch, *shape] (default [4]).
- ``compute``: a chain of MatMuls of ``input`` FP32 [batch, 64, 256] with one shared orthogonal 256x256
  weight, sized to take about ``ms`` milliseconds per sample on one thread. Sizing assumes
  ``ASSUMED_GFLOPS`` (measured on the development box: ~170 GFLOP/s single-threaded ORT, 64x256 @ 256x256)
  unless ``calibrate=True``, which times one layer here (the file then depends on the machine).
- ``memory``: Expand of ``input`` FP32 [batch, 16] to [batch, 16, N] then Mul and ReduceSum, with N
  chosen so that each intermediate holds ``mb`` MiB per sample (inference needs >= ``mb`` MiB; two such
  tensors may be live at once). Small file; the memory is only needed at run time (OOM tests).
- ``torchscript-mlp``, ``torchscript-convnet``: the same MLP/convnet as TorchScript (needs torch).
- ``bert-tiny``: a BERT-style sentence encoder (``farm.models.architectures.bert_model``: 6 layers, hidden
  256, 4 heads, FFN 1024, vocabulary 30522; 12.6 M parameters, 0.65 GMAC per sample at 128 tokens);
  input ``input_ids`` INT64 [batch, seq] (give ``--input input_ids:INT64:128``), output [batch, 256].
- ``resnet18``: ResNet-18 (``resnet_model``: 11.7 M parameters, 1.82 GMAC per sample); input ``input``
  FP32 [batch, 3, 224, 224], output [batch, 1000]. Options: the builders' sizes (e.g. ``image``).
- ``torchscript-bert-tiny``, ``torchscript-resnet18``: the same two as TorchScript with the same weights
  (needs torch); they declare their inputs (``input_ids:INT64:128``, ``input:FP32:3x224x224``).
- ``tiny-llama``: a tiny random-weight Llama for the LLM engines, written into a directory as
  ``tiny-llama.gguf`` and the Hugging Face folder ``tiny-llama-hf/`` (``farm.models.llm_examples``; needs
  the ``llm`` extra).
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import RequestError
from farm.models.architectures import bert_model, resnet_model
from farm.models.llm_examples import build_tiny_llama
from farm.models.spec import onnx_modules
from farm.models.torch_architectures import build_torchscript_architecture
from farm.models.torchscript import build_torchscript

OPSET = 17
IR_VERSION = 8
SEED = 0
ASSUMED_GFLOPS = 170.0
COMPUTE_ROWS = 64
COMPUTE_DIM = 256
ONNX_KINDS: tuple[str, ...] = ("mlp", "convnet", "identity", "compute", "memory", "bert-tiny", "resnet18")
TORCHSCRIPT_KINDS: tuple[str, ...] = ("torchscript-mlp", "torchscript-convnet", "torchscript-bert-tiny",
                                      "torchscript-resnet18")
#: LLM examples: a directory with the model in each form the LLM engines load
LLM_KINDS: tuple[str, ...] = ("tiny-llama",)
EXAMPLE_KINDS: tuple[str, ...] = ONNX_KINDS + TORCHSCRIPT_KINDS + LLM_KINDS
#: TorchScript kinds mirrored from ``farm.models.architectures`` (the others from ``farm.models.torchscript``).
ARCHITECTURE_KINDS: tuple[str, ...] = ("torchscript-bert-tiny", "torchscript-resnet18")


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any], name: str) -> Any:
    onnx, helper, _ = onnx_modules()
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="farm")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _f32_io(name: str, dims: list[Any]) -> Any:
    _, helper, _ = onnx_modules()
    return helper.make_tensor_value_info(name, 1, dims)  # 1 = FLOAT


def _weight(rng: np.random.RandomState, name: str, shape: tuple[int, ...], fan_in: int) -> Any:
    _, _, numpy_helper = onnx_modules()
    arr = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return numpy_helper.from_array(arr, name)


def _bias(rng: np.random.RandomState, name: str, n: int) -> Any:
    _, _, numpy_helper = onnx_modules()
    return numpy_helper.from_array((rng.standard_normal(n) * 0.01).astype(np.float32), name)


def mlp_model(sizes: tuple[int, ...] = (256, 512, 256, 10)) -> Any:
    """Gemm/Relu MLP; input ``input`` [batch, sizes[0]], output ``output`` [batch, sizes[-1]]."""
    _, helper, _ = onnx_modules()
    rng = np.random.RandomState(SEED)
    nodes, inits, prev = [], [], "input"
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        last = i == len(sizes) - 2
        inits += [_weight(rng, f"fc{i}.weight", (b, a), a), _bias(rng, f"fc{i}.bias", b)]
        out = "output" if last else f"fc{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"fc{i}.weight", f"fc{i}.bias"], [out], transB=1))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"]))
            prev = f"relu{i}"
    return _model(nodes, [_f32_io("input", ["batch", sizes[0]])], [_f32_io("output", ["batch", sizes[-1]])],
                  inits, "mlp")


def convnet_model() -> Any:
    """Small conv net on [batch, 3, 32, 32]; output ``output`` [batch, 10]."""
    _, helper, _ = onnx_modules()
    rng = np.random.RandomState(SEED)
    inits = [
        _weight(rng, "conv1.weight", (16, 3, 3, 3), 27), _bias(rng, "conv1.bias", 16),
        _weight(rng, "conv2.weight", (32, 16, 3, 3), 144), _bias(rng, "conv2.bias", 32),
        _weight(rng, "fc.weight", (10, 32), 32), _bias(rng, "fc.bias", 10),
    ]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["c1"], **conv),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], **conv),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["output"], transB=1),
    ]
    return _model(nodes, [_f32_io("input", ["batch", 3, 32, 32])], [_f32_io("output", ["batch", 10])],
                  inits, "convnet")


def identity_model(shape: tuple[int, ...] = (4,)) -> Any:
    """One Identity op; input ``input`` and output ``output`` [batch, *shape]."""
    _, helper, _ = onnx_modules()
    dims = ["batch", *[int(d) for d in shape]]
    return _model([helper.make_node("Identity", ["input"], ["output"])], [_f32_io("input", dims)],
                  [_f32_io("output", dims)], [], "identity")


def compute_layer_flops() -> int:
    """FLOPs per sample of one ``compute`` layer: 2 * rows * dim * dim."""
    return 2 * COMPUTE_ROWS * COMPUTE_DIM * COMPUTE_DIM


def _compute_graph(layers: int) -> Any:
    _, helper, numpy_helper = onnx_modules()
    rng = np.random.RandomState(SEED)
    q, _ = np.linalg.qr(rng.standard_normal((COMPUTE_DIM, COMPUTE_DIM)))
    w = numpy_helper.from_array(q.astype(np.float32), "w")  # orthogonal: values keep their scale
    nodes, prev = [], "input"
    for i in range(layers):
        out = "output" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, "w"], [out]))
        prev = out
    dims = ["batch", COMPUTE_ROWS, COMPUTE_DIM]
    return _model(nodes, [_f32_io("input", dims)], [_f32_io("output", dims)], [w], "compute")


def calibrate_gflops(seconds: float = 0.3) -> float:
    """Single-threaded onnxruntime GFLOP/s of one ``compute`` layer chain, measured here."""
    import onnxruntime as ort  # noqa: PLC0415 - onnxruntime: +0.04 s on every CLI start, measured; calibrate only

    model = _compute_graph(8)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = np.ones((1, COMPUTE_ROWS, COMPUTE_DIM), dtype=np.float32)
    sess.run(None, {"input": x})
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or n < 3:
        sess.run(None, {"input": x})
        n += 1
    return 8 * compute_layer_flops() * n / elapsed / 1e9


def compute_layers(ms: float, gflops: float = ASSUMED_GFLOPS) -> int:
    """Number of MatMul layers for about ``ms`` milliseconds per sample at ``gflops`` GFLOP/s (>= 1)."""
    return max(1, round(ms * 1e-3 * gflops * 1e9 / compute_layer_flops()))


def compute_model(ms: float = 5.0, calibrate: bool = False) -> Any:
    """MatMul chain taking about ``ms`` ms per sample single-threaded; input/output [batch, 64, 256]."""
    if not ms > 0:
        raise RequestError(f"compute model needs ms > 0, got {ms}")
    gflops = calibrate_gflops() if calibrate else ASSUMED_GFLOPS
    return _compute_graph(compute_layers(ms, gflops))


def memory_model(mb: float = 256.0, width: int = 16) -> Any:
    """Needs >= ``mb`` MiB per sample at run time: Expand [batch,16] -> [batch,16,N], Mul, ReduceSum."""
    _, helper, numpy_helper = onnx_modules()
    if not mb > 0:
        raise RequestError(f"memory model needs mb > 0, got {mb}")
    n = max(1, int(np.ceil(mb * (1 << 20) / (4 * width))))
    inits = [
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1, 1, n], dtype=np.int64), "big_shape"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["input", "axis2"], ["x3"]),
        helper.make_node("Expand", ["x3", "big_shape"], ["big"]),
        helper.make_node("Mul", ["big", "big"], ["big_sq"]),
        helper.make_node("ReduceSum", ["big_sq", "axis2"], ["output"], keepdims=0),
    ]
    return _model(nodes, [_f32_io("input", ["batch", width])], [_f32_io("output", ["batch", width])],
                  inits, "memory")


def _out_path(kind: str, out: Path) -> Path:
    out = Path(out)
    if out.is_dir():
        suffix = ".pt" if kind.startswith("torchscript") else ".onnx"
        out = out / f"{kind}{suffix}"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def build_example(kind: str, out: Path, **kw: Any) -> Path:
    """Write example model ``kind`` to ``out`` (a file, or a directory to put ``<kind>.onnx|.pt`` in; for an
    LLM kind, the directory that gets both its forms, which is returned).

    Keyword arguments: ``compute``: ``ms`` (float, default 5.0), ``calibrate`` (bool); ``memory``: ``mb``
    (MiB, default 256), ``width``; ``identity``: ``shape`` (tuple); ``mlp``: ``sizes`` (tuple);
    ``[torchscript-]bert-tiny``: ``vocab``, ``hidden``, ``layers``, ``heads``, ``ffn``, ``max_positions``;
    ``[torchscript-]resnet18``: ``width``, ``classes``, ``image``.
    """
    if kind not in EXAMPLE_KINDS:
        raise RequestError(f"unknown example model {kind!r}; choose one of {', '.join(EXAMPLE_KINDS)}")
    if kind in LLM_KINDS:
        if kw:
            raise RequestError(f"example model {kind!r} takes no options, got {', '.join(kw)}")
        return build_tiny_llama(out).gguf.parent
    path = _out_path(kind, out)
    if kind in TORCHSCRIPT_KINDS:
        name = kind.split("-", 1)[1]
        if kind in ARCHITECTURE_KINDS:
            return build_torchscript_architecture(name, path, **kw)
        if kw:
            raise RequestError(f"example model {kind!r} takes no options, got {', '.join(kw)}")
        return build_torchscript(name, path, mlp_model() if name == "mlp" else convnet_model())
    builders = {"mlp": mlp_model, "convnet": convnet_model, "identity": identity_model,
                "compute": compute_model, "memory": memory_model, "bert-tiny": bert_model, "resnet18": resnet_model}
    try:
        model = builders[kind](**kw)
    except TypeError as exc:
        raise RequestError(f"bad option for example model {kind!r}: {exc}") from None
    onnx, _, _ = onnx_modules()
    onnx.save(model, str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m farm.models.examples KIND OUT [key=value ...]``; prints the written path."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(f"usage: python -m farm.models.examples KIND OUT [key=value ...]; kinds: {', '.join(EXAMPLE_KINDS)}",
              file=sys.stderr)
        return 2
    kw: dict[str, Any] = {}
    for item in args[2:]:
        key, _, value = item.partition("=")
        if value.lower() in ("true", "false"):
            kw[key] = value.lower() == "true"
        elif "x" in value or "," in value:
            kw[key] = tuple(int(v) for v in value.replace(",", "x").split("x") if v)
        else:
            kw[key] = int(value) if value.isdigit() else float(value)
    print(build_example(args[0], Path(args[1]), **kw))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
