"""A captured decode graph replayed with new index-table values gives the eager result.

A serving engine captures its decode step once per batch size and then, every step, copies that step's slot
table (and, for MTP, the accepted-token counts and the row offsets) into the captured tensors before replaying.
Nothing of the tables' values may be baked into the graph: each replay below, with new tables of the same shapes
(permuted slots, sentinels, new accepted counts, new sequence lengths), must write exactly what an eager call with
those tables writes (the same kernel: bit-identical pool and output) and agree with the reference backend.

The suite runs with ``MATE_CHECK_INPUTS=1``: the eager calls check their tables on the host, the captured one
must not (a device-to-host copy during capture is an error), so capturing here also shows the check stays out of
graphs. Run: ``python -m pytest -m gpu packages/mate-runtime/tests/gpu/test_graph_tables.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu  # skipped without a device or TileLang (tests/conftest.py)

H, G, P, N = 16, 2, 64, 128
BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32
DEV = "cuda"


def _inputs(gen: torch.Generator, lead: tuple) -> dict:
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEV)

    return dict(
        x=rnd(*lead, H, P).to(BF16),
        dt=(torch.rand(*lead, H, generator=gen) * 0.5).to(DEV).unsqueeze(-1).expand(*lead, H, P),
        B=rnd(*lead, G, N).to(BF16),
        C=rnd(*lead, G, N).to(BF16),
        z=rnd(*lead, H, P).to(BF16),
    )


def _fixed(gen: torch.Generator) -> dict:
    A = (-torch.rand(H, generator=gen) - 0.1).to(DEV)
    return dict(
        A=A.view(H, 1, 1).expand(H, P, N),
        D=torch.randn(H, generator=gen).to(DEV),
        dt_bias=(torch.rand(H, generator=gen) * 0.2).to(DEV),
        dt_softplus=True,
    )


def _copy_into(captured: dict, new: dict) -> None:
    """Copy the new step's values into the captured tensors (what an engine does before each replay)."""
    for k, v in new.items():
        dst = captured[k]
        if dst.stride(-1) == 0:  # the tied dt: its backing per-head tensor
            dst = dst[..., 0]
            v = v[..., 0]
        dst.copy_(v)


