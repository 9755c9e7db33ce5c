"""The TileLang SSU launcher's plan (kernel key + launch arguments) on CPU tensors: no GPU needed.

``mate.mamba._tilelang.ssu_plan.plan`` turns a normalised call into the kernel spec and the positional arguments of one
launch. These tests pin the dispatch rule (one-token vs packed), the write-mode and optional-input encoding,
the alignment detection that picks vector or scalar state accesses, and the NotImplementedError cases.
"""

from __future__ import annotations

import pytest
import torch
from mate.mamba import settings
from mate.mamba._contract.dtypes import DTYPE_NAMES, QUANT_STATE_DTYPES, STATE_FORMATS
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._platform.device import PLANNING_DEFAULT, pdl_for_capability
from mate.mamba._tilelang import ssu_plan as tl_ssu
from mate_kernels import ssu as kssu

BF16, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
H, P, N, G = 8, 64, 128, 2

# argument positions shared by both kernels
A_FLAGS_ONE, A_MODE_ONE = 19, 20
A_FLAGS_PACKED, A_MODE_PACKED = 24, 25


def inputs(rows, *, state_dtype=BF16, slots=32, tied=True, pool=None):
    g = torch.Generator().manual_seed(0)
    state = pool if pool is not None else torch.randn(slots, H, P, N, generator=g).to(state_dtype)
    x = torch.randn(rows, H, P, generator=g).to(BF16)
    B = torch.randn(rows, G, N, generator=g).to(BF16)
    C = torch.randn(rows, G, N, generator=g).to(BF16)
    if tied:
        dt = torch.rand(rows, H, generator=g).unsqueeze(-1).expand(rows, H, P)
        A = -torch.rand(H, generator=g)
    else:
        dt = torch.rand(rows, H, P, generator=g)
        A = -torch.rand(H, P, N, generator=g)
    return state, x, dt, A, B, C


def plan_of(*args, **kw):
    return tl_ssu.plan(normalize_ssu(*args, **kw))


def test_one_token_decode_plan():
    state, x, dt, A, B, C = inputs(4)
    key, args = plan_of(
        state, x, dt, A, B, C, torch.rand(H), dt_bias=torch.rand(H), dt_softplus=True,
        state_batch_indices=torch.tensor([3, 1, 7, 9], dtype=I32),
    )  # fmt: skip
    assert key.one_token is True and key.tied is True and key.vector_state and key.vector_io
    assert len(args) == 21
    flags = args[A_FLAGS_ONE]
    assert flags == kssu.FLAG_D | kssu.FLAG_DT_BIAS | kssu.FLAG_SOFTPLUS | kssu.FLAG_SRC
    assert args[A_MODE_ONE] == kssu.MODE_FINAL


def test_mtp_plan_is_packed_per_token():
    state, x, dt, A, B, C = inputs(6)
    src = torch.arange(6, dtype=I32).view(2, 3)
    key, args = plan_of(
        state, x, dt, A, B, C, None, state_batch_indices=src, dst_state_batch_indices=src + 10,
        cu_seqlens=torch.tensor([0, 3, 6], dtype=I32), num_accepted_tokens=torch.tensor([1, 3], dtype=I32),
    )  # fmt: skip
    assert key.one_token is False and len(args) == 27
    flags = args[A_FLAGS_PACKED]
    for bit in (kssu.FLAG_SRC, kssu.FLAG_DST, kssu.FLAG_CU, kssu.FLAG_ACC):
        assert flags & bit
    assert not flags & (kssu.FLAG_D | kssu.FLAG_Z | kssu.FLAG_PARENT | kssu.FLAG_IIDX)
    assert args[A_MODE_PACKED] == kssu.MODE_PER_TOKEN
    assert args[19:21] == (3, 1) and args[21:23] == (3, 1)  # (stride_b, stride_t) of both 2-D tables


def test_write_modes():
    state, x, dt, A, B, C = inputs(2)
    _, args = plan_of(state, x, dt, A, B, C, None, disable_state_update=True)
    assert args[A_MODE_ONE] == kssu.MODE_NONE
    dense = inputs(2 * 3)
    x4 = dense[1].view(2, 3, H, P)
    key, args = plan_of(
        dense[0], x4, dense[2].reshape(2, 3, H, P), dense[3], dense[4].view(2, 3, G, N), dense[5].view(2, 3, G, N),
        None, disable_state_update=True, intermediate_states_buffer=torch.zeros(4, 3, H, P, N, dtype=BF16),
        state_batch_indices=torch.tensor([0, 1], dtype=I32),
    )  # fmt: skip
    assert key.one_token is False and args[A_MODE_PACKED] == kssu.MODE_INTERMEDIATE and args[-1] == 3


