"""The conv1d routing of the SGLang hook against stand-ins of SGLang 0.5.23's two conv1d modules and a mixer that
imported their functions under its own names (the default CPU suite, where SGLang is not installed;
test_sgl_conv1d.py runs the real one), and the call forms left to SGLang."""

from __future__ import annotations

import re
import sys
import types

import mate_sglang.hook as hook
import pytest
import torch
from mate.mamba import causal_conv1d_update
from mate.mamba import settings as mate_settings
from mate_sglang import conv1d


def triton_fn(x, weight, bias, conv_states, query_start_loc, seq_lens_cpu, cache_indices=None,
              has_initial_state=None, activation="silu", pad_slot_id=-1, validate_data=False, block_table=None,
              **kwargs):  # fmt: skip
    return "sgl triton fn"


def triton_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None,
                  num_accept_tokens=None, intermediate_conv_window=None, intermediate_state_indices=None,
                  retrieve_next_token=None, retrieve_next_sibling=None, retrieve_parent_token=None, pad_slot_id=-1,
                  metadata=None, validate_data=False):  # fmt: skip
    return "sgl triton update"


def srt_fn(x, weight, bias=None, query_start_loc=None, cache_indices=None, has_initial_state=None, conv_states=None,
           activation="silu", pad_slot_id=-1, **kwargs):  # fmt: skip
    return "sgl fn"


def srt_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None,
               pad_slot_id=-1):  # fmt: skip
    return "sgl update"


@pytest.fixture
def fake_sglang(monkeypatch):
    tri = types.ModuleType(hook.CONV1D_TRITON)
    tri.causal_conv1d_fn, tri.causal_conv1d_update = triton_fn, triton_update
    srt = types.ModuleType(hook.CONV1D_SRT)
    srt.causal_conv1d_fn, srt.causal_conv1d_update = srt_fn, srt_update
    srt._causal_conv1d_update_triton = triton_update
    mixer = types.ModuleType("sglang.srt.layers.attention.mamba.mamba")
    mixer.causal_conv1d_update, mixer.causal_conv1d_update_triton = srt_update, triton_update
    for m in (tri, srt, mixer):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    monkeypatch.setattr(conv1d, "ENGINE_CONV1D", {})
    monkeypatch.setattr(conv1d, "_REFUSED", set())
    return tri, srt, mixer


def test_every_binding_under_any_name_is_routed(fake_sglang):
    tri, srt, mixer = fake_sglang
    hook._patch_conv1d(tri)
    hook._patch_conv1d(srt)
    assert tri.causal_conv1d_update is conv1d.causal_conv1d_update_triton
    assert srt._causal_conv1d_update_triton is conv1d.causal_conv1d_update_triton
    assert mixer.causal_conv1d_update_triton is conv1d.causal_conv1d_update_triton
    assert srt.causal_conv1d_update is mixer.causal_conv1d_update is conv1d.causal_conv1d_update
    assert conv1d.ENGINE_CONV1D["causal_conv1d_update"] is srt_update
    assert hook.status()["conv1d"][hook.CONV1D_TRITON]["causal_conv1d_update"] == sorted([
        tri.__name__, f"{srt.__name__}._causal_conv1d_update_triton", f"{mixer.__name__}.causal_conv1d_update_triton"
    ])  # fmt: skip


def test_a_function_of_another_signature_stays_sglangs(fake_sglang):
    tri, srt, mixer = fake_sglang
    srt.causal_conv1d_update = mixer.causal_conv1d_update = lambda x, conv_state, weight: "other"
    with pytest.warns(UserWarning, match="causal_conv1d_update takes .* it is not routed to MATE"):
        hook._patch_conv1d(srt)
    assert mixer.causal_conv1d_update(1, 2, 3) == "other" and srt.causal_conv1d_fn is conv1d.causal_conv1d_fn


@pytest.mark.parametrize(
    "value, armed",
    [pytest.param("0", False, id="default-off"), pytest.param("1", True, id="on")],
)
def test_the_setting_arms_the_conv1d_hooks(monkeypatch, value, armed):
    seen = []
    monkeypatch.setattr(hook.adapter(), "when_imported", lambda module, patch: seen.append((module, patch)))
    monkeypatch.setattr(hook, "_check_sglang", lambda mod: True)
    with mate_settings.override(MATE_SGLANG_CONV1D=value):
        hook.enable()
    (arm,) = [p for m, p in seen if m == "sglang"]
    arm(types.ModuleType("sglang"))
    assert ((hook.CONV1D_TRITON, hook._patch_conv1d) in seen) is armed
    assert ((hook.CONV1D_SRT, hook._patch_conv1d) in seen) is armed


def test_the_wrappers_update_is_mates_in_place(fake_sglang):
    tri, srt, mixer = fake_sglang
    hook._patch_conv1d(srt)
    torch.manual_seed(0)
    x, states, w = torch.randn(3, 16), torch.randn(6, 16, 3), torch.randn(16, 4)
    idx = torch.tensor([0, -1, 4], dtype=torch.int32)
    got_states, want_states = states.clone(), states.clone()
    xm = x.clone()
    y = mixer.causal_conv1d_update(xm, got_states, w, None, "silu", conv_state_indices=idx)
    want = causal_conv1d_update(x.clone(), want_states, w, None, "silu", idx, null_block_id=-1, backend="torch")
    assert y is xm and torch.equal(y, want) and torch.equal(got_states, want_states)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        pytest.param({"cache_seqlens": torch.zeros(2, dtype=torch.int32)}, "cache_seqlens", id="circular-buffer"),
        pytest.param(
            {"retrieve_parent_token": torch.zeros(2, 3, dtype=torch.int64)},
            "intermediate_conv_window / retrieve_",
            id="eagle-tree",
        ),
        pytest.param({"state_dtype": torch.float32}, "x in float16 beside a float32 conv state", id="dtype-mix"),
    ],
)
def test_a_form_mate_does_not_serve_runs_sglangs_function_or_raises_outside(fake_sglang, kwargs, reason):
    tri, srt, mixer = fake_sglang
    x = torch.randn(2, 16).half()
    states = torch.randn(4, 16, 3).to(kwargs.pop("state_dtype", torch.float16))
    args = (x, states, torch.randn(16, 4).half())
    with pytest.raises(
        NotImplementedError, match=f"causal_conv1d_update_triton: MATE does not serve {re.escape(reason)}"
    ):
        conv1d.causal_conv1d_update_triton(*args, **kwargs)
    hook._patch_conv1d(tri)
    with pytest.warns(UserWarning, match=re.escape(reason)):
        assert mixer.causal_conv1d_update_triton(*args, **kwargs) == "sgl triton update"


def test_a_prefill_without_a_pool_runs_sglangs_function(fake_sglang):
    tri, srt, mixer = fake_sglang
    hook._patch_conv1d(tri)
    with pytest.warns(UserWarning, match="no conv_states"):
        got = tri.causal_conv1d_fn(torch.randn(16, 5), torch.randn(16, 4), None, None, torch.tensor([0, 5]), [5])
    assert got == "sgl triton fn"
