"""Op-level conformance of ``mate_sglang.ops`` with SGLang 0.5.23's Mamba2 ops
(``sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py`` and ``ssd_combined.py``), called the way an engine or a
kernel test calls them, checked against the float64 oracle ``mate.mamba.testing`` (``ssu_recurrence``,
``ssd_recurrence``).

What SGLang's ops do, as these tests read them:

* ``selective_state_update`` loads every input as fp32 (any float dtype mix is valid) and stores y in
  ``out``'s dtype; without ``state_batch_indices`` sequence ``b`` uses pool row ``b`` (no sentinel applies);
  ``enable_stochastic_rounding`` needs an fp16 state and ``cache_philox_rounds >= 0``, and rounds the final state
  store only, with a fresh ``torch.randint`` seed per call.
* ``mamba_chunk_scan_combined`` takes any power-of-two ``chunk_size``; ``final_states`` are fp32, the chunk /
  varlen / track states are in ``state_dtype`` (default C's dtype); ``return_track_states`` (with
  ``return_varlen_states``) returns ``(chunk states, varlen_states, track_states)``.

Tests that need the runtime's wider contract (fp32 B/C beside a bf16/fp16 x in the SSU, chunk_size 8 on the
reference backend) say so in their docstring.
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest
import torch
from mate.mamba.testing import ssd_recurrence, ssu_recurrence
from mate_sglang import ops

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16

# SGLang 0.5.23's signatures (names and defaults), written out from its source
SGL_SSU = [
    ("state", inspect.Parameter.empty), ("x", inspect.Parameter.empty), ("dt", inspect.Parameter.empty),
    ("A", inspect.Parameter.empty), ("B", inspect.Parameter.empty), ("C", inspect.Parameter.empty), ("D", None),
    ("z", None), ("dt_bias", None), ("dt_softplus", False), ("state_batch_indices", None), ("pad_slot_id", -1),
    ("out", None), ("disable_state_update", False), ("intermediate_states_buffer", None), ("cache_steps", None),
    ("retrieve_parent_token", None), ("intermediate_state_indices", None), ("enable_stochastic_rounding", False),
    ("cache_philox_rounds", 0),
]  # fmt: skip
SGL_PREFILL = [
    ("x", inspect.Parameter.empty), ("dt", inspect.Parameter.empty), ("A", inspect.Parameter.empty),
    ("B", inspect.Parameter.empty), ("C", inspect.Parameter.empty), ("chunk_size", inspect.Parameter.empty),
    ("D", None), ("z", None), ("dt_bias", None), ("initial_states", None), ("seq_idx", None),
    ("chunk_indices", None), ("chunk_offsets", None), ("cu_seqlens", None), ("dt_softplus", False),
    ("dt_limit", (0.0, float("inf"))), ("out", None), ("return_final_states", False),
    ("return_varlen_states", False), ("return_intermediate_states", False), ("state_dtype", None),
    ("return_track_states", False), ("track_seq_idx", None), ("track_end_locs", None),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "want"), [(ops.selective_state_update, SGL_SSU), (ops.mamba_chunk_scan_combined,
                                                                                  SGL_PREFILL)])  # fmt: skip
def test_signature_and_defaults_are_sglangs(fn, want):
    got = [(n, p.default) for n, p in inspect.signature(fn).parameters.items()]
    assert got == want


# ------------------------------------------------------------------------------------------------ SSU


def ssu_tensors(bs, T=None, H=4, P=4, N=8, G=2, S=8, seed=0, io=F32, bc=None, state=F32, z=False, dev="cpu"):
    """Full (untied) SGLang-shaped decode tensors: one token (3-D) when ``T`` is None, else dense 4-D."""
    g = torch.Generator().manual_seed(seed)
    lead = (bs,) if T is None else (bs, T)
    t = SimpleNamespace()
    t.state = torch.randn(S, H, P, N, generator=g).to(dev, state)
    t.x = torch.randn(*lead, H, P, generator=g).to(dev, io)
    t.dt = (torch.randn(*lead, H, P, generator=g) * 0.5).to(dev)
    t.A = (-torch.rand(H, P, N, generator=g) - 0.1).to(dev)
    t.B = torch.randn(*lead, G, N, generator=g).to(dev, bc or io)
    t.C = torch.randn(*lead, G, N, generator=g).to(dev, bc or io)
    t.D = torch.randn(H, P, generator=g).to(dev)
    t.dt_bias = (torch.rand(H, P, generator=g) * 0.2).to(dev)
    t.z = torch.randn(*lead, H, P, generator=g).to(dev, io) if z else None
    t.out = torch.empty(*lead, H, P, dtype=io, device=dev)
    return t


def tol(*dtypes):
    return dict(atol=3e-2, rtol=3e-2) if {BF16, F16} & set(dtypes) else dict(atol=2e-5, rtol=2e-5)


def check_ssu(t, exp, *, dtypes=()):
    tl = tol(t.x.dtype, t.out.dtype, t.state.dtype, *dtypes)
    torch.testing.assert_close(t.out.double().cpu(), exp.y64, **tl)
    torch.testing.assert_close(t.state.double().cpu(), exp.state.double(), **tl)


def call_ssu(t, **kw):
    return ops.selective_state_update(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True, out=t.out, **kw
    )


def oracle_ssu(t, pool0, **kw):
    return ssu_recurrence(
        pool0.cpu(), t.x.cpu(), t.dt.cpu(), t.A.cpu(), t.B.cpu(), t.C.cpu(), t.D.cpu(),
        z=None if t.z is None else t.z.cpu(), dt_bias=t.dt_bias.cpu(), dt_softplus=True,
        **{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()},
    )  # fmt: skip


def test_stochastic_rounding_keeps_sglangs_own_checks():
    t32 = ssu_tensors(2)
    with pytest.raises(ValueError, match="float16"):  # SGLang: stochastic rounding needs an fp16 state
        call_ssu(t32, enable_stochastic_rounding=True)
    with pytest.raises(ValueError, match="cache_philox_rounds"):
        call_ssu(t32, cache_philox_rounds=-1)


def _within_one_fp16_step(got: torch.Tensor, exact: torch.Tensor) -> bool:
    """Whether every fp16 value is within one fp16 step of the exact value (a stochastic rounding's two
    candidates; MATE computes in fp32, so the exact value's own fp16 neighbours may differ from MATE's)."""
    return bool(((got.double() - exact).abs() <= exact.abs() * 2.0**-10 + 1e-6).all())


def test_stochastic_rounding_rounds_the_final_store():
    """SGLang's kernel rounds the final fp16 state store stochastically with a fresh seed per call: every value
    written is within one fp16 step of the exact one, torch's generator decides the draw, and other draws round
    differently."""
    idx = torch.tensor([5, 0, 3], dtype=torch.int32)
    pools = []
    for seed in (1, 1, 2):
        t = ssu_tensors(3, seed=4, state=F16, N=32)
        pool0 = t.state.clone()
        torch.manual_seed(seed)
        assert call_ssu(t, state_batch_indices=idx, enable_stochastic_rounding=True, cache_philox_rounds=7) is None
        exact = oracle_ssu(t, pool0.float(), state_batch_indices=idx).state
        assert _within_one_fp16_step(t.state[idx.long()], exact[idx.long()].double())
        others = torch.tensor([1, 2, 4, 6, 7])
        assert torch.equal(t.state[others], pool0[others])
        pools.append(t.state.clone())
    assert torch.equal(pools[0], pools[1]) and not torch.equal(pools[0], pools[2])
    nearest = ssu_tensors(3, seed=4, state=F16, N=32)
    call_ssu(nearest, state_batch_indices=idx)
    assert not torch.equal(nearest.state, pools[0])  # (not round to nearest)


def test_stochastic_rounding_leaves_the_intermediate_buffer_to_nearest():
    """With an intermediate buffer (SGLang's verify) SGLang rounds the buffer's stores to nearest: the same
    bits as with the flag off."""
    bufs = []
    for sr in (True, False):
        t = ssu_tensors(2, T=3, seed=6, state=F16, N=32)
        buf = torch.zeros(4, 3, 4, 4, 32, dtype=F16)
        call_ssu(t, state_batch_indices=torch.tensor([1, 2]), intermediate_states_buffer=buf, cache_steps=3,
                 disable_state_update=True, enable_stochastic_rounding=sr)  # fmt: skip
        bufs.append(buf)
    assert torch.equal(bufs[0], bufs[1])


def test_stochastic_rounding_off_computes_and_ignores_philox_rounds():
    t = ssu_tensors(3, seed=1)
    pool0 = t.state.clone()
    idx = torch.tensor([5, -1, 0], dtype=torch.int32)
    assert call_ssu(t, state_batch_indices=idx, enable_stochastic_rounding=False, cache_philox_rounds=10) is None
    check_ssu(t, oracle_ssu(t, pool0, state_batch_indices=idx))


@pytest.mark.parametrize("T", [None, 3])
def test_table_less_call_uses_pool_rows_0_to_batch(T):
    """No ``state_batch_indices``: sequence b reads and writes pool row b, row 0 included (no sentinel)."""
    t = ssu_tensors(3, T=T, seed=2, z=True)
    pool0 = t.state.clone()
    call_ssu(t)
    exp = oracle_ssu(t, pool0)
    assert exp.written == {0, 1, 2}
    check_ssu(t, exp)


DTYPE_MIXES = [
    # (x, B/C, z, out, state, A): SGLang loads all as fp32 and stores y in out's dtype
    pytest.param(BF16, BF16, BF16, BF16, F32, F32, id="bf16"),
    pytest.param(F16, F16, F16, F16, F16, F32, id="fp16-state-fp16"),
    pytest.param(BF16, BF16, BF16, BF16, BF16, BF16, id="bf16-A-bf16-state"),
    pytest.param(BF16, F32, BF16, BF16, F32, F32, id="bc-fp32-beside-bf16-x(runtime)"),
    pytest.param(F16, F32, F16, F16, F32, F32, id="bc-fp32-beside-fp16-x(runtime)"),
    pytest.param(BF16, BF16, F32, F32, F32, F32, id="z-out-fp32-beside-bf16-x(cast)"),
    pytest.param(F32, F32, F32, BF16, F32, F32, id="out-bf16-beside-fp32-x(cast)"),
    pytest.param(F16, BF16, F16, F32, F32, F16, id="mixed-halves(cast)"),
]


@pytest.mark.parametrize(("io", "bc", "zd", "od", "sd", "ad"), DTYPE_MIXES)
@pytest.mark.parametrize("T", [None, 2])
def test_dtype_mixes(io, bc, zd, od, sd, ad, T):
    """The ``(runtime)`` cases need the runtime to accept fp32 B/C beside a bf16/fp16 x natively."""
    t = ssu_tensors(3, T=T, seed=3, io=io, bc=bc, state=sd, z=True)
    t.z, t.out, t.A = t.z.to(zd), t.out.to(od), t.A.to(ad)
    pool0 = t.state.clone()
    idx = torch.tensor([4, -1, 1])
    call_ssu(t, state_batch_indices=idx)
    check_ssu(t, oracle_ssu(t, pool0, state_batch_indices=idx), dtypes=(bc, zd, ad))


def test_tied_half_precision_A_stays_tied():
    """SGLang's mixer passes A [H] expanded to [H, P, N] (stride 0); a bf16 one is upcast keeping the broadcast."""
    t = ssu_tensors(2, seed=16)
    t.A = t.A[:, :1, :1].to(BF16).expand(t.A.shape)
    pool0 = t.state.clone()
    call_ssu(t, state_batch_indices=torch.tensor([3, 1]))
    check_ssu(t, oracle_ssu(t, pool0, state_batch_indices=torch.tensor([3, 1])))
    a32 = ops._f32_keep_broadcast(t.A)
    assert a32.dtype == F32 and a32.stride()[1:] == (0, 0) and torch.equal(a32, t.A.float())


def test_single_head_forms_without_a_table():
    """SGLang's 3-D state [S, dim, dstate], 2-D x/dt/B/C/z/out, A [dim, dstate], D/dt_bias [dim]."""
    g = torch.Generator().manual_seed(4)
    S, b, P, N = 4, 2, 4, 8
    t = SimpleNamespace(
        state=torch.randn(S, P, N, generator=g), x=torch.randn(b, P, generator=g), dt=torch.randn(b, P, generator=g),
        A=-torch.rand(P, N, generator=g), B=torch.randn(b, N, generator=g), C=torch.randn(b, N, generator=g),
        D=torch.randn(P, generator=g), dt_bias=torch.rand(P, generator=g), z=torch.randn(b, P, generator=g),
        out=torch.empty(b, P),
    )  # fmt: skip
    pool0 = t.state.clone()
    call_ssu(t)
    check_ssu(t, oracle_ssu(t, pool0))


@pytest.mark.parametrize("parent_dtype", [torch.int64, torch.int32])
def test_eagle_tree_verify_int64_parents_beside_int32_indices(parent_dtype):
    """SGLang's verify: dense x [bs, T, H, P], disable_state_update, the buffer indexed by int32
    intermediate_state_indices, int64 retrieve_parent_token (a branching row, a chain row, a pad row)."""
    bs, T = 3, 4
    t = ssu_tensors(bs, T=T, seed=5, io=BF16, z=True)
    pool0 = t.state.clone()
    src = torch.tensor([6, 2, -1], dtype=torch.int32)
    ibuf_idx = torch.arange(bs, dtype=torch.int32)
    parent = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]], dtype=parent_dtype)
    buf = torch.zeros(bs, T, *t.state.shape[1:])
    call_ssu(
        t, state_batch_indices=src, disable_state_update=True, intermediate_states_buffer=buf, cache_steps=T,
        retrieve_parent_token=parent, intermediate_state_indices=ibuf_idx,
    )  # fmt: skip
    exp = oracle_ssu(
        t, pool0, state_batch_indices=src, disable_state_update=True,
        intermediate_states_buffer=torch.zeros_like(buf), cache_steps=T, retrieve_parent_token=parent,
        intermediate_state_indices=ibuf_idx,
    )  # fmt: skip
    assert torch.equal(t.state, pool0)
    torch.testing.assert_close(t.out.double(), exp.y64, **tol(BF16))
    torch.testing.assert_close(buf.double(), exp.ibuf.double(), **tol(BF16))
    assert buf[2].abs().sum() == 0  # the pad row writes nothing


