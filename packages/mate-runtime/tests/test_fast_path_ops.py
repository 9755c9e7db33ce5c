"""The eager fast path of the prefill, of ReplaySSM and of the causal conv1d (``mate.mamba._dispatch.FastPath``), on
CPU tensors.

The same mechanism as the decode's (``test_ssu_fast_path.py``): a call whose metadata equals an earlier TileLang
call's is not normalised again; the TileLang backend's launcher rebuilds the call from the new tensors
(``mate.mamba._contract.template.CallTemplate``) and launches it, the prefill under the plan the first call made.
For each call form, the launches of a hit must equal those of the slow path on the same tensors. The TileLang
backend is picked for CPU tensors and every kernel is a recorder (nothing compiles or runs).
"""

from __future__ import annotations

import pytest
import torch
from mate.mamba import _dispatch as dispatch
from mate.mamba import conv1d as conv1d_api
from mate.mamba import replay as replay_api
from mate.mamba import settings
from mate.mamba import ssd as ssd_api
from mate.mamba._contract.template import CallTemplate
from mate.mamba._platform.device import Hardware
from mate.mamba._tilelang import conv1d as tl_conv1d
from mate.mamba._tilelang import replay as tl_replay
from mate.mamba._tilelang import ssd as tl_ssd
from mate.mamba._tilelang import ssd_plan
from mate.mamba.chunking import chunk_metadata

BF16, F32, I8 = torch.bfloat16, torch.float32, torch.int8
H, P, N, G = 4, 64, 128, 2


@pytest.fixture
def stub(monkeypatch):
    """TileLang for CPU tensors, recording kernels; yields (launches, normalisations)."""
    launches, normalised = [], []
    rec = lambda spec, dev: lambda *args: launches.append((spec, args))  # noqa: E731
    monkeypatch.setattr(dispatch, "resolve_backend", lambda b, d: "torch" if b == "torch" else "tilelang")
    monkeypatch.setattr(tl_ssd, "kernel", rec)
    monkeypatch.setattr(tl_ssd, "hardware", lambda dev: Hardware("cuda", 9, 132))
    monkeypatch.setattr(tl_replay, "kernel", rec)
    monkeypatch.setattr(tl_conv1d, "kernel", rec)
    fasts = (ssd_api.FAST, replay_api.FAST, conv1d_api.FAST_FN, conv1d_api.FAST_UPDATE)
    for fast in fasts:
        norm = fast.normalize
        monkeypatch.setattr(fast, "normalize", lambda *a, _n=norm: normalised.append(1) or _n(*a))
        fast.clear()
    with settings.override(MATE_CHECK_INPUTS="0"):
        yield launches, normalised
    for fast in fasts:
        fast.clear()


def same(a, b, caller: set) -> bool:
    """The same launch argument on both paths: equal scalars; tensors of equal geometry, at the same address where
    either is (a view of) a caller's tensor (fresh outputs differ from call to call)."""
    if not isinstance(a, torch.Tensor):
        return type(a) is type(b) and a == b
    if not isinstance(b, torch.Tensor) or (a.shape, a.stride(), a.dtype) != (b.shape, b.stride(), b.dtype):
        return False
    ours = {a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()} & caller
    return not ours or a.data_ptr() == b.data_ptr()


def storages(kw) -> set:
    return {t.untyped_storage().data_ptr() for t in kw if isinstance(t, torch.Tensor)}


# --------------------------------------------------------------------------------------------------- prefill


