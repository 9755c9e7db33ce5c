"""Error helpers: one wording for every rejected argument.

Bad input is a ``ValueError`` that names the argument, what it is and what was expected; a valid request
that MATE does not implement yet is a ``NotImplementedError`` that names the capability. Both are raised
before anything is written.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch
from mate.mamba._contract.dtypes import DTYPE_NAMES


def describe(t: Any) -> str:
    """A short description of an argument for error messages: shape, dtype, strides, device."""
    if isinstance(t, torch.Tensor):
        return (
            f"tensor(shape={tuple(t.shape)}, dtype={str(t.dtype).removeprefix('torch.')}, "
            f"stride={tuple(t.stride())}, device={t.device})"
        )
    return repr(t)


class _Shown(str):
    def __repr__(self) -> str:
        return str(self)


def values(t: torch.Tensor, limit: int = 16) -> str:
    """The values of an index table for an error message (a long one elided in the middle)."""
    v = t.tolist()
    if len(v) <= limit:
        return _Shown(v)
    return _Shown(f"[{', '.join(map(str, v[:8]))}, ..., {', '.join(map(str, v[-4:]))}] ({len(v)} entries)")


def bad_arg(name: str, value: Any, expected: str) -> NoReturn:
    raise ValueError(f"{name}: got {describe(value)}; expected {expected}")


def check_tensor(name: str, t, ndims, dtypes, device=None, *, device_of: str) -> None:
    """``t`` is a tensor of ``ndims`` dims (an int, several, or None for any), a dtype of ``dtypes`` and, unless
    ``device`` is None, on ``device`` (``device_of``: the argument that set it); else a ValueError naming ``name``."""
    if not isinstance(t, torch.Tensor):
        bad_arg(name, t, "a torch.Tensor")
    if ndims is not None:
        dims = (ndims,) if isinstance(ndims, int) else tuple(ndims)
        if t.dim() not in dims:
            bad_arg(name, t, f"a {' or '.join(f'{n}-D' for n in dims)} tensor")
    if t.dtype not in dtypes:
        bad_arg(name, t, f"dtype in ({', '.join(str(d).removeprefix('torch.') for d in dtypes)})")
    if device is not None and t.device != device:
        bad_arg(name, t, f"a tensor on {device} ({device_of}'s device)")


def check_dtypes(args) -> None:
    """Each ``(name, dtype, allowed)`` of a prewarm call: the first dtype outside its allowed ones is named."""
    for name, dt, allowed in args:
        if dt not in allowed:
            bad_arg(name, dt, f"one of {tuple(str(d).removeprefix('torch.') for d in allowed)}")


def check_ints(args, least: int = 1) -> None:
    """Each ``(name, value)``: an int (not a bool) of at least ``least`` (1: positive, 0: non-negative)."""
    for name, v in args:
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            bad_arg(name, v, {1: "a positive int", 0: "a non-negative int"}[least])


def check_philox_rounds(philox_rounds, state_dtype: torch.dtype, rounded: tuple) -> None:
    """The prewarm functions' ``philox_rounds``: 0, or > 0 with a state the operation rounds stochastically (one
    of ``rounded``)."""
    if not isinstance(philox_rounds, int) or isinstance(philox_rounds, bool) or philox_rounds < 0:
        bad_arg("philox_rounds", philox_rounds, "a non-negative int (0: no stochastic rounding)")
    if philox_rounds and state_dtype not in rounded:
        names = " or ".join(DTYPE_NAMES[dt] for dt in rounded)
        bad_arg("philox_rounds", philox_rounds, f"0 unless state_dtype is {names} (stochastic rounding)")


def check_jobs(jobs) -> None:
    """The prewarm functions' ``jobs``: None (the cores available) or a positive int."""
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        bad_arg("jobs", jobs, "None (the cores available) or a positive int")


def majority_culprit(quantities: dict[str, list[tuple[str, Any, Any]]]) -> ValueError | None:
    """The error naming the argument that breaks the majority, for a call whose shapes disagree.

    ``quantities`` maps a quantity (``"heads"``) to ``(argument name, argument, its value of the quantity)`` for
    every argument that carries it (value None: the argument is absent or not of a form that shows it). For the
    first quantity on which a strict majority of the arguments agree and some disagree, the first dissenter is
    named; None when every quantity is unanimous or has no strict majority (the first failed check then names
    the argument, as it would anyway)."""
    for quantity, votes in quantities.items():
        votes = [v for v in votes if v[2] is not None]
        counts: dict = {}
        for _, _, value in votes:
            counts[value] = counts.get(value, 0) + 1
        if len(counts) < 2:
            continue
        value, n = max(counts.items(), key=lambda kv: kv[1])
        if 2 * n <= len(votes):
            continue
        agree = ", ".join(name for name, _, v in votes if v == value)
        name, arg, got = next(v for v in votes if v[2] != value)
        return ValueError(f"{name}: got {describe(arg)}; expected {quantity} {value} as in {agree} (it has {got})")
    return None


def unsupported(capability: str, hint: str = "") -> NoReturn:
    msg = f"{capability} is not supported by MATE yet"
    raise NotImplementedError(msg + (f" ({hint})" if hint else ""))
