"""The eager fast path of ``selective_state_update`` (``mate.mamba.ssu.eager_ssu``), on CPU tensors.

A call whose metadata equals an earlier TileLang call's replays that call's launch recipe instead of
normalising and planning. For every call form below, the kernel key and the launch arguments the fast path
produces must equal what the slow path (``normalize_ssu`` + ``plan``) produces for the same tensors: on the
first call (a miss, launched by the slow path) and on a second call with different tensors of the same
metadata (a hit, launched by the recipe without normalising). A metadata change misses; the reference
backend keeps its own validation. The TileLang backend is picked for CPU tensors and every kernel is a
recorder (nothing compiles or runs).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from mate.mamba import _dispatch as dispatch
from mate.mamba import settings
from mate.mamba import ssu as api
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._ops import REQUIRED, SSU, SSU_PARAMS
from mate.mamba._tilelang import ssu as tl_ssu
from mate.mamba._tilelang import ssu_plan, tl_internals

BF16, F16, F32, I32, I64 = torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64
H, P, N, G = 8, 16, 32, 2

DEFAULTS = {p.name: p.default for p in SSU_PARAMS if p.default is not REQUIRED}
DEFAULTS["D"] = None
ORDER = tuple(p.name for p in SSU_PARAMS)


def eager(kw: dict):
    full = {**DEFAULTS, **kw}
    return api.eager_ssu(*(full[n] for n in ORDER))


def slow_plan(kw: dict):
    full = {**DEFAULTS, **kw}
    full.pop("backend")
    return ssu_plan.plan(normalize_ssu(**full))


# ------------------------------------------------------------------------------------------- call forms


def _pool(slots, dtype, offset=32, heads=H):
    inner = heads * P * N
    buf = torch.randn(slots, inner + 96).to(dtype)
    return buf[:, offset : offset + inner].view(slots, heads, P, N)


def _rows(rows, io=BF16, extra=0):
    """x/B/C as row views of one conv buffer; ``extra`` pads the row (changes the row stride)."""
    buf = torch.randn(rows, H * P + 2 * G * N + extra).to(io)
    x = buf[:, : H * P].unflatten(-1, (H, P))
    B = buf[:, H * P : H * P + G * N].unflatten(-1, (G, N))
    C = buf[:, H * P + G * N : H * P + 2 * G * N].unflatten(-1, (G, N))
    return x, B, C


def _tied(rows, dt_dtype=F32):
    dt = torch.rand(rows, H).to(dt_dtype).unsqueeze(-1).expand(rows, H, P)
    A = (-torch.rand(H)).view(H, 1, 1).expand(H, P, N)
    D = torch.randn(H).unsqueeze(1).expand(H, P)
    dtb = torch.randn(H).unsqueeze(1).expand(H, P)
    return dt, A, D, dtb


def vllm_decode(batch=3, *, state=BF16, io=BF16, dt_dtype=F32, extra=0, offset=32, z=True, pad=0, tables=I32):
    x, B, C = _rows(batch, io, extra)
    dt, A, D, dtb = _tied(batch, dt_dtype)
    zz = torch.randn(batch, 2 * H * P).to(io)[:, : H * P].unflatten(-1, (H, P)) if z else None
    return dict(
        state=_pool(12, state, offset), x=x, dt=dt, A=A, B=B, C=C, D=D, z=zz, dt_bias=dtb, dt_softplus=True,
        state_batch_indices=torch.arange(1, batch + 1, dtype=tables), pad_slot_id=pad,
        dst_state_batch_indices=torch.arange(5, batch + 5, dtype=tables),
        out=torch.empty(batch, H * P, dtype=io).view(batch, H, P),
    )  # fmt: skip


def public_plain(batch=3):
    """The public API's simplest form: [H] A/D/dt_bias, per-head [R, H] dt, no tables, no out (allocated)."""
    x, B, C = _rows(batch)
    return dict(state=_pool(6, F32), x=x, dt=torch.rand(batch, H), A=-torch.rand(H), B=B, C=C, D=torch.rand(H),
                dt_bias=torch.rand(H))  # fmt: skip


