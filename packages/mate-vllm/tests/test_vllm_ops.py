"""vLLM-native op signatures served by MATE, checked against vLLM's Triton semantics written out by hand over a
float64 recurrence (mate.mamba.testing): null block 0, null source rows, flat (MTP6) vs 2-D tables, one final write
without num_accepted_tokens, untied Mamba1-style forms, the prefill with final_states_out."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from mate.mamba.testing import consumer_tensors, discretize_dt, run_sequence, step
from mate_vllm import ops

ATOL = dict(atol=2e-5, rtol=2e-5)


def call(t, src=None, dst=None, **kw):
    """The mixer's call: D/dt_bias positional, dt_softplus=True, out given."""
    return ops.selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, dt_softplus=True, state_batch_indices=src,
        dst_state_batch_indices=dst, out=t.out, **kw,
    )  # fmt: skip


def test_signature_is_vllms():
    params = inspect.signature(ops.selective_state_update).parameters
    assert list(params) == [
        "state", "x", "dt", "A", "B", "C", "D", "dt_bias", "z", "dt_softplus", "state_batch_indices",
        "dst_state_batch_indices", "null_block_id", "out", "num_accepted_tokens", "cu_seqlens", "is_blackwell",
        "enable_stochastic_rounding", "cache_philox_rounds",
    ]  # fmt: skip
    assert params["null_block_id"].default == 0 and params["out"].default is None
    assert params["D"].default is inspect.Parameter.empty and params["dt_bias"].default is inspect.Parameter.empty


def test_decode_null_block_zero_source_skips_every_write():
    t = consumer_tensors(rows=4, seed=1, z=True)
    pool0 = t.state.clone()
    src = torch.tensor([3, 0, 5, 7], dtype=torch.int32)
    dst = torch.tensor([4, 9, 0, 2], dtype=torch.int32)  # row 1: null source, live dst -> still no write
    assert call(t, src, dst) is None
    expect = pool0.clone()
    for b in range(4):
        read = int(src[b])
        states, ys = run_sequence(None if read == 0 else pool0[read], [b], t)
        torch.testing.assert_close(t.out[b].double(), ys[0], **ATOL)
        if read != 0 and int(dst[b]) != 0:
            expect[int(dst[b])] = states[-1].float()
    torch.testing.assert_close(t.state, expect, **ATOL)
    assert torch.equal(t.state[9], pool0[9]) and torch.equal(t.state[0], pool0[0])


def test_minus_one_is_a_live_slot_index_under_vllms_sentinel():
    """Sentinel 0 vs -1: with null_block_id=0 a source of 0 is null; with null_block_id=-1 slot 0 is live."""
    t = consumer_tensors(rows=2, seed=2)
    pool0 = t.state.clone()
    src = torch.tensor([0, 6], dtype=torch.int32)
    call(t, src, null_block_id=-1)
    expect = pool0.clone()
    for b in range(2):
        expect[int(src[b])] = run_sequence(pool0[int(src[b])], [b], t)[0][-1].float()
    torch.testing.assert_close(t.state, expect, **ATOL)


def test_mtp6_flat_tables_name_entry_b_plus_t():
    """vLLM's MTP6 decode: one sequence, flat src/dst [rows] (the kernel unsqueezes to [rows, 1])."""
    rows = 6
    t = consumer_tensors(rows=rows, S=16, seed=3)
    pool0 = t.state.clone()
    src = torch.arange(1, 7, dtype=torch.int32)
    dst = torch.arange(9, 15, dtype=torch.int32)
    acc = torch.tensor([3], dtype=torch.int32)
    call(t, src, dst, num_accepted_tokens=acc, cu_seqlens=torch.tensor([0, rows], dtype=torch.int32))
    states, ys = run_sequence(pool0[3], list(range(rows)), t)  # read slot src[acc - 1] = 3
    expect = pool0.clone()
    for i in range(rows):
        expect[9 + i] = states[i].float()
        torch.testing.assert_close(t.out[i].double(), ys[i], **ATOL)
    torch.testing.assert_close(t.state, expect, **ATOL)


