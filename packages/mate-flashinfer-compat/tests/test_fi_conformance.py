"""Op-level conformance of MATE's ``flashinfer.mamba`` surface with FlashInfer 0.7.2, checked against the float64
oracle (``mate.mamba.testing``).

Written from FlashInfer's Python wrapper (``flashinfer/mamba/selective_state_update.py``), its dtype checks
(``csrc/selective_state_update.cu``: B/C/z/out in x's dtype, D/dt_bias in dt's dtype, A any float, tables of one
int dtype) and its kernels (``kernel_selective_state_update_stp.cuh``, ``..._mtp_simple.cuh``):

* one-token path: read ``src[b]`` (column 0 of a 2-D table), write ``dst[b]`` (the read slot without one);
  without a table the slot is ``b`` and FlashInfer compares that implicit slot with ``pad_slot_id`` too;
* multi-token paths (dense 4-D ``x`` with ``cache_steps``, packed ``x`` with ``cu_seqlens``): a destination table
  takes every token's state, an intermediate buffer every token's state at ``[idx, t]``, otherwise the final
  state goes back to the read slot (``src[b, acc - 1]`` with ``num_accepted_tokens``);
* the return value is ``out`` (a new tensor like ``x`` without it).

Forms FlashInfer rejects and MATE accepts (documented permissiveness): D/dt_bias in another dtype than dt,
tables of different int dtypes, B/C in fp32 beside a bf16/fp16 x (the last needs the runtime's fp32 B/C).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mate.mamba.testing import ssd_recurrence, ssu_recurrence

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def fi():
    """MATE's ``flashinfer.mamba`` surface itself (beside a real FlashInfer, as on the GPU machine, the real
    ``flashinfer.mamba.selective_state_update`` is this same function under ``MATE_FLASHINFER_COMPAT=auto``)."""
    import mate_flashinfer_compat.mamba

    return mate_flashinfer_compat.mamba


def prefill():
    """The packed SSD prefill under mate.mamba's and vLLM's names (not FlashInfer API)."""
    import mate_flashinfer_compat.prefill

    return mate_flashinfer_compat.prefill


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == F32 else dict(atol=4e-2, rtol=4e-2)


def tensors(rows, S, H=2, P=4, N=8, G=1, io=F32, weight=F32, bc=None, a_dtype=F32, state_dtype=F32, device="cpu",
            seed=0):  # fmt: skip
    """FlashInfer's test tensors: tied per-head dt/A/D/dt_bias expanded with stride 0 (dt, D, dt_bias in the
    weight dtype), x/B/C/z in the input dtype."""
    g = torch.Generator().manual_seed(seed)
    t = SimpleNamespace()
    t.state = torch.randn(S, H, P, N, generator=g).to(state_dtype)
    t.x = torch.randn(rows, H, P, generator=g).to(io)
    t.z = torch.randn(rows, H, P, generator=g).to(io)
    t.B = torch.randn(rows, G, N, generator=g).to(bc or io)
    t.C = torch.randn(rows, G, N, generator=g).to(bc or io)
    t.dt = (torch.randn(rows, H, generator=g) * 0.5).to(weight)
    t.A = (-torch.rand(H, generator=g) - 0.1).to(a_dtype)
    t.D = torch.randn(H, generator=g).to(weight)
    t.dt_bias = (torch.rand(H, generator=g) - 1.0).to(weight)
    for k, v in vars(t).items():
        setattr(t, k, v.to(device))
    t.dt = t.dt.unsqueeze(-1).expand(rows, H, P)
    t.A = t.A.view(H, 1, 1).expand(H, P, N)
    t.D = t.D.view(H, 1).expand(H, P)
    t.dt_bias = t.dt_bias.view(H, 1).expand(H, P)
    return t


def expect(t, x=None, dt=None, B=None, C=None, z=None, **kw):
    """The oracle over FlashInfer's rules (``kw`` as ``mate.mamba.testing.ssu_recurrence``), on CPU copies."""
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    pick = lambda a, b: (a if a is not None else b).cpu()  # noqa: E731
    return ssu_recurrence(
        t.state.cpu(), pick(x, t.x), pick(dt, t.dt), t.A.cpu(), pick(B, t.B), pick(C, t.C), D=t.D.cpu(),
        z=None if z is None else z.cpu(), dt_bias=t.dt_bias.cpu(), dt_softplus=True, **cpu,
    )  # fmt: skip


