"""The ``flashinfer.mamba`` import alias: a meta-path finder, installed at start-up by a ``.pth`` line.

Why a finder and not a ``flashinfer/`` directory: two wheels that both ship ``flashinfer/__init__.py`` overwrite
each other's files in ``site-packages`` (pip does not detect it), which would break a real FlashInfer or silently
replace MATE. The finder instead decides at import time, and the decision is visible:

* ``MATE_FLASHINFER_COMPAT=auto`` (default): without a real FlashInfer on ``sys.path``, ``flashinfer`` is a small
  shim package whose only submodule is ``flashinfer.mamba`` (= :mod:`mate_flashinfer_compat.mamba`). With a real
  FlashInfer, nothing is aliased: FlashInfer stays FlashInfer, and a one-time ``UserWarning`` says that MATE is
  not serving ``flashinfer.mamba`` and how to change that.
* ``force``: ``flashinfer.mamba`` is MATE's even beside a real FlashInfer (its other modules stay FlashInfer's).
* ``off``: the finder does nothing.

Stdlib only: it runs in every interpreter of the environment and must not import torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings

ENV = "MATE_FLASHINFER_COMPAT"
_TARGET = "mate_flashinfer_compat.mamba"
_warned = False


def _mode() -> str:
    """``MATE_FLASHINFER_COMPAT``, parsed by ``mate.settings`` (a malformed value: ``ValueError`` naming it)."""
    try:
        from mate import settings  # stdlib only
    except Exception:  # noqa: BLE001  (no usable MATE runtime: alias, so the first call says what is wrong)
        return "auto"
    return settings.get(ENV)


def real_flashinfer_spec():
    """The spec of a real ``flashinfer`` package on ``sys.path`` (found by the path finder), or None."""
    return importlib.machinery.PathFinder.find_spec("flashinfer")


class _ShimLoader(importlib.abc.Loader):
    """``flashinfer``: a package with no files whose only submodule is ``flashinfer.mamba``."""

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__doc__ = (
            "MATE's FlashInfer compatibility shim (mate-flashinfer-compat): only flashinfer.mamba is provided; "
            "install flashinfer-python for the rest of FlashInfer."
        )
        mod.__path__ = []
        mod.__mate_compat__ = True
        return mod

    def exec_module(self, module):
        return None


class _MambaLoader(importlib.abc.Loader):
    """``flashinfer.mamba``: a module re-exporting :mod:`mate_flashinfer_compat.mamba`'s public names."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        target = importlib.import_module(_TARGET)
        for name in target.__all__:
            setattr(module, name, getattr(target, name))
        module.__all__ = list(target.__all__)
        module.__doc__ = target.__doc__
        module.__mate_compat__ = True


class MateFlashInferFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in ("flashinfer", "flashinfer.mamba"):
            return None
        mode = _mode()
        if mode == "off":
            return None
        real = real_flashinfer_spec()
        if fullname == "flashinfer":
            if real is None:
                return importlib.machinery.ModuleSpec("flashinfer", _ShimLoader(), is_package=True)
            if mode == "auto":
                _warn_real(real)
            return None  # the real package
        if real is not None and mode == "auto":
            return None
        return importlib.machinery.ModuleSpec("flashinfer.mamba", _MambaLoader())


def _warn_real(real) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"mate-flashinfer-compat: a real FlashInfer is installed ({real.origin}); flashinfer.mamba is "
        f"FlashInfer's, not MATE's. Set {ENV}=force to serve flashinfer.mamba from MATE (the rest of FlashInfer "
        f"stays FlashInfer's), or {ENV}=off to silence this.",
        stacklevel=3,
    )


_FINDER = MateFlashInferFinder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install_from_env() -> None:
    """What the ``.pth`` line runs: install unless ``MATE_FLASHINFER_COMPAT=off`` (a malformed value installs
    the finder, which raises the ``ValueError`` on the first ``flashinfer`` import instead of at start-up)."""
    if not os.environ.get(ENV):
        # unset: the setting's default (auto), decided without importing anything, since this line runs at
        # the start of every interpreter of the environment
        install()
        return
    try:
        mode = _mode()
    except ValueError:
        mode = None
    if mode != "off":
        install()


def alias_status() -> dict:
    """Where ``flashinfer`` and ``flashinfer.mamba`` resolve in this interpreter, without importing them."""
    real = real_flashinfer_spec()
    mode = _mode()
    mate_serves = _FINDER in sys.meta_path and mode != "off" and (real is None or mode == "force")
    return {
        "mode": mode,
        "finder_installed": _FINDER in sys.meta_path,
        "real_flashinfer": None if real is None else real.origin,
        "flashinfer.mamba": "mate" if mate_serves else ("flashinfer" if real is not None else None),
    }
