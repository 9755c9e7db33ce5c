"""``selective_state_update(..., backend="torch")`` against the float64 token-by-token oracle
``mate.mamba.testing.ssu_recurrence``.

Every form of the decode call (``docs/mamba.md``) the normaliser accepts: dtypes, head/group ratios, odd P
and N, tied and untied dt/A/D/dt_bias, the 3-D state, every slot table form, the sentinels, MTP with accepted
counts, zero-length sequences, the dense 4-D form, destination tables, the intermediate buffer, strided pools
and row views, ``disable_state_update`` and ``out``. Pool slots (and page bytes) a call does not name must
come back bit-identical.
"""

from __future__ import annotations

import pytest
import torch
from mate.mamba import selective_state_update
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._dispatch import run
from mate.mamba.testing import ssu_recurrence

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
DTYPE_ID = {F32: "f32", BF16: "bf16", F16: "f16"}

# |actual - exact| <= atol + rtol * |exact|: the reference computes in fp32 and rounds once to the stored dtype.
TOL = {F32: (2e-5, 2e-5), BF16: (1e-2, 1e-2), F16: (2e-3, 2e-3)}


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, g, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def make_pool(S, H, P, N, dtype, g, *, single_head=False, paged=False):
    """A slot pool; ``paged`` makes it a strided view into a bigger page buffer with a storage offset
    (vLLM's layout: the SSM state shares each page with the conv state)."""
    shape = (S, P, N) if single_head else (S, H, P, N)
    inner = H * P * N
    if not paged:
        return _randn(shape, dtype, g, 0.5), None
    page = inner + 37  # a conv-state region of 29 elements before, 8 after
    buf = _randn((S + 1, page), dtype, g, 0.5)
    view = buf[1:, 29 : 29 + inner].view(shape)  # storage offset page + 29, stride(0) = page
    assert view.storage_offset() > 0 and view.stride(0) == page
    return view, buf


def make_inputs(
    *,
    H=4,
    P=8,
    N=16,
    G=2,
    rows_shape=(6,),
    io_dtype=BF16,
    dt_form="tied",
    A_form="tied",
    D_form="head",
    bias_form="head",
    z=True,
    softplus=True,
    single_head=False,
    rowview=False,
    seed=0,
):
    """x/dt/A/B/C/D/z/dt_bias for ``rows_shape`` rows ((R,) packed or (bs, T) dense)."""
    g = _gen(seed)
    hp = (P,) if single_head else (H, P)
    gn = (N,) if single_head else (G, N)
    lead = tuple(rows_shape)
    if rowview:
        # x, B, C (and z) as strided row views of one conv-output-like buffer: last dim dense, row stride free.
        width = H * P + 2 * G * N + H * P + 5
        buf = _randn(lead + (width,), io_dtype, g)
        x = buf[..., : H * P].unflatten(-1, hp)
        B = buf[..., H * P : H * P + G * N].unflatten(-1, gn)
        C = buf[..., H * P + G * N : H * P + 2 * G * N].unflatten(-1, gn)
        zz = buf[..., H * P + 2 * G * N : 2 * H * P + 2 * G * N].unflatten(-1, hp) if z else None
        assert x.stride(-1) == 1 and (x.shape[0] == 1 or not x.is_contiguous())
    else:
        x = _randn(lead + hp, io_dtype, g)
        B = _randn(lead + gn, io_dtype, g, 0.5)
        C = _randn(lead + gn, io_dtype, g, 0.5)
        zz = _randn(lead + hp, io_dtype, g) if z else None

    def dt_raw(shape):
        if softplus:
            return torch.randn(shape, generator=g) - 1.0
        return torch.rand(shape, generator=g) * 0.2 + 0.01

    if dt_form == "tied":  # [R, H, P] with strides (*, 1, 0): the production form
        dt = dt_raw(lead + hp[:-1] + (1,)).expand(lead + hp)
    elif dt_form == "per_head":  # [R, H]
        dt = dt_raw(lead + (H,))
    elif dt_form == "full":
        dt = dt_raw(lead + hp)
    elif dt_form == "full_bf16":
        dt = dt_raw(lead + hp).to(BF16)
    else:
        raise AssertionError(dt_form)

    if A_form == "head":  # [H]
        A = -(torch.rand(H, generator=g) + 0.2)
    elif A_form == "tied":  # [H, P, N] strides (1, 0, 0)
        A = -(torch.rand(H, generator=g) + 0.2)
        A = A.view(H, 1, 1).expand(H, P, N)
    elif A_form == "full":  # untied [H, P, N] ([P, N] with a 3-D state)
        A = -(torch.rand((P, N) if single_head else (H, P, N), generator=g) + 0.2)
    else:
        raise AssertionError(A_form)

    def per_head(form):
        if form is None:
            return None
        if form == "head":
            return torch.randn(H, generator=g)
        if form == "tied":
            return torch.randn(H, generator=g).view(H, 1).expand(H, P)
        if form == "full":
            return torch.randn((P,) if single_head else (H, P), generator=g)
        if form == "bf16":
            return torch.randn(H, generator=g).to(BF16)
        raise AssertionError(form)

    D = per_head(D_form)
    dt_bias = per_head(bias_form)
    if dt_bias is not None and not softplus:
        dt_bias = dt_bias.abs() * 0.1  # keep dt' positive without softplus
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=zz, dt_bias=dt_bias, dt_softplus=softplus)


RECURRENCE_ARGS = (
    "state",
    "x",
    "dt",
    "A",
    "B",
    "C",
    "D",
    "z",
    "dt_bias",
    "dt_softplus",
    "state_batch_indices",
    "pad_slot_id",
    "disable_state_update",
    "intermediate_states_buffer",
    "intermediate_state_indices",
    "cache_steps",
    "dst_state_batch_indices",
    "cu_seqlens",
    "num_accepted_tokens",
)


