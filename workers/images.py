"""farm's runtime image, built locally without a registry or a base image.

``build_local_image()`` assembles a root filesystem from the *host's* Python (interpreter, standard
library minus tests/tk/idle, the site-packages distributions farm's worker code needs), the shared
libraries all of that links to (found with ``ldd``: glibc, libstdc++, libgcc_s, libz, libssl, ...) and
farm's own packages ``schemas``, ``farm`` and ``workers``, streams it into one tar and ``docker import``s
it. Nothing is pulled, so it works in air-gapped labs, on CI and in tests; the real-cluster image is
``docker/Dockerfile`` (``FROM python:3.11-slim``).

Layout inside the image: ``/usr/local/bin/python3`` (``python``), ``/usr/local/lib/python3.11``,
``/usr/local/lib/libpython3.11.so.1.0``, host libraries at their host paths, farm's code under
``/opt/farm`` (on ``PYTHONPATH``), ``/model`` as the mount point for a model, ``/tmp`` world-writable,
user ``nobody`` (65534) in ``/etc/passwd``.

The build is cached by a content hash (file names, sizes and mtimes of everything copied from the
host Python, the full content of farm's code, and this builder's version) stored in the image label
``farm.content_hash``: a second build with nothing changed returns at once.

Usage::

    python -m workers.images                   # build (or reuse) farm-runtime:local from this checkout
    python -m workers.images --tag farm-runtime:ci --repo-root /path/to/checkout --force
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution, distributions
from pathlib import Path

import docker
from farm.errors import ContainerError
from workers.engines.backends import BACKENDS
from workers.runners.hardening import client as docker_client

# FARM_IMAGE_TAG: read once at import, so that several checkouts sharing one Docker daemon (worktrees, parallel CI
# jobs) each keep their own image instead of rebuilding one tag back and forth under each other's containers
DEFAULT_TAG = os.environ.get("FARM_IMAGE_TAG") or "farm-runtime:local"
BUILDER_VERSION = "1"
HASH_LABEL = "farm.content_hash"
FARM_PACKAGES: tuple[str, ...] = ("schemas", "farm", "workers")
IMAGE_PREFIX = "/usr/local"
IMAGE_CODE_DIR = "/opt/farm"

# The backends whose package is part of farm's base install go into the base image; the others' packages
# (declared by each backend: ``Backend.package``) only into its variant (``<tag>-<extra>``, extra_distributions).
_PACKAGES = [(b.__module__, b.package) for b in BACKENDS.values() if b.package is not None]
_BASE_PACKAGES = [(module, package) for module, package in _PACKAGES if package.extra is None]
_VARIANT_DISTRIBUTIONS = [d for _, package in _PACKAGES if package.extra is not None for d in package.distributions]
# Distributions always copied (plus their imports found by the probe below). onnx is not needed to *run* a model
# (its engine's package reads it), but the op-profiling pass reads the ONNX graphs with it to map ONNX Runtime's
# fused nodes back to the graph's names (``workers.profiling.collect``), in a served job's container and in an edge
# run alike: it comes along (about 55 MB with ml_dtypes) rather than a second, hand-written reader of ONNX's
# protobuf schema. threadpoolctl (small) sets the BLAS threads of the pass's measured CPU peak, and nvidia-ml-py
# (small) names a GPU for its datasheet peak (``farm.peaks``).
BASE_DISTRIBUTIONS: tuple[str, ...] = (
    "numpy", "grpcio", "protobuf", "tritonclient", "psutil", "onnx", "ml-dtypes", "threadpoolctl", "nvidia-ml-py",
    "pydantic", "pydantic-core", "pydantic-settings", "python-dotenv", "typing-extensions",
    "annotated-types", "typing-inspection", "packaging", "flatbuffers", "python-rapidjson",
    *(d for _, package in _BASE_PACKAGES for d in package.distributions),
)
# Modules imported in a probe process to discover what else the worker code pulls in at import time.
PROBE_MODULES: tuple[str, ...] = (
    "numpy", "grpc", "tritonclient.grpc", "psutil", "pydantic", "schemas",
    "farm.errors", "schemas.metrics", "workers.engines.server", "workers.engines.ready", "workers.edge_bench",
    "onnx", "threadpoolctl", "workers.profiling.run",
    *(m for backend, package in _BASE_PACKAGES for m in (package.module, backend)),
)
# Never copied unless asked for by name in ``extra_distributions`` (size, or host tooling only). "triton"
# is the GPU compiler PyTorch depends on.
EXCLUDED_DISTRIBUTIONS: frozenset[str] = frozenset({
    *_VARIANT_DISTRIBUTIONS, "torchvision", "triton", "setuptools", "pip", "wheel", "sympy", "mpmath", "docker",
    "celery", "sqlalchemy", "alembic", "psycopg2-binary", "redis", "kombu",
    "farm",  # farm's own code is copied from repo_root, never from an (editable) install
})
_STDLIB_SKIP: frozenset[str] = frozenset({
    "site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3",
    "pydoc_data", "__phello__",
})


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Entry:
    """One tar member: ``arc`` is the absolute path in the image; ``src`` the host file (None: dir)."""

    arc: str
    src: Path | None = None
    link: str | None = None  # symlink target
    data: bytes | None = None  # generated file content
    mode: int = 0o644
    mtime: float = 0.0


@dataclass
class RootFs:
    """The planned root filesystem: members keyed by image path, plus what the plan left out."""

    entries: dict[str, Entry] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    distributions: list[str] = field(default_factory=list)

    def add_dir(self, arc: str, mode: int = 0o755) -> None:
        arc = arc.rstrip("/") or "/"
        if arc == "/" or arc in self.entries:
            return
        self.add_dir(os.path.dirname(arc))
        self.entries[arc] = Entry(arc=arc, mode=mode)

    def add_file(self, src: Path, arc: str) -> None:
        self.add_dir(os.path.dirname(arc))
        st = src.stat()
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        self.entries[arc] = Entry(arc=arc, src=src, mode=mode, mtime=st.st_mtime)

    def add_data(self, arc: str, data: bytes, mode: int = 0o644, mtime: float = 0.0) -> None:
        self.add_dir(os.path.dirname(arc))
        self.entries[arc] = Entry(arc=arc, data=data, mode=mode, mtime=mtime)

    def add_host_path(self, path: str) -> None:
        """Copy a host file to the same path in the image, recreating each symlink on the way
        (``/lib -> usr/lib``, ``libz.so.1 -> libz.so.1.2.13``)."""
        parts = Path(path).parts[1:]
        cur = "/"
        for i, part in enumerate(parts):
            nxt = os.path.join(cur, part)
            if os.path.islink(nxt):
                target = os.readlink(nxt)
                self.add_dir(cur)
                self.entries.setdefault(nxt, Entry(arc=nxt, link=target, mode=0o777))
                resolved = os.path.normpath(os.path.join(cur, target))
                rest = os.path.join(resolved, *parts[i + 1:]) if i + 1 < len(parts) else resolved
                self.add_host_path(rest)
                return
            cur = nxt
        if os.path.isdir(cur):
            self.add_dir(cur)
        elif os.path.isfile(cur):
            self.add_file(Path(cur), cur)


def _probe_distributions(repo_root: Path, modules: Iterable[str]) -> tuple[set[str], list[str]]:
    """Import ``modules`` in a fresh interpreter; return the distributions they loaded and notes."""
    code = (
        "import importlib, json, sys\n"
        "from importlib.metadata import packages_distributions\n"
        "failed = {}\n"
        f"for m in {list(modules)!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except Exception as e:\n"
        "        failed[m] = f'{type(e).__name__}: {e}'\n"
        "pd = packages_distributions()\n"
        "dists = sorted({d for t in {n.split('.')[0] for n in sys.modules} for d in pd.get(t, [])})\n"
        "print(json.dumps({'dists': dists, 'failed': failed}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    out = subprocess.run([sys.executable, "-c", code], cwd=str(repo_root), env=env,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return set(), [f"import probe failed: {out.stderr.strip()[-300:]}"]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    notes = [f"probe could not import {m} ({err}); its dependencies may be missing"
             for m, err in data["failed"].items()]
    return {_norm(d) for d in data["dists"]}, notes


def requirement_closure(names: Iterable[str]) -> list[str]:
    """``names`` and every distribution they require, transitively, as installed in this Python (markers
    evaluated here, optional extras left out); a requirement not installed is left out (the image's build
    notes list it)."""
    from packaging.requirements import InvalidRequirement, Requirement  # noqa: PLC0415 - only variant builds

    seen: dict[str, None] = {}
    todo = [_norm(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen[name] = None
        try:
            requires = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for text in requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_norm(req.name))
    return sorted(seen)


def _elf_deps(paths: Iterable[Path]) -> set[str]:
    """Shared libraries (host paths) that ``paths`` need, via ``ldd`` (the loader included)."""
    libs: set[str] = set()
    batch: list[str] = [str(p) for p in paths]
    for i in range(0, len(batch), 64):
        out = subprocess.run(["ldd", *batch[i:i + 64]], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s+(/\S+)\s+\(0x", line)
            if m:
                libs.add(m.group(1))
    return libs


def _is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _site_dirs() -> list[Path]:
    """The host's site-packages / dist-packages directories, in ``sys.path`` order."""
    cands = [Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["platlib"])]
    try:
        cands += [Path(p) for p in site.getsitepackages()]
    except AttributeError:  # virtualenv's old site.py
        pass
    out: list[Path] = []
    for p in cands:
        if p.is_dir() and p.resolve() not in out:
            out.append(p.resolve())
    return out


