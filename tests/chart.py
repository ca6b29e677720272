"""Rendering ``helm/farm`` with a real Helm engine (helm-python-sdk embeds Helm's Go SDK) for the chart tests."""
from __future__ import annotations

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


def render(values: dict[str, Any] | None = None, release: str = "rel", **opts: Any) -> list[dict[str, Any]]:
    """Every manifest the chart renders for ``values`` (install of release ``release`` in namespace farm)."""
    from helm_python import Chart

    chart = Chart.load(str(CHART))
    out = chart.render(values or {}, name=release, namespace="farm", is_install=True, **opts)
    return [doc for text in out.values() for doc in yaml.safe_load_all(text) if doc]


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
