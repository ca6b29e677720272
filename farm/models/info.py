"""Model inspection: detect a model file's format, hash it, and infer or check its input spec.

Per-sample shapes exclude the batch dimension (the first dimension of every ONNX input). Dtypes are
KServe v2 datatypes ("FP32", "INT64", ...). Every failure is a one-line ``ModelError`` (or
``RequestError`` for bad ``--input`` text) that says what to do next.
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import ModelError
from farm.models.llm_info import inspect_gguf, inspect_hf_folder, is_gguf

# ModelInfo, the --input text parsers and the declaration names live in farm.models.spec (shared with
# farm.models.torchscript, which info dispatches to); the "as" ones are re-exported: info is their usual import
from farm.models.spec import FARM_INPUTS_ATTR as FARM_INPUTS_ATTR
from farm.models.spec import FARM_INPUTS_EXTRA as FARM_INPUTS_EXTRA
from farm.models.spec import INPUT_HINT, ModelInfo, one_line, sha256_file
from farm.models.spec import format_input_spec as format_input_spec
from farm.models.spec import tensor_spec as tensor_spec
from farm.models.torchscript import inspect_torchscript
from schemas import TensorSpec
from schemas.dtypes import DTYPES, ONNX_TO_V2

if TYPE_CHECKING:
    import onnx

# ONNX TensorProto elem_type -> KServe v2 datatype, only the ones TensorSpec accepts (from schemas.dtypes).
ONNX_TO_KSERVE: dict[int, str] = {e: name for e, name in ONNX_TO_V2.items() if name in DTYPES}

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"%PDF", "a PDF document"), (b"\x1f\x8b", "a gzip archive"), (b"\x7fELF", "an executable"),
    (b"\x93NUMPY", "a NumPy array file"), (b"\x89HDF", "an HDF5 file (Keras?)"),
)


# ------------------------------------------------------------------------------------------ detection
def _check_file(path: Path) -> int:
    if not path.exists():
        raise ModelError(f"model file {path} does not exist; check the path")
    if path.is_dir():
        raise ModelError(f"{path} is a directory; give the model file itself (.onnx or TorchScript .pt)")
    try:
        size = path.stat().st_size
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ModelError(
            f"cannot read model file {path}: {one_line(exc.strerror or exc)}; check its permissions"
        ) from None
    if size == 0:
        raise ModelError(f"model file {path} is empty (0 bytes); re-export or re-download the model")
    return size


def _zip_kind(path: Path) -> str:
    """'torchscript', 'checkpoint' (torch.save) or 'zip' for a zip file."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ModelError(
            f"{path} is a corrupt zip archive ({one_line(exc)}); re-export the TorchScript model"
        ) from None
    if any(n.endswith("constants.pkl") or "/code/" in f"/{n}" for n in names):
        return "torchscript"
    if any(n.endswith("data.pkl") for n in names):
        return "checkpoint"
    return "zip"


def _looks_like_text(head: bytes) -> bool:
    if b"\x00" in head:
        return False
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        try:
            text = head[:-3].decode("utf-8")  # a multi-byte character cut at the end
        except UnicodeDecodeError:
            return False
    printable = sum(c.isprintable() or c in "\r\n\t" for c in text)
    return printable >= 0.95 * max(1, len(text))


def _parse_onnx(path: Path) -> onnx.ModelProto:
    import onnx  # noqa: PLC0415 - onnx: +0.05-0.09 s on every CLI start, measured

    if path.suffix.lower() in (".pt", ".pth", ".ts", ".torchscript", ".jit"):
        suffix = " and, despite its TorchScript extension, not a TorchScript zip (re-export with torch.jit.save)"
    else:
        suffix = ""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except MemoryError:
        raise ModelError(f"{path} is too large to parse as ONNX; models over 2 GiB are not supported") from None
    except Exception as exc:  # DecodeError (python/upb protobuf), RuntimeError, ValueError
        raise ModelError(
            f"{path} is not a valid ONNX model{suffix}: protobuf parse failed ({one_line(exc, 120)}); "
            "the file is truncated or corrupt, re-export or re-download it"
        ) from None
    graph_ok = model.HasField("graph") and (len(model.graph.node) > 0 or len(model.graph.output) > 0)
    if model.ir_version <= 0 or not graph_ok or len(model.opset_import) == 0:
        raise ModelError(
            f"{path} is not an ONNX model{suffix} (no graph, IR version or opset found); "
            "give an ONNX file (.onnx) or a TorchScript file (.pt), and re-export it if it is truncated"
        )
    return model


