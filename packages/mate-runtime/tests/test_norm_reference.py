"""``rms_norm_gated`` on the CPU: the reference backend against the float64 per-row loop
(``mate.mamba.testing.rms_norm_gated_rows``), the contract's errors, the TileLang planner, the eager fast path (the
TileLang launcher with a recording kernel on CPU tensors) and the custom op under ``torch.compile``."""

from __future__ import annotations

import pytest
import torch
from mate.mamba import _dispatch as dispatch
from mate.mamba import norm as norm_api
from mate.mamba import plan_rms_norm_gated, rms_norm_gated, settings
from mate.mamba._contract.norm import normalize_norm
from mate.mamba._tilelang import norm as tl_norm
from mate.mamba.testing import rms_norm_gated_rows

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
# one rounding of the output in its dtype (half an ulp) plus fp32 arithmetic
RTOL = {BF16: 2**-8, F16: 2**-10, F32: 1e-5}


def inputs(rows=6, hidden=64, *, io=BF16, z=BF16, w=F32, bias=None, lead=(), form="dense", seed=0):
    """(x, weight, bias, z) of one call: ``lead`` extra leading dims; ``form`` "dense", "row-view" (x and z rows of
    a wider buffer, as a mixer's z is a view of the projection output) or "transposed" (a last dim with stride >
    1: copied by the contract, as vLLM does)."""
    g = torch.Generator().manual_seed(seed)
    shape = (*lead, rows, hidden)

    def t(dtype, scale=1.0):
        if form == "row-view":
            return (torch.randn(*lead, rows, hidden + 24, generator=g) * scale).to(dtype)[..., 8 : 8 + hidden]
        if form == "transposed":
            return (torch.randn(*lead, hidden, rows, generator=g) * scale).to(dtype).transpose(-1, -2)
        return (torch.randn(shape, generator=g) * scale).to(dtype)

    x = t(io, 2.0)
    zt = None if z is None else t(z, 2.0)
    weight = (1 + 0.5 * torch.randn(hidden, generator=g)).to(w)
    b = None if bias is None else (0.5 * torch.randn(hidden, generator=g)).to(bias)
    return x, weight, b, zt


def check(out, x, weight, bias, z, eps, group_size, norm_before_gate):
    want = rms_norm_gated_rows(x, weight, bias, z, eps, group_size, norm_before_gate)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), want, rtol=RTOL[x.dtype], atol=1e-5)


CASES = [
    pytest.param({}, {}, id="bf16-one-group"),
    pytest.param({}, {"group_size": 16}, id="bf16-groups16"),
    pytest.param({}, {"group_size": 16, "norm_before_gate": False}, id="bf16-gate-first"),
    pytest.param({"z": None}, {"group_size": 32}, id="no-gate"),
    pytest.param({"z": None, "bias": F32}, {"norm_before_gate": False}, id="no-gate-bias"),
    pytest.param({"bias": BF16, "w": BF16}, {"group_size": 8}, id="bias-bf16-weight"),
    pytest.param({"io": F16, "z": F16, "w": F16}, {"group_size": 16, "norm_before_gate": False}, id="f16"),
    pytest.param({"io": F32, "z": F32}, {"eps": 0.0, "norm_before_gate": False}, id="f32-eps0"),
    pytest.param({"io": BF16, "z": F32}, {"group_size": 32, "norm_before_gate": False}, id="bf16-x-f32-z"),
    pytest.param({"lead": (2, 3), "rows": 5}, {"group_size": 16, "norm_before_gate": False}, id="4d"),
    pytest.param({"rows": 7, "form": "row-view"}, {"group_size": 16, "norm_before_gate": False}, id="row-view"),
    pytest.param({"rows": 5, "form": "transposed"}, {"group_size": 32}, id="transposed-copied"),
    pytest.param({"rows": 0}, {"group_size": 16}, id="no-rows"),
    pytest.param({"rows": 3, "hidden": 1}, {}, id="one-feature"),
    pytest.param({"rows": 3, "hidden": 45}, {"group_size": 9, "eps": 1e-2}, id="odd-groups"),
]


@pytest.mark.parametrize(("form", "opts"), CASES)
def test_reference_matches_per_row_loop(form, opts):
    x, weight, bias, z = inputs(**form)
    kw = {"eps": 1e-5, "group_size": None, "norm_before_gate": True, **opts}
    x0, z0 = x.clone(), None if z is None else z.clone()
    out = rms_norm_gated(x, weight, bias, z, kw["eps"], kw["group_size"], kw["norm_before_gate"], backend="torch")
    check(out, x, weight, bias, z, **kw)
    assert torch.equal(x, x0) and (z is None or torch.equal(z, z0))  # inputs untouched


