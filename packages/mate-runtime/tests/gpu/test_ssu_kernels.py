"""TileLang SSU kernels (``backend="tilelang"``) against the PyTorch reference (``backend="torch"``) on the GPU.

Each case builds its inputs from a seed twice (two independent, identical sets: one for the kernel, one for
the reference) and a third time for the untouched original. Compared: ``y``, the whole storage of the pool
(and of the intermediate buffer), with tolerances reflecting one rounding to the stored dtype; every pool
element the reference leaves unchanged must come back bit-identical from the kernel (untouched slots,
padding between strided slots, sentinel rows, ``disable_state_update``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

pytestmark = pytest.mark.gpu  # skipped without a device or TileLang (tests/conftest.py)

DEVICE = "cuda"  # (tools/gpu/precompile.py builds the cases on the CPU to ask which kernels they plan)
F32, BF16, F16, I32, I64 = torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64
# relative-to-max tolerance of one rounding to the stored dtype (fp32 math on both sides)
STATE_TOL = {F32: 1e-4, BF16: 1.2e-2, F16: 2e-3}
OUT_TOL = {F32: 1e-4, BF16: 1.2e-2, F16: 2e-3}


@dataclass(frozen=True)
class Case:
    state: torch.dtype = BF16
    io: torch.dtype = BF16
    H: int = 8
    G: int = 2
    P: int = 64
    N: int = 128
    batch: int = 4
    form: str = "one"  # one | packed | dense | flat1 (vLLM's one-sequence flat MTP table)
    T: int = 1  # tokens per sequence (packed/dense)
    varlen: bool = False  # packed: random lengths 0..T (empty sequences included)
    accepted: bool = False  # num_accepted_tokens random in 0..T
    table: str = "flat"  # none | flat | 2d | nc (non-contiguous)
    idx: torch.dtype = I32
    pad: int = -1
    pads: bool = True  # some read slots / destinations are the sentinel
    dst: bool = False  # a destination table
    disable: bool = False
    ibuf: bool = False
    parent: bool = False
    paged: str = ""  # "" | "aligned" | "odd": strided pool with a storage offset
    rows_view: bool = False  # x/B/C as row views of one buffer (production form)
    tied: bool = True
    opts: bool = True  # D, z, dt_bias, softplus
    dt_dtype: torch.dtype = F32


def _slots_needed(c: Case, nseq: int) -> int:
    return 2 * nseq * (max(c.T, 1) + 1) + 8


def build(c: Case, seed: int = 0, dev: str | None = None):
    """(kwargs, owners, retrieve_parent_token): inputs of one call on ``dev`` (default ``DEVICE``); ``owners`` are
    the storages to compare."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dev = dev or DEVICE

    def rn(shape, dtype, scale=1.0):
        return (torch.randn(shape, generator=g) * scale).to(dtype).to(dev)

    def ri(lo, hi, shape):
        return torch.randint(lo, hi, shape, generator=g)

    H, G, P, N = c.H, c.G, c.P, c.N
    if c.form == "one":
        nseq, lens = c.batch, [1] * c.batch
    elif c.form == "flat1":
        nseq, lens = 1, [c.T]
    else:
        nseq = c.batch
        lens = ri(0, c.T + 1, (nseq,)).tolist() if c.varlen else [c.T] * nseq
    rows = sum(lens)
    S = _slots_needed(c, nseq)

    # ---- pool
    inner = H * P * N
    if c.paged:
        page = inner + (64 if c.paged == "aligned" else 37)
        off = 32 if c.paged == "aligned" else 29
        pool_owner = rn((S + 1, page), c.state, 0.5)
        state = pool_owner[1:, off : off + inner].view(S, H, P, N)
    else:
        pool_owner = rn((S, H, P, N), c.state, 0.5)
        state = pool_owner

    # ---- x, B, C, z, dt
    lead = (nseq, c.T) if c.form == "dense" else (rows,)
    if c.rows_view:
        width = H * P + 2 * G * N
        buf = rn((*lead, width), c.io)
        x = buf[..., : H * P].unflatten(-1, (H, P))
        B = buf[..., H * P : H * P + G * N].unflatten(-1, (G, N))
        C = buf[..., H * P + G * N :].unflatten(-1, (G, N))
    else:
        x = rn((*lead, H, P), c.io)
        B = rn((*lead, G, N), c.io)
        C = rn((*lead, G, N), c.io)
    z = rn((*lead, H, P), c.io) if c.opts else None
    if c.tied:
        dt = (rn((*lead, H), c.dt_dtype, 0.5) + (0.0 if c.opts else 1.0)).abs()
        dt = dt.unsqueeze(-1).expand(*lead, H, P)  # strides (..., 1, 0): the production form
        A = (-(torch.rand(H, generator=g) + 0.5)).to(dev).view(H, 1, 1).expand(H, P, N)
        D = rn((H,), F32) if c.opts else None
        dt_bias = rn((H,), F32, 0.3) if c.opts else None
        if D is not None:
            D = D.unsqueeze(1).expand(H, P)
            dt_bias = dt_bias.unsqueeze(1).expand(H, P)
    else:
        dt = rn((*lead, H, P), c.dt_dtype, 0.5).abs()
        A = (-(torch.rand(H, P, N, generator=g) + 0.1)).to(dev)
        D = rn((H, P), F32) if c.opts else None
        dt_bias = rn((H, P), F32, 0.3) if c.opts else None

    # ---- tables: distinct slots, never the sentinel value except where it is meant
    lo = 1 if c.pad == 0 else 0
    perm = (torch.randperm(S - lo, generator=g) + lo).to(torch.int64)
    cols = max(c.T, 1)
    src2 = perm[: nseq * cols].view(nseq, cols).clone()
    dst2 = perm[nseq * cols : 2 * nseq * cols].view(nseq, cols).clone()
    acc = None
    if c.accepted:
        acc = ri(0, c.T + 1, (nseq,))
    if c.pads and nseq > 1:
        rpos = torch.zeros(nseq, dtype=torch.int64) if acc is None else (acc - 1).clamp(min=0)
        for b in range(0, nseq, 3):  # a sentinel read slot: zero state, no writes
            src2[b, rpos[b]] = c.pad
        dst2[1::4, cols // 2] = c.pad  # sentinel destinations are skipped
    cu = None
    if c.form == "packed":
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=c.idx)

    def table(t2):
        if c.table == "none":
            return None
        if c.form == "flat1":
            return t2.view(-1).to(c.idx).to(dev)
        if c.table == "flat":
            return t2[:, 0].contiguous().to(c.idx).to(dev)
        if c.table == "2d":
            return t2.to(c.idx).to(dev)
        # non-contiguous: every other column of a wider table (2-D) or a column of it (flat)
        wide = torch.full((nseq, 2 * cols + 1), 12345, dtype=c.idx)
        wide[:, 1::2] = t2.to(c.idx)
        wide = wide.to(dev)
        return wide[:, 1::2] if cols > 1 else wide[:, 1]

    kw = dict(
        state=state,
        x=x,
        dt=dt,
        A=A,
        B=B,
        C=C,
        D=D,
        z=z,
        dt_bias=dt_bias,
        dt_softplus=c.opts,
        state_batch_indices=table(src2),
        pad_slot_id=c.pad,
        disable_state_update=c.disable,
    )
    if c.dst:
        kw["dst_state_batch_indices"] = table(dst2)
    if cu is not None:
        kw["cu_seqlens"] = cu.to(dev)
    if acc is not None:
        kw["num_accepted_tokens"] = acc.to(c.idx).to(dev)
    if c.form == "flat1":
        kw["cu_seqlens"] = torch.tensor([0, c.T], dtype=c.idx, device=dev)
        kw["num_accepted_tokens"] = torch.tensor([max(1, c.T // 2)], dtype=c.idx, device=dev)
    owners = {"pool": pool_owner}
    parent = None
    if c.ibuf:
        entries = nseq + 3
        ibuf = rn((entries, c.T, H, P, N), c.state, 0.5)
        kw["intermediate_states_buffer"] = ibuf
        kw["cache_steps"] = c.T
        kw["intermediate_state_indices"] = (torch.randperm(entries, generator=g)[:nseq]).to(c.idx).to(dev)
        owners["ibuf"] = ibuf
        if c.parent:
            par = torch.full((nseq, c.T), -1, dtype=torch.int64)
            for t in range(1, c.T):
                par[:, t] = torch.randint(-1, t, (nseq,), generator=g)
            parent = par.to(c.idx).to(dev)
    return kw, owners, parent


def normalized(kw, parent):
    """The normalised call of ``build``'s kwargs and parent table (the public function's validation included)."""
    from mate.mamba._contract.ssu import normalize_ssu

    args = dict(kw)
    return normalize_ssu(
        args.pop("state"),
        args.pop("x"),
        args.pop("dt"),
        args.pop("A"),
        args.pop("B"),
        args.pop("C"),
        args.pop("D"),
        retrieve_parent_token=parent,
        **args,
    )


def _call(kw, parent, backend):
    from mate.mamba._dispatch import run

    if parent is None:
        from mate.mamba import selective_state_update

        return selective_state_update(**kw, backend=backend)
    return run("ssu", normalized(kw, parent), backend)


def tilelang_call(kw, parent):
    """The TileLang backend's call on ``build``'s kwargs (the default ``kernel`` of the checks)."""
    return _call(kw, parent, "tilelang")


def sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize()


def _close(name, got, ref, tol):
    got, ref = got.float(), ref.float()
    scale = ref.abs().max().item() + 1e-6
    err = (got - ref).abs()
    bad = err > tol * scale + tol * ref.abs()
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements differ (first {i}: got {got[tuple(i)].item()}, "
            f"ref {ref[tuple(i)].item()}); max err {err.max().item():.3g}, scale {scale:.3g}, tol {tol}"
        )


def check(c: Case, seed: int = 0, kernel=None, dev: str | None = None):
    """The TileLang call (``kernel(kwargs, parent)``: default the public function on ``DEVICE``) against the
    reference on inputs built on ``dev``."""
    dev = dev or DEVICE
    kernel = kernel or tilelang_call
    kw_k, own_k, par_k = build(c, seed, dev)
    kw_r, own_r, par_r = build(c, seed, dev)
    _, own_0, _ = build(c, seed, dev)
    y_k = kernel(kw_k, par_k)
    y_r = _call(kw_r, par_r, "torch")
    sync(dev)
    assert torch.isfinite(y_r.float()).all()
    _close("y", y_k, y_r, OUT_TOL[c.io] if c.io != F32 else OUT_TOL[c.state])
    for name in own_k:
        got, ref, orig = own_k[name], own_r[name], own_0[name]
        same = ref == orig
        assert torch.equal(got[same], orig[same]), f"{name}: elements the reference leaves unchanged were modified"
        _close(name, got, ref, STATE_TOL[c.state])
    if c.disable and not c.ibuf:
        assert torch.equal(own_k["pool"], own_0["pool"])
    if c.ibuf:
        assert torch.equal(own_k["pool"], own_0["pool"]), "intermediate mode must not write the pool"
    return y_k


# ----------------------------------------------------------------------------------------- the grid

ONE = [
    pytest.param(Case(), id="one-bf16-h8g2-p64n128-b4"),
    pytest.param(Case(state=BF16, H=128, G=8, batch=1), id="one-bf16-h128g8-b1"),
    pytest.param(Case(state=BF16, H=128, G=8, batch=8, rows_view=True), id="one-bf16-h128g8-b8-rowsview"),
    pytest.param(Case(state=F32, H=128, G=8, batch=64), id="one-f32-h128g8-b64"),
    pytest.param(Case(state=F16, io=F16, H=16, G=1, N=64, batch=5), id="one-f16io16-h16g1-n64"),
    pytest.param(Case(state=F32, io=F16, H=64, G=1, batch=3), id="one-f32-io16-hg64"),
    pytest.param(Case(state=BF16, H=8, G=8, P=80, batch=5), id="one-bf16-hg1-p80"),
    pytest.param(Case(state=F32, H=8, G=8, P=80, batch=5), id="one-f32-hg1-p80"),
    pytest.param(Case(state=BF16, H=24, G=1, P=128, N=256, batch=2), id="one-bf16-h24g1-p128n256"),
    pytest.param(Case(state=F32, H=4, G=1, P=128, N=256, batch=3), id="one-f32-p128n256"),
    pytest.param(Case(state=F32, H=2, G=1, batch=1024, pads=True), id="one-f32-b1024"),
    pytest.param(Case(state=BF16, H=4, G=2, batch=300, table="none", pads=False), id="one-bf16-b300-notable"),
    pytest.param(Case(state=F32, tied=False), id="one-f32-untied"),
    pytest.param(Case(state=BF16, tied=False, dt_dtype=BF16), id="one-bf16-untied-dtbf16"),
    pytest.param(Case(dt_dtype=BF16), id="one-bf16-dt-bf16"),
    pytest.param(Case(opts=False), id="one-noopts"),
    pytest.param(Case(state=F32, io=F32, opts=False), id="one-f32io32"),
    pytest.param(Case(table="flat", idx=I64, pad=0), id="one-flat-i64-pad0"),
    pytest.param(Case(table="2d", idx=I32, T=1), id="one-2d-i32"),
    pytest.param(Case(table="nc", idx=I64), id="one-noncontig-i64"),
    pytest.param(Case(table="flat", dst=True), id="one-dst"),
    pytest.param(Case(table="flat", dst=True, pad=0, idx=I64), id="one-dst-pad0"),
    pytest.param(Case(disable=True), id="one-disable"),
    pytest.param(Case(paged="aligned", rows_view=True), id="one-paged-aligned-rowsview"),
    pytest.param(Case(paged="odd"), id="one-paged-odd-offset"),
    pytest.param(Case(state=F32, paged="odd", rows_view=True), id="one-f32-paged-odd"),
]

PACKED = [
    pytest.param(Case(form="packed", T=1, accepted=True, table="2d", dst=True), id="mtp-t1"),
    pytest.param(Case(form="packed", T=2, accepted=True, table="2d", dst=True), id="mtp-t2"),
    pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, H=128, G=8, batch=8), id="mtp-t6-h128"),
    pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, state=F32), id="mtp-t6-f32"),
    pytest.param(Case(form="packed", T=8, accepted=True, table="2d", idx=I64, pad=0), id="mtp-t8-i64-pad0-nodst"),
    pytest.param(Case(form="packed", T=4, accepted=True, table="nc", dst=True), id="mtp-t4-noncontig"),
    pytest.param(Case(form="packed", T=4, varlen=True, accepted=True, table="2d", dst=True, batch=9), id="varlen"),
    pytest.param(Case(form="packed", T=3, varlen=True, table="2d", dst=True, batch=7, state=F16), id="varlen-f16"),
    pytest.param(Case(form="packed", T=5, varlen=True, table="flat", batch=6, pads=False), id="varlen-final"),
    pytest.param(Case(form="packed", T=3, accepted=True, table="2d", dst=True, tied=False, state=F32), id="mtp-untied"),
    pytest.param(
        Case(form="packed", T=4, accepted=True, table="2d", dst=True, paged="aligned", rows_view=True),
        id="mtp-paged-rowsview",
    ),
    pytest.param(Case(form="packed", T=4, accepted=True, table="2d", dst=True, paged="odd"), id="mtp-paged-odd"),
    pytest.param(Case(form="packed", T=4, accepted=True, table="2d", dst=True, disable=True), id="mtp-disable"),
    pytest.param(Case(form="flat1", T=7, table="flat", dst=True, pads=False), id="vllm-flat-mtp"),
    pytest.param(Case(form="dense", T=4, table="flat"), id="dense-final"),
    pytest.param(Case(form="dense", T=4, table="2d", dst=True), id="dense-per-token"),
    pytest.param(Case(form="dense", T=1, table="none", pads=False), id="dense-t1-notable"),
    pytest.param(Case(form="dense", T=4, table="flat", ibuf=True, disable=True), id="sglang-ibuf"),
    pytest.param(Case(form="dense", T=5, table="flat", ibuf=True, disable=True, parent=True), id="sglang-parent"),
    pytest.param(
        Case(form="dense", T=6, table="flat", ibuf=True, disable=True, parent=True, state=F32, idx=I64),
        id="sglang-parent-f32-i64",
    ),
]


