"""Chunk metadata for ``ssd_combined_fwd_varlen`` from per-sequence lengths (vLLM's scheme).

Chunk ends land on absolute multiples of ``chunk_size`` counted from the start of each sequence's history,
so a sequence that continues after ``history[b]`` already-processed tokens opens with a short chunk of
``chunk_size - history[b] % chunk_size`` tokens (when that is not a multiple of ``chunk_size``); its last
chunk may be short too. A chunk never spans two sequences.

With ``checkpoints`` (vLLM 0.33's ``--mamba-cache-mode align`` prefill checkpoints), a sequence with a checkpoint
``k`` also ends a chunk ``k`` tokens into its query: its tokens are chunked as two segments, ``k`` tokens after its
history and the rest after ``history + k``, each on the grid above. The chunk ending at the checkpoint is then
short and not the sequence's last, and the state the call returns for it
(``return_intermediate_states=True``) is the state after ``history + k`` tokens, which vLLM stores as a prefix-cache
block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from mate.mamba._contract.errors import bad_arg


@dataclass(frozen=True)
class ChunkMetadata:
    cu_seqlens: torch.Tensor  # [batch + 1] int32
    cu_chunk_seqlens: torch.Tensor  # [nchunks + 1] int32
    seq_idx: torch.Tensor  # [nchunks] int32, the sequence owning each chunk
    last_chunk_indices: torch.Tensor  # [batch] int32
    checkpoint_chunk_indices: torch.Tensor | None = None  # [batch] int32: the chunk ending at each checkpoint, -1

    @property
    def nchunks(self) -> int:
        return self.seq_idx.shape[0]


def chunk_boundaries(seqlens: Sequence[int], chunk_size: int, history: Sequence[int] | None = None,
                     checkpoints: Sequence[int] | None = None):  # fmt: skip
    """Python lists ``(cu_seqlens, cu_chunk_seqlens, seq_idx, last_chunk_indices)``, and with ``checkpoints`` a
    fifth: the chunk ending at each sequence's checkpoint (-1 for none)."""
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
    marks = [0] * len(seqlens) if checkpoints is None else [int(k) for k in checkpoints]
    if len(marks) != len(seqlens) or any(not 0 <= k < n for k, n in zip(marks, seqlens, strict=True)):
        bad_arg("checkpoints", checkpoints, f"{len(seqlens)} offsets into the queries, each in [0, its length) "
                "(0: no checkpoint)")  # fmt: skip
    cu_seqlens, cu_chunks, seq_idx, last, ckpt = [0], [0], [], [], []
    tok = 0
    for b, (n, h, k) in enumerate(zip(seqlens, history, marks, strict=True)):
        segments = [(h, k), (h + k, n - k)] if k else [(h, n)]
        ckpt.append(-1)
        for i, (start, count) in enumerate(segments):
            left, first = count, chunk_size - start % chunk_size
            while left > 0:
                take = min(left, first)
                first = chunk_size
                tok += take
                left -= take
                cu_chunks.append(tok)
                seq_idx.append(b)
            if k and i == 0:
                ckpt[-1] = len(seq_idx) - 1
        last.append(len(seq_idx) - 1)
        cu_seqlens.append(tok)
    if checkpoints is None:
        return cu_seqlens, cu_chunks, seq_idx, last
    return cu_seqlens, cu_chunks, seq_idx, last, ckpt


def chunk_metadata(
    seqlens: Sequence[int],
    chunk_size: int,
    history: Sequence[int] | None = None,
    device: torch.device | str | None = None,
    checkpoints: Sequence[int] | None = None,
) -> ChunkMetadata:
    """``cu_seqlens``, ``cu_chunk_seqlens``, ``seq_idx`` and ``last_chunk_indices`` (int32 tensors on
    ``device``) for sequences of ``seqlens`` new tokens, each continuing after ``history[b]`` tokens
    (default: none), chunked at absolute multiples of ``chunk_size``; with ``checkpoints`` (offsets into the
    queries, 0 for none) also a chunk end at each checkpoint and ``checkpoint_chunk_indices``."""
    parts = chunk_boundaries(seqlens, chunk_size, history, checkpoints)

    def t(v):
        return torch.tensor(v, dtype=torch.int32, device=device)

    cu, cuc, sq, last = parts[:4]
    ckpt = t(parts[4]) if checkpoints is not None else None
    return ChunkMetadata(cu_seqlens=t(cu), cu_chunk_seqlens=t(cuc), seq_idx=t(sq), last_chunk_indices=t(last),
                         checkpoint_chunk_indices=ckpt)  # fmt: skip


__all__ = ["ChunkMetadata", "chunk_metadata", "chunk_boundaries"]
