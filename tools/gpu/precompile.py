"""Compile the TileLang kernels of the GPU tests and of the benchmarks before they run, in parallel processes.

    python tools/gpu/precompile.py [ssu|ssd|ssd-quantized|ssd-bench|replay|all] [--jobs N] [--pdl] [--list]

The kernels are the exact specs the planners give: every case of
``packages/mate-runtime/tests/gpu/test_ssu_kernels.py`` (and ``test_ssu_quantized_kernels.py``) /
``test_ssd_kernels.py`` (and ``test_ssd_quantized_kernels.py``) is built on the CPU and asked
``mate.mamba.plan_selective_state_update`` / ``plan_ssd_combined_fwd_varlen`` which kernels it launches (CPU
tensors are planned as for an H200, the machine the tests run on), plus what a served model uses at the
benchmarks' shapes (``mate.mamba._tilelang.ssu_plan.serving_specs`` / ``ssd_plan.serving_specs``), and the prefetching
scan where a test plans several sequences per CTA. The workers compile for sm_90a
without a GPU and fill TileLang's disk cache (``TILELANG_CACHE_DIR``, default ``~/.tilelang/cache``), so the
first call of each kernel in the tests and the benchmark loads it (~1 s) instead of compiling it (2-4 s for an
SSU kernel, 20-70 s for an SSD scan). It only saves device time: without it the tests compile what they need.

``--pdl`` adds the SSU kernels built with programmatic dependent launch (``mate-mamba bench ssu --pdl`` and the PDL
tests use them).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_TESTS = ROOT / "packages" / "mate-runtime" / "tests" / "gpu"


def _test_module(name: str):
    if str(GPU_TESTS) not in sys.path:
        sys.path.insert(0, str(GPU_TESTS))
    module = importlib.import_module(name)
    module.DEVICE = "cpu"  # (the SSU module builds its tensors there; the SSD one takes a device argument)
    return module


CASE_FILTER: str | None = None  # --cases: only the test cases whose pytest id contains this


def _cases(module) -> list:
    """The first value of each ``pytest.param`` of a module-level list that is one of the module's ``Case``s
    (with ``--cases``, only those whose id contains it)."""
    out = []
    for value in vars(module).values():
        if isinstance(value, list):
            for param in value:
                values = getattr(param, "values", None)
                if values and isinstance(values[0], module.Case):
                    if CASE_FILTER is None or CASE_FILTER in (getattr(param, "id", None) or ""):
                        out.append(values[0])
    return out


def ssu_specs(pdl: bool) -> list:
    from mate.mamba._tilelang import ssu_plan
    from mate.mamba.bench.ssu import warm_cases
    from mate.mamba.planning import plan_selective_state_update

    t = _test_module("test_ssu_kernels")
    specs = []
    extra = [t.Case(H=2, G=1, P=32, N=32, batch=2), t.Case(H=6, G=3, P=64, N=64, batch=3)]
    for c in _cases(t) + extra:
        kw, _, parent = t.build(c, 0)
        specs += plan_selective_state_update(**kw, retrieve_parent_token=parent)
    q = _test_module("test_ssu_quantized_kernels")  # every block-scaled case, in each quantised dtype
    for c in _cases(q):
        for dtype in (p.values[0] for p in q.QDTYPES):
            kw, _, parent = q.build_quantised(c, dtype, 0)
            specs += plan_selective_state_update(**kw, retrieve_parent_token=parent)
    for c in warm_cases(False):
        s = c.shape
        for packed in (False, True):
            specs += ssu_plan.serving_specs(
                state_dtype=c.state, io_dtype=torch.bfloat16, heads=s.heads, dim=s.dim, dstate=s.dstate,
                groups=s.groups, slot_dtype=torch.int32, packed=packed, meta_dtype=torch.int32, tie_hdim=True,
            )  # fmt: skip
    specs += ssu_plan.serving_specs(
        state_dtype=torch.bfloat16, io_dtype=torch.bfloat16, heads=6, dim=64, dstate=64, groups=3,
        slot_dtype=torch.int32, packed=True, meta_dtype=torch.int32, tie_hdim=True,
    )  # fmt: skip
    if pdl:
        specs += [dataclasses.replace(s, pdl=True) for s in specs]
    return list(dict.fromkeys(specs))


def ssd_specs() -> list:
    from mate.mamba._tilelang import ssd_plan
    from mate.mamba.bench.shapes import SSD_CASES
    from mate.mamba.bench.ssd import build_parser, build_plan
    from mate.mamba.planning import plan_ssd_combined_fwd_varlen

    t = _test_module("test_ssd_kernels")
    specs = []
    several = [p.values[0] for p in t.SPC_CASES]  # (cases planned with several sequences per CTA: the prefetch)
    for c in _cases(t):
        kw = t.build(c, dev="cpu")
        if c.pool:
            batch = len(c.seqlens)
            kw.update(
                final_states_out=torch.zeros(batch + 5, c.H, c.P, c.N, dtype=c.state),
                final_state_indices=torch.arange(batch, dtype=torch.int32),
            )
        try:
            planned = plan_ssd_combined_fwd_varlen(**kw)
        except NotImplementedError:  # the cases that test the refusal
            continue
        specs += planned
        if c in several or c == t.GRAPH_CASE:
            specs += [dataclasses.replace(s, prefetch=True) for s in planned if s.factory == "ssd_fused_kernel"]
        # every case as the split design plans it too (the split tests force it on these shapes)
        with ssd_plan.forcing("split", runs=3):
            specs += plan_ssd_combined_fwd_varlen(**kw)
    if CASE_FILTER is not None:  # only the selected test cases
        return list(dict.fromkeys(specs))
    specs += ssd_quantized_specs()
    bench = [p for quick in ([], ["--quick"]) for p in build_plan(build_parser().parse_args(quick))]
    for case_name, L in dict.fromkeys((p.case, p.chunk) for p in bench):  # mate-mamba bench ssd's cases, with --quick
        s = SSD_CASES[case_name]
        served = ssd_plan.serving_specs(
            heads=s.heads, groups=s.groups, dim=s.dim, dstate=s.dstate, chunk_size=L, io_dtype=torch.bfloat16,
            state_dtype=torch.float32, dt_dtype=torch.float32,
        )  # fmt: skip
        # both designs of every case (`mate-mamba bench ssd --designs serial,split`)
        base = served[0]
        specs += served + [dataclasses.replace(base, split=True), ssd_plan.states_spec(base),
                           ssd_plan.combine_spec(base)]  # fmt: skip
    return list(dict.fromkeys(specs))


def ssd_bench_specs(argv: list[str]) -> list:
    """Exactly the kernels ``mate-mamba bench ssd ARGV`` runs: each cell's call planned on the CPU (as for an H200) with
    the planner's pick and with each design held."""
    from mate.mamba._tilelang import ssd_plan
    from mate.mamba.bench.shapes import SSD_BATCHES, SSD_CASES, SSD_LAYOUTS
    from mate.mamba.bench.ssd import build_parser, build_plan, make_window, mate_args
    from mate.mamba.planning import plan_ssd_combined_fwd_varlen

    specs = []
    for cell in build_plan(build_parser().parse_args(argv)):
        w = make_window(SSD_CASES[cell.case], SSD_BATCHES[cell.batch], cell.chunk, 0, "cpu",
                        layout=SSD_LAYOUTS.get(cell.batch))  # fmt: skip
        args, kwargs = mate_args(w, cell.chunk)
        specs += plan_ssd_combined_fwd_varlen(*args, **kwargs)
        for design in ssd_plan.DESIGNS:
            with ssd_plan.forcing(design):
                try:
                    specs += plan_ssd_combined_fwd_varlen(*args, **kwargs)
                except NotImplementedError:  # a design that cannot serve the cell (the bench reports it)
                    pass
    return list(dict.fromkeys(specs))


