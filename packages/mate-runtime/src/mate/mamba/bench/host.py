"""``python -m mate.mamba.bench.host``: eager host time of ``selective_state_update`` and of the SSD prefill up to the
kernel launches, on CPU.

A CPU-host proxy for the issue's eager-host-time target: the production call shapes are built from real CPU
tensors (vLLM's strided page pool with page stride and storage offset, x/B/C row views of one conv buffer,
the tied dt/A/D/dt_bias forms, z, out, int32 slot tables; the MTP packed call with ``cu_seqlens``,
``num_accepted_tokens`` and 2-D tables), the backend resolution is patched to pick the TileLang launcher and
every kernel object is a no-op, so the whole eager path runs except the kernel call itself. With ``--ffi`` the
kernel is tvm_ffi's own no-op function (``testing.nop``, needs tvm_ffi: TileLang's environment): every launch
argument is converted as the compiled kernel's entry converts it (a torch tensor to an ffi tensor), and only the
kernel's host checks and the driver's launch are left out. With ``--tilelang-wrapper`` the kernels are the real
compiled TileLang kernel objects (sm_90a, needs nvcc) whose loaded module is a no-op: TileLang's Python call
wrapper is then measured too, and only the tvm_ffi argument conversion and the launch are left out. Reported:
the median (``--stat min``: the minimum) µs per call of

* ``normalise``: ``normalize_ssu`` alone (the validation every slow-path call pays);
* ``plan``: the launcher's ``plan()`` on an already-normalised call;
* ``mate.mamba``: the public ``mate.mamba.selective_state_update`` end to end (stubbed launch), with the
  metadata-keyed fast path (repeated calls of one form replay its launch recipe) and, as ``slow``, without it
  (``mate.mamba.ssu.FAST.enabled = False``: every call normalises and plans, the behaviour before the fast path).

The runtime does not import its adapters (they import it), so the vLLM adapter's own wrapper is not timed here:
it adds its argument checks and one Python call with keywords to the ``mate.mamba`` figures.

The SSD prefill (not with ``--tilelang-wrapper``) is timed the same way, the planner on an H100's SM count, at
Nemotron-H 8B's shapes (TP1 at 1 x 8192 and 32 x 512: the serial design; TP2 at 1 x 8192: the split one) in two
forms: vLLM 0.33's mixer call through ``mate.mamba.adapters.mamba_chunk_scan_combined_varlen`` (that one is in the
runtime: its time is counted), and ``mate-mamba bench ssd``'s public call, whose new fp32 states cost more to
allocate on a CPU than from a GPU's caching allocator. Columns: ``normalise``, ``plan``, the call with the fast
path off (``slow``) and on (``hit``); ``--breakdown`` adds the parts of a hit.

``mamba2_decode_step`` (``--ops decode_step``) is timed as vLLM 0.33's mixer would call it at Nemotron-H 8B TP1
(z / xBC / dt row views of one in_proj output, both states in one strided page pool, the mixer's ``out``) at batch
1 and 8 (the fused kernel) and 16, 64, 256 (xBC's copy and the three ops' launches): ``normalise``, ``slow``,
``hit``, and ``copy``, xBC's copy alone (a real copy of its rows on a CPU; one launch on a GPU), left out of
``hit - copy``.

Run ``python -m mate.mamba.bench.host [--iters N] [--repeats R] [--stat median|min] [--ffi | --tilelang-wrapper]
[--breakdown] [--ops ssu,ssd,decode_step]``. Numbers
depend on the CPU: compare runs made on one machine (on a shared machine the minimum is the steadier figure).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from mate.mamba import _dispatch as dispatch
from mate.mamba import settings
from mate.mamba._ops import SSU
from mate.mamba.bench import arglists

H, P, N, G = 128, 64, 128, 8  # Nemotron-H 8B at TP1, the headline shape of the targets
NULL_BLOCK = 0  # vLLM 0.33's sentinel
STAT = "median"  # or "min" (--stat)


@dataclass
class Call:
    """The arguments of one production-shaped call (keyword form of ``mate.mamba.selective_state_update``)."""

    label: str
    kwargs: dict

    def positional(self):
        k = self.kwargs
        return k["state"], k["x"], k["dt"], k["A"], k["B"], k["C"], k["D"]

    def keywords(self) -> dict:
        return {n: v for n, v in self.kwargs.items() if n not in ("state", "x", "dt", "A", "B", "C", "D")}


def _pool(slots: int, state_dtype: torch.dtype) -> torch.Tensor:
    """vLLM's hybrid page pool: each page holds the conv state first, then the SSM state; the SSM state is a
    strided ``[S, H, P, N]`` view with ``stride(0)`` = page size and a storage offset."""
    conv = 3 * (H * P + 2 * G * N)  # (d_conv - 1) * conv_dim, in state elements
    page = conv + H * P * N + 256  # page padding (vLLM rounds pages up)
    buf = torch.zeros(slots, page, dtype=state_dtype)
    return buf[:, conv : conv + H * P * N].view(slots, H, P, N)


def _rows(rows: int, io: torch.dtype):
    """x / B / C as row views of one conv-output buffer (row stride H*P + 2*G*N), z of the projection."""
    conv_out = torch.randn(rows, H * P + 2 * G * N).to(io)
    x = conv_out[:, : H * P].unflatten(-1, (H, P))
    B = conv_out[:, H * P : H * P + G * N].unflatten(-1, (G, N))
    C = conv_out[:, H * P + G * N :].unflatten(-1, (G, N))
    zxbcdt = torch.randn(rows, 2 * H * P + 2 * G * N + H).to(io)
    z = zxbcdt[:, : H * P].unflatten(-1, (H, P))
    dt = zxbcdt[:, -H:].unsqueeze(-1).expand(rows, H, P)  # the tied per-head dt: strides (*, 1, 0)
    out = torch.empty(rows, H * P, dtype=io).view(rows, -1, P)
    return x, B, C, z, dt, out


def _params():
    A = (-torch.rand(H)).view(H, 1, 1).expand(H, P, N)  # strides (1, 0, 0)
    D = torch.randn(H).unsqueeze(1).expand(H, P)  # strides (1, 0)
    dt_bias = torch.randn(H).unsqueeze(1).expand(H, P)
    return A, D, dt_bias


def vllm_decode(batch: int, *, state_dtype=torch.bfloat16, io=torch.bfloat16, slots: int = 16,
                one_table: bool = False) -> Call:  # fmt: skip
    """``one_table``: vLLM without prefix caching passes its one slot table as source and destination; with
    it, two gathered tables."""
    state = _pool(slots, state_dtype)
    x, B, C, z, dt, out = _rows(batch, io)
    A, D, dt_bias = _params()
    src = torch.arange(1, batch + 1, dtype=torch.int32)
    dst = src if one_table else torch.arange(1, batch + 1, dtype=torch.int32)
    kw = dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
              state_batch_indices=src, dst_state_batch_indices=dst, pad_slot_id=NULL_BLOCK, out=out)  # fmt: skip
    return Call(f"vLLM decode{', one table' if one_table else ''}, batch {batch}", kw)


def vllm_mtp(batch: int, steps: int = 6, *, state_dtype=torch.bfloat16, io=torch.bfloat16, slots: int = 16,
             one_table: bool = False) -> Call:  # fmt: skip
    state = _pool(max(slots, 2 * batch * steps + 1), state_dtype)
    rows = batch * steps
    x, B, C, z, dt, out = _rows(rows, io)
    A, D, dt_bias = _params()
    src = torch.arange(1, rows + 1, dtype=torch.int32).view(batch, steps)
    dst = src if one_table else (src + rows).contiguous()
    cu = torch.arange(0, rows + 1, steps, dtype=torch.int32)
    acc = torch.full((batch,), steps, dtype=torch.int32)
    kw = dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True,
              state_batch_indices=src, dst_state_batch_indices=dst, pad_slot_id=NULL_BLOCK, out=out,
              cu_seqlens=cu, num_accepted_tokens=acc)  # fmt: skip
    return Call(f"vLLM MTP {steps}{', one table' if one_table else ''}, batch {batch}", kw)


def production_calls() -> list[Call]:
    return [vllm_decode(1), vllm_decode(8), vllm_mtp(1), vllm_mtp(8), vllm_decode(8, one_table=True),
            vllm_mtp(8, one_table=True)]  # fmt: skip


class _NoopModule:
    """Stands in for a loaded kernel module: its entry function does nothing."""

    def __init__(self, launched: list):
        def main(*args):
            launched.append(len(args))

        self.main = main

    def __call__(self, *args):
        return self.main(*args)


@contextmanager
def _stubbed(mods, clear_fast, *, ffi: bool = False, make=None):
    """What every stub below does: the TileLang launcher picked for CPU tensors, the kernels of ``mods`` (TileLang
    launcher modules: their ``kernel`` and its memo ``_kernels``) replaced and memoised as the real lookup memoises
    them, the fast path emptied (``clear_fast()``) on entry and on exit, the host checks of the index data off (the
    production path). A kernel is a plain no-op function (``launched`` gets its argument count per call), with
    ``ffi`` tvm_ffi's no-op function (``launched`` gets the specs handed out), or ``make(spec, launched)``'s."""
    launched = []
    saved = (dispatch.resolve_backend, [(m.kernel, dict(m._kernels)) for m in mods])
    ffi_nop = _ffi_nop() if ffi else None

    def noop(*args):
        launched.append(len(args))

    def fake_resolve(requested, device):
        if requested not in ("auto", "tilelang", "torch"):
            return saved[0](requested, device)
        return "torch" if requested == "torch" else "tilelang"

    def stub(memo):
        def fake_get(spec, device):
            if make is not None:
                kern = make(spec, launched)
            elif ffi:
                kern = ffi_nop
                launched.append(spec)
            else:
                kern = noop
            memo[spec] = kern
            return kern

        return fake_get

    dispatch.resolve_backend = fake_resolve
    for m in mods:
        m.kernel = stub(m._kernels)
        m._kernels.clear()
    clear_fast()
    try:
        with settings.override(MATE_CHECK_INPUTS="0"):
            yield launched
    finally:
        dispatch.resolve_backend = saved[0]
        for m, (kern, memo) in zip(mods, saved[1], strict=True):
            m.kernel = kern
            m._kernels.clear()
            m._kernels.update(memo)
        clear_fast()


@contextmanager
def stubbed_launch(wrapper: bool = False, ffi: bool = False):
    """Pick the TileLang launcher for CPU tensors and make every kernel launch a no-op.

    By default every kernel is a plain no-op function (nothing compiles). ``ffi=True``: every kernel is
    tvm_ffi's no-op function, which converts its arguments as a compiled kernel's entry does (``launched``
    then counts the kernels handed out, not the calls). ``wrapper=True``: every kernel is the real compiled
    TileLang kernel object (compiled for sm_90a, needs nvcc) whose loaded module is replaced by a no-op, so
    TileLang's Python call wrapper (slow path) or the direct tvm_ffi entry lookup (fast path) is part of the
    measurement; only the tvm_ffi argument conversion and the launch are left out."""
    from mate.mamba import ssu as api
    from mate.mamba._tilelang import ssu as tl_ssu
    from mate.mamba._tilelang.cache import CACHE

    patched = []  # (adapter, executable) to restore

    def compiled(spec, launched):
        target = {"kind": "cuda", "arch": "sm_90a"}
        kern = CACHE.compile_only(spec, spec.build, target=target, pass_configs=spec.pass_configs())
        patched.append((kern.adapter, kern.adapter.executable))
        kern.adapter.executable = _NoopModule(launched)
        return kern

    make = compiled if wrapper and not ffi else None
    try:
        with _stubbed((tl_ssu,), api.clear_fast_path_cache, ffi=ffi, make=make) as launched:
            yield launched
    finally:
        for adapter, executable in patched:
            adapter.executable = executable


def _ffi_nop():
    """tvm_ffi's registered no-op function (it converts every argument, then returns)."""
    import tvm_ffi

    return tvm_ffi.get_global_func("testing.nop")


