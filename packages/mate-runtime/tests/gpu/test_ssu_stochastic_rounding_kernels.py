"""TileLang SSU kernels with stochastic rounding of fp16 states (``rand_seed``, ``philox_rounds``) against the
reference backend, over call forms of ``test_ssu_kernels`` (whose input builder this reuses).

Both backends draw the same random bits for every value (Philox-4x32, one counter per eight consecutive elements of
the tensor written, ``mate.mamba._reference.rounding``) and round by the same rule, so a value comes out bit-identical
wherever the two fp32 recurrences agree; where they differ by an ulp (exp, softplus, the order of a sum) the noise
may carry one of them over a boundary, so a small share of values may sit one fp16 step apart. Compared: ``y``; the
pool and buffer bit-identical in at least 99.9 % of their values and every value within one fp16 step; every value
the reference leaves unchanged bit-identical; the same seed the same bits, another seed other bits; graph replay
equal to eager with the seed read from its tensor at replay; the mean of many rounded copies unbiased.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_ssu_kernels import BF16, F16, F32, OUT_TOL, Case, _call, _close, build, sync, tilelang_call

pytestmark = pytest.mark.gpu

from mate.mamba import selective_state_update  # noqa: E402


def build_sr(c: Case, seed: int, rand: int, rounds: int, dev: str | None = None):
    kw, owners, parent = build(replace(c, state=F16), seed, dev)
    kw.update(rand_seed=torch.tensor([rand], dtype=torch.int64, device=kw["state"].device), philox_rounds=rounds)
    return kw, owners, parent


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def check_sr(c: Case, rand: int = 1234, rounds: int = 10, kernel=None, dev: str | None = None):
    """As ``test_ssu_kernels.check`` (``kernel``, ``dev``), for an fp16 pool rounded stochastically."""
    kernel = kernel or tilelang_call
    kw_k, own_k, par_k = build_sr(c, 0, rand, rounds, dev)
    kw_r, own_r, par_r = build_sr(c, 0, rand, rounds, dev)
    _, own_0, _ = build_sr(c, 0, rand, rounds, dev)
    y_k = kernel(kw_k, par_k)
    y_r = _call(kw_r, par_r, "torch")
    sync(kw_k["state"].device)
    _close("y", y_k, y_r, OUT_TOL[c.io] if c.io != F32 else 1e-4)
    for name in own_k:
        got, ref, orig = own_k[name], own_r[name], own_0[name]
        same = _bits(ref) == _bits(orig)
        assert torch.equal(_bits(got)[same], _bits(orig)[same]), f"{name}: values the reference leaves were modified"
        equal = _bits(got) == _bits(ref)
        assert float(equal.float().mean()) >= 0.999, f"{name}: {int((~equal).sum())} of {equal.numel()} values differ"
        step = ref.float().abs() * 2.0**-10 + 2.0**-14  # (one step; below 2^-14 values flush to zero)
        err = (got.float() - ref.float()).abs()
        assert bool((err <= step * 1.01).all()), f"{name}: max error {err.max().item():.3g}"
    return own_k


FORMS = [
    pytest.param(Case(H=128, G=8, batch=64, rows_view=True), id="one-h128g8-b64"),
    pytest.param(Case(batch=8, paged="odd", dst=True), id="one-paged-odd-dst"),
    pytest.param(Case(H=4, G=1, P=80, N=256, io=F16, batch=5, tied=False), id="one-p80n256-untied"),
    pytest.param(Case(batch=2), id="one-small-grid"),
    pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, H=32, G=4, batch=8), id="mtp-t6"),
    pytest.param(Case(form="packed", T=4, varlen=True, table="flat", batch=6, pads=False), id="varlen-final"),
    pytest.param(Case(form="dense", T=4, table="flat", ibuf=True, disable=True), id="sglang-ibuf"),
]


# Pool values (columns) and x added to them (rows): sums at fp16's range edges (65520 carries to inf half of the
# time, 2^-14 - 2^-24 flushes to zero or rises to 2^-14, subnormal results flush), ordinary values, and an inf and
# a NaN (their chunks take the kernel's integer rounding; the other values of those chunks must round the same)
EDGE_POOL = [65504.0, -65504.0, 2.0**-14, -(2.0**-14), 0.0, -0.0, 1.0, -3.140625, 1e-3, 100.0, 7.5e-5, float("inf"),
             float("nan"), 65472.0, -(2.0**-13), 0.33325]  # fmt: skip
EDGE_X = [16.0, -16.0, 8.0, 2.0**-24, -(2.0**-24), 3e-6, -3e-6, 1e-3, 0.0, -5e-7, 0.0625, 32.0, -0.0078125, 1e-5,
          -1.0, 2.0**-20]  # fmt: skip


def check_sr_edges(kernel=None, dev: str | None = None, rand: int = 11):
    """One update whose fp32 values both backends compute exactly alike (A = 0: no decay; dt = B = 1: the new value
    is pool + x, one rounding), at fp16's range edges and with non-finite values: the pool bit-identical."""
    kernel = kernel or tilelang_call
    dev = dev or "cuda"
    S, H, P, N = 2, 2, 64, 128
    pool = torch.tensor(EDGE_POOL, dtype=F16).repeat(N // len(EDGE_POOL))  # [N]
    x_rows = torch.tensor(EDGE_X, dtype=BF16).repeat(P // len(EDGE_X))  # [P]
    # each (slot, head) its own permutation of the rows, so every pair meets several noise words
    g = torch.Generator().manual_seed(rand)
    state = torch.stack([pool.roll(int(torch.randint(N, (1,), generator=g))).expand(P, N) for _ in range(S * H)])
    x = torch.stack([x_rows[torch.randperm(P, generator=g)] for _ in range(S * H)])

    def call():
        return dict(
            state=state.view(S, H, P, N).clone().to(dev), x=x.view(S, H, P).to(dev),
            dt=torch.ones(S, H, device=dev), A=torch.zeros(H, device=dev),
            B=torch.ones(S, 1, N, dtype=BF16, device=dev), C=torch.ones(S, 1, N, dtype=BF16, device=dev), D=None,
            state_batch_indices=torch.arange(S, dtype=torch.int32, device=dev),
            rand_seed=torch.tensor([rand], dtype=torch.int64, device=dev), philox_rounds=10,
        )  # fmt: skip

    got, ref = call(), call()
    kernel(got, None)
    _call(ref, None, "torch")
    sync(got["state"].device)
    equal = _bits(got["state"]) == _bits(ref["state"])
    assert bool(equal.all()), f"{int((~equal).sum())} values differ, e.g. {got['state'][~equal][:4].tolist()} " \
        f"against {ref['state'][~equal][:4].tolist()}"  # fmt: skip
    r = ref["state"].float()
    assert bool(torch.isinf(r).any()) and bool(torch.isnan(r).any()) and bool((r == 0).any())
    return got["state"]


def test_the_rule_at_fp16_range_edges():
    check_sr_edges()


@pytest.mark.parametrize("case", FORMS)
def test_kernels_round_as_the_reference(case):
    check_sr(case)


@pytest.mark.parametrize("rounds", [pytest.param(r, id=f"{r}-rounds") for r in (1, 7)])
def test_other_round_counts(rounds):
    check_sr(Case(batch=8), rounds=rounds)


def test_a_seed_is_deterministic_and_seeds_differ():
    c = Case(batch=16)
    a = check_sr(c, rand=7)["pool"]
    b = check_sr(c, rand=7)["pool"]
    other = check_sr(c, rand=8)["pool"]
    assert torch.equal(_bits(a), _bits(b))
    assert not torch.equal(_bits(a), _bits(other))


def test_graph_replay_reads_the_seed_at_replay():
    """A captured call reads the seed tensor when replayed: a new seed written into it gives the eager result of
    that seed."""
    c = Case(H=32, G=4, batch=16)
    kw, own, _ = build_sr(c, 0, 5, 10)
    fresh, _, _ = build_sr(c, 0, 5, 10)
    start = kw["state"].clone()
    selective_state_update(**kw, backend="tilelang")  # compile + warm
    kw["state"].copy_(start)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        selective_state_update(**kw, backend="tilelang")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        selective_state_update(**kw, backend="tilelang")
    for rand in (5, 6):
        kw["state"].copy_(start)
        kw["rand_seed"].fill_(rand)
        graph.replay()
        torch.cuda.synchronize()
        replayed = own["pool"].clone()
        eager = dict(fresh, rand_seed=torch.tensor([rand], device="cuda"))
        eager["state"].copy_(start)
        selective_state_update(**eager, backend="tilelang")
        torch.cuda.synchronize()
        assert torch.equal(_bits(replayed), _bits(eager["state"]))


def test_mean_of_rounded_copies_is_unbiased():
    """4096 sequences with identical inputs on identical slots (no table: sequence b updates slot b): the mean of
    their rounded new states converges to the fp32 value in fp16's normal range, where round to nearest stays off
    by its fixed error."""
    S, H, P, N = 4096, 2, 64, 128
    g = torch.Generator().manual_seed(3)

    def rows(shape, dtype, scale=1.0):
        return (torch.randn((1, *shape), generator=g) * scale).to(dtype).cuda().expand(S, *shape)

    kw = dict(
        x=rows((H, P), BF16), B=rows((1, N), BF16), C=rows((1, N), BF16),
        dt=(rows((H,), F32, 0.5).abs() + 0.1).unsqueeze(-1).expand(S, H, P),
        A=(-(torch.rand(H, generator=g) + 0.5)).cuda().view(H, 1, 1).expand(H, P, N), D=None,
    )  # fmt: skip
    base = (torch.randn(1, H, P, N, generator=g) * 0.5).half().cuda()
    exact = base.float().expand(S, H, P, N).contiguous()
    selective_state_update(exact, **kw, backend="tilelang")
    state = base.expand(S, H, P, N).contiguous()
    selective_state_update(state, **kw, rand_seed=torch.tensor([99], device="cuda"), backend="tilelang")
    nearest = base.expand(S, H, P, N).contiguous()
    selective_state_update(nearest, **kw, backend="tilelang")
    torch.cuda.synchronize()
    normal = exact[0].abs() >= 2.0**-14  # (below fp16's smallest normal values flush to zero: biased by rule)
    ulp = exact[0].abs() * 2.0**-10
    err_sr = (state.float().mean(0) - exact[0]).abs()
    assert bool((err_sr <= 5 * ulp / 2 / S**0.5 + 2.0**-24)[normal].all())
    err_rn = (nearest.float()[0] - exact[0]).abs()
    assert float(err_rn[normal].mean()) > 10 * float(err_sr[normal].mean())