def mtp(batch=2, T=3, *, meta=I32, flat=False):
    rows = batch * T
    x, B, C = _rows(rows)
    dt, A, D, dtb = _tied(rows, BF16)
    src = torch.arange(1, rows + 1, dtype=meta)
    src = src if flat else src.view(batch, T)
    return dict(
        state=_pool(2 * rows + 2, F32), x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dtb, dt_softplus=True,
        state_batch_indices=src, dst_state_batch_indices=(src + rows).contiguous(), pad_slot_id=0,
        cu_seqlens=torch.arange(0, rows + 1, T, dtype=meta), num_accepted_tokens=torch.full((batch,), T, dtype=meta),
        out=torch.empty(rows, H, P, dtype=BF16),
    )  # fmt: skip


def mtp_one_table(batch=2, T=3):
    """vLLM's speculative decode without prefix caching: one 2-D slot table as source and destination."""
    kw = mtp(batch, T)
    kw["dst_state_batch_indices"] = kw["state_batch_indices"]
    return kw


def mtp_strided_table(batch=2, T=3):
    kw = mtp(batch, T)
    kw["state_batch_indices"] = torch.arange(2 * batch * T, dtype=I32).view(T, 2 * batch).t()[:batch]
    kw.pop("dst_state_batch_indices")  # per-token writes back into the read table
    return kw


def dense_intermediate(batch=2, T=3, *, out=False):
    x, B, C = _rows(batch * T)
    dt, A, D, dtb = _tied(batch * T)
    kw = dict(
        state=_pool(6, BF16), x=x.reshape(batch, T, H, P), dt=dt.reshape(batch, T, H, P), A=A,
        B=B.reshape(batch, T, G, N), C=C.reshape(batch, T, G, N), D=D, dt_bias=dtb, disable_state_update=True,
        intermediate_states_buffer=torch.zeros(4, T, H, P, N, dtype=BF16),
        intermediate_state_indices=torch.tensor([2, 0], dtype=I64),
        state_batch_indices=torch.tensor([3, 1], dtype=I64), cu_seqlens=None,
    )  # fmt: skip
    if out:
        kw["out"] = torch.empty(batch, T, H, P, dtype=BF16)
    return kw


def eagle_tree(batch=2, T=3):
    kw = dense_intermediate(batch, T)
    kw["retrieve_parent_token"] = torch.tensor([[-1, 0, 0], [-1, 0, 1]], dtype=I64)
    return kw


def single_head(batch=3):
    state = torch.randn(5, P, N)
    return dict(state=state, x=torch.randn(batch, P).to(F16), dt=torch.rand(batch, P), A=-torch.rand(P, N),
                B=torch.randn(batch, N).to(F16), C=torch.randn(batch, N).to(F16), D=torch.rand(P))  # fmt: skip


def untied(batch=3):
    x, B, C = _rows(batch)
    return dict(state=_pool(6, BF16), x=x, dt=torch.rand(batch, H, P), A=-torch.rand(H, P, N), B=B, C=C,
                D=torch.rand(H, P), dt_bias=torch.rand(H, P).to(BF16), z=torch.randn(batch, H, P).to(BF16),
                state_batch_indices=torch.tensor([4, 0, 2], dtype=I64))  # fmt: skip


def vllm_mtp_adapter(batch=2, T=3):
    kw = mtp(batch, T)
    kw["final_write_to_dst"] = True  # what mate_vllm passes without num_accepted_tokens
    kw.pop("num_accepted_tokens")
    return kw


