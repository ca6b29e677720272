"""The endpoint egress policy (``farm.egress``, issue 39 point 2): link-local and metadata addresses, the broker's
and the database's and the worker's own ports always refused; loopback only in the embedded default or where an
entry names it; on a cluster nothing without ``FARM_ENDPOINT_ALLOW``; the name resolved once and pinned; caps on
rate and requests in flight. A refused endpoint gets no connection at all: real listening sockets on loopback
count what reaches them."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from farm import egress
from farm.errors import EgressError
from farm.settings import reset_settings
from schemas import JobSpec, MeasurementSettings
from tests.fake_openai import fake_server
from tests.helpers import farm, farm_env


class Listener:
    """A listening socket on loopback that counts the connections reaching it (accepted and closed at once)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self.accepts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepts += 1
            conn.close()

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def listener() -> Iterator[Listener]:
    lis = Listener()
    lis._thread.start()
    try:
        yield lis
    finally:
        lis._stop.set()
        lis._thread.join(2)
        lis.sock.close()


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    reset_settings()


def test_always_refused_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    _settings(monkeypatch, FARM_ENDPOINT_ALLOW="*")
    for endpoint, why in (("169.254.169.254:80", "metadata"), ("[fd00:ec2::254]:80", "metadata"),
                          ("100.100.100.200:80", "metadata"), ("169.254.1.1:8000", "link-local"),
                          ("[fe80::1]:8000", "link-local"), ("0.0.0.0:8000", "not a host address"),
                          ("[::ffff:169.254.169.254]:80", "metadata"), ("224.0.0.1:80", "not a host address")):
        with pytest.raises(EgressError, match=why):
            egress.pin(endpoint)


def test_embedded_default_allows_loopback_and_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    _settings(monkeypatch)
    assert egress.pin("127.0.0.1:8000").address == "127.0.0.1"
    assert egress.pin("localhost:8000").address in ("127.0.0.1", "::1")
    assert egress.pin("10.1.2.3:8000").hostport == "10.1.2.3:8000"
    with pytest.raises(EgressError, match="metadata"):
        egress.pin("169.254.169.254:80")


def test_cluster_needs_a_list_and_loopback_an_exact_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    _settings(monkeypatch, FARM_BROKER_URL="redis://10.9.9.9:6379/0",
              FARM_DATABASE_URL="postgresql+psycopg2://farm:pw@10.9.9.8:5432/farm")
    with pytest.raises(EgressError, match="not set"):
        egress.pin("10.1.2.3:8000")
    _settings(monkeypatch, FARM_ENDPOINT_ALLOW="10.0.0.0/8, 127.0.0.1:8000 llm.internal:443")
    assert egress.pin("10.1.2.3:8000").address == "10.1.2.3"
    assert egress.pin("127.0.0.1:8000").address == "127.0.0.1"  # named exactly
    for endpoint, why in (("127.0.0.1:8001", "loopback"), ("192.168.1.1:80", "not in FARM_ENDPOINT_ALLOW"),
                          ("10.9.9.9:6379", "the broker's address"), ("10.9.9.8:5432", "the database's address"),
                          ("10.9.9.9:8000", "the broker's host")):
        with pytest.raises(EgressError, match=why):
            egress.pin(endpoint)
    _settings(monkeypatch, FARM_ENDPOINT_ALLOW="*")
    with pytest.raises(EgressError, match="loopback"):  # "*" never reaches the worker's own loopback
        egress.pin("127.0.0.1:8000")


def test_own_metrics_ports_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _settings(monkeypatch, FARM_METRICS_PORT="9400")
    with pytest.raises(EgressError, match="metrics endpoint"):
        egress.pin("127.0.0.1:9401")
    assert egress.pin("127.0.0.1:9500").port == 9500