def test_verify_cache_steps_none_takes_the_buffers_steps():
    bs, T = 2, 3
    t = ssu_tensors(bs, T=T, seed=6)
    pool0 = t.state.clone()
    src = torch.tensor([1, 3])
    buf = torch.zeros(8, T, *t.state.shape[1:])
    call_ssu(t, state_batch_indices=src, disable_state_update=True, intermediate_states_buffer=buf)
    exp = oracle_ssu(
        t, pool0, state_batch_indices=src, disable_state_update=True, intermediate_states_buffer=torch.zeros_like(buf)
    )
    torch.testing.assert_close(buf.double(), exp.ibuf.double(), **tol())


# -------------------------------------------------------------------------------------------- prefill


def prefill(lens, seed=7, H=4, P=4, N=8, G=2, io=F32, init=True, dev="cpu"):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    c = SimpleNamespace(lens=lens, T=T, H=H, P=P, N=N)
    c.x = torch.randn(1, T, H, P, generator=g).to(dev, io)
    c.dt = (torch.randn(1, T, H, generator=g) * 0.5).to(dev)
    c.A = (-torch.rand(H, generator=g) - 0.1).to(dev)
    c.B = torch.randn(1, T, G, N, generator=g).to(dev, io)
    c.C = torch.randn(1, T, G, N, generator=g).to(dev, io)
    c.D = torch.randn(H, generator=g).to(dev)
    c.dt_bias = (torch.rand(H, generator=g) * 0.2).to(dev)
    c.z = torch.randn(1, T, H, P, generator=g).to(dev, io)
    c.init = torch.randn(len(lens), H, P, N, generator=g).to(dev) if init else None
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    c.cu = cu
    c.cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
    c.seq_idx = torch.tensor([[b for b, n in enumerate(lens) for _ in range(n)]], dtype=torch.int32, device=dev)
    c.out = torch.empty(1, T, H, P, dtype=io, device=dev)
    return c