def check(kw, *, page=None, expect_writes=None, expect_ibuf_writes=None, out=None, adapter=None):
    """Run the reference and the recurrence on the same arguments and compare everything observable.
    ``adapter`` holds the normaliser's adapter-only arguments (then the call goes through
    ``normalize_ssu`` + the dispatcher's ``run``, as the adapters do)."""
    exp = ssu_recurrence(**{k: v for k, v in kw.items() if k in RECURRENCE_ARGS}, **(adapter or {}))
    state = kw["state"]
    page_before = None if page is None else page.clone()
    out_before = None if out is None else out.clone()
    if adapter is None:
        y = selective_state_update(**kw, out=out, backend="torch")
    else:
        y = run("ssu", normalize_ssu(**kw, out=out, **adapter), "torch")

    # output rows the call covers
    x = kw["x"]
    assert y.shape == x.shape and y.dtype == x.dtype
    if out is not None:
        assert y.data_ptr() == out.data_ptr(), "the caller's out is returned"
    single_head = state.dim() == 3
    heads_dims = 1 if single_head else 2
    y_rows = y.reshape(-1, *y.shape[-heads_dims:])
    e_rows = exp.y64.reshape(-1, *y.shape[-heads_dims:])
    rows = torch.tensor(sorted(exp.rows), dtype=torch.long)
    rtol, atol = TOL[x.dtype]
    assert len(exp.rows) > 0
    torch.testing.assert_close(y_rows[rows].double(), e_rows[rows], rtol=rtol, atol=atol)
    if out is not None:  # rows no sequence covers are left as the caller had them
        others = torch.ones(y_rows.shape[0], dtype=torch.bool)
        others[rows] = False
        assert torch.equal(y_rows[others], out_before.reshape(y_rows.shape)[others])

    # the pool: written slots close, every other slot bit-identical
    S = state.shape[0]
    untouched = [s for s in range(S) if s not in exp.written]
    if expect_writes is not None:
        assert exp.written == set(expect_writes), f"test setup: recurrence wrote {sorted(exp.written)}"
    if exp.written:
        w = torch.tensor(sorted(exp.written))
        rtol, atol = TOL[state.dtype]
        torch.testing.assert_close(state[w].double(), exp.state[w].double(), rtol=rtol, atol=atol)
    if untouched:
        u = torch.tensor(untouched)
        assert torch.equal(state[u], exp.state[u]), "slots the call does not name must stay bit-identical"
    if page is not None:  # the rest of each page (the conv-state bytes) is untouched
        mask = torch.ones_like(page, dtype=torch.bool)
        inner = state[0].numel()
        mask[1:, 29 : 29 + inner] = False
        assert torch.equal(page[mask], page_before[mask])
        if not exp.written:
            assert torch.equal(page, page_before)

    ibuf = kw.get("intermediate_states_buffer")
    if ibuf is not None:
        if expect_ibuf_writes is not None:
            assert exp.ibuf_written == set(expect_ibuf_writes), f"test setup: wrote {sorted(exp.ibuf_written)}"
        flat_a = ibuf.reshape(-1, *ibuf.shape[-3:])
        flat_e = exp.ibuf.reshape(-1, *ibuf.shape[-3:])
        rtol, atol = TOL[ibuf.dtype]
        for k in range(flat_a.shape[0]):
            if k in exp.ibuf_written:
                torch.testing.assert_close(flat_a[k].double(), flat_e[k].double(), rtol=rtol, atol=atol)
            else:
                assert torch.equal(flat_a[k], flat_e[k]), f"intermediate entry {k} must stay untouched"
    return y, exp


def i32(v):
    return torch.tensor(v, dtype=torch.int32)


def i64(v):
    return torch.tensor(v, dtype=torch.int64)


# ------------------------------------------------------------------------------------ dtypes and shapes


