"""The conv1d routing of the vLLM plugin (``MATE_VLLM_CONV1D=1``) inside the real vLLM 0.33.0 (``nox -s engines``, on
the CPU, MATE on its reference backend): vLLM's ``causal_conv1d_fn`` / ``causal_conv1d_update`` become MATE's in
``ops/causal_conv1d.py`` and in every module that imported them, and the mixers' call forms give MATE's result;
vLLM's pure-PyTorch CPU functions agree within fp32 summation order."""

from __future__ import annotations

import importlib
import sys

import mate_vllm.plugin as plugin
import pytest
import torch
from mate.mamba import causal_conv1d_fn, causal_conv1d_update
from mate.mamba import settings as mate_settings
from mate_vllm import ops

pytestmark = pytest.mark.engine
pytest.importorskip("vllm.plugins", reason="the real vLLM is installed by `nox -s engines`")

from vllm.model_executor.layers.mamba.ops import causal_conv1d as cc  # noqa: E402
from vllm.model_executor.layers.mamba.ops.cpu import causal_conv1d as cpu  # noqa: E402

# the modules of vLLM 0.33.0 that import both functions by name and import on a CPU box
IMPORTERS = (
    "vllm.model_executor.layers.mamba.mamba_mixer",
    "vllm.model_executor.layers.mamba.mamba_mixer2",
    "vllm.model_executor.layers.mamba.short_conv",
)
for _name in IMPORTERS:
    importlib.import_module(_name)
# vLLM's own functions (the plugin, enabled in this process, may have routed the update at import: auto)
VLLM_FN, VLLM_UPDATE = (ops.ENGINE_CONV1D.get(n, getattr(cc, n)) for n in ("causal_conv1d_fn", "causal_conv1d_update"))

DIM, W, SLOTS = 48, 4, 9


@pytest.fixture
def routed(monkeypatch):
    for m in list(sys.modules.values()):  # put vLLM's functions back afterwards (the engine tests share this process)
        if (getattr(m, "__name__", "") or "").startswith("vllm."):
            for name in ("causal_conv1d_fn", "causal_conv1d_update"):
                if name in vars(m):
                    monkeypatch.setattr(m, name, getattr(m, name))
    monkeypatch.setattr(ops, "ENGINE_CONV1D", dict(ops.ENGINE_CONV1D))  # (vLLM's own, where auto routed them)
    with mate_settings.override(MATE_VLLM_CONV1D="1"):
        plugin._patch_conv1d(cc)
        yield sys.modules


@pytest.mark.parametrize(
    "module",
    [pytest.param(cc.__name__, id="ops.causal_conv1d"), *(pytest.param(m, id=m.rsplit(".", 1)[1]) for m in IMPORTERS)],
)
def test_every_importer_calls_mates_functions(routed, module):
    mod = routed[module]
    assert mod.causal_conv1d_fn is ops.causal_conv1d_fn and mod.causal_conv1d_update is ops.causal_conv1d_update
    assert ops.ENGINE_CONV1D == {"causal_conv1d_fn": VLLM_FN, "causal_conv1d_update": VLLM_UPDATE}
    assert plugin.status()["conv1d"].startswith("['causal_conv1d_fn', 'causal_conv1d_update'] routed in")


