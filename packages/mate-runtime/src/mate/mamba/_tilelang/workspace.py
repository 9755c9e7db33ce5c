"""Workspace cache: per-shape scratch buffers of the TileLang launchers, allocated once and reused.

A buffer is keyed by (owner's static key, name, dtype, device). A request for more elements than the kept
buffer holds replaces it with a larger one (at least twice the old size, so a growing batch settles after
a few calls); the old buffer is retired, not freed, because a captured graph may still reference it. A
request that fits returns a view of the kept buffer: a steady-state call allocates nothing.

Buffers are reused by every call with the same key, so a launcher must not hand a workspace buffer back to
the caller and must not run two calls concurrently on different streams with the same key.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch


@dataclass
class Workspace:
    buffers: dict = field(default_factory=dict)
    retired: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    allocations: int = 0  # how many buffers were ever allocated (tests read it)

    def get(self, key: Hashable, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
            zeroed: bool = False):  # fmt: skip
        """A ``shape`` view of the kept buffer for (key, name, dtype, device); contents are undefined, or with
        ``zeroed`` zero when the buffer is allocated (for scratch its kernels leave zero, e.g. counters)."""
        need = math.prod(shape)
        k = (key, name, dtype, torch.device(device))
        buf = self.buffers.get(k)
        if buf is None or buf.numel() < need:
            with self.lock:
                buf = self.buffers.get(k)
                if buf is None or buf.numel() < need:
                    size = max(need, 1) if buf is None else max(need, 2 * buf.numel())
                    new = (torch.zeros if zeroed else torch.empty)(size, dtype=dtype, device=device)
                    self.allocations += 1
                    if buf is not None:
                        self.retired.append(buf)
                    self.buffers[k] = buf = new
        return buf[:need].view(shape)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def clear(self) -> None:
        """Drop every buffer (only safe when no captured graph still uses them)."""
        with self.lock:
            self.buffers.clear()
            self.retired.clear()


WORKSPACE = Workspace()
