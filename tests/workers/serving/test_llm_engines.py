"""The LLM engines launched by farm's process runner (``Runner.serve``) on the tiny-llama example: each answers a
streamed chat completion, keeps every thread inside a 1-core lease, and leaves no process behind, also when
its launch fails (the error then holds the engine's last log lines)."""
from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import ValidationError

from farm.errors import ServerError, UnsupportedError
from farm.settings import reset_settings
from schemas import JobSpec, MeasurementSettings
from schemas.engines import SERVED_MODEL_NAME
from tests.llm_servers import skip_without
from workers.measure import tree_pids
from workers.runners.process import ProcessRunner
from workers.serving.confine import thread_cpus

FORMATS = {"llama.cpp": "gguf", "transformers": "hf", "vllm": "hf"}


@pytest.fixture
def python_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp served by llama-cpp-python's server (FARM_LLAMA_SERVER=off), whatever llama-server this host has:
    llama-server's own tests are tests/workers/serving/test_llama_server.py."""
    from farm.settings import reset_settings

    monkeypatch.setenv("FARM_LLAMA_SERVER", "off")
    reset_settings()


def spec_for(engine: str, device: str = "cpu", **knobs: Any) -> JobSpec:
    return JobSpec(job_id="j" * 32, request_id="r", model_sha256="0" * 64, model_format=FORMATS[engine], inputs=[],
                   device=device, engine=engine, batch_size=1, concurrency=1, queue="farm.cpu",
                   measurement=MeasurementSettings(), knobs=knobs)


def stream_chat(url: str, max_tokens: int = 24) -> tuple[list[str], dict[str, Any]]:
    """The content deltas of one streamed chat completion and its last chunk."""
    body = {"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": "How fast is this server?"}],
            "max_tokens": max_tokens, "stream": True}
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    deltas: list[str] = []
    last: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers.get_content_type() == "text/event-stream"
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            last = json.loads(line[6:])
            for choice in last.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    deltas.append(choice["delta"]["content"])
    return deltas, last


def jailed_server(pids: set[int]) -> psutil.Process:
    """The server itself among a jailed launch's processes (not bubblewrap, not farm's relay)."""
    found = [psutil.Process(p) for p in sorted(pids)]
    return next(p for p in reversed(found) if p.name() != "bwrap" and "workers.serving.relay" not in p.cmdline())


def _gone(pids: set[int]) -> bool:
    return all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


@pytest.mark.llm
@pytest.mark.parametrize("engine", ["llama.cpp", "transformers"])
def test_an_engine_serves_a_stream_inside_its_lease_and_leaves_nothing(engine: str, tiny_llama: Any,
                                                                      python_llama_cpp: None) -> None:
    skip_without(engine)
    model = tiny_llama.gguf if engine == "llama.cpp" else tiny_llama.hf
    core = min(os.sched_getaffinity(0))
    with ProcessRunner().serve(spec_for(engine), model, cpus={core}) as target:
        pids = tree_pids(target.pid or 0)
        threads = thread_cpus(pids)
        assert threads and all(t.cpus == {core} for t in threads)
        server = jailed_server(pids)  # the process runner jails every LLM server: bwrap, farm's relay, the server
        cmdline, env = server.cmdline(), server.environ()
        if engine == "llama.cpp":  # threads follow the 1-core lease (the wrapper filled in {cores})
            assert cmdline[cmdline.index("--n_threads") + 1] == "1"
        else:
            assert env["OMP_NUM_THREADS"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
        deltas, last = stream_chat(f"http://{target.url}/v1")
        assert len(deltas) >= 2 and "".join(deltas).strip()
        assert last["choices"][0]["finish_reason"] == "length"
    assert _gone(pids)


@pytest.mark.llm
def test_llama_cpp_threads_follow_the_lease_unless_a_knob_sets_them(tiny_llama: Any, python_llama_cpp: None) -> None:
    skip_without("llama.cpp")
    from workers.serving.registry import serving_engine

    site = ProcessRunner.site
    argv = serving_engine("llama.cpp").launch(spec_for("llama.cpp"), tiny_llama.gguf, site).argv
    assert argv[argv.index("--n_threads") + 1] == "{cores}" and "--interrupt_requests" in argv
    argv = serving_engine("llama.cpp").launch(spec_for("llama.cpp", n_threads=2, n_ctx=512), tiny_llama.gguf,
                                              site).argv
    assert argv[argv.index("--n_threads") + 1] == "2" and argv[argv.index("--n_ctx") + 1] == "512"


@pytest.mark.llm
def test_a_failed_launch_fails_with_the_engines_log_and_leaves_no_process(tmp_path: Path, python_llama_cpp: None
                                                                         ) -> None:
    skip_without("llama.cpp")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 200)  # the magic, then garbage
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ServerError) as info:
        with ProcessRunner().serve(spec_for("llama.cpp"), bad, cpus=None):
            pass
    message = str(info.value)
    assert "server output:" in message and "\n" not in message
    assert "gguf" in message.lower() or "llama" in message.lower()  # the engine's own words
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert _gone(after - before)


