"""Start an LLM server with what only its own process knows: ``python -m workers.serving.lease_exec [--env NAME]...
[--env-cpus NAME]... [--bind HOST] -- ARGV...`` replaces ``{cores}`` in ARGV by the number of cores this process may
run on (its CPU affinity: the job's lease, set by the runner before exec, or a container's cpuset), sets each
``--env`` variable to it and each ``--env-cpus`` variable to those cores as a CPU list (``0-1,4``: vLLM CPU's
``VLLM_CPU_OMP_THREADS_BIND``), replaces ``{port}`` by a free port on HOST and prints ``farm-llm listening
HOST:PORT``, then execs ARGV (same pid, so the runner's process, cgroup and thread checks see the server itself). With
``--cuda-index`` it first rewrites GPU UUIDs in ``CUDA_VISIBLE_DEVICES`` (how farm's process runner binds a
job's GPU) to their NVML indices, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA numbers GPUs as NVML
does: vLLM reads that variable as integers (``int(...)`` in its platform code, vllm-project/vllm#13815).

Why a wrapper: an engine's launch is declared before its runner places it, so it cannot know the leased core
count, and the LLM servers (uvicorn) print no bound port when given port 0. The free port is found by binding
port 0 and closing it: another process could take it before the server binds; the server then fails to start
and the job fails with its log (rare on a worker, where farm starts the servers)."""
from __future__ import annotations

import argparse
import os
import socket
import sys

from schemas.cpus import cpu_list

CORES = "{cores}"
PORT = "{port}"
#: the line printed once the port is chosen (the runner reads it: ``Launch.listen_prefix``)
LISTEN_LINE = "farm-llm listening "


def leased_cores() -> int:
    """How many cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def leased_cpu_list() -> str:
    """The cores this process may run on, as the kernel writes a CPU list (``0-3,6``)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    return cpu_list(cores)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cuda_indices(visible: str) -> str:
    """``visible`` (a ``CUDA_VISIBLE_DEVICES`` value) with each ``GPU-...`` UUID replaced by its NVML index;
    indices and MIG names are kept as they are. Raises SystemExit with the reason when NVML cannot find one."""
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not any(v.startswith("GPU-") for v in ids):
        return visible
    import pynvml  # noqa: PLC0415 - only a GPU job's server needs NVML, and only here

    pynvml.nvmlInit()
    try:
        return ",".join(str(pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(v)))
                        if v.startswith("GPU-") else v for v in ids)
    except pynvml.NVMLError as exc:
        raise SystemExit(f"lease_exec: NVML cannot find the job's GPU {visible} ({exc}); check nvidia-smi -L") from exc
    finally:
        pynvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.serving.lease_exec")
    p.add_argument("--env", action="append", default=[], help="variable set to the leased core count")
    p.add_argument("--env-cpus", action="append", default=[], help="variable set to the leased cores' CPU list")
    p.add_argument("--bind", default="127.0.0.1", help="the host a {port} is found on")
    p.add_argument("--cuda-index", action="store_true",
                   help="rewrite GPU UUIDs in CUDA_VISIBLE_DEVICES to NVML indices (PCI bus order)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the server's command after --")
    if args.cuda_index and os.environ.get("CUDA_VISIBLE_DEVICES"):
        os.environ["CUDA_VISIBLE_DEVICES"] = cuda_indices(os.environ["CUDA_VISIBLE_DEVICES"])
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    cores = str(leased_cores())
    for name in args.env:
        os.environ[name] = cores
    for name in args.env_cpus:
        os.environ[name] = leased_cpu_list()
    if any(PORT in a for a in command):
        port = str(free_port(args.bind))
        command = [a.replace(PORT, port) for a in command]
        print(f"{LISTEN_LINE}{args.bind}:{port}", flush=True)
    command = [a.replace(CORES, cores) for a in command]
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 127  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main())