def test_untied_key():
    state, x, dt, A, B, C = inputs(2, tied=False)
    key, _ = plan_of(state, x, dt, A, B, C, None)
    assert key.tied is False


@pytest.mark.parametrize(("offset", "vector"), [(32, True), (29, False)])
def test_pool_alignment_picks_vector_or_scalar_accesses(offset, vector):
    inner = H * P * N
    page = inner + 64
    buf = torch.zeros(5, page, dtype=BF16)
    pool = buf[:, offset : offset + inner].view(5, H, P, N)
    state, x, dt, A, B, C = inputs(2, pool=pool)
    key, _ = plan_of(state, x, dt, A, B, C, None)
    assert key.vector_state is vector


def test_mixed_metadata_dtypes_are_widened():
    """int32 and int64 metadata in one call (SGLang's EAGLE verify mixes them): the kernel reads one dtype, so the
    plan widens every metadata table to int64 (the values are kept)."""
    state, x, dt, A, B, C = inputs(4)
    acc = torch.tensor([1, 2], dtype=I64)
    key, args = plan_of(
        state, x, dt, A, B, C, None, state_batch_indices=torch.arange(4, dtype=I32).view(2, 2),
        cu_seqlens=torch.tensor([0, 2, 4], dtype=I32), num_accepted_tokens=acc,
    )  # fmt: skip
    assert key.meta_dtype == "int64"
    assert args[12].dtype == args[13].dtype == I64 and args[12].tolist() == [0, 2, 4] and torch.equal(args[13], acc)


def test_too_many_sequences_raise():
    rows = tl_ssu.MAX_SEQUENCES + 1
    state = torch.zeros(2, 1, 8, 16)
    x = torch.zeros(rows, 1, 8)
    B = torch.zeros(rows, 1, 16)
    with pytest.raises(NotImplementedError, match="sequences"):
        pads = torch.full((rows,), -1, dtype=torch.int32)  # (without a table each sequence needs its own slot)
        tl_ssu.plan(
            normalize_ssu(
                state, x, torch.zeros(rows, 1, 8), -torch.ones(1), B, B.clone(), None, state_batch_indices=pads
            )
        )


def test_nothing_to_launch():
    state, x, dt, A, B, C = inputs(0)
    assert plan_of(state, x, dt, A, B, C, None) is None


def test_argument_count_matches_the_kernel_signature():
    pytest.importorskip("tilelang")
    state, x, dt, A, B, C = inputs(4)
    for kw in ({}, {"cu_seqlens": torch.tensor([0, 2, 4], dtype=I32)}):
        key, args = plan_of(state, x, dt, A, B, C, None, **kw)
        assert len(key.build().params) == len(args)


# ---- the planner's rules: tuning table, small grid, PDL, spec identity


