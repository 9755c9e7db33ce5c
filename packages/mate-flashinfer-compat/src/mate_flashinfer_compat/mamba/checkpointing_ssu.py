"""FlashInfer 0.7.2's ``flashinfer.mamba.checkpointing_ssu`` and ``allocate_checkpointing_ssu_scratch`` served by
MATE, for callers without a real FlashInfer (names, order, defaults, return value, semantics).

``checkpointing_ssu`` is ``mate.mamba.replay_state_update`` under FlashInfer's name and signature (MATE's op takes
FlashInfer's arguments already; ``docs/mamba.md`` says where MATE differs: int16 checkpoints are MATE's extension,
a seed beside a non-fp16 checkpoint is ``NotImplementedError``). FlashInfer's kernel choices (``d_split``,
``enable_pdl``, the scratch tensors, ``precompute_heads_per_cta``, ``algorithm``) are validated as FlashInfer does
and have no other effect: MATE plans its own kernel.

Beside a real FlashInfer these names stay FlashInfer's (``MATE_FLASHINFER_COMPAT=auto`` rebinds only
``selective_state_update``): on the H200 FlashInfer's ReplaySSM kernel is faster than MATE's
(docs/ssu-kernels.md#replayssm-decode), so serving the name there would slow its callers down.
"""

from __future__ import annotations

import torch

from .._adapter import adapter

MAX_TOKENS = 16  # FlashInfer 0.7.2's bounds on the scratch's token counts
MAX_WINDOW = 16


def checkpointing_ssu(
    state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out, D=None, z=None,
    dt_bias=None, dt_softplus=False, state_batch_indices=None, pad_slot_id=-1, state_scale=None, rand_seed=None,
    philox_rounds=10, d_split=None, cu_seqlens=None, max_seqlen=None, enable_pdl=False, cb_scaled=None,
    cumAdt_vec=None, cb_old=None, precompute_heads_per_cta=0, algorithm="auto",
) -> torch.Tensor:  # fmt: skip
    """One ReplaySSM decode step (FlashInfer 0.7.2's ``checkpointing_ssu``): ``mate.mamba.replay_state_update``
    with these arguments, on MATE's automatic backend (TileLang on a CUDA/MUSA device, the reference elsewhere).
    Shapes and semantics: that function's docstring. Returns ``out``."""
    return adapter().runtime().replay_state_update(
        state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out, D, z, dt_bias,
        dt_softplus, state_batch_indices, pad_slot_id, state_scale, rand_seed, philox_rounds, d_split, cu_seqlens,
        max_seqlen, enable_pdl, cb_scaled, cumAdt_vec, cb_old, precompute_heads_per_cta, algorithm,
    )  # fmt: skip


def allocate_checkpointing_ssu_scratch(
    batch_size: int,
    num_heads: int,
    num_predicted_tokens: int,
    max_window: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's scratch for its two-kernel ReplaySSM path: ``(cb_scaled [batch, H, 32, tokens_pad / 2]`` of
    ``dtype``, ``cumAdt_vec [batch, H, tokens_pad]`` fp32, ``cb_old [batch, H, 32, window_pad / 2]`` of
    ``dtype``), ``tokens_pad`` = ``num_predicted_tokens`` rounded up to 16, ``window_pad`` = ``max_window`` rounded
    up to 8; allocated once, so a captured graph keeps them. :func:`checkpointing_ssu` accepts them (all three or
    none) and does not need them: MATE's kernel keeps its per-step tables in shared memory."""
    if not (isinstance(batch_size, int) and isinstance(num_heads, int)) or batch_size <= 0 or num_heads <= 0:
        raise ValueError(f"batch_size and num_heads: got {batch_size!r}, {num_heads!r}; expected positive ints")
    if not isinstance(num_predicted_tokens, int) or not 0 < num_predicted_tokens <= MAX_TOKENS:
        raise ValueError(f"num_predicted_tokens: got {num_predicted_tokens!r}; expected an int in [1, {MAX_TOKENS}]")
    if not isinstance(max_window, int) or not 0 < max_window <= MAX_WINDOW:
        raise ValueError(f"max_window: got {max_window!r}; expected an int in [1, {MAX_WINDOW}]")
    tokens_pad = -(-num_predicted_tokens // 16) * 16
    window_pad = -(-max_window // 8) * 8
    cb_scaled = torch.empty(batch_size, num_heads, 32, tokens_pad // 2, dtype=dtype, device=device)
    cumadt = torch.empty(batch_size, num_heads, tokens_pad, dtype=torch.float32, device=device)
    cb_old = torch.empty(batch_size, num_heads, 32, window_pad // 2, dtype=dtype, device=device)
    return cb_scaled, cumadt, cb_old


__all__ = ["checkpointing_ssu", "allocate_checkpointing_ssu_scratch"]
