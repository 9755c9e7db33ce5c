"""Lower and compile every kernel spec of the compile grid, without a GPU.

``python -m mate.mamba._tilelang.compile_check [--only ssu|replay|ssd|norm|conv1d|decode_step] [--arch sm_90a]
[--sources FILE] [--jobs N]`` prints one line per spec, in grid order (``[3/24] ssu <spec> ok 2.1s``), and exits
non-zero if any failed. CI runs it on the CPU machine (nvcc is there), proving that every kernel still lowers and
compiles for Hopper. ``--jobs``: worker processes compiling specs side by side (default: the CPUs this process may
use; 1 compiles in this process).

``--sources FILE``: a JSON map from ``str(spec)`` to the sha256 of its generated CUDA source. Every spec the file
names must generate exactly that source (the default kernels' code may not change unnoticed: a refactor of the
planner or the factories that is meant to keep them must keep them byte for byte); ``--write-sources`` records
the current sources' hashes instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import multiprocessing
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor


def grid(only: str | None = None) -> list:
    """The compile grid's specs (``only``: one family)."""
    from mate.mamba._tilelang import conv1d, decode_step, norm, replay, ssd, ssu

    specs = []
    if only in (None, "ssu"):
        specs += ssu.compile_grid()
    if only in (None, "replay"):
        specs += replay.compile_grid()
    if only in (None, "ssd"):
        specs += ssd.compile_grid()
    if only in (None, "norm"):
        specs += norm.compile_grid()
    if only in (None, "conv1d"):
        specs += conv1d.compile_grid()
    if only in (None, "decode_step"):
        specs += decode_step.compile_grid()
    return specs


def source_sha256(kern) -> str:
    return hashlib.sha256(kern.get_kernel_source().encode()).hexdigest()


def _init_worker() -> None:
    import tilelang

    # TileLang logs every compile at INFO (its import sets the level, so after the import)
    logging.getLogger(tilelang.__name__).setLevel(logging.WARNING)


def _compile(job: tuple) -> tuple:
    """Compile one spec: (sha256 of its source, None, seconds), or (None, (error line, traceback), seconds)."""
    from mate.mamba._tilelang.cache import compile_prim_func

    spec, target = job
    t0 = time.perf_counter()
    try:
        kern = compile_prim_func(spec.build(), target=target, pass_configs=spec.pass_configs())
    except Exception as exc:  # reported by the caller, which fails the run after every spec
        return None, (f"{type(exc).__name__}: {exc}", traceback.format_exc()), time.perf_counter() - t0
    return source_sha256(kern), None, time.perf_counter() - t0


def _results(jobs: list, n: int):
    """``_compile`` of every job, in order; ``n`` > 1: in that many worker processes, each importing TileLang once
    and compiling many specs. Spawned, not forked: a fork of a process with TileLang loaded is not safe; and a
    worker that dies (a crash in TileLang or nvcc) raises BrokenProcessPool here instead of hanging the run."""
    if n <= 1 or len(jobs) <= 1:
        _init_worker()
        yield from map(_compile, jobs)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(n, len(jobs)), mp_context=ctx, initializer=_init_worker) as pool:
        yield from pool.map(_compile, jobs)  # one spec at a time: they take 1-70 s, in no useful order


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mate.mamba._tilelang.compile_check", description=__doc__.split("\n\n")[0]
    )
    families = ("ssu", "replay", "ssd", "norm", "conv1d", "decode_step")
    ap.add_argument("--only", choices=families, default=None, help="compile one kernel family only")
    ap.add_argument("--arch", default="sm_90a", help="CUDA arch to compile for (default sm_90a)")
    ap.add_argument("--sources", default=None, help="JSON map str(spec) -> sha256 of the generated CUDA to check")
    ap.add_argument("--write-sources", action="store_true", help="write the hashes to --sources instead")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: the usable CPUs)")
    args = ap.parse_args(argv)
    from mate.mamba._tilelang.cache import default_jobs

    expected: dict = {}
    if args.sources and not args.write_sources:
        with open(args.sources) as f:
            expected = json.load(f)
    target = {"kind": "cuda", "arch": args.arch}
    specs = grid(args.only)
    failed, changed, seen = 0, 0, {}
    t_all = time.perf_counter()
    results = _results([(spec, target) for spec in specs], args.jobs or default_jobs())
    for i, (spec, (digest, error, seconds)) in enumerate(zip(specs, results, strict=True), 1):
        head = f"[{i}/{len(specs)}] {spec.family} {spec}"
        if error is not None:  # report every failure, then fail the run
            failed += 1
            print(f"{head} FAILED: {error[0]}", flush=True)
            print(error[1], file=sys.stderr, end="", flush=True)
            continue
        seen[str(spec)] = digest
        note = ""
        want = expected.get(str(spec))
        if want is not None and want != digest:
            changed += 1
            note = f" GENERATED CODE CHANGED (sha256 {digest[:12]}, expected {want[:12]})"
        elif want is not None:
            note = " (source as recorded)"
        print(f"{head} ok {seconds:.1f}s{note}", flush=True)
    missing = [k for k in expected if k not in seen] if not args.only else []
    for k in missing:
        print(f"recorded spec not in the compile grid: {k}")
    if args.write_sources and args.sources:
        with open(args.sources, "w") as f:
            json.dump(seen, f, indent=1, sort_keys=True)
            f.write("\n")
    print(
        f"compile check: {len(specs) - failed} ok, {failed} failed, {changed} changed sources, "
        f"{time.perf_counter() - t_all:.0f}s total"
    )
    return 1 if failed or changed or missing or not specs else 0


if __name__ == "__main__":
    sys.exit(main())
