"""TileLang launcher for ``ssd_combined_fwd_varlen``: one normalised :class:`SSDCall` -> its kernel launches.

:mod:`.ssd_plan` decides the kernels (the dt pre-pass and the chunk scan; with the split design the state pass and
the hand-over between them) and the sequences or runs per scan CTA; this
module stages what the kernels cannot read in place, takes scratch from the workspace cache and launches both on
the current stream. A steady-state call allocates only the returned state tensor, and nothing is read back to the
host: the call captures into a CUDA graph once its kernels are compiled (``prewarm``).
"""

from __future__ import annotations

import dataclasses

import torch
from mate.mamba._contract.dtypes import QUANT_STATE_DTYPES
from mate.mamba._contract.ssd import SSDCall, check_index_data
from mate.mamba._contract.template import CallTemplate
from mate.mamba._platform import settings
from mate.mamba._platform.device import hardware, is_capturing, tilelang_target
from mate.mamba._tilelang.cache import CACHE, compile_missing, kernel_lookup
from mate.mamba._tilelang.specs import KernelSpec
from mate.mamba._tilelang.ssd_plan import (
    VLLM_DT,
    _check_supported,
    codec_spec,
    combine_spec,
    dt_spec,
    plan,
    scan_spec,
    serving_specs,
    states_spec,
    tiles,
)  # fmt: skip
from mate.mamba._tilelang.ssd_recipe import make_recipe
from mate.mamba._tilelang.tl_internals import direct_callable
from mate.mamba._tilelang.workspace import WORKSPACE
from mate_kernels.abi import SCAN, SSD_SCAN_ARGS, args_of, launch_args

PREWARM_HINT = (
    "mate.mamba.prewarm_ssd_combined_fwd_varlen(heads=..., groups=..., dim=..., dstate=..., chunk_size=..., "
    "io_dtype=..., state_dtype=..., dt_dtype=...)"
)
SCAN_ARGS = {v: args_of(SSD_SCAN_ARGS, SCAN, v) for v in (None, "split")}  # the scan's two forms
DECAY_ROWS = 4  # rows per (tile, head) of the pre-pass's dtA output: dt', cumsum and the two decay rows
_dummies: dict = {}


def _kmod():
    import mate_kernels.ssd as kmod

    return kmod


kernel, _kernels = kernel_lookup(PREWARM_HINT)  # kernel(spec, device), and its memo (spec -> kernel)


def run(call: SSDCall, sources: dict | None = None):
    """Run one normalised call: ``(states or None, launcher)``. The launcher (None without ``sources``, with
    ``MATE_CHECK_INPUTS=1`` or for a call whose fields are not the caller's tensors or views of them) runs a call
    of the same metadata from the caller's tensors: the :class:`_Launch` this call prepared replayed by its
    recipe (:mod:`.ssd_recipe`), or, for another pointer alignment or a launch that stages a copy, the call
    rebuilt without validation (:class:`~mate.mamba._contract.template.CallTemplate`) and launched by the
    :class:`_Launch` of its alignment."""
    checked = settings.get("MATE_CHECK_INPUTS")
    if checked and not is_capturing(call.x.device):
        check_index_data(call)  # reads the tables back (a sync): the debugging mode only
    key = _pointers(call)
    launch = _Launch(call)
    prepared = {key: launch}  # pointer alignment -> _Launch
    result = launch(call)
    general = CallTemplate.launcher(call, None if checked else sources, lambda c: _launch(c, prepared),
                                    fresh=("out",))  # fmt: skip
    if general is None:
        return result, None
    recipe = make_recipe(call, launch, dict(zip(pointer_fields(call), key, strict=True)), sources, general)
    return result, general if recipe is None else recipe


def _launch(call: SSDCall, prepared: dict) -> torch.Tensor | None:
    """Launch a call's kernels by the :class:`_Launch` of its pointer alignment (made on a new one)."""
    key = _pointers(call)
    launch = prepared.get(key)
    if launch is None:
        launch = prepared[key] = _Launch(call)
    return launch(call)


def pointer_fields(call: SSDCall) -> tuple[str, ...]:
    """The fields whose 16-byte alignment a launch depends on beyond the call's metadata: the tensors the scan
    reads or writes by TMA, and quantised pools (vector access)."""
    fields = ("x", "B", "C", "out")
    for name in ("initial_states", "final_states_out"):
        t = getattr(call, name)
        if t is not None and t.dtype in QUANT_STATE_DTYPES:
            fields += (name,)
    return fields


def _pointers(call: SSDCall) -> tuple:
    """The key of a call's :class:`_Launch`: its :func:`pointer_fields`' addresses modulo 16."""
    return tuple(getattr(call, name).data_ptr() % 16 for name in pointer_fields(call))


