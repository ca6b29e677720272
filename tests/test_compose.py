"""docker-compose.yml for one host: valid for Docker Compose (`config`), migration once before the rest, and
every farm service's command one the CLI accepts (ENTRYPOINT ["farm"] + command)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import REPO

COMPOSE = REPO / "docker-compose.yml"


def compose_cmd() -> list[str]:
    """``docker compose`` (plugin) or ``docker-compose`` (scripts/test installs one of them)."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither the Docker Compose plugin nor docker-compose is installed (scripts/test installs it)")


def config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*compose_cmd(), "-f", str(path), "--project-directory", str(REPO), "config"],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The file as Docker Compose resolves it (anchors merged, paths absolute)."""
    proc = config(COMPOSE)
    assert proc.returncode == 0, proc.stderr
    return dict(yaml.safe_load(proc.stdout))


def test_compose_rejects_a_broken_file(tmp_path: Path) -> None:
    """The validator is real: a misspelt key and a bad condition are refused."""
    for broken in (COMPOSE.read_text().replace("    command: [scheduler]", "    comand: [scheduler]"),
                   COMPOSE.read_text().replace("service_completed_successfully", "service_done", 1)):
        bad = tmp_path / "docker-compose.yml"
        bad.write_text(broken)
        assert config(bad).returncode != 0


def test_migration_runs_once_before_the_scheduler_and_workers(resolved: dict[str, Any]) -> None:
    svc = resolved["services"]
    assert svc["migrate"]["command"] == ["db", "upgrade"] and svc["migrate"]["restart"] == "no"
    assert svc["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("scheduler", "worker"):
        deps = svc[name]["depends_on"]
        assert deps["migrate"]["condition"] == "service_completed_successfully", name
        assert deps["redis"]["condition"] == "service_healthy", name
    assert {"postgres", "redis", "migrate", "scheduler", "worker", "flower", "prometheus"} <= set(svc)


def test_services_share_one_database_and_broker_and_expose_metrics(resolved: dict[str, Any]) -> None:
    svc = resolved["services"]
    farm = {n: s for n, s in svc.items() if s.get("image", "").startswith("farm:")}
    assert {"migrate", "server", "scheduler", "worker", "cli"} <= set(farm)
    # only the server, the scheduler and the workers (and the one-off migration) hold the secrets
    holders = {n for n, s in farm.items() if {"FARM_DATABASE_URL", "FARM_BROKER_URL"} & set(s.get("environment", {}))}
    assert holders == {"migrate", "server", "scheduler", "worker"}
    assert farm["cli"]["environment"]["FARM_API_URL"] == "http://server:8080"
    assert "FARM_TOKEN" in farm["cli"]["environment"]
    urls = {(farm[n]["environment"]["FARM_DATABASE_URL"], farm[n]["environment"]["FARM_BROKER_URL"]) for n in holders}
    assert len(urls) == 1
    db, broker = urls.pop()
    pg = svc["postgres"]["environment"]
    assert f"{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}" in db
    assert svc["flower"]["environment"]["CELERY_BROKER_URL"] == broker
    for s in farm.values():
        assert s["read_only"] is True and s["cap_drop"] == ["ALL"] and s["build"]["target"] == "cpu"
    port = farm["worker"]["environment"]["FARM_METRICS_PORT"]
    prom = yaml.safe_load((REPO / "docker" / "prometheus.yml").read_text())
    targets = {c["job_name"]: c for c in prom["scrape_configs"]}
    assert targets["farm-scheduler"]["static_configs"][0]["targets"] == [f"scheduler:{port}"]
    assert targets["farm-worker"]["dns_sd_configs"][0] == {"names": ["worker"], "type": "A", "port": int(port),
                                                            "refresh_interval": "15s"}


def test_every_farm_service_command_is_one_the_cli_accepts(resolved: dict[str, Any]) -> None:
    for name, s in resolved["services"].items():
        if not s.get("image", "").startswith("farm:") or "command" not in s:
            continue
        proc = subprocess.run([sys.executable, "-m", "farm", *s["command"], "--help"], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0 and "Usage:" in proc.stdout, (name, proc.stderr[-1000:])


def test_the_api_server_runs_with_a_readiness_check(resolved: dict[str, Any]) -> None:
    svc = resolved["services"]
    server = svc["server"]
    assert server["command"][:3] == ["server", "--host", "0.0.0.0"]
    assert "/healthz" in " ".join(server["healthcheck"]["test"])
    assert server["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert svc["cli"]["depends_on"]["server"]["condition"] == "service_healthy"
    assert any("/uploads" in str(v) for v in server["volumes"]) and server["read_only"] is True


def test_the_model_store_is_a_locally_built_seaweedfs_the_farm_services_use(resolved: dict[str, Any]) -> None:
    """SeaweedFS (the model store) is built from docker/Dockerfile (no image pulled from a registry), started as
    `weed server ... -s3 -s3.port=8333`, and the server, the workers and the migration wait for it and name it;
    the CLI (a submitter) has no store settings: its models go through the API."""
    svc = resolved["services"]
    store = svc["seaweedfs"]
    assert store["build"]["target"] == "seaweedfs" and store["build"]["dockerfile"].endswith("docker/Dockerfile")
    assert store["command"][0] == "server" and {"-s3", "-s3.port=8333", "-dir=/data"} <= set(store["command"])
    assert "healthcheck" in store and any("/data" in str(v) for v in store["volumes"])
    for name in ("migrate", "server", "worker"):
        assert svc[name]["depends_on"]["seaweedfs"]["condition"] == "service_healthy", name
        env = svc[name]["environment"]
        assert env["FARM_STORE_URL"].startswith("s3://") and env["FARM_S3_ENDPOINT"] == "http://seaweedfs:8333", name
    assert not any(k.startswith(("FARM_STORE", "FARM_S3")) for k in svc["cli"]["environment"])