def test_spec_decode_2d_tables_null_source_and_null_destinations():
    cu = torch.tensor([0, 3, 6, 6, 8], dtype=torch.int32)
    t = consumer_tensors(rows=8, S=32, seed=4)
    pool0 = t.state.clone()
    src = torch.tensor([[1, 2, 3], [0, 0, 0], [7, 8, 9], [10, 11, 12]], dtype=torch.int64)
    dst = torch.tensor([[13, 14, 15], [16, 17, 18], [19, 20, 21], [22, 0, 24]], dtype=torch.int64)
    acc = torch.tensor([3, 2, 1, 1], dtype=torch.int64)
    call(t, src, dst, num_accepted_tokens=acc, cu_seqlens=cu)
    expect = pool0.clone()
    for b in range(4):
        rows = list(range(int(cu[b]), int(cu[b + 1])))
        read = int(src[b, max(int(acc[b]) - 1, 0)])
        states, ys = run_sequence(None if read == 0 else pool0[read], rows, t)
        for i, r in enumerate(rows):
            torch.testing.assert_close(t.out[r].double(), ys[i], **ATOL)
            if read != 0 and int(dst[b, i]) != 0:
                expect[int(dst[b, i])] = states[i].float()
    torch.testing.assert_close(t.state, expect, **ATOL)
    assert torch.equal(t.state[16:19], pool0[16:19])  # the null-source sequence wrote nothing


def test_spec_decode_without_dst_publishes_to_the_source_table():
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    t = consumer_tensors(rows=4, S=12, seed=5)
    pool0 = t.state.clone()
    src = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    acc = torch.tensor([1, 2], dtype=torch.int32)
    call(t, src, num_accepted_tokens=acc, cu_seqlens=cu)
    expect = pool0.clone()
    for b in range(2):
        states, _ = run_sequence(pool0[int(src[b, int(acc[b]) - 1])], [2 * b, 2 * b + 1], t)
        for i in range(2):
            expect[int(src[b, i])] = states[i].float()
    torch.testing.assert_close(t.state, expect, **ATOL)


def test_packed_rows_without_accepted_tokens_write_one_final_state_to_dst_b0():
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    t = consumer_tensors(rows=5, S=16, seed=6)
    pool0 = t.state.clone()
    src = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    dst = torch.tensor([[7, 8, 9], [10, 11, 12]], dtype=torch.int32)
    call(t, src, dst, cu_seqlens=cu)
    expect = pool0.clone()
    expect[7] = run_sequence(pool0[1], [0, 1, 2], t)[0][-1].float()
    expect[10] = run_sequence(pool0[4], [3, 4], t)[0][-1].float()
    torch.testing.assert_close(t.state, expect, **ATOL)


def test_untied_mamba1_forms():
    """vLLM's own tests: 3-D state [S, dim, dstate], 2-D x/dt [batch, dim], A [dim, dstate], D/dt_bias [dim]."""
    g = torch.Generator().manual_seed(7)
    S, b, P, N = 6, 3, 4, 8
    state = torch.randn(S, P, N, generator=g)
    x, dt = torch.randn(b, P, generator=g), torch.randn(b, P, generator=g)
    A = -torch.rand(P, N, generator=g)
    B, C = torch.randn(b, N, generator=g), torch.randn(b, N, generator=g)
    D, dt_bias = torch.randn(P, generator=g), torch.rand(P, generator=g)
    out = torch.empty(b, P)
    src = torch.tensor([2, 0, 5], dtype=torch.int32)
    pool0 = state.clone()
    ops.selective_state_update(state, x, dt, A, B, C, D, dt_bias, dt_softplus=True, state_batch_indices=src, out=out)
    for i in range(b):
        read = int(src[i])
        s0 = torch.zeros(P, N) if read == 0 else pool0[read]
        d = discretize_dt(dt[i], dt_bias, dt_softplus=True)  # [P]
        s, y = step(s0[None], x[i][None], d[None], A[None], B[i][None], C[i][None], D[None])  # as one head
        torch.testing.assert_close(out[i].double(), y[0], **ATOL)
        if read != 0:
            torch.testing.assert_close(state[read].double(), s[0], **ATOL)
    assert torch.equal(state[0], pool0[0])


