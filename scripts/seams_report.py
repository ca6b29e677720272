#!/usr/bin/env python3
"""Counts for issue 37's seams over product code (``farm``, ``workers``, ``scheduler``, ``schemas``; stdlib
``ast``). Run from the repository root (``python3 scripts/seams_report.py``; ``--list`` names every site; ``--root DIR``
counts another checkout, e.g. the one before a change).

- job-state literals: string constants equal to a ``schemas.job.JobStatus`` value (``"succeeded"``, ...) used
  as a job's status: compared with, assigned to or passed as something named ``status`` (``r["status"] ==``,
  ``Job.status.in_((...))``, ``status=``, ``{"status": ...}``), a container's status (Docker's) left out; the
  ``JobStatus`` enum's own definition is not counted;
- ``dict[str, Any]``: occurrences of that subscript (annotations included; ``Dict[str, Any]`` too);
- import circles: sets of two or more of our modules that all reach each other, imports inside functions
  included (``scripts/import_report.py``'s graph and circles);
- engine-name tables: module- or class-level names bound to a literal table of two or more engine names (dict
  keys, set/tuple/list items, also inside ``frozenset(...)``/``dict(...)``), ``Literal[...]`` types naming two or
  more, and functions that branch on two or more engine names (``engine == "onnxruntime"`` ... an if-chain); the
  cards (``schemas.engines.CARDS``, each engine's name a field of its card) are not a table of names;
- ``submit``: the lines of ``farm submit``'s function (``farm/cli/main.py``), its decorators left out, and of
  its body alone.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("farm", "workers", "scheduler", "schemas")
JOB_STATES = frozenset({"queued", "claimed", "running", "succeeded", "failed", "cancelled"})
SUBMIT_FILE = ROOT / "farm" / "cli" / "main.py"
#: every engine name farm has had (the cards' names, ``endpoint`` left out: it names no engine's module)
ENGINE_NAMES = frozenset({"onnxruntime", "torchscript", "openvino", "triton", "llama.cpp", "transformers", "vllm"})


def _files(root: Path = ROOT) -> Iterator[tuple[str, ast.Module]]:
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            yield str(path.relative_to(root)), ast.parse(path.read_text(), str(path))


def _names_status(node: ast.AST) -> bool:
    """Whether ``node`` is (or holds) something named ``status``, not a container's (Docker's) status."""
    for sub in ast.walk(node):
        text = ast.unparse(sub)
        if "container" in text:
            return False
        if isinstance(sub, ast.Name) and "status" in sub.id.lower():
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "status":
            return True
        if isinstance(sub, ast.Constant) and sub.value == "status":
            return True
    return False


def _is_state(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in JOB_STATES


def _states_in(node: ast.AST) -> list[ast.Constant]:
    """The job-state constants ``node`` is, or holds as a tuple/list/set's items."""
    if _is_state(node):
        return [node]  # type: ignore[list-item]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e for e in node.elts if _is_state(e)]  # type: ignore[misc]
    return []


def _enum_values(tree: ast.Module) -> set[int]:
    """ids of the constants defining an enum's members (``queued = "queued"`` in ``class JobStatus(StrEnum)``)."""
    out: set[int] = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and any("Enum" in ast.unparse(b) for b in cls.bases):
            out |= {id(a.value) for a in cls.body if isinstance(a, ast.Assign)}
    return out


