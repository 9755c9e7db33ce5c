"""Per-kernel GPU time of one SSD call, MATE beside vLLM, from torch.profiler:

    python tools/gpu/ssd_profile.py [--shapes nemotron-h-8b-tp1:1x8192:256,...] [--reps 5]

The benchmark (``mate-mamba bench ssd``) times whole calls; this says which kernel of a call the time goes to (MATE's
dt pre-pass and chunk scan, vLLM's Triton kernels), so a change can aim at it. Eager calls (the kernels
run as they do in a replayed graph), after a warm-up.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch


def kernel_times(fn, reps: int) -> dict[str, float]:
    """Mean device µs per call of every kernel ``fn`` launches."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    acc: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            acc[e.name[:90]] += e.device_time / reps
    return dict(acc)


def main(argv=None) -> int:
    from mate.mamba.bench.shapes import SSD_BATCHES, ssd_case
    from mate.mamba.bench.ssd import make_window, mate_fn, vllm_fn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shapes",
        default="nemotron-h-8b:1x8192:256,nemotron-h-8b:32x512:256,mamba2-2.7b:1x8192:256",
        help="comma list of case:batch:chunk (cases or models, and batches, of mate-mamba bench ssd)",
    )
    ap.add_argument("--reps", type=int, default=5, help="profiled calls per implementation (default 5)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    for item in args.shapes.split(","):
        shape, batch, L = item.split(":")
        s, L = ssd_case(shape), int(L)
        w = make_window(s, SSD_BATCHES[batch], L, 7, dev)
        impls = [("mate", mate_fn(w, L))]
        try:
            impls.append(("vllm", vllm_fn(w, L)))
        except ImportError:
            pass
        for name, fn in impls:
            try:
                times = kernel_times(fn, args.reps)
            except Exception as e:  # noqa: BLE001 - a faulting implementation must not hide the others' numbers
                print(f"{item} {name}: FAILED {type(e).__name__}: {e}", flush=True)
                continue
            total = sum(times.values())
            print(f"{item} {name}: {total:.1f} us device time per call", flush=True)
            for k, v in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"    {v:9.1f} us  {k}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
