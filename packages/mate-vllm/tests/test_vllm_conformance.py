"""Op-level conformance of ``mate_vllm.ops`` with vLLM 0.33's Mamba2 ops, checked against the float64 oracle
(``mate.mamba.testing``).

The cases are the call forms vLLM's own kernel tests and model code use, written here from the semantics of
vLLM's Triton kernels (``mamba_ssm.py::_selective_scan_update_kernel``, ``ssd_combined.py``):

* ``selective_state_update``: without ``state_batch_indices`` sequence ``b`` reads and writes slot ``b`` and
  nothing is masked (``null_block_id`` is compared with loaded table entries only); with a table, a null
  source reads zeros and writes nothing; without ``num_accepted_tokens`` one final state goes to
  ``dst[b, 0]`` (``src[b, 0]`` without a destination); with it, the read slot is ``src[b, max(acc - 1, 0)]``
  and token ``t`` publishes to ``dst[b, t]``; empty packed sequences do nothing. The kernel loads every
  operand as fp32, so fp32 B/C beside a bf16 x, a bf16 A and fp32 D/dt_bias beside a bf16 dt are valid calls.
* ``mamba_chunk_scan_combined_varlen``: any power-of-two ``chunk_size`` (8 .. 256 here), chunks that restart
  at every sequence, A in the activations' dtype, the states returned in ``state_dtype`` else ``C``'s dtype,
  every chunk's end state with ``return_intermediate_states``, None with ``final_states_out``.

The ``gpu`` twins run a few of the same cases on CUDA tensors (``backend="auto"`` picks TileLang there); the
TileLang prefill serves chunk sizes from 64 up and raises ``NotImplementedError`` below.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from mate.mamba.testing import ssd_recurrence, ssu_recurrence
from mate_vllm import ops

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def _tol(dtype):
    return dict(atol=1e-4, rtol=1e-4) if dtype == F32 else dict(atol=4e-2, rtol=4e-2)


# ------------------------------------------------------------------------------------------ decode (SSU)


def vllm_expect(state, x, dt, A, B, C, D, dt_bias, z=None, src=None, dst=None, null=0, cu=None, acc=None):
    """vLLM's rules over the oracle: the sentinel only inside a given table; a destination table is read only
    beside a source table; one final write to ``dst[b, 0]`` without ``num_accepted_tokens``."""
    if src is None:
        dst, null = None, -1
    return ssu_recurrence(
        state.cpu(), x.cpu(), dt.cpu(), A.cpu(), B.cpu(), C.cpu(), D=D.cpu(), z=None if z is None else z.cpu(),
        dt_bias=dt_bias.cpu(), dt_softplus=True, state_batch_indices=None if src is None else src.cpu(),
        pad_slot_id=null, dst_state_batch_indices=None if dst is None else dst.cpu(),
        cu_seqlens=None if cu is None else cu.cpu(), num_accepted_tokens=None if acc is None else acc.cpu(),
        final_write_to_dst=acc is None,
    )  # fmt: skip


def decode_tensors(rows, S, H=2, P=4, N=8, G=1, io=F32, bc=None, state_dtype=F32, a_dtype=F32, device="cpu", seed=0):
    """vLLM's test tensors: multi-head [*, H, P] activations, per-head dt/A/D/dt_bias expanded with stride 0
    (the model's tied form), D/dt_bias in fp32, dt in x's dtype."""
    g = torch.Generator().manual_seed(seed)
    t = SimpleNamespace()
    t.state = torch.randn(S, H, P, N, generator=g).to(state_dtype)
    t.x = torch.randn(rows, H, P, generator=g).to(io)
    t.z = torch.randn(rows, H, P, generator=g).to(io)
    t.dt = (torch.randn(rows, H, generator=g) * 0.5).to(io)
    t.A = (-torch.rand(H, generator=g) - 0.1).to(a_dtype)
    t.B = torch.randn(rows, G, N, generator=g).to(bc or io)
    t.C = torch.randn(rows, G, N, generator=g).to(bc or io)
    t.D = torch.randn(H, generator=g)
    t.dt_bias = torch.rand(H, generator=g) - 1.0
    t.out = torch.empty(rows, H, P, dtype=io)
    for k, v in vars(t).items():
        setattr(t, k, v.to(device))
    # expanded on the device, so the stride-0 (tied) form survives
    t.dt = t.dt.unsqueeze(-1).expand(rows, H, P)
    t.A = t.A.view(H, 1, 1).expand(H, P, N)
    t.D = t.D.view(H, 1).expand(H, P)
    t.dt_bias = t.dt_bias.view(H, 1).expand(H, P)
    return t


def ssu(t, **kw):
    return ops.selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, dt_softplus=True, out=t.out, **kw
    )


def check_ssu(t, e, pool0, io=F32, state_dtype=F32):
    torch.testing.assert_close(t.out.cpu().double(), e.y64, **_tol(io))
    torch.testing.assert_close(t.state.cpu().float(), e.state.float(), **_tol(io if io != F32 else state_dtype))
    untouched = [s for s in range(pool0.shape[0]) if s not in e.written]
    assert torch.equal(t.state.cpu()[untouched], pool0.cpu()[untouched])


@pytest.mark.parametrize("io", [F32, F16, BF16])
def test_mamba1_form_without_a_table_updates_every_slot_including_zero(io):
    """vLLM's basic kernel test: 3-D state [b, dim, dstate], 2-D x/dt [b, dim], A [dim, dstate], D/dt_bias [dim],
    z, no table. Slot 0 is an ordinary slot here (the null block exists only inside a table)."""
    g = torch.Generator().manual_seed(1)
    b, P, N = 3, 8, 16
    state = torch.randn(b, P, N, generator=g).to(io)
    x, z = torch.randn(b, P, generator=g).to(io), torch.randn(b, P, generator=g).to(io)
    dt = torch.randn(b, P, generator=g).to(io)
    A = -torch.rand(P, N, generator=g) - 1.0
    B, C = torch.randn(b, N, generator=g).to(io), torch.randn(b, N, generator=g).to(io)
    D, dt_bias = torch.randn(P, generator=g), torch.rand(P, generator=g) - 4.0
    out, pool0 = torch.empty_like(x), state.clone()
    e = vllm_expect(state, x, dt, A, B, C, D, dt_bias, z=z)
    r = ops.selective_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True, out=out)
    assert r is None and out.dtype == io
    assert e.written == {0, 1, 2}
    torch.testing.assert_close(out.double(), e.y64, **_tol(io))
    torch.testing.assert_close(state.float(), e.state.float(), **_tol(io))
    assert not torch.equal(state[0], pool0[0])


def test_multi_head_tied_form_without_a_table():
    t = decode_tensors(rows=4, S=4, H=4, G=2, seed=2)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z)
    ssu(t, z=t.z)
    check_ssu(t, e, pool0)
    assert e.written == {0, 1, 2, 3}


def test_a_destination_table_without_a_source_table_is_ignored():
    t = decode_tensors(rows=2, S=6, seed=3)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias)
    ssu(t, dst_state_batch_indices=torch.tensor([4, 5], dtype=torch.int32))
    check_ssu(t, e, pool0)
    assert e.written == {0, 1}


def test_packed_rows_without_a_table_use_slot_b_and_skip_empty_sequences():
    cu = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    t = decode_tensors(rows=5, S=3, seed=4)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, cu=cu)
    ssu(t, cu_seqlens=cu)
    check_ssu(t, e, pool0)
    assert e.written == {0, 2} and torch.equal(t.state[1], pool0[1])


@pytest.mark.parametrize("form", ["flat", "n1"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_batch_indices_with_null_entries(form, index_dtype):
    """A randomly permuted slot table with null entries (0): flat [b] and vLLM's own 2-D [b, 1] form."""
    src = torch.tensor([5, 0, 2, 7, 0, 3], dtype=index_dtype)
    t = decode_tensors(rows=6, S=9, H=4, G=2, seed=5)
    pool0 = t.state.clone()
    table = src if form == "flat" else src.unsqueeze(1)
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, src=table)
    ssu(t, z=t.z, state_batch_indices=table)
    check_ssu(t, e, pool0)
    assert e.written == {5, 2, 7, 3}


