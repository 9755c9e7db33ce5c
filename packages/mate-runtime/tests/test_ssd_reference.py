"""``ssd_combined_fwd_varlen(..., backend="torch")`` (the chunked five-stage reference) against the float64
token-by-token oracle ``mate.mamba.testing.ssd_recurrence``, with the chunk metadata of ``mate.mamba.chunking``
(itself checked in ``test_ssd_chunking.py``).

Ragged batches (sequences shorter than, equal to and longer than a chunk), continuing sequences whose first
chunk is short, initial states, half + half prefill equal to the whole, every chunk-end state, state dtypes,
D / z / dt_bias / dt_limit / softplus, the pool-writing extension and ``seq_idx`` as the authority.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from mate.mamba import ssd_combined_fwd_varlen
from mate.mamba.chunking import chunk_metadata
from mate.mamba.testing import ssd_recurrence

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOL = {F32: (1e-4, 1e-4), BF16: (1.5e-2, 1.5e-2), F16: (3e-3, 3e-3)}


def make_inputs(T, *, H=4, P=8, N=16, G=2, io_dtype=F32, D=None, z=False, dt_bias=False, softplus=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, P, generator=g).to(io_dtype)
    B = (torch.randn(T, G, N, generator=g) * 0.5).to(io_dtype)
    C = (torch.randn(T, G, N, generator=g) * 0.5).to(io_dtype)
    if softplus:
        dt = torch.randn(T, H, generator=g) - 2.0
    else:
        dt = torch.rand(T, H, generator=g) * 0.2 + 0.01
    A = -(torch.rand(H, generator=g) + 0.3)
    Dt = None
    if D == "head":
        Dt = torch.randn(H, generator=g)
    elif D == "full":
        Dt = torch.randn(H, P, generator=g)
    elif D == "bf16":
        Dt = torch.randn(H, generator=g).to(BF16)
    zt = torch.randn(T, H, P, generator=g).to(io_dtype) if z else None
    bias = torch.randn(H, generator=g) * 0.5 if dt_bias else None
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=Dt, z=zt, dt_bias=bias, dt_softplus=softplus)


def initial(batch, H=4, P=8, N=16, dtype=F32, seed=100):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, H, P, N, generator=g) * 0.5).to(dtype)


def run_ref(inp, meta, chunk_size, **kw):
    return ssd_combined_fwd_varlen(
        inp["x"],
        inp["dt"],
        inp["A"],
        inp["B"],
        inp["C"],
        chunk_size,
        meta.cu_seqlens,
        meta.cu_chunk_seqlens,
        meta.last_chunk_indices,
        meta.seq_idx,
        kw.pop("out", None),
        inp["D"],
        inp["z"],
        inp["dt_bias"],
        dt_softplus=inp["dt_softplus"],
        backend="torch",
        **kw,
    )


def run_rec(inp, seqlens, meta=None, **kw):
    return ssd_recurrence(
        inp["x"],
        inp["dt"],
        inp["A"],
        inp["B"],
        inp["C"],
        seqlens,
        D=inp["D"],
        z=inp["z"],
        dt_bias=inp["dt_bias"],
        dt_softplus=inp["dt_softplus"],
        cu_chunk_seqlens=None if meta is None else meta.cu_chunk_seqlens,
        **kw,
    )


def close(actual, expected, dtype):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------- ragged batch

RAGGED = [
    pytest.param([5, 16, 37], 16, id="short_equal_long_cs16"),
    pytest.param([1, 33], 16, id="one_token_and_2chunks_plus1"),
    pytest.param([40], 32, id="single_seq_cs32"),
    pytest.param([7, 64, 3, 70], 64, id="cs64_mixed"),
    pytest.param([3, 8, 21], 8, id="cs8_the_engines_smallest"),
    pytest.param([300, 5], 512, id="cs512"),
]


@pytest.mark.parametrize("seqlens,chunk_size", RAGGED)
@pytest.mark.parametrize("io_dtype", [pytest.param(F32, id="f32"), pytest.param(BF16, id="bf16")])
def test_ragged_batch(seqlens, chunk_size, io_dtype):
    inp = make_inputs(sum(seqlens), io_dtype=io_dtype, D="head", z=True, dt_bias=True, seed=1)
    meta = chunk_metadata(seqlens, chunk_size)
    exp = run_rec(inp, seqlens)
    final = run_ref(inp, meta, chunk_size, return_intermediate_states=False)
    out_dtype = io_dtype
    assert final.shape == (len(seqlens), 4, 8, 16) and final.dtype == io_dtype  # state_dtype defaults to C's
    close(final, exp.final, io_dtype)
    out = torch.empty_like(inp["x"])
    run_ref(inp, meta, chunk_size, out=out)
    close(out, exp.y, out_dtype)


OPTIONS = [
    pytest.param(dict(D=None, z=False, dt_bias=False, softplus=True), {}, id="plain_softplus"),
    pytest.param(dict(D="head", z=False, dt_bias=False, softplus=False), {}, id="D_head_no_softplus"),
    pytest.param(dict(D="full", z=True, dt_bias=False, softplus=True), {}, id="D_HP_z"),
    pytest.param(dict(D="bf16", z=False, dt_bias=True, softplus=True), {}, id="D_bf16_dt_bias"),
    pytest.param(dict(D="head", z=True, dt_bias=True, softplus=True), {"dt_limit": (0.05, 0.4)}, id="dt_limit"),
    pytest.param(dict(D=None, z=False, dt_bias=True, softplus=True), {"dt_limit": (0.0, 0.1)}, id="dt_limit_max"),
    pytest.param(dict(D=None, z=True, dt_bias=False, softplus=True), {"initial": True}, id="initial_states"),
]


@pytest.mark.parametrize("opts,extra", OPTIONS)
def test_options(opts, extra):
    seqlens, cs = [9, 16, 30], 16
    inp = make_inputs(sum(seqlens), seed=2, **opts)
    meta = chunk_metadata(seqlens, cs)
    kw = {}
    rec_kw = {}
    if "dt_limit" in extra:
        kw["dt_limit"] = rec_kw["dt_limit"] = extra["dt_limit"]
    if extra.get("initial"):
        kw["initial_states"] = rec_kw["initial_states"] = initial(3)
    exp = run_rec(inp, seqlens, meta, **rec_kw)
    out = torch.empty_like(inp["x"])
    states = run_ref(inp, meta, cs, out=out, return_intermediate_states=True, **kw)
    close(out, exp.y, F32)
    close(states, exp.chunk_end, F32)


def test_dt_limit_is_applied():
    """Guard: the clamp changes the result (so test_options[dt_limit] can fail)."""
    seqlens, cs = [20], 16
    inp = make_inputs(20, dt_bias=True, seed=3)
    meta = chunk_metadata(seqlens, cs)
    a = run_ref(inp, meta, cs)
    b = run_ref(inp, meta, cs, dt_limit=(0.05, 0.1))
    assert not torch.allclose(a, b)


def test_default_dt_limit_floors_at_zero():
    """Without softplus a negative dt' is floored at zero by the default (0, inf) limit."""
    seqlens, cs = [12], 16
    inp = make_inputs(12, softplus=False, seed=4)
    inp["dt"][::2] = -0.3
    meta = chunk_metadata(seqlens, cs)
    exp = run_rec(inp, seqlens, meta)
    out = torch.empty_like(inp["x"])
    final = run_ref(inp, meta, cs, out=out)
    close(out, exp.y, F32)
    close(final, exp.final, F32)


