"""Fixtures for the worker's tests: a limited cgroup, where this machine allows one."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from workers.limits import LimitedCgroup

MIB = 1 << 20


@pytest.fixture
def limited() -> Iterator[type[LimitedCgroup]]:
    """LimitedCgroup, after checking once that this machine lets us create and limit a cgroup."""
    with LimitedCgroup(cpus=0.5, memory_bytes=256 * MIB) as probe:
        if not probe.created or not probe.enforced:
            pytest.skip(f"cannot create a limited cgroup here: {probe.reason}")
    yield LimitedCgroup