def test_defaults_are_vllms():
    """vLLM 0.33: ``rms_norm_gated(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True)``."""
    x, weight, _, z = inputs()
    check(rms_norm_gated(x, weight, None, z), x, weight, None, z, 1e-6, None, True)


def test_zero_row_is_eps_scaled_not_nan():
    x = torch.zeros(2, 16)
    out = rms_norm_gated(x, torch.ones(16), None, None, 1e-6, 8)
    assert torch.equal(out, torch.zeros(2, 16))


def _bad(name, **over):
    x, weight, bias, z = inputs(rows=4, hidden=32)
    kw = dict(x=x, weight=weight, bias=bias, z=z, eps=1e-5, group_size=16, norm_before_gate=False)
    kw.update(over)
    return pytest.param(kw, name, id=f"{name}-{len(over)}-{next(iter(over))}")


BAD = [
    _bad("x", x=torch.zeros(4, 32, dtype=torch.int32)),
    _bad("x", x=torch.tensor(1.0)),
    _bad("x", x=torch.zeros(4, 0)),
    _bad("x", x=torch.zeros(4, 32, dtype=torch.float64)),
    _bad("weight", weight=torch.ones(31)),
    _bad("weight", weight=None),
    _bad("weight", weight=torch.ones(32, dtype=torch.int64)),
    _bad("bias", bias=torch.ones(2, 16)),
    _bad("z", z=torch.zeros(4, 16)),
    _bad("z", z=torch.zeros(4, 32, dtype=torch.int8)),
    _bad("eps", eps=-1e-6),
    _bad("eps", eps=float("nan")),
    _bad("eps", eps="1e-6"),
    _bad("group_size", group_size=12),
    _bad("group_size", group_size=0),
    _bad("group_size", group_size=True),
    _bad("norm_before_gate", norm_before_gate=1),
]


