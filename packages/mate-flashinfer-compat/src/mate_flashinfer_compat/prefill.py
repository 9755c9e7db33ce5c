"""The packed SSD prefill under MATE's and vLLM's names. Not FlashInfer API (FlashInfer 0.7.2's own prefill,
``flashinfer.mamba.ssd_combined_fwd``, takes another contract and is not served by MATE), so these live here and
never in a ``flashinfer`` namespace.

``mamba_chunk_scan_combined_varlen`` is vLLM's prefill op (names, order, and its return dtype: ``state_dtype``,
else ``C``'s dtype), the one :mod:`mate.mamba.adapters` holds for every adapter that serves it;
``ssd_combined_fwd_varlen`` is ``mate.mamba``'s (``state_dtype``, else the initial states' dtype, else ``C``'s).
"""

from __future__ import annotations

import math

import torch
from mate.mamba.adapters import mamba_chunk_scan_combined_varlen

from ._adapter import adapter
from .mamba.selective_state_update import _BACKENDS


def ssd_combined_fwd_varlen(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    cu_seqlens: torch.Tensor,
    cu_chunk_seqlens: torch.Tensor,
    last_chunk_indices: torch.Tensor,
    seq_idx: torch.Tensor,
    out: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    *,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    initial_states: torch.Tensor | None = None,
    return_intermediate_states: bool = False,
    state_dtype: torch.dtype | None = None,
    checkpoint_token_indices: torch.Tensor | None = None,
    checkpoint_state_slots: torch.Tensor | None = None,
    checkpoint_states: torch.Tensor | None = None,
    final_states_out: torch.Tensor | None = None,
    final_state_indices: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor | None:
    """The packed SSD prefill under the seed's name and order (= ``mate.mamba.ssd_combined_fwd_varlen``)."""
    return adapter().runtime().ssd_combined_fwd_varlen(
        x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D, z, dt_bias,
        dt_softplus=dt_softplus, dt_limit=dt_limit, initial_states=initial_states,
        return_intermediate_states=return_intermediate_states, state_dtype=state_dtype,
        checkpoint_token_indices=checkpoint_token_indices, checkpoint_state_slots=checkpoint_state_slots,
        checkpoint_states=checkpoint_states, final_states_out=final_states_out,
        final_state_indices=final_state_indices, backend=_BACKENDS.get(backend, backend),
    )  # fmt: skip


__all__ = ["ssd_combined_fwd_varlen", "mamba_chunk_scan_combined_varlen"]