def _sniff(path: Path) -> tuple[str, Any]:
    """(format, parsed ONNX model or None). Raises ModelError for anything that is not a model."""
    _check_file(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    if is_gguf(head) or path.suffix.lower() == ".gguf":
        return "gguf", None
    if head.startswith(b"PK\x03\x04") or zipfile.is_zipfile(path):
        kind = _zip_kind(path)
        if kind == "torchscript":
            return "torchscript", None
        if kind == "checkpoint":
            raise ModelError(
                f"{path} is a torch.save() checkpoint, not TorchScript; export it with "
                "torch.jit.script(model).save(path) or torch.onnx.export"
            )
        raise ModelError(f"{path} is a zip archive but not a TorchScript model (no code/ or constants.pkl)")
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise ModelError(f"{path} is {what}, not a model; give an ONNX (.onnx) or TorchScript (.pt) file")
    try:
        return "onnx", _parse_onnx(path)
    except ModelError:
        if _looks_like_text(head):  # checked after parsing: an ONNX file may start with a long doc string
            raise ModelError(
                f"{path} is a text file, not a model; give an ONNX (.onnx) or TorchScript (.pt) file"
            ) from None
        raise


def detect_format(path: Path) -> str:
    """``"onnx"``, ``"torchscript"``, ``"gguf"`` or ``"hf"``, decided by content (ONNX: a ModelProto with a
    graph; TorchScript: a zip with ``code/``/``constants.pkl``; GGUF: its magic; hf: a Hugging Face model
    folder). Raises a one-line ModelError for anything else."""
    if Path(path).is_dir():
        return inspect_hf_folder(Path(path)).format
    return _sniff(Path(path))[0]


# ------------------------------------------------------------------------------------------------ ONNX
def _onnx_dims(value_info: Any) -> list[int | str | None] | None:
    """Dims of a ValueInfoProto: int (fixed), str (symbolic name), None (unknown); None if rank unknown."""
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    out: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def _kserve_dtype(elem_type: int, what: str) -> str:
    dtype = ONNX_TO_KSERVE.get(elem_type)
    if dtype is None:
        import onnx  # noqa: PLC0415 - onnx: +0.05-0.09 s on every CLI start, measured

        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"
        raise ModelError(f"{what} has element type {name}, which farm cannot feed; supported: {', '.join(DTYPES)}")
    return dtype


def onnx_graph_inputs(model: onnx.ModelProto) -> list[Any]:
    """The graph's real inputs (ValueInfoProtos), initializers excluded."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _check_given(path: Path, graph_inputs: list[Any], given: list[TensorSpec]) -> list[TensorSpec]:
    """Check user-given specs against the graph; return them in graph order."""
    by_name = {g.name: g for g in given}
    graph_names = [gi.name for gi in graph_inputs]
    missing = [n for n in graph_names if n not in by_name]
    unknown = [n for n in by_name if n not in graph_names]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"model inputs not given: {', '.join(missing)}")
        if unknown:
            parts.append(f"given but not in the model: {', '.join(unknown)}")
        raise ModelError(f"given inputs do not match {path.name}: {'; '.join(parts)}; "
                         f"the model's inputs are {', '.join(graph_names) or '(none)'}")
    problems: list[str] = []
    for gi in graph_inputs:
        spec = by_name[gi.name]
        elem = gi.type.tensor_type.elem_type
        if elem in ONNX_TO_KSERVE and ONNX_TO_KSERVE[elem] != spec.dtype:
            problems.append(f"{gi.name} dtype is {ONNX_TO_KSERVE[elem]}, given {spec.dtype}")
        dims = _onnx_dims(gi)
        if dims is None:
            continue
        per_sample = dims[1:]
        if len(per_sample) != len(spec.shape):
            problems.append(f"{gi.name} has {len(per_sample)} per-sample dims {_fmt_dims(per_sample)}, "
                            f"given {len(spec.shape)} ({'x'.join(map(str, spec.shape)) or 'scalar'})")
            continue
        bad = [i for i, (d, g) in enumerate(zip(per_sample, spec.shape, strict=True)) if isinstance(d, int) and d != g]
        if bad:
            problems.append(f"{gi.name} per-sample shape is {_fmt_dims(per_sample)}, "
                            f"given {'x'.join(map(str, spec.shape))}")
    if problems:
        raise ModelError(f"given inputs do not match {path.name}: {'; '.join(problems)}")
    return [by_name[n] for n in graph_names]


def _fmt_dims(dims: list[int | str | None]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"


def _inspect_onnx(path: Path, model: onnx.ModelProto, given: list[TensorSpec] | None) -> ModelInfo:
    _check_onnx(path, model)
    graph_inputs = onnx_graph_inputs(model)
    if not graph_inputs:
        raise ModelError(f"{path} has no inputs (only initializers); farm needs a model that takes input")
    batch_dims, inferred, need = _read_graph_inputs(path, graph_inputs)
    if given:
        inputs = _check_given(path, graph_inputs, given)
    elif need:
        raise ModelError(f"cannot infer the input shape of {path.name}: {'; '.join(need)}; give it with "
                         f"{INPUT_HINT}")
    else:
        inputs = inferred
    dynamic_batch = all(not isinstance(d, int) for d in batch_dims)
    fixed = sorted({d for d in batch_dims if isinstance(d, int)})
    notes: list[str] = []
    if len(fixed) > 1:
        notes.append(f"inputs disagree on the batch dimension ({', '.join(map(str, fixed))})")
    static_batch = None if dynamic_batch or len(fixed) != 1 else fixed[0]
    if static_batch is not None:
        notes.append(f"the model's batch dimension is fixed at {static_batch}; only batch size {static_batch} "
                     "can be profiled (re-export with a dynamic batch axis for others)")
    outputs = _onnx_outputs(model, inputs, notes, batch=static_batch or 1)
    return ModelInfo(format="onnx", sha256=sha256_file(path), size_bytes=path.stat().st_size, inputs=inputs,
                     outputs=outputs, dynamic_batch=dynamic_batch, static_batch=static_batch, notes=notes)


def _check_onnx(path: Path, model: onnx.ModelProto) -> None:
    """ModelError unless the model is one self-contained file that passes the ONNX checker."""
    import onnx  # noqa: PLC0415 - onnx: +0.05-0.09 s on every CLI start, measured

    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            raise ModelError(f"{path} keeps weights in external data files, which farm cannot ship; "
                             "save it as one file with onnx.save(model, path, save_as_external_data=False)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"{path} fails the ONNX checker: {one_line(exc, 200)}; re-export the model") from None
    except Exception as exc:  # onnx raises a few other types for malformed graphs
        raise ModelError(f"{path} fails the ONNX checker: {one_line(exc, 200)}; re-export the model") from None


def _read_graph_inputs(path: Path, graph_inputs: list[onnx.ValueInfoProto]
                       ) -> tuple[list[int | str | None], list[TensorSpec], list[str]]:
    """(each input's batch dimension, the inputs whose shapes are fully known, what is missing for the rest)."""
    batch_dims: list[int | str | None] = []
    inferred: list[TensorSpec] = []
    need: list[str] = []
    for gi in graph_inputs:
        if not gi.type.HasField("tensor_type"):
            raise ModelError(f"input {gi.name!r} of {path} is not a tensor (sequence/map); farm feeds tensors only")
        dtype = _kserve_dtype(gi.type.tensor_type.elem_type, f"input {gi.name!r}")
        dims = _onnx_dims(gi)
        if dims is None:
            need.append(f"{gi.name!r} has no shape")
            batch_dims.append(None)
            continue
        if not dims:
            raise ModelError(f"input {gi.name!r} of {path} is a scalar with no batch dimension; "
                             "farm needs inputs whose first dimension is the batch")
        batch_dims.append(dims[0])
        per_sample = dims[1:]
        dyn = [i + 1 for i, d in enumerate(per_sample) if not isinstance(d, int)]
        if dyn:
            names = ",".join(f"{i}" + (f" ({dims[i]})" if isinstance(dims[i], str) else "") for i in dyn)
            need.append(f"{gi.name!r} has dynamic dimension {names} in shape {_fmt_dims(dims)}")
            continue
        inferred.append(TensorSpec(name=gi.name, dtype=dtype, shape=tuple(d for d in per_sample if isinstance(d, int))))
    return batch_dims, inferred, need


def fix_input_shapes(model: onnx.ModelProto, inputs: list[TensorSpec], batch: int = 1) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs have concrete shapes ``[batch, *spec.shape]``."""
    import onnx  # noqa: PLC0415 - onnx: +0.05-0.09 s on every CLI start, measured

    m = onnx.ModelProto()
    m.CopyFrom(model)
    by_name = {s.name: s for s in inputs}
    for gi in onnx_graph_inputs(m):
        spec = by_name.get(gi.name)
        if spec is None:
            continue
        shape = gi.type.tensor_type.shape
        del shape.dim[:]
        for d in (batch, *spec.shape):
            shape.dim.add().dim_value = int(d)
    return m


def infer_onnx_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference with data propagation; failures become a one-line ModelError."""
    import onnx  # noqa: PLC0415 - onnx: +0.05-0.09 s on every CLI start, measured

    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # InferenceError and friends
        raise ModelError(f"ONNX shape inference failed: {one_line(exc, 200)}; check the --input shapes") from None


def _onnx_outputs(model: onnx.ModelProto, inputs: list[TensorSpec], notes: list[str],
                  batch: int = 1) -> list[TensorSpec]:
    """Per-sample output specs by shape inference at ``batch``; unknown shapes become () with a note."""
    fixed = fix_input_shapes(model, inputs, batch=batch)
    try:
        inferred = infer_onnx_shapes(fixed)
    except ModelError as exc:
        notes.append(str(exc))
        inferred = fixed
    outs: list[TensorSpec] = []
    for o in inferred.graph.output:
        dtype = _kserve_dtype(o.type.tensor_type.elem_type, f"output {o.name!r}")
        dims = _onnx_dims(o)
        if dims and all(isinstance(d, int) for d in dims[1:]):
            outs.append(TensorSpec(name=o.name, dtype=dtype, shape=tuple(d for d in dims[1:] if isinstance(d, int))))
        else:
            outs.append(TensorSpec(name=o.name, dtype=dtype, shape=()))
            notes.append(f"output {o.name!r} shape could not be inferred ({_fmt_dims(dims or [])}); shown as ()")
    return outs


def inspect_model(path: Path, format: str | None = None, given_inputs: list[TensorSpec] | None = None) -> ModelInfo:
    """Inspect a model file: format, sha256, size, per-sample input/output specs, dynamic batch.

    ONNX inputs are inferred from the graph unless ``given_inputs`` are passed, in which case they are
    checked against it. TorchScript needs ``given_inputs`` unless the file declares ``farm_inputs``.
    """
    return inspect_model_full(path, format, given_inputs)[0]


def inspect_model_full(path: Path, format: str | None = None,
                       given_inputs: list[TensorSpec] | None = None) -> tuple[ModelInfo, Any]:
    """``inspect_model`` plus the parsed ONNX ModelProto (None for TorchScript), to avoid parsing twice."""
    path = Path(path)
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".gguf"):
        info = inspect_hf_folder(path) if path.is_dir() else inspect_gguf(path)
        _given_format(path, format, info.format)
        return info, None
    fmt, model = _sniff(path)
    if fmt == "gguf":
        info = inspect_gguf(path)
        _given_format(path, format, info.format)
        return info, None
    _given_format(path, format, fmt)
    if given_inputs is not None and not given_inputs:
        given_inputs = None
    if fmt == "onnx":
        return _inspect_onnx(path, model, given_inputs), model
    return inspect_torchscript(path, given_inputs), None


def _given_format(path: Path, format: str | None, fmt: str) -> None:
    if format is not None and format != fmt:
        raise ModelError(f"{path.name} was given as {format} but its content is {fmt}; "
                         f"drop --format or pass --format {fmt}")