def state_literals(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, literal) for each job-state string literal used as a job's status."""
    hits: dict[tuple[str, int, int], str] = {}
    for name, tree in _files(root):
        skip = _enum_values(tree)
        for node in ast.walk(tree):
            found: list[ast.Constant] = []
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_names_status(s) for s in sides if not _states_in(s)):
                    found = [c for s in sides for c in _states_in(s)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("in_", "notin_") and _names_status(node.func.value):
                found = [c for a in node.args for c in _states_in(a)]
            elif isinstance(node, ast.keyword) and node.arg and "status" in node.arg:
                found = _states_in(node.value)
            elif isinstance(node, ast.Dict):
                found = [c for k, v in zip(node.keys, node.values, strict=True)
                         if k is not None and _names_status(k) for c in _states_in(v)]
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is not None and any(_names_status(t) for t in targets):
                    found = _states_in(node.value)
            for c in found:
                if id(c) not in skip:
                    hits[(name, c.lineno, c.col_offset)] = c.value
    return sorted((f, line, v) for (f, line, _), v in hits.items())


def dict_str_any(root: Path = ROOT) -> list[tuple[str, int]]:
    """(file, line) of each ``dict[str, Any]`` (or ``Dict[str, Any]``)."""
    out = []
    for name, tree in _files(root):
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and ast.unparse(node) in ("dict[str, Any]", "Dict[str, Any]"):
                out.append((name, node.lineno))
    return sorted(out)


def _engine_consts(node: ast.AST) -> int:
    """How many engine-name constants ``node`` holds directly: a dict's keys, a collection's items (also as the
    argument of a call such as ``frozenset(...)``)."""
    if isinstance(node, ast.Call):
        return sum(_engine_consts(a) for a in node.args)
    items: list[ast.expr | None] = []
    if isinstance(node, ast.Dict):
        items = list(node.keys)
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = list(node.elts)
    return sum(isinstance(k, ast.Constant) and k.value in ENGINE_NAMES for k in items)


def engine_tables(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, what) for each table of engine names: a module- or class-level binding of a literal with two
    or more, a ``Literal[...]`` naming two or more, a function comparing a value with two or more."""
    out: list[tuple[str, int, str]] = []
    for name, tree in _files(root):
        scopes = [tree.body] + [c.body for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
        for stmt in (s for body in scopes for s in body):
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None \
                    and _engine_consts(stmt.value) >= 2:
                target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
                out.append((name, stmt.lineno, ast.unparse(target)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
                consts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                if sum(isinstance(c, ast.Constant) and c.value in ENGINE_NAMES for c in consts) >= 2:
                    out.append((name, node.lineno, "Literal[...]"))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                compared = {c.value for cmp in ast.walk(node) if isinstance(cmp, ast.Compare)
                            for side in cmp.comparators
                            for c in (side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side])
                            if isinstance(c, ast.Constant) and c.value in ENGINE_NAMES}
                if len(compared) >= 2:
                    out.append((name, node.lineno, f"def {node.name} (branches on {', '.join(sorted(compared))})"))
    return sorted(out)


def import_circles(root: Path = ROOT) -> list[list[str]]:
    """Import circles among our modules (``scripts/import_report.py``: grimp's graph, in-function imports in)."""
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(ROOT / "scripts"))
    import import_report  # noqa: PLC0415 - a sibling script, importable only once its folder is on the path

    return import_report.circles(import_report.build_graph())


def submit_lines(path: Path = SUBMIT_FILE) -> tuple[int, int]:
    """(lines of ``def submit`` to its end, decorators left out; lines of its body, docstring included)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "submit":
            end = node.end_lineno or node.lineno
            return end - node.lineno + 1, end - node.body[0].lineno + 1
    return 0, 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="name every job-state literal, dict[str, Any] and circle")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to count (default: this one)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    states, dicts, loops = state_literals(root), dict_str_any(root), import_circles(root)
    whole, body = submit_lines(root / "farm" / "cli" / "main.py")
    tables = engine_tables(root)
    print(f"engine-name tables: {len(tables)}")
    print(f"job-state string literals: {len(states)}")
    print(f"dict[str, Any] occurrences: {len(dicts)}")
    print(f"import circles: {len(loops)} ({sum(map(len, loops))} modules)")
    print(f"submit lines: {whole} (body {body})")
    if args.list:
        print("\n== engine-name tables")
        for f, line, what in tables:
            print(f"{f}:{line} {what}")
        print("\n== job-state literals")
        for f, line, v in states:
            print(f"{f}:{line} {v!r}")
        by_file: dict[str, int] = {}
        for f, _ in dicts:
            by_file[f] = by_file.get(f, 0) + 1
        print("\n== dict[str, Any] by file")
        for f, n in sorted(by_file.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{n:4d} {f}")
        print("\n== import circles")
        for g in loops:
            print(f"{len(g)}: {' '.join(g)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
