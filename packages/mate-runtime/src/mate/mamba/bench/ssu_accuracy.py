"""``mate-mamba bench ssu --accuracy STEPS``: the error a state format adds over a long decode, against the fp32
recurrence.

Every format decodes the same ``STEPS`` one-token steps from the same zero state, at the headline shape
(Nemotron-H 8B, H 128, P 64, N 128, G 8) with 16 sequences: x/B/C bf16, and dt / A in Mamba2's initialisation
ranges (dt_bias so that softplus(dt) is 0.001-0.1 per head, A -1 to -16), so the state keeps a long memory and
rounding errors can accumulate. The oracle is MATE's reference backend with an fp32 state; each format keeps its
own trajectory (its state is what it stored). Per format: the relative error of ``y`` (max |y - y_fp32| over
max |y_fp32| of the step), its mean and worst over the steps and at the last one, and the relative L2 error of the
final state (dequantised). FlashInfer 0.7.2's int16 (and bf16) run on the same inputs when it imports.
"""

from __future__ import annotations

import math
import sys

import torch
from mate.mamba._contract.dtypes import STATE_FORMATS
from mate.mamba.bench.shapes import SSU_SHAPES

FORMATS = (*(("mate", dt) for dt in STATE_FORMATS), ("flashinfer", torch.int16), ("flashinfer", torch.bfloat16))
BATCH = 16


def _inputs(steps: int, dev, seed: int = 0):
    s = SSU_SHAPES["nemotron-h-8b"]
    H, P, N, G = s.heads, s.dim, s.dstate, s.groups
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(steps, BATCH, H, P, generator=g).to(torch.bfloat16).to(dev)
    B = torch.randn(steps, BATCH, G, N, generator=g).to(torch.bfloat16).to(dev)
    C = torch.randn(steps, BATCH, G, N, generator=g).to(torch.bfloat16).to(dev)
    dt = (torch.randn(steps, BATCH, H, generator=g) * 0.1).to(dev)
    u = torch.rand(H, generator=g) * 0.099 + 0.001
    dt_bias = torch.log(torch.expm1(u)).to(dev)  # softplus(dt_bias) = u
    A = -(torch.rand(H, generator=g) * 15 + 1).to(dev)
    D = torch.randn(H, generator=g).to(dev)
    return dict(x=x, B=B, C=C, dt=dt, dt_bias=dt_bias, A=A, D=D, shape=(H, P, N))


def _decoder(impl: str, dtype: torch.dtype, inp: dict, dev):
    """(step(t) -> y, final_state() -> fp32 state) of one format, from a zero state."""
    H, P, N = inp["shape"]
    state = torch.zeros(BATCH, H, P, N, device=dev, dtype=dtype)
    scaled = STATE_FORMATS[dtype].block_scaled
    scale = torch.ones(BATCH, H, P, device=dev) if scaled else None
    A = inp["A"].view(H, 1, 1).expand(H, P, N)
    D = inp["D"].view(H, 1).expand(H, P)
    dt_bias = inp["dt_bias"].view(H, 1).expand(H, P)
    slots = torch.arange(BATCH, device=dev, dtype=torch.int32)
    if impl == "mate":
        from mate.mamba import selective_state_update as fn

        backend = {"backend": "tilelang"}
    else:
        import flashinfer.mamba.selective_state_update  # noqa: F401

        fn = sys.modules["flashinfer.mamba.selective_state_update"].selective_state_update
        backend = {}

    def step(t: int) -> torch.Tensor:
        dt = inp["dt"][t].unsqueeze(-1).expand(BATCH, H, P)
        kw = dict(dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots, **backend)
        if scale is not None:
            kw["state_scale"] = scale
        return fn(state, inp["x"][t], dt, A, inp["B"][t], inp["C"][t], D, **kw)

    def final_state() -> torch.Tensor:
        s = state.float()
        return s * scale.unsqueeze(-1) if scale is not None else s

    return step, final_state


def _oracle(inp: dict, steps: int, dev):
    from mate.mamba import selective_state_update

    H, P, N = inp["shape"]
    state = torch.zeros(BATCH, H, P, N, device=dev)
    A = inp["A"].view(H, 1, 1).expand(H, P, N)
    D = inp["D"].view(H, 1).expand(H, P)
    dt_bias = inp["dt_bias"].view(H, 1).expand(H, P)
    ys = []
    for t in range(steps):
        dt = inp["dt"][t].unsqueeze(-1).expand(BATCH, H, P)
        ys.append(
            selective_state_update(
                state,
                inp["x"][t],
                dt,
                A,
                inp["B"][t],
                inp["C"][t],
                D,
                dt_bias=dt_bias,
                dt_softplus=True,
                backend="torch",
            ).float()  # fmt: skip
        )
    return ys, state


def run(steps: int) -> tuple[list[dict], dict]:
    dev = torch.device("cuda", torch.cuda.current_device())
    inp = _inputs(steps, dev)
    ys_ref, s_ref = _oracle(inp, steps, dev)
    rows, skipped = [], {}
    for impl, dtype in FORMATS:
        name = str(dtype).removeprefix("torch.").replace("float8_e4m3fn", "fp8-e4m3")
        try:
            step, final_state = _decoder(impl, dtype, inp, dev)
            errs = []
            for t in range(steps):
                y = step(t).float()
                ref = ys_ref[t]
                errs.append(((y - ref).abs().max() / ref.abs().max()).item())
            s = final_state()
            state_err = (torch.linalg.vector_norm(s - s_ref) / torch.linalg.vector_norm(s_ref)).item()
        except Exception as exc:  # a peer without this format is reported, not fatal
            skipped[f"{impl} {name}"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:200]}"
            continue
        rows.append(
            dict(
                impl=impl,
                state=name,
                bytes_per_value=torch.tensor([], dtype=dtype).element_size(),
                y_err_mean=sum(errs) / steps,
                y_err_max=max(errs),
                y_err_last=errs[-1],
                state_err_final=state_err,
                finite=all(math.isfinite(e) for e in errs),
            )  # fmt: skip
        )
        print(f"{impl:10s} {name:9s} y err mean {rows[-1]['y_err_mean']:.2e} max {rows[-1]['y_err_max']:.2e} "
              f"final state {state_err:.2e}", flush=True)  # fmt: skip
    meta = dict(device=torch.cuda.get_device_name(dev), steps=steps, batch=BATCH, skipped=skipped,
                shape="H128 P64 N128 G8", method=__doc__.split("\n\n")[1].replace("\n", " "))  # fmt: skip
    return rows, meta


COLUMNS = ["impl", "state", "bytes_per_value", "y_err_mean", "y_err_max", "y_err_last", "state_err_final"]
