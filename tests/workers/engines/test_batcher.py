"""Dynamic batching: merged inferences give each request exactly its unbatched outputs, errors stay with
their request, and the server reports the batch sizes it executed."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

from farm.errors import ServerError
from schemas import JobSpec
from tests.helpers import gather_model
from workers.engines.backends import make_backend
from workers.engines.batcher import DynamicBatcher, Outputs
from workers.serving.base import Launch, Site


def build_gather(path: Path) -> Path:
    """ids: INT64 [N, 3] -> Gather(table[10, 4]) -> y: FP32 [N, 3, 4]; an id outside 0..9 fails the inference."""
    return gather_model(path, 10, 4, 3)


def _runner(model: Path, calls: list[int]):  # noqa: ANN202 (a RunFn)
    """A RunFn over a real onnxruntime backend, run off the loop like the server's instances; ``calls``
    collects each execution's rows."""
    backend = make_backend("onnxruntime")
    backend.load(model, "cpu", 1)

    async def run(feed: dict[str, np.ndarray], out_names: list[str] | None, t: int) -> tuple[Outputs, int, int]:
        calls.append(int(next(iter(feed.values())).shape[0]))
        out = await asyncio.to_thread(backend.infer, feed, out_names)
        return out, 0, 1

    return run


async def _gather(batcher: DynamicBatcher, feeds: list[dict[str, np.ndarray]]) -> list[object]:
    return await asyncio.gather(*(batcher.infer(f, None, 0) for f in feeds), return_exceptions=True)


def test_merged_outputs_equal_unbatched_inference(mlp_onnx: Path) -> None:
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((rows, 16)).astype(np.float32)} for rows in (1, 1, 2, 1, 3, 1, 1, 2)]
    calls: list[int] = []

    async def main() -> list[object]:
        with DynamicBatcher(_runner(mlp_onnx, calls), instances=1, max_batch=64, max_queue_delay_us=200_000) as b:
            out = await _gather(b, feeds)
            assert b.executed == {12: 1} and b.executions == 1
            return out

    results = asyncio.run(main())
    assert calls == [12]  # one inference of all 12 rows
    sess = ort.InferenceSession(str(mlp_onnx), providers=["CPUExecutionProvider"])
    for feed, res in zip(feeds, results, strict=True):
        assert isinstance(res, tuple)
        want = sess.run(None, feed)[0]
        assert res[0]["y"].shape == want.shape
        np.testing.assert_allclose(res[0]["y"], want, rtol=1e-5, atol=1e-5)


def test_batches_respect_max_batch_and_preferred_size(mlp_onnx: Path) -> None:
    feeds = [{"x": np.full((1, 16), i, np.float32)} for i in range(10)]
    calls: list[int] = []

    async def main() -> None:
        with DynamicBatcher(_runner(mlp_onnx, calls), instances=1, max_batch=4, max_queue_delay_us=200_000,
                            preferred=3) as b:
            await _gather(b, feeds)

    asyncio.run(main())
    assert sum(calls) == 10 and max(calls) <= 4 and calls[0] == 3  # the first batch left at the preferred size


def test_incompatible_requests_are_not_merged(mlp_onnx: Path, identity_onnx: Path) -> None:
    """Requests asking for different outputs never share an inference; each still gets its own answer."""
    calls: list[int] = []
    x, ids = np.ones((2, 4), np.float32), np.ones((2, 3), np.int64)

    async def main() -> list[object]:
        with DynamicBatcher(_runner(identity_onnx, calls), instances=1, max_batch=64, max_queue_delay_us=50_000) as b:
            return await asyncio.gather(b.infer({"x": x, "ids": ids}, ["y"], 0),
                                        b.infer({"x": x, "ids": ids}, ["ids_out"], 0),
                                        b.infer({"x": x, "ids": ids}, ["y"], 0))

    results = asyncio.run(main())
    assert [sorted(r[0]) for r in results] == [["y"], ["ids_out"], ["y"]]  # type: ignore[index]
    assert sorted(calls) == [2, 2, 2]  # y, ids_out, y: never two different output sets in one run


