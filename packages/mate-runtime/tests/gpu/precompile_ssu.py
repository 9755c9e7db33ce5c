"""Compile every TileLang SSU kernel the GPU tests will use, in parallel processes, before pytest runs.

``python packages/mate-runtime/tests/gpu/precompile_ssu.py [workers]`` fills TileLang's disk cache, so the
tests' first calls are cache hits (~0.1 s) instead of 2-4 s compiles one after another. Purely an
optimisation of device time: without it the tests compile the same kernels themselves.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch


def _compile(key):
    from mate._tilelang.cache import compile_prim_func
    from mate._tilelang.ssu import PASS_CONFIGS, build_kernel

    t0 = time.perf_counter()
    compile_prim_func(build_kernel(key), target={"kind": "cuda", "arch": "sm_90a"}, pass_configs=PASS_CONFIGS)
    return time.perf_counter() - t0


def keys(device: str = "cuda") -> list:
    sys.path.insert(0, os.path.dirname(__file__))
    import test_ssu_kernels as t

    t.DEVICE = device
    from mate._tilelang import ssu as tl_ssu
    from mate.mamba._ssu_call import normalize_ssu

    cases = [p.values[0] for p in t.ONE + t.PACKED]
    cases += [
        t.Case(H=2, G=1, P=32, N=32, batch=2),
        t.Case(form="packed", T=4, varlen=True, accepted=True, table="2d", dst=True, batch=9),
    ]
    out = set()
    for c in cases:
        kw, _, parent = t.build(c, 0)
        args = dict(kw)
        call = normalize_ssu(
            args.pop("state"), args.pop("x"), args.pop("dt"), args.pop("A"), args.pop("B"), args.pop("C"),
            args.pop("D"), retrieve_parent_token=parent, **args,
        )  # fmt: skip
        planned = tl_ssu.plan(call)
        if planned is not None:
            out.add(planned[0])
    out.update(
        tl_ssu.prewarm_keys(
            state_dtype=torch.bfloat16,
            io_dtype=torch.bfloat16,
            heads=6,
            dim=64,
            dstate=64,
            groups=3,
            slot_dtype=torch.int32,
            packed=True,
            meta_dtype=torch.int32,
            tie_hdim=True,
            pdl=tl_ssu.pdl_for(torch.device("cuda")),
        )  # fmt: skip
    )
    return sorted(out, key=str)


def main() -> int:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 14
    ks = keys()
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        times = list(ex.map(_compile, ks))
    print(f"precompiled {len(ks)} SSU kernels in {time.perf_counter() - t0:.1f}s (sum {sum(times):.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