def test_rejections():
    t = consumer_tensors(rows=2, seed=8)
    with pytest.raises(ValueError, match="out"):
        ops.selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias)
    with pytest.raises(ValueError, match="^state:.*float16"):  # (an fp32 pool: vLLM rounds into fp16 only)
        call(t, enable_stochastic_rounding=True, cache_philox_rounds=10)
    with pytest.raises(ValueError, match="state_batch_indices"):
        call(t, num_accepted_tokens=torch.ones(2, dtype=torch.int32))


def test_torch_compile_fullgraph_decode_step():
    torch._dynamo.reset()
    t = consumer_tensors(rows=3, seed=9)
    src = torch.tensor([2, 0, 4], dtype=torch.int32)

    def step(state, out):
        ops.selective_state_update(
            state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, dt_softplus=True, state_batch_indices=src, out=out
        )
        return out + 1.0

    s_ref, o_ref = t.state.clone(), torch.empty_like(t.out)
    step(s_ref, o_ref)
    s, o = t.state.clone(), torch.empty_like(t.out)
    torch.compile(step, fullgraph=True, backend="aot_eager")(s, o)
    assert torch.equal(s, s_ref) and torch.equal(o, o_ref)


# ---------------------------------------------------------------------------------------------- prefill


def prefill_case(seed=10):
    """Two sequences; the second continues a history of 11 tokens, so its first chunk ends at the absolute chunk
    boundary 16 (a short opening chunk of 5 tokens), then one full chunk of 16."""
    g = torch.Generator().manual_seed(seed)
    H, P, N, G, L = 4, 4, 8, 2, 16
    lens = [20, 21]
    T = sum(lens)
    c = SimpleNamespace(H=H, P=P, N=N, L=L)
    c.x = torch.randn(T, H, P, generator=g)
    c.dt_h = torch.randn(T, H, generator=g) * 0.5
    c.A_h = -torch.rand(H, generator=g) - 0.1
    c.B = torch.randn(T, G, N, generator=g)
    c.C = torch.randn(T, G, N, generator=g)
    c.D_h = torch.randn(H, generator=g)
    c.dtb_h = torch.rand(H, generator=g) * 0.2
    c.z = torch.randn(T, H, P, generator=g)
    c.init = torch.randn(2, H, P, N, generator=g)
    c.cu_seqlens = torch.tensor([0, 20, 41], dtype=torch.int32)
    c.cu_chunk = torch.tensor([0, 16, 20, 25, 41], dtype=torch.int32)
    c.seq_idx = torch.tensor([0, 0, 1, 1], dtype=torch.int32)
    c.last_chunk = torch.tensor([1, 3], dtype=torch.int32)
    return c


