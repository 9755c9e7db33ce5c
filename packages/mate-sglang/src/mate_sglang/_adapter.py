"""mate-sglang as MATE's adapter helper knows it (:class:`mate.mamba.adapters.Adapter`): its release, the SGLang
releases it was written against, the settings it reads. Standard library only at import: the ``.pth`` line
imports the hook in every interpreter, and the hook and the ops reach MATE through :func:`adapter` on first
use."""

from __future__ import annotations

NAME = "mate-sglang"
ENV_ENABLE = "MATE_SGLANG_ENABLE"
ENV_SSU = "MATE_SGLANG_SSU_BACKENDS"
ENV_PREFILL = "MATE_SGLANG_PREFILL"
ENV_CONV1D = "MATE_SGLANG_CONV1D"

_adapter = None


def settings() -> tuple:
    """The settings mate-sglang reads (its ``mate.mamba.adapters`` entry point: MATE's settings table and
    ``mate-mamba info`` list them)."""
    from mate.mamba.settings import ON_OFF, Setting, names, on_off

    return (
        Setting(ENV_ENABLE, "0", ON_OFF, "1: arm the SGLang hook in every interpreter.", on_off),
        Setting(
            ENV_SSU,
            "triton,flashinfer",
            None,
            "The SGLang --mamba-backend names MATE serves (comma-separated; none: leave the registry alone).",
            names,
        ),
        Setting(ENV_PREFILL, "1", ON_OFF, "0: leave SGLang's SSD prefill to SGLang.", on_off),
        Setting(
            ENV_CONV1D,
            "0",
            ON_OFF,
            "1: SGLang's causal conv1d functions (kernels/ops/mamba/causal_conv1d_triton.py, "
            "srt/layers/attention/mamba/causal_conv1d.py and every module that imported them) run MATE's. Off by "
            "default until MATE's conv1d kernels are measured against SGLang's (docs/benchmarks/conv1d.md).",
            on_off,
        ),
    )


def adapter():
    """mate-sglang's :class:`mate.mamba.adapters.Adapter`, made on first use; ``ImportError`` when MATE does not
    import."""
    global _adapter
    if _adapter is None:
        try:
            from mate.mamba.adapters import Adapter
        except Exception as e:  # noqa: BLE001  (MATE fails before its helper can say how: the cause is in e)
            raise ImportError(f"{NAME}: the MATE runtime is missing, or installed but broken: {e!r}") from e
        from . import __version__

        _adapter = Adapter(
            NAME,
            __version__,
            package="sglang",
            engine="SGLang",
            tested=("0.5.23",),
            settings=settings,
            status=("version", "ssu", "choices", "prefill", "conv1d"),
        )
    return _adapter
