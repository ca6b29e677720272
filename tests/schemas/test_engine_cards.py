"""The engine cards (``schemas.engines.CARDS``) agree with the modules that implement them: an LLM card with its
serving module (``workers.serving.registry.SERVING``) and the knobs that module turns into flags, an in-process
card with its backend (``workers.engines.backends.BACKENDS``) and Triton backend, a profiler a card names with
``workers.profiling.collect.PROFILERS``; and the tables derived from the cards keep their values."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import get_args

import pytest

from farm.errors import UnsupportedError
from farm.settings import reset_settings
from schemas import JobSpec, MeasurementSettings, TensorSpec
from schemas.engines import (
    CARDS,
    ENDPOINT_ENGINE,
    FORMAT_ENGINE,
    IN_PROCESS,
    LLM_FORMAT_ENGINE,
    EngineCard,
    ModelFormat,
    default_engine,
    is_openai,
    llm_format,
)
from schemas.knobs import Knob, KnobValue
from schemas.llm import LlmSettings
from schemas.llm_engines import KNOBS
from schemas.op_profile import PROFILED_ENGINES
from workers.engines.backends import BACKENDS
from workers.engines.base import IOSpec
from workers.engines.repository import served_config
from workers.profiling.collect import PROFILERS
from workers.runners import docker as docker_runner
from workers.runners import process as process_runner
from workers.serving import llm as serving_llm
from workers.serving.base import ServingEngine
from workers.serving.builtin import BuiltinServer
from workers.serving.registry import SERVING

OPENAI = [c for c in CARDS.values() if c.protocol == "openai"]
IN_PROCESS_KSERVE = [c for c in CARDS.values() if c.in_process and c.protocol == "kserve"]


def _llm_module(engine: ServingEngine) -> bool:
    """Whether ``engine``'s module launches an LLM server through ``workers.serving.llm``'s wrapper."""
    return getattr(sys.modules[type(engine).__module__], "wrap", None) is serving_llm.wrap


def test_every_card_has_its_serving_entry_and_an_llm_serving_module_has_an_openai_card() -> None:
    assert set(SERVING) == set(CARDS)
    assert all(SERVING[c.name].name == c.name for c in CARDS.values())
    for card in CARDS.values():  # the module a card names implements it
        implementation = BACKENDS[card.name] if card.in_process else type(SERVING[card.name])
        assert implementation.__module__ == card.module, card.name
    llm_modules = {name for name, engine in SERVING.items() if _llm_module(engine)}
    assert llm_modules == {c.name for c in OPENAI} and llm_modules
    for card in OPENAI:
        package = SERVING[card.name].package
        assert package is not None and package.extra == card.extra, card.name
        assert not card.in_process and card.triton_backend is None and card.profiler is None


def test_every_in_process_card_has_its_backend_with_the_same_triton_backend() -> None:
    assert set(BACKENDS) == {c.name for c in IN_PROCESS_KSERVE} == set(IN_PROCESS)
    io = [IOSpec("x", "FP32", (-1, 4))]
    for card in IN_PROCESS_KSERVE:
        backend = BACKENDS[card.name]
        assert backend.engine == card.name and backend.package.extra == card.extra
        assert isinstance(SERVING[card.name], BuiltinServer)
        fmt = sorted(card.formats)[0]
        cfg = served_config("m", fmt, card.name, io, io, instances=1, device="cpu", threads=1)
        assert card.triton_backend and cfg.backend == card.triton_backend, card.name
        # the backend's Triton platform (ModelMetadata: ``onnxruntime_onnx``, ``pytorch_libtorch``) is the card's
        assert backend.platform.split("_")[0] == card.triton_backend, card.name
    for card in CARDS.values():  # Triton loads each format with the backend of the format's in-process engine
        if not card.in_process and card.protocol == "kserve" and card.name != ENDPOINT_ENGINE:
            assert all(CARDS[FORMAT_ENGINE[f]].triton_backend for f in card.formats), card.name


def test_a_profiler_a_card_names_exists_and_profiles_that_engine() -> None:
    named = {c.name: c.profiler for c in CARDS.values() if c.profiler is not None}
    assert set(PROFILED_ENGINES) == set(named) and named
    for engine, profiler in named.items():
        assert profiler in PROFILERS and PROFILERS[profiler].engine == engine
    assert {p.engine for p in PROFILERS.values()} == set(named)  # no profiler without its card


def _value(knob: Knob) -> KnobValue:
    """A value of ``knob`` unlike any engine's default: the last choice, true, the upper (float: lower) bound."""
    if knob.kind == "choice":
        return knob.choices[-1]
    if knob.kind == "bool":
        return True
    bound = knob.low if knob.kind == "float" else knob.high
    assert bound is not None
    return int(bound) if knob.kind == "int" else bound


