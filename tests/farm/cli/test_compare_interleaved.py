"""``farm compare --interleaved OLD NEW`` through the real CLI on two tiny ONNX models: the verdict line with its
interval and detectable difference, every block in --json, the CI gate's exit codes, bad input in one line."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from farm.models.examples import build_example
from tests.helpers import farm, servers_of

#: a short, quiet cell: one thread, blocks of 100 ms, a budget that a tiny model's verdict fits in
QUICK = ["--threads", "1", "--block-ms", "100", "--warmup", "0.1"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("compare")
    return {"a": build_example("compute", out / "a.onnx", ms=0.5),
            "slow": build_example("compute", out / "slow.onnx", ms=1.5),  # three times the layers
            "other": build_example("identity", out / "identity.onnx")}


@pytest.mark.slow
def test_a_clear_slowdown_fails_the_gate_and_names_its_verdict(models: dict[str, Path]) -> None:
    out = farm("compare", "--interleaved", str(models["a"]), str(models["slow"]), *QUICK, "--budget-s", "30",
               "--fail-on-regression", "20", check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "slower" in out.stdout and "% CI" in out.stdout and "detectable difference" in out.stdout
    assert "both at once" in out.stdout and "conclusively slower" in out.stderr


@pytest.mark.slow
def test_a_against_a_passes_the_gate_and_keeps_every_block(models: dict[str, Path]) -> None:
    # alpha 0.001: an A/A verdict is wrong with probability alpha by design (CI once drew one at 0.05)
    out = farm("compare", "--interleaved", str(models["a"]), str(models["a"]), *QUICK, "--budget-s", "8",
               "--fail-on-regression", "5", "--alpha", "0.001", "--json")
    got = json.loads(out.stdout)
    assert got["verdict"] in ("same", "inconclusive") and got["pairs"] >= 2  # how many fit in 8 s: the host's
    assert len(got["blocks"]) == 2 * got["pairs"]
    assert {b["side"] for b in got["blocks"]} == {"A", "B"}
    assert all(b["requests"] > 0 and b["duration_s"] > 0 for b in got["blocks"])
    lo, hi = got["ci_pct"]
    assert lo <= got["change_pct"] <= hi and got["detectable_pct"] > 0 and got["mode"] == "both at once"
    assert got["setup_s"] >= 0 and got["seconds"] > 0  # the budget is measuring time; leasing and loading apart


@pytest.mark.slow
def test_the_alternate_start_mode_says_so(models: dict[str, Path]) -> None:
    out = farm("compare", "--interleaved", str(models["a"]), str(models["slow"]), *QUICK, "--budget-s", "3",
               "--alternate-start", "--mode", "constant", "--rate", "50")
    assert "alternate start" in out.stdout and "alternate-start mode" in out.stdout and "p50 latency" in out.stdout


@pytest.mark.parametrize(("args", "says"), [
    (("{a}", "{other}"), "same inputs"),
    (("{a}", "{a}", "--batch-sizes", "1,2"), "one cell"),
    (("{a}", "{a}", "--mode", "poisson"), "needs a rate"),
    (("{a}", "{missing}"), "is not a file"),
    (("{a}", "{a}", "--engine", "triton"), "runs its own server"),
    (("{a}", "{a}", "--engine", "llama.cpp"), "cannot load onnx"),
])
def test_bad_input_is_one_line(models: dict[str, Path], tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    paths = {k: str(v) for k, v in models.items()} | {"missing": str(tmp_path / "nope.onnx")}
    out = farm("compare", "--interleaved", *(a.format(**paths) for a in args), check=False)
    assert out.returncode not in (0, 1), out.stdout  # not a verdict: an error
    assert says in out.stderr and "Traceback" not in out.stderr
    assert len([line for line in out.stderr.splitlines() if line.strip()]) == 1, out.stderr


def test_cell_options_need_interleaved() -> None:
    out = farm("compare", "abc", "def", "--batch-sizes", "4", check=False)
    assert out.returncode != 0 and "--interleaved" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
@pytest.mark.llm
def test_two_llm_models_interleave_on_their_own_servers(tiny_llama: Any, llama_server: str) -> None:
    """An LLM cell: each GGUF served by llama-server on the compare's lease (jailed as a job's), the streamed load
    alternating between them; blocks carry TTFT and output tokens/s, the verdict is on tokens/s, and both servers
    are gone after."""
    since = time.time()
    out = farm("compare", "--interleaved", str(tiny_llama.gguf), str(tiny_llama.gguf), "--input-tokens", "16",
               "--output-tokens", "8", "-c", "2", "--budget-s", "4", "--json")
    got = json.loads(out.stdout)
    assert got["metric"] == "output_tokens_per_s" and got["pairs"] >= 1 and "llama.cpp" in got["cell"]
    assert len(got["blocks"]) == 2 * got["pairs"] and {b["side"] for b in got["blocks"]} == {"A", "B"}
    assert all(b["requests"] > 0 and b["ttft_p50_ms"] > 0 and b["output_tokens_per_s"] > 0 for b in got["blocks"])
    assert "--block-ms raised to 1000" in out.stderr  # an LLM block is never shorter than a streamed answer
    assert servers_of(tiny_llama.gguf, since) == []


@pytest.mark.slow
def test_host_figures_line_up_two_hosts(models: dict[str, Path], tmp_path: Path) -> None:
    """A model's cost in units of a reference, measured interleaved on one host, written as a host figure; two
    figures of one model lined up (here both from this host: the same or inconclusive, never a difference)."""
    figures = []
    for name in ("x", "y"):
        path = tmp_path / f"{name}.json"
        out = farm("compare", "--interleaved", str(models["a"]), str(models["slow"]), *QUICK, "--budget-s", "3",
                   "--host-figure", str(path))
        assert "host figure: slow.onnx costs" in out.stdout and path.is_file()
        figures.append(json.loads(path.read_text()))
    for fig in figures:
        assert fig["model"]["name"] == "slow.onnx" and fig["reference"]["name"] == "a.onnx"
        assert len(fig["ratios"]) >= 2 and fig["figure"] > 1.0  # three times the layers: costs more than the ref
        assert fig["host"]["cpu"] and fig["metric"] == "throughput_infer_per_s"
    out = farm("compare", "--hosts", str(tmp_path / "x.json"), str(tmp_path / "y.json"), "--json")
    got = json.loads(out.stdout)
    assert got["verdict"] in ("same", "inconclusive") and got["x"]["pairs"] == len(figures[0]["ratios"])
    text = farm("compare", "--hosts", str(tmp_path / "x.json"), str(tmp_path / "y.json")).stdout
    assert "in units of a.onnx" in text and "detectable difference" in text and "rank-sum" in text


def test_host_figures_of_other_models_or_files_are_one_line(tmp_path: Path) -> None:
    def fig(model: str) -> str:
        path = tmp_path / f"{model}.json"
        path.write_text(json.dumps({"model": {"name": model, "sha256": model * 8}, "reference": {"name": "r",
                                    "sha256": "r" * 8}, "cell": "c", "metric": "m", "ratios": [1.0, 1.1],
                                    "figure": 1.05, "host": {"cpu": "x"}, "measured_at": "now"}))
        return str(path)

    for args, says in [((fig("m1"), fig("m2")), "differ in their model"),
                       ((fig("m1"), str(tmp_path)), "cannot read it"),
                       ((fig("m1"), __file__), "is not a host figure")]:
        out = farm("compare", "--hosts", *args, check=False)
        assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1, out.stderr
    out = farm("compare", "abc", "def", "--host-figure", str(tmp_path / "f.json"), check=False)
    assert out.returncode == 2 and "--interleaved REF MODEL" in out.stderr
