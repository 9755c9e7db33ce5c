"""``mate-mamba bench layer``: a Mamba2 layer's decode step (one token per sequence), MATE's
``mamba2_decode_step`` (the fused kernel, one launch, up to ``decode_step_plan.FUSED_MAX_BATCH``; MATE's three ops
above it: the ``launches`` column) against the same step as three launches: vLLM 0.33's Triton
``causal_conv1d_update`` (SiLU), MATE's ``selective_state_update`` (TileLang) and vLLM's Triton ``rms_norm_gated``
(norm after the gate, the layer's group size), in the same process on the same inputs.

Shape: a registry case's per-rank layer (``shapes.SSD_MODELS``, default ``nemotron-h-8b-tp1``: H 128, P 64, N 128,
G 8, norm groups = G), conv width 4, bf16 io, conv pool, weights and SSM pool, fp32 A / D / dt_bias, int32 slots,
batch 1 / 2 / 4 / 8 / 64. xBC, z and dt are row views of one in_proj output; the conv pool is vLLM's layout
(``[slots, width - 1, channels]`` passed as its channel-contiguous transpose), slot 0 the null block (vLLM's
``pad_slot_id``), the batch's slots a random permutation of the rest. Each implementation is captured in a CUDA
graph, one call per window of disjoint tensors so a replay touches more than the L2 (``timing.windows_for``),
replayed; median µs per step.

Bytes per call (GB/s, % of the device copy bandwidth measured in the same run): the SSM rows read and written,
the conv rows read (width - 1 per channel) and written, xBC, z and dt read and the output written, once per
sequence (a three-launch path moves more: its intermediates; the count is the fused step's).
"""

from __future__ import annotations

import argparse
import sys
from typing import NamedTuple

import torch
from mate.mamba.bench import arglists
from mate.mamba.bench.report import markdown_table, write_report
from mate.mamba.bench.shapes import SSD_CASES, SSDCase
from mate.mamba.bench.ssd import parse_models
from mate.mamba.bench.timing import graph_times_us, start, windows_for

WIDTH = 4
BATCHES = (1, 2, 4, 8, 16, 64)
DEFAULT_CASE = "nemotron-h-8b-tp1"
IMPLS = ("mate", "three-ops")
DTYPE = torch.bfloat16
EPS = 1e-5


class Planned(NamedTuple):
    case: str
    batch: int


def build_plan(args) -> list[Planned]:
    """The cells an argument namespace of :func:`build_parser` measures, in order; nothing runs."""
    return [Planned(c, b) for c in (args.models or [DEFAULT_CASE]) for b in args.batches]


def channels(case: SSDCase) -> int:
    return case.heads * case.dim + 2 * case.groups * case.dstate


def nbytes(cell: Planned) -> int:
    """Bytes one step moves at least (the module docstring's count)."""
    c = SSD_CASES[cell.case]
    es, b = DTYPE.itemsize, cell.batch
    hp, cd = c.heads * c.dim, channels(c)
    state = 2 * b * c.heads * c.dim * c.dstate * es
    conv = b * cd * (2 * WIDTH - 2) * es
    io = b * (cd + hp + c.heads + hp) * es
    return state + conv + io + cd * (WIDTH + 1) * es + hp * es


def make_window(cell: Planned, seed: int, dev) -> dict:
    """One window: ``mamba2_decode_step``'s keyword arguments (pools holding the batch's slots and the null
    block)."""
    c = SSD_CASES[cell.case]
    g = torch.Generator(device=dev).manual_seed(seed)
    wg = torch.Generator(device=dev).manual_seed(0)  # one layer's weights in every window
    H, P, N, G, b = c.heads, c.dim, c.dstate, c.groups, cell.batch
    hp, cd = H * P, channels(c)

    def randn(*shape, gen=g, scale=1.0, dtype=DTYPE):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(dtype)

    proj = randn(b, hp + cd + H)
    f32 = torch.float32
    return dict(
        xBC=proj[:, hp : hp + cd], z=proj[:, :hp], dt=proj[:, hp + cd :],
        conv_state=randn(b + 1, WIDTH - 1, cd).transpose(1, 2), conv_weight=randn(cd, WIDTH, gen=wg, scale=0.5),
        conv_bias=randn(cd, gen=wg, scale=0.1), ssm_state=randn(b + 1, H, P, N, scale=0.5),
        A=-torch.rand(H, generator=wg, device=dev) - 0.1, D=randn(H, gen=wg, dtype=f32),
        dt_bias=randn(H, gen=wg, scale=0.5, dtype=f32), norm_weight=randn(hp, gen=wg, scale=0.3) + 1,
        state_indices=(torch.randperm(b, generator=g, device=dev) + 1).to(torch.int32).unsqueeze(1),
        ngroups=G, pad_slot_id=0, norm_group_size=hp // G, eps=EPS, out=torch.empty_like(proj[:, :hp]),
    )  # fmt: skip


