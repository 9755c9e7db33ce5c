"""The one normalisation point of ``rms_norm_gated`` (the grouped, gated RMSNorm after a Mamba2 mixer's SSM).

Canonical form (M rows, N hidden, G = N / group_size groups): ``x [M, N]`` and ``z [M, N]`` with a dense last dim
and any row stride (the caller's leading dims flattened; a form that cannot be viewed so is copied, as vLLM 0.33's
``rms_norm_gated`` does), ``weight`` / ``bias`` ``[N]`` dense, ``out [M, N]`` new and contiguous in x's dtype,
``shape`` the caller's x shape (the result's).

Semantics (vLLM 0.33 ``rms_norm_gated``, ``is_rms_norm=True``): in fp32, ``g = silu(z) = z * sigmoid(z)``;
``h = x * g`` before the norm when ``norm_before_gate`` is False (Mamba2's choice); per row and group,
``y = h * rsqrt(mean(h^2) + eps) * weight (+ bias)``, then ``y *= g`` when ``norm_before_gate`` is True; only the
stored output is rounded, to x's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import IO_DTYPES, PARAM_DTYPES
from mate.mamba._contract.errors import bad_arg, check_tensor


@dataclass(frozen=True)
class NormCall:
    x: torch.Tensor  # [M, N], stride(1) == 1
    weight: torch.Tensor  # [N] dense
    bias: torch.Tensor | None  # [N] dense
    z: torch.Tensor | None  # [M, N], stride(1) == 1
    out: torch.Tensor  # [M, N] contiguous, x's dtype
    eps: float
    group_size: int
    norm_before_gate: bool
    shape: tuple  # the caller's x shape: the result is out viewed as it

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def hidden(self) -> int:
        return self.x.shape[1]

    @property
    def groups(self) -> int:
        return self.hidden // self.group_size


def _tensor(name, t, dtypes, device):
    check_tensor(name, t, None, dtypes, device, device_of="x")


def _rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    """``t`` as ``[rows, hidden]`` with a dense last dim: a view where one exists, else a copy."""
    t = t.reshape(-1, hidden)
    return t if t.stride(1) == 1 or hidden == 1 else t.contiguous()


def _vector(name, t, hidden, device, optional=False):
    if t is None and optional:
        return None
    _tensor(name, t, PARAM_DTYPES, device)
    if t.shape != (hidden,):
        bad_arg(name, t, f"shape ({hidden},) (x's last dim)")
    return t.contiguous()


def normalize_norm(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True) -> NormCall:
    """Validate a ``rms_norm_gated`` call and return its canonical form (see the module docstring); ``ValueError``
    naming the first bad argument, before anything is allocated or written."""
    _tensor("x", x, IO_DTYPES, None)
    if x.dim() < 1 or x.shape[-1] < 1:
        bad_arg("x", x, "a tensor of at least 1 dim with a non-empty last dim (the normalised features)")
    device, shape, hidden = x.device, tuple(x.shape), x.shape[-1]
    weight = _vector("weight", weight, hidden, device)
    bias = _vector("bias", bias, hidden, device, optional=True)
    if z is not None:
        _tensor("z", z, IO_DTYPES, device)
        if tuple(z.shape) != shape:
            bad_arg("z", z, f"x's shape {shape}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps >= 0):
        bad_arg("eps", eps, "a finite non-negative float")
    if group_size is None:
        group_size = hidden
    elif isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or hidden % group_size:
        bad_arg("group_size", group_size, f"None (the whole row) or a positive divisor of x's last dim ({hidden})")
    if not isinstance(norm_before_gate, bool):
        bad_arg("norm_before_gate", norm_before_gate, "a bool")
    x2 = _rows(x, hidden)
    return NormCall(
        x=x2, weight=weight, bias=bias, z=None if z is None else _rows(z, hidden),
        out=torch.empty(x2.shape, dtype=x.dtype, device=device), eps=float(eps), group_size=group_size,
        norm_before_gate=norm_before_gate, shape=shape,
    )  # fmt: skip


def finish(call: NormCall) -> torch.Tensor:
    """The result: ``out`` in the caller's x shape."""
    return call.out.view(call.shape)


__all__ = ["NormCall", "finish", "normalize_norm"]
