"""The engines' own op profilers, read into one shape (``Collected``: per node, its self time in each iteration).

- ONNX Runtime: ``SessionOptions.enable_profiling`` writes a Chrome trace; its ``Node`` events (``dur`` µs,
  ``args.op_name``, ``provider``, ``input_type_shape``) fall inside one ``model_run`` event per inference. The
  optimized graph (``optimized_model_filepath``) maps the nodes the optimizer fused back to the graph's names.
- TorchScript: ``torch.profiler`` with ``record_shapes``; each inference inside one ``record_function`` marker;
  a node is an aten op by its position in the call tree (``aten::linear#3/aten::addmm#0``, ``farm.models.torch_nodes``:
  ``farm analyze --layers`` names its static costs alike). The module call's
  own self time (the TorchScript interpreter) is no node: it stays in the overhead.
- OpenVINO: ``PERF_COUNT`` and ``InferRequest.get_profiling_info()`` after each inference (layer, type, exec type,
  real time, EXECUTED / NOT_RUN / OPTIMIZED_OUT); the runtime model's ``originalLayersNames`` lists the fused
  layers. OpenVINO writes no trace: farm writes one (Chrome format) from the same counters.
"""
from __future__ import annotations

import bisect
import importlib.util
import json
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import ServerError
from farm.models.torch_nodes import TORCH_MARK, torch_nodes
from schemas.engines import CARDS
from workers.engines.base import Backend

Feed = dict[str, np.ndarray]
#: a trace file larger than this is not parsed (the profile fails and says so), bytes
MAX_TRACE_FILE = 512 * 1024 * 1024
NCHWC = "_nchwc"


@dataclass
class NodeAcc:
    """One node's readings: its self time in each iteration read (µs) and its calls over them."""

    op_type: str
    exec_type: str = ""
    provider: str = ""
    shapes: str = ""
    status: str = "executed"
    fused: list[str] = field(default_factory=list)
    per_iter: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    calls: int = 0


@dataclass
class Collected:
    """What a profiler gave: the nodes, how many iterations were read, trace events seen, whether the event
    bound cut them, the trace file, and the wall time of each profiled inference (ms)."""

    nodes: dict[str, NodeAcc]
    iterations: int
    events: int
    capped: bool
    trace: Path | None
    walls_ms: list[float]
    note: str | None = None


def timed(backend: Backend, feed: Feed, n: int) -> list[float]:
    """Run ``n`` inferences; their wall times, ms."""
    out: list[float] = []
    for _ in range(n):
        t = time.perf_counter_ns()
        backend.infer(feed)
        out.append((time.perf_counter_ns() - t) / 1e6)
    return out


class Profiler(ABC):
    """One engine's op profiler. ``prepare`` is called on the fresh backend before ``load``; then ``profiled``
    once per inference (warm-up ones included: the first ``warmup`` are dropped), then ``finish``."""

    engine: str

    def __init__(self, workdir: Path, warmup: int, max_events: int, model: Path) -> None:
        self.workdir, self.warmup, self.max_events, self.model = workdir, warmup, max_events, model
        self.accs: dict[str, NodeAcc] = {}
        self.walls: list[float] = []  # profiled inferences after the warm-up, ms
        self.kept = 0  # iterations read
        self.seen = 0  # node events read
        self.capped = False
        self.calls = 0

    def prepare(self, backend: Backend) -> None:
        backend.profile_prefix = str(self.workdir / self.engine)

    def profiled(self, backend: Backend, feed: Feed) -> None:
        """One inference with the profiler on; its wall time is kept once the warm-up is over."""
        wall = timed(backend, feed, 1)
        self.calls += 1
        if self.calls > self.warmup:
            self.walls += wall

    def take(self, rows: list[tuple[str, NodeAcc, float]]) -> bool:
        """Add one iteration's (name, template, µs) rows, unless they would pass the event bound (then the
        profile is capped and False is returned)."""
        if self.capped or self.seen + len(rows) > self.max_events:
            self.capped = True
            return False
        self.seen += len(rows)
        for name, template, us in rows:
            acc = self.accs.setdefault(name, template)
            acc.per_iter[self.kept] += us
            acc.calls += template.status == "executed"
        self.kept += 1
        return True

    @abstractmethod
    def finish(self, backend: Backend) -> Collected:
        """Stop the profiler and return what it saw."""

    def collected(self, events: int, trace: Path | None, note: str | None = None) -> Collected:
        walls = self.walls[: self.kept] if self.kept else self.walls
        return Collected(self.accs, self.kept, events, self.capped, trace, walls, note)


