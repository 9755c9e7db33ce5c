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
    vector_pool,
)  # fmt: skip
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
    of the same metadata from the caller's tensors: the call rebuilt without validation
    (:class:`~mate.mamba._contract.template.CallTemplate`), the plan made here reused (re-planned only when the
    pointer alignment of a quantised pool changes)."""
    checked = settings.get("MATE_CHECK_INPUTS")
    if checked and not is_capturing(call.x.device):
        check_index_data(call)  # reads the tables back (a sync): the debugging mode only
    plans: dict = {}  # by pointer alignment, filled by the launches
    result = _launch(call, plans)
    if sources is None or checked:
        return result, None
    template = CallTemplate.of(call, tuple(sources.values()), fresh=("out",))
    if template is None:
        return result, None
    return result, lambda tensors: _launch(template.rebuild(tensors), plans)


def _alignment(call: SSDCall) -> tuple:
    """The data-pointer-dependent part of a plan: 16-byte vector access to the quantised pools."""
    init, pool = call.initial_states, call.final_states_out
    return (
        init is not None and init.dtype in QUANT_STATE_DTYPES and vector_pool(init),
        pool is not None and pool.dtype in QUANT_STATE_DTYPES and vector_pool(pool),
    )


def _launch(call: SSDCall, plans: dict) -> torch.Tensor | None:
    """Launch a call's kernels under its plan (``plans``: by pointer alignment, filled on a new one)."""
    dev = call.x.device
    align = _alignment(call)
    p = plans.get(align)
    if p is None:
        p = plans[align] = plan(call, hardware(dev))
    H, P, N, L = call.heads, call.dim, call.dstate, call.chunk_size
    batch, nchunks = call.batch, call.nchunks

    skey = ("ssd", H, call.groups, P, N)
    use_fsi = call.final_states_out is not None
    if call.return_intermediate_states:
        states = torch.empty((nchunks, H, P, N), dtype=call.state_dtype, device=dev)
        state_dt = call.state_dtype
    elif p.encode is not None:  # a quantised pool: fp32 final states per sequence, encoded after the scan
        states = WORKSPACE.get(skey, "final_fp32", (batch, H, P, N), torch.float32, dev)
        state_dt = torch.float32
    elif use_fsi:
        states = call.final_states_out
        state_dt = states.dtype
    else:
        states = torch.empty((batch, H, P, N), dtype=call.state_dtype, device=dev)
        state_dt = call.state_dtype

    cu = _vec1(call.cu_chunk_seqlens, skey, "cu_chunk_seqlens")
    seq_idx = _vec1(call.seq_idx, skey, "seq_idx")
    last = _vec1(call.last_chunk_indices, skey, "last_chunk_indices")
    fsi = _vec1(call.final_state_indices, skey, "final_state_indices") if use_fsi else last
    scan_fsi = fsi if p.encode is None else last  # with the encode, the scan writes row b for sequence b
    scan = kernel(p.scan, dev)
    dtpass = kernel(p.dt, dev)

    x = call.x if _tma_ok(call.x) else _stage(skey, "x", call.x)
    B = call.B if _tma_ok(call.B) else _stage(skey, "B", call.B)
    C = call.C if _tma_ok(call.C) else _stage(skey, "C", call.C)
    dt = call.dt if call.dt.stride(1) == 1 else _stage(skey, "dt", call.dt)
    A = _vec1(call.A, skey, "A")
    dt_bias = (
        _vec1(call.dt_bias, skey, "dt_bias") if call.dt_bias is not None else _dummy("dtb", dev, torch.float32, (H,))
    )
    if call.D is None:
        D = _dummy("D", dev, torch.float32, (H,))
    elif not call.D_tied:
        D = _vec1(call.D, skey, "D")
    else:
        D = _vec1(call.D[:, 0], skey, "D")
    flags = 0
    kmod = _kmod()
    # z is read with plain accesses: any row strides, dense inner dim.
    if call.z is not None:
        z = call.z if _inner_dense(call.z, 1) else _stage(skey, "z", call.z)
        flags |= kmod.FLAG_Z
    else:
        z = _dummy("z", dev, call.x.dtype, (1, H, P))
    if p.decode is not None:  # a quantised initial_states: decoded into fp32 rows the scan reads
        init = WORKSPACE.get(skey, "init_fp32", (batch, H, P, N), torch.float32, dev)
        q_init = call.initial_states
        if not _inner_dense(q_init, 2):
            q_init = _stage(skey, "init_q", q_init)
        kernel(p.decode, dev)(q_init, call.initial_states_scale, init)
        flags |= kmod.FLAG_INIT
    elif call.initial_states is not None:
        init = (
            call.initial_states if _inner_dense(call.initial_states, 3) else _stage(skey, "init", call.initial_states)
        )
        flags |= kmod.FLAG_INIT
    else:
        init = _dummy("init", dev, getattr(torch, p.scan.init_dtype), (1, H, P, N))
    # full tiles of out are stored by TMA: out needs TMA-compatible strides (else a staging copy)
    out = call.out if _tma_ok(call.out) else WORKSPACE.get(skey, "out", tuple(call.out.shape), call.out.dtype, dev)
    st = states if _inner_dense(states, 3) else WORKSPACE.get(skey, "states", tuple(states.shape), state_dt, dev)
    staged_states = st is not states
    if staged_states:
        st.copy_(states)  # rows the call does not name keep their values

    bounds = WORKSPACE.get(skey, "bounds", (batch + 1,), torch.int32, dev)
    dest = WORKSPACE.get(skey, "dest", (nchunks,), torch.int32, dev)
    BL = p.scan.block_L
    nvt = nchunks * (L // BL)
    dtA = WORKSPACE.get(skey, "dtA", (nvt, H, DECAY_ROWS, BL), torch.float32, dev)
    tmeta = WORKSPACE.get(skey, "tmeta", (nvt, kmod.META_WIDTH), torch.int32, dev)
    dtpass(dt, A, dt_bias, cu, seq_idx, dtA, tmeta, last, scan_fsi, bounds, dest)
    values = {
        "x": x, "B": B, "C": C, "cu_chunk_seqlens": cu, "seq_idx": seq_idx, "dest": dest, "D": D, "z": z,
        "initial_states": init, "out": out, "states_out": st, "dtA": dtA, "tmeta": tmeta, "flags": flags,
    }  # fmt: skip
    if p.design == "split":
        _split_scan(p, skey, dev, values)
    else:
        # k sequences per CTA: every k-th run bound (k divides the batch, so the view ends on bounds[batch])
        spc = p.seqs_per_cta
        values["bounds"] = bounds[::spc] if spc > 1 else bounds
        scan(*launch_args(SCAN_ARGS[None], values))
    if out is not call.out:
        call.out.copy_(out)
    if staged_states:
        states.copy_(st)
    if p.encode is not None:
        pool = call.final_states_out
        q_pool = pool if _inner_dense(pool, 2) else _stage(skey, "final_q", pool)  # rows it does not name kept
        kernel(p.encode, dev)(states, fsi, q_pool, call.final_states_scale)
        if q_pool is not pool:
            pool.copy_(q_pool)
    return None if use_fsi else states


def _split_scan(p, skey, dev, values: dict) -> None:
    """The split design (``mate_kernels.ssd_split``): the state pass and the hand-over over ``p.runs`` even runs
    of chunks, then the scan over the same runs, each entering with the true state. Scratch from the workspace;
    the run bounds are computed on the device (no host copy: capture-safe). ``values``: the scan's launch values
    but the runs'."""
    x, B, cu, init, dtA, tmeta, flags = (values[n] for n in ("x", "B", "cu_chunk_seqlens", "initial_states", "dtA",
                                                               "tmeta", "flags"))  # fmt: skip
    R, nchunks = p.runs, values["seq_idx"].shape[0]
    H, P, N = p.scan.heads, p.scan.dim, p.scan.dstate
    runs = WORKSPACE.get(skey, "runs", (R + 1,), torch.int32, dev)
    torch.arange(R + 1, out=runs, dtype=torch.int32)
    runs.mul_(nchunks).floor_divide_(R)  # run r: chunks [r * nchunks // R, (r + 1) * nchunks // R)
    run_states = WORKSPACE.get(skey, "run_states", (R, H, P, N), torch.float32, dev)
    run_dec = WORKSPACE.get(skey, "run_dec", (R, H), torch.float32, dev)
    kernel(p.states, dev)(x, B, cu, runs, init, dtA, tmeta, run_states, run_dec, flags)
    kernel(p.combine, dev)(run_states.view(R, H, P * N), run_dec)
    kernel(p.scan, dev)(*launch_args(SCAN_ARGS["split"], values | {"bounds": runs, "run_states": run_states}))


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


def _stage(skey, name, t: torch.Tensor) -> torch.Tensor:
    buf = WORKSPACE.get(skey, name, tuple(t.shape), t.dtype, t.device)
    buf.copy_(t)
    return buf


def _vec1(t: torch.Tensor, skey, name) -> torch.Tensor:
    return t if t.is_contiguous() else _stage(skey, name, t)


__all__ = ["run", "kernel", "prewarm", "compile_grid", "tiles", "_check_supported",
           "PREWARM_HINT"]  # fmt: skip
