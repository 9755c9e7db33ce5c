"""The oracle itself (``mate.mamba.testing``): one token against the formula written out by hand, and its three entry
points (the decode step, the prefill, one sequence of consumer tensors) agreeing with each other."""

from __future__ import annotations

import torch
from mate.mamba.testing import (
    consumer_tensors,
    discretize_dt,
    gpu_skip_reason,
    run_sequence,
    softplus,
    ssd_recurrence,
    ssu_recurrence,
    step,
)

F64 = torch.float64


def test_one_token_from_a_zero_state_is_the_closed_form():
    """From s = 0: s' = dt' x (x) B[g], y = dt' x (B[g] . C[g]) + D x, times silu(z); heads 0-1 read group 0."""
    g = torch.Generator().manual_seed(0)
    H, P, N, G = 4, 3, 5, 2
    x, dt, z, D = (torch.randn(H, P, generator=g, dtype=F64) for _ in range(4))
    A = -torch.rand(H, P, N, generator=g, dtype=F64)
    B, C = torch.randn(G, N, generator=g, dtype=F64), torch.randn(G, N, generator=g, dtype=F64)
    s, y = step(torch.zeros(H, P, N, dtype=F64), x, dt, A, B, C, D, z)
    for h in range(H):
        grp = h // 2
        assert torch.allclose(s[h], torch.outer(dt[h] * x[h], B[grp]))
        want = dt[h] * x[h] * (B[grp] @ C[grp]) + D[h] * x[h]
        assert torch.allclose(y[h], want * z[h] * torch.sigmoid(z[h]))


def test_one_token_without_input_decays_the_state():
    g = torch.Generator().manual_seed(1)
    H, P, N = 2, 3, 4
    s0 = torch.randn(H, P, N, generator=g, dtype=F64)
    A, dt = -torch.rand(H, P, N, generator=g, dtype=F64), torch.rand(H, P, generator=g, dtype=F64)
    C = torch.randn(1, N, generator=g, dtype=F64)
    s, y = step(s0, torch.zeros(H, P, dtype=F64), dt, A, torch.ones(1, N, dtype=F64), C)
    assert torch.allclose(s, s0 * torch.exp(A * dt[..., None]))
    assert torch.allclose(y, s @ C[0])


def test_discretize_dt():
    dt, bias = torch.tensor([-30.0, -1.0, 0.5, 25.0]), torch.tensor(0.25)
    assert torch.equal(discretize_dt(dt), dt.double())
    sp = discretize_dt(dt, bias, dt_softplus=True)
    assert torch.allclose(sp, torch.log1p(torch.exp((dt + bias).double())))
    assert sp[-1] == 25.25 and softplus(torch.tensor(21.0)) == 21.0  # the identity above 20
    assert discretize_dt(dt, dt_limit=(0.0, 1.0)).tolist() == [0.0, 0.0, 0.5, 1.0]


def test_prefill_and_decode_step_agree_over_the_same_tokens():
    """``ssd_recurrence`` over a packed batch = ``ssu_recurrence`` over the same rows with per-head dt, the
    initial states in the read slots and every token's state published to a destination slot."""
    g = torch.Generator().manual_seed(2)
    lens, H, P, N, G = [3, 1, 4], 4, 2, 3, 2
    T = sum(lens)
    x, z = torch.randn(T, H, P, generator=g), torch.randn(T, H, P, generator=g)
    dt, dt_bias = torch.randn(T, H, generator=g), torch.randn(H, generator=g)
    A, D = -torch.rand(H, generator=g), torch.randn(H, generator=g)
    B, C = torch.randn(T, G, N, generator=g), torch.randn(T, G, N, generator=g)
    init = torch.randn(len(lens), H, P, N, generator=g)
    cu = [0, 3, 4, 8]
    ssd = ssd_recurrence(
        x, dt, A, B, C, lens, D=D, z=z, dt_bias=dt_bias, dt_softplus=True, initial_states=init,
        cu_chunk_seqlens=torch.tensor(cu),
    )  # fmt: skip
    src = torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2]])
    dst = torch.arange(3, 15).view(3, 4)
    ssu = ssu_recurrence(
        torch.cat([init, torch.zeros(12, H, P, N)]), x, dt, A, B, C, D, z, dt_bias, True, src,
        dst_state_batch_indices=dst, cu_seqlens=torch.tensor(cu),
    )  # fmt: skip
    assert torch.allclose(ssu.y64, ssd.y)
    last = [int(dst[b, n - 1]) for b, n in enumerate(lens)]
    assert torch.allclose(ssu.state[last].double(), ssd.final, atol=1e-6)  # the pool is fp32
    assert torch.allclose(ssd.chunk_end, ssd.final)  # one chunk per sequence here


def test_one_sequence_of_consumer_tensors_agrees_with_the_decode_step():
    t = consumer_tensors(rows=3, seed=3, z=True)
    pool0 = t.state.clone()
    states, ys = run_sequence(pool0[4], [0, 1, 2], t)
    exp = ssu_recurrence(
        t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.z, t.dt_bias, True, torch.tensor([[4, 4, 4]]),
        cu_seqlens=torch.tensor([0, 3]),
    )  # fmt: skip
    assert torch.allclose(exp.y64, torch.stack(ys))
    assert exp.written == {4} and torch.allclose(exp.state[4].double(), states[-1], atol=1e-6)
    assert torch.equal(t.state, pool0), "the oracle never writes its inputs"


def test_gpu_skip_reason_names_what_is_missing():
    reason = gpu_skip_reason()
    if not (torch.cuda.is_available() or getattr(torch, "musa", None)):
        assert reason == "needs a CUDA or MUSA device"
    assert reason is None or reason.startswith("needs ")
