"""Every environment variable MATE reads, in one table: its name, its values, what it does.

MATE's kernels are chosen by the planners from the call alone; the variables here are the few things a user
really chooses: whether the SSU kernels use programmatic dependent launch, whether the kernels' index tables
are checked on the host (a debugging aid), and whether (and where) each
adapter plugs MATE into its engine. Each is parsed once, on first use, by :func:`get`; a malformed value raises
``ValueError`` naming the variable and the values it takes.

This module imports only the standard library: the adapters' start-up hooks (``.pth`` lines, run in every
interpreter) read their switches through it without importing torch.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One environment variable: its parser maps the raw text (``default`` when unset or empty) to a value."""

    name: str
    default: str
    choices: tuple[str, ...] | None  # the accepted spellings (None: ``parse`` decides)
    help: str
    parse: Callable[[str], object] = str
    keep_case: bool = False  # a path: the raw text is not lower-cased before parsing


def _backends(raw: str) -> tuple[str, ...]:
    """A comma-separated list of backend names; ``none``, ``off`` or ``0`` is the empty tuple."""
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    return () if names in ((), ("none",), ("off",), ("0",)) else names


_ON_OFF = ("0", "1", "false", "true", "no", "yes", "off", "on")


def _on_off(raw: str) -> bool:
    return raw in ("1", "true", "yes", "on")


CACHE_OFF = ("off", "none", "0")


def _cache_dir(raw: str) -> str | None:
    """The compiled-kernel cache directory: ``off`` / ``none`` / ``0`` is None (no disk cache); empty is
    ``$XDG_CACHE_HOME/mate``, else ``~/.cache/mate``; ``~`` and ``$VARS`` are expanded."""
    if raw.lower() in CACHE_OFF:
        return None
    if not raw:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(home, "mate")
    return os.path.abspath(os.path.expanduser(os.path.expandvars(raw)))


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "MATE_SSU_PDL",
            "0",
            ("0", "1", "auto"),
            "Programmatic dependent launch for the selective-state-update kernels: 0 off (default), 1 on "
            "(NotImplementedError where the device cannot), auto on for CUDA compute capability 9.0 and newer. "
            "It lets a decode kernel launch while the previous kernel on the stream drains; it helps behind "
            "another kernel that triggers early and costs 0.2-0.4 us behind one that does not.",
        ),
        Setting(
            "MATE_CHECK_INPUTS",
            "0",
            _ON_OFF,
            "1: the TileLang backend also checks the values of the index tables (cu_seqlens, the chunk tables, "
            "seq_idx, slot and buffer indices) on every call, as the reference backend always does. It copies "
            "them to the host (a device sync per call, skipped while a graph is being captured) and sends every "
            "decode call through the full path. A debugging aid; the kernels skip out-of-range entries either way.",
            _on_off,
        ),
        Setting("MATE_VLLM_ENABLE", "0", _ON_OFF, "1: the vLLM plugin routes Mamba2 SSU/SSD to MATE.", _on_off),
        Setting(
            "MATE_VLLM_SSU_BACKENDS",
            "triton,flashinfer",
            None,
            "The vLLM SSU backend names MATE serves (comma-separated; none: leave the registry alone).",
            _backends,
        ),
        Setting("MATE_VLLM_PREFILL", "1", _ON_OFF, "0: leave vLLM's SSD prefill to vLLM.", _on_off),
        Setting(
            "MATE_VLLM_REPLAYSSM",
            "0",
            _ON_OFF,
            "1: vLLM's --use-replayssm decode on its FlashInfer backend runs MATE's replay_state_update instead of "
            "FlashInfer's checkpointing_ssu. Off by default: on the H200 MATE's kernel is slower than FlashInfer's "
            "(docs/ssu-kernels.md, ReplaySSM decode).",
            _on_off,
        ),
        Setting("MATE_SGLANG_ENABLE", "0", _ON_OFF, "1: arm the SGLang hook in every interpreter.", _on_off),
        Setting(
            "MATE_SGLANG_SSU_BACKENDS",
            "triton,flashinfer",
            None,
            "The SGLang --mamba-backend names MATE serves (comma-separated; none: leave the registry alone).",
            _backends,
        ),
        Setting("MATE_SGLANG_PREFILL", "1", _ON_OFF, "0: leave SGLang's SSD prefill to SGLang.", _on_off),
        Setting(
            "MATE_FLASHINFER_COMPAT",
            "auto",
            ("auto", "alias", "off"),
            "FlashInfer's Mamba ops served by MATE. auto: beside a real FlashInfer, flashinfer.mamba."
            "selective_state_update becomes MATE's and the rest stays FlashInfer's; without one, no flashinfer "
            "module (import mate_flashinfer_compat.mamba). alias: also a flashinfer package serving only "
            "flashinfer.mamba where no real FlashInfer is installed. off: never.",
        ),
        Setting(
            "MATE_CACHE_DIR",
            "",
            None,
            "MATE's cache of compiled kernels (a directory; docs/startup.md): a kernel compiled once is loaded "
            "from there by every later process without re-lowering or re-compiling. Empty: $XDG_CACHE_HOME/mate, "
            "else ~/.cache/mate; off: no disk cache (compile in every process).",
            _cache_dir,
            keep_case=True,
        ),
    )
}

_values: dict[str, object] = {}
_overrides: list[dict[str, object]] = []
_lock = threading.Lock()


def parse(name: str, raw: str | None) -> object:
    """The value of setting ``name`` for the raw text ``raw`` (None or blank: the default)."""
    s = SETTINGS[name]
    text = s.default if raw is None or not raw.strip() else raw.strip() if s.keep_case else raw.strip().lower()
    if s.choices is not None and text not in s.choices:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(s.choices)} (default {s.default})")
    return s.parse(text)


def get(name: str) -> object:
    """The value of setting ``name``: an enclosing :func:`override`'s, else the environment's, read once."""
    for layer in reversed(_overrides):
        if name in layer:
            return layer[name]
    try:
        return _values[name]
    except KeyError:
        pass
    with _lock:
        if name not in _values:
            _values[name] = parse(name, os.environ.get(name))
        return _values[name]


@contextlib.contextmanager
def override(**values: str) -> Iterator[None]:
    """Within the block, read the settings named (by variable name) as if the environment said ``values``
    (tests and the benchmark compare settings in one process). Kernels already planned keep their choice."""
    layer = {name: parse(name, raw) for name, raw in values.items()}
    _overrides.append(layer)
    try:
        yield
    finally:
        _overrides.remove(layer)


def reset() -> None:
    """Forget the values read so far: the next :func:`get` reads the environment again."""
    with _lock:
        _values.clear()


def describe() -> list[tuple[str, str, str]]:
    """(name, value in force, help) of every setting, for ``mate-mamba info``."""
    rows = []
    for name, s in SETTINGS.items():
        try:
            value = str(os.environ.get(name) or s.default)
            parse(name, os.environ.get(name))
        except ValueError as exc:
            value = f"invalid ({exc})"
        rows.append((name, value, s.help))
    return rows


__all__ = ["SETTINGS", "Setting", "describe", "get", "override", "parse", "reset"]