@pytest.mark.parametrize("io_dtype", [pytest.param(d, id=f"io_{DTYPE_ID[d]}") for d in (BF16, F16, F32)])
@pytest.mark.parametrize("state_dtype", [pytest.param(d, id=f"state_{DTYPE_ID[d]}") for d in (F32, BF16, F16)])
def test_dtypes_packed_mtp(state_dtype, io_dtype):
    """Packed MTP (2-D src/dst tables, accepted counts) in every state x io dtype combination."""
    g = _gen(1)
    lens = [3, 2, 3]
    kw = make_inputs(H=4, P=8, N=16, G=2, rows_shape=(sum(lens),), io_dtype=io_dtype, seed=1)
    state, _ = make_pool(24, 4, 8, 16, state_dtype, g)
    src = i32([[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    dst = src + 10
    kw.update(
        state=state,
        state_batch_indices=src,
        dst_state_batch_indices=dst,
        cu_seqlens=i32([0, 3, 5, 8]),
        num_accepted_tokens=i32([2, 1, 3]),
    )
    check(kw, expect_writes={10, 11, 12, 13, 14, 16, 17, 18})


@pytest.mark.parametrize("state_dtype", [pytest.param(d, id=f"state_{DTYPE_ID[d]}") for d in (F32, BF16, F16)])
@pytest.mark.parametrize("io_dtype", [pytest.param(d, id=f"io_{DTYPE_ID[d]}") for d in (BF16, F16, F32)])
def test_dtypes_one_token(state_dtype, io_dtype):
    """The plain decode step: one token per sequence, a flat read table, final write to the read slot."""
    g = _gen(2)
    kw = make_inputs(rows_shape=(4,), io_dtype=io_dtype, seed=2)
    state, _ = make_pool(9, 4, 8, 16, state_dtype, g)
    kw.update(state=state, state_batch_indices=i32([7, 2, 0, 5]))
    check(kw, expect_writes={7, 2, 0, 5})


HPNG = [
    pytest.param(4, 80, 96, 4, id="H4_P80_N96_G4_ratio1"),
    pytest.param(4, 80, 96, 1, id="H4_P80_N96_G1"),
    pytest.param(6, 8, 16, 3, id="H6_G3_ratio2"),
    pytest.param(8, 16, 24, 1, id="H8_G1_ratio8"),
    pytest.param(3, 5, 7, 1, id="H3_P5_N7_odd"),
    pytest.param(1, 16, 8, 1, id="H1_4d_state"),
]


@pytest.mark.parametrize("H,P,N,G", HPNG)
def test_heads_groups_and_odd_sizes(H, P, N, G):
    g = _gen(3)
    lens = [2, 0, 3]
    kw = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(sum(lens),), io_dtype=F32, D_form="full", seed=3)
    state, _ = make_pool(8, H, P, N, F32, g)
    kw.update(
        state=state,
        state_batch_indices=i64([[1, 2, 3], [4, 5, 6], [0, 7, 7]]),
        cu_seqlens=i64([0, 2, 2, 5]),
    )
    check(kw, expect_writes={1, 0})  # final writes to each non-empty sequence's read slot


# ----------------------------------------------------------------------------- tied and untied params

PARAM_FORMS = [
    pytest.param("tied", "tied", "head", "head", id="dt_tied-A_tied-D_head-bias_head"),
    pytest.param("per_head", "head", "tied", "tied", id="dt_perhead-A_head-D_tied-bias_tied"),
    pytest.param("full", "full", "full", "full", id="all_untied"),
    pytest.param("full_bf16", "tied", "bf16", "bf16", id="dt_bf16-D_bf16-bias_bf16"),
    pytest.param("tied", "full", None, None, id="A_untied-no_D-no_bias"),
    pytest.param("full", "head", "head", None, id="dt_untied-A_head"),
]


@pytest.mark.parametrize("dt_form,A_form,D_form,bias_form", PARAM_FORMS)
@pytest.mark.parametrize("softplus", [pytest.param(True, id="softplus"), pytest.param(False, id="no_softplus")])
def test_tied_and_untied_params(dt_form, A_form, D_form, bias_form, softplus):
    g = _gen(4)
    kw = make_inputs(
        H=4, P=6, N=10, G=2, rows_shape=(5,), io_dtype=F32, dt_form=dt_form, A_form=A_form,
        D_form=D_form, bias_form=bias_form, softplus=softplus, seed=4,
    )  # fmt: skip
    state, _ = make_pool(12, 4, 6, 10, F32, g)
    kw.update(state=state, state_batch_indices=i32([[3, 9], [4, 9]]), cu_seqlens=i32([0, 2, 5]))
    check(kw, expect_writes={3, 4})


@pytest.mark.parametrize(
    "A_form,D_form,bias_form,layout",
    [
        pytest.param("full", "full", "full", "one", id="A_PN-D_P-bias_P-one_token"),
        pytest.param("head", "head", "head", "one", id="A_1-D_1-bias_1-one_token"),
        pytest.param("full", "full", None, "packed", id="A_PN-D_P-packed_mtp"),
        pytest.param("tied", None, "full", "dense", id="A_tied-dense"),
    ],
)
def test_single_head_3d_state(A_form, D_form, bias_form, layout):
    """The 3-D state ``[S, P, N]`` with 2-D ``x [R, P]`` (H = 1; Mamba1-style untied ``[P, N]`` A)."""
    g = _gen(5)
    rows_shape = {"one": (3,), "packed": (5,), "dense": (2, 3)}[layout]
    kw = make_inputs(
        H=1, P=12, N=20, G=1, rows_shape=rows_shape, io_dtype=F32, dt_form="full", A_form=A_form,
        D_form=D_form, bias_form=bias_form, single_head=True, seed=5,
    )  # fmt: skip
    state, _ = make_pool(10, 1, 12, 20, F32, g, single_head=True)
    if layout == "one":
        kw.update(state=state, state_batch_indices=i32([4, 1, 8]))
        writes = {4, 1, 8}
    elif layout == "packed":
        kw.update(
            state=state,
            state_batch_indices=i32([[0, 1, 2], [3, 4, 5]]),
            cu_seqlens=i32([0, 3, 5]),
            num_accepted_tokens=i32([1, 2]),
        )
        writes = {0, 1, 2, 3, 4}
    else:
        kw.update(state=state, state_batch_indices=i32([[6, 7, 8], [0, 1, 2]]), dst_state_batch_indices=None)
        writes = {6, 0}
    check(kw, expect_writes=writes)


# ------------------------------------------------------------------------------------------ slot tables


def _table(kind, values):
    """One slot table in a given storage form: values are [nseq, T] (or [R] for flat)."""
    if kind == "flat_i32":
        return i32(values)
    if kind == "flat_i64":
        return i64(values)
    if kind == "2d_i32":
        return i32(values)
    if kind == "2d_i64":
        return i64(values)
    if kind == "2d_noncontig":  # every other column of a wider table
        v = i64(values)
        wide = torch.full((v.shape[0], 2 * v.shape[1]), 999, dtype=torch.int64)
        wide[:, ::2] = v
        t = wide[:, ::2]
        assert not t.is_contiguous()
        return t
    if kind == "2d_transposed":  # column-major storage
        v = i32(values)
        t = v.t().contiguous().t()
        assert t.stride() == (1, v.shape[0])
        return t
    if kind == "flat_strided":
        v = i32(values)
        wide = torch.full((2 * v.shape[0],), 999, dtype=torch.int32)
        wide[::2] = v
        return wide[::2]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [pytest.param(k, id=k) for k in ("flat_i32", "flat_i64", "flat_strided")] + [pytest.param(None, id="no_table")],
)
def test_one_token_flat_tables(kind):
    g = _gen(6)
    kw = make_inputs(rows_shape=(4,), io_dtype=F32, seed=6)
    state, _ = make_pool(10, 4, 8, 16, F32, g)
    kw["state"] = state
    if kind is None:
        writes = {0, 1, 2, 3}
    else:
        kw["state_batch_indices"] = _table(kind, [9, 3, 6, 0])
        writes = {9, 3, 6, 0}
    check(kw, expect_writes=writes)


@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in ("2d_i32", "2d_i64", "2d_noncontig", "2d_transposed")])
@pytest.mark.parametrize("with_dst", [pytest.param(True, id="dst"), pytest.param(False, id="src_only")])
def test_packed_2d_tables(kind, with_dst):
    """2-D ``[nseq, T]`` tables addressed by their two strides, with per-token publishing."""
    g = _gen(7)
    lens = [3, 1, 2]
    kw = make_inputs(rows_shape=(sum(lens),), io_dtype=F32, seed=7)
    state, _ = make_pool(20, 4, 8, 16, F32, g)
    src = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    kw.update(
        state=state,
        state_batch_indices=_table(kind, src),
        cu_seqlens=i32([0, 3, 4, 6]),
        num_accepted_tokens=i32([3, 1, 2]),
    )
    if with_dst:
        kw["dst_state_batch_indices"] = _table(kind, [[r + 10 for r in row] for row in src])
        writes = {10, 11, 12, 13, 16, 17}
    else:
        writes = {0, 1, 2, 3, 6, 7}
    check(kw, expect_writes=writes)


