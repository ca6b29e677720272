"""How a runner without containers confines a launched server: the one place every ``Launch`` passes through
(``workers.runners.process``, and LLM edge runs), so an engine's server is jailed by construction, not by a flag
each engine must remember.

``Launch.sandbox`` says how (``workers.serving.base``):

- ``"server"`` (the default, every LLM engine's): the bubblewrap jail (``farm.sandbox``: own user, pid, ipc and
  mount namespaces, no capabilities, the model and the server's start directory read-only, the clean environment)
  with a network namespace of its own that has only loopback: the server reaches nothing, and is reached only
  through a listening socket the runner makes on the host's loopback and passes in, where farm's relay
  (``workers.serving.relay``) copies each connection to it;
- ``"host-network"``: the jail keeping the host's network (farm's own KServe server on a model that runs code:
  no relay inside its sub-millisecond latencies);
- ``"none"``: farm's own server on a format that runs no code.

Where the operator trusts this host's models (``FARM_TRUSTED_MODELS=1``) nothing is jailed; where a jail is needed
and cannot be made, the job is refused with one line (``farm.sandbox.code_jail``). A Hugging Face folder with
pickle weights (``pytorch_model.bin``: loading it unpickles) is served only in the jail (or a container).
"""
from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from farm.errors import SandboxError
from farm.models.llm_info import pickle_weights
from farm.sandbox import code_jail, jail_argv
from workers.serving.base import Launch

RELAY = "workers.serving.relay"


@dataclass
class Confined:
    """A launch as the runner starts it: its command line, the descriptors it inherits, and notes for the result."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)
    jailed: bool = False
    port: int | None = None  # where the runner reaches the server (the relay's host port), None: the launch's


def _executables(argv: list[str]) -> list[Path]:
    """The directories of the launch's programs given by absolute path (llama-server in a folder of its own):
    the jail sees them read-only."""
    out = []
    for a in argv:
        p = Path(a)
        if p.is_absolute() and p.is_file() and os.access(p, os.X_OK):
            out.append(p.resolve().parent)
    return out


def _read_only(launch: Launch) -> list[Path]:
    paths = [Path(launch.model), *(Path(p) for p in launch.mounts), *_executables(launch.argv),
             *(Path(p) for p in launch.read_only)]
    if launch.cwd:
        paths.append(Path(launch.cwd))
    return [p for p in dict.fromkeys(paths) if str(p) and p.exists()]


def refuse_pickle(launch: Launch, jailed: bool) -> None:
    """SandboxError when the launch serves a model folder holding pickle weights outside a jail."""
    folder = Path(launch.model)
    if jailed or not folder.is_dir():
        return
    pickled = pickle_weights(folder)
    if pickled:
        raise SandboxError(f"the model folder holds pickle weights ({', '.join(pickled[:3])}), which run code when "
                           "loaded; farm serves them only in its sandbox, which is off on this worker "
                           "(FARM_TRUSTED_MODELS): re-save the model as safetensors "
                           "(save_pretrained(safe_serialization=True)), or use the Docker runner")


@contextmanager
def confined(launch: Launch, env: dict[str, str]) -> Iterator[Confined]:
    """``launch`` as it must start on a local process site (see the module docstring), with the environment ``env``;
    the host's listening socket of a jailed server lives until the block ends. SandboxError when it must be jailed
    and this host cannot (or serves pickle weights unjailed)."""
    name = Path(launch.model).name or "the server"
    jailed = launch.sandbox != "none" and code_jail(f"the model {name} (served by a launched server)")
    refuse_pickle(launch, jailed)
    if not jailed:
        yield Confined(list(launch.argv))
        return
    cwd = launch.cwd or None
    if launch.sandbox == "host-network":
        yield Confined(jail_argv(launch.argv, network=True, read_only=_read_only(launch), env=env, cwd=cwd),
                       jailed=True)
        return
    with socket.create_server(("127.0.0.1", 0)) as listener:
        where = ["--prefix", launch.listen_prefix] if launch.listen_prefix else ["--port", str(launch.port)]
        inner = [sys.executable, "-m", RELAY, "--listen-fd", str(listener.fileno()), *where, "--", *launch.argv]
        argv = jail_argv(inner, network=False, read_only=_read_only(launch), env=env, cwd=cwd)
        yield Confined(argv, (listener.fileno(),), jailed=True, port=int(listener.getsockname()[1]), notes=[
            "served in farm's jail with a network of its own: the client reached it through farm's relay"])
