"""The ReplaySSM planner on the CPU: the staged rows it picks, the ring it refuses, the specs prewarm compiles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from mate.mamba import plan_replay_state_update, prewarm_replay_state_update
from mate.mamba._tilelang import replay_plan
from mate.mamba._tilelang.specs import MaterializeSpec, ReplaySpec

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from test_replay_kernels import Case, build  # noqa: E402


@pytest.mark.parametrize(
    "L, T, rows",
    [
        pytest.param(17, 1, (32, 1), id="vllm-default-one-token"),  # --replayssm-buffer-len 16, T 1
        pytest.param(22, 6, (32, 8), id="vllm-default-mtp6"),
        pytest.param(8, 1, (16, 1), id="short-ring"),
        pytest.param(16, 16, (16, 16), id="tokens-fill-the-ring"),
        pytest.param(64, 3, (64, 4), id="longest-ring"),
    ],
)
def test_staged_rows(L, T, rows):
    assert replay_plan.staged_rows(L, T) == rows


@pytest.mark.parametrize("packed", [pytest.param(False, id="mtp"), pytest.param(True, id="packed")])
def test_plan_stages_the_ring_and_the_tokens(packed):
    pool, kw = build(Case(T=3, L=20, packed=packed), dev="cpu")
    (spec,) = plan_replay_state_update(*pool.values(), **kw)
    assert (spec.ring_rows, spec.new_rows) == (32, 4)
    assert spec.vector_io  # dense rings: 16-byte pieces


def test_plan_reads_rings_in_scalars_when_not_16_byte_aligned():
    pool, kw = build(Case(L=9), dev="cpu")
    xc = pool["x_cache"]
    big = torch.zeros(xc.shape[0], xc.shape[1], xc.shape[2], xc.shape[3] + 1, dtype=xc.dtype)
    pool["x_cache"] = big[..., 1:]  # the last dim dense, its rows 65 values apart
    (spec,) = plan_replay_state_update(*pool.values(), **kw)
    assert not spec.vector_io


def test_a_ring_past_64_rows_is_not_implemented_before_anything_is_written():
    pool, kw = build(Case(L=65), dev="cpu")
    before = {k: v.clone() for k, v in pool.items()}
    with pytest.raises(NotImplementedError, match="L=65"):
        plan_replay_state_update(*pool.values(), **kw)
    assert all(torch.equal(before[k], pool[k]) for k in pool)


def test_serving_specs_follow_window_and_tokens():
    kw = dict(state_dtype=torch.bfloat16, io_dtype=torch.bfloat16, heads=128, dim=64, dstate=128, groups=8,
              slot_dtype=torch.int32)  # fmt: skip
    one = replay_plan.serving_specs(**kw)
    mtp = replay_plan.serving_specs(**kw, window=16, tokens=6)
    decode = [s for s in one if isinstance(s, ReplaySpec)]
    assert {(s.ring_rows, s.new_rows) for s in decode} == {(32, 1)}
    assert {(s.ring_rows, s.new_rows) for s in mtp if isinstance(s, ReplaySpec)} == {(32, 8)}
    assert {s.dt_dtype for s in decode} == {"float32", "bfloat16"}
    # and the materialisation of the same pools (the slot dtype's tables, the same staged ring)
    (mat,) = [s for s in one if isinstance(s, MaterializeSpec)]
    assert (mat.ring_rows, mat.index_dtype, mat.state_dtype) == (32, "int32", "bfloat16")


@pytest.mark.parametrize(
    "bad, match",
    [
        pytest.param(dict(tokens=0), "tokens", id="tokens-0"),
        pytest.param(dict(window=-1), "window", id="window-negative"),
        pytest.param(dict(groups=3), "groups", id="groups-not-a-divisor"),
        pytest.param(dict(philox_rounds=10), "philox_rounds", id="rounds-beside-bf16"),
    ],
)
def test_prewarm_validates(bad, match):
    kw = dict(state_dtype=torch.bfloat16, io_dtype=torch.bfloat16, heads=8, dim=64, dstate=128, groups=2)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        prewarm_replay_state_update(**kw)


def test_backend_plan_names_the_materialisation_kernel():
    """The backend's plan of a one-layer materialisation is its kernel's spec (it once went to the decode's planner)."""
    from mate.mamba._contract.replay import normalize_materialize
    from mate.mamba._tilelang import backend

    S, H, P, N, L = 4, 4, 64, 128, 16
    call = normalize_materialize(
        torch.zeros(S, H, P, N), torch.zeros(S, H, L, P, dtype=torch.bfloat16),
        torch.zeros(S, 1, L, N, dtype=torch.bfloat16), torch.zeros(S, H, L), -torch.ones(H),
        torch.zeros(2, dtype=torch.int32), torch.tensor([3, 0], dtype=torch.int32),
        torch.tensor([0, 1], dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32),
    )  # fmt: skip
    (spec,) = backend.plan("materialize", call)
    assert isinstance(spec, MaterializeSpec) and (spec.dim, spec.dstate, spec.ring_rows) == (P, N, L)
