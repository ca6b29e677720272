"""The worker's model cache (farm.store.cache) cannot serve a wrong model: verified publish and reuse, corruption
detected and fetched again, LRU eviction that spares pinned models, one download for four racing processes, a
fetch killed by SIGKILL cleaned up by the next, a store that is down retried then reported in one line."""
from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from farm.errors import ArtifactError, StoreUnavailable
from farm.settings import get_settings, reset_settings
from farm.store.base import Manifest, ManifestEntry
from farm.store.cache import MARKER, ModelCache
from farm.store.fetch import Retry
from tests.farm.store.dirstore import DirStore

FAST = Retry(attempts=3, backoff_s=0.01)
FOLDER = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}" * 100,
          "weights/model-00001-of-00002.safetensors": os.urandom(300_000),
          "weights/model-00002-of-00002.safetensors": os.urandom(200_000)}
#: past the file system's timestamp tick: a write within the publish's own tick is the check's documented blind spot
TICK_S = 0.05


def _cache(tmp_path: Path, store: DirStore, max_bytes: int | None = None) -> ModelCache:
    return ModelCache(tmp_path / "cache", store, max_bytes, retry=FAST, wait_s=60)


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by relative path, with its sha256."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _expected_tree() -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in sorted(FOLDER.items())}


def _writable(path: Path) -> None:
    time.sleep(TICK_S)
    os.chmod(path, 0o644)


def _published(tmp_path: Path, data: bytes, name: str = "model.onnx") -> tuple[DirStore, ModelCache, str, Path]:
    """A store holding ``data``, a cache, the model's sha256, and the path of its copy once used (and unpinned)."""
    store = DirStore(tmp_path / "store")
    sha = store.add(data)
    cache = _cache(tmp_path, store)
    with cache.use(sha, name, "file") as path:
        assert path.read_bytes() == data
    return store, cache, sha, path


def _published_folder(tmp_path: Path) -> tuple[DirStore, ModelCache, str, Path]:
    """As ``_published``, for ``FOLDER`` cached as ``m``."""
    store = DirStore(tmp_path / "store")
    sha = store.add_folder(FOLDER)
    cache = _cache(tmp_path, store)
    with cache.use(sha, "m", "folder") as path:
        assert _tree(path) == _expected_tree()
    return store, cache, sha, path


