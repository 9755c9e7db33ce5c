"""``mate-mamba bench norm``'s ``vllm`` column inside the real vLLM 0.33.0 (``nox -s engines``, on the CPU): the
``Mixer2RMSNormGated`` it builds per registry shape takes the path :func:`mate.mamba.bench.norm.vllm_path` names
(its Triton ``rms_norm_gated`` or PyTorch), and computes the norm MATE computes for that shape."""

from __future__ import annotations

import pytest
import torch
from mate.mamba import rms_norm_gated
from mate.mamba.bench import norm as bench

pytestmark = pytest.mark.engine
pytest.importorskip("vllm.plugins", reason="the real vLLM is installed by `nox -s engines`")

from vllm.model_executor.layers.mamba import mamba_mixer2 as mixer  # noqa: E402


@pytest.mark.parametrize("name", list(bench.NORM_SHAPES))
def test_bench_vllm_column_takes_the_named_path_and_computes_mates_norm(monkeypatch, name):
    case = bench.Case(bench.NORM_SHAPES[name], 2, "bf16")
    torch.manual_seed(0)
    w = bench.Window(case, torch.device("cpu"))
    weight = (1 + 0.1 * torch.randn(case.shape.hidden)).to(torch.bfloat16)
    triton_calls = []
    monkeypatch.setattr(mixer, "rms_norm_gated", lambda *a, **k: triton_calls.append(k) or a[0])
    y = bench._mixer_norm(case, weight).forward_cuda(w.x, w.z)
    want = rms_norm_gated(w.x, weight, None, z=w.z, eps=bench.EPS, group_size=case.shape.group_size,
                          norm_before_gate=False, backend="torch")  # fmt: skip
    if bench.vllm_path(case.shape) == "triton":
        (kwargs,) = triton_calls  # one group: the whole row, as MATE's group_size
        assert kwargs["norm_before_gate"] is False and kwargs.get("group_size") in (None, case.shape.hidden)
    else:
        assert triton_calls == []
        # PyTorch rounds the normalised value to bf16, then the product with the weight: two roundings to MATE's one
        torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)
