"""Kernel specs: the one value that decides a compiled kernel.

A spec is a frozen, printable record of exactly the arguments one ``mate_kernels`` factory takes. It is at once

* the factory input: ``spec.build()`` calls the factory with ``spec.kwargs()`` and returns the ``T.prim_func``;
* the compiled-kernel cache key (:mod:`mate.mamba._tilelang.cache`): equal specs are one kernel;
* a compile-grid item (:mod:`mate.mamba._tilelang.compile_check`) and what ``mate.mamba.plan_*`` report.

The planners (:mod:`.ssu_plan`, :mod:`.ssd_plan`) are the only code that makes specs from calls, so "which
kernel runs for this call?" has one answer, printable without running anything.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass
from typing import ClassVar

from mate_kernels.ssu import SSUTiling


@dataclass(frozen=True)
class KernelSpec:
    """Base of the per-family specs: ``module.factory(**kwargs())`` builds the kernel."""

    module: ClassVar[str]
    factory: ClassVar[str]
    family: ClassVar[str]

    def kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def build(self):
        """The ``T.prim_func`` of this spec (imports TileLang through the kernel module)."""
        return getattr(importlib.import_module(self.module), self.factory)(**self.kwargs())

    def pass_configs(self) -> dict:
        """TileLang pass configuration the kernel is compiled with."""
        return {}

    def __str__(self) -> str:
        fields = ", ".join(f"{k}={_show(v)}" for k, v in self.kwargs().items())
        return f"{self.factory}({fields})"


def _show(v) -> str:
    if isinstance(v, SSUTiling):
        return (f"Tiling(vec={v.vec}, vecs={v.vecs}, lanes={v.lanes}, rows_per_thread={v.rows_per_thread}, "
                f"threads={v.threads}, block_p={v.block_p})")  # fmt: skip
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v) if isinstance(v, str) else str(v)


# The SSU kernels index only in-range addresses (clamped indices, dummies at index 0), so TileLang's bounds-check
# guards are turned off. The key is looked up through TileLang's enum so a TileLang build without it (the MUSA
# fork) compiles with the guards instead of failing on an unknown pass config.
SSU_PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}
_ssu_pass_configs: dict | None = None


def ssu_pass_configs() -> dict:
    global _ssu_pass_configs
    if _ssu_pass_configs is None:
        try:
            from tilelang.transform import PassConfigKey

            key = getattr(PassConfigKey, "TL_DISABLE_SAFE_MEMORY_ACCESS", None)
        except Exception:  # an older or forked TileLang without the enum
            key = None
        name = getattr(key, "value", key)
        _ssu_pass_configs = dict(SSU_PASS_CONFIGS) if name in SSU_PASS_CONFIGS else {}
    return _ssu_pass_configs


@dataclass(frozen=True)
class SSUSpec(KernelSpec):
    """``mate_kernels.ssu.ssu_kernel``: one decode-step kernel (one-token or packed)."""

    module: ClassVar[str] = "mate_kernels.ssu"
    factory: ClassVar[str] = "ssu_kernel"
    family: ClassVar[str] = "ssu"

    dim: int
    dstate: int
    heads_per_group: int
    state_dtype: str
    io_dtype: str
    dt_dtype: str
    d_dtype: str
    dt_bias_dtype: str
    src_dtype: str
    dst_dtype: str
    meta_dtype: str
    ibuf_dtype: str
    tied: bool
    one_token: bool
    vector_state: bool
    vector_io: bool
    tiling: SSUTiling
    pack_early: bool
    min_blocks: int
    pdl: bool
    philox_rounds: int = 0  # > 0: fp16 stochastic rounding with ``rand_seed``
    staged: bool = False  # the state through shared memory by cp.async, updated one row at a time (block-scaled)

    def pass_configs(self) -> dict:
        return ssu_pass_configs()


@dataclass(frozen=True)
class ReplaySpec(KernelSpec):
    """``mate_kernels.ssu_replay.replay_kernel``: the ReplaySSM decode step (``replay_state_update``)."""

    module: ClassVar[str] = "mate_kernels.ssu_replay"
    factory: ClassVar[str] = "replay_kernel"
    family: ClassVar[str] = "replay"

    dim: int
    dstate: int
    heads_per_group: int
    state_dtype: str
    io_dtype: str
    dt_dtype: str
    slot_dtype: str
    ring_rows: int
    new_rows: int
    tiling: SSUTiling
    min_blocks: int
    philox_rounds: int
    vector_state: bool
    vector_io: bool

    def pass_configs(self) -> dict:
        return ssu_pass_configs()


@dataclass(frozen=True)
class ReplayTableSpec(KernelSpec):
    """``mate_kernels.ssu_replay_table.replay_table_kernel``: the table design's first kernel, each head's token
    table of a ReplaySSM step into the workspace."""

    module: ClassVar[str] = "mate_kernels.ssu_replay_table"
    factory: ClassVar[str] = "replay_table_kernel"
    family: ClassVar[str] = "replay"

    dstate: int
    heads_per_group: int
    io_dtype: str
    dt_dtype: str
    slot_dtype: str
    ring_rows: int
    new_rows: int
    heads_per_cta: int
    warps: int
    vector_io: bool
    pdl: bool

    def pass_configs(self) -> dict:
        return ssu_pass_configs()


@dataclass(frozen=True)
class ReplayRowsSpec(KernelSpec):
    """``mate_kernels.ssu_replay.replay_rows_kernel``: the table design's second kernel, the state rows' work of a
    ReplaySSM step with the table read from the workspace."""

    module: ClassVar[str] = "mate_kernels.ssu_replay"
    factory: ClassVar[str] = "replay_rows_kernel"
    family: ClassVar[str] = "replay"

    dim: int
    dstate: int
    heads_per_group: int
    state_dtype: str
    io_dtype: str
    slot_dtype: str
    ring_rows: int
    new_rows: int
    tiling: SSUTiling
    min_blocks: int
    philox_rounds: int
    vector_state: bool
    vector_io: bool
    pdl: bool

    def pass_configs(self) -> dict:
        return ssu_pass_configs()


@dataclass(frozen=True)
class MaterializeSpec(KernelSpec):
    """``mate_kernels.ssu_materialize.materialize_kernel``: a slot's replayed state written into another slot
    (``materialize_replayed_state``)."""

    module: ClassVar[str] = "mate_kernels.ssu_materialize"
    factory: ClassVar[str] = "materialize_kernel"
    family: ClassVar[str] = "replay"

    dim: int
    dstate: int
    heads_per_group: int
    state_dtype: str
    io_dtype: str
    index_dtype: str
    ring_rows: int
    tiling: SSUTiling
    vector_state: bool
    vector_io: bool
    philox_rounds: int = 0  # > 0: the rows written rounded stochastically with ``rand_seed``

    def pass_configs(self) -> dict:
        return ssu_pass_configs()


@dataclass(frozen=True)
class MaterializeLayersSpec(KernelSpec):
    """``mate_kernels.ssu_materialize.materialize_layers_kernel``: the materialisation over layers whose pools are
    named by per-layer address tables (``materialize_replayed_layers``, FlashInfer's ``replayssm_materialize``)."""

    module: ClassVar[str] = "mate_kernels.ssu_materialize"
    factory: ClassVar[str] = "materialize_layers_kernel"
    family: ClassVar[str] = "replay"

    dim: int
    dstate: int
    heads_per_group: int
    state_dtype: str
    io_dtype: str
    a_dtype: str
    ring_rows: int
    tiling: SSUTiling
    philox_rounds: int = 0  # > 0: the rows written rounded stochastically with ``rand_seed`` (a key per layer)

    def pass_configs(self) -> dict:
        return ssu_pass_configs()


@dataclass(frozen=True)
class SSDScanSpec(KernelSpec):
    """``mate_kernels.ssd.ssd_fused_kernel``: the chunk scan (state carried across chunks in registers). It reads
    dt' and the decay factors the pre-pass wrote, so the dt options live in :class:`SSDDtSpec` alone."""

    module: ClassVar[str] = "mate_kernels.ssd"
    factory: ClassVar[str] = "ssd_fused_kernel"
    family: ClassVar[str] = "ssd"

    heads: int
    groups: int
    dim: int
    dstate: int
    chunk_size: int
    io_dtype: str
    state_dtype: str
    init_dtype: str
    D_dtype: str
    cu_dtype: str
    seq_idx_dtype: str
    has_D: bool
    D_per_dim: bool
    intermediate: bool
    block_P: int
    block_L: int
    num_stages: int
    scores_in_shared: bool
    narrow_p: bool
    prefetch: bool
    split: bool = False


@dataclass(frozen=True)
class SSDCombineSpec(KernelSpec):
    """``mate_kernels.ssd.ssd_combine_kernel``: the split design's hand-over of the run end states."""

    module: ClassVar[str] = "mate_kernels.ssd"
    factory: ClassVar[str] = "ssd_combine_kernel"
    family: ClassVar[str] = "ssd"

    heads: int
    dim: int
    dstate: int


@dataclass(frozen=True)
class SSDStatesSpec(KernelSpec):
    """``mate_kernels.ssd.ssd_run_states_kernel``: the split design's state pass (each run's end state and decay
    from the state recurrence alone)."""

    module: ClassVar[str] = "mate_kernels.ssd"
    factory: ClassVar[str] = "ssd_run_states_kernel"
    family: ClassVar[str] = "ssd"

    heads: int
    groups: int
    dim: int
    dstate: int
    chunk_size: int
    io_dtype: str
    init_dtype: str
    block_P: int
    block_L: int
    num_stages: int


@dataclass(frozen=True)
class SSDDtSpec(KernelSpec):
    """``mate_kernels.ssd.ssd_dt_kernel``: the dt pre-pass (dt', cumsum, decay rows, tile records, runs table)."""

    module: ClassVar[str] = "mate_kernels.ssd"
    factory: ClassVar[str] = "ssd_dt_kernel"
    family: ClassVar[str] = "ssd"

    heads: int
    chunk_size: int
    block_L: int
    dt_dtype: str
    dt_bias_dtype: str
    cu_dtype: str
    seq_idx_dtype: str
    has_dt_bias: bool
    dt_softplus: bool
    dt_min: float
    dt_max: float
    heads_per_cta: int
    last_dtype: str
    fsi_dtype: str
    use_final_indices: bool


@dataclass(frozen=True)
class StateCodecSpec(KernelSpec):
    """``mate_kernels.state_codec.state_codec_kernel``: whole states between a block-scaled quantised pool and the
    fp32 rows the SSD scan reads (``decode``: the initial states) or writes (``encode``: the final states, into the
    pool slots ``index`` names)."""

    module: ClassVar[str] = "mate_kernels.state_codec"
    factory: ClassVar[str] = "state_codec_kernel"
    family: ClassVar[str] = "ssd"

    dim: int
    dstate: int
    qdtype: str
    direction: str
    index_dtype: str
    vector_state: bool
    per_thread: int

    def pass_configs(self) -> dict:
        return ssu_pass_configs()  # every index is guarded in the kernel (slots outside the pool are skipped)


@dataclass(frozen=True)
class NormSpec(KernelSpec):
    """``mate_kernels.norm.norm_kernel``: the gated RMSNorm (``rms_norm_gated``), one CTA per (row, group)."""

    module: ClassVar[str] = "mate_kernels.norm"
    factory: ClassVar[str] = "norm_kernel"
    family: ClassVar[str] = "norm"

    group_size: int
    io_dtype: str
    z_dtype: str
    weight_dtype: str
    bias_dtype: str
    has_z: bool
    has_bias: bool
    norm_before_gate: bool
    vec: int
    threads: int
    chunks: int

    def pass_configs(self) -> dict:
        # every access is in range by construction (a group's pieces are guarded against its end, the grid holds
        # N / group_size groups): TileLang's per-element guards would split the 16-byte accesses into scalars
        return ssu_pass_configs()


__all__ = [
    "KernelSpec",
    "NormSpec",
    "MaterializeSpec",
    "MaterializeLayersSpec",
    "ReplayRowsSpec",
    "ReplaySpec",
    "ReplayTableSpec",
    "SSDCombineSpec",
    "SSDDtSpec",
    "SSDStatesSpec",
    "SSDScanSpec",
    "SSUSpec",
    "SSU_PASS_CONFIGS",
    "StateCodecSpec",
    "ssu_pass_configs",
]


def _conv1d_pass_configs(vec: int) -> dict:
    """The vector form's: every index is in range (the kernel's guards), and TileLang's per-element guards would
    split its 16-byte accesses; the scalar form keeps them."""
    return ssu_pass_configs() if vec > 1 else {}


@dataclass(frozen=True)
class Conv1dUpdateSpec(KernelSpec):
    """``mate_kernels.conv1d.conv1d_update_kernel``: the causal conv1d's decode update (every call form)."""

    module: ClassVar[str] = "mate_kernels.conv1d"
    factory: ClassVar[str] = "conv1d_update_kernel"
    family: ClassVar[str] = "conv1d"

    width: int
    x_dtype: str
    state_dtype: str
    weight_dtype: str
    bias_dtype: str
    slot_dtype: str
    acc_dtype: str
    qsl_dtype: str
    has_bias: bool
    silu: bool
    varlen: bool
    spec_decode: bool
    has_slots: bool
    has_null: bool
    round_via_state: bool
    threads: int
    vec: int = 1  # channels per thread: 1 the scalar form, else 16-byte vector accesses
    group: int = 1  # a sequence's tokens a thread loads before computing them

    def pass_configs(self) -> dict:
        return _conv1d_pass_configs(self.vec)


@dataclass(frozen=True)
class Conv1dFnSpec(KernelSpec):
    """``mate_kernels.conv1d.conv1d_fn_kernel``: the causal conv1d's varlen prefill."""

    module: ClassVar[str] = "mate_kernels.conv1d"
    factory: ClassVar[str] = "conv1d_fn_kernel"
    family: ClassVar[str] = "conv1d"

    width: int
    x_dtype: str
    state_dtype: str
    weight_dtype: str
    bias_dtype: str
    qsl_dtype: str
    slot_dtype: str
    has_bias: bool
    silu: bool
    has_slots: bool
    has_init: bool
    has_null: bool
    threads: int
    block_t: int
    vec: int = 1

    def pass_configs(self) -> dict:
        return _conv1d_pass_configs(self.vec)


__all__ += ["Conv1dFnSpec", "Conv1dUpdateSpec"]


@dataclass(frozen=True)
class DecodeStepSpec(KernelSpec):
    """``mate_kernels.decode_step.decode_step_kernel``: a Mamba2 layer's fused decode step (conv1d update, SSU,
    gated norm), one launch over ``(P / block_p, heads, batch)``."""

    module: ClassVar[str] = "mate_kernels.decode_step"
    factory: ClassVar[str] = "decode_step_kernel"
    family: ClassVar[str] = "decode_step"

    dim: int
    dstate: int
    heads_per_group: int
    heads_per_norm: int
    width: int
    io_dtype: str
    state_dtype: str
    dt_dtype: str
    weight_dtype: str
    bias_dtype: str
    has_bias: bool
    d_dtype: str
    has_D: bool
    dt_bias_dtype: str
    has_dt_bias: bool
    norm_weight_dtype: str
    index_dtype: str
    tiling: SSUTiling
    vector_state: bool

    def pass_configs(self) -> dict:
        return ssu_pass_configs()  # every index is in range (slots outside either pool are skipped)


__all__ += ["DecodeStepSpec"]
