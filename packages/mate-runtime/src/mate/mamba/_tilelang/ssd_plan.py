"""The SSD planner: one normalised :class:`SSDCall` -> the specs of its kernels and the launch choices.

A call with the serial design launches two kernels (:mod:`mate_kernels.ssd`):

1. the dt pre-pass (:class:`SSDDtSpec`) computes every tile's dt', its cumsum, the per-row decay factors and the
   tile records in parallel, and derives on the GPU the runs table (each CTA row's chunk range) and the
   chunk -> state-row map;
2. the chunk scan (:class:`SSDScanSpec`) walks each run's chunks per (head, P block) with the fp32 state in
   registers: a producer warpgroup loads x/B/C and the pre-pass's tiles by TMA, two consumer warpgroups run the
   GEMMs and store ``out`` by TMA and the requested chunk-end states.

With the split design (:mod:`mate_kernels.ssd_split`: few heads per rank on long sequences) the state pass
(:class:`SSDStatesSpec`) and the hand-over (:class:`SSDCombineSpec`) run between the two, over even runs of chunks
that the scan then walks all at once.

A block-scaled quantised pool (int16, int8, fp8-e4m3 with fp32 row scales) meets the scan's fp32 states through
:mod:`mate_kernels.state_codec` (:class:`StateCodecSpec`): quantised ``initial_states`` are decoded into fp32 rows
before the pre-pass, and the final states of a quantised ``final_states_out`` are written by the scan as fp32 rows
per sequence, then encoded into the slots ``final_state_indices`` names. Each moves a state once each way, a few
microseconds beside the prefill (docs/ssd-kernels.md has the measured cost).

What the planner decides, and why (docs/ssd-kernels.md; the alternatives measured: docs/design/decisions.md):

* the design (:func:`split_runs`): the split design's run count where its predicted makespan beats the serial
  scan's, else the serial design; :func:`forcing` holds the planner to one (benchmarks, tests);

* the tile (:func:`tiles`): the P block (64 where it divides the head dim; else the largest multiple of 16 up to
  128 that does, the K-major ``narrow_p`` tiling), the longest token tile (128, else 64) whose shared memory fits,
  scores from registers only at 128-token tiles;
* sequences per CTA (:func:`seqs_per_cta`): the divisor of the batch with the shortest predicted makespan; the
  scan kernel reads ``bounds[::k]`` at run time, so every k is the same compiled kernel;
* the L2 prefetch of the next entering state (:func:`wants_prefetch`): where a CTA walks several sequences;
* the pre-pass's heads per CTA: the largest power of two up to 8 dividing the heads (one 32-byte dt sector per
  token);
* a call without D runs the kernel with D, fed zeros (the launcher's D stand-in): in the scan without D, the
  epilogue reads x_s nowhere after the S x wgmma's wait, so TileLang's pipeline releases x_s to the producer while
  that asynchronous wgmma may still read it (tests/test_ssd_generated_code.py shows it); with D the epilogue's
  ``D * x`` read keeps the release after the wait. One fused multiply-add per element, the same schedule.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import DTYPE_NAMES, QUANT_STATE_DTYPES
from mate.mamba._contract.ssd import SSDCall
from mate.mamba._platform.device import Hardware
from mate.mamba._tilelang.specs import SSDCombineSpec, SSDDtSpec, SSDScanSpec, SSDStatesSpec, StateCodecSpec

H200_SMS = 132  # the SM count prewarm plans for without a device (the compile-only target)
SMEM_LIMIT = 227 * 1024 - 2048  # the opt-in maximum per block, less static shared memory (barriers)
SUPPORTED_DSTATE = (64, 128, 256)
TILELANG_CHUNK_SIZES = (64, 128, 256)
MAX_SEQUENCES = 65535  # grid z
DT_HEADS_PER_CTA = 8  # the pre-pass's largest head group
NUM_STAGES = 2


def _kmod():
    import mate_kernels.ssd as kmod

    return kmod


def _check_supported(dim: int, dstate: int, chunk_size: int, io_dtype: torch.dtype) -> None:
    """Raise NotImplementedError naming the capability when no TileLang SSD kernel can serve the shape."""
    if io_dtype == torch.float32:
        raise NotImplementedError(
            "float32 x/B/C in the TileLang SSD prefill (its tensor-core path takes bf16/fp16 operands) is not "
            "supported by MATE yet; use bf16/fp16 inputs or backend='torch'"
        )
    if chunk_size not in TILELANG_CHUNK_SIZES:
        raise NotImplementedError(
            f"chunk_size={chunk_size} in the TileLang SSD prefill (tiles are 64 or 128 tokens; tested up to 256) is "
            "not supported by MATE yet; use chunk_size 64, 128 or 256, or backend='torch'"
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


def _mn_parts(block_P: int) -> bool:
    """Whether the MN-major tiling splits the P block into a main part and a tail (:func:`mate_kernels.ssd.p_parts`)."""
    try:
        _kmod().p_parts(block_P)
    except ValueError:
        return False
    return True


def _block_p(dim: int) -> int:
    if dim % 64 == 0:
        return 64
    return max(b for b in range(16, 129, 16) if dim % b == 0)


@dataclass(frozen=True)
class Tiles:
    block_P: int
    block_L: int
    scores_in_shared: bool
    narrow_p: bool


@functools.lru_cache(maxsize=256)
def tiles(dim: int, dstate: int, chunk_size: int, io_dtype: torch.dtype) -> Tiles:
    """The scan kernel's tile for one shape (NotImplementedError naming the capability when none serves it)."""
    _check_supported(dim, dstate, chunk_size, io_dtype)
    block_P = _block_p(dim)
    kmod = _kmod()
    if block_P % 64 and _mn_parts(block_P) and chunk_size % 128 == 0 and dstate % 128 == 0:
        # the MN-major tiling with a tail part (80 = 64 + 16) at 128-token tiles, where they fit: the tail's
        # GEMMs split their rows (128 tokens; N for the state GEMM) over the two warpgroups
        smem = kmod.fused_smem_bytes(dim_block=block_P, dstate=dstate, block_L=128, io_bytes=2, num_stages=NUM_STAGES)
        if smem <= SMEM_LIMIT:
            return Tiles(block_P, 128, False, False)
    narrow = block_P % 64 != 0
    for block_L in (128, 64):
        if chunk_size % block_L:
            continue
        # Scores feed the intra-chunk GEMM from registers only at 128 tokens (the row-split layout of the score
        # GEMM then matches the A operand's); otherwise from shared memory.
        shared = block_L < 128
        smem = kmod.fused_smem_bytes(
            dim_block=block_P, dstate=dstate, block_L=block_L, io_bytes=2, num_stages=NUM_STAGES,
            scores_in_shared=shared, narrow_p=narrow,
        )  # fmt: skip
        if smem <= SMEM_LIMIT:
            return Tiles(block_P, block_L, shared, narrow)
    raise NotImplementedError(f"the SSD shape P={dim} N={dstate} does not fit the scan kernel's shared memory")


