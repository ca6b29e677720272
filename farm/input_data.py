"""``--input-data random|zeros|FILE``: reading a data file (``.npz``, or JSON: one array per input) and
checking it against the model's inputs at submit time, so that a bad file is a one-line error naming the
input and the mismatch, never a failed job; and the one generator of the tensors a job sends
(:func:`input_tensors`), used by the load generator and the edge bench alike, so that the served and the
edge jobs of a request send the same data."""
from __future__ import annotations

import base64
import hashlib
import json
import math
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from farm.errors import RequestError
from schemas import TensorSpec
from schemas.dtypes import DTYPES, V2_NUMPY_NAME
from schemas.input_data import MAX_FILE_BYTES, DataArray, InputData

#: the most an .npz may inflate to (the sizes its archive declares, and each array's header shape): the data a
#: job may carry (``MAX_FILE_BYTES``) in its widest source dtype (float64 rows for an INT8 input: 8x), plus
#: the .npy headers. Checked before anything is decompressed: a 2 MB archive of zeros can declare gigabytes
MAX_NPZ_BYTES = 8 * MAX_FILE_BYTES + (1 << 16)
#: the largest JSON data file read (its text: about 20 characters per number holds MAX_FILE_BYTES of data)
MAX_JSON_BYTES = 32 * MAX_FILE_BYTES


def _check_npz(path: Path, where: str) -> None:
    """RequestError when the archive declares more than ``MAX_NPZ_BYTES`` uncompressed (its members' sizes in
    the zip directory, then each .npy header's shape and dtype), read without inflating any array. zipfile
    stops each member's stream at its declared size, so the declared total also caps what np.load inflates."""
    with zipfile.ZipFile(path) as z:
        declared = sum(info.file_size for info in z.infolist())
        if declared > MAX_NPZ_BYTES:
            raise RequestError(f"{where} inflates to {declared >> 20} MiB, above {MAX_NPZ_BYTES >> 20} MiB; keep "
                               f"fewer rows (at most {MAX_FILE_BYTES >> 20} MiB of data: they are cycled)")
        for info in z.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with z.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read_header(member)
            if math.prod(shape) * dtype.itemsize > MAX_NPZ_BYTES:
                raise RequestError(f"{where}: array {info.filename[:-4]!r} declares shape {list(shape)} "
                                   f"{dtype}, above {MAX_NPZ_BYTES >> 20} MiB; keep fewer rows (they are cycled)")


def _read(path: Path) -> dict[str, np.ndarray]:
    """The file's arrays by name; RequestError when it cannot be read as .npz or JSON (or an .npz would
    inflate past ``MAX_NPZ_BYTES``)."""
    where = f"input data file {path}"
    if not path.is_file():
        raise RequestError(f"{where} does not exist; give random, zeros or a .npz/.json file")
    if path.suffix.lower() == ".npz":
        try:
            _check_npz(path, where)
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise RequestError(f"{where} is not a readable .npz archive ({exc}); write it with numpy.savez") from None
    if path.suffix.lower() == ".json":
        if path.stat().st_size > MAX_JSON_BYTES:
            raise RequestError(f"{where} is {path.stat().st_size >> 20} MiB, above {MAX_JSON_BYTES >> 20} MiB of "
                               "JSON; keep fewer rows (they are cycled) or write an .npz")
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise RequestError(f"{where} is not valid JSON ({exc}); give one array per input name") from None
        if not isinstance(doc, dict):
            raise RequestError(f"{where} must hold an object mapping each input name to an array of rows")
        out: dict[str, np.ndarray] = {}
        for name, rows in doc.items():
            try:
                out[name] = np.asarray(rows)
            except ValueError:
                raise RequestError(f"{where}: input {name!r} is not a rectangular array "
                                   "(rows of equal length)") from None
            if out[name].dtype.kind not in "biuf":
                raise RequestError(f"{where}: input {name!r} holds {out[name].dtype.kind!r}-kind values, not numbers")
        return out
    raise RequestError(f"{where}: use a .npz or .json file (one array per input, rows first)")


def _fit(where: str, spec: TensorSpec, arr: np.ndarray) -> np.ndarray:
    """``arr`` as rows of ``spec`` (dtype and per-row shape); RequestError naming the mismatch."""
    want = np.dtype(V2_NUMPY_NAME[spec.dtype])
    shape = tuple(spec.shape)
    if arr.shape == shape:  # a single row given without its row axis
        arr = arr.reshape((1, *shape))
    if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape or arr.shape[0] < 1:
        raise RequestError(f"{where}: input {spec.name!r} has shape {list(arr.shape)}, the model expects rows of "
                           f"{list(shape)} (shape [rows, {', '.join(map(str, shape))}])")
    kinds = {"f": "f", "i": "iu", "u": "iu", "b": "b"}[want.kind]
    if arr.dtype.kind not in kinds and not (want.kind == "f" and arr.dtype.kind in "iu"):
        raise RequestError(f"{where}: input {spec.name!r} holds {arr.dtype} values, the model expects {spec.dtype}")
    if want.kind in "iu":
        info = np.iinfo(want)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise RequestError(f"{where}: input {spec.name!r} has values outside {spec.dtype} "
                               f"({info.min}..{info.max})")
    return np.ascontiguousarray(arr.astype(want.newbyteorder("<"), copy=False))


