"""``mate.mamba.chunking`` (vLLM-style chunk metadata: hand-listed cases, a count made token by token, the
rejections) and the workspace cache, on the CPU."""

from __future__ import annotations

import pytest
import torch
from mate.mamba._tilelang.workspace import Workspace
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
        pytest.param(
            [5, 16, 37, 20],
            16,
            [0, 0, 0, 10],
            [0, 5, 21, 37, 53, 58, 64, 78],
            [0, 1, 2, 2, 2, 3, 3],
            [0, 1, 4, 6],
            id="short-equal-long-continuing",
        ),
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


def chunks_token_by_token(seqlens, chunk_size, history):
    """The chunk boundaries counted one token at a time (independently of ``chunk_boundaries``' arithmetic): a
    chunk closes after a token whose position in its sequence's history (counted from 1) is a multiple of
    ``chunk_size``, and after a sequence's last token."""
    cu_chunks, seq_idx, last, tok = [0], [], [], 0
    for b, n in enumerate(seqlens):
        for i in range(n):
            tok += 1
            if (history[b] + i + 1) % chunk_size == 0 or i == n - 1:
                cu_chunks.append(tok)
                seq_idx.append(b)
        last.append(len(seq_idx) - 1)
    return cu_chunks, seq_idx, last


@pytest.mark.parametrize(
    "seqlens,chunk_size,history",
    [
        pytest.param([5, 16, 37], 16, None, id="no-history"),
        pytest.param([20, 5, 40], 16, [10, 3, 17], id="short-first-chunks"),
        pytest.param([16, 8, 1], 16, [16, 8, 15], id="boundaries"),
        pytest.param([300, 1], 128, [200, 0], id="cs128"),
        pytest.param([1], 256, [255], id="one-token-closing-a-chunk"),
    ],
)
def test_chunk_metadata_matches_a_token_by_token_count(seqlens, chunk_size, history):
    m = chunk_metadata(seqlens, chunk_size, history=history)
    cu_chunks, seq_idx, last = chunks_token_by_token(seqlens, chunk_size, history or [0] * len(seqlens))
    expected = dict(
        cu_seqlens=[0, *torch.tensor(seqlens).cumsum(0).tolist()],
        cu_chunk_seqlens=cu_chunks,
        seq_idx=seq_idx,
        last_chunk_indices=last,
    )
    for name, values in expected.items():
        got = getattr(m, name)
        assert got.dtype == torch.int32 and got.tolist() == values, name


@pytest.mark.parametrize(
    "args,name",
    [
        pytest.param(([], 16), "seqlens", id="empty"),
        pytest.param(([3, 0], 16), "seqlens", id="zero-length"),
        pytest.param(([3], 0), "chunk_size", id="chunk-size-0"),
        pytest.param(([3], 16.0), "chunk_size", id="chunk-size-float"),
        pytest.param(([3, 4], 16, [1]), "history", id="history-length"),
        pytest.param(([3], 16, [-1]), "history", id="history-negative"),
        pytest.param(([3, 4], 16, None, None, [1]), "checkpoints", id="checkpoints-length"),
        pytest.param(([3], 16, None, None, [3]), "checkpoints", id="checkpoint-at-the-end"),
        pytest.param(([3], 16, None, None, [-1]), "checkpoints", id="checkpoint-negative"),
    ],
)
def test_chunk_metadata_rejections(args, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        chunk_metadata(*args)


@pytest.mark.parametrize(
    "seqlens, chunk, history, checkpoints, cu_chunks, last, ckpt",
    [
        # vLLM 0.33's BaseMambaAttentionMetadataBuilder._compute_chunk_metadata gives the same (2026-12-04, from
        # the released wheel): a 144-token chunk ends the first query's checkpoint at 400, a 32-token one the
        # second's at 800 (absolute), and the chunk after each realigns to the 256 grid
        pytest.param(
            [700, 500],
            256,
            [0, 400],
            [400, 400],
            [0, 256, 400, 512, 700, 812, 1068, 1100, 1200],
            [3, 7],
            [1, 6],
            id="vllm-align-two-checkpoints",
        ),  # fmt: skip
        pytest.param(
            [700, 50],
            256,
            [0, 300],
            [512, 0],
            [0, 256, 512, 700, 750],
            [2, 3],
            [1, -1],
            id="checkpoint-on-the-grid_none",
        ),  # fmt: skip
        pytest.param([10], 4, None, [5], [0, 4, 5, 8, 10], [3], [1], id="short-chunk-inside"),
    ],
)
def test_checkpoints_end_a_chunk_inside_the_query(seqlens, chunk, history, checkpoints, cu_chunks, last, ckpt):
    cu, cuc, sq, la, ck = chunk_boundaries(seqlens, chunk, history, checkpoints)
    assert (cuc, la, ck) == (cu_chunks, last, ckpt)
    hist = history or [0] * len(seqlens)
    for b, c in enumerate(ck):  # the checkpoint chunk ends history + k tokens into the sequence's history
        if c >= 0:
            assert cuc[c + 1] - cu[b] == checkpoints[b] and sq[c] == b and c != la[b]
    # and every other chunk end still lies on the grid of absolute multiples, or ends the sequence
    for c in range(len(sq)):
        b = sq[c]
        end = cuc[c + 1] - cu[b] + hist[b]
        assert end % chunk == 0 or c == la[b] or c == ck[b]
    meta = chunk_metadata(seqlens, chunk, history, checkpoints=checkpoints)
    assert meta.checkpoint_chunk_indices.tolist() == ckpt
    assert chunk_metadata(seqlens, chunk).checkpoint_chunk_indices is None


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


def test_zeroed_workspace_is_zero_when_allocated_and_kept_as_left():
    """``zeroed``: a new (or grown) buffer starts at zero; a reused one holds what the last user left (the decode
    step's counters rely on both: zeroed once, left zero by every launch)."""
    ws = Workspace()
    a = ws.get("k", "counters", (8,), torch.int32, "cpu", zeroed=True)
    assert not a.any()
    a[3] = 7
    assert int(ws.get("k", "counters", (8,), torch.int32, "cpu", zeroed=True)[3]) == 7
    grown = ws.get("k", "counters", (64,), torch.int32, "cpu", zeroed=True)
    assert ws.allocations == 2 and not grown.any()
