"""Realistic input data: value ranges per input, ``--input-data zeros|FILE`` (rows cycled), one-line
errors for unfit files, and the result saying which data was sent. The end-to-end test profiles an
embedding lookup (Gather over a 50-row table), which fails on the default random ids and runs on ids
kept in the vocabulary by a value range or a data file."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from farm.errors import RequestError
from farm.input_data import resolve_input_data
from farm.models.info import format_input_spec, tensor_spec
from schemas import TensorSpec
from schemas.input_data import DataArray, InputData
from tests.helpers import FAST, farm, gather_model
from workers.engines.base import IOSpec
from workers.engines.decode import decode_inputs
from workers.loadgen.kserve.request import build_request, input_tensor, random_tensor

VOCAB = 50
IDS = TensorSpec(name="ids", dtype="INT64", shape=(8,))
X = TensorSpec(name="x", dtype="FP32", shape=(2,))


def build_lookup(path: Path) -> Path:
    """ids: INT64 [N, 8] -> Gather over a [VOCAB, 4] table -> emb: FP32 [N, 8, 4]."""
    return gather_model(path, VOCAB, 4, 8, out_name="emb")


def test_value_range_parses_and_bounds_random_values() -> None:
    spec = tensor_spec("input_ids:INT64:128:0..30521")
    assert (spec.name, spec.dtype, spec.shape, spec.value_range) == ("input_ids", "INT64", (128,), (0, 30521))
    assert tensor_spec(format_input_spec(spec)) == spec
    ints = random_tensor(TensorSpec(name="t", dtype="INT32", shape=(1000,), value_range=(5, 6)), 2)
    assert set(np.unique(ints)) == {5, 6}  # both ends included
    floats = random_tensor(TensorSpec(name="f", dtype="FP32", shape=(1000,), value_range=(-2, -1)), 1)
    assert floats.min() >= -2 and floats.max() < -1
    for bad, needle in (("ids:INT64:8:9..1", "LOW > HIGH"), ("ids:INT64:8:0.5..3", "whole numbers")):
        with pytest.raises(RequestError, match=needle):
            tensor_spec(bad)


def test_zeros_and_file_rows_cycle_into_the_batch(tmp_path: Path) -> None:
    zeros = input_tensor(X, 3, InputData(kind="zeros"))
    assert zeros.shape == (3, 2) and not zeros.any()
    ids = np.arange(16, dtype=np.int64).reshape(2, 8)
    np.savez(tmp_path / "d.npz", ids=ids, x=np.array([[1.5, 2.5], [3.5, 4.5], [5.5, 6.5]]))
    data = resolve_input_data(InputData.model_validate(str(tmp_path / "d.npz")), [IDS, X])
    assert data is not None and data.kind == "file" and data.describe()["rows"] == {"ids": 2, "x": 3}
    got = input_tensor(IDS, 5, data)
    assert got.dtype == np.int64 and (got == ids[[0, 1, 0, 1, 0]]).all()
    # what the server decodes is exactly the file's rows (x: float64 in the file, FP32 on the wire)
    specs = {"ids": IOSpec("ids", "INT64", (-1, 8)), "x": IOSpec("x", "FP32", (-1, 2))}
    feed = decode_inputs(build_request("m", [IDS, X], 4, data=data), specs)
    assert (feed["x"] == np.array([[1.5, 2.5], [3.5, 4.5], [5.5, 6.5], [1.5, 2.5]], np.float32)).all()
    (tmp_path / "d.json").write_text(json.dumps({"ids": ids.tolist(), "x": [[0, 1]]}))
    data = resolve_input_data(InputData.model_validate(str(tmp_path / "d.json")), [IDS, X])
    assert data is not None and (input_tensor(X, 2, data) == [[0, 1], [0, 1]]).all()


BAD_FILES = [
    ("missing.npz", {"ids": np.zeros((2, 8), np.int64)}, "no array for input(s) 'x'"),
    ("extra.npz", {"ids": np.zeros((2, 8), np.int64), "x": np.zeros((1, 2)), "mask": np.ones(3)},
     "'mask' match no input"),
    ("shape.npz", {"ids": np.zeros((2, 7), np.int64), "x": np.zeros((1, 2))}, "input 'ids' has shape [2, 7]"),
    ("dtype.npz", {"ids": np.zeros((2, 8)), "x": np.zeros((1, 2))}, "input 'ids' holds float64 values"),
    ("range.json", {"ids": [[2 ** 40] * 8], "x": [[0, 0]]}, None),
    ("ragged.json", {"ids": [[1, 2], [3]], "x": [[0, 0]]}, "input 'ids' is not a rectangular array"),
    ("bad.json", "{not json", "is not valid JSON"),
    ("data.csv", "1,2", "use a .npz or .json file"),
]


@pytest.mark.parametrize(("name", "content", "needle"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_unfit_files_are_one_line_errors_naming_the_input(tmp_path: Path, name: str, content: object,
                                                           needle: str | None) -> None:
    path = tmp_path / name
    if isinstance(content, dict) and name.endswith(".npz"):
        np.savez(path, **content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    ids = TensorSpec(name="ids", dtype="INT32", shape=(8,)) if name == "range.json" else IDS
    with pytest.raises(RequestError) as err:
        resolve_input_data(InputData.model_validate(str(path)), [ids, X])
    text = str(err.value)
    assert "\n" not in text and name in text
    assert needle in text if needle else "outside INT32" in text and "'ids'" in text


def test_missing_file_through_the_cli_is_one_line(tmp_path: Path) -> None:
    model = build_lookup(tmp_path / "lookup.onnx")
    np.savez(tmp_path / "ids.npz", ids=np.zeros((3, 9), np.int64))
    proc = farm("submit", str(model), "--input-data", str(tmp_path / "ids.npz"), check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "input 'ids' has shape [3, 9]" in lines[0] and "[8]" in lines[0]


@pytest.mark.slow
def test_value_range_and_data_file_keep_ids_in_the_vocabulary(tmp_path: Path) -> None:
    """Random ids in [0, 99] break a 50-row embedding; a value range or a file of real ids does not,
    and every result says which data it sent."""
    model = build_lookup(tmp_path / "lookup.onnx")
    np.savez(tmp_path / "ids.npz", ids=np.array([[1, 2, 3, 4, 5, 6, 7, 49]], np.int64))

    def run(*args: str) -> dict[str, object]:
        farm("submit", str(model), "--batch-sizes", "3", *args, *FAST, check=False)
        rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
        rows = json.loads(farm("results", rid, "--format", "json").stdout)
        assert len(rows) == 1
        return rows[0]

    plain = run()
    assert plain["status"] == "failed" and plain["input_data"] == "random"
    ranged = run("--input", f"ids:INT64:8:0..{VOCAB - 1}")
    assert ranged["status"] == "succeeded" and ranged["error_count"] == 0
    filed = run("--input-data", str(tmp_path / "ids.npz"))
    assert filed["status"] == "succeeded" and filed["input_data"] == "file:ids.npz" and filed["error_count"] == 0
    zeros = run("--input-data", "zeros")
    assert zeros["status"] == "succeeded" and zeros["input_data"] == "zeros"


def test_edge_bench_honours_value_ranges_and_zeros() -> None:
    from workers.engines.inputs import make_inputs
    from workers.runners.common import bench_command

    given = [{"name": "ids", "dtype": "INT64", "shape": [8], "value_range": [3, 4]}]
    feed = make_inputs([IOSpec("ids", "INT64", (-1, 8))], given, 64)
    assert feed["ids"].shape == (64, 8) and set(np.unique(feed["ids"])) == {3, 4}
    zeros = make_inputs([IOSpec("ids", "INT64", (-1, 8))], [{**given[0], "zeros": True}], 2)
    assert not zeros["ids"].any()
    from schemas import EdgeProfile, JobSpec, MeasurementSettings

    spec = JobSpec(job_id="j", request_id="r", model_sha256="0" * 64, model_format="onnx", device="cpu",
                   engine="onnxruntime", batch_size=1, concurrency=1, queue="farm.edge",
                   edge_profile=EdgeProfile(cpus=1, memory="512m"),
                   inputs=[TensorSpec(name="ids", dtype="INT64", shape=(8,), value_range=(0, 49))],
                   measurement=MeasurementSettings(), input_data=InputData(kind="zeros"))
    argv = bench_command(spec, "/m.onnx")
    sent = json.loads(argv[argv.index("--inputs") + 1])
    assert sent == [{"name": "ids", "dtype": "INT64", "shape": [8], "value_range": [0, 49], "zeros": True}]


class _Recorder:
    """A real gRPC KServe v2 server (in this process) that answers every ModelInfer (unary or streamed)
    and records the first INT64 value of each request's first input."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from tritonclient.grpc import service_pb2 as pb
        from tritonclient.grpc import service_pb2_grpc as pb_grpc

        seen = self.seen = set[int]()

        class Service(pb_grpc.GRPCInferenceServiceServicer):
            def ServerReady(self, request, context):  # noqa: N802
                return pb.ServerReadyResponse(ready=True)

            def ModelReady(self, request, context):  # noqa: N802
                return pb.ModelReadyResponse(ready=True)

            def ModelInfer(self, request, context):  # noqa: N802
                seen.add(int(np.frombuffer(request.raw_input_contents[0], np.int64)[0]))
                return pb.ModelInferResponse(model_name=request.model_name)

            def ModelStreamInfer(self, request_iterator, context):  # noqa: N802
                for request in request_iterator:
                    resp = self.ModelInfer(request, context)
                    resp.id = request.id
                    yield pb.ModelStreamInferResponse(infer_response=resp)

        self.pool = futures.ThreadPoolExecutor(max_workers=2)
        self.server = grpc.server(self.pool)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(Service(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def __enter__(self) -> _Recorder:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None).wait()
        self.pool.shutdown(wait=True)  # grpc.server does not own the executor it is given


@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_every_row_of_the_file_is_sent(tmp_path: Path, rpc: str) -> None:
    """Five rows at batch 2: the generator sends requests starting at rows 0, 2 and 4 in turn."""
    from schemas import MeasurementSettings
    from workers.loadgen.clients import run_load
    from workers.loadgen.contract import LoadSpec, LoadTarget

    ids = np.arange(5 * 8, dtype=np.int64).reshape(5, 8)
    np.savez(tmp_path / "rows.npz", ids=ids)
    data = resolve_input_data(InputData.model_validate(str(tmp_path / "rows.npz")), [IDS])
    settings = MeasurementSettings(warmup_s=0.1, duration_s=0.5, rpc=rpc)
    with _Recorder() as server:
        result = run_load(LoadTarget(f"127.0.0.1:{server.port}", "m"),
                          LoadSpec.from_settings([IDS], 2, 1, settings, data=data), processes=1)
    assert server.seen == {0, 16, 32}  # the first id of rows 0, 2 and 4
    assert result.details["input_data"]["kind"] == "file" and result.details["input_data"]["rows"] == {"ids": 5}


def test_served_and_edge_jobs_of_a_request_send_the_same_data() -> None:
    """One generator (``farm.input_data``): the tensors of a served request (decoded as its server sees
    them) and of the edge bench are equal, integers drawn from 0..99 on both sides."""
    from schemas import EdgeProfile, JobSpec, MeasurementSettings
    from workers.engines.inputs import make_inputs
    from workers.runners.common import bench_command

    inputs = [IDS, X, TensorSpec(name="r", dtype="INT32", shape=(3,), value_range=(5, 7))]
    specs = {t.name: IOSpec(t.name, t.dtype, (-1, *t.shape)) for t in inputs}
    spec = JobSpec(job_id="j", request_id="r", model_sha256="0" * 64, model_format="onnx", device="cpu",
                   engine="onnxruntime", batch_size=4, concurrency=1, queue="farm.edge",
                   edge_profile=EdgeProfile(cpus=1, memory="512m"), inputs=inputs, measurement=MeasurementSettings())
    argv = bench_command(spec, "/m.onnx")
    model_order = [specs["x"], specs["r"], specs["ids"]]  # the engine may list its inputs in another order
    edge = make_inputs(model_order, json.loads(argv[argv.index("--inputs") + 1]), 4)
    served = decode_inputs(build_request("m", inputs, 4), specs)
    assert list(edge) == ["x", "r", "ids"] and set(served) == set(edge)
    for name in served:
        assert edge[name].dtype == served[name].dtype and np.array_equal(edge[name], served[name]), name
    assert edge["ids"].min() >= 0 and 9 < edge["ids"].max() <= 99 and set(np.unique(edge["r"])) <= {5, 6, 7}


@pytest.mark.slow
def test_edge_runs_send_the_request_data_file(tmp_path: Path) -> None:
    """An edge run of a request with ``--input-data FILE`` sends the file's rows, as its served jobs do: ids
    in a 50-row vocabulary run where random ids (0..99, what edge runs sent before) fail the lookup."""
    model = build_lookup(tmp_path / "lookup.onnx")
    np.savez(tmp_path / "ids.npz", ids=np.array([[1, 2, 3, 4, 5, 6, 7, 49]], np.int64))
    farm("submit", str(model), "--batch-sizes", "3", "--edge", "cpus=1,memory=512m", "--input-data",
         str(tmp_path / "ids.npz"), *FAST, check=False)
    rid = json.loads(farm("status", "--json").stdout)[0]["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json").stdout)
    edge = [r for r in rows if r["edge_profile"]]
    assert len(edge) == 1 and len(rows) == 2
    assert all(r["status"] == "succeeded" and r["input_data"] == "file:ids.npz" for r in rows), rows


