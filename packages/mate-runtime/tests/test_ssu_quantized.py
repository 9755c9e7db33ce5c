"""Block-scaled quantised SSU states (int16 as FlashInfer 0.7.2 defines it; int8 and fp8-e4m3 with the same
layout) on the reference backend, against the float64 recurrence run on the dequantised pool.

What is checked, per call form: the output equals the recurrence's on the dequantised state (the reference
dequantises exactly, so only the io dtype's rounding is left); every slot written holds, dequantised, the
recurrence's new state within half a quantisation step of its row, with the row's new scale max|row| / qmax;
every other slot and its scales stay bit-identical; intermediate buffers likewise with their own scales, and a
parent state read back from a quantised buffer (EAGLE trees) is dequantised.
"""

from __future__ import annotations

import pytest
import torch
from mate.mamba import selective_state_update
from mate.mamba._contract.dtypes import QUANT_STATE_DTYPES, STATE_FORMATS
from mate.mamba.testing import discretize_dt, ssu_recurrence, step
from test_ssu_reference import TOL, make_inputs

QDTYPES = [pytest.param(dt, id=STATE_FORMATS[dt].label) for dt in QUANT_STATE_DTYPES]
H, P, N, G = 4, 8, 16, 2


def quantised(shape, dtype, seed):
    """(stored numbers, fp32 scales over the last dim) of random values, quantised as the kernels store them."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(shape, generator=g) * 0.5
    fmt = STATE_FORMATS[dtype]
    qmax = fmt.qmax
    scale = v.abs().amax(-1) / qmax
    q = (v / scale.unsqueeze(-1)).clamp(-qmax, qmax)
    q = q.round() if fmt.integer else q
    return q.to(dtype), scale


def dequantised(q, scale):
    return q.float() * scale.unsqueeze(-1)


def check_rows(q, scale, expected, rows):
    """Dequantised rows within half a step of ``expected`` (fp8: its relative spacing), scales max|row| / qmax."""
    qmax = STATE_FORMATS[q.dtype].qmax
    e = expected[rows].double()
    want_scale = e.abs().amax(-1) / qmax
    torch.testing.assert_close(scale[rows].double(), want_scale, rtol=1e-5, atol=1e-12)
    step = scale[rows].double().unsqueeze(-1)
    err = (dequantised(q[rows], scale[rows]).double() - e).abs()
    bound = 0.5 * step + 1e-6 if q.dtype != torch.float8_e4m3fn else e.abs() * 2.0**-4 + step * 2.0**-9
    assert bool((err <= bound).all()), f"max error {err.max():.3e}"


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize(
    "form",
    [
        pytest.param("one-token", id="one-token"),
        pytest.param("mtp-per-token-dst", id="mtp_per-token-dst"),
        pytest.param("dense-final", id="dense_final-to-read-slot"),
    ],
)
def test_quantised_pool(dtype, form):
    S = 10
    q, scale = quantised((S, H, P, N), dtype, seed=1)
    q0, scale0 = q.clone(), scale.clone()
    kw = dict(D=None)
    if form == "one-token":
        inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(3,), seed=2)
        kw.update(state_batch_indices=torch.tensor([7, -1, 2], dtype=torch.int32), pad_slot_id=-1)
    elif form == "mtp-per-token-dst":
        inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(5,), seed=3)
        kw.update(
            cu_seqlens=torch.tensor([0, 3, 5], dtype=torch.int32),
            state_batch_indices=torch.tensor([[1, 0, 0], [4, 0, 0]], dtype=torch.int32),
            dst_state_batch_indices=torch.tensor([[5, 6, 8], [9, 3, -1]], dtype=torch.int32),
            pad_slot_id=-1,
        )
    else:
        inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(2, 3), seed=4)
        kw.update(state_batch_indices=torch.tensor([6, 0], dtype=torch.int32))
    kw.update(inp)
    exp = ssu_recurrence(dequantised(q0, scale0), **kw)
    y = selective_state_update(q, **kw, state_scale=scale, backend="torch")

    rtol, atol = TOL[y.dtype]
    rows = torch.tensor(sorted(exp.rows))
    flat = y.reshape(-1, H, P)
    torch.testing.assert_close(flat[rows].double(), exp.y64.reshape(-1, H, P)[rows], rtol=rtol, atol=atol)
    assert exp.written, "test setup: the call writes slots"
    written = torch.tensor(sorted(exp.written))
    check_rows(q, scale, exp.state, written)
    untouched = torch.tensor([s for s in range(S) if s not in exp.written])
    assert torch.equal(q[untouched], q0[untouched]) and torch.equal(scale[untouched], scale0[untouched])


@pytest.mark.parametrize("dtype", QDTYPES)
def test_quantised_intermediate_buffer_and_parents(dtype):
    """A dense EAGLE tree step: every token's state into a quantised intermediate buffer with its own scales,
    each token after the first continuing from its parent's state read back from that buffer (dequantised);
    the pool (quantised too) is only read."""
    S, T, entries = 6, 4, 3
    q, scale = quantised((S, H, P, N), dtype, seed=5)
    iq = torch.zeros((entries, T, H, P, N), dtype=dtype)
    iscale = torch.ones((entries, T, H, P))
    q0, scale0 = q.clone(), scale.clone()
    inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(2, T), seed=6)
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]], dtype=torch.int64)
    kw = dict(
        state_batch_indices=torch.tensor([4, 1], dtype=torch.int32),
        intermediate_state_indices=torch.tensor([2, 0], dtype=torch.int32), cache_steps=T,
        retrieve_parent_token=parents,
    )  # fmt: skip
    kw.update(inp)
    y = selective_state_update(
        q, **kw, state_scale=scale, intermediate_states_buffer=iq, intermediate_state_scales=iscale, backend="torch"
    )
    assert torch.equal(q, q0) and torch.equal(scale, scale0), "the pool is only read"
    # token by token: the first token from the slot's dequantised state, each later one from its parent's entry
    # as stored; the expected entry is that step of the plain recurrence, checked within half a step
    assert y.shape == inp["x"].shape
    for b, (slot, entry) in enumerate(((4, 2), (1, 0))):
        for t in range(T):
            par = int(parents[b, t])
            if t == 0:
                s0 = dequantised(q0[slot], scale0[slot]).double()
            else:
                s0 = dequantised(iq[entry, par], iscale[entry, par]).double()
            x, dt = inp["x"][b, t].double(), inp["dt"][b, t].double()
            s_new, y_t = _one_step(s0, x, dt, inp, b, t)
            got = dequantised(iq[entry, t], iscale[entry, t]).double()
            qmax = STATE_FORMATS[dtype].qmax
            torch.testing.assert_close(iscale[entry, t].double(), s_new.abs().amax(-1) / qmax, rtol=1e-5, atol=1e-12)
            tol = 0.5 * iscale[entry, t].double().unsqueeze(-1) + 1e-6
            if dtype == torch.float8_e4m3fn:
                tol = s_new.abs() * 2.0**-4 + tol
            assert bool(((got - s_new).abs() <= tol).all()), (b, t)
            rtol, atol = TOL[y.dtype]
            torch.testing.assert_close(y[b, t].double(), y_t, rtol=rtol, atol=atol)
    untouched = torch.ones(entries, dtype=torch.bool)
    untouched[[0, 2]] = False
    assert bool((iq[untouched] == 0).all()) and bool((iscale[untouched] == 1).all())


def _one_step(s0, x, dt, inp, b, t):
    """One token of the float64 recurrence (``mate.mamba.testing.step``) with the call's dt options."""
    dtp = discretize_dt(dt, inp["dt_bias"].view(H, 1), dt_softplus=inp["dt_softplus"])
    return step(s0, x, dtp, inp["A"], inp["B"][b, t], inp["C"][b, t], inp["D"].view(H, 1), inp["z"][b, t])


