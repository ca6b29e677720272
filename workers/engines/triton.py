"""Adapter for the official Triton Inference Server.

Builds a model repository (``<repo>/<name>/config.pbtxt`` + ``<repo>/<name>/1/model.onnx|model.pt``)
from one ONNX or TorchScript file, gives the ``tritonserver`` command line and ``docker run`` arguments,
and attaches to a running server. Triton speaks the same KServe v2 gRPC protocol as farm's built-in
server, so the same client (``ready.wait_ready``, the load generator) drives both.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from farm.errors import ModelError, ServerError
from schemas.dtypes import ONNX_TO_V2
from schemas.engines import CARDS, FORMAT_ENGINE, SERVED_MODEL_NAME
from workers.engines.base import IOSpec, parse_device
from workers.engines.ready import wait_ready
from workers.engines.torchscript_backend import TorchScriptBackend

TRITON_IMAGE = CARDS["triton"].image or ""  # default image (its card's); pass image= to pin another
TRITON_GRPC_PORT = 8001  # inside the container
REPO_MOUNT = "/models"
DEFAULT_MAX_BATCH = 64

_FILES = {"onnx": "model.onnx", "torchscript": "model.pt"}
_THREAD_PARAM = {"onnx": "intra_op_thread_count", "torchscript": "INTRA_OP_THREAD_COUNT"}


def v2_to_config_type(datatype: str) -> int:
    """KServe v2 datatype (``FP32``) -> model config DataType enum (``TYPE_FP32``)."""
    name = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    try:
        return mc.DataType.Value(name)
    except ValueError:
        raise ServerError(f"datatype {datatype!r} has no Triton config type; use a KServe v2 datatype") from None


def onnx_io(model_path: Path) -> tuple[list[IOSpec], list[IOSpec]]:
    """The inputs and outputs an ONNX file declares (initializers excluded), -1 for dynamic dims."""
    import onnx  # noqa: PLC0415 - ~0.2 s, ~10 MiB; the built-in server imports this module without needing it

    try:
        m = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {model_path}: {exc}; check the file") from exc
    inits = {i.name for i in m.graph.initializer}

    def spec(v: Any) -> IOSpec:
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim)
        return IOSpec(v.name, ONNX_TO_V2.get(t.elem_type, f"ONNX_{t.elem_type}"), dims)

    return [spec(v) for v in m.graph.input if v.name not in inits], [spec(v) for v in m.graph.output]


def torchscript_outputs(model_path: Path, inputs: list[IOSpec]) -> list[IOSpec]:
    """Discover a TorchScript model's outputs by one warm-up run with the declared inputs (needs torch)."""
    b = TorchScriptBackend()
    b.declare_inputs(inputs)
    b.load(model_path, "cpu", threads=1)
    try:
        outs = b.outputs()
    finally:
        b.close()
    if not outs:
        raise ModelError(
            "cannot discover the TorchScript model's outputs: declare every input's datatype and shape "
            "(e.g. x:FP32:-1x3x224x224), or pass outputs= explicitly"
        )
    return outs


def _batchable(specs: list[IOSpec]) -> bool:
    return bool(specs) and all(s.shape is not None and len(s.shape) > 0 and s.shape[0] == -1 for s in specs)


def model_config(
    model_name: str,
    model_format: str,
    inputs: list[IOSpec],
    outputs: list[IOSpec],
    *,
    max_batch_size: int | None = None,
    instances: int = 1,
    device: str = "cpu",
    threads: int = 0,
    max_queue_delay_us: int | None = None,
    preferred_batch_size: int | None = None,
) -> mc.ModelConfig:
    """The Triton ModelConfig proto. ``max_batch_size`` None: DEFAULT_MAX_BATCH when every tensor's first
    dim is dynamic, else 0 (no batching; dims given in full). Shapes in ``inputs``/``outputs`` include
    the batch dim."""
    if model_format not in _FILES:
        raise ServerError(f"Triton adapter handles formats {', '.join(_FILES)}, not {model_format!r}")
    if instances < 1:
        raise ServerError(f"instances must be >= 1, got {instances}")
    batchable = _batchable(inputs) and _batchable(outputs)
    if max_batch_size is None:
        max_batch_size = DEFAULT_MAX_BATCH if batchable else 0
    if max_batch_size > 0 and not batchable:
        raise ServerError(
            f"max_batch_size {max_batch_size} needs a dynamic first dimension on every input and output; "
            "export the model with a dynamic batch axis or use max_batch_size=0"
        )
    backend = CARDS[FORMAT_ENGINE[model_format]].triton_backend  # Triton loads a format as its engine's card says
    cfg = mc.ModelConfig(name=model_name, backend=backend, max_batch_size=max_batch_size,
                         default_model_filename=_FILES[model_format])
    for specs, target, kind in ((inputs, cfg.input, "input"), (outputs, cfg.output, "output")):
        for s in specs:
            if s.shape is None or not s.datatype:
                raise ServerError(
                    f"{kind} {s.name!r} has no datatype/shape; Triton needs both in config.pbtxt: declare it"
                )
            dims = list(s.shape[1:] if max_batch_size > 0 else s.shape)
            target.add(name=s.name, data_type=v2_to_config_type(s.datatype), dims=dims or [1])
    gpu = parse_device(device)[0] == "gpu"
    group = cfg.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_GPU if gpu
                                   else mc.ModelInstanceGroup.KIND_CPU)
    if gpu:
        group.gpus.append(0)
    if threads > 0:
        cfg.parameters[_THREAD_PARAM[model_format]].string_value = str(threads)
    _dynamic_batching(cfg, max_queue_delay_us, preferred_batch_size)
    return cfg