def test_prefill_final_states_out_written_into_the_pool():
    c = prefill_case()
    out = torch.empty_like(c.x)
    pool = torch.zeros(6, c.H, c.P, c.N)
    r = ops.mamba_chunk_scan_combined_varlen(
        c.x, c.dt_h, c.A_h, c.B, c.C, c.L, c.cu_seqlens, c.cu_chunk, c.last_chunk, c.seq_idx, out, c.D_h, c.z,
        c.dtb_h, c.init, True, (0.0, float("inf")), False, None, pool, torch.tensor([4, 1], dtype=torch.int32),
    )  # fmt: skip
    assert r is None
    for b, rows in enumerate((range(0, 20), range(20, 41))):
        states, ys = run_sequence(c.init[b], list(rows), c)
        torch.testing.assert_close(out[list(rows)].double(), torch.stack(ys), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(pool[(4, 1)[b]].double(), states[-1], atol=1e-4, rtol=1e-4)
    assert pool[0].abs().sum() == 0 and pool[5].abs().sum() == 0


def test_prefill_returns_states_and_intermediate_chunk_states():
    c = prefill_case(11)
    out = torch.empty_like(c.x)
    args = (c.x, c.dt_h, c.A_h, c.B, c.C, c.L, c.cu_seqlens, c.cu_chunk, c.last_chunk, c.seq_idx, out)
    final = ops.mamba_chunk_scan_combined_varlen(*args, D=c.D_h, dt_bias=c.dtb_h, dt_softplus=True)
    chunks = ops.mamba_chunk_scan_combined_varlen(
        *args, D=c.D_h, dt_bias=c.dtb_h, dt_softplus=True, return_intermediate_states=True
    )
    assert final.shape == (2, c.H, c.P, c.N) and chunks.shape == (4, c.H, c.P, c.N)
    for b, rows in enumerate((range(0, 20), range(20, 41))):
        states, _ = run_sequence(None, list(rows), c)
        torch.testing.assert_close(final[b].double(), states[-1], atol=1e-4, rtol=1e-4)
    s20, _ = run_sequence(None, list(range(0, 20)), c)
    torch.testing.assert_close(chunks[0].double(), s20[15], atol=1e-4, rtol=1e-4)  # end of chunk [0, 16)
    s21, _ = run_sequence(None, list(range(20, 41)), c)
    torch.testing.assert_close(chunks[2].double(), s21[4], atol=1e-4, rtol=1e-4)  # the short opening chunk


def test_prefill_compiles_fullgraph():
    torch._dynamo.reset()
    c = prefill_case(12)

    def f(out, pool):
        ops.mamba_chunk_scan_combined_varlen(
            c.x, c.dt_h, c.A_h, c.B, c.C, c.L, c.cu_seqlens, c.cu_chunk, c.last_chunk, c.seq_idx, out, c.D_h,
            None, c.dtb_h, c.init, True, final_states_out=pool, final_state_indices=torch.tensor([2, 0]),
        )  # fmt: skip
        return out * 1.0

    o_ref, p_ref = torch.empty_like(c.x), torch.zeros(3, c.H, c.P, c.N)
    f(o_ref, p_ref)
    o, p = torch.empty_like(c.x), torch.zeros(3, c.H, c.P, c.N)
    torch.compile(f, fullgraph=True, backend="aot_eager")(o, p)
    assert torch.equal(o, o_ref) and torch.equal(p, p_ref)


@pytest.mark.gpu
def test_gpu_spec_decode_matches_cpu():
    cu = torch.tensor([0, 3, 6, 6, 8], dtype=torch.int32)
    src = torch.tensor([[1, 2, 3], [0, 0, 0], [7, 8, 9], [10, 11, 12]], dtype=torch.int32)
    dst = torch.tensor([[13, 14, 15], [16, 17, 18], [19, 20, 21], [22, 0, 24]], dtype=torch.int32)
    acc = torch.tensor([3, 2, 1, 1], dtype=torch.int32)
    cpu = consumer_tensors(rows=8, S=32, seed=4, H=8, P=64, N=128, G=2, io_dtype=torch.bfloat16)
    gpu = consumer_tensors(rows=8, S=32, seed=4, H=8, P=64, N=128, G=2, io_dtype=torch.bfloat16)
    for k, v in vars(gpu).items():
        if isinstance(v, torch.Tensor):
            setattr(gpu, k, v.cuda())
    call(cpu, src, dst, num_accepted_tokens=acc, cu_seqlens=cu)
    call(gpu, src.cuda(), dst.cuda(), num_accepted_tokens=acc.cuda(), cu_seqlens=cu.cuda())
    torch.testing.assert_close(gpu.out.cpu().float(), cpu.out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gpu.state.cpu(), cpu.state, atol=2e-3, rtol=2e-3)