def test_a_name_is_resolved_once_and_every_address_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that resolves to an allowed and a metadata address is refused (no rebinding between the check and
    the connection: the job is pinned to the address checked)."""
    _settings(monkeypatch, FARM_ENDPOINT_ALLOW="*")
    calls = []

    def fake(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
        calls.append(host)
        answers = {"two.test": ["10.1.1.1", "169.254.169.254"], "one.test": ["10.1.1.2"]}[host]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers]

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(EgressError, match=r"two.test \(169.254.169.254\) is a cloud metadata address"):
        egress.pin("two.test:8000")
    pinned = egress.pin("one.test:8000")
    assert (pinned.address, pinned.authority, pinned.hostport) == ("10.1.1.2", "one.test:8000", "10.1.1.2:8000")
    assert calls == ["two.test", "one.test"]


def test_bad_allow_entries_and_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    _settings(monkeypatch, FARM_ENDPOINT_ALLOW="10.0.0.0/33")
    with pytest.raises(EgressError, match="FARM_ENDPOINT_ALLOW"):
        egress.pin("10.1.1.1:80")
    _settings(monkeypatch, FARM_ENDPOINT_MAX_RATE="100", FARM_ENDPOINT_MAX_IN_FLIGHT="8")
    egress.check_load([1, 8], [None, 100.0])
    with pytest.raises(EgressError, match="FARM_ENDPOINT_MAX_IN_FLIGHT"):
        egress.check_load([16], [None])
    with pytest.raises(EgressError, match="FARM_ENDPOINT_MAX_RATE"):
        egress.check_load([1], [1e6])


def test_a_refused_endpoint_gets_no_connection_at_submit(tmp_path: Path) -> None:
    """Finding: any endpoint was accepted, and checked by connecting to it. On a cluster without an allowlist,
    a loopback endpoint (a service on the host) is refused at submit in one line, before any connection; the
    metadata address likewise in the embedded default; an open-loop rate of 1e6/s is refused too."""
    with listener() as lis:
        env = farm_env(FARM_BROKER_URL="redis://127.0.0.1:1/0", FARM_DATABASE_URL=f"sqlite:///{tmp_path}/f.db")
        for args in (["--endpoint", f"http://{lis.hostport}", "--api", "openai-chat"], ["--endpoint", lis.hostport]):
            proc = farm("submit", *args, "--model-name", "m", check=False, env=env)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert "which is not set" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        proc = farm("submit", "--endpoint", "http://169.254.169.254:80", "--api", "openai-chat", "--model-name", "m",
                    check=False)
        assert proc.returncode == 2 and "metadata address" in proc.stderr, proc.stderr
        proc = farm("submit", "--endpoint", f"http://{lis.hostport}", "--api", "openai-chat", "--model-name", "m",
                    "--rate", "1000000", check=False)
        assert proc.returncode == 2 and "FARM_ENDPOINT_MAX_RATE" in proc.stderr, proc.stderr
        assert lis.accepts == 0


def _endpoint_spec(descriptor: Path, endpoint: str, llm: bool, concurrency: int = 1) -> JobSpec:
    import json

    descriptor.write_text(json.dumps({"endpoint": endpoint, "model_name": "m", "server": {}}))
    m = MeasurementSettings(llm={"api": "openai-chat"}) if llm else MeasurementSettings()
    return JobSpec(job_id="j" * 32, request_id="r", model_sha256="0" * 64, model_format="endpoint", inputs=[],
                   device="cpu", engine="endpoint", batch_size=1, concurrency=concurrency, queue="farm.cpu",
                   measurement=m)


@pytest.mark.parametrize("llm", [True, False])
def test_the_worker_refuses_before_connecting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llm: bool) -> None:
    """A job that reached a worker whose policy refuses its endpoint (another host's submit, a crafted job)
    fails in one line with no connection made; a job over the in-flight cap likewise."""
    from workers.serving.endpoint import endpoint_target

    with listener() as lis:
        _settings(monkeypatch, FARM_BROKER_URL="redis://127.0.0.1:1/0", FARM_ENDPOINT_ALLOW="*")
        spec = _endpoint_spec(tmp_path / "d.json", lis.hostport, llm)
        with pytest.raises(EgressError, match="loopback, which only an entry naming it exactly allows"), \
                endpoint_target(spec, tmp_path / "d.json"):
            pass
        _settings(monkeypatch, FARM_ENDPOINT_ALLOW=lis.hostport, FARM_ENDPOINT_MAX_IN_FLIGHT="2")
        spec = _endpoint_spec(tmp_path / "d.json", lis.hostport, llm, concurrency=4)
        with pytest.raises(EgressError, match="FARM_ENDPOINT_MAX_IN_FLIGHT"), \
                endpoint_target(spec, tmp_path / "d.json"):
            pass
        assert lis.accepts == 0


def test_an_allowed_endpoint_is_driven_at_its_pinned_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's target is the address it checked, the name kept for the Host header, the cap on requests in
    flight set: an open loop past it counts its sends as IN_FLIGHT_CAP errors, never queued."""
    from workers.loadgen.clients import run_load
    from workers.loadgen.contract import LoadSpec, LoadTarget
    from workers.serving.endpoint import endpoint_target

    with fake_server(model="m", ttft_ms=100, itl_ms=1) as url:
        hostport = url.split("//")[1]
        _settings(monkeypatch, FARM_ENDPOINT_MAX_IN_FLIGHT="2")
        spec = _endpoint_spec(tmp_path / "d.json", f"localhost:{hostport.rsplit(':', 1)[1]}", True)
        with endpoint_target(spec, tmp_path / "d.json") as target:
            assert target.host in ("127.0.0.1", "::1") and target.authority == spec_authority(hostport)
            assert target.in_flight_cap == 2 and target.server is not None
            settings = MeasurementSettings(duration_s=1.5, warmup_s=0.2, window_s=0.5, rate=60.0,
                                           llm={"api": "openai-chat", "input_tokens": 4, "output_tokens": 2})
            r = run_load(LoadTarget(target.url, "m", authority=target.authority, in_flight_cap=target.in_flight_cap),
                         LoadSpec.from_settings([], 1, 1, settings))
    # 60/s at 0.1 s each wants ~6 in flight: past 2, sends are counted, not made
    assert r.details["errors"].get("IN_FLIGHT_CAP", 0) > 0 and r.metrics["requests_per_s"] > 0, r.details["errors"]


def spec_authority(hostport: str) -> str:
    return f"localhost:{hostport.rsplit(':', 1)[1]}"
