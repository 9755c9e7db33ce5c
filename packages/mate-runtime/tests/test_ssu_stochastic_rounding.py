"""Stochastic rounding of fp16 SSU states (``rand_seed``, ``philox_rounds``) on the reference backend.

Checked: the generator is Philox-4x32 as FlashInfer 0.7.2 defines it (against a plain integer transcription of
its rounds), one counter per eight consecutive elements; each value written is one of the two fp16 neighbours of
the fp32 recurrence's value; the mean over many independently rounded copies converges to the fp32 value
(unbiased) where round-to-nearest stays off by its fixed rounding error; a seed gives the same bits every time and
another seed other bits; what it does not serve raises naming the argument.
"""

from __future__ import annotations

import pytest
import torch
from mate.mamba import selective_state_update
from mate.mamba._reference.rounding import philox4x32, random_bits, round_to_fp16
from mate.mamba.testing import ssu_recurrence
from test_ssu_reference import make_inputs

H, P, N, G = 2, 4, 32, 1
M32 = 0xFFFFFFFF


def philox_plain(seed: int, offset: int, rounds: int) -> tuple[int, int, int, int]:
    """FlashInfer's philox_randint4x (conversion.cuh), its four words, in Python integers."""
    k0, k1, c0, c1, c2, c3 = seed & M32, (seed >> 32) & M32, offset & M32, (offset >> 32) & M32, 0, 0
    for _ in range(rounds):
        c0, c1, c2, c3 = (
            ((0xCD9E8D57 * c2) >> 32) ^ c1 ^ k0,
            (0xCD9E8D57 * c2) & M32,
            ((0xD2511F53 * c0) >> 32) ^ c3 ^ k1,
            (0xD2511F53 * c0) & M32,
        )
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


@pytest.mark.parametrize("rounds", [pytest.param(r, id=f"{r}-rounds") for r in (1, 7, 10)])
@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed-{s}") for s in (0, 1234567, 2**40 + 5)])
def test_philox_is_flashinfers(seed, rounds):
    offsets = torch.tensor([0, 1, 2, 77777, 2**32 + 3, 2**45 - 1])
    words = [w.tolist() for w in philox4x32(seed, offsets, rounds)]
    assert list(zip(*words, strict=True)) == [philox_plain(seed, int(o), rounds) for o in offsets]


