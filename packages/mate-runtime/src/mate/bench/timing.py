"""Timing helpers shared by the SSU and SSD benchmarks.

``graph_time_us`` captures one call per window (each window touches its own slice of a large pool, so the
working set of one replay exceeds the 60 MB L2 and every call reads cold HBM), replays the graph
``replays`` times, and returns the median over ``repeats`` of the time per call. ``copy_ceiling_tbps``
measures a device-to-device copy (read + write bytes) in the same process, the bandwidth ceiling the
kernels are compared against. ``host_time_us`` is the eager host time of one call.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch

from .._device import device_module, graph_class, graph_context

L2_BYTES = 60 * 1024 * 1024


def windows_for(bytes_per_call: int, *, min_total: int = 4 * L2_BYTES, max_windows: int = 256) -> int:
    """How many disjoint windows make one graph replay touch more than ``min_total`` bytes (at least 2)."""
    n = -(-min_total // max(1, bytes_per_call))
    return max(2, min(max_windows, n))


def _device(device) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def _device_ms(mod, fn: Callable[[], object], times: int) -> float:
    """Device time in ms of ``times`` back-to-back calls of ``fn`` on the current stream (device events)."""
    start = mod.Event(enable_timing=True)
    end = mod.Event(enable_timing=True)
    start.record()
    for _ in range(times):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def graph_time_us(fn_per_window: list[Callable[[], object]], replays: int = 20, repeats: int = 5, device=None) -> float:
    """Median time per call in µs of graph-replaying one call per window (see the module docstring)."""
    dev = _device(device)
    mod = device_module(dev)
    for fn in fn_per_window:  # warm up: compile / autotune outside capture
        fn()
    mod.synchronize()
    graph = graph_class(dev)()
    with graph_context(dev)(graph):
        for fn in fn_per_window:
            fn()
    graph.replay()
    mod.synchronize()
    per_call = [_device_ms(mod, graph.replay, replays) * 1e3 / (replays * len(fn_per_window)) for _ in range(repeats)]
    del graph
    return statistics.median(per_call)


def copy_ceiling_tbps(device=None, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Device-to-device copy bandwidth in TB/s, counting bytes read + bytes written."""
    dev = _device(device)
    mod = device_module(dev)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    mod.synchronize()
    copy = functools.partial(dst.copy_, src)
    return statistics.median(2 * nbytes * 5 / (_device_ms(mod, copy, 5) * 1e-3) / 1e12 for _ in range(repeats))


def host_time_us(fn: Callable[[], object], iters: int = 200, device=None) -> float:
    """Eager host time per call in µs (the time the Python caller is blocked; the device runs behind)."""
    dev = _device(device)
    mod = device_module(dev)
    for _ in range(5):
        fn()
    mod.synchronize()
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / iters)
        mod.synchronize()
    return min(samples)


__all__ = ["L2_BYTES", "windows_for", "graph_time_us", "copy_ceiling_tbps", "host_time_us"]
