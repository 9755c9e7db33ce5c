"""Error helpers: one wording for every rejected argument.

Bad input is a ``ValueError`` that names the argument, what it is and what was expected; a valid request
that MATE does not implement yet is a ``NotImplementedError`` that names the capability. Both are raised
before anything is written.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch


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


def unsupported(capability: str, hint: str = "") -> NoReturn:
    msg = f"{capability} is not supported by MATE yet"
    raise NotImplementedError(msg + (f" ({hint})" if hint else ""))
