"""TileLang SSU kernels on block-scaled quantised states (int16, int8, fp8-e4m3 with fp32 row scales) against the
reference backend, over the call forms of ``test_ssu_kernels`` (whose input builder this reuses).

Each case's float inputs are built as there (with an fp32 pool), then the pool (and the intermediate buffer) is
quantised row by row into a tensor of the same layout (strided pools and their padding included). Compared: ``y``
within the io dtype's rounding (both backends dequantise exactly: stored number x fp32 scale); every row either
backend writes, dequantised, within one quantisation step of the other's (the two fp32 states differ by an ulp,
which may flip one rounding) and its new scale within 1e-4; every row and scale the reference leaves unchanged, and
the storage around a strided view, comes back bit-identical from the kernel.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from mate.mamba._contract.dtypes import QUANT_STATE_DTYPES, STATE_FORMATS
from test_ssu_kernels import BF16, F16, F32, I64, OUT_TOL, Case, _call, _close, build, sync, tilelang_call

pytestmark = pytest.mark.gpu

QDTYPES = [pytest.param(dt, id=STATE_FORMATS[dt].label) for dt in QUANT_STATE_DTYPES]


def quantise_like(owner: torch.Tensor, view: torch.Tensor, dtype: torch.dtype):
    """(owner, view, scales): ``view`` (a view of ``owner``) quantised by rows into a zeroed ``owner`` copy of
    ``dtype`` with the same layout, and the fp32 scales ``view.shape[:-1]``."""
    fmt = STATE_FORMATS[dtype]
    qmax = fmt.qmax
    v = view.float()
    scale = v.abs().amax(-1) / qmax
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = (v / scale.unsqueeze(-1)).clamp(-qmax, qmax)
    q = q.round() if fmt.integer else q
    owner_q = torch.zeros(owner.shape, dtype=dtype, device=owner.device)
    view_q = torch.as_strided(owner_q, view.shape, view.stride(), view.storage_offset())
    view_q.copy_(q.to(dtype))
    return owner_q, view_q, scale.contiguous()


def build_quantised(c: Case, dtype: torch.dtype, seed: int, dev: str | None = None):
    """(kwargs, owners, parent) of ``build`` with the pool and buffer quantised; owners gain the scales."""
    kw, owners, parent = build(replace(c, state=F32), seed, dev)
    pool, state, sscale = quantise_like(owners["pool"], kw["state"], dtype)
    kw.update(state=state, state_scale=sscale)
    owners = {"pool": pool, "pool_scale": sscale}
    if "intermediate_states_buffer" in kw:
        ib = kw["intermediate_states_buffer"]
        ibq, _, iscale = quantise_like(ib, ib, dtype)
        kw.update(intermediate_states_buffer=ibq, intermediate_state_scales=iscale)
        owners.update(ibuf=ibq, ibuf_scale=iscale)
    return kw, owners, parent


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The elements' bit patterns as integers of their width (compared element by element, not byte by byte)."""
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _dequantised(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float().view(*scale.shape, -1) * scale.unsqueeze(-1)


def check_quantised(c: Case, dtype: torch.dtype, seed: int = 0, kernel=None, dev: str | None = None):
    """As ``test_ssu_kernels.check`` (``kernel``, ``dev``), for a quantised pool."""
    kernel = kernel or tilelang_call
    kw_k, own_k, par_k = build_quantised(c, dtype, seed, dev)
    kw_r, own_r, par_r = build_quantised(c, dtype, seed, dev)
    kw_0, own_0, _ = build_quantised(c, dtype, seed, dev)
    y_k = kernel(kw_k, par_k)
    y_r = _call(kw_r, par_r, "torch")
    sync(kw_k["state"].device)
    assert torch.isfinite(y_r.float()).all()
    _close("y", y_k, y_r, OUT_TOL[c.io] if c.io != F32 else 1e-4)
    for name, sname, view in (("pool", "pool_scale", "state"), ("ibuf", "ibuf_scale", "intermediate_states_buffer")):
        if name not in own_k:
            continue
        # rows the reference leaves as they were (numbers and scale) come back bit-identical, and so does every
        # element of the storage outside the view (a strided pool's padding); a row written may keep some of
        # its numbers by chance, so written rows are compared by value below
        qk, qr, q0 = kw_k[view], kw_r[view], kw_0[view]
        sk, sr, s0 = own_k[sname], own_r[sname], own_0[sname]
        kept = (_bytes(qr) == _bytes(q0)).all(-1) & (sr == s0)
        assert torch.equal(_bytes(qk)[kept], _bytes(q0)[kept]), f"{name}: rows the reference leaves were modified"
        assert torch.equal(sk[kept], s0[kept]), f"{sname}: scales the reference leaves were modified"
        outside = torch.ones(own_k[name].shape, dtype=torch.bool, device=qk.device)
        torch.as_strided(outside, qk.shape, qk.stride(), qk.storage_offset()).fill_(False)
        assert torch.equal(_bytes(own_k[name])[outside], _bytes(own_0[name])[outside]), f"{name}: padding modified"
        # the new scales follow the rows' maxima, which differ between the two fp32 states by a few ulp
        torch.testing.assert_close(sk, sr, rtol=1e-4, atol=0, msg=lambda m, sname=sname: f"{sname}: {m}")
        dk, dr = _dequantised(qk, sk), _dequantised(qr, sr)
        step = torch.maximum(sk, sr).unsqueeze(-1)
        if dtype == torch.float8_e4m3fn:  # one e4m3 ulp at the value (3 mantissa bits), subnormals included
            bound = dr.abs() * 2.0**-3 + step * 2.0**-8
        else:  # one flipped rounding; along a tree of parents a flip in a reloaded state carries into its children
            bound = step * (1.01 if not c.parent else 1.01 * c.T)
        err = (dk - dr).abs()
        assert bool((err <= bound).all()), f"{name}: max error {err.max().item():.3g} (bound {bound.max().item():.3g})"
        # the two fp32 states differ by a few ulp (exp, softplus, tokens after a write): an int16 step is 2^-15 of
        # the row's max, so that flips roundings often (the bound above is the check); int8 steps are 2^8 times
        # coarser and fp8's relative spacing 2^-3, so a flip there stays rare
        if dtype != torch.int16:
            flips = int((err > step * 1e-3).sum())
            assert flips <= max(8, err.numel() // 1000), f"{name}: {flips} of {err.numel()} values off by a step"
    if c.disable or c.ibuf:
        assert torch.equal(_bytes(own_k["pool"]), _bytes(own_0["pool"]))
        assert torch.equal(own_k["pool_scale"], own_0["pool_scale"])
    return y_k


FORMS = [
    pytest.param(Case(H=128, G=8, batch=8, rows_view=True), id="one-h128g8-b8-rowsview"),
    pytest.param(Case(H=32, G=4, batch=64, table="2d", idx=I64, pad=0), id="one-b64-2d-i64-pad0"),
    pytest.param(Case(paged="odd"), id="one-paged-odd-offset"),
    pytest.param(Case(paged="aligned"), id="one-paged-aligned"),
    pytest.param(Case(dst=True), id="one-dst"),
    pytest.param(Case(tied=False, dt_dtype=BF16), id="one-untied"),
    pytest.param(Case(H=4, G=1, P=80, N=256, io=F16, batch=5), id="one-p80n256-io16"),
    pytest.param(Case(disable=True), id="one-disable"),
    pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, H=128, G=8, batch=8), id="mtp-t6-h128"),
    pytest.param(Case(form="packed", T=4, varlen=True, accepted=True, table="2d", dst=True, batch=9), id="varlen"),
    pytest.param(Case(form="packed", T=5, varlen=True, table="flat", batch=6, pads=False), id="varlen-final"),
    pytest.param(Case(form="packed", T=4, accepted=True, table="2d", dst=True, paged="odd"), id="mtp-paged-odd"),
    pytest.param(Case(form="dense", T=4, table="flat"), id="dense-final"),
    pytest.param(Case(form="dense", T=4, table="flat", ibuf=True, disable=True), id="sglang-ibuf"),
    pytest.param(Case(form="dense", T=5, table="flat", ibuf=True, disable=True, parent=True), id="sglang-parent"),
]


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("case", FORMS)
def test_quantised_state(case, dtype):
    check_quantised(case, dtype)


