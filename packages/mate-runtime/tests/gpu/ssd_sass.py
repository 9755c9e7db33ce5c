"""Static SASS of the SSD prefill kernel per design, on a machine without a GPU (nvcc + nvdisasm only):
``python packages/mate-runtime/tests/gpu/ssd_sass.py [--shape nemotron-h-8b] [--chunk 256] [--out DIR]``.

Nsight Compute showed the fused kernel bound by its per-tile instruction stream (~20 K warp instructions per
128-token tile); the SASS says where those instructions are. For each design this prints the registers /
spills (ptxas), the static instruction count, the opcodes that matter (branches, global and shared loads,
stores, multiplies, MUFU) and every straight-line segment of more than 100 instructions between GEMMs,
barriers and branches, so a change can be judged before it reaches a GPU. nvdisasm comes from the CUDA
toolkit or the ``nvidia-cuda-nvdisasm`` wheel (``NVDISASM`` names it explicitly).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import torch

OPCODES = ("BRA", "BSSY", "LDG", "STG", "LDS", "STS", "STSM", "IMAD", "FMUL", "FFMA", "MUFU", "HGMMA", "UTMASTG")
MARKERS = ("HGMMA", "BAR.SYNC", "EXIT", "UTMA", "WARPGROUP.ARRIVE", "DEPBAR")


def nvdisasm() -> str | None:
    cands = [os.environ.get("NVDISASM"), shutil.which("nvdisasm")]
    cands += [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvdisasm")]
    cands += glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cu*", "bin", "nvdisasm"))
    return next((c for c in cands if c and os.path.exists(c)), None)


def instructions(sass: str) -> list[tuple[str, str]]:
    out = []
    for ln in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+((?:@!?U?P[0-9T]+\s+)?[A-Z0-9_.]+)(.*?);", ln)
        if m:
            out.append((m.group(1).split()[-1], m.group(2).strip()))
    return out


def segments(ins, min_len: int = 100):
    """Straight-line runs between GEMMs, barriers, TMA and branches: (start, length, top opcodes, end)."""
    prev = 0
    for i, (op, arg) in enumerate(ins):
        if any(op.startswith(k) for k in MARKERS) or (op.startswith("BRA") and "`" in arg):
            if i - prev >= min_len:
                top = Counter(o.split(".")[0] for o, _ in ins[prev:i]).most_common(6)
                yield prev, i - prev, ", ".join(f"{k} {v}" for k, v in top), op
            prev = i + 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="nemotron-h-8b")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--out", default="ssd-sass")
    args = ap.parse_args(argv)
    from mate._tilelang import ssd as tl_ssd
    from mate._tilelang.cache import compile_prim_func
    from mate.bench.ssd import SSD_SHAPES
    from ssd_ptxas import ptxas_info

    dis = nvdisasm()
    if dis is None:
        print("nvdisasm not found (CUDA toolkit, the nvidia-cuda-nvdisasm wheel, or NVDISASM=...)", file=sys.stderr)
        return 2
    s = SSD_SHAPES[args.shape]
    os.makedirs(args.out, exist_ok=True)
    for kind in tl_ssd.VARIANTS:
        fkeys, _ = tl_ssd.prewarm_keys(heads=s.heads, groups=s.groups, dim=s.dim, dstate=s.dstate,
                                       chunk_size=args.chunk, io_dtype=torch.bfloat16, state_dtype=torch.float32,
                                       dt_dtype=torch.float32, kind=kind)  # fmt: skip
        key = fkeys[0]  # final states, the benchmark's configuration
        kern = compile_prim_func(tl_ssd.builder_for(key)(), target={"kind": "cuda", "arch": "sm_90a"})
        cu = os.path.join(args.out, f"{kind}.cu")
        with open(cu, "w") as f:
            f.write(kern.get_kernel_source())
        regs = ptxas_info(cu)
        sass = subprocess.run([dis, "-c", cu[:-3] + ".cubin"], capture_output=True, text=True).stdout
        with open(cu[:-3] + ".sass", "w") as f:
            f.write(sass)
        ins = instructions(sass)
        counts = Counter(op.split(".")[0] for op, _ in ins)
        print(f"== {kind} ({args.shape}, chunk {args.chunk}): {len(ins)} instructions; {regs}")
        print("   " + ", ".join(f"{k} {counts[k]}" for k in OPCODES))
        for start, n, top, end in segments(ins):
            print(f"   [{start:5d}] {n:4d}: {top}  -> {end}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