@pytest.mark.parametrize(("kw", "name"), BAD)
def test_bad_arguments_name_the_argument(kw, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        rms_norm_gated(**kw)


def test_unknown_backend_is_named():
    x, weight, bias, z = inputs()
    with pytest.raises(ValueError, match="^backend: "):
        rms_norm_gated(x, weight, bias, z, backend="cuda")


# ------------------------------------------------------------------------------------------ the TileLang planner


def _spec(*args, **kwargs):
    (spec,) = plan_rms_norm_gated(*args, **kwargs)
    return spec


def test_plan_of_the_mamba2_call():
    """Nemotron-H 8B per rank: 8192 features in 8 groups, bf16 x and z, the gate before the norm."""
    x, weight, _, z = inputs(rows=3, hidden=8192, w=BF16)
    spec = _spec(x, weight, None, z, 1e-5, 1024, False)
    assert (spec.group_size, spec.vec, spec.threads, spec.chunks) == (1024, 8, 128, 1)
    assert spec.has_z and not spec.has_bias and not spec.norm_before_gate


@pytest.mark.parametrize(
    ("hidden", "gs", "io", "z", "want"),
    [
        pytest.param(5120, None, BF16, BF16, (8, 224, 3), id="bf16-5120"),
        pytest.param(1024, 512, F32, F32, (4, 128, 1), id="f32-512"),
        pytest.param(1024, 512, BF16, F32, (4, 128, 1), id="f32-z-narrows-vec"),
        pytest.param(960, 96, F16, None, (8, 32, 1), id="f16-96"),
        pytest.param(90, 9, BF16, BF16, (1, 32, 1), id="odd-group-scalar"),
        pytest.param(32768, None, BF16, BF16, (8, 1024, 4), id="wide"),
    ],
)
def test_plan_tiling(hidden, gs, io, z, want):
    x, weight, _, zt = inputs(rows=2, hidden=hidden, io=io, z=z)
    spec = _spec(x, weight, None, zt, 1e-5, gs)
    assert (spec.vec, spec.threads, spec.chunks) == want
    assert spec.threads * spec.chunks * spec.vec >= spec.group_size


def test_plan_falls_back_to_scalar_accesses_off_the_16_byte_grid():
    buf = torch.randn(4, 1024 + 16).to(BF16)
    x = buf[:, 1:1025]  # rows 2 bytes off the grid
    weight = torch.ones(1024)
    assert _spec(x, weight, None, None).vec == 1
    assert _spec(buf[:, 8:1032].contiguous(), weight, None, None).vec == 8
    odd_stride = torch.randn(4, 1028).to(BF16)[:, :1024]  # row stride 1028: not whole 8-value vectors
    assert _spec(odd_stride, weight, None, None).vec == 1


def test_plan_without_rows_launches_nothing():
    x, weight, _, z = inputs(rows=0)
    assert plan_rms_norm_gated(x, weight, None, z) == ()


def test_too_wide_group_is_not_implemented_on_tilelang():
    x = torch.randn(1, 131072)
    with pytest.raises(NotImplementedError, match="group_size=131072"):
        plan_rms_norm_gated(x, torch.ones(131072), None)


# ---------------------------------------------------------------------------- the eager fast path (TileLang launcher)


def _torch_kernel(spec):
    """The kernel's contract in torch, on its launch arguments: what the recording stub computes."""

    def launch(x, z, weight, bias, out, eps):
        call = normalize_norm(x, weight, bias if spec.has_bias else None, z if spec.has_z else None, eps,
                              spec.group_size, spec.norm_before_gate)  # fmt: skip
        from mate.mamba._reference.norm import rms_norm_gated as ref

        out.copy_(ref(call).view(out.shape))

    return launch


@pytest.fixture
def stub(monkeypatch):
    """TileLang for CPU tensors, each launch recorded and computed in torch; yields (launches, normalisations)."""
    launches, normalised = [], []

    def kernel(spec, dev):
        run = _torch_kernel(spec)
        return lambda *args: launches.append((spec, args)) or run(*args)

    monkeypatch.setattr(dispatch, "resolve_backend", lambda b, d: "torch" if b == "torch" else "tilelang")
    monkeypatch.setattr(tl_norm, "kernel", kernel)
    norm = norm_api.FAST.normalize
    monkeypatch.setattr(norm_api.FAST, "normalize", lambda *a, _n=norm: normalised.append(1) or _n(*a))
    norm_api.FAST.clear()
    with settings.override(MATE_CHECK_INPUTS="0"):
        yield launches, normalised
    norm_api.FAST.clear()


@pytest.mark.parametrize(
    "form",
    [
        pytest.param({"form": "row-view"}, id="row-view"),
        pytest.param({"z": None, "bias": F32}, id="no-gate-bias"),
        pytest.param({"lead": (3,)}, id="3d"),
    ],
)
def test_fast_path_hit_equals_the_slow_path(stub, form):
    launches, normalised = stub
    outs = []
    for seed in range(3):
        x, weight, bias, z = inputs(rows=5, hidden=64, seed=seed, **form)
        out = rms_norm_gated(x, weight, bias, z, 1e-5, 16, False)
        check(out, x, weight, bias, z, 1e-5, 16, False)
        outs.append(out)
    assert len(normalised) == 1 and len(launches) == 3  # one normalisation, three launches
    assert outs[0].data_ptr() != outs[1].data_ptr()  # a new output per call
    spec, args = launches[2]
    assert args[0].data_ptr() == x.data_ptr() and args[5] == 1e-5


def test_fast_path_replans_when_the_alignment_changes(stub):
    launches, _ = stub
    buf = torch.randn(4, 72).to(BF16)
    weight = torch.ones(64)
    rms_norm_gated(buf[:, :64], weight, None, None, 1e-5, 16)  # aligned
    rms_norm_gated(buf[:, 1:65], weight, None, None, 1e-5, 16)  # same metadata, 2 bytes off
    assert [s.vec for s, _ in launches] == [8, 1]


def test_fast_path_metadata_change_normalises_again(stub):
    _, normalised = stub
    x, weight, _, z = inputs()
    rms_norm_gated(x, weight, None, z, 1e-5, 16, False)
    rms_norm_gated(x, weight, None, z, 1e-5, 32, False)
    rms_norm_gated(x[:3], weight, None, z[:3], 1e-5, 16, False)
    assert len(normalised) == 3


# ------------------------------------------------------------------------------------------------ torch.compile


def test_compiled_norm_equals_eager():
    torch._dynamo.reset()
    x, weight, bias, z = inputs(rows=5, hidden=64, lead=(2,), bias=F32)

    def f(x, z):
        return rms_norm_gated(x, weight, bias, z, 1e-5, 16, False) * 2

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, z)
    torch.testing.assert_close(got, f(x, z), rtol=0, atol=0)


def test_bad_norm_call_is_rejected_while_tracing():
    torch._dynamo.reset()
    x, weight, _, z = inputs()
    with pytest.raises(Exception, match="group_size"):
        torch.compile(lambda x: rms_norm_gated(x, weight, None, z, 1e-5, 7), fullgraph=True, backend="aot_eager")(x)
