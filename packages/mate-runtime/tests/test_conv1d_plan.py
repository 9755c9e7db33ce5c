"""The causal conv1d planner (CPU, no TileLang): the update's kernels for the benchmark's calls (vLLM's layout, one
token and MTP) are among those prewarm compiles, its tokens per step follow the call form, and a call with nothing
to read launches nothing."""

from __future__ import annotations

import pytest
import torch
from mate.mamba._contract.conv1d import normalize_conv1d_update
from mate.mamba._tilelang import conv1d_plan
from mate.mamba._tilelang.conv1d import serving_specs
from mate.mamba.bench import conv1d as bench


def _bench_call(T: int, batch: int = 4, dim: int = 256):
    w = bench.make_window(bench.Planned("c", "update", str(batch), T), dim, 1, torch.device("cpu"))
    kw = {k: w[k] for k in ("num_accepted_tokens", "query_start_loc", "max_query_len") if k in w}
    return normalize_conv1d_update(w["x"], w["conv_state"], w["weight"], w["bias"], "silu", w["conv_state_indices"],
                                   **kw)  # fmt: skip


@pytest.mark.parametrize("T", [1, bench.MTP])
def test_prewarm_compiles_the_kernel_of_vllms_calls(T):
    spec = conv1d_plan.spec_update(_bench_call(T))
    served = serving_specs(dim=256, width=bench.WIDTH, io_dtype=torch.bfloat16, state_dtype=torch.bfloat16,
                           weight_dtype=torch.bfloat16, index_dtype=torch.int32, has_bias=True, silu=True)  # fmt: skip
    assert spec in served
    assert spec.vec == 8 and spec.threads == conv1d_plan.TUNING["update_threads"]
    assert spec.group == (1 if T == 1 else conv1d_plan.TUNING["mtp_group"])


def test_update_group_follows_the_call_form():
    assert conv1d_plan.update_group(varlen=False, spec_decode=False) == 1
    for varlen, spec_decode in ((True, True), (False, True), (True, False)):
        assert conv1d_plan.update_group(varlen, spec_decode) == conv1d_plan.TUNING["mtp_group"]


def test_update_without_tokens_or_slots_launches_nothing():
    """The kernel reads at indices clamped into x and the pool: with either empty there is nothing to launch."""
    x = torch.randn(3, 64, 0)
    pool = torch.randn(5, 64, 3)
    w = torch.randn(64, 4)
    assert conv1d_plan.plan_update(normalize_conv1d_update(x, pool, w)) is None
    empty = torch.randn(0, 64, 3)
    call = normalize_conv1d_update(torch.randn(3, 64), empty, w, conv_state_indices=torch.zeros(3, dtype=torch.int32))
    assert conv1d_plan.plan_update(call) is None
    assert conv1d_plan.plan_update(normalize_conv1d_update(torch.randn(3, 64), pool, w)) is not None