def ssd_quantized_specs() -> list:
    """The kernels of ``test_ssd_quantized_kernels`` (its cases on a pool of each quantised dtype)."""
    from mate.mamba._tilelang import ssd_plan
    from mate.mamba.planning import plan_ssd_combined_fwd_varlen

    t = _test_module("test_ssd_kernels")
    specs = []
    q = _test_module("test_ssd_quantized_kernels")
    for c in _cases(q):
        for dtype in (p.values[0] for p in q.QDTYPES):
            kw = t.build(dataclasses.replace(c, state=torch.float32), dev="cpu")
            batch = len(c.seqlens)
            if c.init:
                kw.update(initial_states=torch.zeros(batch, c.H, c.P, c.N, dtype=dtype),
                          initial_states_scale=torch.ones(batch, c.H, c.P))  # fmt: skip
            if c.state != torch.float32:
                kw["state_dtype"] = c.state
            if c.pool:
                kw.update(
                    final_states_out=torch.zeros(batch + 5, c.H, c.P, c.N, dtype=dtype),
                    final_state_indices=torch.arange(batch, dtype=torch.int64 if c.extra else torch.int32),
                    final_states_scale=torch.ones(batch + 5, c.H, c.P),
                )
            specs += plan_ssd_combined_fwd_varlen(**kw)
            if len(c.seqlens) == 1:  # (the split test forces the split design on it)
                with ssd_plan.forcing("split"):
                    specs += plan_ssd_combined_fwd_varlen(**kw)
    return list(dict.fromkeys(specs))