# ----------------------------------------------------------------------------- continuing sequences


@pytest.mark.parametrize(
    "seqlens,history,chunk_size",
    [
        pytest.param([20, 5, 40], [10, 3, 17], 16, id="short_first_chunks"),
        pytest.param([16, 8], [16, 8], 16, id="history_on_and_off_boundary"),
        pytest.param([50], [60], 32, id="long_continuation_cs32"),
    ],
)
@pytest.mark.parametrize("state_dtype", [pytest.param(F32, id="state_f32"), pytest.param(BF16, id="state_bf16")])
def test_continuing_sequences(seqlens, history, chunk_size, state_dtype):
    """Sequences that continue after ``history`` tokens open with a short chunk and enter from
    ``initial_states``; every chunk-end state matches the recurrence."""
    inp = make_inputs(sum(seqlens), D="full", z=True, dt_bias=True, seed=5)
    meta = chunk_metadata(seqlens, chunk_size, history=history)
    first = meta.cu_chunk_seqlens[1:] - meta.cu_chunk_seqlens[:-1]
    assert first.max() <= chunk_size
    init = initial(len(seqlens), dtype=state_dtype)
    exp = run_rec(inp, seqlens, meta, initial_states=init)
    out = torch.empty_like(inp["x"])
    states = run_ref(inp, meta, chunk_size, out=out, initial_states=init, return_intermediate_states=True)
    assert states.dtype == state_dtype  # state_dtype defaults to initial_states' dtype
    assert states.shape == (meta.seq_idx.shape[0], 4, 8, 16)
    close(out, exp.y, F32)
    close(states, exp.chunk_end, state_dtype)