FORMS = {
    "vllm_decode": vllm_decode,
    "vllm_decode_bf16_dt": lambda: vllm_decode(dt_dtype=BF16),
    "vllm_decode_f32_state_i64": lambda: vllm_decode(state=F32, tables=I64),
    "vllm_decode_batch1_no_z": lambda: vllm_decode(1, z=False),
    "public_plain": public_plain,
    "mtp": mtp,
    "mtp_i64_flat": lambda: mtp(1, 4, meta=I64, flat=True),
    "mtp_strided_table": mtp_strided_table,
    "mtp_one_table": mtp_one_table,
    "vllm_final_write": vllm_mtp_adapter,
    "dense_intermediate": dense_intermediate,
    "dense_intermediate_out": lambda: dense_intermediate(out=True),
    "eagle_tree": eagle_tree,
    "single_head": single_head,
    "untied": untied,
    "nothing_to_launch": lambda: public_plain(0),
}


# ------------------------------------------------------------------------------------------- harness


@pytest.fixture
def stub(monkeypatch):
    """TileLang picked for CPU tensors; every kernel records (key, args); normalize_ssu calls counted."""
    launches = []
    normalised = []

    def get(key, device):
        def kern(*args):
            launches.append((key, args))

        tl_ssu._kernels[key] = kern
        return kern

    def count(*a, **k):
        normalised.append(1)
        return normalize_ssu(*a, **k)

    monkeypatch.setattr(dispatch, "resolve_backend", lambda b, d: "torch" if b == "torch" else "tilelang")
    monkeypatch.setattr(api.FAST, "normalize", count)
    monkeypatch.setattr(tl_ssu, "kernel", get)
    monkeypatch.setattr(tl_ssu, "_kernels", {})
    api.clear_fast_path_cache()
    with settings.override(MATE_CHECK_INPUTS="0"):  # checking the index data keeps every call on the full path
        yield launches, normalised
    api.clear_fast_path_cache()


def same_tensor(a, b) -> bool:
    return (
        a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        and a.device == b.device
    )  # fmt: skip


def assert_same_launch(got, expected, *, result=None):
    """Same kernel key and argument list; a freshly allocated output is compared by geometry (and must be a
    view of the returned result)."""
    gkey, gargs = got
    ekey, eargs = expected
    assert gkey == ekey
    assert len(gargs) == len(eargs)
    for i, (g, e) in enumerate(zip(gargs, eargs, strict=True)):
        if isinstance(e, torch.Tensor):
            assert isinstance(g, torch.Tensor), i
            if i == 9 and result is not None:  # out: the recipe's own allocation
                assert g.shape == e.shape and g.stride() == e.stride() and g.dtype == e.dtype, i
                assert g.untyped_storage().data_ptr() == result.untyped_storage().data_ptr()
            else:
                assert same_tensor(g, e), (i, g.shape, e.shape)
        else:
            assert type(g) is type(e) and g == e, (i, g, e)


@pytest.mark.parametrize("form", list(FORMS))
def test_fast_path_equals_slow_path(stub, form):
    launches, normalised = stub
    for attempt in range(3):  # miss, then two hits with fresh tensors of the same metadata
        kw = FORMS[form]()
        expected = slow_plan(kw)
        before = len(normalised)
        result = eager(kw)
        assert len(normalised) - before == (1 if attempt == 0 else 0), "a hit must not normalise"
        if kw.get("out") is not None:
            assert result is kw["out"]
        else:
            assert result.shape == kw["x"].shape and result.dtype == kw["x"].dtype
        if expected is None:
            assert not launches
            continue
        assert len(launches) == attempt + 1
        fresh_out = kw.get("out") is None
        assert_same_launch(launches[-1], expected, result=result if fresh_out else None)


def test_every_form_is_replayed(stub):
    """No form of the grid falls back to the slow path for good (each is remembered as a recipe)."""
    for make in FORMS.values():
        eager(make())
    assert all(v is not api.FAST.SLOW for v in api.FAST.cache.values())


