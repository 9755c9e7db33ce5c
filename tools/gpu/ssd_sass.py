"""Static SASS of MATE's SSD prefill kernels, on a machine without a GPU (TileLang, nvcc and nvdisasm only):

    python tools/gpu/ssd_sass.py [--shape nemotron-h-8b] [--batch 1x8192] [--chunk 256] [--out DIR]

For each kernel the planner picks for the benchmark's call at one shape (the dt pre-pass and the chunk scan,
see ``ssd_ptxas.py``) this prints the registers / spills (ptxas), the static instruction count, the opcodes
that matter (branches, global and shared loads, stores, multiplies, MUFU) and every straight-line segment of
more than 100 instructions between GEMMs, barriers and branches, so a change can be judged before it reaches a
GPU. nvdisasm comes from the CUDA toolkit or the ``nvidia-cuda-nvdisasm`` wheel (``NVDISASM`` names it
explicitly).
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


def disassemble(dis: str, cu: str) -> str:
    """The SASS of the cubin beside ``cu`` (nvdisasm ``dis``), also written beside it as ``.sass``."""
    sass = subprocess.run([dis, "-c", cu[:-3] + ".cubin"], capture_output=True, text=True).stdout
    with open(cu[:-3] + ".sass", "w") as f:
        f.write(sass)
    return sass


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
    from ssd_ptxas import kernel_source, planned_specs, ptxas_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shape",
        default="nemotron-h-8b",
        help="a case or model of mate-mamba bench ssd (default nemotron-h-8b, at TP1)",
    )
    ap.add_argument("--batch", default="1x8192", help="a batch of mate-mamba bench ssd (default 1x8192)")
    ap.add_argument("--chunk", type=int, default=256, help="chunk size (default 256)")
    ap.add_argument("--out", default="ssd-sass", help="directory for the .cu / .cubin / .sass files (default ssd-sass)")
    args = ap.parse_args(argv)
    dis = nvdisasm()
    if dis is None:
        print("nvdisasm not found (CUDA toolkit, the nvidia-cuda-nvdisasm wheel, or NVDISASM=...)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    for spec in planned_specs(args.shape, args.batch, args.chunk):
        cu = os.path.join(args.out, f"{spec.factory}.cu")
        with open(cu, "w") as f:
            f.write(kernel_source(spec))
        regs = ptxas_info(cu)
        sass = disassemble(dis, cu)
        ins = instructions(sass)
        counts = Counter(op.split(".")[0] for op, _ in ins)
        print(f"== {spec.factory} ({args.shape}, {args.batch}, chunk {args.chunk}): {len(ins)} instructions; {regs}")
        print(f"   {spec}")
        print("   " + ", ".join(f"{k} {counts[k]}" for k in OPCODES))
        for start, n, top, end in segments(ins):
            print(f"   [{start:5d}] {n:4d}: {top}  -> {end}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