def mate_step(w: dict):
    from mate.mamba import mamba2_decode_step

    return lambda: mamba2_decode_step(**w, backend="tilelang")


def load_vllm():
    try:
        from vllm.model_executor.layers.mamba.ops.causal_conv1d import causal_conv1d_update
        from vllm.model_executor.layers.mamba.ops.layernorm_gated import rms_norm_gated
    except Exception as exc:  # a peer that cannot be imported is reported, not fatal
        return exc
    return causal_conv1d_update, rms_norm_gated


def three_ops(w: dict, vllm):
    """The step as vLLM's mixer runs it: vLLM's conv update (in place, as the mixer does, on a scratch copy of
    xBC refreshed by a device copy inside the graph), MATE's SSU, vLLM's gated norm."""
    from mate.mamba import selective_state_update

    conv_update, norm = vllm
    H, P = w["ssm_state"].shape[1:3]
    N, G = w["ssm_state"].shape[3], w["ngroups"]
    hp = H * P
    xc = w["xBC"].clone()
    y = torch.empty(xc.shape[0], H, P, dtype=xc.dtype, device=xc.device)
    A = w["A"][:, None, None].expand(-1, P, N)
    D = w["D"][:, None].expand(-1, P)
    dt_bias = w["dt_bias"][:, None].expand(-1, P)
    dt = w["dt"][:, :, None].expand(-1, -1, P)

    def step():
        xc.copy_(w["xBC"])
        x = conv_update(xc, w["conv_state"], w["conv_weight"], w["conv_bias"], "silu",
                        conv_state_indices=w["state_indices"], null_block_id=w["pad_slot_id"])  # fmt: skip
        xs, B, C = torch.split(x, [hp, G * N, G * N], dim=-1)
        selective_state_update(w["ssm_state"], xs.view(-1, H, P), dt, A, B.view(-1, G, N), C.view(-1, G, N), D,
                               dt_bias=dt_bias, dt_softplus=True, state_batch_indices=w["state_indices"],
                               pad_slot_id=w["pad_slot_id"], out=y, backend="tilelang")  # fmt: skip
        return norm(y.view(-1, hp), w["norm_weight"], None, z=w["z"], eps=EPS, group_size=w["norm_group_size"],
                    norm_before_gate=False)  # fmt: skip

    return step


def _batches(text: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or any(b < 1 for b in out):
        raise argparse.ArgumentTypeError(f"expected a comma list of positive batch sizes; got {text!r}")
    return list(dict.fromkeys(out))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mate-mamba bench layer", description=__doc__.split("\n\n")[0],
        epilog="writes NAME.json and NAME.md under --out (after every cell). --list prints the cells without a device.",
    )  # fmt: skip
    ap.add_argument("--models", type=parse_models, default=[], metavar="LIST",
                    help=f"comma list of per-rank cases or models (default: {DEFAULT_CASE})")  # fmt: skip
    ap.add_argument("--batches", type=_batches, default=list(BATCHES), metavar="LIST",
                    help=f"comma list of batch sizes (default: {','.join(map(str, BATCHES))})")  # fmt: skip
    arglists.add_report(ap, "layer")
    ap.add_argument("--list", action="store_true", help="print the cells the options select, and exit (no device)")
    arglists.add_timing(ap, replays=10)
    return ap


