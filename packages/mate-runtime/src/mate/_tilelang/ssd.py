"""TileLang launcher for ``ssd_combined_fwd_varlen``: one normalised :class:`SSDCall` -> kernel launches.

Three launches with the default ``lean`` design and ``prepass`` (two with ``fused``):
    1. ``ssd_runs_kernel`` derives, on the GPU, the chunk range of each CTA row (runs of chunks with one
       ``seq_idx``) and the chunk -> state-row map of the returned/pool states;
    2. ``ssd_fused_kernel`` walks each run's chunks per (head, P-block) with the fp32 state in registers and
       writes ``out`` and the requested chunk-end states. In the ``lean`` and ``prepass`` designs
       (``MATE_SSD_KERNEL``, see :func:`variant`) ``ssd_dt_kernel`` first computes every tile's ``dt'``, cumsum
       and bounds (lean: also the per-row decay factors) in parallel, and the fused kernel's producer warpgroup
       loads them with the x/B/C tiles.

Scratch (the run bounds, the state-row map, staging copies of inputs the kernels cannot read in place)
comes from the workspace cache, so a steady-state call allocates only the returned state tensor. Nothing is
read back to the host: the call captures into a CUDA graph once its kernels are compiled (``prewarm``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import torch

from .._device import is_accelerator, sm_count
from ..mamba._ssd_call import SSDCall
from .cache import CACHE
from .compile_check import CompileItem
from .workspace import WORKSPACE

_DT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int32: "int32",
       torch.int64: "int64"}  # fmt: skip
PASS_CONFIGS: dict = {}
PREWARM_HINT = (
    "mate.mamba.prewarm_ssd_combined_fwd_varlen(heads=..., groups=..., dim=..., dstate=..., chunk_size=..., "
    "io_dtype=..., state_dtype=..., dt_dtype=...)"
)
SMEM_LIMIT = 227 * 1024 - 2048  # the opt-in maximum per block, less static shared memory (barriers)
SUPPORTED_DSTATE = (64, 128, 256)
MAX_SEQUENCES = 65535  # grid z

_dummies: dict = {}


def _kmod():
    import mate_kernels.ssd as kmod

    return kmod


KERNEL_ENV = "MATE_SSD_KERNEL"
VARIANTS = ("fused", "prepass", "lean")
PREPASS_VARIANTS = ("prepass", "lean")  # the designs fed by the dt pre-pass
DEFAULT_VARIANT = "lean"  # measured fastest on the H200 (docs/benchmarks/ssd.md)


_override: list[str] = []  # set by ``using`` (tests and the benchmark compare the variants in one process)


def variant() -> str:
    """The prefill kernel design: ``MATE_SSD_KERNEL`` = ``lean`` (default: a parallel pre-pass computes every
    tile's dt', cumsum, per-row decay factors and bounds, the fused kernel's producer loads them, and the
    consumers run a trimmed per-tile instruction stream: uniform tests, branch-free mask, TMA output store;
    1.7-2.15x vLLM on Nemotron-H on the H200), ``prepass`` (the same pre-pass without the trimming; about half
    lean's speed) or ``fused`` (the fused kernel's consumers compute dt' and its cumsum per tile; the reference
    design, 10-18 % slower than prepass)."""
    if _override:
        return _override[-1]
    name = os.environ.get(KERNEL_ENV, "").strip().lower() or DEFAULT_VARIANT
    if name not in VARIANTS:
        raise ValueError(f"{KERNEL_ENV}={name!r}: expected one of {', '.join(VARIANTS)}")
    return name


@contextlib.contextmanager
def using(kind: str):
    """Run the enclosed calls (and graph captures) with the prefill kernel ``kind``, whatever the environment."""
    if kind not in VARIANTS:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(VARIANTS)}")
    _override.append(kind)
    try:
        yield
    finally:
        _override.pop()


def _check_supported(dim: int, dstate: int, chunk_size: int, io_dtype: torch.dtype) -> None:
    """Raise NotImplementedError naming the capability when no TileLang SSD kernel can serve the shape."""
    if io_dtype == torch.float32:
        raise NotImplementedError(
            "float32 x/B/C in the TileLang SSD prefill (its tensor-core path takes bf16/fp16 operands) is not "
            "supported by MATE yet; use bf16/fp16 inputs or backend='torch'"
        )
    if chunk_size < 64:
        raise NotImplementedError(
            f"chunk_size={chunk_size} in the TileLang SSD prefill (tiles are 64 or 128 tokens) is not supported "
            "by MATE yet; use chunk_size 64, 128 or 256, or backend='torch'"
        )
    if dstate not in SUPPORTED_DSTATE:
        raise NotImplementedError(
            f"dstate={dstate} in the TileLang SSD prefill (64, 128 or 256) is not supported by MATE yet; "
            "use backend='torch'"
        )
    if dim % 16:
        # The P block is the N of three wgmmas: a multiple of 64 takes the MN-major tiling, another multiple of
        # 16 (e.g. 80) the K-major ``narrow_p`` one; below 16 or off that grid there is no wgmma tile.
        raise NotImplementedError(
            f"dim={dim} in the TileLang SSD prefill (a multiple of 16) is not supported by MATE yet; "
            "use backend='torch'"
        )


def _block_p(dim: int) -> int:
    """The P block: 64 where it divides the head dim (the measured tiling), else the largest multiple of 16 up
    to 128 that divides it (the K-major ``narrow_p`` tiling; 80 for a head dim of 80)."""
    if dim % 64 == 0:
        return 64
    return max(b for b in range(16, 129, 16) if dim % b == 0)


BLOCK_L_ENV = "MATE_SSD_BLOCK_L"
THREADS_ENV = "MATE_SSD_THREADS"
OVERLAP_ENV = "MATE_SSD_OVERLAP"
DT_HEADS_ENV = "MATE_SSD_DT_HEADS"
HPC_ENV = "MATE_SSD_HEADS_PER_CTA"
PRELOAD_ENV = "MATE_SSD_PRELOAD"
RUNS_IN_DT_ENV = "MATE_SSD_RUNS_IN_DT"
SPC_ENV = "MATE_SSD_SEQS_PER_CTA"
PREFETCH_ENV = "MATE_SSD_PREFETCH"
DEFERRED_STORE_ENV = "MATE_SSD_DEFERRED_STORE"
# the defaults of the lean design's options, each decided by a same-run measurement on the H200
# (docs/ssd-kernels.md#tuning-knobs-environment)
OVERLAP_DEFAULT = True
PRELOAD_DEFAULT = True
RUNS_IN_DT_DEFAULT = True
DEFERRED_STORE_DEFAULT = True
# the values MATE_SSD_SEQS_PER_CTA may take (an upper bound on the sequences per fused CTA; unset: none)
SPC_ALLOWED = range(1, MAX_SEQUENCES + 1)
DT_HEADS_DEFAULT = 8
# a heads-per-CTA choice must leave at least this many CTAs per SM: fewer, longer CTAs would leave SMs idle
# (one sequence of 128 heads is one wave; grouping its heads would halve the SMs in use)
HPC_MIN_WAVES = 3


def _env_choice(name: str, allowed: tuple[int, ...] | range) -> int | None:
    """An SSD tuning or opt-in variable: None when unset, empty or 0 (the default), else one of ``allowed``
    (ValueError naming the variable otherwise)."""
    raw = os.environ.get(name, "").strip()
    if raw in ("", "0"):
        return None
    if raw.isdigit() and int(raw) in allowed:
        return int(raw)
    spelled = f"{allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) else ", ".join(map(str, allowed))
    raise ValueError(f"{name}={raw!r}: expected 0 (the default) or one of {spelled}")


_option_override: list[dict] = []  # set by ``options`` (the benchmark compares settings in one run)


@contextlib.contextmanager
def options(
    *, overlap: bool | None = None, dt_heads: int | None = None, heads_per_cta: int | None = None,
    preload: bool | None = None, runs_in_dt: bool | None = None, seqs_per_cta: int | None = None,
    prefetch: bool | None = None, deferred_store: bool | None = None,
):  # fmt: skip
    """Plan the enclosed calls' kernels as if ``MATE_SSD_OVERLAP`` / ``MATE_SSD_DT_HEADS`` /
    ``MATE_SSD_HEADS_PER_CTA`` / ``MATE_SSD_PRELOAD`` / ``MATE_SSD_RUNS_IN_DT`` / ``MATE_SSD_SEQS_PER_CTA`` /
    ``MATE_SSD_PREFETCH`` / ``MATE_SSD_DEFERRED_STORE`` were set to these values (None: as the environment
    says)."""
    _option_override.append(
        {"overlap": overlap, "dt_heads": dt_heads, "heads_per_cta": heads_per_cta, "preload": preload,
         "runs_in_dt": runs_in_dt, "seqs_per_cta": seqs_per_cta, "prefetch": prefetch,
         "deferred_store": deferred_store}
    )  # fmt: skip
    try:
        yield
    finally:
        _option_override.pop()


def _setting(name: str, env: str, allowed: tuple[int, ...]):
    """An option's value: the enclosing :func:`options` block's when it sets one, else the environment's
    (:func:`_env_choice`: None when unset)."""
    value = _option_override[-1][name] if _option_override else None
    return _env_choice(env, allowed) if value is None else value


def _flag(name: str, env: str, default: bool | None, requested: bool | None = None) -> bool | None:
    """An on/off option: ``requested`` when given (a build's own tiles: the compile check), else the enclosing
    :func:`options` block's value when it sets one, else ``env`` = 1 / 0, else (unset or empty) ``default``
    (None: the launch decides). ValueError naming the variable on any other value."""
    if requested is not None:
        return requested
    value = _option_override[-1][name] if _option_override else None
    if value is not None:
        return bool(value)
    raw = os.environ.get(env, "").strip()
    if raw == "":
        return default
    if raw in ("0", "1"):
        return raw == "1"
    unset = "per launch" if default is None else int(default)
    raise ValueError(f"{env}={raw!r}: expected 1 (on) or 0 (off); unset: {unset}")


def _pow2_divisors(x: int, n: int, largest: int) -> list[int]:
    """The powers of two up to ``n`` (and ``largest``) that divide ``x``: the group sizes a heads-per-CTA option
    (and the dt pre-pass's heads per CTA) may use."""
    return [d for d in (1, 2, 4, 8, 16) if d <= min(n, largest) and x % d == 0]


def hpc_candidates(kind: str, heads: int) -> list[int]:
    """The heads-per-CTA values a launch of a ``kind`` fused kernel may pick (:func:`heads_per_cta`): [1], or
    under ``MATE_SSD_HEADS_PER_CTA=n`` (or :func:`options`; opt-in: measured slower on the H200 where it applies) for
    the lean design every power of two up to n that divides ``heads``. Prewarm compiles each of them."""
    if kind != "ssd_lean":
        return [1]
    return _pow2_divisors(heads, _setting("heads_per_cta", HPC_ENV, (2, 4, 8)) or 1, 8)


def heads_per_cta(candidates: list[int], heads: int, p_blocks: int, batch: int, sms: int) -> int:
    """Heads per CTA of one launch: the largest of :func:`hpc_candidates` that still leaves ``HPC_MIN_WAVES``
    CTAs per SM (many short sequences: fewer CTA starts and less wave quantisation; one long sequence keeps one
    head per CTA)."""
    return max((d for d in candidates if p_blocks * (heads // d) * batch >= HPC_MIN_WAVES * sms), default=1)


def seqs_per_cta(batch: int, ctas_per_seq: int, sms: int, mean_tiles: int = 1) -> int:
    """Sequences per fused CTA of one launch (the fused kernel reads ``bounds[::k]``): the divisor k of the batch
    (up to ``MATE_SSD_SEQS_PER_CTA`` or :func:`options`; unset: any, 1 turns it off) with the shortest predicted
    makespan, the larger k on a tie. The prediction counts tiles (``block_L`` tokens) on the busiest SM, with one
    CTA per SM (the lean kernel's 384 threads x 168 registers fill one), every sequence ``mean_tiles`` long and a
    CTA start costed as one tile (its first tiles and entering state come from DRAM): ``waves(k) * (k * mean_tiles
    + 1)``,
    ``waves(k) = ceil(ctas_per_seq * batch / k / sms)`` (``ctas_per_seq``: P blocks x head groups). Where one
    sequence's CTAs fill about one wave (Nemotron-H: 128 heads on 132 SMs) that is k = batch: one CTA per head
    walks the whole batch, so every CTA carries the same work whatever the lengths (a ragged batch is not bound
    by its longest sequence and the waves around it). Where they fill a fraction of it (Mamba2-2.7B: 80,
    Falcon-H1: 48 CTAs per sequence) short batches keep one sequence per CTA. A runtime choice: the same kernel
    serves every k."""
    limit = _setting("seqs_per_cta", SPC_ENV, SPC_ALLOWED) or batch
    return _shortest_makespan(batch, min(batch, limit), ctas_per_seq, sms, mean_tiles)


@functools.lru_cache(maxsize=256)
def _shortest_makespan(batch: int, limit: int, ctas_per_seq: int, sms: int, mean_tiles: int) -> int:
    """:func:`seqs_per_cta`'s choice among the divisors of ``batch`` up to ``limit`` (cached: a launch's host
    path)."""

    def makespan(k: int) -> int:
        return -(-ctas_per_seq * (batch // k) // sms) * (k * mean_tiles + 1)

    small = [d for d in range(1, math.isqrt(batch) + 1) if batch % d == 0]
    divisors = [k for k in {*small, *(batch // d for d in small)} if k <= limit]
    return min(divisors, key=lambda k: (makespan(k), -k))


def _overlap(kind: str, tiles: dict) -> bool:
    """Whether a fused kernel issues its wgmmas in two asynchronous pairs (``ssd_fused_kernel(overlap=True)``):
    the lean design at a P block that is a multiple of 64, unless ``tiles`` (the compile check), :func:`options`
    or ``MATE_SSD_OVERLAP=0`` says otherwise (default on since the sixth session's measurement: 3-6 % faster
    in every quick-benchmark cell). The results are the same either way."""
    if kind != "ssd_lean" or tiles.get("narrow_p"):
        return False
    return _flag("overlap", OVERLAP_ENV, OVERLAP_DEFAULT, tiles.get("overlap"))


def _preload(kind: str, tiles: dict) -> bool:
    """Whether the lean kernel loads a CTA's first entering state before its pipelined loop
    (``ssd_fused_kernel(preload=True)``), unless ``tiles`` (the compile check), :func:`options` or
    ``MATE_SSD_PRELOAD=0`` says otherwise (default on since the sixth session's measurement: 2.4-2.7 % faster at
    32 x 512, unchanged at 1 x 8192). The results are the same either way."""
    if kind != "ssd_lean":
        return False
    return _flag("preload", PRELOAD_ENV, PRELOAD_DEFAULT, tiles.get("preload"))


def _deferred_store(kind: str, tiles: dict) -> bool:
    """Whether the lean kernel waits for a full tile's TMA output store just before that shared tile's next write
    instead of right after the store (``ssd_fused_kernel(deferred_store=True)``), unless ``tiles`` (the compile
    check), :func:`options` or ``MATE_SSD_DEFERRED_STORE=0`` says otherwise. The results are the same either
    way."""
    if kind != "ssd_lean":
        return False
    return _flag("deferred_store", DEFERRED_STORE_ENV, DEFERRED_STORE_DEFAULT, tiles.get("deferred_store"))


def _prefetch_setting() -> bool | None:
    """``MATE_SSD_PREFETCH`` (or :func:`options`): True (1), False (0) or None (unset: each launch decides,
    :func:`wants_prefetch`)."""
    return _flag("prefetch", PREFETCH_ENV, None)


def wants_prefetch(spc: int) -> bool:
    """Whether a lean launch uses the kernel with the L2 prefetch of the next entering state: as
    ``MATE_SSD_PREFETCH`` says, else (unset) where the launch walks several sequences per CTA (measured in the
    eighth session with the whole batch per CTA: 32 x 512 632.5 -> 596.3 us at chunk 128, the ragged batch and
    8 x 2048 within -0.2..+0.9 %; the variant is 0.5-2 % slower where a CTA opens one sequence)."""
    setting = _prefetch_setting()
    if setting is not None:
        return setting
    return spc > 1


def _prefetch(kind: str, tiles: dict) -> bool:
    """Whether a lean build has the L2 prefetch (``ssd_fused_kernel(prefetch=True)``): as ``tiles`` (a launch's
    choice, the compile check) says, else as ``MATE_SSD_PREFETCH`` says (off when unset). The results are the
    same either way."""
    if kind != "ssd_lean":
        return False
    return bool(_flag("prefetch", PREFETCH_ENV, None, tiles.get("prefetch")))


def plan(
    dim: int, dstate: int, chunk_size: int, io_dtype: torch.dtype, *, threads: int | None = None,
    block_L: int | None = None,
) -> dict:  # fmt: skip
    """Tile choice of the fused kernel for one shape: block_P, block_L, threads, scores placement, pipeline
    depth; the tile must fit with and without the dt pre-pass (one plan serves both designs). ``threads``
    (consumer threads, 256 or 512) and ``block_L`` (64 or 128) default to the tuning variables
    ``MATE_SSD_THREADS`` / ``MATE_SSD_BLOCK_L``, else 256 and the longest tile that fits. Raises
    NotImplementedError naming the capability when the kernel cannot serve the shape."""
    _check_supported(dim, dstate, chunk_size, io_dtype)
    block_P = _block_p(dim)
    narrow = block_P % 64 != 0
    kmod = _kmod()
    forced = block_L or _env_choice(BLOCK_L_ENV, (64, 128))
    threads = threads or _env_choice(THREADS_ENV, (256, 512)) or 256
    for block_L in (forced,) if forced else (128, 64):
        if chunk_size % block_L:
            continue
        # Scores feed the intra-chunk GEMM from registers only with two consumer warpgroups at 128 tokens (the
        # row-split layout of the score GEMM then matches the A operand's); otherwise from shared memory.
        shared = block_L < 128 or threads != 256
        smem = max(
            kmod.fused_smem_bytes(
                dim_block=block_P,
                dstate=dstate,
                block_L=block_L,
                io_bytes=2,
                num_stages=2,
                scores_in_shared=shared,
                precomputed_dt=pre,
                decay_rows=rows,
                narrow_p=narrow,
                threads=threads,
            )
            for pre, rows in ((False, False), (True, False), (True, True))  # the three designs
        )
        if smem <= SMEM_LIMIT:
            tiles = dict(block_P=block_P, block_L=block_L, threads=threads, scores_in_shared=shared, num_stages=2)
            if narrow:  # (only then, so the measured kernels' build arguments stay as they were)
                tiles["narrow_p"] = True
            return tiles
    raise NotImplementedError(f"the SSD shape P={dim} N={dstate} does not fit the fused kernel's shared memory")


def _fused_key(*, H, G, P, N, L, io, state, init, dt, dtb, D, D_per_dim, cu, sq, softplus, lo, hi, has_dtb, has_D,
               intermediate, kind="ssd_fused"):  # fmt: skip
    return (kind, H, G, P, N, L, io, state, init, dt, dtb, D, D_per_dim, cu, sq, softplus, lo, hi, has_dtb,
            has_D, intermediate)  # fmt: skip


def _fused_builder(key, tiles: dict | None = None):
    """The build function of a fused-kernel key, with the planned tiles (or ``tiles``, for the compile check)."""
    (kind, H, G, P, N, L, io, state, init, dt, dtb, D, D_per_dim, cu, sq, softplus, lo, hi, has_dtb, has_D,
     intermediate) = key  # fmt: skip
    tiles = dict(tiles or plan(P, N, L, getattr(torch, io)))
    # the on/off options as build arguments only when on (so the first measured kernel's arguments and cache
    # key stay as they were)
    for name, on in (
        ("overlap", _overlap(kind, tiles)), ("preload", _preload(kind, tiles)), ("prefetch", _prefetch(kind, tiles)),
        ("deferred_store", _deferred_store(kind, tiles)),
    ):  # fmt: skip
        tiles.pop(name, None)
        if on:
            tiles[name] = True

    def build():
        return _kmod().ssd_fused_kernel(
            heads=H, groups=G, dim=P, dstate=N, chunk_size=L, io_dtype=io, state_dtype=state, init_dtype=init,
            dt_dtype=dt, dt_bias_dtype=dtb, D_dtype=D, cu_dtype=cu, seq_idx_dtype=sq, has_dt_bias=has_dtb,
            dt_softplus=softplus, dt_min=lo, dt_max=hi, has_D=has_D, D_per_dim=D_per_dim, intermediate=intermediate,
            precomputed_dt=kind in ("ssd_prepass", "ssd_lean"), lean=kind == "ssd_lean",
            decay_rows=kind == "ssd_lean", **tiles,
        )  # fmt: skip

    build.tiles = tiles  # part of the in-memory cache key (``_get``)
    return build


def _dt_key(fused_key, runs_key=None) -> tuple:
    """The pre-pass kernel of a ``prepass`` / ``lean`` fused key (heads, chunk, tile, dt options); with
    ``runs_key``, the pre-pass that also computes the runs table (``ssd_dt_kernel(with_runs=True)``): the runs
    key's index dtypes and final-indices flag are appended."""
    (kind, H, _G, P, N, L, io, _st, _init, dt, dtb, _D, _Dpd, cu, sq, softplus, lo, hi, has_dtb, _hD, _i) = fused_key
    block_L = plan(P, N, L, getattr(torch, io))["block_L"]
    key = ("ssd_dt", H, L, block_L, dt, dtb, cu, sq, softplus, lo, hi, has_dtb, kind == "ssd_lean")
    return key if runs_key is None else key + (runs_key[2:],)


DT_DECAY_ROWS = 12  # the position of the decay-rows flag in a pre-pass key


def runs_in_dt(kind: str) -> bool:
    """Whether a ``kind`` call computes the runs table inside the dt pre-pass (one launch fewer) instead of in
    :func:`mate_kernels.ssd.ssd_runs_kernel`: designs with a pre-pass, unless :func:`options` or
    ``MATE_SSD_RUNS_IN_DT=0`` says otherwise (default on since the seventh session's measurement: 1-6 us faster
    in every benchmark cell). The results are the same either way."""
    return kind in PREPASS_VARIANTS and _flag("runs_in_dt", RUNS_IN_DT_ENV, RUNS_IN_DT_DEFAULT)


def _dt_heads(heads: int, requested: int | None = None) -> int:
    """Heads per CTA of the dt pre-pass: the largest power of two up to n dividing ``heads``, n from
    ``requested``, :func:`options` or ``MATE_SSD_DT_HEADS`` (1 for one head per CTA), else
    ``DT_HEADS_DEFAULT`` (8: one 32-byte dt sector per token; 0-1 % faster than one head in every
    quick-benchmark cell of the sixth session)."""
    n = (
        requested
        if requested is not None
        else (_setting("dt_heads", DT_HEADS_ENV, (1, 2, 4, 8, 16)) or DT_HEADS_DEFAULT)
    )
    return max(_pow2_divisors(heads, n, 16))


def _dt_builder(key, heads_per_cta: int | None = None):
    """The build function of a pre-pass key (``heads_per_cta``: see :func:`_dt_heads`)."""
    _, H, L, block_L, dt, dtb, cu, sq, softplus, lo, hi, has_dtb, decay_rows, *runs = key
    hb = _dt_heads(H, heads_per_cta)
    extra = {"heads_per_cta": hb} if hb > 1 else {}  # (one head keeps the first measured kernel's arguments, key)
    with_runs = {}
    if runs:  # (last, fsi, use_fsi) of the runs key: see _dt_key
        ((last, fsi, use_fsi),) = runs
        with_runs = dict(with_runs=True, last_dtype=last, fsi_dtype=fsi, use_final_indices=use_fsi)

    def build():
        return _kmod().ssd_dt_kernel(
            heads=H, chunk_size=L, block_L=block_L, dt_dtype=dt, dt_bias_dtype=dtb, cu_dtype=cu, seq_idx_dtype=sq,
            has_dt_bias=has_dtb, dt_softplus=softplus, dt_min=lo, dt_max=hi, decay_rows=decay_rows, **extra,
            **with_runs,
        )  # fmt: skip

    build.tiles = extra or None  # part of the in-memory cache key (``_get``)
    return build


def _runs_key(sq, last, fsi, use_fsi):
    return ("ssd_runs", sq, last, fsi, use_fsi)


def _runs_builder(key):
    _, sq, last, fsi, use_fsi = key

    def build():
        return _kmod().ssd_runs_kernel(seq_idx_dtype=sq, last_dtype=last, fsi_dtype=fsi, use_final_indices=use_fsi)

    return build


def builder_for(key):
    """The build function of any SSD kernel key."""
    return {
        "ssd_fused": _fused_builder,
        "ssd_prepass": _fused_builder,
        "ssd_lean": _fused_builder,
        "ssd_dt": _dt_builder,
        "ssd_runs": _runs_builder,
    }[key[0]](key)


def builds(key) -> list[tuple]:
    """The (cache key, build function) pairs a launch of ``key`` may use: its kernel and, for a lean fused key
    under ``MATE_SSD_HEADS_PER_CTA``, each heads-per-CTA variant a launch may pick (prewarm compiles them all)."""
    build = builder_for(key)
    if key[0] != "ssd_lean":
        return [(cache_key(key, build), build)]
    P, N, L, io = key[3], key[4], key[5], getattr(torch, key[6])
    setting = _prefetch_setting()
    out = []
    for d in hpc_candidates(key[0], key[1]):
        for pf in [setting] if setting is not None else [False, True]:
            tiles = {**plan(P, N, L, io), "prefetch": pf}
            if d > 1:
                tiles["heads_per_cta"] = d
            b = _fused_builder(key, tiles)
            out.append((cache_key(key, b), b))
    return out


def cache_key(key, build) -> tuple:
    """The in-memory cache key of a kernel key and its build function. A fused kernel's tiles come from plan()
    (the tuning variables included), not from its key: the compiled kernel is cached under both, so a process
    that changes MATE_SSD_THREADS / MATE_SSD_BLOCK_L between calls never launches a kernel built for other tiles
    than the launcher plans with."""
    tiles = getattr(build, "tiles", None)
    return key if tiles is None else key + (tuple(sorted(tiles.items())),)


def _get(key, builder, device):
    build = builder(key)
    return CACHE.get(cache_key(key, build), build, device, prewarm_hint=PREWARM_HINT, pass_configs=PASS_CONFIGS)


def _dummy(kind, device, dtype, shape):
    key = (kind, device, dtype, shape)
    t = _dummies.get(key)
    if t is None:
        t = _dummies[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


def _inner_dense(t: torch.Tensor, inner: int) -> bool:
    """Whether the last ``inner`` dims of ``t`` are laid out densely (row-major)."""
    expected = 1
    for d in range(t.dim() - 1, t.dim() - 1 - inner, -1):
        if t.shape[d] != 1 and t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def _tma_ok(t: torch.Tensor) -> bool:
    """A TMA-read tensor: 16-byte aligned base, dense last dim, every other stride a positive multiple of 16
    bytes. Size-1 dims count too: the TMA descriptor carries their stride as given (DLPack passes it through
    unnormalised), and TileLang's descriptor check rejects a zero or unaligned one at launch (e.g. a 1-token
    call whose x is a row view of an odd-width projection buffer)."""
    es = t.element_size()
    if t.data_ptr() % 16 or t.stride(-1) != 1:
        return False
    return all(t.stride(d) > 0 and (t.stride(d) * es) % 16 == 0 for d in range(t.dim() - 1))


def _stage(skey, name, t: torch.Tensor) -> torch.Tensor:
    buf = WORKSPACE.get(skey, name, tuple(t.shape), t.dtype, t.device)
    buf.copy_(t)
    return buf


def _vec1(t: torch.Tensor, skey, name) -> torch.Tensor:
    return t if t.is_contiguous() else _stage(skey, name, t)


def kernel_keys(call: SSDCall, kind: str | None = None) -> tuple[tuple, ...]:
    """The kernel keys of a call for the variant ``kind`` (default: :func:`variant`): (fused, runs), plus the
    dt pre-pass for ``prepass`` / ``lean``. Works on CPU tensors too: the precompile scripts use it."""
    kind = kind or variant()
    use_fsi = call.final_state_indices is not None
    if call.return_intermediate_states or not use_fsi:
        state_dt = call.state_dtype
    else:
        state_dt = call.final_states_out.dtype
    init_dt = call.initial_states.dtype if call.initial_states is not None else state_dt
    fsi_dt = call.final_state_indices.dtype if use_fsi else call.last_chunk_indices.dtype
    key = _fused_key(
        H=call.heads, G=call.groups, P=call.dim, N=call.dstate, L=call.chunk_size, io=_DT[call.x.dtype],
        state=_DT[state_dt], init=_DT[init_dt], dt=_DT[call.dt.dtype],
        dtb=_DT[call.dt_bias.dtype] if call.dt_bias is not None else "float32",
        D=_DT[call.D.dtype] if call.D is not None else "float32", D_per_dim=not call.D_tied,
        cu=_DT[call.cu_chunk_seqlens.dtype], sq=_DT[call.seq_idx.dtype], softplus=call.dt_softplus,
        lo=float(call.dt_limit[0]), hi=float(call.dt_limit[1]), has_dtb=call.dt_bias is not None,
        has_D=call.D is not None, intermediate=call.return_intermediate_states, kind=f"ssd_{kind}",
    )  # fmt: skip
    rkey = _runs_key(_DT[call.seq_idx.dtype], _DT[call.last_chunk_indices.dtype], _DT[fsi_dt], use_fsi)
    if kind not in PREPASS_VARIANTS:
        return key, rkey
    # (with the runs in the pre-pass the runs key stays in the tuple: the precompile scripts index it; the
    # launcher does not launch it)
    return key, rkey, _dt_key(key, rkey if runs_in_dt(kind) else None)


def ssd_combined_fwd_varlen(call: SSDCall) -> torch.Tensor | None:
    H, G, P, N, L = call.heads, call.groups, call.dim, call.dstate, call.chunk_size
    kind = variant()
    tiles = plan(P, N, L, call.x.dtype)
    dev = call.x.device
    batch, nchunks = call.batch, call.nchunks
    if batch > MAX_SEQUENCES:
        raise NotImplementedError(f"batch={batch} sequences in one TileLang SSD call (at most {MAX_SEQUENCES})")
    if call.tokens == 0:
        raise NotImplementedError("an SSD call with zero tokens in the TileLang SSD prefill")

    use_fsi = call.final_states_out is not None
    if call.return_intermediate_states:
        states = torch.empty((nchunks, H, P, N), dtype=call.state_dtype, device=dev)
        state_dt = call.state_dtype
    elif use_fsi:
        states = call.final_states_out
        state_dt = states.dtype
    else:
        states = torch.empty((batch, H, P, N), dtype=call.state_dtype, device=dev)
        state_dt = call.state_dtype

    skey = ("ssd", H, G, P, N)
    cu = _vec1(call.cu_chunk_seqlens, skey, "cu_chunk_seqlens")
    seq_idx = _vec1(call.seq_idx, skey, "seq_idx")
    last = _vec1(call.last_chunk_indices, skey, "last_chunk_indices")
    fsi = _vec1(call.final_state_indices, skey, "final_state_indices") if use_fsi else last
    key, rkey, *dkey = kernel_keys(call, kind)
    hpc, candidates = 1, hpc_candidates(key[0], H)
    if len(candidates) > 1 and is_accelerator(dev):  # (the SM count is read only when asked for)
        hpc = heads_per_cta(candidates, H, P // tiles["block_P"], batch, sm_count(dev))
    if hpc > 1:
        tiles = {**tiles, "heads_per_cta": hpc}
    spc = 1
    if is_accelerator(dev):  # (the SM count is read only on a device)
        mean_tiles = max(1, -(-call.tokens // (batch * tiles["block_L"])))
        spc = seqs_per_cta(batch, (P // tiles["block_P"]) * (H // hpc), sm_count(dev), mean_tiles)
    if kind == "lean":
        tiles = {**tiles, "prefetch": wants_prefetch(spc) and call.initial_states is not None}
    merged_runs = bool(dkey) and len(dkey[0]) > DT_DECAY_ROWS + 1  # the pre-pass computes the runs table
    runs = None if merged_runs else _get(rkey, _runs_builder, dev)
    kernel = _get(key, lambda k: _fused_builder(k, tiles), dev)  # the tiles this launch is planned with
    D_per_dim = not call.D_tied
    init_dt = key[8]

    x = call.x if _tma_ok(call.x) else _stage(skey, "x", call.x)
    B = call.B if _tma_ok(call.B) else _stage(skey, "B", call.B)
    C = call.C if _tma_ok(call.C) else _stage(skey, "C", call.C)
    dt = call.dt if call.dt.stride(1) == 1 else _stage(skey, "dt", call.dt)
    A = _vec1(call.A, skey, "A")
    dt_bias = (
        _vec1(call.dt_bias, skey, "dt_bias") if call.dt_bias is not None else _dummy("dtb", dev, torch.float32, (H,))
    )
    if call.D is None:
        D = _dummy("D", dev, torch.float32, (H,))
    elif D_per_dim:
        D = _vec1(call.D, skey, "D")
    else:
        D = _vec1(call.D[:, 0], skey, "D")
    flags = 0
    kmod = _kmod()
    # z and out are read / written with plain accesses: any row strides, dense inner dim.
    if call.z is not None:
        z = call.z if _inner_dense(call.z, 1) else _stage(skey, "z", call.z)
        flags |= kmod.FLAG_Z
    else:
        z = _dummy("z", dev, call.x.dtype, (1, H, P))
    if call.initial_states is not None:
        init = (
            call.initial_states if _inner_dense(call.initial_states, 3) else _stage(skey, "init", call.initial_states)
        )
        flags |= kmod.FLAG_INIT
    else:
        init = _dummy("init", dev, _torch_dtype(init_dt), (1, H, P, N))
    # the lean design stores full tiles by TMA: out then needs TMA-compatible strides (else a staging copy)
    out_ok = _tma_ok(call.out) if kind == "lean" else _inner_dense(call.out, 1)
    out = call.out if out_ok else WORKSPACE.get(skey, "out", tuple(call.out.shape), call.out.dtype, dev)
    st = states if _inner_dense(states, 3) else WORKSPACE.get(skey, "states", tuple(states.shape), state_dt, dev)
    staged_states = st is not states
    if staged_states:
        st.copy_(states)  # rows the call does not name keep their values

    bounds = WORKSPACE.get(skey, "bounds", (batch + 1,), torch.int32, dev)
    dest = WORKSPACE.get(skey, "dest", (nchunks,), torch.int32, dev)
    if runs is not None:
        runs(seq_idx, last, fsi, bounds, dest)
    BL = tiles["block_L"]
    if dkey:
        nvt = nchunks * (L // BL)
        rows = 4 if dkey[0][DT_DECAY_ROWS] else 2  # the lean design's pre-pass adds the decay rows
        dtA = WORKSPACE.get(skey, "dtA", (nvt, H, rows, BL), torch.float32, dev)
        tmeta = WORKSPACE.get(skey, "tmeta", (nvt, kmod.META_WIDTH), torch.int32, dev)
        dtpass = _get(dkey[0], _dt_builder, dev)
        if merged_runs:
            dtpass(dt, A, dt_bias, cu, seq_idx, dtA, tmeta, last, fsi, bounds, dest)
        else:
            dtpass(dt, A, dt_bias, cu, seq_idx, dtA, tmeta)
    else:
        dtA = _dummy("dtA", dev, torch.float32, (1, H, 2, BL))
        tmeta = _dummy("tmeta", dev, torch.int32, (1, kmod.META_WIDTH))
    # k sequences per CTA: every k-th run bound (k divides the batch, so the view ends on bounds[batch])
    bounds_k = bounds[::spc] if spc > 1 else bounds
    kernel(x, dt, A, B, C, cu, seq_idx, bounds_k, dest, dt_bias, D, z, init, out, st, dtA, tmeta, flags)
    if out is not call.out:
        call.out.copy_(out)
    if staged_states:
        states.copy_(st)
    return None if use_fsi else states


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def prewarm_keys(*, heads, groups, dim, dstate, chunk_size, io_dtype, state_dtype, dt_dtype, kind=None):
    """The kernels a served model uses: vLLM's flags (dt_softplus, dt_bias, per-head D, default dt_limit, int32
    tables), returning final states and intermediate states, init in the state dtype, for the variant ``kind``
    (default: :func:`variant`). Returns (fused kernel keys, helper keys: the runs kernels and, for the designs
    fed by the pre-pass, the dt pre-pass)."""
    kind = kind or variant()
    io, state = _DT[io_dtype], _DT[state_dtype]
    keys = [
        _fused_key(
            H=heads,
            G=groups,
            P=dim,
            N=dstate,
            L=chunk_size,
            io=io,
            state=state,
            init=state,
            dt=_DT[dt_dtype],
            dtb="float32",
            D="float32",
            D_per_dim=False,
            cu="int32",
            sq="int32",
            softplus=True,
            lo=0.0,
            hi=math.inf,
            has_dtb=True,
            has_D=True,
            intermediate=intermediate,
            kind=f"ssd_{kind}",
        )  # fmt: skip
        for intermediate in (False, True)
    ]
    runs = [_runs_key("int32", "int32", "int32", False), _runs_key("int32", "int32", "int32", True)]
    if kind not in PREPASS_VARIANTS:
        return keys, runs
    if runs_in_dt(kind):  # one pre-pass per runs kernel it stands in for (the runs kernels are not launched)
        return keys, [_dt_key(keys[0], r) for r in runs]
    return keys, runs + [_dt_key(keys[0])]


def prewarm(device, *, heads, groups, dim, dstate, chunk_size, io_dtype, state_dtype, dt_dtype, block_M=None,
            target=None):  # fmt: skip
    """Compile every SSD kernel of one configuration, for the variant in force (``block_M`` is accepted for API
    stability, the tile sizes come from :func:`plan`). With ``target``
    (e.g. ``{"kind": "cuda", "arch": "sm_90a"}``) and no device, compile only. Returns the compiled keys."""
    plan(dim, dstate, chunk_size, io_dtype)
    fkeys, rkeys = prewarm_keys(
        heads=heads, groups=groups, dim=dim, dstate=dstate, chunk_size=chunk_size, io_dtype=io_dtype,
        state_dtype=state_dtype, dt_dtype=dt_dtype,
    )  # fmt: skip
    done = []
    for key in fkeys + rkeys:
        for ck, build in builds(key):
            if device is None:
                CACHE.compile_only(ck, build, target=target, pass_configs=PASS_CONFIGS)
            else:
                CACHE.get(ck, build, device, prewarm_hint=PREWARM_HINT, pass_configs=PASS_CONFIGS)
        done.append(key)
    return done


def _compile_key_worker(key, target):
    """Compile one key in a worker process; errors come back as text (TVM errors do not pickle)."""
    from .cache import compile_prim_func

    try:
        for _ck, build in builds(key):
            compile_prim_func(build(), target=target, pass_configs=PASS_CONFIGS)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[-400:]}"
    return None


def precompile(keys, *, target=None, jobs: int | None = None, log=print) -> None:
    """Compile ``keys`` in parallel worker processes: each fills TileLang's on-disk cache, so this process's
    first use of a key loads it (~0.1 s) instead of compiling (the GPU test and benchmark runs use it)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import os
    import time

    if target is None:
        target = {"kind": "cuda", "arch": "sm_90a"}
    keys = list(dict.fromkeys(keys))
    jobs = jobs or max(1, min(len(keys), (os.cpu_count() or 2)))
    t0 = time.perf_counter()
    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(_compile_key_worker, k, target): k for k in keys}
        for f in cf.as_completed(futs):
            try:
                err = f.result()
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
            if err:
                log(f"precompile FAILED {futs[f]}: {err}")
            else:
                log(f"precompiled {futs[f]} ({time.perf_counter() - t0:.0f}s)")


def compile_grid() -> list[CompileItem]:
    """Representative configurations: chunk 128/256, P 64/128, N 128/256, G 1/8, bf16/fp16 io, fp32/bf16
    state (each fused kernel compiles in ~20-30 s on a 2-core CPU)."""
    grid = [
        # (H, G, P, N, L, io, state, intermediate, D_per_dim)
        (128, 8, 64, 128, 128, "bfloat16", "float32", False, False),
        (128, 8, 64, 128, 256, "bfloat16", "float32", True, False),
        (80, 1, 64, 128, 256, "float16", "bfloat16", False, True),
        (24, 1, 128, 256, 256, "bfloat16", "float32", False, False),
    ]
    items = [
        CompileItem(family="ssd", label="runs int32", build=_runs_builder(_runs_key("int32", "int32", "int32", True)))
    ]
    prepass_grid = [
        (128, 8, 64, 128, 256, "bfloat16", "float32", False, False),
        (24, 1, 128, 256, 256, "float16", "bfloat16", True, True),
    ]
    for kind, rows in (("fused", grid), ("prepass", prepass_grid), ("lean", prepass_grid)):
        items.extend(_compile_items(kind, rows))
    # the K-major tiling of a head dim that is not a multiple of 64 (P 80: 64-token tiles at N 128)
    items.extend(_compile_items("lean", [(32, 4, 80, 128, 256, "bfloat16", "float32", False, False)]))
    # the lean kernel under its tuning and opt-in settings: four consumer warpgroups (MATE_SSD_THREADS=512,
    # scores in shared memory), 4 heads per CTA in one pipelined loop (MATE_SSD_HEADS_PER_CTA), its GEMMs issued
    # in pairs (MATE_SSD_OVERLAP=1)
    key = _fused_key(
        H=128, G=8, P=64, N=128, L=256, io="bfloat16", state="float32", init="float32", dt="float32", dtb="float32",
        D="float32", D_per_dim=False, cu="int32", sq="int32", softplus=True, lo=0.0, hi=math.inf, has_dtb=True,
        has_D=True, intermediate=False, kind="ssd_lean",
    )  # fmt: skip
    plain = plan(64, 128, 256, torch.bfloat16)
    variants = [
        (plan(64, 128, 256, torch.bfloat16, threads=512), "threads 512"),
        ({**plain, "heads_per_cta": 4}, "4 heads per CTA"),
        ({**plain, "overlap": False}, "without overlap"),
        ({**plain, "preload": False}, "without preload"),
        ({**plain, "prefetch": True}, "L2 prefetch"),
        ({**plain, "deferred_store": False}, "output store waited at once"),
    ]
    for tiles, what in variants:
        label = f"lean H128 G8 P64 N128 chunk256 io=bfloat16 state=float32 tile L{tiles['block_L']}xP64 {what}"
        items.append(CompileItem(family="ssd", label=label, build=_fused_builder(key, tiles),
                                 pass_configs=dict(PASS_CONFIGS)))  # fmt: skip
    # the MATE_SSD_DT_HEADS=1 pre-pass (one head per CTA; the default takes 8)
    items.append(CompileItem(family="ssd", label="dt pre-pass H128 chunk256 decay rows 1 head per CTA",
                             build=_dt_builder(_dt_key(key), 1), pass_configs=dict(PASS_CONFIGS)))  # fmt: skip
    # the pre-pass with the runs table (the default; here with final states into a pool by index), and at N 256
    # (64-token tiles: the runs scan over 64 threads)
    rk = _runs_key("int32", "int32", "int64", True)
    items.append(CompileItem(family="ssd", label="dt pre-pass H128 chunk256 decay rows with the runs table",
                             build=_dt_builder(_dt_key(key, rk)), pass_configs=dict(PASS_CONFIGS)))  # fmt: skip
    falcon = key[:1] + (24, 1, 128, 256) + key[5:]  # (H, G, P, N after the kind)
    items.append(CompileItem(family="ssd", label="dt pre-pass H24 chunk256 tile L64 decay rows with the runs table",
                             build=_dt_builder(_dt_key(falcon, _runs_key("int32", "int32", "int32", False))),
                             pass_configs=dict(PASS_CONFIGS)))  # fmt: skip
    return items


def _compile_items(kind: str, rows) -> list[CompileItem]:
    items = []
    for H, G, P, N, L, io, state, inter, dpd in rows:
        key = _fused_key(
            H=H, G=G, P=P, N=N, L=L, io=io, state=state, init=state, dt="float32", dtb="float32", D="float32",
            D_per_dim=dpd, cu="int32", sq="int32", softplus=True, lo=0.0, hi=math.inf, has_dtb=True, has_D=True,
            intermediate=inter, kind=f"ssd_{kind}",
        )  # fmt: skip
        tiles = plan(P, N, L, getattr(torch, io))
        label = (
            f"{kind} H{H} G{G} P{P} N{N} chunk{L} io={io} state={state}{' intermediate' if inter else ''}"
            f"{' D[H,P]' if dpd else ''} tile L{tiles['block_L']}xP{tiles['block_P']}"
        )
        items.append(CompileItem(family="ssd", label=label, build=_fused_builder(key), pass_configs=dict(PASS_CONFIGS)))
        if kind != "fused":
            dkey = _dt_key(key)
            dlabel = f"dt pre-pass H{H} chunk{L} tile L{dkey[3]}{' decay rows' * dkey[DT_DECAY_ROWS]}"
            items.append(CompileItem(family="ssd", label=dlabel, build=_dt_builder(dkey),
                                     pass_configs=dict(PASS_CONFIGS)))  # fmt: skip
    return items


__all__ = [
    "ssd_combined_fwd_varlen",
    "kernel_keys",
    "builder_for",
    "precompile",
    "prewarm",
    "prewarm_keys",
    "compile_grid",
    "plan",
    "variant",
    "using",
    "PASS_CONFIGS",
]
