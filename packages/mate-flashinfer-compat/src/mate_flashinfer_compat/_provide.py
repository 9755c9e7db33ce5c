"""Serving MATE's functions inside a real FlashInfer's ``flashinfer.mamba`` (called by the post-import hook that
:mod:`mate_flashinfer_compat._alias` arms, once that package has executed)."""

from __future__ import annotations

import inspect
import sys

from ._adapter import ENV, WARNING, adapter, report_once
from ._names import NOT_SERVED, PROVIDED, SERVED, STANDALONE


def _params(fn) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _version() -> str:
    # flashinfer/__init__ sets __version__ before it imports flashinfer.mamba
    return str(getattr(sys.modules.get("flashinfer"), "__version__", None) or "unknown")


def serve(module, served: dict) -> None:
    """Rebind each name of ``SERVED`` in ``module`` (the real ``flashinfer.mamba``) to MATE's function, through
    the ``mate-flashinfer-compat`` ledger (so :func:`mate_flashinfer_compat.uninstall` puts FlashInfer's back).
    Only the package attribute changes: FlashInfer's implementation submodules and everything else in
    ``flashinfer`` stay FlashInfer's. A name whose signature is not the one MATE reproduces is left to FlashInfer
    with a warning naming the version."""
    from . import mamba as mate_fm

    a = adapter()
    version = _version()
    done = []
    for name in SERVED:
        mine = getattr(mate_fm, name)
        theirs = module.__dict__.get(name)
        if theirs is mine:
            done.append(name)
            continue
        got, want = _params(theirs) if callable(theirs) else None, _params(mine)
        if got != want:
            served[name] = f"flashinfer (its signature {got} differs from FlashInfer 0.7.2's)"
            report_once(
                f"signature-{name}",
                f"mate-flashinfer-compat: FlashInfer {version}'s {PROVIDED}.{name} takes {got}, not FlashInfer "
                f"0.7.2's {want}; MATE does not serve it and FlashInfer's own function stays",
                WARNING,
            )
            continue
        a.ledger.set_entry(module.__dict__, f"{PROVIDED}.{name}", name, mine)
        served[name] = "mate"
        done.append(name)
    if not done:
        return
    note = (
        ""
        if a.is_tested(version)
        else f" (FlashInfer {version}: not a version this adapter was checked against; same signature)"
    )
    rest = [n for n in STANDALONE + NOT_SERVED if n in module.__dict__]
    report_once(
        "served",
        f"mate-flashinfer-compat: {', '.join(f'{PROVIDED}.{n}' for n in done)} is MATE's inside FlashInfer "
        f"{version} ({getattr(module, '__file__', None)}){note}; FlashInfer serves the rest of flashinfer "
        f"({', '.join(rest)}, attention, ...). {ENV}=off leaves all of it to FlashInfer.",
    )
