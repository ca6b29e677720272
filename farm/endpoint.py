"""``farm submit --endpoint HOST:PORT --model-name NAME``: profiling a running KServe v2 gRPC server
(Triton, MLServer, KServe, ``farm serve``) without a model file.

At submission the server's ServerMetadata (name, version) and ModelMetadata (inputs) are read, dynamic
dimensions are filled from ``--input``, and a small JSON descriptor of the endpoint becomes the request's
artifact (format ``endpoint``), so that jobs, results and the artifact store work as for a model file.
The worker reads the descriptor back and drives the endpoint (``workers.serving.endpoint``). Reading the
metadata is the KServe client's (``workers.engines.triton.attach``), which the CLI passes in: the core does
not import workers.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from farm import egress
from farm.errors import FarmError, RequestError
from farm.settings import get_settings
from schemas import ProfileRequest, TensorSpec
from schemas.dtypes import DTYPES

FORMAT = "endpoint"
FILENAME = "endpoint.json"


class ServedModel(Protocol):
    """What ``describe_endpoint`` reads of a served model (``workers.engines.triton.AttachedServer``): the
    server's name and version, the model's platform, and its inputs and outputs (each with ``name``,
    ``datatype`` and ``shape``, the first dimension being the batch)."""

    @property
    def server_name(self) -> str: ...
    @property
    def server_version(self) -> str: ...
    @property
    def platform(self) -> str: ...
    @property
    def inputs(self) -> Sequence[Any]: ...
    @property
    def outputs(self) -> Sequence[Any]: ...


#: attach(endpoint ADDRESS:PORT, model name, timeout s): wait until the server serves the model and read its
#: metadata; a FarmError when it does not. The address is the one the egress policy checked and pinned
#: (``farm.egress.pin``); an HTTP reader takes the name the request gave for its Host header and TLS itself
Attach = Callable[[str, str, float], ServedModel]


def _per_sample(name: str, datatype: str, shape: list[int], given: TensorSpec | None) -> tuple[TensorSpec, int | None]:
    """The TensorSpec of one input from its metadata (first dim = batch) and the user's ``--input``,
    and the batch size the server fixes (None: dynamic)."""
    if given is not None:
        if datatype and given.dtype != datatype:
            raise RequestError(f"--input {name}: the server declares {datatype}, not {given.dtype}")
        meta = shape[1:] if shape else []
        if shape and (len(meta) != len(given.shape) or any(m not in (-1, g) for m, g in zip(meta, given.shape,
                                                                                          strict=True))):
            raise RequestError(f"--input {name}: shape {list(given.shape)} does not fit the server's {shape} "
                               "(its first dimension is the batch; give the rest, -1 = any)")
        return given, (shape[0] if shape and shape[0] > 0 else None)
    if datatype not in DTYPES:
        raise RequestError(f"input {name!r} of the served model is {datatype or 'of unknown datatype'}, which "
                           f"farm cannot generate; it sends {', '.join(DTYPES)}")
    if not shape:
        raise RequestError(f"input {name!r} of the served model has no batch dimension; give its shape with "
                           f"--input {name}:{datatype}:SHAPE")
    per = shape[1:]
    if any(d < 0 for d in per):
        raise RequestError(f"input {name!r} of the served model has dynamic dims {shape}; give them with "
                           f"--input {name}:{datatype}:{'x'.join('N' if d < 0 else str(d) for d in per)}")
    return TensorSpec(name=name, dtype=datatype, shape=tuple(per)), (shape[0] if shape[0] > 0 else None)


def endpoint_inputs(meta_inputs: Sequence[Any], given: list[TensorSpec] | None) -> tuple[list[TensorSpec], int | None]:
    """The request's inputs from the served model's metadata (IOSpec-like: name, datatype, shape) and the
    user's specs; with the batch size the server fixes, if any. RequestError when they do not fit."""
    by_name = {g.name: g for g in given or []}
    if not meta_inputs:
        if not given:
            raise RequestError("the server reports no inputs for the model; give them with --input NAME:DTYPE:SHAPE")
        return list(given), None
    unknown = [n for n in by_name if n not in {m.name for m in meta_inputs}]
    if unknown:
        raise RequestError(f"--input {', '.join(unknown)}: not an input of the served model (its inputs: "
                           f"{', '.join(m.name for m in meta_inputs)})")
    specs, batches = [], set()
    for m in meta_inputs:
        spec, batch = _per_sample(m.name, m.datatype, list(m.shape or []), by_name.get(m.name))
        specs.append(spec)
        batches.add(batch)
    fixed = {b for b in batches if b is not None}
    return specs, (fixed.pop() if len(fixed) == 1 and None not in batches else None)


def describe_endpoint(request: ProfileRequest, attach: Attach, timeout_s: float = 10.0) -> tuple[Path, dict[str, Any]]:
    """Check the endpoint against this host's egress policy and caps (``farm.egress``: EgressError, before any
    connection), read its metadata with ``attach`` at the address checked, and write its descriptor under
    ``<home>/endpoints``; returns the file and the descriptor. RequestError when the server does not answer or does
    not serve the model."""
    assert request.endpoint is not None and request.model_name is not None
    pinned = egress.pin(request.endpoint)  # EgressError before any connection
    egress.check_load(request.concurrency, request.rate_levels())
    try:
        server = attach(pinned.hostport, request.model_name, timeout_s)
    except FarmError as exc:
        raise RequestError(f"endpoint {request.endpoint}: {exc}") from None
    context = getattr(server, "context_tokens", None)
    # an LLM server (measurement.llm) takes text, no tensors
    inputs, batch = ([], None) if request.measurement.llm else endpoint_inputs(server.inputs, request.inputs)
    descriptor = {
        "endpoint": request.endpoint, "model_name": request.model_name,
        "server": {"name": server.server_name, "version": server.server_version},
        "platform": server.platform, "static_batch": batch,
        "inputs": [t.model_dump(mode="json") for t in inputs],
        "outputs": [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape or [])} for o in server.outputs],
        **({"context_tokens": context} if isinstance(context, int) else {}),
    }
    data = json.dumps(descriptor, sort_keys=True, separators=(",", ":")).encode()
    folder = get_settings().home / "endpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}-{FILENAME}"
    path.write_bytes(data)
    return path, descriptor
