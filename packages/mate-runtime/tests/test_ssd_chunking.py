"""``mate.mamba.chunking.chunk_metadata`` (vLLM-style chunk metadata) and the workspace cache, on the CPU."""

from __future__ import annotations

import pytest
import torch
from mate._tilelang.workspace import Workspace
from mate.mamba.chunking import chunk_boundaries, chunk_metadata


@pytest.mark.parametrize(
    "seqlens, chunk, history, cu_chunks, seq_idx, last",
    [
        pytest.param([5], 4, None, [0, 4, 5], [0, 0], [1], id="one-longer-than-chunk"),
        pytest.param([4], 4, None, [0, 4], [0], [0], id="one-equal"),
        pytest.param([1, 3, 9], 4, None, [0, 1, 4, 8, 12, 13], [0, 1, 2, 2, 2], [0, 1, 4], id="ragged"),
        pytest.param([6, 2], 4, [3, 0], [0, 1, 5, 6, 8], [0, 0, 0, 1], [2, 3], id="continuing-short-first"),
        pytest.param([3], 4, [8], [0, 3], [0], [0], id="history-on-a-boundary"),
        pytest.param([2], 4, [1], [0, 2], [0], [0], id="inside-one-chunk"),
    ],
)
def test_chunk_boundaries(seqlens, chunk, history, cu_chunks, seq_idx, last):
    cu, cuc, sq, la = chunk_boundaries(seqlens, chunk, history)
    assert cu == [0, *torch.tensor(seqlens).cumsum(0).tolist()]
    assert (cuc, sq, la) == (cu_chunks, seq_idx, last)


def test_chunks_end_on_absolute_multiples():
    seqlens, hist, L = [300, 17, 129, 1], [0, 37, 200, 5], 128
    cu, cuc, sq, _ = chunk_boundaries(seqlens, L, hist)
    for c in range(len(sq)):
        b = sq[c]
        start_in_seq = cuc[c] - cu[b] + hist[b]
        end_in_seq = cuc[c + 1] - cu[b] + hist[b]
        assert 0 < end_in_seq - start_in_seq <= L
        assert end_in_seq % L == 0 or cuc[c + 1] == cu[b + 1]  # a chunk ends on a multiple or at the sequence end
        assert start_in_seq // L == (end_in_seq - 1) // L  # never crosses a multiple


def test_chunk_metadata_tensors():
    m = chunk_metadata([3, 5], 4, device="cpu")
    assert m.cu_seqlens.dtype == torch.int32 and m.cu_seqlens.tolist() == [0, 3, 8]
    assert m.cu_chunk_seqlens.tolist() == [0, 3, 7, 8]
    assert m.seq_idx.tolist() == [0, 1, 1] and m.last_chunk_indices.tolist() == [0, 2] and m.nchunks == 3


@pytest.mark.parametrize(
    "kw, name",
    [
        pytest.param(dict(seqlens=[], chunk_size=4), "seqlens", id="empty"),
        pytest.param(dict(seqlens=[3, 0], chunk_size=4), "seqlens", id="zero-length"),
        pytest.param(dict(seqlens=[3], chunk_size=0), "chunk_size", id="chunk-0"),
        pytest.param(dict(seqlens=[3], chunk_size=4, history=[1, 2]), "history", id="history-length"),
    ],
)
def test_chunk_metadata_rejects(kw, name):
    with pytest.raises(ValueError, match=name):
        chunk_boundaries(**kw)


def test_workspace_grows_and_reuses():
    ws = Workspace()
    a = ws.get("k", "buf", (4, 3), torch.float32, "cpu")
    assert a.shape == (4, 3) and ws.allocations == 1
    b = ws.get("k", "buf", (2, 5), torch.float32, "cpu")  # fits: a view of the same storage
    assert b.data_ptr() == a.data_ptr() and ws.allocations == 1
    c = ws.get("k", "buf", (20,), torch.float32, "cpu")  # grows (at least doubles), the old one is retired
    assert c.numel() == 20 and ws.allocations == 2 and len(ws.retired) == 1
    d = ws.get("k", "buf", (24,), torch.float32, "cpu")
    assert ws.allocations == 2 and d.data_ptr() == c.data_ptr()
    ws.get("k", "buf", (4,), torch.int32, "cpu")  # another dtype is another buffer
    assert ws.allocations == 3
