"""The TileLang causal conv1d kernels' generated CUDA, run on the CPU (``tests/emulate``), against the reference
backend: the cases of ``tests/gpu/test_conv1d_kernels.py``, each call planned as the TileLang backend plans it and
its kernel executed from the source its compiled kernel has; and tables out of range stay inside the tensors.
Needs TileLang (no nvcc) and g++."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "emulate"), str(HERE / "gpu")]

from cuda_emulator import Emulated, unavailable  # noqa: E402
from mate.mamba._contract.conv1d import normalize_conv1d_fn, normalize_conv1d_update  # noqa: E402
from mate.mamba._tilelang import conv1d_plan  # noqa: E402
from test_conv1d_kernels import CASES, F32, Case, build, check  # noqa: E402

pytestmark = pytest.mark.emulated
if (why := unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)

_built: dict = {}


def _run(spec, args, grid):
    em = _built.get(spec)
    if em is None:
        em = _built[spec] = Emulated(spec.build(), spec.pass_configs())
    em(*args, grid=grid, threads=spec.threads)


def emulated(fn, args):
    """The public call's TileLang path with its kernel run on the CPU: normalise, plan, launch."""
    if fn.__name__ == "causal_conv1d_fn":
        call = normalize_conv1d_fn(**args)
        planned = conv1d_plan.plan_fn(call)
        if planned is not None:
            _run(*planned, conv1d_plan.grid_fn(planned[0], call))
        return call.out
    call = normalize_conv1d_update(**args)
    planned = conv1d_plan.plan_update(call)
    if planned is not None:
        _run(*planned, conv1d_plan.grid_update(planned[0], call))
    return call.result


@pytest.mark.parametrize("c", CASES)
def test_emulated_kernel_matches_reference(c):
    check(replace(c, dim=min(c.dim, 136)), kernel=emulated, dev="cpu")


@pytest.mark.parametrize(
    ("c", "vec"),
    [pytest.param(Case(layout="token-contiguous"), 8, id="fn-vllm-layout"),
     pytest.param(Case(form="one", layout="token-contiguous"), 8, id="update-vllm-layout"),
     pytest.param(Case(form="one", io=F32, layout="token-contiguous"), 4, id="update-fp32-x"),
     pytest.param(Case(form="one"), 1, id="update-pool-dim-strided"),
     pytest.param(Case(form="one", layout="token-contiguous", dim=100), 1, id="update-dim-not-multiple"),
     pytest.param(Case(form="one", layout="misaligned"), 1, id="update-misaligned"),
     pytest.param(Case(layout="misaligned"), 1, id="fn-misaligned")],
)  # fmt: skip
def test_planner_picks_the_vector_form_where_the_layout_allows(c, vec):
    fn, args, _ = build(replace(c, dim=min(c.dim, 136)), 0, "cpu")
    if fn.__name__ == "causal_conv1d_fn":
        spec = conv1d_plan.spec_fn(normalize_conv1d_fn(**args))
    else:
        spec = conv1d_plan.spec_update(normalize_conv1d_update(**args))
    assert spec.vec == vec


def test_fast_path_launcher_rechecks_the_alignment(monkeypatch):
    """The launcher a call leaves picks its kernel per call by the pointers' alignment."""
    from mate.mamba._tilelang import conv1d as launcher

    used = []
    monkeypatch.setattr(launcher, "kernel", lambda spec, device: lambda *a: used.append(spec.vec))
    c = Case(form="one", layout="token-contiguous", dim=64)
    _, args, _ = build(c, 0, "cpu")
    call = normalize_conv1d_update(**args)
    launch = launcher._launcher(call, conv1d_plan.spec_update, conv1d_plan.args_update)
    launch(call)
    _, bad, _ = build(replace(c, layout="misaligned"), 0, "cpu")
    launch(normalize_conv1d_update(**bad))
    launch(call)
    assert used == [8, 1, 8]


def test_emulated_fn_across_token_blocks():
    """Sequences crossing the 64-token blocks at every offset of their first width - 1 tokens (the CTA holding a
    sequence's first token runs them and alone touches its state)."""
    for seed in range(3):
        check(Case(dim=40), kernel=emulated, dev="cpu", seed=seed)


def test_emulated_tables_out_of_range_stay_inside_the_tensors():
    """Slots past the pool and below zero, accepted counts far outside, query starts past the tokens: no
    access outside the tensors (the emulator would fault or corrupt the guard bytes), slots not named untouched."""
    fn, args, _ = build(Case(form="varlen", mtp=True, dim=24), 0, "cpu")
    pool0 = args["conv_state"].clone()
    args["conv_state_indices"] = torch.tensor([[40], [-7], [3], [1000], [5], [2]], dtype=torch.int32)
    args["num_accepted_tokens"] = torch.tensor([90, -4, 1, 2, 1000, 0], dtype=torch.int32)
    args["query_start_loc"] = torch.tensor([0, 3, 900, 2, 5, 1 << 30, 7], dtype=torch.int32)
    emulated(fn, args)
    for s in set(range(pool0.shape[0])) - {3, 5, 2}:
        assert torch.equal(args["conv_state"][s], pool0[s])