def plan_rootfs(repo_root: Path, extra_distributions: Iterable[str] = ()) -> RootFs:
    """Decide every file of the image (no copying yet)."""
    fs = RootFs()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    lib_arc = f"{IMAGE_PREFIX}/lib/{pyver}"
    _add_interpreter(fs, stdlib, pyver)
    _add_stdlib(fs, stdlib, lib_arc)
    _add_distributions(fs, repo_root, extra_distributions, f"{lib_arc}/site-packages")
    _add_farm_code(fs, repo_root)
    _add_system_files(fs)
    return fs


def _add_interpreter(fs: RootFs, stdlib: Path, pyver: str) -> None:
    """The interpreter as ``bin/pythonX.Y`` (plus python3/python links) and libpython."""
    exe = Path(os.path.realpath(sys.executable))
    fs.add_file(exe, f"{IMAGE_PREFIX}/bin/{pyver}")
    for alias in ("python3", "python"):
        fs.entries[f"{IMAGE_PREFIX}/bin/{alias}"] = Entry(arc=f"{IMAGE_PREFIX}/bin/{alias}", link=pyver,
                                                           mode=0o777)
    libdir = Path(sysconfig.get_config_var("LIBDIR") or stdlib.parent)
    ldlib = sysconfig.get_config_var("INSTSONAME") or f"lib{pyver}.so.1.0"
    if (libdir / ldlib).exists():
        fs.add_file(libdir / ldlib, f"{IMAGE_PREFIX}/lib/{ldlib}")


