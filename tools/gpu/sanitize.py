"""compute-sanitizer memcheck, racecheck and synccheck over every kernel path, and memcheck with garbage tables.

    python tools/gpu/sanitize.py [--tools memcheck,racecheck,synccheck] [--paths ssu-one,ssu-packed,ssd,garbage]
                                 [--timeout SECONDS] [--skip-warm] [--sanitizer PATH]

What runs, in this order:

1. warm-up, outside the sanitizer: the kernels every path launches are compiled in ``--jobs`` processes into
   TileLang's disk cache (``TILELANG_CACHE_DIR``), then every path runs once, each valid call checked against the
   reference backend; the sanitized runs then load the kernels instead of compiling them (a compile under the
   sanitizer takes minutes). ``--skip-warm`` leaves it out when the cache is known to be warm.
2. one sanitized run per (tool, path): ``compute-sanitizer --tool TOOL python tools/gpu/sanitize.py --driver PATH``,
   each under ``--timeout`` seconds (default 600), printing the sanitizer's summary line(s) (``ERROR SUMMARY: 0
   errors``; racecheck's ``RACECHECK SUMMARY``), and the tail of its output when it fails or times out.

The paths, at the GPU tests' shapes (H 8, G 2, P 64, N 128, bf16 x/B/C; the SSD designs add P 80, N 256, fp16 and
chunks 64/128/256):

- ``ssu-one``: the one-token kernel, fp32 and bf16 state, flat tables with sentinels and destinations, the small
  grid and the capped one;
- ``ssu-packed``: the packed kernel: MTP with ``cu_seqlens`` (empty sequences), accepted counts and 2-D tables, the
  dense form with the intermediate buffer and parent tokens, a disabled update;
- ``ssd``: the prefill's designs: chunk 64/128/256, head dim 80 (K-major operands), dstate 256, fp16 with a bf16
  state, z and per-dim D, chunk-end states, states into a pool by index, several sequences per scan CTA with the
  L2 prefetch;
- ``garbage`` (memcheck only): the same kernels with garbage index tables and ``MATE_CHECK_INPUTS=0``: huge and
  negative slot and destination indices (int32 and int64), unsorted ``cu_seqlens``, huge accepted counts,
  out-of-range intermediate entries and parents, random chunk tables, ``seq_idx``, ``last_chunk_indices`` and
  ``final_state_indices``. The kernels guard every index they read from a table, so this run must be clean too.

The driver runs with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (each tensor its own allocation, so an access past a
tensor is past an allocation, which memcheck sees) and ``MATE_CHECK_INPUTS=0``. Exit status 0 when every run
reports 0 errors; 1 otherwise. Needs a Hopper GPU, TileLang and ``compute-sanitizer`` (``$CUDA_HOME/bin`` or
``PATH``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("memcheck", "racecheck", "synccheck")
PATHS = ("ssu-one", "ssu-packed", "ssd", "garbage")
GARBAGE_TOOLS = ("memcheck",)  # racecheck/synccheck of the garbage path adds nothing to the valid paths' runs
H, G, P, N = 8, 2, 64, 128
DEV = "cuda"  # (the driver's device)


# ------------------------------------------------------------------------------------------------- driver


def _torch():
    import torch

    return torch


def _sync():
    from mate.mamba._platform.device import synchronize

    synchronize(_torch().device(DEV))


def _close(what, got, want, tol):
    err = float((got.float() - want.float()).abs().max()) / max(float(want.float().abs().max()), 1e-6)
    if not err <= tol:
        raise AssertionError(f"{what}: error {err:.2e} above {tol:.0e} against the reference")


def _ssu_call(kw: dict, check: bool):
    """One TileLang call (and, with ``check``, the same call on the reference with copies, compared)."""
    from mate.mamba import selective_state_update

    mutable = ("state", "intermediate_states_buffer")
    ref = {k: (v.clone() if k in mutable and v is not None else v) for k, v in kw.items()}
    y = selective_state_update(**kw, backend="tilelang")
    _sync()
    if check:
        y_ref = selective_state_update(**ref, backend="torch")
        # packed rows past the last sequence (cu_seqlens[-1]) belong to no sequence: no backend writes them
        cu = kw.get("cu_seqlens")
        rows = int(cu[-1]) if cu is not None else y.shape[0]
        _close("y", y[:rows], y_ref[:rows], 3e-2)
        for k in mutable:
            if kw.get(k) is not None:
                _close(k, kw[k], ref[k], 3e-2)


def _ssu_tensors(lead, slots, state_dtype, gen, dense=False):
    torch = _torch()
    dev = DEV
    bf16 = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dev)

    dt = (torch.rand(*lead, H, generator=gen) * 0.5).to(dev).unsqueeze(-1).expand(*lead, H, P)
    return dict(
        state=rnd(slots, H, P, N).to(state_dtype), x=rnd(*lead, H, P).to(bf16), dt=dt,
        A=(-torch.rand(H, generator=gen) - 0.1).to(dev).view(H, 1, 1).expand(H, P, N),
        B=rnd(*lead, G, N).to(bf16), C=rnd(*lead, G, N).to(bf16), D=rnd(H), z=rnd(*lead, H, P).to(bf16),
        dt_bias=(torch.rand(H, generator=gen) * 0.2).to(dev), dt_softplus=True,
    )  # fmt: skip


def path_ssu_one(check: bool, garbage: bool = False):
    torch = _torch()
    gen = torch.Generator().manual_seed(0)
    i32, i64 = torch.int32, torch.int64
    for state_dtype in (torch.float32, torch.bfloat16):
        for batch in (3, 64):  # (a small grid with a 2-byte state, then the capped kernel)
            S = 2 * batch + 4
            kw = _ssu_tensors((batch,), S, state_dtype, gen)
            slots = torch.randperm(S, generator=gen)[: 2 * batch]
            src, dst = slots[:batch].clone(), slots[batch:].clone()
            src[0], dst[1] = -1, -1  # sentinels
            kw.update(state_batch_indices=src.to(i32).to(DEV), dst_state_batch_indices=dst.to(i32).to(DEV))
            if garbage:
                for name, dtype, hi in (("state_batch_indices", i64, 2**40), ("dst_state_batch_indices", i32, 2**31)):
                    vals = torch.randint(-hi, hi - 1, (batch,), generator=gen, dtype=torch.int64)
                    vals[::3] = torch.randint(S, S + 1000, vals[::3].shape, generator=gen)  # just past the pool
                    kw[name] = vals.to(dtype).to(DEV)  # (int32: wrapped into its range)
            _ssu_call(kw, check and not garbage)
            del kw["dst_state_batch_indices"]
            _ssu_call(kw, check and not garbage)  # the final state back to the read slot


def path_ssu_packed(check: bool, garbage: bool = False):
    torch = _torch()
    gen = torch.Generator().manual_seed(1)
    i32 = torch.int32
    batch, T = 6, 4
    rows = batch * T
    S = 2 * rows + 4
    for state_dtype in (torch.float32, torch.bfloat16):
        # MTP: packed varlen rows, accepted counts, 2-D read and destination tables
        kw = _ssu_tensors((rows,), S, state_dtype, gen)
        lens = torch.tensor([4, 0, 3, 4, 1, 2])
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(i32)
        slots = torch.randperm(S, generator=gen)[: 2 * rows].to(i32)
        src, dst = slots[:rows].view(batch, T).clone(), slots[rows:].view(batch, T).clone()
        src[2] = -1
        dst[0, 1] = -1
        acc = torch.tensor([4, 0, 2, 1, 1, 3], dtype=i32)
        if garbage:
            cu = torch.randint(-100, 200, (batch + 1,), generator=gen, dtype=i32)
            acc = torch.randint(-50, 1000, (batch,), generator=gen, dtype=i32)
            src = torch.randint(-(2**31), 2**31 - 1, (batch, T), generator=gen, dtype=torch.int64).to(i32)
            dst = torch.randint(-(2**31), 2**31 - 1, (batch, T), generator=gen, dtype=torch.int64).to(i32)
        kw.update(
            cu_seqlens=cu.to(DEV), num_accepted_tokens=acc.to(DEV), state_batch_indices=src.to(DEV),
            dst_state_batch_indices=dst.to(DEV),
        )  # fmt: skip
        _ssu_call(kw, check and not garbage)
        kw["disable_state_update"] = True
        _ssu_call(kw, check and not garbage)
        # SGLang's EAGLE verify: dense tokens, an intermediate buffer with entry indices, parent tokens
        E = batch + 3
        kw = _ssu_tensors((batch, T), S, state_dtype, gen)
        iidx = torch.randperm(E, generator=gen)[:batch].to(i32)
        src = torch.randperm(S, generator=gen)[:batch].to(i32)
        parent = torch.tensor([[-1, 0, 1, 1]] * batch, dtype=i32)
        if garbage:
            iidx = torch.randint(-(2**31), 2**31 - 1, (batch,), generator=gen, dtype=torch.int64).to(i32)
            src = torch.randint(-(2**31), 2**31 - 1, (batch,), generator=gen, dtype=torch.int64).to(i32)
            parent = torch.randint(-5, 100, (batch, T), generator=gen, dtype=i32)
        kw.update(
            intermediate_states_buffer=torch.zeros(E, T, H, P, N, device=DEV, dtype=state_dtype),
            intermediate_state_indices=iidx.to(DEV), state_batch_indices=src.to(DEV),
            retrieve_parent_token=parent.to(DEV),
        )  # fmt: skip
        _ssu_call(kw, check and not garbage)
        del kw["intermediate_state_indices"]  # entries are the read slots
        kw["intermediate_states_buffer"] = torch.zeros(S, T, H, P, N, device=DEV, dtype=state_dtype)
        _ssu_call(kw, check and not garbage)


# (name, shape and options) of the prefill designs: the planner picks the kernels from these
SSD_DESIGNS = [
    ("chunk128", dict()),
    ("chunk256", dict(chunk=256)),
    ("chunk64", dict(chunk=64)),
    ("dim80", dict(P=80)),
    ("dstate256_dim128_fp16", dict(P=128, N=256, chunk=256, io="float16", state="bfloat16")),
    ("z_Dfull_intermediate", dict(z=True, D="full", intermediate=True)),
    ("pool", dict(pool=True)),
    ("seqs_per_cta_prefetch", dict(one_sm=True)),
]


def _ssd_call(opts: dict, check: bool, garbage: bool, gen):
    torch = _torch()
    from mate.mamba import ssd_combined_fwd_varlen
    from mate.mamba._platform.device import Hardware
    from mate.mamba._tilelang import ssd as tl_ssd
    from mate.mamba.chunking import chunk_metadata

    Pd, Nd, L = opts.get("P", P), opts.get("N", N), opts.get("chunk", 128)
    io = getattr(torch, opts.get("io", "bfloat16"))
    st = getattr(torch, opts.get("state", "float32"))
    seqlens = (1, 50, 128, 300)
    meta = chunk_metadata(seqlens, L, history=(0, 10, 0, 37), device=DEV)
    T, batch, nc = sum(seqlens), len(seqlens), meta.nchunks
    dev = DEV

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dev)

    kw = dict(
        x=rnd(T, H, Pd).to(io), dt=rnd(T, H, scale=0.5), A=(-torch.rand(H, generator=gen) - 0.1).to(dev),
        B=rnd(T, G, Nd, scale=0.5).to(io), C=rnd(T, G, Nd, scale=0.5).to(io), chunk_size=L,
        cu_seqlens=meta.cu_seqlens, cu_chunk_seqlens=meta.cu_chunk_seqlens,
        last_chunk_indices=meta.last_chunk_indices, seq_idx=meta.seq_idx,
        out=torch.empty(T, H, Pd, dtype=io, device=dev),
        D=rnd(H, Pd) if opts.get("D") == "full" else rnd(H), z=rnd(T, H, Pd).to(io) if opts.get("z") else None,
        dt_bias=rnd(H, scale=0.1), dt_softplus=True, initial_states=rnd(batch, H, Pd, Nd).to(st),
        return_intermediate_states=bool(opts.get("intermediate")),
    )  # fmt: skip
    if opts.get("pool") or garbage:
        kw["final_states_out"] = torch.zeros(batch + 3, H, Pd, Nd, dtype=st, device=dev)
        kw["final_state_indices"] = torch.tensor([4, 0, 6, 2], dtype=torch.int32, device=dev)
        kw["return_intermediate_states"] = False
    if garbage:
        i64 = torch.int64
        kw["cu_chunk_seqlens"] = torch.randint(-(10**6), 10**6, (nc + 1,), generator=gen, dtype=i64).to(dev)
        kw["seq_idx"] = torch.randint(-100, 100, (nc,), generator=gen, dtype=i64).to(dev)
        kw["last_chunk_indices"] = torch.randint(-(2**40), 2**40, (batch,), generator=gen, dtype=i64).to(dev)
        kw["cu_seqlens"] = torch.randint(-(10**6), 10**6, (batch + 1,), generator=gen, dtype=i64).to(dev)
        kw["final_state_indices"] = torch.randint(-(2**40), 2**40, (batch,), generator=gen, dtype=i64).to(dev)
    saved = tl_ssd.hardware
    if opts.get("one_sm"):  # plan as for one SM: one scan CTA walks several sequences (and prefetches)
        tl_ssd.hardware = lambda d: Hardware("cuda", 9, 1)
    try:
        ref = {k: (v.clone() if k in ("out", "final_states_out") and v is not None else v) for k, v in kw.items()}
        states = ssd_combined_fwd_varlen(**kw, backend="tilelang")
        _sync()
    finally:
        tl_ssd.hardware = saved
    if check and not garbage:
        ref_states = ssd_combined_fwd_varlen(**ref, backend="torch")
        _close("out", kw["out"], ref["out"], 3e-2)
        if states is not None:
            _close("states", states, ref_states, 3e-2)
        else:
            _close("final_states_out", kw["final_states_out"], ref["final_states_out"], 3e-2)


def path_ssd(check: bool, garbage: bool = False):
    torch = _torch()
    gen = torch.Generator().manual_seed(2)
    for name, opts in SSD_DESIGNS:
        if garbage and name not in ("chunk128", "dim80", "z_Dfull_intermediate", "seqs_per_cta_prefetch"):
            continue
        t0 = time.perf_counter()
        _ssd_call(opts, check, garbage, gen)
        print(f"  ssd {name}{' (garbage tables)' if garbage else ''}: {time.perf_counter() - t0:.1f}s", flush=True)


def path_garbage(check: bool):
    path_ssu_one(check, garbage=True)
    path_ssu_packed(check, garbage=True)
    path_ssd(check, garbage=True)


DRIVERS = {"ssu-one": path_ssu_one, "ssu-packed": path_ssu_packed, "ssd": path_ssd, "garbage": path_garbage}


def collect_specs(paths: list[str]) -> list:
    """The kernel specs the paths launch: every path run once with the kernel lookups stubbed (nothing compiles or
    launches; the outputs are not looked at)."""
    from mate.mamba import ssu as api
    from mate.mamba._tilelang import ssd as tl_ssd
    from mate.mamba._tilelang import ssu as tl_ssu

    specs = []

    def record(spec, device):
        specs.append(spec)
        return lambda *args: None

    saved = tl_ssu.kernel, tl_ssd.kernel
    tl_ssu.kernel = tl_ssd.kernel = record
    try:
        for name in paths:
            DRIVERS[name](False)
    finally:
        tl_ssu.kernel, tl_ssd.kernel = saved
        api.clear_fast_path_cache()  # (recipes made with the stubs)
    return list(dict.fromkeys(specs))


def driver(paths: list[str], check: bool, jobs: int = 0) -> int:
    import logging

    import tilelang

    logging.getLogger(tilelang.__name__).setLevel(logging.WARNING)
    if jobs:
        from mate.mamba._tilelang.cache import compile_parallel

        specs = collect_specs(paths)
        t0 = time.perf_counter()
        failed = compile_parallel(specs, jobs=jobs, log=lambda m: None)
        print(
            f"compiled {len(specs) - failed}/{len(specs)} kernels in {jobs} processes, {time.perf_counter() - t0:.0f}s"
        )
        if failed:
            return 1
    for name in paths:
        t0 = time.perf_counter()
        DRIVERS[name](check)
        print(f"driver {name}: ok {time.perf_counter() - t0:.1f}s", flush=True)
    return 0


# ------------------------------------------------------------------------------------------------ runner


def sanitizer_binary(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / "compute-sanitizer").exists():
            return str(Path(base) / "bin" / "compute-sanitizer")
    return shutil.which("compute-sanitizer")


def driver_env() -> dict:
    env = dict(os.environ)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    env["MATE_CHECK_INPUTS"] = "0"  # the garbage reaches the kernels; the valid paths run as in production
    src = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


SUMMARY = re.compile(r"(ERROR SUMMARY: .*|RACECHECK SUMMARY: .*)")


def run(cmd: list[str], timeout: float) -> tuple[int | None, str, float]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=driver_env(), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        return None, out, time.perf_counter() - t0


def clean(tool: str, rc: int | None, summaries: list[str]) -> bool:
    if rc != 0 or not summaries:
        return False
    for line in summaries:
        m = re.search(r"ERROR SUMMARY: (\d+) error", line) or re.search(r"\((\d+) errors?", line)
        if m and int(m.group(1)) != 0:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)}")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per sanitized run (default 600)")
    ap.add_argument("--warm-timeout", type=float, default=1800, help="seconds for the warm-up run (default 1800)")
    ap.add_argument("--skip-warm", action="store_true", help="no warm-up run (the kernel cache is warm)")
    ap.add_argument("--sanitizer", default=None, help="the compute-sanitizer binary (default: CUDA_HOME, PATH)")
    ap.add_argument("--driver", default=None, help=argparse.SUPPRESS)  # internal: run paths in this process
    ap.add_argument("--check", action="store_true", help=argparse.SUPPRESS)  # internal: compare with the reference
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4, help="compile processes of the warm-up")
    args = ap.parse_args(argv)

    if args.driver is not None:
        paths = list(PATHS) if args.driver == "all" else args.driver.split(",")
        return driver(paths, args.check, args.jobs if args.check else 0)

    tools = [t for t in args.tools.split(",") if t]
    paths = [p for p in args.paths.split(",") if p]
    bad = [t for t in tools if t not in TOOLS] + [p for p in paths if p not in PATHS]
    if bad:
        print(f"sanitize: unknown tool or path {bad}; tools {TOOLS}, paths {PATHS}", file=sys.stderr)
        return 2
    binary = sanitizer_binary(args.sanitizer)
    if binary is None:
        print("sanitize: compute-sanitizer not found (set CUDA_HOME or --sanitizer)", file=sys.stderr)
        return 2
    me = [sys.executable, str(Path(__file__).resolve())]

    if not args.skip_warm:
        print(f"warm-up (compile every path's kernels, check them against the reference): {', '.join(paths)}")
        rc, out, secs = run([*me, "--driver", ",".join(paths), "--check", "--jobs", str(args.jobs)], args.warm_timeout)
        print("\n".join("  " + line for line in out.strip().splitlines()[-12:]))
        if rc != 0:
            print(f"warm-up FAILED ({'timed out' if rc is None else f'exit {rc}'}, {secs:.0f}s): fix that first")
            return 1
        print(f"warm-up ok, {secs:.0f}s")

    results = []
    for tool in tools:
        for path in paths:
            if path == "garbage" and tool not in GARBAGE_TOOLS:
                continue
            cmd = [binary, "--tool", tool, "--error-exitcode", "99", *me, "--driver", path]
            rc, out, secs = run(cmd, args.timeout)
            summaries = [m.group(1).strip() for m in SUMMARY.finditer(out)]
            ok = clean(tool, rc, summaries)
            status = "clean" if ok else ("TIMED OUT" if rc is None else f"FAILED (exit {rc})")
            print(
                f"{tool:<9} {path:<10} {status}, {secs:.0f}s: {' | '.join(summaries) or 'no summary line'}", flush=True
            )
            if not ok:
                print("\n".join("    " + line for line in out.strip().splitlines()[-40:]), flush=True)
            results.append(ok)
    print(f"sanitize: {sum(results)}/{len(results)} runs clean")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
