"""``mate-mamba bench conv1d``: the causal conv1d of a Mamba2 layer, MATE (TileLang) vs vLLM 0.33's Triton
``causal_conv1d_update`` / ``causal_conv1d_fn``, in the same process on the same inputs.

Shapes per tensor-parallel rank from the model registry (``shapes.SSD_MODELS``, a case named ``<model>-tp<N>``):
conv dim = heads * P + 2 * groups * N, width 4, bf16 x, weight, bias and pool. The pool is laid out as vLLM's mixer
allocates it (``mamba_utils.mamba2_state_shape``, the default ``SD`` layout): ``[slots, state_len, dim]``, passed
as its ``[slots, dim, state_len]`` transpose (dim contiguous), ``state_len = width - 1 + speculative tokens``;
slot 0 is vLLM's null block, the batch's slots a random permutation of the rest.

* the update at batch 1/8/64/256/1024, one token (``x [batch, dim]``, ``conv_state_indices [batch, 1]``) and MTP 6
  (vLLM's speculative decode: ``x [batch * 6, dim]`` packed, ``query_start_loc``, ``num_accepted_tokens``,
  ``conv_state_indices [batch, 6]``, ``max_query_len`` 6): each call captured in a CUDA graph, one call per window
  of disjoint tensors so a replay touches more than the L2 (``timing.windows_for``), replayed; median µs per call;
* the prefill ``causal_conv1d_fn`` at 1x8192, 16x1024 and the ragged 137/4000/1/900/3000 (``has_initial_state``
  alternating), ``x`` the transpose of a ``[tokens, dim]`` buffer as vLLM passes it: graph-replayed the same way
  (vLLM with the launch metadata its attention-metadata builder computes ahead of the step, as it serves; without
  it vLLM's call copies the lengths to the host), and each implementation's eager host time per call.

Bytes per call (GB/s, % of the device copy bandwidth measured in the same run): x read and the result written;
the pool columns read (``width - 1`` per sequence with a history) and written (``state_len`` per sequence for the
update, ``width - 1`` for the prefill); weight and bias once. ``max_abs_diff_vs_vllm``: the largest difference of
the results and the written pools on one window.
"""

from __future__ import annotations

import argparse
import sys
import types
from typing import NamedTuple

import torch
from mate.mamba.bench import arglists
from mate.mamba.bench.report import markdown_table, write_report
from mate.mamba.bench.shapes import SSD_CASES, SSDCase
from mate.mamba.bench.ssd import parse_models
from mate.mamba.bench.timing import graph_times_us, host_times_us, start, windows_for

WIDTH = 4
MTP = 6  # tokens per query of the speculative update (1 + 5 draft tokens)
UPDATE_BATCHES = (1, 8, 64, 256, 1024)
FN_BATCHES = {
    "1x8192": [8192],
    "16x1024": [1024] * 16,
    "ragged5": [137, 4000, 1, 900, 3000],
}
QUICK = dict(case="nemotron-h-8b-tp1", update=(1, 64, 1024), fn=("1x8192", "ragged5"))
IMPLS = ("mate", "vllm")
DTYPE = torch.bfloat16


def conv_dim(case: SSDCase) -> int:
    return case.heads * case.dim + 2 * case.groups * case.dstate


class Planned(NamedTuple):
    """One measured cell: a case of the registry, the op (``update`` / ``fn``), its batch label and the tokens
    per sequence of an update (1 or :data:`MTP`; 0 for the prefill)."""

    case: str
    op: str
    batch: str
    T: int


def build_plan(args) -> list[Planned]:
    """The cells an argument namespace of :func:`build_parser` measures, in order; nothing runs."""
    cases = args.models or ([QUICK["case"]] if args.quick else list(SSD_CASES))
    ups = QUICK["update"] if args.quick else UPDATE_BATCHES
    fns = QUICK["fn"] if args.quick else tuple(FN_BATCHES)
    plan = []
    for c in cases:
        if "update" in args.ops:
            plan += [Planned(c, "update", str(b), T) for T in (1, MTP) for b in ups]
        if "fn" in args.ops:
            plan += [Planned(c, "fn", name, 0) for name in fns]
    return plan


