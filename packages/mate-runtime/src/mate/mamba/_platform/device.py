"""Device neutrality in one place: CUDA and MUSA are reached through ``torch.get_device_module``.

Nothing else in MATE names ``torch.cuda`` or ``torch.musa`` directly, so one code path serves NVIDIA and
Moore Threads GPUs (torch_musa registers the ``"musa"`` device type with the same module interface).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from mate.mamba._platform import settings

ACCELERATOR_TYPES = ("cuda", "musa")


def is_accelerator(device: torch.device) -> bool:
    return device.type in ACCELERATOR_TYPES


def device_module(device: torch.device | str):
    """``torch.cuda`` or ``torch.musa`` for a device."""
    return torch.get_device_module(torch.device(device))


def default_accelerator() -> torch.device | None:
    """The current accelerator device when one is usable, else None (checked without initialising a context
    on machines that have none)."""
    for kind in ACCELERATOR_TYPES:
        mod = getattr(torch, kind, None)
        try:
            if mod is not None and mod.is_available():
                return torch.device(kind, mod.current_device())
        except Exception:  # a half-installed torch_musa reports through exceptions
            continue
    return None


def is_capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is capturing a graph."""
    if not is_accelerator(device):
        return False
    return bool(device_module(device).is_current_stream_capturing())


def graph_class(device: torch.device):
    """``torch.cuda.CUDAGraph`` / ``torch.musa.MUSAGraph``."""
    mod = device_module(device)
    return getattr(mod, "CUDAGraph", None) or mod.MUSAGraph


def graph_context(device: torch.device):
    """``torch.cuda.graph`` / ``torch.musa.graph``."""
    return device_module(device).graph


_SM_COUNTS: dict = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of an accelerator (cached: read once per device)."""
    key = (device.type, device.index)
    n = _SM_COUNTS.get(key)
    if n is None:
        n = _SM_COUNTS[key] = int(device_module(device).get_device_properties(device).multi_processor_count)
    return n


def synchronize(device: torch.device) -> None:
    if is_accelerator(device):
        device_module(device).synchronize(device)


def tilelang_target(device: torch.device):
    """The TileLang target for a device: sm_90a needs the dict form (warp specialisation and wgmma)."""
    if device.type == "musa":
        return "musa"
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm_{major}{minor}" + ("a" if major in (9, 10) else "")
    return {"kind": "cuda", "arch": arch}


# ------------------------------------------------------------------------ what the planners read of a device


@dataclass(frozen=True)
class Hardware:
    """What the planner reads of a device: its kind, compute-capability major and SM count."""

    kind: str
    major: int
    sms: int


# What a plan assumes for tensors that are not on an accelerator (``mate.mamba.plan_*`` on the CPU): an H200.
PLANNING_DEFAULT = Hardware("cuda", 9, 132)
_HW: dict = {}


def hardware(device: torch.device) -> Hardware:
    hw = _HW.get(device)
    if hw is None:
        if is_accelerator(device):
            major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0
            hw = Hardware(device.type, major, sm_count(device))
        else:
            hw = PLANNING_DEFAULT
        _HW[device] = hw
    return hw


def pdl_for_capability(kind: str, major: int) -> bool:
    """Whether kernels for a device of this kind and compute-capability major build with programmatic dependent
    launch under ``MATE_SSU_PDL`` (NotImplementedError when it is forced on where it cannot run)."""
    setting = settings.get("MATE_SSU_PDL")
    supported = kind == "cuda" and major >= 9
    if setting == "auto":
        return supported
    if setting == "1" and not supported:
        raise NotImplementedError(
            f"MATE_SSU_PDL=1: programmatic dependent launch needs a CUDA device of compute capability 9.0 or "
            f"newer, got {kind} {major}.x"
        )
    return setting == "1"


def pdl_for_arch(arch: str) -> bool:
    """``pdl_for_capability`` for a CUDA compile target such as "sm_90a" (``mate-mamba prewarm --target``)."""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    if not digits:
        raise ValueError(f"target: expected a CUDA arch such as sm_90a, got {arch!r}")
    return pdl_for_capability("cuda", int(digits) // 10)
