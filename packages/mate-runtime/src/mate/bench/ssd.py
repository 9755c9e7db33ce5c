"""``mate bench ssd``: SSD varlen prefill, MATE (TileLang) vs vLLM 0.33's Triton ``mamba_chunk_scan_combined_varlen``.

Both run in the same process on the same inputs, each call captured in a CUDA graph (one call per window of
disjoint inputs so a replay reads cold HBM) and replayed; median time per call. Reported per
shape and chunk size: µs, M tokens/s, TFLOP/s and TB/s against the ceilings (bf16 dense tensor-core peak
~790 TFLOP/s; the device copy bandwidth measured in the same run), MATE's speed-up over vLLM, and each
implementation's eager host time per call. MATE runs the kernels its planner picks for each call.

FLOP count (the algorithm's useful work, identical for both implementations; L = chunk size):
``T * (2 G L N  [C B^T]  +  H (L P  [causal intra-chunk scan]  +  4 P N  [chunk state + C·state]))``.
Bytes: x, B, C, dt read, out written, initial states read and final states written (fp32).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import torch

from .report import write_report
from .timing import copy_ceiling_tbps, graph_time_us, host_time_us, windows_for

PEAK_TFLOPS_BF16 = 790.0


@dataclass(frozen=True)
class SSDShape:
    name: str
    heads: int
    dim: int
    dstate: int
    groups: int


SSD_SHAPES = {
    "nemotron-h-8b": SSDShape("nemotron-h-8b", 128, 64, 128, 8),
    "mamba2-2.7b": SSDShape("mamba2-2.7b", 80, 64, 128, 1),
    "falcon-h1-7b": SSDShape("falcon-h1-7b", 24, 128, 256, 1),
}
# (label, sequence lengths)
BATCHES = {
    "1x8192": [8192],
    "1x32768": [32768],
    "8x2048": [2048] * 8,
    "32x512": [512] * 32,
    "ragged5": [137, 4000, 1, 900, 3000],
}
# (shape, batches, chunk sizes)
PLAN = [
    ("nemotron-h-8b", list(BATCHES), [128, 256]),
    ("mamba2-2.7b", ["1x8192", "8x2048"], [256]),
    ("falcon-h1-7b", ["1x8192", "8x2048"], [256]),
]
QUICK_PLAN = [("nemotron-h-8b", ["1x8192", "32x512"], [128, 256])]


def flops(T: int, s: SSDShape, L: int) -> float:
    return T * (2 * s.groups * L * s.dstate + s.heads * (L * s.dim + 4 * s.dim * s.dstate))


def nbytes(T: int, batch: int, s: SSDShape) -> int:
    io = 2 * T * (2 * s.heads * s.dim + 2 * s.groups * s.dstate) + 4 * T * s.heads
    return io + 2 * 4 * batch * s.heads * s.dim * s.dstate


def make_window(s: SSDShape, seqlens, L, seed, dev):
    from ..mamba.chunking import chunk_metadata

    meta = chunk_metadata(seqlens, L, device=dev)
    T = sum(seqlens)
    g = torch.Generator(device=dev).manual_seed(seed)
    H, P, N, G = s.heads, s.dim, s.dstate, s.groups
    bf = torch.bfloat16
    return dict(
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
    )


def mate_args(w, L) -> tuple[tuple, dict]:
    """(args, kwargs) of MATE's call on window ``w``: ``ssd_combined_fwd_varlen(*args, **kwargs)``, or
    ``plan_ssd_combined_fwd_varlen(*args, **kwargs)`` for the kernels it runs."""
    m = w["meta"]
    args = (w["x"], w["dt"], w["A"], w["B"], w["C"], L, m.cu_seqlens, m.cu_chunk_seqlens, m.last_chunk_indices,
            m.seq_idx, w["out"], w["D"], None, w["dt_bias"])  # fmt: skip
    return args, dict(dt_softplus=True, initial_states=w["init"], state_dtype=torch.float32)


def mate_fn(w, L):
    """MATE's call on window ``w`` (the kernels its planner picks for the call)."""
    from ..mamba import ssd_combined_fwd_varlen

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
            m.seq_idx, w["out"], w["D"], None, w["dt_bias"], w["init"], True, (0.0, float("inf")), False,
            torch.float32,
        )  # fmt: skip

    return fn