@pytest.mark.parametrize(
    ("state_dtype", "rows", "packed", "expect"),
    [
        pytest.param(BF16, 512, False, (4, True, 8), id="bf16-one-token-full-grid"),
        pytest.param(BF16, 1, False, (4, False, 0), id="bf16-one-token-small-grid"),
        pytest.param(BF16, 4, True, (2, True, 8), id="bf16-packed"),
        pytest.param(F32, 1, False, (4, False, 0), id="fp32-one-token"),
        pytest.param(F32, 4, True, (4, False, 6), id="fp32-packed"),
    ],
)
def test_tuning_table(state_dtype, rows, packed, expect):
    """The spec carries the tuning the table gives for (state width, kernel); the chunk count shapes the tiling.
    On the CPU the plan is the H200's (132 SMs): batch 1 at 8 heads is a small grid, 512 x 8 heads is not."""
    state, x, dt, A, B, C = inputs(rows, state_dtype=state_dtype, slots=rows + 1)
    kw = {"cu_seqlens": torch.tensor([0, rows // 2, rows], dtype=I32)} if packed else {}
    spec, _ = plan_of(state, x, dt, A, B, C, None, **kw)
    per_thread, pack_early, min_blocks = expect
    assert (spec.pack_early, spec.min_blocks) == (pack_early, min_blocks)
    assert spec.tiling == kssu.choose_tiling(P, N, spec.state_dtype, per_thread)


def test_small_grid_needs_full_chunks():
    """At P 80 the tiling holds two chunks per thread: the capped kernel stays (measured faster there)."""
    hw = PLANNING_DEFAULT
    assert tl_ssu.small_grid(1, 128, 64, 128, BF16, hw)
    assert not tl_ssu.small_grid(1, 128, 80, 128, BF16, hw)
    assert not tl_ssu.small_grid(1, 128, 64, 128, F32, hw)
    assert not tl_ssu.small_grid(1024, 128, 64, 128, BF16, hw)


@pytest.mark.parametrize("dtype", [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")])
def test_one_byte_states_stage_large_grids(dtype):
    """int8 / fp8 one-token calls: the staged design above 8 CTAs per SM (its tiling: one CTA per head at P 64),
    the register design at or below; never staged without 16-byte pool accesses, nor in the packed kernel."""
    hw = PLANNING_DEFAULT  # 132 SMs: 1056 CTAs are 8 per SM
    assert tl_ssu.small_grid(8, 128, 64, 128, dtype, hw)
    assert not tl_ssu.small_grid(9, 128, 64, 128, dtype, hw)
    for rows, staged in ((132, False), (133, True)):  # H 8: one CTA per (sequence, head)
        state, x, dt, A, B, C = inputs(rows, state_dtype=dtype, slots=rows + 1)
        spec, _ = plan_of(state, x, dt, A, B, C, None, state_scale=torch.ones(state.shape[:3]))
        assert spec.staged is staged
        assert spec.tiling == kssu.choose_tiling(P, N, spec.state_dtype, 4 if staged else 2)
    state, x, dt, A, B, C = inputs(200, state_dtype=dtype, slots=201)
    odd = torch.zeros(state.numel() + 1, dtype=dtype)[1:].view(state.shape)  # off 16-byte alignment
    spec, _ = plan_of(odd, x, dt, A, B, C, None, state_scale=torch.ones(state.shape[:3]))
    assert not spec.vector_state and not spec.staged
    cu = torch.tensor([0, 100, 200], dtype=I32)
    spec, _ = plan_of(state, x, dt, A, B, C, None, state_scale=torch.ones(state.shape[:3]), cu_seqlens=cu)
    assert not spec.one_token and not spec.staged


@pytest.mark.parametrize(
    ("setting", "kind", "major", "expect"),
    [
        pytest.param("0", "cuda", 9, False, id="off"),
        pytest.param("auto", "cuda", 9, True, id="auto-hopper"),
        pytest.param("auto", "cuda", 8, False, id="auto-ampere"),
        pytest.param("auto", "musa", 0, False, id="auto-musa"),
        pytest.param("1", "cuda", 10, True, id="on-blackwell"),
    ],
)
def test_pdl_setting(setting, kind, major, expect):
    with settings.override(MATE_SSU_PDL=setting):
        assert pdl_for_capability(kind, major) is expect


def test_pdl_forced_where_unsupported_raises():
    with settings.override(MATE_SSU_PDL="1"), pytest.raises(NotImplementedError, match="MATE_SSU_PDL"):
        pdl_for_capability("cuda", 8)
    with pytest.raises(ValueError, match="MATE_SSU_PDL"):
        settings.parse("MATE_SSU_PDL", "yes")


def test_pdl_spec_under_the_setting():
    state, x, dt, A, B, C = inputs(2)
    with settings.override(MATE_SSU_PDL="auto"):
        spec, _ = plan_of(state, x, dt, A, B, C, None)
    assert spec.pdl is True
    spec, _ = plan_of(state, x, dt, A, B, C, None)
    assert spec.pdl is False


def test_equal_calls_share_one_spec_object():
    """The planner memoises specs: a call's host path builds no dataclass, and equal specs are one cache key."""
    state, x, dt, A, B, C = inputs(2)
    a, _ = plan_of(state, x, dt, A, B, C, None)
    b, _ = plan_of(state, x, dt, A, B, C, None)
    assert a is b and hash(a) == hash(b)
    assert "ssu_kernel(" in str(a) and "min_blocks=" in str(a)


def test_public_plan_query_matches_the_planner():
    from mate.mamba.planning import plan_selective_state_update

    state, x, dt, A, B, C = inputs(4)
    table = torch.tensor([3, 1, 7, 9], dtype=I32)
    (spec,) = plan_selective_state_update(state, x, dt, A, B, C, None, state_batch_indices=table)
    assert spec == plan_of(state, x, dt, A, B, C, None, state_batch_indices=table)[0]
    assert plan_selective_state_update(*inputs(0), None) == ()


# ---------------------------------------------------------------------------------------- quantised states

QDTYPES = [pytest.param(dt, id=STATE_FORMATS[dt].label) for dt in QUANT_STATE_DTYPES]


@pytest.mark.parametrize("dtype", [pytest.param(dt, id=f.label) for dt, f in STATE_FORMATS.items()])
def test_every_state_format_has_its_tuning_rows(dtype):
    """The planner tunes a state format by its tuning key (a new key needs its TUNING rows); the small-grid
    one-token row serves the 2-byte floats, the stochastically rounded rows a format with stochastic rounding."""
    f = STATE_FORMATS[dtype]
    assert tl_ssu.tuning(dtype, False) is tl_ssu.TUNING[(f.tuning_key, "packed")]
    assert tl_ssu.tuning(dtype, True) is tl_ssu.TUNING[(f.tuning_key, "one_token")]
    small = "one_token_small" if (f.tuning_key, "one_token_small") in tl_ssu.TUNING else "one_token"
    assert tl_ssu.tuning(dtype, True, small_grid=True) is tl_ssu.TUNING[(f.tuning_key, small)]
    if f.sr_tuning_key is not None:
        for one_token, kernel in ((True, "one_token"), (False, "packed")):
            assert tl_ssu.tuning(dtype, one_token, True, rounds=10) is tl_ssu.TUNING[(f.sr_tuning_key, kernel)]
    assert DTYPE_NAMES[dtype] == f.name


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_quantised_one_token_plan(qdtype):
    state = torch.zeros(32, H, P, N, dtype=qdtype)
    scale = torch.ones(32, H, P, 1)  # FlashInfer's trailing-1 form: a view of it is passed
    _, x, dt, A, B, C = inputs(4)
    key, args = plan_of(state, x, dt, A, B, C, None, state_batch_indices=torch.tensor([3, 1, 7, 9], dtype=I32),
                        state_scale=scale)  # fmt: skip
    assert key.one_token and key.state_dtype == DTYPE_NAMES[qdtype]
    assert not key.pack_early
    assert key.tiling.vec == 16 // state.element_size()
    assert key.tiling.vecs * key.tiling.vec * key.tiling.rows_per_thread == 32  # 32 state values per thread
    assert len(args) == 22 and args[21].shape == (32, H, P)
    assert args[21].untyped_storage().data_ptr() == scale.untyped_storage().data_ptr()  # written in place


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_quantised_packed_plan(qdtype):
    state = torch.zeros(32, H, P, N, dtype=qdtype)
    scale = torch.ones(32, H, P)
    _, x, dt, A, B, C = inputs(6)
    src = torch.arange(6, dtype=I32).view(2, 3)
    key, args = plan_of(state, x, dt, A, B, C, None, cu_seqlens=torch.tensor([0, 3, 6], dtype=I32),
                        state_batch_indices=src, dst_state_batch_indices=src + 10,
                        num_accepted_tokens=torch.tensor([1, 2], dtype=I32), state_scale=scale)  # fmt: skip
    assert not key.one_token and key.ibuf_dtype == key.state_dtype
    assert len(args) == 29 and args[27] is scale
    assert any(args[28] is d for d in tl_ssu.dummies())  # no buffer: the dummy buffer's dummy scales

    ibuf = torch.zeros(4, 3, H, P, N, dtype=qdtype)
    iscale = torch.ones(4, 3, H, P)
    x4, dt4 = x.view(2, 3, H, P), dt.reshape(2, 3, H, P)
    key, args = plan_of(state, x4, dt4, A, B.view(2, 3, G, N), C.view(2, 3, G, N), None,
                        state_batch_indices=torch.tensor([1, 2], dtype=I32), disable_state_update=True,
                        intermediate_states_buffer=ibuf, intermediate_state_indices=torch.tensor([3, 0], dtype=I32),
                        cache_steps=3, state_scale=scale, intermediate_state_scales=iscale)  # fmt: skip
    assert args[A_MODE_PACKED] == kssu.MODE_INTERMEDIATE
    assert args[27] is scale and args[28].shape == (12, H, P)
    assert args[28].untyped_storage().data_ptr() == iscale.untyped_storage().data_ptr()


def test_quantised_state_beside_another_buffer_dtype_is_refused():
    state = torch.zeros(32, H, P, N, dtype=torch.int8)
    _, x, dt, A, B, C = inputs(6)
    call = normalize_ssu(state, x.view(2, 3, H, P), dt.reshape(2, 3, H, P), A, B.view(2, 3, G, N),
                         C.view(2, 3, G, N), None, state_batch_indices=torch.tensor([1, 2], dtype=I32),
                         disable_state_update=True, intermediate_states_buffer=torch.zeros(2, 3, H, P, N, dtype=BF16),
                         cache_steps=3, state_scale=torch.ones(32, H, P))  # fmt: skip
    with pytest.raises(NotImplementedError, match="intermediate_states_buffer"):
        tl_ssu.plan(call)


def test_stochastic_rounding_plans_the_seeded_kernels():
    """An fp16 state with rand_seed: the kernels built with Philox rounds (nothing narrowed early), the seed as the
    trailing argument (a view of the caller's tensor, whatever its shape)."""
    state = torch.zeros(32, H, P, N, dtype=torch.float16)
    _, x, dt, A, B, C = inputs(2)
    seed = torch.tensor([[7]])
    spec, args = tl_ssu.plan(normalize_ssu(state, x, dt, A, B, C, None, rand_seed=seed, philox_rounds=7))
    assert spec.one_token and spec.philox_rounds == 7 and not spec.pack_early
    assert len(args) == 22 and args[21].shape == (1,) and args[21].data_ptr() == seed.data_ptr()
    plain, _ = tl_ssu.plan(normalize_ssu(state, x, dt, A, B, C, None))
    assert plain.philox_rounds == 0 and plain != spec
    # the packed kernel: the seed after cache_steps
    xs, dts = x.unsqueeze(1).expand(2, 3, H, P), dt.unsqueeze(1).expand(2, 3, H, P)
    Bs, Cs = B.unsqueeze(1).expand(2, 3, G, N), C.unsqueeze(1).expand(2, 3, G, N)
    pspec, pargs = tl_ssu.plan(normalize_ssu(state, xs, dts, A, Bs, Cs, None, rand_seed=seed))
    assert not pspec.one_token and pspec.philox_rounds == 10 and len(pargs) == 28 and pargs[27].shape == (1,)
    specs = tl_ssu.serving_specs(state_dtype=torch.float16, io_dtype=BF16, heads=H, dim=P, dstate=N, groups=G,
                                 slot_dtype=I32, packed=True, meta_dtype=I32, tie_hdim=True,
                                 philox_rounds=10)  # fmt: skip
    assert pspec in specs and {s.philox_rounds for s in specs} == {10}


def test_stochastic_rounding_needs_four_values_per_counter():
    state = torch.zeros(4, H, P, 18, dtype=torch.float16)
    x = torch.zeros(2, H, P, dtype=torch.bfloat16)
    B = torch.zeros(2, G, 18, dtype=torch.bfloat16)
    call = normalize_ssu(state, x, torch.zeros(2, H, P), torch.zeros(H, P, 18), B, B, None,
                         rand_seed=torch.tensor([1]))  # fmt: skip
    with pytest.raises(NotImplementedError, match="dstate=18"):
        tl_ssu.plan(call)


@pytest.mark.parametrize("qdtype", QDTYPES)
def test_serving_specs_of_a_quantised_pool(qdtype):
    """What prewarm compiles for a block-scaled pool: one-token and packed, dt fp32 and bf16; int8 / fp8 also the
    small-grid one-token form (the register design beside the staged one)."""
    specs = tl_ssu.serving_specs(state_dtype=qdtype, io_dtype=BF16, heads=H, dim=P, dstate=N, groups=G,
                                 slot_dtype=I32, packed=True, meta_dtype=I32, tie_hdim=True)  # fmt: skip
    one_byte = STATE_FORMATS[qdtype].bytes == 1
    assert len(specs) == (6 if one_byte else 4)
    assert {s.state_dtype for s in specs} == {DTYPE_NAMES[qdtype]}
    assert sorted(s.one_token for s in specs) == [False, False] + [True] * (4 if one_byte else 2)
    assert sum(s.staged for s in specs) == (2 if one_byte else 0)
    assert not any(s.pack_early for s in specs)
