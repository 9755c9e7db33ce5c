"""The reference causal conv1d (``mate.mamba._reference.conv1d``, behind ``causal_conv1d_fn`` /
``causal_conv1d_update`` with ``backend="torch"``) against a plain per-token loop written from the contract's
prose (a window of the last ``width - 1`` inputs slid token by token), and the contract's errors."""

from __future__ import annotations

import pytest
import torch
from mate.mamba import causal_conv1d_fn, causal_conv1d_update

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32


def _prod(state_dt, weight_dt):
    return state_dt if state_dt == weight_dt else F32


def _tap_sum(taps, w, bias, prod):
    acc = torch.zeros(w.shape[0]) if bias is None else bias.float().clone()
    for j, v in enumerate(taps):
        acc = acc + (v.float() * w[:, j].float()).to(prod).float()
    return acc


def _finish(acc, silu, state_dt, out_dt, via_state):
    if silu:
        acc = acc / (1.0 + torch.exp(-acc))
    return (acc.to(state_dt) if via_state else acc).to(out_dt)


def loop_fn(x, w, bias, states, qsl, idx, has, silu, pad=-1, null=0):
    """x ``[D, tokens]``: per sequence, per token, a window of the last W - 1 inputs."""
    W, sd = w.shape[1], states.dtype
    out = torch.zeros_like(x)
    states = states.clone()
    for b in range(len(qsl) - 1):
        s, e, slot = qsl[b], qsl[b + 1], idx[b]
        if e == s or slot in (pad, null):
            continue
        window = [states[slot, :, j].clone() if has[b] else torch.zeros(x.shape[0], dtype=sd) for j in range(W - 1)]
        for t in range(s, e):
            xt = x[:, t].to(sd)
            out[:, t] = _finish(_tap_sum(window + [xt], w, bias, _prod(sd, w.dtype)), silu, sd, x.dtype, True)
            window = window[1:] + [xt]
        for j in range(W - 1):
            states[slot, :, j] = window[j]
    return out, states


def loop_update(xs, w, bias, states, idx, acc, silu, null=0):
    """``xs``: per sequence its tokens ``[D, L]``. Without ``acc`` the state is the last ``state_len`` inputs of
    history + tokens (``state_len = W - 1``); with it, the window starts ``acc - 1`` columns in and the state
    becomes the accepted window's last ``W - 2`` entries followed by every token. Returns the outputs (None for a
    skipped sequence) and the new pool."""
    W, sd = w.shape[1], states.dtype
    states = states.clone()
    outs = []
    for b, x in enumerate(xs):
        slot = idx[b]
        if slot == null or x.shape[1] == 0:
            outs.append(None)
            continue
        off = 0 if acc is None else acc[b] - 1
        window = [states[slot, :, off + j].clone() for j in range(W - 1)]
        kept = window[1:] if acc is not None else None
        y = []
        for t in range(x.shape[1]):
            xt = x[:, t].to(sd)
            y.append(_finish(_tap_sum(window + [xt], w, bias, _prod(sd, w.dtype)), silu, sd, sd, False))
            window = window[1:] + [xt]
        new = kept + [x[:, t].to(sd) for t in range(x.shape[1])] if acc is not None else window
        for j, v in enumerate(new):
            states[slot, :, j] = v
        outs.append(torch.stack(y, dim=1))
    return outs, states


def _pool(S, D, K, dt, layout, g):
    if layout == "token-contiguous":  # vLLM's SD layout seen through a transpose: dim contiguous
        return torch.randn(S, K, D, generator=g).to(dt).transpose(1, 2)
    if layout == "page":  # a strided view of a larger page per slot
        return torch.randn(S, D * K + 24, generator=g).to(dt)[:, 8 : 8 + D * K].view(S, D, K)
    return torch.randn(S, D, K, generator=g).to(dt)


FN_CASES = [
    pytest.param(4, BF16, BF16, BF16, True, True, "dense", torch.int32, id="w4-bf16-bias-silu"),
    pytest.param(4, F16, F16, F16, False, False, "token-contiguous", torch.int64, id="w4-fp16-strided-pool-int64"),
    pytest.param(3, F32, F32, F32, True, True, "page", torch.int32, id="w3-fp32-page-pool"),
    pytest.param(2, BF16, BF16, F32, True, False, "dense", torch.int64, id="w2-bf16-fp32-weight"),
    pytest.param(4, F32, BF16, BF16, True, True, "dense", torch.int32, id="w4-fp32-x-bf16-pool"),
    pytest.param(4, F16, BF16, F16, False, True, "token-contiguous", torch.int32, id="w4-fp16-x-bf16-pool-fp16-w"),
    pytest.param(6, BF16, BF16, BF16, True, True, "dense", torch.int32, id="w6-bf16"),
]


