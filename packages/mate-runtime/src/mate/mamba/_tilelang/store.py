"""MATE's on-disk cache of compiled kernels (``MATE_CACHE_DIR``; docs/startup.md).

One entry per (kernel spec, the versions that change its code, target architecture): the compiled host+device
library TileLang built (``executable.so``, the cubin embedded), the kernel's parameter records, the kernel's
signature (its ``T.prim_func`` without a body: what TileLang's launcher reads, a few KB) and the generated
sources, with a manifest of every file's size and sha256. Loading an entry builds nothing: no factory call, no
lowering, no nvcc (0.01-0.03 s per kernel on a 2-core CPU against 0.1-0.5 s from TileLang's own disk cache, which
builds the ``T.prim_func`` again to hash it; measured 2026-12-02 at 3b537ab).

Layout (``v1`` is the entry format)::

    $MATE_CACHE_DIR/v1/<factory>-<digest[:32]>/   manifest.json, executable.so, params.json, func.json, *.cu
    $MATE_CACHE_DIR/v1/.staging/                  entries being written (renamed into place when complete)
    $MATE_CACHE_DIR/v1/.locks/                    one lock file per entry (writers only)

Writers take the entry's lock (``fcntl.flock``), so two processes first-calling one spec compile it once: the
second waits and then loads the first one's entry. An entry is written into ``.staging`` and renamed into place
complete, so a reader never sees half an entry and readers take no lock. A corrupt entry (a file whose checksum
differs from the manifest's) or a mismatched one (a manifest naming another key) is reported once per process
with a warning, never loaded, and rebuilt. A read-only cache directory (an image's) still loads; a miss there
compiles in memory and warns once that it cannot store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import os
import shutil
import tarfile
import time
import uuid
import warnings

from mate.mamba._tilelang.tl_internals import kernel_files, load_kernel, result_indices

FORMAT = "mate-kernel-cache-v1"
LAYOUT = "v1"
MANIFEST = "manifest.json"
LIBRARY = "executable.so"
PARAMS = "params.json"
FUNC = "func.json"
DEVICE_SOURCE = "device_kernel.cu"
HOST_SOURCE = "host_kernel.cu"
FILES = (LIBRARY, PARAMS, FUNC, DEVICE_SOURCE, HOST_SOURCE)
EXECUTION_BACKEND = "tvm_ffi"


class CacheWarning(RuntimeWarning):
    """An entry of MATE's kernel cache was corrupt, mismatched or could not be written."""


_warned: set = set()