def ssd_call(lens=(5, 300), chunk=128, pool=False, quant=False, z=False, vllm=False):
    """``vllm``: the mixer's form (vLLM 0.33): parameters, out given, gathered initial states, the final states
    into a strided page pool by slot."""
    meta = chunk_metadata(list(lens), chunk)
    T = sum(lens)
    buf = torch.randn(T, H * P + 2 * G * N).to(BF16)  # x/B/C as row views of one projection buffer
    kw = dict(
        x=buf[:, : H * P].unflatten(-1, (H, P)), dt=torch.rand(T, H), A=-torch.rand(H),
        B=buf[:, H * P : H * P + G * N].unflatten(-1, (G, N)), C=buf[:, H * P + G * N :].unflatten(-1, (G, N)),
        chunk_size=chunk, cu_seqlens=meta.cu_seqlens, cu_chunk_seqlens=meta.cu_chunk_seqlens,
        last_chunk_indices=meta.last_chunk_indices, seq_idx=meta.seq_idx, D=torch.rand(H), dt_bias=torch.rand(H),
        dt_softplus=True,
    )  # fmt: skip
    if z:
        kw["z"] = torch.randn(T, H, P).to(BF16)
    if pool:
        dtype = I8 if quant else F32
        kw["final_states_out"] = torch.zeros(6, H, P, N, dtype=dtype)
        kw["final_state_indices"] = torch.tensor([3, 1], dtype=torch.int32)
        if quant:
            kw["final_states_scale"] = torch.ones(6, H, P)
    if vllm:
        for name in ("A", "D", "dt_bias"):
            kw[name] = torch.nn.Parameter(kw[name], requires_grad=False)
        kw["out"] = torch.empty(T, H * P, dtype=BF16).view(T, -1, P)
        kw["initial_states"] = torch.zeros(len(lens), H, P, N)
        kw["final_states_out"] = torch.zeros(6, H * P * N + 64)[:, 32 : 32 + H * P * N].view(6, H, P, N)
        kw["final_state_indices"] = torch.tensor([3, 1], dtype=torch.int32)[: len(lens)]
    return kw


def _with(kw, **changes):
    return kw | changes


SSD_FORMS = {
    "returned-states": lambda: ssd_call(),
    "pool-by-index": lambda: ssd_call(pool=True, z=True),
    "int8-pool": lambda: ssd_call(pool=True, quant=True),
    "one-long-split": lambda: ssd_call(lens=(4096,)),
    "vllm-mixer": lambda: ssd_call(vllm=True),
    # D as an expanded [H, P] (read through a view of it) and dt read through a staged copy
    "expanded-D": lambda: _with(ssd_call(), D=torch.rand(H).unsqueeze(1).expand(H, P)),
    "staged-dt": lambda: _with(ssd_call(), dt=torch.rand(H, 305).t()),
}
RECIPE_FORMS = [f for f in SSD_FORMS if f != "staged-dt"]  # the launch objects that stage nothing


def run_ssd(kw):
    names = ["x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices",
             "seq_idx"]  # fmt: skip
    rest = {k: v for k, v in kw.items() if k not in names}
    return ssd_api.ssd_combined_fwd_varlen(*(kw[n] for n in names), **rest)


@pytest.mark.parametrize("form", list(SSD_FORMS))
def test_prefill_hit_equals_the_slow_path(stub, form):
    launches, normalised = stub
    kw = SSD_FORMS[form]()
    run_ssd(kw)  # a miss: normalised, launched, remembered
    assert len(normalised) == 1
    kw = SSD_FORMS[form]()  # new tensors, same metadata
    del launches[:]
    got = run_ssd(kw)
    assert len(normalised) == 1, "a hit must not normalise"
    hit = list(launches)
    del launches[:]
    ssd_api.FAST.enabled = False
    try:
        want = run_ssd(kw)
    finally:
        ssd_api.FAST.enabled = True
    assert [s for s, _ in hit] == [s for s, _ in launches]
    if form == "one-long-split":
        assert ssd_plan.plan(ssd_api.FAST.normalize(*_positional(kw)), Hardware("cuda", 9, 132)).design == "split"
    for (_, g), (_, e) in zip(hit, launches, strict=True):
        assert len(g) == len(e)
        assert all(same(a, b, storages(kw.values())) for a, b in zip(g, e, strict=True))
    assert (got is None) == (want is None)
    if got is not None:
        assert got.shape == want.shape and got.dtype == want.dtype