@pytest.mark.parametrize("W, xdt, sdt, wdt, has_bias, silu, layout, idt", FN_CASES)
def test_fn_matches_token_loop(W, xdt, sdt, wdt, has_bias, silu, layout, idt):
    g = torch.Generator().manual_seed(W)
    D, S = 24, 9
    lens = [7, 0, 1, 2, 13, 5, 3]  # an empty sequence, sequences shorter than the history
    q = [0]
    for n in lens:
        q.append(q[-1] + n)
    tokens = q[-1] + 3  # three tokens past the last sequence
    x = torch.randn(tokens, D, generator=g).to(xdt).t()  # vLLM's channel-last [D, tokens] view
    w = torch.randn(D, W, generator=g).to(wdt)
    bias = torch.randn(D, generator=g).to(wdt) if has_bias else None
    pool = _pool(S, D, W - 1 + 2, sdt, layout, g)
    idx = [3, 5, -1, 4, 2, 0, 8]  # a pad (-1) and vLLM's null block (0)
    has = [True, False, True, False, True, True, True]
    ref_out, ref_pool = loop_fn(x, w, bias, pool, q, idx, has, silu)
    act = "silu" if silu else None
    y = causal_conv1d_fn(x, w, bias, pool, torch.tensor(q, dtype=idt), torch.tensor(idx, dtype=idt),
                         torch.tensor(has), act, backend="torch")  # fmt: skip
    assert y.dtype == x.dtype and y.stride() == x.stride()
    torch.testing.assert_close(y, ref_out, rtol=0, atol=0)
    torch.testing.assert_close(pool, ref_pool, rtol=0, atol=0)


UPDATE_CASES = [
    pytest.param(4, BF16, BF16, "one", False, torch.int32, "dense", id="w4-one-token"),
    pytest.param(4, F16, F16, "dense3", False, torch.int64, "token-contiguous", id="w4-3-tokens-strided"),
    pytest.param(3, F32, F32, "dense3", True, torch.int32, "page", id="w3-mtp-dense"),
    pytest.param(4, BF16, BF16, "varlen", True, torch.int32, "token-contiguous", id="w4-mtp-varlen"),
    pytest.param(2, BF16, F32, "varlen", True, torch.int64, "dense", id="w2-mtp-varlen-fp32-pool"),
    pytest.param(4, F32, BF16, "one", False, torch.int64, "dense", id="w4-fp32-x-bf16-pool"),
    pytest.param(6, F16, F16, "varlen", True, torch.int32, "dense", id="w6-mtp-varlen"),
]


@pytest.mark.parametrize("W, xdt, sdt, form, spec, idt, layout", UPDATE_CASES)
@pytest.mark.parametrize("with_out", [False, True], ids=["in-place", "out"])
def test_update_matches_token_loop(W, xdt, sdt, form, spec, idt, layout, with_out):
    g = torch.Generator().manual_seed(10 + W)
    D, S, T = 16, 10, 3
    idx = [4, 0, 7, 2, 9]  # slot 0: vLLM's null block
    batch = len(idx)
    K = W - 1 + (T - 1 if spec else 0) + 1  # one column more than needed
    pool = _pool(S, D, K, sdt, layout, g)
    w = torch.randn(D, W, generator=g).to(xdt)
    bias = torch.randn(D, generator=g).to(xdt)
    acc = [1 + int(a) for a in torch.randint(0, T, (batch,), generator=g)] if spec else None
    kw = {}
    if form == "varlen":
        lens = [T, 1, 0, 2, T]
        q = [0]
        for n in lens:
            q.append(q[-1] + n)
        x = torch.randn(q[-1], D, generator=g).to(xdt)
        xs = [x[q[b] : q[b + 1]].t() for b in range(batch)]
        kw = dict(query_start_loc=torch.tensor(q, dtype=idt), max_query_len=T)
    elif form == "one":
        x = torch.randn(batch, D, generator=g).to(xdt)
        xs = [x[b].unsqueeze(-1) for b in range(batch)]
    else:
        x = torch.randn(batch, T, D, generator=g).to(xdt).transpose(1, 2)  # [batch, D, T], dim contiguous
        xs = [x[b] for b in range(batch)]
    outs, ref_pool = loop_update(xs, w, bias, pool, idx, acc, True)
    x0, pool0 = x.clone(), pool.clone()
    out = torch.full_like(x, 7.0) if with_out else None
    table = torch.tensor(idx, dtype=idt).unsqueeze(1).expand(batch, 2)  # [batch, k]: column 0 is read
    r = causal_conv1d_update(x, pool, w, bias, True, table, None if acc is None else torch.tensor(acc, dtype=idt),
                             out=out, backend="torch", **kw)  # fmt: skip
    if with_out:
        assert r is out and torch.equal(x, x0)
    elif xdt == sdt:
        assert r is x  # in place
    torch.testing.assert_close(pool, ref_pool, rtol=0, atol=0)
    for b, y in enumerate(outs):
        got = _seq(r, form, q if form == "varlen" else None, b)
        if y is None:  # a skipped sequence writes nothing: out keeps its values, x its own through the pool dtype
            kept = x0.to(sdt).to(xdt)
            want = torch.full_like(got, 7.0) if with_out else _seq(kept, form, q if form == "varlen" else None, b)
        else:
            want = y.to(got.dtype) if not with_out else None
            if with_out:  # rounded once, to out's dtype (the loop rounded to the pool's: redo from fp32)
                want = _expected_direct(xs[b], w, bias, pool0, idx[b], acc and acc[b], got.dtype)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _seq(t, form, q, b):
    """Sequence ``b``'s ``[D, L]`` of a result of the update's form."""
    if form == "varlen":
        return t[q[b] : q[b + 1]].t()
    return t[b].unsqueeze(-1) if form == "one" else t[b]


