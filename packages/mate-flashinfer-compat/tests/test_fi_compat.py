"""FlashInfer's selective_state_update served by MATE (mate_flashinfer_compat.mamba): vLLM's FlashInferSSUBackend
calls and FlashInfer's own write rules, checked against a float64 recurrence with hand-written slot expectations
(mate.mamba.testing)."""

from __future__ import annotations

import mate_flashinfer_compat.mamba
import pytest
import torch
from mate.mamba.testing import consumer_tensors, run_sequence

ATOL = dict(atol=2e-5, rtol=2e-5)


def fi_ssu():
    """MATE's FlashInfer-shaped function (without a real FlashInfer no ``flashinfer`` module exists by default;
    beside one, ``flashinfer.mamba.selective_state_update`` is this same function: test_fi_real.py)."""
    from mate_flashinfer_compat.mamba import selective_state_update

    return selective_state_update


def vllm_flashinfer_backend_call(t, src, dst, cu_seqlens=None, acc=None, null_block_id=0, algorithm="auto", fn=None):
    """Exactly what vLLM 0.33's FlashInferSSUBackend.__call__ passes (stochastic rounding off)."""
    return (fn or fi_ssu())(
        t.state, t.x, t.dt, t.A, t.B, t.C, D=t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu_seqlens, num_accepted_tokens=acc,
        cache_steps=src.size(-1) if cu_seqlens is not None and src is not None else 0,
        pad_slot_id=null_block_id, out=t.out, rand_seed=None, philox_rounds=10, algorithm=algorithm,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- import surface


def test_signature_matches_flashinfer_0_7_2():
    import inspect

    params = list(inspect.signature(mate_flashinfer_compat.mamba.selective_state_update).parameters.values())
    expected = [
        ("state", None), ("x", None), ("dt", None), ("A", None), ("B", None), ("C", None), ("D", None),
        ("z", None), ("dt_bias", None), ("dt_softplus", False), ("state_batch_indices", None), ("pad_slot_id", -1),
        ("state_scale", None), ("out", None), ("disable_state_update", False), ("intermediate_states_buffer", None),
        ("intermediate_state_indices", None), ("intermediate_state_scales", None), ("rand_seed", None),
        ("philox_rounds", 10), ("cache_steps", 0), ("algorithm", "auto"), ("dst_state_batch_indices", None),
        ("cu_seqlens", None), ("num_accepted_tokens", None), ("backend", "auto"),
    ]  # fmt: skip
    assert [p.name for p in params] == [n for n, _ in expected]
    for p, (_, default) in zip(params[7:], expected[7:], strict=True):
        assert p.default == default, p.name
    assert params[6].default is inspect.Parameter.empty  # D has no default in FlashInfer


# --------------------------------------------------------------------- vLLM's FlashInferSSUBackend calls


def test_vllm_decode_null_block_zero():
    """Plain decode: flat src/dst [N], null block 0; a null source reads zeros and writes nothing."""
    t = consumer_tensors(rows=4, seed=1)
    pool0 = t.state.clone()
    src = torch.tensor([3, 0, 5, 7], dtype=torch.int32)
    dst = torch.tensor([3, 0, 6, 2], dtype=torch.int32)  # row 2 moves (prefix-caching style), row 3 too
    ret = vllm_flashinfer_backend_call(t, src, dst)
    assert ret is t.out
    expect = pool0.clone()
    for b in range(4):
        s0 = None if int(src[b]) == 0 else pool0[int(src[b])]
        states, ys = run_sequence(s0, [b], t)
        torch.testing.assert_close(t.out[b].double(), ys[0], **ATOL)
        if int(src[b]) != 0:
            expect[int(dst[b])] = states[-1].float()
    torch.testing.assert_close(t.state, expect, **ATOL)
    assert torch.equal(t.state[0], pool0[0])  # the null block is never written


def test_vllm_spec_decode_packed_mtp():
    """MTP through FlashInfer's packed form: 3-D x + cu_seqlens, src/dst [N, 1+K], acc, cache_steps = 1+K."""
    lens = [3, 0, 2, 3]
    cu = torch.tensor([0, 3, 3, 5, 8], dtype=torch.int32)
    t = consumer_tensors(rows=8, S=32, seed=2)
    pool0 = t.state.clone()
    src = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 0]], dtype=torch.int32)
    dst = torch.tensor([[11, 12, 13], [14, 15, 16], [17, 0, 19], [20, 21, 22]], dtype=torch.int32)
    acc = torch.tensor([2, 1, 1, 1], dtype=torch.int32)
    vllm_flashinfer_backend_call(t, src, dst, cu_seqlens=cu, acc=acc)
    expect = pool0.clone()
    for b in range(4):
        rows = list(range(int(cu[b]), int(cu[b + 1])))
        read = int(src[b, max(int(acc[b]) - 1, 0)])
        states, ys = run_sequence(None if read == 0 else pool0[read], rows, t)
        for i, r in enumerate(rows):
            torch.testing.assert_close(t.out[r].double(), ys[i], **ATOL)
            if read != 0 and int(dst[b, i]) != 0:
                expect[int(dst[b, i])] = states[i].float()
    assert lens[1] == 0  # the empty sequence writes nothing
    torch.testing.assert_close(t.state, expect, **ATOL)
    assert torch.equal(t.state[0], pool0[0]) and torch.equal(t.state[20:23], pool0[20:23])  # null source row 3


