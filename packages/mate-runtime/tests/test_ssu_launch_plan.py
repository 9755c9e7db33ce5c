"""The TileLang SSU launcher's plan (kernel key + launch arguments) on CPU tensors: no GPU needed.

``mate._tilelang.ssu.plan`` turns a normalised call into the kernel key and the positional arguments of one
launch. These tests pin the dispatch rule (one-token vs packed), the write-mode and optional-input encoding,
the alignment detection that picks vector or scalar state accesses, and the NotImplementedError cases.
"""

from __future__ import annotations

import pytest
import torch
from mate._tilelang import ssu as tl_ssu
from mate.mamba._ssu_call import normalize_ssu
from mate_kernels import ssu as kssu

BF16, F32, I32, I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
H, P, N, G = 8, 64, 128, 2

# key layout: ("ssu", one_token, P, N, ratio, state, io, dt, D, dt_bias, src, dst, meta, ibuf, tied, vstate, vio)
ONE_TOKEN, VSTATE, VIO, TIED = 1, 15, 16, 14
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
    assert key[ONE_TOKEN] is True and key[TIED] is True and key[VSTATE] and key[VIO]
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
    assert key[ONE_TOKEN] is False and len(args) == 27
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
    assert key[ONE_TOKEN] is False and args[A_MODE_PACKED] == kssu.MODE_INTERMEDIATE and args[-1] == 3


def test_untied_key():
    state, x, dt, A, B, C = inputs(2, tied=False)
    key, _ = plan_of(state, x, dt, A, B, C, None)
    assert key[TIED] is False


@pytest.mark.parametrize(("offset", "vector"), [(32, True), (29, False)])
def test_pool_alignment_picks_vector_or_scalar_accesses(offset, vector):
    inner = H * P * N
    page = inner + 64
    buf = torch.zeros(5, page, dtype=BF16)
    pool = buf[:, offset : offset + inner].view(5, H, P, N)
    state, x, dt, A, B, C = inputs(2, pool=pool)
    key, _ = plan_of(state, x, dt, A, B, C, None)
    assert key[VSTATE] is vector


def test_mixed_metadata_dtypes_raise():
    state, x, dt, A, B, C = inputs(4)
    with pytest.raises(NotImplementedError, match="num_accepted_tokens"):
        plan_of(
            state, x, dt, A, B, C, None, state_batch_indices=torch.arange(4, dtype=I32).view(2, 2),
            cu_seqlens=torch.tensor([0, 2, 4], dtype=I32), num_accepted_tokens=torch.tensor([1, 2], dtype=I64),
        )  # fmt: skip


def test_too_many_sequences_raise():
    rows = tl_ssu.MAX_SEQUENCES + 1
    state = torch.zeros(2, 1, 8, 16)
    x = torch.zeros(rows, 1, 8)
    B = torch.zeros(rows, 1, 16)
    with pytest.raises(NotImplementedError, match="sequences"):
        tl_ssu.plan(normalize_ssu(state, x, torch.zeros(rows, 1, 8), -torch.ones(1), B, B.clone(), None))


def test_nothing_to_launch():
    state, x, dt, A, B, C = inputs(0)
    assert plan_of(state, x, dt, A, B, C, None) is None


def test_argument_count_matches_the_kernel_signature():
    pytest.importorskip("tilelang")
    state, x, dt, A, B, C = inputs(4)
    for kw in ({}, {"cu_seqlens": torch.tensor([0, 2, 4], dtype=I32)}):
        key, args = plan_of(state, x, dt, A, B, C, None, **kw)
        assert len(tl_ssu.build_kernel(key).params) == len(args)
