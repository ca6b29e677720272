"""Op profiles in the database (``--op-profile``): written with the job's result, read by ``farm ops``, ``farm
report`` and ``farm compare --ops``.

A worker hands the profile over inside its result's ``details`` (``attach``): the profile under
:data:`DETAIL_KEY` and its raw trace (gzip, base64) under :data:`TRACE_KEY`, so that it travels the result's
retry and spool path. ``lifecycle.finish`` takes both out (:func:`split`) and writes them (:func:`store`) in the
same transaction as the result row: tables ``op_profiles`` (one row per job, with the trace) and ``op_nodes``
(one row per node); the results row keeps a short summary under ``details.op_profile``.
"""
from __future__ import annotations

import base64
import gzip
from dataclasses import dataclass
from typing import Any, TypedDict

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.orm import Session

from farm.db.models import Job, OpNodeRow, OpProfileRow, Result, utcnow
from farm.errors import RequestError
from schemas.op_profile import (
    OVERHEAD,
    Achieved,
    LayerCost,
    LayerRow,
    OpDelta,
    OpNode,
    OpProfile,
    OpSummary,
    OpTypeRow,
    PeakFields,
)

DETAIL_KEY = "op_profile"
TRACE_KEY = "op_profile_trace_gz_b64"
#: profile fields kept in the result's ``details`` summary (the device's peak, where the pass ran), not in
#: ``op_profiles``' columns
SUMMARY_FIELDS = ("peak_gflops", "peak_source", "site")
Bind = Connection | Session


def attach(details: dict[str, Any], prof: OpProfile, trace_gz: bytes | None) -> None:
    """Put ``prof`` (and its compressed trace) into a result's ``details`` for :func:`split` to take out."""
    details[DETAIL_KEY] = prof.model_dump()
    if trace_gz is not None:
        details[TRACE_KEY] = base64.b64encode(trace_gz).decode()


def summary(prof: OpProfile) -> OpSummary:
    """What the results row keeps of a profile (the rest lives in ``op_profiles`` / ``op_nodes``)."""
    return OpSummary(status=prof.status, reason=prof.reason, nodes=len(prof.nodes), node_sum_ms=prof.node_sum_ms,
                     compute_ms=prof.compute_ms, peak_gflops=prof.peak_gflops, peak_source=prof.peak_source,
                     site=prof.site)


def split(details: dict[str, Any]) -> tuple[dict[str, Any], OpProfile | None, bytes | None]:
    """``details`` without the profile and trace (a summary left in their place), the profile, the trace."""
    raw = details.get(DETAIL_KEY)
    if not isinstance(raw, dict) or "engine" not in raw:
        return details, None, None
    prof = OpProfile.model_validate(raw)
    packed = details.get(TRACE_KEY)
    rest = {k: v for k, v in details.items() if k not in (DETAIL_KEY, TRACE_KEY)}
    rest[DETAIL_KEY] = summary(prof)
    return rest, prof, base64.b64decode(packed) if isinstance(packed, str) else None


def store(bind: Bind, job_id: str, prof: OpProfile, trace_gz: bytes | None) -> None:
    """Write ``prof`` as the op profile of ``job_id`` (replacing an earlier one of a re-run)."""
    bind.execute(delete(OpNodeRow).where(OpNodeRow.job_id == job_id))
    bind.execute(delete(OpProfileRow).where(OpProfileRow.job_id == job_id))
    head = prof.model_dump(exclude={"nodes", *SUMMARY_FIELDS})
    bind.execute(insert(OpProfileRow).values(job_id=job_id, trace_gz=trace_gz, created_at=utcnow(), **head))
    if prof.nodes:
        bind.execute(insert(OpNodeRow), [{"job_id": job_id, "rank": i, **n.model_dump()}
                                         for i, n in enumerate(prof.nodes)])


class StoredJob(TypedDict):
    """The coordinates of a profiled job (``op_profile.load``), its status, its server compute p50 (ms) and its
    model (from its spec; None: an older job without the key)."""

    request_id: str
    engine: str
    device: str
    batch_size: int
    concurrency: int
    edge_profile: str | None
    status: str
    server_compute_p50_ms: float | None
    model_sha256: str | None
    model_filename: str | None
    model_format: str | None
    inputs: list[Any] | None


@dataclass
class Stored:
    """A job's stored profile, with the job's coordinates and whether its raw trace was kept."""

    job_id: str
    profile: OpProfile
    has_trace: bool
    job: StoredJob


def resolve_job(session: Session, job_id: str) -> str:
    """The full id of the job ``job_id`` names (a unique prefix of at least 6 characters is enough)."""
    jid = job_id.strip().lower()
    if len(jid) < 6 or not all(c in "0123456789abcdef" for c in jid):
        raise RequestError(f"{job_id!r} is not a job id; give the id `farm results` shows (6+ hex characters)")
    ids = list(session.execute(select(Job.id).where(Job.id.startswith(jid)).limit(2)).scalars())
    if not ids:
        raise RequestError(f"no job {job_id}; `farm results REQUEST_ID` lists the jobs of a request")
    if len(ids) > 1:
        raise RequestError(f"job id {job_id} is ambiguous; give more of its characters")
    return str(ids[0])


