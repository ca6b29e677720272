"""``--input-data random|zeros|FILE``: reading a data file (``.npz``, or JSON: one array per input) and
checking it against the model's inputs at submit time, so that a bad file is a one-line error naming the
input and the mismatch, never a failed job."""
from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

from farm.errors import RequestError
from schemas import TensorSpec
from schemas.dtypes import V2_NUMPY_NAME
from schemas.input_data import MAX_FILE_BYTES, DataArray, InputData


def _read(path: Path) -> dict[str, np.ndarray]:
    """The file's arrays by name; RequestError when it cannot be read as .npz or JSON."""
    where = f"input data file {path}"
    if not path.is_file():
        raise RequestError(f"{where} does not exist; give random, zeros or a .npz/.json file")
    if path.suffix.lower() == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise RequestError(f"{where} is not a readable .npz archive ({exc}); write it with numpy.savez") from None
    if path.suffix.lower() == ".json":
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