def check(t, y, e, pool0, io=F32, state_dtype=F32):
    torch.testing.assert_close(y.cpu().double(), e.y64, **_tol(io))
    torch.testing.assert_close(t.state.cpu().float(), e.state.float(), **_tol(io if io != F32 else state_dtype))
    untouched = [s for s in range(pool0.shape[0]) if s not in e.written]
    assert torch.equal(t.state.cpu()[untouched], pool0.cpu()[untouched])


# ------------------------------------------------------------------------------------------ one token


@pytest.mark.parametrize("io,weight,state_dtype", [(BF16, BF16, BF16), (BF16, F32, F32), (F16, F16, F32)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_one_token_with_a_table_returns_out(io, weight, state_dtype, index_dtype):
    t = tensors(rows=4, S=7, H=4, G=2, io=io, weight=weight, state_dtype=state_dtype, seed=1)
    pool0 = t.state.clone()
    src = torch.tensor([6, -1, 2, 0], dtype=index_dtype)
    out = torch.empty_like(t.x)
    e = expect(t, z=t.z, state_batch_indices=src, pad_slot_id=-1, final_write_to_dst=True)
    y = fi().selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src, pad_slot_id=-1, out=out,
    )  # fmt: skip
    assert y is out and y.dtype == io
    check(t, y, e, pool0, io, state_dtype)
    assert e.written == {6, 2, 0}


def test_one_token_without_a_table_and_without_out():
    """Slot b for sequence b; no ``out``: a new tensor shaped and typed like x comes back."""
    t = tensors(rows=3, S=3, io=BF16, weight=BF16, seed=2)
    pool0 = t.state.clone()
    e = expect(t)
    y = fi().selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True)
    assert y.shape == t.x.shape and y.dtype == BF16
    check(t, y, e, pool0, BF16)
    assert e.written == {0, 1, 2}


def test_one_token_without_a_table_compares_the_implicit_slot_with_pad_slot_id():
    """FlashInfer's kernel compares slot ``b`` with ``pad_slot_id`` also without a table (unlike vLLM's)."""
    t = tensors(rows=3, S=3, seed=3)
    pool0 = t.state.clone()
    e = expect(t, pad_slot_id=1)
    y = fi().selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, pad_slot_id=1
    )
    check(t, y, e, pool0)
    assert e.written == {0, 2}


def test_one_token_two_d_n_by_1_table_and_destination_mixed_int_dtypes():
    """[N, 1] tables; src int32 beside dst int64 (FlashInfer requires one dtype; MATE accepts both)."""
    t = tensors(rows=3, S=9, seed=4)
    pool0 = t.state.clone()
    src = torch.tensor([[1], [-1], [4]], dtype=torch.int32)
    dst = torch.tensor([[7], [8], [-1]], dtype=torch.int64)
    e = expect(t, state_batch_indices=src, dst_state_batch_indices=dst, final_write_to_dst=True)
    y = fi().selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src,
        dst_state_batch_indices=dst,
    )  # fmt: skip
    check(t, y, e, pool0)
    assert e.written == {7}


