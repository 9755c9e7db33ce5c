"""Shape registry for the benchmarks: the decode shapes (per tensor-parallel rank; ``docs/benchmarks/ssu.md``) and the
prefill models, served at their tensor-parallel sizes and expanded into per-rank cases."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SSUShape:
    name: str
    heads: int
    dim: int
    dstate: int
    groups: int


SSU_SHAPES = {
    # the headline shape of the targets: Nemotron-H 8B at TP1 (and Nemotron 3 Super per rank)
    "nemotron-h-8b": SSUShape("nemotron-h-8b", 128, 64, 128, 8),
    "nemotron-3-nano": SSUShape("nemotron-3-nano", 64, 64, 128, 8),
    "nemotron-h-8b-tp8": SSUShape("nemotron-h-8b-tp8", 16, 64, 128, 1),
    "mamba2-2.7b": SSUShape("mamba2-2.7b", 80, 64, 128, 1),
    "falcon-h1-7b": SSUShape("falcon-h1-7b", 24, 128, 256, 1),
    "p80": SSUShape("p80", 32, 80, 128, 4),
}


# ------------------------------------------------------------------------------------------------------ SSD


@dataclass(frozen=True)
class ServedModel:
    """A Mamba2-layer model as it is served: the whole model's SSD shape and the tensor-parallel sizes it runs at.

    ``chunk_size`` is the model config's, the one the serving engine passes to the prefill."""

    name: str
    heads: int
    dim: int  # head dim P
    dstate: int  # N
    groups: int  # G, the B/C groups
    chunk_size: int
    tp: tuple[int, ...]


@dataclass(frozen=True)
class SSDCase:
    """One rank's shape of a served model at one tensor-parallel size (what one SSD call on that rank sees)."""

    name: str  # "<model>-tp<tp>"
    model: str
    tp: int
    heads: int
    dim: int
    dstate: int
    groups: int
    chunk_size: int


# The models the prefill benchmark covers (whole-model numbers; per-rank shapes come from ssd_cases).
SSD_MODELS = (
    ServedModel("nemotron-h-8b", 128, 64, 128, 8, chunk_size=128, tp=(1, 2)),
    ServedModel("nemotron-h-56b", 256, 64, 256, 8, chunk_size=128, tp=(8,)),
    ServedModel("nemotron-3-nano-30b", 64, 64, 128, 8, chunk_size=128, tp=(1,)),
    ServedModel("nemotron-3-super-120b", 128, 64, 128, 8, chunk_size=128, tp=(8,)),
    ServedModel("nemotron-3-nano-4b", 96, 80, 128, 8, chunk_size=256, tp=(1,)),
    ServedModel("granite-4.0-h-tiny", 48, 64, 128, 1, chunk_size=256, tp=(1,)),
    ServedModel("falcon-h1-7b", 24, 128, 256, 1, chunk_size=256, tp=(1,)),
    ServedModel("mamba2-2.7b", 80, 64, 128, 1, chunk_size=256, tp=(1,)),
    ServedModel("zamba2-7b", 112, 64, 64, 2, chunk_size=256, tp=(1,)),
)


def per_rank(model: ServedModel, tp: int) -> SSDCase:
    """``model``'s shape on one of ``tp`` ranks. Heads split evenly across the ranks; so do the groups, as vLLM's
    Mamba2 mixer shards them, except that a model with one group has it replicated on every rank: per-rank groups
    = max(1, groups // tp). (vLLM serves no other group count that ``tp`` does not divide; neither does this.)"""
    if model.heads % tp:
        raise ValueError(f"{model.name}: {model.heads} heads do not split over tp={tp}")
    if model.groups % tp and model.groups != 1:
        raise ValueError(f"{model.name}: {model.groups} groups do not split over tp={tp}")
    return SSDCase(
        f"{model.name}-tp{tp}", model.name, tp, model.heads // tp, model.dim, model.dstate,
        max(1, model.groups // tp), model.chunk_size,
    )  # fmt: skip


def ssd_cases(models=SSD_MODELS) -> dict[str, SSDCase]:
    """Every (model, tp) of ``models`` as a per-rank case, by name, in registry order."""
    return {c.name: c for c in (per_rank(m, tp) for m in models for tp in m.tp)}


SSD_CASES = ssd_cases()


def ssd_case(name: str) -> SSDCase:
    """A case by its name, or by a model's name (that model at its smallest tensor-parallel size)."""
    if name in SSD_CASES:
        return SSD_CASES[name]
    for m in SSD_MODELS:
        if m.name == name:
            return per_rank(m, min(m.tp))
    raise KeyError(f"no SSD case or model {name!r}; the cases: {', '.join(SSD_CASES)}")


# Prefill batches, sequence lengths per call. The registry's five: one long prompt, one very long one, a batch of
# mid-length prompts, many short ones, and a ragged mix with a one-token sequence (a decode riding along).
SSD_BATCHES = {
    "1x8192": [8192],
    "1x32768": [32768],
    "16x1024": [1024] * 16,
    "64x64": [64] * 64,
    "ragged5": [137, 4000, 1, 900, 3000],
    # the --quick plan's batch and the tools' reference points
    "8x2048": [2048] * 8,
    "32x512": [512] * 32,
    # prefix caching (vLLM 0.33 --mamba-cache-mode align; cache blocks of 400 tokens, as in vLLM's own example):
    # 8 prompts continuing after 800 cached tokens with 2000 new ones; "cont" returns the final states only,
    # "align" also ends a chunk at each prefill checkpoint (absolute token 2400, off the chunk grid) and returns
    # every chunk's state, as vLLM's mixer then asks (SSD_LAYOUTS)
    "cont8x2000": [2000] * 8,
    "align8x2000": [2000] * 8,
}
REGISTRY_BATCHES = ("1x8192", "1x32768", "16x1024", "64x64", "ragged5")


@dataclass(frozen=True)
class BatchLayout:
    """A batch's tokens already in the cache (``history``), its prefill checkpoints (offsets into the queries, 0
    for none: ``mate.mamba.chunking.chunk_metadata``) and whether the call returns every chunk's state."""

    history: tuple
    checkpoints: tuple | None = None
    intermediate: bool = False


SSD_LAYOUTS = {
    "cont8x2000": BatchLayout(history=(800,) * 8),
    "align8x2000": BatchLayout(history=(800,) * 8, checkpoints=(1600,) * 8, intermediate=True),
}

__all__ = [
    "SSUShape", "SSU_SHAPES", "ServedModel", "SSDCase", "SSD_MODELS", "SSD_CASES", "SSD_BATCHES", "REGISTRY_BATCHES",
    "BatchLayout", "SSD_LAYOUTS", "per_rank", "ssd_cases", "ssd_case",
]  # fmt: skip
