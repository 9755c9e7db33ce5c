"""The one normalisation point of ``mamba2_decode_step``: a Mamba2 layer's decode step (one token per sequence) from
the in_proj output to the gated norm's output, as vLLM 0.33's ``MambaMixer2`` runs it with three ops.

Notation: H heads, P head_dim, N d_state, G SSM groups (``ngroups``), HP = H * P, CD = HP + 2 * G * N (the conv
channels: x, then B, then C), W the conv width, S slots. Semantics, exactly the three ops in sequence:

1. ``causal_conv1d_update(xBC, conv_state, conv_weight, conv_bias, "silu", slots, null_block_id=pad_slot_id)`` on
   a copy of ``xBC`` (the caller's xBC is not written; vLLM updates its own in place): the result, as vLLM's mixer
   leaves it without ``out`` (a sequence on the sentinel keeps its raw xBC row, through the pool's dtype).
2. Its split into ``x [batch, H, P]``, ``B`` and ``C [batch, G, N]``, then ``selective_state_update(ssm_state, x,
   dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots, pad_slot_id=pad_slot_id,
   out=y)`` with dt / A / D / dt_bias tied per head as the mixer expands them, no ``z`` (a sentinel's state reads
   as zeros and nothing is written), ``y [batch, H, P]`` in xBC's dtype.
3. ``rms_norm_gated(y, norm_weight, None, z, eps, norm_group_size, norm_before_gate=False)`` into ``out``.

One slot table serves both pools (``state_indices``): vLLM 0.33 and SGLang address a layer's conv and SSM states
by one cache index per sequence, and one table gives one pad rule (a sequence is live in both pools or in none).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from mate.mamba._contract.conv1d import MAX_WIDTH
from mate.mamba._contract.dtypes import INDEX_DTYPES, IO_DTYPES, PARAM_DTYPES, QUANT_STATE_DTYPES, STATE_DTYPES
from mate.mamba._contract.errors import bad_arg, check_tensor, values


@dataclass(frozen=True)
class DecodeStepCall:
    xBC: torch.Tensor  # [batch, CD], last dim dense
    z: torch.Tensor  # [batch, HP], last dim dense, xBC's dtype
    dt: torch.Tensor  # [batch, H] (raw: dt_bias and softplus are applied inside)
    conv_state: torch.Tensor  # [S, CD, K >= W - 1], any strides
    conv_weight: torch.Tensor  # [CD, W]
    conv_bias: torch.Tensor | None  # [CD]
    ssm_state: torch.Tensor  # [S', H, P, N], inner three dims dense
    A: torch.Tensor  # [H] fp32
    D: torch.Tensor | None  # [H]
    dt_bias: torch.Tensor | None  # [H]
    norm_weight: torch.Tensor  # [HP]
    slots: torch.Tensor  # [batch] (column 0 of a 2-D table), int32 / int64
    pad_slot_id: int
    ngroups: int
    norm_group_size: int
    eps: float
    out: torch.Tensor  # [batch, HP], xBC's dtype

    @property
    def state(self) -> torch.Tensor:
        """The SSM pool (whose device the dispatcher runs the call on)."""
        return self.ssm_state

    @property
    def batch(self) -> int:
        return self.xBC.shape[0]

    @property
    def heads(self) -> int:
        return self.ssm_state.shape[1]

    @property
    def dim(self) -> int:
        return self.ssm_state.shape[2]

    @property
    def dstate(self) -> int:
        return self.ssm_state.shape[3]

    @property
    def width(self) -> int:
        return self.conv_weight.shape[1]

    @property
    def norm_groups(self) -> int:
        return self.heads * self.dim // self.norm_group_size


_tensor = functools.partial(check_tensor, device_of="xBC")  # (name, t, ndims, dtypes, device=None)


def _shape(name, t, shape, what) -> None:
    if tuple(t.shape) != shape:
        bad_arg(name, t, f"shape {shape} ({what})")


def _int(name, v, least) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < least:
        bad_arg(name, v, f"an int >= {least}")
    return v


def normalize_decode_step(xBC, z, dt, conv_state, conv_weight, conv_bias, ssm_state, A, D, dt_bias, norm_weight,
                          state_indices, ngroups, pad_slot_id=-1, norm_group_size=None, eps=1e-6,
                          out=None) -> DecodeStepCall:  # fmt: skip
    """Validate a ``mamba2_decode_step`` call into a :class:`DecodeStepCall` (``ValueError`` naming the first bad
    argument, ``NotImplementedError`` for a valid form MATE does not serve), before anything is written; ``out``
    is allocated here when None."""
    _tensor("xBC", xBC, 2, IO_DTYPES)
    dev, batch, cd = xBC.device, xBC.shape[0], xBC.shape[1]
    if cd and xBC.stride(1) != 1:
        bad_arg("xBC", xBC, "rows with a dense last dim (stride(1) == 1)")
    if isinstance(ssm_state, torch.Tensor) and ssm_state.dtype in QUANT_STATE_DTYPES:
        raise NotImplementedError(
            f"ssm_state: a block-scaled {str(ssm_state.dtype).removeprefix('torch.')} pool is not served by "
            "mamba2_decode_step (fp32 / bf16 / fp16 pools; selective_state_update serves quantised pools)"
        )
    _tensor("ssm_state", ssm_state, 4, STATE_DTYPES, dev)
    _, H, P, N = ssm_state.shape
    if ssm_state.stride()[1:] != (P * N, N, 1):
        bad_arg("ssm_state", ssm_state, "[slots, H, P, N] with the inner three dims dense")
    G = _int("ngroups", ngroups, 1)
    if H % G:
        bad_arg("ngroups", ngroups, f"a divisor of the heads ({H}, ssm_state.shape[1])")
    hp = H * P
    if cd != hp + 2 * G * N:
        bad_arg("xBC", xBC, f"{hp + 2 * G * N} channels per row (heads * head_dim + 2 * ngroups * d_state)")
    _tensor("z", z, 2, (xBC.dtype,), dev)
    _shape("z", z, (batch, hp), "batch, heads * head_dim; xBC's dtype")
    if hp and z.stride(1) != 1:
        bad_arg("z", z, "rows with a dense last dim (stride(1) == 1)")
    _tensor("dt", dt, 2, (torch.float32, xBC.dtype), dev)
    _shape("dt", dt, (batch, H), "batch, heads")
    _tensor("conv_weight", conv_weight, 2, IO_DTYPES, dev)
    W = conv_weight.shape[1]
    if conv_weight.shape[0] != cd or not 2 <= W <= MAX_WIDTH:
        bad_arg("conv_weight", conv_weight, f"shape ({cd}, width) with width in [2, {MAX_WIDTH}]")
    if conv_bias is not None:
        _tensor("conv_bias", conv_bias, 1, IO_DTYPES, dev)
        _shape("conv_bias", conv_bias, (cd,), "xBC's channels")
    _tensor("conv_state", conv_state, 3, IO_DTYPES, dev)
    if conv_state.shape[1] != cd or conv_state.shape[2] < W - 1:
        bad_arg("conv_state", conv_state, f"shape (slots, {cd}, state_len) with state_len >= {W - 1} (width - 1)")
    _tensor("A", A, 1, (torch.float32,), dev)
    _shape("A", A, (H,), "one per head")
    for name, t in (("D", D), ("dt_bias", dt_bias)):
        if t is not None:
            _tensor(name, t, 1, PARAM_DTYPES, dev)
            _shape(name, t, (H,), "one per head")
    _tensor("norm_weight", norm_weight, 1, PARAM_DTYPES, dev)
    _shape("norm_weight", norm_weight, (hp,), "heads * head_dim")
    _tensor("state_indices", state_indices, state_indices.dim() if isinstance(state_indices, torch.Tensor) else 1,
            INDEX_DTYPES, dev)  # fmt: skip
    if state_indices.dim() not in (1, 2) or state_indices.shape[0] != batch or 0 in state_indices.shape[1:]:
        bad_arg("state_indices", state_indices, f"[{batch}] or [{batch}, k] (one slot per sequence, column 0)")
    if not isinstance(pad_slot_id, int) or isinstance(pad_slot_id, bool):
        bad_arg("pad_slot_id", pad_slot_id, "an int (vLLM 0.33 passes its null block, 0)")
    if norm_group_size is None:
        norm_group_size = hp
    elif isinstance(norm_group_size, bool) or not isinstance(norm_group_size, int) or norm_group_size < 1 \
            or hp % norm_group_size:  # fmt: skip
        bad_arg("norm_group_size", norm_group_size, f"None (one group) or a positive divisor of heads * head_dim "
                f"({hp})")  # fmt: skip
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps >= 0):
        bad_arg("eps", eps, "a finite non-negative float")
    if out is None:
        out = torch.empty((batch, hp), dtype=xBC.dtype, device=dev)
    else:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch, hp):
            bad_arg("out", out, f"shape ({batch}, {hp}) (batch, heads * head_dim)")
        if out.dtype != xBC.dtype or out.device != dev:
            bad_arg("out", out, f"dtype {str(xBC.dtype).removeprefix('torch.')} on {dev} (xBC's)")
        if hp and out.stride(1) != 1:
            bad_arg("out", out, "rows with a dense last dim (stride(1) == 1)")
    slots = state_indices if state_indices.dim() == 1 else state_indices[:, 0]
    return DecodeStepCall(
        xBC=xBC, z=z, dt=dt, conv_state=conv_state, conv_weight=conv_weight, conv_bias=conv_bias,
        ssm_state=ssm_state, A=A, D=D, dt_bias=dt_bias, norm_weight=norm_weight, slots=slots,
        pad_slot_id=pad_slot_id, ngroups=G, norm_group_size=norm_group_size, eps=float(eps), out=out,
    )  # fmt: skip


def check_index_data(call: DecodeStepCall) -> None:
    """The slots' values (a device-to-host copy): each in ``[0, slots)`` of both pools, or ``pad_slot_id``."""
    S = min(call.conv_state.shape[0], call.ssm_state.shape[0])
    idx = call.slots.detach().to("cpu", torch.int64)
    ok = ((idx >= 0) & (idx < S)) | (idx == call.pad_slot_id)
    if not bool(ok.all()):
        bad_arg("state_indices", values(idx), f"entries in [0, {S}) (slots of both pools) or pad_slot_id")


