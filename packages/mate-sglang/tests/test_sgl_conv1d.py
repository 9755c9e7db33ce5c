"""The conv1d routing of the SGLang hook (``MATE_SGLANG_CONV1D=1``) inside the real SGLang 0.5.23 (``nox -s
engines``, on the CPU, MATE on its reference backend): SGLang's Triton conv1d functions and its ``srt`` wrappers
become MATE's under every name SGLang's modules bound them (the Mamba2 mixer's CUDA imports included, read from its
source), and SGLang's call forms give MATE's result with SGLang's output conventions. SGLang has no PyTorch conv1d
to compare with (its CPU functions are compiled ``sgl_kernel`` ops)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys

import mate_sglang.hook as hook
import pytest
import torch
from mate.mamba import causal_conv1d_fn, causal_conv1d_update
from mate_sglang import conv1d

pytestmark = pytest.mark.engine

if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("sglang.srt") is None:
    pytest.skip("the real SGLang is installed by `nox -s engines`", allow_module_level=True)

import sglang.kernels.ops.mamba.causal_conv1d_triton as triton_conv  # noqa: E402
import sglang.srt.layers.attention.mamba.causal_conv1d as srt_conv  # noqa: E402
import sglang.srt.layers.attention.mamba.mamba as mixer  # noqa: E402

# SGLang 0.5.23's modules that bind the conv1d functions and import on a CPU box
IMPORTERS = (
    "sglang.srt.models.lfm2",
    "sglang.srt.models.lfm2_moe",
    "sglang.srt.layers.attention.linear.kda_prefill_graph",
)
for _name in IMPORTERS:
    importlib.import_module(_name)
ORIGINALS = {
    "causal_conv1d_fn_triton": triton_conv.causal_conv1d_fn,
    "causal_conv1d_update_triton": triton_conv.causal_conv1d_update,
    "causal_conv1d_fn": srt_conv.causal_conv1d_fn,
    "causal_conv1d_update": srt_conv.causal_conv1d_update,
}
DIM, W, SLOTS = 40, 4, 8


@pytest.fixture
def routed(monkeypatch):
    originals = set(ORIGINALS.values())
    for m in list(sys.modules.values()):  # put SGLang's functions back afterwards (the engine tests share a process)
        if (getattr(m, "__name__", "") or "").startswith("sglang."):
            for name, value in list(vars(m).items()):
                if any(value is o for o in originals):
                    monkeypatch.setattr(m, name, value)
    monkeypatch.setattr(conv1d, "ENGINE_CONV1D", {})
    monkeypatch.setattr(conv1d, "_REFUSED", set())
    hook._patch_conv1d(triton_conv)
    hook._patch_conv1d(srt_conv)


def test_every_binding_is_mates(routed):
    assert triton_conv.causal_conv1d_fn is conv1d.causal_conv1d_fn_triton
    assert triton_conv.causal_conv1d_update is conv1d.causal_conv1d_update_triton
    assert srt_conv._causal_conv1d_fn_triton is conv1d.causal_conv1d_fn_triton  # the wrapper's non-CUDA path
    assert srt_conv._causal_conv1d_update_triton is conv1d.causal_conv1d_update_triton
    assert srt_conv.causal_conv1d_fn is conv1d.causal_conv1d_fn
    assert srt_conv.causal_conv1d_update is conv1d.causal_conv1d_update
    lfm2 = sys.modules["sglang.srt.models.lfm2"]
    assert lfm2.causal_conv1d_fn is conv1d.causal_conv1d_fn
    assert lfm2.causal_conv1d_update_triton is conv1d.causal_conv1d_update_triton
    assert sys.modules[IMPORTERS[2]].causal_conv1d_fn is conv1d.causal_conv1d_fn_triton
    assert conv1d.ENGINE_CONV1D == ORIGINALS
    st = hook.status()["conv1d"]
    assert set(st) == {hook.CONV1D_TRITON, hook.CONV1D_SRT}
    assert set(st[hook.CONV1D_TRITON]) == set(st[hook.CONV1D_SRT]) == {"causal_conv1d_fn", "causal_conv1d_update"}


def test_the_mamba2_mixers_cuda_imports_bind_mates_functions(routed):
    """On CUDA the mixer binds four names (``is_cuda()`` is False here, so its imports are run from its source)."""
    tree = ast.parse(inspect.getsource(mixer))
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "is_cuda()"]
    names: dict = {}
    exec(compile(ast.Module(block.body, []), mixer.__file__, "exec"), names)  # noqa: S102  (the wheel's own lines)
    assert names["causal_conv1d_fn"] is conv1d.causal_conv1d_fn
    assert names["causal_conv1d_update"] is conv1d.causal_conv1d_update
    assert names["causal_conv1d_fn_triton"] is conv1d.causal_conv1d_fn_triton
    assert names["causal_conv1d_update_triton"] is conv1d.causal_conv1d_update_triton


def prefill_inputs(dtype):
    torch.manual_seed(0)
    lens = [6, 1, 0, 9]
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    hidden = torch.randn(int(qsl[-1]), DIM).to(dtype)
    w, b = torch.randn(DIM, W).to(dtype), torch.randn(DIM).to(dtype)
    idx = torch.tensor([0, -1, 5, 3], dtype=torch.int32)  # slot 0 is live in SGLang; -1 its pad slot
    has = torch.tensor([True, True, False, True])
    states = torch.randn(SLOTS, DIM, W - 1).to(dtype)
    return hidden, w, b, qsl, idx, has, states


@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")])
@pytest.mark.parametrize("layer", [pytest.param("triton", id="triton"), pytest.param("srt", id="srt-wrapper")])
def test_the_mixers_prefill_call_gives_mates_result(routed, dtype, layer):
    hidden, w, b, qsl, idx, has, states = prefill_inputs(dtype)
    x = hidden.transpose(0, 1)  # the mixer's [dim, tokens] view of its [tokens, dim] buffer
    ccfn = mixer_names()["causal_conv1d_fn_triton" if layer == "triton" else "causal_conv1d_fn"]
    mine = states.clone()
    y = ccfn(x, w, b, activation="silu", conv_states=mine, has_initial_state=has, cache_indices=idx,
             query_start_loc=qsl, seq_lens_cpu=[6, 1, 0, 9])  # fmt: skip
    want_states = states.clone()
    want = causal_conv1d_fn(x, w, b, want_states, qsl, idx, has, "silu", pad_slot_id=-1, null_block_id=None,
                            backend="torch")  # fmt: skip
    assert torch.equal(y, want) and torch.equal(mine, want_states)
    assert not torch.equal(mine[0], states[0])  # slot 0 is an ordinary slot in SGLang
    assert torch.equal(x, hidden.transpose(0, 1))  # a new tensor: x is left alone


def mixer_names():
    return {
        "causal_conv1d_fn": srt_conv.causal_conv1d_fn,
        "causal_conv1d_update": srt_conv.causal_conv1d_update,
        "causal_conv1d_fn_triton": triton_conv.causal_conv1d_fn,
        "causal_conv1d_update_triton": triton_conv.causal_conv1d_update,
    }


@pytest.mark.parametrize("layer", [pytest.param("triton", id="triton"), pytest.param("srt", id="srt-wrapper")])
def test_the_mixers_decode_call_gives_mates_result(routed, layer):
    torch.manual_seed(1)
    x = torch.randn(4, DIM).to(torch.bfloat16)
    w, b = torch.randn(DIM, W).to(torch.bfloat16), torch.randn(DIM).to(torch.bfloat16)
    idx = torch.tensor([2, -1, 0, 6], dtype=torch.int32)
    states = torch.randn(SLOTS, DIM, W - 1).to(torch.bfloat16)
    ccu = mixer_names()["causal_conv1d_update_triton" if layer == "triton" else "causal_conv1d_update"]
    mine, xm = states.clone(), x.clone()
    y = ccu(xm, mine, w, b, "silu", conv_state_indices=idx)
    want_states = states.clone()
    want = causal_conv1d_update(x.clone(), want_states, w, b, "silu", conv_state_indices=idx, null_block_id=-1,
                                backend="torch")  # fmt: skip
    live = [0, 2, 3]
    assert torch.equal(y[live], want[live]) and torch.equal(mine, want_states)
    assert not torch.equal(mine[0], states[0])
    if layer == "triton":  # a new tensor, x untouched (SGLang's Triton function)
        assert y.data_ptr() != xm.data_ptr() and torch.equal(xm, x)
    else:  # written into x (the wrapper's compiled kernel), the pad row keeping x's values
        assert y.data_ptr() == xm.data_ptr() and torch.equal(y[1], x[1])


def test_accepted_tokens_are_vllms_sliding_window(routed):
    """SGLang's ``num_accept_tokens`` on ``[batch, dim, seqlen]`` is MATE's (vLLM's) ``num_accepted_tokens``."""
    torch.manual_seed(2)
    T, dtype = 3, torch.bfloat16
    x = torch.randn(2, DIM, T).to(dtype)
    w = torch.randn(DIM, W).to(dtype)
    idx = torch.tensor([4, 1], dtype=torch.int32)
    acc = torch.tensor([2, 1], dtype=torch.int32)
    states = torch.randn(SLOTS, DIM, W - 1 + T - 1).to(dtype)
    mine = states.clone()
    y = triton_conv.causal_conv1d_update(x, mine, w, None, None, conv_state_indices=idx, num_accept_tokens=acc)
    want_states = states.clone()
    want = causal_conv1d_update(x.clone(), want_states, w, None, None, conv_state_indices=idx,
                                num_accepted_tokens=acc, null_block_id=-1, backend="torch")  # fmt: skip
    assert torch.equal(y, want) and torch.equal(mine, want_states)


def test_the_verify_windows_run_sglangs_function_with_one_warning(routed, monkeypatch):
    """The target-verify call (intermediate conv windows, EAGLE trees) is not MATE's: SGLang's Triton runs it."""
    calls = []
    monkeypatch.setitem(conv1d.ENGINE_CONV1D, "causal_conv1d_update_triton", lambda *a, **k: calls.append(a) or "sgl")
    x = torch.randn(2, DIM, 3)
    window = torch.zeros(2, 3, DIM, W - 1)
    with pytest.warns(UserWarning, match="intermediate_conv_window / retrieve_"):
        got = triton_conv.causal_conv1d_update(x, torch.zeros(SLOTS, DIM, W - 1), torch.randn(DIM, W),
                                               intermediate_conv_window=window)  # fmt: skip
    assert got == "sgl" and calls[0][8] is window
