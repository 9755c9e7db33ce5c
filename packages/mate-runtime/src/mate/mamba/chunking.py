"""Chunk metadata for ``ssd_combined_fwd_varlen`` from per-sequence lengths (vLLM's scheme).

Chunk ends land on absolute multiples of ``chunk_size`` counted from the start of each sequence's history,
so a sequence that continues after ``history[b]`` already-processed tokens opens with a short chunk of
``chunk_size - history[b] % chunk_size`` tokens (when that is not a multiple of ``chunk_size``); its last
chunk may be short too. A chunk never spans two sequences.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._errors import bad_arg


@dataclass(frozen=True)
class ChunkMetadata:
    cu_seqlens: torch.Tensor  # [batch + 1] int32
    cu_chunk_seqlens: torch.Tensor  # [nchunks + 1] int32
    seq_idx: torch.Tensor  # [nchunks] int32, the sequence owning each chunk
    last_chunk_indices: torch.Tensor  # [batch] int32

    @property
    def nchunks(self) -> int:
        return self.seq_idx.shape[0]


def chunk_boundaries(seqlens: Sequence[int], chunk_size: int, history: Sequence[int] | None = None):
    """Python lists ``(cu_seqlens, cu_chunk_seqlens, seq_idx, last_chunk_indices)``."""
    if not isinstance(chunk_size, int) or chunk_size < 1:
        bad_arg("chunk_size", chunk_size, "a positive int")
    seqlens = [int(s) for s in seqlens]
    if not seqlens or any(s < 1 for s in seqlens):
        bad_arg("seqlens", seqlens, "a non-empty sequence of positive token counts")
    if history is None:
        history = [0] * len(seqlens)
    history = [int(h) for h in history]
    if len(history) != len(seqlens) or any(h < 0 for h in history):
        bad_arg("history", history, f"{len(seqlens)} non-negative token counts (one per sequence)")
    cu_seqlens, cu_chunks, seq_idx, last = [0], [0], [], []
    tok = 0
    for b, (n, h) in enumerate(zip(seqlens, history, strict=True)):
        left = n
        first = chunk_size - h % chunk_size
        while left > 0:
            take = min(left, first)
            first = chunk_size
            tok += take
            left -= take
            cu_chunks.append(tok)
            seq_idx.append(b)
        last.append(len(seq_idx) - 1)
        cu_seqlens.append(tok)
    return cu_seqlens, cu_chunks, seq_idx, last


def chunk_metadata(
    seqlens: Sequence[int],
    chunk_size: int,
    history: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> ChunkMetadata:
    """``cu_seqlens``, ``cu_chunk_seqlens``, ``seq_idx`` and ``last_chunk_indices`` (int32 tensors on
    ``device``) for sequences of ``seqlens`` new tokens, each continuing after ``history[b]`` tokens
    (default: none), chunked at absolute multiples of ``chunk_size``."""
    cu, cuc, sq, last = chunk_boundaries(seqlens, chunk_size, history)

    def t(v):
        return torch.tensor(v, dtype=torch.int32, device=device)

    return ChunkMetadata(cu_seqlens=t(cu), cu_chunk_seqlens=t(cuc), seq_idx=t(sq), last_chunk_indices=t(last))


__all__ = ["ChunkMetadata", "chunk_metadata", "chunk_boundaries"]