def test_an_error_stays_with_its_request(tmp_path: Path) -> None:
    model = build_gather(tmp_path / "gather.onnx")
    good = [np.array([[i % 10, 1, 2]], np.int64) for i in range(5)]
    bad = np.array([[1, 99, 2]], np.int64)  # id 99 is outside the table: onnxruntime refuses the batch
    feeds = [{"ids": a} for a in (*good[:2], bad, *good[2:])]
    calls: list[int] = []

    async def main() -> list[object]:
        with DynamicBatcher(_runner(model, calls), instances=1, max_batch=64, max_queue_delay_us=200_000) as b:
            return await _gather(b, feeds)

    results = asyncio.run(main())
    assert calls[0] == 6 and sorted(calls[1:]) == [1] * 6  # merged once, failed, then each alone
    assert isinstance(results[2], Exception)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for feed, res in zip(feeds, results, strict=True):
        if feed["ids"] is bad:
            continue
        assert isinstance(res, tuple)
        np.testing.assert_array_equal(res[0]["y"], sess.run(None, feed)[0])


def test_requests_left_waiting_fail_when_the_batcher_closes(mlp_onnx: Path) -> None:
    async def main() -> BaseException | None:
        with DynamicBatcher(_runner(mlp_onnx, []), instances=1, max_batch=64, max_queue_delay_us=10_000_000) as b:
            task = asyncio.ensure_future(b.infer({"x": np.ones((1, 16), np.float32)}, None, 0))
            await asyncio.sleep(0.05)
        await asyncio.wait([task], timeout=5)
        return task.exception()

    assert isinstance(asyncio.run(main()), ServerError)


def test_server_batches_concurrent_requests_and_reports_batch_sizes(mlp_onnx: Path, start_server) -> None:
    """The real server with --max-queue-delay-us: 32 batch-1 requests from 8 threads; every answer equals
    in-process inference and the statistics show merged executions."""
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(32)]
    with start_server(mlp_onnx, "--threads", "1", "--max-queue-delay-us", "20000") as s:
        client = tc.InferenceServerClient(s.url)

        def one(x: np.ndarray) -> np.ndarray:
            inp = tc.InferInput("x", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return client.infer("model", [inp]).as_numpy("y")

        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(one, xs))
        bad = tc.InferInput("x", [1, 15], "FP32")
        bad.set_data_from_numpy(np.ones((1, 15), np.float32))
        with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT|shape|dimension"):
            client.infer("model", [bad])
        st = client.get_inference_statistics("model").model_stats[0]
    sess = ort.InferenceSession(str(mlp_onnx), providers=["CPUExecutionProvider"])
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(y, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    sizes = {b.batch_size: b.compute_infer.count for b in st.batch_stats}
    assert sum(size * n for size, n in sizes.items()) == 32 == st.inference_count
    assert st.execution_count == sum(sizes.values()) < 32 and max(sizes) > 1


def test_runners_pass_a_jobs_dynamic_batching_to_the_server(mlp_onnx: Path) -> None:
    """Each job of a --max-queue-delay-us list starts its server with its own delay, and a Docker serving
    container is reused only by jobs of the same batching settings."""
    from scheduler.expand import ModelRef, expand
    from schemas import ProfileRequest, TensorSpec
    from workers.runners import docker as docker_runner
    from workers.runners import process as process_runner
    from workers.serving.registry import serving_engine

    ref = ModelRef(sha256="e" * 64, format="onnx", filename="mlp.onnx", inputs=(TensorSpec(name="x", shape=(16,)),))
    req = ProfileRequest(model="mlp.onnx", max_queue_delay_us=[0, 500], measurement={"preferred_batch_size": 4})
    plain, *batched = expand(ProfileRequest(model="mlp.onnx"), "r", ref).jobs + expand(req, "r", ref).jobs

    def launch(job: JobSpec, site: Site) -> Launch:
        return serving_engine(job.engine).launch(job, mlp_onnx, site)

    for site in (process_runner.SITE, docker_runner.SITE):
        assert "--max-queue-delay-us" not in launch(plain, site).argv
        argvs = [launch(j, site).argv for j in batched]
        assert [a[a.index("--max-queue-delay-us") + 1] for a in argvs] == ["0", "500"]
        assert all(a[a.index("--preferred-batch-size") + 1] == "4" for a in argvs)
    keys = {docker_runner.DockerRunner.reuse_key(j, launch(j, docker_runner.SITE), "img") for j in (plain, *batched)}
    assert len(keys) == 3