@contextmanager
def slow_path():
    """The fast path switched off: every call normalises and plans."""
    from mate.mamba import ssu as api

    saved = api.FAST.enabled
    api.FAST.enabled = False
    try:
        yield
    finally:
        api.FAST.enabled = saved


def median_us(fn: Callable[[], object], iters: int, repeats: int) -> float:
    """µs per call over ``repeats`` timed loops of ``iters`` calls: the median, or the minimum when ``STAT`` is
    ``"min"``."""
    for _ in range(min(iters, 50)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) * 1e6 / iters)
    return min(samples) if STAT == "min" else statistics.median(samples)


def measure(call: Call, iters: int = 2000, repeats: int = 7, wrapper: bool = False, ffi: bool = False) -> dict:
    from mate.mamba import selective_state_update
    from mate.mamba._contract.ssu import normalize_ssu
    from mate.mamba._tilelang import ssu_plan

    pos, kw = call.positional(), call.keywords()
    res = {"call": call.label}
    with stubbed_launch(wrapper, ffi) as launched:
        res["normalise"] = median_us(lambda: normalize_ssu(*pos, **kw), iters, repeats)
        normalised = normalize_ssu(*pos, **kw)
        res["plan"] = median_us(lambda: ssu_plan.plan(normalised), iters, repeats)
        res["mate.mamba"] = median_us(lambda: selective_state_update(*pos, **kw), iters, repeats)
        if not launched:
            raise RuntimeError("the stubbed kernel was never called: the measurement did not reach the launch")
        with slow_path():
            res["mate.mamba slow"] = median_us(lambda: selective_state_update(*pos, **kw), iters, repeats)
    return res


