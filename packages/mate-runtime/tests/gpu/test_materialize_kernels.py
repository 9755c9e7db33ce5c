"""The TileLang materialisation kernel (``materialize_replayed_state`` on the TileLang backend) against the
reference backend.

Each case builds one random pool with rings and a batch of requests (distinct sources, destinations apart from
every source; random ``ring_start`` and prefixes from 0 to the whole ring, some forced to 0 and to ``L``) and runs
one call on both backends from identical copies. Compared: every destination within the state format's rounding
(fp32 to 1e-5, 2-byte to one step, a quantised row to one quantisation step with its scale to 1e-4; rounded
stochastically, >= 99.9 % of the stored numbers bit-identical, all of them and the scales where the rings' dt' is 0),
a prefix-0 destination bit-identical to its source (numbers and scales), every other slot and the rings
bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytestmark = pytest.mark.gpu

from mate.mamba import materialize_replayed_state  # noqa: E402
from test_replay_kernels import BF16, F8, F16, F32, I8, I16, QMAX, _values  # noqa: E402

I32, I64 = torch.int32, torch.int64


@dataclass(frozen=True)
class MCase:
    state: torch.dtype = F32
    io: torch.dtype = BF16
    H: int = 8
    G: int = 2
    P: int = 64
    N: int = 128
    L: int = 17
    slots: int = 14
    batch: int = 5
    src_dtype: torch.dtype = I32
    table_dtype: torch.dtype = I32  # ring_start, replay_prefix_len, dst_slots
    pads: bool = True
    strided_pool: bool = False
    odd_rings: bool = False  # rings whose rows are off the 16-byte grid (views one value into a wider buffer)
    rounds: int = 0  # the destinations rounded stochastically (fp16, int8, fp8)
    still_ring: bool = False  # dt' = 0: a destination gets its source's values requantised (bit-exact rounding)


def build(c: MCase, seed: int = 0, dev: str = "cuda"):
    """(pool, request tables) of one call."""
    g = torch.Generator(device=dev).manual_seed(seed)
    S, H, P, N, G, L, b = c.slots, c.H, c.P, c.N, c.G, c.L, c.batch
    truth = torch.randn(S, H, P, N, generator=g, device=dev) * 0.5
    scale = None
    if c.state in QMAX:
        # (a still ring's sources fill 0.7 of the range: their requantised numbers fall off the grid)
        scale = truth.abs().amax(-1) / (QMAX[c.state] * (0.7 if c.still_ring else 1.0))
        q = truth / scale.unsqueeze(-1)
        state = (q if c.state == F8 else q.round()).to(c.state)
    else:
        state = truth.to(c.state)
    x_cache = torch.randn(S, H, L, P, generator=g, device=dev).to(c.io)
    B_cache = torch.randn(S, G, L, N, generator=g, device=dev).to(c.io)
    if c.odd_rings:
        wide_x = torch.zeros(S, H, L, P + 1, dtype=c.io, device=dev)
        wide_b = torch.zeros(S, G, L, N + 1, dtype=c.io, device=dev)
        wide_x[..., 1:], wide_b[..., 1:] = x_cache, B_cache
        x_cache, B_cache = wide_x[..., 1:], wide_b[..., 1:]
    pool = dict(
        state=state,
        x_cache=x_cache,
        B_cache=B_cache,
        dt_cache=torch.rand(S, H, L, generator=g, device=dev) * (0.0 if c.still_ring else 0.3),
        A=-(torch.rand(H, generator=g, device=dev) + 0.3),
    )
    perm = torch.randperm(S, generator=g, device=dev)
    src, dst = perm[:b].clone(), perm[b : 2 * b].clone()
    ring_start = torch.randint(0, L, (b,), generator=g, device=dev)
    prefix = torch.randint(0, L + 1, (b,), generator=g, device=dev)
    prefix[0], prefix[1] = 0, L  # an exact copy; the whole ring (wrapping unless ring_start is 0)
    ring_start[1] = L - 2
    if c.pads:
        src[2] = -1  # a sentinel source and a sentinel destination: nothing written
        dst[3] = -1
    tables = dict(ring_start=ring_start.to(c.table_dtype), replay_prefix_len=prefix.to(c.table_dtype),
                  src_slots=src.to(c.src_dtype), dst_slots=dst.to(c.table_dtype))  # fmt: skip
    if scale is not None:
        tables["state_scale"] = scale
    if c.rounds:
        tables.update(rand_seed=torch.tensor([987], dtype=torch.int64, device=dev), philox_rounds=c.rounds)
    return pool, tables


def tilelang_kernel(pool, tables) -> None:
    materialize_replayed_state(*pool.values(), backend="tilelang", **tables)


def check(c: MCase, seed: int = 0, kernel=tilelang_kernel, dev: str = "cuda"):
    """One call through ``kernel`` (default the TileLang backend; ``tests/test_materialize_emulated.py`` passes
    the kernel run on the CPU) and through the reference, from identical copies; compared as the module
    docstring says."""
    pool, tables = build(c, seed, dev)

    def side(fn):
        p = {k: v.clone() for k, v in pool.items()}
        t = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in tables.items()}
        if c.odd_rings:  # (a clone of a view with gaps is dense: the views rebuilt for each side)
            for name in ("x_cache", "B_cache"):
                wide = torch.zeros(*pool[name].shape[:-1], pool[name].shape[-1] + 1, dtype=c.io, device=dev)
                wide[..., 1:] = pool[name]
                p[name] = wide[..., 1:]
        big = None
        if c.strided_pool:  # slots and heads padded apart (a paged pool's view)
            big = torch.zeros(c.slots, c.H + 1, c.P, c.N, dtype=c.state, device=dev)
            big[:, : c.H] = pool["state"]
            p["state"] = big[:, : c.H]
        fn(p, t)
        return p, t, big

    pk, tk, big_k = side(kernel)
    pr, tr, big_r = side(lambda p, t: materialize_replayed_state(*p.values(), backend="torch", **t))
    if dev == "cuda":
        torch.cuda.synchronize()
    if c.strided_pool:
        assert torch.equal(big_k[:, c.H :].float(), big_r[:, c.H :].float()), "the pool's padding was written"
    for name in ("x_cache", "B_cache", "dt_cache", "A"):
        assert torch.equal(pk[name], pool[name]), f"{name} was written"
    src, dst, pre = tables["src_slots"].tolist(), tables["dst_slots"].tolist(), tables["replay_prefix_len"].tolist()
    written = [d for s, d in zip(src, dst, strict=True) if s != -1 and d != -1]
    keep = torch.ones(c.slots, dtype=torch.bool)
    keep[written] = False
    keep = keep.to(pool["state"].device)
    sk, sr = tk.get("state_scale"), tr.get("state_scale")
    assert torch.equal(pk["state"][keep].float(), pool["state"][keep].float()), "a slot not a destination was written"
    if sk is not None:
        assert torch.equal(sk[keep], tables["state_scale"][keep]), "a scale not a destination's was written"
    for s, d, k in zip(src, dst, pre, strict=True):
        if s == -1 or d == -1:
            continue
        if k == 0:  # an exact copy of the source's numbers and scales
            assert torch.equal(pk["state"][d].float(), pool["state"][s].float()), f"prefix 0: slot {d} not a copy"
            if sk is not None:
                assert torch.equal(sk[d], tables["state_scale"][s])
            continue
        got, ref = _values(pk["state"][d], None if sk is None else sk[d]), _values(pr["state"][d], None if sr is None
                                                                                    else sr[d])  # fmt: skip
        if c.rounds:  # the same random bits: equal numbers but where the fp32 values differ (never, dt' = 0)
            equal = pk["state"][d].view(torch.uint8) == pr["state"][d].view(torch.uint8)
            assert float(equal.float().mean()) >= (1.0 if c.still_ring else 0.999), f"slot {d}: numbers differ"
            assert not c.still_ring or sk is None or torch.equal(sk[d], sr[d]), f"slot {d}: scales differ"
        if c.state in QMAX:
            step = sr[d].unsqueeze(-1) * (1.0 if c.state != F8 else 32.0)  # one step (fp8: of the top binade)
            err = (got - ref).abs()
            assert bool((err <= step * 1.01 + 1e-6).all()), f"slot {d}: max error {err.max().item():.3g}"
            assert torch.allclose(sk[d], sr[d], rtol=1e-4, atol=0), f"slot {d}: scales"
        else:
            tol = 1e-5 if c.state == F32 else 8e-3
            err = (got - ref).abs()
            assert bool((err <= tol * (ref.abs() + ref.abs().max())).all()), f"slot {d}: max error {err.max():.3g}"
    assert any(k > 0 for s, d, k in zip(src, dst, pre, strict=True) if s != -1 and d != -1), "nothing replayed"


CASES = [
    pytest.param(MCase(), id="fp32"),
    pytest.param(MCase(state=BF16), id="bf16"),
    pytest.param(MCase(state=F16, io=F16), id="fp16-fp16-io"),
    pytest.param(MCase(state=I16), id="int16"),
    pytest.param(MCase(state=I8), id="int8"),
    pytest.param(MCase(state=F8), id="fp8"),
    pytest.param(MCase(state=BF16, src_dtype=I64), id="mixed-index-dtypes"),
    pytest.param(MCase(state=BF16, src_dtype=I64, table_dtype=I64), id="int64-tables"),
    pytest.param(MCase(state=F32, strided_pool=True), id="strided-pool"),
    pytest.param(MCase(state=F16, io=F16, H=2, G=2, P=80, N=256, L=40, slots=8, batch=4), id="p80-n256-untied"),
    pytest.param(MCase(state=BF16, L=5, pads=False), id="short-ring-no-pads"),
    pytest.param(MCase(state=I8, odd_rings=True), id="rings-off-the-16-byte-grid"),
    pytest.param(MCase(state=F16, io=F16, rounds=10), id="fp16-sr"),
    pytest.param(MCase(state=I8, rounds=10), id="int8-sr"),
    pytest.param(MCase(state=F8, rounds=5), id="fp8-sr-rounds5"),
    pytest.param(MCase(state=I8, rounds=10, still_ring=True), id="int8-sr-exact"),
    pytest.param(MCase(state=F8, rounds=10, still_ring=True), id="fp8-sr-exact"),
]


@pytest.mark.parametrize("c", CASES)
def test_materialize_kernel_matches_reference(c):
    check(c)


def check_out_of_range(kernel=tilelang_kernel, dev: str = "cuda"):
    """Whatever the tables hold, the kernel writes only destinations inside the pool: a request whose source or
    destination is outside it writes nothing, ``ring_start`` is taken modulo the ring and a prefix clamped into
    [0, L] (the reference raises ValueError for such values; MATE_CHECK_INPUTS=1 makes the TileLang path check)."""
    c = MCase(state=BF16, pads=False)
    pool, tables = build(c, 3, dev)
    L = c.L
    mine = {k: v.clone() for k, v in pool.items()}
    bad = {k: v.clone() for k, v in tables.items()}
    bad["src_slots"][2] = c.slots + 5
    bad["dst_slots"][3] = -7
    bad["ring_start"][4] = 3 * L + 1
    bad["replay_prefix_len"][4] = 10 * L
    kernel(mine, bad)
    ref = {k: v.clone() for k, v in pool.items()}
    good = {k: v.clone() for k, v in tables.items()}
    good["src_slots"][2] = -1
    good["dst_slots"][3] = -1
    good["ring_start"][4] = 1
    good["replay_prefix_len"][4] = L
    materialize_replayed_state(*ref.values(), backend="torch", **good)
    got, want = mine["state"].float(), ref["state"].float()
    assert torch.allclose(got, want, rtol=8e-3, atol=8e-3 * float(want.abs().max()))
    untouched = [tables["dst_slots"][2].item(), tables["dst_slots"][3].item()]
    for d in untouched:
        assert torch.equal(mine["state"][d], pool["state"][d])


def test_tables_out_of_range_stay_inside_the_tensors(unchecked_inputs):
    check_out_of_range()


def test_checked_tables_out_of_range_raise_before_writing():
    """With ``MATE_CHECK_INPUTS=1`` the TileLang path refuses the same tables with a ``ValueError`` naming the
    table, and writes nothing (set here, not taken from the suite's default, which the environment may change)."""
    from mate.mamba import settings

    c = MCase(state=BF16, pads=False)
    pool, tables = build(c, 3)
    mine = {k: v.clone() for k, v in pool.items()}
    for name, value in (("src_slots", c.slots + 5), ("replay_prefix_len", 10 * c.L)):
        bad = {k: v.clone() for k, v in tables.items()}
        bad[name][2] = value
        with settings.override(MATE_CHECK_INPUTS="1"), pytest.raises(ValueError, match=name):
            tilelang_kernel(mine, bad)
        assert torch.equal(mine["state"], pool["state"])
