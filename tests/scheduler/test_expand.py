from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler.enqueue import job_rows
from scheduler.expand import ModelRef, expand, job_id_for, matrix_size, repeat_job_id, resolve_devices
from schemas import SERVING_KEYS, ProfileRequest, TensorSpec
from schemas.queues import queue_for

ONNX = ModelRef(sha256="a" * 64, format="onnx", filename="m.onnx",
                inputs=(TensorSpec(name="input", shape=(256,)),))
TS = ModelRef(sha256="b" * 64, format="torchscript", filename="m.pt", inputs=(TensorSpec(name="x", shape=(8,)),))


def test_full_matrix_plus_edge_runs() -> None:
    req = ProfileRequest(model="m.onnx", devices=["cpu", "gpu:t4"], engines=["onnxruntime", "triton"],
                         batch_sizes=[1, 4, 16], concurrency=[1, 4],
                         edge=[{"cpus": 1, "memory": "512m"}, {"cpus": 0.5, "memory": "256m", "name": "tiny"}])
    exp = expand(req, "r1", ONNX)
    serving = [j for j in exp.jobs if not j.is_edge]
    edge = [j for j in exp.jobs if j.is_edge]
    assert len(serving) == 2 * 2 * 3 * 2 == matrix_size(req) - len(edge)
    assert len(edge) == 2 * 3
    assert {j.queue for j in serving} == {"farm.cpu", "farm.gpu.t4"}
    assert {j.queue for j in edge} == {"farm.edge"}
    assert all(j.engine == "onnxruntime" and j.concurrency == 1 for j in edge)
    assert len({j.job_id for j in exp.jobs}) == len(exp.jobs)
    assert exp.excluded == []


def test_job_ids_are_deterministic_from_request_and_coordinates() -> None:
    req = ProfileRequest(model="m.onnx", batch_sizes=[1, 2])
    a, b = expand(req, "req-x", ONNX), expand(req, "req-x", ONNX)
    assert [j.job_id for j in a.jobs] == [j.job_id for j in b.jobs]
    assert a.jobs[0].job_id == job_id_for("req-x", "cpu", "onnxruntime", 1, 1, None)
    assert expand(req, "req-y", ONNX).jobs[0].job_id != a.jobs[0].job_id


def test_incompatible_engines_are_left_out_with_reason() -> None:
    req = ProfileRequest(model="m.onnx", engines=["onnxruntime", "torchscript"])
    exp = expand(req, "r", ONNX)
    assert [j.engine for j in exp.jobs] == ["onnxruntime"]
    assert exp.excluded == [{"device": "cpu", "engine": "torchscript",
                             "reason": "engine torchscript cannot load onnx models (it loads: torchscript)"}]
    ts = expand(ProfileRequest(model="m.pt", engines=["onnxruntime", "torchscript"]), "r", TS)
    assert [j.engine for j in ts.jobs] == ["torchscript"]


def test_gpu_selectors_resolve_against_live_inventory() -> None:
    products = ["NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA A100-SXM4-40GB"]
    devices, excluded = resolve_devices(["gpu"], products)
    assert devices == ["gpu:a100-sxm4-40gb", "gpu:t4"] and excluded == []
    assert resolve_devices(["gpu:a100"], products)[0] == ["gpu:a100-sxm4-40gb"]
    assert resolve_devices(["gpu:h100"], products)[0] == ["gpu:h100"]  # waits for such a worker
    devices, excluded = resolve_devices(["cpu", "gpu"], [])
    assert devices == ["cpu"] and "no worker with a GPU is online" in str(excluded[0]["reason"])


def test_a_fixed_batch_model_runs_only_its_batch_size() -> None:
    fixed = ModelRef(sha256="c" * 64, format="onnx", filename="f.onnx", inputs=ONNX.inputs, static_batch=4)
    exp = expand(ProfileRequest(model="f.onnx", batch_sizes=[1, 4, 16], edge=[{"cpus": 1, "memory": "512m"}]),
                 "r", fixed)
    assert sorted({j.batch_size for j in exp.jobs}) == [4] and len(exp.jobs) == 2
    assert [e["batch_size"] for e in exp.excluded] == [1, 16]
    assert "fixed at 4" in str(exp.excluded[0]["reason"])


def test_queue_names() -> None:
    assert queue_for("cpu") == "farm.cpu"
    assert queue_for("gpu:a100-sxm4-40gb") == "farm.gpu.a100-sxm4-40gb"