def call_prefill(c, chunk_size, **kw):
    kw.setdefault("seq_idx", c.seq_idx)
    kw.setdefault("cu_seqlens", c.cu_t)
    return ops.mamba_chunk_scan_combined(
        c.x, c.dt, c.A, c.B, c.C, chunk_size, D=c.D, z=c.z, dt_bias=c.dt_bias, initial_states=c.init,
        dt_softplus=True, out=c.out, **kw,
    )  # fmt: skip


def oracle_prefill(c, bounds=(), dt_limit=(0.0, math.inf)):
    """The float64 recurrence; ``after[p]``: the state after packed token ``p - 1`` (for each ``p`` in bounds)."""
    cc = sorted(set(bounds) | {c.T} | {0}) if bounds else None
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in vars(c).items()}
    e = ssd_recurrence(
        cpu["x"][0], cpu["dt"][0], cpu["A"].float(), cpu["B"][0], cpu["C"][0], c.lens, D=cpu["D"],
        z=None if c.z is None else cpu["z"][0],
        dt_bias=cpu["dt_bias"], dt_softplus=True, dt_limit=dt_limit, initial_states=cpu["init"],
        cu_chunk_seqlens=None if cc is None else torch.tensor(cc),
    )  # fmt: skip
    after = {} if cc is None else {p: e.chunk_end[i] for i, p in enumerate(cc[1:])}
    return e, after


