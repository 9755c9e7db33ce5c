"""The ReplaySSM decode on the reference backend (``mate.mamba.replay_state_update``, FlashInfer 0.7.2's
``checkpointing_ssu`` contract) against stored-state decode (``selective_state_update`` on an fp32 pool).

Long random decode traces run both side by side from the same states: every output equal, flushes included
(a ring of 5 rows with one token per call flushes every fourth call of a slot), every slot's true state
(:func:`materialize_replayed_state` of its checkpoint and live tokens) equal to the stored one; speculative steps of
3 tokens with random accepted counts (the stored-state side keeps the state after the accepted tokens); packed
varlen rows with empty sequences; sentinel slots; quantised and stochastically rounded checkpoints within their
rounding; the host bookkeeping (:func:`advance_replay_ring`) as vLLM 0.33's trackers keep it.
"""

from __future__ import annotations

import math

import pytest
import torch
from mate.mamba import advance_replay_ring, materialize_replayed_state, replay_state_update, selective_state_update
from mate.mamba._contract.dtypes import STATE_FORMATS
from mate.mamba._reference.rounding import random_bits, round_scaled

H, P, N, G = 4, 4, 8, 2
F32 = torch.float32


class Pool:
    """A replayed pool (checkpoints, rings, trackers) and the stored-state pool it must agree with."""

    def __init__(self, S, L, T, state_dtype=F32, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.S, self.L, self.T, self.W = S, L, T, L - T
        self.truth = torch.randn(S, H, P, N, generator=g) * 0.5
        self.scale = None
        fmt = STATE_FORMATS[state_dtype]
        if fmt.block_scaled:
            self.scale = self.truth.abs().amax(-1) / fmt.qmax
            q = self.truth / self.scale.unsqueeze(-1)
            self.state = (q.round() if fmt.integer else q).to(state_dtype)
            self.truth = self.state.float() * self.scale.unsqueeze(-1)  # both sides start from the same values
        else:
            self.state = self.truth.to(state_dtype)
            self.truth = self.state.float().clone()  # (not the checkpoint tensor itself, also for an fp32 one)
        self.x_cache = torch.zeros(S, H, L, P)
        self.B_cache = torch.zeros(S, G, L, N)
        self.dt_cache = torch.zeros(S, H, L)
        self.ring_start = torch.zeros(S, dtype=torch.int32)
        self.pnat = torch.zeros(S, dtype=torch.int32)
        self.A = -(torch.rand(H, generator=g) + 0.3)
        self.D = torch.randn(H, generator=g)
        self.dt_bias = torch.rand(H, generator=g) * 0.2
        self.g = g

    def inputs(self, batch, T):
        g = self.g
        return dict(
            x=torch.randn(batch, T, H, P, generator=g), dt=torch.randn(batch, T, H, generator=g) * 0.5,
            B=torch.randn(batch, T, G, N, generator=g), C=torch.randn(batch, T, G, N, generator=g),
            z=torch.randn(batch, T, H, P, generator=g),
        )  # fmt: skip

    def step(self, slots, inp, lens=None, rand_seed=None):
        """One replayed call; returns out (NaN where nothing was written)."""
        out = torch.full_like(inp["x"], float("nan"))
        kw = {}
        if lens is not None:  # packed: [1, tokens, ...] with cu_seqlens
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
            kw = dict(cu_seqlens=cu, max_seqlen=self.T)
        replay_state_update(
            self.state, self.x_cache, self.B_cache, self.dt_cache, self.ring_start, self.pnat, inp["x"], inp["dt"],
            self.A, inp["B"], inp["C"], out, D=self.D, z=inp["z"], dt_bias=self.dt_bias, dt_softplus=True,
            state_batch_indices=slots, state_scale=self.scale, rand_seed=rand_seed, backend="torch", **kw,
        )  # fmt: skip
        return out

    def stored_tokens(self, slot, x, dt, B, C, z):
        """The stored-state decode of one sequence's tokens from the truth state: (y [T, H, P], states after each
        token [T, H, P, N])."""
        s = self.truth[slot : slot + 1].clone()
        ys, states = [], []
        for t in range(x.shape[0]):
            y = selective_state_update(
                s, x[t : t + 1], dt[t : t + 1].unsqueeze(-1).expand(1, H, P), self.A.view(H, 1, 1).expand(H, P, N),
                B[t : t + 1], C[t : t + 1], self.D, z=z[t : t + 1], dt_bias=self.dt_bias, dt_softplus=True,
                backend="torch",
            )  # fmt: skip
            ys.append(y[0])
            states.append(s[0].clone())
        return torch.stack(ys), torch.stack(states)

    def true_state(self, slot, scratch):
        """The slot's state as its checkpoint and live tokens give it (materialised into ``scratch``)."""
        materialize_replayed_state(
            self.state, self.x_cache, self.B_cache, self.dt_cache, self.A, self.ring_start[slot : slot + 1],
            self.pnat[slot : slot + 1], torch.tensor([slot]), torch.tensor([scratch]), state_scale=self.scale,
            backend="torch",
        )  # fmt: skip
        s = self.state[scratch].float()
        return s if self.scale is None else s * self.scale[scratch].unsqueeze(-1)


def run_trace(pool: Pool, steps: int, batch: int, T: int, tol: float, packed=False, rand_seed=None, pads=True):
    flushes = 0
    scratch = pool.S - 1  # never a sequence's slot: the materialisation target
    for step in range(steps):
        slots = torch.randperm(pool.S - 1, generator=pool.g)[:batch].to(torch.int32)
        if pads and step % 5 == 2:
            slots[0] = -1  # a padded sequence: nothing run, nothing written
        lens = torch.randint(0 if packed else T, T + 1, (batch,), generator=pool.g).tolist()
        inp = pool.inputs(batch, T)
        if packed:  # the same tokens as packed rows of the lengths
            rows = {k: torch.cat([v[b, : lens[b]] for b in range(batch)]).unsqueeze(0) for k, v in inp.items()}
            out = pool.step(slots, rows, lens, rand_seed).squeeze(0)
            starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
        else:
            out = pool.step(slots, inp, None, rand_seed)
        accepted = torch.tensor([int(torch.randint(1, n + 1, (1,), generator=pool.g)) if n else 0 for n in lens])
        before = pool.pnat.clone()
        for b in range(batch):
            slot, n = int(slots[b]), lens[b]
            got = out[starts[b] : starts[b] + n] if packed else out[b, :n]
            if slot == -1:
                assert torch.isnan(got).all(), "a padded sequence's output was written"
                continue
            if n == 0:
                continue
            cut = {k: v[b, :n] for k, v in inp.items()}
            ys, states = pool.stored_tokens(slot, cut["x"], cut["dt"], cut["B"], cut["C"], cut["z"])
            torch.testing.assert_close(got, ys, rtol=tol, atol=tol * (1 + float(ys.abs().max())))
            pool.truth[slot] = states[int(accepted[b]) - 1]
            flushes += int(before[slot]) + n > pool.W
        advance_replay_ring(pool.ring_start, pool.pnat, slots, torch.tensor(lens), accepted, ring_len=pool.L,
                            window=pool.W)  # fmt: skip
        assert bool((pool.ring_start >= 0).all() and (pool.ring_start < pool.L).all())
        assert bool((pool.pnat >= 0).all() and (pool.pnat <= pool.W).all())
    for slot in range(pool.S - 1):
        true = pool.true_state(slot, scratch)
        torch.testing.assert_close(
            true, pool.truth[slot], rtol=tol, atol=tol * (1 + float(pool.truth[slot].abs().max()))
        )
    return flushes


def test_one_token_trace_equals_stored_state_decode():
    """200 one-token steps of 4 of 7 slots, a ring of 5 rows (window 4): flushes every fourth call of a slot."""
    pool = Pool(S=8, L=5, T=1)
    flushes = run_trace(pool, steps=200, batch=4, T=1, tol=1e-5)
    assert flushes > 50


def test_speculative_trace_with_accepted_counts():
    """3 tokens per call, 1-3 of them accepted: the stored-state side keeps the state after the accepted ones, the
    replayed side counts them live (a rejected token's ring row is overwritten later)."""
    pool = Pool(S=8, L=7, T=3, seed=1)
    flushes = run_trace(pool, steps=120, batch=3, T=3, tol=1e-5)
    assert flushes > 20


def test_packed_varlen_trace_with_empty_sequences():
    pool = Pool(S=8, L=7, T=3, seed=2)
    flushes = run_trace(pool, steps=100, batch=4, T=3, tol=1e-5, packed=True)
    assert flushes > 10


@pytest.mark.parametrize("dtype", [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8"),
                                   pytest.param(torch.int16, id="int16")])  # fmt: skip
def test_quantised_checkpoints_within_their_rounding(dtype):
    """A quantised checkpoint is requantised at each flush (new row scales): the trace stays within the format's
    rounding of the stored fp32 decode."""
    pool = Pool(S=8, L=5, T=1, state_dtype=dtype, seed=3)
    tol = {torch.int8: 5e-2, torch.float8_e4m3fn: 2e-1, torch.int16: 1e-3}[dtype]
    run_trace(pool, steps=60, batch=4, T=1, tol=tol, pads=False)


@pytest.mark.parametrize(
    ("dtype", "tol"),
    [pytest.param(torch.float16, 5e-3, id="fp16"), pytest.param(torch.int8, 5e-2, id="int8"),
     pytest.param(torch.float8_e4m3fn, 2e-1, id="fp8")],
)  # fmt: skip
def test_stochastically_rounded_checkpoints(dtype, tol):
    """A checkpoint rounded stochastically at each flush (an int8 / fp8 one requantised with new scales):
    deterministic for a seed, within the format's rounding of the stored decode, and other than round to nearest
    and than another seed."""
    final = []
    for seed in (5, 5, 6, None):
        pool = Pool(S=8, L=5, T=1, state_dtype=dtype, seed=4)
        rs = None if seed is None else torch.tensor([seed])
        run_trace(pool, steps=40, batch=4, T=1, tol=tol, rand_seed=rs, pads=False)
        final.append(pool.state.view(torch.uint8).clone())
    assert torch.equal(final[0], final[1])
    assert not torch.equal(final[0], final[2]) and not torch.equal(final[0], final[3])


def _grid_step(q: torch.Tensor, fmt) -> torch.Tensor:
    """The spacing of the format's numbers at the scaled values ``q`` (written from the format's definition)."""
    if fmt.integer:
        return torch.ones_like(q)
    e = torch.floor(torch.log2(q.abs().clamp(min=2.0**-30)))
    return torch.exp2(torch.clamp(e - fmt.mantissa, min=fmt.min_exp))


@pytest.mark.parametrize("dtype", [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")])
def test_stochastic_requantisation_is_unbiased(dtype):
    """512 slots flush the same checkpoint through the same live tokens, each slot's numbers from its own random
    bits: the mean of the stored values is the exact replayed value within 0.12 of a grid step everywhere (the
    mean of 512 draws is within ~0.07 step of it), which round to nearest misses by up to half a step."""
    fmt = STATE_FORMATS[dtype]
    S, L = 512, 5
    pool = Pool(S=S, L=L, T=1, state_dtype=dtype, seed=11)
    for t in (pool.state, pool.scale, pool.x_cache, pool.B_cache, pool.dt_cache):  # every slot as slot 0
        t[:] = t[0]
    pool.x_cache.normal_(generator=pool.g)
    pool.x_cache[:] = pool.x_cache[0]
    pool.B_cache.normal_(generator=pool.g)
    pool.B_cache[:] = pool.B_cache[0]
    pool.dt_cache.fill_(0.2)
    pool.pnat.fill_(L - 1)  # a full window: every slot flushes
    exact = pool.state[0].float() * pool.scale[0].unsqueeze(-1)
    exact = replay_ref(exact, pool.A, pool.x_cache[0, :, : L - 1], pool.B_cache[0, :, : L - 1], pool.dt_cache[0])
    amax = exact.abs().amax(-1, keepdim=True)
    step = _grid_step(exact * (fmt.qmax / amax), fmt) * amax / fmt.qmax  # in value units
    errors = []
    for seed in (torch.tensor([2024]), None):
        state, scale = pool.state.clone(), pool.scale.clone()
        inp = pool.inputs(S, 1)
        replay_state_update(state, pool.x_cache.clone(), pool.B_cache.clone(), pool.dt_cache.clone(), pool.ring_start,
                            pool.pnat, inp["x"], inp["dt"], pool.A, inp["B"], inp["C"], torch.empty_like(inp["x"]),
                            state_scale=scale, rand_seed=seed, backend="torch")  # fmt: skip
        stored = state.float() * scale.unsqueeze(-1)
        errors.append(float(((stored.mean(0) - exact).abs() / step).max()))
        if seed is not None:
            assert len(torch.unique(stored[:, 0, 0, 0])) == 2, "a value rounds to its two neighbours"
    assert errors[0] < 0.12, f"stochastic rounding: mean off by {errors[0]:.3f} step"
    assert errors[1] > 0.12, f"round to nearest: mean off by only {errors[1]:.3f} step (the test cannot fail)"


def _replay_ring(s, A, xs, Bs, dts):
    """``s [H, P, N]`` advanced through ring rows ``xs [H, k, P]``, ``Bs [G, k, N]``, ``dts [H, k]``: the plain
    recurrence, token by token."""
    for j in range(xs.shape[1]):
        Bh = Bs[:, j].repeat_interleave(H // G, dim=0)
        s = torch.exp(A * dts[:, j]).view(-1, 1, 1) * s + (dts[:, j].view(-1, 1) * xs[:, j]).unsqueeze(
            -1
        ) * Bh.unsqueeze(1)
    return s


def replay_ref(s, A, xs, Bs, dts):
    return _replay_ring(s, A, xs.float(), Bs.float(), dts[:, : xs.shape[1]])


def _sr_independent(x: torch.Tensor, fmt, u: torch.Tensor) -> torch.Tensor:
    """The stochastic rounding written independently, in integers (FlashInfer's software rule for fp8: the 16 bits
    placed at the top of the discarded mantissa, then truncated; for int8 floor(|x| + u / 2^16))."""
    out = []
    for v, r in zip(x.tolist(), u.tolist(), strict=True):
        a = abs(v)
        if fmt.integer:
            q = min(int((a * 65536 + r) // 65536), int(fmt.qmax))  # a has at most 24 significant bits: exact
        else:
            m, e = math.frexp(a)  # a = m 2^e, m in [0.5, 1)
            mant24, unb = int(m * 2**24), e - 1
            shift = 20 if unb >= -6 else 14 - unb
            q = min(((mant24 + (r << (shift - 16))) >> shift) * 2.0 ** (unb - 23 + shift), fmt.qmax) if a else 0.0
        out.append(-q if v < 0 else q)
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [pytest.param(torch.int8, id="int8"), pytest.param(torch.float8_e4m3fn, id="fp8")])
def test_round_scaled_equals_an_integer_formulation(dtype):
    """round_scaled (floats, exact operations) against the same rule in integer arithmetic, over values across the
    range: both binades of each power of two, fp8's subnormal range and values past qmax (saturated)."""
    fmt = STATE_FORMATS[dtype]
    g = torch.Generator().manual_seed(3)
    edges = torch.tensor([0.0, fmt.qmax, -fmt.qmax, fmt.qmax * 1.01, 2.0**-9, 2.0**-6, 2.0**-12, 0.75])
    x = torch.cat([torch.randn(3000, generator=g) * 40, torch.randn(1000, generator=g) * 0.01, edges])
    off = torch.arange(x.numel()) + 12345
    got = round_scaled(x, fmt, 77, off, 10).float()
    want = _sr_independent(x, fmt, random_bits(77, off, 10))
    assert torch.equal(got, want)


def test_tracker_rule_is_vllms():
    """advance_replay_ring: a flushed call moves ring_start past the live tokens and keeps the accepted ones live;
    another adds them; a sentinel or an empty sequence changes nothing."""
    rs = torch.tensor([3, 0, 4, 2], dtype=torch.int32)
    pk = torch.tensor([4, 1, 2, 0], dtype=torch.int32)
    advance_replay_ring(rs, pk, torch.tensor([0, 1, -1, 3]), torch.tensor([1, 3, 1, 0]), torch.tensor([1, 2, 1, 0]),
                        ring_len=5, window=4)  # fmt: skip
    assert rs.tolist() == [2, 0, 4, 2] and pk.tolist() == [1, 3, 2, 0]
    # with vLLM's sentinel 0, a -1 entry (or one past the trackers) is no slot: nothing changes
    rs2, pk2 = rs.clone(), torch.tensor([0, 0, 0, 3], dtype=torch.int32)
    advance_replay_ring(rs2, pk2, torch.tensor([-1, 7]), torch.tensor([2, 1]), torch.tensor([1, 1]), ring_len=5,
                        window=3, pad_slot_id=0)  # fmt: skip
    assert rs2.tolist() == rs.tolist() and pk2.tolist() == [0, 0, 0, 3]


@pytest.mark.parametrize("dtype", [pytest.param(torch.int8, id="int8"), pytest.param(F32, id="fp32")])
def test_materialising_no_tokens_is_an_exact_copy(dtype):
    """A replay prefix of 0 copies the stored numbers and their scale as they are (no requantisation)."""
    pool = Pool(S=4, L=5, T=1, state_dtype=dtype, seed=8)
    materialize_replayed_state(pool.state, pool.x_cache, pool.B_cache, pool.dt_cache, pool.A, torch.tensor([0]),
                               torch.tensor([0]), torch.tensor([1]), torch.tensor([3]), state_scale=pool.scale,
                               backend="torch")  # fmt: skip
    assert torch.equal(pool.state[3], pool.state[1])
    if pool.scale is not None:
        assert torch.equal(pool.scale[3], pool.scale[1])


def _args(pool, inp, out):
    return (pool.state, pool.x_cache, pool.B_cache, pool.dt_cache, pool.ring_start, pool.pnat, inp["x"], inp["dt"],
            pool.A, inp["B"], inp["C"], out)  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "error", "name"),
    [
        pytest.param(lambda a, k: a.__setitem__(3, a[3][:, :2]), ValueError, "dt_cache", id="dt-cache-shape"),
        pytest.param(lambda a, k: a.__setitem__(4, a[4].long()), ValueError, "ring_start", id="ring-start-int64"),
        pytest.param(lambda a, k: k.update(max_seqlen=2), ValueError, "max_seqlen", id="max-seqlen-without-cu"),
        pytest.param(lambda a, k: k.update(algorithm="fastest"), ValueError, "algorithm", id="algorithm"),
        pytest.param(lambda a, k: k.update(d_split=3), ValueError, "d_split", id="d-split"),
        pytest.param(lambda a, k: k.update(cb_scaled=torch.zeros(1)), ValueError, "cb_scaled", id="partial-scratch"),
        pytest.param(
            lambda a, k: k.update(rand_seed=torch.tensor([1])),
            NotImplementedError,
            "rand_seed",
            id="seed-with-fp32-state",
        ),  # fmt: skip
        pytest.param(lambda a, k: k.update(backend="tilelang"), NotImplementedError, "tilelang", id="tilelang-on-cpu"),
        pytest.param(lambda a, k: a[5].fill_(5), ValueError, "prev_num_accepted_tokens", id="pnat-past-window"),
        pytest.param(
            lambda a, k: k.update(state_batch_indices=torch.tensor([9, 0])),
            ValueError,
            "state_batch_indices",
            id="slot-outside-pool",
        ),  # fmt: skip
    ],
)
def test_bad_calls_are_named_before_anything_is_written(mutate, error, name):
    pool = Pool(S=8, L=5, T=1, seed=6)
    inp = pool.inputs(2, 1)
    out = torch.full_like(inp["x"], float("nan"))
    args, kw = list(_args(pool, inp, out)), dict(state_batch_indices=torch.tensor([1, 2]), backend="torch")
    mutate(args, kw)
    before = [t.clone() for t in (pool.state, pool.x_cache, pool.B_cache, pool.dt_cache)]
    with pytest.raises(error, match=name):
        replay_state_update(*args, **kw)
    after = (pool.state, pool.x_cache, pool.B_cache, pool.dt_cache)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True)) and torch.isnan(out).all()


def test_two_cta_split_is_refused_with_an_8_bit_state():
    pool = Pool(S=8, L=5, T=1, state_dtype=torch.int8, seed=9)
    inp = pool.inputs(2, 1)
    with pytest.raises(ValueError, match="^d_split:"):
        replay_state_update(*_args(pool, inp, torch.empty_like(inp["x"])), state_scale=pool.scale, d_split=2,
                            backend="torch")  # fmt: skip


def test_more_sequences_than_slots_need_a_table():
    """Without state_batch_indices sequence b runs on slot b: more sequences than slots are refused before
    anything is written."""
    pool = Pool(S=2, L=5, T=1, seed=10)
    inp = pool.inputs(3, 1)
    out = torch.full_like(inp["x"], float("nan"))
    caches = pool.x_cache.clone()
    with pytest.raises(ValueError, match="^state_batch_indices:"):
        replay_state_update(*_args(pool, inp, out), backend="torch")
    assert torch.isnan(out).all() and torch.equal(pool.x_cache, caches)


def test_a_window_that_cannot_hold_a_call_is_refused():
    pool = Pool(S=8, L=5, T=3, seed=7)  # window 2 < 3 new tokens
    inp = pool.inputs(2, 3)
    with pytest.raises(ValueError, match="x_cache"):
        replay_state_update(*_args(pool, inp, torch.empty_like(inp["x"])), backend="torch")


def test_seeds_the_checkpoint_formats_do_not_round_stochastically_are_refused():
    """rand_seed beside an int16 checkpoint (FlashInfer has no int16 checkpoint) raises NotImplementedError naming
    the state, in the decode and the materialisation, before anything is written; philox_rounds 0 with a seed is a
    ValueError."""
    pool = Pool(S=8, L=5, T=1, state_dtype=torch.int16, seed=12)
    inp = pool.inputs(2, 1)
    out = torch.full_like(inp["x"], float("nan"))
    before = pool.state.clone()
    seed = torch.tensor([1])
    with pytest.raises(NotImplementedError, match="rand_seed.*int16"):
        replay_state_update(*_args(pool, inp, out), state_scale=pool.scale, rand_seed=seed, backend="torch")
    tables = (torch.tensor([0]), torch.tensor([2]), torch.tensor([1]), torch.tensor([3]))
    with pytest.raises(NotImplementedError, match="rand_seed.*int16"):
        materialize_replayed_state(pool.state, pool.x_cache, pool.B_cache, pool.dt_cache, pool.A, *tables,
                                   state_scale=pool.scale, rand_seed=seed, backend="torch")  # fmt: skip
    pool8 = Pool(S=8, L=5, T=1, state_dtype=torch.int8, seed=12)
    with pytest.raises(ValueError, match="^philox_rounds:"):
        materialize_replayed_state(pool8.state, pool8.x_cache, pool8.B_cache, pool8.dt_cache, pool8.A, *tables,
                                   state_scale=pool8.scale, rand_seed=seed, philox_rounds=0,
                                   backend="torch")  # fmt: skip
    assert torch.equal(pool.state, before) and torch.isnan(out).all()


def test_prewarm_takes_rounds_for_the_formats_that_round_stochastically():
    from mate.mamba import prewarm_replay_state_update, prewarm_selective_state_update

    shape = dict(io_dtype=torch.bfloat16, heads=4, dim=64, dstate=128, groups=2)
    for dtype in (torch.float16, torch.int8, torch.float8_e4m3fn):
        assert prewarm_replay_state_update(state_dtype=dtype, philox_rounds=10, **shape) is None
    with pytest.raises(ValueError, match="^philox_rounds:"):
        prewarm_replay_state_update(state_dtype=torch.int16, philox_rounds=10, **shape)
    with pytest.raises(ValueError, match="^philox_rounds:"):  # the SSU rounds an fp16 state only
        prewarm_selective_state_update(state_dtype=torch.int8, io_dtype=torch.bfloat16, batch=4, heads=4, dim=64,
                                       dstate=128, groups=2, slot_dtype=torch.int32, philox_rounds=10)  # fmt: skip


def test_materialisation_rounds_stochastically_with_a_seed():
    """materialize_replayed_state with a seed: deterministic for it, other than round to nearest, within one grid
    step of it; a prefix of 0 still copies the numbers and scales exactly."""
    results = []
    for seed in (torch.tensor([9]), torch.tensor([9]), None):
        pool = Pool(S=6, L=5, T=1, state_dtype=torch.float8_e4m3fn, seed=13)
        pool.x_cache.normal_(generator=pool.g)
        pool.B_cache.normal_(generator=pool.g)
        pool.dt_cache.uniform_(0.0, 0.3, generator=pool.g)
        materialize_replayed_state(pool.state, pool.x_cache, pool.B_cache, pool.dt_cache, pool.A,
                                   torch.tensor([1, 0]), torch.tensor([4, 0]), torch.tensor([0, 1]),
                                   torch.tensor([4, 5]), state_scale=pool.scale, rand_seed=seed,
                                   backend="torch")  # fmt: skip
        assert torch.equal(pool.state[5].view(torch.uint8), pool.state[1].view(torch.uint8))
        assert torch.equal(pool.scale[5], pool.scale[1])
        results.append(pool.state[4].float() * pool.scale[4].unsqueeze(-1))
    assert torch.equal(results[0], results[1]) and not torch.equal(results[0], results[2])
    step = pool.scale[4].unsqueeze(-1) * 32.0  # the top binade's step
    assert bool(((results[0] - results[2]).abs() <= step * 1.001).all())
