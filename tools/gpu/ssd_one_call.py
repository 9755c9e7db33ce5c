"""One eager MATE SSD call at a benchmark shape, for a profiler to attach to (e.g. Nsight Compute):

    ncu -k regex:ssd -c 2 python tools/gpu/ssd_one_call.py [--shape nemotron-h-8b] [--batch 1x8192] [--chunk 256]

The call is the benchmark's (``mate-mamba bench ssd``): the kernels MATE's planner picks for it, the dt pre-pass then
the chunk scan. ``--warmup`` calls first (compiling, and loading TileLang's cache) so the profiled call is a
steady one.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    from mate.mamba.bench.shapes import SSD_BATCHES, SSD_CASES, SSD_MODELS, ssd_case
    from mate.mamba.bench.ssd import make_window, mate_fn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shape", default="nemotron-h-8b", choices=(*SSD_CASES, *(m.name for m in SSD_MODELS)),
        help="a case, or a model (its smallest TP)",
    )  # fmt: skip
    ap.add_argument("--batch", default="1x8192", choices=tuple(SSD_BATCHES), help="sequences x tokens")
    ap.add_argument("--chunk", type=int, default=256, help="chunk size (default 256)")
    ap.add_argument("--warmup", type=int, default=1, help="calls before the profiled one (default 1)")
    args = ap.parse_args(argv)
    w = make_window(ssd_case(args.shape), SSD_BATCHES[args.batch], args.chunk, 7, torch.device("cuda"))
    fn = mate_fn(w, args.chunk)
    for _ in range(args.warmup + 1):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