@pytest.mark.parametrize("case", ONE)
def test_one_token(case):
    check(case)


@pytest.mark.parametrize("case", PACKED)
def test_packed(case):
    check(case)


# The kernel the planner picks for each 2-byte-state grid: the one-token kernel of small grids (at most 4 CTAs per
# SM: no register cap, late narrowing) for batch-1/few-sequence calls, the capped one for large batches; both
# forms must match the reference, and the spec recorded must be the one launched.
SMALL_GRID_CASES = [
    pytest.param(Case(state=BF16, H=128, G=8, batch=8, rows_view=True), True, id="one-bf16-h128g8-b8-rowsview"),
    pytest.param(Case(state=BF16, H=128, G=8, batch=64), False, id="one-bf16-h128g8-b64"),
    pytest.param(Case(table="flat", dst=True, pad=0, idx=I64), True, id="one-dst-pad0"),
    pytest.param(Case(state=F16, io=F16, H=16, G=1, N=64, batch=5), True, id="one-f16io16-n64"),
    pytest.param(Case(paged="odd"), True, id="one-paged-odd-offset"),
]


@pytest.mark.parametrize(("case", "small"), SMALL_GRID_CASES)
def test_small_grid_choice(case, small, monkeypatch):
    import mate.mamba.ssu as mssu
    from mate.mamba._tilelang import ssu as tl_ssu

    monkeypatch.setattr(mssu.FAST, "enabled", False)
    before = set(tl_ssu._kernels)
    check(case)
    launched = {s for s in tl_ssu._kernels if s.one_token} - before
    tuned = {(s.pack_early, s.min_blocks) for s in launched}
    assert tuned <= {(False, 0) if small else (True, 8)}