def rel(got, ref):
    return ((got.double().cpu() - ref).abs().max() / ref.abs().max()).item()


LENS = [5, 37, 20]  # T = 62: sequences start inside chunks for every chunk size below


@pytest.mark.parametrize("chunk_size", [8, 16, 32, 64, 128, 256])
def test_prefill_chunk_sizes_with_varlen_and_chunk_states(chunk_size):
    """chunk_size 8 needs the reference backend to serve every power of two >= 8."""
    c = prefill(LENS)
    states, final, varlen = call_prefill(
        c, chunk_size, return_final_states=True, return_varlen_states=True, return_intermediate_states=True
    )
    nabs = math.ceil(c.T / chunk_size)
    e, after = oracle_prefill(c, bounds=[k * chunk_size for k in range(1, nabs)])
    assert states.shape == (1, nabs, c.H, c.P, c.N) and final.shape == (1, c.H, c.P, c.N)
    assert varlen.shape == (3, c.H, c.P, c.N)
    assert final.dtype == F32 and states.dtype == F32 and varlen.dtype == F32
    assert rel(c.out[0], e.y) < 1e-5
    assert rel(varlen, e.final) < 1e-5
    assert rel(final[0], e.final[-1]) < 1e-5
    torch.testing.assert_close(states[0, 0], c.init[0])  # chunk 0 enters with the first sequence's state
    for k in range(1, nabs):
        assert rel(states[0, k], after[k * chunk_size]) < 1e-5


