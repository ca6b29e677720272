"""Rendering ``helm/farm`` with a real Helm engine (helm-python-sdk embeds Helm's Go SDK) for the chart tests.

The engine runs in a child process per call: Helm's Go runtime, loaded into a pytest-xdist worker (whose tests run
outside the main thread), took the worker down with it; a child keeps it away from the test process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "farm"
CI_VALUES = CHART / "ci" / "gpu-edge-keda.yaml"
#: the Kubernetes version the manifests are validated against (kubernetes-validate's schemas)
KUBE_VERSION = "1.30.0"
#: custom resources kubernetes-validate has no schema for (checked field by field in the tests)
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}


#: what the child runs: ``render`` or ``lint`` of the chart with the JSON arguments on stdin; prints the JSON answer,
#: or ``{"values_error": TEXT}`` when Helm refuses the values
_CHILD = """
import json, sys
import helm_python
call = json.load(sys.stdin)
try:
    if call["op"] == "render":
        chart = helm_python.Chart.load(call["chart"])
        out = chart.render(call["values"], name=call["release"], namespace="farm", is_install=True, **call["opts"])
    else:
        out = helm_python.lint(call["chart"], call["values"], strict=True)
except helm_python.HelmValuesError as exc:
    out = {"values_error": str(exc)}
json.dump(out, sys.stdout)
"""


class ChartValuesError(Exception):
    """Helm refused the values (helm-python-sdk's ``HelmValuesError`` in the child)."""


def _helm(op: str, values: dict[str, Any] | None, **extra: Any) -> Any:
    call = {"op": op, "chart": str(CHART), "values": values, **extra}
    done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(call), capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"helm {op} failed in its process (exit {done.returncode}): {done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    if isinstance(out, dict) and set(out) == {"values_error"}:
        raise ChartValuesError(out["values_error"])
    return out


def render(values: dict[str, Any] | None = None, release: str = "rel", **opts: Any) -> list[dict[str, Any]]:
    """Every manifest the chart renders for ``values`` (install of release ``release`` in namespace farm)."""
    out = _helm("render", values or {}, release=release, opts=opts)
    return [doc for name, text in out.items() if not name.endswith("NOTES.txt")  # text for people, not a manifest
            for doc in yaml.safe_load_all(text) if doc]


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Helm's strict lint of the chart with ``values`` (None: its defaults)."""
    return dict(_helm("lint", values))


def ci_values() -> dict[str, Any]:
    return dict(yaml.safe_load(CI_VALUES.read_text()))


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """``kind`` manifests by name."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod spec of every Deployment and Job, by ``Kind/name``."""
    return {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "Job")}


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity (``1500m``, ``1.5``, ``1024Mi``, ``4Gi``) as a number (cores or bytes)."""
    s = str(text)
    for suffix, factor in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("Ti", 1 << 40), ("m", 1e-3),
                           ("k", 1e3), ("M", 1e6), ("G", 1e9)):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * factor
    return float(s)