def hit_breakdown(call: Call, iters: int = 2000, repeats: int = 7, ffi: bool = False) -> dict:
    """µs of the parts of a fast-path hit: the form's check, the recipe's launch (the stubbed kernel's call
    included), the whole public call (the rest: passing the arguments on, the scalars' comparison), and, for
    reference, the metadata key a call builds when the check refuses it."""
    from mate.mamba import selective_state_update
    from mate.mamba import ssu as api

    pos, kw = call.positional(), call.keywords()
    full = {**dict(zip(("state", "x", "dt", "A", "B", "C", "D"), pos, strict=True)), **kw}
    tensors = tuple(full.get(n) for n in SSU.tensor_names)
    with stubbed_launch(ffi=ffi):
        for _ in range(2):  # a miss, then a hit: the form is the latest
            selective_state_update(*pos, **kw)
        scalars, check, launch = api.FAST.latest
        if launch is None or not check(tensors):
            raise RuntimeError(f"{call.label}: the latest form's check refused its own call")
        return {
            "call": call.label,
            "check": median_us(lambda: check(tensors), iters, repeats),
            "launch": median_us(lambda: launch(tensors), iters, repeats),
            "public call": median_us(lambda: selective_state_update(*pos, **kw), iters, repeats),
            "key": median_us(lambda: dispatch.fast_key(tensors, scalars), iters, repeats),
        }


