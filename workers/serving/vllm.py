"""The ``vllm`` engine: a Hugging Face model folder served over the OpenAI API by vLLM's server
(``vllm serve``) on one GPU of a GPU worker. Declared for GPU workers only (``schemas.engines.RULES``: a CPU
job is excluded at submit with its reason); a worker without the ``vllm`` package refuses the job with what to
install. Its knobs (``schemas.llm_engines.KNOBS["vllm"]``) map to vLLM's flags."""
from __future__ import annotations

from pathlib import Path

from farm.errors import UnsupportedError
from schemas import JobSpec
from schemas.engines import SERVED_MODEL_NAME
from workers.engines.base import Package
from workers.serving.base import Launch, ServingEngine, Site
from workers.serving.llm import listen_prefix, port_arg, require_module, wait_openai_ready, wrap

#: the pin the GPU image and docs name (docs/llm-engines.md)
VLLM_PIN = "vllm==0.11.0"
INSTALL = f"pip install '{VLLM_PIN}' on the GPU worker (or use its GPU image)"
FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
         "gpu_memory_utilization": "--gpu-memory-utilization"}


def vllm_argv(spec: JobSpec, model: str, site: Site) -> list[str]:
    """vLLM's OpenAI server for ``spec`` serving the folder ``model`` (as the server sees it)."""
    argv = [site.python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--served-model-name", SERVED_MODEL_NAME, "--host", site.host, "--port", port_arg(site)]
    for knob, flag in FLAGS.items():
        if knob in spec.knobs:
            argv += [flag, str(spec.knobs[knob])]
    if "enable_prefix_caching" in spec.knobs:
        argv.append("--enable-prefix-caching" if spec.knobs["enable_prefix_caching"] else "--no-enable-prefix-caching")
    return argv


class Vllm(ServingEngine):
    """vLLM on a GPU job's folder."""

    name = "vllm"
    package = Package("vllm", ("vllm",), extra=None)

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        if not spec.device.startswith("gpu"):
            raise UnsupportedError(f"job {spec.job_id}: the vllm engine runs on GPU workers only; use the "
                                   "transformers engine (or llama.cpp with a GGUF file) on a CPU")
        require_module(spec, site, "vllm", INSTALL)
        model = site.path(model_path)
        return Launch(argv=wrap(site, vllm_argv(spec, model, site)), port=site.port, model=model,
                      mounts=site.mounts(model_path), env={"HF_HUB_OFFLINE": "1"}, listen_prefix=listen_prefix(site),
                      ready=wait_openai_ready)
