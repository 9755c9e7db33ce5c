"""Test support shared by MATE's adapter packages (``mate-flashinfer-compat``, ``mate-vllm``, ``mate-sglang``).

A float64 Mamba2 recurrence for one sequence, written from contracts.md §1 and independent of the reference
backend (it imports nothing else from MATE), and builders for consumer-shaped tensors (tied per-head
dt/A/D/dt_bias, x/B/C as row views of one conv buffer, a strided state pool with a storage offset). Each
adapter's tests apply their consumer's slot rules on top of it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

F64 = torch.float64


def run_sequence(s0, rows, t, softplus=True):
    """Token-by-token recurrence over packed rows ``rows`` of the tensors in namespace ``t`` (per-head
    ``dt_h [R, H]``, ``A_h``, ``D_h``, ``dtb_h`` and ``x [R, H, P]``, ``B``/``C`` ``[R, G, N]``, optional ``z``).
    ``s0`` is the entering state ``[H, P, N]`` (None = zeros). Returns (states after each token, outputs)."""
    H, P = t.x.shape[1], t.x.shape[2]
    G, N = t.B.shape[1], t.B.shape[2]
    s = torch.zeros(H, P, N, dtype=F64) if s0 is None else s0.to(F64).clone()
    states, ys = [], []
    for r in rows:
        y = torch.zeros(H, P, dtype=F64)
        for h in range(H):
            g = h // (H // G)
            d = float(t.dt_h[r, h]) + (float(t.dtb_h[h]) if t.dtb_h is not None else 0.0)
            if softplus and d <= 20.0:
                d = float(torch.log1p(torch.exp(torch.tensor(d, dtype=F64))))
            decay = float(torch.exp(torch.tensor(float(t.A_h[h]) * d, dtype=F64)))
            xb = t.x[r, h].to(F64)
            s[h] = s[h] * decay + d * xb[:, None] * t.B[r, g].to(F64)[None, :]
            y[h] = s[h] @ t.C[r, g].to(F64)
            if t.D_h is not None:
                y[h] = y[h] + float(t.D_h[h]) * xb
            if getattr(t, "z", None) is not None:
                zz = t.z[r, h].to(F64)
                y[h] = y[h] * zz * torch.sigmoid(zz)
        states.append(s.clone())
        ys.append(y)
    return states, ys


def consumer_tensors(rows, H=4, P=4, N=8, G=2, S=10, seed=0, z=False, io_dtype=torch.float32):
    """Tensors shaped like a consumer's decode call (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    t = SimpleNamespace()
    t.dt_h = torch.randn(rows, H, generator=g) * 0.5
    t.A_h = -torch.rand(H, generator=g) - 0.1
    t.D_h = torch.randn(H, generator=g)
    t.dtb_h = torch.rand(H, generator=g) * 0.2
    conv = torch.randn(rows, H * P + 2 * G * N, generator=g).to(io_dtype)
    t.x = conv[:, : H * P].view(rows, H, P)
    t.B = conv[:, H * P : H * P + G * N].view(rows, G, N)
    t.C = conv[:, H * P + G * N :].view(rows, G, N)
    t.dt = t.dt_h.unsqueeze(-1).expand(rows, H, P)
    t.A = t.A_h.view(H, 1, 1).expand(H, P, N)
    t.D = t.D_h.view(H, 1).expand(H, P)
    t.dt_bias = t.dtb_h.view(H, 1).expand(H, P)
    t.z = torch.randn(rows, H, P, generator=g).to(io_dtype) if z else None
    page = torch.randn(S, H * P * N + 16, generator=g)
    t.state = page[:, 8 : 8 + H * P * N].view(S, H, P, N)
    t.out = torch.empty(rows, H, P, dtype=io_dtype)
    return t
