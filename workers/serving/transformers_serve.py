"""The ``transformers`` engine: a Hugging Face model folder served over the OpenAI API by ``transformers serve``
(``pip install 'farm[llm]'``), offline (``HF_HUB_OFFLINE``: nothing is fetched from a hub) and, for a CPU job,
on the CPU only. The server is pinned to its model and answers only requests naming it exactly as it was
started, so it is started as ``transformers serve model`` in a directory where ``model`` is the job's folder:
requests name ``schemas.engines.SERVED_MODEL_NAME`` like every other engine's. torch's threads follow the
job's core lease (``OMP_NUM_THREADS``) unless the ``n_threads`` knob sets them; the other knobs
(its card's, ``schemas.engines.CARDS["transformers"].knobs``) map to its flags."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from farm.settings import get_settings
from schemas import JobSpec
from schemas.engines import CARDS, SERVED_MODEL_NAME
from workers.engines.base import Package
from workers.serving.base import Launch, ServingEngine, Site
from workers.serving.llm import LLM_DISTRIBUTIONS, listen_prefix, port_arg, require_module, wait_openai_ready, wrap

INSTALL = "pip install 'farm[llm]'"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"}


def link_dir(model_path: Path) -> Path:
    """The directory a local server starts in: it holds ``model``, a link to the job's folder."""
    key = hashlib.sha256(str(model_path.resolve()).encode()).hexdigest()[:16]
    return get_settings().home / "llm-serve" / key


def make_link(model_path: Path) -> Path:
    """Write :func:`link_dir` (idempotent); returns it."""
    where = link_dir(model_path)
    where.mkdir(parents=True, exist_ok=True)
    link = where / SERVED_MODEL_NAME
    target = model_path.resolve()
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return where
    tmp = where / f".{SERVED_MODEL_NAME}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)
    return where


def knob_args(spec: JobSpec) -> list[str]:
    """The server's flags for the job's knobs (n_threads is an environment variable instead)."""
    k = spec.knobs
    out: list[str] = []
    if "dtype" in k:
        out += ["--dtype", str(k["dtype"])]
    if "attn_implementation" in k:
        out += ["--attn-implementation", str(k["attn_implementation"])]
    if k.get("continuous_batching") or "max_batch_tokens" in k:
        out.append("--continuous-batching")
    if "max_batch_tokens" in k:
        out += ["--cb-max-batch-tokens", str(k["max_batch_tokens"])]
    return out


class TransformersServe(ServingEngine):
    """``transformers serve`` pinned to the job's Hugging Face folder."""

    name = "transformers"
    package = Package("transformers", LLM_DISTRIBUTIONS, extra=CARDS[name].extra)

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        require_module(spec, site, "transformers", INSTALL)
        gpu = spec.device.startswith("gpu")
        env = {**OFFLINE, **({} if gpu else {"CUDA_VISIBLE_DEVICES": ""})}
        threads = spec.knobs.get("n_threads")
        if threads is not None:
            env.update({name: str(threads) for name in THREAD_VARIABLES})
        argv = [site.python, "-m", "transformers.cli.transformers", "serve", SERVED_MODEL_NAME,
                "--host", site.host, "--port", port_arg(site), "--device", "cuda" if gpu else "cpu",
                "--log-level", "info", *knob_args(spec)]
        wrapped = wrap(site, argv, env_threads=THREAD_VARIABLES if threads is None else ())
        if site.container:
            inside = f"{site.model_dir}/{SERVED_MODEL_NAME}"
            return Launch(argv=wrapped, port=site.port, model=inside, mounts={str(model_path.resolve()): inside},
                          env={**env, "HF_HOME": "/tmp/hf"}, cwd=site.model_dir, listen_prefix=listen_prefix(site),
                          ready=wait_openai_ready)
        return Launch(argv=wrapped, port=site.port, model=str(model_path), env=env, cwd=str(link_dir(model_path)),
                      listen_prefix=listen_prefix(site), prepare=lambda: make_link(model_path),
                      ready=wait_openai_ready)
