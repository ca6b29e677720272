"""farm's one error tree. Each message says what to do next."""
from __future__ import annotations


class FarmError(Exception):
    """Base of every error farm raises on purpose; the CLI prints it as one line and exits non-zero."""

    exit_code = 1


class ConfigError(FarmError):
    """Settings are wrong (bad URL, unreachable database or broker)."""


class RequestError(FarmError):
    """The profiling request is invalid: bad field, missing or corrupt model, matrix too large."""

    exit_code = 2


class ModelError(RequestError):
    """The model file cannot be read, parsed or has inputs farm cannot feed."""


class ArtifactError(FarmError):
    """A model artifact is missing from the store or does not match its sha256."""


class SchedulerError(FarmError):
    """Expansion, enqueueing or reconciliation failed."""


class RunInterrupted(FarmError):
    """An embedded run was stopped by SIGINT or SIGTERM; the exit code is 128 + the signal number (130, 143),
    as shells report it, and the message says how to finish the request (``farm resume``)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class NotFoundError(FarmError):
    """A request, job or worker id does not exist, or a model server was asked for a model it does not serve
    (farm's server answers gRPC NOT_FOUND)."""

    exit_code = 3


class WorkerError(FarmError):
    """A worker could not run a job."""


class ContainerError(WorkerError):
    """A container did not start, did not become ready, or died."""


class ServerError(WorkerError):
    """The model server did not start or did not become ready in time."""


class LeaseError(WorkerError):
    """A thread of the model server may run on cores outside its job's lease, so its figures would count
    cores the job did not lease: farm refuses to measure it."""


class LoadGenError(WorkerError):
    """The load generator could not drive the server (connection refused, all requests failed)."""


class SamplerError(WorkerError):
    """A resource sampler could not read its source (NVML, cgroup, process)."""


class UnsupportedError(WorkerError):
    """This worker cannot run this kind of job (e.g. edge runs without the Docker runner)."""


class SandboxError(ConfigError):
    """Code from a model or request would have to run in a sandbox (farm.sandbox) this host cannot make, or a
    worker refuses to run a request's own command; the message says what the operator can do."""
