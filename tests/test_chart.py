"""helm/farm rendered by a real Helm engine: every manifest valid for Kubernetes, the values schema strict,
GPU and edge pools sized right, pods restricted, migrations ordered, and KEDA's query the code's queues."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schemas.queues import CPU_QUEUE, EDGE_QUEUE, gpu_queue
from schemas.request import device_slug
from schemas.specs import EdgeProfile
from tests.chart import (
    KEDA_KINDS,
    KUBE_VERSION,
    REPO,
    ChartValuesError,
    by_kind,
    ci_values,
    lint,
    pod_specs,
    quantity,
    render,
)

pytest.importorskip("helm_python", reason="the test extra installs helm-python-sdk")


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def ci_docs() -> list[dict[str, Any]]:
    return render(ci_values())


@pytest.mark.parametrize("which", ["default", "gpu-edge-keda"])
def test_every_manifest_passes_the_kubernetes_schemas(which: str, default_docs: list[dict[str, Any]],
                                                      ci_docs: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    docs = default_docs if which == "default" else ci_docs
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "PodDisruptionBudget", "Job", "ServiceAccount", "Secret"} <= kinds
    for doc in docs:
        if doc["kind"] in KEDA_KINDS:
            continue  # a CRD: checked in test_keda_scaled_object_per_autoscaled_pool
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("bad, message", [
    ({"cpuWorker": {"replicas": 2}}, "cpuWorker"),
    ({"scheduler": {"replicas": "two"}}, "want integer"),
    ({"pools": [{"name": "cpu", "image": "cpu", "queues": ["farm.cpu"], "runner": "process", "replicas": "two"}]},
     "want integer"),
    ({"pools": [{"name": "gpu", "image": "gpu", "queues": ["gpu-a100"], "runner": "process"}]}, "queues"),
    ({"pools": [{"name": "e", "image": "cpu", "queues": [], "runner": "process", "edgeProfile": {"cpus": 1}}]},
     "memoryMiB"),
    ({"logFormat": "yaml"}, "logFormat"),
])
def test_values_schema_rejects_unknown_keys_and_wrong_types(bad: dict[str, Any], message: str, tmp_path: Path) -> None:
    import yaml

    bad_file = tmp_path / "bad-values.yaml"
    bad_file.write_text(yaml.safe_dump(bad))
    with pytest.raises(ChartValuesError, match=message):
        render(yaml.safe_load(bad_file.read_text()))


def test_gpu_pool_requests_its_gpu_on_its_product_with_the_gpu_image(ci_docs: list[dict[str, Any]]) -> None:
    values = ci_values()
    pool = next(p for p in values["pools"] if p["image"] == "gpu")
    spec = pod_specs(ci_docs)[f"Deployment/rel-farm-{pool['name']}"]
    worker = spec["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1 == worker["resources"]["requests"]["nvidia.com/gpu"]
    assert worker["image"].endswith(":0.1.0-gpu")
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    # the queue is the one the code names for the GPU a worker there detects through NVML
    queues = worker["args"][worker["args"].index("--queues") + 1].split(",")
    assert queues == [gpu_queue(device_slug("NVIDIA A100-SXM4-40GB"))]
    assert {"name": "FARM_JOB_CORES", "value": "4"} in worker["env"]
    cpu = pod_specs(ci_docs)["Deployment/rel-farm-cpu"]["containers"][0]
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"] and cpu["image"].endswith(":0.1.0")


def test_edge_pool_limits_are_its_profile(ci_docs: list[dict[str, Any]]) -> None:
    pool = next(p for p in ci_values()["pools"] if p.get("edgeProfile"))
    prof = EdgeProfile(cpus=pool["edgeProfile"]["cpus"], memory=f"{pool['edgeProfile']['memoryMiB']}m")
    worker = pod_specs(ci_docs)[f"Deployment/rel-farm-{pool['name']}"]["containers"][0]
    for side in ("limits", "requests"):  # Guaranteed QoS: the box is exactly the profile
        assert quantity(worker["resources"][side]["cpu"]) == prof.cpus
        assert quantity(worker["resources"][side]["memory"]) == prof.memory
    assert worker["args"][worker["args"].index("--queues") + 1] == EDGE_QUEUE


@pytest.mark.parametrize("which", ["default", "gpu-edge-keda"])
def test_pods_are_restricted_probed_and_outlast_their_jobs(which: str, default_docs: list[dict[str, Any]],
                                                           ci_docs: list[dict[str, Any]]) -> None:
    docs = default_docs if which == "default" else ci_docs
    longest = 7200 if which == "default" else ci_values()["longestJobSeconds"]
    sa = by_kind(docs, "ServiceAccount")["rel-farm"]
    assert sa["automountServiceAccountToken"] is False
    for name, spec in pod_specs(docs).items():
        assert spec["automountServiceAccountToken"] is False, name
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["seccompProfile"]["type"] == "RuntimeDefault", name
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"], name
        if name.startswith("Deployment/"):
            main = spec["containers"][0]
            probe = "/healthz" if main["args"][0] == "server" else "/metrics"  # the API server's own readiness
            assert main["livenessProbe"]["httpGet"]["path"] == probe and main["readinessProbe"], name
            assert spec["initContainers"][0]["args"][:2] == ["db", "check"], name
            if main["args"][0] == "worker":
                assert spec["terminationGracePeriodSeconds"] > longest, name
    pools = [d["metadata"]["name"] for d in by_kind(docs, "Deployment").values()
             if d["spec"]["template"]["spec"]["containers"][0]["args"][0] == "worker"]
    assert pools and sorted(pools) == sorted(by_kind(docs, "PodDisruptionBudget"))


def test_pods_roll_when_the_secret_or_settings_change() -> None:
    def annotations(values: dict[str, Any]) -> dict[str, str]:
        pod = by_kind(render(values), "Deployment")["rel-farm-cpu"]["spec"]["template"]
        return dict(pod["metadata"]["annotations"])

    base = annotations({})
    moved = annotations({"database": {"url": "postgresql+psycopg2://farm:x@db2:5432/farm"}})
    tuned = annotations({"settings": {"FARM_HEARTBEAT_S": "2"}})
    assert moved["checksum/secret"] != base["checksum/secret"]
    assert moved["checksum/settings"] == base["checksum/settings"]
    assert tuned["checksum/settings"] != base["checksum/settings"]


def test_migrations_run_in_a_hook_after_their_secret_exists(default_docs: list[dict[str, Any]]) -> None:
    job = by_kind(default_docs, "Job")["rel-farm-db-upgrade"]
    hooks = job["metadata"]["annotations"]
    assert set(hooks["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    ref = job["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
    secret = by_kind(default_docs, "Secret")[ref["name"]]
    # the Secret it reads is itself a hook of the same phases with a lower weight: created first
    s_hooks = secret["metadata"]["annotations"]
    assert s_hooks["helm.sh/hook"] == hooks["helm.sh/hook"]
    assert int(s_hooks["helm.sh/hook-weight"]) < int(hooks["helm.sh/hook-weight"])
    assert ref["key"] in secret["stringData"]
    # a hook pod must not need release resources (created only after pre-install hooks): no ServiceAccount
    assert "serviceAccountName" not in job["spec"]["template"]["spec"]


def test_bundled_trial_services_run_migrations_as_a_revision_job() -> None:
    import kubernetes_validate

    docs = render({"bundled": {"enabled": True}})
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    deployments = by_kind(docs, "Deployment")
    assert {"rel-farm-postgres", "rel-farm-redis"} <= set(deployments)
    job = by_kind(docs, "Job")["rel-farm-db-upgrade-1"]
    assert "annotations" not in job["metadata"]  # not a hook: the bundled Postgres starts with the release
    secret = by_kind(docs, "Secret")["rel-farm"]["stringData"]
    assert "@rel-farm-postgres:5432/farm" in secret["FARM_DATABASE_URL"]
    assert secret["FARM_BROKER_URL"] == "redis://rel-farm-redis:6379/0"


def test_keda_scaled_object_per_autoscaled_pool(ci_docs: list[dict[str, Any]]) -> None:
    scaled = by_kind(ci_docs, "ScaledObject")
    auto = [p for p in ci_values()["pools"] if p.get("autoscaling", {}).get("enabled")]
    assert sorted(scaled) == sorted(f"rel-farm-{p['name']}" for p in auto)
    for pool in auto:
        name = f"rel-farm-{pool['name']}"
        so = scaled[name]["spec"]
        assert so["scaleTargetRef"]["name"] == name and so["minReplicaCount"] == pool["autoscaling"]["minReplicas"]
        trigger = so["triggers"][0]
        assert trigger["type"] == "postgresql" and trigger["authenticationRef"]["name"] == name
        auth = by_kind(ci_docs, "TriggerAuthentication")[name]["spec"]["secretTargetRef"][0]
        assert auth == {"parameter": "connection", "name": "farm-db", "key": "KEDA_POSTGRES_CONNECTION"}
        # KEDA owns the replica count of an autoscaled pool
        assert "replicas" not in by_kind(ci_docs, "Deployment")[name]["spec"]
    gpu = scaled["rel-farm-a100"]["spec"]
    assert gpu["minReplicaCount"] == 0 and gpu["triggers"][0]["metadata"]["activationTargetQueryValue"] == "0"


def test_keda_query_counts_queued_claimed_and_running_jobs_of_the_pools_queues(
        cluster_env: dict[str, str], example_onnx: Path, ci_docs: list[dict[str, Any]]) -> None:
    """Run each pool's rendered query on a real ledger whose jobs are spread over states and queues."""
    from sqlalchemy import text, update

    from farm.db.models import Job
    from farm.db.session import get_engine, session_scope
    from scheduler.enqueue import submit
    from schemas import ProfileRequest
    from schemas.job import JobStatus

    sub = submit(ProfileRequest(model=str(example_onnx), batch_sizes=[1, 2, 3, 4, 5, 6, 7, 8]), send=False)
    a100 = gpu_queue("a100-sxm4-40gb")
    plan = [(CPU_QUEUE, JobStatus.queued), (CPU_QUEUE, JobStatus.running), (CPU_QUEUE, JobStatus.succeeded),
            (a100, JobStatus.queued), (a100, JobStatus.claimed), (a100, JobStatus.running),
            (a100, JobStatus.failed), (gpu_queue("t4"), JobStatus.queued)]
    with session_scope() as s:
        ids = [j for (j,) in s.query(Job.id).filter(Job.request_id == sub.request_id).order_by(Job.id)]
        assert len(ids) == len(plan)
        for job_id, (queue, status) in zip(ids, plan, strict=True):
            s.execute(update(Job).where(Job.id == job_id).values(queue=queue, status=status))
    active = {JobStatus.queued, JobStatus.claimed, JobStatus.running}
    with get_engine().connect() as conn:
        for name, so in by_kind(ci_docs, "ScaledObject").items():
            pool = next(p for p in ci_values()["pools"] if f"rel-farm-{p['name']}" == name)
            queues = set(pool["queues"]) | ({gpu_queue(pool["gpuProduct"])} if pool.get("gpuProduct") else set())
            expected = sum(1 for q, st in plan if q in queues and st in active)
            got = conn.execute(text(so["spec"]["triggers"][0]["metadata"]["query"])).scalar()
            assert got == expected, (name, got, expected)
    assert expected > 0