@pytest.mark.parametrize("chunk_size", [1, 2, 4, 7, 12, 0])
def test_prefill_rejects_what_sglang_rejects_or_mate_does_not_serve(chunk_size):
    """Not a power of two: SGLang asserts (ValueError here); 1, 2, 4: valid there, not served here."""
    c = prefill(LENS)
    err = ValueError if chunk_size & (chunk_size - 1) or chunk_size < 1 else NotImplementedError
    with pytest.raises(err, match="chunk_size"):
        call_prefill(c, chunk_size, return_varlen_states=True)


FORMS = [
    # (return_final_states, return_varlen_states, return_intermediate_states) -> SGLang's return value
    ((False, False, False), ()),
    ((True, False, False), ("final",)),
    ((False, True, False), ("varlen",)),
    ((True, True, False), ("final", "varlen")),
    ((False, False, True), ("states",)),
    ((True, False, True), ("states", "final")),
    ((False, True, True), ("states", "varlen")),
    ((True, True, True), ("states", "final", "varlen")),
]


@pytest.mark.parametrize(("flags", "names"), FORMS)
@pytest.mark.parametrize("state_dtype", [None, F32, BF16])
def test_prefill_every_return_form_and_its_dtypes(flags, names, state_dtype):
    """bf16 x/B/C: final_states fp32 always; the chunk and varlen states in state_dtype, default C's (bf16)."""
    fin, var, inter = flags
    c = prefill(LENS, seed=8, io=BF16)
    kw = {} if var else {"cu_seqlens": None}
    res = call_prefill(
        c, 16, return_final_states=fin, return_varlen_states=var, return_intermediate_states=inter,
        state_dtype=state_dtype, **kw,
    )  # fmt: skip
    if not names:
        assert res is None
        return
    got = (res,) if len(names) == 1 else res
    assert isinstance(got, tuple) and len(got) == len(names)
    e, after = oracle_prefill(c, bounds=[16, 32, 48])
    sdt = state_dtype or BF16
    for name, v in zip(names, got, strict=True):
        if name == "final":
            assert v.dtype == F32 and v.shape == (1, c.H, c.P, c.N)
            assert rel(v[0], e.final[-1]) < 2e-2
        elif name == "varlen":
            assert v.dtype == sdt and v.shape == (3, c.H, c.P, c.N)
            assert rel(v, e.final) < 2e-2
        else:
            assert v.dtype == sdt and v.shape == (1, 4, c.H, c.P, c.N)
            for k in range(1, 4):
                assert rel(v[0, k], after[16 * k]) < 2e-2
    assert rel(c.out[0], e.y) < 2e-2