def _expected_direct(x, w, bias, pool, slot, a, out_dt):
    W, sd = w.shape[1], pool.dtype
    off = (a - 1) if a else 0
    window = [pool[slot, :, off + j] for j in range(W - 1)]
    ys = []
    for t in range(x.shape[1]):
        xt = x[:, t].to(sd)
        ys.append(_finish(_tap_sum(window + [xt], w, bias, _prod(sd, w.dtype)), True, sd, out_dt, False))
        window = window[1:] + [xt]
    return torch.stack(ys, dim=1)


def test_update_varlen_short_query_rewrites_fewer_columns():
    """vLLM's packed update without ``num_accepted_tokens``: a query ``k`` tokens short of ``max_query_len``
    rewrites ``k`` columns fewer (``state_len = width - 1 - k``): width 4, max 3, one token -> 1 column shifted."""
    D, W = 2, 4
    pool = torch.arange(2 * D * 3, dtype=F32).view(2, D, 3)
    x = torch.tensor([[100.0, 200.0]])  # one token of sequence 0
    w = torch.ones(D, W)
    q = torch.tensor([0, 1], dtype=torch.int32)
    y = causal_conv1d_update(x, pool, w, None, None, torch.tensor([1], dtype=torch.int32), None, q, 3,
                             backend="torch")  # fmt: skip
    # history (slot 1) = cols [6, 7, 8] / [9, 10, 11]; state_len 3 - 2 = 1: column 0 <- the token
    assert pool[1].tolist() == [[100.0, 7.0, 8.0], [200.0, 10.0, 11.0]]
    assert y.tolist() == [[6 + 7 + 8 + 100.0, 9 + 10 + 11 + 200.0]]


# ------------------------------------------------------------------------------------------------- errors


def _fn_args(**over):
    D, W = 8, 4
    a = dict(
        x=torch.randn(10, D).t(),
        weight=torch.randn(D, W),
        bias=None,
        conv_states=torch.zeros(4, D, W - 1),
        query_start_loc=torch.tensor([0, 4, 10], dtype=torch.int32),
        cache_indices=torch.tensor([1, 2], dtype=torch.int32),
        has_initial_state=torch.tensor([True, False]),
    )
    a.update(over)
    return a


def _update_args(**over):
    D, W = 8, 4
    a = dict(
        x=torch.randn(2, D),
        conv_state=torch.zeros(4, D, W - 1),
        weight=torch.randn(D, W),
        conv_state_indices=torch.tensor([1, 2], dtype=torch.int32),
    )
    a.update(over)
    return a