def check_agreement(s, seqlens, L, dev) -> float:
    """Relative difference of MATE's and vLLM's outputs and final states on one window."""
    w = make_window(s, seqlens, L, 1234, dev)
    st_m = mate_fn(w, L)()
    out_m = w["out"].float().clone()
    st_v = vllm_fn(w, L)()
    out_v = w["out"].float()
    e_out = ((out_m - out_v).abs().max() / out_v.abs().max()).item()
    e_st = ((st_m - st_v).abs().max() / st_v.abs().max()).item()
    return max(e_out, e_st)


def plot_bars(rows, path: str, device: str = "") -> str | None:
    """Grouped bars of M tokens/s per batch and implementation, one panel per (shape, chunk)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # plotting is optional
        return None
    panels = list(dict.fromkeys((r["shape"], r["chunk"]) for r in rows))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (shape, chunk) in zip(axes[0], panels, strict=True):
        sel = [r for r in rows if r["shape"] == shape and r["chunk"] == chunk]
        batches = list(dict.fromkeys(r["batch"] for r in sel))
        impls = list(dict.fromkeys(r["impl"] for r in sel))
        width = 0.8 / max(1, len(impls))
        for k, impl in enumerate(impls):
            vals = [next((r["mtok_s"] for r in sel if r["batch"] == b and r["impl"] == impl), 0) for b in batches]
            ax.bar([i + k * width for i in range(len(batches))], vals, width, label=impl)
        ax.set_xticks([i + width * (len(impls) - 1) / 2 for i in range(len(batches))])
        ax.set_xticklabels(batches, fontsize=8)
        ax.set_title(f"{shape}, chunk {chunk}", fontsize=9)
        ax.set_ylabel("M tokens/s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("SSD varlen prefill throughput (graph-replayed" + (f", {device})" if device else ")"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


IMPLS = ("mate", "vllm")


def _names(text: str, known, what: str) -> list[str]:
    """A comma list of names of ``known``; argparse.ArgumentTypeError naming the choices otherwise."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in known for n in names):
        raise argparse.ArgumentTypeError(f"expected a comma list of {what} of {', '.join(known)}; got {text!r}")
    return list(dict.fromkeys(names))


