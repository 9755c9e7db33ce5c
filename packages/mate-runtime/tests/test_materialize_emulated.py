"""The TileLang materialisation kernel's generated CUDA, run on the CPU (``tests/emulate``), against the
reference backend: the cases and checks of the GPU test ``tests/gpu/test_materialize_kernels.py``, with the
kernel the planner picks for each call executed from the exact source its compiled kernel has. Needs TileLang
(no nvcc) and g++."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "emulate"), str(HERE / "gpu")]

from cuda_emulator import launch_spec, unavailable  # noqa: E402
from mate.mamba._contract.replay import normalize_materialize  # noqa: E402
from mate.mamba._tilelang import replay_plan  # noqa: E402
from test_materialize_kernels import CASES, MCase, check, check_out_of_range  # noqa: E402

pytestmark = pytest.mark.emulated
if (why := unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)


def emulated_kernel(pool, tables) -> None:
    """``materialize_replayed_state`` on the TileLang backend, its kernel run on the CPU: the planner's spec and
    arguments for the call, the launch grid ``(P blocks, heads, requests)``."""
    t = dict(tables)
    call = normalize_materialize(*pool.values(), t["ring_start"], t["replay_prefix_len"], t["src_slots"],
                                 t["dst_slots"], t.get("state_scale"), rand_seed=t.get("rand_seed"),
                                 philox_rounds=t.get("philox_rounds", 10))  # fmt: skip
    planned = replay_plan.plan_materialize(call)
    if planned is not None:
        launch_spec(*planned, dim=call.state.shape[2], heads=call.state.shape[1], rows=call.src.shape[0])


@pytest.mark.parametrize("c", CASES)
def test_emulated_materialize_matches_reference(c):
    if c.H * c.batch > 64:
        c = MCase(**{**c.__dict__, "H": 4})
    check(c, kernel=emulated_kernel, dev="cpu")


def test_emulated_tables_out_of_range_stay_inside_the_tensors():
    check_out_of_range(kernel=emulated_kernel, dev="cpu")
