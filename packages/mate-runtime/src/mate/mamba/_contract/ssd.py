"""The one normalisation point of ``ssd_combined_fwd_varlen`` (packed variable-length SSD prefill).

Canonical form (T packed tokens, H heads, P head dim, N state size, G groups, ``nchunks`` chunks, ``batch``
sequences): ``x, z, out [T, H, P]``, ``dt [T, H]`` (raw, before bias/softplus/limit), ``A [H]`` fp32,
``B, C [T, G, N]``, ``D [H, P]`` (a per-head ``[H]`` D appears as a stride-0 broadcast), ``dt_bias [H]``,
``initial_states [batch, H, P, N]``.

Chunk rules (one place): chunk ``c`` covers tokens ``[cu_chunk_seqlens[c], cu_chunk_seqlens[c+1])`` and
belongs to sequence ``seq_idx[c]``; it opens a sequence when ``c == 0`` or ``seq_idx[c] != seq_idx[c-1]``,
and then enters from ``initial_states[seq_idx[c]]`` (zero without initial states), else from the end
state of chunk ``c - 1``. ``seq_idx`` is the authority: ``last_chunk_indices`` only picks which chunk-end
states are returned. A chunk spans at most ``chunk_size`` tokens.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import INDEX_DTYPES, IO_DTYPES, PARAM_DTYPES, QUANT_STATE_DTYPES, STATE_DTYPES
from mate.mamba._contract.errors import bad_arg, check_tensor, majority_culprit, unsupported, values
from mate.mamba._contract.ssu import host_ints

MIN_CHUNK_SIZE = 8  # the engines' prefill ops take powers of two from 8 up


def check_chunk_size(chunk_size) -> None:
    """ValueError unless a positive int; NotImplementedError unless a power of two from :data:`MIN_CHUNK_SIZE` up
    (what the engines' prefill ops take and the reference serves)."""
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        bad_arg("chunk_size", chunk_size, "a positive int")
    if chunk_size < MIN_CHUNK_SIZE or chunk_size & (chunk_size - 1):
        raise NotImplementedError(
            f"chunk_size={chunk_size} in the SSD prefill is not supported by MATE: it serves powers of two from "
            f"{MIN_CHUNK_SIZE} up (the TileLang kernels 64, 128 and 256)"
        )


@dataclass(frozen=True)
class SSDCall:
    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    chunk_size: int
    cu_seqlens: torch.Tensor
    cu_chunk_seqlens: torch.Tensor
    last_chunk_indices: torch.Tensor
    seq_idx: torch.Tensor
    out: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None
    dt_softplus: bool
    dt_limit: tuple[float, float]
    initial_states: torch.Tensor | None
    return_intermediate_states: bool
    state_dtype: torch.dtype
    final_states_out: torch.Tensor | None
    initial_states_scale: torch.Tensor | None  # [batch, H, P] fp32 with a quantised initial_states
    final_states_scale: torch.Tensor | None  # [slots, H, P] fp32 with a quantised final_states_out (written)
    final_state_indices: torch.Tensor | None

    @property
    def tokens(self) -> int:
        return self.x.shape[0]

    @property
    def heads(self) -> int:
        return self.x.shape[1]

    @property
    def dim(self) -> int:
        return self.x.shape[2]

    @property
    def dstate(self) -> int:
        return self.B.shape[2]

    @property
    def groups(self) -> int:
        return self.B.shape[1]

    @property
    def nchunks(self) -> int:
        return self.cu_chunk_seqlens.shape[0] - 1

    @property
    def batch(self) -> int:
        return self.cu_seqlens.shape[0] - 1

    @property
    def D_tied(self) -> bool:
        return self.D is None or self.D.stride(1) == 0

    @property
    def has_dt_limit(self) -> bool:
        return self.dt_limit != (0.0, math.inf)


_tensor = functools.partial(check_tensor, device_of="x")  # (name, t, ndims, dtypes, device)


def _shape(name, t, shape):
    if tuple(t.shape) != tuple(shape):
        bad_arg(name, t, f"shape {tuple(shape)}")


def _pool_scale(name, scale, of, states, device):
    """The fp32 ``[rows, H, P]`` scales of a quantised state tensor (None for a float one, or none given): a
    scale beside a float tensor, or a quantised tensor without one, is the caller's mistake."""
    quantised = states is not None and states.dtype in QUANT_STATE_DTYPES
    if scale is None:
        if quantised:
            bad_arg(name, None, f"a float32 [rows, heads, dim] tensor of {of}'s block scales ({of} is "
                    f"{str(states.dtype).removeprefix('torch.')})")  # fmt: skip
        return None
    if not quantised:
        bad_arg(name, scale, f"None unless {of} is an int16, int8 or float8_e4m3fn tensor")
    _tensor(name, scale, 3, (torch.float32,), device)
    _shape(name, scale, tuple(states.shape[:3]))
    if scale.stride(2) != 1 or scale.stride(1) != scale.shape[2]:
        bad_arg(name, scale, "the inner (heads, dim) dims dense")
    return scale


def normalize_ssd(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    cu_seqlens,
    cu_chunk_seqlens,
    last_chunk_indices,
    seq_idx,
    out=None,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    initial_states=None,
    return_intermediate_states=False,
    state_dtype=None,
    checkpoint_token_indices=None,
    checkpoint_state_slots=None,
    checkpoint_states=None,
    final_states_out=None,
    final_state_indices=None,
    initial_states_scale=None,
    final_states_scale=None,
) -> SSDCall:
    """Validate ``ssd_combined_fwd_varlen``'s arguments (in ``mate.mamba._ops.SSD_PARAMS`` order, all but ``backend``)
    and return the canonical :class:`SSDCall`."""
    try:
        for name, val in (
            ("checkpoint_token_indices", checkpoint_token_indices),
            ("checkpoint_state_slots", checkpoint_state_slots),
            ("checkpoint_states", checkpoint_states),
        ):
            if val is not None:
                unsupported(f"{name} (checkpointed state replay in the SSD prefill)", f"pass {name}=None")

        _tensor("x", x, 3, IO_DTYPES, None)
        device = x.device
        T, H, P = x.shape
        _tensor("dt", dt, 2, PARAM_DTYPES, device)
        _shape("dt", dt, (T, H))
        _tensor("A", A, 1, PARAM_DTYPES, device)
        _shape("A", A, (H,))
        if A.dtype != torch.float32:  # a 2-byte A (the engines accept one): the kernels and the reference take fp32
            A = A.float()
        _tensor("B", B, 3, (x.dtype,), device)
        G, N = B.shape[1], B.shape[2]
        if B.shape[0] != T or G < 1 or H % G != 0:
            bad_arg("B", B, f"[{T}, groups, dstate] with heads ({H}) divisible by groups and x's dtype")
        _tensor("C", C, 3, (x.dtype,), device)
        _shape("C", C, B.shape)
        check_chunk_size(chunk_size)

        _tensor("cu_seqlens", cu_seqlens, 1, INDEX_DTYPES, device)
        batch = cu_seqlens.shape[0] - 1
        if batch < 1:
            bad_arg("cu_seqlens", cu_seqlens, "[batch + 1] cumulative token offsets with batch >= 1")
        _tensor("cu_chunk_seqlens", cu_chunk_seqlens, 1, INDEX_DTYPES, device)
        nchunks = cu_chunk_seqlens.shape[0] - 1
        if nchunks < 1:
            bad_arg("cu_chunk_seqlens", cu_chunk_seqlens, "[nchunks + 1] cumulative chunk offsets with nchunks >= 1")
        if nchunks * chunk_size < T:
            bad_arg(
                "cu_chunk_seqlens",
                cu_chunk_seqlens,
                f"at least {-(-T // chunk_size)} chunks: {nchunks} chunks of at most chunk_size ({chunk_size}) tokens "
                f"cannot cover the {T} tokens",
            )
        _tensor("seq_idx", seq_idx, 1, INDEX_DTYPES, device)
        if seq_idx.shape[0] != nchunks:
            bad_arg(
                "seq_idx",
                seq_idx,
                f"[nchunks] = ({nchunks},): the sequence owning each chunk (per chunk, not per token)",
            )
        _tensor("last_chunk_indices", last_chunk_indices, 1, INDEX_DTYPES, device)
        _shape("last_chunk_indices", last_chunk_indices, (batch,))

        if out is None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        else:
            _tensor("out", out, 3, (x.dtype,), device)
            _shape("out", out, x.shape)
        Dh = None
        if D is not None:
            _tensor("D", D, D.dim() if isinstance(D, torch.Tensor) and D.dim() in (1, 2) else 1, PARAM_DTYPES, device)
            if D.dim() == 1:
                _shape("D", D, (H,))
                Dh = D.unsqueeze(1).expand(H, P)
            else:
                _shape("D", D, (H, P))
                Dh = D
        if z is not None:
            _tensor("z", z, 3, (x.dtype,), device)
            _shape("z", z, x.shape)
        if dt_bias is not None:
            _tensor("dt_bias", dt_bias, 1, PARAM_DTYPES, device)
            _shape("dt_bias", dt_bias, (H,))
        try:
            lo, hi = (float(v) for v in dt_limit)
        except (TypeError, ValueError):
            bad_arg("dt_limit", dt_limit, "a (min, max) pair of floats")
        if not lo <= hi:
            bad_arg("dt_limit", dt_limit, "min <= max")
        if initial_states is not None:
            _tensor("initial_states", initial_states, 4, STATE_DTYPES + QUANT_STATE_DTYPES, device)
            _shape("initial_states", initial_states, (batch, H, P, N))
        init_scale = _pool_scale("initial_states_scale", initial_states_scale, "initial_states", initial_states,
                                 device)  # fmt: skip
        if state_dtype is None:
            state_dtype = C.dtype
            if initial_states is not None and initial_states.dtype in STATE_DTYPES:
                state_dtype = initial_states.dtype
        if state_dtype not in STATE_DTYPES:
            bad_arg("state_dtype", state_dtype, "float32, bfloat16 or float16")
        if final_states_out is not None or final_state_indices is not None:
            if final_states_out is None or final_state_indices is None:
                bad_arg("final_states_out", final_states_out, "given together with final_state_indices")
            if return_intermediate_states:
                bad_arg("return_intermediate_states", True, "False when final_states_out is given")
            _tensor("final_states_out", final_states_out, 4, STATE_DTYPES + QUANT_STATE_DTYPES, device)
            if tuple(final_states_out.shape[1:]) != (H, P, N):
                bad_arg("final_states_out", final_states_out, f"[slots, {H}, {P}, {N}]")
            _tensor("final_state_indices", final_state_indices, 1, INDEX_DTYPES, device)
            _shape("final_state_indices", final_state_indices, (batch,))
        final_scale = _pool_scale("final_states_scale", final_states_scale, "final_states_out", final_states_out,
                                  device)  # fmt: skip

        return SSDCall(
            x=x,
            dt=dt,
            A=A,
            B=B,
            C=C,
            chunk_size=chunk_size,
            cu_seqlens=cu_seqlens,
            cu_chunk_seqlens=cu_chunk_seqlens,
            last_chunk_indices=last_chunk_indices,
            seq_idx=seq_idx,
            out=out,
            D=Dh,
            z=z,
            dt_bias=dt_bias,
            dt_softplus=bool(dt_softplus),
            dt_limit=(lo, hi),
            initial_states=initial_states,
            return_intermediate_states=bool(return_intermediate_states),
            state_dtype=state_dtype,
            final_states_out=final_states_out,
            final_state_indices=final_state_indices,
            initial_states_scale=init_scale,
            final_states_scale=final_scale,
        )

    except ValueError:
        culprit = _ssd_culprit(x, dt, A, B, C, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D, z,
                               dt_bias, initial_states, final_states_out, final_state_indices)  # fmt: skip
        if culprit is None:
            raise
        raise culprit from None


def _dims(t, ndim, *axes):
    """``t.shape[axis]`` (``axis`` None: the first dim minus one, a table's count) when ``t`` is a tensor of
    ``ndim`` dims (a tuple: any of them), else None."""
    ndims = ndim if isinstance(ndim, tuple) else (ndim,)
    if not isinstance(t, torch.Tensor) or t.dim() not in ndims:
        return [None] * len(axes)
    return [t.shape[0] - 1 if a is None else (t.shape[a] if a < t.dim() else None) for a in axes]


def _ssd_culprit(x, dt, A, B, C, cu, cuc, last, seq_idx, out, D, z, dt_bias, init, fso, fsi) -> ValueError | None:
    """For a call whose shapes disagree: the error naming the argument that breaks the majority (e.g. an x with
    the wrong head count, not the dt that agrees with A), or None (``_errors.majority_culprit``)."""
    (xT, xH, xP), (dT, dH), (bT, bG, bN), (cT, cG, cN) = (
        _dims(x, 3, 0, 1, 2), _dims(dt, 2, 0, 1), _dims(B, 3, 0, 1, 2), _dims(C, 3, 0, 1, 2)
    )  # fmt: skip
    (zT, zH, zP), (oT, oH, oP) = _dims(z, 3, 0, 1, 2), _dims(out, 3, 0, 1, 2)
    (iB, iH, iP, iN), (fH, fP, fN) = _dims(init, 4, 0, 1, 2, 3), _dims(fso, 4, 1, 2, 3)
    (DH, DP) = _dims(D, (1, 2), 0, 1)
    return majority_culprit({
        "tokens": [("x", x, xT), ("dt", dt, dT), ("B", B, bT), ("C", C, cT), ("z", z, zT), ("out", out, oT)],
        "heads": [("x", x, xH), ("dt", dt, dH), ("A", A, _dims(A, 1, 0)[0]), ("D", D, DH), ("z", z, zH),
                  ("out", out, oH), ("dt_bias", dt_bias, _dims(dt_bias, 1, 0)[0]), ("initial_states", init, iH),
                  ("final_states_out", fso, fH)],
        "dim": [("x", x, xP), ("z", z, zP), ("out", out, oP), ("D", D, DP), ("initial_states", init, iP),
                ("final_states_out", fso, fP)],
        "dstate": [("B", B, bN), ("C", C, cN), ("initial_states", init, iN), ("final_states_out", fso, fN)],
        "groups": [("B", B, bG), ("C", C, cG)],
        "sequences": [("cu_seqlens", cu, _dims(cu, 1, None)[0]), ("last_chunk_indices", last, _dims(last, 1, 0)[0]),
                      ("initial_states", init, iB), ("final_state_indices", fsi, _dims(fsi, 1, 0)[0])],
        "chunks": [("cu_chunk_seqlens", cuc, _dims(cuc, 1, None)[0]), ("seq_idx", seq_idx, _dims(seq_idx, 1, 0)[0])],
    })  # fmt: skip


def check_index_data(call: SSDCall) -> None:
    """The checks on the chunk tables' values, which the normaliser cannot make without reading device memory:
    ``cu_seqlens`` and ``cu_chunk_seqlens`` non-decreasing from 0 to the token count, no chunk longer than
    ``chunk_size`` or spanning a sequence boundary, ``seq_idx`` naming a sequence, ``last_chunk_indices`` a chunk
    and ``final_state_indices`` a slot of ``final_states_out``. The reference backend runs them on every call
    before anything is written; the TileLang backend with ``MATE_CHECK_INPUTS=1`` (the tables are copied to the
    host: a device sync per table)."""
    T, nc, batch, L = call.tokens, call.nchunks, call.batch, call.chunk_size
    cus, cuc = host_ints(call.cu_seqlens), host_ints(call.cu_chunk_seqlens)
    for name, cu in (("cu_seqlens", cus), ("cu_chunk_seqlens", cuc)):
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) != T:
            bad_arg(name, values(cu), f"non-decreasing token offsets from 0 to the token count ({T})")
    lens = cuc[1:] - cuc[:-1]
    if int(lens.max()) > L:
        c = int(torch.argmax(lens))
        bad_arg(
            "cu_chunk_seqlens",
            values(cuc),
            f"chunks of at most chunk_size ({L}) tokens (chunk {c} has {int(lens[c])})",
        )
    # a sequence boundary strictly inside a chunk: the chunk spans two sequences
    inner = cus[(cus > 0) & (cus < T)]
    if inner.numel():
        c = torch.searchsorted(cuc, inner, right=True) - 1  # the chunk each boundary falls in
        crossing = cuc[c] < inner
        if bool(crossing.any()):
            k = int(torch.nonzero(crossing)[0])
            cc, v = int(c[k]), int(inner[k])
            bad_arg(
                "cu_chunk_seqlens",
                values(cuc),
                f"every chunk inside one sequence (chunk {cc}, tokens [{int(cuc[cc])}, {int(cuc[cc + 1])}), spans "
                f"the sequence boundary at token {v} of cu_seqlens)",
            )
    for name, t, n, what in (
        ("seq_idx", call.seq_idx, batch, "sequences"),
        ("last_chunk_indices", call.last_chunk_indices, nc, "chunks"),
    ):
        t = host_ints(t)
        if bool(((t < 0) | (t >= n)).any()):
            bad_arg(name, values(t), f"{what} in [0, {n})")
    if call.final_state_indices is not None:
        slots = call.final_states_out.shape[0]
        t = host_ints(call.final_state_indices)
        if bool(((t < 0) | (t >= slots)).any()):
            bad_arg("final_state_indices", values(t), f"slots in [0, {slots}) of final_states_out")