def warn_once(what: str, message: str) -> None:
    """Warn about ``what`` once per process (a corrupt entry is reported once, then rebuilt)."""
    if what in _warned:
        return
    _warned.add(what)
    warnings.warn(message, CacheWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------------ the key


def target_arch(target) -> str | None:
    """The architecture a TileLang target compiles for (``{"kind": "cuda", "arch": "sm_90a"}`` -> ``cuda:sm_90a``);
    None where the target does not name one ("auto"): such a kernel is not stored."""
    if isinstance(target, dict):
        kind, arch = target.get("kind"), target.get("arch")
        return f"{kind}:{arch}" if kind and arch else None
    if isinstance(target, str) and target.startswith("musa"):
        return target
    return None


@functools.cache
def _kernels_source_digest() -> str:
    """sha256 of the kernel factories' source files: an edited checkout (same version string) is a new key."""
    import mate_kernels

    root = os.path.dirname(mate_kernels.__file__)
    h = hashlib.sha256()
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            h.update(name.encode())
            with open(os.path.join(root, name), "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


@functools.cache
def _toolkit_versions() -> dict:
    import tilelang
    from mate.mamba._platform.version import __version__

    try:
        from tilelang.contrib.nvcc import get_cuda_version

        cuda = ".".join(str(v) for v in get_cuda_version())
    except Exception:  # no CUDA toolkit here (a MUSA host, or none at all)
        cuda = "none"
    try:
        import mate_kernels

        kernels = getattr(mate_kernels, "__version__", None) or _dist_version("mate-kernels")
    except ImportError:
        kernels = "none"
    return {
        "mate": __version__,
        "mate_kernels": f"{kernels}+{_kernels_source_digest()}",
        "tilelang": str(getattr(tilelang, "__version__", "unknown")),
        "cuda": cuda,
    }


def _dist_version(dist: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def versions(target) -> dict:
    """The versions that change a compiled kernel: MATE, the kernel factories (version + source digest),
    TileLang, the CUDA toolkit (nvcc) and the target architecture."""
    return {**_toolkit_versions(), "arch": target_arch(target)}


def _plain(v):
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {str(getattr(k, "value", k)): _plain(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return repr(v)


def entry_key(spec, target, pass_configs) -> dict:
    """Everything that decides the compiled code of ``spec`` for ``target``, as plain JSON values."""
    return {
        "format": FORMAT,
        "family": spec.family,
        "factory": f"{spec.module}.{spec.factory}",
        "spec": str(spec),
        "fields": _plain(spec.kwargs()),
        "pass_configs": _plain(pass_configs or {}),
        "execution_backend": EXECUTION_BACKEND,
        "versions": versions(target),
    }


def digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ the store


@dataclasses.dataclass
class Entry:
    """One entry as ``mate-mamba cache list`` shows it."""

    path: str
    manifest: dict | None  # None: unreadable
    size: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


class Store:
    """The entries under one cache directory (``root``)."""

    def __init__(self, root: str):
        self.root = root
        self.base = os.path.join(root, LAYOUT)

    # paths
    def entry_path(self, key: dict) -> str:
        return os.path.join(self.base, f"{key['factory'].rsplit('.', 1)[-1]}-{digest(key)[:32]}")

    def _lock_path(self, entry: str) -> str:
        return os.path.join(self.base, ".locks", os.path.basename(entry) + ".lock")

    @contextlib.contextmanager
    def lock(self, entry: str):
        """The entry's writer lock (blocks while another process compiles it). Yields False where the directory
        cannot take a lock file (read-only): the caller then compiles without storing."""
        import fcntl

        try:
            os.makedirs(os.path.dirname(self._lock_path(entry)), exist_ok=True)
            fd = os.open(self._lock_path(entry), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield False
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # checking
    def check(self, entry: str, key: dict | None = None) -> str | None:
        """Why the entry at ``entry`` must not be loaded (None: it is sound). ``key``: the key it must have."""
        try:
            with open(os.path.join(entry, MANIFEST)) as f:
                manifest = json.load(f)
        except FileNotFoundError:
            return "missing manifest"
        except (OSError, ValueError) as exc:
            return f"unreadable manifest ({exc})"
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return f"manifest format {manifest.get('format') if isinstance(manifest, dict) else None!r}"
        if key is not None and (manifest.get("key") != key or manifest.get("digest") != digest(key)):
            return "manifest names another kernel or other versions"
        if key is None:  # (mate-mamba cache verify, import): the manifest must agree with itself and the directory name
            own = manifest.get("key")
            if not isinstance(own, dict) or manifest.get("digest") != digest(own):
                return "manifest names another kernel (its key and digest differ)"
            if os.path.basename(entry) != self._name_for(own):
                return "directory name does not match its key"
        files = manifest.get("files") or {}
        for name in FILES:
            meta = files.get(name)
            path = os.path.join(entry, name)
            if not isinstance(meta, dict):
                return f"{name} not in the manifest"
            try:
                if os.path.getsize(path) != meta.get("size") or _sha256(path) != meta.get("sha256"):
                    return f"{name} does not match its checksum"
            except OSError:
                return f"{name} missing"
        return None

    # loading
    def load(self, spec, target, pass_configs):
        """(kernel, entry path) when a sound entry is there; (None, path) on a miss; a corrupt or mismatched
        entry warns once and is a miss (the caller rebuilds it)."""
        key = entry_key(spec, target, pass_configs)
        entry = self.entry_path(key)
        if not os.path.isdir(entry):
            return None, entry
        problem = self.check(entry, key)
        if problem is None:
            try:
                return self._load(entry, key, target), entry
            except Exception as exc:  # a library that does not load (another platform's, truncated)
                problem = f"does not load ({type(exc).__name__}: {exc})"
        warn_once(
            entry,
            f"MATE kernel cache: the entry {entry} for {spec} is not loaded ({problem}); compiling it again",
        )
        return None, entry

    def _load(self, entry: str, key: dict, target):
        with open(os.path.join(entry, FUNC)) as f:
            signature = f.read()
        with open(os.path.join(entry, PARAMS)) as f:
            params = f.read()
        with open(os.path.join(entry, MANIFEST)) as f:
            out_idx = json.load(f).get("out_idx") or None
        return load_kernel(
            signature_json=signature, params_json=params, host_source=os.path.join(entry, HOST_SOURCE),
            device_source=os.path.join(entry, DEVICE_SOURCE), library=os.path.join(entry, LIBRARY), target=target,
            out_idx=out_idx, execution_backend=EXECUTION_BACKEND, pass_configs=key["pass_configs"] or None,
        )  # fmt: skip

    # writing
    def save(self, spec, target, pass_configs, kernel, *, seconds: float | None = None) -> str:
        """Write ``kernel``'s entry (the caller holds the entry's lock): staged, then renamed into place."""
        key = entry_key(spec, target, pass_configs)
        entry = self.entry_path(key)
        out_idx = result_indices(kernel)
        return self.publish(entry, key, lambda d: write_kernel_files(kernel, d), seconds=seconds, out_idx=out_idx)

    def publish(self, entry: str, key: dict, write_files, *, seconds=None, out_idx=None) -> str:
        """Stage an entry (``write_files(dir)`` writes :data:`FILES`), add its manifest, rename it into place."""
        staging_root = os.path.join(self.base, ".staging")
        os.makedirs(staging_root, exist_ok=True)
        staging = os.path.join(staging_root, f"{os.path.basename(entry)}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        os.mkdir(staging)
        try:
            write_files(staging)
            files = {}
            for name in FILES:
                path = os.path.join(staging, name)
                files[name] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
            manifest = {"format": FORMAT, "digest": digest(key), "key": key, "files": files, "created": time.time(),
                        "compile_seconds": seconds, "out_idx": out_idx or []}  # fmt: skip
            with open(os.path.join(staging, MANIFEST), "w") as f:
                json.dump(manifest, f, indent=1, sort_keys=True)
            for name in (*FILES, MANIFEST):
                with open(os.path.join(staging, name), "rb+") as f:
                    os.fsync(f.fileno())
            if os.path.isdir(entry):  # a corrupt entry being replaced: move it aside first
                trash = os.path.join(staging_root, f"old.{os.path.basename(entry)}.{uuid.uuid4().hex[:8]}")
                with contextlib.suppress(FileNotFoundError):
                    os.rename(entry, trash)
                    shutil.rmtree(trash, ignore_errors=True)
            try:
                os.rename(staging, entry)
            except OSError as exc:  # another writer (without the lock: a lock-less filesystem) won the race
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return entry

    # the CLI's views
    def entries(self) -> list[Entry]:
        if not os.path.isdir(self.base):
            return []
        out = []
        for name in sorted(os.listdir(self.base)):
            path = os.path.join(self.base, name)
            if name.startswith(".") or not os.path.isdir(path):
                continue
            try:
                with open(os.path.join(path, MANIFEST)) as f:
                    manifest = json.load(f)
            except (OSError, ValueError):
                manifest = None
            size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
            out.append(Entry(path, manifest if isinstance(manifest, dict) else None, size))
        return out

    def verify(self) -> list[tuple[Entry, str | None]]:
        """Every entry with what is wrong with it (None: sound); the key is checked against the manifest's own."""
        return [(e, self.check(e.path)) for e in self.entries()]

    def _name_for(self, key: dict) -> str:
        return os.path.basename(self.entry_path(key))

    def clear(self) -> int:
        """Remove every entry (and the staging area); returns how many entries were removed."""
        n = len(self.entries())
        if os.path.isdir(self.base):
            trash = f"{self.base}.removing.{uuid.uuid4().hex[:8]}"
            os.rename(self.base, trash)
            shutil.rmtree(trash, ignore_errors=True)
        return n

    def export(self, path: str) -> int:
        """Write every sound entry into the tar file ``path`` (gzip when it ends in .gz / .tgz)."""
        mode = "w:gz" if path.endswith((".gz", ".tgz")) else "w"
        n = 0
        with tarfile.open(path, mode) as tar:
            for e, problem in self.verify():
                if problem is None:
                    tar.add(e.path, arcname=os.path.join(LAYOUT, e.name))
                    n += 1
        return n

    def import_(self, path: str) -> tuple[int, int]:
        """Add the entries of a tar file written by :meth:`export`: (added, skipped). Each is checked before it
        is published; an entry already here is kept."""
        added = skipped = 0
        staging_root = os.path.join(self.base, ".staging")
        os.makedirs(staging_root, exist_ok=True)
        unpack = os.path.join(staging_root, f"import.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        os.mkdir(unpack)
        try:
            with tarfile.open(path) as tar:
                members = [m for m in tar.getmembers() if _safe_member(m)]
                tar.extractall(unpack, members=members, filter="data")
            src_base = os.path.join(unpack, LAYOUT)
            for name in sorted(os.listdir(src_base)) if os.path.isdir(src_base) else []:
                src = os.path.join(src_base, name)
                problem = self.check(src)
                dest = os.path.join(self.base, name)
                if problem is not None:
                    warn_once(f"import:{name}", f"MATE kernel cache import: {name} skipped ({problem})")
                    skipped += 1
                    continue
                key = _manifest(src)["key"]
                with self.lock(dest):
                    if self.check(dest, key) is None:
                        skipped += 1
                        continue
                    self.publish(dest, key, lambda d, src=src: _copy_files(src, d),
                                 seconds=None, out_idx=_manifest(src).get("out_idx"))  # fmt: skip
                    added += 1
        finally:
            shutil.rmtree(unpack, ignore_errors=True)
        return added, skipped


def _manifest(entry: str) -> dict:
    with open(os.path.join(entry, MANIFEST)) as f:
        return json.load(f)


def _safe_member(m: tarfile.TarInfo) -> bool:
    parts = m.name.split("/")
    return (m.isfile() or m.isdir()) and not os.path.isabs(m.name) and ".." not in parts and parts[0] == LAYOUT


def _copy_files(src: str, dest: str) -> None:
    for name in FILES:
        shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))


def write_kernel_files(kernel, d: str) -> None:
    """The files of an entry, from a kernel TileLang just compiled: its library (copied from TileLang's own
    cache entry when there is one, else exported), parameters, bodiless signature and sources."""
    files = kernel_files(kernel)
    lib = os.path.join(d, LIBRARY)
    tl_entry = files["tilelang_entry"]
    tl_lib = os.path.join(tl_entry, LIBRARY) if tl_entry else None
    if tl_lib and os.path.isfile(tl_lib):
        shutil.copyfile(tl_lib, lib)
    else:
        files["library"](lib)
    for name, key in ((PARAMS, "params"), (FUNC, "signature"), (DEVICE_SOURCE, "device_source"),
                      (HOST_SOURCE, "host_source")):  # fmt: skip
        with open(os.path.join(d, name), "w") as f:
            f.write(files[key])


def store() -> Store | None:
    """The store under ``MATE_CACHE_DIR`` (None when it is ``off``)."""
    from mate.mamba._platform import settings

    root = settings.get("MATE_CACHE_DIR")
    return Store(root) if root else None


__all__ = ["CacheWarning", "Entry", "Store", "entry_key", "digest", "store", "target_arch", "versions",
           "write_kernel_files"]  # fmt: skip