def _add_stdlib(fs: RootFs, stdlib: Path, lib_arc: str) -> None:
    """The standard library, less the parts a server never imports (``_STDLIB_SKIP``, config-*)."""
    for root, dirs, files in os.walk(stdlib):
        rel = Path(root).relative_to(stdlib)
        if rel == Path("."):
            dirs[:] = [d for d in dirs if d not in _STDLIB_SKIP and not d.startswith("config-")]
        for f in files:
            fs.add_file(Path(root) / f, f"{lib_arc}/{rel / f}" if str(rel) != "." else f"{lib_arc}/{f}")
    fs.add_dir(f"{lib_arc}/site-packages")


def _add_distributions(fs: RootFs, repo_root: Path, extra_distributions: Iterable[str], site_arc: str) -> None:
    """site-packages: base + probed imports - excluded, each distribution copied whole from its RECORD."""
    probed, notes = _probe_distributions(repo_root, PROBE_MODULES)
    fs.notes.extend(notes)
    extra = {_norm(d) for d in extra_distributions}
    wanted = ({_norm(d) for d in BASE_DISTRIBUTIONS} | probed | extra) - (
        {_norm(d) for d in EXCLUDED_DISTRIBUTIONS} - extra)
    found: set[str] = set()
    for dist in distributions(path=[str(p) for p in _site_dirs()]):
        name = _norm(dist.metadata["Name"] or "")
        if name not in wanted or name in found:
            continue
        found.add(name)
        dist_root = Path(str(dist.locate_file(""))).resolve()
        for record in dist.files or []:
            src = Path(str(dist.locate_file(record))).resolve()
            try:
                rel = src.relative_to(dist_root)
            except ValueError:
                continue  # scripts in bin/ etc.
            if src.is_file() and not rel.name.startswith("__editable__"):
                fs.add_file(src, f"{site_arc}/{rel}")
    missing = sorted(wanted - found)
    if missing:
        fs.notes.append(f"distributions not installed on the host, left out: {', '.join(missing)}")
    fs.distributions = sorted(found)


