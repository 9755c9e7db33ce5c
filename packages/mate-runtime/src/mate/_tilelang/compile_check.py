"""Lower and compile every kernel configuration of a representative prewarm grid, without a GPU.

``python -m mate._tilelang.compile_check [--only ssu|ssd] [--target sm_90a]`` prints one line per
configuration (``ssu <label> ok 2.1s``) and exits non-zero if any failed. CI runs it on the CPU machine
(nvcc is there), proving that every kernel still lowers and compiles for Hopper.

Each kernel family's launcher module exposes ``compile_grid() -> list[CompileItem]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CompileItem:
    family: str  # "ssu" | "ssd"
    label: str  # the configuration, human readable
    build: Callable[[], object]  # returns the T.prim_func
    pass_configs: dict = field(default_factory=dict)


def _grid(only: str | None) -> list[CompileItem]:
    from . import ssd, ssu

    items: list[CompileItem] = []
    for fam, mod in (("ssu", ssu), ("ssd", ssd)):
        if only in (None, fam):
            items.extend(mod.compile_grid())
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mate._tilelang.compile_check")
    ap.add_argument("--only", choices=("ssu", "ssd"), default=None)
    ap.add_argument("--arch", default="sm_90a", help="CUDA arch to compile for (default sm_90a)")
    args = ap.parse_args(argv)

    from .cache import compile_prim_func

    target = {"kind": "cuda", "arch": args.arch}
    items = _grid(args.only)
    failed = 0
    t_all = time.perf_counter()
    for item in items:
        t0 = time.perf_counter()
        try:
            compile_prim_func(item.build(), target=target, pass_configs=item.pass_configs)
            print(f"{item.family} {item.label} ok {time.perf_counter() - t0:.1f}s", flush=True)
        except Exception as exc:  # report every failure, then fail the run
            failed += 1
            print(f"{item.family} {item.label} FAILED: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc(file=sys.stderr)
    print(f"compile check: {len(items) - failed} ok, {failed} failed, {time.perf_counter() - t_all:.0f}s total")
    return 1 if failed or not items else 0


if __name__ == "__main__":
    sys.exit(main())