def test_serving_dimensions_expand_to_one_job_per_combination() -> None:
    req = ProfileRequest(model="m.onnx", concurrency=[1, 8], instances=[1, 2], threads=[0, 2],
                         max_queue_delay_us=[0, 500], measurement={"preferred_batch_size": 4})
    exp = expand(req, "r", ONNX)
    assert len(exp.jobs) == 2 * 2 * 2 * 2 == matrix_size(req)
    combos = {(j.measurement.instances, j.measurement.threads, j.measurement.max_queue_delay_us, j.concurrency)
              for j in exp.jobs}
    assert len(combos) == 16 and len({j.job_id for j in exp.jobs}) == 16
    assert {j.measurement.preferred_batch_size for j in exp.jobs} == {4}
    dumped = exp.jobs[-1].model_dump(mode="json")["measurement"]
    assert {k: dumped[k] for k in SERVING_KEYS} == {"instances": 2, "threads": 2, "max_queue_delay_us": 500,
                                                     "preferred_batch_size": 4}


def test_single_serving_values_keep_their_job_ids() -> None:
    plain = expand(ProfileRequest(model="m.onnx"), "r", ONNX).jobs[0]
    assert plain.job_id == job_id_for("r", "cpu", "onnxruntime", 1, 1, None)
    assert plain.measurement.instances == 1 and plain.measurement.max_queue_delay_us is None
    scalar = expand(ProfileRequest(model="m.onnx", measurement={"instances": 3}), "r", ONNX).jobs
    listed = expand(ProfileRequest(model="m.onnx", instances=[3]), "r", ONNX).jobs
    assert [j.measurement.instances for j in scalar] == [3] == [j.measurement.instances for j in listed]
    assert scalar[0].job_id == listed[0].job_id != plain.job_id


def test_quick_search_submits_only_first_steps() -> None:
    levels = [1, 2, 4, 8, 16, 32, 64]
    climb = expand(ProfileRequest(model="m.onnx", concurrency=levels, instances=[1, 2],
                                  measurement={"search": "quick"}), "r", ONNX)
    assert sorted((j.measurement.instances, j.concurrency) for j in climb.jobs) == [(1, 1), (2, 1)]
    bisect = expand(ProfileRequest(model="m.onnx", concurrency=levels, measurement={"search": "quick", "p99_ms": 5}),
                    "r", ONNX)
    assert [j.concurrency for j in bisect.jobs] == [8]
    assert bisect.jobs[0].job_id == job_id_for("r", "cpu", "onnxruntime", 1, 8, None)


def test_bad_serving_lists_are_refused() -> None:
    for field, bad in (("instances", [0]), ("threads", [-1]), ("max_queue_delay_us", [-5]), ("instances", [])):
        with pytest.raises(ValidationError):
            ProfileRequest(model="m.onnx", **{field: bad})
    for field, bad in (("rates", [0]), ("rates", []), ("rates", [float("inf")])):
        with pytest.raises(ValidationError, match="rates"):
            ProfileRequest(model="m.onnx", **{field: bad})
    with pytest.raises(ValidationError, match="one concurrency"):  # open loop: the search walks the rates
        ProfileRequest(model="m.onnx", concurrency=[1, 2], rates=[50, 100], measurement={"search": "quick"})
    with pytest.raises(ValidationError, match="give the open-loop rate once"):
        ProfileRequest(model="m.onnx", rates=[50, 100], measurement={"rate": 75})


def test_rates_expand_to_one_open_loop_job_per_rate() -> None:
    """Brute force: one job per rate (and per serving configuration), each with its rate in its measurement
    and an id of its own; the request becomes open loop (constant unless poisson is asked)."""
    req = ProfileRequest(model="m.onnx", rates=[200, 50, 100], instances=[1, 2], measurement={"mode": "poisson"})
    exp = expand(req, "r", ONNX)
    assert len(exp.jobs) == 3 * 2 == matrix_size(req)
    assert sorted((j.measurement.instances, j.measurement.rate) for j in exp.jobs) == [
        (i, r) for i in (1, 2) for r in (50.0, 100.0, 200.0)]
    assert {j.measurement.mode for j in exp.jobs} == {"poisson"} and {j.concurrency for j in exp.jobs} == {1}
    assert len({j.job_id for j in exp.jobs}) == len(exp.jobs)
    job = exp.jobs[0]
    assert job.job_id == job_id_for("r", "cpu", "onnxruntime", 1, 1, None, job.measurement.model_dump())
    constant = expand(ProfileRequest(model="m.onnx", rates=[50, 100]), "r", ONNX).jobs
    assert {j.measurement.mode for j in constant} == {"constant"}


