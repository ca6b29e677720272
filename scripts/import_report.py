#!/usr/bin/env python3
"""Counts for issue 24's layering: imports of farm's own packages inside functions, layer violations and
import circles among farm's modules. Run from the repository root (``python3 scripts/import_report.py``;
``--counts`` prints the three numbers only).

- in-function imports: ``import``/``from ... import`` statements of ``schemas``, ``farm``, ``scheduler`` or
  ``workers`` (or relative ones) anywhere inside a function of those packages (stdlib ``ast``);
- layer violations: direct imports (module pairs, in-function and ``TYPE_CHECKING`` ones included) that go
  against schemas <- farm core (``farm`` without ``farm.cli``) <- scheduler | workers <- ``farm.cli`` (and
  ``farm.__main__``, the CLI run as ``python -m farm``), or
  between scheduler and workers; the graph is import-linter's own (``grimp``), so it agrees with
  ``lint-imports``;
- import circles: the strongly connected components of more than one module in that graph (scipy's
  ``connected_components``, a dependency of farm already).
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import grimp
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

PACKAGES = ("schemas", "farm", "scheduler", "workers")
ROOT = Path(__file__).resolve().parent.parent


def layer(module: str) -> tuple[int, str]:
    """(rank, name) of a module's layer; a module may import only from lower ranks (and its own layer),
    except that scheduler and workers (same rank) may not import each other."""
    top = module.split(".")[0]
    if module in ("farm.cli", "farm.__main__", "farm.server") or module.startswith(("farm.cli.", "farm.server.")):
        return 3, "cli"  # the CLI, the API server beside it, and __main__ (python -m farm)
    if top in ("scheduler", "workers"):
        return 2, top
    return (1, "farm") if top == "farm" else (0, "schemas")


def in_function_imports(root: Path = ROOT) -> Iterator[tuple[str, int, str, str]]:
    """(file, line, function, imported module) for each import of an own package inside a function."""
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for fn in ast.walk(tree):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        names = [a.name for a in node.names]
                    elif isinstance(node, ast.ImportFrom):
                        names = ["." * node.level + (node.module or "")]
                    else:
                        continue
                    for name in names:
                        if name.startswith(".") or name.split(".")[0] in PACKAGES:
                            yield str(path.relative_to(root)), node.lineno, fn.name, name
                            break
            # nested functions are walked twice (as themselves and inside their parent): keep the innermost


def unique_in_function_imports(root: Path = ROOT) -> list[tuple[str, int, str, str]]:
    """``in_function_imports`` with each statement once (the innermost function names it)."""
    seen: dict[tuple[str, int], tuple[str, int, str, str]] = {}
    for hit in in_function_imports(root):
        seen[(hit[0], hit[1])] = hit  # ast.walk is breadth-first: the innermost function comes last
    return sorted(seen.values())


def build_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def violations(graph: grimp.ImportGraph) -> list[tuple[str, str, int]]:
    """(importer, imported, first line) for each direct import against the layering."""
    out = []
    for importer in sorted(graph.modules):
        rank, name = layer(importer)
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            irank, iname = layer(imported)
            if irank > rank or (irank == rank == 2 and iname != name):
                details = graph.get_import_details(importer=importer, imported=imported)
                out.append((importer, imported, min((d["line_number"] for d in details), default=0)))
    return out


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import circles: sets of two or more modules that all reach each other, largest first."""
    mods = sorted(graph.modules)
    index = {m: i for i, m in enumerate(mods)}
    edges = [(index[a], index[b]) for a in mods for b in graph.find_modules_directly_imported_by(a)]
    rows, cols = zip(*edges, strict=True) if edges else ((), ())
    adj = csr_matrix((np.ones(len(edges)), (rows, cols)), shape=(len(mods), len(mods)))
    _, labels = connected_components(adj, directed=True, connection="strong")
    groups: dict[int, list[str]] = {}
    for m, label in zip(mods, labels, strict=True):
        groups.setdefault(int(label), []).append(m)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", action="store_true", help="print the three counts only")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    hits = unique_in_function_imports()
    graph = build_graph()
    bad = violations(graph)
    loops = circles(graph)
    print(f"in-function imports of own packages: {len(hits)}")
    print(f"layer violations (module pairs): {len(bad)}")
    print(f"import circles: {len(loops)} ({sum(map(len, loops))} modules)")
    if args.counts:
        return 0
    by_pkg: dict[str, int] = {}
    for f, *_ in hits:
        by_pkg[f.split("/")[0]] = by_pkg.get(f.split("/")[0], 0) + 1
    print("\n== in-function imports by package: " + ", ".join(f"{p} {by_pkg.get(p, 0)}" for p in PACKAGES))
    for f, line, fn, mod in hits:
        print(f"{f}:{line} {fn}(): {mod}")
    print("\n== layer violations (importer -> imported, line)")
    for a, b, line in bad:
        print(f"{a} [{layer(a)[1]}] -> {b} [{layer(b)[1]}] (line {line})")
    print("\n== import circles")
    for g in loops:
        print(f"{len(g)}: {' '.join(g)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