def test_flat_tables_on_the_multi_token_path_name_entry_b():
    """FlashInfer addresses a 1-D table with a zero token stride: each token of sequence b writes dst[b]."""
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    t = consumer_tensors(rows=5, S=12, seed=3)
    pool0 = t.state.clone()
    src = torch.tensor([4, 6], dtype=torch.int64)
    dst = torch.tensor([9, 10], dtype=torch.int64)
    fi_ssu()(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src,
        dst_state_batch_indices=dst, cu_seqlens=cu, cache_steps=3, pad_slot_id=-1, out=t.out,
    )  # fmt: skip
    expect = pool0.clone()
    for b, rows in enumerate(([0, 1, 2], [3, 4])):
        states, ys = run_sequence(pool0[int(src[b])], rows, t)
        expect[int(dst[b])] = states[-1].float()  # the last token's write wins
        for i, r in enumerate(rows):
            torch.testing.assert_close(t.out[r].double(), ys[i], **ATOL)
    torch.testing.assert_close(t.state, expect, **ATOL)


def test_dst_writes_ignore_disable_state_update_on_the_multi_token_path():
    t = consumer_tensors(rows=4, S=12, seed=4)
    pool0 = t.state.clone()
    x4 = lambda v: v.view(2, 2, *v.shape[1:])  # noqa: E731  dense [batch, T, ...]
    src = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    dst = torch.tensor([[5, 6], [7, -1]], dtype=torch.int32)
    out = torch.empty(2, 2, 4, 4)
    fi_ssu()(
        t.state, x4(t.x), x4(t.dt), t.A, x4(t.B), x4(t.C), t.D, dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src, dst_state_batch_indices=dst, out=out, disable_state_update=True,
    )  # fmt: skip
    expect = pool0.clone()
    for b in range(2):
        states, ys = run_sequence(pool0[int(src[b, 0])], [2 * b, 2 * b + 1], t)
        for i in range(2):
            torch.testing.assert_close(out[b, i].double(), ys[i], **ATOL)
            if int(dst[b, i]) != -1:
                expect[int(dst[b, i])] = states[i].float()
    torch.testing.assert_close(t.state, expect, **ATOL)


def test_accepted_tokens_without_dst_write_only_the_final_state_to_the_read_slot():
    cu = torch.tensor([0, 2, 4], dtype=torch.int32)
    t = consumer_tensors(rows=4, S=12, seed=5)
    pool0 = t.state.clone()
    src = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    acc = torch.tensor([2, 1], dtype=torch.int32)
    fi_ssu()(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src,
        cu_seqlens=cu, num_accepted_tokens=acc, cache_steps=2, out=t.out,
    )  # fmt: skip
    expect = pool0.clone()
    for b, read in ((0, 2), (1, 3)):
        states, _ = run_sequence(pool0[read], [2 * b, 2 * b + 1], t)
        expect[read] = states[-1].float()
    torch.testing.assert_close(t.state, expect, **ATOL)
    # and disable_state_update gates that final write
    t2 = consumer_tensors(rows=4, S=12, seed=5)
    pool1 = t2.state.clone()
    fi_ssu()(
        t2.state, t2.x, t2.dt, t2.A, t2.B, t2.C, t2.D, dt_bias=t2.dt_bias, dt_softplus=True,
        state_batch_indices=src, cu_seqlens=cu, num_accepted_tokens=acc, cache_steps=2, out=t2.out,
        disable_state_update=True,
    )  # fmt: skip
    assert torch.equal(t2.state, pool1)