def _read_json(path: Path) -> Any:
    size = path.stat().st_size
    if size > MAX_TRACE_FILE:
        raise ServerError(f"the profiler's trace is {size / 2**20:.0f} MiB, above farm's bound of "
                          f"{MAX_TRACE_FILE / 2**20:.0f} MiB; profile fewer iterations or a smaller batch")
    return json.loads(path.read_text())


def _shapes(args: dict[str, Any]) -> str:
    """ORT's input_type_shape ([{"float": [1, 3]}, ...]) as ``float[1,3] float[3]``."""
    parts = []
    for item in args.get("input_type_shape") or []:
        for dtype, dims in item.items():
            parts.append(f"{dtype}[{','.join(str(d) for d in dims)}]")
    return " ".join(parts)


class OrtProfiler(Profiler):
    engine = "onnxruntime"

    def finish(self, backend: Backend) -> Collected:
        trace = Path(backend.end_profiling())  # type: ignore[attr-defined]
        events = _read_json(trace)
        runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                      key=lambda e: e["ts"])[self.warmup:]
        nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
        starts = [r["ts"] for r in runs]
        by_run: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in nodes:
            i = bisect.bisect_right(starts, e["ts"]) - 1
            if i >= 0 and e["ts"] <= runs[i]["ts"] + runs[i]["dur"]:
                by_run[i].append(e)
        for i in range(len(runs)):
            rows = []
            for e in by_run[i]:
                args = e.get("args", {})
                op = str(args.get("op_name", ""))
                rows.append((e["name"][: -len("_kernel_time")], NodeAcc(
                    op_type=op, exec_type=op, provider=str(args.get("provider", "")), shapes=_shapes(args)),
                    float(e.get("dur", 0))))
            if not self.take(rows):
                break
        _ort_graph(self.model, Path(f"{backend.profile_prefix}.optimized.onnx"), self.accs)
        return self.collected(len(nodes), trace)


def _graph_names(graph: Any) -> list[str]:
    """Node names as ONNX Runtime reports them: the node's name, else ``<OpType>_<index>``."""
    return [n.name or f"{n.op_type}_{i}" for i, n in enumerate(graph.node)]


def _ort_graph(model: Path, optimized: Path, accs: dict[str, NodeAcc]) -> None:
    """Map the original graph's nodes onto the executed ones: a node absent from the optimized graph belongs to
    the optimized node that produces the first of its downstream tensors still present (the fusion kept that
    output), else it was optimized out (constant-folded or removed) and gets a zero row marked so."""
    if not optimized.is_file() or importlib.util.find_spec("onnx") is None:
        return  # no onnx here (farm's image carries it; a user's own may not): the nodes stay unmapped, named as run
    import onnx  # noqa: PLC0415 - onnx is heavy and only a profiling pass of an ONNX model needs it

    orig = onnx.load(str(model), load_external_data=False).graph
    opt = onnx.load(str(optimized), load_external_data=False).graph
    opt_names = _graph_names(opt)
    producer = {t: name for name, n in zip(opt_names, opt.node, strict=True) for t in n.output}
    # the NCHWc layout pass renames tensors and names its node "<the original output tensor>_nchwc"
    producer.update({name[: -len(NCHWC)]: name for name in opt_names if name.endswith(NCHWC)})
    consumers: dict[str, list[Any]] = defaultdict(list)
    for n in orig.node:
        for t in n.input:
            consumers[t].append(n)
    constants = {i.name for i in opt.initializer}  # outputs the optimizer computed once: constant-folded
    op_of = {name: n.op_type for name, n in zip(opt_names, opt.node, strict=True)}
    for name, node in zip(_graph_names(orig), orig.node, strict=True):
        out = node.output[0] if node.output else ""
        if op_of.get(producer.get(out, "")) == node.op_type:  # kept as it was (an unnamed node's name may differ)
            continue
        folded = bool(node.output) and all(t in constants for t in node.output)
        owner = None if folded else _downstream_owner(node, producer, consumers)
        if owner is not None and owner in accs:
            accs[owner].fused.append(name)
        else:
            accs.setdefault(name, NodeAcc(op_type=node.op_type, status="optimized_out"))


def _downstream_owner(node: Any, producer: dict[str, str], consumers: dict[str, list[Any]]) -> str | None:
    frontier, seen = list(node.output), set()
    while frontier:
        t = frontier.pop(0)
        if t in producer:
            return producer[t]
        if t in seen:
            continue
        seen.add(t)
        for c in consumers.get(t, []):
            frontier.extend(c.output)
    return None


