"""The server's prefix cache as a job dimension (issue 41 point 4, ``workers.loadgen.openai.prefix_cache``): cold
and warm are two jobs of a cell; warm puts the shared prefix in the cache before the windows, cold resets it and
keeps the warm-up's prompts out of it; the row carries the hit rate the workload intends and the one the server
counted, flagged where they differ by more than 10 points. Against the fake server (a prefix cache of 4-word
blocks with vLLM's counters and reset route) and against llama-server on the tiny random GGUF."""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from rich.console import Console

from farm.cli.views import jobs_table
from scheduler.expand import ModelRef, expand, job_count
from schemas import MeasurementSettings, ProfileRequest
from schemas.engines import SERVED_MODEL_NAME
from schemas.llm import LlmSettings
from schemas.load_levels import ClosedLoop, PoissonRate
from tests.fake_openai import fake_server
from tests.helpers import farm, farm_env
from tests.workers.loadgen.openai.test_openai_client import _measure
from workers.loadgen.clients import run_load
from workers.loadgen.contract import LoadSpec, LoadTarget
from workers.loadgen.openai.prefix_cache import CachePrep, intended_pct, judge, measured_pct
from workers.loadgen.openai.workload import shared_prefix, synthetic_prompts

GGUF = ModelRef(sha256="c" * 64, format="gguf", filename="m.gguf", inputs=())


def test_states_parse_from_text_once_each_and_a_bad_one_is_refused() -> None:
    assert LlmSettings(prefix_cache="warm,cold,warm").prefix_cache == ["warm", "cold"]
    assert LlmSettings().cache_state == "cold" and LlmSettings().shared_tokens() == 0
    with pytest.raises(ValidationError, match="cold"):
        LlmSettings(prefix_cache="hot")
    with pytest.raises(ValidationError, match="--shared-prefix and --prefix-tokens"):
        LlmSettings(shared_prefix_pct=50, prefix_tokens=8)
    with pytest.raises(ValidationError, match="--shared-prefix shapes synthetic prompts"):
        LlmSettings(shared_prefix_pct=50, prompts="p.jsonl")
    with pytest.raises(ValidationError):
        LlmSettings(shared_prefix_pct=100)


def test_a_shared_prefix_pct_is_inside_the_prompt_length() -> None:
    """--shared-prefix 50 on 32-token prompts: every prompt begins with the same 16 words and is 32 long."""
    llm = LlmSettings(input_tokens=32, shared_prefix_pct=50)
    prompts = synthetic_prompts(llm, None, 8)
    prefix = shared_prefix(llm, None)
    assert llm.shared_tokens() == 16 and llm.shared_share_pct() == 50 and len(prefix.split()) == 16
    assert all(p.text.startswith(prefix + " ") and p.input_tokens == 32 for p in prompts)
    assert len({p.text for p in prompts}) == 8


def test_cold_and_warm_are_two_jobs_of_one_cell_and_cold_keeps_its_id() -> None:
    base = ProfileRequest(model="m.gguf", concurrency=[1, 4], measurement={"llm": {"shared_prefix_pct": 50}})
    both = base.model_copy(update={"measurement": base.measurement.model_copy(update={
        "llm": LlmSettings(shared_prefix_pct=50, prefix_cache=["cold", "warm"])})})
    one, two = expand(base, "r1", GGUF).jobs, expand(both, "r1", GGUF).jobs
    assert len(two) == 2 * len(one) == job_count(both, GGUF) == 4
    states = [(j.concurrency, j.measurement.llm.prefix_cache) for j in two if j.measurement.llm]
    assert sorted(states) == [(1, ["cold"]), (1, ["warm"]), (4, ["cold"]), (4, ["warm"])]
    assert len({j.job_id for j in two}) == 4
    assert {j.job_id for j in one} == {j.job_id for j in two if j.measurement.llm and
                                       j.measurement.llm.cache_state == "cold"}
    console = Console(record=True, width=120)
    console.print(jobs_table(two, "dry run"))  # farm submit --dry-run: a cache column, each job's state
    lines = console.export_text().splitlines()
    assert "cache" in lines[2] and [ln.split()[-2] for ln in lines[4:8]] == ["cold", "warm", "cold", "warm"]
    console = Console(record=True, width=120)
    console.print(jobs_table(one, "dry run"))
    assert "cache" not in console.export_text()  # cold alone: as before


