"""Property tests of the contract (hypothesis): the normalisers and the reference backend over random calls.

- Random valid calls of every form (one token per sequence with flat tables and sentinels, the dense MTP step with
  2-D tables and ``num_accepted_tokens``, packed varlen rows with ``cu_seqlens`` and empty sequences, the
  intermediate buffer with and without entry indices, EAGLE trees with ``retrieve_parent_token``; the SSD prefill
  with and without initial states, continuing sequences, D / z / dt_bias / softplus / dt limits, chunk-end or
  pooled final states) agree with the float64 recurrence of ``mate.mamba.testing``; slots and entries the call does not
  write stay bit-identical.
- Random invalid calls (a valid call with one mistake) raise ``ValueError`` / ``NotImplementedError`` whose message
  starts with the argument at fault, and every tensor of the call is bit-identical afterwards.

Derandomized (the same examples on every run) and sized to run in well under a minute on two cores.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mate.mamba import selective_state_update, ssd_combined_fwd_varlen
from mate.mamba.chunking import chunk_metadata
from mate.mamba.testing import ssd_recurrence, ssu_recurrence

I32, I64, F32 = torch.int32, torch.int64, torch.float32
PROPERTY = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _gen(draw) -> torch.Generator:
    return torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1), label="seed"))


def _randn(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def _perm(g, n, k):
    """``k`` distinct slots out of ``n``."""
    return torch.randperm(n, generator=g)[:k]


# --------------------------------------------------------------------------------------------- SSU calls


@st.composite
def ssu_calls(draw):
    """(form, keyword arguments of a valid selective_state_update call)."""
    g = _gen(draw)
    form = draw(st.sampled_from(["one", "dense", "packed", "ibuf", "tree"]), label="form")
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2]))
    P = draw(st.sampled_from([2, 4]))
    N = draw(st.sampled_from([4, 8]))
    idx = draw(st.sampled_from([I32, I64]))
    batch = draw(st.integers(1, 3))
    T = 1 if form == "one" else draw(st.integers(1, 4))
    S = 2 * batch * max(T, 4) + 3  # room for every table, packed destinations as wide as the longest sequence
    if form == "packed":
        lens = draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch))
        rows = sum(lens)
        lead = (rows,)
    elif form == "one":
        lead = (batch,)
    else:
        lead = (batch, T)
    kw = dict(
        state=_randn(g, S, H, P, N),
        x=_randn(g, *lead, H, P),
        A=-torch.rand(H, generator=g) - 0.1,
        B=_randn(g, *lead, G, N),
        C=_randn(g, *lead, G, N),
        D=_randn(g, H) if draw(st.booleans()) else None,
    )
    kw["dt"] = torch.rand(*lead, H, P, generator=g) * 0.5
    if draw(st.booleans()):
        kw["dt"] = kw["dt"][..., :1].expand(*lead, H, P)  # the tied per-head form
    if draw(st.booleans()):
        kw["z"] = _randn(g, *lead, H, P)
    if draw(st.booleans()):
        kw["dt_bias"] = torch.rand(H, generator=g) * 0.2
        kw["dt_softplus"] = draw(st.booleans())
    slots = _perm(g, S, 2 * batch * T)
    pad = draw(st.sampled_from([-1, S + 5]))
    if form == "one":
        if draw(st.booleans()):
            src = slots[:batch].clone()
            if draw(st.booleans()):
                src[draw(st.integers(0, batch - 1))] = pad  # a padded sequence
            kw["state_batch_indices"], kw["pad_slot_id"] = src.to(idx), pad
            if draw(st.booleans()):
                kw["dst_state_batch_indices"] = slots[batch : 2 * batch].to(idx)
        kw["disable_state_update"] = draw(st.booleans())
    elif form == "dense":
        kw["state_batch_indices"] = slots[: batch * T].view(batch, T).to(idx)
        if draw(st.booleans()):
            kw["num_accepted_tokens"] = torch.tensor(
                draw(st.lists(st.integers(0, T), min_size=batch, max_size=batch)), dtype=idx
            )
        if draw(st.booleans()):
            kw["dst_state_batch_indices"] = slots[batch * T :].view(batch, T).to(idx)
    elif form == "packed":
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        kw["cu_seqlens"] = torch.tensor(cu, dtype=idx)
        kw["state_batch_indices"] = slots[:batch].to(idx)
        if draw(st.booleans()):
            width = max(max(lens), 1)
            kw["dst_state_batch_indices"] = _perm(g, S, batch * width).view(batch, width).to(idx)
    else:  # the intermediate buffer (and, for trees, parent tokens)
        steps = T + draw(st.integers(0, 1))
        entries = S + 1
        kw["intermediate_states_buffer"] = _randn(g, entries, steps, H, P, N)
        kw["state_batch_indices"] = slots[:batch].to(idx)
        if draw(st.booleans()):
            kw["intermediate_state_indices"] = _perm(g, entries, batch).to(idx)
        if form == "tree":
            kw["retrieve_parent_token"] = torch.tensor(
                [[-1] + [draw(st.integers(-1, t - 1)) for t in range(1, T)] for _ in range(batch)], dtype=idx
            )
    return form, kw


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(-1).view(torch.uint8).clone()


def _snapshot(kw: dict) -> dict:
    return {k: _bits(v) for k, v in kw.items() if isinstance(v, torch.Tensor)}


def _same_bits(kw: dict, before: dict) -> list[str]:
    return [k for k, b in before.items() if not torch.equal(_bits(kw[k]), b)]


@PROPERTY
@given(ssu_calls())
def test_valid_decode_calls_agree_with_the_recurrence(call):
    form, kw = call
    want = ssu_recurrence(**kw)
    state0 = kw["state"].clone()
    ibuf0 = None if kw.get("intermediate_states_buffer") is None else kw["intermediate_states_buffer"].clone()
    y = selective_state_update(**kw, backend="torch")
    torch.testing.assert_close(y.double(), want.y64, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kw["state"], want.state, atol=1e-4, rtol=1e-4)
    untouched = [s for s in range(state0.shape[0]) if s not in want.written]
    assert torch.equal(kw["state"][untouched], state0[untouched]), f"{form}: a slot the call does not name changed"
    if ibuf0 is not None:
        got = kw["intermediate_states_buffer"]
        torch.testing.assert_close(got, want.ibuf, atol=1e-4, rtol=1e-4)
        flat, flat0 = got.flatten(0, 1), ibuf0.flatten(0, 1)
        keep = [i for i in range(flat.shape[0]) if i not in want.ibuf_written]
        assert torch.equal(flat[keep], flat0[keep]), f"{form}: an intermediate entry the call does not write changed"


# --------------------------------------------------------------------------------------------- SSD calls


@st.composite
def ssd_calls(draw):
    """(sequence lengths, keyword arguments of a valid ssd_combined_fwd_varlen call)."""
    g = _gen(draw)
    G = draw(st.sampled_from([1, 2]))
    H = G * draw(st.sampled_from([1, 2]))
    P, N = 4, draw(st.sampled_from([4, 8]))
    L = draw(st.sampled_from([8, 16]))
    idx = draw(st.sampled_from([I32, I64]))
    seqlens = draw(st.lists(st.integers(1, 24), min_size=1, max_size=3), label="seqlens")
    history = draw(st.lists(st.integers(0, 20), min_size=len(seqlens), max_size=len(seqlens)))
    meta = chunk_metadata(seqlens, L, history=history)
    T, batch = sum(seqlens), len(seqlens)
    kw = dict(
        x=_randn(g, T, H, P),
        dt=_randn(g, T, H, scale=0.5),
        A=-torch.rand(H, generator=g) - 0.1,
        B=_randn(g, T, G, N),
        C=_randn(g, T, G, N),
        chunk_size=L,
        cu_seqlens=meta.cu_seqlens.to(idx),
        cu_chunk_seqlens=meta.cu_chunk_seqlens.to(idx),
        last_chunk_indices=meta.last_chunk_indices.to(idx),
        seq_idx=meta.seq_idx.to(idx),
        out=torch.zeros(T, H, P),
    )
    if draw(st.booleans()):
        kw["D"] = _randn(g, H) if draw(st.booleans()) else _randn(g, H, P)
    if draw(st.booleans()):
        kw["z"] = _randn(g, T, H, P)
    if draw(st.booleans()):
        kw["dt_bias"] = torch.rand(H, generator=g) * 0.2
    kw["dt_softplus"] = draw(st.booleans())
    if draw(st.booleans()):
        kw["dt_limit"] = (0.0, 0.5)
    if draw(st.booleans()):
        kw["initial_states"] = _randn(g, batch, H, P, N)
    ending = draw(st.sampled_from(["final", "intermediate", "pool"]))
    if ending == "intermediate":
        kw["return_intermediate_states"] = True
    elif ending == "pool":
        kw["final_states_out"] = _randn(g, batch + 2, H, P, N)
        kw["final_state_indices"] = _perm(g, batch + 2, batch).to(idx)
    return seqlens, kw


@PROPERTY
@given(ssd_calls())
def test_valid_prefill_calls_agree_with_the_recurrence(call):
    seqlens, kw = call
    want = ssd_recurrence(
        kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], seqlens, D=kw.get("D"), z=kw.get("z"),
        dt_bias=kw.get("dt_bias"), dt_softplus=kw["dt_softplus"], dt_limit=kw.get("dt_limit", (0.0, math.inf)),
        initial_states=kw.get("initial_states"), cu_chunk_seqlens=kw["cu_chunk_seqlens"],
    )  # fmt: skip
    pool0 = None if kw.get("final_states_out") is None else kw["final_states_out"].clone()
    states = ssd_combined_fwd_varlen(**kw, backend="torch")
    torch.testing.assert_close(kw["out"].double(), want.y, atol=2e-4, rtol=2e-4)
    if kw.get("return_intermediate_states"):
        torch.testing.assert_close(states.double(), want.chunk_end, atol=2e-4, rtol=2e-4)
    elif pool0 is not None:
        assert states is None
        fsi = kw["final_state_indices"].long()
        torch.testing.assert_close(kw["final_states_out"][fsi].double(), want.final, atol=2e-4, rtol=2e-4)
        rest = [s for s in range(pool0.shape[0]) if s not in fsi.tolist()]
        assert torch.equal(kw["final_states_out"][rest], pool0[rest])
    else:
        torch.testing.assert_close(states.double(), want.final, atol=2e-4, rtol=2e-4)


# ------------------------------------------------------------------------------------------ invalid calls


def _decreasing(t):
    v = t.clone()
    v[-1] = v[-2] - 1 if v.numel() > 1 else -1
    return v


# (name, applies to the call, mutate the keyword arguments in place, the argument the error must name)
SSU_MISTAKES = [
    ("x_heads", lambda f, kw: True, lambda g, kw: kw.update(x=torch.randn(*kw["x"].shape[:-2], kw["x"].shape[-2] + 1,
                                                                       kw["x"].shape[-1])), "x"),
    ("x_int", lambda f, kw: True, lambda g, kw: kw.update(x=kw["x"].to(I32)), "x"),
    ("B_dstate", lambda f, kw: True, lambda g, kw: kw.update(B=torch.randn(*kw["B"].shape[:-1], kw["B"].shape[-1] + 1)),
     "B"),
    ("state_float64", lambda f, kw: True, lambda g, kw: kw.update(state=kw["state"].double()), "state"),
    ("A_heads", lambda f, kw: True, lambda g, kw: kw.update(A=-torch.rand(kw["A"].shape[0] + 1)), "A"),
    ("dt_bias_shape", lambda f, kw: True, lambda g, kw: kw.update(dt_bias=torch.rand(kw["A"].shape[0] + 2)), "dt_bias"),
    ("slot_past_pool", lambda f, kw: kw.get("state_batch_indices") is not None,  # every slot of sequence 0
     lambda g, kw: kw["state_batch_indices"].__setitem__(0, kw["state"].shape[0] + 7), "state_batch_indices"),
    ("slot_int16", lambda f, kw: kw.get("state_batch_indices") is not None,
     lambda g, kw: kw.update(state_batch_indices=kw["state_batch_indices"].to(torch.int16)), "state_batch_indices"),
    ("cu_seqlens_decreasing", lambda f, kw: f == "packed" and kw["cu_seqlens"].numel() > 2,
     lambda g, kw: kw.update(cu_seqlens=_decreasing(kw["cu_seqlens"])), "cu_seqlens"),
    ("accepted_past_table", lambda f, kw: kw.get("num_accepted_tokens") is not None,
     lambda g, kw: kw["num_accepted_tokens"].__setitem__(0, kw["x"].shape[1] + 1), "num_accepted_tokens"),
    ("entry_past_buffer", lambda f, kw: kw.get("intermediate_state_indices") is not None,
     lambda g, kw: kw["intermediate_state_indices"].__setitem__(0, kw["intermediate_states_buffer"].shape[0]),
     "intermediate_state_indices"),
    ("parent_past_steps", lambda f, kw: f == "tree" and kw["x"].shape[1] > 1,
     lambda g, kw: kw["retrieve_parent_token"].__setitem__((0, 1), kw["intermediate_states_buffer"].shape[1]),
     "retrieve_parent_token"),
    ("rand_seed", lambda f, kw: True, lambda g, kw: kw.update(rand_seed=torch.zeros(1, dtype=I64)), "rand_seed"),
    ("dst_with_buffer", lambda f, kw: f in ("ibuf", "tree"),
     lambda g, kw: kw.update(dst_state_batch_indices=kw["state_batch_indices"].clone()), "dst_state_batch_indices"),
]  # fmt: skip

SSD_MISTAKES = [
    ("x_heads", lambda kw: True, lambda kw: kw.update(x=torch.randn(kw["x"].shape[0], kw["x"].shape[1] + 1, 4)), "x"),
    ("B_tokens", lambda kw: True, lambda kw: kw.update(B=torch.randn(kw["B"].shape[0] + 1, *kw["B"].shape[1:])), "B"),
    ("cu_seqlens_short", lambda kw: True, lambda kw: kw["cu_seqlens"].__setitem__(-1, kw["cu_seqlens"][-1] - 1),
     "cu_seqlens"),
    ("cu_seqlens_decreasing", lambda kw: kw["cu_seqlens"].numel() > 2,
     lambda kw: kw.update(cu_seqlens=_decreasing(kw["cu_seqlens"])), "cu_seqlens"),
    ("chunks_short", lambda kw: True,
     lambda kw: kw["cu_chunk_seqlens"].__setitem__(-1, kw["cu_chunk_seqlens"][-1] - 1), "cu_chunk_seqlens"),
    ("seq_idx_past_batch", lambda kw: True,
     lambda kw: kw["seq_idx"].__setitem__(-1, kw["cu_seqlens"].numel() - 1), "seq_idx"),
    ("last_chunk_past_chunks", lambda kw: True,
     lambda kw: kw["last_chunk_indices"].__setitem__(0, kw["seq_idx"].numel()), "last_chunk_indices"),
    ("chunk_size_12", lambda kw: True, lambda kw: kw.update(chunk_size=12), "chunk_size"),
    ("dt_limit_reversed", lambda kw: True, lambda kw: kw.update(dt_limit=(1.0, 0.0)), "dt_limit"),
    ("initial_states_batch", lambda kw: kw.get("initial_states") is not None,
     lambda kw: kw.update(initial_states=torch.randn(len(kw["initial_states"]) + 1, *kw["initial_states"].shape[1:])),
     "initial_states"),
    ("pool_index_past_pool", lambda kw: kw.get("final_state_indices") is not None,
     lambda kw: kw["final_state_indices"].__setitem__(0, kw["final_states_out"].shape[0]), "final_state_indices"),
    ("checkpoints", lambda kw: True, lambda kw: kw.update(checkpoint_states=torch.zeros(1)), "checkpoint_states"),
]  # fmt: skip


def _named(exc: Exception, name: str) -> bool:
    msg = str(exc)
    return msg.startswith((f"{name}:", f"{name}=", f"{name} "))


@PROPERTY
@given(ssu_calls(), st.data())
def test_invalid_decode_calls_name_the_argument_and_write_nothing(call, data):
    form, kw = call
    mistakes = [m for m in SSU_MISTAKES if m[1](form, kw)]
    label, _, mutate, name = data.draw(st.sampled_from(mistakes), label="mistake")
    mutate(None, kw)
    before = _snapshot(kw)
    with pytest.raises((ValueError, NotImplementedError)) as info:
        selective_state_update(**kw, backend="torch")
    assert _named(info.value, name), f"{form}/{label}: {info.value}"
    assert not _same_bits(kw, before), f"{form}/{label}: {_same_bits(kw, before)} written by a rejected call"


@PROPERTY
@given(ssd_calls(), st.data())
def test_invalid_prefill_calls_name_the_argument_and_write_nothing(call, data):
    _, kw = call
    mistakes = [m for m in SSD_MISTAKES if m[1](kw)]
    label, _, mutate, name = data.draw(st.sampled_from(mistakes), label="mistake")
    mutate(kw)
    before = _snapshot(kw)
    with pytest.raises((ValueError, NotImplementedError)) as info:
        ssd_combined_fwd_varlen(**kw, backend="torch")
    assert _named(info.value, name), f"{label}: {info.value}"
    assert not _same_bits(kw, before), f"{label}: {_same_bits(kw, before)} written by a rejected call"