@pytest.mark.parametrize(
    "io,weight,bc,a_dtype",
    [
        (BF16, BF16, None, BF16),  # A in bf16 (FlashInfer's matrixA_t; cast to fp32, exact)
        (BF16, BF16, None, F16),
        (BF16, F32, F32, F32),  # B/C fp32 beside a bf16 x (MATE's permissiveness; needs the runtime's change)
    ],
)
def test_one_token_dtype_mixes(io, weight, bc, a_dtype):
    t = tensors(rows=3, S=5, io=io, weight=weight, bc=bc, a_dtype=a_dtype, seed=5)
    pool0 = t.state.clone()
    src = torch.tensor([4, 0, 2], dtype=torch.int32)
    e = expect(t, state_batch_indices=src, final_write_to_dst=True)
    y = fi().selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True, state_batch_indices=src
    )
    check(t, y, e, pool0, io)


def test_d_and_dt_bias_in_fp32_beside_a_bf16_dt():
    """FlashInfer requires D/dt_bias in dt's dtype; MATE accepts fp32 beside bf16 and computes in fp32."""
    t = tensors(rows=2, S=3, io=BF16, weight=BF16, seed=6)
    t.D, t.dt_bias = t.D.float(), t.dt_bias.float()
    pool0 = t.state.clone()
    e = expect(t)
    y = fi().selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True)
    check(t, y, e, pool0, BF16)


# ------------------------------------------------------------------------------------------ multi-token


def test_dense_mtp_with_an_intermediate_buffer_int64_tables():
    b, T = 2, 3
    t = tensors(rows=b * T, S=6, H=4, G=2, seed=7)
    pool0 = t.state.clone()
    d4 = lambda v: v.reshape(b, T, *v.shape[1:])  # noqa: E731
    src = torch.tensor([5, 1], dtype=torch.int64)
    buf = torch.zeros(b, T, 4, 4, 8)
    idx = torch.tensor([1, 0], dtype=torch.int64)
    e = expect(t, x=d4(t.x), dt=d4(t.dt), B=d4(t.B), C=d4(t.C), z=d4(t.z), state_batch_indices=src,
               intermediate_states_buffer=buf, intermediate_state_indices=idx, cache_steps=T)  # fmt: skip
    y = fi().selective_state_update(
        t.state, d4(t.x), d4(t.dt), t.A, d4(t.B), d4(t.C), t.D, z=d4(t.z), dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src, intermediate_states_buffer=buf, intermediate_state_indices=idx, cache_steps=T,
    )  # fmt: skip
    assert y.shape == (b, T, 4, 4)
    check(t, y, e, pool0)
    torch.testing.assert_close(buf.double(), e.ibuf.double(), **_tol(F32))
    assert torch.equal(t.state, pool0)


def test_packed_spec_decode_n_by_1_plus_k_tables():
    """vLLM's FlashInfer backend call: packed rows, [N, 1 + K] tables, num_accepted_tokens, cache_steps = 1 + K."""
    cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    src = torch.tensor([[1, 2, 3], [-1, -1, -1], [4, 5, 6]], dtype=torch.int32)
    dst = torch.tensor([[7, 8, 9], [10, 11, 12], [13, -1, 15]], dtype=torch.int32)
    acc = torch.tensor([2, 1, 3], dtype=torch.int32)
    t = tensors(rows=7, S=16, H=4, G=2, io=BF16, weight=F32, seed=8)
    pool0 = t.state.clone()
    out = torch.empty_like(t.x)
    e = expect(t, z=t.z, state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu,
               num_accepted_tokens=acc)  # fmt: skip
    y = fi().selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu, num_accepted_tokens=acc,
        cache_steps=3, out=out,
    )  # fmt: skip
    assert y is out
    check(t, y, e, pool0, BF16)
    assert e.written == {7, 8, 9, 13, 15}


def test_unserved_options_are_named():
    t = tensors(rows=2, S=3, io=F16, weight=F16, state_dtype=F16, seed=9)
    ssu = fi().selective_state_update
    args = (t.state, t.x, t.dt, t.A, t.B, t.C, t.D)
    with pytest.raises(ValueError, match="^philox_rounds:"):  # FlashInfer's rule: rounds > 0 with a seed
        ssu(*args, rand_seed=torch.zeros(1, dtype=torch.int64), philox_rounds=0)
    with pytest.raises(NotImplementedError, match="rand_seed"):  # stochastic rounding is for fp16 states
        ssu(t.state.float(), *args[1:], rand_seed=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="^state_scale:"):  # FlashInfer's scales go with an int16 state only
        ssu(*args, state_scale=torch.ones(3, 2, 4))