@pytest.mark.parametrize(
    "change",
    ["row_stride", "dt_dtype", "state_dtype", "z_none", "pad_slot_id", "batch", "softplus", "tables_i64",
     "backend_torch", "final_write"],
)  # fmt: skip
def test_metadata_change_misses(stub, change):
    launches, normalised = stub
    eager(vllm_decode())
    eager(vllm_decode())
    assert len(normalised) == 1
    kw = {
        "row_stride": lambda: vllm_decode(extra=8),
        "dt_dtype": lambda: vllm_decode(dt_dtype=BF16),
        "state_dtype": lambda: vllm_decode(state=F32),
        "z_none": lambda: vllm_decode(z=False),
        "pad_slot_id": lambda: vllm_decode(pad=-1),
        "batch": lambda: vllm_decode(4),
        "softplus": lambda: {**vllm_decode(), "dt_softplus": False},
        "tables_i64": lambda: vllm_decode(tables=I64),
        "backend_torch": lambda: {**vllm_decode(), "backend": "torch"},
        "final_write": lambda: {**vllm_decode(), "final_write_to_dst": True},
    }[change]()
    expected = None if kw.get("backend") == "torch" else slow_plan(kw)
    eager(kw)
    assert len(normalised) == 2, "a metadata change must take the slow path"
    if expected is not None:
        assert_same_launch(launches[-1], expected)


def test_pointer_alignment_is_rechecked_on_a_hit(stub):
    """Storage offsets are not part of the key: a pool at an odd offset hits the recipe, which still picks the
    scalar-access kernel (the one plan() picks) and builds every view relative to the new offsets."""
    launches, normalised = stub
    eager(vllm_decode(offset=32))
    for offset in (29, 32, 8):
        kw = vllm_decode(offset=offset)
        expected = slow_plan(kw)
        eager(kw)
        assert_same_launch(launches[-1], expected)
    assert len(normalised) == 1
    assert launches[1][0].vector_state is False and launches[2][0].vector_state is True


def test_views_follow_the_new_storage_offset(stub):
    launches, normalised = stub
    eager(mtp_strided_table())
    kw = mtp_strided_table()
    big = torch.arange(7 + 12, dtype=I32)[7:].view(3, 4).t()[:2]  # same shape/strides, another offset
    kw["state_batch_indices"] = big
    expected = slow_plan(kw)
    eager(kw)
    assert len(normalised) == 1
    assert_same_launch(launches[-1], expected)


def test_copies_take_the_slow_path(stub):
    """B/C with a non-unit last stride are copied by the launcher: not replayable, every call is normalised."""
    launches, normalised = stub

    def make():
        kw = vllm_decode()
        kw["B"] = torch.randn(3, G, 2 * N).to(BF16)[:, :, ::2]
        kw["C"] = torch.randn(3, G, 2 * N).to(BF16)[:, :, ::2]
        return kw

    for _ in range(3):
        kw = make()
        expected = slow_plan(kw)
        eager(kw)
        assert launches[-1][0] == expected[0]
    assert len(normalised) == 3
    assert list(api.FAST.cache.values()) == [api.FAST.SLOW]


def test_invalid_calls_are_never_remembered(stub):
    launches, normalised = stub
    kw = vllm_decode()
    kw["x"] = kw["x"].to(F16)  # B/C stay bf16
    for _ in range(2):
        with pytest.raises(ValueError, match="B"):
            eager(kw)
    assert not api.FAST.cache and not launches


def test_unkeyable_values_take_the_slow_path(stub):
    launches, normalised = stub
    for _ in range(2):
        eager({**vllm_decode(), "dt_softplus": 1})  # truthy int: valid, but keyed only as an exact bool
    assert len(normalised) == 2 and not api.FAST.cache


def test_cache_is_bounded(stub, monkeypatch):
    monkeypatch.setattr(api.FAST, "size", 3)
    for b in range(1, 7):
        eager(vllm_decode(b))
    assert len(api.FAST.cache) == 3


def test_reference_backend_keeps_its_index_checks(monkeypatch):
    """The reference backend validates index data on every call (a remembered key only marks it as slow)."""
    api.clear_fast_path_cache()
    kw = vllm_decode()
    kw["backend"] = "torch"
    eager(kw)
    bad = vllm_decode()
    bad["backend"] = "torch"
    bad["state_batch_indices"][0] = 99  # past the pool
    with pytest.raises(ValueError, match="state_batch_indices"):
        eager(bad)
    api.clear_fast_path_cache()


