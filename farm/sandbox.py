"""Where code from a model file may run: only in a jail (see SECURITY.md).

A TorchScript file is a program: its ``forward`` and ``__setstate__`` run when it is loaded or called, and
can create and write files (``torch.from_file(path, True, n)``), open sockets, read the environment. farm
loads such a model (``CODE_FORMATS``) only inside a bubblewrap jail (:func:`jail_argv`): new user, mount, pid,
ipc, uts and network namespaces; an empty root with the system and Python read-only, the model file
read-only, a private tmpfs ``/tmp``; no capabilities; the environment rebuilt from an allowlist
(``farm.secrets.clean_env``); dies with its parent. A served model keeps the host's network (the load client
must reach its port) but nothing else. Where bubblewrap is missing or cannot create namespaces, such a model
is refused with one line saying what to do, unless the operator trusts the host's models
(``FARM_TRUSTED_MODELS=1``). Containers (the Docker runner) are the other sandbox: ``workers.runners``.

We call bubblewrap ourselves rather than a library: there is no maintained Python binding, and its command
line is the documented interface.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from farm import errors
from farm.errors import ModelError, SandboxError
from farm.secrets import JOB_HOME, clean_env
from farm.settings import get_settings

#: model formats whose loading runs code from the file (custom classes, ``__setstate__``, scripted calls)
CODE_FORMATS = frozenset({"torchscript"})
#: the uid and gid a jailed process runs as (nobody), like farm's containers
JAIL_UID = 65534
#: host paths a jailed Python needs, read-only (those that exist)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/alternatives",
                "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd",
                "/etc/group", "/etc/nsswitch.conf", "/etc/hosts")
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap)"
#: where farm's packages (farm, schemas, workers) are imported from: the jail sees it read-only
SOURCE_ROOT = Path(__file__).resolve().parents[1]
#: the longest a jailed parse, dry run or analysis of one model may take, s
PROBE_TIMEOUT_S = 600.0
#: the errors a jailed probe may report back by name (anything else becomes a ModelError)
PROBE_ERRORS = ("ModelError", "RequestError")


def runs_code(model_format: str) -> bool:
    """Whether loading a model of ``model_format`` runs code from the file (so it needs the sandbox)."""
    return model_format in CODE_FORMATS


@functools.lru_cache(maxsize=1)
def jail_unavailable() -> str | None:
    """Why this host cannot jail a process (None: it can): bubblewrap missing, or it cannot create the
    namespaces (a container without user namespaces, a kernel that forbids them)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    probe = jail_argv(["/bin/true"], network=False)
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, env=clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start ({exc})"
    if done.returncode != 0:
        why = " ".join(done.stderr.split())[:200] or f"exit {done.returncode}"
        return (f"bubblewrap cannot create its namespaces here ({why}); allow unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1), or run the worker with the Docker runner")
    return None


def _python_paths() -> list[str]:
    """Directories a jailed ``python -m farm...`` / ``workers...`` needs: the interpreter's prefixes, the
    site-packages directories, farm's own source tree and ``PYTHONPATH``; never the current directory or
    the home directory as such (a user's files are not the jail's business)."""
    out = [sys.prefix, sys.base_prefix, sys.exec_prefix, str(SOURCE_ROOT), *site.getsitepackages(),
           site.getusersitepackages()]
    out += [p for p in sys.path if "site-packages" in p or "dist-packages" in p]
    out += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    home = str(Path.home())
    return [p for p in dict.fromkeys(out) if p not in ("/", home) and Path(p).is_dir()]


def _binds(paths: Iterable[str], flag: str) -> list[str]:
    out: list[str] = []
    for p in paths:
        out += [flag, p, p]
    return out


def _library_dirs(ld_library_path: str) -> list[str]:
    """The absolute, existing directories of an ``LD_LIBRARY_PATH`` value."""
    return [str(Path(p).resolve()) for p in ld_library_path.split(os.pathsep) if os.path.isabs(p) and Path(p).is_dir()]