def test_a_knob_the_engine_does_not_have_is_refused() -> None:
    with pytest.raises(ValidationError, match="engine llama.cpp has no knob max_num_seqs"):
        spec_for("llama.cpp", max_num_seqs=4)
    with pytest.raises(ValidationError, match="n_parallel"):
        spec_for("llama.cpp", n_parallel=0)
    with pytest.raises(ValidationError, match="has no knobs"):
        JobSpec(job_id="j", request_id="r", model_sha256="0" * 64, model_format="onnx", inputs=[], device="cpu",
                engine="onnxruntime", batch_size=1, concurrency=1, queue="farm.cpu",
                measurement=MeasurementSettings(), knobs={"n_ctx": 512})


def test_slots_need_llama_server_and_vllm_on_a_cpu_needs_its_environment(tiny_llama: Any, python_llama_cpp: None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.serving.registry import serving_engine

    site = ProcessRunner.site
    if serving_engine("llama.cpp").package and not _has("llama_cpp"):
        pytest.skip("llama-cpp-python is not installed: pip install 'farm[llm]'")
    with pytest.raises(UnsupportedError, match="n_parallel 4 needs llama.cpp's llama-server"):
        serving_engine("llama.cpp").launch(spec_for("llama.cpp", n_parallel=4), tiny_llama.gguf, site)
    monkeypatch.delenv("FARM_VLLM_PYTHON", raising=False)
    reset_settings()
    with pytest.raises(UnsupportedError, match="no vLLM CPU environment: set FARM_VLLM_PYTHON"):
        serving_engine("vllm").launch(spec_for("vllm"), tiny_llama.hf, site)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.llm
@pytest.mark.parametrize(("engine", "knobs"), [
    ("llama.cpp", {"n_ctx": 512, "n_batch": 64, "n_threads": 1, "n_parallel": 1}),
    ("transformers", {"dtype": "float32", "attn_implementation": "eager", "n_threads": 1}),
])
def test_knobs_reach_a_real_server(engine: str, knobs: dict[str, Any], tiny_llama: Any, python_llama_cpp: None
                                   ) -> None:
    """The flags each knob maps to are ones the real server takes: it starts and streams."""
    skip_without(engine)
    model = tiny_llama.gguf if engine == "llama.cpp" else tiny_llama.hf
    with ProcessRunner().serve(spec_for(engine, **knobs), model, cpus={min(os.sched_getaffinity(0))}) as target:
        deltas, _ = stream_chat(f"http://{target.url}/v1", max_tokens=8)
        assert len(deltas) >= 2
        if engine == "transformers":
            env = psutil.Process(target.pid).environ()
            assert env["OMP_NUM_THREADS"] == "1" and env["HF_HUB_OFFLINE"] == "1"