def test_intermediate_buffer_mode_leaves_the_pool_alone():
    t = consumer_tensors(rows=6, S=8, seed=6)
    pool0 = t.state.clone()
    d4 = lambda v: v.view(2, 3, *v.shape[1:])  # noqa: E731
    buf = torch.zeros(4, 3, 4, 4, 8)
    src = torch.tensor([2, -1], dtype=torch.int32)
    idx = torch.tensor([3, 1], dtype=torch.int32)
    y = fi_ssu()(
        t.state, d4(t.x), d4(t.dt), t.A, d4(t.B), d4(t.C), t.D, dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src, intermediate_states_buffer=buf, intermediate_state_indices=idx, cache_steps=3,
    )  # fmt: skip
    assert torch.equal(t.state, pool0)
    states, ys = run_sequence(pool0[2], [0, 1, 2], t)
    for i in range(3):
        torch.testing.assert_close(buf[3, i].double(), states[i], **ATOL)
        torch.testing.assert_close(y[0, i].double(), ys[i], **ATOL)
    assert buf[1].abs().sum() == 0 and buf[0].abs().sum() == 0  # the pad row writes nothing
    _, ys = run_sequence(None, [3, 4, 5], t)
    torch.testing.assert_close(y[1].double(), torch.stack(ys), **ATOL)


def test_one_token_path_ignores_accepted_tokens_like_flashinfer():
    t = consumer_tensors(rows=2, S=12, seed=13)
    pool0 = t.state.clone()
    src = torch.tensor([[3, 4, 5], [6, 7, 8]], dtype=torch.int32)
    fi_ssu()(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src,
        num_accepted_tokens=torch.tensor([3, 2], dtype=torch.int32), out=t.out,
    )  # fmt: skip
    expect = pool0.clone()
    for b, read in ((0, 3), (1, 6)):  # column 0, not src[b, acc - 1]
        states, ys = run_sequence(pool0[read], [b], t)
        expect[read] = states[-1].float()
        torch.testing.assert_close(t.out[b].double(), ys[0], **ATOL)
    torch.testing.assert_close(t.state, expect, **ATOL)


def test_one_token_path_reads_column_zero_and_honours_disable():
    t = consumer_tensors(rows=2, S=12, seed=7)
    pool0 = t.state.clone()
    src = torch.tensor([[3, 4, 5], [6, 7, 8]], dtype=torch.int32)
    fi_ssu()(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src,
        out=t.out, disable_state_update=True,
    )  # fmt: skip
    assert torch.equal(t.state, pool0)
    for b, read in ((0, 3), (1, 6)):
        _, ys = run_sequence(pool0[read], [b], t)
        torch.testing.assert_close(t.out[b].double(), ys[0], **ATOL)
    fi_ssu()(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src)
    expect = pool0.clone()
    for b, read in ((0, 3), (1, 6)):
        expect[read] = run_sequence(pool0[read], [b], t)[0][-1].float()
    torch.testing.assert_close(t.state, expect, **ATOL)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(algorithm="fastest"), ValueError, "algorithm"),
        (dict(backend="triton"), ValueError, "backend"),
        (dict(rand_seed=torch.zeros(1, dtype=torch.int64)), NotImplementedError, "rand_seed"),
        (dict(intermediate_states_buffer=torch.zeros(2, 1, 4, 4, 8)), ValueError, "intermediate_states_buffer"),
        (dict(cu_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32)), ValueError, "cache_steps"),
        (
            dict(intermediate_states_buffer=torch.zeros(2, 1, 4, 4, 8), dst_state_batch_indices=torch.zeros(2)),
            ValueError,
            "mutually exclusive",
        ),
    ],
)
def test_rejections(kwargs, exc, match):
    t = consumer_tensors(rows=2, seed=8)
    src = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(exc, match=match):
        fi_ssu()(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, state_batch_indices=src, **kwargs)


def test_async_horizontal_is_accepted_as_simple():
    t = consumer_tensors(rows=2, seed=9)
    fi_ssu()(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, algorithm="async_horizontal", backend="flashinfer")


def test_torch_compile_fullgraph_over_the_vllm_decode_call():
    torch._dynamo.reset()
    t = consumer_tensors(rows=3, seed=10)
    src = torch.tensor([2, 0, 4], dtype=torch.int32)
    ref_state, ref_out = t.state.clone(), torch.empty_like(t.out)
    fn = fi_ssu()

    def step(state, out):
        fn(state, t.x, t.dt, t.A, t.B, t.C, D=t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src,
           dst_state_batch_indices=src, pad_slot_id=0, out=out, cache_steps=0)  # fmt: skip
        return out * 1.0

    step(ref_state, ref_out)
    got_state, got_out = t.state.clone(), torch.empty_like(t.out)
    torch.compile(step, fullgraph=True, backend="aot_eager")(got_state, got_out)
    assert torch.equal(got_out, ref_out) and torch.equal(got_state, ref_state)


