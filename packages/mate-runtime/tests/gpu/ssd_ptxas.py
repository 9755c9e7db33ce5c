"""Registers, spills and shared memory of the SSD kernels (ptxas -v on the CUDA source TileLang generates).

``python packages/mate-runtime/tests/gpu/ssd_ptxas.py [--out DIR] [--shape nemotron-h-8b] [--chunk 256]``
compiles the fused kernel of one benchmark shape for sm_90a (no GPU needed: nvcc only), writes its ``.cu`` under
``--out`` and prints registers per thread, spill bytes and the CTA's thread count (shared memory: the plan).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

import torch


def ptxas_info(cu_path: str, arch: str = "sm_90a") -> str:
    import tilelang.env as tl_env

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, "-std=c++20", f"-arch={arch}", "-cubin", "-o", cu_path[:-3] + ".cubin", "-DENABLE_BF16",
           "--use_fast_math", "-w", "-Xptxas", "-v", f"-I{tl_env.TILELANG_TEMPLATE_PATH}",
           f"-I{tl_env.CUTLASS_INCLUDE_DIR}", cu_path]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if re.search("registers|spill|error", ln)]
    return " | ".join(lines) if lines else f"nvcc rc={res.returncode}: {res.stderr[-300:]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="ssd-ptxas")
    ap.add_argument("--shape", default="nemotron-h-8b")
    ap.add_argument("--chunk", type=int, default=256)
    args = ap.parse_args(argv)
    from mate._tilelang import ssd as tl_ssd
    from mate._tilelang.cache import compile_prim_func
    from mate.bench.ssd import SSD_SHAPES

    s = SSD_SHAPES[args.shape]
    os.makedirs(args.out, exist_ok=True)
    kw = dict(heads=s.heads, groups=s.groups, dim=s.dim, dstate=s.dstate, chunk_size=args.chunk,
              io_dtype=torch.bfloat16, state_dtype=torch.float32, dt_dtype=torch.float32)  # fmt: skip
    fused, _ = tl_ssd.prewarm_keys(**kw)
    keys = [fused[0]]
    fplan = tl_ssd.plan(s.dim, s.dstate, args.chunk, torch.bfloat16)
    print(f"{args.shape} chunk {args.chunk}: fused plan {fplan}")
    for key in keys:
        kern = compile_prim_func(tl_ssd.builder_for(key)(), target={"kind": "cuda", "arch": "sm_90a"})
        src = kern.get_kernel_source()
        path = os.path.join(args.out, f"{key[0]}.cu")
        with open(path, "w") as f:
            f.write(src)
        bounds = re.search(r"__launch_bounds__\((\d+)", src)
        print(f"{key[0]}: threads {bounds.group(1) if bounds else '?'}; {ptxas_info(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
