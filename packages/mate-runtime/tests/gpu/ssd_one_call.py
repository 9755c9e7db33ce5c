"""One eager MATE SSD call per design at a benchmark shape, for a profiler to attach to (e.g. Nsight Compute):
``ncu -k regex:fused_kernel -c 1 python ssd_one_call.py [--shape nemotron-h-8b --batch 1x8192 --chunk 256]``."""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    from mate._tilelang import ssd as tl_ssd
    from mate.bench.ssd import BATCHES, SSD_SHAPES, make_window, mate_fn

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="nemotron-h-8b")
    ap.add_argument("--batch", default="1x8192")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--kinds", default=",".join(tl_ssd.VARIANTS))
    args = ap.parse_args(argv)
    w = make_window(SSD_SHAPES[args.shape], BATCHES[args.batch], args.chunk, 7, torch.device("cuda"))
    for kind in args.kinds.split(","):
        mate_fn(w, args.chunk, kind)()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