# Programmatic dependent launch (MATE_SSU_PDL, off by default): the grid above runs the build without it; the PDL
# build (MATE_SSU_PDL=1, or auto on this GPU) gives the same results; a chain of calls on the same slots (each
# reading the state the previous one wrote) replayed from one graph equals the same chain run eagerly without PDL
# (a kernel must not touch memory before its predecessor has finished).
PDL_CASES = [ONE[1], ONE[3], ONE[21], PACKED[2], PACKED[18]]


def test_pdl_is_off_by_default_and_auto_takes_it_here():
    from mate.mamba import settings
    from mate.mamba._platform.device import hardware, pdl_for_capability

    hw = hardware(torch.device("cuda"))
    assert pdl_for_capability(hw.kind, hw.major) is False
    with settings.override(MATE_SSU_PDL="auto"):
        assert pdl_for_capability(hw.kind, hw.major) is True


@pytest.mark.parametrize("case", PDL_CASES)
def test_pdl_setting(case, monkeypatch):
    import mate.mamba.ssu as mssu
    from mate.mamba import settings
    from mate.mamba._tilelang import ssu as tl_ssu

    monkeypatch.setattr(mssu.FAST, "enabled", False)
    before = set(tl_ssu._kernels)
    with settings.override(MATE_SSU_PDL="1"):
        check(case)
    new = set(tl_ssu._kernels) - before
    assert new and all(s.pdl for s in new)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(state=BF16, H=128, G=8, batch=64), id="one-bf16-b64"),
        pytest.param(Case(state=F32, H=128, G=8, batch=8), id="one-f32-b8"),
        pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, H=128, G=8, batch=8), id="mtp"),
    ],
)
def test_pdl_chain_in_graph_equals_eager(case, monkeypatch):
    import mate.mamba.ssu as mssu
    from mate.mamba import selective_state_update, settings
    from mate.mamba._tilelang import ssu as tl_ssu

    monkeypatch.setattr(mssu.FAST, "enabled", False)
    steps = 4
    kw_e, own_e, _ = build(case, 1)
    ys_e = [selective_state_update(**kw_e, backend="tilelang").clone() for _ in range(steps)]
    torch.cuda.synchronize()
    with settings.override(MATE_SSU_PDL="1"):
        kw_g, own_g, _ = build(case, 1)
        selective_state_update(**build(case, 2)[0], backend="tilelang")  # compile outside capture
        outs = [torch.empty_like(kw_g["x"]) for _ in range(steps)]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for out in outs:
                selective_state_update(**{**kw_g, "out": out}, backend="tilelang")
    g.replay()
    torch.cuda.synchronize()
    assert any(s.pdl for s in tl_ssu._kernels)
    for i in range(steps):
        _close(f"y of call {i}", outs[i], ys_e[i], 1e-5)
    _close("pool after the chain", own_g["pool"], own_e["pool"], 1e-5)


