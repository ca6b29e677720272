"""The ``vllm`` engine: a Hugging Face model folder served over the OpenAI API by vLLM's server
(``python -m vllm.entrypoints.openai.api_server``) on one GPU of a GPU worker, or by vLLM's CPU build on a CPU
worker's leased cores (``workers.serving.vllm_cpu``: the process runner, from the environment ``FARM_VLLM_PYTHON``
names). A GPU worker without the ``vllm`` package refuses the job with what to install. Its knobs
(``CARDS["vllm"].knobs``) map to vLLM's flags (``FLAGS``); the model is served as ``model`` like every LLM engine;
readiness is a one-token completion (on a CPU, then a warm-up until steady).

Images: on the Docker runner, the image named by ``FARM_VLLM_IMAGE`` (``docker/Dockerfile``'s ``vllm`` target,
built on the GPU host), else farm's local image's ``-gpu`` variant, copied from the worker's own Python with
every distribution vLLM requires. The job's GPU: the Docker runner asks for it by UUID (a device request), so
the container sees that GPU only; the process runner sets ``CUDA_VISIBLE_DEVICES`` to its UUID, which vLLM
cannot read (it takes the variable's entries as integers), so the launch wrapper rewrites it to the GPU's NVML
index in PCI bus order (``workers.serving.lease_exec --cuda-index``). The pins (vLLM and the torch it brings,
kept out of the CPU install's torch) are in ``pyproject.toml``'s ``gpu`` extra and ``docker/Dockerfile``'s
``vllm`` target; ``tests/workers/serving/test_vllm_launch.py`` checks that they agree with ``VLLM_VERSION`` and
the docs."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from farm.errors import UnsupportedError
from farm.settings import get_settings
from schemas import JobSpec
from schemas.engines import CARDS, SERVED_MODEL_NAME
from workers.engines.base import Package
from workers.serving.base import Launch, ServingEngine, Site
from workers.serving.llm import listen_prefix, port_arg, require_module, wait_openai_ready, wrap
from workers.serving.vllm_cpu import (
    ENV_CPUS,
    ENV_THREADS,
    SYSTEM_READS,
    VLLM_CPU_VERSION,
    cpu_env,
    refuse_gpu_knobs,
    venv_root,
    vllm_python,
    warm_until_steady,
)
from workers.serving.vllm_cpu import (
    INSTALL as CPU_INSTALL,
)

#: the vLLM release farm's GPU image and ``farm[gpu]`` install (docs/llm-engines.md)
VLLM_VERSION = "0.33.0"
VLLM_PIN = f"vllm=={VLLM_VERSION}"
#: the torch that release pins (its own ``Requires-Dist``): in the GPU image only, never beside farm[torch]'s CPU pin
VLLM_TORCH = "torch==2.14.0"
INSTALL = f"pip install 'farm[gpu]' ({VLLM_PIN}) in a venv without farm's torch/llm extras, or use farm's GPU image"
FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
         "gpu_memory_utilization": "--gpu-memory-utilization", "block_size": "--block-size", "dtype": "--dtype",
         "optimization_level": "--optimization-level"}
#: on/off knobs: knob -> (flag when true, flag when false)
SWITCHES = {"enable_prefix_caching": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
            "enable_chunked_prefill": ("--enable-chunked-prefill", "--no-enable-chunked-prefill")}
#: offline (no hub, no usage report: model files come from farm's store and nothing leaves the worker)
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
#: vLLM's API process and engine core share tensors over shared memory; Docker's default /dev/shm is 64 MB
SHM_SIZE = "2g"
#: the least time vLLM gets to answer its first completion, s: before it serves, it profiles memory, compiles the
#: model (torch.compile) and captures CUDA graphs, a minute or more even for a tiny model (FARM_SERVER_READY_TIMEOUT_S,
#: 60 s by default, is sized for farm's own servers); a server that exits is still reported at once
READY_FLOOR_S = 600.0
#: the distributions farm's image variant ``<tag>-gpu`` starts from; their requirements are followed
#: (``Package.closure``): vLLM needs about 150, with torch's CUDA build and the nvidia-* wheels
VLLM_DISTRIBUTIONS = ("vllm",)


def wait_vllm_ready(url: str, model_name: str, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
    """``wait_openai_ready`` with at least ``READY_FLOOR_S`` for vLLM's start-up."""
    wait_openai_ready(url, model_name, max(timeout_s, READY_FLOOR_S), alive=alive)


def vllm_steady(concurrency: int) -> Callable[..., None]:
    """The CPU build's readiness check: ready (``wait_vllm_ready``), then warmed at ``concurrency`` until steady."""
    def ready(url: str, model_name: str, timeout_s: float, alive: Callable[[], bool] | None = None) -> None:
        wait_vllm_ready(url, model_name, timeout_s, alive=alive)
        warm_until_steady(url, model_name, concurrency, alive=alive)
    return ready


def vllm_argv(spec: JobSpec, model: str, site: Site, python: str | None = None) -> list[str]:
    """vLLM's OpenAI server for ``spec`` serving the folder ``model`` (as the server sees it), run by ``python``
    (default the site's)."""
    argv = [python or site.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", SERVED_MODEL_NAME, "--host", site.host, "--port", port_arg(site),
            "--disable-uvicorn-access-log"]  # a log line per request costs the server's CPU during the measurement
    for knob, flag in FLAGS.items():
        if knob in spec.knobs:
            argv += [flag, str(spec.knobs[knob])]
    for knob, (on, off) in SWITCHES.items():
        if knob in spec.knobs:
            argv.append(on if spec.knobs[knob] else off)
    return argv


class Vllm(ServingEngine):
    """vLLM on a GPU job's folder."""

    name = "vllm"
    package = Package("vllm", VLLM_DISTRIBUTIONS, extra=CARDS[name].extra, closure=True,
                      install=f"{INSTALL}: build docker/Dockerfile's vllm target and name it in FARM_VLLM_IMAGE")

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        if not spec.device.startswith("gpu"):
            return self.launch_cpu(spec, model_path, site)
        require_module(spec, site, "vllm", INSTALL)
        model = site.path(model_path)
        image = get_settings().vllm_image if site.container else None
        return Launch(argv=wrap(site, vllm_argv(spec, model, site), cuda_index=True), port=site.port, model=model,
                      mounts=site.mounts(model_path), env=dict(ENV), shm_size=SHM_SIZE if site.container else None,
                      listen_prefix=listen_prefix(site), ready=wait_vllm_ready, image=image,
                      image_help=f"build it there: docker build -f docker/Dockerfile --target vllm -t {image} .",
                      entrypoint=[""] if image else None)  # farm's image's entrypoint is the CLI: run argv itself

    def launch_cpu(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        """vLLM's CPU build on the job's leased cores, from ``FARM_VLLM_PYTHON``'s environment (process runner)."""
        if site.container:
            raise UnsupportedError(f"job {spec.job_id}: vLLM on a CPU runs on the process runner (FARM_RUNNER=process) "
                                   f"from its own environment; {CPU_INSTALL}")
        refuse_gpu_knobs(spec)
        python = vllm_python()
        model = site.path(model_path)
        argv = vllm_argv(spec, model, site, python)
        return Launch(argv=wrap(site, argv, env_threads=ENV_THREADS, env_cpus=ENV_CPUS), port=site.port, model=model,
                      env={**ENV, **cpu_env(spec)}, listen_prefix=listen_prefix(site),
                      ready=vllm_steady(spec.concurrency), read_only=(venv_root(python), *SYSTEM_READS),
                      server={"name": "vllm-cpu", "version": VLLM_CPU_VERSION, "python": python})
