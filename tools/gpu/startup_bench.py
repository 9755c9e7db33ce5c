"""Startup benchmark: cold and warm times per kernel and per model configuration, each in a fresh process.

    python tools/gpu/startup_bench.py [--config DIR_OR_JSON] [--tp N] [--target sm_90a] [--jobs 1,16]
                                      [--out DIR] [--no-tilelang-warm] [--no-api]

Stages, each a new ``python -m mate.mamba prewarm`` process (or, for ``api``, a new process calling the public prewarm
functions), with empty temporary cache directories (``MATE_CACHE_DIR``, ``TILELANG_CACHE_DIR``) made here:

- ``cold jobs=J``: every kernel compiled, in J worker processes (``--jobs``; a comma list runs one cold stage
  per value, each from empty caches). With J=1 the per-kernel seconds are each compile's own, with its phases
  (factory build, lowering, code generation, nvcc, host wrapper, cache writes);
- ``warm``: a new process after the first cold stage: every kernel loaded from MATE's cache;
- ``tilelang-warm``: the same with ``MATE_CACHE_DIR=off``: TileLang's own disk cache only (the path before
  MATE's cache; it builds each ``T.prim_func`` again to hash it);
- ``api`` (on a GPU, without ``--target``): a new process calling ``prewarm_selective_state_update(packed=True,
  dt_dim=1)`` and ``prewarm_ssd_combined_fwd_varlen`` for the configuration from the warm cache, each timed.

The "ready" time of a stage is what ``mate-mamba prewarm`` reports for the prewarm work itself (imports aside: the
TileLang import is printed apart); "process" is the child's whole wall time. Without ``--target`` it compiles for
the local GPU (run it on the H200); ``--target sm_90a`` compiles only (a CPU machine). Writes ``startup.md`` and
``startup.json`` to ``--out`` (default: print only).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "packages" / "mate-runtime" / "tests" / "data" / "nemotron_h_8b" / "config.json"
LINE = re.compile(r"^\[(\d+)/(\d+)\] (.+?) ok ([\d.]+)s \(([^:)]+)(?:: ([^)]*))?\)")
SUMMARY = re.compile(
    r"^(\d+)/(\d+) kernels ready in ([\d.]+)s .*?: (\d+) compiled, (\d+) loaded from the cache, "
    r"(\d+) from TileLang's cache \(TileLang import ([\d.]+)s before\)"
)

API = """
import json, sys, time
import torch
t0 = time.perf_counter()
import tilelang  # noqa: F401
from mate.mamba import prewarm_selective_state_update, prewarm_ssd_combined_fwd_varlen
from mate.mamba._tilelang.cache import CACHE
from mate.mamba.prewarm_model import per_rank, read_config
imports = time.perf_counter() - t0
m = read_config(sys.argv[1])
heads, groups = per_rank(m, int(sys.argv[2]))
t = time.perf_counter()
prewarm_selective_state_update(state_dtype=torch.float32, io_dtype=torch.bfloat16, batch=1, heads=heads, dim=m.dim,
                               dstate=m.dstate, groups=groups, slot_dtype=torch.int32, packed=True, dt_dim=1)
ssu = time.perf_counter() - t
t = time.perf_counter()
prewarm_ssd_combined_fwd_varlen(heads, groups, m.dim, m.dstate, m.chunk_size, torch.bfloat16, torch.float32,
                                torch.float32)
ssd = time.perf_counter() - t
print(json.dumps({"imports": imports, "ssu": ssu, "ssd": ssd, "compiles": CACHE.compiles,
                  "loads": CACHE.disk_loads}))
