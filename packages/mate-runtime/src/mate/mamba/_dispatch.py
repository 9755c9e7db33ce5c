"""Dispatch: which backend serves a normalised call, and the call into it.

``"tilelang"`` on a CUDA/MUSA device where TileLang is installed, else ``"torch"`` (the pure-PyTorch
reference). The backends are imported on first use, so ``import mate.mamba`` never imports TileLang.
"""

from __future__ import annotations

import functools
import importlib.util

import torch
from mate.mamba._contract.errors import bad_arg
from mate.mamba._contract.replay import ReplayCall
from mate.mamba._contract.ssd import SSDCall
from mate.mamba._contract.ssu import SSUCall
from mate.mamba._device import is_accelerator

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


def run_ssu(call: SSUCall, backend: str = "auto") -> torch.Tensor:
    """Run a normalised ``selective_state_update`` on the backend ``backend`` resolves to; returns ``y``."""
    if resolve_backend(backend, call.state.device) == "torch":
        from mate.mamba._reference import ssu as naive_ssu

        return naive_ssu.selective_state_update(call)
    from mate.mamba._tilelang import ssu as tl_ssu

    return tl_ssu.selective_state_update(call)


def run_replay(call: ReplayCall, backend: str = "auto") -> torch.Tensor:
    """Run a normalised ``replay_state_update`` on the backend ``backend`` resolves to; returns ``out``."""
    if resolve_backend(backend, call.state.device) == "torch":
        from mate.mamba._reference import replay as naive_replay

        return naive_replay.replay_state_update(call)
    from mate.mamba._tilelang import replay as tl_replay

    return tl_replay.replay_state_update(call)


def run_ssd(call: SSDCall, backend: str = "auto") -> torch.Tensor | None:
    """Run a normalised ``ssd_combined_fwd_varlen`` on the backend ``backend`` resolves to; returns the states
    (None when they were written into ``final_states_out``)."""
    if resolve_backend(backend, call.x.device) == "torch":
        from mate.mamba._reference import ssd as naive_ssd

        return naive_ssd.ssd_combined_fwd_varlen(call)
    from mate.mamba._tilelang import ssd as tl_ssd

    return tl_ssd.ssd_combined_fwd_varlen(call)