# ------------------------------------------------------------------------------------------------ SSD prefill

SSD_CELLS = (("nemotron-h-8b-tp1", "1x8192"), ("nemotron-h-8b-tp1", "32x512"), ("nemotron-h-8b-tp2", "1x8192"))
H100 = (9, 132)  # the planner's hardware (compute capability major, SMs): the GPU runs' card, for its designs


@dataclass
class PrefillCall:
    """One production-shaped prefill call: ``run()`` makes it as its caller does; ``kwargs`` are its arguments as
    ``mate.mamba.ssd_combined_fwd_varlen``'s keywords."""

    label: str
    run: Callable[[], object]
    kwargs: dict


def _prefill_tensors(case, lens, io=torch.bfloat16):
    """x / B / C as row views of the conv1d output (a [tokens, conv_dim] row-major result), dt a column slice of the
    input projection, out a view of the mixer's preallocated output, A / D / dt_bias fp32 parameters, int32
    chunk tables (``chunk_metadata``)."""
    from mate.mamba.chunking import chunk_metadata

    h, p, n, g = case.heads, case.dim, case.dstate, case.groups
    T = sum(lens)
    conv_out = torch.zeros(T, h * p + 2 * g * n, dtype=io)
    x = conv_out[:, : h * p].view(T, h, p)
    B = conv_out[:, h * p : h * p + g * n].view(T, g, n)
    C = conv_out[:, h * p + g * n :].view(T, g, n)
    dt = torch.zeros(T, 2 * g * n + h)[:, -h:]  # (the projection's other columns, shortened)
    out = torch.empty(T, h * p, dtype=io).view(T, -1, p)

    def param(v):
        return torch.nn.Parameter(v, requires_grad=False)

    A, D, dt_bias = param(-torch.rand(h)), param(torch.rand(h)), param(torch.rand(h))
    m = chunk_metadata(list(lens), case.chunk_size)
    return dict(x=x, dt=dt, A=A, B=B, C=C, chunk_size=case.chunk_size, cu_seqlens=m.cu_seqlens,
                cu_chunk_seqlens=m.cu_chunk_seqlens, last_chunk_indices=m.last_chunk_indices, seq_idx=m.seq_idx,
                out=out, D=D, dt_bias=dt_bias)  # fmt: skip


