"""Compiled-kernel cache: one compiled TileLang kernel object per kernel spec.

The kept kernel object is called directly (TileLang's eager-call path costs ~60 us more per call). A miss first
looks in MATE's disk cache (:mod:`.store`, ``MATE_CACHE_DIR``), which loads a kernel compiled by any earlier
process (or built ahead of time on a CPU machine) without building, lowering or compiling it; only then does it
compile (2-6 s for an SSU kernel, 15-70 s for the SSD scan) and store the result. A miss while the current stream
is capturing a graph raises instead of stalling the capture, naming the prewarm call that would have compiled the
kernel beforehand. ``KernelCache.log`` records every compile and every disk load, so tests and the startup
benchmark count them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch
from mate.mamba._platform.device import is_capturing, tilelang_target
from mate.mamba._tilelang.tl_internals import wrap_compile_stages


class KernelNotPrewarmedError(RuntimeError):
    """A kernel would have compiled inside a graph capture."""


@dataclass
class CompileRecord:
    """One kernel made ready: ``source`` "compile" (built and compiled here), "disk" (loaded from MATE's disk
    cache) or "tilelang-cache" (built here, then found in TileLang's disk cache: nothing lowered or compiled);
    ``phases`` the seconds per compile phase (:data:`PHASES`)."""

    key: Hashable
    seconds: float
    source: str = "compile"
    phases: dict = field(default_factory=dict)


@dataclass
class KernelCache:
    """Compiled kernels by kernel spec (:mod:`mate.mamba._tilelang.specs`); ``build()`` gives the ``T.prim_func``."""

    kernels: dict = field(default_factory=dict)
    log: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def compiles(self) -> int:
        return sum(r.source == "compile" for r in self.log)

    @property
    def disk_loads(self) -> int:
        return sum(r.source == "disk" for r in self.log)

    def get(
        self,
        key: Hashable,
        build: Callable[[], object],
        device: torch.device,
        *,
        prewarm_hint: str,
        pass_configs: dict | None = None,
        target=None,
    ):
        """The compiled kernel for ``key``; ``build()`` returns the ``T.prim_func`` to compile on a miss."""
        kern = self.kernels.get(key)
        if kern is not None:
            return kern
        if device is not None and is_capturing(device):
            raise KernelNotPrewarmedError(
                f"the TileLang kernel for {key} is not compiled and the current stream is capturing a graph; "
                f"compile it before capture with {prewarm_hint}"
            )
        with self.lock:
            kern = self.kernels.get(key)
            if kern is None:
                kern = self._obtain(key, build, target or tilelang_target(device), pass_configs)
        return kern

    def compile_only(self, key: Hashable, build: Callable[[], object], *, target, pass_configs=None):
        """Compile without a device (prewarm on a build machine, the CI compile check)."""
        with self.lock:
            kern = self.kernels.get(key)
            if kern is None:
                kern = self._obtain(key, build, target, pass_configs)
        return kern

    def _obtain(self, key, build, target, pass_configs):
        """Load ``key`` from MATE's disk cache, else compile it (under the entry's lock: another process compiling
        the same kernel is waited for and its entry loaded) and store it."""
        from mate.mamba._tilelang import store as store_mod

        st = store_mod.store() if _storable(key, target) else None
        if st is None:
            return self._compile(key, build, target, pass_configs)
        t0 = time.perf_counter()
        kern, entry = st.load(key, target, pass_configs)
        if kern is None:
            with st.lock(entry) as locked:
                kern, _ = st.load(key, target, pass_configs) if locked else (None, None)
                if kern is None:
                    kern = self._compile(key, build, target, pass_configs)
                    record = self.log[-1]
                    t1 = time.perf_counter()
                    try:
                        st.save(key, target, pass_configs, kern, seconds=record.seconds)
                    except OSError as exc:  # a read-only or full cache directory: serve from memory
                        store_mod.warn_once(
                            f"save:{st.root}",
                            f"MATE kernel cache: cannot write {st.root} ({exc}); compiled kernels are not kept",
                        )
                    record.phases["store"] = time.perf_counter() - t1
                    return kern
        self.kernels[key] = kern
        self.log.append(CompileRecord(key=key, seconds=time.perf_counter() - t0, source="disk"))
        return kern

    def _compile(self, key, build, target, pass_configs):
        t0 = time.perf_counter()
        with phase_timer() as phases:
            with _phase(phases, "build"):
                prim_func = build()
            _install_timers()
            kern = compile_prim_func(prim_func, target=target, pass_configs=pass_configs)
        # TileLang's own disk cache may have served it: then nothing was lowered (with the timers in place)
        source = "tilelang-cache" if _installed and "lower" not in phases else "compile"
        self.kernels[key] = kern
        self.log.append(CompileRecord(key=key, seconds=time.perf_counter() - t0, source=source, phases=phases))
        return kern


def _storable(key, target) -> bool:
    from mate.mamba._tilelang.specs import KernelSpec
    from mate.mamba._tilelang.store import target_arch

    return isinstance(key, KernelSpec) and target_arch(target) is not None


def compile_prim_func(prim_func, *, target, pass_configs=None):
    import tilelang

    return tilelang.compile(prim_func, target=target, execution_backend="tvm_ffi", pass_configs=pass_configs or {})


# ------------------------------------------------------------------------------------- compile-time breakdown

PHASES = ("build", "lower", "codegen", "nvcc", "wrapper", "tilelang-cache", "store")
"""Where a compile's time goes: the factory building the ``T.prim_func``, TileLang's lowering passes, device code
generation, nvcc/ptxas, the host wrapper (generated C compiled into ``executable.so``), TileLang's own disk-cache
save (less the wrapper), and MATE's store."""

