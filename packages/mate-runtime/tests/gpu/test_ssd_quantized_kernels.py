"""TileLang SSD prefill on block-scaled quantised pools (int16, int8, fp8-e4m3 with fp32 row scales) against the
reference backend, over the call forms of ``test_ssd_kernels`` (whose input builder this reuses).

Each case's float inputs are built as there; its initial states are quantised by rows (the call passes them with
``initial_states_scale``) and its pool, where it has one, is a quantised copy of the float pool with its scales
(``final_states_out`` + ``final_states_scale``). Compared: ``out`` and returned states within the float cases'
tolerances (both backends dequantise exactly); every pool row written, dequantised, within the float tolerance of
the reference's plus one quantisation step (the two fp32 final states differ by the kernels' rounding, which may
flip a rounding), its scale within that tolerance; every row not named, its scale and a paged pool's padding
bit-identical.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_ssd_kernels import BF16, F32, OUT_TOL, STATE_TOL, Case, build, fresh_pool, rel_err
from test_ssu_quantized_kernels import QDTYPES, quantise_like
from test_ssu_quantized_kernels import _bytes as _bits

pytestmark = pytest.mark.gpu

from mate.mamba import ssd_combined_fwd_varlen  # noqa: E402
from mate.mamba._tilelang import ssd_plan  # noqa: E402
from mate.mamba.planning import plan_ssd_combined_fwd_varlen  # noqa: E402


def _dequantised(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.unsqueeze(-1)


def run_quantised(case: Case, dtype: torch.dtype, backend: str, seed: int = 0):
    """(out, returned states, (pool owner, pool view, pool scales, slot indices) or None) of one call."""
    kw = build(replace(case, state=F32), seed)
    if case.init:
        init = kw["initial_states"]
        _, init_q, init_scale = quantise_like(init, init, dtype)
        kw.update(initial_states=init_q, initial_states_scale=init_scale)
    if case.state != F32:
        kw["state_dtype"] = case.state
    out = torch.full_like(kw["x"], float("nan"))
    pool = None
    if case.pool:
        owner, fpool, idx = _float_pool(case)
        q_owner, q_view, q_scale = quantise_like(owner, fpool, dtype)
        if case.extra.get("fsi_int64"):
            idx = idx.long()
        ret = ssd_combined_fwd_varlen(**kw, out=out, final_states_out=q_view, final_state_indices=idx,
                                      final_states_scale=q_scale, backend=backend)  # fmt: skip
        assert ret is None
        pool = (q_owner, q_view, q_scale, idx)
    else:
        ret = ssd_combined_fwd_varlen(**kw, out=out, backend=backend)
    return out, ret, pool


def check(case: Case, dtype: torch.dtype):
    out_k, st_k, pool_k = run_quantised(case, dtype, "tilelang")
    out_r, st_r, pool_r = run_quantised(case, dtype, "torch")
    torch.cuda.synchronize()
    assert rel_err(out_k, out_r) < OUT_TOL[case.io], "out"
    if st_r is not None:
        assert rel_err(st_k, st_r) < STATE_TOL[case.io], "states"
    if pool_r is None:
        return
    (owner_k, vk, sk, idx), (_, vr, sr, _) = pool_k, pool_r
    owner_0, v0, s0 = fresh_quantised_pool(case, dtype)
    written = torch.zeros(vk.shape[0], dtype=torch.bool, device=vk.device)
    written[idx.long()] = True
    # rows not named, their scales and the storage outside the view come back as they were
    assert torch.equal(_bits(vk[~written]), _bits(v0[~written])), "rows not named were modified"
    assert torch.equal(sk[~written], s0[~written]), "scales not named were modified"
    outside = torch.ones(owner_k.shape, dtype=torch.bool, device=owner_k.device)
    torch.as_strided(outside, vk.shape, vk.stride(), vk.storage_offset()).fill_(False)
    assert torch.equal(_bits(owner_k)[outside], _bits(owner_0)[outside]), "padding modified"
    # written rows: the dequantised values within the float tolerance plus one step of either row
    dk, dr = _dequantised(vk[written], sk[written]), _dequantised(vr[written], sr[written])
    top = dr.abs().max()
    step = torch.maximum(sk[written], sr[written]).unsqueeze(-1)
    if dtype == torch.float8_e4m3fn:
        bound = STATE_TOL[case.io] * top + dr.abs() * 2.0**-3 + step * 2.0**-8
    else:
        bound = STATE_TOL[case.io] * top + step * 1.01
    err = (dk - dr).abs()
    assert bool((err <= bound).all()), f"pool: max error {err.max().item():.3g}"
    tol = STATE_TOL[case.io]
    torch.testing.assert_close(sk[written], sr[written], rtol=tol, atol=tol * sr[written].max().item())


def _float_pool(case: Case):
    """(owner, pool view, slot indices) of the case's fp32 pool (the owner: the whole storage of a paged one)."""
    kw = build(replace(case, state=F32), 0)
    pool, idx = fresh_pool(replace(case, state=F32), kw["cu_seqlens"].shape[0] - 1)
    owner = pool if pool.is_contiguous() else pool.as_strided((pool.untyped_storage().nbytes() // 4,), (1,), 0)
    return owner, pool, idx


def fresh_quantised_pool(case: Case, dtype: torch.dtype):
    """(owner, view, scales) of the quantised pool as a call receives it (before anything is written)."""
    owner, pool, _ = _float_pool(case)
    return quantise_like(owner, pool, dtype)


CASES = [
    pytest.param(Case(pool="dense"), id="ragged-1-50-128-300_init_pool"),
    pytest.param(Case(pool="paged", seqlens=(5, 400)), id="paged-pool"),
    pytest.param(Case(pool="dense", extra={"fsi_int64": True}, seqlens=(300, 2)), id="pool_int64-indices"),
    pytest.param(Case(pool="dense", init=False, seqlens=(129, 1)), id="pool_no-init"),
    pytest.param(Case(), id="init_returned-fp32-states"),
    pytest.param(Case(state=BF16, seqlens=(200, 33)), id="init_returned-bf16-states"),
    pytest.param(Case(intermediate=True, history=(0, 100, 0, 64)), id="init_intermediate-states"),
    pytest.param(Case(chunk=256, H=4, G=1, P=128, N=256, seqlens=(3, 300, 513), pool="dense"), id="P128-N256_c256"),
    pytest.param(Case(H=4, G=1, P=80, chunk=256, seqlens=(100, 700), pool="dense"), id="P80_c256"),
]


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("case", CASES)
def test_quantised_pool_matches_reference(case, dtype):
    check(case, dtype)


def test_float_pool_beside_quantised_initial_states():
    """Quantised initial states, a float pool written by the scan itself."""
    case = Case(pool="dense", seqlens=(40, 300))
    kw = build(case, 0)
    init = kw["initial_states"]
    _, init_q, init_scale = quantise_like(init, init, torch.int8)
    kw.update(initial_states=init_q, initial_states_scale=init_scale)
    res = []
    for backend in ("tilelang", "torch"):
        pool, idx = fresh_pool(case, 2)
        out = torch.empty_like(kw["x"])
        ssd_combined_fwd_varlen(**kw, out=out, final_states_out=pool, final_state_indices=idx, backend=backend)
        res.append((out, pool))
    torch.cuda.synchronize()
    assert rel_err(res[0][0], res[1][0]) < OUT_TOL[BF16]
    assert rel_err(res[0][1], res[1][1]) < STATE_TOL[BF16]


SPLIT_CASES = [pytest.param(Case(H=16, G=1, pool="dense", seqlens=(4000,)), id="H16_1x4000")]


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("case", SPLIT_CASES)
def test_split_design_on_a_quantised_pool(case, dtype):
    kw = build(case, 0)
    _, init_q, init_scale = quantise_like(kw["initial_states"], kw["initial_states"], dtype)
    kw.update(initial_states=init_q, initial_states_scale=init_scale)
    pool, idx = fresh_pool(replace(case, state=F32), 1)
    _, qv, qs = quantise_like(pool, pool, dtype)
    with ssd_plan.forcing("split"):
        specs = plan_ssd_combined_fwd_varlen(**kw, final_states_out=qv, final_state_indices=idx,
                                             final_states_scale=qs)  # fmt: skip
        assert [s.factory for s in specs][0] == "state_codec_kernel" and specs[-1].factory == "state_codec_kernel"
        assert any(getattr(s, "split", False) for s in specs)
    with ssd_plan.forcing("split"):
        check(case, dtype)


def test_graph_replay_equals_eager_on_a_quantised_pool():
    case = Case(pool="dense", seqlens=(17, 300))
    kw = build(case, 0)
    _, init_q, init_scale = quantise_like(kw["initial_states"], kw["initial_states"], torch.int8)
    kw.update(initial_states=init_q, initial_states_scale=init_scale)
    pool, idx = fresh_pool(replace(case, state=F32), 2)
    _, qv, qs = quantise_like(pool, pool, torch.int8)
    q0, s0 = qv.clone(), qs.clone()
    out = torch.empty_like(kw["x"])
    args = dict(kw, out=out, final_states_out=qv, final_state_indices=idx, final_states_scale=qs, backend="tilelang")
    ssd_combined_fwd_varlen(**args)
    eager = (out.clone(), qv.clone(), qs.clone())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ssd_combined_fwd_varlen(**args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ssd_combined_fwd_varlen(**args)
    out.zero_()
    qv.copy_(q0)
    qs.copy_(s0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager[0]) and torch.equal(_bits(qv), _bits(eager[1])) and torch.equal(qs, eager[2])