def test_the_intended_rate_and_the_flag() -> None:
    """Warm: the shared share; cold: that share over the requests after a closed loop's first ``concurrency`` (an
    open loop's first); the server's usage (the measured requests' own) wins over its counters (their scrapes' edges
    hold other requests); 10 points apart flags the row with a note."""
    assert intended_pct("warm", 50.0, 100, ClosedLoop(concurrency=4)) == 50.0
    assert intended_pct("cold", 50.0, 100, ClosedLoop(concurrency=4)) == pytest.approx(48.0)
    assert intended_pct("cold", 50.0, 100, PoissonRate(rate=5.0, concurrency=4)) == pytest.approx(49.5)
    view = {"windows": {"cached_prompt_tokens": 30.0, "prefix_cache_queries": 100.0}}
    assert measured_pct(view, 80.0) == (80.0, "usage") and measured_pct(view, None) == (30.0, "server counters")
    assert measured_pct({}, None) == (None, None)
    llama = {"windows": {"cached_prompt_tokens": 30.0, "prompt_tokens": 70.0},
             "names": {"cached_prompt_tokens": "llamacpp:prompt_tokens_cached_total"}}
    assert measured_pct(llama, None) == (30.0, "server counters")
    llm = LlmSettings(input_tokens=100, shared_prefix_pct=0)
    m, notes = judge(llm, CachePrep("cold", "reset", True), 100.0, 45.0, {}, 50, ClosedLoop(concurrency=1))
    assert m == {"prefix_hit_intended_pct": 0.0, "prefix_hit_pct": 45.0, "prefix_hit_as_intended": False}
    assert any("45 % of the prompt tokens" in n and "imply 0 %" in n for n in notes)
    m, notes = judge(llm, CachePrep("cold", "reset", True), 100.0, 5.0, {}, 50, ClosedLoop(concurrency=1))
    assert m["prefix_hit_as_intended"] is True and not notes
    m, notes = judge(llm.model_copy(update={"shared_prefix_pct": 50.0}), CachePrep("cold", "not reset: no route",
                     False), 100.0, None, {}, 50, ClosedLoop(concurrency=1))
    assert m["prefix_hit_pct"] is None and m["prefix_hit_as_intended"] is None and "not reset" in notes[0]
    erased = CachePrep("cold", "reset (2 slots erased)", True, "its host-memory cache keeps its prompts")
    m, notes = judge(llm, erased, 100.0, 45.0, {}, 50, ClosedLoop(concurrency=1))  # what the erase left: said
    assert m["prefix_hit_as_intended"] is False and notes[0].endswith("; its host-memory cache keeps its prompts")
    assert judge(llm, erased, 100.0, 5.0, {}, 50, ClosedLoop(concurrency=1))[1] == []  # as intended: no caveat


