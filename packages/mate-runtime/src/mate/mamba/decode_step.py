"""``mamba2_decode_step``: a Mamba2 layer's decode step (conv1d update + SiLU, SSU, gated RMSNorm) in one call, and
its prewarm.

Eager calls take the dispatcher's fast path, else normalise (``mate.mamba._contract.decode_step``) and run on a
backend; while ``torch.compile`` traces, the call becomes the ``mate::mamba2_decode_step`` custom op
(``mate.mamba._ops``, whose parameter table this signature matches).
"""

from __future__ import annotations

import torch
from mate.mamba._contract.decode_step import normalize_decode_step
from mate.mamba._contract.dtypes import INDEX_DTYPES, IO_DTYPES, PARAM_DTYPES, STATE_DTYPES
from mate.mamba._contract.errors import bad_arg, check_dtypes, check_ints
from mate.mamba._dispatch import FastPath, prewarm
from mate.mamba._ops import DECODE_STEP, trace_decode_step


def mamba2_decode_step(
    xBC: torch.Tensor,
    z: torch.Tensor,
    dt: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_bias: torch.Tensor | None,
    ssm_state: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,
    *,
    state_indices: torch.Tensor,
    ngroups: int,
    pad_slot_id: int = -1,
    norm_group_size: int | None = None,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """One decode token per sequence through a Mamba2 layer, from the in_proj output's pieces to the gated norm's
    output (the input of out_proj). H heads, P head_dim, N d_state, G = ``ngroups``, HP = H * P, S slots.

    - ``xBC``: ``[batch, HP + 2 * G * N]`` (x, B, C channels; bf16/fp16/fp32; a row view of the in_proj output,
      last dim dense); not written.
    - ``z``: ``[batch, HP]`` (the gate, xBC's dtype, last dim dense); ``dt``: ``[batch, H]`` raw (fp32 or xBC's
      dtype).
    - ``conv_state``: the pool ``[S, HP + 2 * G * N, state_len >= W - 1]`` (any strides), updated in place;
      ``conv_weight``: ``[channels, W]``; ``conv_bias``: ``[channels]`` or None.
    - ``ssm_state``: the pool ``[S, H, P, N]`` fp32/bf16/fp16 (inner three dims dense), updated in place.
    - ``A``: ``[H]`` fp32; ``D``, ``dt_bias``: ``[H]`` or None; ``norm_weight``: ``[HP]``.
    - ``state_indices``: ``[batch]`` or ``[batch, k]`` (column 0) int32/int64, each sequence's slot in both pools;
      a sequence on ``pad_slot_id`` reads zero SSM state, skips its conv and writes neither pool (vLLM 0.33 passes
      its null block, 0).
    - ``norm_group_size``: a divisor of HP (None: HP; vLLM: ``HP / ngroups`` per rank); ``eps``: the norm's.
    - ``out``: ``[batch, HP]`` in xBC's dtype (last dim dense) or None (allocated).

    Exactly ``causal_conv1d_update`` (SiLU) -> split -> ``selective_state_update`` (tied dt/A/D/dt_bias,
    ``dt_softplus=True``, no z) -> ``rms_norm_gated(y, norm_weight, None, z, eps, norm_group_size,
    norm_before_gate=False)``, with their roundings (``mate.mamba._contract.decode_step``). Returns ``out``.
    """
    entry = trace_decode_step if torch.compiler.is_compiling() else eager_decode_step  # traced: the custom op
    return entry(xBC, z, dt, conv_state, conv_weight, conv_bias, ssm_state, A, D, dt_bias, norm_weight, state_indices,
                 ngroups, pad_slot_id, norm_group_size, eps, out, backend)  # fmt: skip


# The eager call: the dispatcher's fast path, else normalise, dispatch and remember.
FAST = FastPath("decode_step", DECODE_STEP, normalize_decode_step)
eager_decode_step = DECODE_STEP.entry("eager_decode_step", FAST, split=True)


def prewarm_mamba2_decode_step(
    *,
    heads: int,
    dim: int,
    dstate: int,
    ngroups: int,
    width: int = 4,
    norm_group_size: int | None = None,
    io_dtype: torch.dtype = torch.bfloat16,
    state_dtype: torch.dtype = torch.bfloat16,
    dt_dtype: torch.dtype | None = None,
    param_dtype: torch.dtype = torch.float32,
    weight_dtype: torch.dtype | None = None,
    index_dtype: torch.dtype = torch.int32,
    has_conv_bias: bool = True,
) -> None:
    """Compile the fused kernel of one serving configuration before graph capture (the batch, pool sizes and
    strides are runtime values). ``dt_dtype``: None is io_dtype; ``param_dtype``: D's, dt_bias's and
    norm_weight's; ``weight_dtype``: the conv weight's and bias's (None: io_dtype; the conv pool has io_dtype).
    Without a usable TileLang device the call only validates its arguments."""
    check_ints((("heads", heads), ("dim", dim), ("dstate", dstate), ("ngroups", ngroups), ("width", width)))
    if heads % ngroups:
        bad_arg("ngroups", ngroups, f"a divisor of heads ({heads})")
    hp = heads * dim
    if norm_group_size is not None and (isinstance(norm_group_size, bool) or not isinstance(norm_group_size, int)
                                        or norm_group_size < 1 or hp % norm_group_size):  # fmt: skip
        bad_arg("norm_group_size", norm_group_size, f"None or a positive divisor of heads * dim ({hp})")
    dt_dtype = io_dtype if dt_dtype is None else dt_dtype
    weight_dtype = io_dtype if weight_dtype is None else weight_dtype
    check_dtypes((("io_dtype", io_dtype, IO_DTYPES), ("state_dtype", state_dtype, STATE_DTYPES),
                  ("dt_dtype", dt_dtype, (torch.float32, io_dtype)), ("param_dtype", param_dtype, PARAM_DTYPES),
                  ("weight_dtype", weight_dtype, IO_DTYPES), ("index_dtype", index_dtype, INDEX_DTYPES)))  # fmt: skip
    prewarm("decode_step", heads=heads, dim=dim, dstate=dstate, ngroups=ngroups, width=width,
            norm_group_size=hp if norm_group_size is None else norm_group_size, io_dtype=io_dtype,
            state_dtype=state_dtype, dt_dtype=dt_dtype, param_dtype=param_dtype, weight_dtype=weight_dtype,
            index_dtype=index_dtype, has_conv_bias=bool(has_conv_bias))  # fmt: skip


__all__ = ["mamba2_decode_step", "prewarm_mamba2_decode_step"]