def test_a_request_file_with_one_rate_still_works() -> None:
    """``measurement.rate`` alone: one open-loop job, as before rates lists; the same as ``rates: [R]``."""
    single = expand(ProfileRequest.model_validate({"model": "m.onnx", "measurement": {"rate": 80}}), "r", ONNX).jobs
    listed = expand(ProfileRequest.model_validate({"model": "m.onnx", "rates": 80}), "r", ONNX).jobs
    assert [(j.measurement.mode, j.measurement.rate) for j in single] == [("constant", 80.0)]
    assert [j.job_id for j in single] == [j.job_id for j in listed]
    closed = expand(ProfileRequest(model="m.onnx"), "r", ONNX).jobs[0]
    assert closed.measurement.rate is None and closed.job_id != single[0].job_id


def test_open_loop_quick_search_submits_the_first_rate_only() -> None:
    rates = [50, 100, 150, 200, 250, 300, 350]
    climb = expand(ProfileRequest(model="m.onnx", rates=rates, instances=[1, 2], measurement={"search": "quick"}),
                   "r", ONNX)
    assert sorted((j.measurement.instances, j.measurement.rate) for j in climb.jobs) == [(1, 50.0), (2, 50.0)]
    bisect = expand(ProfileRequest(model="m.onnx", rates=rates, measurement={"search": "quick", "p99_ms": 5}),
                    "r", ONNX)
    assert [j.measurement.rate for j in bisect.jobs] == [200.0]  # the middle of 7 rates


def test_the_rate_is_carried_like_concurrency() -> None:
    """Each job's open-loop rate is set at expansion (``JobSpec.rate``, the ``jobs.rate`` column of its row),
    as its concurrency is; the request's ``rates`` list is the one list of them (``measurement.rate`` alone
    becomes ``rates: [R]``), and validation builds new inputs instead of changing frozen models."""
    req = ProfileRequest(model="m.onnx", rates=[100, 50], concurrency=[2])
    before = req.model_dump()
    jobs = expand(req, "r", ONNX).jobs
    assert sorted((j.concurrency, j.rate) for j in jobs) == [(2, 50.0), (2, 100.0)]
    assert sorted((r["concurrency"], r["rate"]) for r in job_rows("r", jobs)) == [(2, 50.0), (2, 100.0)]
    assert req.model_dump() == before and req.rates == [50.0, 100.0]  # expansion left the request alone
    closed = expand(ProfileRequest(model="m.onnx"), "r", ONNX).jobs
    assert [j.rate for j in closed] == [None] and job_rows("r", closed)[0]["rate"] is None
    single = ProfileRequest.model_validate({"model": "m.onnx", "measurement": {"rate": 80}})
    assert single.rates == [80.0] and single.rate_levels() == [80.0] and single.measurement.mode == "constant"
    given = {"rate": 80}
    assert ProfileRequest.model_validate({"model": "m.onnx", "measurement": given}).rates == [80.0]
    assert given == {"rate": 80}  # the caller's input is not changed either


def test_repeats_run_every_cell_n_times_in_shuffled_rounds_with_ids_of_their_own() -> None:
    req = ProfileRequest(model="m.onnx", batch_sizes=[1, 2, 4], concurrency=[1, 2],
                         edge=[{"cpus": 1, "memory": "512m"}], repeats=4)
    once = expand(req.model_copy(update={"repeats": 1}), "r1", ONNX).jobs
    jobs = expand(req, "r1", ONNX).jobs
    cells = len(once)
    assert len(jobs) == 4 * cells == matrix_size(req) and len({j.job_id for j in jobs}) == len(jobs)
    rounds = [jobs[r * cells:(r + 1) * cells] for r in range(4)]
    for r, round_jobs in enumerate(rounds):  # each round holds every cell once, all with its repeat index
        assert {j.repeat for j in round_jobs} == {r}
        assert sorted(j.job_id for j in round_jobs) == sorted(repeat_job_id(j.job_id, r) for j in once)
    orders = [[(j.device, j.engine, j.batch_size, j.concurrency, j.edge_profile) for j in rj] for rj in rounds]
    assert len({tuple(map(str, o)) for o in orders}) > 1  # interleaved: the cell order changes between rounds
    assert [j.job_id for j in expand(req, "r1", ONNX).jobs] == [j.job_id for j in jobs]  # seeded: reproducible
    assert [j.job_id for j in once] == [j.job_id for j in expand(req.model_copy(update={"repeats": 1}), "r1",
                                                                   ONNX).jobs]  # no repeats: ids and order as before
    assert all(j.repeat == 0 for j in once)
    rows = job_rows("r1", jobs)
    assert [row["spec"]["repeat"] for row in rows] == [j.repeat for j in jobs]


@pytest.mark.parametrize("repeats", [0, 21, -1, True])
def test_repeats_out_of_bounds_are_refused(repeats: object) -> None:
    with pytest.raises(ValidationError, match="repeats"):
        ProfileRequest(model="m.onnx", repeats=repeats)


