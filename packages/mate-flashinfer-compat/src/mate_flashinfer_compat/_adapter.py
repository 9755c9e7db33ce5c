"""mate-flashinfer-compat as MATE's adapter helper knows it (:class:`mate.mamba.adapters.Adapter`): its release,
the FlashInfer releases whose ``flashinfer.mamba`` contract it reproduces, the setting it reads; and how it reports
what it serves. Standard library only at import: the ``.pth`` line runs the start-up hook in every interpreter,
and the hooks and the functions reach MATE through :func:`adapter` on first use."""

from __future__ import annotations

import warnings

NAME = "mate-flashinfer-compat"
ENV = "MATE_FLASHINFER_COMPAT"

INFO, WARNING = 20, 30  # logging's levels; logging itself is imported only to report
_reported: set = set()
_adapter = None


def settings() -> tuple:
    """The setting mate-flashinfer-compat reads (its ``mate.mamba.adapters`` entry point: MATE's settings table
    and ``mate-mamba info`` list it)."""
    from mate.mamba.settings import Setting

    return (
        Setting(
            ENV,
            "auto",
            ("auto", "alias", "off"),
            "FlashInfer's Mamba ops served by MATE. auto: beside a real FlashInfer, flashinfer.mamba."
            "selective_state_update becomes MATE's and the rest stays FlashInfer's; without one, no flashinfer "
            "module (import mate_flashinfer_compat.mamba). alias: also a flashinfer package serving only "
            "flashinfer.mamba where no real FlashInfer is installed. off: never.",
        ),
    )


def adapter():
    """mate-flashinfer-compat's :class:`mate.mamba.adapters.Adapter`, made on first use; ``ImportError`` when MATE
    does not import."""
    global _adapter
    if _adapter is None:
        try:
            from mate.mamba.adapters import Adapter
        except Exception as e:  # noqa: BLE001  (MATE fails before its helper can say how: the cause is in e)
            raise ImportError(f"{NAME}: the MATE runtime is missing, or installed but broken: {e!r}") from e
        from . import __version__

        _adapter = Adapter(
            NAME, __version__, package="flashinfer", engine="FlashInfer", tested=("0.7.2",), settings=settings
        )
    return _adapter


def report_once(key: str, message: str, level: int = INFO) -> None:
    """One line per process and event: an INFO log for what is served, a warning for what is not as asked."""
    if key in _reported:
        return
    _reported.add(key)
    if level >= WARNING:
        warnings.warn(message, stacklevel=4)
    else:
        import logging

        logging.getLogger("mate_flashinfer_compat").info(message)