def pool(dtype):
    """vLLM's SD layout: the cache is ``[slots, state_len, dim]``; the kernels see its transpose (dim-contiguous)."""
    return torch.randn(SLOTS, W - 1, DIM).to(dtype).transpose(-1, -2)


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float32, id="fp32")])
def test_the_mixers_prefill_call_gives_mates_result(routed, dtype):
    torch.manual_seed(0)
    lens = [5, 1, 0, 7, 3]
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(int(qsl[-1]), DIM).to(dtype).t()  # the mixer's transpose of its [tokens, dim] buffer
    w, b = torch.randn(DIM, W).to(dtype), torch.randn(DIM).to(dtype)
    idx = torch.tensor([3, 0, 5, 1, 7], dtype=torch.int32)  # slot 0: vLLM's null block, skipped
    has = torch.tensor([True, True, False, False, True])
    states = pool(dtype)
    kw = dict(activation="silu", has_initial_state=has, cache_indices=idx, metadata=None, query_start_loc=qsl)
    mine = states.clone()
    y = routed["vllm.model_executor.layers.mamba.mamba_mixer2"].causal_conv1d_fn(x, w, b, conv_states=mine, **kw)
    want_states = states.clone()
    want = causal_conv1d_fn(x, w, b, conv_states=want_states, backend="torch", **kw)
    assert torch.equal(y, want) and torch.equal(mine, want_states)
    assert not torch.equal(mine, states)
    if dtype == torch.float32:  # vLLM's own CPU path (it knows pad_slot_id only: the null-block sequence left out)
        live = [0, 2, 3, 4]
        ref_states = states.clone()
        ref = cpu.causal_conv1d_fn_cpu(x, w, b, ref_states, qsl, idx.clone().index_fill_(0, torch.tensor([1]), -1),
                                       has, "silu")  # fmt: skip
        for s in live:
            t = slice(int(qsl[s]), int(qsl[s + 1]))
            torch.testing.assert_close(y[:, t], ref[:, t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine, ref_states, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float32, id="fp32")])
def test_the_mixers_decode_call_gives_mates_result(routed, dtype):
    """mamba_mixer2's decode: ``[batch, dim]`` in place, a ``[batch, 1]`` table with the null block on a padded row."""
    torch.manual_seed(1)
    x = torch.randn(4, DIM).to(dtype)
    w, b = torch.randn(DIM, W).to(dtype), torch.randn(DIM).to(dtype)
    idx = torch.tensor([[2], [0], [6], [4]], dtype=torch.int32)
    states = pool(dtype)
    mine, xm = states.clone(), x.clone()
    y = routed["vllm.model_executor.layers.mamba.mamba_mixer2"].causal_conv1d_update(
        xm, mine, w, b, "silu", conv_state_indices=idx, num_accepted_tokens=None, query_start_loc=None
    )
    want_states, xw = states.clone(), x.clone()
    want = causal_conv1d_update(xw, want_states, w, b, "silu", conv_state_indices=idx, backend="torch")
    assert y.data_ptr() == xm.data_ptr()  # vLLM writes the result into x
    assert torch.equal(y, want) and torch.equal(mine, want_states)
    assert torch.equal(y[1], x[1]) and torch.equal(mine[0], states[0])  # the null-block row runs nothing
    if dtype == torch.float32:  # vLLM's PyTorch fallback (a dense batch of its own states)
        live = idx[[0, 2, 3], 0].long()
        ref_states = states[live].clone()
        ref = cpu.causal_conv1d_update_torch(x[[0, 2, 3]].unsqueeze(-1), ref_states, w, b, "silu").squeeze(-1)
        torch.testing.assert_close(y[[0, 2, 3]], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine[live], ref_states, rtol=0, atol=0)


def test_the_spec_decode_call_gives_mates_result(routed):
    """mamba_mixer2 / short_conv with MTP: packed ``[tokens, dim]``, ``[batch, 1 + K]`` tables, accepted counts."""
    torch.manual_seed(2)
    K, dtype = 2, torch.bfloat16
    qsl = torch.tensor([0, 3, 6, 7], dtype=torch.int32)
    x = torch.randn(7, DIM).to(dtype)
    w = torch.randn(DIM, W).to(dtype)
    idx = torch.tensor([[1, 2, 3], [4, 5, 6], [8, 7, 0]], dtype=torch.int32)
    acc = torch.tensor([1, 3, 2], dtype=torch.int32)
    states = torch.randn(SLOTS, W - 1 + K, DIM).to(dtype).transpose(-1, -2)
    kw = dict(conv_state_indices=idx, num_accepted_tokens=acc, query_start_loc=qsl, max_query_len=idx.size(-1))
    mine = states.clone()
    y = routed["vllm.model_executor.layers.mamba.short_conv"].causal_conv1d_update(x.clone(), mine, w, None, None,
                                                                                   **kw)  # fmt: skip
    want_states = states.clone()
    want = causal_conv1d_update(x.clone(), want_states, w, None, None, backend="torch", **kw)
    assert torch.equal(y, want) and torch.equal(mine, want_states)
