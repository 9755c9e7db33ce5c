"""``mate-mamba bench ssd``: SSD varlen prefill, MATE (TileLang) vs vLLM 0.33's Triton
``mamba_chunk_scan_combined_varlen``.

Both run in the same process on the same inputs, each call captured in a CUDA graph (one call per window of
disjoint inputs so a replay reads cold HBM) and replayed; median time per call. The shapes are the registry's
(``shapes.SSD_MODELS``): each served model's per-rank shape at each tensor-parallel size it is served at, a case
named ``<model>-tp<N>``, at the registry's batches and the model's chunk size. Reported per case, batch and chunk
size: µs, M tokens/s, TFLOP/s and TB/s against the ceilings (bf16 dense tensor-core peak ~790 TFLOP/s; the device
copy bandwidth measured in the same run), MATE's speed-up over vLLM, and each implementation's eager host time
per call. MATE runs the kernels its planner picks for each call (``--designs auto``), or, one row per design,
the planner held to a design (``--designs serial,split``).

FLOP count (the algorithm's useful work, identical for both implementations; L = chunk size):
``T * (2 G L N  [C B^T]  +  H (L P  [causal intra-chunk scan]  +  4 P N  [chunk state + C·state]))``.
Bytes: x, B, C, dt read, out written, initial states read and final states written (fp32; with ``--pool``,
MATE's in the pool's dtype and their fp32 row scales).

``--pool DTYPE`` (int16, int8, float8_e4m3fn): MATE reads block-scaled initial states and writes the final states
into a block-scaled pool of that dtype by index (``initial_states_scale``, ``final_states_out`` +
``final_state_indices`` + ``final_states_scale``), as a served model with a quantised state cache does; vLLM, which
has no such pool, runs its fp32-state call beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import NamedTuple

import torch
from mate.mamba._contract.dtypes import DTYPE_NAMES, QUANT_STATE_DTYPES, STATE_FORMATS
from mate.mamba._tilelang import ssd_plan
from mate.mamba.bench import arglists
from mate.mamba.bench.report import markdown_table, write_report
from mate.mamba.bench.shapes import (
    REGISTRY_BATCHES,
    SSD_BATCHES,
    SSD_CASES,
    SSD_LAYOUTS,
    SSD_MODELS,
    BatchLayout,
    SSDCase,
)
from mate.mamba.bench.timing import graph_time_us, host_time_us, start, windows_for

PEAK_TFLOPS_BF16 = 790.0


# The --quick plan: (case, batches, chunk sizes), the headline shape at chunk 128 (its own) and 256.
QUICK_PLAN = [("nemotron-h-8b-tp1", ["1x8192", "32x512"], [128, 256])]


class Planned(NamedTuple):
    """One measured cell: a case of the registry (``shapes.SSD_CASES``), a batch of ``SSD_BATCHES``, a chunk size."""

    case: str
    batch: str
    chunk: int


def build_plan(args) -> list[Planned]:
    """The cells an argument namespace of :func:`build_parser` measures, in order; nothing runs.

    Without ``--quick``: every selected case (``--models``, default the whole registry) at every selected batch
    (``--batches``, default the registry's five), each at its model's chunk size. With ``--quick``: the quick plan,
    less what ``--models`` / ``--batches`` leave out."""
    models, batches = args.models, args.batches
    if args.quick:
        cells = [Planned(c, b, L) for c, bs, Ls in QUICK_PLAN for b in bs for L in Ls]
        return [p for p in cells if (not models or p.case in models) and (not batches or p.batch in batches)]
    cases = [SSD_CASES[n] for n in models] if models else list(SSD_CASES.values())
    return [Planned(c.name, b, c.chunk_size) for c in cases for b in batches or REGISTRY_BATCHES]


def flops(T: int, s: SSDCase, L: int) -> float:
    return T * (2 * s.groups * L * s.dstate + s.heads * (L * s.dim + 4 * s.dim * s.dstate))


POOL_DTYPES = {DTYPE_NAMES[dt]: dt for dt in QUANT_STATE_DTYPES}  # --pool's choices


def nbytes(T: int, batch: int, s: SSDCase, pool: str | None = None, written: int | None = None) -> int:
    """Bytes one call moves (see the module docstring); ``pool``: the states in that quantised dtype;
    ``written``: the states the call writes (default one per sequence; every chunk's with intermediate states)."""
    io = 2 * T * (2 * s.heads * s.dim + 2 * s.groups * s.dstate) + 4 * T * s.heads
    rows = batch * s.heads * s.dim
    if pool is None:
        return io + 4 * (rows + (batch if written is None else written) * s.heads * s.dim) * s.dstate
    return io + 2 * rows * (POOL_DTYPES[pool].itemsize * s.dstate + 4)


def quantise_rows(v: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(numbers, fp32 scales over the last dim) of ``v`` in a block-scaled ``dtype``, as MATE stores a state."""
    fmt = STATE_FORMATS[dtype]
    qmax = fmt.qmax
    scale = v.abs().amax(-1) / qmax
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (v / scale.unsqueeze(-1)).clamp(-qmax, qmax)
    return (q.round() if fmt.integer else q).to(dtype), scale


def make_window(s: SSDCase, seqlens, L, seed, dev, pool: str | None = None, layout: BatchLayout | None = None):
    """One window of inputs; ``pool``: with MATE's quantised initial states, pool, its scales and slot indices
    (``init_q``, ``init_scale``, ``pool``, ``pool_scale``, ``fsi``: sequence b's final state into slot b);
    ``layout``: the sequences' cached tokens and prefill checkpoints (``shapes.SSD_LAYOUTS``)."""
    from mate.mamba.chunking import chunk_metadata

    if layout is None:
        meta = chunk_metadata(seqlens, L, device=dev)
    else:
        meta = chunk_metadata(seqlens, L, layout.history, device=dev, checkpoints=layout.checkpoints)
    T = sum(seqlens)
    g = torch.Generator(device=dev).manual_seed(seed)
    H, P, N, G = s.heads, s.dim, s.dstate, s.groups
    bf = torch.bfloat16
    w = dict(
        x=torch.randn(T, H, P, generator=g, device=dev).to(bf),
        dt=torch.randn(T, H, generator=g, device=dev) - 2.0,
        A=-(torch.rand(H, generator=g, device=dev) + 0.3),
        B=(torch.randn(T, G, N, generator=g, device=dev) * 0.5).to(bf),
        C=(torch.randn(T, G, N, generator=g, device=dev) * 0.5).to(bf),
        D=torch.randn(H, generator=g, device=dev),
        dt_bias=torch.randn(H, generator=g, device=dev) * 0.5,
        init=torch.randn(len(seqlens), H, P, N, generator=g, device=dev) * 0.5,
        out=torch.empty(T, H, P, dtype=bf, device=dev),
        meta=meta,
        intermediate=layout is not None and layout.intermediate,
    )
    if pool is not None:
        batch = len(seqlens)
        w["init_q"], w["init_scale"] = quantise_rows(w["init"], POOL_DTYPES[pool])
        w["pool"] = torch.zeros(batch, H, P, N, dtype=POOL_DTYPES[pool], device=dev)
        w["pool_scale"] = torch.ones(batch, H, P, device=dev)
        w["fsi"] = torch.arange(batch, dtype=torch.int32, device=dev)
    return w


def mate_args(w, L) -> tuple[tuple, dict]:
    """(args, kwargs) of MATE's call on window ``w``: ``ssd_combined_fwd_varlen(*args, **kwargs)``, or
    ``plan_ssd_combined_fwd_varlen(*args, **kwargs)`` for the kernels it runs."""
    m = w["meta"]
    args = (w["x"], w["dt"], w["A"], w["B"], w["C"], L, m.cu_seqlens, m.cu_chunk_seqlens, m.last_chunk_indices,
            m.seq_idx, w["out"], w["D"], None, w["dt_bias"])  # fmt: skip
    if "pool" in w:
        return args, dict(dt_softplus=True, initial_states=w["init_q"], initial_states_scale=w["init_scale"],
                          final_states_out=w["pool"], final_state_indices=w["fsi"],
                          final_states_scale=w["pool_scale"])  # fmt: skip
    return args, dict(dt_softplus=True, initial_states=w["init"], state_dtype=torch.float32,
                      return_intermediate_states=w["intermediate"])  # fmt: skip


def mate_fn(w, L):
    """MATE's call on window ``w`` (the kernels its planner picks for the call)."""
    from mate.mamba import ssd_combined_fwd_varlen

    args, kwargs = mate_args(w, L)

    def fn():
        return ssd_combined_fwd_varlen(*args, **kwargs, backend="tilelang")

    return fn


def vllm_fn(w, L):
    from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen

    m = w["meta"]

    def fn():
        return mamba_chunk_scan_combined_varlen(
            w["x"], w["dt"], w["A"], w["B"], w["C"], L, m.cu_seqlens, m.cu_chunk_seqlens, m.last_chunk_indices,
            m.seq_idx, w["out"], w["D"], None, w["dt_bias"], w["init"], True, (0.0, float("inf")), w["intermediate"],
            torch.float32,
        )  # fmt: skip

    return fn


def check_agreement(s, seqlens, L, dev, pool: str | None = None, layout: BatchLayout | None = None) -> float:
    """Relative difference of MATE's and vLLM's outputs and returned states on one window (with ``pool``: MATE's
    dequantised pool rows, vLLM's from the initial states MATE's quantised ones stand for)."""
    w = make_window(s, seqlens, L, 1234, dev, pool, layout)
    st_m = mate_fn(w, L)()
    if pool is not None:
        st_m = w["pool"].float() * w["pool_scale"].unsqueeze(-1)
        w["init"] = w["init_q"].float() * w["init_scale"].unsqueeze(-1)
    out_m = w["out"].float().clone()
    st_v = vllm_fn(w, L)()
    out_v = w["out"].float()
    e_out = ((out_m - out_v).abs().max() / out_v.abs().max()).item()
    e_st = ((st_m - st_v).abs().max() / st_v.abs().max()).item()
    return max(e_out, e_st)


# ------------------------------------------------------------------------------------------------ designs

# ``auto`` is the planner's own choice, the one served; a design name (``ssd_plan.DESIGNS``) times MATE with the
# planner held to that design (``ssd_plan.forcing``), as a row of its own.
AUTO = "auto"


def designs() -> tuple[str, ...]:
    """The design names ``--designs`` takes besides ``auto``: the planner's."""
    return ssd_plan.DESIGNS


def parse_designs(text: str) -> list[str]:
    """The ``--designs`` list: ``auto`` and/or design names."""
    return arglists.names(text, (AUTO, *designs()), "designs")


def design_impl(design: str) -> str:
    """The impl name of a MATE row: ``mate`` for the planner's choice, ``mate-<design>`` for a forced design."""
    return "mate" if design == AUTO else f"mate-{design}"


def design_context(design: str):
    """The context MATE is timed in: the planner held to ``design`` (the warm-up, the graph capture and the
    eager calls all run inside it; a replay only replays what was captured), nothing for ``auto``."""
    if design == AUTO:
        return contextlib.nullcontext()
    return ssd_plan.forcing(design)


def planned_design(w, L) -> str | None:
    """The design MATE's planner picks for window ``w``'s call: ``split`` where its kernels include the split
    design's state pass, else ``serial``; None where the call cannot be planned."""
    from mate.mamba import plan_ssd_combined_fwd_varlen

    args, kwargs = mate_args(w, L)
    try:
        planned = plan_ssd_combined_fwd_varlen(*args, **kwargs)
    except Exception:  # the timing reports what fails; this column stays empty
        return None
    return "split" if any(s.factory == "ssd_run_states_kernel" for s in planned) else "serial"


# ------------------------------------------------------------------------------------------------ report


def is_mate(impl: str) -> bool:
    return impl == "mate" or impl.startswith("mate-")


def add_speedups(rows: list[dict]) -> None:
    """``speedup_vs_vllm`` (vLLM's µs / the row's) on every timed MATE row of one cell, where vLLM was timed."""
    vllm = next((r["us"] for r in rows if r["impl"] == "vllm" and r.get("us")), None)
    for r in rows:
        if vllm and is_mate(r["impl"]) and r.get("us"):
            r["speedup_vs_vllm"] = round(vllm / r["us"], 2)


def summary_rows(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """(table, columns): one line per (case, batch, chunk), MATE's µs per design, vLLM's µs and each MATE row's
    speed-up over vLLM (> 1: MATE is faster)."""
    mates = list(dict.fromkeys(r["impl"] for r in rows if is_mate(r["impl"])))
    cells = list(dict.fromkeys((r["case"], r["batch"], r["chunk"]) for r in rows))
    table = []
    for case, batch, chunk in cells:
        sel = {r["impl"]: r for r in rows if (r["case"], r["batch"], r["chunk"]) == (case, batch, chunk)}
        line = dict(case=case, batch=batch, chunk=chunk)
        if "mate" in sel:
            line["design"] = sel["mate"].get("design")
        for impl in mates:
            line[f"{impl} us"] = sel.get(impl, {}).get("us")
        line["vllm us"] = sel.get("vllm", {}).get("us")
        for impl in mates:
            line[f"vllm / {impl}"] = sel.get(impl, {}).get("speedup_vs_vllm")
        table.append(line)
    cols = ["case", "batch", "chunk", *(["design"] if "mate" in mates else [])]
    cols += [f"{m} us" for m in mates] + ["vllm us"] + [f"vllm / {m}" for m in mates]
    return table, cols


TARGET_SPEEDUP = 1.5  # the line drawn on the speed-up chart


def plot_speedups(rows, path: str, device: str = "") -> str | None:
    """One chart of MATE's speed-up over vLLM: a group of bars per case (and chunk, where a case has several), a
    bar per batch (and per MATE design, hatched, where several are timed), a line at the target speed-up."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # plotting is optional
        return None
    timed = [r for r in rows if is_mate(r["impl"]) and r.get("speedup_vs_vllm")]
    if not timed:
        return None
    chunks = {}
    for r in timed:
        chunks.setdefault(r["case"], set()).add(r["chunk"])
    groups = list(dict.fromkeys((r["case"], r["chunk"]) for r in timed))
    labels = [case if len(chunks[case]) == 1 else f"{case}\nchunk {chunk}" for case, chunk in groups]
    batches = list(dict.fromkeys(r["batch"] for r in timed))
    impls = list(dict.fromkeys(r["impl"] for r in timed))
    series = [(b, i) for b in batches for i in impls]  # a batch's designs side by side
    width = 0.8 / len(series)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    hatches = ["", "//", "..", "xx", "\\\\"]
    fig, ax = plt.subplots(figsize=(max(6.0, 3.0 + 0.3 * len(groups) * len(series)), 4.2))
    for k, (batch, impl) in enumerate(series):
        vals = [
            next((r["speedup_vs_vllm"] for r in timed if (r["case"], r["chunk"], r["batch"], r["impl"]) ==
                  (case, chunk, batch, impl)), 0)
            for case, chunk in groups
        ]  # fmt: skip
        label = batch if len(impls) == 1 else f"{batch}, {impl}"
        ax.bar([g + k * width for g in range(len(groups))], vals, width, label=label,
               color=colors[batches.index(batch) % len(colors)], hatch=hatches[impls.index(impl) % len(hatches)],
               edgecolor="white" if len(impls) == 1 else "black", linewidth=0.4)  # fmt: skip
    ax.axhline(TARGET_SPEEDUP, color="black", linestyle="--", linewidth=1, label=f"{TARGET_SPEEDUP}x")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))])
    ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("vLLM µs / MATE µs")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("SSD varlen prefill: MATE's speed-up over vLLM (graph-replayed" + (f", {device})" if device else ")"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------ command line

IMPLS = ("mate", "vllm")


def parse_models(text: str) -> list[str]:
    """The ``--models`` list as case names, in the order given: a case name, a model name (each of its
    tensor-parallel sizes) or ``all`` (the whole registry)."""
    by_model = {m.name: [c.name for c in SSD_CASES.values() if c.model == m.name] for m in SSD_MODELS}
    known = ("all", *by_model, *(c for c in SSD_CASES if c not in by_model))
    out = []
    for name in arglists.names(text, known, "models or cases"):
        out += list(SSD_CASES) if name == "all" else by_model.get(name, [name])
    return list(dict.fromkeys(out))


DESCRIPTION = (
    "Benchmark ssd_combined_fwd_varlen (varlen SSD prefill): MATE against vLLM 0.33's Triton "
    "mamba_chunk_scan_combined_varlen on the same inputs, each call captured in a CUDA graph over disjoint input "
    "windows (each replay reads cold HBM) and replayed. The shapes are served models' per-rank shapes (a model at "
    "each tensor-parallel size it is served at). Reports µs, M tokens/s, TFLOP/s and TB/s per case, batch and chunk "
    "size, MATE's speed-up over vLLM and the eager host time per call; writes NAME.json, NAME.md and NAME.png under "
    "--out (after every case, so a time limit keeps the results so far). Needs a CUDA device."
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mate-mamba bench ssd", description=DESCRIPTION)
    arglists.add_report(ap, "ssd")
    arglists.add_impls(ap, IMPLS)
    ap.add_argument(
        "--quick", action="store_true",
        help="the headline case (nemotron-h-8b-tp1) at 1x8192 and 32x512 tokens, chunk sizes 128 and 256, only",
    )  # fmt: skip
    ap.add_argument(
        "--models", type=parse_models, default=[], metavar="LIST",
        help="comma list of per-rank cases (e.g. nemotron-3-super-120b-tp8), models (each tensor-parallel size "
        f"they are served at) or all: only those. Cases: {', '.join(SSD_CASES)} (default: all)",
    )  # fmt: skip
    ap.add_argument(
        "--batches", type=lambda v: arglists.names(v, SSD_BATCHES, "batches"), default=[], metavar="LIST",
        help=f"comma list of batches (sequences x tokens), of {', '.join(SSD_BATCHES)}: only those (default: "
        f"{','.join(REGISTRY_BATCHES)}; with --quick, the quick plan's)",
    )  # fmt: skip
    ap.add_argument(
        "--designs", type=parse_designs, default=[AUTO], metavar="LIST",
        help=f"comma list of MATE's SSD designs to time, of {AUTO}, {', '.join(designs())}: auto is the planner's "
        "choice (the mate row, with the design it picked); each other name a row of its own (mate-NAME), the "
        "planner held to that design (default: auto)",
    )  # fmt: skip
    ap.add_argument(
        "--pool", choices=tuple(POOL_DTYPES), default=None,
        help="MATE reads and writes its states in a block-scaled pool of this dtype (vLLM: fp32 states)",
    )  # fmt: skip
    arglists.add_timing(ap, replays=10)
    return ap


COLUMNS = ["model", "tp", "H", "P", "N", "G", "batch", "tokens", "chunk", "impl", "design", "us", "mtok_s", "tflops",
           "pct_peak", "tbps", "pct_copy", "speedup_vs_vllm", "max_rel_diff_vs_vllm", "host_us"]  # fmt: skip


def _short(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"[:300]


def measure(case: SSDCase, bname: str, L: int, impls, mate_designs, dev, ceiling, args) -> list[dict]:
    """The rows of one cell: a MATE row per design of ``mate_designs`` and vLLM's, with the speed-ups."""
    seqlens = SSD_BATCHES[bname]
    layout = SSD_LAYOUTS.get(bname)
    T = sum(seqlens)
    pool = args.pool
    if pool is not None and layout is not None and layout.intermediate:
        print(f"{case.name} {bname}: skipped with --pool (a quantised pool takes final states, not every chunk's)",
              flush=True)  # fmt: skip
        return []
    wins = [make_window(case, seqlens, L, 17, dev, pool, layout)]
    written = wins[0]["meta"].nchunks if wins[0]["intermediate"] else None
    nwin = min(windows_for(nbytes(T, len(seqlens), case, written=written)), 4)
    wins += [make_window(case, seqlens, L, 17 + i, dev, pool, layout) for i in range(1, nwin)]
    runs = []  # (impl, design): design None for vLLM
    for impl in impls:
        runs += [(design_impl(d), d) for d in mate_designs] if impl == "mate" else [(impl, None)]
    rows = []
    for impl, design in runs:
        row = dict(
            case=case.name, model=case.model, tp=case.tp, H=case.heads, P=case.dim, N=case.dstate, G=case.groups,
            batch=bname, tokens=T, chunk=L, impl=impl,
        )  # fmt: skip
        if design is not None:
            row["design"] = planned_design(wins[0], L) if design == AUTO else design
        try:
            with contextlib.nullcontext() if design is None else design_context(design):
                if design is not None and "vllm" in impls:
                    try:
                        row["max_rel_diff_vs_vllm"] = f"{check_agreement(case, seqlens, L, dev, pool, layout):.1e}"
                    except Exception as exc:  # report, keep measuring (a design's refusal is the timing's to say)
                        if not isinstance(exc, NotImplementedError):
                            print(f"{impl} agreement check failed: {_short(exc)}", flush=True)
                fns = [(vllm_fn if design is None else mate_fn)(w, L) for w in wins]
                us = graph_time_us(fns, replays=args.replays, repeats=args.repeats, device=dev)
                try:
                    row["host_us"] = round(host_time_us(fns[0], iters=20, device=dev), 1)
                except Exception as exc:  # report, keep measuring
                    print(f"{impl} host time: {_short(exc)}", flush=True)
        except Exception as exc:
            print(f"{impl} {case.name} {bname} chunk{L}: {_short(exc)}", flush=True)
            if design not in (None, AUTO) and isinstance(exc, NotImplementedError):
                row["error"] = _short(exc)  # the design cannot serve this call: a row that says so
                rows.append(row)
            continue
        moved = nbytes(T, len(seqlens), case, pool if design is not None else None, written)
        row.update(
            us=round(us, 1), mtok_s=round(T / us, 2), tflops=round(flops(T, case, L) / us / 1e6, 1),
            pct_peak=round(100 * flops(T, case, L) / us / 1e6 / PEAK_TFLOPS_BF16, 1),
            tbps=round(moved / us / 1e6, 2), pct_copy=round(100 * moved / us / 1e6 / ceiling, 1),
        )  # fmt: skip
        rows.append(row)
        print(row, flush=True)
    add_speedups(rows)
    del wins
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad names exit 2 with one line, before any device is needed
    plan = build_plan(args)
    if not plan:
        print("mate-mamba bench ssd: the options select no case (see --models, --batches, --quick)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("mate-mamba bench ssd: needs a CUDA device", file=sys.stderr)
        return 2
    dev, ceiling = start()

    def report():
        meta = dict(
            device=torch.cuda.get_device_name(dev), copy_ceiling_tbps=round(ceiling, 2), peak_tflops=PEAK_TFLOPS_BF16,
            timing="CUDA graph, one call per window of disjoint inputs, replayed; median of repeats",
            dtypes="x/B/C bf16, dt/A/D/dt_bias fp32, initial and returned states fp32, dt_softplus, D [H], dt_bias"
            + (f"; MATE's states in a block-scaled {args.pool} pool (read and written by index)" if args.pool else ""),
            flops=__doc__.split("FLOP count")[1].split("\n\n")[0].strip(), designs=args.designs,
        )  # fmt: skip
        cols = COLUMNS + (["error"] if any("error" in r for r in rows) else [])
        table, table_cols = summary_rows(rows)
        preface = (
            f"# SSD varlen prefill: MATE vs vLLM 0.33 Triton\n\n{meta['device']}; copy ceiling {ceiling:.2f} TB/s; "
            f"{meta['timing']}.\n{meta['dtypes']}.\nTFLOP/s counts {meta['flops']}\n"
            f"pct_peak: of the bf16 dense tensor-core peak, {PEAK_TFLOPS_BF16:.0f} TFLOP/s.\n"
            "Shapes per tensor-parallel rank (case = model-tpN). `mate`: the planner's choice (design: the one it "
            "picked, where the plan names it); `mate-NAME`: the planner held to design NAME.\n"
            "host_us: eager host time per call (the time the Python caller is blocked, the device running behind; "
            "best of 3 loops of 20 calls).\n\n## Summary\n\n`vllm / X` > 1: MATE is faster.\n\n"
            + markdown_table(table, table_cols)
            + "\n## Every row"
        )
        paths = write_report(args.name, rows, args.out, meta=meta, columns=cols, preface=preface)
        png = plot_speedups(rows, os.path.join(args.out, f"{args.name}.png"), meta["device"])
        if png:
            paths["png"] = png
        return paths

    rows = []
    for cell in plan:
        rows += measure(SSD_CASES[cell.case], cell.batch, cell.chunk, args.impls, args.designs, dev, ceiling, args)
        report()  # partial results survive a time limit
    paths = report()
    print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "main", "build_parser", "build_plan", "Planned", "QUICK_PLAN", "plot_speedups", "summary_rows", "add_speedups",
    "parse_models", "parse_designs", "designs", "flops", "nbytes",
]  # fmt: skip