def test_public_function_takes_the_fast_path(stub):
    from mate.mamba import selective_state_update

    launches, normalised = stub
    for _ in range(2):
        kw = vllm_decode()
        state, x, dt, A, B, C, D = (kw.pop(n) for n in ("state", "x", "dt", "A", "B", "C", "D"))
        y = selective_state_update(state, x, dt, A, B, C, D, **kw)
        assert y is kw["out"]
    assert len(normalised) == 1 and len(launches) == 2


# ------------------------------------------------------------------------------- direct tvm_ffi call


class TVMFFIKernelAdapter:  # named like TileLang's adapter: direct_callable checks the class name
    def __init__(self, result_idx, main):
        self.result_idx = result_idx
        self._main = main

    def _get_executable(self):
        return type("Module", (), {"main": staticmethod(self._main)})()


class FakeKernel:
    def __init__(self, adapter):
        self.adapter = adapter
        self.wrapped = []

    def __call__(self, *args):
        self.wrapped.append(args)


def test_direct_callable_picks_the_ffi_function_only_without_outputs(monkeypatch):
    def main(*args):
        return None

    plain = FakeKernel(TVMFFIKernelAdapter([], main))
    assert tl_internals.direct_callable(plain) is main
    with_output = FakeKernel(TVMFFIKernelAdapter([3], main))
    assert tl_internals.direct_callable(with_output) is with_output
    other = FakeKernel(type("CythonKernelAdapter", (), {"result_idx": []})())
    assert tl_internals.direct_callable(other) is other
    assert tl_internals.direct_callable(lambda *a: None) is not main


def test_recipes_launch_through_the_direct_function(stub, monkeypatch):
    launches, _ = stub
    direct = []
    kern = FakeKernel(TVMFFIKernelAdapter([], lambda *args: direct.append(args)))
    monkeypatch.setattr(tl_ssu, "kernel", lambda key, device: tl_ssu._kernels.setdefault(key, kern))
    eager(vllm_decode())  # miss: the slow path calls the kernel object
    kw = vllm_decode()
    expected = slow_plan(kw)
    eager(kw)  # hit: the recipe calls the ffi function with the same arguments
    assert len(kern.wrapped) == 1 and len(direct) == 1
    assert_same_launch((expected[0], direct[0]), expected)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="compiling a CUDA kernel needs nvcc")
def test_direct_function_of_a_compiled_kernel():
    """A real compiled (sm_90a) kernel: the direct function is TileLang's tvm_ffi entry, reached with the same
    arguments as the wrapper (both reject CPU tensors with the kernel's own device check)."""
    pytest.importorskip("tilelang")
    from mate.mamba._tilelang.cache import CACHE

    key, args = slow_plan(vllm_decode(1))
    kern = CACHE.compile_only(
        key, key.build, target={"kind": "cuda", "arch": "sm_90a"}, pass_configs=key.pass_configs()
    )
    fn = tl_internals.direct_callable(kern)
    assert fn is not kern and callable(fn)
    errors = []
    for f in (kern, fn):
        with pytest.raises(RuntimeError, match="device_type mismatch") as e:
            f(*args)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    with pytest.raises(RuntimeError, match="num_args"):
        fn(*args[:-1])


def test_alternating_forms_each_replay_their_own_recipe(stub):
    """The latest-hit shortcut and the keyed lookup agree: two forms interleaved, each launch equals the slow
    path's for its own tensors."""
    launches, normalised = stub
    for i in range(6):
        kw = vllm_decode(3) if i % 2 else mtp()
        expected = slow_plan(kw)
        eager(kw)
        assert_same_launch(launches[-1], expected)
    assert len(normalised) == 2


# ----------------------------------------------------------------------------- the latest form's tensor guard