def _add_farm_code(fs: RootFs, repo_root: Path) -> None:
    """farm's own code: .py and package data, no caches, read now (the checkout may change meanwhile)."""
    for pkg in FARM_PACKAGES:
        base = repo_root / pkg
        if not base.is_dir():
            raise ContainerError(f"{base} is missing; pass repo_root= the farm checkout (holding {pkg}/)")
        for root, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
            for f in files:
                if f.endswith((".pyc", ".pyo", ".tmp")) or f.startswith("."):
                    continue  # caches and editors' temporary files
                src = Path(root) / f
                try:  # read now: the checkout may change while the tar is written
                    fs.add_data(f"{IMAGE_CODE_DIR}/{src.relative_to(repo_root)}", src.read_bytes())
                except FileNotFoundError:
                    pass  # removed while we walked


def _add_system_files(fs: RootFs) -> None:
    """passwd/group/nsswitch for root and nobody, empty hosts files, /tmp and the mount points."""
    fs.add_data("/etc/passwd", b"root:x:0:0:root:/root:/bin/false\n"
                b"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    fs.add_data("/etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    fs.add_data("/etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files\n")
    for f in ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf"):
        fs.add_data(f, b"")
    fs.add_dir("/tmp", 0o1777)
    for d in ("/model", "/proc", "/sys", "/dev", "/root", "/opt/farm"):
        fs.add_dir(d)


def _add_libraries(fs: RootFs) -> None:
    """Add every shared library the ELF files of ``fs`` link to, at its host path."""
    elves = [e.src for e in fs.entries.values()
             if e.src is not None and (e.arc.endswith(".so") or ".so." in e.arc or "/bin/" in e.arc)
             and _is_elf(e.src)]
    for lib in sorted(_elf_deps(elves)):
        if lib.startswith(str(Path(sysconfig.get_paths()["stdlib"]).parent.parent) + "/") or any(
                lib.startswith(f"{d}/") for d in _site_dirs()):
            continue  # libpython / site-packages libs: already in the image at their new place
        fs.add_host_path(lib)


def content_hash(fs: RootFs) -> str:
    """sha256 over the plan: host files by (path, size, mtime), farm's code and generated files by
    content, plus the builder version."""
    h = hashlib.sha256(f"farm-image-{BUILDER_VERSION}\n".encode())
    for arc in sorted(fs.entries):
        e = fs.entries[arc]
        h.update(arc.encode() + b"\0")
        if e.link is not None:
            h.update(b"L" + e.link.encode())
        elif e.data is not None:
            h.update(b"D" + hashlib.sha256(e.data).digest())
        elif e.src is not None:
            st = e.src.stat()
            h.update(f"F{st.st_size}:{st.st_mtime_ns}:{e.mode:o}".encode())
        else:
            h.update(f"d{e.mode:o}".encode())
    return h.hexdigest()


def write_tar(fs: RootFs, out: Path) -> int:
    """Write the root filesystem to ``out`` (uncompressed tar, root-owned); returns its size in bytes."""
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        for arc in sorted(fs.entries):
            e = fs.entries[arc]
            ti = tarfile.TarInfo(arc.lstrip("/"))
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            ti.mode = e.mode
            ti.mtime = int(e.mtime) if e.mtime else 0
            if e.link is not None:
                ti.type = tarfile.SYMTYPE
                ti.linkname = e.link
                tar.addfile(ti)
            elif e.data is not None:
                ti.size = len(e.data)
                tar.addfile(ti, io.BytesIO(e.data))
            elif e.src is not None:
                ti.size = e.src.stat().st_size
                with open(e.src, "rb") as f:
                    tar.addfile(ti, f)
            else:
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
    return out.stat().st_size


def image_label(tag: str, label: str = HASH_LABEL, client: object | None = None) -> str | None:
    """The value of ``label`` on image ``tag``; None when the image or label is absent."""
    try:
        img = docker_client(client).images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    return (img.labels or {}).get(label)


def image_exists(tag: str = DEFAULT_TAG, client: object | None = None) -> bool:
    """True when the local Docker daemon has an image called ``tag``."""
    try:
        docker_client(client).images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_local_image(
    tag: str = DEFAULT_TAG,
    repo_root: Path | None = None,
    *,
    extra_distributions: Iterable[str] = (),
    force: bool = False,
    client: object | None = None,
    log: bool = False,
) -> str:
    """Build (or reuse) the runtime image ``tag`` from the host Python and ``repo_root``'s code.

    Returns the image id. Reuses the existing image when its ``farm.content_hash`` label matches the
    planned content (unless ``force``). ``extra_distributions`` adds host site-packages distributions
    by name (e.g. ``["torch"]``, a backend's ``package.distributions``). Raises ContainerError when Docker is missing or
    the import fails.
    """
    repo_root = Path(repo_root) if repo_root is not None else Path(__file__).resolve().parents[1]
    dc = docker_client(client)
    t0 = time.monotonic()
    fs = plan_rootfs(repo_root, extra_distributions)
    _add_libraries(fs)
    digest = content_hash(fs)
    if not force and image_label(tag, client=dc) == digest:
        return dc.images.get(tag).id
    env = [
        f"PATH={IMAGE_PREFIX}/bin:/usr/bin:/bin",
        f"LD_LIBRARY_PATH={IMAGE_PREFIX}/lib",
        # site-packages on PYTHONPATH too: a distro-patched site.py may only look in dist-packages
        f"PYTHONPATH={IMAGE_CODE_DIR}:{IMAGE_PREFIX}/lib/python{sys.version_info.major}.{sys.version_info.minor}"
        "/site-packages",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONUNBUFFERED=1",
        "LANG=C.UTF-8",
        "HOME=/tmp",
    ]
    changes = [f"ENV {e}" for e in env] + [
        f"WORKDIR {IMAGE_CODE_DIR}",
        f'LABEL {HASH_LABEL}="{digest}" farm.builder="workers.images/{BUILDER_VERSION}"',
        'CMD ["python3"]',
    ]
    try:
        old_id: str | None = dc.images.get(tag).id
    except Exception:
        old_id = None
    repo, _, version = tag.rpartition(":")
    if not repo or "/" in version:
        repo, version = tag, "latest"
    with tempfile.TemporaryDirectory(prefix="farm-image-") as tmp:
        tar_path = Path(tmp) / "rootfs.tar"
        size = write_tar(fs, tar_path)
        try:
            dc.api.import_image(src=str(tar_path), repository=repo, tag=version, changes=changes)
        except Exception as exc:
            raise ContainerError(f"docker import of {tag} failed: {exc}; check dockerd's log and disk space") from exc
    if image_label(tag, client=dc) != digest:
        raise ContainerError(f"docker import did not produce {tag} with label {HASH_LABEL}={digest[:12]}")
    new_id = dc.images.get(tag).id
    if old_id and old_id != new_id:
        try:  # the replaced build, now untagged; kept if a container still uses it
            dc.images.remove(old_id, noprune=False)
        except Exception:
            pass
    if log:
        print(f"built {tag}: {len(fs.entries)} entries, {size / 2**20:.0f} MiB tar, "
              f"{len(fs.distributions)} distributions, {time.monotonic() - t0:.1f} s", file=sys.stderr)
        for n in fs.notes:
            print(f"note: {n}", file=sys.stderr)
    return new_id


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workers.images", description=__doc__.splitlines()[0])
    p.add_argument("--tag", default=DEFAULT_TAG)
    p.add_argument("--repo-root", type=Path, default=None)
    p.add_argument("--extra", action="append", default=[], help="extra host distribution (repeatable)")
    p.add_argument("--force", action="store_true", help="rebuild even when the content hash matches")
    a = p.parse_args(argv)
    image_id = build_local_image(a.tag, a.repo_root, extra_distributions=a.extra, force=a.force, log=True)
    print(image_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