def test_repeats_and_quick_search_do_not_combine() -> None:
    with pytest.raises(ValidationError, match="repeats and a quick search do not combine"):
        ProfileRequest(model="m.onnx", concurrency=[1, 2, 4], repeats=3, measurement={"search": "quick"})


def test_each_job_row_of_a_knob_sweep_keeps_its_own_knobs() -> None:
    """The bulk insert dumps the request-wide fields once: the knobs are per job (a sweep once stored the
    first job's knobs in every row)."""
    gguf = ModelRef(sha256="c" * 64, format="gguf", filename="m.gguf", inputs=())
    req = ProfileRequest(model="m.gguf", knobs={"n_ctx": ["256", "512"], "n_batch": ["8"]})
    jobs = expand(req, "r1", gguf).jobs
    rows = job_rows("r1", jobs)
    assert sorted(row["spec"]["knobs"]["n_ctx"] for row in rows) == [256, 512]
    assert [row["spec"]["knobs"] for row in rows] == [dict(j.knobs) for j in jobs]


def test_an_llm_model_on_an_edge_box_gets_llm_engine_jobs_under_the_profile() -> None:
    """A GGUF file with --edge: llama.cpp jobs on the edge queue, one per knob set x concurrency, each with the
    OpenAI client's settings (the SLO) and the profile's limits; job_count agrees."""
    from scheduler.expand import job_count
    from schemas.queues import EDGE_QUEUE

    gguf = ModelRef(sha256="c" * 64, format="gguf", filename="m.gguf", inputs=())
    req = ProfileRequest(model="m.gguf", concurrency=[1, 2], knobs={"n_ctx": ["256", "512"]},
                         edge=[{"cpus": 1, "memory": "512m", "name": "pi"}],
                         measurement={"llm": {"slo": "ttft=500,tpot=100"}})
    jobs = expand(req, "r1", gguf).jobs
    edge = [j for j in jobs if j.is_edge]
    assert len(edge) == 2 * 2 and len(jobs) == 2 * len(edge) == job_count(req, gguf)
    assert {(j.engine, j.queue, j.edge_profile.name, j.edge_profile.memory) for j in edge  # type: ignore[union-attr]
            } == {("llama.cpp", EDGE_QUEUE, "pi", 512 * 2**20)}
    assert sorted((j.concurrency, j.knobs["n_ctx"]) for j in edge) == [(1, 256), (1, 512), (2, 256), (2, 512)]
    assert all(j.measurement.llm is not None and j.measurement.llm.slo is not None for j in edge)
    assert len({j.job_id for j in jobs}) == len(jobs)


def test_a_model_without_engines_named_gets_its_formats_default_engine() -> None:
    """``farm submit m.pt`` serves a TorchScript model on torchscript (it was expanded for onnxruntime, the
    request's default, and refused: "engine onnxruntime cannot load torchscript models")."""
    assert {j.engine for j in expand(ProfileRequest(model="m.pt"), "r", TS).jobs} == {"torchscript"}
    assert {j.engine for j in expand(ProfileRequest(model="m.onnx"), "r", ONNX).jobs} == {"onnxruntime"}


def test_every_job_carries_its_engines_protocol_set_at_expansion() -> None:
    """``JobSpec.protocol`` is the card's (KServe for an ONNX model's engines, OpenAI for a GGUF model's, edge jobs
    included), stored in the job's spec (the bulk insert), and an older stored spec without it loads with the
    one its card gives."""
    from schemas import JobSpec

    onnx = expand(ProfileRequest(model="m.onnx", engines=["onnxruntime", "triton"],
                                 edge=[{"cpus": 1, "memory": "512m"}]), "r1", ONNX).jobs
    gguf_ref = ModelRef(sha256="c" * 64, format="gguf", filename="m.gguf", inputs=())
    gguf = expand(ProfileRequest(model="m.gguf", edge=[{"cpus": 1, "memory": "512m"}]), "r1", gguf_ref).jobs
    assert {j.protocol for j in onnx} == {"kserve"} and not any(j.speaks_openai for j in onnx)
    assert {j.protocol for j in gguf} == {"openai"} and all(j.speaks_openai for j in gguf)
    assert any(j.is_edge for j in onnx) and any(j.is_edge for j in gguf)
    rows = job_rows("r1", onnx + gguf)
    assert [row["spec"]["protocol"] for row in rows] == [j.protocol for j in onnx + gguf]
    for row, job in zip(rows, onnx + gguf, strict=True):
        old = {k: v for k, v in row["spec"].items() if k != "protocol"}  # stored before the field existed
        assert JobSpec.model_validate(old).protocol == job.protocol