def _spec(card: EngineCard, knobs: dict[str, KnobValue], device: str) -> JobSpec:
    return JobSpec(job_id="k" * 32, request_id="r", model_sha256="0" * 64, model_format=sorted(card.formats)[0],
                   inputs=[TensorSpec(name="x", shape=(1,))], device=device, engine=card.name, batch_size=1,
                   concurrency=1, queue="farm.cpu", measurement=MeasurementSettings(llm=LlmSettings()), knobs=knobs)


def _launched(card: EngineCard, knobs: dict[str, KnobValue], model: Path
              ) -> dict[tuple[str, str], tuple[list[str], dict[str, str]]]:
    """The launch's command line and environment on each site and device class that can launch it (a container, a
    process; a CPU, a GPU), by (site, device)."""
    out = {}
    for site in (docker_runner.SITE, process_runner.SITE):
        for device in sorted(card.devices):
            try:
                launch = SERVING[card.name].launch(_spec(card, knobs, "cpu" if device == "cpu" else "gpu:h200"),
                                                   model, site)
            except UnsupportedError:  # this site cannot run it (no package here, one slot only, CPU only)
                continue
            out[(str(site.container), device)] = (launch.argv, dict(launch.env))
    return out


@pytest.mark.parametrize("engine", [c.name for c in OPENAI])
def test_every_knob_of_a_card_changes_its_serving_modules_launch(engine: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A knob on the card that the serving module ignored would be swept and measured as if it had been set."""
    monkeypatch.setattr(shutil, "which", lambda name, *_a, **_k: f"/opt/bin/{name}")  # llama-server "on PATH"
    monkeypatch.setenv("FARM_VLLM_PYTHON", sys.executable)  # vLLM's CPU environment (only declared: nothing runs)
    reset_settings()
    card = CARDS[engine]
    assert card.knobs and set(KNOBS[engine]) == {k.name for k in card.knobs}
    plain = _launched(card, {}, tmp_path)
    assert plain, engine
    for knob in card.knobs:
        got = _launched(card, {knob.name: _value(knob)}, tmp_path)
        assert any(got[key] != base for key, base in plain.items() if key in got), \
            f"{engine}: knob {knob.name} changes no launch"
    flags = getattr(sys.modules[type(SERVING[engine]).__module__], "FLAGS", {})
    assert set(flags) <= {k.name for k in card.knobs}, engine  # the module maps no knob its card lacks


def test_the_derived_tables_keep_their_values() -> None:
    """The tables the cards replaced, as they were written by hand before (the same requests give the same jobs)."""
    assert FORMAT_ENGINE == {"onnx": "onnxruntime", "torchscript": "torchscript"}
    assert LLM_FORMAT_ENGINE == {"gguf": "llama.cpp", "hf": "transformers"}
    assert IN_PROCESS == ("onnxruntime", "torchscript", "openvino")
    assert PROFILED_ENGINES == ("onnxruntime", "torchscript", "openvino")
    assert [c.name for c in OPENAI] == ["llama.cpp", "transformers", "vllm"]
    assert set(get_args(ModelFormat)) == {f for c in CARDS.values() for f in c.formats} - {"endpoint"}
    defaults = [f for c in CARDS.values() for f in c.default_for]
    assert len(defaults) == len(set(defaults))  # one default engine per format
    assert all(f in CARDS[default_engine(f) or ""].formats for f in defaults)


def test_is_openai_is_the_cards_protocol_or_the_jobs_llm_settings() -> None:
    assert [e for e in CARDS if is_openai(e)] == [c.name for c in OPENAI]
    assert not is_openai(ENDPOINT_ENGINE) and is_openai(ENDPOINT_ENGINE, LlmSettings())
    assert not is_openai("no-such-engine")
    assert llm_format("gguf") and llm_format("hf") and not llm_format("onnx") and not llm_format("endpoint")