def test_flat_table_one_sequence_mtp():
    """vLLM's MTP6 form: flat ``[rows]`` tables, one sequence per call, entry ``b + t`` for position t."""
    g = _gen(8)
    rows = 6
    kw = make_inputs(rows_shape=(rows,), io_dtype=BF16, seed=8)
    state, _ = make_pool(16, 4, 8, 16, F32, g)
    kw.update(
        state=state,
        state_batch_indices=i32(list(range(rows))),
        dst_state_batch_indices=i32(list(range(8, 8 + rows))),
        num_accepted_tokens=i32([4]),  # read slot: entry 0 + 3 = slot 3
        cu_seqlens=i32([0, rows]),
        pad_slot_id=0,
    )
    _, exp = check(kw, expect_writes=set(range(8, 8 + rows)))
    assert exp.written


def test_flat_table_equals_2d_table_for_one_sequence():
    """With one sequence per call the flat and the 2-D table name the same entries: identical results."""
    g = _gen(9)
    rows = 5
    kw = make_inputs(rows_shape=(rows,), io_dtype=F32, seed=9)
    state, _ = make_pool(12, 4, 8, 16, F32, g)
    flat = dict(kw, state=state.clone(), state_batch_indices=i32([0, 1, 2, 3, 4]), cu_seqlens=i32([0, rows]))
    flat["num_accepted_tokens"] = i32([2])
    two_d = dict(flat, state=state.clone(), state_batch_indices=i32([[0, 1, 2, 3, 4]]))
    y1 = selective_state_update(**flat, backend="torch")
    y2 = selective_state_update(**two_d, backend="torch")
    assert torch.equal(y1, y2) and torch.equal(flat["state"], two_d["state"])
    check(dict(flat, state=state.clone()))


# ---------------------------------------------------------------------------------- sentinels and MTP


@pytest.mark.parametrize("pad", [pytest.param(-1, id="pad_minus1"), pytest.param(0, id="pad_0")])
@pytest.mark.parametrize(
    "mode", [pytest.param(m, id=m) for m in ("one_token", "packed_final", "packed_dst", "packed_acc_src")]
)
def test_pad_sentinel(pad, mode):
    """A sentinel read slot reads a zero state and writes nothing (output still computed); a sentinel
    destination is skipped."""
    g = _gen(10)
    state, _ = make_pool(12, 4, 8, 16, BF16, g)
    if mode == "one_token":
        kw = make_inputs(rows_shape=(4,), seed=10)
        kw.update(state=state, state_batch_indices=i32([5, pad, 7, pad]), pad_slot_id=pad)
        writes = {5, 7}
    else:
        lens = [2, 3, 2]
        kw = make_inputs(rows_shape=(sum(lens),), seed=10)
        kw.update(state=state, cu_seqlens=i32([0, 2, 5, 7]), pad_slot_id=pad)
        src = i64([[pad, 1, 2], [3, 4, 5], [6, 7, 8]])  # sequence 0 reads the sentinel
        kw["state_batch_indices"] = src
        if mode == "packed_final":
            writes = {3, 6}
        elif mode == "packed_dst":
            kw["dst_state_batch_indices"] = i64([[9, 10, 11], [pad, 10, pad], [11, pad, 1]])
            writes = {10, 11}
        else:  # accepted counts, no dst: publish into the read table; sentinel entries of src are skipped
            src[1, 1] = pad
            kw["num_accepted_tokens"] = i32([1, 3, 2])
            writes = {3, 5, 6, 7}
            kw["state_batch_indices"] = src
    check(kw, expect_writes=writes)


def test_pad_rows_output_from_zero_state():
    """The output of a sentinel row is the recurrence from a zero state, not garbage from a slot."""
    g = _gen(11)
    kw = make_inputs(rows_shape=(2,), io_dtype=F32, D_form=None, z=False, seed=11)
    state, _ = make_pool(4, 4, 8, 16, F32, g)
    kw.update(state=state, state_batch_indices=i32([-1, -1]))
    y, _ = check(kw, expect_writes=set())
    # from zero: s = dt' * x (x) B, y = s . C
    assert y.abs().max() > 0


