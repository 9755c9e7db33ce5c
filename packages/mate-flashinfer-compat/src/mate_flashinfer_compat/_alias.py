"""Where FlashInfer's Mamba names resolve: the start-up hook (run by the ``.pth`` line), the provider hook beside a
real FlashInfer, and the ``flashinfer`` alias package.

``MATE_FLASHINFER_COMPAT`` (parsed by ``mate.mamba.settings``) decides:

* ``auto`` (default): nothing is imported until the process imports ``flashinfer.mamba``. If that is a real
  FlashInfer, a post-import hook (:func:`mate.mamba.adapters.when_imported`) rebinds the package attributes MATE
  serves (``flashinfer.mamba.selective_state_update``) to MATE's functions right after the package executes,
  before whoever imported it reads them; every other FlashInfer name stays FlashInfer's. The implementation
  submodule ``flashinfer.mamba.selective_state_update`` keeps FlashInfer's own function, which is what
  ``cake_selective_state_update`` calls and what a benchmark of FlashInfer's kernel reaches. Without a real
  FlashInfer no ``flashinfer`` module exists (an engine's ``find_spec("flashinfer")`` stays None); code
  written against FlashInfer imports :mod:`mate_flashinfer_compat.mamba`.
* ``alias``: as ``auto`` beside a real FlashInfer (with a warning that the alias was not installed); without
  one, ``flashinfer`` is a package whose only submodule is ``flashinfer.mamba`` (= MATE's package, with its
  ``selective_state_update`` submodule). Any other ``flashinfer`` attribute or submodule raises
  ``AttributeError`` / ``ImportError`` naming MATE and what it serves, so an attention import fails loudly.
* ``off``: nothing is installed.

Why a finder and not a ``flashinfer/`` directory: two wheels that both ship ``flashinfer/__init__.py`` overwrite
each other's files in ``site-packages`` (pip does not detect it). What is served is reported once per process
(logger ``mate_flashinfer_compat``, INFO), and :func:`status` says it at any time.

Standard library only at module level: it runs in every interpreter of the environment and must not import
torch.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types

from ._adapter import ENV, WARNING, adapter, report_once
from ._names import PACKAGE, PROVIDED, SERVED, STANDALONE, SUBMODULES, TARGET, not_served_message

_armed = {"hook": False}
_served: dict = {}  # what the provider hook did in the real flashinfer.mamba: name -> "mate" or why not


def _mode() -> str:
    """``MATE_FLASHINFER_COMPAT`` through ``mate.mamba.settings`` (stdlib only). ``ValueError`` naming a malformed
    value; ``ImportError`` without a MATE runtime."""
    return adapter().setting(ENV)


def real_flashinfer_spec():
    """The spec of a real ``flashinfer`` package on ``sys.path`` (found by the path finder), or None."""
    return importlib.machinery.PathFinder.find_spec("flashinfer")


def _is_alias(module) -> bool:
    return bool(getattr(module, "__mate_alias__", False))


# ----------------------------------------------------------------------------- beside a real FlashInfer


def _on_flashinfer_mamba(module) -> None:
    """Post-import hook on ``flashinfer.mamba``: serve MATE's functions inside a real FlashInfer. It runs inside
    that import, so it never raises: a failure warns and leaves FlashInfer's functions serving."""
    if _is_alias(module):
        return
    try:
        from ._provide import serve

        serve(module, _served)
    except Exception as e:  # noqa: BLE001  (must not take the consumer's `import flashinfer` down)
        _served.update(dict.fromkeys(SERVED, f"flashinfer (serving failed: {e!r})"))
        report_once(
            "serve-failed",
            f"mate-flashinfer-compat: serving flashinfer.mamba from MATE failed and was skipped ({e!r}); "
            "FlashInfer's own functions serve",
            WARNING,
        )


# ----------------------------------------------------------------------------- the alias (no FlashInfer)


_MODULE_DUNDERS = frozenset(
    ("__name__", "__spec__", "__loader__", "__package__", "__path__", "__file__", "__cached__", "__builtins__")
)


def _alias_getattr(qualname: str):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(f"module {qualname!r} has no attribute {name!r}")
        raise AttributeError(not_served_message(f"{qualname}.{name}"))

    return __getattr__


def _alias_message(fullname: str) -> str:
    return (
        f"{fullname}: this flashinfer is MATE's alias ({ENV}=alias, mate-flashinfer-compat), which provides only "
        f"flashinfer.mamba ({', '.join(PACKAGE)}); it is not FlashInfer. Install flashinfer-python for the rest of "
        f"FlashInfer, or unset {ENV} (auto) so that no flashinfer module pretends to exist."
    )


class _ShimLoader(importlib.abc.Loader):
    """``flashinfer``: a package with no files whose only submodule is ``flashinfer.mamba``."""

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__doc__ = (
            "MATE's flashinfer alias (mate-flashinfer-compat, MATE_FLASHINFER_COMPAT=alias): only flashinfer.mamba "
            f"is provided, serving {', '.join(PACKAGE)}; this is not FlashInfer."
        )
        return mod

    def exec_module(self, module):
        module.__mate_alias__ = True
        module.__all__ = ["mamba"]

        def __getattr__(name):
            if name == "mamba":
                return importlib.import_module(PROVIDED)
            if name.startswith("__"):
                raise AttributeError(f"module 'flashinfer' has no attribute {name!r}")
            raise AttributeError(_alias_message(f"flashinfer.{name}"))

        module.__getattr__ = __getattr__
        report_once(
            "alias",
            f"mate-flashinfer-compat: flashinfer is MATE's alias ({ENV}=alias, no real FlashInfer installed); "
            f"flashinfer.mamba serves MATE's {', '.join(PACKAGE)} and nothing else of FlashInfer exists",
        )