FN_ERRORS = [
    pytest.param(dict(x=torch.randn(2, 3, 4)), ValueError, "x:", id="x-3d"),
    pytest.param(dict(x=torch.randn(8, 10).to(torch.int32)), ValueError, "x:", id="x-int"),
    pytest.param(dict(weight=torch.randn(8, 1)), ValueError, "weight:", id="width-1"),
    pytest.param(dict(weight=torch.randn(8, 7)), ValueError, "weight:", id="width-7"),
    pytest.param(dict(weight=torch.randn(7, 4)), ValueError, "weight:", id="weight-dim"),
    pytest.param(dict(bias=torch.randn(3)), ValueError, "bias:", id="bias-shape"),
    pytest.param(dict(conv_states=torch.zeros(4, 8, 2)), ValueError, "conv_states:", id="pool-too-short"),
    pytest.param(dict(conv_states=torch.zeros(4, 9, 3)), ValueError, "conv_states:", id="pool-dim"),
    pytest.param(dict(query_start_loc=torch.tensor([0.0, 10.0])), ValueError, "query_start_loc:", id="qsl-float"),
    pytest.param(
        dict(query_start_loc=torch.tensor([0, 6, 4], dtype=torch.int32)),
        ValueError,
        "query_start_loc:",
        id="qsl-decreasing",
    ),
    pytest.param(
        dict(query_start_loc=torch.tensor([0, 4, 11], dtype=torch.int32)),
        ValueError,
        "query_start_loc:",
        id="qsl-past-tokens",
    ),
    pytest.param(
        dict(cache_indices=torch.tensor([1], dtype=torch.int32)), ValueError, "cache_indices:", id="indices-rows"
    ),
    pytest.param(
        dict(cache_indices=torch.tensor([1, 4], dtype=torch.int32)),
        ValueError,
        "cache_indices:",
        id="indices-out-of-pool",
    ),
    pytest.param(dict(has_initial_state=torch.tensor([1, 0])), ValueError, "has_initial_state:", id="has-init-int"),
    pytest.param(dict(activation="relu"), ValueError, "activation:", id="activation"),
]


@pytest.mark.parametrize("over, error, name", FN_ERRORS)
def test_fn_errors_name_the_argument(over, error, name):
    a = _fn_args(**over)
    pool0 = a["conv_states"].clone()
    with pytest.raises(error, match=name):
        causal_conv1d_fn(**a, backend="torch")
    assert torch.equal(a["conv_states"], pool0)  # raised before anything was written


UPDATE_ERRORS = [
    pytest.param(dict(x=torch.randn(2, 8, 1, 1)), ValueError, "x:", id="x-4d"),
    pytest.param(dict(out=torch.zeros(2, 8, dtype=BF16)), ValueError, "out:", id="out-dtype"),
    pytest.param(dict(out=torch.zeros(3, 8)), ValueError, "out:", id="out-shape"),
    pytest.param(
        dict(conv_state_indices=torch.tensor([1, 2, 3], dtype=torch.int32)),
        ValueError,
        "conv_state_indices:",
        id="indices-rows",
    ),
    pytest.param(
        dict(conv_state_indices=torch.tensor([1, 5], dtype=torch.int32)),
        ValueError,
        "conv_state_indices:",
        id="indices-out-of-pool",
    ),
    pytest.param(
        dict(conv_state_indices=torch.tensor([-1, 2], dtype=torch.int32)),
        ValueError,
        "conv_state_indices:",
        id="indices-negative",
    ),
    pytest.param(
        dict(query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32)),
        ValueError,
        "max_query_len:",
        id="varlen-without-max",
    ),
    pytest.param(
        dict(query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32), conv_state_indices=None, max_query_len=1),
        ValueError,
        "conv_state_indices:",
        id="varlen-without-indices",
    ),
    pytest.param(
        dict(query_start_loc=torch.tensor([0, 2, 2], dtype=torch.int32), max_query_len=1),
        ValueError,
        "query_start_loc:",
        id="query-longer-than-max",
    ),
    pytest.param(
        dict(x=torch.randn(2, 8, 3), num_accepted_tokens=torch.tensor([1, 1], dtype=torch.int32)),
        ValueError,
        "conv_state:",
        id="mtp-pool-too-short",
    ),
    pytest.param(
        dict(num_accepted_tokens=torch.tensor([1, 2], dtype=torch.int32)),
        ValueError,
        "num_accepted_tokens:",
        id="accepted-past-pool",
    ),
    pytest.param(
        dict(num_accepted_tokens=torch.tensor([0, 1], dtype=torch.int32)),
        ValueError,
        "num_accepted_tokens:",
        id="accepted-zero",
    ),
    pytest.param(dict(activation="gelu"), ValueError, "activation:", id="activation"),
    pytest.param(dict(null_block_id=0.0), ValueError, "null_block_id:", id="null-float"),
]


@pytest.mark.parametrize("over, error, name", UPDATE_ERRORS)
def test_update_errors_name_the_argument(over, error, name):
    a = _update_args(**over)
    pool0 = a["conv_state"].clone()
    with pytest.raises(error, match=name):
        causal_conv1d_update(**a, backend="torch")
    assert torch.equal(a["conv_state"], pool0)
