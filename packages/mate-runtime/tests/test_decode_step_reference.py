"""``mamba2_decode_step`` on the reference backend: bit for bit the three public ops in sequence as vLLM 0.33's
mixer calls them (conv1d update with SiLU, the SSU with the tied per-head parameters and softplus, the gated norm
after the gate), over the cases the kernels are tested on; the pad rule; and the contract's errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

from mate.mamba import (  # noqa: E402
    causal_conv1d_update,
    mamba2_decode_step,
    rms_norm_gated,
    selective_state_update,
)
from test_decode_step_kernels import CASES, Case, build, clone  # noqa: E402


def three_ops(kw: dict) -> torch.Tensor:
    """The decode step as vLLM's mixer runs it, with MATE's three public ops on the reference backend."""
    ssm, conv, idx = kw["ssm_state"], kw["conv_state"], kw["state_indices"]
    H, P, N = ssm.shape[1:]
    G, hp, pad = kw["ngroups"], H * P, kw["pad_slot_id"]
    xBC = causal_conv1d_update(kw["xBC"].clone(), conv, kw["conv_weight"], kw["conv_bias"], "silu",
                               conv_state_indices=idx, null_block_id=pad, backend="torch")  # fmt: skip
    x, B, C = torch.split(xBC, [hp, G * N, G * N], dim=-1)
    y = torch.empty(xBC.shape[0], H, P, dtype=xBC.dtype)
    D = kw["D"]
    selective_state_update(
        ssm, x.view(-1, H, P), kw["dt"][:, :, None].expand(-1, -1, P), kw["A"][:, None, None].expand(-1, P, N),
        B.view(-1, G, N), C.view(-1, G, N), None if D is None else D[:, None].expand(-1, P),
        dt_bias=kw["dt_bias"][:, None].expand(-1, P), dt_softplus=True, state_batch_indices=idx, pad_slot_id=pad,
        out=y, backend="torch",
    )  # fmt: skip
    return rms_norm_gated(y.view(-1, hp), kw["norm_weight"], None, kw["z"], kw["eps"], kw["norm_group_size"], False,
                          backend="torch")  # fmt: skip


@pytest.mark.parametrize("c", CASES)
def test_reference_is_the_three_ops_bit_for_bit(c):
    kw = build(c, "cpu")
    xBC = kw["xBC"].clone()
    a, b = clone(kw), clone(kw)
    got = mamba2_decode_step(**a, backend="torch")
    want = three_ops(b)
    assert torch.equal(got, want)
    assert torch.equal(a["conv_state"], b["conv_state"]) and torch.equal(a["ssm_state"], b["ssm_state"])
    assert torch.equal(kw["xBC"], xBC), "xBC is not written"
    assert not torch.equal(a["ssm_state"], kw["ssm_state"]), "the call updated the pool"


def test_pad_sequences_write_nothing_and_out_is_given():
    c = Case(batch=3, pads=(0, 2))
    kw = build(c, "cpu")
    a = clone(kw)
    out = torch.full_like(kw["z"], 7.0)
    got = mamba2_decode_step(**a, out=out, backend="torch")
    assert got is out and not torch.equal(out[0], torch.full_like(out[0], 7.0))
    live = int(kw["state_indices"][1])
    others = [s for s in range(kw["ssm_state"].shape[0]) if s != live]
    assert torch.equal(a["ssm_state"][others], kw["ssm_state"][others])
    assert torch.equal(a["conv_state"][others], kw["conv_state"][others])
    assert not torch.equal(a["conv_state"][live], kw["conv_state"][live])


def test_two_calls_chain_the_states():
    """The second call reads what the first wrote (the layer's next token), as the three ops do."""
    kw = build(Case(pads=()), "cpu")
    a, b = clone(kw), clone(kw)
    for _ in range(2):
        assert torch.equal(mamba2_decode_step(**a, backend="torch"), three_ops(b))
    assert torch.equal(a["ssm_state"], b["ssm_state"]) and torch.equal(a["conv_state"], b["conv_state"])


def _bad(kw, **change):
    kw = dict(kw, **change)
    return lambda: mamba2_decode_step(**kw, backend="torch")


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        pytest.param(lambda kw: {"xBC": kw["xBC"][:, 1:]}, ValueError, "xBC", id="xBC-channels"),
        pytest.param(lambda kw: {"xBC": kw["xBC"].t().contiguous().t()}, ValueError, "xBC", id="xBC-strided"),
        pytest.param(lambda kw: {"z": kw["z"].float()}, ValueError, "z", id="z-dtype"),
        pytest.param(lambda kw: {"dt": kw["dt"][:, :2]}, ValueError, "dt", id="dt-shape"),
        pytest.param(lambda kw: {"ngroups": 3}, ValueError, "ngroups", id="ngroups-divisor"),
        pytest.param(lambda kw: {"ngroups": 4}, ValueError, "xBC", id="ngroups-channels"),
        pytest.param(lambda kw: {"conv_weight": kw["conv_weight"][:, :1]}, ValueError, "conv_weight", id="width-1"),
        pytest.param(lambda kw: {"conv_state": kw["conv_state"][:, :, :1]}, ValueError, "conv_state", id="state-len"),
        pytest.param(
            lambda kw: {"ssm_state": kw["ssm_state"].transpose(2, 3)}, ValueError, "ssm_state", id="ssm-inner-dense"
        ),  # fmt: skip
        pytest.param(
            lambda kw: {"ssm_state": kw["ssm_state"].to(torch.int8)},
            NotImplementedError,
            "ssm_state",
            id="quantised-pool",
        ),  # fmt: skip
        pytest.param(lambda kw: {"A": kw["A"].to(torch.bfloat16)}, ValueError, "A", id="A-dtype"),
        pytest.param(lambda kw: {"D": kw["D"][:2]}, ValueError, "D", id="D-shape"),
        pytest.param(lambda kw: {"norm_weight": kw["norm_weight"][:8]}, ValueError, "norm_weight", id="norm-weight"),
        pytest.param(lambda kw: {"norm_group_size": 100}, ValueError, "norm_group_size", id="norm-group"),
        pytest.param(
            lambda kw: {"state_indices": kw["state_indices"].float()}, ValueError, "state_indices", id="table-dtype"
        ),  # fmt: skip
        pytest.param(
            lambda kw: {"state_indices": kw["state_indices"][:2]}, ValueError, "state_indices", id="table-rows"
        ),  # fmt: skip
        pytest.param(
            lambda kw: {"state_indices": torch.tensor([0, 99, 1], dtype=torch.int32)},
            ValueError,
            "state_indices",
            id="slot-out-of-range",
        ),  # fmt: skip
        pytest.param(lambda kw: {"pad_slot_id": None}, ValueError, "pad_slot_id", id="pad-none"),
        pytest.param(lambda kw: {"eps": -1.0}, ValueError, "eps", id="eps"),
        pytest.param(
            lambda kw: {"out": torch.empty_like(kw["z"], dtype=torch.float32)}, ValueError, "out", id="out-dtype"
        ),  # fmt: skip
    ],
)
def test_contract_errors_name_the_argument_before_writing(change, error, name):
    kw = build(Case(), "cpu")
    before = clone(kw)
    with pytest.raises(error, match=rf"^{name}\b|{name}:"):
        _bad(kw, **change(kw))()
    assert torch.equal(kw["ssm_state"], before["ssm_state"]) and torch.equal(kw["conv_state"], before["conv_state"])


def test_traced_call_is_the_custom_op():
    kw = build(Case(pads=()), "cpu")
    a, b = clone(kw), clone(kw)
    compiled = torch.compile(lambda **k: mamba2_decode_step(**k, backend="torch"), fullgraph=True, backend="eager")
    got = compiled(**a)
    assert torch.equal(got, mamba2_decode_step(**b, backend="torch"))
    assert torch.equal(a["ssm_state"], b["ssm_state"]) and torch.equal(a["conv_state"], b["conv_state"])