def test_custom_null_block_id():
    src = torch.tensor([0, 4, 3], dtype=torch.int32)  # with null_block_id=3, slot 0 is live and 3 is null
    t = decode_tensors(rows=3, S=5, seed=6)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, src=src, null=3)
    ssu(t, state_batch_indices=src, null_block_id=3)
    check_ssu(t, e, pool0)
    assert e.written == {0, 4}


def test_spec_decode_n_by_1_plus_k_tables_and_mixed_index_dtypes():
    """vLLM's spec-decode form: 2-D [N, 1 + K] source and destination tables, num_accepted_tokens, cu_seqlens;
    each index tensor in its own int dtype; one sequence has a null source, one a null destination entry."""
    K = 2
    cu = torch.tensor([0, 3, 5, 8], dtype=torch.int64)
    src = torch.tensor([[1, 2, 3], [0, 0, 0], [7, 8, 9]], dtype=torch.int32)
    dst = torch.tensor([[10, 11, 12], [13, 14, 15], [16, 0, 18]], dtype=torch.int64)
    acc = torch.tensor([2, 1, 3], dtype=torch.int32)
    assert src.shape == (3, 1 + K)
    t = decode_tensors(rows=8, S=20, H=4, G=2, seed=7)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, src=src, dst=dst, cu=cu, acc=acc)
    ssu(t, z=t.z, state_batch_indices=src, dst_state_batch_indices=dst, num_accepted_tokens=acc, cu_seqlens=cu)
    check_ssu(t, e, pool0)
    assert e.written == {10, 11, 12, 16, 18}