@pytest.mark.parametrize(
    "seqlens,chunk_size",
    [
        pytest.param([40, 9, 64], 16, id="cs16"),
        pytest.param([70, 33], 32, id="cs32"),
    ],
)
@pytest.mark.parametrize("io_dtype", [pytest.param(F32, id="f32"), pytest.param(F16, id="f16")])
def test_half_plus_half_equals_whole(seqlens, chunk_size, io_dtype):
    """Prefill of the first half, then of the second half continuing from its final states, is the whole."""
    inp = make_inputs(sum(seqlens), io_dtype=io_dtype, D="head", z=True, dt_bias=True, seed=6)
    init = initial(len(seqlens))
    whole_meta = chunk_metadata(seqlens, chunk_size)
    whole_out = torch.empty_like(inp["x"])
    whole = run_ref(inp, whole_meta, chunk_size, out=whole_out, initial_states=init, state_dtype=F32)

    firsts = [n // 2 for n in seqlens]
    seconds = [n - f for n, f in zip(seqlens, firsts, strict=True)]
    starts = [0]
    for n in seqlens:
        starts.append(starts[-1] + n)
    idx1 = torch.cat([torch.arange(s, s + f) for s, f in zip(starts, firsts, strict=False)])
    idx2 = torch.cat([torch.arange(s + f, s + n) for s, f, n in zip(starts, firsts, seqlens, strict=False)])

    def part(idx):
        return {k: (v[idx] if isinstance(v, torch.Tensor) and v.dim() >= 2 else v) for k, v in inp.items()}

    m1 = chunk_metadata(firsts, chunk_size)
    out1 = torch.empty_like(inp["x"][idx1])
    s1 = run_ref(part(idx1), m1, chunk_size, out=out1, initial_states=init, state_dtype=F32)
    m2 = chunk_metadata(seconds, chunk_size, history=firsts)
    out2 = torch.empty_like(inp["x"][idx2])
    s2 = run_ref(part(idx2), m2, chunk_size, out=out2, initial_states=s1, state_dtype=F32)

    rtol, atol = TOL[F32]
    torch.testing.assert_close(s2, whole, rtol=rtol, atol=atol)
    torch.testing.assert_close(out1.float(), whole_out[idx1].float(), rtol=TOL[io_dtype][0], atol=TOL[io_dtype][1])
    torch.testing.assert_close(out2.float(), whole_out[idx2].float(), rtol=TOL[io_dtype][0], atol=TOL[io_dtype][1])
    exp = run_rec(inp, seqlens, initial_states=init)
    close(whole, exp.final, F32)
    close(whole_out, exp.y, io_dtype)


# ----------------------------------------------------------------------------------- returned states


@pytest.mark.parametrize(
    "state_dtype,init_dtype,expected",
    [
        pytest.param(None, None, BF16, id="default_C_dtype"),
        pytest.param(None, F16, F16, id="default_initial_dtype"),
        pytest.param(F32, None, F32, id="explicit_f32"),
        pytest.param(F16, F32, F16, id="explicit_over_initial"),
    ],
)
def test_state_dtype(state_dtype, init_dtype, expected):
    seqlens, cs = [10, 20], 16
    inp = make_inputs(30, io_dtype=BF16, seed=7)
    meta = chunk_metadata(seqlens, cs)
    init = None if init_dtype is None else initial(2, dtype=init_dtype)
    res = run_ref(inp, meta, cs, initial_states=init, state_dtype=state_dtype)
    assert res.dtype == expected and res.shape == (2, 4, 8, 16)
    exp = run_rec(inp, seqlens, initial_states=init)
    close(res, exp.final, expected)
    inter = run_ref(inp, meta, cs, initial_states=init, state_dtype=state_dtype, return_intermediate_states=True)
    assert inter.dtype == expected and inter.shape == (3, 4, 8, 16)


@pytest.mark.parametrize("state_dtype", [pytest.param(F32, id="pool_f32"), pytest.param(BF16, id="pool_bf16")])
def test_final_states_out(state_dtype):
    """vLLM 0.33's extension: final states go straight into the pool at ``final_state_indices``; other
    slots stay bit-identical; the call returns None."""
    seqlens, cs = [18, 4, 33], 16
    inp = make_inputs(sum(seqlens), D="head", seed=8)
    meta = chunk_metadata(seqlens, cs)
    init = initial(3)
    pool = torch.randn(8, 4, 8, 16).to(state_dtype)
    before = pool.clone()
    idx = torch.tensor([6, 1, 3], dtype=torch.int64)
    res = run_ref(inp, meta, cs, initial_states=init, final_states_out=pool, final_state_indices=idx)
    assert res is None
    exp = run_rec(inp, seqlens, initial_states=init)
    close(pool[idx], exp.final, state_dtype)
    rest = torch.tensor([0, 2, 4, 5, 7])
    assert torch.equal(pool[rest], before[rest])


def test_seq_idx_is_the_authority():
    """A ``last_chunk_indices`` that disagrees with ``seq_idx`` only changes which states come back."""
    seqlens, cs = [20, 40], 16
    inp = make_inputs(60, z=True, seed=9)
    meta = chunk_metadata(seqlens, cs)  # chunks: 16 4 | 16 16 8 ; last = [1, 4]
    init = initial(2)
    exp = run_rec(inp, seqlens, meta, initial_states=init)
    good_out = torch.empty_like(inp["x"])
    run_ref(inp, meta, cs, out=good_out, initial_states=init)
    for lci in ([0, 3], [2, 2], [4, 1]):
        bad = dataclasses.replace(meta, last_chunk_indices=torch.tensor(lci, dtype=torch.int32))
        out = torch.empty_like(inp["x"])
        res = run_ref(inp, bad, cs, out=out, initial_states=init)
        assert torch.equal(out, good_out)
        close(res, exp.chunk_end[torch.tensor(lci)], F32)


def test_out_written_in_place_and_allocated():
    seqlens, cs = [10, 25], 16
    inp = make_inputs(35, io_dtype=BF16, z=True, D="head", seed=10)
    meta = chunk_metadata(seqlens, cs)
    exp = run_rec(inp, seqlens)
    big = torch.zeros(35, 4, 2 * 8, dtype=BF16)
    out = big[:, :, ::2]  # a strided out
    run_ref(inp, meta, cs, out=out)
    close(out, exp.y, BF16)
    assert torch.equal(big[:, :, 1::2], torch.zeros_like(big[:, :, 1::2]))


@pytest.mark.parametrize("G", [pytest.param(1, id="G1"), pytest.param(4, id="G_eq_H"), pytest.param(2, id="G2")])
def test_groups(G):
    seqlens, cs = [21, 11], 16
    inp = make_inputs(32, G=G, D="full", seed=11)
    meta = chunk_metadata(seqlens, cs)
    exp = run_rec(inp, seqlens, meta)
    out = torch.empty_like(inp["x"])
    states = run_ref(inp, meta, cs, out=out, return_intermediate_states=True)
    close(out, exp.y, F32)
    close(states, exp.chunk_end, F32)


def test_odd_sizes():
    """P and N that are not powers of two (80, 96)."""
    seqlens, cs = [5, 17], 16
    inp = make_inputs(22, H=2, P=80, N=96, G=1, D="head", z=True, seed=12)
    meta = chunk_metadata(seqlens, cs)
    init = initial(2, H=2, P=80, N=96)
    exp = run_rec(inp, seqlens, meta, initial_states=init)
    out = torch.empty_like(inp["x"])
    states = run_ref(inp, meta, cs, out=out, initial_states=init, return_intermediate_states=True)
    close(out, exp.y, F32)
    close(states, exp.chunk_end, F32)
    assert math.isfinite(float(states.abs().max()))


@pytest.mark.parametrize("chunk_size", [pytest.param(128, id="cs128"), pytest.param(256, id="cs256")])
def test_large_chunk_sizes(chunk_size):
    seqlens = [chunk_size // 2 + 3, 5]
    inp = make_inputs(sum(seqlens), H=2, P=4, N=8, G=1, D="head", z=True, seed=13)
    meta = chunk_metadata(seqlens, chunk_size, history=[chunk_size - 7, 0])
    init = initial(2, H=2, P=4, N=8)
    exp = run_rec(inp, seqlens, meta, initial_states=init)
    out = torch.empty_like(inp["x"])
    states = run_ref(inp, meta, chunk_size, out=out, initial_states=init, return_intermediate_states=True)
    close(out, exp.y, F32)
    close(states, exp.chunk_end, F32)


def _random_ssd(seed):
    r = torch.Generator().manual_seed(2000 + seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=r))]

    cs = pick([16, 32])
    batch = pick([1, 2, 3, 4])
    seqlens = [int(torch.randint(1, 3 * cs, (1,), generator=r)) for _ in range(batch)]
    history = [pick([0, 0, int(torch.randint(1, 4 * cs, (1,), generator=r))]) for _ in range(batch)]
    H, G = pick([(4, 2), (4, 4), (3, 1), (6, 3)])
    P, N = pick([(8, 16), (5, 12), (16, 8)])
    io = pick([F32, BF16, F16])
    inp = make_inputs(
        sum(seqlens), H=H, P=P, N=N, G=G, io_dtype=io, D=pick([None, "head", "full", "bf16"]),
        z=pick([True, False]), dt_bias=pick([True, False]), softplus=pick([True, False]), seed=seed,
    )  # fmt: skip
    if pick([True, False]):
        inp["dt"] = inp["dt"].to(pick([BF16, F16]))
    kw = {}
    if pick([True, False]):
        kw["dt_limit"] = pick([(0.0, 0.2), (0.02, math.inf), (0.01, 0.5)])
    if pick([True, True, False]):
        kw["initial_states"] = initial(batch, H=H, P=P, N=N, dtype=pick([F32, BF16]), seed=seed)
    sd = pick([None, F32, BF16, F16])
    return cs, seqlens, history, inp, kw, sd


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"combo{s}") for s in range(24)])
def test_random_combinations(seed):
    cs, seqlens, history, inp, kw, sd = _random_ssd(seed)
    meta = chunk_metadata(seqlens, cs, history=history)
    if seed % 2:  # the index tensors may be int64 as well
        tables = {f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)}
        meta = dataclasses.replace(meta, **{k: v.long() for k, v in tables.items() if v is not None})
    exp = run_rec(inp, seqlens, meta, **kw)
    out = torch.empty_like(inp["x"])
    states = run_ref(inp, meta, cs, out=out, return_intermediate_states=True, state_dtype=sd, **kw)
    expected_dtype = sd or (kw["initial_states"].dtype if "initial_states" in kw else inp["C"].dtype)
    assert states.dtype == expected_dtype
    close(out, exp.y, inp["x"].dtype)
    close(states, exp.chunk_end, expected_dtype)
    final = run_ref(inp, meta, cs, state_dtype=sd, **kw)
    close(final, exp.final, expected_dtype)


@pytest.mark.parametrize("a_dtype", [pytest.param(BF16, id="bf16"), pytest.param(F16, id="fp16")])
def test_two_byte_a_is_the_fp32_call(a_dtype):
    """A 2-byte ``A`` (the engines' prefill accepts one) is cast to fp32: the result is the fp32 call's with that
    rounded A, bit for bit."""
    seqlens = [5, 37]
    inp = make_inputs(sum(seqlens), D="head", dt_bias=True, seed=3)
    meta = chunk_metadata(seqlens, 16)
    A2 = inp["A"].to(a_dtype)
    got = run_ref({**inp, "A": A2}, meta, 16)
    want = run_ref({**inp, "A": A2.float()}, meta, 16)
    assert torch.equal(got, want)
