"""A worker's cache of models fetched from the model store: it cannot serve a wrong model.

``ModelCache(root, store, max_bytes).use(sha256, filename, layout)`` yields the local path of a verified copy,
``<root>/<sha256>/<filename>`` (a file, or a folder materialised file by file from its manifest's blobs), and
holds a *pin* (a shared lock, ``farm.store.locks``) on it for the body, so eviction never removes a model a
running job uses. Concurrent jobs of one model on one host share one copy and one download: one takes the
model's exclusive lock and fetches, the others wait on the lock, then find the copy.

Publishing is atomic: a fetch writes a temporary name in the entry's own directory, hashes while streaming
(``farm.store.fetch``: constant memory), fsyncs, renames it into place, then writes the entry's *marker*
(``.farm-verified.json``: every file's path, sha256, size, and the inode, mtime and ctime it had once verified).
No marker, no use: a fetch killed midway (even by SIGKILL) leaves a temporary file without a marker, which the
next fetch of that model (or the budget's scan) removes.

What re-verification costs per use: one ``lstat`` per file of the entry (and a walk of a folder, so an added or
removed file counts) compared with the marker; the full sha256 only at publish and when any of size, inode, mtime
or ctime changed (a truncated file, a flipped byte, anything written after publish changes them: ctime cannot be
set back). An entry that fails its re-hash is fetched again, never served. Not caught per use: a change that
keeps all four, i.e. a write within the file system's timestamp tick after publish, or a raw write to the disk.

The size budget (``max_bytes``: ``FARM_CACHE_MAX_BYTES``; None = no budget, only the disk's free space) counts
published entries and fetches in flight; a fetch that would pass it evicts the least recently used entries that
no job pins (last use is the marker's mtime, touched at each use), or fails with a one-line error.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from farm.errors import ArtifactError
from farm.settings import get_settings
from farm.store.base import BlobStore, Manifest, ManifestEntry
from farm.store.fetch import Retry, blob_size, copy_blob, hash_file, read_manifest
from farm.store.locks import DigestLock

Layout = Literal["file", "folder"]
SHA_RE = re.compile(r"^[0-9a-f]{64}$")
MARKER = ".farm-verified.json"
RESERVED = ".farm-fetching"  # a fetch in flight: the bytes it will take (the budget counts them)
LOCKS = ".locks"
SELF = "."  # the path a file model's one entry has in its marker
GiB = 1 << 30


class FileStat(BaseModel):
    """One verified file of an entry: its path inside the model ("." for a file model), sha256, size (bytes), and
    what ``lstat`` said of it once verified (inode, mtime and ctime in ns)."""

    path: str
    sha256: str
    size: int
    ino: int
    mtime_ns: int
    ctime_ns: int

    def unchanged(self, st: os.stat_result) -> bool:
        """Whether ``st`` is the file as verified."""
        return (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns) == (
            self.size, self.ino, self.mtime_ns, self.ctime_ns)


class Marker(BaseModel):
    """A published entry: model ``sha256`` as ``filename`` (a file or a folder), ``size`` bytes, its files."""

    sha256: str
    filename: str
    layout: Layout
    size: int
    files: list[FileStat]


class ModelCache:
    """Verified local copies of stored models under ``root``, at most ``max_bytes`` of them (None: no budget)."""

    def __init__(self, root: Path, store: BlobStore, max_bytes: int | None = None, *, retry: Retry | None = None,
                 wait_s: float = 3600.0) -> None:
        self.root = root
        self.store = store
        self.max_bytes = max_bytes
        self.retry = retry or Retry()
        self.wait_s = wait_s  # how long a job waits for another's fetch of the same model (s)

    @classmethod
    def from_settings(cls, store: BlobStore) -> ModelCache:
        """This host's cache (``FARM_HOME/artifacts``, budget ``FARM_CACHE_MAX_BYTES``) of ``store``'s models."""
        settings = get_settings()
        return cls(settings.cache_dir, store, settings.cache_max_bytes)

    @contextmanager
    def use(self, sha256: str, filename: str, layout: Layout) -> Iterator[Path]:
        """The verified local copy of model ``sha256``, pinned (never evicted) until the block ends."""
        _check(sha256, filename, layout)
        with DigestLock(self._lock_path(sha256), self.wait_s) as lock:
            yield self._pinned(lock, sha256, filename, layout)

    def _pinned(self, lock: DigestLock, sha: str, filename: str, layout: Layout) -> Path:
        """Take the pin on an intact entry, making it intact first (under the exclusive lock) if it is not."""
        for _ in range(3):
            lock.shared()
            if self._intact(sha, filename, layout):
                os.utime(self._entry(sha) / MARKER)  # last use, for the LRU
                return self._entry(sha) / filename
            lock.exclusive()
            self._make_valid(sha, filename, layout)
        raise ArtifactError(f"model {sha[:12]}'s cached copy under {self.root} kept changing while being verified; "
                            "look for another process writing there, then retry the job")

    def _make_valid(self, sha: str, filename: str, layout: Layout) -> None:
        """Under the exclusive lock: keep an entry that is intact, or whose files re-hash to their digests (only
        their timestamps changed, e.g. restored from a backup); fetch it again otherwise."""
        marker = self._marker(sha)
        if marker is not None and marker.layout == layout:
            model = self._entry(sha) / marker.filename
            if self._stats_match(model, marker) or self._rehashes(model, marker):
                if marker.filename != filename:  # the same bytes, asked for under another name
                    os.rename(model, self._entry(sha) / filename)
                self._record(sha, filename, layout, marker.files)
                return
        self._fetch(sha, filename, layout)

    def _fetch(self, sha: str, filename: str, layout: Layout) -> None:
        """Under the exclusive lock: download model ``sha`` into a temporary name, verify, rename, mark."""
        entry = self._entry(sha)
        shutil.rmtree(entry, ignore_errors=True)  # a bad copy, a dead fetcher's temporary files: nobody else's
        entry.mkdir(parents=True)
        tmp = entry / f".{filename}.{os.getpid()}.tmp"
        try:
            if layout == "file":
                size = self.retry.call(self.store, f"model {sha[:12]}", lambda: blob_size(self.store, sha))
                self._reserve(sha, size)
                self.retry.call(self.store, f"model {sha[:12]}", lambda: copy_blob(self.store, sha, tmp, size))
                files = [ManifestEntry(path=SELF, sha256=sha, size=size)]
            else:
                manifest = self.retry.call(self.store, f"model {sha[:12]}", lambda: read_manifest(self.store, sha))
                self._reserve(sha, manifest.size)
                self._copy_folder(manifest, tmp)
                files = list(manifest.files)
            os.chmod(tmp, 0o444 if layout == "file" else 0o755)  # containers read models through read-only mounts
            os.rename(tmp, entry / filename)
            _fsync_dir(entry)
            self._record(sha, filename, layout, files)
            (entry / RESERVED).unlink()
        except BaseException:
            shutil.rmtree(entry, ignore_errors=True)  # nothing published: no marker, no bytes
            raise

    def _copy_folder(self, manifest: Manifest, tmp: Path) -> None:
        """Every file of ``manifest`` fetched and verified under the folder ``tmp``, files as files."""
        tmp.mkdir()
        dirs = {tmp}
        for f in manifest.files:
            dest = tmp / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dirs.add(dest.parent)
            self.retry.call(self.store, f"{f.path} of model {manifest.digest()[:12]}",
                            lambda f=f, dest=dest: copy_blob(self.store, f.sha256, dest, f.size))  # type: ignore[misc]
            os.chmod(dest, 0o444)
        for d in dirs:
            os.chmod(d, 0o755)  # whatever the umask: containers read the folder as another user
            _fsync_dir(d)

    def _reserve(self, sha: str, size: int) -> None:
        """Make room for ``size`` more bytes (evicting unpinned entries, least recently used first) and count
        them as a fetch in flight; a one-line error when the budget or the disk cannot hold them."""
        if self.max_bytes is not None and size > self.max_bytes:
            raise ArtifactError(f"model {sha[:12]} is {size / GiB:.2f} GiB, more than this worker's model cache "
                                f"budget FARM_CACHE_MAX_BYTES={self.max_bytes} ({self.max_bytes / GiB:.2f} GiB); "
                                "raise it, or run the request on a worker with room for it")
        with DigestLock(self.root / LOCKS / "budget.lock", self.wait_s) as budget:
            budget.exclusive()
            if self.max_bytes is not None:
                self._make_room(sha, size, self.max_bytes)
            free = shutil.disk_usage(self.root).free
            if size > free:
                raise ArtifactError(f"model {sha[:12]} needs {size / GiB:.2f} GiB and {self.root} has "
                                    f"{free / GiB:.2f} GiB free; free disk space, or set FARM_CACHE_MAX_BYTES so "
                                    "the cache evicts older models")
            (self._entry(sha) / RESERVED).write_text(str(size))

    def _make_room(self, sha: str, size: int, budget: int) -> None:
        """Evict unpinned published entries, least recently used first, until ``size`` more bytes fit."""
        entries = self._census(sha)
        used = sum(size for _, size, _ in entries)
        for _, victim_size, victim in sorted(e for e in entries if e[2] is not None):
            if used + size <= budget:
                break
            if victim is not None and self._evict(victim):
                used -= victim_size
        if used + size > budget:
            raise ArtifactError(f"model {sha[:12]} ({size / GiB:.2f} GiB) does not fit the model cache's budget "
                                f"({budget / GiB:.2f} GiB) beside the {used / GiB:.2f} GiB that running jobs use; "
                                "retry when they finish, or raise FARM_CACHE_MAX_BYTES")

    def _census(self, sha: str) -> list[tuple[float, int, str | None]]:
        """The other entries as (last use, bytes, sha256 if published else None); stale leftovers (temporary
        files of dead fetchers, entries without a marker nobody holds) are removed on the way."""
        found: list[tuple[float, int, str | None]] = []
        for entry in self.root.iterdir():
            if entry.name == sha or not SHA_RE.match(entry.name):
                continue
            marker = self._marker(entry.name)
            if marker is not None:
                try:
                    found.append(((entry / MARKER).stat().st_mtime, marker.size, entry.name))
                except FileNotFoundError:  # being fetched again (a bad copy) by its own exclusive holder
                    found.append((0.0, marker.size, None))
                continue
            with DigestLock(self._lock_path(entry.name), self.wait_s) as lock:
                if lock.try_exclusive():  # no marker and nobody fetching: leftovers of a dead process
                    shutil.rmtree(entry, ignore_errors=True)
                    lock.unlink()
                else:
                    found.append((0.0, _reserved_bytes(entry), None))
        return found

    def _evict(self, sha: str) -> bool:
        """Remove entry ``sha`` unless a job pins it (or fetches it); whether it was removed."""
        with DigestLock(self._lock_path(sha), self.wait_s) as lock:
            if not lock.try_exclusive():
                return False
            (self._entry(sha) / MARKER).unlink(missing_ok=True)  # unpublished first: a half-removed entry is junk
            shutil.rmtree(self._entry(sha), ignore_errors=True)
            lock.unlink()
            return True

    def _intact(self, sha: str, filename: str, layout: Layout) -> bool:
        """The per-use check: a marker for this name and layout, and every file as it was verified."""
        marker = self._marker(sha)
        return (marker is not None and marker.filename == filename and marker.layout == layout
                and self._stats_match(self._entry(sha) / filename, marker))

    def _stats_match(self, model: Path, marker: Marker) -> bool:
        """Whether the files under ``model`` are exactly the marker's, each unchanged since verified."""
        current = _regular_files(model, marker.layout)
        if current is None or current.keys() != {f.path for f in marker.files}:
            return False
        return all(f.unchanged(current[f.path]) for f in marker.files)

    def _rehashes(self, model: Path, marker: Marker) -> bool:
        """The full check: the marker's files are the model's (their manifest's digest is the model's id) and
        each file on disk hashes to its digest."""
        entries = [ManifestEntry(path=f.path, sha256=f.sha256, size=f.size) for f in marker.files]
        if marker.layout == "file":
            listed = len(entries) == 1 and entries[0].sha256 == marker.sha256 and entries[0].path == SELF
        else:
            listed = Manifest(files=tuple(entries)).digest() == marker.sha256
        current = _regular_files(model, marker.layout)
        if not listed or current is None or current.keys() != {e.path for e in entries}:
            return False
        return all(current[e.path].st_size == e.size and hash_file(_file(model, e.path)) == e.sha256
                   for e in entries)

    def _record(self, sha: str, filename: str, layout: Layout, files: list[ManifestEntry] | list[FileStat]) -> None:
        """Write the entry's marker (atomically: temporary name, fsync, rename) from its files as they are now."""
        model = self._entry(sha) / filename
        stats = []
        for f in files:
            st = os.lstat(_file(model, f.path))
            stats.append(FileStat(path=f.path, sha256=f.sha256, size=f.size, ino=st.st_ino, mtime_ns=st.st_mtime_ns,
                                  ctime_ns=st.st_ctime_ns))
        marker = Marker(sha256=sha, filename=filename, layout=layout, size=sum(f.size for f in files), files=stats)
        tmp = self._entry(sha) / f".{MARKER}.{os.getpid()}.tmp"
        with open(tmp, "w") as out:
            out.write(marker.model_dump_json())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self._entry(sha) / MARKER)
        _fsync_dir(self._entry(sha))

    def _marker(self, sha: str) -> Marker | None:
        """Entry ``sha``'s marker; None when absent or unreadable (an unpublished entry)."""
        try:
            marker = Marker.model_validate_json((self._entry(sha) / MARKER).read_bytes())
        except (OSError, ValidationError):
            return None
        return marker if marker.sha256 == sha else None

    def _entry(self, sha: str) -> Path:
        return self.root / sha

    def _lock_path(self, sha: str) -> Path:
        return self.root / LOCKS / f"{sha}.lock"