def test_packed_rows_with_a_table_write_one_final_state_to_dst_b0():
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    src = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int64)
    dst = torch.tensor([[7, 8, 9], [10, 11, 12]], dtype=torch.int32)
    t = decode_tensors(rows=5, S=13, seed=8)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, src=src, dst=dst, cu=cu)
    ssu(t, state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu)
    check_ssu(t, e, pool0)
    assert e.written == {7, 10}


@pytest.mark.parametrize(
    "io,bc,a_dtype,state_dtype",
    [
        (BF16, F32, F32, F32),  # B/C fp32 beside a bf16 x (needs the runtime's fp32 B/C)
        (F16, F32, F32, BF16),
        (BF16, None, BF16, F32),  # A in the activations' dtype (cast to fp32 by the adapter)
        (F32, None, F32, BF16),  # a bf16 state pool beside fp32 activations
    ],
)
def test_dtype_mixes(io, bc, a_dtype, state_dtype):
    src = torch.tensor([3, 1, 0], dtype=torch.int32)
    t = decode_tensors(rows=3, S=5, io=io, bc=bc, a_dtype=a_dtype, state_dtype=state_dtype, seed=9)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, src=src)
    assert ssu(t, z=t.z, state_batch_indices=src) is None
    assert t.out.dtype == io and t.state.dtype == state_dtype
    check_ssu(t, e, pool0, io=io, state_dtype=state_dtype)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("z", dict(z=F32)),
        ("out", dict(out=F32)),
        ("B", dict(B=F16)),
    ],
)
def test_dtype_mixes_mate_does_not_serve_are_named(name, kw):
    t = decode_tensors(rows=2, S=3, io=BF16, seed=10)
    z = t.z.to(kw["z"]) if "z" in kw else None
    out = t.out.to(kw["out"]) if "out" in kw else t.out
    B = t.B.to(kw["B"]) if "B" in kw else t.B
    state0 = t.state.clone()
    with pytest.raises(NotImplementedError, match=rf"^{name} in "):
        ops.selective_state_update(t.state, t.x, t.dt, t.A, B, t.C, t.D, t.dt_bias, z=z, out=out)
    assert torch.equal(t.state, state0)


def _within_one_fp16_step(got: torch.Tensor, exact: torch.Tensor) -> bool:
    """Whether every fp16 value is within one fp16 step of the exact value (a stochastic rounding's two
    candidates; MATE computes in fp32, so the exact value's own fp16 neighbours may differ from MATE's)."""
    return bool(((got.double() - exact).abs() <= exact.abs() * 2.0**-10 + 1e-6).all())