def dt_heads_per_cta(heads: int) -> int:
    return max(d for d in (1, 2, 4, 8) if d <= DT_HEADS_PER_CTA and heads % d == 0)


def seqs_per_cta(batch: int, ctas_per_seq: int, sms: int, mean_tiles: int = 1) -> int:
    """Sequences per scan CTA: the divisor k of the batch with the shortest predicted makespan, the larger k on a
    tie. The prediction counts tiles on the busiest SM with one CTA per SM (the kernel's 384 threads x 168
    registers fill one), every sequence ``mean_tiles`` long and a CTA start costed as one tile (its first tiles and
    entering state come from DRAM): ``waves(k) * (k * mean_tiles + 1)``, ``waves(k) = ceil(ctas_per_seq * batch /
    k / sms)``. Where one sequence's CTAs fill about one wave (Nemotron-H: 128 heads on 132 SMs) that is k = batch:
    one CTA per head walks the whole batch and carries the same work whatever the lengths; where they fill a
    fraction of it short batches keep one sequence per CTA."""
    return _shortest_makespan(batch, ctas_per_seq, sms, mean_tiles)


@functools.lru_cache(maxsize=256)
def _shortest_makespan(batch: int, ctas_per_seq: int, sms: int, mean_tiles: int) -> int:
    def makespan(k: int) -> int:
        return -(-ctas_per_seq * (batch // k) // sms) * (k * mean_tiles + 1)

    small = [d for d in range(1, math.isqrt(batch) + 1) if batch % d == 0]
    divisors = {*small, *(batch // d for d in small)}
    return min(divisors, key=lambda k: (makespan(k), -k))


def wants_prefetch(spc: int, has_initial_states: bool) -> bool:
    """The scan kernel with the L2 prefetch of the next entering state: where a CTA walks several sequences that
    have initial states (32 x 512: 632.5 -> 596.3 us at chunk 128; 0.5-2 % slower where a CTA opens one)."""
    return spc > 1 and has_initial_states


DESIGNS = ("serial", "split")
# The split design's cost model, in scan tiles (one tile of block_L tokens of one (head, P block) on one SM, the
# unit of seqs_per_cta's model), fitted to the H200 (2026-12-02, docs/benchmarks/ssd.md): the state pass walks
# each run before the scan does at 0.3 of a scan tile per tile (one GEMM of four, no output) plus about two tiles
# per CTA (its pipeline fill and the run's end state), the scan's CTA start is one tile, and the launches it adds
# (the run bounds, the state pass, the hand-over) about one tile.
SPLIT_STATE_TILES = 0.3
SPLIT_CTA_TILES = 3.0
SPLIT_LAUNCH_TILES = 1.0
# With several sequences the plain scan's prediction counts each as long as the mean. Where its CTAs fit in one
# wave that is its best case: the wave waits on the longest sequence, which the planner cannot see without a sync
# (over several waves the scheduler evens the lengths out); the split design's prediction is exact whatever the
# lengths. So there the split design is taken where it is predicted within this margin of the plain scan's best
# case (ragged 137/4000/1/900/3000 at 16 heads: 70.8 us split against 134.6 us plain; 16 x 1024, where the mean
# is the truth, stays plain).
RAGGED_MARGIN = 1.25
MAX_RUNS = 1024
_forced: contextvars.ContextVar = contextvars.ContextVar("mate_ssd_design", default=None)


@contextlib.contextmanager
def forcing(design: str, runs: int | None = None):
    """Plan every SSD call in this context with ``design`` (one of :data:`DESIGNS`) instead of the planner's
    choice; with ``split``, ``runs`` fixes the number of runs (default: the model's best). For benchmarks that
    show both designs and for tests of each; a call the forced design cannot serve raises NotImplementedError."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}; got {design!r}")
    if runs is not None and (design != "split" or runs < 1):
        raise ValueError(f"runs is a positive number of runs of the split design; got {runs!r} with {design!r}")
    token = _forced.set((design, runs))
    try:
        yield
    finally:
        _forced.reset(token)


def serial_makespan(batch: int, ctas_per_seq: int, sms: int, mean_tiles: int) -> int:
    """The plain scan's predicted makespan in tiles (the model of :func:`seqs_per_cta`, at its best k)."""
    k = seqs_per_cta(batch, ctas_per_seq, sms, mean_tiles)
    return -(-ctas_per_seq * (batch // k) // sms) * (k * mean_tiles + 1)


def split_makespan(runs: int, nchunks: int, tiles_per_chunk: int, ctas_per_run: int, sms: int) -> float:
    """The split design's predicted makespan in tiles with ``runs`` even runs of chunks: the waves of runs, each
    as long as its longest run through the state pass and the scan (:data:`SPLIT_STATE_TILES`,
    :data:`SPLIT_CTA_TILES`), plus the launches (:data:`SPLIT_LAUNCH_TILES`)."""
    waves = -(-ctas_per_run * runs // sms)
    tiles_per_run = -(-nchunks // runs) * tiles_per_chunk
    return waves * ((1 + SPLIT_STATE_TILES) * tiles_per_run + SPLIT_CTA_TILES) + SPLIT_LAUNCH_TILES


@functools.lru_cache(maxsize=1024)  # planned on every prefill call: the search runs once per shape
def split_runs(*, batch: int, nchunks: int, tiles_per_chunk: int, ctas_per_run: int, sms: int,
               mean_tiles: int) -> int:  # fmt: skip
    """The design rule: the number of even runs of chunks the split design cuts the call into, or 0 for the plain
    scan (one run per sequence, :func:`seqs_per_cta` of them per CTA). Split where its predicted makespan
    (:func:`split_makespan`, over the run counts that fill up to two waves) beats the plain scan's
    (:func:`serial_makespan`, which counts every sequence as long as the mean; where that is one wave, its best
    case, so there the margin :data:`RAGGED_MARGIN`). Few heads per rank on a long sequence split (H 16 on 132 SMs:
    8 runs; H 64: 2); Nemotron-H 8B (128 heads) never does."""
    serial = serial_makespan(batch, ctas_per_run, sms, mean_tiles)
    k = seqs_per_cta(batch, ctas_per_run, sms, mean_tiles)
    if batch > 1 and ctas_per_run * (batch // k) <= sms:  # one wave of unknown lengths: the mean is its best case
        serial *= RAGGED_MARGIN
    top = min(nchunks, MAX_RUNS, max(1, 2 * sms // ctas_per_run))
    best, best_cost = 0, float(serial)
    for runs in range(2, top + 1):
        cost = split_makespan(runs, nchunks, tiles_per_chunk, ctas_per_run, sms)
        if cost < best_cost:
            best, best_cost = runs, cost
    return best


@functools.lru_cache(maxsize=256)
def best_split_runs(nchunks: int, tiles_per_chunk: int, ctas_per_run: int, sms: int) -> int:
    """The split design's best run count whatever the plain scan would cost (a forced split)."""
    top = min(nchunks, MAX_RUNS, max(2, 2 * sms // ctas_per_run))
    return min(range(2, top + 1), key=lambda r: split_makespan(r, nchunks, tiles_per_chunk, ctas_per_run, sms))


def may_split(heads: int, dim: int, dstate: int, chunk_size: int, io_dtype: torch.dtype, sms: int) -> bool:
    """Whether the rule can pick the split design for some call of this shape (prewarm compiles its kernels only
    then): where one sequence's CTAs fill at most half the SMs."""
    t = tiles(dim, dstate, chunk_size, io_dtype)
    return 2 * heads * (dim // t.block_P) <= sms


def scan_spec(*, H, G, P, N, L, io, state, init, D, D_per_dim, cu, sq, has_D, intermediate,
              prefetch=False, split=False) -> SSDScanSpec:  # fmt: skip
    """The scan kernel's spec (dtype names in; the tile from :func:`tiles`)."""
    t = tiles(P, N, L, getattr(torch, io))
    return SSDScanSpec(
        heads=H, groups=G, dim=P, dstate=N, chunk_size=L, io_dtype=io, state_dtype=state, init_dtype=init,
        D_dtype=D, cu_dtype=cu, seq_idx_dtype=sq, has_D=has_D, D_per_dim=D_per_dim, intermediate=intermediate,
        block_P=t.block_P, block_L=t.block_L, num_stages=NUM_STAGES, scores_in_shared=t.scores_in_shared,
        narrow_p=t.narrow_p, prefetch=prefetch, split=split,
    )  # fmt: skip


def combine_spec(scan: SSDScanSpec) -> SSDCombineSpec:
    return SSDCombineSpec(heads=scan.heads, dim=scan.dim, dstate=scan.dstate)


def states_spec(scan: SSDScanSpec) -> SSDStatesSpec:
    """The split design's state pass before ``scan`` (its tile and input dtypes)."""
    return SSDStatesSpec(
        heads=scan.heads, groups=scan.groups, dim=scan.dim, dstate=scan.dstate, chunk_size=scan.chunk_size,
        io_dtype=scan.io_dtype, init_dtype=scan.init_dtype, block_P=scan.block_P, block_L=scan.block_L,
        num_stages=states_stages(scan.block_P, scan.dstate, scan.block_L),
    )  # fmt: skip


def states_stages(block_P: int, dstate: int, block_L: int) -> int:
    """The state pass's pipeline depth: 3 tiles in flight where they fit (it is bound by the loads' latency:
    one GEMM per tile), else 2."""
    kmod = _kmod()
    for stages in (3, 2):
        smem = kmod.states_smem_bytes(dim_block=block_P, dstate=dstate, block_L=block_L, io_bytes=2, num_stages=stages)
        if smem <= SMEM_LIMIT:
            return stages
    return 2


def dt_spec(scan: SSDScanSpec, *, dt, dtb, has_dtb, softplus, lo, hi, last, fsi, use_fsi) -> SSDDtSpec:
    """The pre-pass feeding ``scan`` (its heads, chunk, tile and index dtypes), with the call's dt options and the
    runs table's index dtypes."""
    return SSDDtSpec(
        heads=scan.heads, chunk_size=scan.chunk_size, block_L=scan.block_L, dt_dtype=dt, dt_bias_dtype=dtb,
        cu_dtype=scan.cu_dtype, seq_idx_dtype=scan.seq_idx_dtype, has_dt_bias=has_dtb, dt_softplus=softplus,
        dt_min=lo, dt_max=hi, heads_per_cta=dt_heads_per_cta(scan.heads), last_dtype=last, fsi_dtype=fsi,
        use_final_indices=use_fsi,
    )  # fmt: skip


CODEC_PER_THREAD = 4  # 16-byte chunks of the quantised row per thread (the SSU kernels' default tiling)


def vector_pool(t: torch.Tensor) -> bool:
    """Whether a quantised pool takes 16-byte vector accesses: an aligned base and outer strides that are whole
    16-byte chunks."""
    chunk = 16 // t.element_size()
    return t.data_ptr() % 16 == 0 and all(t.stride(d) % chunk == 0 for d in range(t.dim() - 1))


def codec_spec(*, P, N, qdtype, direction, index="int32", vector=True) -> StateCodecSpec:
    """A state conversion between a quantised pool of ``qdtype`` (a dtype name) and fp32 rows."""
    return StateCodecSpec(dim=P, dstate=N, qdtype=qdtype, direction=direction, index_dtype=index,
                          vector_state=vector, per_thread=CODEC_PER_THREAD)  # fmt: skip


@dataclass(frozen=True)
class SSDPlan:
    """The kernels of one call: ``design`` "serial" (the pre-pass, then the scan over one run per sequence,
    ``seqs_per_cta`` sequences per CTA) or "split" (the pre-pass, the state pass ``states`` and the hand-over
    ``combine`` over ``runs`` even runs of chunks, then the split scan over the same runs). ``decode`` /
    ``encode``: the conversions of a quantised ``initial_states`` (before the pre-pass) and ``final_states_out``
    (after the scan)."""

    scan: SSDScanSpec
    dt: SSDDtSpec
    seqs_per_cta: int
    design: str = "serial"
    runs: int = 0
    states: SSDStatesSpec | None = None
    combine: SSDCombineSpec | None = None
    decode: StateCodecSpec | None = None
    encode: StateCodecSpec | None = None

    def specs(self) -> tuple:
        """The specs in launch order."""
        middle = (self.dt, self.states, self.combine, self.scan) if self.design == "split" else (self.dt, self.scan)
        return tuple(s for s in (self.decode, *middle, self.encode) if s is not None)


_PLANS: dict = {}


def plan(call: SSDCall, hw: Hardware) -> SSDPlan:
    """The kernels and launch choices of one call (NotImplementedError for what no kernel serves)."""
    if call.batch > MAX_SEQUENCES:
        raise NotImplementedError(f"batch={call.batch} sequences in one TileLang SSD call (at most {MAX_SEQUENCES})")
    if call.tokens == 0:
        raise NotImplementedError("an SSD call with zero tokens in the TileLang SSD prefill")
    use_fsi = call.final_state_indices is not None
    # a quantised pool: the scan reads decoded fp32 initial states and writes fp32 final states per sequence
    # (encoded into the pool's slots afterwards), so its kernels are the fp32-state ones
    q_init = call.initial_states is not None and call.initial_states.dtype in QUANT_STATE_DTYPES
    q_final = use_fsi and call.final_states_out.dtype in QUANT_STATE_DTYPES
    if q_final:
        state_dt = torch.float32
    elif call.return_intermediate_states or not use_fsi:
        state_dt = call.state_dtype
    else:
        state_dt = call.final_states_out.dtype
    init_dt = torch.float32 if q_init else (call.initial_states.dtype if call.initial_states is not None else state_dt)
    scan_fsi = use_fsi and not q_final  # the scan writes into the pool by index itself
    fsi_dt = call.final_state_indices.dtype if scan_fsi else call.last_chunk_indices.dtype
    n = DTYPE_NAMES
    codecs = (
        (call.initial_states.dtype, vector_pool(call.initial_states)) if q_init else None,
        (call.final_states_out.dtype, call.final_state_indices.dtype, vector_pool(call.final_states_out))
        if q_final else None,
    )  # fmt: skip
    static = (
        call.heads, call.groups, call.dim, call.dstate, call.chunk_size, call.x.dtype, state_dt, init_dt,
        call.dt.dtype, call.dt_bias.dtype if call.dt_bias is not None else None,
        call.D.dtype if call.D is not None else None, call.D_tied, call.cu_chunk_seqlens.dtype, call.seq_idx.dtype,
        call.dt_softplus, float(call.dt_limit[0]), float(call.dt_limit[1]), call.return_intermediate_states,
        call.last_chunk_indices.dtype, fsi_dt, scan_fsi, codecs,
    )  # fmt: skip
    specs = _PLANS.get(static)
    if specs is None:
        base = scan_spec(
            H=call.heads, G=call.groups, P=call.dim, N=call.dstate, L=call.chunk_size, io=n[call.x.dtype],
            state=n[state_dt], init=n[init_dt], D=n[call.D.dtype] if call.D is not None else "float32",
            D_per_dim=not call.D_tied, cu=n[call.cu_chunk_seqlens.dtype], sq=n[call.seq_idx.dtype],
            has_D=True, intermediate=call.return_intermediate_states,
        )  # fmt: skip
        dt = dt_spec(
            base, dt=n[call.dt.dtype], dtb=n[call.dt_bias.dtype] if call.dt_bias is not None else "float32",
            has_dtb=call.dt_bias is not None, softplus=call.dt_softplus, lo=float(call.dt_limit[0]),
            hi=float(call.dt_limit[1]), last=n[call.last_chunk_indices.dtype], fsi=n[fsi_dt], use_fsi=scan_fsi,
        )  # fmt: skip
        splitting = dataclasses.replace(base, split=True, prefetch=False)
        P, N = call.dim, call.dstate
        decode = (codec_spec(P=P, N=N, qdtype=n[codecs[0][0]], direction="decode", vector=codecs[0][1])
                  if q_init else None)  # fmt: skip
        encode = (codec_spec(P=P, N=N, qdtype=n[codecs[1][0]], direction="encode", index=n[codecs[1][1]],
                             vector=codecs[1][2]) if q_final else None)  # fmt: skip
        specs = _PLANS[static] = (base, _with_prefetch(base), dt, splitting, states_spec(base), combine_spec(base),
                                  decode, encode)  # fmt: skip
    base, prefetching, dt, splitting, states, combine, decode, encode = specs
    mean_tiles = max(1, -(-call.tokens // (call.batch * base.block_L)))
    ctas = call.heads * (call.dim // base.block_P)
    tpc = call.chunk_size // base.block_L
    forced, forced_runs = _forced.get() or (None, None)
    if forced == "split":
        if call.nchunks < 2 and not forced_runs:
            raise NotImplementedError("the split SSD design with fewer than 2 chunks (nothing to split)")
        runs = forced_runs or best_split_runs(call.nchunks, tpc, ctas, hw.sms)
    elif forced == "serial":
        runs = 0
    else:
        runs = split_runs(
            batch=call.batch, nchunks=call.nchunks, tiles_per_chunk=tpc, ctas_per_run=ctas, sms=hw.sms,
            mean_tiles=mean_tiles,
        )  # fmt: skip
    if runs:
        if runs > MAX_SEQUENCES:
            raise NotImplementedError(f"runs={runs} in the split SSD design (at most {MAX_SEQUENCES})")
        return SSDPlan(splitting, dt, 1, "split", runs, states, combine, decode, encode)
    spc = seqs_per_cta(call.batch, ctas, hw.sms, mean_tiles)
    scan = prefetching if wants_prefetch(spc, call.initial_states is not None) else base
    return SSDPlan(scan, dt, spc, decode=decode, encode=encode)


def _with_prefetch(spec: SSDScanSpec) -> SSDScanSpec:
    return dataclasses.replace(spec, prefetch=True)


# The dt options vLLM's mixer passes (dt_softplus, a fp32 dt_bias, the default dt_limit).
VLLM_DT = dict(dtb="float32", has_dtb=True, softplus=True, lo=0.0, hi=math.inf)


def serving_specs(*, heads, groups, dim, dstate, chunk_size, io_dtype, state_dtype, dt_dtype, sms=None) -> list:
    """The kernels a served model uses: vLLM's flags (:data:`VLLM_DT`, per-head D, int32 tables), final states
    returned or written into a pool by index, intermediate states, init in the state dtype, the scan with and
    without the prefetch, and where the design rule can split for this shape on ``sms`` SMs (default: an H200's
    132) the split scan with its state pass and hand-over. A quantised ``state_dtype`` (a pool of block-scaled
    states): the fp32-state kernels and the pool's two conversions."""
    io, state = DTYPE_NAMES[io_dtype], DTYPE_NAMES[state_dtype]
    codecs = []
    if state_dtype in QUANT_STATE_DTYPES:
        codecs = [codec_spec(P=dim, N=dstate, qdtype=state, direction=d) for d in ("decode", "encode")]
        state = "float32"
    split = may_split(heads, dim, dstate, chunk_size, io_dtype, sms or H200_SMS)
    specs, extra = [], []
    for intermediate in (False, True):
        base = scan_spec(
            H=heads, G=groups, P=dim, N=dstate, L=chunk_size, io=io, state=state, init=state, D="float32",
            D_per_dim=False, cu="int32", sq="int32", has_D=True, intermediate=intermediate,
        )  # fmt: skip
        specs += [base, _with_prefetch(base)]
        if split:
            extra.append(dataclasses.replace(base, split=True))
    if split:
        extra += [states_spec(specs[0]), combine_spec(specs[0])]
    for use_fsi in (False, True):
        dt = DTYPE_NAMES[dt_dtype]
        specs.append(dt_spec(specs[0], dt=dt, **VLLM_DT, last="int32", fsi="int32", use_fsi=use_fsi))
    return specs + extra + codecs


__all__ = [
    "SSDPlan", "Tiles", "plan", "tiles", "scan_spec", "dt_spec", "states_spec", "combine_spec", "serving_specs",
    "seqs_per_cta", "wants_prefetch", "dt_heads_per_cta", "split_runs", "split_makespan", "serial_makespan",
    "best_split_runs", "may_split", "forcing", "DESIGNS", "_check_supported", "SUPPORTED_DSTATE", "MAX_SEQUENCES",
    "codec_spec", "vector_pool",
]  # fmt: skip
