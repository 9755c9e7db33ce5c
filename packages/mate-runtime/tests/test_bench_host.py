"""``mate.mamba.bench.host`` (the CPU-host proxy of the SSU eager host time) runs end to end on CPU."""

from __future__ import annotations

import pytest
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
