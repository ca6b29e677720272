"""What a job may see of its worker, what the database may keep of a worker's secrets, and the endpoint
credentials an operator hands to jobs by name.

A job runs code that came from a submitter (a model server loading an uploaded model, an edge command, an
analysis of a model): it gets :func:`clean_env`, an environment built from an allowlist, never the worker's
own variables (``FARM_*`` URLs with their passwords, cloud keys, tokens). Every error and detail a worker
writes to the database passes :func:`scrub` (``farm.lifecycle._settle``), which masks the passwords of the
database and broker URLs, the values of ``FARM_*`` variables that look secret and every endpoint credential's
value, wherever they appear.

Endpoint credentials (an API key a profiled OpenAI server asks for) are named by the operator, like GitHub
Actions' secrets: ``FARM_ENDPOINT_CREDENTIALS`` maps names to sources (an environment variable or a file of
the worker's, optionally the endpoints each may be sent to); a request names a credential (``--credential
NAME``), never a variable, so a submitter cannot make a worker send an arbitrary secret of its environment.
The value is read on the worker when the job runs (:func:`credential_value`) and never stored, logged or echoed.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from farm.errors import ConfigError, CredentialError
from farm.settings import get_settings

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


#: a credential's name: what a request may say (letters, digits, ``_.-``)
CREDENTIAL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CREDENTIAL_MAX_BYTES = 16 << 10  # a credential file larger than this is not a key
CREDENTIALS_HINT = "the worker's operator names them in FARM_ENDPOINT_CREDENTIALS (docs/security.md)"


@dataclass(frozen=True)
class Credential:
    """One operator-named endpoint credential: where its value comes from (``env``: a variable of the worker's
    environment, ``file``: a file it reads, e.g. a mounted Kubernetes Secret) and the endpoints (``HOST:PORT`` or
    ``HOST``) it may be sent to (empty: any endpoint the egress policy allows)."""

    name: str
    kind: str
    ref: str
    hosts: tuple[str, ...] = ()

    def allows(self, hostport: str) -> bool:
        """Whether this credential may be sent to the endpoint ``hostport`` (``HOST:PORT``)."""
        if not self.hosts:
            return True
        host = hostport.rpartition(":")[0].strip("[]").lower()
        return any(h.lower() in (hostport.lower(), host) for h in self.hosts)

    def read(self) -> str:
        """The secret itself; CredentialError (never holding the value) when it cannot be read."""
        if self.kind == "env":
            value = os.environ.get(self.ref)
            if not value:
                raise CredentialError(f"credential {self.name!r}: its variable {self.ref} is not set on this worker; "
                                      f"{CREDENTIALS_HINT}")
            return value
        try:
            with open(self.ref, "rb") as f:
                data = f.read(CREDENTIAL_MAX_BYTES + 1)
        except (OSError, ValueError) as exc:
            raise CredentialError(f"credential {self.name!r}: its file {self.ref} cannot be read on this worker "
                                  f"({getattr(exc, 'strerror', None) or exc}); {CREDENTIALS_HINT}") from None
        value = data.decode("utf-8", errors="replace").strip()
        if not value or len(data) > CREDENTIAL_MAX_BYTES or "\n" in value or "\r" in value:
            raise CredentialError(f"credential {self.name!r}: its file {self.ref} holds no single-line key; "
                                  f"{CREDENTIALS_HINT}")
        return value


def _one_credential(name: str, source: Any) -> Credential:
    """A credential from its JSON object (``{"env"|"file": ..., "hosts": [...]}``) or text (``env:VAR``)."""
    if not CREDENTIAL_NAME.match(name):
        raise ConfigError(f"FARM_ENDPOINT_CREDENTIALS: {name!r} is not a credential name (letters, digits, _.-)")
    hosts: tuple[str, ...] = ()
    if isinstance(source, dict):
        hosts = tuple(str(h) for h in source.get("hosts") or ())
        kinds = [k for k in ("env", "file") if k in source]
        source = f"{kinds[0]}:{source[kinds[0]]}" if len(kinds) == 1 else ""
    kind, _, ref = str(source).partition(":")
    if kind not in ("env", "file") or not ref.strip() or "\x00" in ref:
        raise ConfigError(f"FARM_ENDPOINT_CREDENTIALS: credential {name!r} needs env:VARIABLE or file:PATH")
    return Credential(name, kind, ref.strip(), hosts)


def credentials(text: str | None = None) -> dict[str, Credential]:
    """The operator's credentials by name (``FARM_ENDPOINT_CREDENTIALS``: ``NAME=env:VAR,NAME2=file:PATH`` or a JSON
    object); ConfigError (one line) when the setting cannot be read."""
    raw = (get_settings().endpoint_credentials if text is None else text) or ""
    if not raw.strip():
        return {}
    if raw.lstrip().startswith("{"):
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"FARM_ENDPOINT_CREDENTIALS is not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ConfigError("FARM_ENDPOINT_CREDENTIALS must be a JSON object of name -> source")
        items = list(obj.items())
    else:
        items = []
        for part in filter(None, (p.strip() for p in re.split(r"[,\n]", raw))):
            name, sep, source = part.partition("=")
            if not sep:
                raise ConfigError(f"FARM_ENDPOINT_CREDENTIALS: {part!r} is not NAME=env:VAR or NAME=file:PATH")
            items.append((name.strip(), source.strip()))
    return {name: _one_credential(name, source) for name, source in items}


def credential_value(name: str, hostport: str) -> str:
    """The value of credential ``name`` for the endpoint ``hostport``, read on this worker now; CredentialError
    (one line, never the value) when it is unknown here, may not go to that endpoint, or cannot be read."""
    known = credentials()
    cred = known.get(name)
    if cred is None:
        have = ", ".join(sorted(known)) or "none"
        raise CredentialError(f"credential {name!r} is not set up on this worker (it has: {have}); {CREDENTIALS_HINT}")
    if not cred.allows(hostport):
        raise CredentialError(f"credential {name!r} may not be sent to {hostport} (only to {', '.join(cred.hosts)}); "
                              f"{CREDENTIALS_HINT}")
    return cred.read()


def credential_secrets() -> list[str]:
    """Every credential value readable here (what :func:`scrub` masks); unreadable ones are left out."""
    out = []
    try:
        known = credentials()
    except ConfigError:
        return []
    for cred in known.values():
        try:
            out.append(cred.read())
        except CredentialError:
            continue
    return out


def secret_values(source: Mapping[str, str] | None = None) -> list[str]:
    """The strings :func:`scrub` masks: the password of every ``FARM_*`` URL, the whole value of every
    ``FARM_*`` variable named like a secret (and of URLs with a password) and, for this process's own environment,
    every endpoint credential's value; longest first."""
    src = os.environ if source is None else source
    found: set[str] = set(credential_secrets()) if source is None else set()
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
