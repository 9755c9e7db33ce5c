"""Reference ``mamba2_decode_step``: literally the three reference ops in sequence over their own canonical calls (the
contract module's docstring): the conv1d update with SiLU, the SSU with the tied per-head parameters and
``dt_softplus``, the gated norm (norm after the gate)."""

from __future__ import annotations

import torch
from mate.mamba._contract.conv1d import normalize_conv1d_update
from mate.mamba._contract.decode_step import DecodeStepCall, check_index_data
from mate.mamba._contract.norm import normalize_norm
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._reference.conv1d import causal_conv1d_update
from mate.mamba._reference.norm import rms_norm_gated
from mate.mamba._reference.ssu import selective_state_update


@torch.no_grad()
def mamba2_decode_step(call: DecodeStepCall) -> torch.Tensor:
    check_index_data(call)
    H, P, N, G, batch = call.heads, call.dim, call.dstate, call.ngroups, call.batch
    hp = H * P
    # 1. the conv update on a copy of xBC (the op writes its result into x when x has the pool's dtype)
    xc = call.xBC.clone()
    conv = normalize_conv1d_update(xc, call.conv_state, call.conv_weight, call.conv_bias, "silu", call.slots,
                                   null_block_id=call.pad_slot_id)  # fmt: skip
    xBC = causal_conv1d_update(conv)
    # 2. the split and the SSU, dt / A / D / dt_bias tied per head as vLLM's mixer expands them
    x = xBC[:, :hp].view(batch, H, P)
    B = xBC[:, hp : hp + G * N].view(batch, G, N)
    C = xBC[:, hp + G * N :].view(batch, G, N)
    y = torch.empty((batch, H, P), dtype=call.xBC.dtype, device=call.xBC.device)
    ssu = normalize_ssu(
        call.ssm_state, x, call.dt[:, :, None].expand(-1, -1, P), call.A[:, None, None].expand(H, P, N), B, C,
        None if call.D is None else call.D[:, None].expand(H, P), None,
        None if call.dt_bias is None else call.dt_bias[:, None].expand(H, P), True, call.slots, call.pad_slot_id,
        out=y,
    )  # fmt: skip
    selective_state_update(ssu)
    # 3. the gated norm, norm(y * silu(z))
    norm = normalize_norm(y.view(batch, hp), call.norm_weight, None, call.z, call.eps, call.norm_group_size, False)
    call.out.copy_(rms_norm_gated(norm))
    return call.out


__all__ = ["mamba2_decode_step"]
