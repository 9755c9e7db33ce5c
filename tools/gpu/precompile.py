"""Compile the TileLang kernels of the GPU tests and of the benchmarks before they run, in parallel processes.

    python tools/gpu/precompile.py [ssu|ssd|all] [--jobs N] [--pdl] [--list]

Each worker process calls MATE's public prewarm entry points (``mate.mamba.prewarm_selective_state_update``,
``mate.mamba.prewarm_ssd_combined_fwd_varlen``) for one configuration at a time. The kernels land in TileLang's
disk cache (``TILELANG_CACHE_DIR``, default ``~/.tilelang/cache``), so the first call of each configuration in
the tests and the benchmark loads a compiled kernel (~0.1 s) instead of compiling it (2-4 s each, one after
another). It only saves device time: without it the tests compile the same kernels themselves, and a test
case whose kernel is not among those prewarm compiles for its configuration (say, a call without D) still
compiles on first use.

The configurations are the benchmarks' cases (``mate.bench.ssu`` / ``mate.bench.ssd``) and every case of
``packages/mate-runtime/tests/gpu/test_ssu_kernels.py`` / ``test_ssd_kernels.py`` (their shapes and dtypes).
``--pdl`` adds the SSU kernels built with programmatic dependent launch (``mate bench ssu --pdl`` and the PDL
tests use them). Needs the GPU the tests will run on: prewarm compiles for the visible device.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing
import os
import pathlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_TESTS = ROOT / "packages" / "mate-runtime" / "tests" / "gpu"
_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32", torch.int64: "i64"}


def _test_cases(module_name: str) -> list:
    """Every case of a GPU test module: the first value of each ``pytest.param`` of a module-level list that is
    one of the module's ``Case`` records. An import failure is reported and yields no cases (the benchmark's
    configurations are still compiled)."""
    if str(GPU_TESTS) not in sys.path:
        sys.path.insert(0, str(GPU_TESTS))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a test module that needs something this machine lacks
        print(f"{module_name}: not imported ({type(exc).__name__}: {exc}); its cases are left out", flush=True)
        return []
    case_cls = getattr(module, "Case", None)
    cases = []
    for value in vars(module).values():
        if isinstance(value, list):
            for param in value:
                values = getattr(param, "values", None)
                if values and case_cls is not None and isinstance(values[0], case_cls):
                    cases.append(values[0])
    return cases


def ssu_configs() -> list[dict]:
    """Keyword arguments of ``prewarm_selective_state_update``, one per distinct configuration."""
    from mate.bench.ssu import warm_cases

    configs = []
    for c in warm_cases(False):
        s = c.shape
        configs.append(
            dict(
                state_dtype=c.state,
                io_dtype=torch.bfloat16,
                batch=1,
                heads=s.heads,
                dim=s.dim,
                dstate=s.dstate,
                groups=s.groups,
                slot_dtype=torch.int32,
                packed=c.T > 1,
                dt_dim=1,
            )
        )
    for c in _test_cases("test_ssu_kernels"):
        configs.append(
            dict(
                state_dtype=c.state,
                io_dtype=c.io,
                batch=1,
                heads=c.H,
                dim=c.P,
                dstate=c.N,
                groups=c.G,
                slot_dtype=getattr(c, "idx", torch.int32),
                packed=getattr(c, "form", "one") != "one",
                dt_dim=1 if getattr(c, "tied", True) else None,
            )
        )
    return _distinct(configs)


def ssd_configs() -> list[dict]:
    """Keyword arguments of ``prewarm_ssd_combined_fwd_varlen``, one per distinct configuration."""
    from mate.bench.ssd import PLAN, SSD_SHAPES

    configs = []
    for shape_name, _batches, chunks in PLAN:
        s = SSD_SHAPES[shape_name]
        for L in chunks:
            configs.append(
                dict(
                    heads=s.heads,
                    groups=s.groups,
                    dim=s.dim,
                    dstate=s.dstate,
                    chunk_size=L,
                    io_dtype=torch.bfloat16,
                    state_dtype=torch.float32,
                    dt_dtype=torch.float32,
                )
            )
    for c in _test_cases("test_ssd_kernels"):
        configs.append(
            dict(
                heads=c.H,
                groups=c.G,
                dim=c.P,
                dstate=c.N,
                chunk_size=c.chunk,
                io_dtype=c.io,
                state_dtype=c.state,
                dt_dtype=getattr(c, "dt_dtype", torch.float32),
            )
        )
    return _distinct(configs)


def _distinct(configs: list[dict]) -> list[dict]:
    return list({tuple(sorted(c.items(), key=lambda kv: kv[0])): c for c in configs}.values())


def label(op: str, config: dict, pdl: bool) -> str:
    text = " ".join(f"{k}={_NAMES.get(v, v)}" for k, v in config.items())
    return f"{op} {text}" + (" MATE_SSU_PDL=1" if pdl else "")


def prewarm(job: tuple[str, dict, bool]) -> tuple[str | None, float]:
    """One configuration, in a worker process: (error or None, seconds)."""
    from mate import mamba, settings

    op, config, pdl = job
    fn = mamba.prewarm_selective_state_update if op == "ssu" else mamba.prewarm_ssd_combined_fwd_varlen
    t0 = time.perf_counter()
    try:
        with settings.override(MATE_SSU_PDL="1") if pdl else contextlib.nullcontext():
            fn(**config)
    except Exception as exc:  # one failing configuration must not hide the others
        return f"{type(exc).__name__}: {exc}", time.perf_counter() - t0
    return None, time.perf_counter() - t0


def jobs_for(ops: list[str], pdl: bool) -> list[tuple[str, dict, bool]]:
    jobs = []
    if "ssu" in ops:
        configs = ssu_configs()
        jobs += [("ssu", c, False) for c in configs] + ([("ssu", c, True) for c in configs] if pdl else [])
    if "ssd" in ops:
        jobs += [("ssd", c, False) for c in ssd_configs()]
    return jobs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("op", nargs="?", default="all", choices=("ssu", "ssd", "all"), help="which kernels (default all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="worker processes (default: CPU count)")
    ap.add_argument("--pdl", action="store_true", help="also the SSU kernels built with programmatic dependent launch")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit (no GPU needed)")
    args = ap.parse_args(argv)
    jobs = jobs_for(["ssu", "ssd"] if args.op == "all" else [args.op], args.pdl)
    if args.list:
        for op, config, pdl in jobs:
            print(label(op, config, pdl))
        print(f"{len(jobs)} configurations")
        return 0
    if not torch.cuda.is_available():
        print("precompile: needs the GPU the tests run on (prewarm compiles for the visible device)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    failed, total = 0, 0.0
    # spawn: each worker starts its own CUDA context (a forked one cannot)
    with ProcessPoolExecutor(max(1, args.jobs), mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {ex.submit(prewarm, job): job for job in jobs}
        for fut in as_completed(futures):
            op, config, pdl = futures[fut]
            error, seconds = fut.result()
            total += seconds
            if error is None:
                print(f"precompiled {label(op, config, pdl)} in {seconds:.1f}s", flush=True)
            else:
                failed += 1
                print(f"FAILED {label(op, config, pdl)}: {error}", flush=True)
    print(
        f"precompiled {len(jobs) - failed} of {len(jobs)} configurations in {time.perf_counter() - t0:.1f}s "
        f"(sum {total:.0f}s, {args.jobs} workers){f'; {failed} failed' if failed else ''}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