def three_ops(call: DecodeStepCall, xbc: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> tuple:
    """The contract's sequence (the module docstring) as the three ops' normalised calls, for every backend:
    ``causal_conv1d_update`` in place on ``xbc`` (``[batch, CD]`` in xBC's dtype, holding a copy of xBC: a
    sequence on the sentinel keeps its raw row; the pool has that dtype, so the in-place result rounds as vLLM's),
    ``selective_state_update`` from its split into ``y`` (``[batch, H, P]``), ``rms_norm_gated`` of y into ``out``
    (``[batch, HP]`` contiguous, the norm's canonical form). Returns ``(conv, ssu, norm)``."""
    from mate.mamba._contract.conv1d import normalize_conv1d_update
    from mate.mamba._contract.norm import NormCall
    from mate.mamba._contract.ssu import normalize_ssu

    H, P, N, G, hp = call.heads, call.dim, call.dstate, call.ngroups, call.heads * call.dim
    batch = call.batch
    conv = normalize_conv1d_update(xbc, call.conv_state, call.conv_weight, call.conv_bias, "silu", call.slots,
                                   null_block_id=call.pad_slot_id)  # fmt: skip
    x = xbc[:, :hp].view(batch, H, P)
    B = xbc[:, hp : hp + G * N].view(batch, G, N)
    C = xbc[:, hp + G * N :].view(batch, G, N)
    ssu = normalize_ssu(
        call.ssm_state, x, call.dt[:, :, None].expand(-1, -1, P), call.A[:, None, None].expand(H, P, N), B, C,
        None if call.D is None else call.D[:, None].expand(H, P), None,
        None if call.dt_bias is None else call.dt_bias[:, None].expand(H, P), True, call.slots, call.pad_slot_id,
        out=y,
    )  # fmt: skip
    # (z has a dense last dim, checked above; the weight made dense as rms_norm_gated's normaliser makes it)
    norm = NormCall(x=y.view(batch, hp), weight=call.norm_weight.contiguous(), bias=None, z=call.z, out=out,
                    eps=call.eps, group_size=call.norm_group_size, norm_before_gate=False,
                    shape=(batch, hp))  # fmt: skip
    return conv, ssu, norm


__all__ = ["DecodeStepCall", "check_index_data", "normalize_decode_step", "three_ops"]
