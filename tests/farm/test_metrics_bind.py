"""The unauthenticated /metrics endpoint listens on loopback unless the operator says otherwise (issue 27,
finding 5), its start line names the address really bound, and the deployments that scrape pods (Helm,
compose) set 0.0.0.0 themselves."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from farm.settings import Settings, get_settings
from farm.telemetry import MetricsServer, serve_metrics
from tests.chart import REPO


def _non_loopback_ip() -> str | None:
    """An address of this host other than loopback (the one a default route would use), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, only a route is looked up
        except OSError:
            return None
        ip = str(s.getsockname()[0])
    return None if ip.startswith("127.") else ip


def test_the_default_address_is_loopback_and_the_log_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert Settings().metrics_addr == "127.0.0.1" == get_settings().metrics_addr
    with serve_metrics(CollectorRegistry(), 0, get_settings().metrics_addr, "worker w1") as server:
        assert server is not None
        assert f"worker w1: metrics on http://127.0.0.1:{server.port}/metrics" in capsys.readouterr().err
        other = _non_loopback_ip()
        if other is not None:  # not reachable from the host's other interfaces
            with pytest.raises(OSError), socket.create_connection((other, server.port), timeout=2):
                pass


def test_a_wildcard_bind_is_logged_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """Bound to every interface, the log says 0.0.0.0 (it used to say 127.0.0.1)."""
    with serve_metrics(CollectorRegistry(), 0, "0.0.0.0", "scheduler") as server:
        assert server is not None
        assert f"scheduler: metrics on http://0.0.0.0:{server.port}/metrics" in capsys.readouterr().err
    with MetricsServer(CollectorRegistry(), 0) as default:
        assert default.url.startswith("http://127.0.0.1:")


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_helm_and_compose_bind_metrics_on_the_pod_interfaces() -> None:
    pytest.importorskip("helm_python", reason="the test extra installs helm-python-sdk")
    from tests.chart import pod_specs, render

    specs = pod_specs(render())
    assert specs
    for name, spec in specs.items():
        for c in spec["containers"]:
            if "FARM_METRICS_PORT" in _env(c):
                assert _env(c)["FARM_METRICS_ADDR"] == "0.0.0.0", name
    compose = yaml.safe_load(Path(REPO / "docker-compose.yml").read_text())
    farm = [s for s in compose["services"].values() if str(s.get("image", "")).startswith("farm:")]
    serving = [s for s in farm if "FARM_METRICS_PORT" in s["environment"]]  # not the cli service (a submitter)
    assert serving and all(s["environment"]["FARM_METRICS_ADDR"] == "0.0.0.0" for s in serving)