class _Launch:
    """The launches of one call form (metadata) at one pointer alignment.

    Everything that depends only on those is decided once, when the first such call arrives: the plan, the
    compiled kernels (called through their tvm_ffi entry), the scratch buffers, which arguments are staged into
    a dense or aligned copy, the dummies and the flags. A call then copies what is staged, launches, and copies
    the staged outputs back. A steady-state call allocates only the returned states."""

    def __init__(self, call: SSDCall):
        dev = call.x.device
        p = self.p = plan(call, hardware(dev))
        H, P, N, L = call.heads, call.dim, call.dstate, call.chunk_size
        batch, nchunks = call.batch, call.nchunks
        self.nchunks = nchunks
        skey = ("ssd", H, call.groups, P, N)
        self.skey, self.device = skey, dev
        k = {name: direct_callable(kernel(spec, dev)) for name, spec in
             (("scan", p.scan), ("dt", p.dt), ("decode", p.decode), ("encode", p.encode), ("states", p.states),
              ("combine", p.combine)) if spec is not None}  # fmt: skip
        self.kernels = k

        self.use_fsi = call.final_states_out is not None
        # the states the scan writes: "new" (allocated per call, returned), "fp32" (a quantised pool's rows,
        # encoded after the scan) or "pool" (the caller's final_states_out)
        if call.return_intermediate_states:
            self.states_kind, shape, state_dt = "new", (nchunks, H, P, N), call.state_dtype
        elif p.encode is not None:
            self.states_kind, shape, state_dt = "fp32", (batch, H, P, N), torch.float32
            self.fp32_states = WORKSPACE.get(skey, "final_fp32", shape, torch.float32, dev)
        elif self.use_fsi:
            self.states_kind, shape, state_dt = "pool", tuple(call.final_states_out.shape), call.final_states_out.dtype
        else:
            self.states_kind, shape, state_dt = "new", (batch, H, P, N), call.state_dtype
        self.states_shape, self.states_dtype = shape, state_dt
        # the scan writes dense states: a strided pool is staged (rows the call does not name keep their values)
        dense = self.states_kind != "pool" or _inner_dense(call.final_states_out, 3)
        self.st_buf = None if dense else WORKSPACE.get(skey, "states", shape, state_dt, dev)

        # staging buffers: None where the caller's tensor is read in place
        def stage_if(ok: bool, name: str, t: torch.Tensor):
            return None if ok else WORKSPACE.get(skey, name, tuple(t.shape), t.dtype, dev)

        self.buf = {
            "cu_chunk_seqlens": stage_if(call.cu_chunk_seqlens.is_contiguous(), "cu_chunk_seqlens",
                                         call.cu_chunk_seqlens),
            "seq_idx": stage_if(call.seq_idx.is_contiguous(), "seq_idx", call.seq_idx),
            "last_chunk_indices": stage_if(call.last_chunk_indices.is_contiguous(), "last_chunk_indices",
                                           call.last_chunk_indices),
            "x": stage_if(_tma_ok(call.x), "x", call.x),
            "B": stage_if(_tma_ok(call.B), "B", call.B),
            "C": stage_if(_tma_ok(call.C), "C", call.C),
            "dt": stage_if(call.dt.stride(1) == 1, "dt", call.dt),
            "A": stage_if(call.A.is_contiguous(), "A", call.A),
        }  # fmt: skip
        if self.use_fsi:
            fsi = call.final_state_indices
            self.buf["final_state_indices"] = stage_if(fsi.is_contiguous(), "final_state_indices", fsi)
        if call.dt_bias is not None:
            self.buf["dt_bias"] = stage_if(call.dt_bias.is_contiguous(), "dt_bias", call.dt_bias)
        self.dt_bias = None if call.dt_bias is not None else _dummy("dtb", dev, torch.float32, (H,))
        self.D_tied = call.D is not None and call.D_tied
        if call.D is not None:
            D = call.D[:, 0] if self.D_tied else call.D
            self.buf["D"] = stage_if(D.is_contiguous(), "D", D)
        self.D = None if call.D is not None else _dummy("D", dev, torch.float32, (H,))
        kmod = _kmod()
        flags = 0
        if call.z is not None:  # read with plain accesses: any row strides, dense inner dim
            self.buf["z"] = stage_if(_inner_dense(call.z, 1), "z", call.z)
            flags |= kmod.FLAG_Z
        self.z = None if call.z is not None else _dummy("z", dev, call.x.dtype, (1, H, P))
        init = call.initial_states
        self.init = None
        if p.decode is not None:  # a quantised initial_states: decoded into fp32 rows the scan reads
            self.init = WORKSPACE.get(skey, "init_fp32", (batch, H, P, N), torch.float32, dev)
            self.buf["init_q"] = stage_if(_inner_dense(init, 2), "init_q", init)
            flags |= kmod.FLAG_INIT
        elif init is not None:
            self.buf["init"] = stage_if(_inner_dense(init, 3), "init", init)
            flags |= kmod.FLAG_INIT
        else:
            self.init = _dummy("init", dev, getattr(torch, p.scan.init_dtype), (1, H, P, N))
        if p.encode is not None:  # rows the call does not name keep their values
            pool = call.final_states_out
            self.buf["final_q"] = stage_if(_inner_dense(pool, 2), "final_q", pool)
        self.flags = flags
        # full tiles of out are stored by TMA: out needs TMA-compatible strides (else a staging copy)
        self.out_buf = stage_if(_tma_ok(call.out), "out", call.out)
        self.staged = any(b is not None for b in self.buf.values())  # else every input is read in place

        self.bounds = WORKSPACE.get(skey, "bounds", (batch + 1,), torch.int32, dev)
        self.dest = WORKSPACE.get(skey, "dest", (nchunks,), torch.int32, dev)
        BL = p.scan.block_L
        nvt = nchunks * (L // BL)
        self.dtA = WORKSPACE.get(skey, "dtA", (nvt, H, DECAY_ROWS, BL), torch.float32, dev)
        self.tmeta = WORKSPACE.get(skey, "tmeta", (nvt, kmod.META_WIDTH), torch.int32, dev)
        # k sequences per CTA: every k-th run bound (k divides the batch, so the view ends on bounds[batch])
        spc = p.seqs_per_cta
        self.scan_bounds = self.bounds[::spc] if spc > 1 else self.bounds
        if p.design == "split":
            R = p.runs
            # the run bounds depend only on (R, nchunks): one buffer per pair, filled on the device once (during
            # a capture the fill is captured instead, so it runs on every call of this launch)
            self.runs = WORKSPACE.get(("ssd-runs", R, nchunks), "runs", (R + 1,), torch.int32, dev)
            self.runs_filled = not is_capturing(dev)
            if self.runs_filled:
                _fill_runs(self.runs, nchunks)
            self.run_states = WORKSPACE.get(skey, "run_states", (R, H, P, N), torch.float32, dev)
            self.run_states_rows = self.run_states.view(R, H, P * N)  # as the hand-over reads them
            self.run_dec = WORKSPACE.get(skey, "run_dec", (R, H), torch.float32, dev)

    def _in(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the kernels read it: itself, or its copy in the staging buffer."""
        buf = self.buf[name]
        if buf is None:
            return t
        buf.copy_(t)
        return buf

    def __call__(self, call: SSDCall, k: dict | None = None) -> torch.Tensor | None:
        """Launch ``call``'s kernels (``k``: the kernels by name, default the compiled ones; a recipe's dry run
        passes recorders)."""
        p = self.p
        k = self.kernels if k is None else k
        _in = self._in if self.staged else _as_is
        kind = self.states_kind
        if kind == "new":
            states = torch.empty(self.states_shape, dtype=self.states_dtype, device=self.device)
        else:
            states = self.fp32_states if kind == "fp32" else call.final_states_out
        st = states if self.st_buf is None else self.st_buf
        if st is not states:
            st.copy_(states)  # rows the call does not name keep their values

        cu = _in("cu_chunk_seqlens", call.cu_chunk_seqlens)
        seq_idx = _in("seq_idx", call.seq_idx)
        last = _in("last_chunk_indices", call.last_chunk_indices)
        fsi = _in("final_state_indices", call.final_state_indices) if self.use_fsi else last
        dt_bias = self.dt_bias if call.dt_bias is None else _in("dt_bias", call.dt_bias)
        if call.D is None:
            D = self.D
        else:
            D = _in("D", call.D[:, 0] if self.D_tied else call.D)
        z = self.z if call.z is None else _in("z", call.z)
        if p.decode is not None:
            init = self.init
            k["decode"](_in("init_q", call.initial_states), call.initial_states_scale, init)
        elif call.initial_states is not None:
            init = _in("init", call.initial_states)
        else:
            init = self.init
        out = call.out if self.out_buf is None else self.out_buf
        k["dt"](_in("dt", call.dt), _in("A", call.A), dt_bias, cu, seq_idx, self.dtA, self.tmeta, last,
                fsi if p.encode is None else last,  # with the encode, the scan writes row b for sequence b
                self.bounds, self.dest)  # fmt: skip
        values = {
            "x": _in("x", call.x), "B": _in("B", call.B), "C": _in("C", call.C), "cu_chunk_seqlens": cu,
            "seq_idx": seq_idx, "dest": self.dest, "D": D, "z": z, "initial_states": init, "out": out,
            "states_out": st, "dtA": self.dtA, "tmeta": self.tmeta, "flags": self.flags, "bounds": self.scan_bounds,
        }  # fmt: skip
        if p.design == "split":
            self._split_scan(values, k)
        else:
            k["scan"](*launch_args(SCAN_ARGS[None], values))
        if out is not call.out:
            call.out.copy_(out)
        if st is not states:
            states.copy_(st)
        if p.encode is not None:
            pool = call.final_states_out
            q_pool = pool if self.buf["final_q"] is None else _in("final_q", pool)
            k["encode"](states, fsi, q_pool, call.final_states_scale)
            if q_pool is not pool:
                pool.copy_(q_pool)
        return None if self.use_fsi else states

    def _split_scan(self, values: dict, k: dict) -> None:
        """The split design (``mate_kernels.ssd_split``): the state pass and the hand-over over ``p.runs`` even
        runs of chunks, then the scan over the same runs, each entering with the true state. ``values``: the scan's
        launch values, its bounds replaced here by the runs'."""
        runs, run_states, run_dec = self.runs, self.run_states, self.run_dec
        if not self.runs_filled:
            _fill_runs(runs, self.nchunks)
        k["states"](values["x"], values["B"], values["cu_chunk_seqlens"], runs, values["initial_states"],
                    values["dtA"], values["tmeta"], run_states, run_dec, values["flags"])  # fmt: skip
        k["combine"](self.run_states_rows, run_dec)
        values["bounds"], values["run_states"] = runs, run_states
        k["scan"](*launch_args(SCAN_ARGS["split"], values))


def prewarm(device, *, heads, groups, dim, dstate, chunk_size, io_dtype, state_dtype, dt_dtype, target=None,
            jobs=1):  # fmt: skip
    """Compile every SSD kernel of one configuration (:func:`ssd_plan.serving_specs`), those not cached in
    ``jobs`` worker processes (:func:`.cache.compile_missing`). With ``target`` (e.g. ``{"kind": "cuda", "arch":
    "sm_90a"}``) and no device, compile only. Returns the specs."""
    _check_supported(dim, dstate, chunk_size, io_dtype)
    specs = serving_specs(
        heads=heads, groups=groups, dim=dim, dstate=dstate, chunk_size=chunk_size, io_dtype=io_dtype,
        state_dtype=state_dtype, dt_dtype=dt_dtype, sms=hardware(device).sms if device is not None else None,
    )  # fmt: skip
    compile_missing(specs, target=target or tilelang_target(device), jobs=jobs)
    for spec in specs:
        if device is None:
            CACHE.compile_only(spec, spec.build, target=target, pass_configs=spec.pass_configs())
        else:
            kernel(spec, device)
    return specs


def compile_grid() -> list[KernelSpec]:
    """Representative configurations: chunk 64/128/256, P 64/80/128 (80: the tail and the K-major tilings),
    N 128/256, G 1/4/8, bf16/fp16 io, fp32/bf16 state, per-head and per-dim D, intermediate states, the
    prefetching scan, and their pre-passes (the runs table for returned final states and for states written into a
    pool by index; 1 and 8 heads per CTA), and the conversions of quantised pools."""
    grid = [
        # (H, G, P, N, L, io, state, intermediate, D_per_dim, prefetch)
        (128, 8, 64, 128, 128, "bfloat16", "float32", False, False, False),
        (128, 8, 64, 128, 256, "bfloat16", "float32", False, False, False),
        (128, 8, 64, 128, 256, "bfloat16", "float32", False, False, True),
        (128, 8, 64, 128, 256, "bfloat16", "float32", True, False, False),
        (80, 1, 64, 128, 256, "float16", "bfloat16", False, True, False),
        (24, 1, 128, 256, 256, "float16", "bfloat16", True, True, False),
        (32, 4, 80, 128, 256, "bfloat16", "float32", False, False, False),
        # P 80's tail tiling with intermediate states, per-dim D, fp16 and the prefetch; its K-major one (chunk 64)
        (96, 8, 80, 128, 256, "float16", "bfloat16", True, True, True),
        (32, 4, 80, 128, 64, "bfloat16", "float32", False, False, False),
    ]
    specs: list[KernelSpec] = []
    for H, G, P, N, L, io, state, inter, dpd, prefetch in grid:
        specs.append(scan_spec(
            H=H, G=G, P=P, N=N, L=L, io=io, state=state, init=state, D="float32", D_per_dim=dpd, cu="int32",
            sq="int32", has_D=True, intermediate=inter, prefetch=prefetch,
        ))  # fmt: skip
    for i, (last, fsi, use_fsi) in ((0, ("int32", "int32", False)), (1, ("int32", "int64", True)),
                                    (5, ("int32", "int32", False)), (6, ("int32", "int32", True))):  # fmt: skip
        specs.append(dt_spec(specs[i], dt="float32", **VLLM_DT, last=last, fsi=fsi, use_fsi=use_fsi))
    # one head per CTA (odd head counts per rank)
    odd = scan_spec(
        H=3, G=1, P=64, N=128, L=256, io="bfloat16", state="float32", init="float32", D="float32", D_per_dim=False,
        cu="int32", sq="int32", has_D=True, intermediate=False,
    )  # fmt: skip
    specs.append(dt_spec(odd, dt="float32", **VLLM_DT, last="int32", fsi="int32", use_fsi=False))
    # the split design: its scan (final states by index; intermediate states at 64-token tiles; a head dim of 80),
    # the state pass (128 threads; 256 at N 256; K-major at a head dim of 80) and the hand-over
    few = scan_spec(
        H=16, G=1, P=64, N=128, L=128, io="bfloat16", state="float32", init="float32", D="float32", D_per_dim=False,
        cu="int32", sq="int32", has_D=True, intermediate=False, split=True,
    )  # fmt: skip
    specs += [few, states_spec(few), combine_spec(few)]
    for i in (5, 6):  # (24, 1, 128, 256, 256 intermediate) and (32, 4, 80, 128, 256)
        split = dataclasses.replace(specs[i], split=True)
        specs += [split, states_spec(split)]
    # dt options away from vLLM's: no softplus, no bias, a dt limit, bf16 dt
    limited = dict(dt="bfloat16", dtb="float32", has_dtb=False, softplus=False, lo=0.02, hi=0.15)
    specs.append(dt_spec(specs[0], **limited, last="int32", fsi="int32", use_fsi=False))
    # a quantised pool's conversions: each dtype both ways, int64 slot indices, a strided pool, P 80 and N 256
    specs += [
        codec_spec(P=64, N=128, qdtype="int16", direction="decode"),
        codec_spec(P=64, N=128, qdtype="int16", direction="encode"),
        codec_spec(P=64, N=128, qdtype="int8", direction="decode"),
        codec_spec(P=64, N=128, qdtype="int8", direction="encode", index="int64"),
        codec_spec(P=80, N=128, qdtype="float8_e4m3fn", direction="decode", vector=False),
        codec_spec(P=128, N=256, qdtype="float8_e4m3fn", direction="encode"),
    ]
    return specs


def _as_is(name: str, t: torch.Tensor) -> torch.Tensor:
    """:meth:`_Launch._in` of a launch that stages nothing."""
    return t


def _fill_runs(runs: torch.Tensor, nchunks: int) -> None:
    """Run r of R covers chunks [r * nchunks // R, (r + 1) * nchunks // R): computed on the device (no host copy:
    capture-safe)."""
    R = runs.shape[0] - 1
    torch.arange(R + 1, out=runs, dtype=torch.int32)
    runs.mul_(nchunks).floor_divide_(R)


def _dummy(kind, device, dtype, shape):
    key = (kind, device, dtype, shape)
    t = _dummies.get(key)
    if t is None:
        t = _dummies[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


def _inner_dense(t: torch.Tensor, inner: int) -> bool:
    """Whether the last ``inner`` dims of ``t`` are laid out densely (row-major)."""
    expected = 1
    for d in range(t.dim() - 1, t.dim() - 1 - inner, -1):
        if t.shape[d] != 1 and t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def _tma_ok(t: torch.Tensor) -> bool:
    """A TMA-read tensor: 16-byte aligned base, dense last dim, every other stride a positive multiple of 16
    bytes. Size-1 dims count too: the TMA descriptor carries their stride as given (DLPack passes it through
    unnormalised), and TileLang's descriptor check rejects a zero or unaligned one at launch (e.g. a 1-token
    call whose x is a row view of an odd-width projection buffer)."""
    es = t.element_size()
    if t.data_ptr() % 16 or t.stride(-1) != 1:
        return False
    return all(t.stride(d) > 0 and (t.stride(d) * es) % 16 == 0 for d in range(t.dim() - 1))


__all__ = ["run", "kernel", "prewarm", "compile_grid", "tiles", "_check_supported",
           "PREWARM_HINT"]  # fmt: skip