def replay_specs() -> list:
    """The ReplaySSM kernels of ``test_replay_kernels`` and of ``mate-mamba bench replay``."""
    from mate.mamba._tilelang import replay_plan
    from mate.mamba.bench.replay import serving_configs
    from mate.mamba.planning import plan_replay_state_update

    t = _test_module("test_replay_kernels")
    specs = []
    for c in _cases(t):
        pool, kw = t.build(c, 0, dev="cpu")
        for design in replay_plan.DESIGNS:  # (the test runs each case through both designs)
            with replay_plan.forcing(design):
                specs += plan_replay_state_update(*pool.values(), **kw)
    for cfg in serving_configs():
        specs += replay_plan.serving_specs(**cfg)
    return list(dict.fromkeys(specs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "op",
        nargs="?",
        default="all",
        choices=("ssu", "ssd", "ssd-quantized", "ssd-bench", "replay", "all"),
        help="which kernels (default all; ssd-quantized: those of the quantised-pool SSD tests; ssd-bench: those "
        "`mate-mamba bench ssd` runs with the arguments of --bench-args)",
    )
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="worker processes (default: CPU count)")
    ap.add_argument("--pdl", action="store_true", help="also the SSU kernels built with programmatic dependent launch")
    ap.add_argument("--list", action="store_true", help="print the kernel specs and exit")
    ap.add_argument(
        "--cases", default=None, metavar="SUBSTR",
        help="ssd: only the SSD tests' cases whose pytest id contains SUBSTR (no benchmark kernels)",
    )  # fmt: skip
    ap.add_argument(
        "--bench-args", default="", metavar="ARGS",
        help="ssd-bench: the arguments of the `mate-mamba bench ssd` run to compile for (default: none, the registry)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    global CASE_FILTER
    CASE_FILTER = args.cases
    specs = []
    if args.op in ("ssd", "all"):  # the long compiles first
        specs += ssd_specs()
    elif args.op == "ssd-quantized":
        specs += ssd_quantized_specs()
    elif args.op == "ssd-bench":
        specs += ssd_bench_specs(args.bench_args.split())
    if args.op in ("ssu", "all"):
        specs += ssu_specs(args.pdl)
    if args.op in ("replay", "all"):
        specs += replay_specs()
    if args.list:
        for s in specs:
            print(s)
        print(f"{len(specs)} kernels")
        return 0
    from mate.mamba._tilelang.cache import compile_parallel

    failed = compile_parallel(specs, jobs=args.jobs, log=lambda m: print(m, flush=True))
    print(f"precompiled {len(specs) - failed} of {len(specs)} kernels{f'; {failed} failed' if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
