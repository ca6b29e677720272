"""Size limits checked before anything is allocated (issue 27, point 6): an input shape whose batch would
exceed FARM_MAX_INPUT_BYTES is refused before the model is loaded, a shape beyond the schema's element cap is
invalid, and an .npz input data file is refused by the sizes it declares, before any array is inflated."""
from __future__ import annotations

import io
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

import scheduler.enqueue as enqueue
from farm.errors import RequestError
from farm.input_data import MAX_NPZ_BYTES, check_input_sizes, resolve_input_data
from farm.settings import default_max_input_bytes
from schemas import ProfileRequest, TensorSpec
from schemas.input_data import InputData

#: the MLP example's input
MLP = TensorSpec(name="input", shape=(256,))


def write_npz_bomb(path: Path, inflated: int, name: str = "input") -> Path:
    """An .npz whose one array (``name``: FP32 rows of 256) inflates to ``inflated`` bytes of zeros,
    deflated to a few hundred KB, written in chunks (never held in memory)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (inflated // 1024, 256)})
    chunk = bytes(1 << 20)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z, \
            z.open(f"{name}.npy", "w", force_zip64=True) as member:
        member.write(header.getvalue())
        for _ in range(inflated // len(chunk)):
            member.write(chunk)
    return path


def _lying_npz(path: Path) -> Path:
    """An .npz whose member is small (and says so in the zip directory) but whose .npy header declares
    10**9 rows: np.load would allocate the array from the header before finding the data short."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**9, 256)})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("input.npy", header.getvalue() + bytes(1024))
    return path


def _file(path: Path) -> InputData:
    return InputData.model_validate({"kind": "file", "source": str(path)})


def test_an_npz_bomb_is_refused_by_its_declared_size_without_inflating(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = write_npz_bomb(tmp_path / "bomb.npz", 256 << 20)
    assert bomb.stat().st_size < 2 << 20 and 256 << 20 > MAX_NPZ_BYTES

    def no_load(*_: object, **__: object) -> None:
        raise AssertionError("np.load called on an archive above the limit")

    monkeypatch.setattr(np, "load", no_load)
    tracemalloc.start()
    try:
        with pytest.raises(RequestError, match=r"inflates to 256 MiB, above \d+ MiB"):
            resolve_input_data(_file(bomb), [MLP])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_an_npy_header_declaring_a_huge_array_is_refused_before_loading(tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(RequestError, match=r"array 'input' declares shape \[1000000000, 256\] float32"):
            resolve_input_data(_file(_lying_npz(tmp_path / "lying.npz")), [MLP])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_a_small_npz_is_still_read(tmp_path: Path) -> None:
    np.savez(tmp_path / "ok.npz", input=np.ones((4, 256), dtype=np.float64))  # float64 rows for an FP32 input
    data = resolve_input_data(_file(tmp_path / "ok.npz"), [MLP])
    assert data is not None and data.arrays is not None and data.arrays["input"].shape == (4, 256)


def test_input_bytes_are_bounded_per_batch() -> None:
    limit = 64 << 20
    check_input_sizes([TensorSpec(name="x", shape=(3, 224, 224))], [1, 64], limit)  # 37 MiB per batch of 64
    with pytest.raises(RequestError, match=r"'x' \(FP32 3x224x224\) takes 74 MiB per batch of 128.*"
                                           "FARM_MAX_INPUT_BYTES"):
        check_input_sizes([TensorSpec(name="x", shape=(3, 224, 224))], [1, 128], limit)
    assert 1 << 20 <= default_max_input_bytes() <= 1 << 30


def test_a_shape_beyond_the_element_cap_is_invalid() -> None:
    with pytest.raises(ValidationError, match="elements per sample"):
        TensorSpec(name="x", shape=(1 << 20, 1 << 20))


def test_a_shape_bomb_is_refused_before_the_model_is_loaded(sqlite_url: str, example_onnx: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``--input input:FP32:1000000000`` (4 GB a sample): refused by ``plan`` before the model is inspected
    (a TorchScript dry run would allocate the input)."""
    def no_inspection(*_: object, **__: object) -> None:
        raise AssertionError("the model was inspected for a request above the input limit")

    monkeypatch.setattr(enqueue, "inspect_model", no_inspection)
    req = ProfileRequest(model=str(example_onnx), inputs=[{"name": "input", "shape": [1_000_000_000]}])
    with pytest.raises(RequestError, match=r"takes 3,815 MiB per batch of 1, above the limit of .* MiB "
                                           r"\(FARM_MAX_INPUT_BYTES\)"):
        enqueue.plan(req)


def test_cli_refuses_each_bomb_in_one_line_with_exit_2(sqlite_url: str, example_onnx: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The matrix, rate range, shape and npz bombs through ``farm submit``: exit 2, one ``error:`` line, no
    request stored."""
    from farm.cli.main import main
    from farm.readers.results import recent_requests

    many = ",".join(map(str, range(1, 1001)))
    bomb = write_npz_bomb(tmp_path / "bomb.npz", 64 << 20)
    cases = {"FARM_JOB_LIMIT": ["-b", many, "-c", many],
             "rates; use a larger step": ["--rate", "1:1000000:1"],
             "FARM_MAX_INPUT_BYTES": ["--input", "input:FP32:1000000000"],
             "inflates to 64 MiB": ["--input-data", str(bomb)]}
    for expected, args in cases.items():
        with pytest.raises(SystemExit) as exc:
            main(["submit", str(example_onnx), *args])
        err = capsys.readouterr().err
        assert exc.value.code == 2, (args[0], err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err
    assert recent_requests() == []
