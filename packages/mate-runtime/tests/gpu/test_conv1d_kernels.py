"""The TileLang causal conv1d kernels against the reference backend, over the awkward cases: widths 2-4, silu or
not, bias or not, bf16 / fp16 / fp32, ragged batches with an empty sequence and sequences shorter than the
history, pad and null slots, mixed ``has_initial_state``, MTP with ``num_accepted_tokens``, strided pool views,
int32 and int64 tables; and CUDA-graph replay equal to eager. ``tests/test_conv1d_emulated.py`` runs the same
cases with the kernels' generated CUDA on the CPU (``check(case, kernel=..., dev="cpu")``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


@dataclass(frozen=True)
class Case:
    width: int = 4
    io: torch.dtype = BF16
    state: torch.dtype = BF16
    bias: bool = True
    silu: bool = True
    layout: str = "dense"  # dense, token-contiguous (vLLM's layout: dim contiguous), page (an offset view),
    # misaligned (token-contiguous 2 bytes past a 16-byte boundary: the scalar form)
    index: torch.dtype = torch.int32
    qsl: torch.dtype = torch.int32
    form: str = "fn"  # fn, one, dense3, varlen
    mtp: bool = False
    out: bool = False  # the update: into a caller's out instead of x
    dim: int = 200  # not a multiple of the threads per CTA: the last channel block is partial
    tokens: int = 4  # the update's tokens per sequence (the longest query) but in the one-token form


CASES = [
    pytest.param(Case(), id="fn-w4-bf16"),
    pytest.param(
        Case(
            width=2,
            io=F16,
            state=F16,
            bias=False,
            silu=False,
            layout="token-contiguous",
            index=torch.int64,
            qsl=torch.int64,
        ),
        id="fn-w2-fp16-strided-int64",
    ),  # fmt: skip
    pytest.param(Case(width=3, io=F32, state=F32, layout="page", qsl=torch.int64), id="fn-w3-fp32-page"),
    pytest.param(Case(io=F32, state=BF16, index=torch.int64), id="fn-fp32-x-bf16-pool"),
    pytest.param(Case(form="one"), id="update-one-token"),
    pytest.param(Case(form="one", io=F16, state=F32, out=True, layout="token-contiguous"), id="update-fp16-fp32-out"),
    pytest.param(Case(form="dense3", width=3, silu=False, index=torch.int64), id="update-3-tokens-w3"),
    pytest.param(Case(form="dense3", mtp=True, layout="page"), id="update-mtp-dense"),
    pytest.param(Case(form="varlen", mtp=True, layout="token-contiguous"), id="update-mtp-varlen"),
    pytest.param(
        Case(
            form="varlen",
            mtp=True,
            width=2,
            io=F32,
            state=F32,
            bias=False,
            index=torch.int64,
            qsl=torch.int64,
            out=True,
        ),
        id="update-mtp-varlen-w2-fp32-int64",
    ),  # fmt: skip
    # the vector form (vLLM's layout, dim a multiple of 16 bytes' channels) and the scalar one beside it
    pytest.param(Case(layout="token-contiguous"), id="fn-w4-bf16-vec"),
    pytest.param(Case(width=3, bias=False, layout="token-contiguous", dim=96), id="fn-w3-vec-one-cta"),
    pytest.param(Case(form="one", layout="token-contiguous"), id="update-one-token-vec"),
    pytest.param(Case(form="one", io=F32, state=BF16, layout="token-contiguous", out=True), id="update-fp32-bf16-vec4"),
    pytest.param(Case(form="dense3", mtp=True, layout="token-contiguous", silu=False), id="update-mtp-dense-vec"),
    pytest.param(Case(form="one", layout="token-contiguous", dim=100), id="update-vec-dim-not-multiple"),
    pytest.param(Case(form="one", layout="misaligned"), id="update-misaligned-pool"),
    # more tokens than the history: the first ones' pool columns fall before the pool (not written)
    pytest.param(Case(form="dense3", width=2, layout="token-contiguous", dim=136), id="update-4-tokens-w2-vec"),
    # a query longer than the tokens a thread loads at once (the rest run one at a time)
    pytest.param(Case(form="varlen", mtp=True, layout="token-contiguous", tokens=11, dim=136), id="update-mtp-11-vec"),
    pytest.param(Case(layout="misaligned", width=2), id="fn-misaligned-pool"),
]


def _pool(S, D, K, dt, layout, g, dev):
    if layout == "misaligned":
        return torch.randn(S * K * D + 1, generator=g).to(dt)[1:].view(S, K, D).transpose(1, 2).to(dev)
    if layout == "token-contiguous":
        return torch.randn(S, K, D, generator=g).to(dt).transpose(1, 2).to(dev)
    if layout == "page":
        return torch.randn(S, D * K + 40, generator=g).to(dt)[:, 8 : 8 + D * K].to(dev).view(S, D, K)
    return torch.randn(S, D, K, generator=g).to(dt).to(dev)


def build(c: Case, seed: int, dev):
    """``(fn, args, kwargs, mutated)``: the public function, its arguments, and the names of the tensors it writes."""
    from mate.mamba import causal_conv1d_fn, causal_conv1d_update

    g = torch.Generator().manual_seed(seed)
    D, W, S = c.dim, c.width, 12
    w = torch.randn(D, W, generator=g).to(c.io).to(dev)
    bias = torch.randn(D, generator=g).to(c.io).to(dev) if c.bias else None
    act = "silu" if c.silu else None
    if c.form == "fn":
        lens = [70, 0, 1, 2, 130, 5, 64, 3]
        q = [0]
        for n in lens:
            q.append(q[-1] + n)
        x = torch.randn(q[-1] + 5, D, generator=g).to(c.io).to(dev).t()  # 5 tokens past the last sequence
        pool = _pool(S, D, W - 1 + 1, c.io if c.state is None else c.state, c.layout, g, dev)
        idx = torch.tensor([3, 5, -1, 4, 2, 0, 8, 11], dtype=c.index, device=dev)  # a pad, the null block
        has = torch.tensor([True, False, True, False, True, True, False, True], device=dev)
        args = dict(x=x, weight=w, bias=bias, conv_states=pool, query_start_loc=torch.tensor(q, dtype=c.qsl,
                    device=dev), cache_indices=idx, has_initial_state=has, activation=act)  # fmt: skip
        return causal_conv1d_fn, args, ("conv_states",)
    T = c.tokens if c.form != "one" else 1
    idx = torch.tensor([4, 0, 7, 2, 9, 11], dtype=c.index, device=dev)
    batch = idx.shape[0]
    K = W - 1 + (T - 1 if c.mtp else 0) + 1
    pool = _pool(S, D, K, c.state, c.layout, g, dev)
    kw = {}
    if c.form == "varlen":
        lens = [T, 1, 0, 2, T, 3]
        q = [0]
        for n in lens:
            q.append(q[-1] + n)
        x = torch.randn(q[-1], D, generator=g).to(c.io).to(dev)
        kw = dict(query_start_loc=torch.tensor(q, dtype=c.qsl, device=dev), max_query_len=T)
    elif c.form == "one":
        x = torch.randn(batch, D, generator=g).to(c.io).to(dev)
    else:
        x = torch.randn(batch, T, D, generator=g).to(c.io).to(dev).transpose(1, 2)
    if c.mtp:
        kw["num_accepted_tokens"] = torch.randint(1, T + 1, (batch,), generator=g).to(c.index).to(dev)
    args = dict(x=x, conv_state=pool, weight=w, bias=bias, activation=act,
                conv_state_indices=idx.unsqueeze(1).expand(batch, 2), **kw)  # fmt: skip
    mutated = ("conv_state", "x")
    if c.out:
        args["out"] = torch.full_like(x, 3.0)
        mutated = ("conv_state", "out")
    return causal_conv1d_update, args, mutated


def _clone(args):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _tol(dt):
    return {F32: 2e-5, F16: 2e-3, BF16: 1.6e-2}[dt]


def check(c: Case, *, kernel, dev, seed: int = 0) -> None:
    """``kernel(fn, args)`` (the TileLang path: it returns the result) against the reference on copies of the same
    inputs: results, every written tensor."""
    fn, args, mutated = build(c, seed, dev)
    mine, ref = _clone(args), _clone(args)
    got = kernel(fn, mine)
    want = fn(**ref, backend="torch")
    tol = _tol(c.io) + _tol(c.state)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    for name in mutated:
        torch.testing.assert_close(mine[name].float(), ref[name].float(), rtol=tol, atol=tol)


pytestmark = pytest.mark.gpu


def _gpu_ready() -> str | None:
    import importlib.util

    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if importlib.util.find_spec("tilelang") is None:
        return "needs TileLang"
    return None


def _tilelang(fn, args):
    return fn(**args, backend="tilelang")


@pytest.mark.parametrize("c", CASES)
def test_kernel_matches_reference(c):
    if (why := _gpu_ready()) is not None:
        pytest.skip(why)
    check(c, kernel=_tilelang, dev="cuda")


@pytest.mark.parametrize("c", [pytest.param(Case(form="one"), id="update"), pytest.param(Case(), id="fn")])
def test_graph_replay_equals_eager(c):
    """Captured after a warm-up, replayed on new inputs copied into the captured tensors: equal to eager."""
    if (why := _gpu_ready()) is not None:
        pytest.skip(why)
    fn, args, mutated = build(c, 0, "cuda")
    static = _clone(args)
    fn(**_clone(args), backend="tilelang")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn(**static, backend="tilelang")
    _, new, _ = build(c, 1, "cuda")
    for k, v in new.items():
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            static[k].copy_(v)
    eager = _clone(new)
    want = fn(**eager, backend="tilelang")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(result, want)
    for name in mutated:
        assert torch.equal(static[name], eager[name])


@pytest.mark.parametrize(
    "c",
    [pytest.param(Case(form="one"), id="update-one-token"),
     pytest.param(Case(form="varlen", mtp=True, layout="token-contiguous"), id="update-mtp-varlen"),
     pytest.param(Case(), id="fn")],
)  # fmt: skip
def test_fast_path_allocates_only_the_result(c):
    """A call of an earlier call's metadata (the fast path's launcher) allocates nothing on the device but the
    prefill's returned tensor, and leaves the same result as the slow path."""
    if (why := _gpu_ready()) is not None:
        pytest.skip(why)
    from mate.mamba import conv1d as api

    fn, args, mutated = build(c, 0, "cuda")
    slow = _clone(args)
    fn(**_clone(args), backend="tilelang")  # compile, remember the metadata
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    result = fn(**args, backend="tilelang")
    grown = torch.cuda.memory_allocated() - before
    fresh = 0 if c.form != "fn" else -(-result.untyped_storage().nbytes() // 512) * 512  # the allocator's rounding
    assert grown == fresh
    fast = api.FAST_FN if c.form == "fn" else api.FAST_UPDATE
    fast.enabled = False
    try:
        want = fn(**slow, backend="tilelang")
    finally:
        fast.enabled = True
    assert torch.equal(result, want)
    for name in mutated:
        assert torch.equal(args[name], slow[name])


def test_fast_path_rechecks_the_alignment():
    """A call of an earlier (vector-form) call's metadata whose pool is 2 bytes off a 16-byte boundary takes the
    scalar form on the fast path: equal to the reference."""
    if (why := _gpu_ready()) is not None:
        pytest.skip(why)
    c = Case(form="one", layout="token-contiguous")
    fn, args, _ = build(c, 0, "cuda")
    fn(**_clone(args), backend="tilelang")  # the vector form, remembered by the fast path
    pool = args["conv_state"]
    S, D, K = pool.shape
    buf = torch.empty(S * K * D + 1, dtype=pool.dtype, device="cuda")
    shifted = buf[1:].view(S, K, D).transpose(1, 2)  # the same shape and strides, misaligned
    shifted.copy_(pool)
    mine, ref = _clone(args), _clone(args)
    mine["conv_state"] = shifted
    got = fn(**mine, backend="tilelang")
    want = fn(**ref, backend="torch")
    tol = _tol(c.io) + _tol(c.state)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(shifted.float(), ref["conv_state"].float(), rtol=tol, atol=tol)
