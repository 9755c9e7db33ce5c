"""The TileLang ReplaySSM kernels (``replay_state_update`` on the TileLang backend) against the reference backend,
each test through both designs (the fused kernel, and the table design's table and rows kernels: the planner's
choice forced either way).

Each case builds one random pool (checkpoints, rings with random ``ring_start`` and live counts from 0 to the
window, so some sequences flush and some do not) and runs one call on both backends from identical copies.
Compared: ``out`` (rows of padded sequences stay unwritten); every checkpoint (flushed ones within the state
format's rounding: fp32 to 1e-5, 2-byte to one step, a quantised row to one quantisation step with its scale to
1e-4, stochastically rounded fp16 / int8 / fp8 bit-identical in >= 99.9 % of values, and in all of them where the
rings' dt' is 0, so the flushed values are the checkpoint's own on both sides; slots not flushed bit-identical); the
rings (appended rows exact, x and B copied, dt to 1e-6). A trace test runs the kernel and MATE's stored-state SSU
kernel side by side over many steps with the host's ring bookkeeping (``advance_replay_ring``), and a graph replay
equals eager.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytestmark = pytest.mark.gpu

from mate.mamba import advance_replay_ring, replay_state_update, selective_state_update  # noqa: E402
from mate.mamba._contract.dtypes import STATE_FORMATS  # noqa: E402
from mate.mamba._tilelang import replay_plan  # noqa: E402

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
I16, I8, F8 = torch.int16, torch.int8, torch.float8_e4m3fn
QMAX = {dt: f.qmax for dt, f in STATE_FORMATS.items() if f.block_scaled}
OUT_TOL = {F32: 1e-4, BF16: 1.2e-2, F16: 2e-3}


@dataclass(frozen=True)
class Case:
    state: torch.dtype = F32
    io: torch.dtype = BF16
    H: int = 8
    G: int = 2
    P: int = 64
    N: int = 128
    batch: int = 6
    T: int = 1
    L: int = 8
    slots: int = 11
    packed: bool = False
    slot_dtype: torch.dtype = torch.int32
    table: bool = True
    pads: bool = True
    optional: bool = True  # D, z, dt_bias, softplus
    dt_dtype: torch.dtype = F32
    strided_pool: bool = False
    rounds: int = 0  # stochastic rounding of a flush (fp16, int8, fp8)
    still_ring: bool = False  # dt' = 0 in every ring: a flush requantises the checkpoint's own values (bit-exact)


def build(c: Case, seed: int = 0, dev: str = "cuda"):
    """(pool, keyword arguments) of one call (``dev`` "cpu": for planning, ``tools/gpu/precompile.py``)."""
    g = torch.Generator(device=dev).manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=dev) * scale

    S, H, P, N, G, L, T = c.slots, c.H, c.P, c.N, c.G, c.L, c.T
    W = L - T
    truth = rnd(S, H, P, N, scale=0.5)
    scale = None
    if c.state in QMAX:
        # (a still ring's checkpoints fill 0.7 of the range: their requantised numbers fall off the grid)
        scale = truth.abs().amax(-1) / (QMAX[c.state] * (0.7 if c.still_ring else 1.0))
        q = truth / scale.unsqueeze(-1)
        state = (q.round() if STATE_FORMATS[c.state].integer else q).to(c.state)
    else:
        state = truth.to(c.state)
    if c.strided_pool:  # slots and heads padded apart (a paged pool's view)
        big = torch.zeros(S, H + 1, P, N, dtype=c.state, device=dev)
        big[:, :H] = state
        state = big[:, :H]
    x_cache = rnd(S, H, L, P).to(c.io)
    B_cache = rnd(S, G, L, N).to(c.io)
    dt_cache = torch.rand(S, H, L, generator=g, device=dev) * 0.3
    if c.still_ring:
        dt_cache.zero_()
    ring_start = torch.randint(0, L, (S,), generator=g, device=dev, dtype=torch.int32)
    pnat = torch.randint(0, W + 1, (S,), generator=g, device=dev, dtype=torch.int32)
    batch = c.batch
    slots = torch.randperm(S, generator=g, device=dev)[:batch].to(c.slot_dtype)
    pnat[slots[[0, 2]].long()] = W  # two full windows: flushes
    pnat[slots[3].long()] = 0
    pnat[slots[4].long()] = W - T  # the fullest window that does not flush
    if c.pads:
        slots[1] = -1
    lens = torch.randint(0 if c.packed else T, T + 1, (batch,), generator=g, device=dev)
    lens[0] = lens[4] = T
    rows = int(lens.sum()) if c.packed else None
    lead = (1, rows) if c.packed else (batch, T)
    kw = dict(
        x=rnd(*lead, H, P).to(c.io), dt=(rnd(*lead, H, scale=0.5)).to(c.dt_dtype), A=-(torch.rand(H, generator=g,
        device=dev) + 0.3), B=rnd(*lead, G, N).to(c.io), C=rnd(*lead, G, N).to(c.io),
    )  # fmt: skip
    kw["out"] = torch.full_like(kw["x"], float("nan"))
    if c.optional:
        kw.update(D=rnd(H), z=rnd(*lead, H, P).to(c.io), dt_bias=torch.rand(H, generator=g, device=dev) * 0.2,
                  dt_softplus=True)  # fmt: skip
    if c.table:
        kw["state_batch_indices"] = slots
    if c.packed:
        cu = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
        cu[1:] = lens.cumsum(0)
        kw.update(cu_seqlens=cu, max_seqlen=T)
    if scale is not None:
        kw["state_scale"] = scale
    if c.rounds:
        kw.update(rand_seed=torch.tensor([4321], dtype=torch.int64, device=dev), philox_rounds=c.rounds)
    pool = dict(state=state, x_cache=x_cache, B_cache=B_cache, dt_cache=dt_cache, ring_start=ring_start,
                prev_num_accepted_tokens=pnat)  # fmt: skip
    return pool, kw


def _clone(d):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def run(pool, kw, backend):
    pool, kw = _clone(pool), _clone(kw)
    replay_state_update(pool["state"], pool["x_cache"], pool["B_cache"], pool["dt_cache"], pool["ring_start"],
                        pool["prev_num_accepted_tokens"], backend=backend, **kw)  # fmt: skip
    return pool, kw


def _close(name, got, ref, tol):
    got, ref = got.float(), ref.float()
    scale = ref.abs().max().item() + 1e-6
    err = (got - ref).abs()
    bad = err > tol * scale + tol * ref.abs()
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} differ (first {i}: got "
            f"{got[tuple(i)].item()}, ref {ref[tuple(i)].item()}); max err {err.max().item():.3g}"
        )


def _values(state, scale):
    s = state.float()
    return s if scale is None else s * scale.unsqueeze(-1)


def tilelang_kernel(pool, kw) -> None:
    replay_state_update(*pool.values(), backend="tilelang", **kw)


def reference(pool, kw) -> None:
    replay_state_update(*pool.values(), backend="torch", **kw)


def check(c: Case, seed: int = 0, kernel=tilelang_kernel, dev: str = "cuda"):
    """One call of the case through ``kernel`` (default the TileLang backend; ``tests/test_replay_emulated.py``
    passes the kernel run on the CPU) and through the reference, from identical copies; compared as the module
    docstring says."""
    pool, kw = build(c, seed, dev)

    def side(fn):
        p, k = _clone(pool), _clone(kw)
        big = None
        if c.strided_pool:  # (a clone of a strided view is dense: the view rebuilt for each side)
            big = torch.zeros(c.slots, c.H + 1, c.P, c.N, dtype=c.state, device=dev)
            big[:, : c.H] = pool["state"]
            p["state"] = big[:, : c.H]
        fn(p, k)
        return p, k, big

    pk, kk, big_k = side(kernel)
    pr, kr, big_r = side(reference)
    if c.strided_pool:
        assert torch.equal(big_k[:, c.H :].float(), big_r[:, c.H :].float()), "the pool's padding was written"
    if dev == "cuda":
        torch.cuda.synchronize()
    nan_k, nan_r = torch.isnan(kk["out"]), torch.isnan(kr["out"])
    assert torch.equal(nan_k, nan_r), "the rows written differ (a padded or empty sequence's row written?)"
    _close("out", torch.nan_to_num(kk["out"]), torch.nan_to_num(kr["out"]), OUT_TOL[c.io] if c.io != F32 else 1e-4)
    # the checkpoints: flushed slots within the format's rounding, the others bit-identical
    changed = (pr["state"].float() != pool["state"].float()).flatten(1).any(1)
    if kw.get("state_scale") is not None:
        changed |= kr["state_scale"].ne(kw["state_scale"]).flatten(1).any(1)
    keep = ~changed
    assert torch.equal(pk["state"][keep].float(), pool["state"][keep].float()), "a checkpoint not flushed was written"
    sk, sr_ = kk.get("state_scale"), kr.get("state_scale")
    got, ref = _values(pk["state"], sk), _values(pr["state"], sr_)
    if c.rounds and c.still_ring:  # the same fp32 values rounded from the same random bits: every bit equal
        assert torch.equal(pk["state"].view(torch.uint8), pr["state"].view(torch.uint8)), "state: not bit-identical"
        assert sk is None or torch.equal(sk, sr_), "state_scale: not bit-identical"
    if c.state in QMAX:
        step = sr_.unsqueeze(-1) * (1.0 if c.state != F8 else 32.0)  # one step (fp8: of the top binade)
        err = (got - ref).abs()
        assert bool((err <= step * 1.01 + 1e-6).all()), f"state: max error {err.max().item():.3g}"
        _close("state_scale", sk, sr_, 1e-4)
        if c.rounds:  # the fold's fp32 rounding differs from the reference's order: a rare value rounds otherwise
            equal = pk["state"].view(torch.uint8) == pr["state"].view(torch.uint8)
            assert float(equal.float().mean()) >= 0.999, f"state: {int((~equal).sum())} numbers differ"
    elif c.rounds:
        equal = pk["state"].view(torch.int16) == pr["state"].view(torch.int16)
        assert float(equal.float().mean()) >= 0.999, f"state: {int((~equal).sum())} values differ"
        step = ref.abs() * 2.0**-10 + 2.0**-14
        assert bool(((got - ref).abs() <= step * 1.01).all())
    else:
        _close("state", got, ref, 1e-5 if c.state == F32 else 8e-3)
    for name in ("x_cache", "B_cache"):
        assert torch.equal(pk[name], pr[name]), f"{name}: the appended rows differ"
    _close("dt_cache", pk["dt_cache"], pr["dt_cache"], 1e-6)
    assert bool(changed.any()), "the case flushed nothing (it must exercise the flush)"


CASES = [
    pytest.param(Case(), id="one-fp32"),
    pytest.param(Case(state=BF16, H=128, G=8, batch=64, slots=80), id="one-bf16-h128g8-b64"),
    pytest.param(Case(state=F16, io=F16), id="one-fp16-io16"),
    pytest.param(Case(T=4, L=10, state=BF16), id="mtp4-bf16"),
    pytest.param(Case(T=6, L=12, H=16, G=2), id="mtp6-fp32"),
    pytest.param(Case(T=3, L=7, packed=True, batch=8, slots=12, slot_dtype=torch.int64), id="packed-varlen-int64"),
    pytest.param(Case(table=False, pads=False, batch=6), id="no-table"),
    pytest.param(Case(optional=False, dt_dtype=BF16), id="no-optional-dt-bf16"),
    pytest.param(Case(strided_pool=True, state=BF16), id="strided-pool"),
    pytest.param(Case(P=80, N=256, H=4, G=4, io=F16, state=F16), id="p80-n256-ratio1"),
    pytest.param(Case(state=I16), id="int16"),
    pytest.param(Case(state=I8, T=2, L=6), id="int8-mtp2"),
    pytest.param(Case(state=F8), id="fp8"),
    pytest.param(Case(state=F16, rounds=10), id="fp16-sr"),
    pytest.param(Case(state=I8, rounds=10), id="int8-sr"),
    pytest.param(Case(state=F8, rounds=7, T=2, L=6, packed=True, batch=8, slots=12), id="fp8-sr-packed-rounds7"),
    pytest.param(Case(state=I8, rounds=10, still_ring=True), id="int8-sr-exact"),
    pytest.param(Case(state=F8, rounds=10, still_ring=True), id="fp8-sr-exact"),
    # vLLM's default ring (16 + 1 rows: 32 staged), and a ring of 40 rows (64 staged: the token scan crosses its
    # 32-position chunks, live tokens up to 38)
    pytest.param(Case(state=BF16, L=17, slots=14), id="ring17-bf16"),
    pytest.param(Case(T=2, L=40, slots=14), id="ring40-mtp2-fp32"),
    # 24 heads per group: the table design's two CTAs of 12 heads per group (the group's dot products in each, B
    # appended by the first), packed rows of 0-3 tokens
    pytest.param(Case(state=BF16, H=48, G=2, T=3, L=9, packed=True, batch=6, slots=10), id="ratio24-packed-mtp3"),
]


@pytest.fixture(params=replay_plan.DESIGNS)
def table(request):
    """Whether the test's calls run the table design: every call of the test forced into the fixture's design."""
    with replay_plan.forcing(request.param):
        yield request.param == "table"


@pytest.mark.parametrize("c", CASES)
def test_replay_kernel_matches_reference(c, table):
    check(c)


def test_trace_equals_stored_state_kernel(table):
    """60 one-token steps of 16 of 24 slots, ring 6 (window 5), H 16 / G 2: the replay kernel's outputs equal MATE's
    stored-state SSU kernel's on an fp32 pool, flushes included."""
    torch.manual_seed(0)
    S, H, G, P, N, L = 24, 16, 2, 64, 128, 6
    dev = "cuda"
    h0 = torch.randn(S, H, P, N, device=dev) * 0.5
    state, stored = h0.clone(), h0.clone()
    x_cache = torch.zeros(S, H, L, P, dtype=BF16, device=dev)
    B_cache = torch.zeros(S, G, L, N, dtype=BF16, device=dev)
    dt_cache = torch.zeros(S, H, L, device=dev)
    rs = torch.zeros(S, dtype=torch.int32, device=dev)
    pk = torch.zeros(S, dtype=torch.int32, device=dev)
    A = -(torch.rand(H, device=dev) + 0.3)
    D, dtb = torch.randn(H, device=dev), torch.rand(H, device=dev) * 0.2
    flushes = 0
    for _ in range(60):
        slots = torch.randperm(S, device=dev)[:16].to(torch.int32)
        x = torch.randn(16, 1, H, P, device=dev).to(BF16)
        dt = torch.randn(16, 1, H, device=dev) * 0.5
        B = torch.randn(16, 1, G, N, device=dev).to(BF16)
        C = torch.randn(16, 1, G, N, device=dev).to(BF16)
        z = torch.randn(16, 1, H, P, device=dev).to(BF16)
        out = torch.empty_like(x)
        flushes += int((pk[slots.long()] + 1 > L - 1).sum())
        replay_state_update(state, x_cache, B_cache, dt_cache, rs, pk, x, dt, A, B, C, out, D=D, z=z, dt_bias=dtb,
                            dt_softplus=True, state_batch_indices=slots, backend="tilelang")  # fmt: skip
        y = selective_state_update(stored, x[:, 0], dt[:, 0].unsqueeze(-1).expand(16, H, P),
                                   A.view(H, 1, 1).expand(H, P, N), B[:, 0], C[:, 0], D, z=z[:, 0], dt_bias=dtb,
                                   dt_softplus=True, state_batch_indices=slots, backend="tilelang")  # fmt: skip
        _close("out", out[:, 0], y, 1.2e-2)
        ones = torch.ones(16, dtype=torch.int32, device=dev)
        advance_replay_ring(rs, pk, slots, ones, ones, ring_len=L, window=L - 1)
    assert flushes > 100


def test_graph_replay_equals_eager(table):
    c = Case(state=BF16, T=2, L=6)
    pool, kw = build(c, 3)
    pe, ke = run(pool, kw, "tilelang")
    pg, kg = _clone(pool), _clone(kw)
    args = (pg["state"], pg["x_cache"], pg["B_cache"], pg["dt_cache"], pg["ring_start"],
            pg["prev_num_accepted_tokens"])  # fmt: skip
    from mate.mamba import settings

    with settings.override(MATE_CHECK_INPUTS="0"):
        replay_state_update(*[a.clone() for a in args], backend="tilelang", **_clone(kw))  # compile outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replay_state_update(*args, backend="tilelang", **kg)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(torch.nan_to_num(kg["out"]), torch.nan_to_num(ke["out"]))
    assert torch.equal(pg["state"], pe["state"])
    assert torch.equal(pg["x_cache"], pe["x_cache"])