def nbytes(cell: Planned, dim: int, has_init: int | None = None) -> int:
    """Bytes one call moves (the module docstring's count); ``has_init``: the prefill's sequences with a history
    (default: every other one, as :func:`make_window` sets them)."""
    es = DTYPE.itemsize
    params = dim * (WIDTH + 1) * es
    if cell.op == "update":
        b = int(cell.batch)
        state_len = WIDTH - 1 + (cell.T - 1 if cell.T > 1 else 0)
        return params + 2 * b * cell.T * dim * es + b * dim * (WIDTH - 1 + state_len) * es
    lens = FN_BATCHES[cell.batch]
    init = (len(lens) + 1) // 2 if has_init is None else has_init
    return params + 2 * sum(lens) * dim * es + (init + len(lens)) * (WIDTH - 1) * dim * es


def make_window(cell: Planned, dim: int, seed: int, dev) -> dict:
    """One window of inputs: vLLM's argument values for the cell (keyword names of vLLM's / MATE's calls) and
    the shared weights' seed; a window's pool holds its batch's slots and the null block."""
    g = torch.Generator(device=dev).manual_seed(seed)
    wg = torch.Generator(device=dev).manual_seed(0)  # one layer's weights in every window

    def randn(*shape, gen=g, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(DTYPE)

    w = dict(weight=randn(dim, WIDTH, gen=wg, scale=0.5), bias=randn(dim, gen=wg, scale=0.1))
    if cell.op == "update":
        b, T = int(cell.batch), cell.T
        state_len = WIDTH - 1 + (T - 1 if T > 1 else 0)
        pool = randn(b + 1, state_len, dim).transpose(1, 2)
        slots = (torch.randperm(b, generator=g, device=dev) + 1).to(torch.int32)
        w.update(x=randn(b * T, dim), conv_state=pool, conv_state_indices=slots.unsqueeze(1).repeat(1, T))
        if T > 1:
            w.update(
                num_accepted_tokens=torch.randint(1, T + 1, (b,), generator=g, device=dev, dtype=torch.int32),
                query_start_loc=torch.arange(0, b * T + 1, T, device=dev, dtype=torch.int32), max_query_len=T,
            )  # fmt: skip
        return w
    lens = FN_BATCHES[cell.batch]
    b = len(lens)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    w.update(
        x=randn(sum(lens), dim).t(), conv_states=randn(b + 1, WIDTH - 1, dim).transpose(1, 2),
        query_start_loc=qsl.to(dev), qsl_cpu=qsl,
        cache_indices=(torch.randperm(b, generator=g, device=dev) + 1).to(torch.int32),
        has_initial_state=torch.arange(b, device=dev) % 2 == 0,
    )  # fmt: skip
    return w


def mate_fn(cell: Planned, w: dict):
    """MATE's call on window ``w`` (eager: the dispatcher's fast path after the first call)."""
    from mate.mamba import causal_conv1d_fn, causal_conv1d_update

    if cell.op == "update":
        kw = {k: w[k] for k in ("num_accepted_tokens", "query_start_loc", "max_query_len") if k in w}
        args = (w["x"], w["conv_state"], w["weight"], w["bias"], "silu", w["conv_state_indices"])
        return lambda: causal_conv1d_update(*args, **kw, backend="tilelang")
    args = (w["x"], w["weight"], w["bias"], w["conv_states"], w["query_start_loc"], w["cache_indices"],
            w["has_initial_state"], "silu")  # fmt: skip
    return lambda: causal_conv1d_fn(*args, backend="tilelang")


def load_vllm():
    """vLLM's two entry points and its launch-metadata helper, or None (a printed note) where not importable."""
    try:
        from vllm.model_executor.layers.mamba.ops import causal_conv1d as ops
    except Exception as exc:  # the peer is optional: MATE's rows are still measured
        print(f"vLLM not importable, its rows skipped: {type(exc).__name__}: {exc}", flush=True)
        return None
    try:  # without it vLLM's prefill reads the lengths back to the host: no graph capture, so no prefill rows
        from vllm.v1.attention.backends.utils import compute_causal_conv1d_metadata
    except Exception as exc:
        print(f"vLLM's compute_causal_conv1d_metadata not importable, its prefill rows skipped: {exc}", flush=True)
        compute_causal_conv1d_metadata = None
    return types.SimpleNamespace(update=ops.causal_conv1d_update, fn=ops.causal_conv1d_fn,
                                 metadata=compute_causal_conv1d_metadata)  # fmt: skip


def vllm_fn(cell: Planned, w: dict, vllm):
    if cell.op == "update":
        kw = {k: w[k] for k in ("num_accepted_tokens", "query_start_loc", "max_query_len") if k in w}
        args = (w["x"], w["conv_state"], w["weight"], w["bias"], "silu", w["conv_state_indices"])
        return lambda: vllm.update(*args, **kw)
    nums, batch_ptr, offsets = vllm.metadata(w["qsl_cpu"], device=w["x"].device)
    meta = types.SimpleNamespace(nums_dict=nums, batch_ptr=batch_ptr, token_chunk_offset_ptr=offsets)
    args = (w["x"], w["weight"], w["bias"], w["conv_states"], w["query_start_loc"], w["cache_indices"],
            w["has_initial_state"], "silu")  # fmt: skip
    return lambda: vllm.fn(*args, metadata=meta)


def max_abs_diff(cell: Planned, dim: int, dev, vllm) -> float:
    """The largest difference of MATE's and vLLM's results and written pools on one window."""
    w = make_window(cell, dim, 99, dev)
    pool = "conv_state" if cell.op == "update" else "conv_states"
    v = dict(w, x=w["x"].clone())  # the update writes x in place; clone() keeps the strides of both
    v[pool] = w[pool].clone()
    got, want = mate_fn(cell, w)(), vllm_fn(cell, v, vllm)()
    return max((got.float() - want.float()).abs().max().item(), (w[pool].float() - v[pool].float()).abs().max().item())


# ------------------------------------------------------------------------------------------------ command line

DESCRIPTION = (
    "Benchmark causal_conv1d_update (decode: one token and MTP 6) and causal_conv1d_fn (varlen prefill): MATE "
    "against vLLM 0.33's Triton kernels on the same inputs, each call captured in a CUDA graph over disjoint input "
    "windows (each replay touches more than the L2) and replayed. Shapes: served models' per-rank conv dims "
    "(heads * P + 2 * groups * N), width 4, bf16, vLLM's pool layout. Reports µs, GB/s and % of the copy "
    "bandwidth, MATE's speed-up over vLLM, the max abs difference and (prefill) the eager host time per call; "
    "writes NAME.json and NAME.md under --out (after every cell). --list prints the cells without a device."
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mate-mamba bench conv1d", description=DESCRIPTION)
    arglists.add_report(ap, "conv1d")
    arglists.add_impls(ap, IMPLS)
    ap.add_argument(
        "--ops", type=lambda v: arglists.names(v, ("update", "fn"), "ops"), default=["update", "fn"],
        metavar="LIST", help="comma list of the entry points to time, of update, fn (default: update,fn)",
    )  # fmt: skip
    ap.add_argument(
        "--quick", action="store_true",
        help=f"the headline case ({QUICK['case']}) only: the update at batch "
        f"{', '.join(map(str, QUICK['update']))} (one token and MTP {MTP}), the prefill at {', '.join(QUICK['fn'])}",
    )  # fmt: skip
    ap.add_argument(
        "--models", type=parse_models, default=[], metavar="LIST",
        help="comma list of per-rank cases (e.g. nemotron-h-8b-tp1), models (each tensor-parallel size they are "
        f"served at) or all: only those. Cases: {', '.join(SSD_CASES)} (default: all; with --quick, its case)",
    )  # fmt: skip
    ap.add_argument("--list", action="store_true", help="print the cells the options select, and exit (no device)")
    arglists.add_timing(ap, replays=10)
    return ap


COLUMNS = ["case", "dim", "op", "batch", "T", "tokens", "impl", "us", "gbps", "pct_copy", "speedup_vs_vllm",
           "max_abs_diff_vs_vllm", "host_us"]  # fmt: skip


def list_lines(plan: list[Planned]) -> list[str]:
    """One line per cell: case, conv dim, op, batch, tokens per sequence, bytes per call."""
    lines = []
    for cell in plan:
        dim = conv_dim(SSD_CASES[cell.case])
        form = "prefill" if cell.op == "fn" else ("one token" if cell.T == 1 else f"MTP {cell.T}")
        lines.append(f"{cell.case} dim={dim} {cell.op} batch={cell.batch} {form} {nbytes(cell, dim) / 1e6:.2f} MB")
    return lines


def _short(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"[:300]


def measure(cell: Planned, impls, vllm, dev, ceiling, args) -> list[dict]:
    """The rows of one cell: MATE's and vLLM's, the speed-up on MATE's."""
    case = SSD_CASES[cell.case]
    dim = conv_dim(case)
    moved = nbytes(cell, dim)
    nwin = windows_for(moved)
    wins = [make_window(cell, dim, 17 + i, dev) for i in range(nwin)]
    tokens = wins[0]["x"].shape[0] if cell.op == "update" else wins[0]["x"].shape[1]
    makers = {"mate": lambda w: mate_fn(cell, w)}
    if vllm is not None and "vllm" in impls and (cell.op == "update" or vllm.metadata is not None):
        makers["vllm"] = lambda w: vllm_fn(cell, w, vllm)
    fns = {name: [make(w) for w in wins] for name, make in makers.items() if name in impls}
    diff = None
    if "mate" in fns and "vllm" in fns:
        try:
            diff = f"{max_abs_diff(cell, dim, dev, vllm):.2e}"
        except Exception as exc:  # report, keep timing
            print(f"{cell.case} {cell.op} {cell.batch}: agreement check failed: {_short(exc)}", flush=True)
    times = graph_times_us(fns, replays=args.replays, repeats=args.repeats, device=dev)
    host = {}
    if cell.op == "fn":
        try:
            host = host_times_us({n: f[0] for n, f in fns.items()}, iters=20, device=dev)
        except Exception as exc:  # report, keep the device times
            print(f"{cell.case} fn {cell.batch}: host time: {_short(exc)}", flush=True)
    rows = []
    for name, us in times.items():
        row = dict(case=cell.case, dim=dim, op=cell.op, batch=cell.batch, T=cell.T or None, tokens=tokens, impl=name)
        if isinstance(us, Exception):
            print(f"{name} {cell.case} {cell.op} {cell.batch}: {_short(us)}", flush=True)
            row["error"] = _short(us)
        else:
            row.update(us=round(us, 2), gbps=round(moved / us / 1e3, 1), pct_copy=round(100 * moved / us / 1e6 /
                       ceiling, 1))  # fmt: skip
        if name == "mate":
            row["max_abs_diff_vs_vllm"] = diff
        if name in host:
            row["host_us"] = round(host[name], 1)
        rows.append(row)
    v = next((r.get("us") for r in rows if r["impl"] == "vllm"), None)
    for r in rows:
        if r["impl"] == "mate" and v and r.get("us"):
            r["speedup_vs_vllm"] = round(v / r["us"], 2)
    for r in rows:
        print(r, flush=True)
    del wins, fns
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad names exit 2 with one line, before any device is needed
    plan = build_plan(args)
    code = arglists.listed_or_refused("mate-mamba bench conv1d", plan, list_lines, args.list,
                                      "--models, --ops, --quick")  # fmt: skip
    if code is not None:
        return code
    vllm = load_vllm() if "vllm" in args.impls else None
    dev, ceiling = start()
    meta = dict(
        device=torch.cuda.get_device_name(dev), copy_ceiling_tbps=round(ceiling, 2), width=WIDTH,
        dtypes="x, weight, bias and pool bf16; int32 tables; silu",
        timing="CUDA graph, one call per window of disjoint tensors, replayed; median of repeats",
        bytes=__doc__.split("Bytes per call")[1].split("\n\n")[0].strip(),
        vllm="imported" if vllm is not None else "not importable: no vLLM rows",
    )  # fmt: skip
    rows: list[dict] = []

    def report():
        cols = COLUMNS + (["error"] if any("error" in r for r in rows) else [])
        preface = (
            f"# Causal conv1d: MATE vs vLLM 0.33 Triton\n\n{meta['device']}; copy ceiling {ceiling:.2f} TB/s; "
            f"{meta['timing']}.\n{meta['dtypes']}; width {WIDTH}; vLLM's pool layout (dim contiguous).\n"
            f"Bytes per call{meta['bytes']}\nT: tokens per sequence of the update (1, or MTP {MTP} packed with "
            "num_accepted_tokens). host_us: eager host time per prefill call (best of 3 loops of 20).\n"
            "speedup_vs_vllm > 1: MATE is faster.\n\n"
        )
        return write_report(args.name, rows, args.out, meta=meta, columns=cols, preface=preface)

    for cell in plan:
        try:
            rows += measure(cell, args.impls, vllm, dev, ceiling, args)
        except Exception as exc:  # one cell failing (e.g. out of memory) is reported, the rest measured
            print(f"{cell}: {_short(exc)}", flush=True)
        report()  # partial results survive a time limit
    paths = report()
    print(markdown_table(rows, COLUMNS))
    print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FN_BATCHES", "MTP", "QUICK", "UPDATE_BATCHES", "Planned", "build_parser", "build_plan", "conv_dim",
           "list_lines", "main", "make_window", "nbytes"]  # fmt: skip
