"""The multi-layer materialisation kernel's generated CUDA (``materialize_replayed_layers`` on the TileLang
backend), run on the CPU (``tests/emulate``): the cases of ``tests/gpu/test_materialize_layers_kernels.py``, the
kernel reading CPU addresses from the pointer tables, against the per-layer loop of the reference. Needs TileLang
(no nvcc) and g++."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "emulate"), str(HERE / "gpu")]

from cuda_emulator import launch_spec, unavailable  # noqa: E402
from mate.mamba._contract.replay import normalize_materialize_layers  # noqa: E402
from mate.mamba._tilelang import replay_plan  # noqa: E402
from test_materialize_layers_kernels import CASES, check, config, pointer_tables  # noqa: E402

pytestmark = pytest.mark.emulated
if (why := unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)


def emulated_kernel(layers, tables, c) -> None:
    """The planner's spec and arguments for the call, run over the launch grid ``(P blocks, layers * heads,
    batch)``."""
    call = normalize_materialize_layers(*pointer_tables(layers, c).values(), *tables.values(), **config(c, "cpu"))
    spec, args = replay_plan.plan_materialize_layers(call)
    launch_spec(spec, args, dim=c.P, heads=len(c.slots) * c.H, rows=c.batch)


@pytest.mark.parametrize("c", CASES)
def test_emulated_layers_match_per_layer_loop(c):
    check(c, run=emulated_kernel, dev="cpu")
