"""Backend choice: ``"tilelang"`` on a CUDA/MUSA device where TileLang is installed, else ``"torch"``."""

from __future__ import annotations

import functools
import importlib.util

import torch

from ._device import is_accelerator
from ._errors import bad_arg

BACKENDS = ("auto", "tilelang", "torch")


@functools.cache
def tilelang_installed() -> bool:
    """Whether TileLang can be imported, checked without importing it (``import mate.mamba`` stays light)."""
    return importlib.util.find_spec("tilelang") is not None


def resolve_backend(requested: str, device: torch.device) -> str:
    if requested not in BACKENDS:
        bad_arg("backend", requested, f"one of {BACKENDS}")
    if requested == "torch":
        return "torch"
    usable = is_accelerator(device) and tilelang_installed()
    if requested == "auto":
        return "tilelang" if usable else "torch"
    if not is_accelerator(device):
        raise NotImplementedError(
            f"backend='tilelang' runs on CUDA or MUSA tensors, not on {device}; use backend='torch' or 'auto'"
        )
    if not tilelang_installed():
        raise ModuleNotFoundError(
            "backend='tilelang' needs TileLang: pip install 'mate-runtime[cuda]' (NVIDIA) or tilelang-musa (MUSA)"
        )
    return "tilelang"
