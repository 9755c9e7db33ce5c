"""The fused TileLang decode step (``mamba2_decode_step`` on the TileLang backend) against the reference backend, two
calls in a row (the kernel's counters and accumulators must be back at zero after each), and a CUDA-graph replay of
it against eager calls.

The cases (:data:`CASES`) are shared with the CPU emulation of the same kernel (``tests/test_decode_step_emulated.py``)
and the reference's own tests: batch 1 / 3 / 8 with pad sequences, heads 4-16, P 64, N 64 / 128, one or two SSM
groups, one or two norm groups (also differing from the SSM groups), conv width 4 and 2, fp32 / bf16 / fp16 SSM
pools, bf16 / fp16 io, int32 / int64 slot tables (``[batch]`` and vLLM's ``[batch, 1]``), and pools that are strided
views (an SSM pool inside larger pages at an odd offset: scalar state accesses; a channel-contiguous conv pool
with spare columns). Compared: the conv pool exactly, the SSM pool and the output within an ulp or two of their
dtypes (the kernel's exp, softplus, rsqrt and summation order are the device's).
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
    batch: int = 3
    heads: int = 8
    dim: int = 64
    dstate: int = 64
    groups: int = 2
    norm_groups: int = 2
    width: int = 4
    io: torch.dtype = BF16
    state: torch.dtype = BF16
    index: torch.dtype = torch.int32
    pads: tuple = (1,)  # sequences on pad_slot_id
    pad_slot_id: int = -1
    table_2d: bool = False  # vLLM's [batch, 1] table
    strided: bool = False  # pools as views: SSM pool inside pages at an offset, channel-contiguous conv pool
    has_D: bool = True
    has_bias: bool = True
    out_rows: bool = False  # out as row views of a wider buffer (not contiguous)

    @property
    def channels(self) -> int:
        return self.heads * self.dim + 2 * self.groups * self.dstate


CASES = [
    pytest.param(Case(), id="b3-h8-n64-g2-ng2-bf16"),
    pytest.param(Case(batch=1, pads=(), heads=4, groups=1, norm_groups=1, dstate=128), id="b1-h4-n128-g1"),
    pytest.param(
        Case(batch=8, pads=(0, 5), heads=16, dstate=128, state=F32, index=torch.int64), id="b8-h16-f32-state-int64"
    ),  # fmt: skip
    pytest.param(Case(width=2, groups=1, norm_groups=2, table_2d=True), id="w2-g1-ng2-table2d"),
    pytest.param(Case(groups=2, norm_groups=1, strided=True, state=F32), id="g2-ng1-strided-pools"),
    pytest.param(
        Case(io=F16, state=F16, pads=(2,), pad_slot_id=0, has_D=False, has_bias=False, heads=4, norm_groups=4),
        id="f16-null-block-0-no-D-no-bias",
    ),  # fmt: skip
    pytest.param(
        Case(
            batch=8,
            heads=16,
            dstate=128,
            groups=2,
            norm_groups=2,
            state=BF16,
            pads=(7,),
            strided=True,
            index=torch.int64,
            table_2d=True,
        ),
        id="b8-bf16-strided-int64-2d",
    ),  # fmt: skip
]


def build(c: Case, dev: str, seed: int = 0) -> dict:
    """The keyword arguments of one ``mamba2_decode_step`` call on ``dev``: z, xBC and dt as row views of one
    in_proj output (vLLM's layout), pools of ``batch + 3`` slots, live sequences on distinct shuffled slots."""
    g = torch.Generator().manual_seed(seed)
    H, P, N, G, W, B = c.heads, c.dim, c.dstate, c.groups, c.width, c.batch
    hp, cd = H * P, c.channels
    slots = B + 3
    proj = torch.randn(B, hp + cd + H, generator=g).to(c.io)
    z, xBC, dt = proj[:, :hp], proj[:, hp : hp + cd], proj[:, hp + cd :]
    K = W - 1 + (2 if c.strided else 0)  # spare columns past width - 1 stay untouched
    conv = torch.randn(slots, cd, K, generator=g).to(c.io)
    ssm = (torch.randn(slots, H, P, N, generator=g) * 0.5).to(c.state)
    if c.strided:
        conv = conv.transpose(1, 2).contiguous().transpose(1, 2)  # channel-contiguous, as vLLM's pool
        # pages of an odd length at an odd offset: no 16-byte state access fits (the scalar-access kernel)
        page = torch.zeros(slots, H * P * N + 97, dtype=c.state)
        page[:, 33 : 33 + H * P * N] = ssm.reshape(slots, -1)
        ssm = page[:, 33 : 33 + H * P * N].view(slots, H, P, N)
    perm = torch.randperm(slots, generator=g)
    if c.pad_slot_id in range(slots):
        perm = perm[perm != c.pad_slot_id]
    idx = perm[:B].clone()
    for b in c.pads:
        idx[b] = c.pad_slot_id
    idx = idx.to(c.index)
    if c.table_2d:
        idx = torch.stack([idx, torch.full_like(idx, 10**6)], dim=1)  # column 1 is never read
    to = {"device": dev}
    extra = {"out": torch.zeros(B, hp + 8, dtype=c.io, device=dev)[:, :hp]} if c.out_rows else {}
    return dict(**extra,
        xBC=xBC.to(**to), z=z.to(**to), dt=dt.to(**to), conv_state=conv.to(**to),
        conv_weight=(0.5 * torch.randn(cd, W, generator=g)).to(c.io).to(**to),
        conv_bias=(0.2 * torch.randn(cd, generator=g)).to(c.io).to(**to) if c.has_bias else None,
        ssm_state=ssm.to(**to), A=(-torch.rand(H, generator=g) * 2 - 0.1).to(**to),
        D=torch.randn(H, generator=g).to(**to) if c.has_D else None,
        dt_bias=(torch.randn(H, generator=g) * 0.5).to(**to),
        norm_weight=(1 + 0.3 * torch.randn(hp, generator=g)).to(c.io).to(**to),
        state_indices=idx.to(**to), ngroups=G, pad_slot_id=c.pad_slot_id, norm_group_size=hp // c.norm_groups,
        eps=1e-5,
    )  # fmt: skip


def clone(kw: dict) -> dict:
    """The call's arguments with fresh copies of the two pools (keeping their strides and offsets)."""
    out = dict(kw)
    for name in ("conv_state", "ssm_state"):
        t = kw[name]
        base = t.untyped_storage()
        copy = torch.empty(0, dtype=t.dtype, device=t.device).set_(
            base.clone(), t.storage_offset(), t.shape, t.stride()
        )  # fmt: skip
        out[name] = copy
    return out


def check(got: tuple, want: tuple) -> None:
    """``(out, conv_state, ssm_state)`` of two runs."""
    (o, cs, ss), (wo, wcs, wss) = got, want
    assert torch.equal(cs, wcs), "conv pool"
    # the state against the pool's scale, as the SSU tests compare it: a new value is a sum of terms larger than
    # itself, so one rounding step of x (the conv's output in the io dtype, where the device's exp and the host's
    # may differ by an ulp) moves it by a step of those terms, not of its own size (seen at fp16 on an H100)
    atol = 2 * ULP[wo.dtype] * wss.float().abs().max().item()  # (out has xBC's dtype)
    torch.testing.assert_close(ss.float(), wss.float(), rtol=2 * ULP[wss.dtype], atol=atol)
    torch.testing.assert_close(o.float(), wo.float(), rtol=2 * ULP[wo.dtype], atol=2 * ULP[wo.dtype])


def run(kw: dict, backend: str) -> tuple:
    from mate.mamba import mamba2_decode_step

    out = mamba2_decode_step(**kw, backend=backend)
    return out, kw["conv_state"], kw["ssm_state"]


# batches above the fused kernel's (decode_step_plan.FUSED_MAX_BATCH): the step as three launches
SEQUENCE_CASES = [
    pytest.param(Case(batch=12, pads=(3,), heads=16, dstate=128), id="b12-h16-n128"),
    pytest.param(
        Case(
            batch=40,
            pads=(0, 39),
            heads=16,
            dstate=128,
            state=F32,
            index=torch.int64,
            strided=True,
            table_2d=True,
            out_rows=True,
        ),
        id="b40-f32-strided-int64-2d-out-rows",
    ),  # fmt: skip
    pytest.param(
        Case(batch=24, io=F16, state=F16, pads=(2,), pad_slot_id=0, has_D=False, has_bias=False, width=2),
        id="b24-f16-null-block-0-w2",
    ),  # fmt: skip
]

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_gpu
@pytest.mark.parametrize("c", CASES)
def test_kernel_matches_reference_twice(c):
    pytest.importorskip("tilelang")
    kw = build(c, "cuda")
    a, r = clone(kw), clone(kw)
    for step in range(2):  # the second call proves the counters and accumulators were reset
        if step:
            a["dt"] = r["dt"] = kw["dt"] * 0.5
        check(tuple(t.cpu() for t in run(a, "tilelang")), tuple(t.cpu() for t in run(r, "torch")))


@needs_gpu
@pytest.mark.parametrize("c", SEQUENCE_CASES)
def test_three_launches_match_reference_twice(c):
    pytest.importorskip("tilelang")
    from mate.mamba import plan_mamba2_decode_step

    kw = build(c, "cuda")
    assert len(plan_mamba2_decode_step(**clone(kw))) == 3  # conv1d update, SSU, norm
    a, r = clone(kw), clone(kw)
    for step in range(2):
        if step:
            a["dt"] = r["dt"] = kw["dt"] * 0.5
        check(tuple(t.cpu() for t in run(a, "tilelang")), tuple(t.cpu() for t in run(r, "torch")))


@needs_gpu
@pytest.mark.parametrize("batch", [8, 12], ids=["fused-b8", "three-launches-b12"])
def test_graph_replay_twice_equals_eager(batch):
    pytest.importorskip("tilelang")
    kw = build(Case(batch=batch, heads=16, dstate=128, pads=(3,)), "cuda")
    eager, graphed = clone(kw), clone(kw)
    out = torch.empty_like(kw["z"])
    graphed["out"] = out
    from mate.mamba import mamba2_decode_step

    mamba2_decode_step(**clone(kw), backend="tilelang")  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mamba2_decode_step(**graphed, backend="tilelang")
    for _ in range(2):
        graph.replay()
        want = mamba2_decode_step(**eager, backend="tilelang")
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        assert torch.equal(graphed["conv_state"], eager["conv_state"])
        assert torch.equal(graphed["ssm_state"], eager["ssm_state"])
