"""Compiled-kernel cache: one compiled TileLang kernel object per kernel spec.

The kept kernel object is called directly (TileLang's eager-call path costs ~60 us more per call). A miss
compiles (2-4 s for an SSU kernel, 20-70 s for the SSD scan; TileLang's disk cache makes a later process's miss a
load); a miss while the current stream is capturing a graph raises instead of stalling the
capture, naming the prewarm call that would have compiled the kernel beforehand.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

from .._device import is_capturing, tilelang_target


class KernelNotPrewarmedError(RuntimeError):
    """A kernel would have compiled inside a graph capture."""


@dataclass
class CompileRecord:
    key: Hashable
    seconds: float


@dataclass
class KernelCache:
    """Compiled kernels by kernel spec (:mod:`mate._tilelang.specs`); ``build()`` gives the ``T.prim_func``."""

    kernels: dict = field(default_factory=dict)
    log: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

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
                kern = self._compile(key, build, target or tilelang_target(device), pass_configs)
        return kern

    def compile_only(self, key: Hashable, build: Callable[[], object], *, target, pass_configs=None):
        """Compile without a device (prewarm on a build machine, the CI compile check)."""
        with self.lock:
            kern = self.kernels.get(key)
            if kern is None:
                kern = self._compile(key, build, target, pass_configs)
        return kern

    def _compile(self, key, build, target, pass_configs):
        t0 = time.perf_counter()
        kern = compile_prim_func(build(), target=target, pass_configs=pass_configs)
        self.kernels[key] = kern
        self.log.append(CompileRecord(key=key, seconds=time.perf_counter() - t0))
        return kern


def compile_prim_func(prim_func, *, target, pass_configs=None):
    import tilelang

    return tilelang.compile(prim_func, target=target, execution_backend="tvm_ffi", pass_configs=pass_configs or {})


def _compile_worker(spec, target) -> tuple[float, str | None]:
    """Compile one spec in a worker process (fills TileLang's disk cache); errors come back as text (TVM errors
    do not pickle)."""
    t0 = time.perf_counter()
    try:
        compile_prim_func(spec.build(), target=target, pass_configs=spec.pass_configs())
    except Exception as exc:
        return time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc)[-400:]}"
    return time.perf_counter() - t0, None


def compile_parallel(specs, *, target=None, jobs: int | None = None, log=print) -> int:
    """Compile ``specs`` in ``jobs`` worker processes (default: one per core). Each fills TileLang's disk cache,
    so a later process's first use of a spec loads it instead of compiling. Returns the number that failed."""
    import concurrent.futures as cf
    import multiprocessing as mp

    target = target or {"kind": "cuda", "arch": "sm_90a"}
    specs = list(dict.fromkeys(specs))
    jobs = jobs or max(1, min(len(specs), os.cpu_count() or 2))
    failed, t0 = 0, time.perf_counter()
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(_compile_worker, s, target): s for s in specs}
        for i, f in enumerate(cf.as_completed(futures), 1):
            seconds, err = f.result()
            failed += err is not None
            what = f"FAILED {err}" if err else f"ok {seconds:.1f}s"
            log(f"[{i}/{len(specs)}] {futures[f]} {what} ({time.perf_counter() - t0:.0f}s)")
    return failed


def cache_dir() -> str:
    """Where TileLang keeps compiled kernels on disk."""
    return os.environ.get("TILELANG_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".tilelang", "cache"))


CACHE = KernelCache()
