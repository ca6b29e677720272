"""How a TorchScript model's nodes are named, in one place: the op-profiling pass (``workers.profiling.collect``)
names what ``torch.profiler`` recorded by these rules, and ``farm analyze --layers`` (``farm.models.torch_counter``)
names its static per-node costs by the same ones, so that the two join by name.

A node is an aten op by its path in the profiler's call tree under one inference's marker, each step numbered
among its siblings of the same name: ``aten::linear#3/aten::addmm#0``. The module call (``forward``) and the
marker itself are walked through, not nodes. Imports nothing (farm's runtime image reads it, torch or not).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

#: the ``record_function`` span around one inference
TORCH_MARK = "farm::iteration"
#: spans walked through (their children are the nodes)
TORCH_WRAPPERS = ("forward", TORCH_MARK)


def torch_nodes(mark: Any) -> list[tuple[str, Any]]:
    """The profiler events under one iteration's marker ``mark`` (a ``FunctionEvent``), pre-order (a parent
    before its children, siblings in call order), each with its node name."""
    out: list[tuple[str, Any]] = []
    counters: dict[tuple[str, str], int] = defaultdict(int)

    def walk(evt: Any, prefix: str) -> None:
        for child in evt.cpu_children:
            if child.name in TORCH_WRAPPERS:
                walk(child, prefix)
                continue
            k = counters[(prefix, child.name)]
            counters[(prefix, child.name)] += 1
            name = f"{prefix}{child.name}#{k}"
            out.append((name, child))
            walk(child, name + "/")

    walk(mark, "")
    return out