def load(session: Session, job_id: str) -> Stored:
    """The op profile of ``job_id`` (a prefix will do); RequestError when the job has none (with what to do)."""
    jid = resolve_job(session, job_id)
    row = session.get(OpProfileRow, jid)
    job = session.get(Job, jid)
    assert job is not None
    coords = StoredJob(request_id=job.request_id, engine=job.engine, device=job.device, batch_size=job.batch_size,
                       concurrency=job.concurrency, edge_profile=job.edge_profile, status=job.status,
                       server_compute_p50_ms=session.execute(
                           select(Result.server_compute_p50_ms)  # type: ignore[attr-defined]
                           .where(Result.job_id == jid)).scalar(),
                       model_sha256=job.spec.get("model_sha256"), model_filename=job.spec.get("model_filename"),
                       model_format=job.spec.get("model_format"), inputs=job.spec.get("inputs"))
    if row is None:
        raise RequestError(f"job {jid} has no op profile (status {job.status}); submit with --op-profile to take "
                           "one")
    nodes = session.execute(select(OpNodeRow).where(OpNodeRow.job_id == jid).order_by(OpNodeRow.rank)).scalars()
    prof = OpProfile(engine=row.engine, status=row.status, reason=row.reason,  # type: ignore[arg-type]
                     batch_size=row.batch_size, threads=row.threads, warmup=row.warmup, iterations=row.iterations,
                     events=row.events, capped=row.capped, node_sum_ms=row.node_sum_ms, compute_ms=row.compute_ms,
                     profiled_ms=row.profiled_ms, overhead_ms=row.overhead_ms, trace_format=row.trace_format,
                     cpus=row.cpus, **_peak(session, jid),
                     nodes=[OpNode(name=n.name, op_type=n.op_type, exec_type=n.exec_type, provider=n.provider,
                                   calls=n.calls, self_ms_p50=n.self_ms_p50, self_ms_p90=n.self_ms_p90, share=n.share,
                                   input_shapes=n.input_shapes, fused=list(n.fused or []),
                                   status=n.status)  # type: ignore[arg-type]
                            for n in nodes])
    return Stored(jid, prof, row.trace_gz is not None, coords)


def _peak(session: Session, jid: str) -> PeakFields:
    """The fields the job's result keeps in ``details.op_profile`` (none: an older result)."""
    details = session.execute(select(Result.details).where(Result.job_id == jid)).scalar()
    kept = (details or {}).get(DETAIL_KEY) if isinstance(details, dict) else None
    if not isinstance(kept, dict):
        return PeakFields()
    return PeakFields(peak_gflops=kept.get("peak_gflops"), peak_source=kept.get("peak_source"), site=kept.get("site"))


def trace(session: Session, job_id: str) -> bytes:
    """The raw trace of ``job_id``'s profile (Chrome trace JSON, opens in Perfetto); RequestError when none."""
    jid = resolve_job(session, job_id)
    packed = session.execute(select(OpProfileRow.trace_gz).where(OpProfileRow.job_id == jid)).scalar()
    if packed is None:
        raise RequestError(f"job {jid} has no raw trace kept (no op profile, an engine without one, or a trace "
                           "over the size bound: `farm ops` says which)")
    return gzip.decompress(packed)


def by_op_type(prof: OpProfile) -> list[OpTypeRow]:
    """Per op type: nodes, calls and self time per inference (sum of the nodes' medians, ms), share; the most
    time first, zero-time op types last; the overhead row (compute - node sum) at the end, never spread."""
    groups: dict[str, list[OpNode]] = {}
    for n in prof.nodes:
        groups.setdefault(n.op_type, []).append(n)
    rows = sorted((OpTypeRow(op_type=op, nodes=len(ns), calls=sum((n.calls for n in ns), 0.0),
                             self_ms=sum((n.self_ms_p50 for n in ns), 0.0), share=sum((n.share for n in ns), 0.0))
                   for op, ns in groups.items()), key=lambda g: (g["self_ms"] <= 0, -g["self_ms"], g["op_type"]))
    if prof.overhead_ms is not None:
        rows.append(OpTypeRow(op_type=OVERHEAD, nodes=0, calls=1.0, self_ms=prof.overhead_ms, share=None))
    return rows


def compare_ops(a: OpProfile, b: OpProfile) -> list[OpDelta]:
    """Op types of two profiles side by side: self time per inference in each (ms), B / A and B - A; the
    largest absolute change first (op types in one profile only have None on the other side)."""
    ta = {r["op_type"]: r["self_ms"] for r in by_op_type(a)}
    tb = {r["op_type"]: r["self_ms"] for r in by_op_type(b)}
    rows: list[OpDelta] = []
    for op in dict.fromkeys([*ta, *tb]):
        ma, mb = ta.get(op), tb.get(op)
        ratio = mb / ma if ma and mb is not None and ma > 0 else None
        delta = (mb or 0.0) - (ma or 0.0)
        rows.append(OpDelta(op_type=op, a_ms=ma, b_ms=mb, ratio=ratio, delta_ms=delta))
    rows.sort(key=lambda r: -abs(r["delta_ms"]))
    return rows


