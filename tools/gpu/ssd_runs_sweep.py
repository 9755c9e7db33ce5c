"""The split SSD design's time against its run count, beside the serial design and the planner's pick.

    python tools/gpu/ssd_runs_sweep.py [--cases LIST] [--batches LIST] [--runs LIST] [--jobs N] [--out DIR]

For each registry case and batch: MATE held to the split design at each run count of ``--runs`` (the planner's
rule ``ssd_plan.split_runs`` searches these; the cost model's prediction is printed beside each), the serial
design, and the planner's own pick, each CUDA-graph replayed over windows larger than L2 as ``mate-mamba bench ssd``
times them. The kernels do not depend on the run count (it is a launch argument), so one compile per case serves
the whole sweep; they are compiled first in ``--jobs`` worker processes. Writes ``runs_sweep.json`` under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

import torch
from mate.mamba._tilelang import ssd_plan
from mate.mamba._tilelang.cache import compile_parallel
from mate.mamba.bench.shapes import SSD_BATCHES, SSD_CASES
from mate.mamba.bench.ssd import make_window, mate_fn, nbytes
from mate.mamba.bench.timing import graph_time_us, windows_for

SMS = 132


def _specs(case, several: bool) -> list:
    """The kernels the sweep runs: the serial scan (with the prefetch where a batch has several sequences), the
    split design's three, and the pre-pass (final states returned, no pool)."""
    base = ssd_plan.scan_spec(
        H=case.heads, G=case.groups, P=case.dim, N=case.dstate, L=case.chunk_size, io="bfloat16", state="float32",
        init="float32", D="float32", D_per_dim=False, cu="int32", sq="int32", has_D=True, intermediate=False,
    )  # fmt: skip
    dt = ssd_plan.dt_spec(base, dt="float32", **ssd_plan.VLLM_DT, last="int32", fsi="int32", use_fsi=False)
    split = [dataclasses.replace(base, split=True), ssd_plan.states_spec(base), ssd_plan.combine_spec(base)]
    return [base, dt, *split] + ([dataclasses.replace(base, prefetch=True)] if several else [])


def predicted(case, seqlens, runs: int) -> float:
    t = ssd_plan.tiles(case.dim, case.dstate, case.chunk_size, torch.bfloat16)
    nchunks = sum(-(-n // case.chunk_size) for n in seqlens)
    ctas = case.heads * (case.dim // t.block_P)
    return ssd_plan.split_makespan(runs, nchunks, case.chunk_size // t.block_L, ctas, SMS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="falcon-h1-7b-tp1,granite-4.0-h-tiny-tp1,mamba2-2.7b-tp1")
    ap.add_argument("--batches", default="1x8192")
    ap.add_argument("--compile-only", action="store_true", help="compile the sweep's kernels and stop (no GPU)")
    ap.add_argument("--runs", default="2,3,4,5,6,8,10,11,12,16")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    cases = [SSD_CASES[c] for c in args.cases.split(",")]
    several = any(len(SSD_BATCHES[b]) > 1 for b in args.batches.split(","))
    specs = [s for c in cases for s in _specs(c, several)]
    failed = compile_parallel(specs, jobs=args.jobs, log=lambda m: print(m, flush=True))
    if failed:
        print(f"{failed} kernels failed to compile", flush=True)
    if args.compile_only:
        return 1 if failed else 0
    dev = torch.device("cuda")
    rows = []
    for case in cases:
        L = case.chunk_size
        for bname in args.batches.split(","):
            seqlens = SSD_BATCHES[bname]
            nwin = min(windows_for(nbytes(sum(seqlens), len(seqlens), case)), 4)
            wins = [make_window(case, seqlens, L, 17 + i, dev) for i in range(nwin)]
            nchunks = wins[0]["meta"].nchunks
            variants = [("auto", None), ("serial", None)]
            variants += [("split", int(r)) for r in args.runs.split(",") if 2 <= int(r) <= nchunks]
            for design, runs in variants:
                ctx = ssd_plan.forcing(design, runs) if design != "auto" else None
                t0 = time.perf_counter()
                try:
                    if ctx is not None:
                        ctx.__enter__()
                    fns = [mate_fn(w, L) for w in wins]
                    us = graph_time_us(fns, replays=10, repeats=args.repeats, device=dev)
                except Exception as exc:  # report and go on
                    print(f"{case.name} {bname} {design} {runs}: {type(exc).__name__}: {exc}", flush=True)
                    continue
                finally:
                    if ctx is not None:
                        ctx.__exit__(None, None, None)
                row = dict(case=case.name, batch=bname, design=design, runs=runs, us=round(us, 1),
                           model_tiles=round(predicted(case, seqlens, runs), 1) if runs else None,
                           seconds=round(time.perf_counter() - t0, 1))  # fmt: skip
                rows.append(row)
                print(row, flush=True)
            del wins
            torch.cuda.empty_cache()
    path = pathlib.Path(args.out) / "runs_sweep.json"
    path.write_text(json.dumps(dict(device=torch.cuda.get_device_name(0), rows=rows), indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
