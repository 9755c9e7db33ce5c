"""Compiled-kernel cache: one compiled TileLang kernel object per static configuration.

The kept kernel object is called directly (TileLang's eager-call path costs ~60 us more per call). A miss
compiles (2-4 s); a miss while the current stream is capturing a graph raises instead of stalling the
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


def cache_dir() -> str:
    """Where TileLang keeps compiled kernels on disk."""
    return os.environ.get("TILELANG_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".tilelang", "cache"))


CACHE = KernelCache()