def vllm_prefill(case_name: str, batch: str, state_dtype=torch.float32) -> PrefillCall:
    """vLLM 0.33's mixer call (``mamba_mixer2.py``) through MATE's adapter: the final states written into the
    strided page pool by slot, initial states gathered per call (``torch.where`` over the pool rows: a dense
    tensor in the pool's dtype), keywords as the mixer passes them."""
    from mate.mamba.adapters import mamba_chunk_scan_combined_varlen
    from mate.mamba.bench.shapes import SSD_BATCHES, SSD_CASES

    case, lens = SSD_CASES[case_name], SSD_BATCHES[batch]
    t = _prefill_tensors(case, lens)
    h, p, n, g = case.heads, case.dim, case.dstate, case.groups
    slots = len(lens) + 1
    conv = 3 * (h * p + 2 * g * n)
    pool = torch.zeros(slots, conv + h * p * n + 64, dtype=state_dtype)[:, conv : conv + h * p * n].view(slots, h, p, n)
    init = torch.zeros(len(lens), h, p, n, dtype=state_dtype)
    fsi = torch.arange(1, len(lens) + 1, dtype=torch.int32)
    kw = dict(t, initial_states=init, dt_softplus=True, dt_limit=(0.0, float("inf")), state_dtype=state_dtype,
              final_states_out=pool, final_state_indices=fsi)  # fmt: skip
    x, dt, A, B, C = (kw[k] for k in ("x", "dt", "A", "B", "C"))
    rest = {k: v for k, v in kw.items() if k not in ("x", "dt", "A", "B", "C")}

    def run():
        return mamba_chunk_scan_combined_varlen(x, dt, A, B, C, **rest)

    return PrefillCall(f"vLLM mixer, {case_name} {batch}", run, kw)


def bench_prefill(case_name: str, batch: str) -> PrefillCall:
    """``mate-mamba bench ssd``'s MATE call (its host-time column): the public function, fp32 initial states, the
    final states returned (a new fp32 tensor per call)."""
    from mate.mamba import ssd_combined_fwd_varlen
    from mate.mamba.bench.shapes import SSD_BATCHES, SSD_CASES

    case, lens = SSD_CASES[case_name], SSD_BATCHES[batch]
    t = _prefill_tensors(case, lens)
    init = torch.zeros(len(lens), case.heads, case.dim, case.dstate)
    kw = dict(t, z=None, dt_softplus=True, initial_states=init, state_dtype=torch.float32,
              return_intermediate_states=False, backend="tilelang")  # fmt: skip
    names = ("x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices",
             "seq_idx", "out", "D", "z", "dt_bias")  # fmt: skip
    args = tuple(kw[k] for k in names)
    rest = {k: v for k, v in kw.items() if k not in names}

    def run():
        return ssd_combined_fwd_varlen(*args, **rest)

    return PrefillCall(f"bench ssd, {case_name} {batch}", run, kw)


def prefill_calls() -> list[PrefillCall]:
    return [make(c, b) for make in (vllm_prefill, bench_prefill) for c, b in SSD_CELLS]


@contextmanager
def stubbed_prefill(ffi: bool = False):
    """:func:`stubbed_launch` for the prefill: the TileLang launcher picked for CPU tensors, every kernel a no-op
    (``ffi``: tvm_ffi's no-op function), the planner on an H100's SM count."""
    from mate.mamba import ssd as api
    from mate.mamba._platform.device import Hardware
    from mate.mamba._tilelang import ssd as tl_ssd

    saved = tl_ssd.hardware
    tl_ssd.hardware = lambda device: Hardware("cuda", *H100)
    try:
        with _stubbed((tl_ssd,), api.FAST.clear, ffi=ffi) as launched:
            yield launched
    finally:
        tl_ssd.hardware = saved


