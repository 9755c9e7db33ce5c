"""Registers, spills and threads of the SSD kernels (ptxas -v on the CUDA source TileLang generates):

    python tools/gpu/ssd_ptxas.py [--out DIR] [--shape nemotron-h-8b] [--batch 1x8192] [--chunk 256]

Plans the benchmark's call at one shape (``mate.mamba.plan_ssd_combined_fwd_varlen`` on CPU tensors: the specs of
the dt pre-pass and the chunk scan), compiles each spec for sm_90a (no GPU needed: TileLang and nvcc only),
writes its ``.cu`` under ``--out`` and prints the spec, the CTA's thread count, and ptxas's registers per thread
and spill bytes.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

import torch


def planned_specs(shape: str, batch: str, chunk: int) -> tuple:
    """The kernel specs MATE's planner picks for the benchmark's call (``mate-mamba bench ssd``) at one shape."""
    from mate.mamba import plan_ssd_combined_fwd_varlen
    from mate.mamba.bench.shapes import SSD_BATCHES, ssd_case
    from mate.mamba.bench.ssd import make_window, mate_args

    w = make_window(ssd_case(shape), SSD_BATCHES[batch], chunk, 7, torch.device("cpu"))
    args, kwargs = mate_args(w, chunk)
    return plan_ssd_combined_fwd_varlen(*args, **kwargs)


def kernel_source(spec, arch: str = "sm_90a") -> str:
    """The CUDA source TileLang generates for ``spec`` (compiled for ``arch`` without a device)."""
    import tilelang

    kern = tilelang.compile(
        spec.build(), target={"kind": "cuda", "arch": arch}, execution_backend="tvm_ffi",
        pass_configs=spec.pass_configs(),
    )  # fmt: skip
    return kern.get_kernel_source()


def ptxas_info(cu_path: str, arch: str = "sm_90a", flags: tuple = ("-DENABLE_BF16", "--use_fast_math")) -> str:
    """ptxas's register / spill lines for a TileLang ``.cu`` compiled with ``flags`` (the SSD kernels': fast
    math) (the cubin is written beside it)."""
    import tilelang.env as tl_env

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmd = [nvcc, "-std=c++20", f"-arch={arch}", "-cubin", "-o", cu_path[:-3] + ".cubin", *flags, "-w", "-Xptxas",
           "-v", f"-I{tl_env.TILELANG_TEMPLATE_PATH}", f"-I{tl_env.CUTLASS_INCLUDE_DIR}", cu_path]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln.strip() for ln in (res.stdout + res.stderr).splitlines() if re.search("registers|spill|error", ln)]
    return " | ".join(lines) if lines else f"nvcc rc={res.returncode}: {res.stderr[-300:]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="ssd-ptxas", help="directory for the .cu / .cubin files (default ssd-ptxas)")
    ap.add_argument(
        "--shape",
        default="nemotron-h-8b",
        help="a case or model of mate-mamba bench ssd (default nemotron-h-8b, at TP1)",
    )
    ap.add_argument("--batch", default="1x8192", help="a batch of mate-mamba bench ssd (default 1x8192)")
    ap.add_argument("--chunk", type=int, default=256, help="chunk size (default 256)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for spec in planned_specs(args.shape, args.batch, args.chunk):
        src = kernel_source(spec)
        path = os.path.join(args.out, f"{spec.factory}.cu")
        with open(path, "w") as f:
            f.write(src)
        bounds = re.search(r"__launch_bounds__\((\d+)", src)
        print(f"{spec}\n    threads {bounds.group(1) if bounds else '?'}; {ptxas_info(path)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