_timing = threading.local()
_installed = False
_install_lock = threading.Lock()


class _phase:
    def __init__(self, phases: dict | None, name: str):
        self.phases, self.name = phases, name

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.phases is not None:
            self.phases[self.name] = self.phases.get(self.name, 0.0) + time.perf_counter() - self.t0


def _timed(name: str, fn, exclusive_of: tuple[str, ...] = ()):
    """``fn`` adding its seconds to the current thread's phase table (less the nested phases named)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        phases = getattr(_timing, "phases", None)
        if phases is None:
            return fn(*args, **kwargs)
        before = sum(phases.get(n, 0.0) for n in exclusive_of)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            nested = sum(phases.get(n, 0.0) for n in exclusive_of) - before
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0 - nested

    return wrapper


def _install_timers() -> None:
    """Wrap TileLang's compile stages once (each wrapper is a pass-through outside :func:`phase_timer`), once the
    kernel factory has imported TileLang. A TileLang whose internals moved leaves the breakdown empty."""
    global _installed
    with _install_lock:
        if _installed or "tilelang" not in sys.modules:
            return
        _installed = True
        try:
            wrap_compile_stages(_timed)
        except Exception:
            pass


class phase_timer:
    """``with phase_timer() as phases:`` collects the seconds of each :data:`PHASES` entry run on this thread."""

    def __enter__(self) -> dict:
        self.outer = getattr(_timing, "phases", None)
        _timing.phases = {}
        return _timing.phases

    def __exit__(self, *exc):
        inner = _timing.phases
        _timing.phases = self.outer
        if self.outer is not None:
            for k, v in inner.items():
                self.outer[k] = self.outer.get(k, 0.0) + v


def format_phases(phases: dict) -> str:
    """``build 0.34s, lower 1.00s, ...`` in :data:`PHASES` order (phases that did not run are left out)."""
    return ", ".join(f"{name} {phases[name]:.2f}s" for name in PHASES if phases.get(name))


# ------------------------------------------------------------------------------------------- parallel compile


def _init_worker() -> None:
    import tilelang

    # TileLang logs every compile at INFO (its import sets the level, so after the import)
    logging.getLogger(tilelang.__name__).setLevel(logging.WARNING)


def _compile_worker(spec, target, cache_root) -> tuple[float, str | None, str, dict, str | None]:
    """Make one spec ready in a worker process: loaded from MATE's disk cache (``cache_root``, the parent's, which
    a ``settings.override`` there does not pass through the environment) or compiled and stored there (and in
    TileLang's). Returns (seconds, error or None, source, phases, sha256 of the generated CUDA or None); errors come
    back as text (TVM errors do not pickle), their traceback on the worker's stderr."""
    from mate.mamba._platform import settings

    t0 = time.perf_counter()
    try:
        with settings.override(MATE_CACHE_DIR=cache_root or "off"):
            kern = CACHE.compile_only(spec, spec.build, target=target, pass_configs=spec.pass_configs())
    except Exception as exc:
        traceback.print_exc()
        return time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc)[-400:]}", "compile", {}, None
    record = CACHE.log[-1] if CACHE.log else CompileRecord(spec, 0.0)
    digest = hashlib.sha256(kern.get_kernel_source().encode()).hexdigest()
    return time.perf_counter() - t0, None, record.source, dict(record.phases), digest


