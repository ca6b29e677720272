"""The chart's process-runner workers can jail untrusted models (issue 27 point 3): a user namespace for the pod,
seccomp and /proc opened for bubblewrap only in the worker container; ``jailModels: false`` restores the
restricted profile (and such models are then refused, docs/security.md)."""
from __future__ import annotations

from tests.chart import pod_specs, render


def _workers(values: dict[str, object]) -> list[dict[str, object]]:
    return [s for name, s in pod_specs(render(values)).items() if "cpu" in name and name.startswith("Deployment/")]


def test_process_pools_get_what_the_jail_needs_and_lose_it_when_off() -> None:
    (on,) = _workers({})
    assert on["hostUsers"] is False
    sc = on["containers"][0]["securityContext"]  # type: ignore[index]
    assert sc["seccompProfile"] == {"type": "Unconfined"} and sc["procMount"] == "Unmasked"
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert on["initContainers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}  # type: ignore[index]
    (off,) = _workers({"jailModels": False})
    assert "hostUsers" not in off
    assert off["containers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}  # type: ignore[index]
