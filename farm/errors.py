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


class AuthError(FarmError):
    """An API call without a valid token (HTTP 401): unknown, revoked or missing."""

    exit_code = 4


class ForbiddenError(FarmError):
    """An API call its identity may not make (HTTP 403): changing another's request, an operator's command."""

    exit_code = 4


class LimitError(RequestError):
    """A submit past a fair-share limit (queued jobs, request size; HTTP 429): wait, or shrink it."""


class TooLargeError(LimitError):
    """An upload past the server's size limit (HTTP 413)."""


class ArtifactError(FarmError):
    """A model artifact is missing from the store or does not match its sha256."""


class StoreUnavailable(ArtifactError):
    """The model store (a folder under FARM_HOME, an S3 bucket, a shared volume) cannot be reached or written:
    a fetch is retried; a submit fails and says which store to start or fix."""


class BlobMissing(ArtifactError):
    """A blob the database names is not in the model store (deleted, or a half-finished upload never published)."""


class DigestMismatch(ArtifactError):
    """Bytes sent to the model store are not the sha256 (or size) they were sent as: the file changed while it
    was stored, or a reference names other bytes; nothing was published."""


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


class EgressError(RequestError):
    """An endpoint the operator's egress policy refuses (``farm.egress``: ``FARM_ENDPOINT_ALLOW``), or one over the
    endpoint caps on rate and requests in flight; refused at submit and again on the worker, before any connection."""


class CredentialError(RequestError):
    """A request names an endpoint credential the operator did not set up (``FARM_ENDPOINT_CREDENTIALS``), or its
    secret cannot be read where the job runs; the message never holds the secret."""