def test_one_token_kernel_chosen_by_shape():
    from mate.mamba._tilelang import ssu as tl_ssu

    check(Case())
    assert any(s.one_token for s in tl_ssu._kernels)
    check(Case(form="packed", T=2, accepted=True, table="2d", dst=True))
    assert any(not s.one_token for s in tl_ssu._kernels)


# ----------------------------------------------------------------------------- graphs, allocations, syncs


def _graph_vs_eager(c: Case):
    from mate.mamba import selective_state_update

    kw_e, own_e, _ = build(c, 1)
    kw_g, own_g, _ = build(c, 1)
    out_g = torch.empty_like(kw_g["x"])
    selective_state_update(**build(c, 2)[0], backend="tilelang")  # compile outside capture
    y_e = selective_state_update(**kw_e, backend="tilelang")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        selective_state_update(**kw_g, out=out_g, backend="tilelang")
    torch.cuda.synchronize()
    assert torch.equal(own_g["pool"], build(c, 1)[1]["pool"]), "capture must not run the kernel"
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_g, y_e)
    assert torch.equal(own_g["pool"], own_e["pool"])


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(H=128, G=8, batch=8), id="one"),
        pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, batch=4), id="mtp"),
    ],
)
def test_cuda_graph_replay_equals_eager(case):
    _graph_vs_eager(case)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(H=128, G=8, batch=8), id="one"),
        pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, batch=4), id="mtp"),
    ],
)
@pytest.mark.usefixtures("unchecked_inputs")
def test_no_allocation_in_steady_state(case):
    from mate.mamba import selective_state_update

    kw, _, _ = build(case, 3)
    out = torch.empty_like(kw["x"])
    selective_state_update(**kw, out=out, backend="tilelang")
    selective_state_update(**kw, out=out, backend="tilelang")
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(3):
        selective_state_update(**kw, out=out, backend="tilelang")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(H=128, G=8, batch=8), id="one"),
        pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, batch=4), id="mtp"),
        pytest.param(Case(form="packed", T=4, varlen=True, accepted=True, table="2d", dst=True, batch=9), id="varlen"),
    ],
)
@pytest.mark.usefixtures("unchecked_inputs")
def test_no_host_sync(case):
    from mate.mamba import selective_state_update

    kw, _, _ = build(case, 4)
    out = torch.empty_like(kw["x"])
    selective_state_update(**kw, out=out, backend="tilelang")  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        selective_state_update(**kw, out=out, backend="tilelang")
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_compile_during_capture_raises_prewarm_error():
    from mate.mamba import selective_state_update
    from mate.mamba._tilelang.cache import KernelNotPrewarmedError

    c = Case(H=2, G=1, P=32, N=32, batch=2)  # a configuration no other test compiles
    kw, _, _ = build(c, 5)
    out = torch.empty_like(kw["x"])
    g = torch.cuda.CUDAGraph()
    with pytest.raises(KernelNotPrewarmedError, match="prewarm_selective_state_update"):
        with torch.cuda.graph(g):
            selective_state_update(**kw, out=out, backend="tilelang")


