"""FlashInfer 0.7.2's ``flashinfer.mamba.replayssm_materialize`` served by MATE, for callers without a real
FlashInfer (names, order, keyword-only arguments, defaults, checks, semantics).

It is ``mate.mamba.materialize_replayed_layers`` under FlashInfer's name: on a CUDA device MATE's TileLang kernel
reads the per-layer pointer tables on the device (one launch over every layer and request, capturable in a CUDA
graph once compiled by an eager call); elsewhere the reference reads them back and runs layer by layer (refused
under graph capture). FlashInfer's checks raise ``ValueError`` naming the argument; ``philox_rounds > 0`` rounds
an fp16, int8 or fp8-e4m3 state stochastically with FlashInfer's per-layer seeds (MATE's random bits, FlashInfer's
distribution) and raises ``NotImplementedError`` beside another state.

Beside a real FlashInfer the name stays FlashInfer's, as ``checkpointing_ssu`` does (``_names.STANDALONE``).
"""

from __future__ import annotations

import torch

from .._adapter import adapter


def replayssm_materialize(
    state_ptrs: torch.Tensor, state_slot_strides: torch.Tensor, x_cache_ptrs: torch.Tensor,
    x_cache_slot_strides: torch.Tensor, B_cache_ptrs: torch.Tensor, B_cache_slot_strides: torch.Tensor,
    dt_cache_ptrs: torch.Tensor, dt_cache_slot_strides: torch.Tensor, A_ptrs: torch.Tensor,
    state_scale_ptrs: torch.Tensor, state_scale_slot_strides: torch.Tensor, src_slots: torch.Tensor,
    dst_slots: torch.Tensor, ring_start: torch.Tensor, replay_prefix_len: torch.Tensor,
    active_request_indices: torch.Tensor, *, state_dtype: torch.dtype, input_dtype: torch.dtype,
    matrixA_dtype: torch.dtype, dim: int, dstate: int, num_heads: int, heads_per_group: int, max_window: int,
    ring_buffer_len: int, pad_slot_id: int = -1, rand_seed: torch.Tensor | None = None, philox_rounds: int = 0,
    dependency_inputs: list[torch.Tensor] | None = None, dependency_outputs: list[torch.Tensor] | None = None,
) -> None:  # fmt: skip
    """Write, for each selected request and layer, the state of a source slot advanced through a prefix of its
    replay ring into a destination slot (FlashInfer 0.7.2's ``replayssm_materialize``): ``mate.mamba.
    materialize_replayed_layers`` with these arguments on MATE's automatic backend. Tables and semantics: that
    function's docstring."""
    adapter().runtime().materialize_replayed_layers(
        state_ptrs, state_slot_strides, x_cache_ptrs, x_cache_slot_strides, B_cache_ptrs, B_cache_slot_strides,
        dt_cache_ptrs, dt_cache_slot_strides, A_ptrs, state_scale_ptrs, state_scale_slot_strides, src_slots,
        dst_slots, ring_start, replay_prefix_len, active_request_indices, state_dtype=state_dtype,
        input_dtype=input_dtype, matrixA_dtype=matrixA_dtype, dim=dim, dstate=dstate, num_heads=num_heads,
        heads_per_group=heads_per_group, max_window=max_window, ring_buffer_len=ring_buffer_len,
        pad_slot_id=pad_slot_id, rand_seed=rand_seed, philox_rounds=philox_rounds,
        dependency_inputs=dependency_inputs, dependency_outputs=dependency_outputs,
    )  # fmt: skip


__all__ = ["replayssm_materialize"]
