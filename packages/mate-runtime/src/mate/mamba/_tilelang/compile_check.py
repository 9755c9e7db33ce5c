"""Lower and compile every kernel spec of the compile grid, without a GPU.

``python -m mate.mamba._tilelang.compile_check [--only ssu|replay|ssd|norm|conv1d|decode_step] [--arch sm_90a]
[--sources FILE] [--jobs N]`` prints one line per spec as it completes (``[3/24] ssu <spec> ok 2.1s (compiled)``),
then every failed or changed spec again, and exits non-zero if any failed. CI runs it on the CPU machine (nvcc is
there), proving that every kernel still lowers and compiles for Hopper. The specs are compiled by
:func:`.cache.compile_parallel` with MATE's disk cache off (every spec really compiles; TileLang's own cache is the
caller's to empty), in ``--jobs`` worker processes (default: the CPUs this process may use).

``--sources FILE``: a JSON map from ``str(spec)`` to the sha256 of its generated CUDA source. Every spec the file
names must generate exactly that source (the default kernels' code may not change unnoticed: a refactor of the
planner or the factories that is meant to keep them must keep them byte for byte); ``--write-sources`` records
the current sources' hashes instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


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
    from mate.mamba._platform import settings
    from mate.mamba._tilelang.cache import compile_parallel, default_jobs

    expected: dict = {}
    if args.sources and not args.write_sources:
        with open(args.sources) as f:
            expected = json.load(f)
    target = {"kind": "cuda", "arch": args.arch}
    specs = grid(args.only)
    t_all = time.perf_counter()
    results: dict = {}
    with settings.override(MATE_CACHE_DIR="off"):  # a loaded entry would prove nothing
        compile_parallel(specs, target=target, jobs=args.jobs or default_jobs(), results=results,
                         name=lambda spec: f"{spec.family} {spec}", log=lambda m: print(m, flush=True))  # fmt: skip
    failed, changed, seen = 0, 0, {}
    for i, spec in enumerate(specs, 1):
        _, error, _, _, digest = results[spec]
        head = f"[{i}/{len(specs)}] {spec.family} {spec}"
        if error is not None:  # every failure reported (its traceback is above, from its worker), then the run fails
            failed += 1
            print(f"{head} FAILED: {error}", flush=True)
            continue
        seen[str(spec)] = digest
        want = expected.get(str(spec))
        if want is not None and want != digest:
            changed += 1
            print(f"{head} GENERATED CODE CHANGED (sha256 {digest[:12]}, expected {want[:12]})", flush=True)
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