class TorchProfiler(Profiler):
    """torch.profiler around each profiled inference on its own (the plain inferences between them run
    without it); the trace kept is the last profiled inference's."""

    engine = "torchscript"

    def __init__(self, workdir: Path, warmup: int, max_events: int, model: Path) -> None:
        super().__init__(workdir, warmup, max_events, model)
        self.events = 0
        self.trace: Path | None = None

    def prepare(self, backend: Backend) -> None:
        """torch.profiler wraps the calls from outside: the backend loads as it serves."""

    def profiled(self, backend: Backend, feed: Feed) -> None:
        import torch  # noqa: PLC0415 - optional heavy engine (farm[torch]); loaded already by the backend

        if self.calls < self.warmup or self.capped:
            super().profiled(backend, feed)
            return
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            with torch.profiler.record_function(TORCH_MARK):  # the inference's own span
                super().profiled(backend, feed)
        events = list(prof.events())
        self.events += len(events)
        marks = [e for e in events if e.name == TORCH_MARK]
        rows = [(name, NodeAcc(op_type=evt.name, exec_type=evt.overload_name or "", provider="cpu",
                               shapes=_torch_shapes(evt)), float(evt.self_cpu_time_total))
                for mark in marks for name, evt in torch_nodes(mark)]
        if self.take(rows):
            self.trace = self.workdir / "torchscript.trace.json"
            prof.export_chrome_trace(str(self.trace))

    def finish(self, backend: Backend) -> Collected:
        return self.collected(self.events, self.trace, note=None)


def _torch_shapes(evt: Any) -> str:
    return " ".join(f"[{','.join(str(d) for d in s)}]" for s in (evt.input_shapes or []) if s)


_OV_STATUS = {"EXECUTED": "executed", "NOT_RUN": "not_run", "OPTIMIZED_OUT": "optimized_out"}


class OpenVinoProfiler(Profiler):
    engine = "openvino"

    def __init__(self, workdir: Path, warmup: int, max_events: int, model: Path) -> None:
        super().__init__(workdir, warmup, max_events, model)
        self.trace_events: list[dict[str, Any]] = []
        self.clock = 0.0

    def profiled(self, backend: Backend, feed: Feed) -> None:
        super().profiled(backend, feed)
        if self.calls <= self.warmup or self.capped:
            return
        rows = []
        for info in backend.request.get_profiling_info():  # type: ignore[attr-defined]
            us = info.real_time.total_seconds() * 1e6
            status = _OV_STATUS.get(str(info.status).rsplit(".", 1)[-1], "executed")
            rows.append((info.node_name, NodeAcc(op_type=info.node_type, exec_type=info.exec_type, provider="CPU",
                                                 status=status), us))
        if self.take(rows):
            for name, acc, us in rows:
                if us > 0:
                    self.trace_events.append({"name": name, "cat": acc.op_type, "ph": "X", "ts": self.clock,
                                              "dur": us, "pid": 1, "tid": 1, "args": {"exec_type": acc.exec_type}})
                    self.clock += us

    def finish(self, backend: Backend) -> Collected:
        _ov_fused(backend.request.get_compiled_model(), self.accs)  # type: ignore[attr-defined]
        trace = self.workdir / "openvino.trace.json"
        trace.write_text(json.dumps({"traceEvents": self.trace_events, "displayTimeUnit": "ms"}))
        return self.collected(self.seen, trace,
                              note="OpenVINO writes no trace: farm's trace lays its per-layer counters end to end")


def _ov_fused(compiled: Any, accs: dict[str, NodeAcc]) -> None:
    for op in compiled.get_runtime_model().get_ordered_ops():
        name = op.get_friendly_name()
        if name not in accs:
            continue
        rt = op.get_rt_info()
        if "originalLayersNames" in rt:
            orig = [n for n in str(rt["originalLayersNames"].astype(str)).split(",") if n and n != name]
            accs[name].fused = orig


#: the op profilers by class name, as engine cards name them (``schemas.engines.EngineCard.profiler``)
PROFILERS: dict[str, type[Profiler]] = {p.__name__: p for p in (OrtProfiler, TorchProfiler, OpenVinoProfiler)}


def profiler_for(engine: str, model: Path, workdir: Path, warmup: int, max_events: int) -> Profiler | None:
    """The op profiler of ``engine``, the one its card names (None: farm has none for it)."""
    card = CARDS.get(engine)
    if card is None or card.profiler is None:
        return None
    return PROFILERS[card.profiler](workdir, warmup, max_events, model)