def test_stochastic_rounding_rounds_the_final_store():
    """vLLM's kernel rounds the final fp16 state store stochastically, a fresh seed per call (torch's generator
    draws it): every value written is within one fp16 step of the exact one, and other draws round differently."""
    src = torch.tensor([2, 0, 1], dtype=torch.int32)
    pools = []
    for seed in (1, 1, 2):
        t = decode_tensors(rows=3, S=4, io=F16, state_dtype=F16, N=32, seed=11)
        pool0 = t.state.clone()
        torch.manual_seed(seed)
        ssu(t, state_batch_indices=src, null_block_id=-1, enable_stochastic_rounding=True, cache_philox_rounds=7)
        e = vllm_expect(pool0.float(), t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, src=src, null=-1)
        assert _within_one_fp16_step(t.state[src.long()], e.state[src.long()].double())
        assert torch.equal(t.state[3], pool0[3])
        pools.append(t.state.clone())
    assert torch.equal(pools[0], pools[1]) and not torch.equal(pools[0], pools[2])


def test_stochastic_rounding_leaves_speculative_writes_to_nearest():
    """With num_accepted_tokens (speculative decoding) vLLM's per-token stores round to nearest: the same bits as
    with the flag off; a non-fp16 state with the flag is refused naming the state."""
    pools = []
    for sr in (True, False):
        t = decode_tensors(rows=4, S=12, io=F16, state_dtype=F16, N=32, seed=12)
        src = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
        ssu(t, state_batch_indices=src, dst_state_batch_indices=torch.tensor([[5, 6], [7, 8]], dtype=torch.int32),
            cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32), num_accepted_tokens=torch.tensor([1, 2]),
            null_block_id=-1, enable_stochastic_rounding=sr)  # fmt: skip
        pools.append(t.state)
    assert torch.equal(pools[0], pools[1])
    t = decode_tensors(rows=2, S=3, seed=11)
    with pytest.raises(ValueError, match="^state:.*float16"):
        ssu(t, enable_stochastic_rounding=True)
    with pytest.raises(ValueError, match="^cache_philox_rounds:"):
        ssu(t, cache_philox_rounds=-1)


# ---------------------------------------------------------------------------------------- prefill (SSD)


def chunk_metadata(seqlens, chunk_size, history=None):
    """vLLM's prefill metadata: every sequence is cut at the absolute chunk boundaries of its own positions
    (``history[b]`` tokens already computed, so its first chunk may be short); chunks never span sequences."""
    history = history or [0] * len(seqlens)
    cu_chunk, seq_idx, last = [0], [], []
    bos = 0
    for b, (n, h) in enumerate(zip(seqlens, history, strict=True)):
        pos = h
        while pos < h + n:
            end = min((pos // chunk_size + 1) * chunk_size, h + n)
            cu_chunk.append(bos + end - h)
            seq_idx.append(b)
            pos = end
        last.append(len(seq_idx) - 1)
        bos += n
    i32 = dict(dtype=torch.int32)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], **i32)
    return cu, torch.tensor(cu_chunk, **i32), torch.tensor(last, **i32), torch.tensor(seq_idx, **i32)


def prefill_tensors(seqlens, H=2, P=4, N=8, G=1, io=F32, a_dtype=None, device="cpu", seed=0):
    """vLLM's prefill test tensors: x/dt/B/C (and A, by default) in one dtype, D/dt_bias fp32."""
    g = torch.Generator().manual_seed(seed)
    T = sum(seqlens)
    t = SimpleNamespace()
    t.x = torch.randn(T, H, P, generator=g).to(io)
    t.dt = (torch.randn(T, H, generator=g) * 0.5 - 1.0).to(io)
    t.A = (-torch.rand(H, generator=g) - 0.1).to(a_dtype or io)
    t.B = torch.randn(T, G, N, generator=g).to(io)
    t.C = torch.randn(T, G, N, generator=g).to(io)
    t.D = torch.randn(H, P, generator=g)
    t.z = torch.randn(T, H, P, generator=g).to(io)
    t.dt_bias = torch.rand(H, generator=g) * 0.2
    t.init = torch.randn(len(seqlens), H, P, N, generator=g)
    t.out = torch.empty(T, H, P, dtype=io)
    for k, v in vars(t).items():
        setattr(t, k, v.to(device))
    return t