def _check(sha: str, filename: str, layout: str) -> None:
    """Refuse a digest that is not a sha256, a name that is not a plain file name, an unknown layout."""
    if not SHA_RE.match(sha):
        raise ArtifactError(f"{sha!r} is not a sha256 model id")
    if not filename or filename != Path(filename).name or filename.startswith(".") or len(filename) > 200:
        raise ArtifactError(f"{filename!r} is not a plain file name to cache a model under")
    if layout not in ("file", "folder"):
        raise ArtifactError(f"unknown model layout {layout!r}: file or folder")


def _file(model: Path, rel: str) -> Path:
    return model if rel == SELF else model / rel


def _regular_files(model: Path, layout: Layout) -> dict[str, os.stat_result] | None:
    """Every file of the model, by its path inside it ("." for a file model), with its ``lstat``; None when the
    model is missing or holds anything but regular files and folders (a link would lead outside the cache)."""
    try:
        top = os.lstat(model)
    except FileNotFoundError:
        return None
    if layout == "file":
        return {SELF: top} if _is_regular(top) else None
    files: dict[str, os.stat_result] = {}
    for d, subdirs, names in os.walk(model):
        for name in names + [s for s in subdirs if os.path.islink(os.path.join(d, s))]:
            st = os.lstat(os.path.join(d, name))
            if not _is_regular(st):
                return None
            files[Path(os.path.relpath(os.path.join(d, name), model)).as_posix()] = st
    return files


def _is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


def _reserved_bytes(entry: Path) -> int:
    """The bytes a fetch in flight announced for ``entry`` (0 when not yet announced)."""
    try:
        return int((entry / RESERVED).read_text())
    except (OSError, ValueError):
        return 0


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
