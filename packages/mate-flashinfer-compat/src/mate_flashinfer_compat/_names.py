"""Which of FlashInfer 0.7.2's ``flashinfer.mamba`` names MATE serves (standard library only: the start-up hook
and the alias finder read it without importing torch)."""

from __future__ import annotations

# FlashInfer's Mamba package, and MATE's package shaped like it.
PROVIDED = "flashinfer.mamba"
TARGET = "mate_flashinfer_compat.mamba"

# flashinfer.mamba names that MATE serves with FlashInfer's exact contract (signature, defaults, semantics), in
# its own package and inside a real FlashInfer's flashinfer.mamba.
SERVED = ("selective_state_update",)
# flashinfer.mamba names that MATE serves with FlashInfer's contract only where no real FlashInfer is installed
# (mate_flashinfer_compat.mamba, and the alias): beside one they stay FlashInfer's, whose ReplaySSM kernel is
# faster than MATE's on the H200.
STANDALONE = ("checkpointing_ssu", "allocate_checkpointing_ssu_scratch", "replayssm_materialize")
# FlashInfer's other public flashinfer.mamba names (its __all__, and the CuTe DSL prefill where that imports):
# FlashInfer's alone.
NOT_SERVED = (
    "cake_selective_state_update",
    "SSDCombined",
    "ssd_combined_fwd",
)
# The names of MATE's own flashinfer.mamba-shaped package.
PACKAGE = SERVED + STANDALONE
# Submodules of FlashInfer's flashinfer.mamba package that have a MATE counterpart.
SUBMODULES = ("selective_state_update", "checkpointing_ssu", "replayssm_materialize")


def not_served_message(qualname: str) -> str:
    """Why ``qualname`` (``<package>.<name>``) is absent from MATE's FlashInfer-shaped package."""
    name = qualname.rsplit(".", 1)[-1]
    what = "a part of FlashInfer's flashinfer.mamba" if name in NOT_SERVED else "not a flashinfer.mamba name"
    return (
        f"{qualname}: {what} that MATE does not serve; mate-flashinfer-compat serves only "
        f"{', '.join(PACKAGE)}. Install flashinfer-python for the rest: beside it, MATE_FLASHINFER_COMPAT=auto "
        "serves MATE's functions inside the real flashinfer.mamba and leaves every other one to FlashInfer."
    )
