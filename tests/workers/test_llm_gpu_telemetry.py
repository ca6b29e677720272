"""NVML telemetry joins an LLM job's row as it joins any GPU job's: ``farm submit --engine vllm --device gpu`` on
the tiny-llama folder, embedded, on a host whose only NVML is the fake libnvidia-ml (two GPUs) and whose ``vllm``
is a stand-in package: its ``vllm.entrypoints.openai.api_server`` takes vLLM's command line, records what it was
given, "loads" 300 MiB onto its GPU in the fake NVML state (as a compute process of its own pid, 70 % busy,
150 W), then becomes the fake OpenAI server (``tests.fake_openai``). So the real path runs: submit's checks, the
embedded worker's GPU detection and slot, vLLM's launch declaration, the process runner's GPU binding (the UUID
in ``CUDA_VISIBLE_DEVICES`` turned into its index by the launch wrapper), the OpenAI client, the NVML sampler
of the job's GPU, and the stored row."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers import farm, farm_env
from tests.workers.samplers.conftest import fake_nvml_dir  # noqa: F401  (fake NVML fixture)

MIB = 1 << 20
UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000")
LLM = ["--duration", "1", "--window", "0.5", "--warmup", "0.3", "--input-tokens", "16", "--output-tokens", "8"]

FAKE_SERVER = '''
import argparse, json, os, sys
p = argparse.ArgumentParser()
for flag in ("--model", "--served-model-name", "--host", "--port"):
    p.add_argument(flag)
args, rest = p.parse_known_args()
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(os.environ["FAKE_VLLM_RECORD_DIR"] if "FAKE_VLLM_RECORD_DIR" in os.environ else {record!r},
                       "launch.json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
               "order": os.environ.get("CUDA_DEVICE_ORDER"), "offline": os.environ.get("HF_HUB_OFFLINE"),
               "pid": os.getpid()}}, f)
gpu = os.environ["CUDA_VISIBLE_DEVICES"]  # the index of the job's GPU
state = {state!r}
lines = [l for l in open(state).read().splitlines()
         if not any(l.startswith(f"gpu {{gpu}} {{k}} ") for k in ("mem_used", "util_gpu", "power_mw"))]
lines += [f"gpu {{gpu}} mem_used {{(1024 + 300) << 20}}", f"gpu {{gpu}} util_gpu 70", f"gpu {{gpu}} power_mw 150000",
          f"gpu {{gpu}} proc {{os.getpid()}} {{300 << 20}}"]
open(state + ".tmp", "w").write("\\n".join(lines) + "\\n")
os.replace(state + ".tmp", state)
os.execv(sys.executable, [sys.executable, "-m", "tests.fake_openai", "--port", args.port, "--model",
                          args.served_model_name, "--ttft-ms", "5", "--itl-ms", "1"])
'''


def _fake_vllm(root: Path, state: Path, record: Path) -> Path:
    pkg = root / "vllm" / "entrypoints" / "openai"
    pkg.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api_server.py").write_text(FAKE_SERVER.format(state=str(state), record=str(record)))
    return root


def test_an_llm_job_on_a_gpu_gets_the_nvml_figures_of_its_own_gpu(fake_nvml_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    lib = tmp_path / "nvml"
    lib.mkdir()
    shutil.copy(fake_nvml_dir / "libnvidia-ml.so.1", lib)
    state = lib / "nvml.state"  # beside the library: the server's allowlisted environment has no FAKE_NVML_STATE
    # GPU 0, a T4, is busy with something else (its figures must not leak in); the job's is GPU 1, the L4
    state.write_text(f"driver 550.54.15\ngpu 0 uuid {UUIDS[0]}\ngpu 0 name Tesla T4\ngpu 0 mem_total {16 << 30}\n"
                     f"gpu 0 mem_used {12 << 30}\ngpu 0 util_gpu 100\ngpu 0 power_mw 70000\n"
                     f"gpu 1 uuid {UUIDS[1]}\ngpu 1 name NVIDIA L4\ngpu 1 mem_total {24 << 30}\n"
                     f"gpu 1 mem_used {1 << 30}\ngpu 1 util_gpu 0\ngpu 1 power_mw 30000\n")
    fake = _fake_vllm(tmp_path / "site", state, tmp_path)
    # unjailed: the stand-in server writes its GPU's figures into the fake NVML's state file, which farm's jail
    # rightly keeps read-only (tests/farm/test_sandbox.py checks that a jail sees LD_LIBRARY_PATH's libraries)
    env = farm_env(LD_LIBRARY_PATH=str(lib), FARM_RUNNER="process", FARM_TRUSTED_MODELS="1")
    env["PYTHONPATH"] = f"{fake}:{env.get('PYTHONPATH', '')}"
    farm("example-model", str(tmp_path / "m"), "--kind", "tiny-llama", env=env)
    out = farm("submit", str(tmp_path / "m" / "tiny-llama-hf"), "--engine", "vllm", "--device", "gpu:l4",
               "--knob", "max_num_seqs=8", "--knob", "enable_prefix_caching=false", "--concurrency", "2", *LLM,
               "--json", env=env)
    rid = json.loads(out.stdout)["request_id"]
    (row,) = json.loads(farm("results", rid, "--format", "json", env=env).stdout)
    assert row["status"] == "succeeded" and row["engine"] == "vllm", row.get("error")
    launch = json.loads((tmp_path / "launch.json").read_text())
    assert launch["cuda"] == "1" and launch["order"] == "PCI_BUS_ID" and launch["offline"] == "1"  # index, not UUID
    assert "--max-num-seqs" in launch["argv"] and "--no-enable-prefix-caching" in launch["argv"]
    # the LLM figures and the GPU's, on one row
    assert row["ttft_p50_ms"] >= 5 and row["itl_p50_ms"] > 0 and row["output_tokens_per_s"] > 0
    assert row["gpu_mem_peak_bytes"] == 300 * MIB  # the server process's own memory, from NVML
    assert 0 < row["gpu_util_avg_pct"] <= 70 and 30 <= row["gpu_power_avg_w"] <= 150  # never the T4's 100 %
    wide = farm("results", rid, "--wide", env={**env, "COLUMNS": "400"}).stdout  # wide enough: no header cut
    assert "GPU mem" in wide and "GPU W" in wide  # the LLM table shows them where measured
