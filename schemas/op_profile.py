"""The operator-level profile of one job: one schema for every engine (``--op-profile``).

A profile is taken in its own short pass after the job's load measurement (``workers.profiling``): the same
engine, device, batch and threads, on the job's cores, with the engine's own profiler on (ONNX Runtime's
``enable_profiling`` trace, ``torch.profiler``, OpenVINO's ``PERF_COUNT``). Times are per inference (one
batch call), in ms; ``share`` is a node's part of the node sum. ``status`` says whether the profile exists:

- ``ok``: rows measured; ``capped`` is set when the trace held more events than the bound and only the
  first iterations' events were read (the row says so in ``reason``);
- ``none``: the engine has no op profiler in farm (Triton, a running endpoint): ``reason`` says so;
- ``failed``: the profiler or its pass crashed: ``reason`` is the one-line cause. The job's load figures are
  kept either way.
"""
from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from schemas.engines import CARDS

#: engines whose backend profiler farm reads (``workers.profiling.collect``): the cards that name a profiler
PROFILED_ENGINES: tuple[str, ...] = tuple(c.name for c in CARDS.values() if c.profiler is not None)
#: the most trace events a pass reads (a larger trace is cut, and the profile says so)
MAX_EVENTS = 200_000
#: inferences of a profiling pass after its warm-up
PROFILE_ITERATIONS = 20
PROFILE_WARMUP = 5
#: the largest raw trace kept with the profile (gzip-compressed bytes); a larger one is dropped, and said so
MAX_TRACE_BYTES = 32 * 1024 * 1024
#: the name of the row that holds compute time no node accounts for (framework, copies, scheduling)
OVERHEAD = "(overhead)"

ProfileStatus = Literal["ok", "none", "failed"]
NodeStatus = Literal["executed", "optimized_out", "not_run"]