def _cost_order(spec) -> int:
    """Longest compiles first (the SSD scan, then the SSU kernels, then the dt pre-pass): a shorter makespan."""
    return {"SSDScanSpec": 0, "SSUSpec": 1}.get(type(spec).__name__, 2)


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def compile_parallel(
    specs, *, target=None, jobs: int | None = None, log=print, results: dict | None = None, name=str
) -> int:
    """Compile ``specs`` in ``jobs`` worker processes (default: one per core, at most one per spec). Each worker
    stores its kernels in MATE's disk cache (and TileLang's), so a later process's first use of a spec loads it
    instead of compiling. ``results`` (a dict) receives spec -> (seconds, error, source, phases, sha256 of the
    generated CUDA). Returns the number that failed. ``name(spec)`` is how a progress line names a spec. Workers
    are spawned, not forked (a fork of a process with TileLang loaded is not safe), and one that dies (a crash in
    TileLang or nvcc) raises ``BrokenProcessPool`` here instead of hanging the caller."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from mate.mamba._platform import settings

    cache_root = settings.get("MATE_CACHE_DIR")
    target = target or {"kind": "cuda", "arch": "sm_90a"}
    specs = sorted(dict.fromkeys(specs), key=_cost_order)
    jobs = max(1, min(len(specs), jobs or default_jobs()))
    failed, t0 = 0, time.perf_counter()
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker) as pool:
        futures = {pool.submit(_compile_worker, s, target, cache_root): s for s in specs}
        for i, f in enumerate(cf.as_completed(futures), 1):
            seconds, err, source, phases, digest = f.result()
            if results is not None:
                results[futures[f]] = (seconds, err, source, phases, digest)
            failed += err is not None
            what = f"FAILED {err}" if err else f"ok {seconds:.1f}s ({'loaded' if source == 'disk' else 'compiled'})"
            log(f"[{i}/{len(specs)}] {name(futures[f])} {what} ({time.perf_counter() - t0:.0f}s)")
    return failed


def in_store(spec, target) -> bool:
    """Whether MATE's disk cache holds a sound entry of ``spec`` for ``target`` (False when it is off)."""
    from mate.mamba._tilelang.store import entry_key, store

    st = store()
    if st is None:
        return False
    key = entry_key(spec, target, spec.pass_configs())
    return st.check(st.entry_path(key), key) is None


def compile_missing(specs, *, target, jobs: int | None = None, log=None, results: dict | None = None,
                    name=str) -> None:  # fmt: skip
    """Compile in ``jobs`` worker processes (default: the cores available) the specs that are neither loaded in
    this process nor in MATE's disk cache, so that the caller's own first use of each then loads it. Nothing is
    done with one job, at most one such spec, or the disk cache off (workers hand kernels over through it): the
    caller then compiles in its own process. A worker that fails leaves its spec to the caller, whose compile
    raises the error there. ``log`` (default: silent) gets one line first and one per spec, named by ``name``;
    ``results`` as in :func:`compile_parallel`."""
    from concurrent.futures.process import BrokenProcessPool

    from mate.mamba._tilelang.store import store

    jobs = default_jobs() if jobs is None else jobs
    if jobs <= 1 or store() is None:
        return
    missing = [s for s in dict.fromkeys(specs) if s not in CACHE.kernels and not in_store(s, target)]
    if len(missing) < 2:
        return
    jobs = min(jobs, len(missing))
    log = log or (lambda m: None)
    log(f"compiling {len(missing)} kernels in {jobs} worker processes")
    try:
        compile_parallel(missing, target=target, jobs=jobs, log=lambda m: log(f"  {m}"), results=results,
                         name=name)  # fmt: skip
    except BrokenProcessPool as exc:
        raise RuntimeError(
            "the compile worker processes died: they start with the 'spawn' method, which imports the main "
            'script again; call the prewarm functions under `if __name__ == "__main__":`, or pass jobs=1 to '
            "compile in this process"
        ) from exc


def cache_dir() -> str:
    """Where TileLang keeps compiled kernels on disk (MATE's own cache: ``settings.get("MATE_CACHE_DIR")``)."""
    return os.environ.get("TILELANG_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".tilelang", "cache"))


CACHE = KernelCache()


def kernel_lookup(prewarm_hint: str):
    """``(kernel, memo)`` for one launcher module: ``kernel(spec, device)`` is the compiled kernel of ``spec`` from
    :data:`CACHE` (compiled on a miss; a miss during graph capture raises, naming ``prewarm_hint``), remembered in
    ``memo`` (spec -> kernel), a plain dict the launch paths read without locking."""
    memo: dict = {}

    def kernel(spec, device):
        kern = memo.get(spec)
        if kern is None:
            kern = memo[spec] = CACHE.get(spec, spec.build, device, prewarm_hint=prewarm_hint,
                                          pass_configs=spec.pass_configs())  # fmt: skip
        return kern

    return kernel, memo
