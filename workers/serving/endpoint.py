"""The ``endpoint`` engine: drive a running KServe v2 gRPC server (or, with ``measurement.llm``, an OpenAI server)
that farm did not start, named by the job's descriptor artifact (``farm.endpoint``). Nothing is started or
stopped; the server's resources are not sampled (it may be on another host), and the result names the server
from its ServerMetadata.

Before any connection the worker checks the endpoint against its own egress policy and caps (``farm.egress``:
the name resolved once, the job pinned to the address checked) and, for a named credential, reads its value from
the operator's source (``farm.secrets``); a refusal fails the job with one line."""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from farm import egress
from farm.endpoint import ServedModel
from farm.errors import ServerError, UnsupportedError
from farm.secrets import credential_value
from farm.settings import get_settings
from schemas import JobSpec
from schemas.engines import ENDPOINT_ENGINE
from workers.engines.triton import attach
from workers.serving.base import Launch, ServingEngine, ServingTarget, Site
from workers.serving.openai_api import attach_openai


@contextmanager
def endpoint_target(spec: JobSpec, descriptor_path: Path) -> Iterator[ServingTarget]:
    """The endpoint of ``descriptor_path``, once it serves the model; ServerError when it does not."""
    try:
        desc = json.loads(descriptor_path.read_text())
        url, model_name = str(desc["endpoint"]), str(desc["model_name"])
    except (OSError, ValueError, KeyError) as exc:
        raise ServerError(f"job {spec.job_id}: the endpoint descriptor is unreadable ({exc}); submit again") from None
    pinned = egress.pin(url)  # EgressError before any connection
    egress.check_load([spec.concurrency], [spec.rate])
    llm = spec.measurement.llm
    timeout_s = get_settings().server_ready_timeout_s
    if llm is not None:
        key = credential_value(llm.credential, pinned.authority) if llm.credential else None
        server: ServedModel = attach_openai(pinned.hostport, model_name, timeout_s, llm, pinned.authority, key)
    else:
        server = attach(pinned.hostport, model_name, timeout_s)
    facts = {"name": server.server_name, "version": server.server_version, "url": url, "model_name": model_name,
             "platform": server.platform, "address": pinned.address}
    who = f"{server.server_name} {server.server_version}".rstrip()
    notes = [f"profiled the running {who} at {url} (model {model_name}); its resources are not sampled"]
    was = desc.get("server") or {}
    if (was.get("name"), was.get("version")) != (server.server_name, server.server_version):
        notes.append(f"the endpoint was {was.get('name')} {was.get('version')} at submission")
    yield ServingTarget(host=pinned.address, port=pinned.port, model_name=model_name, notes=notes, server=facts,
                        authority=pinned.authority, in_flight_cap=get_settings().endpoint_max_in_flight)


class Endpoint(ServingEngine):
    """Always attached: the job's "model" is the endpoint's descriptor."""

    name = ENDPOINT_ENGINE

    def attach(self, spec: JobSpec, model_path: Path) -> AbstractContextManager[ServingTarget] | None:
        return endpoint_target(spec, model_path)

    def launch(self, spec: JobSpec, model_path: Path, site: Site) -> Launch:
        raise UnsupportedError(f"job {spec.job_id}: an endpoint is driven where it runs; farm starts no server for it")
