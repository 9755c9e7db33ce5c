"""The conv1d routing of the vLLM plugin against stand-ins of vLLM 0.33's ``ops/causal_conv1d.py`` and a module that
imported its functions by name (the default CPU suite, where vLLM is not installed; test_vllm_conv1d.py runs the
real one): what is routed, what is left to vLLM, and the calls MATE refuses, which run vLLM's function."""

from __future__ import annotations

import sys
import types
import warnings

import mate_vllm.plugin as plugin
import pytest
import torch
from mate.mamba import causal_conv1d_fn, causal_conv1d_update
from mate.mamba import settings as mate_settings
from mate_vllm import ops


def vllm_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None, has_initial_state=None,
            activation="silu", pad_slot_id=-1, null_block_id=0, metadata=None, validate_data=False):  # fmt: skip
    return "vllm fn"


def vllm_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None, num_accepted_tokens=None,
                query_start_loc=None, max_query_len=-1, null_block_id=0, validate_data=False, out=None):  # fmt: skip
    return "vllm update"


def cpu_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None, query_start_loc=None,
               pad_slot_id=None, **kwargs):  # fmt: skip
    return "vllm cpu update"


@pytest.fixture
def fake_vllm(monkeypatch):
    """``ops.causal_conv1d`` and a mixer that imported both functions by name, as vLLM lays them out; both routed
    (``MATE_VLLM_CONV1D=1``) while the test runs."""
    cc = types.ModuleType("vllm.model_executor.layers.mamba.ops.causal_conv1d")
    mixer = types.ModuleType("vllm.model_executor.layers.mamba.mamba_mixer2")
    for m in (cc, mixer):
        m.causal_conv1d_fn, m.causal_conv1d_update = vllm_fn, vllm_update
        monkeypatch.setitem(sys.modules, m.__name__, m)
    monkeypatch.setattr(ops, "ENGINE_CONV1D", {})
    monkeypatch.setattr(ops, "_REFUSED", set())
    with mate_settings.override(MATE_VLLM_CONV1D="1"):
        yield cc, mixer


def test_both_functions_are_routed_where_vllm_imported_them(fake_vllm):
    cc, mixer = fake_vllm
    plugin._patch_conv1d(cc)
    for m in (cc, mixer):
        assert m.causal_conv1d_fn is ops.causal_conv1d_fn and m.causal_conv1d_update is ops.causal_conv1d_update
    assert plugin.status()["conv1d"] == (
        f"['causal_conv1d_fn', 'causal_conv1d_update'] routed in {sorted([cc.__name__, mixer.__name__])}"
    )


def test_vllms_cpu_platform_functions_stay_vllms(fake_vllm):
    """On vLLM's CPU platform the module binds its CPU update (another signature): it is left, with a warning."""
    cc, mixer = fake_vllm
    cc.causal_conv1d_update = mixer.causal_conv1d_update = cpu_update
    with pytest.warns(UserWarning, match="causal_conv1d_update takes .* it is not routed to MATE"):
        plugin._patch_conv1d(cc)
    assert cc.causal_conv1d_update is cpu_update and mixer.causal_conv1d_fn is ops.causal_conv1d_fn
    assert ops.ENGINE_CONV1D == {"causal_conv1d_fn": vllm_fn}


@pytest.mark.parametrize(
    "value, armed",
    [pytest.param("0", False, id="off"), pytest.param("1", True, id="on"), pytest.param("auto", True, id="auto")],
)
def test_the_setting_arms_the_conv1d_hook(monkeypatch, value, armed):
    seen = []
    monkeypatch.setattr(plugin.adapter(), "when_imported", lambda module, patch: seen.append((module, patch)))
    with mate_settings.override(MATE_VLLM_ENABLE="1", MATE_VLLM_CONV1D=value):
        plugin.register()
    assert ((plugin.CAUSAL_CONV1D, plugin._patch_conv1d) in seen) is armed


def conv_inputs():
    torch.manual_seed(0)
    x = torch.randn(3, 16)
    return x, torch.randn(8, 3, 16).transpose(-1, -2), torch.randn(16, 4)  # the pool as vLLM's SD layout