def test_prewarm_then_capture():
    from mate.mamba import prewarm_selective_state_update, selective_state_update
    from mate.mamba._tilelang import ssu as tl_ssu
    from mate.mamba._tilelang.ssu_plan import serving_specs

    c = Case(H=6, G=3, P=64, N=64, batch=3, form="packed", T=3, accepted=True, table="2d", dst=True)
    prewarm_selective_state_update(
        state_dtype=c.state, io_dtype=c.io, batch=3, heads=6, dim=64, dstate=64, groups=3, slot_dtype=I32,
        packed=True, meta_dtype=I32, dt_dim=1,
    )  # fmt: skip
    specs = serving_specs(
        state_dtype=c.state, io_dtype=c.io, heads=6, dim=64, dstate=64, groups=3, slot_dtype=I32, packed=True,
        meta_dtype=I32, tie_hdim=True, pdl=False,
    )  # fmt: skip
    assert all(s in tl_ssu._kernels for s in specs)
    kw, _, _ = build(c, 6)
    out = torch.empty_like(kw["x"])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        selective_state_update(**kw, out=out, backend="tilelang")
    g.replay()
    torch.cuda.synchronize()
    kw_r, _, _ = build(c, 6)
    y_r = selective_state_update(**kw_r, backend="torch")
    _close("y", out, y_r, OUT_TOL[c.io])


