"""Compile every SSD kernel the GPU tests and the benchmark use, in parallel processes (fills TileLang's disk
cache before ``pytest -m gpu``): ``python packages/mate-runtime/tests/gpu/ssd_precompile.py [--jobs N]``.
Runs on a machine without a GPU too (the calls are built on the CPU only to derive the kernel keys)."""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))


def _under(env: dict, keys, jobs) -> None:
    """Compile ``keys`` with ``env`` set: the tuning and opt-in variables are read when a worker makes a kernel's
    builder, and the workers start with this process's environment. ``keys`` may be a function, called under
    ``env`` (for the options that change the kernel keys themselves)."""
    from mate._tilelang import ssd as tl_ssd

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        keys = keys() if callable(keys) else keys
        tl_ssd.precompile(list(dict.fromkeys(keys)), jobs=jobs, log=lambda m: print(m, flush=True))
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def _bench_keys() -> list:
    """The kernel keys of the benchmark's plan (final states only), under the settings in force."""
    from mate._tilelang import ssd as tl_ssd
    from mate.bench.ssd import PLAN, SSD_SHAPES

    bench = []
    for shape_name, _b, chunks in PLAN:
        s = SSD_SHAPES[shape_name]
        for L in chunks:
            for kind in tl_ssd.VARIANTS:
                fk, rk = tl_ssd.prewarm_keys(heads=s.heads, groups=s.groups, dim=s.dim, dstate=s.dstate,
                                             chunk_size=L, io_dtype=torch.bfloat16, state_dtype=torch.float32,
                                             dt_dtype=torch.float32, kind=kind)  # fmt: skip
                # the benchmark returns final states: no intermediate-state kernels
                bench.extend([k for k in fk if k[-1] is not True] + list(rk))
    return bench


GROUPS = "defaults,bench,settings,hpc,prev,dt,dtruns,prefetch,tenth"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--only-tests", action="store_true")
    ap.add_argument("--defaults-only", action="store_true", help="skip the opt-in and previous settings' kernels")
    ap.add_argument("--groups", default=GROUPS, help=f"comma-separated subset of {GROUPS}")
    args = ap.parse_args(argv)
    import test_ssd_kernels as t
    from mate._tilelang import ssd as tl_ssd

    def keys_of(case, kind):
        return list(tl_ssd.kernel_keys(t.normalized_call(case), kind))

    tests = [k for p in t.CASES + t.NARROW_P_CASES for kind in tl_ssd.VARIANTS for k in keys_of(p.values[0], kind)]
    bench = [] if args.only_tests else _bench_keys()
    keys = list(dict.fromkeys(tests + bench))
    print(f"{len(keys)} kernels", flush=True)
    groups = set(args.groups.split(","))
    if "defaults" in groups:
        tl_ssd.precompile(keys, jobs=args.jobs, log=lambda m: print(m, flush=True))
    if "bench" in groups and "defaults" not in groups:  # the benchmark's kernels alone (defaults has them)
        tl_ssd.precompile(_bench_keys(), jobs=args.jobs, log=lambda m: print(m, flush=True))
    if args.defaults_only:
        return 0
    # the opt-in options' kernels: those of their GPU tests and of the benchmark's option impls (mate-lean+...)
    bench_lean = [k for k in bench if k[0] == "ssd_lean"]
    graph = keys_of(t.GRAPH_CASE, "lean")[:1]
    if "settings" in groups:  # each off setting, with the runs and dt kernels its tests use
        settings = [k for p in t.LEAN_OPTION_CASES for k in keys_of(p.values[0], "lean")]
        for env in (tl_ssd.OVERLAP_ENV, tl_ssd.PRELOAD_ENV, tl_ssd.DEFERRED_STORE_ENV):
            _under({env: "0"}, settings + graph, args.jobs)
    if "hpc" in groups:  # (under MATE_SSD_HEADS_PER_CTA a worker compiles every variant a launch may pick)
        hpc = [k for p in t.HPC_CASES for k in keys_of(p.values[0], "lean")[:1]]
        for ovl in ("0", "1"):
            _under({tl_ssd.HPC_ENV: "8", tl_ssd.OVERLAP_ENV: ovl}, hpc + graph + bench_lean, args.jobs)
    if "prev" in groups:  # the sixth session's defaults (mate-lean+nodtruns: the runs kernel, its pre-pass)
        _under({tl_ssd.RUNS_IN_DT_ENV: "0"}, lambda: [k for k in _bench_keys() if k[0] in ("ssd_runs", "ssd_dt")],
               args.jobs)  # fmt: skip
    if "dtruns" in groups:  # the runs-table tests' kernels, the pre-pass with and without the runs table

        def runs_keys():  # (under the setting: it changes the pre-pass keys)
            cases = [p.values[0] for p in t.RUNS_IN_DT_CASES] + [t.GRAPH_CASE]
            return [k for c in cases for kind in ("lean", "prepass") for k in keys_of(c, kind)]

        for merged in ("1", "0"):
            _under({tl_ssd.RUNS_IN_DT_ENV: merged}, runs_keys, args.jobs)
    if "prefetch" in groups:  # the lean kernels with the L2 prefetch: its tests' and the benchmark's
        pf = [k for p in t.SPC_CASES for k in keys_of(p.values[0], "lean")[:1]]
        _under({tl_ssd.PREFETCH_ENV: "1"}, pf + graph + bench_lean, args.jobs)
    if "tenth" in groups:  # the benchmark's lean kernels without the tenth session's deferred output-store wait
        _under({tl_ssd.DEFERRED_STORE_ENV: "0"}, bench_lean + graph, args.jobs)
        _under({tl_ssd.DEFERRED_STORE_ENV: "0", tl_ssd.PREFETCH_ENV: "1"}, bench_lean, args.jobs)
    if "dt" in groups:  # the dt cases' kernels, with both pre-pass settings
        dt = [k for p in t.DT_HEADS_CASES for kind in ("lean", "prepass") for k in keys_of(p.values[0], kind)]
        for n in ("1", "8"):
            _under({tl_ssd.DT_HEADS_ENV: n}, dt, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