@pytest.mark.parametrize(
    "acc",
    [
        pytest.param([0, 0], id="acc_0"),
        pytest.param([1, 1], id="acc_1"),
        pytest.param([4, 4], id="acc_T"),
        pytest.param([0, 4], id="acc_mixed_0_T"),
        pytest.param([3, 2], id="acc_mid"),
    ],
)
@pytest.mark.parametrize("layout", [pytest.param("packed", id="packed"), pytest.param("dense", id="dense4d")])
def test_num_accepted_tokens(acc, layout):
    """The read slot is ``src[b, max(acc - 1, 0)]``; every token publishes to ``dst[b, t]``."""
    g = _gen(12)
    T = 4
    rows_shape = (2 * T,) if layout == "packed" else (2, T)
    kw = make_inputs(rows_shape=rows_shape, io_dtype=F16, seed=12)
    state, _ = make_pool(20, 4, 8, 16, F32, g)
    kw.update(
        state=state,
        state_batch_indices=i32([[0, 1, 2, 3], [4, 5, 6, 7]]),
        dst_state_batch_indices=i32([[10, 11, 12, 13], [14, 15, 16, 17]]),
        num_accepted_tokens=i32(acc),
    )
    if layout == "packed":
        kw["cu_seqlens"] = i32([0, T, 2 * T])
    check(kw, expect_writes=set(range(10, 18)))


def test_num_accepted_tokens_changes_the_read_slot():
    """Guard against a test that cannot fail: different accepted counts give different outputs."""
    g = _gen(13)
    kw = make_inputs(rows_shape=(3,), io_dtype=F32, seed=13)
    state, _ = make_pool(8, 4, 8, 16, F32, g)
    base = dict(kw, state_batch_indices=i32([[0, 1, 2]]), cu_seqlens=i32([0, 3]))
    ys = []
    for a in (1, 2, 3):
        ys.append(selective_state_update(**base, state=state.clone(), num_accepted_tokens=i32([a]), backend="torch"))
    assert not torch.equal(ys[0], ys[1]) and not torch.equal(ys[1], ys[2])


@pytest.mark.parametrize(
    "lens",
    [
        pytest.param([0, 3, 0, 2], id="zero_len_inside"),
        pytest.param([0, 0], id="all_empty"),
        pytest.param([3, 0], id="zero_len_last"),
    ],
)
@pytest.mark.parametrize("mode", [pytest.param("final", id="final"), pytest.param("per_token", id="per_token")])
def test_zero_length_sequences(lens, mode):
    """An empty sequence computes nothing and writes nothing (not even its final state)."""
    g = _gen(14)
    nseq, T = len(lens), 3
    R = max(sum(lens), 1)
    kw = make_inputs(rows_shape=(R,), io_dtype=F32, seed=14)
    state, _ = make_pool(32, 4, 8, 16, F32, g)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    src = i32([[b * T + t for t in range(T)] for b in range(nseq)])
    kw.update(state=state, state_batch_indices=src, cu_seqlens=i32(cu))
    if mode == "per_token":
        kw["dst_state_batch_indices"] = src + 16
        kw["num_accepted_tokens"] = i32([1] * nseq)
    exp_writes = set()
    for b, n in enumerate(lens):
        if mode == "final" and n:
            exp_writes.add(b * T)
        if mode == "per_token":
            exp_writes |= {16 + b * T + t for t in range(n)}
    if sum(lens) == 0:
        out = torch.full(kw["x"].shape, 7.0, dtype=kw["x"].dtype)
        before = state.clone()
        y = selective_state_update(**kw, out=out, backend="torch")
        assert torch.equal(state, before) and torch.equal(y, torch.full_like(y, 7.0))
        return
    check(kw, expect_writes=exp_writes)


def test_packed_rows_past_the_last_sequence_untouched():
    """Rows past ``cu_seqlens[-1]`` belong to no sequence: a caller's ``out`` keeps them."""
    g = _gen(15)
    kw = make_inputs(rows_shape=(6,), io_dtype=BF16, seed=15)
    state, _ = make_pool(8, 4, 8, 16, BF16, g)
    kw.update(state=state, state_batch_indices=i32([[0, 1], [2, 3]]), cu_seqlens=i32([0, 2, 4]))
    out = torch.full(kw["x"].shape, 3.0, dtype=BF16)
    check(kw, out=out, expect_writes={0, 2})


# ------------------------------------------------------------------------------------------- dense 4-D


@pytest.mark.parametrize(
    "tables",
    [
        pytest.param("none", id="no_table"),
        pytest.param("src", id="src_final"),
        pytest.param("src_dst", id="src_dst_per_token"),
        pytest.param("src_acc", id="src_acc_per_token"),
    ],
)
def test_dense_4d(tables):
    g = _gen(16)
    bs, T = 3, 2
    kw = make_inputs(H=4, P=8, N=16, G=4, rows_shape=(bs, T), io_dtype=BF16, dt_form="per_head", seed=16)
    state, _ = make_pool(16, 4, 8, 16, F16, g)
    kw["state"] = state
    src = i32([[1, 2], [3, 4], [5, 6]])
    if tables == "none":
        writes = {0, 1, 2}
    elif tables == "src":
        kw["state_batch_indices"] = src
        writes = {1, 3, 5}
    elif tables == "src_dst":
        kw["state_batch_indices"] = src
        kw["dst_state_batch_indices"] = src + 8
        writes = {9, 10, 11, 12, 13, 14}
    else:
        kw["state_batch_indices"] = src
        kw["num_accepted_tokens"] = i32([2, 1, 0])
        writes = {1, 2, 3, 4, 5, 6}
    check(kw, expect_writes=writes)


def test_dense_4d_noncontiguous_out():
    """A dense ``out`` that cannot be flattened to rows is still filled (through scratch)."""
    g = _gen(17)
    kw = make_inputs(H=4, P=8, N=16, G=2, rows_shape=(2, 3), io_dtype=F32, seed=17)
    state, _ = make_pool(4, 4, 8, 16, F32, g)
    kw["state"] = state
    out = torch.zeros(3, 2, 4, 8).transpose(0, 1)  # [2, 3, 4, 8] with swapped leading strides
    assert not out.is_contiguous()
    check(kw, out=out, expect_writes={0, 1})