@pytest.mark.gpu
def test_gpu_vllm_spec_decode_matches_cpu():
    cu = torch.tensor([0, 3, 3, 5, 8], dtype=torch.int32)
    src = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 0]], dtype=torch.int32)
    dst = torch.tensor([[11, 12, 13], [14, 15, 16], [17, 0, 19], [20, 21, 22]], dtype=torch.int32)
    acc = torch.tensor([2, 1, 1, 1], dtype=torch.int32)
    cpu = consumer_tensors(rows=8, S=32, seed=2, H=8, P=64, N=128, G=2, io_dtype=torch.bfloat16)
    gpu = consumer_tensors(rows=8, S=32, seed=2, H=8, P=64, N=128, G=2, io_dtype=torch.bfloat16)
    for k, v in vars(gpu).items():
        if isinstance(v, torch.Tensor):
            setattr(gpu, k, v.cuda())
    from mate_flashinfer_compat.mamba import selective_state_update as fn

    vllm_flashinfer_backend_call(cpu, src, dst, cu_seqlens=cu, acc=acc, fn=fn)
    vllm_flashinfer_backend_call(gpu, src.cuda(), dst.cuda(), cu_seqlens=cu.cuda(), acc=acc.cuda(), fn=fn)
    torch.testing.assert_close(gpu.out.cpu().float(), cpu.out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gpu.state.cpu(), cpu.state, atol=2e-3, rtol=2e-3)


def test_prefill_names_are_served():
    from mate_flashinfer_compat.prefill import mamba_chunk_scan_combined_varlen, ssd_combined_fwd_varlen

    g = torch.Generator().manual_seed(11)
    T, H, P, N = 5, 2, 4, 8
    x, dt = torch.randn(T, H, P, generator=g), torch.randn(T, H, generator=g)
    A, B, C = -torch.rand(H, generator=g), torch.randn(T, 1, N, generator=g), torch.randn(T, 1, N, generator=g)
    args = (x, dt, A, B, C, 16, torch.tensor([0, 5]), torch.tensor([0, 5]), torch.tensor([0]), torch.tensor([0]))
    out1, out2 = torch.empty_like(x), torch.empty_like(x)
    s1 = ssd_combined_fwd_varlen(*args, out1, dt_softplus=True)
    s2 = mamba_chunk_scan_combined_varlen(*args, out2, None, None, None, None, True)  # vLLM's positional order
    assert torch.equal(s1, s2) and torch.equal(out1, out2)
    t = type("T", (), {})()
    t.x, t.B, t.C, t.dt_h, t.A_h, t.D_h, t.dtb_h, t.z = x, B, C, dt, A, None, None, None
    states, ys = run_sequence(None, range(T), t)
    torch.testing.assert_close(out1.double(), torch.stack(ys), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s1[0].double(), states[-1], atol=1e-4, rtol=1e-4)


def test_sglang_flashinfer_backend_verify_call():
    """SGLang's FlashInferSSUBackend: dense 4-D verify step, disable_state_update=True, a 5-D intermediate buffer,
    cache_steps=T, intermediate_state_indices, 1-D slots with a -1 pad."""
    bs, T = 3, 4
    t = consumer_tensors(rows=bs * T, S=8, seed=12)
    pool0 = t.state.clone()
    d4 = lambda v: v.reshape(bs, T, *v.shape[1:])  # noqa: E731
    buf = torch.zeros(5, T, 4, 4, 8)
    src = torch.tensor([6, -1, 1], dtype=torch.int32)
    idx = torch.tensor([0, 2, 4], dtype=torch.int32)
    out = torch.empty(bs, T, 4, 4)
    fi_ssu()(
        t.state, d4(t.x), d4(t.dt), t.A, d4(t.B), d4(t.C), D=t.D, z=None, dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src, out=out, disable_state_update=True, intermediate_states_buffer=buf,
        cache_steps=T, intermediate_state_indices=idx,
    )  # fmt: skip
    assert torch.equal(t.state, pool0)
    for b in range(bs):
        read = int(src[b])
        states, ys = run_sequence(None if read == -1 else pool0[read], list(range(b * T, (b + 1) * T)), t)
        torch.testing.assert_close(out[b].double(), torch.stack(ys), **ATOL)
        if read != -1:
            torch.testing.assert_close(buf[int(idx[b])].double(), torch.stack(states), **ATOL)
    assert buf[2].abs().sum() == 0
