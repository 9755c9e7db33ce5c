"""Reference ``mamba2_decode_step``: literally the three reference ops in sequence over the contract's canonical
calls (``three_ops`` of ``mate.mamba._contract.decode_step``): the conv1d update with SiLU, the SSU with the tied
per-head parameters and ``dt_softplus``, the gated norm (norm after the gate)."""

from __future__ import annotations

import torch
from mate.mamba._contract.decode_step import DecodeStepCall, check_index_data, three_ops
from mate.mamba._reference.conv1d import causal_conv1d_update
from mate.mamba._reference.norm import rms_norm_gated
from mate.mamba._reference.ssu import selective_state_update


@torch.no_grad()
def mamba2_decode_step(call: DecodeStepCall) -> torch.Tensor:
    check_index_data(call)
    hp = call.heads * call.dim
    xc = call.xBC.clone()  # the conv update writes its result into it (vLLM's mixer updates its own xBC in place)
    y = torch.empty((call.batch, call.heads, call.dim), dtype=call.xBC.dtype, device=call.xBC.device)
    out = torch.empty((call.batch, hp), dtype=call.xBC.dtype, device=call.xBC.device)
    conv, ssu, norm = three_ops(call, xc, y, out)
    causal_conv1d_update(conv)
    selective_state_update(ssu)
    call.out.copy_(rms_norm_gated(norm))
    return call.out


__all__ = ["mamba2_decode_step"]
