"""Reference gated RMSNorm (``rms_norm_gated``) over the canonical :class:`NormCall`: fp32 arithmetic, one rounding
(the store into ``out``, in x's dtype), as vLLM 0.33's Triton kernel computes it."""

from __future__ import annotations

import torch
from mate.mamba._contract.norm import NormCall, finish


def rms_norm_gated(call: NormCall) -> torch.Tensor:
    x = call.x.float()
    gate = None
    if call.z is not None:
        z = call.z.float()
        gate = z * torch.sigmoid(z)
    if gate is not None and not call.norm_before_gate:
        x = x * gate
    rows, hidden = x.shape
    grouped = x.view(rows, call.groups, call.group_size)
    rstd = torch.rsqrt(grouped.square().mean(dim=-1, keepdim=True) + call.eps)
    y = (grouped * rstd).view(rows, hidden) * call.weight.float()
    if call.bias is not None:
        y = y + call.bias.float()
    if gate is not None and call.norm_before_gate:
        y = y * gate
    call.out.copy_(y)
    return finish(call)


__all__ = ["rms_norm_gated"]