def measure_prefill(call: PrefillCall, iters: int = 2000, repeats: int = 7, ffi: bool = False) -> dict:
    """Like :func:`measure` for a prefill call: ``normalise`` (``normalize_ssd``), ``plan``, the call with the fast
    path off (``slow``) and on."""
    from mate.mamba import ssd as api
    from mate.mamba._contract.ssd import normalize_ssd
    from mate.mamba._platform.device import Hardware
    from mate.mamba._tilelang import ssd_plan

    kw = {k: v for k, v in call.kwargs.items() if k != "backend"}
    res = {"call": call.label}
    with stubbed_prefill(ffi) as launched:
        res["normalise"] = median_us(lambda: normalize_ssd(**kw), iters, repeats)
        normalised = normalize_ssd(**kw)
        res["plan"] = median_us(lambda: ssd_plan.plan(normalised, Hardware("cuda", *H100)), iters, repeats)
        res["hit"] = median_us(call.run, iters, repeats)
        if not launched:
            raise RuntimeError("the stubbed kernel was never called: the measurement did not reach the launch")
        saved = api.FAST.enabled
        api.FAST.enabled = False
        try:
            res["slow"] = median_us(call.run, max(1, iters // 10), repeats)
        finally:
            api.FAST.enabled = saved
    return res


def prefill_breakdown(call: PrefillCall, iters: int = 2000, repeats: int = 7, ffi: bool = False) -> dict:
    """µs of the parts of a prefill hit: the form's check, the launch (the recipe: the pointer check, the returned
    tensors' allocation, the stubbed kernels' calls), the whole call as its caller makes it, and, for reference,
    the metadata key and the call rebuilt from the tensors (what a hit did before the recipe)."""
    from mate.mamba import ssd as api
    from mate.mamba._contract.template import CallTemplate
    from mate.mamba._ops import SSD

    tensors = tuple(call.kwargs.get(n) for n in SSD.tensor_names)
    with stubbed_prefill(ffi):
        for _ in range(2):  # a miss, then a hit: the form is the latest
            call.run()
        scalars, check, launch = api.FAST.latest
        if launch is None or not check(tensors):
            raise RuntimeError(f"{call.label}: the latest form's check refused its own call")
        launch_object = getattr(launch, "launch_object", None)
        res = {
            "call": call.label,
            "check": median_us(lambda: check(tensors), iters, repeats),
            "launch": median_us(lambda: launch(tensors), iters, repeats),
            "call total": median_us(call.run, iters, repeats),
            "key": median_us(lambda: dispatch.fast_key(tensors, scalars), iters, repeats),
        }
        if launch_object is not None:
            from mate.mamba._contract.ssd import normalize_ssd

            normalised = normalize_ssd(**{k: v for k, v in call.kwargs.items() if k != "backend"})
            sources = dict(zip(SSD.tensor_names, tensors, strict=True))
            template = CallTemplate.of(normalised, tuple(sources.values()), fresh=("out",))
            res["rebuild"] = median_us(lambda: template.rebuild(tensors), iters, repeats)
        return res


# ------------------------------------------------------------------------------------------------ decode step

W = 4  # Nemotron-H's conv width
DECODE_STEP_BATCHES = (1, 8, 16, 64, 256)  # 1 and 8: the fused kernel; above FUSED_MAX_BATCH: three launches


def vllm_decode_step(batch: int, slots: int = 16) -> PrefillCall:
    """``mate.mamba.mamba2_decode_step`` as vLLM 0.33's mixer would call it at Nemotron-H 8B TP1: z / xBC / dt as row
    views of one bf16 in_proj output, the conv and SSM states in one strided page pool (the conv state
    channel-contiguous, ``[S, CD, W - 1]`` with strides (page, 1, CD); the SSM state ``[S, H, P, N]`` at an offset),
    bf16 conv weight / bias and norm weight, fp32 A / D / dt_bias, an int32 slot table, the mixer's ``out``, norm
    groups of ``H * P / G``."""
    from mate.mamba import mamba2_decode_step

    hp, cd = H * P, H * P + 2 * G * N
    slots = max(slots, batch + 1)
    conv = (W - 1) * cd
    page = conv + H * P * N + 256
    buf = torch.zeros(slots, page, dtype=torch.bfloat16)
    conv_state = buf[:, :conv].view(slots, W - 1, cd).transpose(1, 2)
    ssm_state = buf[:, conv : conv + H * P * N].view(slots, H, P, N)
    proj = torch.randn(batch, hp + cd + H).to(torch.bfloat16)
    z, xBC, dt = proj[:, :hp], proj[:, hp : hp + cd], proj[:, hp + cd :]
    kw = dict(xBC=xBC, z=z, dt=dt, conv_state=conv_state, conv_weight=torch.randn(cd, W).to(torch.bfloat16),
              conv_bias=torch.randn(cd).to(torch.bfloat16), ssm_state=ssm_state, A=-torch.rand(H), D=torch.randn(H),
              dt_bias=torch.randn(H), norm_weight=torch.ones(hp, dtype=torch.bfloat16),
              state_indices=torch.arange(1, batch + 1, dtype=torch.int32), ngroups=G, pad_slot_id=NULL_BLOCK,
              norm_group_size=hp // G, eps=1e-5, out=torch.empty(batch, hp, dtype=torch.bfloat16))  # fmt: skip
    pos = tuple(kw[k] for k in ("xBC", "z", "dt", "conv_state", "conv_weight", "conv_bias", "ssm_state", "A", "D",
                                "dt_bias", "norm_weight"))  # fmt: skip
    rest = {k: v for k, v in kw.items() if k not in ("xBC", "z", "dt", "conv_state", "conv_weight", "conv_bias",
                                                       "ssm_state", "A", "D", "dt_bias", "norm_weight")}  # fmt: skip

    def run():
        return mamba2_decode_step(*pos, **rest)

    return PrefillCall(f"vLLM mixer step, batch {batch}", run, kw)


@contextmanager
def stubbed_decode_step(ffi: bool = False):
    """:func:`stubbed_launch` for ``mamba2_decode_step``: the TileLang launcher picked for CPU tensors, the fused
    kernel and the three ops' kernels (conv1d update, SSU, gated norm) no-ops (``ffi``: tvm_ffi's no-op function)."""
    from mate.mamba import decode_step as api
    from mate.mamba._tilelang import conv1d as tl_conv1d
    from mate.mamba._tilelang import decode_step as tl_step
    from mate.mamba._tilelang import norm as tl_norm
    from mate.mamba._tilelang import ssu as tl_ssu

    with _stubbed((tl_step, tl_conv1d, tl_ssu, tl_norm), api.FAST.clear, ffi=ffi) as launched:
        yield launched


def measure_decode_step(call: PrefillCall, iters: int = 2000, repeats: int = 7, ffi: bool = False) -> dict:
    """Like :func:`measure` for a decode step: ``normalise`` (``normalize_decode_step``), the call with the fast path
    off (``slow``) and on (``hit``), and ``copy``: above the fused kernel's batch, xBC copied into a buffer of its
    shape alone (on a CPU a real copy of the rows, growing with the batch; a GPU's host pays one launch), which
    ``hit - copy`` leaves out."""
    from mate.mamba import decode_step as api
    from mate.mamba._contract.decode_step import normalize_decode_step
    from mate.mamba._tilelang.decode_step_plan import FUSED_MAX_BATCH

    kw = {k: v for k, v in call.kwargs.items() if k != "backend"}
    res = {"call": call.label}
    with stubbed_decode_step(ffi) as launched:
        res["normalise"] = median_us(lambda: normalize_decode_step(**kw), iters, repeats)
        res["copy"] = 0.0
        if kw["xBC"].shape[0] > FUSED_MAX_BATCH:
            ws = torch.empty(kw["xBC"].shape, dtype=kw["xBC"].dtype)
            res["copy"] = median_us(lambda: ws.copy_(kw["xBC"]), iters, repeats)
        res["hit"] = median_us(call.run, iters, repeats)
        res["hit - copy"] = res["hit"] - res["copy"]
        if not launched:
            raise RuntimeError("the stubbed kernel was never called: the measurement did not reach the launch")
        saved = api.FAST.enabled
        api.FAST.enabled = False
        try:
            res["slow"] = median_us(call.run, max(1, iters // 10), repeats)
        finally:
            api.FAST.enabled = saved
    return res


def decode_step_calls() -> list[PrefillCall]:
    return [vllm_decode_step(b) for b in DECODE_STEP_BATCHES]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mate.mamba.bench.host", description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=2000, help="calls per timed repeat")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats (see --stat)")
    ap.add_argument(
        "--tilelang-wrapper",
        action="store_true",
        help="launch through the real compiled kernel objects (sm_90a, needs nvcc) with a no-op module, so "
        "TileLang's Python call wrapper is measured too (the SSU only)",
    )
    ap.add_argument(
        "--ffi",
        action="store_true",
        help="launch tvm_ffi's no-op function (needs tvm_ffi), so the conversion of every launch argument is measured",
    )
    ap.add_argument("--stat", choices=("median", "min"), default="median", help="statistic over the repeats")
    ap.add_argument("--breakdown", action="store_true", help="also time the parts of a fast-path hit")
    ap.add_argument(
        "--ops",
        type=lambda v: arglists.names(v, ("ssu", "ssd", "decode_step"), "ops"),
        default=None,
        metavar="LIST",
        help="comma list of ssu, ssd, decode_step: the ops timed (default all; with --tilelang-wrapper the SSU)",
    )
    args = ap.parse_args(argv)
    global STAT
    STAT = args.stat
    torch.set_num_threads(1)
    if args.ffi and args.tilelang_wrapper:
        ap.error("--ffi and --tilelang-wrapper stub the launch in two different places: pass one")
    if args.ops is None:
        args.ops = ["ssu"] if args.tilelang_wrapper else ["ssu", "ssd", "decode_step"]
    if args.tilelang_wrapper and set(args.ops) - {"ssu"}:
        ap.error("--tilelang-wrapper times the SSU only (the other kernels compile for minutes): pass --ops ssu")
    how = (
        "TileLang wrapper kept, module stubbed"
        if args.tilelang_wrapper
        else "tvm_ffi's no-op function as the kernel"
        if args.ffi
        else "kernel object stubbed"
    )
    if "ssu" in args.ops:
        _ssu_tables(args, how)
    if "ssd" in args.ops:
        _ssd_tables(args, how)
    if "decode_step" in args.ops:
        _decode_step_tables(args, how)
    return 0


def _ssu_tables(args, how: str) -> None:
    cols = ("normalise", "plan", "mate.mamba slow", "mate.mamba")
    print(f"CPU-host proxy ({how}); {STAT} µs per call (H {H}, P {P}, N {N}, G {G}, bf16)")
    print(f"| call | {' | '.join(cols)} |")
    print(f"|---|{'---:|' * len(cols)}")
    for call in production_calls():
        r = measure(call, args.iters, args.repeats, args.tilelang_wrapper, args.ffi)
        print(f"| {r['call']} | " + " | ".join(f"{r[c]:.1f}" if c in r else "-" for c in cols) + " |", flush=True)
    print("slow: fast path off (every call normalises and plans); fast path: repeated calls replay a recipe")
    if args.breakdown:
        parts = ("check", "launch", "public call", "key")
        print(f"\nfast-path hit, {STAT} µs\n| call | {' | '.join(parts)} |\n|---|{'---:|' * len(parts)}")
        for call in production_calls():
            r = hit_breakdown(call, args.iters, args.repeats, args.ffi)
            print(f"| {r['call']} | " + " | ".join(f"{r[c]:.1f}" for c in parts) + " |", flush=True)


def _ssd_tables(args, how: str) -> None:
    cols = ("normalise", "plan", "slow", "hit")
    print(f"\nSSD prefill ({how}); {STAT} µs per call, the planner on an H100 ({H100[1]} SMs)")
    print(f"| call | {' | '.join(cols)} |\n|---|{'---:|' * len(cols)}")
    for call in prefill_calls():
        r = measure_prefill(call, args.iters, args.repeats, args.ffi)
        print(f"| {r['call']} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |", flush=True)
    print(
        "vLLM mixer: through mate.mamba.adapters (final states into the page pool by slot); bench ssd: the "
        "public call returning new fp32 states (on a CPU their allocation costs more than on a GPU's caching "
        "allocator); slow: a tenth of --iters per repeat"
    )
    if args.breakdown:
        parts = ("check", "launch", "call total", "key", "rebuild")
        print(f"\nprefill hit, {STAT} µs\n| call | {' | '.join(parts)} |\n|---|{'---:|' * len(parts)}")
        for call in prefill_calls():
            r = prefill_breakdown(call, args.iters, args.repeats, args.ffi)
            print(f"| {r['call']} | " + " | ".join(f"{r[c]:.1f}" if c in r else "-" for c in parts) + " |",
                  flush=True)  # fmt: skip


def _decode_step_tables(args, how: str) -> None:
    from mate.mamba._tilelang.decode_step_plan import FUSED_MAX_BATCH

    cols = ("normalise", "copy", "slow", "hit", "hit - copy")
    print(f"\nmamba2_decode_step ({how}); {STAT} µs per call (H {H}, P {P}, N {N}, G {G}, W {W}, bf16 pools and io)")
    print(f"| call | {' | '.join(cols)} |\n|---|{'---:|' * len(cols)}")
    for call in decode_step_calls():
        r = measure_decode_step(call, args.iters, args.repeats, args.ffi)
        print(f"| {r['call']} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |", flush=True)
    print(f"batch <= {FUSED_MAX_BATCH}: the fused kernel; above: xBC's copy and three launches (conv1d update, SSU, "
          "gated norm); copy: xBC's rows copied alone (on a CPU a real copy), left out of hit - copy; slow: a tenth of "
          "--iters per repeat")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
