from __future__ import annotations

import numpy as np
import pytest

from schemas import TensorSpec
from schemas.dtypes import (
    BY_NAME,
    DTYPES,
    ONNX_TO_V2,
    ORT_TO_V2,
    TABLE,
    TORCH_TO_V2,
    TYPED_CONTENTS,
    V2_NUMPY_NAME,
    InputSpec,
    normalize_dtype,
    parse_input_spec,
)


def test_one_table_every_view_derives_from() -> None:
    assert len(BY_NAME) == len(TABLE) == len(ONNX_TO_V2) == len(ORT_TO_V2) == 14
    assert DTYPES == ("FP32", "FP16", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "BOOL")
    assert set(DTYPES) <= set(V2_NUMPY_NAME) and set(TORCH_TO_V2.values()) == set(DTYPES)
    for name, np_name in V2_NUMPY_NAME.items():
        assert np.dtype(np_name).name == np_name, name
    assert "BF16" not in V2_NUMPY_NAME and "BYTES" not in V2_NUMPY_NAME and "FP16" not in TYPED_CONTENTS
    for d in DTYPES:  # every requestable datatype is a valid TensorSpec dtype
        assert TensorSpec(name="x", dtype=d, shape=(1,)).dtype == d


def test_aliases_and_unknown_dtypes() -> None:
    assert normalize_dtype(" float ") == "FP32" and normalize_dtype("int") == "INT32"
    assert normalize_dtype("uint16") == "UINT16"
    with pytest.raises(ValueError, match="not supported"):
        normalize_dtype("BF16")


@pytest.mark.parametrize("text,expected", [
    ("input:FP32:3x224x224", ("input", "FP32", (3, 224, 224))),
    ("x:fp32:1,28,28", ("x", "FP32", (1, 28, 28))),
    ("x:float16:[2, 3]", ("x", "FP16", (2, 3))),
    ("input_1:0:FP32:8", ("input_1:0", "FP32", (8,))),
    ("x:3*4", ("x", "FP32", (3, 4))),
    ("flag:BOOL:", ("flag", "BOOL", ())),
    ("s:INT64:scalar", ("s", "INT64", ())),
    ("x:fp32:-1x3x8", ("x", "FP32", (-1, 3, 8))),  # -1: dynamic (the built-in server's --input)
    ("a:b:INT64:4", ("a:b", "INT64", (4,))),
    ("x:UINT16:4", ("x", "UINT16", (4,))),
    ("x:FP99:1", ("x:FP99", "FP32", (1,))),  # not a dtype: part of the name
])
def test_parse_input_spec_accepts_both_former_grammars(text: str, expected: tuple) -> None:
    assert parse_input_spec(text) == InputSpec(*expected)


@pytest.mark.parametrize("text", ["x", ":FP32:3", "x:FP32:3xa", "x:FP32:3x", "x:FP32:0", "x:FP32:-2x3"])
def test_parse_input_spec_bad(text: str) -> None:
    with pytest.raises(ValueError, match="NAME:DTYPE:SHAPE"):
        parse_input_spec(text)