# -------------------------------------------------------------------------------- intermediate buffer


@pytest.mark.parametrize("form", [pytest.param("5d", id="buf5d"), pytest.param("flat4d", id="buf_flat4d")])
@pytest.mark.parametrize(
    "indices", [pytest.param(True, id="with_indices"), pytest.param(False, id="idx_from_read_slot")]
)
@pytest.mark.parametrize("disable", [pytest.param(True, id="disable_update"), pytest.param(False, id="update_enabled")])
def test_intermediate_buffer_dense(form, indices, disable):
    """SGLang's spec verify: the state after token t goes to ``buf[idx, t]``; the pool is never written."""
    g = _gen(18)
    bs, T, steps = 3, 3, 4
    kw = make_inputs(H=4, P=8, N=16, G=2, rows_shape=(bs, T), io_dtype=BF16, seed=18)
    state, _ = make_pool(8, 4, 8, 16, F32, g)
    entries = 6
    buf = _randn((entries, steps, 4, 8, 16), F32, g)
    if form == "flat4d":
        buf = buf.view(entries * steps, 4, 8, 16)
        kw["cache_steps"] = steps
    kw.update(
        state=state,
        state_batch_indices=i32([[2, 0, 0], [-1, 0, 0], [5, 0, 0]]),  # sequence 1 is a pad row
        intermediate_states_buffer=buf,
        disable_state_update=disable,
    )
    if indices:
        kw["intermediate_state_indices"] = i64([4, 1, 0])
        ib = {4 * steps + t for t in range(T)} | {0 * steps + t for t in range(T)}
    else:
        ib = {2 * steps + t for t in range(T)} | {5 * steps + t for t in range(T)}
    check(kw, expect_writes=set(), expect_ibuf_writes=ib)


def test_intermediate_buffer_packed_no_table():
    """Packed rows, no read table: idx(b) = b (the read slot is b)."""
    g = _gen(19)
    lens = [2, 3]
    kw = make_inputs(rows_shape=(5,), io_dtype=F16, seed=19)
    state, _ = make_pool(4, 4, 8, 16, BF16, g)
    buf = _randn((3, 3, 4, 8, 16), BF16, g)
    kw.update(state=state, intermediate_states_buffer=buf, cu_seqlens=i32([0, 2, 5]))
    check(kw, expect_writes=set(), expect_ibuf_writes={0, 1, 3, 4, 5})
    assert lens


# ----------------------------------------------------------------------------- strided pools and rows


@pytest.mark.parametrize("state_dtype", [pytest.param(d, id=f"state_{DTYPE_ID[d]}") for d in (F32, BF16)])
@pytest.mark.parametrize(
    "mode",
    [pytest.param("one_token", id="one_token"), pytest.param("mtp", id="mtp"), pytest.param("off", id="disabled")],
)
def test_paged_pool_with_storage_offset(state_dtype, mode):
    """The state is a strided view of a page buffer with a storage offset; conv bytes stay untouched."""
    g = _gen(20)
    state, page = make_pool(10, 4, 8, 16, state_dtype, g, paged=True)
    if mode == "one_token":
        kw = make_inputs(rows_shape=(3,), seed=20)
        kw.update(state=state, state_batch_indices=i32([8, 0, 3]))
        writes = {8, 0, 3}
    else:
        kw = make_inputs(rows_shape=(4,), seed=20)
        kw.update(
            state=state,
            state_batch_indices=i32([[1, 2], [4, 5]]),
            dst_state_batch_indices=i32([[6, 7], [8, 9]]),
            cu_seqlens=i32([0, 2, 4]),
            num_accepted_tokens=i32([2, 1]),
            disable_state_update=mode == "off",
        )
        writes = {6, 7, 8, 9} if mode == "mtp" else set()
    check(kw, page=page, expect_writes=writes)


@pytest.mark.parametrize("layout", [pytest.param("one", id="one_token"), pytest.param("packed", id="packed")])
def test_row_views_of_one_buffer(layout):
    """x, B, C, z as strided row views of one conv-output buffer (row stride H*P + 2*G*N + ...)."""
    g = _gen(21)
    R = 5
    kw = make_inputs(H=4, P=8, N=16, G=2, rows_shape=(R,), io_dtype=BF16, rowview=True, seed=21)
    state, _ = make_pool(10, 4, 8, 16, F32, g)
    kw["state"] = state
    if layout == "one":
        kw["state_batch_indices"] = i32([0, 2, 4, 6, 8])
        writes = {0, 2, 4, 6, 8}
    else:
        kw.update(
            state_batch_indices=i32([[1, 2, 3], [4, 5, 6]]),
            dst_state_batch_indices=i32([[1, 2, 3], [4, 5, 6]]),
            cu_seqlens=i32([0, 3, 5]),
            num_accepted_tokens=i32([1, 1]),
        )
        writes = {1, 2, 3, 4, 5}
    check(kw, expect_writes=writes)


# ----------------------------------------------------------------------------- state update and out


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("one_token", id="one_token"),
        pytest.param("packed_dst", id="packed_dst"),
        pytest.param("dense", id="dense4d"),
    ],
)
def test_disable_state_update_leaves_pool_bit_identical(mode):
    g = _gen(22)
    state, page = make_pool(10, 4, 8, 16, BF16, g, paged=True)
    if mode == "one_token":
        kw = make_inputs(rows_shape=(3,), seed=22)
        kw["state_batch_indices"] = i32([1, 2, 3])
    elif mode == "packed_dst":
        kw = make_inputs(rows_shape=(4,), seed=22)
        kw.update(
            state_batch_indices=i32([[0, 1], [2, 3]]),
            dst_state_batch_indices=i32([[4, 5], [6, 7]]),
            cu_seqlens=i32([0, 2, 4]),
            num_accepted_tokens=i32([2, 2]),
        )
    else:
        kw = make_inputs(rows_shape=(2, 2), seed=22)
    before = page.clone()
    kw.update(state=state, disable_state_update=True)
    y, _ = check(kw, page=page, expect_writes=set())
    assert torch.equal(page, before)
    # and the same call with updates enabled does write (the flag is what kept the pool intact)
    kw["disable_state_update"] = False
    selective_state_update(**kw, backend="torch")
    assert not torch.equal(page, before)


