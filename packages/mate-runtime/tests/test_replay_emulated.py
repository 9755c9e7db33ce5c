"""The TileLang ReplaySSM kernels' generated CUDA, run on the CPU (``tests/emulate``), against the reference backend.

The same cases and checks as the GPU test ``tests/gpu/test_replay_kernels.py`` (every state format, one-token /
MTP / packed varlen, flushes and not, pads, strided pools, mixed table dtypes), each through both designs (the
fused kernel, and the table design's table and rows kernels: the planner's choice forced either way), with the
kernels the planner picks for each call executed from the exact source their compiled kernels have, one after
another over their launch grids; and a trace of calls with the host's ring bookkeeping between them, through ring
wrap-arounds and flushes. Needs TileLang (no nvcc) and g++.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "emulate"), str(HERE / "gpu")]

from cuda_emulator import Emulated, unavailable  # noqa: E402
from mate.mamba import advance_replay_ring, replay_state_update  # noqa: E402
from mate.mamba._contract.replay import check_replay_data, normalize_replay  # noqa: E402
from mate.mamba._tilelang import replay_plan  # noqa: E402
from test_replay_kernels import BF16, CASES, Case, build, check  # noqa: E402

pytestmark = pytest.mark.emulated
if (why := unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)


_built: dict = {}  # spec -> Emulated, once per process


@pytest.fixture(params=replay_plan.DESIGNS)
def table(request):
    """Whether the test's calls run the table design: every call of the test forced into the fixture's design."""
    with replay_plan.forcing(request.param):
        yield request.param == "table"


def launch(call) -> list:
    """The planner's kernels for a normalised call, run on the CPU one after another over their launch grids; their
    specs."""
    planned = replay_plan.plan(call) or ()
    for spec, args in planned:
        em = _built.get(spec)
        if em is None:
            em = _built[spec] = Emulated(spec.build(), spec.pass_configs())
        grid, threads = replay_plan.grid(spec, call)
        em(*args, grid=grid, threads=threads)
    return [spec for spec, _ in planned]


def emulated_kernel(pool, kw) -> None:
    """``replay_state_update`` on the TileLang backend, its kernels run on the CPU."""
    call = normalize_replay(*pool.values(), **kw)
    check_replay_data(call)
    launch(call)


@pytest.mark.parametrize("c", CASES)
def test_emulated_kernel_matches_reference(c, table):
    if c.batch * c.H > 1024:  # the same form at a size the CPU runs in seconds (16 heads per group kept)
        c = replace(c, batch=8, H=32, G=2, slots=12)
    check(c, kernel=emulated_kernel, dev="cpu")


def test_emulated_trace_with_ring_bookkeeping(table):
    """12 calls of 2 tokens on 6 of 8 slots, ring 5 (window 3): the kernel and the reference side by side from one
    pool, the trackers advanced between calls with random accepted counts; every output and, at the end, every
    checkpoint and ring agree."""
    c = Case(state=BF16, H=4, G=2, T=2, L=5, slots=8, batch=6, pads=False)
    pool, _ = build(c, 0, "cpu")
    mine = {k: v.clone() for k, v in pool.items()}
    ref = {k: v.clone() for k, v in pool.items()}
    g = torch.Generator().manual_seed(1)
    flushes = 0
    for _ in range(12):
        _, kw = build(c, int(torch.randint(0, 1 << 30, (1,), generator=g)), "cpu")
        slots = kw["state_batch_indices"]
        flushes += int((ref["prev_num_accepted_tokens"][slots.long()] + c.T > c.L - c.T).sum())
        k1 = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        emulated_kernel(mine, k1)
        replay_state_update(*ref.values(), backend="torch", **kw)
        torch.testing.assert_close(k1["out"], kw["out"], rtol=1.2e-2, atol=1.2e-2 * float(kw["out"].abs().max()))
        acc = torch.randint(1, c.T + 1, (c.batch,), generator=g, dtype=torch.int32)
        new = torch.full((c.batch,), c.T, dtype=torch.int32)
        for side in (mine, ref):
            advance_replay_ring(side["ring_start"], side["prev_num_accepted_tokens"], slots, new, acc, ring_len=c.L,
                                window=c.L - c.T)  # fmt: skip
    assert flushes >= 6
    torch.testing.assert_close(mine["state"].float(), ref["state"].float(), rtol=8e-3, atol=8e-3)
    for name in ("x_cache", "B_cache"):
        assert torch.equal(mine[name], ref[name])
    torch.testing.assert_close(mine["dt_cache"], ref["dt_cache"], rtol=1e-6, atol=1e-6)


def test_emulated_tables_out_of_range_stay_inside_the_tensors(table):
    """Slots outside the pool (above and below; not the sentinel), a ``ring_start`` far outside the ring and live
    counts below 0 and above the window, with the debugging check off (the reference refuses such tables): the
    pool is a view between guard slots, which stay bit-identical, the rows of the bad sequences stay unwritten,
    and the sequences with good tables match the reference."""
    c = Case(batch=6, slots=10, pads=False)
    pool, kw = build(c, 5, "cpu")
    S = c.slots
    big = torch.randn(S + 4, c.H, c.P, c.N)
    big[2 : 2 + S] = pool["state"]
    guard = big.clone()
    mine = {k: v.clone() for k, v in pool.items()}
    mine["state"] = big[2 : 2 + S]
    slots = kw["state_batch_indices"].clone()
    good = slots[[0, 2, 3]].long()
    slots[1], slots[4] = S + 1, -2  # outside the pool (the guard slots are right there)
    mine["ring_start"][slots[5].long()] = 1_000_003
    mine["prev_num_accepted_tokens"][good[2]] = -4
    mine["prev_num_accepted_tokens"][slots[5].long()] = 99
    k1 = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    k1["state_batch_indices"] = slots
    call = normalize_replay(*mine.values(), **k1)
    assert len(launch(call)) == (2 if table else 1)
    assert torch.equal(big[:2], guard[:2]) and torch.equal(big[2 + S :], guard[2 + S :]), "a guard slot was written"
    assert torch.isnan(k1["out"][[1, 4]]).all(), "a sequence on a slot outside the pool wrote its output"
    # the good sequences (slots 0 and 2 untouched tables; slot 3's negative count read as 0) as the reference
    ref = {k: v.clone() for k, v in pool.items()}
    ref["prev_num_accepted_tokens"][good[2]] = 0
    kr = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    keep = torch.tensor([0, 2, 3])
    for name in ("x", "dt", "B", "C", "z", "out", "state_batch_indices"):
        kr[name] = kr[name][keep]
    replay_state_update(*ref.values(), backend="torch", **kr)
    torch.testing.assert_close(k1["out"][keep], kr["out"], rtol=1.2e-2, atol=1.2e-2 * float(kr["out"].abs().max()))
    torch.testing.assert_close(mine["state"][good], ref["state"][good], rtol=1e-5, atol=1e-5)
