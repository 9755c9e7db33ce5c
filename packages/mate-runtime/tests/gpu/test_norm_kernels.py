"""The TileLang gated RMSNorm (``rms_norm_gated`` on the TileLang backend) against the reference backend, and a
CUDA-graph replay of it against eager calls.

The cases (:data:`CASES`) are shared with the CPU emulation of the same kernel (``tests/test_norm_emulated.py``):
the gate before and after the norm, no gate, a bias, one group and several, bf16 / fp16 / fp32 (and an fp32 z
beside a bf16 x), odd row counts, rows of a wider buffer (vLLM's z), rows off the 16-byte grid (the scalar kernel),
a group the CTA does not tile exactly, and Nemotron-H 8B's per-rank shape. Compared: the output within one ulp of
its dtype of the reference's (both compute in fp32 and round once; they differ in summation order and exp/rsqrt).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
ULP = {BF16: 2**-7, F16: 2**-10, F32: 2e-6}  # relative


@dataclass(frozen=True)
class Case:
    rows: int = 5
    hidden: int = 256
    group_size: int | None = 64
    io: torch.dtype = BF16
    z: torch.dtype | None = BF16
    weight: torch.dtype = BF16
    bias: torch.dtype | None = None
    norm_before_gate: bool = False
    eps: float = 1e-5
    form: str = "dense"  # "row-view": rows of a wider buffer; "offset": rows 2 bytes off the 16-byte grid


CASES = [
    pytest.param(Case(), id="mamba2-bf16"),
    pytest.param(Case(norm_before_gate=True, bias=F32, weight=F32), id="norm-first-bias"),
    pytest.param(Case(z=None, group_size=None), id="no-gate-one-group"),
    pytest.param(Case(z=None, bias=BF16, norm_before_gate=True), id="no-gate-bias"),
    pytest.param(Case(io=F16, z=F16, weight=F16, rows=3), id="f16"),
    pytest.param(Case(io=F32, z=F32, weight=F32, eps=1e-6, rows=4), id="f32"),
    pytest.param(Case(z=F32), id="bf16-x-f32-z"),
    pytest.param(Case(rows=7, form="row-view"), id="row-view"),
    pytest.param(Case(rows=3, form="offset"), id="off-grid-scalar"),
    pytest.param(Case(hidden=5120, group_size=None, rows=2), id="group-5120-guarded"),
    pytest.param(Case(hidden=90, group_size=9, rows=3), id="odd-group"),
    pytest.param(Case(hidden=8192, group_size=1024, rows=3, eps=1e-5), id="nemotron-h-8b"),
    pytest.param(Case(rows=1, eps=0.5), id="one-row-big-eps"),
]


def build(c: Case, dev: str, seed: int = 0) -> dict:
    """The keyword arguments of one ``rms_norm_gated`` call on ``dev``."""
    g = torch.Generator().manual_seed(seed)

    def rows_of(dtype):
        pad = {"dense": 0, "row-view": 24, "offset": 16}[c.form]
        buf = (torch.randn(c.rows, c.hidden + pad, generator=g) * 2).to(dtype).to(dev)
        start = {"dense": 0, "row-view": 8, "offset": 1}[c.form]
        return buf[:, start : start + c.hidden]

    kw = dict(
        x=rows_of(c.io), weight=(1 + 0.5 * torch.randn(c.hidden, generator=g)).to(c.weight).to(dev),
        bias=None if c.bias is None else (0.5 * torch.randn(c.hidden, generator=g)).to(c.bias).to(dev),
        z=None if c.z is None else rows_of(c.z), eps=c.eps, group_size=c.group_size,
        norm_before_gate=c.norm_before_gate,
    )  # fmt: skip
    return kw


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=ULP[want.dtype], atol=1e-5)


@pytest.mark.parametrize("c", CASES)
def test_kernel_matches_reference(c):
    from mate.mamba import rms_norm_gated

    kw = build(c, "cuda")
    got = rms_norm_gated(**kw, backend="tilelang")
    want = rms_norm_gated(**kw, backend="torch")
    check(got, want)


@pytest.mark.parametrize("c", [pytest.param(Case(hidden=8192, group_size=1024, rows=64), id="nemotron-h-8b-b64")])
def test_graph_replay_equals_eager(c):
    """Captured once, replayed with new input values in the same buffers: the eager result, bit for bit."""
    from mate.mamba import prewarm_rms_norm_gated, rms_norm_gated

    prewarm_rms_norm_gated(hidden=c.hidden, group_size=c.group_size, io_dtype=c.io, weight_dtype=c.weight, jobs=1)
    kw = build(c, "cuda")
    rms_norm_gated(**kw)  # the fast path's first (slow) call, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rms_norm_gated(**kw)
    for seed in (1, 2):
        new = build(c, "cuda", seed)
        kw["x"].copy_(new["x"])
        kw["z"].copy_(new["z"])
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, rms_norm_gated(**kw))
        check(out, rms_norm_gated(**kw, backend="torch"))