@pytest.mark.parametrize("form", list(SSD_FORMS))
def test_prefill_hit_replays_a_recipe(stub, monkeypatch, form):
    """A launch object that stages nothing is replayed by its recipe: no call rebuilt, and no torch operation but the
    returned states' allocation (views of the caller's tensors only where a kernel reads one through a view).
    One that stages a copy keeps the general launcher."""
    from torch.utils._python_dispatch import TorchDispatchMode

    run_ssd(SSD_FORMS[form]())
    (launcher,) = ssd_api.FAST.cache.values()
    assert hasattr(launcher, "launch_object") == (form in RECIPE_FORMS)
    if form not in RECIPE_FORMS:
        return
    kw = SSD_FORMS[form]()
    run_ssd(kw)  # the form becomes the latest

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    ops = []
    monkeypatch.setattr(CallTemplate, "rebuild", lambda *a: pytest.fail("a recipe's hit rebuilt the call"))
    with Ops():
        got = run_ssd(kw)
    want = (["aten.empty"] if "out" not in kw else []) + (["aten.empty"] if got is not None else [])
    want += ["aten.as_strided"] if form == "expanded-D" else []  # (the kernels read D[:, 0])
    assert sorted(ops) == sorted(want)


def test_prefill_recipe_keeps_a_torch_tensor_in_every_tvm_ffi_call(stub, monkeypatch):
    """tvm_ffi launches on the stream of the first torch tensor it converts: a recipe converts its constants (workspace,
    dummies) to tvm_ffi tensors once, except in a kernel call that has no per-call tensor (the split design's
    hand-over), whose constants stay torch tensors."""
    from mate.mamba._tilelang import ssd_recipe

    class Converted:
        def __init__(self, t):
            self.t = t

    monkeypatch.setattr(ssd_recipe, "is_ffi_function", lambda fn: True)
    monkeypatch.setattr(ssd_recipe, "ffi_tensor", Converted)
    launches, _ = stub
    for _ in range(2):
        run_ssd(SSD_FORMS["one-long-split"]())
    del launches[:]
    run_ssd(SSD_FORMS["one-long-split"]())
    assert [s.factory for s, _ in launches][2] == "ssd_combine_kernel"
    for _, args in launches:
        assert any(isinstance(a, torch.Tensor) for a in args)
    assert sum(isinstance(a, Converted) for _, args in launches for a in args) > 0


