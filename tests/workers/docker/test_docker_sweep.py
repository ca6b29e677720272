"""A serving container whose starting process was SIGKILLed (no time to remove it) is removed by the next
farm process that runs jobs on the host (issue 27, point 7): containers carry their owner's pid, start time
and host; ``sweep_dead_owners`` removes those whose owner is gone, and only those."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import psutil
import pytest

from workers.runners import hardening as hd
from workers.runners.docker import sweep_dead_owners
from workers.runners.hardening import OWNER_PID_LABEL, OWNER_STARTED_LABEL, owner_labels

pytestmark = pytest.mark.docker


def _sleeper(client: Any, image: str, labels: dict[str, str]) -> Any:
    return client.containers.run(image, ["python", "-c", "import time; time.sleep(120)"], entrypoint=[],
                                 detach=True, labels=labels, network_mode="none")


def test_containers_of_a_killed_owner_are_swept_and_live_ones_kept(docker_client: Any, runtime_image: str) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead_labels = {**owner_labels(), OWNER_PID_LABEL: str(dead.pid),
                   OWNER_STARTED_LABEL: f"{psutil.Process(dead.pid).create_time():.2f}"}
    dead.kill()
    dead.wait()
    base = hd.labels("sweep-test", "job", "serve")
    orphan = _sleeper(docker_client, runtime_image, {**base, **dead_labels})
    mine = _sleeper(docker_client, runtime_image, {**base, **owner_labels()})
    reused_pid = _sleeper(docker_client, runtime_image, {**base, **owner_labels(), OWNER_STARTED_LABEL: "1.00"})
    try:
        removed = set(sweep_dead_owners(docker_client))
        assert orphan.id in removed and reused_pid.id in removed and mine.id not in removed
        mine.reload()
        assert mine.status == "running"
    finally:
        for c in (orphan, mine, reused_pid):
            hd.remove(c, stop_timeout_s=1)