@pytest.mark.parametrize("layout", [pytest.param("one", id="one_token"), pytest.param("dense", id="dense4d")])
def test_out_given_vs_returned(layout):
    g = _gen(23)
    rows_shape = (3,) if layout == "one" else (2, 2)
    kw = make_inputs(rows_shape=rows_shape, io_dtype=F16, seed=23)
    state, _ = make_pool(6, 4, 8, 16, F32, g)
    kw["state"] = state
    y_new = selective_state_update(**dict(kw, state=state.clone()), backend="torch")
    out = torch.empty_like(kw["x"])
    y_out, _ = check(dict(kw, state=state.clone()), out=out)
    assert y_out is out
    assert torch.equal(y_new, out)


def test_untouched_slots_across_a_large_pool():
    """A pool much bigger than the call: only the named slots change, bit for bit."""
    g = _gen(24)
    kw = make_inputs(rows_shape=(3,), io_dtype=BF16, seed=24)
    state, _ = make_pool(64, 4, 8, 16, BF16, g)
    before = state.clone()
    kw.update(state=state, state_batch_indices=i64([63, 0, 31]))
    check(kw, expect_writes={63, 0, 31})
    changed = [s for s in range(64) if not torch.equal(state[s], before[s])]
    assert changed == [0, 31, 63]


# ------------------------------------------------------------------------------- adapter-only rules


def _parent_case(form):
    g = _gen(30)
    bs, T, steps = 2, 4, 4
    kw = make_inputs(H=4, P=8, N=16, G=2, rows_shape=(bs, T), io_dtype=F32, seed=30)
    state, _ = make_pool(6, 4, 8, 16, F32, g)
    buf = _randn((5, steps, 4, 8, 16), F32, g)
    if form == "flat4d":
        buf = buf.view(5 * steps, 4, 8, 16)
        kw["cache_steps"] = steps
    kw.update(
        state=state,
        state_batch_indices=i32([[3, 0, 0, 0], [1, 0, 0, 0]]),
        intermediate_states_buffer=buf,
        intermediate_state_indices=i32([4, 2]),
        disable_state_update=True,
    )
    return kw


@pytest.mark.parametrize("form", [pytest.param("5d", id="buf5d"), pytest.param("flat4d", id="buf_flat4d")])
@pytest.mark.parametrize(
    "parent",
    [
        pytest.param([[-1, 0, 1, 1], [-1, 0, 0, 2]], id="tree"),
        pytest.param([[-1, -1, -1, -1], [-1, -1, -1, -1]], id="chain_no_reload"),
        pytest.param([[-1, 0, 0, 0], [-1, 0, 1, 2]], id="star_and_chain"),
    ],
)
def test_eagle_tree_parents(form, parent):
    """SGLang's ``retrieve_parent_token``: before token t > 0 the state is reloaded from ``buf[idx,
    parent[t]]`` (the state this call wrote after token parent[t])."""
    kw = _parent_case(form)
    ib = {4 * 4 + t for t in range(4)} | {2 * 4 + t for t in range(4)}
    check(kw, adapter=dict(retrieve_parent_token=i64(parent)), expect_writes=set(), expect_ibuf_writes=ib)


def test_eagle_tree_parents_change_the_result():
    """Guard: a tree differs from the chain (so test_eagle_tree_parents can fail)."""
    outs = []
    for parent in ([[-1, -1, -1, -1]] * 2, [[-1, 0, 0, 0]] * 2):
        kw = _parent_case("5d")
        outs.append(run("ssu", normalize_ssu(**kw, retrieve_parent_token=i64(parent)), "torch"))
    assert not torch.allclose(outs[0], outs[1])


@pytest.mark.parametrize("pad", [pytest.param(-1, id="pad_minus1"), pytest.param(0, id="pad_0")])
def test_final_write_to_dst(pad):
    """vLLM's one-final-write rule: the final state goes to ``dst(b, 0)`` (sentinel skipped)."""
    g = _gen(31)
    kw = make_inputs(rows_shape=(5,), io_dtype=BF16, seed=31)
    state, _ = make_pool(12, 4, 8, 16, F32, g)
    kw.update(
        state=state,
        state_batch_indices=i32([[1, 2, 3], [4, 5, 6], [7, 8, 9]]),
        dst_state_batch_indices=i32([[10, 2, 3], [pad, 5, 6], [11, 8, 9]]),
        cu_seqlens=i32([0, 3, 5, 5]),
        pad_slot_id=pad,
    )
    check(kw, adapter=dict(final_write_to_dst=True), expect_writes={10})


def test_accepted_counts_without_dst_write_final_only():
    """FlashInfer's rule (``accepted_writes_per_token=False``): accepted counts without a destination table
    write only the final state, back to the read slot."""
    g = _gen(32)
    kw = make_inputs(rows_shape=(6,), io_dtype=F16, seed=32)
    state, _ = make_pool(8, 4, 8, 16, BF16, g)
    kw.update(
        state=state,
        state_batch_indices=i32([[0, 1, 2], [3, 4, 5]]),
        cu_seqlens=i32([0, 3, 6]),
        num_accepted_tokens=i32([2, 3]),
    )
    check(kw, adapter=dict(accepted_writes_per_token=False), expect_writes={1, 5})