COLUMNS = ["case", "batch", "impl", "launches", "us", "gbps", "pct_copy", "speedup_vs_three_ops", "max_abs_diff"]


def list_lines(plan: list[Planned]) -> list[str]:
    lines = []
    for cell in plan:
        c = SSD_CASES[cell.case]
        lines.append(f"{cell.case} H={c.heads} P={c.dim} N={c.dstate} G={c.groups} batch={cell.batch} "
                     f"{nbytes(cell) / 1e6:.2f} MB")  # fmt: skip
    return lines


def measure(cell: Planned, vllm, dev, ceiling, args) -> list[dict]:
    moved = nbytes(cell)
    wins = [make_window(cell, 17 + i, dev) for i in range(windows_for(moved))]
    fns = {"mate": [mate_step(w) for w in wins]}
    diff = None
    if not isinstance(vllm, Exception):
        fns["three-ops"] = [three_ops(w, vllm) for w in wins]
        a = make_window(cell, 5, dev)
        b = {**a, "conv_state": a["conv_state"].clone(), "ssm_state": a["ssm_state"].clone(), "out": a["out"].clone()}
        got, want = mate_step(a)(), three_ops(b, vllm)()
        diff = max(float((got.float() - want.float()).abs().max()),
                   float((a["ssm_state"].float() - b["ssm_state"].float()).abs().max()),
                   float((a["conv_state"].float() - b["conv_state"].float()).abs().max()))  # fmt: skip
    times = graph_times_us(fns, replays=args.replays, repeats=args.repeats, device=dev)
    rows = []
    for name, us in times.items():
        row = dict(case=cell.case, batch=cell.batch, impl=name)
        if isinstance(us, Exception):
            row["error"] = f"{type(us).__name__}: {str(us).strip()[:200]}"
        else:
            row.update(us=round(us, 2), gbps=round(moved / us / 1e3, 1),
                       pct_copy=round(100 * moved / us / 1e6 / ceiling, 1))  # fmt: skip
        rows.append(row)
    three = next((r.get("us") for r in rows if r["impl"] == "three-ops"), None)
    for r in rows:
        if r["impl"] == "mate":
            from mate.mamba import plan_mamba2_decode_step

            r["launches"] = len(plan_mamba2_decode_step(**wins[0]))
            r["max_abs_diff"] = None if diff is None else f"{diff:.2e}"
            if three and r.get("us"):
                r["speedup_vs_three_ops"] = round(three / r["us"], 2)
        print(r, flush=True)
    del wins, fns
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    plan = build_plan(args)
    code = arglists.listed_or_refused("mate-mamba bench layer", plan, list_lines, args.list, "--models, --batches")
    if code is not None:
        return code
    vllm = load_vllm()
    dev, ceiling = start()
    meta = dict(
        device=torch.cuda.get_device_name(dev), copy_ceiling_tbps=round(ceiling, 2), width=WIDTH,
        timing="CUDA graph, one call per window of disjoint tensors, replayed; median of repeats",
        vllm="imported" if not isinstance(vllm, Exception) else f"not importable ({vllm}): no three-ops rows",
    )  # fmt: skip
    rows: list[dict] = []

    def report():
        cols = COLUMNS + (["error"] if any("error" in r for r in rows) else [])
        preface = (f"# Mamba2 decode step: MATE vs vLLM conv1d + MATE SSU + vLLM norm\n\n{meta['device']}; "
                   f"copy ceiling {ceiling:.2f} TB/s; {meta['timing']}.\n\n")  # fmt: skip
        return write_report(args.name, rows, args.out, meta=meta, columns=cols, preface=preface)

    for cell in plan:
        try:
            rows += measure(cell, vllm, dev, ceiling, args)
        except Exception as exc:  # one cell failing is reported, the rest measured
            print(f"{cell}: {type(exc).__name__}: {exc}", flush=True)
        report()
    paths = report()
    print(markdown_table(rows, COLUMNS))
    print("wrote " + ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BATCHES", "Planned", "build_parser", "build_plan", "list_lines", "main", "make_window", "nbytes"]
