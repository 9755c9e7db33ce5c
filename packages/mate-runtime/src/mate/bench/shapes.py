"""Shape registry for the benchmarks (per tensor-parallel rank; ``contracts.md`` §6)."""

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

__all__ = ["SSUShape", "SSU_SHAPES"]