ONE_BYTE = [pytest.param(dt, id=STATE_FORMATS[dt].label) for dt in QUANT_STATE_DTYPES if STATE_FORMATS[dt].bytes == 1]


@pytest.mark.parametrize("dtype", ONE_BYTE)
@pytest.mark.parametrize("case", [f for f in FORMS if f.id.startswith("one-")])
def test_staged_design_every_one_token_form(case, dtype, monkeypatch):
    """int8 / fp8 one-token calls run the staged design on large grids and the register design on small ones
    (``SMALL_GRID_CTAS_PER_SM``): with the rule off, these grids run the staged one (a misaligned pool keeps the
    register design)."""
    from mate.mamba._tilelang import ssu_plan

    monkeypatch.setattr(ssu_plan, "SMALL_GRID_CTAS_PER_SM", {})
    check_quantised(case, dtype)


@pytest.mark.parametrize("dtype", QDTYPES)
def test_zero_rows_get_unit_scales(dtype):
    """A zero state with zero inputs stays zero: every written row is all-zero numbers with scale 1."""
    c = Case(H=8, G=2, batch=4, pads=False, opts=False)
    kw, owners, _ = build_quantised(c, dtype, 0)
    kw["state"].zero_()
    kw["state_scale"].fill_(0.25)
    kw["x"] = torch.zeros_like(kw["x"])
    _call(kw, None, "tilelang")
    rows = kw["state_batch_indices"].long()
    assert torch.equal(kw["state_scale"][rows], torch.ones_like(kw["state_scale"][rows]))
    assert not bool(kw["state"][rows].float().abs().any())


@pytest.mark.parametrize("dtype", QDTYPES)
def test_fast_path_replay_and_graph(dtype):
    """A second eager call with the same metadata replays its launch recipe (the scales are its trailing
    arguments); a captured graph replayed equals eager."""
    from mate.mamba import selective_state_update

    c = Case(H=16, G=2, batch=8, table="flat")
    for seed in (1, 2):  # the second call is the recipe's
        kw_k, own_k, _ = build_quantised(c, dtype, seed)
        kw_r, own_r, _ = build_quantised(c, dtype, seed)
        y_k = selective_state_update(**kw_k, backend="tilelang")
        y_r = selective_state_update(**kw_r, backend="torch")
        _close("y", y_k, y_r, OUT_TOL[c.io])
        torch.testing.assert_close(own_k["pool_scale"], own_r["pool_scale"], rtol=1e-5, atol=0)
    kw, own, _ = build_quantised(c, dtype, 3)
    kw_e, own_e, _ = build_quantised(c, dtype, 3)
    out = torch.empty_like(kw["x"])
    selective_state_update(**kw_e, backend="tilelang")  # eager result, and the kernel compiled before capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        selective_state_update(**kw, out=out, backend="tilelang")
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bytes(own["pool"]), _bytes(own_e["pool"]))
    assert torch.equal(own["pool_scale"], own_e["pool_scale"])