def check_input_sizes(inputs: Sequence[TensorSpec], batch_sizes: Sequence[int], limit: int) -> None:
    """RequestError when one batch of an input, at the request's largest batch size, would take more than
    ``limit`` bytes (``FARM_MAX_INPUT_BYTES``): computed from the shapes, before any model is loaded or tensor
    allocated, so ``--input x:FP32:1000000000`` is refused at submit instead of failing on a worker."""
    batch = max(batch_sizes, default=1)
    for spec in inputs:
        size = math.prod(spec.shape) * batch * np.dtype(V2_NUMPY_NAME[spec.dtype]).itemsize
        if size > limit:
            raise RequestError(f"input {spec.name!r} ({spec.dtype} {'x'.join(map(str, spec.shape))}) takes "
                               f"{size / 2**20:,.0f} MiB per batch of {batch}, above the limit of "
                               f"{limit / 2**20:,.0f} MiB (FARM_MAX_INPUT_BYTES); give smaller shapes or batches")


def resolve_input_data(data: InputData | None, inputs: list[TensorSpec]) -> InputData | None:
    """``data`` ready for the jobs: random/zeros as they are; a file (``source``: its path) read and its
    arrays checked against ``inputs``. RequestError, naming the input and the mismatch, when unfit."""
    if data is None or data.kind != "file" or data.arrays is not None:
        return data
    path = Path(data.source or "").expanduser()
    where = f"input data file {path.name}"
    found = _read(path)
    names = [s.name for s in inputs]
    unknown = [n for n in found if n not in names]
    missing = [n for n in names if n not in found]
    if unknown or missing:
        parts = ([f"no array for input(s) {', '.join(map(repr, missing))}"] if missing else []) + \
                ([f"array(s) {', '.join(map(repr, unknown))} match no input"] if unknown else [])
        raise RequestError(f"{where}: {'; '.join(parts)}; the model's inputs are {', '.join(names)}")
    arrays = {s.name: _fit(where, s, found[s.name]) for s in inputs}
    size = sum(a.nbytes for a in arrays.values())
    if size > MAX_FILE_BYTES:
        raise RequestError(f"{where} holds {size >> 10} KiB of data, above {MAX_FILE_BYTES >> 20} MiB; "
                           "keep fewer rows (they are cycled)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return InputData(kind="file", source=path.name, sha256=digest, arrays={
        s.name: DataArray(dtype=s.dtype, shape=tuple(arrays[s.name].shape),
                          b64=base64.b64encode(arrays[s.name].tobytes()).decode()) for s in inputs})


#: random values of an input without a ``value_range``: floats uniform in [0, 1), integers in [0, 99] (small,
#: so index-like inputs stay valid); booleans are fair coin flips
DEFAULT_FLOAT_RANGE = (0.0, 1.0)
DEFAULT_INT_RANGE = (0.0, 99.0)
#: KServe v2 datatype -> numpy dtype (little-endian, as the protocol's raw contents are)
V2_NUMPY: dict[str, np.dtype] = {name: np.dtype(V2_NUMPY_NAME[name]).newbyteorder("<") for name in DTYPES}


def random_tensor(spec: TensorSpec, batch_size: int, seed: int = 0) -> np.ndarray:
    """Random data of ``spec``'s dtype, shape ``(batch_size, *spec.shape)``: uniform in ``spec.value_range``
    (low, high) when given (floats in [low, high), integers in [low, high] both included), else in
    :data:`DEFAULT_FLOAT_RANGE` / :data:`DEFAULT_INT_RANGE`. The same ``seed`` gives the same data."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dtype = V2_NUMPY.get(spec.dtype)
    if dtype is None:
        raise ValueError(f"dtype {spec.dtype!r} has no numpy equivalent; allowed: {', '.join(V2_NUMPY)}")
    rng = np.random.default_rng(seed)
    shape = (batch_size, *spec.shape)
    low, high = spec.value_range or (DEFAULT_FLOAT_RANGE if dtype.kind == "f" else DEFAULT_INT_RANGE)
    if dtype.kind == "f":
        return (low + (high - low) * rng.random(shape, dtype=np.float64)).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.integers(int(low), int(high), size=shape, endpoint=True).astype(dtype)


def input_tensor(spec: TensorSpec, batch_size: int, data: InputData | None, seed: int = 0,
                 first_row: int = 0) -> np.ndarray:
    """The tensor sent for ``spec``: random (``data`` None or ``random``), zeros, or the file's rows in
    order from ``first_row``, cycled past the file's end."""
    if data is None or data.kind == "random":
        return random_tensor(spec, batch_size, seed)
    dtype = V2_NUMPY[spec.dtype]
    if data.kind == "zeros":
        return np.zeros((batch_size, *spec.shape), dtype=dtype)
    arr = (data.arrays or {}).get(spec.name)
    if arr is None:
        raise ValueError(f"the input data file has no array for input {spec.name!r}")
    rows = np.frombuffer(base64.b64decode(arr.b64), dtype=V2_NUMPY[arr.dtype]).reshape(arr.shape)
    if tuple(rows.shape[1:]) != tuple(spec.shape) or arr.dtype != spec.dtype:
        raise ValueError(f"the input data of {spec.name!r} has rows of {list(rows.shape[1:])} {arr.dtype}, "
                         f"the model expects {list(spec.shape)} {spec.dtype}")
    return np.ascontiguousarray(rows[(first_row + np.arange(batch_size)) % rows.shape[0]])


def input_tensors(specs: Sequence[TensorSpec], batch_size: int, data: InputData | None, seed: int = 0,
                  first_row: int = 0) -> dict[str, np.ndarray]:
    """One batch of every input of ``specs`` by name, the i-th drawn with ``seed + i`` (:func:`input_tensor`):
    what a served request and an edge run of the same job send."""
    return {spec.name: input_tensor(spec, batch_size, data, seed=seed + i, first_row=first_row)
            for i, spec in enumerate(specs)}