# ------------------------------------------------------------------------------------------------ the prefill


@pytest.mark.parametrize("dtype", QDTYPES)
def test_prefill_reads_and_writes_a_quantised_pool(dtype):
    """The SSD prefill on a quantised pool end to end: initial states dequantised with their scales, final states
    written into the pool by index with new scales, other slots bit-identical; equal to the token-by-token
    recurrence on the dequantised initial states."""
    from mate.mamba import ssd_combined_fwd_varlen
    from mate.mamba.chunking import chunk_metadata
    from mate.mamba.testing import ssd_recurrence

    seqlens, L = [13, 1, 30], 8
    meta = chunk_metadata(seqlens, L)
    T, batch, S = sum(seqlens), len(seqlens), 7
    g = torch.Generator().manual_seed(11)
    x = torch.randn(T, H, P, generator=g)
    dt = torch.randn(T, H, generator=g) - 1.0
    A = -(torch.rand(H, generator=g) + 0.3)
    B, C = (torch.randn(T, G, N, generator=g) * 0.5 for _ in range(2))
    init_q, init_scale = quantised((batch, H, P, N), dtype, seed=12)
    pool, pool_scale = quantised((S, H, P, N), dtype, seed=13)
    pool0, pool_scale0 = pool.clone(), pool_scale.clone()
    slots = torch.tensor([5, 0, 3], dtype=torch.int32)
    ret = ssd_combined_fwd_varlen(
        x, dt, A, B, C, L, meta.cu_seqlens, meta.cu_chunk_seqlens, meta.last_chunk_indices, meta.seq_idx,
        out=(out := torch.empty_like(x)), dt_softplus=True, initial_states=init_q, initial_states_scale=init_scale,
        final_states_out=pool, final_state_indices=slots, final_states_scale=pool_scale, backend="torch",
    )  # fmt: skip
    assert ret is None
    e = ssd_recurrence(x, dt, A, B, C, seqlens, dt_softplus=True, initial_states=dequantised(init_q, init_scale),
                       cu_chunk_seqlens=meta.cu_chunk_seqlens)  # fmt: skip
    torch.testing.assert_close(out.double(), e.y, rtol=1e-4, atol=1e-4)
    expected = torch.zeros(S, H, P, N, dtype=torch.float64)
    expected[slots.long()] = e.final
    check_rows(pool, pool_scale, expected, slots.long())
    others = torch.tensor([1, 2, 4, 6])
    assert torch.equal(pool[others], pool0[others]) and torch.equal(pool_scale[others], pool_scale0[others])


def test_prefill_scales_go_with_quantised_pools_only():
    from mate.mamba import ssd_combined_fwd_varlen
    from mate.mamba.chunking import chunk_metadata

    meta = chunk_metadata([5], 8)
    args = (torch.randn(5, H, P), torch.randn(5, H), -torch.rand(H), torch.randn(5, G, N), torch.randn(5, G, N), 8,
            meta.cu_seqlens, meta.cu_chunk_seqlens, meta.last_chunk_indices, meta.seq_idx)  # fmt: skip
    with pytest.raises(ValueError, match="^initial_states_scale:"):
        ssd_combined_fwd_varlen(*args, initial_states=torch.zeros(1, H, P, N, dtype=torch.int16))
    with pytest.raises(ValueError, match="^initial_states_scale:"):
        ssd_combined_fwd_varlen(*args, initial_states=torch.zeros(1, H, P, N), initial_states_scale=torch.ones(1, H, P))
    with pytest.raises(ValueError, match="^final_states_scale:"):
        pool = dict(final_states_out=torch.zeros(2, H, P, N, dtype=torch.int8), final_state_indices=torch.tensor([1]))
        ssd_combined_fwd_varlen(*args, **pool, final_states_scale=torch.ones(2, H, N))
