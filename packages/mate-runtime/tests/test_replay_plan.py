"""The ReplaySSM planner on the CPU: the staged rows it picks, the ring it refuses, the design it picks by batch,
the specs prewarm compiles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from mate.mamba import plan_replay_state_update, prewarm_replay_state_update
from mate.mamba._tilelang import replay_plan
from mate.mamba._tilelang.specs import MaterializeSpec, ReplayRowsSpec, ReplaySpec, ReplayTableSpec

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
@pytest.mark.parametrize("batch", [pytest.param(6, id="table-design"), pytest.param(12, id="fused")])
def test_plan_stages_the_ring_and_the_tokens(packed, batch):
    pool, kw = build(Case(T=3, L=20, packed=packed, batch=batch, slots=16), dev="cpu")
    specs = plan_replay_state_update(*pool.values(), **kw)
    for spec in specs:
        assert (spec.ring_rows, spec.new_rows) == (32, 4)
        assert spec.vector_io  # dense rings: 16-byte pieces
    assert len(specs) == (2 if batch <= replay_plan.TABLE_MAX_SEQUENCES else 1)


@pytest.mark.parametrize("batch", [5, 8, 9, 64])
def test_small_batches_take_the_table_design(batch):
    """Up to TABLE_MAX_SEQUENCES sequences: the table kernel, then the rows kernel (more CTAs than the fused
    kernel's: fewer state chunks per thread, programmatic dependent launch on the planning default, an H200);
    above: the fused kernel."""
    pool, kw = build(Case(state=torch.bfloat16, H=128, G=8, batch=batch, slots=80), dev="cpu")
    specs = plan_replay_state_update(*pool.values(), **kw)
    if batch > replay_plan.TABLE_MAX_SEQUENCES:
        assert [type(s) for s in specs] == [ReplaySpec]
        return
    table, rows = specs
    assert isinstance(table, ReplayTableSpec) and isinstance(rows, ReplayRowsSpec)
    assert (table.heads_per_group, table.heads_per_cta, table.pdl, rows.pdl) == (16, 16, True, True)
    fused = replay_plan.spec_for(dim=64, dstate=128, heads_per_group=16, vector_state=True, vector_io=True,
                                 dtypes={"state_dtype": torch.bfloat16, "io_dtype": torch.bfloat16,
                                         "dt_dtype": torch.float32, "slot_dtype": torch.int32})  # fmt: skip
    assert rows.tiling.block_p < fused.tiling.block_p


def test_forcing_a_design():
    pool, kw = build(Case(batch=10, slots=12), dev="cpu")
    with replay_plan.forcing("table"):
        assert [type(s) for s in plan_replay_state_update(*pool.values(), **kw)] == [ReplayTableSpec, ReplayRowsSpec]
        # the workspace holds the forced call's sequences
        assert replay_plan.table_workspace("cpu", 8, 32, 1, nseq=10).shape[0] == 10
    with replay_plan.forcing("fused"):
        pool, kw = build(Case(batch=6), dev="cpu")
        assert [type(s) for s in plan_replay_state_update(*pool.values(), **kw)] == [ReplaySpec]
    with pytest.raises(ValueError, match="design"), replay_plan.forcing("split"):
        pass


def test_table_heads_per_cta_divide_the_group():
    assert [replay_plan.table_heads_per_cta(r) for r in (1, 6, 16, 24, 80, 128)] == [1, 6, 16, 12, 16, 16]


def test_plan_reads_rings_in_scalars_when_not_16_byte_aligned():
    pool, kw = build(Case(L=9), dev="cpu")
    xc = pool["x_cache"]
    big = torch.zeros(xc.shape[0], xc.shape[1], xc.shape[2], xc.shape[3] + 1, dtype=xc.dtype)
    pool["x_cache"] = big[..., 1:]  # the last dim dense, its rows 65 values apart
    specs = plan_replay_state_update(*pool.values(), **kw)
    assert specs and not any(spec.vector_io for spec in specs)


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
    # the table design's kernels of the same calls (small batches): a table kernel per dt dtype, one rows kernel
    tables = [s for s in one if isinstance(s, ReplayTableSpec)]
    (rows,) = [s for s in one if isinstance(s, ReplayRowsSpec)]
    assert {s.dt_dtype for s in tables} == {"float32", "bfloat16"} and (rows.ring_rows, rows.new_rows) == (32, 1)
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
