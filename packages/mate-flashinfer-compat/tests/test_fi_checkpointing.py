"""FlashInfer's ``checkpointing_ssu`` and ``allocate_checkpointing_ssu_scratch`` in MATE's FlashInfer-shaped package
(served where no real FlashInfer is installed): FlashInfer 0.7.2's signature, the call forwarded to
``mate.mamba.replay_state_update`` argument for argument, and FlashInfer's scratch shapes and bounds."""

from __future__ import annotations

import inspect

import pytest
import torch
from mate.mamba import replay_state_update
from mate_flashinfer_compat.mamba import allocate_checkpointing_ssu_scratch, checkpointing_ssu

H, P, N, G, S, L = 4, 8, 16, 2, 6, 6

# FlashInfer 0.7.2.post1's flashinfer.mamba.checkpointing_ssu (flashinfer/mamba/checkpointing_ssu.py)
CKPT_SIGNATURE = (
    "state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out, D=None, z=None, "
    "dt_bias=None, dt_softplus=False, state_batch_indices=None, pad_slot_id=-1, state_scale=None, rand_seed=None, "
    "philox_rounds=10, d_split=None, cu_seqlens=None, max_seqlen=None, enable_pdl=False, cb_scaled=None, "
    "cumAdt_vec=None, cb_old=None, precompute_heads_per_cta=0, algorithm='auto'"
)


def _signature(fn) -> str:
    return ", ".join(p.name + (f"={p.default!r}" if p.default is not p.empty else "")
                     for p in inspect.signature(fn).parameters.values())  # fmt: skip


def test_signature_is_flashinfer_0_7_2s():
    assert _signature(checkpointing_ssu) == CKPT_SIGNATURE
    assert _signature(allocate_checkpointing_ssu_scratch) == (
        "batch_size, num_heads, num_predicted_tokens, max_window, dtype, device"
    )


def _pool(seed, T=1):
    """A pool whose slots hold 0 .. L - T live tokens (every slot at most a full window)."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        state=torch.randn(S, H, P, N, generator=g) * 0.5,
        x_cache=torch.randn(S, H, L, P, generator=g),
        B_cache=torch.randn(S, G, L, N, generator=g),
        dt_cache=torch.rand(S, H, L, generator=g) * 0.3,
        ring_start=torch.tensor([0, 5, 2, 1, 4, 3], dtype=torch.int32),
        prev_num_accepted_tokens=torch.tensor([0, 3, L - T, 1, 2, L - T], dtype=torch.int32),
    )


def _step(seed, batch, T):
    g = torch.Generator().manual_seed(100 + seed)
    return dict(
        x=torch.randn(batch, T, H, P, generator=g), dt=torch.randn(batch, T, H, generator=g) * 0.5,
        A=-(torch.rand(H, generator=g) + 0.3), B=torch.randn(batch, T, G, N, generator=g),
        C=torch.randn(batch, T, G, N, generator=g), D=torch.randn(H, generator=g),
        z=torch.randn(batch, T, H, P, generator=g), dt_bias=torch.rand(H, generator=g) * 0.2,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("T", "slots"),
    [
        pytest.param(1, [2, 0, 5, 3], id="one-token_flushes_and-a-pad"),
        pytest.param(2, [1, 4, 0], id="mtp-2_flush-and-append"),
    ],
)
def test_checkpointing_ssu_is_replay_state_update(T, slots):
    """Every pool tensor, ring and output as MATE's op leaves them, with every optional argument set (a dropped or
    reordered argument changes the result): slot 0 is the pad slot, so its sequence runs nothing."""
    inp = _step(T, len(slots), T)
    idx = torch.tensor(slots, dtype=torch.int32)
    mine, ref = _pool(T, T), _pool(T, T)
    out_mine = torch.full_like(inp["x"], float("nan"))
    out_ref = out_mine.clone()
    got = checkpointing_ssu(
        *mine.values(), inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], out_mine, D=inp["D"], z=inp["z"],
        dt_bias=inp["dt_bias"], dt_softplus=True, state_batch_indices=idx, pad_slot_id=0,
    )  # fmt: skip
    want = replay_state_update(
        *ref.values(), inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], out_ref, inp["D"], inp["z"],
        inp["dt_bias"], True, idx, 0, backend="torch",
    )  # fmt: skip
    assert got is out_mine and want is out_ref
    pad = slots.index(0)
    assert torch.equal(out_mine.isnan(), out_ref.isnan()) and bool(out_mine[pad].isnan().all())  # the pad's rows
    torch.testing.assert_close(out_mine.nan_to_num(), out_ref.nan_to_num(), atol=0, rtol=0)
    for name in mine:
        assert torch.equal(mine[name], ref[name]), name
    flushed = [s for s in slots if s != 0 and int(ref["prev_num_accepted_tokens"][s]) + T > L - T]
    assert flushed and not torch.equal(mine["state"][flushed], _pool(T, T)["state"][flushed])  # a flush wrote them


def test_scratch_has_flashinfers_shapes_and_is_accepted():
    cb, cum, old = allocate_checkpointing_ssu_scratch(3, H, 6, 10, torch.bfloat16, "cpu")
    assert (cb.shape, cum.shape, old.shape) == ((3, H, 32, 8), (3, H, 16), (3, H, 32, 8))
    assert cb.dtype == old.dtype == torch.bfloat16 and cum.dtype == torch.float32
    cb, _, old = allocate_checkpointing_ssu_scratch(1, 2, 16, 16, torch.float16, torch.device("cpu"))
    assert cb.shape == (1, 2, 32, 8) and old.shape == (1, 2, 32, 8)
    pool, inp = _pool(0), _step(0, 2, 1)
    out = torch.empty_like(inp["x"])
    with_scratch = checkpointing_ssu(
        *pool.values(), inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], out, D=inp["D"],
        state_batch_indices=torch.tensor([1, 2], dtype=torch.int32), cb_scaled=cb, cumAdt_vec=cum, cb_old=old,
        algorithm="two-kernel",
    )  # fmt: skip
    assert with_scratch is out and bool(out.isfinite().all())


@pytest.mark.parametrize(
    ("args", "match"),
    [
        pytest.param((0, 4, 1, 4), "batch_size and num_heads", id="batch-0"),
        pytest.param((2, -1, 1, 4), "batch_size and num_heads", id="heads-negative"),
        pytest.param((2, 4, 0, 4), "num_predicted_tokens", id="tokens-0"),
        pytest.param((2, 4, 17, 4), "num_predicted_tokens", id="tokens-17"),
        pytest.param((2, 4, 1, 0), "max_window", id="window-0"),
        pytest.param((2, 4, 1, 17), "max_window", id="window-17"),
    ],
)
def test_scratch_bounds_are_flashinfers(args, match):
    with pytest.raises(ValueError, match=match):
        allocate_checkpointing_ssu_scratch(*args, torch.bfloat16, "cpu")


def test_mismatched_scratch_is_a_named_error_before_anything_is_written():
    pool, inp = _pool(1), _step(1, 2, 1)
    before = {k: v.clone() for k, v in pool.items()}
    cb, cum, _ = allocate_checkpointing_ssu_scratch(2, H, 1, 4, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="cb_scaled"):
        checkpointing_ssu(*pool.values(), inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], torch.empty_like(inp["x"]),
                          cb_scaled=cb, cumAdt_vec=cum)  # fmt: skip
    for name in pool:
        assert torch.equal(pool[name], before[name]), name
