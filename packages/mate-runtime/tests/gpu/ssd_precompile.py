"""Compile every SSD kernel the GPU tests and the benchmark use, in parallel processes (fills TileLang's disk
cache before ``pytest -m gpu``): ``python packages/mate-runtime/tests/gpu/ssd_precompile.py [--jobs N]``.
Runs on a machine without a GPU too (the calls are built on the CPU only to derive the kernel keys)."""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--only-tests", action="store_true")
    args = ap.parse_args(argv)
    import test_ssd_kernels as t
    from mate._tilelang import ssd as tl_ssd

    keys = []
    for p in t.CASES + t.NARROW_P_CASES:
        call = t.normalized_call(p.values[0])
        for kind in tl_ssd.VARIANTS:
            keys.extend(tl_ssd.kernel_keys(call, kind))
    if not args.only_tests:
        from mate.bench.ssd import PLAN, SSD_SHAPES

        for shape_name, _b, chunks in PLAN:
            s = SSD_SHAPES[shape_name]
            for L in chunks:
                for kind in tl_ssd.VARIANTS:
                    fk, rk = tl_ssd.prewarm_keys(heads=s.heads, groups=s.groups, dim=s.dim, dstate=s.dstate,
                                                 chunk_size=L, io_dtype=torch.bfloat16, state_dtype=torch.float32,
                                                 dt_dtype=torch.float32, kind=kind)  # fmt: skip
                    # the benchmark returns final states: no intermediate-state kernels
                    keys.extend([k for k in fk if k[-1] is not True] + list(rk))
    keys = list(dict.fromkeys(keys))
    print(f"{len(keys)} kernels", flush=True)
    tl_ssd.precompile(keys, jobs=args.jobs, log=lambda m: print(m, flush=True))
    # the overlapped lean kernels (MATE_SSD_OVERLAP=1) of their GPU tests and, unless --only-tests, of the
    # benchmark (the sweep's overlap setting): the same keys, built under the setting (read when a worker makes
    # a kernel's builder; the workers start with this environment)
    cases = [p.values[0] for p in t.OVERLAP_CASES] + [t.GRAPH_CASE]
    ovl = [k for c in cases for k in tl_ssd.kernel_keys(t.normalized_call(c), "lean")]
    ovl += [k for k in keys if k[0] == "ssd_lean"]
    os.environ[tl_ssd.OVERLAP_ENV] = "1"
    try:
        tl_ssd.precompile(list(dict.fromkeys(ovl)), jobs=args.jobs, log=lambda m: print(m, flush=True))
    finally:
        del os.environ[tl_ssd.OVERLAP_ENV]
    # the pre-passes with 8 heads per CTA (MATE_SSD_DT_HEADS=8) of their GPU tests and of the benchmark
    dt8 = [k for p in t.DT_HEADS_CASES for d in ("lean", "prepass")
           for k in tl_ssd.kernel_keys(t.normalized_call(p.values[0]), d)[2:]]  # fmt: skip
    dt8 += [k for k in keys if k[0] == "ssd_dt"]
    os.environ[tl_ssd.DT_HEADS_ENV] = "8"
    try:
        tl_ssd.precompile(list(dict.fromkeys(dt8)), jobs=args.jobs, log=lambda m: print(m, flush=True))
    finally:
        del os.environ[tl_ssd.DT_HEADS_ENV]
    return 0


if __name__ == "__main__":
    sys.exit(main())