class _AliasLoader(importlib.abc.Loader):
    """``flashinfer.mamba`` (a package) and its submodules: the public names of MATE's counterpart module."""

    def __init__(self, target: str, package: bool):
        self.target, self.package = target, package

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        target = importlib.import_module(self.target)
        if self.package:
            # the submodules first, as FlashInfer's __init__ does: importing one binds its name on the package,
            # and the function of the same name must win
            for sub in SUBMODULES:
                importlib.import_module(f"{module.__name__}.{sub}")
        for name, value in vars(target).items():
            if name not in _MODULE_DUNDERS and not (self.package and name == "__getattr__"):
                setattr(module, name, value)
        module.__mate_alias__ = True
        if self.package:
            module.__getattr__ = _alias_getattr(module.__name__)


class MateFlashInferFinder(importlib.abc.MetaPathFinder):
    """Serves ``flashinfer`` and ``flashinfer.mamba[.*]`` under ``alias`` where no real FlashInfer is installed;
    with a malformed switch, raises its ``ValueError`` at the first ``flashinfer`` import."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "flashinfer" and not fullname.startswith("flashinfer."):
            return None
        if fullname == "flashinfer":
            if _mode() != "alias":  # a malformed value raises its ValueError here
                return None
            real = real_flashinfer_spec()
            if real is not None:
                report_once(
                    "alias-beside-real",
                    f"mate-flashinfer-compat: {ENV}=alias, but a real FlashInfer is installed ({real.origin}); it "
                    f"stays FlashInfer and MATE serves {', '.join(SERVED)} inside its flashinfer.mamba, as auto does",
                    WARNING,
                )
                return None
            return importlib.machinery.ModuleSpec("flashinfer", _ShimLoader(), is_package=True)
        if not _is_alias(sys.modules.get("flashinfer")):
            return None  # a real FlashInfer's module
        if fullname == PROVIDED:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(TARGET, package=True), is_package=True)
        if fullname.startswith(PROVIDED + "."):
            sub = fullname[len(PROVIDED) + 1 :]
            if sub in SUBMODULES:
                return importlib.machinery.ModuleSpec(fullname, _AliasLoader(f"{TARGET}.{sub}", package=False))
            raise ImportError(not_served_message(fullname), name=fullname)
        raise ImportError(_alias_message(fullname), name=fullname)


_FINDER = MateFlashInferFinder()


# -------------------------------------------------------------------------------------------- install


def install(mode: str | None = None) -> None:
    """Arm what ``mode`` (default: the switch) asks for, idempotently: the provider hook on ``flashinfer.mamba``
    (``auto``, ``alias``; it fires now if FlashInfer is already imported) and the alias finder (``alias``)."""
    mode = _mode() if mode is None else mode
    if mode == "off":
        return
    if mode == "alias" and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if not _armed["hook"]:
        a = adapter()
        _armed["hook"] = True
        a.when_imported(PROVIDED, _on_flashinfer_mamba)


def uninstall() -> None:
    """Remove the alias finder, drop the pending hook and put FlashInfer's own functions back."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    if _armed["hook"] or _served:
        adapter().restore()
    _armed["hook"] = False
    _served.clear()


def install_from_env() -> None:
    """What the ``.pth`` line runs at every interpreter start; never raises. A malformed switch installs the
    finder, which raises the ``ValueError`` naming the variable at the first ``flashinfer`` import; without a
    MATE runtime nothing can be served and nothing is installed."""
    try:
        # unset: the setting's default (auto), without importing mate.mamba.settings at every interpreter start
        mode = "auto" if not os.environ.get(ENV) else _mode()
    except ValueError:
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        return
    except Exception:  # noqa: BLE001  (no usable MATE runtime; calls into mate_flashinfer_compat.mamba say why)
        return
    try:
        install(mode)
    except Exception:  # noqa: BLE001  (start-up of an unrelated interpreter must never fail here)
        return


def status() -> dict:
    """Where FlashInfer's Mamba names resolve in this interpreter, without importing FlashInfer."""
    try:
        mode = _mode()
    except (ValueError, ImportError) as e:
        mode = f"invalid ({e})"
    real = real_flashinfer_spec()
    fi = sys.modules.get("flashinfer")
    fm = sys.modules.get(PROVIDED)
    served = {}
    # the ReplaySSM names are MATE's only in MATE's alias (no real FlashInfer); beside one they stay FlashInfer's
    alias = (fi is not None and _is_alias(fi)) or (fi is None and real is None and mode == "alias" and _armed["hook"])
    for name in SERVED + (STANDALONE if alias else ()):
        if fm is not None:
            mates = getattr(getattr(fm, name, None), "__module__", "").startswith(TARGET)
            served[name] = "mate" if mates else _served.get(name, "flashinfer")
        elif mode == "off" or not _armed["hook"]:
            served[name] = "flashinfer" if real is not None else None
        elif real is not None:
            served[name] = "mate (when flashinfer.mamba is imported)"
        else:
            served[name] = "mate" if mode == "alias" else None
    if fi is not None:
        flashinfer = "MATE's alias (flashinfer.mamba only)" if _is_alias(fi) else "FlashInfer"
    elif real is not None:
        flashinfer = "FlashInfer"
    elif mode == "alias" and _FINDER in sys.meta_path:
        flashinfer = "MATE's alias (flashinfer.mamba only)"
    else:
        flashinfer = None
    return {
        "mode": mode,
        "real_flashinfer": None if real is None else real.origin,
        "flashinfer": flashinfer,
        "flashinfer.mamba": served,
        "mate_flashinfer_compat.mamba": list(PACKAGE),
    }