def join_layers(layers: list[LayerCost], prof: OpProfile) -> list[LayerRow]:
    """The static per-node costs (``farm.models.onnx_counter.node_costs``, ``farm.models.torch_layers``) joined
    with a profile by node name: each profiled node takes the costs of itself and of the graph nodes fused into
    it, and gets its achieved GFLOP/s and bytes/s (parameters + outputs over its median self time). A static node
    that ``covers_subtree`` (TorchScript: a counted aten op) also takes the time of the profiled nodes below it
    (its kernels), which then get no row of their own. Without a profile: the layers as they are. Nodes the
    profile does not name in the graph (layout reorders) keep None costs."""
    by_name = {r["name"]: r for r in layers}
    covering = {r["name"] for r in layers if r.get("covers_subtree")}
    ms: dict[str, float] = {}
    owner: dict[str, str] = {}
    for n in prof.nodes:
        top = _covering_ancestor(n.name, covering)
        owner[n.name] = top or n.name
        ms[owner[n.name]] = ms.get(owner[n.name], 0.0) + n.self_ms_p50
    rows: list[LayerRow] = []
    for n in prof.nodes:
        if owner[n.name] != n.name:
            continue
        members = [by_name[m] for m in (n.name, *n.fused) if m in by_name]
        flops = _total([m["flops"] for m in members])
        nbytes = _total([m["param_bytes"] + a if (a := m["activation_bytes"]) is not None else None for m in members])
        s = ms[n.name] / 1000.0
        rows.append(LayerRow(name=n.name, op_type=n.op_type, self_ms=ms[n.name], flops=flops,
                             bytes=None if nbytes is None else int(nbytes),
                             params=sum(m["params"] for m in members) if members else None,
                             gflops_per_s=flops / s / 1e9 if flops is not None and s > 0 else None,
                             gbytes_per_s=nbytes / s / 1e9 if nbytes is not None and s > 0 else None))
    rows.sort(key=lambda r: (r["self_ms"] <= 0, -r["self_ms"], r["name"]))
    return rows


def _total(values: list[float | None] | list[int | None]) -> float | None:
    """The sum of ``values``; None when there are none or one is unknown."""
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _covering_ancestor(name: str, covering: set[str]) -> str | None:
    """The outermost node above ``name`` (a ``/`` path) whose static cost covers its subtree; None: none."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        if "/".join(parts[:i]) in covering:
            return "/".join(parts[:i])
    return None


def achieved(layers: list[LayerCost], prof: OpProfile, peak_gflops: float | None) -> Achieved:
    """The model's total: FLOPs per batch call over the engine's compute time, and its share of the device's peak:
    ``peak_gflops`` when the user gives it, else the profile's own (``farm.peaks``: measured on the pass's cores,
    or a GPU's datasheet figure); None when neither is known."""
    flops = None if any(r["flops"] is None for r in layers) else sum(r["flops"] or 0 for r in layers)
    rate = flops / (prof.compute_ms / 1000.0) / 1e9 if flops is not None and prof.compute_ms else None
    peak, source = (peak_gflops, "given (--peak-gflops)") if peak_gflops else (prof.peak_gflops, prof.peak_source)
    return Achieved(flops=flops, compute_ms=prof.compute_ms, gflops_per_s=rate, peak_gflops=peak,
                    peak_source=source if peak else None, of_peak=rate / peak if rate is not None and peak else None)


def request_profiles(session: Session, request_id: str) -> list[Stored]:
    """The stored op profiles of a request's jobs, in matrix order (engine, device, batch, concurrency)."""
    ids = session.execute(select(Job.id).join(OpProfileRow, OpProfileRow.job_id == Job.id)
                          .where(Job.request_id == request_id)
                          .order_by(Job.edge_profile, Job.engine, Job.device, Job.batch_size, Job.concurrency))
    return [load(session, jid) for jid in ids.scalars()]


def job_label(stored: Stored) -> str:
    """A job's short label in op-profile views: engine, batch, concurrency, edge profile."""
    j = stored.job
    edge = f" edge {j['edge_profile']}" if j.get("edge_profile") else ""
    return f"{j['engine']} b{j['batch_size']} c{j['concurrency']}{edge}"


def breakdown_line(stored: Stored, types: int = 4) -> str:
    """One line: the job's top op types and their share of the compute time, then the overhead."""
    prof = stored.profile
    if prof.status != "ok":
        return f"{stored.job_id[:8]} {job_label(stored)}: no op profile ({prof.status}: {prof.reason})"
    whole = prof.compute_ms or prof.node_sum_ms or 0.0
    rows = by_op_type(prof)
    parts = [f"{r['op_type']} {100 * r['self_ms'] / whole:.0f}%" for r in rows[:types]
             if r["op_type"] != OVERHEAD and whole > 0]
    over = f"; overhead {100 * (prof.overhead_ms or 0.0) / whole:.0f}%" if whole > 0 else ""
    return f"{stored.job_id[:8]} {job_label(stored)}: {', '.join(parts)}{over} of {prof.compute_ms or 0:.3f} ms"