def test_a_file_is_published_verified_and_reused(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    store, cache, sha, path = _published(tmp_path, data, "model.gguf")
    assert path == tmp_path / "cache" / sha / "model.gguf"
    marker = json.loads((path.parent / MARKER).read_text())
    assert (marker["sha256"], marker["size"], marker["files"][0]["sha256"]) == (sha, len(data), sha)
    with cache.use(sha, "model.gguf", "file") as again:
        assert again == path and again.read_bytes() == data
    assert store.gets() == [sha]  # the second use served the verified copy, no download
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([MARKER, "model.gguf"])


def test_a_folder_is_materialised_file_by_file(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    sha = store.add_folder(FOLDER)
    with _cache(tmp_path, store).use(sha, "tiny-llama", "folder") as path:
        assert path.is_dir() and _tree(path) == _expected_tree()
        assert not any(p.is_symlink() for p in path.rglob("*"))
    assert len(store.gets()) == 1 + len(FOLDER)  # the manifest, then each file once


def test_a_truncated_file_is_fetched_again(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    store, cache, sha, path = _published(tmp_path, data)
    _writable(path)
    os.truncate(path, len(data) // 2)
    with cache.use(sha, "model.onnx", "file") as again:
        assert again.read_bytes() == data
    assert store.gets() == [sha, sha]


def test_a_flipped_byte_in_a_shard_is_fetched_again(tmp_path: Path) -> None:
    store, cache, sha, path = _published_folder(tmp_path)
    shard = path / "weights/model-00002-of-00002.safetensors"
    _writable(shard)
    with open(shard, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert shard.stat().st_size == len(FOLDER["weights/model-00002-of-00002.safetensors"])  # same size
    with cache.use(sha, "m", "folder") as again:
        assert _tree(again) == _expected_tree()
    assert len(store.gets()) == 2 * (1 + len(FOLDER))


def test_a_file_added_to_a_folder_is_not_served(tmp_path: Path) -> None:
    store, cache, sha, path = _published_folder(tmp_path)
    (path / "modeling_evil.py").write_text("import os")
    with cache.use(sha, "m", "folder") as again:
        assert _tree(again) == _expected_tree()


def test_a_touched_but_intact_entry_is_rehashed_not_fetched(tmp_path: Path) -> None:
    store, cache, sha, path = _published(tmp_path, os.urandom(1 << 20))
    _writable(path)  # its ctime changes, its bytes do not
    with cache.use(sha, "model.onnx", "file") as again:
        assert hashlib.sha256(again.read_bytes()).hexdigest() == sha
    assert store.gets() == [sha]


def test_lru_eviction_spares_a_pinned_model(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    size = 1 << 20
    a, b, c, d = (store.add(os.urandom(size)) for _ in range(4))
    cache = _cache(tmp_path, store, max_bytes=int(2.5 * size))
    root = tmp_path / "cache"
    with cache.use(a, "a.onnx", "file"):  # a: pinned, and the least recently used
        with cache.use(b, "b.onnx", "file"):
            pass
        time.sleep(TICK_S)  # distinct last-use times
        with cache.use(c, "c.onnx", "file"):  # needs room: b goes, a (older, pinned) stays
            pass
        assert (root / a / "a.onnx").is_file() and not (root / b).exists() and (root / c / "c.onnx").is_file()
        with cache.use(c, "c.onnx", "file"):
            with pytest.raises(ArtifactError, match="running jobs use") as full:
                with cache.use(d, "d.onnx", "file"):
                    pass
            assert "\n" not in str(full.value)
    assert not (root / d).exists()  # nothing half-published
    time.sleep(TICK_S)
    with cache.use(c, "c.onnx", "file"):
        pass
    with cache.use(d, "d.onnx", "file"):  # now unpinned: a, the least recently used, goes
        pass
    assert sorted(p.name for p in root.iterdir() if p.name != ".locks") == sorted([c, d])


def test_a_model_larger_than_the_budget_is_one_line(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    sha = store.add(os.urandom(1 << 20))
    with pytest.raises(ArtifactError, match="FARM_CACHE_MAX_BYTES") as exc:
        with _cache(tmp_path, store, max_bytes=1 << 19).use(sha, "big.gguf", "file"):
            pass
    assert "\n" not in str(exc.value)
    assert store.gets() == []


def _race(cache_root: Path, store_root: Path, sha: str, out: Path, start: Any) -> None:
    """One of the racing processes: use the folder when all four are ready, write what it saw to ``out``."""
    cache = ModelCache(cache_root, DirStore(store_root, delay_s=0.02), None, wait_s=120)
    start.wait()
    entered = time.time()
    with cache.use(sha, "m", "folder") as path:
        out.write_text(json.dumps({"path": str(path), "tree": _tree(path), "entered": entered, "got": time.time()}))


def test_four_processes_share_one_download_of_a_folder(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    sha = store.add_folder(FOLDER)
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(4)
    procs = [ctx.Process(target=_race, args=(tmp_path / "cache", store.root, sha, tmp_path / f"out{i}.json", start))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    seen = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(4)]
    assert max(s["entered"] for s in seen) < min(s["got"] for s in seen)  # all four asked before any had it
    assert {s["path"] for s in seen} == {str(tmp_path / "cache" / sha / "m")}
    assert all(s["tree"] == _expected_tree() for s in seen)
    assert len(store.gets()) == 1 + len(FOLDER)  # exactly one download
    assert sorted(os.listdir(tmp_path / "cache" / sha)) == sorted([MARKER, "m"])  # no stray copies


def _fetch_slowly(cache_root: Path, store_root: Path, sha: str) -> None:
    with ModelCache(cache_root, DirStore(store_root, delay_s=0.01), None).use(sha, "model.gguf", "file"):
        pass


def test_a_fetch_killed_midway_leaves_a_temp_file_the_next_fetch_cleans(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    data = os.urandom(8 << 20)
    sha = store.add(data)
    entry = tmp_path / "cache" / sha
    child = mp.get_context("spawn").Process(target=_fetch_slowly, args=(tmp_path / "cache", store.root, sha))
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.endswith(".tmp") and p.stat().st_size > 0 for p in entry.glob(".*")):
            assert time.monotonic() < deadline and child.is_alive(), "the child never started writing"
            time.sleep(0.01)
    finally:
        os.kill(child.pid or 0, signal.SIGKILL)
        child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL
    assert not (entry / MARKER).exists() and not (entry / "model.gguf").exists()  # nothing published
    assert [p.name for p in entry.glob("*.tmp")] == [f".model.gguf.{child.pid}.tmp"]  # only its temp file
    with _cache(tmp_path, store).use(sha, "model.gguf", "file") as path:
        assert path.read_bytes() == data
    assert sorted(os.listdir(entry)) == sorted([MARKER, "model.gguf"])  # the dead fetch's temp file is gone


def test_a_dead_fetchers_leftovers_are_cleaned_by_the_budget(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    sha = store.add(os.urandom(1 << 20))
    stale = tmp_path / "cache" / ("0" * 64)
    stale.mkdir(parents=True)
    (stale / ".model.gguf.99999.tmp").write_bytes(b"x" * 1000)
    with _cache(tmp_path, store, max_bytes=4 << 20).use(sha, "model.gguf", "file"):
        pass
    assert not stale.exists()


def test_a_store_that_is_down_is_retried_then_one_line(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store", down_calls=100)
    sha = DirStore(tmp_path / "store").add(b"weights")
    with pytest.raises(StoreUnavailable, match="3 tries") as exc:
        with _cache(tmp_path, store).use(sha, "model.gguf", "file"):
            pass
    assert "\n" not in str(exc.value) and store.url in str(exc.value)
    assert store.calls == 3
    assert not (tmp_path / "cache" / sha).exists()


def test_a_store_back_within_the_retries_serves_the_model(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store", down_calls=2)
    sha = store.add(b"weights")
    with _cache(tmp_path, store).use(sha, "model.gguf", "file") as path:
        assert path.read_bytes() == b"weights"


def test_a_corrupt_blob_in_the_store_is_an_artifact_error_and_nothing_is_published(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    sha = store.add(b"weights" * 1000)
    (store.root / sha).write_bytes(b"Weights" * 1000)
    with pytest.raises(ArtifactError, match="submit the model again") as exc:
        with _cache(tmp_path, store).use(sha, "model.gguf", "file"):
            pass
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "cache" / sha).exists()


def test_a_manifest_that_escapes_its_folder_is_refused(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    evil = ManifestEntry(path="../../outside", sha256=store.add(b"x"), size=1)
    sha = store.add(Manifest(files=(evil,)).canonical())
    with pytest.raises(ArtifactError, match="unsafe path"):
        with _cache(tmp_path, store).use(sha, "m", "folder"):
            pass
    assert not (tmp_path / "outside").exists() and not (tmp_path / "cache" / sha).exists()


@pytest.mark.parametrize(("sha", "filename"), [("abc", "m.onnx"), ("a" * 64, "../m.onnx"), ("a" * 64, ".hidden")])
def test_a_bad_id_or_name_is_refused(tmp_path: Path, sha: str, filename: str) -> None:
    with pytest.raises(ArtifactError):
        with _cache(tmp_path, DirStore(tmp_path / "store")).use(sha, filename, "file"):
            pass


def test_the_hosts_cache_takes_its_place_and_budget_from_the_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_CACHE_MAX_BYTES", str(5 << 30))
    reset_settings()
    cache = ModelCache.from_settings(DirStore(tmp_path / "store"))
    assert (cache.root, cache.max_bytes) == (get_settings().home / "artifacts", 5 << 30)


def _pin_until_released(cache_root: Path, store_root: Path, sha: str, flag: Path) -> None:
    """Pin model ``sha`` (in this process) until ``flag``/release exists; ``flag``/pinned says when it holds it."""
    with ModelCache(cache_root, DirStore(store_root), None).use(sha, "a.onnx", "file"):
        (flag / "pinned").touch()
        while not (flag / "release").exists():
            time.sleep(0.01)


def test_a_model_pinned_by_another_process_is_never_evicted(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    size = 1 << 20
    a, b = store.add(os.urandom(size)), store.add(os.urandom(size))
    cache = _cache(tmp_path, store, max_bytes=int(1.5 * size))
    flag = tmp_path / "flag"
    flag.mkdir()
    job = mp.get_context("spawn").Process(target=_pin_until_released, args=(cache.root, store.root, a, flag))
    job.start()
    try:
        deadline = time.monotonic() + 60
        while not (flag / "pinned").exists():
            assert time.monotonic() < deadline and job.is_alive(), "the job never pinned its model"
            time.sleep(0.01)
        with pytest.raises(ArtifactError, match="running jobs use"):
            with cache.use(b, "b.onnx", "file"):
                pass
        assert (cache.root / a / "a.onnx").read_bytes() == (store.root / a).read_bytes()
    finally:
        (flag / "release").touch()
        job.join(timeout=60)
    assert job.exitcode == 0
    with cache.use(b, "b.onnx", "file"):  # the job is over: its model may go
        pass
    assert not (cache.root / a).exists()


def test_threads_of_one_process_share_one_download(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store", delay_s=0.005)
    sha = store.add_folder(FOLDER)
    cache = _cache(tmp_path, store)

    def job(_: int) -> dict[str, str]:
        with cache.use(sha, "m", "folder") as path:
            return _tree(path)

    with ThreadPoolExecutor(4) as pool:
        trees = list(pool.map(job, range(4)))
    assert trees == [_expected_tree()] * 4
    assert len(store.gets()) == 1 + len(FOLDER)


def test_the_same_bytes_under_another_name_are_renamed_not_fetched(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    store, cache, sha, path = _published(tmp_path, data, "a.onnx")
    with cache.use(sha, "b.onnx", "file") as other:
        assert other == path.with_name("b.onnx") and other.read_bytes() == data
    assert not path.exists() and store.gets() == [sha]


def test_an_unmarked_copy_from_before_the_cache_is_fetched_again(tmp_path: Path) -> None:
    store = DirStore(tmp_path / "store")
    data = os.urandom(1 << 20)
    sha = store.add(data)
    old = tmp_path / "cache" / sha / "model.onnx"  # what fetch_model wrote before: no marker, never re-verified
    old.parent.mkdir(parents=True)
    old.write_bytes(data[:-1] + b"\0")
    with _cache(tmp_path, store).use(sha, "model.onnx", "file") as path:
        assert path == old and path.read_bytes() == data
    assert store.gets() == [sha]