def test_edge_bench_reads_the_data_file_the_runner_writes() -> None:
    """``edge_input_file`` writes the request's checked arrays; the bench's batch from it equals a served
    request's first batch (rows from the first, cycled), not random values."""
    from schemas import EdgeProfile, JobSpec, MeasurementSettings
    from workers.engines.inputs import make_inputs
    from workers.runners.common import bench_command, edge_input_file

    rows = np.arange(16, dtype="<i8").reshape(2, 8)
    ids = DataArray(dtype="INT64", shape=(2, 8), b64=base64.b64encode(rows.tobytes()).decode())
    data = InputData(kind="file", source="ids.npz", sha256="0" * 64, arrays={"ids": ids})
    spec = JobSpec(job_id="j", request_id="r", model_sha256="0" * 64, model_format="onnx", device="cpu",
                   engine="onnxruntime", batch_size=3, concurrency=1, queue="farm.edge",
                   edge_profile=EdgeProfile(cpus=1, memory="512m"), inputs=[IDS], input_data=data,
                   measurement=MeasurementSettings())
    with edge_input_file(spec) as path:
        assert path is not None
        argv = bench_command(spec, "/m.onnx", str(path))
        read = InputData.model_validate_json(Path(argv[argv.index("--input-data") + 1]).read_bytes())
    assert path is not None and not path.exists()
    edge = make_inputs([IOSpec("ids", "INT64", (-1, 8))], json.loads(argv[argv.index("--inputs") + 1]), 3, data=read)
    served = decode_inputs(build_request("m", [IDS], 3, data=data), {"ids": IOSpec("ids", "INT64", (-1, 8))})
    assert np.array_equal(edge["ids"], served["ids"])
    assert edge["ids"][:, 0].tolist() == [0, 8, 0]  # rows 0, 1, then the first again