def _check_rounds(captured: dict, pool: torch.Tensor, out: torch.Tensor, graph, rounds):
    """For each round's new values: eager on a copy of the pool, replay on the pool, compare."""
    from mate.mamba import selective_state_update

    for new in rounds:
        _copy_into(captured, new)
        pool_e = pool.clone()
        kw_e = {k: (v.clone() if isinstance(v, torch.Tensor) and k in new else v) for k, v in captured.items()}
        kw_e["state"] = pool_e
        y_e = selective_state_update(**kw_e, backend="tilelang")
        kw_r = dict(kw_e, state=pool.clone())
        y_r = selective_state_update(**kw_r, backend="torch")
        graph.replay()
        torch.cuda.synchronize()
        # packed rows past the last sequence (cu_seqlens[-1]) belong to no sequence: no backend writes them
        rows = int(new["cu_seqlens"][-1]) if "cu_seqlens" in new else out.shape[0]
        assert torch.equal(out[:rows], y_e[:rows]), "replayed y differs from the eager call's"
        assert torch.equal(pool, pool_e), "replayed pool writes differ from the eager call's"
        torch.testing.assert_close(out[:rows].float(), y_r[:rows].float(), atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(pool, kw_r["state"], atol=2e-2, rtol=2e-2)


def _capture(captured: dict, pool: torch.Tensor):
    from mate.mamba import selective_state_update

    out = torch.empty_like(captured["x"])
    selective_state_update(**dict(captured, state=pool.clone()), backend="tilelang")  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        selective_state_update(**captured, state=pool, out=out, backend="tilelang")
    torch.cuda.synchronize()
    return graph, out


@pytest.mark.parametrize("state_dtype", [pytest.param(F32, id="fp32"), pytest.param(BF16, id="bf16")])
def test_one_token_graph_replayed_with_new_slot_tables(state_dtype):
    gen = torch.Generator().manual_seed(0)
    batch, S = 8, 40
    pool = torch.randn(S, H, P, N, generator=gen).to(DEV, state_dtype)
    captured = dict(
        _inputs(gen, (batch,)), **_fixed(gen),
        state_batch_indices=torch.arange(batch, dtype=I32, device=DEV),
        dst_state_batch_indices=torch.arange(batch, 2 * batch, dtype=I32, device=DEV),
        pad_slot_id=-1,
    )  # fmt: skip
    graph, out = _capture(captured, pool)

    def step(k):
        slots = torch.randperm(S, generator=gen)[: 2 * batch].to(torch.int32)
        src, dst = slots[:batch].clone(), slots[batch:].clone()
        if k % 2:  # padded sequences (zero state, no write) and a skipped destination
            src[k % batch] = -1
            dst[(k + 3) % batch] = -1
        return dict(_inputs(gen, (batch,)), state_batch_indices=src.to(DEV), dst_state_batch_indices=dst.to(DEV))

    _check_rounds(captured, pool, out, graph, [step(k) for k in range(4)])


def test_mtp_graph_replayed_with_new_tables_accepted_counts_and_lengths():
    gen = torch.Generator().manual_seed(1)
    batch, T, S = 6, 4, 64
    rows = batch * T
    pool = torch.randn(S, H, P, N, generator=gen).to(DEV, F32)
    captured = dict(
        _inputs(gen, (rows,)), **_fixed(gen),
        cu_seqlens=torch.arange(0, rows + 1, T, dtype=I32, device=DEV),
        num_accepted_tokens=torch.full((batch,), T, dtype=I32, device=DEV),
        state_batch_indices=torch.arange(rows, dtype=I32, device=DEV).view(batch, T),
        dst_state_batch_indices=torch.arange(rows, 2 * rows, dtype=I32, device=DEV).view(batch, T),
        pad_slot_id=-1,
    )  # fmt: skip
    graph, out = _capture(captured, pool)

    def step(k):
        slots = torch.randperm(S, generator=gen)[: 2 * rows].to(torch.int32)
        src, dst = slots[:rows].view(batch, T).clone(), slots[rows:].view(batch, T).clone()
        acc = torch.randint(0, T + 1, (batch,), generator=gen, dtype=torch.int32)
        lens = torch.randint(0, T + 1, (batch,), generator=gen)  # varlen: some sequences short or empty
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
        if k % 2:
            dst[k % batch, 1] = -1  # a skipped destination
            src[(k + 1) % batch] = -1  # a padded sequence, whatever its accepted count
        return dict(
            _inputs(gen, (rows,)), cu_seqlens=cu.to(DEV), num_accepted_tokens=acc.to(DEV),
            state_batch_indices=src.to(DEV), dst_state_batch_indices=dst.to(DEV),
        )  # fmt: skip

    _check_rounds(captured, pool, out, graph, [step(k) for k in range(5)])


def test_intermediate_buffer_graph_replayed_with_new_entries_and_parents():
    """SGLang's EAGLE verify: dense tokens, an intermediate buffer, entry indices and parent tokens."""
    from mate.mamba import selective_state_update

    gen = torch.Generator().manual_seed(2)
    batch, T, S, E = 4, 3, 16, 12
    pool = torch.randn(S, H, P, N, generator=gen).to(DEV, F32)
    ibuf = torch.zeros(E, T, H, P, N, device=DEV)
    captured = dict(
        _inputs(gen, (batch, T)), **_fixed(gen),
        state_batch_indices=torch.arange(batch, dtype=I32, device=DEV),
        intermediate_states_buffer=ibuf, intermediate_state_indices=torch.arange(batch, dtype=I32, device=DEV),
        retrieve_parent_token=torch.tensor([[-1, 0, 1]] * batch, dtype=I32, device=DEV), pad_slot_id=-1,
    )  # fmt: skip
    out = torch.empty_like(captured["x"])
    selective_state_update(
        **dict(captured, intermediate_states_buffer=ibuf.clone()), state=pool.clone(), backend="tilelang"
    )  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        selective_state_update(**captured, state=pool, out=out, backend="tilelang")
    torch.cuda.synchronize()
    for _ in range(3):
        new = dict(
            _inputs(gen, (batch, T)),
            state_batch_indices=torch.randperm(S, generator=gen)[:batch].to(I32).to(DEV),
            intermediate_state_indices=torch.randperm(E, generator=gen)[:batch].to(I32).to(DEV),
            retrieve_parent_token=torch.tensor(
                [[-1] + [int(torch.randint(-1, t, (1,), generator=gen)) for t in range(1, T)] for _ in range(batch)],
                dtype=I32,
            ).to(DEV),
        )
        _copy_into(captured, new)
        ibuf_e, pool_e = ibuf.clone(), pool.clone()
        kw_e = {k: (v.clone() if k in new else v) for k, v in captured.items()}
        y_e = selective_state_update(**dict(kw_e, state=pool_e, intermediate_states_buffer=ibuf_e), backend="tilelang")
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y_e) and torch.equal(ibuf, ibuf_e) and torch.equal(pool, pool_e)