DESCRIPTION = (
    "Benchmark ssd_combined_fwd_varlen (varlen SSD prefill): MATE against vLLM 0.33's Triton "
    "mamba_chunk_scan_combined_varlen on the same inputs, each call captured in a CUDA graph over disjoint input "
    "windows (each replay reads cold HBM) and replayed. Reports µs, M tokens/s, TFLOP/s and TB/s per shape, "
    "batch and chunk size, MATE's speed-up over vLLM and the eager host time per call; writes NAME.json, NAME.md "
    "and NAME.png under --out (after every case, so a time limit keeps the results so far). Needs a CUDA device."
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mate bench ssd", description=DESCRIPTION)
    ap.add_argument(
        "--out", default=os.path.join("docs", "benchmarks"), metavar="DIR",
        help="directory the report is written to (default: %(default)s)",
    )  # fmt: skip
    ap.add_argument("--name", default="ssd", help="file name of the report, without suffix (default: %(default)s)")
    ap.add_argument(
        "--impls", type=lambda v: _names(v, IMPLS, "implementations"), default=list(IMPLS), metavar="LIST",
        help=f"comma list of the implementations to time, of {', '.join(IMPLS)} (default: {','.join(IMPLS)})",
    )  # fmt: skip
    ap.add_argument(
        "--quick", action="store_true", help="the headline shape (Nemotron-H 8B) at 1x8192 and 32x512 tokens only"
    )
    ap.add_argument(
        "--shapes", type=lambda v: _names(v, SSD_SHAPES, "shapes"), default=[], metavar="LIST",
        help=f"comma list of model shapes, of {', '.join(SSD_SHAPES)}: only those (default: every shape)",
    )  # fmt: skip
    ap.add_argument(
        "--batches", type=lambda v: _names(v, BATCHES, "batches"), default=[], metavar="LIST",
        help=f"comma list of batches (sequences x tokens), of {', '.join(BATCHES)}: only those, of any shape "
        "(default: every batch of the plan)",
    )  # fmt: skip
    ap.add_argument(
        "--replays", type=int, default=10, metavar="N", help="graph replays per timed sample (default: %(default)s)"
    )
    ap.add_argument(
        "--repeats", type=int, default=5, metavar="N",
        help="timed samples per implementation and case; the median is reported (default: %(default)s)",
    )  # fmt: skip
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad names exit 2 with one line, before any device is needed
    impls, only, only_shapes = args.impls, args.batches, args.shapes
    if not torch.cuda.is_available():
        print("mate bench ssd: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    ceiling = copy_ceiling_tbps(dev)
    print(f"copy ceiling {ceiling:.2f} TB/s", flush=True)

    def report():
        meta = dict(
            device=torch.cuda.get_device_name(dev), copy_ceiling_tbps=round(ceiling, 2), peak_tflops=PEAK_TFLOPS_BF16,
            timing="CUDA graph, one call per window of disjoint inputs, replayed; median of repeats",
            dtypes="x/B/C bf16, dt/A/D/dt_bias fp32, initial and returned states fp32, dt_softplus, D [H], dt_bias",
            flops=__doc__.split("FLOP count")[1].split("\n\n")[0].strip(),
        )  # fmt: skip
        cols = ["shape", "batch", "chunk", "impl", "us", "mtok_s", "tflops", "tbps", "pct_copy", "speedup_vs_vllm",
                "max_rel_diff_vs_vllm", "host_us"]  # fmt: skip
        preface = (
            f"# SSD varlen prefill: MATE vs vLLM 0.33 Triton\n\n{meta['device']}; copy ceiling {ceiling:.2f} TB/s; "
            f"{meta['timing']}.\n{meta['dtypes']}.\nTFLOP/s counts {meta['flops']}\n"
            "host_us: eager host time per call (the time the Python caller is blocked, the device running behind; "
            "best of 3 loops of 20 calls)."
        )
        paths = write_report(args.name, rows, args.out, meta=meta, columns=cols, preface=preface)
        png = plot_bars(rows, os.path.join(args.out, f"{args.name}.png"), meta["device"])
        if png:
            paths["png"] = png
        return paths

    rows = []
    for shape_name, batches, chunks in QUICK_PLAN if args.quick else PLAN:
        if only_shapes and shape_name not in only_shapes:
            continue
        s = SSD_SHAPES[shape_name]
        for bname in batches:
            if only and bname not in only:
                continue
            seqlens = BATCHES[bname]
            T = sum(seqlens)
            for L in chunks:
                per_call = nbytes(T, len(seqlens), s)
                nwin = min(windows_for(per_call), 4)
                wins = [make_window(s, seqlens, L, 17 + i, dev) for i in range(nwin)]
                base = {}
                agree = {}
                for impl in impls:
                    if "vllm" in impls and impl == "mate":
                        try:
                            agree[impl] = check_agreement(s, seqlens, L, dev)
                        except Exception as exc:  # report, keep measuring
                            print(f"{impl} agreement check failed: {type(exc).__name__}: {exc}", flush=True)
                for impl in impls:
                    try:
                        fns = [(mate_fn if impl == "mate" else vllm_fn)(w, L) for w in wins]
                        us = graph_time_us(fns, replays=args.replays, repeats=args.repeats, device=dev)
                    except Exception as exc:
                        print(f"{impl} {shape_name} {bname} chunk{L}: {type(exc).__name__}: {exc}", flush=True)
                        continue
                    base[impl] = us
                    row = dict(
                        shape=shape_name, H=s.heads, P=s.dim, N=s.dstate, G=s.groups, batch=bname, tokens=T,
                        chunk=L, impl=impl, us=round(us, 1), mtok_s=round(T / us, 2),
                        tflops=round(flops(T, s, L) / us / 1e6, 1), tbps=round(per_call / us / 1e6, 2),
                        pct_copy=round(100 * per_call / us / 1e6 / ceiling, 1),
                        pct_peak=round(100 * flops(T, s, L) / us / 1e6 / PEAK_TFLOPS_BF16, 1),
                    )  # fmt: skip
                    if impl in agree:
                        row["max_rel_diff_vs_vllm"] = f"{agree[impl]:.1e}"
                    try:
                        row["host_us"] = round(host_time_us(fns[0], iters=20, device=dev), 1)
                    except Exception as exc:  # report, keep measuring
                        print(f"{impl} host time: {type(exc).__name__}: {exc}", flush=True)
                    rows.append(row)
                    print(row, flush=True)
                if "vllm" in base:
                    for r in rows[-len(base) :]:
                        if r["impl"] == "mate":
                            r["speedup_vs_vllm"] = round(base["vllm"] / base[r["impl"]], 2)
                del wins
                torch.cuda.empty_cache()
                report()  # partial results survive a time limit
    paths = report()
    print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "plot_bars", "SSD_SHAPES", "BATCHES", "flops", "nbytes"]
