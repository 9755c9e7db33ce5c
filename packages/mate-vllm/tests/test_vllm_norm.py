"""The gated RMSNorm routing of the vLLM plugin (``MATE_VLLM_NORM=1``) inside the real vLLM 0.33.0 (``nox -s
engines``, on the CPU, MATE on its reference backend): vLLM's ``rms_norm_gated`` becomes MATE's in the module and in
the mixer that imported it, with the same result; the layers left to vLLM's PyTorch code are named once."""

from __future__ import annotations

import types
import warnings

import mate_vllm.plugin as plugin
import pytest
import torch
from mate.mamba import rms_norm_gated
from mate.mamba.bench import norm as bench
from mate_vllm import ops

pytestmark = pytest.mark.engine
pytest.importorskip("vllm.plugins", reason="the real vLLM is installed by `nox -s engines`")

from vllm.model_executor.layers.mamba import mamba_mixer2 as mixer  # noqa: E402
from vllm.model_executor.layers.mamba.ops import layernorm_gated as lg  # noqa: E402


@pytest.fixture
def routed(monkeypatch):
    for mod in (lg, mixer):  # put vLLM's function back afterwards (the engine tests share this process)
        monkeypatch.setattr(mod, "rms_norm_gated", mod.rms_norm_gated)
    plugin._patch_norm(lg)
    yield
    assert plugin.adapter().status()["norm"].startswith("routed in")


def test_the_mixers_kernel_call_runs_mates_norm(routed):
    assert lg.rms_norm_gated is ops.rms_norm_gated and mixer.rms_norm_gated is ops.rms_norm_gated
    case = bench.Case(bench.NORM_SHAPES["mamba2-2.7b-tp1"], 3, "bf16")  # one group at TP 1: forward_cuda's kernel
    torch.manual_seed(0)
    w = bench.Window(case, torch.device("cpu"))
    weight = (1 + 0.1 * torch.randn(case.shape.hidden)).to(torch.bfloat16)
    y = bench._mixer_norm(case, weight).forward_cuda(w.x, w.z)
    want = rms_norm_gated(w.x, weight, None, z=w.z, eps=bench.EPS, norm_before_gate=False, backend="torch")
    assert torch.equal(y, want)


class FakeNorm:
    """The attributes vLLM's ``Mixer2RMSNormGated.__init__`` sets, and its CustomOp dispatch."""

    def __init__(self, n_groups, tp_size=1, method="forward_cuda"):
        self.use_rms_norm, self.n_groups, self.tp_size = True, n_groups, tp_size
        self._forward_method = getattr(self, method)

    def forward_cuda(self, x, gate):
        return x

    def forward_native(self, x, gate):
        return x


@pytest.mark.parametrize(
    "n_groups, tp_size, method, left",
    [
        pytest.param(1, 1, "forward_cuda", None, id="one-group-tp1-served"),
        pytest.param(8, 1, "forward_cuda", "8 groups at TP 1", id="nemotron-h-groups"),
        pytest.param(1, 2, "forward_cuda", "1 groups at TP 2", id="one-group-tp2-all-reduce"),
        pytest.param(1, 1, "forward_native", "runs forward_native", id="op-disabled-inductor"),
    ],
)
def test_left_to_vllm_names_why(n_groups, tp_size, method, left):
    why = plugin.left_to_vllm(FakeNorm(n_groups, tp_size, method))
    assert why is None if left is None else left in why


def test_one_warning_per_process_for_the_layers_left_to_vllm():
    class Mixer2RMSNormGated(FakeNorm):
        pass

    mod = types.ModuleType("fake_mixer2")
    mod.Mixer2RMSNormGated = Mixer2RMSNormGated
    plugin._watch_mixer2_norm(mod)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Mixer2RMSNormGated(1)
        assert seen == []
        Mixer2RMSNormGated(8)
        Mixer2RMSNormGated(8)
    (warning,) = seen
    assert "8 groups at TP 1" in str(warning.message) and "stays vLLM's PyTorch code" in str(warning.message)