def test_a_routed_call_is_mates(fake_vllm):
    cc, mixer = fake_vllm
    plugin._patch_conv1d(cc)
    x, states, w = conv_inputs()
    idx = torch.tensor([2, 0, 5], dtype=torch.int32)
    got_states, want_states = states.clone(), states.clone()
    y = mixer.causal_conv1d_update(x.clone(), got_states, w, None, "silu", conv_state_indices=idx)
    want = causal_conv1d_update(x.clone(), want_states, w, None, "silu", conv_state_indices=idx, backend="torch")
    assert torch.equal(y, want) and torch.equal(got_states, want_states)
    qsl = torch.tensor([0, 2, 3], dtype=torch.int32)
    got_states, want_states = states.clone(), states.clone()
    y = mixer.causal_conv1d_fn(x.t(), w, None, got_states, qsl, idx[:2], torch.tensor([True, False]))
    want = causal_conv1d_fn(x.t(), w, None, want_states, qsl, idx[:2], torch.tensor([True, False]), backend="torch")
    assert torch.equal(y, want) and torch.equal(got_states, want_states)


def test_a_call_mate_refuses_runs_vllms_function_with_one_warning(fake_vllm, monkeypatch):
    cc, mixer = fake_vllm
    plugin._patch_conv1d(cc)
    runtime = types.SimpleNamespace(causal_conv1d_update=lambda *a: (_ for _ in ()).throw(NotImplementedError("X")))
    monkeypatch.setattr(plugin.adapter(), "runtime", lambda: runtime)
    x, states, w = conv_inputs()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert mixer.causal_conv1d_update(x, states, w) == "vllm update"
        assert mixer.causal_conv1d_update(x, states, w) == "vllm update"
    (warning,) = seen
    assert "causal_conv1d_update: MATE does not serve this call (X); vLLM's own causal_conv1d_update runs it" in str(
        warning.message
    )


def test_a_refusal_outside_vllm_raises(monkeypatch):
    monkeypatch.setattr(ops, "ENGINE_CONV1D", {})
    runtime = types.SimpleNamespace(causal_conv1d_fn=lambda *a: (_ for _ in ()).throw(NotImplementedError("Y")))
    monkeypatch.setattr(plugin.adapter(), "runtime", lambda: runtime)
    x, states, w = conv_inputs()
    with pytest.raises(NotImplementedError, match="Y"):
        ops.causal_conv1d_fn(x.t(), w, None, states, torch.tensor([0, 3], dtype=torch.int32))


def test_bad_input_is_mates_value_error_not_vllms_function(fake_vllm):
    cc, mixer = fake_vllm
    plugin._patch_conv1d(cc)
    x, states, w = conv_inputs()
    with pytest.raises(ValueError, match="weight"):
        mixer.causal_conv1d_update(x, states, w[:5])


def test_the_default_is_auto():
    assert plugin.adapter().setting(plugin.ENV_CONV1D) == plugin.CONV1D_AUTO


def test_auto_routes_the_update_only_and_by_the_rule(fake_vllm):
    """``auto``: only ``causal_conv1d_update`` is rebound; one-token calls of at least ``CONV1D_UPDATE_MIN_BATCH``
    sequences are MATE's, smaller ones and speculative-decode calls vLLM's."""
    cc, mixer = fake_vllm
    with mate_settings.override(MATE_VLLM_CONV1D="auto"):
        plugin._patch_conv1d(cc)
    for m in (cc, mixer):
        assert m.causal_conv1d_fn is vllm_fn and m.causal_conv1d_update is ops.causal_conv1d_update_auto
    assert ops.ENGINE_CONV1D == {"causal_conv1d_update": vllm_update}
    assert plugin.status()["conv1d"].endswith(f"(auto: MATE's for one token at batch >= {ops.CONV1D_UPDATE_MIN_BATCH}, "
                                              "else vLLM's)")  # fmt: skip
    n = ops.CONV1D_UPDATE_MIN_BATCH
    torch.manual_seed(0)
    w, states = torch.randn(16, 4), torch.randn(n + 2, 3, 16).transpose(-1, -2)
    idx = torch.randperm(n + 2)[:n].to(torch.int32)
    x = torch.randn(n, 16)
    got_states, want_states = states.clone(), states.clone()
    y = mixer.causal_conv1d_update(x.clone(), got_states, w, None, "silu", conv_state_indices=idx)
    want = causal_conv1d_update(x.clone(), want_states, w, None, "silu", conv_state_indices=idx, backend="torch")
    assert torch.equal(y, want) and torch.equal(got_states, want_states)
    assert mixer.causal_conv1d_update(x[: n - 1], states, w, None, "silu", conv_state_indices=idx[: n - 1]) == (
        "vllm update"
    )
    nat = torch.ones(n, dtype=torch.int32)
    assert mixer.causal_conv1d_update(x, states, w, None, "silu", idx, nat) == "vllm update"
    assert mixer.causal_conv1d_update(x=x, conv_state=states, weight=w, query_start_loc=idx) == "vllm update"
