"""The cache's per-digest file locks (farm.store.locks): flock semantics within one process (two pins of one model
conflict with an evictor like two processes, and releasing one never drops the other), a lock file removed under a
waiter, and a wait that ends in one line."""
from __future__ import annotations

from pathlib import Path

import pytest

from farm.errors import ArtifactError
from farm.store.locks import DigestLock


def test_two_pins_in_one_process_each_hold_their_own(tmp_path: Path) -> None:
    path = tmp_path / "m.lock"
    with DigestLock(path, 1) as one, DigestLock(path, 1) as two, DigestLock(path, 1) as evictor:
        one.shared()
        two.shared()
        assert not evictor.try_exclusive()
        one.close()  # a POSIX record lock (lockf) would drop the process's every lock on the file here
        assert not evictor.try_exclusive()
        two.release()
        assert evictor.try_exclusive()


def test_a_lock_file_removed_under_a_waiter_is_taken_anew(tmp_path: Path) -> None:
    path = tmp_path / "m.lock"
    with DigestLock(path, 1) as evictor, DigestLock(path, 1) as waiter:
        assert evictor.try_exclusive()
        assert not waiter.try_exclusive()  # it holds the file open, unlocked
        evictor.unlink()
        evictor.close()
        assert waiter.try_exclusive()  # on the file the path names now, not the unlinked one
        assert path.exists()
        with DigestLock(path, 1) as third:
            assert not third.try_exclusive()  # the waiter's lock is on the file others open now


def test_a_wait_past_its_deadline_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "m.lock"
    with DigestLock(path, 1) as holder, DigestLock(path, 0.1) as late:
        holder.shared()
        with pytest.raises(ArtifactError, match="waited") as exc:
            late.exclusive()
        assert "\n" not in str(exc.value)