def jail_argv(argv: Sequence[str], *, network: bool, read_only: Iterable[Path | str] = (),
              env: dict[str, str] | None = None, writable: Iterable[Path | str] = (),
              cwd: str | None = None) -> list[str]:
    """``argv`` run by bubblewrap in a jail (see the module docstring); ``network``: keep the host's network
    (a server whose port the load client drives), else none at all; ``read_only``: further host paths the
    process may read (the model file), seen at the same paths; ``env``: its whole environment (default
    ``clean_env()``), with ``HOME`` at the jail's private ``/tmp``; ``writable``: the job's own scratch
    directories it writes its output to (the only host paths it may write), seen at the same paths; ``cwd``: the
    directory it starts in (one of ``read_only``; default the private ``/tmp``)."""
    environment = dict(clean_env() if env is None else env)
    environment["HOME"] = JOB_HOME
    # the jailed python imports farm's own code from where this process does (an editable install's finder may
    # point elsewhere, outside the jail)
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
        [str(SOURCE_ROOT), *(p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p)]))
    args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            *([] if network else ["--unshare-net"]), "--uid", str(JAIL_UID), "--gid", str(JAIL_UID),
            "--die-with-parent", "--cap-drop", "ALL", "--clearenv"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # before the binds: a model may be in /tmp
    args += _binds(SYSTEM_PATHS, "--ro-bind-try")
    args += _binds(_python_paths(), "--ro-bind-try")
    # the operator's library directories (a GPU node's driver libraries are often there, e.g. libnvidia-ml in
    # /usr/local/nvidia/lib64): LD_LIBRARY_PATH comes from the worker's allowlisted environment, not from a request
    args += _binds(_library_dirs(environment.get("LD_LIBRARY_PATH", "")), "--ro-bind-try")
    args += _binds((str(Path(p).resolve()) for p in read_only), "--ro-bind")
    args += _binds((str(Path(p).resolve()) for p in writable), "--bind")
    args += ["--chdir", str(Path(cwd).resolve()) if cwd else "/tmp"]
    gpus = sorted(glob.glob("/dev/nvidia*"))
    if gpus:  # a GPU host: its devices, and /sys read-only for the CUDA driver's PCI lookups (not run on a GPU yet)
        args += _binds(gpus, "--dev-bind-try") + ["--ro-bind-try", "/sys", "/sys"]
    for key, value in sorted(environment.items()):
        args += ["--setenv", key, value]
    return [*args, "--", *argv]


def model_jail(model_format: str, what: str) -> bool:
    """Whether code from a ``model_format`` model named ``what`` must run jailed here (False: the format runs
    no code, or the operator trusts this host's models); SandboxError when it must but cannot."""
    return runs_code(model_format) and code_jail(f"{what} ({model_format})")


def code_jail(what: str) -> bool:
    """Whether ``what``, a model whose loading runs code from the file, must run jailed here (False: the
    operator trusts this host's models, ``FARM_TRUSTED_MODELS``); SandboxError when it must but cannot."""
    if get_settings().trusted_models:
        return False
    why = jail_unavailable()
    if why is not None:
        raise SandboxError(
            f"{what} runs code from its file when loaded, and farm loads such models only in a sandbox, which "
            f"this host lacks: {why}; or set FARM_TRUSTED_MODELS=1 if you trust every model this host loads "
            "(see docs/security.md)")
    return True


def run_jailed(module: str, args: Sequence[str], *, read_only: Iterable[Path | str], what: str,
               timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run ``python -m module *args`` in a jail without network and return the JSON object on its last
    stdout line; a reported ``{"error": ..., "kind": ...}`` is raised here as that error (ModelError by
    default); ModelError naming ``what`` when it crashes, prints nothing or runs past ``timeout_s``."""
    argv = jail_argv([sys.executable, "-m", module, *args], network=False, read_only=read_only)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
                              env=clean_env(), start_new_session=True)  # no controlling terminal in the jail
    except subprocess.TimeoutExpired:
        raise ModelError(f"{what} did not finish within {timeout_s:g} s in the sandbox") from None
    lines = done.stdout.strip().splitlines()
    try:
        out = json.loads(lines[-1]) if lines else None
    except ValueError:
        out = None
    if not isinstance(out, dict):
        tail = " ".join(done.stderr.split())[-300:] or "no output"
        raise ModelError(f"{what} failed in the sandbox (exit {done.returncode}): {tail}")
    if "error" in out:
        kind = out.get("kind") if out.get("kind") in PROBE_ERRORS else "ModelError"
        raise getattr(errors, str(kind))(str(out["error"]))
    return out
