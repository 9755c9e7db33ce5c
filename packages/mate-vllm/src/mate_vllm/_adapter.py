"""mate-vllm as MATE's adapter helper knows it (:class:`mate.mamba.adapters.Adapter`): its release, the vLLM
releases it was written against, the settings it reads. Standard library only at import: vLLM imports the
plugin in every process, and the plugin and the ops reach MATE through :func:`adapter` on first use."""

from __future__ import annotations

NAME = "mate-vllm"
ENV_ENABLE = "MATE_VLLM_ENABLE"
ENV_SSU = "MATE_VLLM_SSU_BACKENDS"
ENV_PREFILL = "MATE_VLLM_PREFILL"
ENV_REPLAYSSM = "MATE_VLLM_REPLAYSSM"
ENV_REPLAYSSM_RULE = "MATE_VLLM_REPLAYSSM_RULE"
REPLAYSSM_AUTO = "auto"
ENV_NORM = "MATE_VLLM_NORM"
ENV_CONV1D = "MATE_VLLM_CONV1D"
CONV1D_AUTO = "auto"

_adapter = None


def _replayssm(raw: str) -> str:
    """``MATE_VLLM_REPLAYSSM``: ``auto`` (the rule), or the kernel of every call (``mate`` / ``flashinfer``)."""
    from mate.mamba.settings import on_off

    return REPLAYSSM_AUTO if raw == REPLAYSSM_AUTO else "mate" if on_off(raw) else "flashinfer"


def _conv1d(raw: str) -> str:
    """``MATE_VLLM_CONV1D``: ``auto`` (the measured rule, :data:`mate_vllm.ops.CONV1D_UPDATE_MIN_BATCH`), ``all``
    (1) or ``off`` (0)."""
    from mate.mamba.settings import on_off

    return CONV1D_AUTO if raw == CONV1D_AUTO else "all" if on_off(raw) else "off"


def _path(raw: str) -> str | None:
    return raw or None


def settings() -> tuple:
    """The settings mate-vllm reads (its ``mate.mamba.adapters`` entry point: MATE's settings table and
    ``mate-mamba info`` list them)."""
    from mate.mamba.settings import ON_OFF, Setting, names, on_off

    return (
        Setting(ENV_ENABLE, "0", ON_OFF, "1: the vLLM plugin routes Mamba2 SSU/SSD to MATE.", on_off),
        Setting(
            ENV_SSU,
            "triton,flashinfer",
            None,
            "The vLLM SSU backend names MATE serves (comma-separated; none: leave the registry alone).",
            names,
        ),
        Setting(ENV_PREFILL, "1", ON_OFF, "0: leave vLLM's SSD prefill to vLLM.", on_off),
        Setting(
            ENV_REPLAYSSM,
            REPLAYSSM_AUTO,
            (REPLAYSSM_AUTO, *ON_OFF),
            "Which kernel serves vLLM's --use-replayssm decode on its FlashInfer backend: auto (default) MATE's "
            "replay_state_update for the calls where the measured rule (mate_vllm.replay_rule) names it, FlashInfer's "
            "checkpointing_ssu for the rest; 1 MATE's for every call; 0 FlashInfer's for every call.",
            _replayssm,
        ),
        Setting(
            ENV_REPLAYSSM_RULE,
            "",
            None,
            f"The rule file {ENV_REPLAYSSM}=auto follows (JSON, python -m mate_vllm.replay_rule REPORT --write PATH); "
            "empty: the one shipped with mate-vllm, derived from docs/benchmarks/replay.json.",
            _path,
            keep_case=True,
        ),
        Setting(
            ENV_NORM,
            "0",
            ON_OFF,
            "1: vLLM's gated RMSNorm kernel (layernorm_gated.rms_norm_gated: the Mamba2 mixer's norm of a one-group "
            "layer at TP 1, where vLLM runs its Triton kernel) runs MATE's rms_norm_gated. Off by default: on those "
            "shapes MATE's kernel is 0.61-0.80x vLLM's Triton kernel (H100, docs/benchmarks/norm.md).",
            on_off,
        ),
        Setting(
            ENV_CONV1D,
            CONV1D_AUTO,
            (CONV1D_AUTO, *ON_OFF),
            "Which kernels serve vLLM's causal_conv1d_fn / causal_conv1d_update (ops/causal_conv1d.py and every module "
            "that imported them: the Mamba1/Mamba2 mixers, ShortConv, the GDN/KDA layers): auto (default) MATE's "
            "causal_conv1d_update for one-token calls of at least 64 sequences, where it was measured 2.0-2.6x "
            "faster than vLLM's Triton kernel, vLLM's for the rest (H100, docs/benchmarks/conv1d.md); 1 MATE's "
            "for every call; 0 vLLM's for every call.",
            _conv1d,
        ),
    )


def adapter():
    """mate-vllm's :class:`mate.mamba.adapters.Adapter`, made on first use; ``ImportError`` when MATE does not
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
            package="vllm",
            engine="vLLM",
            tested=("0.33.0",),
            settings=settings,
            status=("version", "ssu", "prefill", "replayssm", "norm", "conv1d"),
        )
    return _adapter