def _dynamic_batching(cfg: mc.ModelConfig, max_queue_delay_us: int | None, preferred: int | None) -> None:
    """Write ``dynamic_batching`` (delay in µs, optional preferred batch size) when a delay is given."""
    if max_queue_delay_us is None:
        return
    if cfg.max_batch_size == 0:
        raise ServerError("dynamic batching needs a model with a dynamic batch dimension (max_batch_size > 0); "
                          "export it with a dynamic batch axis or drop --max-queue-delay-us")
    cfg.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    if preferred is not None:
        cfg.dynamic_batching.preferred_batch_size.append(min(preferred, cfg.max_batch_size))


def config_pbtxt(cfg: mc.ModelConfig) -> str:
    """The config.pbtxt text of a ModelConfig."""
    return text_format.MessageToString(cfg)


def build_repository(
    repo_dir: Path,
    model_path: Path,
    model_format: str,
    model_name: str = SERVED_MODEL_NAME,
    *,
    inputs: list[IOSpec] | None = None,
    outputs: list[IOSpec] | None = None,
    max_batch_size: int | None = None,
    instances: int = 1,
    device: str = "cpu",
    threads: int = 0,
    max_queue_delay_us: int | None = None,
    preferred_batch_size: int | None = None,
) -> Path:
    """Write ``repo_dir/model_name/{config.pbtxt,1/<file>}`` and return ``repo_dir``.

    ONNX tensors are read from the file; TorchScript needs ``inputs`` (and discovers ``outputs`` with torch
    when not given). The model file is hard-linked when possible, else copied (symlinks break in mounts)."""
    model_path = Path(model_path)
    if not model_path.is_file():
        raise ModelError(f"model file {model_path} does not exist; check the path")
    if model_format == "onnx":
        file_in, file_out = onnx_io(model_path)
        inputs, outputs = inputs or file_in, outputs or file_out
    elif model_format == "torchscript":
        if not inputs:
            raise ServerError("a TorchScript model carries no input specs; pass inputs= (name, datatype, shape)")
        outputs = outputs or torchscript_outputs(model_path, inputs)
    cfg = model_config(model_name, model_format, inputs or [], outputs or [], max_batch_size=max_batch_size,
                       instances=instances, device=device, threads=threads,
                       max_queue_delay_us=max_queue_delay_us, preferred_batch_size=preferred_batch_size)
    model_dir = Path(repo_dir) / model_name
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    target = version_dir / _FILES[model_format]
    if target.exists():
        target.unlink()
    try:
        os.link(model_path, target)
    except OSError:
        shutil.copy2(model_path, target)
    (model_dir / "config.pbtxt").write_text(config_pbtxt(cfg))
    return Path(repo_dir)


def tritonserver_command(repo_dir: str | Path = REPO_MOUNT, grpc_port: int = TRITON_GRPC_PORT) -> list[str]:
    """The ``tritonserver`` command line: gRPC only, no HTTP/metrics, exit if the model fails to load."""
    return [
        "tritonserver",
        f"--model-repository={repo_dir}",
        f"--grpc-port={grpc_port}",
        "--allow-http=false",
        "--allow-metrics=false",
        "--model-control-mode=none",
        "--exit-on-error=true",
        "--strict-readiness=true",
    ]


def docker_run_kwargs(
    repo_dir: Path,
    host_port: int,
    *,
    device: str = "cpu",
    gpu_ids: list[str] | None = None,
    image: str = TRITON_IMAGE,
    host: str = "127.0.0.1",
) -> dict[str, Any]:
    """Keyword arguments for ``docker.from_env().containers.run``: repo mounted read-only at /models,
    container gRPC port published on ``host:host_port`` only, GPUs requested when ``device`` is a gpu."""
    kw: dict[str, Any] = {
        "image": image,
        "command": tritonserver_command(REPO_MOUNT, TRITON_GRPC_PORT),
        "volumes": {str(Path(repo_dir).resolve()): {"bind": REPO_MOUNT, "mode": "ro"}},
        "ports": {f"{TRITON_GRPC_PORT}/tcp": (host, host_port)},
        "shm_size": "1g",
        "detach": True,
        "labels": {"farm.engine": "triton"},
    }
    if parse_device(device)[0] == "gpu":
        import docker  # noqa: PLC0415 - farm's image has no docker SDK, and its server imports this module

        kw["device_requests"] = [
            docker.types.DeviceRequest(device_ids=gpu_ids, capabilities=[["gpu"]]) if gpu_ids
            else docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])
        ]
    return kw


@dataclass
class AttachedServer:
    """A running KServe v2 server (Triton or farm's own) that farm will drive."""

    url: str
    model_name: str
    server_name: str
    server_version: str
    platform: str
    inputs: list[IOSpec] = field(default_factory=list)
    outputs: list[IOSpec] = field(default_factory=list)

    @property
    def host(self) -> str:
        return self.url.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def attach(url: str, model_name: str = SERVED_MODEL_NAME, timeout_s: float = 60.0) -> AttachedServer:
    """Wait until ``url`` serves ``model_name``, then read its server and model metadata."""
    wait_ready(url, model_name, timeout_s)
    with grpc.insecure_channel(url) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        try:
            sm = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=10)
            mm = stub.ModelMetadata(pb.ModelMetadataRequest(name=model_name), timeout=10)
        except grpc.RpcError as exc:
            raise ServerError(
                f"the server at {url} is ready but its metadata call failed ({exc.code().name}: "
                f"{exc.details()}); check it implements KServe v2 gRPC"
            ) from exc

    def specs(ts: Any) -> list[IOSpec]:
        return [IOSpec(t.name, t.datatype, tuple(t.shape)) for t in ts]

    return AttachedServer(url, model_name, sm.name, sm.version, mm.platform, specs(mm.inputs), specs(mm.outputs))