def test_prefill_final_states_fp32_not_rounded_through_the_state_dtype():
    c = prefill(LENS, seed=9, io=BF16)
    final, varlen = call_prefill(c, 16, return_final_states=True, return_varlen_states=True)
    assert final.dtype == F32 and varlen.dtype == BF16
    assert not torch.equal(final[0], final[0].to(BF16).float())  # carries more than bf16 precision
    torch.testing.assert_close(final[0].to(BF16), varlen[2], atol=0, rtol=0)


@pytest.mark.parametrize("a_dtype", [BF16, F16])
def test_prefill_half_precision_A(a_dtype):
    c = prefill(LENS, seed=10)
    c.A = c.A.to(a_dtype)
    varlen = call_prefill(c, 32, return_varlen_states=True)
    e, _ = oracle_prefill(c)  # the oracle reads the same (rounded) A
    assert rel(varlen, e.final) < 1e-5 and rel(c.out[0], e.y) < 1e-5


def test_prefill_dt_limit_and_seq_idx_with_given_pseudo_chunks():
    c = prefill(LENS, seed=11)
    # the absolute 16-grid split where a sequence starts: [0,5) [5,16) [16,32) [32,42) [42,48) [48,62)
    ci = torch.tensor([0, 0, 1, 2, 2, 3])
    co = torch.tensor([0, 5, 0, 0, 10, 0])
    varlen = call_prefill(c, 16, chunk_indices=ci, chunk_offsets=co, dt_limit=(0.05, 0.6), return_varlen_states=True)
    e, _ = oracle_prefill(c, dt_limit=(0.05, 0.6))
    assert rel(varlen, e.final) < 1e-5 and rel(c.out[0], e.y) < 1e-5


def test_prefill_independent_rows_without_seq_idx_or_initial_states():
    c = prefill([24, 24], seed=12, init=False)
    x = c.x.view(2, 24, c.H, c.P)
    out = torch.empty_like(x)
    final = ops.mamba_chunk_scan_combined(
        x, c.dt.view(2, 24, c.H), c.A, c.B.view(2, 24, 2, c.N), c.C.view(2, 24, 2, c.N), 16, D=c.D,
        dt_bias=c.dt_bias, dt_softplus=True, out=out, return_final_states=True,
    )  # fmt: skip
    c.z = None
    e, _ = oracle_prefill(c)
    assert final.dtype == F32 and final.shape == (2, c.H, c.P, c.N)
    assert rel(final, e.final) < 1e-5
    assert rel(out.reshape(48, c.H, c.P), e.y) < 1e-5


def test_prefill_track_states():
    """SGLang's prefix-cache tracking: track_states[0, i] is sequence track_seq_idx[i]'s state before packed
    position track_end_locs[i] (mid-chunk, on the grid, at its end, at its start = its initial state)."""
    c = prefill(LENS, seed=13)
    tsid = torch.tensor([1, 1, 2, 0, 1], dtype=torch.int64)
    tend = torch.tensor([21, 32, 62, 5, 5], dtype=torch.int64)
    states, varlen, track = call_prefill(
        c, 16, return_varlen_states=True, return_final_states=True, return_intermediate_states=True,
        return_track_states=True, track_seq_idx=tsid, track_end_locs=tend,
    )  # fmt: skip
    e, after = oracle_prefill(c, bounds=[16, 32, 48, 21, 5])
    assert states.shape == (1, 4, c.H, c.P, c.N) and varlen.shape == (3, c.H, c.P, c.N)
    assert track.shape == (1, 5, c.H, c.P, c.N) and track.dtype == F32
    for i, p in enumerate([21, 32, 62]):
        assert rel(track[0, i], after[p]) < 1e-5
    assert rel(track[0, 3], e.final[0]) < 1e-5  # sequence 0 ends at 5
    torch.testing.assert_close(track[0, 4], c.init[1])  # sequence 1 before any token
    assert rel(varlen, e.final) < 1e-5 and rel(c.out[0], e.y) < 1e-5
    for k in range(1, 4):
        assert rel(states[0, k], after[16 * k]) < 1e-5