@pytest.mark.parametrize("which", ["default", "gpu-edge-keda"])
def test_helm_lint_strict_finds_no_warning_or_error(which: str) -> None:
    report = lint(ci_values() if which != "default" else None)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


def test_the_api_server_runs_with_a_readiness_probe_and_only_farm_pods_hold_the_secrets(
        default_docs: list[dict[str, Any]]) -> None:
    spec = pod_specs(default_docs)["Deployment/rel-farm-server"]
    main = spec["containers"][0]
    assert main["args"][:3] == ["server", "--host", "0.0.0.0"]
    assert main["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = by_kind(default_docs, "Service")["rel-farm-server"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "server"
    holders = set()
    for name, pod in pod_specs(default_docs).items():
        for c in pod["containers"]:
            if any("secretKeyRef" in (e.get("valueFrom") or {}) for e in c.get("env", [])):
                holders.add(c["args"][0] if c.get("args") else name)
    # the server, the scheduler, the workers (and the migration job's `db upgrade`): no other pod
    assert holders <= {"server", "scheduler", "worker", "db"} and {"server", "scheduler", "worker"} <= holders


def test_the_charts_cli_instructions_use_a_token() -> None:
    notes = (REPO / "helm" / "farm" / "templates" / "NOTES.txt").read_text()
    assert "farm token create" in notes and "FARM_TOKEN" in notes and "FARM_API_URL" in notes
    assert "FARM_DATABASE_URL" not in notes and "FARM_BROKER_URL" not in notes


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_the_model_store_is_an_s3_endpoint_for_every_pod_that_moves_model_bytes() -> None:
    """modelStore: an S3 endpoint with inline keys (in the chart's Secret and the migration hook's), set on the
    server, the workers and the migration (which moves bytes out of the database)."""
    docs = render({"modelStore": {"url": "s3://models/farm", "endpoint": "http://seaweedfs.storage:8333",
                                  "accessKeyId": "AK", "secretAccessKey": "SK"}})
    secrets = by_kind(docs, "Secret")
    assert secrets["rel-farm"]["stringData"]["FARM_S3_ACCESS_KEY_ID"] == "AK"
    assert secrets["rel-farm-migrate"]["stringData"]["FARM_S3_SECRET_ACCESS_KEY"] == "SK"
    pods = pod_specs(docs)
    for name in ("Deployment/rel-farm-server", "Deployment/rel-farm-cpu", "Job/rel-farm-db-upgrade"):
        env = _env(pods[name]["containers"][0])
        assert env["FARM_STORE_URL"] == "s3://models/farm" and env["FARM_S3_ENDPOINT"] == "http://seaweedfs.storage:8333"
        assert env["FARM_S3_ACCESS_KEY_ID"]["secretKeyRef"]["key"] == "FARM_S3_ACCESS_KEY_ID", name
    with pytest.raises(ChartValuesError):
        render({"modelStore": {"endpoint": "seaweedfs:8333"}})  # no scheme


def test_the_model_store_can_be_a_read_write_many_volume() -> None:
    docs = render({"modelStore": {"volumeClaim": "farm-models"}})
    pods = pod_specs(docs)
    for name in ("Deployment/rel-farm-server", "Deployment/rel-farm-cpu", "Job/rel-farm-db-upgrade"):
        pod = pods[name]
        assert {"name": "model-store", "persistentVolumeClaim": {"claimName": "farm-models"}} in pod["volumes"]
        assert {"name": "model-store", "mountPath": "/store"} in pod["containers"][0]["volumeMounts"], name
        assert _env(pod["containers"][0])["FARM_STORE_URL"] == "/store"
