#!/usr/bin/env python3
"""Counts issue 37's engine-name tables: module-level assignments in product code (``farm``, ``workers``,
``scheduler``, ``schemas``) whose value names two or more engines as string literals (a dict keyed or valued by
engine names, a tuple or set of them, a list of engine cards). A table derived from another one (a comprehension
over ``CARDS``) names no engine and is not counted. Run from the repository root
(``python3 scripts/engine_tables.py``; ``--list`` also prints each table as ``path:line NAME``).

The engine names are ``schemas.engines``' own (``ENGINES`` and ``ENDPOINT_ENGINE``), read from this checkout.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("farm", "workers", "scheduler", "schemas")
#: a table names at least this many distinct engines
MIN_ENGINES = 2


def engine_names() -> frozenset[str]:
    """The engines of this checkout (``schemas.engines``, imported from ``ROOT``)."""
    sys.path.insert(0, str(ROOT))
    from schemas.engines import ENDPOINT_ENGINE, ENGINES  # noqa: PLC0415 - this checkout's, after sys.path

    return frozenset((*ENGINES, ENDPOINT_ENGINE))


def _targets(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return [node.target.id]
    return []


def named_engines(value: ast.AST, names: frozenset[str]) -> set[str]:
    """The engine names ``value`` holds as string literals."""
    return {n.value for n in ast.walk(value) if isinstance(n, ast.Constant) and n.value in names}


def tables(names: frozenset[str]) -> Iterator[tuple[str, int, str]]:
    """(path, line, name) of each engine-name table of the product packages."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in tree.body:
                value = getattr(node, "value", None)
                targets = _targets(node)
                if targets and value is not None and len(named_engines(value, names)) >= MIN_ENGINES:
                    yield str(path.relative_to(ROOT)), node.lineno, targets[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each table's place and name")
    args = parser.parse_args()
    found = list(tables(engine_names()))
    if args.list:
        for path, line, name in found:
            print(f"{path}:{line} {name}")
    print(len(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