"""


def run_prewarm(config, tp, target, jobs, env) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "mate.mamba",
        "prewarm",
        str(config),
        "--tp",
        str(tp),
        "--jobs",
        str(jobs),
        "--verbose",
    ]
    if target:
        cmd += ["--target", target]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    kernels, summary = [], None
    for line in p.stdout.splitlines():
        if m := LINE.match(line):
            kernels.append({"label": m.group(3), "seconds": float(m.group(4)), "how": m.group(5),
                            "phases": m.group(6) or ""})  # fmt: skip
        elif m := SUMMARY.match(line):
            summary = {"ready": float(m.group(3)), "compiled": int(m.group(4)), "loaded": int(m.group(5)),
                       "from_tilelang": int(m.group(6)), "tilelang_import": float(m.group(7))}  # fmt: skip
    if summary is None:
        sys.exit(f"no summary line in the output of {' '.join(cmd)}:\n{p.stdout[-3000:]}")
    return {"kernels": kernels, **summary, "process": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="a model directory or config.json")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--target", default=None, help="compile only for this arch (e.g. sm_90a); default: this GPU")
    ap.add_argument("--jobs", default=None, help="worker processes of the cold stages, e.g. 1,16 (default: cores)")
    ap.add_argument("--out", default=None, help="write startup.md and startup.json here")
    ap.add_argument("--no-tilelang-warm", action="store_true", help="skip the TileLang-cache-only warm stage")
    ap.add_argument("--no-api", action="store_true", help="skip the public prewarm functions' stage")
    args = ap.parse_args(argv)
    jobs = [int(j) for j in args.jobs.split(",")] if args.jobs else [len(os.sched_getaffinity(0))]

    results: dict = {"config": args.config, "tp": args.tp, "target": args.target or "this GPU", "stages": {}}
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    results["commit"] = commit.stdout.strip()
    results["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="mate-startup-") as tmp:
        first_env = None
        for i, j in enumerate(jobs):
            env = {**os.environ, "MATE_CACHE_DIR": f"{tmp}/mate{i}", "TILELANG_CACHE_DIR": f"{tmp}/tl{i}"}
            name = f"cold jobs={j}"
            print(f"{name} ...", flush=True)
            results["stages"][name] = run_prewarm(args.config, args.tp, args.target, j, env)
            first_env = first_env or env
        print("warm ...", flush=True)
        results["stages"]["warm"] = run_prewarm(args.config, args.tp, args.target, 1, first_env)
        if not args.no_tilelang_warm:
            print("tilelang-warm ...", flush=True)
            results["stages"]["tilelang-warm"] = run_prewarm(
                args.config, args.tp, args.target, 1, {**first_env, "MATE_CACHE_DIR": "off"}
            )
        if not args.no_api and not args.target:
            print("api ...", flush=True)
            t0 = time.perf_counter()
            cfg = args.config if args.config.endswith(".json") else os.path.join(args.config, "config.json")
            p = subprocess.run([sys.executable, "-c", API, cfg, str(args.tp)], env=first_env, capture_output=True,
                               text=True)  # fmt: skip
            if p.returncode != 0:
                sys.exit(f"api stage failed:\n{p.stderr[-3000:]}")
            results["stages"]["api"] = {**json.loads(p.stdout.strip().splitlines()[-1]),
                                        "process": time.perf_counter() - t0}  # fmt: skip

    md = report(results)
    print(md)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "startup.md").write_text(md)
        (out / "startup.json").write_text(json.dumps(results, indent=1))
    return 0


def report(r: dict) -> str:
    lines = [f"# Startup: {r['config']} (tp {r['tp']}, {r['target']})", "",
             f"Measured {r['date']} at {r['commit']}.", "",
             "| stage | ready (s) | compiled | loaded (MATE) | TileLang cache | TileLang import (s) | process (s) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, s in r["stages"].items():
        if name == "api":
            continue
        lines.append(f"| {name} | {s['ready']:.2f} | {s['compiled']} | {s['loaded']} | {s['from_tilelang']} "
                     f"| {s['tilelang_import']:.1f} | {s['process']:.1f} |")  # fmt: skip
    if "api" in r["stages"]:
        a = r["stages"]["api"]
        lines += ["", "Public prewarm functions, warm MATE cache, new process: prewarm_selective_state_update "
                      f"{a['ssu']:.2f} s, prewarm_ssd_combined_fwd_varlen {a['ssd']:.2f} s "
                      f"(imports {a['imports']:.1f} s; {a['compiles']} compiles, {a['loads']} loads)."]  # fmt: skip
    names = [n for n in r["stages"] if n != "api"]
    lines += ["", "Per kernel (seconds; a cold stage with jobs > 1 overlaps its compiles):", "",
              "| kernel | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]  # fmt: skip
    for i, k in enumerate(r["stages"][names[0]]["kernels"]):
        cells = []
        for n in names:
            ks = r["stages"][n]["kernels"]
            cells.append(f"{ks[i]['seconds']:.2f}" if i < len(ks) else "")
        lines.append(f"| {k['label']} | " + " | ".join(cells) + " |")
    cold1 = [n for n in names if n == "cold jobs=1"]
    if cold1:
        lines += ["", "Where each compile's time goes (cold jobs=1):", ""]
        lines += [f"- {k['label']}: {k['phases']}" for k in r["stages"][cold1[0]]["kernels"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
