"""``farm submit tiny.gguf --engine llama.cpp`` end to end on the embedded default, as a user runs it: farm launches
llama.cpp's ``llama-server`` (jailed, on the job's cores, with ``--metrics``), drives it with the OpenAI client and
stores the row: which server ran and its version, and the server's own view (its ``/metrics`` scraped through the
measured windows), consistent with the client's counts; ``n_parallel`` is the server's slots; a server that dies
while loading fails its job with its own last log lines; Ctrl-C leaves nothing running; llama-cpp-python's server
serves where llama-server is absent, and its row says it has no ``/metrics``."""
from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers import farm, farm_env, running_job, servers_of, signal_when, start_submit

pytestmark = pytest.mark.llm

SHORT = ["--duration", "2", "--window", "1", "--warmup", "0.5", "--input-tokens", "24", "--output-tokens", "16"]


def _submit(env: dict[str, str], model: Path, *args: str) -> tuple[str, list[dict[str, Any]]]:
    out = farm("submit", str(model), "--engine", "llama.cpp", *SHORT, *args, "--json", env=env, timeout=420)
    rid = json.loads(out.stdout)["request_id"]
    return rid, json.loads(farm("results", rid, "--format", "json", env=env).stdout)


def _details(env: dict[str, str], job_id: str) -> dict[str, Any]:
    with sqlite3.connect(Path(env["FARM_HOME"]) / "farm.db") as con:  # the embedded database
        (text,) = con.execute("SELECT details FROM results WHERE job_id = ?", (job_id,)).fetchone()
    details: dict[str, Any] = json.loads(text)
    return details


def test_llama_server_rows_name_it_and_carry_its_own_view(llama_server: str, tiny_llama: Any) -> None:
    """Slots 1 and 4 at concurrency 4: each row names llama-server and its version; the server's requests running
    never exceed its slots (one slot: the rest wait in its queue); its generated-token counter over the whole run
    equals the client's own total (plus what requests cut off at the end got); it was scraped at >= 2 Hz."""
    from workers.serving.llama_cpp import llama_server_version

    env = farm_env()
    _, rows = _submit(env, tiny_llama.gguf, "--concurrency", "4", "--knob", "n_parallel=1,4")
    assert sorted(r["knobs"]["n_parallel"] for r in rows) == [1, 4]
    for r in rows:
        assert r["status"] == "succeeded", r.get("error")
        assert r["error_count"] == 0  # llama-server closes its connection after each stream: the client copes
        assert r["server"] == f"llama-server {llama_server_version(llama_server)}"
        slots = r["knobs"]["n_parallel"]
        assert 1 <= r["server_requests_running_max"] <= slots
        assert r["server_generation_tokens"] > 0 and r["server_prompt_tokens"] > 0
        view = _details(env, r["job_id"])["load"]["server_view"]
        assert view["available"] and view["scrape_hz"] >= 2 and r["server_scrapes"] >= 2 * r["duration_s"]
        client, server = view["client_run"], view["run"]
        assert 0 <= server["generation_tokens"] - client["generation_tokens"] <= client["cut"] * 16, view
        assert server["prompt_tokens"] + server["cached_prompt_tokens"] >= client["prompt_tokens"]
    one = next(r for r in rows if r["knobs"]["n_parallel"] == 1)
    four = next(r for r in rows if r["knobs"]["n_parallel"] == 4)
    assert one["server_requests_running_max"] == 1 and one["server_requests_waiting_max"] >= 1
    assert four["server_requests_running_max"] > 1


def test_a_llama_server_that_dies_while_loading_fails_its_job_with_its_log(llama_server: str,
                                                                         tiny_llama: Any) -> None:
    """n_ubatch above n_batch: llama.cpp asserts while loading; the job fails with the server's words, nothing of
    it is left running, and the next job of the request (a sound one) still runs."""
    env, since = farm_env(), time.time()
    _, rows = _submit(env, tiny_llama.gguf, "--concurrency", "1", "--knob", "n_batch=1,512",
                      "--knob", "n_ubatch=1024")
    by_batch = {r["knobs"]["n_batch"]: r for r in rows}
    bad, good = by_batch[1], by_batch[512]
    assert bad["status"] == "failed" and "GGML_ASSERT" in bad["error"] and "exited before it was ready" in bad["error"]
    assert "\n" not in bad["error"]
    assert good["status"] == "succeeded", good.get("error")
    assert servers_of(tiny_llama.gguf, since) == []


def test_ctrl_c_stops_llama_server_and_leaves_nothing(llama_server: str, tiny_llama: Any, tmp_path: Path) -> None:
    env, since = farm_env(), time.time()
    proc = start_submit(tiny_llama.gguf, tmp_path / "stderr", "--engine", "llama.cpp", "--duration", "20",
                        "--input-tokens", "24", "--output-tokens", "16", env=env)
    db = Path(env["FARM_HOME"]) / "farm.db"

    def serving() -> list[psutil.Process] | None:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if running_job(db) is None or not any(p.name() == "llama-server" for p in kids if p.is_running()):
            return None
        time.sleep(1.0)  # into the load
        return psutil.Process(proc.pid).children(recursive=True)

    code, children = signal_when(proc, tmp_path / "stderr", serving, signal.SIGINT)
    assert code == 130, (tmp_path / "stderr").read_text()
    gone, alive = psutil.wait_procs(children, timeout=5)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
    assert servers_of(tiny_llama.gguf, since) == []


def test_without_llama_server_llama_cpp_python_serves_and_the_row_says_so(tiny_llama: Any, tmp_path: Path) -> None:
    """FARM_LLAMA_SERVER naming a missing program: the job runs on llama-cpp-python's server, named in the row;
    it has no /metrics, which the row says (no server figures, 0 scrapes), and nothing else fails."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: pip install 'farm[llm]'")
    env = farm_env(FARM_LLAMA_SERVER=str(tmp_path / "missing-llama-server"))
    _, (row,) = _submit(env, tiny_llama.gguf, "--concurrency", "1")
    assert row["status"] == "succeeded", row.get("error")
    assert row["server"].startswith("llama-cpp-python ") and row["output_tokens_per_s"] > 0
    assert row["server_scrapes"] == 0 and row["server_generation_tokens"] is None
    details = _details(env, row["job_id"])
    assert any("no Prometheus /metrics" in n for n in details["load"]["notes"])
    assert any("served by llama-cpp-python's server" in n and "missing-llama-server" in n for n in details["notes"])


def test_a_knob_llama_cpp_lacks_is_refused_at_submit(tiny_llama: Any) -> None:
    proc = farm("submit", str(tiny_llama.gguf), "--engine", "llama.cpp", "--knob", "max_num_seqs=4", "--dry-run",
                check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "engine llama.cpp has no knob max_num_seqs" in proc.stderr and "n_ubatch" in proc.stderr