def test_pad_slot_without_table():
    """Without a table sequence b uses slot b, and the sentinel rule still applies to that slot (the
    ``_ssu_call`` docstring, as FlashInfer's kernels do): with ``pad_slot_id=0`` sequence 0 reads zeros
    and writes nothing."""
    g = _gen(33)
    kw = make_inputs(rows_shape=(3,), io_dtype=F32, seed=33)
    state, _ = make_pool(4, 4, 8, 16, F32, g)
    kw.update(state=state, pad_slot_id=0)
    check(kw, expect_writes={1, 2})


# ------------------------------------------------------------------------------ randomised combinations


def _random_case(seed):
    """One random combination of every independent choice (layout, sizes, dtypes, parameter forms, table
    forms, sentinel, accepted counts, write mode, pool and row layout)."""
    r = torch.Generator().manual_seed(1000 + seed)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=r))]

    H, G = pick([(4, 4), (4, 1), (6, 2), (8, 2), (2, 1)])
    P, N = pick([(8, 16), (5, 7), (16, 8), (12, 20)])
    layout = pick(["packed", "packed", "dense", "one"])
    nseq = pick([1, 2, 3])
    T = pick([1, 2, 3, 4])
    if layout == "packed":
        lens = [int(torch.randint(0, T + 1, (1,), generator=r)) for _ in range(nseq)]
        lens[0] = max(lens[0], 1)  # at least one token in the call
        rows_shape = (max(sum(lens), 1),)
    elif layout == "dense":
        lens = [T] * nseq
        rows_shape = (nseq, T)
    else:
        lens, T = [1] * nseq, 1
        rows_shape = (nseq,)
    io = pick([F32, BF16, F16])
    sd = pick([F32, BF16, F16])
    kw = make_inputs(
        H=H, P=P, N=N, G=G, rows_shape=rows_shape, io_dtype=io, seed=seed,
        dt_form=pick(["tied", "per_head", "full"]), A_form=pick(["head", "tied", "full"]),
        D_form=pick([None, "head", "tied", "full", "bf16"]), bias_form=pick([None, "head", "tied", "full"]),
        z=pick([True, False]), softplus=pick([True, False]), rowview=pick([False, True]),
    )  # fmt: skip
    pad = pick([-1, 0])
    S = 2 * nseq * T + 2
    free = [s for s in range(S) if s != pad]
    perm = torch.randperm(len(free), generator=r).tolist()
    slots = [free[i] for i in perm]
    src = torch.tensor(slots[: nseq * T], dtype=torch.int64).view(nseq, T)
    dst = torch.tensor(slots[nseq * T : 2 * nseq * T], dtype=torch.int64).view(nseq, T)
    if nseq > 1 and pick([True, False]):
        src[int(torch.randint(nseq, (1,), generator=r)), :] = pad
    if pick([True, False]):
        dst[0, -1] = pad
    state, page = make_pool(S, H, P, N, sd, _gen(seed), paged=pick([False, True]))
    kw["state"] = state
    kw["pad_slot_id"] = pad
    if layout == "packed":
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        kw["cu_seqlens"] = torch.tensor(cu, dtype=pick([torch.int32, torch.int64]))
    mode = pick(["final", "per_token_dst", "accepted", "disable", "ibuf"] if layout != "one" else ["final", "disable"])
    idt = pick([torch.int32, torch.int64])
    if layout == "one" and pick([True, False]):
        kw["state_batch_indices"] = src[:, 0].contiguous().to(idt)  # flat one-token table
    else:
        kw["state_batch_indices"] = src.to(idt)
    if mode == "per_token_dst":
        kw["dst_state_batch_indices"] = dst.to(idt)
    if mode in ("per_token_dst", "accepted") and layout != "one":
        kw["num_accepted_tokens"] = torch.randint(0, T + 1, (nseq,), generator=r).to(idt)
    if mode == "disable":
        kw["disable_state_update"] = True
    if mode == "ibuf":
        kw["intermediate_states_buffer"] = _randn((nseq + 1, T, H, P, N), sd, _gen(seed + 1))
        kw["intermediate_state_indices"] = torch.randperm(nseq + 1, generator=r)[:nseq].to(idt)
        kw["disable_state_update"] = pick([True, False])
    return kw, page


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"combo{s}") for s in range(64)])
def test_random_combinations(seed):
    kw, page = _random_case(seed)
    check(kw, page=page)


@pytest.mark.parametrize(
    "io_dtype", [pytest.param(torch.bfloat16, id="bf16-x"), pytest.param(torch.float16, id="fp16-x")]
)
def test_fp32_bc_beside_a_two_byte_x(io_dtype):
    """B/C in fp32 beside a 2-byte x (the engines' ops read them natively): the reference reads them as given, so
    the result is the float64 recurrence's with the fp32 B/C, not with B/C rounded to x's dtype."""
    from mate.mamba import selective_state_update
    from mate.mamba.testing import step

    S, H, P, N, G, b = 4, 4, 8, 16, 2, 2
    g = torch.Generator().manual_seed(11)
    state = torch.randn(S, H, P, N, generator=g)
    x = torch.randn(b, H, P, generator=g).to(io_dtype)
    dt = torch.rand(b, H, P, generator=g) * 0.2
    A = -torch.rand(H, generator=g) - 0.3
    B, C = torch.randn(b, G, N, generator=g), torch.randn(b, G, N, generator=g)
    slots = torch.tensor([1, 3], dtype=torch.int32)
    want_s, want_y = [], []
    for i, slot in enumerate(slots.tolist()):
        s, y = step(state[slot], x[i], dt[i], A.view(H, 1, 1).expand(H, P, N), B[i], C[i])
        want_s.append(s)
        want_y.append(y)
    y = selective_state_update(state, x, dt, A, B, C, None, state_batch_indices=slots, backend="torch")
    assert y.dtype == io_dtype
    torch.testing.assert_close(y.double(), torch.stack(want_y), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(state[slots.long()].double(), torch.stack(want_s), rtol=1e-5, atol=1e-5)
