"""Static SASS of MATE's SSU kernels per state value, on a machine without a GPU (TileLang, nvcc and nvdisasm only):

    python tools/gpu/ssu_sass.py [--states bf16,int8,fp8] [--out DIR]

For each state dtype this compiles, for sm_90a, the one-token kernel the planner runs on a large grid (int8 / fp8:
the staged design) and the packed one (MTP), at Nemotron-H 8B's head (P 64, N 128, 16 heads per group, tied, bf16
io, fp32 dt), with TileLang's own nvcc flags (no fast math), and prints ptxas's registers / spills and the
instructions per state value of a thread by opcode class: over the whole kernel, and over the part that runs per
value (one-token: from the first barrier to EXIT, the staged design's update; packed: the token loop's body, per
token, with all its paths: the parent reload and both write modes). The counts are static (every path once, the
not-taken division slow paths and write modes included), so they compare builds, not cycles. nvdisasm as for
``ssd_sass.py`` (``NVDISASM`` names it explicitly).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

from ssd_ptxas import kernel_source, ptxas_info
from ssd_sass import disassemble, instructions, nvdisasm

CLASSES = ("FFMA", "FMUL", "FADD", "FMNMX", "PRMT", "LOP3", "SHF", "IADD3", "IMAD", "F2FP", "HADD2", "MUFU", "SHFL",
           "LDS", "LDG", "STG", "LDL", "STL", "BRA")  # fmt: skip
STATES = {"bf16": "bfloat16", "int8": "int8", "fp8": "float8_e4m3fn", "int16": "int16", "fp16": "float16"}


def specs(state: str) -> list:
    """(name, spec, values per thread) of the one-token (large grid) and packed kernels of one state dtype."""
    import torch
    from mate.mamba._platform.device import pdl_for_arch
    from mate.mamba._tilelang.ssu_plan import spec_dtypes, spec_for

    out = []
    for one_token in (True, False):
        dst = torch.int32 if one_token else torch.int64
        dtypes = spec_dtypes(state=getattr(torch, STATES[state]), io=torch.bfloat16, dt=torch.float32,
                             src=torch.int32, dst=dst, meta=torch.int32)  # fmt: skip
        spec = spec_for(one_token=one_token, dim=64, dstate=128, heads_per_group=16, dtypes=dtypes, tied=True,
                        vector_state=True, vector_io=True, pdl=pdl_for_arch("sm_90a"))  # fmt: skip
        t = spec.tiling
        out.append((f"{'one-token' if one_token else 'packed'}-{state}", spec, t.rows_per_thread * t.vecs * t.vec))
    return out


def per_value_part(sass: str, one_token: bool) -> list[str]:
    """The opcodes of the part that runs per value: one-token from the first barrier (the stage's) to EXIT, packed
    the innermost loop's body (the token loop: the shortest backward branch's span)."""
    operands, ops, labels, pending = [], [], {}, []
    for ln in sass.splitlines():
        m = re.match(r"\s*\.(L_x_\d+):", ln)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z0-9_.]+)(.*?);", ln)
        if m:
            for lb in pending:
                labels[lb] = len(ops)
            pending = []
            operands.append(m.group(3))
            ops.append(m.group(2))
    if one_token:
        lo = next((i for i, op in enumerate(ops) if op.startswith("BAR")), 0)
        hi = next((i for i in range(lo, len(ops)) if ops[i] == "EXIT"), len(ops))
        return ops[lo:hi]
    loops = []
    for i, (op, arg) in enumerate(zip(ops, operands, strict=True)):
        m = re.search(r"`\(\.(L_x_\d+)\)", arg)
        if op.startswith("BRA") and m and labels.get(m.group(1), i) < i:
            loops.append((i - labels[m.group(1)], labels[m.group(1)], i))
    if not loops:
        return []
    _, lo, hi = min(loops)
    return ops[lo : hi + 1]


def row(ops: list[str], per: int) -> str:
    c = Counter(op.split(".")[0] for op in ops if not op.startswith(("NOP", "BSSY", "BSYNC", "EXIT")))
    n = sum(c.values())
    cells = " ".join(f"{k} {c[k] / per:.2f}" for k in CLASSES if c[k])
    return f"{n} instructions, {n / per:.2f} per value: {cells}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--states", default="bf16,int8,fp8", help="state dtypes (default bf16,int8,fp8)")
    ap.add_argument("--out", default="ssu-sass", help="directory for the .cu / .cubin / .sass files (default ssu-sass)")
    args = ap.parse_args(argv)
    dis = nvdisasm()
    if dis is None:
        print("nvdisasm not found (CUDA toolkit, the nvidia-cuda-nvdisasm wheel, or NVDISASM=...)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for state in args.states.split(","):
        for name, spec, per in specs(state):
            cu = os.path.join(args.out, f"{name}.cu")
            with open(cu, "w") as f:
                f.write(kernel_source(spec))
            regs = ptxas_info(cu, flags=())  # as TileLang compiles the SSU kernels: no fast math
            sass = disassemble(dis, cu)
            one_token = spec.one_token
            print(f"== {name}{' (staged)' if spec.staged else ''}, {per} values per thread; {regs}")
            print(f"   kernel: {row([op for op, _ in instructions(sass)], per)}")
            part = "barrier to EXIT" if one_token else "token loop, per token"
            print(f"   {part}: {row(per_value_part(sass, one_token), per)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
