"""docs/architecture.md's recipes ("Add an engine", "a load kind", "a metric", "a server-metrics source") list the
files they touch: each must exist, each registry named must be in its file, and each recipe must name the
registries farm reads that kind of thing from (a new hand-written engine table, mode or figure the recipe does
not name fails here)."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from typing import get_args

import pytest

from farm.cli.submit_options import SUBMIT_OPTIONS
from schemas.engines import CARDS
from schemas.load_levels import OPEN_LEVELS
from schemas.metrics import LABELS, METRICS
from schemas.request import MeasurementSettings
from workers.engines.backends import BACKENDS
from workers.loadgen.openai import client as openai_client
from workers.loadgen.openai.server_metrics import FAMILIES
from workers.loadgen.patterns import OPEN_PATTERNS, ClosedLoop
from workers.profiling.collect import PROFILERS
from workers.serving.registry import SERVING

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
RECIPES = ("Add an engine", "Add a load kind", "Add a metric", "Add a server-metrics source")
_FILE = re.compile(r"^- `([^`]+)`(?: `([A-Za-z_][A-Za-z0-9_]*)`)?\s*$")

Listed = list[tuple[str, str | None]]


def recipe_files(recipe: str, text: str | None = None) -> Listed:
    """(path, registry or None) of each line of ``recipe``'s **Files** list in docs/architecture.md."""
    text = DOC.read_text() if text is None else text
    start = text.index(f"### {recipe}\n")
    end = min((i for i in (text.find("\n### ", start + 1), text.find("\n## ", start + 1)) if i > 0),
              default=len(text))
    section = text[start:end].splitlines()
    lines = section[section.index("**Files**") + 1:]
    listed: Listed = []
    for line in lines:
        match = _FILE.match(line)
        if match is None:
            break
        listed.append((match[1], match[2]))
    return listed


def _matches(path: str) -> list[Path]:
    return sorted(REPO.glob(path.replace("<name>", "*")))


def _defined(path: str, name: str) -> bool:
    """Whether ``path`` defines ``name`` at module level (an assignment, a function or a class)."""
    for node in ast.parse((REPO / path).read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def _engine_tables() -> set[tuple[str, str]]:
    """(path, name) of each engine-name table ``scripts/engine_tables.py`` counts."""
    spec = importlib.util.spec_from_file_location("engine_tables", REPO / "scripts" / "engine_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {(path, name) for path, _line, name in module.tables(module.engine_names())}


def _source(obj: object) -> str:
    return str(Path(inspect.getsourcefile(obj) or "").resolve().relative_to(REPO))  # type: ignore[arg-type]


def test_the_file_list_parser_reads_a_recipe() -> None:
    text = "### Add a thing\n\n**Files**\n- `a/b.py` `REG`\n- `c/<name>.py`\n\n1. step\n### Next\n"
    assert recipe_files("Add a thing", text) == [("a/b.py", "REG"), ("c/<name>.py", None)]


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_file_a_recipe_lists_exists_and_holds_its_registry(recipe: str) -> None:
    listed = recipe_files(recipe)
    assert listed, f"{recipe}: no **Files** list"
    for path, registry in listed:
        assert _matches(path), f"{recipe}: {path} does not exist"
        if registry is not None:
            assert "<name>" not in path and _defined(path, registry), f"{recipe}: {path} has no {registry}"


def test_the_engine_recipe_names_every_registry_an_engine_is_read_from() -> None:
    listed = set(recipe_files("Add an engine"))
    wanted = {("schemas/engines.py", "CARDS"), ("workers/profiling/collect.py", "PROFILERS")}
    assert wanted | _engine_tables() <= listed
    paths = {path for path, _ in listed}
    # the modules those registries hold live where the recipe says a new one goes
    for backend in BACKENDS.values():
        assert Path(_source(backend)).match("workers/engines/*_backend.py"), backend
    for engine in SERVING.values():
        assert Path(_source(type(engine))).match("workers/serving/*.py"), engine
    assert {"workers/engines/<name>_backend.py", "workers/serving/<name>.py"} <= paths
    for card in CARDS.values():  # the module each card names is one of those the recipe adds
        path = Path(card.module.replace(".", "/") + ".py")
        assert path.match("workers/engines/*_backend.py" if card.in_process else "workers/serving/*.py"), card.name
    assert {_source(p) for p in PROFILERS.values()} == {"workers/profiling/collect.py"}


def test_the_load_kind_recipe_names_every_place_a_mode_is_read() -> None:
    listed = set(recipe_files("Add a load kind"))
    assert {("workers/loadgen/patterns.py", "OPEN_PATTERNS"), ("schemas/request.py", "MeasurementSettings"),
            ("schemas/load_levels.py", "OPEN_LEVELS"), ("farm/cli/submit_options.py", None)} <= listed
    modes = set(get_args(MeasurementSettings.model_fields["mode"].annotation))
    assert modes == {ClosedLoop.mode, *OPEN_PATTERNS} == {"closed", *OPEN_LEVELS}
    helps = [o.help for o in SUBMIT_OPTIONS if "--mode" in o.flags]
    assert helps and all(set(re.findall(r"[a-z]+", h)) >= modes for h in helps)  # the hand-written help


def test_the_metric_recipe_names_the_registry_and_its_labels() -> None:
    listed = set(recipe_files("Add a metric"))
    assert {("schemas/metrics.py", "METRICS"), ("schemas/metrics.py", "LABELS"), ("docs/metrics.md", None)} <= listed
    assert {m.name for m in METRICS} <= set(LABELS)


def test_the_server_metrics_recipe_names_where_each_figure_is_read() -> None:
    listed = set(recipe_files("Add a server-metrics source"))
    assert {("workers/loadgen/openai/server_metrics.py", "FAMILIES"), ("workers/loadgen/openai/client.py",
            "_record"), ("schemas/metrics.py", "METRICS")} <= listed
    names = {m.name for m in METRICS}
    assert {f"server_{figure}_p50_ms" for figure in FAMILIES} <= names  # every figure read has its column
    source = inspect.getsource(openai_client._record)
    assert 'f"server_{figure}_p50_ms"' in source  # and the client fills each from the scrape


def test_a_registry_module_imports() -> None:
    for recipe in RECIPES:
        for path, registry in recipe_files(recipe):
            if registry is not None:
                module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
                assert hasattr(module, registry), (path, registry)