def test_prefill_track_states_forms():
    c = prefill(LENS, seed=14)
    states, varlen, track = call_prefill(c, 32, return_varlen_states=True, return_track_states=True)
    assert track is None and states.shape == (1, 2, c.H, c.P, c.N)
    _, _, track = call_prefill(
        c, 32, return_varlen_states=True, return_track_states=True, track_seq_idx=torch.tensor([], dtype=torch.long),
        track_end_locs=torch.tensor([], dtype=torch.long),
    )  # fmt: skip
    assert track is None
    with pytest.raises(ValueError, match="return_track_states"):
        call_prefill(c, 32, return_track_states=True)
    with pytest.raises(ValueError, match="track_end_locs"):
        call_prefill(
            c, 32, return_varlen_states=True, return_track_states=True, track_seq_idx=torch.tensor([0]),
            track_end_locs=torch.tensor([30]),
        )  # fmt: skip


# ------------------------------------------------------------------------------------ GPU (TileLang)


@pytest.mark.gpu
@pytest.mark.parametrize(("bc", "T"), [(BF16, None), (F32, None), (BF16, 4), (F32, 4)])
def test_gpu_ssu_dtype_mix_and_eagle_tree(bc, T):
    """TileLang: bf16 x with bf16/fp32 B/C (fp32 needs the runtime's change), one token and an EAGLE verify with
    int64 parents beside int32 intermediate_state_indices."""
    bs = 3
    t = ssu_tensors(bs, T=T, H=8, P=64, N=128, G=2, seed=20, io=BF16, bc=bc, dev="cuda")
    t.dt = t.dt[..., :1].expand(t.dt.shape)  # SGLang's tied per-head dt / A / dt_bias
    t.A = t.A[:, :1, :1].expand(t.A.shape)
    t.dt_bias = t.dt_bias[:, :1].expand(t.dt_bias.shape)
    pool0 = t.state.clone()
    src = torch.tensor([6, -1, 0], dtype=torch.int32, device="cuda")
    kw = dict(state_batch_indices=src)
    if T is not None:
        kw.update(
            disable_state_update=True, intermediate_states_buffer=torch.zeros(bs, T, 8, 64, 128, device="cuda"),
            cache_steps=T, intermediate_state_indices=torch.arange(bs, dtype=torch.int32, device="cuda"),
            retrieve_parent_token=torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 1, 1]], device="cuda"),
        )  # fmt: skip
    exp_kw = {k: (v.clone() if k == "intermediate_states_buffer" else v) for k, v in kw.items()}
    call_ssu(t, **kw)
    torch.cuda.synchronize()
    exp = oracle_ssu(t, pool0, **exp_kw)
    # fp32 B/C are read in x's dtype by the kernels (a cast): their bf16 rounding reaches the states too
    stol = 2e-3 if bc == BF16 else 1e-2
    assert rel(t.out, exp.y64) < 2e-2
    assert rel(t.state, exp.state.double()) < stol
    if T is not None:
        assert rel(kw["intermediate_states_buffer"], exp.ibuf.double()) < stol


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("src_dt", "ibuf_dt", "parent_dt"),
    [
        pytest.param(torch.int32, torch.int32, torch.int32, id="all-int32"),
        pytest.param(torch.int64, torch.int64, torch.int64, id="all-int64"),
        pytest.param(torch.int32, torch.int32, torch.int64, id="parents-int64(sglang-eagle)"),
        pytest.param(torch.int64, torch.int32, torch.int32, id="src-int64"),
        pytest.param(torch.int32, torch.int64, torch.int64, id="ibuf-parents-int64"),
    ],
)  # fmt: skip
def test_gpu_eagle_tree_mixed_index_dtypes(src_dt, ibuf_dt, parent_dt):
    """The EAGLE verify on the TileLang kernels with state_batch_indices, intermediate_state_indices and
    retrieve_parent_token each in its own int dtype (the planner widens a mix to int64 once)."""
    bs, T = 3, 4
    t = ssu_tensors(bs, T=T, H=8, P=64, N=128, G=2, seed=23, io=BF16, dev="cuda")
    pool0 = t.state.clone()
    buf = torch.zeros(bs, T, 8, 64, 128, device="cuda")
    kw = dict(
        state_batch_indices=torch.tensor([6, -1, 0], dtype=src_dt, device="cuda"), disable_state_update=True,
        cache_steps=T, intermediate_state_indices=torch.tensor([2, 0, 1], dtype=ibuf_dt, device="cuda"),
        retrieve_parent_token=torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 1, 1]], dtype=parent_dt,
                                           device="cuda"),
    )  # fmt: skip
    call_ssu(t, intermediate_states_buffer=buf, **kw)
    torch.cuda.synchronize()
    exp = oracle_ssu(t, pool0, intermediate_states_buffer=torch.zeros_like(buf), **kw)
    assert torch.equal(t.state, pool0)
    assert rel(t.out, exp.y64) < 2e-2 and rel(buf, exp.ibuf.double()) < 2e-3
    assert buf[0].abs().sum() == 0  # entry 0 belongs to the pad row


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [64, 128, 256])
def test_gpu_prefill_return_forms_and_track_states(chunk_size):
    c = prefill([5, 150, 40], seed=21, H=8, P=64, N=128, io=BF16, dev="cuda")
    states, varlen, track = call_prefill(
        c, chunk_size, return_varlen_states=True, return_track_states=True,
        track_seq_idx=torch.tensor([1, 2], device="cuda"), track_end_locs=torch.tensor([100, 195], device="cuda"),
    )  # fmt: skip
    torch.cuda.synchronize()
    e, after = oracle_prefill(c, bounds=[100])
    assert varlen.dtype == BF16 and states.dtype == BF16 and track.dtype == BF16
    assert rel(c.out[0], e.y) < 3e-2 and rel(varlen, e.final) < 3e-2
    assert rel(track[0, 0], after[100]) < 3e-2 and rel(track[0, 1], e.final[2]) < 3e-2
    final = call_prefill(c, chunk_size, return_final_states=True)
    assert final.dtype == F32 and rel(final[0], e.final[2]) < 3e-2


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [8, 16, 32])
def test_gpu_prefill_small_chunk_sizes_are_named(chunk_size):
    c = prefill([5, 40], seed=22, H=8, P=64, N=128, io=BF16, dev="cuda")
    with pytest.raises(NotImplementedError, match="chunk_size"):
        call_prefill(c, chunk_size, return_varlen_states=True)


def test_prefill_independent_rows_chunk_states():
    """No seq_idx: each batch row is a sequence with its own initial state; chunk states per row."""
    c = prefill([40, 40], seed=15)
    x = c.x.view(2, 40, c.H, c.P)
    out = torch.empty_like(x)
    states, final = ops.mamba_chunk_scan_combined(
        x, c.dt.view(2, 40, c.H), c.A, c.B.view(2, 40, 2, c.N), c.C.view(2, 40, 2, c.N), 16, D=c.D,
        z=c.z.view(2, 40, c.H, c.P), dt_bias=c.dt_bias, initial_states=c.init, dt_softplus=True, out=out,
        return_final_states=True, return_intermediate_states=True,
    )  # fmt: skip
    e, after = oracle_prefill(c, bounds=[16, 32, 56, 72])
    assert states.shape == (2, 3, c.H, c.P, c.N) and final.shape == (2, c.H, c.P, c.N)
    assert rel(out.reshape(80, c.H, c.P), e.y) < 1e-5 and rel(final, e.final) < 1e-5
    for r in range(2):
        torch.testing.assert_close(states[r, 0], c.init[r])
        for k in (1, 2):
            assert rel(states[r, k], after[40 * r + 16 * k]) < 1e-5
