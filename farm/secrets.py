"""What a job may see of its worker, and what the database may keep of a worker's secrets.

A job runs code that came from a submitter (a model server loading an uploaded model, an edge command, an
analysis of a model): it gets :func:`clean_env`, an environment built from an allowlist, never the worker's
own variables (``FARM_*`` URLs with their passwords, cloud keys, tokens). Every error and detail a worker
writes to the database passes :func:`scrub` (``farm.lifecycle._settle``), which masks the passwords of the
database and broker URLs and the values of ``FARM_*`` variables that look secret, wherever they appear.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

#: variables a job keeps from the worker's environment, by exact name
ALLOWED = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
    "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "TORCH_NUM_THREADS",
})
#: variables a job keeps by prefix: locale, and the engines' thread and runtime knobs (OpenMP, MKL, ORT, ...)
ALLOWED_PREFIXES = ("LC_", "OMP_", "KMP_", "MKL_", "GOMP_", "ORT_", "OV_", "ONEDNN_", "DNNL_")
#: the home a job sees: the worker's own (dotfiles, cloud credentials) is not its business
JOB_HOME = "/tmp"
#: a ``FARM_*`` variable whose name says it holds a secret: its value is masked wherever it appears
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEY|CREDENTIAL", re.IGNORECASE)
MASK = "***"
_MIN_SECRET = 4  # shorter values are not masked (they would mask ordinary words and digits)


def clean_env(extra: Mapping[str, str] | None = None, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a job's process: the allowlisted variables of ``source`` (this process's
    environment by default), ``HOME`` set to :data:`JOB_HOME`, then ``extra`` (the launch's own settings)."""
    src = os.environ if source is None else source
    env = {k: v for k, v in src.items() if k in ALLOWED or k.startswith(ALLOWED_PREFIXES)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["HOME"] = JOB_HOME
    env.update(extra or {})
    return env


def _url_password(url: str) -> str | None:
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return unquote(password) if password else None


def secret_values(source: Mapping[str, str] | None = None) -> list[str]:
    """The strings :func:`scrub` masks: the password of every ``FARM_*`` URL and the whole value of every
    ``FARM_*`` variable named like a secret (and of URLs with a password), longest first."""
    src = os.environ if source is None else source
    found: set[str] = set()
    for name, value in src.items():
        if not name.startswith("FARM_") or not value:
            continue
        password = _url_password(value) if "://" in value else None
        if password:
            found.update({password, value})
        elif SECRET_NAME.search(name):
            found.add(value)
    return sorted((v for v in found if len(v) >= _MIN_SECRET), key=len, reverse=True)


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s/]+@", re.IGNORECASE)


def scrub_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with every known secret (:func:`secret_values`) and every URL password replaced by ``***``."""
    for value in secret_values() if secrets is None else secrets:
        text = text.replace(value, MASK)
    return _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)


def scrub(value: Any, secrets: Iterable[str] | None = None) -> Any:
    """``value`` (a string, or lists and dicts of them, as a result's details) with secrets masked
    (:func:`scrub_text`); other values as they are."""
    known = list(secret_values() if secrets is None else secrets)
    if isinstance(value, str):
        return scrub_text(value, known)
    if isinstance(value, Mapping):
        return {k: scrub(v, known) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v, known) for v in value]
    return value
