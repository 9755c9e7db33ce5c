"""``mate.mamba.bench.host`` (the CPU-host proxy of the SSU and SSD eager host time) runs end to end on CPU."""

from __future__ import annotations

import pytest
import torch
from mate.mamba import ssu as api
from mate.mamba.bench import host


@pytest.mark.parametrize("make", [lambda: host.vllm_decode(2), lambda: host.vllm_mtp(2, 3)])
def test_measure_reaches_the_stubbed_launch(make):
    r = host.measure(make(), iters=3, repeats=1)  # raises when the stubbed kernel was never called
    for col in ("normalise", "plan", "mate.mamba", "mate.mamba slow"):
        assert r[col] > 0
    assert api.FAST.enabled is True and not api.FAST.cache  # switched back on, cache cleared


def test_production_calls_are_the_vllm_forms():
    _, decode, _, mtp, one_decode, one_mtp = host.production_calls()  # batch 8: a size-1 row dim has no stride
    kw = decode.kwargs
    assert kw["state"].storage_offset() > 0 and kw["state"].stride(0) > kw["state"][0].numel()
    assert kw["dt"].stride()[-1] == 0 and kw["A"].stride() == (1, 0, 0) and kw["D"].stride() == (1, 0)
    assert kw["x"].stride(0) == kw["B"].stride(0) == kw["C"].stride(0)  # rows of one conv buffer
    assert mtp.kwargs["state_batch_indices"].dim() == 2 and mtp.kwargs["cu_seqlens"] is not None
    for call in (decode, mtp):  # vLLM with prefix caching: two tables; without: one, as source and destination
        assert call.kwargs["dst_state_batch_indices"] is not call.kwargs["state_batch_indices"]
    for call in (one_decode, one_mtp):
        assert call.kwargs["dst_state_batch_indices"] is call.kwargs["state_batch_indices"]


@pytest.mark.parametrize("call", [host.vllm_decode(2), host.vllm_mtp(2, 3, one_table=True)], ids=["decode", "mtp"])
def test_hit_breakdown_times_a_hit(call):
    r = host.hit_breakdown(call, iters=3, repeats=1)  # raises when the form's check refuses its own call
    for col in ("check", "launch", "public call", "key"):
        assert r[col] > 0


@pytest.mark.parametrize("make", [host.vllm_prefill, host.bench_prefill], ids=["vllm-mixer", "bench-ssd"])
def test_prefill_measure_reaches_the_stubbed_launch(make):
    from mate.mamba import ssd as ssd_api

    call = make("nemotron-3-super-120b-tp8", "ragged5")  # a small registry shape
    r = host.measure_prefill(call, iters=3, repeats=1)  # raises when the stubbed kernels were never called
    for col in ("normalise", "plan", "slow", "hit"):
        assert r[col] > 0
    assert ssd_api.FAST.enabled is True and not ssd_api.FAST.cache
    r = host.prefill_breakdown(call, iters=3, repeats=1)  # raises when the form's check refuses its own call
    for col in ("check", "launch", "call total", "key", "rebuild"):  # (rebuild: the hit replays a recipe)
        assert r[col] > 0


def test_prefill_calls_are_the_vllm_mixer_form():
    kw = host.vllm_prefill("nemotron-3-super-120b-tp8", "ragged5").kwargs
    pool = kw["final_states_out"]
    assert pool.storage_offset() > 0 and pool.stride(0) > pool[0].numel()  # a view of vLLM's page pool
    assert kw["x"].stride(0) == kw["B"].stride(0) == kw["C"].stride(0)  # rows of one conv1d output
    assert kw["dt"].stride(0) > kw["dt"].shape[1] and isinstance(kw["A"], torch.nn.Parameter)
    assert kw["final_state_indices"].dtype == torch.int32 and kw["initial_states"] is not None


def test_prefill_recipe_calls_tvm_ffi_functions():
    """With tvm_ffi's no-op as every kernel, a hit replays a recipe whose constants are tvm_ffi tensors (converted
    once) beside the caller's torch tensors."""
    pytest.importorskip("tvm_ffi")
    from mate.mamba import ssd as ssd_api

    call = host.vllm_prefill("nemotron-3-super-120b-tp8", "1x8192")  # the split design: four kernels
    with host.stubbed_prefill(ffi=True):
        for _ in range(3):
            call.run()
        (launcher,) = ssd_api.FAST.cache.values()
        assert launcher.launch_object.p.design == "split"
        constants = [v for k, v in launcher.__globals__.items() if k.startswith("_c")]
        assert any(type(v).__module__.startswith("tvm_ffi") for v in constants)


@pytest.mark.parametrize("batch", [2, 12], ids=["fused", "three-ops"])
def test_decode_step_measure_reaches_the_stubbed_launch(batch):
    from mate.mamba import decode_step as step_api

    r = host.measure_decode_step(host.vllm_decode_step(batch), iters=3, repeats=1)  # raises: no launch reached
    for col in ("normalise", "slow", "hit"):
        assert r[col] > 0
    assert (r["copy"] > 0) == (batch > 8)
    assert step_api.FAST.enabled is True and not step_api.FAST.cache
