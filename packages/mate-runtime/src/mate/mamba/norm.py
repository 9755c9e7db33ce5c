"""``rms_norm_gated``: the grouped, gated RMSNorm of a Mamba2 mixer (public signature: vLLM 0.33's), and its prewarm.

Eager calls take the dispatcher's fast path, else normalise (``mate.mamba._contract.norm``) and run on a backend;
while ``torch.compile`` traces, the call becomes the ``mate::rms_norm_gated`` custom op (``mate.mamba._ops``, whose
parameter table this signature matches).
"""

from __future__ import annotations

import torch
from mate.mamba._contract.dtypes import IO_DTYPES, PARAM_DTYPES
from mate.mamba._contract.errors import bad_arg, check_dtypes, check_ints, check_jobs
from mate.mamba._contract.norm import normalize_norm
from mate.mamba._dispatch import FastPath, prewarm
from mate.mamba._ops import NORM, trace_norm


def rms_norm_gated(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """The gated RMSNorm over ``x``'s last dim (N features), per group of ``group_size`` features.

    - ``x``: ``[..., N]`` bf16/fp16/fp32 (any strides: a form that is not rows of a dense last dim is copied).
    - ``weight``, ``bias`` (or None): ``[N]`` fp32/bf16/fp16.
    - ``z`` (or None): x's shape, bf16/fp16/fp32; the gate is ``silu(z)``.
    - ``group_size``: a divisor of N (None: N, one group); per TP rank ``heads * head_dim / groups``.
    - ``norm_before_gate``: True ``norm(x) * silu(z)``; False ``norm(x * silu(z))`` (what Mamba2 uses).

    Per row and group, in fp32: ``y = h * rsqrt(mean(h^2) + eps) * weight (+ bias)``. Returns a new tensor of x's
    shape and dtype, rounded once (on the store).
    """
    entry = trace_norm if torch.compiler.is_compiling() else eager_norm  # traced: the custom op
    return entry(x, weight, bias, z, eps, group_size, norm_before_gate, backend)  # mate.mamba._ops.NORM_PARAMS order


# The eager call: the dispatcher's fast path (a call whose metadata equals an earlier one's is rebuilt without
# validation and launched under the plan that call made), else normalise, dispatch and remember.
FAST = FastPath("norm", NORM, normalize_norm)
eager_norm = NORM.entry("eager_norm", FAST, split=True)


def prewarm_rms_norm_gated(
    *,
    hidden: int,
    group_size: int | None = None,
    io_dtype: torch.dtype = torch.bfloat16,
    weight_dtype: torch.dtype = torch.bfloat16,
    z_dtype: torch.dtype | None = None,
    has_z: bool = True,
    has_bias: bool = False,
    norm_before_gate: bool = False,
    jobs: int | None = None,
) -> None:
    """Compile the TileLang kernel of one serving configuration, outside any captured graph (the row count and
    eps are runtime values: one kernel serves every batch). ``z_dtype`` None: x's (``io_dtype``). The defaults are
    a Mamba2 mixer's call (a gate, no bias, ``norm_before_gate=False``). Without a usable TileLang device there
    is nothing to compile and the call only validates its arguments. ``jobs`` as for the other prewarm functions.
    """
    check_ints((("hidden", hidden),))
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size < 1 or hidden % group_size):  # fmt: skip
        bad_arg("group_size", group_size, f"None (the whole row) or a positive divisor of hidden ({hidden})")
    z_dtype = io_dtype if z_dtype is None else z_dtype
    check_dtypes((("io_dtype", io_dtype, IO_DTYPES), ("weight_dtype", weight_dtype, PARAM_DTYPES),
                  ("z_dtype", z_dtype, IO_DTYPES)))  # fmt: skip
    for name, v in (("has_z", has_z), ("has_bias", has_bias), ("norm_before_gate", norm_before_gate)):
        if not isinstance(v, bool):
            bad_arg(name, v, "a bool")
    check_jobs(jobs)
    prewarm(
        "norm", hidden=hidden, group_size=hidden if group_size is None else group_size, io_dtype=io_dtype,
        weight_dtype=weight_dtype, z_dtype=z_dtype if has_z else None, has_bias=has_bias,
        norm_before_gate=norm_before_gate, jobs=jobs,
    )  # fmt: skip


__all__ = ["prewarm_rms_norm_gated", "rms_norm_gated"]