def test_eight_elements_share_a_counter():
    """Element o takes the 16-bit half o % 2 of word (o % 8) // 2 of the counter o - o % 8."""
    offsets = torch.arange(40, 60)
    got = random_bits(99, offsets, 10).tolist()
    want = [(philox_plain(99, o - o % 8, 10)[(o % 8) // 2] >> (16 * (o % 2))) & 0xFFFF for o in offsets.tolist()]
    assert got == want


def test_rounding_edges():
    x = torch.tensor([1.0, -2.5, 65504.0, 70000.0, 1e-8, -1e-8, float("inf"), float("-inf"), float("nan")])
    r = round_to_fp16(x, 9, torch.arange(x.numel()), 10)
    assert r.dtype == torch.float16
    assert r[:3].tolist() == [1.0, -2.5, 65504.0]  # fp16 values stay as they are
    assert r[3].item() == float("inf") and r[4].item() == 0.0 and str(r[5].item()) == "-0.0"
    assert r[6].item() == float("inf") and r[7].item() == float("-inf") and torch.isnan(r[8])


def _call(S, seed, rounds=10, **extra):
    """One decode step of S sequences with identical inputs, each on its own slot of identical fp16 state."""
    inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(1,), seed=3)
    inp = {k: (v.expand(S, *v.shape[1:]).contiguous() if isinstance(v, torch.Tensor) and v.dim() > 1
               and v.shape[0] == 1 else v) for k, v in inp.items()}  # fmt: skip
    g = torch.Generator().manual_seed(4)
    state = (torch.randn(1, H, P, N, generator=g) * 0.5).to(torch.float16).expand(S, H, P, N).contiguous()
    kw = dict(inp, state_batch_indices=torch.arange(S, dtype=torch.int32), **extra)
    exact = ssu_recurrence(state.float(), **kw).state  # the fp32 recurrence's new states
    seed_t = None if seed is None else torch.tensor([seed], dtype=torch.int64)
    selective_state_update(state, **kw, rand_seed=seed_t, philox_rounds=rounds, backend="torch")
    return state, exact


def test_values_are_fp16_neighbours_and_unbiased():
    S = 4096
    state, exact = _call(S, seed=2024)
    lo = exact.half()
    lo = torch.where(lo.float() > exact, torch.nextafter(lo, torch.tensor(-float("inf"), dtype=torch.float16)), lo)
    hi = torch.nextafter(lo, torch.tensor(float("inf"), dtype=torch.float16))
    assert bool(((state == lo) | (state == hi)).all()), "every value is a neighbour of the exact one"
    # the mean over S independently rounded copies: within 5 sigma of the exact value (sigma <= ulp / 2 / sqrt S)
    ulp = (hi.float() - lo.float())[0]
    err_sr = (state.float().mean(0) - exact[0]).abs()
    assert bool((err_sr <= 5 * ulp / 2 / S**0.5 + 1e-12).all())
    # round-to-nearest's error is the same in every copy: far above the mean's where the remainder is mid-way
    nearest, _ = _call(8, seed=None)
    err_rn = (nearest.float()[0] - exact[0]).abs()
    assert float(err_rn.mean()) > 10 * float(err_sr.mean())


def test_a_seed_is_deterministic_and_seeds_differ():
    a, _ = _call(16, seed=7)
    b, _ = _call(16, seed=7)
    c, _ = _call(16, seed=8)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert not torch.equal(a.view(torch.int16), c.view(torch.int16))
    assert not torch.equal(a[0].view(torch.int16), a[1].view(torch.int16))  # each slot its own offsets


def test_intermediate_buffer_values_are_rounded_too():
    S, T = 64, 2
    inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(S, T), seed=5)
    state = torch.zeros(S, H, P, N, dtype=torch.float16)
    buf = torch.zeros(S, T, H, P, N, dtype=torch.float16)
    kw = dict(inp, state_batch_indices=torch.arange(S, dtype=torch.int32), cache_steps=T)
    exact = ssu_recurrence(state.float(), **kw, intermediate_states_buffer=buf.float()).ibuf
    selective_state_update(state, **kw, intermediate_states_buffer=buf, rand_seed=torch.tensor([3]),
                           backend="torch")  # fmt: skip
    err = (buf.float() - exact).abs()
    near = (buf.float() - exact.half().float()).abs().amax()
    # within one fp16 step (values below fp16's smallest normal, 2^-14, flush to zero), and not all the nearest
    assert bool((err <= exact.abs() * 2.0**-10 + 2.0**-14).all()) and near > 0


@pytest.mark.parametrize(
    ("extra", "error", "name"),
    [
        pytest.param(dict(philox_rounds=0), ValueError, "philox_rounds", id="rounds-zero"),
        pytest.param(dict(rand_seed=torch.tensor([1, 2])), ValueError, "rand_seed", id="two-seeds"),
        pytest.param(dict(rand_seed=torch.tensor([1], dtype=torch.int32)), ValueError, "rand_seed", id="int32-seed"),
    ],
)
def test_what_stochastic_rounding_refuses(extra, error, name):
    inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(2,), seed=6)
    state = torch.zeros(2, H, P, N, dtype=torch.float16)
    kw = dict(inp, **{"rand_seed": torch.tensor([5]), **extra})
    with pytest.raises(error, match=f"^{name}:"):
        selective_state_update(state, **kw, backend="torch")
    assert bool((state == 0).all())


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")])
def test_stochastic_rounding_of_other_float_states_is_not_supported(dtype):
    inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(2,), seed=6)
    with pytest.raises(NotImplementedError, match="rand_seed"):
        selective_state_update(torch.zeros(2, H, P, N, dtype=dtype), **inp, rand_seed=torch.tensor([5]))


def test_stochastic_rounding_with_block_scales_is_refused():
    inp = make_inputs(H=H, P=P, N=N, G=G, rows_shape=(2,), seed=6)
    state = torch.zeros(2, H, P, N, dtype=torch.int16)
    with pytest.raises(ValueError, match="^rand_seed:"):
        selective_state_update(state, **inp, state_scale=torch.ones(2, H, P), rand_seed=torch.tensor([5]))