def test_bf16_state_one_rounding_per_write():
    """A bf16 MTP state written at every token: the kernel's published states match the reference's
    (both keep fp32 in registers and round once per write), not a re-rounded chain."""
    check(replace(Case(form="packed", T=8, accepted=False, table="2d", dst=True, pads=False), state=BF16))


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case(state=BF16, H=16, G=2, batch=4), id="one-bf16"),
        pytest.param(Case(state=F32, io=F16, H=8, G=1, batch=3), id="one-f32-state-fp16-x"),
        pytest.param(Case(form="packed", T=3, accepted=True, table="2d", dst=True), id="mtp"),
    ],
)
def test_fp32_bc_beside_a_two_byte_x(case):
    """B/C in fp32 beside a bf16/fp16 x (the engines' ops take them): the kernels read B/C in x's dtype (one cast
    per call), the reference reads them as given; the results agree within x's rounding."""
    kw_k, own_k, par_k = build(case, 0)
    kw_r, own_r, par_r = build(case, 0)
    g = torch.Generator().manual_seed(5)
    for kw in (kw_k, kw_r):
        for name in ("B", "C"):
            kw[name] = (torch.randn(kw[name].shape, generator=g) * 0.5).to(DEVICE)
        g.manual_seed(5)
    assert kw_k["B"].dtype == F32 and kw_k["x"].dtype != F32 and torch.equal(kw_k["B"], kw_r["B"])
    y_k = _call(kw_k, par_k, "tilelang")
    y_r = _call(kw_r, par_r, "torch")
    torch.cuda.synchronize()
    _close("y", y_k, y_r, 2 * OUT_TOL[case.io])
    for name in own_k:
        _close(name, own_k[name], own_r[name], 2 * STATE_TOL[case.state])
