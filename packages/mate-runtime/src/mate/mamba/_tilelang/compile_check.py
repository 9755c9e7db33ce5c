"""Lower and compile every kernel spec of the compile grid, without a GPU.

``python -m mate.mamba._tilelang.compile_check [--only ssu|replay|ssd|norm|conv1d|decode_step] [--arch sm_90a]
[--sources FILE]`` prints one line per spec (``[3/24] ssu <spec> ok 2.1s``) and exits non-zero if any failed. CI
runs it on the CPU machine (nvcc is there), proving that every kernel still lowers and compiles for Hopper.

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
import sys
import time
import traceback


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mate.mamba._tilelang.compile_check", description=__doc__.split("\n\n")[0]
    )
    families = ("ssu", "replay", "ssd", "norm", "conv1d", "decode_step")
    ap.add_argument("--only", choices=families, default=None, help="compile one kernel family only")
    ap.add_argument("--arch", default="sm_90a", help="CUDA arch to compile for (default sm_90a)")
    ap.add_argument("--sources", default=None, help="JSON map str(spec) -> sha256 of the generated CUDA to check")
    ap.add_argument("--write-sources", action="store_true", help="write the hashes to --sources instead")
    args = ap.parse_args(argv)

    import tilelang

    # TileLang logs every compile at INFO (its import sets the level, so after the import)
    logging.getLogger(tilelang.__name__).setLevel(logging.WARNING)
    from mate.mamba._tilelang.cache import compile_prim_func

    expected: dict = {}
    if args.sources and not args.write_sources:
        with open(args.sources) as f:
            expected = json.load(f)
    target = {"kind": "cuda", "arch": args.arch}
    specs = grid(args.only)
    failed, changed, seen = 0, 0, {}
    t_all = time.perf_counter()
    for i, spec in enumerate(specs, 1):
        t0 = time.perf_counter()
        head = f"[{i}/{len(specs)}] {spec.family} {spec}"
        try:
            kern = compile_prim_func(spec.build(), target=target, pass_configs=spec.pass_configs())
        except Exception as exc:  # report every failure, then fail the run
            failed += 1
            print(f"{head} FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc(file=sys.stderr)
            continue
        digest = seen[str(spec)] = source_sha256(kern)
        note = ""
        want = expected.get(str(spec))
        if want is not None and want != digest:
            changed += 1
            note = f" GENERATED CODE CHANGED (sha256 {digest[:12]}, expected {want[:12]})"
        elif want is not None:
            note = " (source as recorded)"
        print(f"{head} ok {time.perf_counter() - t0:.1f}s{note}", flush=True)
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