def test_int16_state_with_block_scales_passes_through():
    """FlashInfer's int16 block-scaled state: served (here by the reference backend), its scales written in
    place for the slots the call writes (mate.mamba's tests check the values against the recurrence)."""
    t = tensors(rows=2, S=3, io=F16, weight=F16, state_dtype=F32, seed=10)
    q = (t.state * 1000).round().to(torch.int16)
    scale = torch.full(q.shape[:3], 1e-3)
    y = fi().selective_state_update(q, t.x, t.dt, t.A, t.B, t.C, t.D, state_scale=scale)
    assert torch.isfinite(y.float()).all()
    assert not torch.equal(scale[:2], torch.full_like(scale[:2], 1e-3))  # rows 0, 1: slots 0, 1 rewritten
    assert torch.equal(scale[2], torch.full_like(scale[2], 1e-3))


# -------------------------------------------------------------------------------------------- prefill


def prefill_case(seqlens, chunk_size, H=2, P=4, N=8, G=1, io=F32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sum(seqlens)
    c = SimpleNamespace()
    c.x = torch.randn(T, H, P, generator=g).to(io)
    c.dt = (torch.randn(T, H, generator=g) * 0.5 - 1.0).to(io)
    c.A = (-torch.rand(H, generator=g) - 0.1).to(io)
    c.B = torch.randn(T, G, N, generator=g).to(io)
    c.C = torch.randn(T, G, N, generator=g).to(io)
    c.D = torch.randn(H, generator=g)
    c.dt_bias = torch.rand(H, generator=g) * 0.2
    c.init = torch.randn(len(seqlens), H, P, N, generator=g)
    cu_chunk, seq_idx, last, bos = [0], [], [], 0
    for b, n in enumerate(seqlens):
        for s in range(0, n, chunk_size):
            cu_chunk.append(bos + min(s + chunk_size, n))
            seq_idx.append(b)
        last.append(len(seq_idx) - 1)
        bos += n
    c.cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    c.cu_chunk = torch.tensor(cu_chunk, dtype=torch.int32)
    c.seq_idx = torch.tensor(seq_idx, dtype=torch.int32)
    c.last = torch.tensor(last, dtype=torch.int32)
    for k, v in vars(c).items():
        setattr(c, k, v.to(device))
    return c


def _prefill_oracle(c, seqlens):
    return ssd_recurrence(
        c.x.cpu(), c.dt.cpu(), c.A.cpu(), c.B.cpu(), c.C.cpu(), seqlens, D=c.D.cpu(), dt_bias=c.dt_bias.cpu(),
        dt_softplus=True, initial_states=c.init.cpu(),
    )  # fmt: skip


@pytest.mark.parametrize("chunk_size", [8, 32, 128])
def test_vllm_named_prefill_chunk_sizes_and_return_dtype(chunk_size):
    """vLLM's op under FlashInfer's module: bf16 x/dt/A/B/C (needs the runtime's 16-bit A and chunk size 8),
    fp32 initial states; the states come back in C's dtype (vLLM's rule)."""
    seqlens = [chunk_size + 3, 2 * chunk_size]
    c = prefill_case(seqlens, chunk_size, io=BF16, seed=chunk_size)
    out = torch.empty_like(c.x)
    final = prefill().mamba_chunk_scan_combined_varlen(
        c.x, c.dt, c.A, c.B, c.C, chunk_size, c.cu, c.cu_chunk, c.last, c.seq_idx, out, c.D, None, c.dt_bias,
        c.init, True,
    )  # fmt: skip
    e = _prefill_oracle(c, seqlens)
    assert final.dtype == BF16 and final.shape == (2, 2, 4, 8)
    torch.testing.assert_close(out.double(), e.y, atol=6e-2, rtol=6e-2)
    torch.testing.assert_close(final.double(), e.final, atol=6e-2, rtol=6e-2)


def test_seed_named_prefill_returns_the_initial_states_dtype():
    """``ssd_combined_fwd_varlen`` keeps mate.mamba's rule: state_dtype, else the initial states' dtype."""
    seqlens = [20, 9]
    c = prefill_case(seqlens, 16, io=BF16, seed=3)
    c.A = c.A.float()
    out = torch.empty_like(c.x)
    final = prefill().ssd_combined_fwd_varlen(
        c.x, c.dt, c.A, c.B, c.C, 16, c.cu, c.cu_chunk, c.last, c.seq_idx, out, c.D, None, c.dt_bias,
        dt_softplus=True, initial_states=c.init,
    )  # fmt: skip
    assert final.dtype == F32
    torch.testing.assert_close(final.double(), _prefill_oracle(c, seqlens).final, atol=3e-2, rtol=3e-2)


# ------------------------------------------------------------------------------------------- GPU twins

GPU_SHAPE = dict(H=8, P=64, N=128, G=2)


@pytest.mark.gpu
def test_gpu_one_token_bf16_a_fp32_d_without_a_table():
    t = tensors(rows=4, S=4, io=BF16, weight=BF16, a_dtype=BF16, device="cuda", seed=20, **GPU_SHAPE)
    t.D, t.dt_bias = t.D.float(), t.dt_bias.float()
    pool0 = t.state.cpu()
    e = expect(t, z=t.z)
    y = fi().selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True)
    check(t, y, e, pool0, BF16)


