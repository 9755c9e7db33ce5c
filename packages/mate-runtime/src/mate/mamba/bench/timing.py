"""Timing helpers shared by the SSU and SSD benchmarks.

``graph_times_us`` captures one call per window (each window touches its own slice of a large pool, so the
working set of one replay exceeds the 60 MB L2 and every call reads cold HBM), replays the graph ``replays``
times, and returns the median over ``repeats`` of the time per call; the implementations of one case are timed
in interleaved rounds. ``copy_ceiling_tbps`` measures a device-to-device copy (read + write bytes) in the same
process, the bandwidth ceiling the kernels are compared against. ``host_times_us`` is the eager host time of one
call per implementation, interleaved the same way.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch
from mate.mamba._platform.device import device_module, graph_class, graph_context

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


def _capture(dev, mod, fn_per_window: list[Callable[[], object]]):
    """Warm up (compile / autotune outside capture), then capture one call per window into one graph."""
    for fn in fn_per_window:
        fn()
    mod.synchronize()
    graph = graph_class(dev)()
    with graph_context(dev)(graph):
        for fn in fn_per_window:
            fn()
    graph.replay()
    mod.synchronize()
    return graph


def graph_times_us(
    impls: dict[str, list[Callable[[], object]]], replays: int = 20, repeats: int = 5, device=None
) -> dict[str, float | Exception]:
    """Median time per call in µs of each implementation's graph (see the module docstring), or the exception
    its warm-up or capture raised. The implementations are timed in interleaved rounds (each round times every
    graph once, the first of each round rotating), so a drift of the machine during a case (clocks, memory
    state) falls on all of them alike instead of on whichever is timed last."""
    dev = _device(device)
    mod = device_module(dev)
    graphs: dict = {}
    out: dict[str, float | Exception] = {}
    for name, fns in impls.items():
        try:
            graphs[name] = _capture(dev, mod, fns)
        except Exception as exc:  # one implementation failing (e.g. a peer without this shape) is reported
            out[name] = exc
    names = list(graphs)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            ms = _device_ms(mod, graphs[name].replay, replays)
            samples[name].append(ms * 1e3 / (replays * len(impls[name])))
    for name in names:
        out[name] = statistics.median(samples[name])
    graphs.clear()
    return {name: out[name] for name in impls}


def graph_time_us(fn_per_window: list[Callable[[], object]], replays: int = 20, repeats: int = 5, device=None) -> float:
    """Median time per call in µs of graph-replaying one call per window (see the module docstring)."""
    us = graph_times_us({"fn": fn_per_window}, replays, repeats, device)["fn"]
    if isinstance(us, Exception):
        raise us
    return us


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


def start(skipped: dict | None = None) -> tuple[torch.device, float]:
    """A device run's start: the current CUDA device and its copy ceiling (TB/s, read + write, measured now), both
    printed with the implementations ``skipped`` (name -> why)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    for name, why in (skipped or {}).items():
        print(f"[skip] {name}: {why}", flush=True)
    ceiling = copy_ceiling_tbps(dev)
    print(f"copy ceiling: {ceiling:.2f} TB/s (read + write)", flush=True)
    return dev, ceiling


def host_times_us(impls: dict[str, Callable[[], object]], iters: int = 200, rounds: int = 3, device=None) -> dict:
    """Eager host time per call in µs of each implementation (the time the Python caller is blocked; the device
    runs behind): the best of ``rounds`` loops of ``iters`` calls, the implementations' loops interleaved (the
    first rotating per round), so a slow phase of the host falls on all of them alike."""
    dev = _device(device)
    mod = device_module(dev)
    for fn in impls.values():
        for _ in range(5):
            fn()
    mod.synchronize()
    names = list(impls)
    best = {n: float("inf") for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            fn = impls[name]
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e6 / iters)
            mod.synchronize()
    return best


def host_time_us(fn: Callable[[], object], iters: int = 200, device=None) -> float:
    """Eager host time per call in µs of one implementation (see :func:`host_times_us`)."""
    return host_times_us({"fn": fn}, iters=iters, device=device)["fn"]


__all__ = [
    "L2_BYTES", "windows_for", "graph_time_us", "graph_times_us", "copy_ceiling_tbps", "host_time_us", "host_times_us",
    "start",
]  # fmt: skip
