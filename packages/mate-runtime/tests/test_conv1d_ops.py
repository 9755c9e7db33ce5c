"""The causal conv1d's custom ops: ``torch.compile(fullgraph=True)`` traces ``causal_conv1d_fn`` and
``causal_conv1d_update`` and the compiled result equals eager (outputs, the pool, the in-place x); bad calls are
rejected while tracing; the public signatures match the op tables (less vLLM's ``metadata`` / ``validate_data``)."""

from __future__ import annotations

import inspect

import mate.mamba.conv1d as api
import pytest
import torch
from mate.mamba import causal_conv1d_fn, causal_conv1d_update
from mate.mamba._ops import CONV1D_FN_PARAMS, CONV1D_UPDATE_PARAMS, REQUIRED

DROPPED = {"metadata", "validate_data"}


@pytest.mark.parametrize(
    "fn, params", [pytest.param(api.causal_conv1d_fn, CONV1D_FN_PARAMS, id="fn"),
                   pytest.param(api.causal_conv1d_update, CONV1D_UPDATE_PARAMS, id="update")]
)  # fmt: skip
def test_public_signature_matches_the_table(fn, params):
    sig = [p for p in inspect.signature(fn).parameters.values() if p.name not in DROPPED]
    assert [p.name for p in sig] == [p.name for p in params]
    for p, row in zip(sig, params, strict=True):
        assert p.default == (inspect.Parameter.empty if row.default is REQUIRED else row.default), p.name
        assert (p.kind is inspect.Parameter.KEYWORD_ONLY) == row.keyword, p.name


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    D, W, S = 8, 4, 6
    return dict(
        x=torch.randn(12, D, generator=g).t(),
        w=torch.randn(D, W, generator=g),
        bias=torch.randn(D, generator=g),
        pool=torch.randn(S, D, W - 1 + 2, generator=g),
        q=torch.tensor([0, 5, 5, 12], dtype=torch.int32),
        idx=torch.tensor([3, 2, 4], dtype=torch.int32),
        has=torch.tensor([True, False, False]),
        xd=torch.randn(3, D, 3, generator=g),
        acc=torch.tensor([1, 2, 1], dtype=torch.int32),
    )


def _layer(x, w, bias, pool, q, idx, has, xd, acc):
    y = causal_conv1d_fn(x, w, bias, pool, q, idx, has, activation="silu")
    z = causal_conv1d_update(xd, pool, w, bias, True, idx, acc)  # in place on xd
    return y * 2.0, z + 1.0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_equals_eager(backend):
    torch._dynamo.reset()
    a = _inputs()
    b = {k: v.clone() if k in ("pool", "xd") else v for k, v in a.items()}
    y_ref, z_ref = _layer(**a)
    y, z = torch.compile(_layer, fullgraph=True, backend=backend)(**b)
    assert torch.equal(y, y_ref) and torch.equal(z, z_ref)
    assert torch.equal(b["pool"], a["pool"]) and torch.equal(b["xd"], a["xd"])  # the in-place writes survive
    assert not torch.equal(a["pool"], _inputs()["pool"])


def test_compiled_update_into_a_new_tensor_and_out():
    """x not of the pool's dtype (the result a new tensor) and a caller's out, traced."""
    torch._dynamo.reset()
    a = _inputs(1)
    xd = a["xd"].to(torch.bfloat16)

    def step(pool, out):
        r1 = causal_conv1d_update(xd, pool, a["w"], None, "silu", a["idx"])
        r2 = causal_conv1d_update(xd, pool, a["w"], None, None, a["idx"], out=out)
        return r1, r2

    p1, p2 = a["pool"].clone(), a["pool"].clone()
    o1, o2 = torch.zeros_like(xd), torch.zeros_like(xd)
    ref = step(p1, o1)
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(p2, o2)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1]) and torch.equal(o1, o2)
    assert torch.equal(p1, p2)


def test_bad_call_rejected_while_tracing():
    torch._dynamo.reset()
    a = _inputs()

    def bad(x, pool):
        return causal_conv1d_fn(x, a["w"][:, :1], None, pool, a["q"], a["idx"], a["has"])

    with pytest.raises(Exception, match="weight"):
        torch.compile(bad, fullgraph=True, backend="eager")(a["x"], a["pool"])