@pytest.mark.gpu
def test_gpu_packed_spec_decode_mixed_index_dtypes():
    cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    src = torch.tensor([[1, 2, 3], [-1, -1, -1], [4, 5, 6]], dtype=torch.int32)
    dst = torch.tensor([[7, 8, 9], [10, 11, 12], [13, -1, 15]], dtype=torch.int64)
    acc = torch.tensor([2, 1, 3], dtype=torch.int32)
    t = tensors(rows=7, S=16, io=BF16, weight=F32, device="cuda", seed=21, **GPU_SHAPE)
    pool0 = t.state.cpu()
    e = expect(t, state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu, num_accepted_tokens=acc)
    y = fi().selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, dt_bias=t.dt_bias, dt_softplus=True,
        state_batch_indices=src.cuda(), dst_state_batch_indices=dst.cuda(), cu_seqlens=cu.cuda(),
        num_accepted_tokens=acc.cuda(), cache_steps=3,
    )  # fmt: skip
    check(t, y, e, pool0, BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [32, 128])
def test_gpu_vllm_named_prefill(chunk_size):
    seqlens = [chunk_size + 5, 2 * chunk_size]
    c = prefill_case(seqlens, chunk_size, io=BF16, device="cuda", seed=22, **GPU_SHAPE)
    out = torch.empty_like(c.x)
    args = (c.x, c.dt, c.A, c.B, c.C, chunk_size, c.cu, c.cu_chunk, c.last, c.seq_idx, out, c.D, None, c.dt_bias,
            c.init, True)  # fmt: skip
    if chunk_size < 64:
        with pytest.raises(NotImplementedError, match="chunk_size"):
            prefill().mamba_chunk_scan_combined_varlen(*args)
        return
    final = prefill().mamba_chunk_scan_combined_varlen(*args)
    e = _prefill_oracle(c, seqlens)
    assert final.dtype == BF16
    scale = max(1.0, float(e.y.abs().max()))
    torch.testing.assert_close(out.cpu().double(), e.y, atol=3e-2 * scale, rtol=6e-2)
    torch.testing.assert_close(final.cpu().double(), e.final, atol=3e-2 * scale, rtol=6e-2)