def test_the_latest_form_hits_without_its_key(stub, monkeypatch):
    """A call of the latest hit's form is recognised by the form's tensor guard: no key is built."""
    launches, normalised = stub
    for _ in range(2):  # a miss, then a hit that makes the form the latest
        eager(vllm_decode())
    monkeypatch.setattr(dispatch, "fast_key", lambda *a: pytest.fail("the key was built"))
    kw = vllm_decode()
    expected = slow_plan(kw)
    eager(kw)
    assert len(normalised) == 1
    assert_same_launch(launches[-1], expected)


def test_an_absent_tensor_is_not_a_present_one(stub):
    """The guard tells None from a tensor of any metadata: D given and dt_bias absent, then the other way round
    with the same [H] fp32 tensor, are two forms."""
    launches, normalised = stub
    for _ in range(3):
        eager({**public_plain(), "dt_bias": None})
    kw = public_plain()
    kw["D"], kw["dt_bias"] = None, kw["D"]
    expected = slow_plan(kw)
    result = eager(kw)
    assert len(normalised) == 2
    assert_same_launch(launches[-1], expected, result=result)


@pytest.mark.parametrize("case", ["repeated_tensor", "inference_mode"])
def test_a_refused_check_falls_back_to_the_key(stub, case):
    """Where the form's check refuses what the key accepts (the form passed one table twice, this call two equal
    ones: a repeat is checked as one object; a change of inference mode: the guard's dispatch keys) every call
    still hits, and the check is made again from the refused call."""
    launches, normalised = stub

    def make(i):
        kw = vllm_decode()
        if case == "repeated_tensor" and i < 3:
            kw["dst_state_batch_indices"] = kw["state_batch_indices"]
        return kw

    for i in range(5):
        kw = make(i)
        expected = slow_plan(kw)
        if case == "inference_mode" and i >= 3:
            with torch.inference_mode():
                eager(kw)
        else:
            eager(kw)
        assert_same_launch(launches[-1], expected)
    assert len(normalised) == 1 and len(launches) == 5
    check = api.FAST.latest[1]
    assert check is not dispatch._refuse
    if case == "repeated_tensor":  # made again from a call with two tables: accepts such calls
        full = {**DEFAULTS, **make(4)}
        assert check(tuple(full[n] for n in SSU.tensor_names))


def test_one_table_as_source_and_destination_hits_without_its_key(stub, monkeypatch):
    """vLLM without prefix caching passes one slot table as both: the form's check takes the repeat as one
    object (the tensor guard refuses an object twice) and no key is built."""
    launches, normalised = stub

    def make():
        kw = vllm_decode()
        kw["dst_state_batch_indices"] = kw["state_batch_indices"]
        return kw

    for _ in range(2):
        eager(make())
    monkeypatch.setattr(dispatch, "fast_key", lambda *a: pytest.fail("the key was built"))
    kw = make()
    expected = slow_plan(kw)
    eager(kw)
    assert len(normalised) == 1
    assert_same_launch(launches[-1], expected)


def test_one_recipe_serves_one_table_and_two(stub):
    """The packed kernel takes 2-D tables as 1-D views: one table passed as both is viewed once, two equal
    tables each (the key does not tell them apart: both forms replay one recipe)."""
    launches, normalised = stub
    for i in range(6):
        kw = mtp_one_table() if i % 3 else mtp()
        expected = slow_plan(kw)
        eager(kw)
        assert_same_launch(launches[-1], expected)
        src, dst = launches[-1][1][10:12]
        assert (src is dst) == (i % 3 != 0)
    assert len(normalised) == 1


def test_switching_the_fast_path_off_forgets_the_latest_form(stub, monkeypatch):
    """The op's entry replays the latest hit's form itself: switched off, no call is replayed any more."""
    launches, normalised = stub
    for _ in range(2):
        eager(vllm_decode())
    monkeypatch.setattr(api.FAST, "enabled", False)
    eager(vllm_decode())
    assert len(normalised) == 2 and len(launches) == 3