def _fake_run(state: str, shared: float, **extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    with fake_server(model="fake", tokenize=True, cache=True, **extra) as url:
        r = _measure(url, concurrency=2, input_tokens=32, shared_prefix_pct=shared, prefix_cache=state)
    return r.metrics, r.details


def test_warm_with_half_shared_hits_half_on_the_fake() -> None:
    m, d = _fake_run("warm", 50)
    assert d["workload"]["prefix_cache"] == "warm" and "warmed (2 of 2" in d["workload"]["prefix_cache_prep"]
    # 16 of 32 tokens shared: 16 words after the BOS, four whole 4-word blocks of the fake's cache; its usage counts
    # tokens (32 a prompt) for the measured requests, the measured figure; its counters words (31: the BOS is none)
    assert m["prefix_hit_intended_pct"] == pytest.approx(50.0)
    assert m["prefix_hit_pct"] == pytest.approx(50.0)
    assert m["prefix_hit_as_intended"] is True and m["cached_prompt_tokens_pct"] == pytest.approx(50.0)


def test_cold_with_nothing_shared_hits_nothing_on_the_fake() -> None:
    m, d = _fake_run("cold", 0)
    assert d["workload"]["prefix_cache_prep"] == "reset (POST /reset_prefix_cache)"
    assert m["prefix_hit_intended_pct"] == 0 and m["prefix_hit_pct"] == 0 and m["prefix_hit_as_intended"] is True


def test_cold_keeps_the_warm_up_out_of_the_cache() -> None:
    """Cold with half shared: the warm-up's prompts carry their salt in front, so the measured requests after the
    first two find the prefix only where an earlier measured one put it: hits just under the warm share."""
    m, _ = _fake_run("cold", 50)
    assert 0 < m["prefix_hit_intended_pct"] < 50
    assert m["prefix_hit_pct"] < 100 * 16 / 31 and m["prefix_hit_as_intended"] is True


@pytest.mark.llm
def test_llama_server_counts_the_intended_hits_warm_and_none_cold(llama_server: str, tiny_llama: Any) -> None:
    """The real llama-server (2 slots) on the tiny GGUF: --shared-prefix 50 warm, its own counters
    (llamacpp:prompt_tokens_cached_total against the prompt tokens it evaluated) within 10 points of the 50 %
    intended; then cold with nothing shared on the same server: near 0."""
    from tests.workers.serving.test_llm_engines import spec_for  # noqa: PLC0415 - the engines' tests' helper
    from workers.runners.process import ProcessRunner  # noqa: PLC0415 - the serving stack: this test only

    core = min(os.sched_getaffinity(0))
    got = {}
    with ProcessRunner().serve(spec_for("llama.cpp", n_parallel=2), tiny_llama.gguf, cpus={core}) as target:
        for state, shared in (("warm", 50.0), ("cold", 0.0)):
            settings = MeasurementSettings(duration_s=3.0, warmup_s=0.5, window_s=1.0, llm={
                "api": "openai-completions", "input_tokens": 128, "output_tokens": 4, "shared_prefix_pct": shared,
                "prefix_cache": state})
            got[state] = run_load(LoadTarget(target.url, SERVED_MODEL_NAME), LoadSpec.from_settings([], 1, 2, settings))
    warm, cold = got["warm"].metrics, got["cold"].metrics
    assert warm["error_count"] == 0 and cold["error_count"] == 0
    assert warm["prefix_hit_intended_pct"] == pytest.approx(50, abs=1)
    assert warm["prefix_hit_pct"] == pytest.approx(warm["prefix_hit_intended_pct"], abs=10), got["warm"].details
    assert warm["prefix_hit_as_intended"] is True and warm["cached_prompt_tokens_pct"] > 40
    assert cold["prefix_hit_intended_pct"] == 0 and cold["prefix_hit_pct"] < 5 and cold["prefix_hit_as_intended"]
    assert got["warm"].details["server_view"]["names"]["cached_prompt_tokens"] == "llamacpp:prompt_tokens_cached_total"


def test_submit_cold_and_warm_two_rows_with_their_columns() -> None:
    """``farm submit --prefix-cache cold,warm --shared-prefix 50`` end to end (embedded) on the fake: two rows of
    one cell, never merged as repeats, the table's cache column, the facts and metrics in the SQL view; a bad
    state or share is a one-line usage error."""
    env = farm_env()
    args = ["--api", "openai-chat", "--model-name", "fake", "--duration", "1", "--window", "0.5", "--warmup", "0.3",
            "--input-tokens", "32", "--output-tokens", "4"]
    with fake_server(model="fake", tokenize=True, cache=True) as url:
        out = farm("submit", "--endpoint", url, *args, "--prefix-cache", "cold,warm", "--shared-prefix", "50",
                   "--json", env=env)
        for bad, text in ((["--prefix-cache", "hot"], "cold"), (["--shared-prefix", "120"], "95"),
                          (["--shared-prefix", "50", "--prefix-tokens", "8"], "give one of them")):
            proc = farm("submit", "--endpoint", url, *args, *bad, check=False, env=env)
            assert proc.returncode == 2 and text in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    rid = json.loads(out.stdout)["request_id"]
    rows = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    assert sorted(r["prefix_cache"] for r in rows) == ["cold", "warm"] and {r["status"] for r in rows} == {"succeeded"}
    for r in rows:
        assert r["shared_prefix_pct"] == 50 and r["prefix_hit_as_intended"] is True
    warm = next(r for r in rows if r["prefix_cache"] == "warm")
    assert warm["prefix_hit_intended_pct"] == 50 and warm["prefix_hit_pct"] == pytest.approx(50.0)  # its usage
    assert "cache" in farm("results", rid, env=env).stdout
    path = next(Path(env["FARM_HOME"]).rglob("*.db"))
    with sqlite3.connect(path) as con:
        got = con.execute("SELECT prefix_cache, shared_prefix_pct, prefix_hit_intended_pct, prefix_hit_pct, "
                          "prefix_hit_as_intended FROM job_results WHERE request_id = ?", (rid,)).fetchall()
    assert sorted(g[0] for g in got) == ["cold", "warm"] and all(g[4] == 1 for g in got)


def test_docker_reuses_no_server_for_a_cold_job_with_a_shared_prefix(tmp_path: Path) -> None:
    """The docker runner's reuse key: a cold job sharing a prefix matches no kept container (its server is
    restarted, its cache empty); the warm job, and a cold one sharing nothing, match as before."""
    from workers.runners.docker import SITE, DockerRunner  # noqa: PLC0415 - the docker SDK: this test only
    from workers.serving.registry import serving_engine  # noqa: PLC0415 - idem

    def keys(shared: float) -> dict[str, set[str]]:
        req = ProfileRequest(model="m.gguf", concurrency=[1], repeats=2, measurement={
            "llm": {"shared_prefix_pct": shared, "prefix_cache": ["cold", "warm"]}})
        out: dict[str, set[str]] = {}
        for j in expand(req, "r1", GGUF).jobs:
            assert j.measurement.llm is not None
            launch = serving_engine(j.engine).launch(j, tmp_path / "m.gguf", SITE)
            out.setdefault(j.measurement.llm.cache_state, set()).add(DockerRunner.reuse_key(j, launch, "img"))
        return out

    shared, none = keys(50.0), keys(0.0)
    assert len(shared["cold"]) == 2 and len(shared["warm"]) == 1  # two runs of the cold cell: two servers
    assert len(none["cold"]) == 1 and none["cold"] == none["warm"]