def test_split_run_bounds_are_filled_once(stub, monkeypatch):
    """The split design's run bounds depend only on (runs, nchunks): filled when the launch is made, not per call."""
    launches, _ = stub
    kw = SSD_FORMS["one-long-split"]()
    run_ssd(kw)
    monkeypatch.setattr(torch, "arange", lambda *a, **k: pytest.fail("the run bounds were filled again"))
    del launches[:]
    run_ssd(SSD_FORMS["one-long-split"]())
    (runs,) = [a[3] for s, a in launches if s.factory == "ssd_run_states_kernel"]
    R, nchunks = runs.shape[0] - 1, kw["seq_idx"].shape[0]
    assert runs.tolist() == [r * nchunks // R for r in range(R + 1)]


def _positional(kw):
    names = ["x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices",
             "seq_idx", "out", "D", "z", "dt_bias", "dt_softplus"]  # fmt: skip
    return [kw.get(n, False if n == "dt_softplus" else None) for n in names]


def test_prefill_inputs_reach_the_kernels_as_passed(stub):
    launches, _ = stub
    run_ssd(ssd_call())
    kw = ssd_call()
    del launches[:]
    run_ssd(kw)
    (_, dt_args), (_, scan_args) = launches
    assert dt_args[0] is kw["dt"]
    assert any(a is kw["cu_chunk_seqlens"] for a in scan_args)
    x = scan_args[0]  # a view rebuilt over the caller's buffer (TMA-compatible strides: not staged)
    assert x.data_ptr() == kw["x"].data_ptr() and x.stride() == kw["x"].stride()


def test_prefill_hit_stages_what_a_new_pointer_alignment_needs(stub):
    """Storage offsets are not metadata: a hit whose x, B, C start 2 bytes off a 16-byte boundary (one bf16
    element) reads them from aligned copies (the scan reads them by TMA), then an aligned call reads them in place
    again, without normalising."""
    launches, normalised = stub

    def shifted(kw, by):
        for name in ("x", "B", "C"):
            t = kw[name]
            base = t.untyped_storage().nbytes() // t.element_size()
            flat = torch.empty(base + by, dtype=t.dtype)[by:]
            kw[name] = torch.as_strided(flat, t.shape, t.stride(), by + t.storage_offset()).copy_(t)
        return kw

    run_ssd(ssd_call())
    for by, staged in ((1, True), (0, False)):
        kw = shifted(ssd_call(), by)
        del launches[:]
        run_ssd(kw)
        x = launches[-1][1][0]
        assert (x.data_ptr() != kw["x"].data_ptr()) == staged and torch.equal(x, kw["x"])
        assert x.data_ptr() % 16 == 0
    assert len(normalised) == 1


def test_prefill_metadata_change_misses(stub):
    _, normalised = stub
    run_ssd(ssd_call())
    run_ssd(ssd_call(lens=(6, 300)))  # another token count: other shapes
    run_ssd(ssd_call(z=True))
    assert len(normalised) == 3 and len(ssd_api.FAST.cache) == 3


def test_prefill_checked_mode_leaves_no_launcher(stub):
    _, normalised = stub
    with settings.override(MATE_CHECK_INPUTS="1"):
        run_ssd(ssd_call())
        run_ssd(ssd_call())
    assert len(normalised) == 2 and list(ssd_api.FAST.cache.values()) == [ssd_api.FAST.SLOW]


def test_invalid_prefill_is_never_remembered(stub):
    kw = ssd_call()
    kw["B"] = kw["B"].float()
    for _ in range(2):
        with pytest.raises(ValueError, match="B"):
            run_ssd(kw)
    assert not ssd_api.FAST.cache


# --------------------------------------------------------------------------------------------------- ReplaySSM


def replay_args(batch=2, T=1, L=17, S=8, packed=False):
    out = torch.zeros(batch, T, H, P)
    args = [torch.zeros(S, H, P, N), torch.zeros(S, H, L, P), torch.zeros(S, G, L, N), torch.zeros(S, H, L),
            torch.zeros(S, dtype=torch.int32), torch.zeros(S, dtype=torch.int32), torch.randn(batch, T, H, P),
            torch.rand(batch, T, H), -torch.rand(H), torch.randn(batch, T, G, N), torch.randn(batch, T, G, N),
            out]  # fmt: skip
    kw = dict(D=torch.rand(H), dt_bias=torch.rand(H), dt_softplus=True,
              state_batch_indices=torch.arange(batch, dtype=torch.int32))  # fmt: skip
    return args, kw


@pytest.mark.parametrize("T", [1, 6], ids=["one-token", "mtp6"])
def test_replay_hit_equals_the_slow_path(stub, T):
    launches, normalised = stub
    args, kw = replay_args(T=T)
    replay_api.replay_state_update(*args, **kw)
    args, kw = replay_args(T=T)
    del launches[:]
    out = replay_api.replay_state_update(*args, **kw)
    assert len(normalised) == 1 and out is args[-1]
    hit = list(launches)
    del launches[:]
    replay_api.FAST.enabled = False
    try:
        replay_api.replay_state_update(*args, **kw)
    finally:
        replay_api.FAST.enabled = True
    (gs, ga), (es, ea) = hit[0], launches[0]
    assert gs == es and all(same(a, b, storages([*args, *kw.values()])) for a, b in zip(ga, ea, strict=True))


# ------------------------------------------------------------------------------------------------ causal conv1d

CD, CW, CS = 24, 4, 9  # channels, width, pool slots


def conv_pool(K=CW - 1, dtype=BF16):
    """vLLM's pool layout: [slots, state_len, dim] allocated, passed as its [slots, dim, state_len] transpose."""
    return torch.randn(CS, K, CD).to(dtype).transpose(1, 2)


def conv_fn_args(tables=True, idx=torch.int32):
    x = torch.randn(40, CD).to(BF16).t()  # vLLM passes its [tokens, dim] buffer transposed
    kw = dict(x=x, weight=torch.randn(CD, CW).to(BF16), bias=torch.randn(CD).to(BF16), conv_states=conv_pool(),
              query_start_loc=torch.tensor([0, 7, 7, 39], dtype=idx))  # fmt: skip
    if tables:
        kw |= dict(cache_indices=torch.tensor([4, 0, 2], dtype=idx), has_initial_state=torch.tensor([1, 0, 1]) > 0)
    return kw


def conv_update_args(form, idx=torch.int32):
    w, b = torch.randn(CD, CW).to(BF16), torch.randn(CD).to(BF16)
    if form == "one-token":
        return dict(x=torch.randn(5, CD).to(BF16), conv_state=conv_pool(), weight=w, bias=b, activation="silu",
                    conv_state_indices=torch.tensor([1, 0, 3, 8, 2], dtype=idx))  # fmt: skip
    if form == "one-token-out":
        kw = conv_update_args("one-token", idx)
        return kw | dict(out=torch.empty_like(kw["x"]))
    if form == "mtp-dense":
        return dict(x=torch.randn(3, CD, 4).to(BF16), conv_state=conv_pool(K=CW - 1 + 3), weight=w, bias=b,
                    conv_state_indices=torch.tensor([[2, 7], [0, 7], [5, 7]], dtype=idx),
                    num_accepted_tokens=torch.tensor([1, 3, 2], dtype=idx))  # fmt: skip
    if form == "mtp-packed":
        return dict(x=torch.randn(10, CD).to(BF16), conv_state=conv_pool(K=CW - 1 + 3), weight=w, bias=None,
                    conv_state_indices=torch.tensor([2, 0, 5], dtype=idx),
                    num_accepted_tokens=torch.tensor([1, 3, 2], dtype=idx),
                    query_start_loc=torch.tensor([0, 4, 6, 10], dtype=idx), max_query_len=4)  # fmt: skip
    raise AssertionError(form)


CONV_UPDATE_FORMS = [
    pytest.param("one-token", torch.int32, id="one-token-int32"),
    pytest.param("one-token-out", torch.int64, id="one-token-out-int64"),
    pytest.param("mtp-dense", torch.int64, id="mtp-dense-int64"),
    pytest.param("mtp-packed", torch.int32, id="mtp-packed-int32"),
]


def _hit_and_slow(fast, call, make, launches, normalised):
    """A miss, then a hit on new tensors, then the slow path on those tensors: (hit launches, slow launches, hit
    result, slow result, the tensors)."""
    call(**make())
    assert len(normalised) == 1
    kw = make()
    del launches[:]
    got = call(**kw)
    assert len(normalised) == 1, "a hit must not normalise"
    hit = list(launches)
    del launches[:]
    fast.enabled = False
    try:
        want = call(**kw)
    finally:
        fast.enabled = True
    return hit, list(launches), got, want, kw


@pytest.mark.parametrize("form, idx", CONV_UPDATE_FORMS)
def test_conv1d_update_hit_equals_the_slow_path(stub, form, idx):
    launches, normalised = stub
    hit, slow, got, want, kw = _hit_and_slow(conv1d_api.FAST_UPDATE, conv1d_api.causal_conv1d_update,
                                             lambda: conv_update_args(form, idx), launches, normalised)  # fmt: skip
    assert len(hit) == len(slow) == 1
    (gs, ga), (es, ea) = hit[0], slow[0]
    assert gs == es and all(same(a, b, storages(kw.values())) for a, b in zip(ga, ea, strict=True))
    assert got is want is kw.get("out", kw["x"])  # in place into x (the pool's dtype), or into out


@pytest.mark.parametrize("tables", [pytest.param(True, id="tables"), pytest.param(False, id="no-tables")])
def test_conv1d_fn_hit_equals_the_slow_path(stub, tables):
    launches, normalised = stub
    hit, slow, got, want, kw = _hit_and_slow(conv1d_api.FAST_FN, conv1d_api.causal_conv1d_fn,
                                             lambda: conv_fn_args(tables), launches, normalised)  # fmt: skip
    assert len(hit) == len(slow) == 1
    (gs, ga), (es, ea) = hit[0], slow[0]
    assert gs == es and all(same(a, b, storages(kw.values())) for a, b in zip(ga, ea, strict=True))
    # the result: a new tensor of x's geometry (torch.empty_like(x): channel-contiguous), written by the launch
    assert got.stride() == want.stride() == kw["x"].stride() and ga[1] is got and got is not want


def test_conv1d_result_copy_is_not_replayed(stub):
    """Without out and with x not in the pool's dtype the result is a copy of x the normaliser made (rows the
    kernel skips keep x's values): such calls always normalise."""
    _, normalised = stub
    for _ in range(2):
        kw = conv_update_args("one-token")
        kw["x"] = kw["x"].float()
        out = conv1d_api.causal_conv1d_update(**kw)
        assert out is not kw["x"] and out.dtype == torch.float32
    assert len(normalised) == 2 and list(conv1d_api.FAST_UPDATE.cache.values()) == [conv1d_api.FAST_UPDATE.SLOW]


def test_conv1d_metadata_change_misses(stub):
    _, normalised = stub
    conv1d_api.causal_conv1d_update(**conv_update_args("one-token"))
    conv1d_api.causal_conv1d_update(**conv_update_args("one-token", torch.int64))  # another index dtype
    kw = conv_update_args("one-token")
    conv1d_api.causal_conv1d_update(**kw | dict(activation=None))  # another scalar option
    conv1d_api.causal_conv1d_update(**kw | dict(conv_state=kw["conv_state"].contiguous()))  # another pool layout
    assert len(normalised) == 4 and len(conv1d_api.FAST_UPDATE.cache) == 4
    conv1d_api.causal_conv1d_fn(**conv_fn_args())
    conv1d_api.causal_conv1d_fn(**conv_fn_args(tables=False))
    assert len(normalised) == 6 and len(conv1d_api.FAST_FN.cache) == 2


def test_conv1d_checked_mode_leaves_no_launcher(stub):
    _, normalised = stub
    with settings.override(MATE_CHECK_INPUTS="1"):
        for _ in range(2):
            conv1d_api.causal_conv1d_fn(**conv_fn_args())
    assert len(normalised) == 2 and list(conv1d_api.FAST_FN.cache.values()) == [conv1d_api.FAST_FN.SLOW]


def test_conv1d_absent_tensors_are_one_cached_dummy(stub):
    """The stand-ins for absent tables are the same tensor on every call: no allocation per launch, and a stable
    address under graph capture."""
    launches, _ = stub
    for _ in range(2):
        conv1d_api.causal_conv1d_update(**conv_update_args("one-token"))
    (_, a), (_, b) = launches
    assert a[6] is b[6] and a[7] is b[7] and a[6] is a[7]  # num_accepted_tokens, query_start_loc


# ---------------------------------------------------------------------------------------------- the template


def test_template_refuses_a_copy():
    """A field that is a copy the normaliser made (not the caller's tensor or a view of it) cannot be rebuilt."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Call:
        a: torch.Tensor
        b: torch.Tensor
        n: int

    src = torch.randn(4, 3)
    assert CallTemplate.of(Call(src, src[:, 1:], 3), (src,)) is not None
    assert CallTemplate.of(Call(src, src.t().contiguous(), 3), (src,)) is None
    t = CallTemplate.of(Call(src, src[:, 1:], 3), (src,))
    new = torch.randn(4, 3)
    call = t.rebuild((new,))
    assert call.a is new and call.n == 3 and torch.equal(call.b, new[:, 1:])


def test_template_rebuilds_a_fresh_output_with_its_strides():
    """A fresh field allocated like a transposed input (``torch.empty_like``) is rebuilt with the same strides;
    a fresh-named field that is a view into a larger storage is refused."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Call:
        a: torch.Tensor
        out: torch.Tensor

    src = torch.randn(5, 3).t()
    t = CallTemplate.of(Call(src, torch.empty_like(src)), (src,), fresh=("out",))
    out = t.rebuild((torch.randn(5, 3).t(),)).out
    assert out.shape == (3, 5) and out.stride() == (1, 3)
    assert CallTemplate.of(Call(src, torch.empty(4, 5)[1:]), (src,), fresh=("out",)) is None