class OpNode(BaseModel):
    """One graph node (or engine kernel) of a profile. ``name``: the graph node's name as the engine reports it
    (ONNX Runtime: the optimized graph's node, ``OpType_<index>`` for unnamed ones; TorchScript: module path and
    aten op; OpenVINO: the runtime model's layer); ``fused``: the graph nodes the engine folded into it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    op_type: str
    exec_type: str = ""  # the engine's kernel/implementation (OpenVINO exec type, ORT kernel op, aten overload)
    provider: str = ""  # ONNX Runtime execution provider / device of the kernel
    calls: float = Field(default=0.0, ge=0, description="calls per inference")
    self_ms_p50: float = Field(default=0.0, ge=0, description="self time per inference, median over iterations, ms")
    self_ms_p90: float = Field(default=0.0, ge=0, description="self time per inference, p90 over iterations, ms")
    share: float = Field(default=0.0, ge=0, description="part of the node sum (median times), 0..1")
    input_shapes: str = ""
    fused: list[str] = Field(default_factory=list)
    status: NodeStatus = "executed"


class OpProfile(BaseModel):
    """A job's op profile: its nodes (highest median self time first; zero-time nodes last) and the totals.

    ``node_sum_ms``: the per-inference sum of the nodes' median self times; ``compute_ms``: the engine call's
    median time for the same batch without the profiler, in the same process on the same cores;
    ``overhead_ms`` = ``compute_ms - node_sum_ms`` (framework, copies; negative when the profiler's own cost
    inflated the nodes): shown as its own row, never spread over nodes."""

    model_config = ConfigDict(extra="forbid")

    engine: str
    status: ProfileStatus
    reason: str | None = None
    batch_size: int = 1
    threads: int = 0
    warmup: int = 0
    iterations: int = 0
    events: int = 0
    capped: bool = False
    node_sum_ms: float | None = None
    compute_ms: float | None = None
    profiled_ms: float | None = None
    overhead_ms: float | None = None
    trace_format: str | None = None  # "chrome" (Perfetto / chrome://tracing opens it)
    cpus: str | None = None  # the cores every thread of the pass was allowed on, read before its sessions closed
    #: the device's peak FLOP rate (GFLOP/s) and how it was found (``farm.peaks``: measured on the pass's cores,
    #: a GPU datasheet); None: unknown. These three are kept in the result's ``details.op_profile``, not in
    #: ``op_profiles``' columns.
    peak_gflops: float | None = None
    peak_source: str | None = None
    #: where the pass ran: its hostname and pid (the Docker runner adds its container's id and cpuset)
    site: str | None = None
    nodes: list[OpNode] = Field(default_factory=list)

    @property
    def sum_vs_compute(self) -> float | None:
        """node_sum_ms / compute_ms (1.0: the nodes account for the whole engine call)."""
        if not self.node_sum_ms or not self.compute_ms:
            return None
        return self.node_sum_ms / self.compute_ms


def missing(engine: str, status: ProfileStatus, reason: str) -> OpProfile:
    """A profile that does not exist (``none``: no profiler for this engine; ``failed``: it crashed)."""
    return OpProfile(engine=engine, status=status, reason=reason)


def no_profiler(engine: str) -> OpProfile:
    """The explicit "no op profile" of an engine farm cannot profile (Triton, endpoints)."""
    return missing(engine, "none", f"engine {engine} has no op profiler in farm (op profiles: "
                                   f"{', '.join(PROFILED_ENGINES)}); its server's own tools (Triton's trace "
                                   "API) give the request-level view")


class LayerCost(TypedDict):
    """One graph node's static cost in one batch call (``farm.models.onnx_counter.node_costs``,
    ``farm.models.torch_layers``): ``name`` as the engine's profile reports it, MACs and FLOPs (None: no rule or
    shape), its parameters (elements, bytes) and its outputs' bytes (None: a shape unknown); ``covers_subtree``
    (TorchScript): a counted op whose cost covers the profiled kernels below it."""

    name: str
    op_type: str
    macs: float | None
    flops: float | None
    params: int
    param_bytes: int
    activation_bytes: int | None
    covers_subtree: NotRequired[bool]


class LayerRow(TypedDict):
    """A profiled node joined with its static cost (``farm.op_profile.join_layers``): its time per inference (ms),
    FLOPs and bytes (parameters + outputs) per call, parameters, and the achieved GFLOP/s and GB/s (None:
    unknown)."""

    name: str
    op_type: str
    self_ms: float
    flops: float | None
    bytes: int | None
    params: int | None
    gflops_per_s: float | None
    gbytes_per_s: float | None


class Achieved(TypedDict):
    """The model's total (``farm.op_profile.achieved``): FLOPs per call, the engine's compute time (ms), the
    achieved GFLOP/s, the device's peak (GFLOP/s) and where it came from, and the share of it (None: unknown)."""

    flops: float | None
    compute_ms: float | None
    gflops_per_s: float | None
    peak_gflops: float | None
    peak_source: str | None
    of_peak: float | None


class LayersView(TypedDict):
    """The layer-wise view joined with a profile: per-node rows and the model's total."""

    layers: list[LayerRow]
    total: Achieved


class OpTypeRow(TypedDict):
    """One op type of a profile (``farm.op_profile.by_op_type``): its nodes, calls and self time per inference
    (ms) and share of the node sum (None: the overhead row)."""

    op_type: str
    nodes: int
    calls: float
    self_ms: float
    share: float | None


class OpDelta(TypedDict):
    """One op type of two profiles side by side (``farm.op_profile.compare_ops``): self time per inference in A
    and B (ms; None: absent on that side), B / A and B - A (ms)."""

    op_type: str
    a_ms: float | None
    b_ms: float | None
    ratio: float | None
    delta_ms: float


class PeakFields(TypedDict, total=False):
    """The profile fields a result keeps in ``details.op_profile`` rather than in ``op_profiles``' columns."""

    peak_gflops: float | None
    peak_source: str | None
    site: str | None


class OpSummary(PeakFields):
    """What a results row keeps of its profile (``details.op_profile``; the rest lives in its tables)."""

    status: str
    reason: str | None
    nodes: int
    node_sum_ms: float | None
    compute_ms: float | None