def prefill(t, meta, chunk_size, **kw):
    cu, cu_chunk, last, seq_idx = (m.to(t.x.device) for m in meta)
    return ops.mamba_chunk_scan_combined_varlen(
        t.x, t.dt, t.A, t.B, t.C, chunk_size, cu, cu_chunk, last, seq_idx, t.out, **kw
    )


def oracle(t, seqlens, meta, **kw):
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    return ssd_recurrence(
        t.x.cpu(), t.dt.cpu(), t.A.cpu(), t.B.cpu(), t.C.cpu(), seqlens, cu_chunk_seqlens=meta[1], **cpu
    )


@pytest.mark.parametrize("chunk_size", [8, 16, 32, 64, 128, 256])
def test_prefill_every_power_of_two_chunk_size(chunk_size):
    """Each sequence spans several chunks at every size; the second one continues a history, so its first
    chunk is short. Needs the reference backend's chunk sizes 8 .. 256."""
    seqlens = [2 * chunk_size + 3, chunk_size + 5]
    meta = chunk_metadata(seqlens, chunk_size, history=[0, chunk_size // 2 + 1])
    t = prefill_tensors(seqlens, seed=chunk_size)
    kw = dict(D=t.D, z=t.z, dt_bias=t.dt_bias, initial_states=t.init, dt_softplus=True)
    e = oracle(t, seqlens, meta, **kw)
    final = prefill(t, meta, chunk_size, **kw)
    assert final.shape == (2, 2, 4, 8) and final.dtype == F32
    torch.testing.assert_close(t.out.double(), e.y, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(final.double(), e.final, atol=1e-3, rtol=1e-3)
    chunks = prefill(t, meta, chunk_size, return_intermediate_states=True, **kw)
    assert chunks.shape == (len(meta[3]), 2, 4, 8)
    torch.testing.assert_close(chunks.double(), e.chunk_end, atol=1e-3, rtol=1e-3)


def test_prefill_bf16_activations_and_a_return_states_in_cs_dtype():
    """vLLM's prefill test dtypes: x/dt/A/B/C bf16 (A cast to fp32, needs the runtime's 16-bit A), D/dt_bias
    fp32; the states come back in C's dtype, also beside fp32 initial states, unless state_dtype says so."""
    seqlens, L = [40, 25], 16
    meta = chunk_metadata(seqlens, L)
    t = prefill_tensors(seqlens, H=4, G=2, io=BF16, seed=20)
    kw = dict(D=t.D[:, 0].contiguous(), dt_bias=t.dt_bias, initial_states=t.init, dt_softplus=True)
    e = oracle(t, seqlens, meta, **kw)
    final = prefill(t, meta, L, **kw)
    assert final.dtype == BF16 and t.out.dtype == BF16
    torch.testing.assert_close(t.out.double(), e.y, atol=6e-2, rtol=6e-2)
    torch.testing.assert_close(final.double(), e.final, atol=6e-2, rtol=6e-2)
    final32 = prefill(t, meta, L, state_dtype=F32, **kw)
    assert final32.dtype == F32
    torch.testing.assert_close(final32.double(), e.final, atol=3e-2, rtol=3e-2)


def test_prefill_dt_limit_and_final_states_out():
    seqlens, L = [19, 30], 8
    meta = chunk_metadata(seqlens, L)
    t = prefill_tensors(seqlens, seed=21)
    kw = dict(D=t.D, dt_bias=t.dt_bias, initial_states=t.init, dt_softplus=True, dt_limit=(0.05, 0.5))
    e = oracle(t, seqlens, meta, **kw)
    pool = torch.zeros(5, 2, 4, 8)
    assert prefill(t, meta, L, final_states_out=pool, final_state_indices=torch.tensor([3, 1]), **kw) is None
    torch.testing.assert_close(t.out.double(), e.y, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(pool[[3, 1]].double(), e.final, atol=1e-3, rtol=1e-3)
    assert pool[[0, 2, 4]].abs().sum() == 0


# ------------------------------------------------------------------------------------------- GPU twins

GPU_SHAPE = dict(H=8, P=64, N=128, G=2)


@pytest.mark.gpu
def test_gpu_decode_without_a_table_bf16_x_fp32_bc():
    cu = torch.tensor([0, 1, 3, 4], dtype=torch.int32, device="cuda")
    t = decode_tensors(rows=4, S=3, io=BF16, bc=F32, device="cuda", seed=30, **GPU_SHAPE)
    pool0 = t.state.cpu()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, cu=cu)
    ssu(t, z=t.z, cu_seqlens=cu)
    # the kernels read fp32 B/C in x's dtype (a cast): y carries B's bf16 rounding too, hence twice the tolerance
    torch.testing.assert_close(t.out.cpu().double(), e.y64, atol=8e-2, rtol=8e-2)
    torch.testing.assert_close(t.state.cpu().float(), e.state.float(), **_tol(BF16))
    untouched = [s for s in range(pool0.shape[0]) if s not in e.written]
    assert torch.equal(t.state.cpu()[untouched], pool0.cpu()[untouched])
    assert e.written == {0, 1, 2}


I32, I64 = torch.int32, torch.int64


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("src_dt", "dst_dt", "acc_dt", "cu_dt"),
    [
        pytest.param(I32, I32, I32, I32, id="all-int32"),
        pytest.param(I64, I64, I64, I64, id="all-int64"),
        pytest.param(I32, I64, I32, I32, id="dst-int64"),
        pytest.param(I64, I32, I32, I64, id="src-cu-int64"),
        pytest.param(I32, I32, I64, I32, id="acc-int64"),
    ],
)  # fmt: skip
def test_gpu_decode_n_by_1_plus_k_tables_bf16_a(src_dt, dst_dt, acc_dt, cu_dt):
    """vLLM's spec decode on the TileLang kernels with each index tensor in its own int dtype."""
    cu = torch.tensor([0, 3, 5, 8], dtype=cu_dt)
    src = torch.tensor([[1, 2, 3], [0, 0, 0], [7, 8, 9]], dtype=src_dt)
    dst = torch.tensor([[10, 11, 12], [13, 14, 15], [16, 0, 18]], dtype=dst_dt)
    acc = torch.tensor([2, 1, 3], dtype=acc_dt)
    t = decode_tensors(rows=8, S=20, io=BF16, a_dtype=BF16, device="cuda", seed=31, **GPU_SHAPE)
    pool0 = t.state.cpu()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, src=src, dst=dst, cu=cu, acc=acc)
    ssu(t, state_batch_indices=src.cuda(), dst_state_batch_indices=dst.cuda(), num_accepted_tokens=acc.cuda(),
        cu_seqlens=cu.cuda())  # fmt: skip
    check_ssu(t, e, pool0, io=BF16)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [8, 16, 32, 64, 128, 256])
def test_gpu_prefill_chunk_sizes(chunk_size):
    seqlens = [chunk_size + 7, 2 * chunk_size - 3]
    meta = chunk_metadata(seqlens, chunk_size, history=[0, chunk_size // 2])
    t = prefill_tensors(seqlens, io=BF16, device="cuda", seed=32, **GPU_SHAPE)
    kw = dict(D=t.D, z=t.z, dt_bias=t.dt_bias, initial_states=t.init, dt_softplus=True)
    if chunk_size < 64:
        with pytest.raises(NotImplementedError, match="chunk_size"):
            prefill(t, meta, chunk_size, **kw)
        return
    final = prefill(t, meta, chunk_size, **kw)
    e = oracle(t, seqlens, meta, **kw)
    assert final.dtype == BF16
    scale = max(1.0, float(e.y.abs().max()))
    torch.testing.assert_close(t.out.cpu().double(), e.y, atol=3e-2 * scale, rtol=6e-2)
    torch.testing.assert_close(final.cpu().double(), e.final, atol=3e-2 * math.sqrt(scale), rtol=6e-2)
