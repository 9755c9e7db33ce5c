"""TileLang launcher for ``selective_state_update``: one normalised :class:`SSUCall` -> one kernel launch.

The call shape alone picks the kernel: one token per sequence without ``cu_seqlens``/``num_accepted_tokens``/
intermediate buffer runs the one-token kernel, everything else the packed kernel. Both are built by
``mate_kernels.ssu.ssu_kernel``; optional inputs travel as a bitmask plus small cached dummy tensors, so one
compiled kernel per (P, N, heads per group, dtypes, tied/untied, alignment) serves every combination of
D / z / dt_bias / softplus / tables / write modes. No host<->device synchronisation happens here: nothing
is read back from the device, and every launch goes to the current stream (TileLang's ``tvm_ffi`` backend).
"""

from __future__ import annotations

import os

import torch
from mate_kernels.ssu import (
    FLAG_ACC,
    FLAG_CU,
    FLAG_D,
    FLAG_DST,
    FLAG_DT_BIAS,
    FLAG_IIDX,
    FLAG_PARENT,
    FLAG_SOFTPLUS,
    FLAG_SRC,
    FLAG_Z,
)

from .._device import is_accelerator, sm_count
from ..mamba._ssu_call import SSUCall, finish
from .cache import CACHE
from .compile_check import CompileItem

_DT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int32: "int32",
       torch.int64: "int64"}  # fmt: skip
# The kernels index only in-range addresses (clamped indices, dummies at index 0), so TileLang's bounds-check
# guards are turned off; the key is looked up through getattr so a TileLang build without it (the MUSA fork)
# compiles with the guards instead of failing on an unknown pass config.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}
_pass_configs_checked: dict | None = None


def _pass_configs() -> dict:
    global _pass_configs_checked
    if _pass_configs_checked is None:
        try:
            from tilelang.transform import PassConfigKey

            key = getattr(PassConfigKey, "TL_DISABLE_SAFE_MEMORY_ACCESS", None)
        except Exception:  # an older or forked TileLang without the enum
            key = None
        name = getattr(key, "value", key)
        _pass_configs_checked = dict(PASS_CONFIGS) if name in PASS_CONFIGS else {}
    return _pass_configs_checked


PREWARM_HINT = (
    "mate.mamba.prewarm_selective_state_update(state_dtype=..., io_dtype=..., batch=..., heads=..., dim=..., "
    "dstate=..., groups=..., slot_dtype=..., packed=..., meta_dtype=..., dt_dim=...)"
)
MAX_SEQUENCES = 65535  # the grid's z dimension

_MODES = {"none": 0, "final": 1, "per_token": 2, "intermediate": 3}
_kernels: dict = {}  # static key -> compiled kernel (a copy of the CACHE entries, read without locking)
_dummies: dict = {}


def _kmod():
    import mate_kernels.ssu as kmod

    return kmod


def _vec(state_dtype: torch.dtype, dstate: int) -> int:
    from mate_kernels.ssu import choose_tiling

    return choose_tiling(1, dstate, _DT[state_dtype]).vec


_VEC_CACHE: dict = {}


def _vec_of(state_dtype, dstate):
    v = _VEC_CACHE.get((state_dtype, dstate))
    if v is None:
        v = _VEC_CACHE[(state_dtype, dstate)] = _vec(state_dtype, dstate)
    return v


def _dummy(kind: str, device, dtype, shape):
    key = (kind, device, dtype, shape)
    t = _dummies.get(key)
    if t is None:
        t = _dummies[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


def _aligned(t: torch.Tensor, vec: int, nbytes: int, dims: int) -> bool:
    """Whether ``t``'s base is ``nbytes``-aligned and its outer ``dims`` strides are multiples of ``vec``."""
    if t.data_ptr() % nbytes:
        return False
    for d in range(dims):
        if t.stride(d) % vec:
            return False
    return True


def _vector_strides(vec: int, state, B, C, ibuf) -> tuple:
    """The data-pointer-independent half of the vector-access decision: whether the pool (and the intermediate
    buffer, when given) and the B/C rows have strides that allow 16-byte accesses of ``vec`` values, and the
    byte alignment each base pointer then needs."""
    s0, s1 = state.stride()[:2]
    vs = not (s0 % vec or s1 % vec)
    nb_ibuf = 0
    if ibuf is not None:
        i0, i1 = ibuf.stride()[:2]
        vs = vs and not (i0 % vec or i1 % vec)
        nb_ibuf = vec * ibuf.element_size()
    bs0, bs1 = B.stride()[:2]
    cs0, cs1 = C.stride()[:2]
    vio = not (bs0 % vec or bs1 % vec or cs0 % vec or cs1 % vec)
    return vs, vio, vec * state.element_size(), nb_ibuf, vec * B.element_size()


def _vector_pointers(terms: tuple, state, B, C, ibuf) -> tuple[bool, bool]:
    """(vector state accesses, vector B/C row accesses) from :func:`_vector_strides` and the data pointers (the
    part that changes from call to call, re-evaluated by the eager fast path every time)."""
    vs, vio, nb_state, nb_ibuf, nb_io = terms
    vstate = vs and not state.data_ptr() % nb_state and (ibuf is None or not ibuf.data_ptr() % nb_ibuf)
    vio = vio and not (B.data_ptr() % nb_io or C.data_ptr() % nb_io)
    return vstate, vio


def _vector_access(vec: int, state, B, C, ibuf) -> tuple[bool, bool]:
    return _vector_pointers(_vector_strides(vec, state, B, C, ibuf), state, B, C, ibuf)


# ---- Options for 2-byte (bf16/fp16) states (docs/ssu-kernels.md, "bf16 state: what the generated code shows").
# Read once from the environment at import. The defaults are the setting that won the H200 A/B of 2026-11-30
# (one-token: 96 -> 64 registers, 5 -> 8 CTAs/SM; packed: 139 -> 119 registers, 3 -> 4 CTAs/SM; +8-11% TB/s at
# batch 8-64); with them every kernel key keeps the plain "ssu" tag. Another setting is part of the key's first
# entry ("ssu:..."), so kernels of both settings can live in one process (``mate bench ssu --env``) and never mix
# in the caches.
#   MATE_SSU_BF16_PACK=0|1      one-token kernel: narrow each updated value back into its load registers at once
#   MATE_SSU_BF16_MIN_BLOCKS=n  one-token kernel: __launch_bounds__(threads, n), ptxas caps registers for n CTAs/SM
#                               (0: no cap)
#   MATE_SSU_BF16_CHUNKS=c      one-token kernel: 16-byte state chunks per thread
#   MATE_SSU_BF16_PACKED_MIN_BLOCKS=n  the same register cap for the packed kernel
#   MATE_SSU_BF16_PACKED_CHUNKS=c      packed kernel: 16-byte state chunks per thread
# The packed kernel's defaults (2 chunks, 8 CTAs: 64 registers, no spills, twice the warps per SM for the same
# bytes in flight) won the seventh session's H200 A/B: MTP 6 bf16 batch 64 290.5 -> 273.5 us (3.23 -> 3.44 TB/s;
# vLLM 287.7), batch 8 unchanged; the one-token kernel with 2 chunks was slower at batch 8-64 (it keeps 4).
TWO_BYTE_STATES = (torch.bfloat16, torch.float16)  # the state dtypes these options shape
BF16_ENV = ("MATE_SSU_BF16_PACK", "MATE_SSU_BF16_MIN_BLOCKS", "MATE_SSU_BF16_CHUNKS", "MATE_SSU_BF16_PACKED_MIN_BLOCKS",
            "MATE_SSU_BF16_PACKED_CHUNKS")  # fmt: skip
BF16_DEFAULTS = {"pack_early": True, "min_blocks": 8, "per_thread": 4, "packed_min_blocks": 8, "packed_per_thread": 2}


def parse_bf16_options(env) -> dict:
    """The 2-byte-state kernel options from an environment mapping (ValueError on a malformed value)."""
    opts = dict(BF16_DEFAULTS)
    pack = env.get("MATE_SSU_BF16_PACK", str(int(BF16_DEFAULTS["pack_early"])))
    if pack not in ("0", "1"):
        raise ValueError(f"MATE_SSU_BF16_PACK: expected 0 or 1, got {pack!r}")
    opts["pack_early"] = pack == "1"
    for name, field in (("MATE_SSU_BF16_MIN_BLOCKS", "min_blocks"), ("MATE_SSU_BF16_CHUNKS", "per_thread"),
                        ("MATE_SSU_BF16_PACKED_MIN_BLOCKS", "packed_min_blocks"),
                        ("MATE_SSU_BF16_PACKED_CHUNKS", "packed_per_thread")):  # fmt: skip
        value = env.get(name, str(BF16_DEFAULTS[field]))
        try:
            opts[field] = int(value)
        except ValueError:
            raise ValueError(f"{name}: expected an integer, got {value!r}") from None
    for name, field in (("MATE_SSU_BF16_MIN_BLOCKS", "min_blocks"), ("MATE_SSU_BF16_PACKED_MIN_BLOCKS",
                                                                       "packed_min_blocks")):  # fmt: skip
        if not 0 <= opts[field] <= 32:
            raise ValueError(f"{name}: expected 0..32, got {opts[field]}")
    for name, field in (("MATE_SSU_BF16_CHUNKS", "per_thread"), ("MATE_SSU_BF16_PACKED_CHUNKS", "packed_per_thread")):
        if opts[field] not in (1, 2, 4, 8, 16):
            raise ValueError(f"{name}: expected 1, 2, 4, 8 or 16, got {opts[field]}")
    return opts


def bf16_tag(opts: dict) -> str:
    """The kernel key's first entry for 2-byte states: "ssu" for the defaults, else
    "ssu:pack=..:mb=..:chunks=..:pmb=..:pchunks=.."."""
    if opts == BF16_DEFAULTS:
        return "ssu"
    return (f"ssu:pack={int(opts['pack_early'])}:mb={opts['min_blocks']}:chunks={opts['per_thread']}"
            f":pmb={opts['packed_min_blocks']}:pchunks={opts['packed_per_thread']}")  # fmt: skip


def _tag_options(tag: str) -> dict:
    """The 2-byte-state options a kernel key's tag stands for ("ssu": the defaults)."""
    if tag == "ssu":
        return dict(BF16_DEFAULTS)
    fields = dict(f.split("=") for f in tag.split(":")[1:])
    return {"pack_early": fields["pack"] == "1", "min_blocks": int(fields["mb"]), "per_thread": int(fields["chunks"]),
            "packed_min_blocks": int(fields["pmb"]), "packed_per_thread": int(fields["pchunks"])}  # fmt: skip


_TAG_2B = bf16_tag(parse_bf16_options(os.environ))

# ---- A launch choice for 2-byte states: a one-token grid of at most MATE_SSU_BF16_SMALL_GRID CTAs per SM (default
# 4; 0: never) runs the one-token kernel without the register cap and with late narrowing (the fourth session's
# default, same state chunks), where its tiling holds the full four chunks per thread. The cap exists to fit 8 CTAs
# per SM where the grid has more CTAs than the uncapped kernel's 5 per SM; a grid that fits in one wave either way
# gains nothing from it. Measured at batch 1 on the H200 (eighth session, two runs; docs/ssu-kernels.md): 3.42 ->
# 3.31 / 3.43 -> 3.30 us at H 128, 2.83 -> 2.71 at H 16, 3.61 -> 3.41 at H 24 / P 128 / N 256, 3.38 -> 3.24 at
# H 80; either change alone is slower; at P 80 (two chunks per thread) the capped kernel is faster (2.93 against
# 3.13), hence the four-chunk condition. The kernel is keyed by its own tag (``_small_tag``).
SMALL_GRID_ENV = "MATE_SSU_BF16_SMALL_GRID"
SMALL_GRID_DEFAULT = 4


def parse_small_grid(env) -> int:
    """``MATE_SSU_BF16_SMALL_GRID`` from an environment mapping: CTAs per SM, 0..64 (ValueError otherwise)."""
    value = env.get(SMALL_GRID_ENV, str(SMALL_GRID_DEFAULT))
    if not value.isdigit() or int(value) > 64:
        raise ValueError(f"{SMALL_GRID_ENV}: expected an integer 0..64 (CTAs per SM; 0: never), got {value!r}")
    return int(value)


_SMALL_GRID = parse_small_grid(os.environ)
_SMALL_TAGS: dict = {}
_HEAD_BLOCKS: dict = {}


def _small_tag(tag: str) -> str:
    """The key tag of the one-token kernel a small grid runs under the 2-byte options ``tag``: the same options
    without the one-token register cap and with late narrowing."""
    small = _SMALL_TAGS.get(tag)
    if small is None:
        small = _SMALL_TAGS[tag] = bf16_tag({**_tag_options(tag), "pack_early": False, "min_blocks": 0})
    return small


def _small_grid(nseq: int, heads: int, P: int, N: int, state_dt, device) -> bool:
    """Whether a one-token launch with a 2-byte state is a small grid (see ``MATE_SSU_BF16_SMALL_GRID``): CTAs =
    sequences x heads x P blocks, against that many CTAs per SM, where the tiling holds the full chunks per
    thread."""
    if not _SMALL_GRID or state_dt not in TWO_BYTE_STATES or not is_accelerator(device):
        return False  # (the SM count is read only on a device)
    key = (P, N, state_dt, _TAG_2B)
    blocks = _HEAD_BLOCKS.get(key)
    if blocks is None:
        per_thread = _tag_options(_TAG_2B)["per_thread"]
        tiling = _kmod().choose_tiling(P, N, _DT[state_dt], per_thread)
        full = tiling.vecs * tiling.rows_per_thread == per_thread  # (P 80: two chunks, measured slower uncapped)
        blocks = _HEAD_BLOCKS[key] = P // tiling.block_p if full else 0
    return 0 < nseq * heads * blocks <= _SMALL_GRID * sm_count(device)


# ---- The one option for fp32 states (docs/ssu-kernels.md): a register cap for the packed (MTP) kernel. Under a
# 6-CTA cap ptxas gives it 80 registers without spilling (126 and 4 CTAs per SM without one); measured on the H200
# (2026-11-30, fourth session): MTP 6 fp32 batch 8 73.0 -> 67.4 us (vLLM 69.2), batch 64 510 -> 501 us, one-token
# unaffected. The default (6) keeps the plain "ssu" key; another value tags fp32 packed keys "ssu:f32pmb=n".
#   MATE_SSU_F32_PACKED_MIN_BLOCKS=n  __launch_bounds__(threads, n) on the fp32-state packed kernel (0: no cap)
F32_ENV = ("MATE_SSU_F32_PACKED_MIN_BLOCKS",)
F32_DEFAULTS = {"packed_min_blocks": 6}


def parse_f32_options(env) -> dict:
    """The fp32-state kernel options from an environment mapping (ValueError on a malformed value)."""
    value = env.get("MATE_SSU_F32_PACKED_MIN_BLOCKS", str(F32_DEFAULTS["packed_min_blocks"]))
    if not value.isdigit() or not 0 <= int(value) <= 32:
        raise ValueError(f"MATE_SSU_F32_PACKED_MIN_BLOCKS: expected an integer 0..32, got {value!r}")
    return {"packed_min_blocks": int(value)}


def f32_tag(opts: dict) -> str:
    """The key's first entry of an fp32-state packed kernel: "ssu" for the defaults, else "ssu:f32pmb=n"."""
    return "ssu" if opts == F32_DEFAULTS else f"ssu:f32pmb={opts['packed_min_blocks']}"


_TAG_F32 = f32_tag(parse_f32_options(os.environ))


def set_f32_options(opts: dict | None) -> str:
    """Switch the fp32-state options for kernels planned from now on (None: the defaults); returns the previous
    tag (A/B benchmarks, as :func:`set_bf16_options`)."""
    global _TAG_F32
    prev = _TAG_F32
    _TAG_F32 = f32_tag(dict(F32_DEFAULTS) if opts is None else {**F32_DEFAULTS, **opts})
    return prev


def set_bf16_options(opts: dict | None) -> str:
    """Switch the 2-byte-state options for kernels planned from now on (None: the defaults); returns the previous
    tag. For A/B benchmarks; the eager fast path keeps the kernels its recipes were built with, so callers turn
    it off (``mate.mamba.ssu.FAST_PATH = False``) while switching."""
    global _TAG_2B
    prev = _TAG_2B
    _TAG_2B = bf16_tag(dict(BF16_DEFAULTS) if opts is None else {**BF16_DEFAULTS, **opts})
    return prev


# ---- The packed kernel's row reduction of y = s . C (eleventh session): transposed (each of the first log2(R)
# butterfly steps halves the rows a lane holds: R - 1 + log2(L / R) shuffles for R rows over L lanes, 6 instead of 20
# at 4 rows x 32 lanes; R lanes then write one y each) or plain (every row reduced on its own, lane 0 writes them
# all). Measured on the H200 (docs/ssu-kernels.md, interleaved A/B in one run): MTP 6 bf16 batch 8 39.94 -> 39.15 us,
# batch 64 275.7 -> 272.3 us, fp32 batch 64 503.0 -> 502.2; the one-token kernel gained nothing (fp32 batch 1 4.77
# -> 4.75, batch 8 20.44 -> 20.30) and lost at bf16 (batch 1 3.71 -> 3.81, batch 8 11.52 -> 11.67), so it keeps the
# plain reduction. MATE_SSU_TRANSPOSED_REDUCE=0 selects the plain one for the packed kernel too; that setting adds
# ":tr=0" to packed keys.
REDUCE_ENV = "MATE_SSU_TRANSPOSED_REDUCE"
_TR_OFF = ":tr=0"


def parse_transposed_reduce(env) -> bool:
    """``MATE_SSU_TRANSPOSED_REDUCE`` from an environment mapping (ValueError unless 0 or 1; default 1)."""
    value = env.get(REDUCE_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{REDUCE_ENV}: expected 0 or 1, got {value!r}")
    return value == "1"


_TRANSPOSED = parse_transposed_reduce(os.environ)


# ---- Programmatic dependent launch (PDL, opt-in). Both kernels call ``T.pdl_trigger()`` and then ``T.pdl_sync()``
# before their first global access (read or write), so the stream order is kept whatever runs before or after them:
# a call's launch may proceed while the previous kernel on the stream drains, and the next kernel may launch while
# this one runs (TileLang's tvm_ffi launcher sets the programmatic-serialisation attribute for a kernel that calls
# pdl_sync). Measured on the H200 (twelfth session, docs/ssu-kernels.md): behind another SSU call (the benchmark's
# back-to-back graph) batch 1 bf16 3.66 -> 3.40 us, fp32 4.68 -> 4.19 us, batch 8 -4 to -7 %, larger batches within
# noise; behind a kernel that does not trigger early (a conv1d in vLLM's decode step, `bench --after-producer`)
# batch 1 is 0.2-0.4 us SLOWER (bf16 5.34 -> 5.75 us for the pair). So it stays off unless the engine asks:
# MATE_SSU_PDL "0" (default), "1" (on; NotImplementedError where unsupported), "auto" (on for CUDA compute
# capability 9.0+, off elsewhere, MUSA included). Keys of PDL kernels carry ":pdl=1".
PDL_ENV = "MATE_SSU_PDL"
_PDL_ON = ":pdl=1"


def parse_pdl(env) -> bool | None:
    """``MATE_SSU_PDL`` from an environment mapping: False for "0" (the default), True for "1", None for "auto";
    ValueError for anything else."""
    value = env.get(PDL_ENV, "0")
    if value not in ("auto", "0", "1"):
        raise ValueError(f"{PDL_ENV}: expected auto, 0 or 1, got {value!r}")
    return None if value == "auto" else value == "1"


_PDL = parse_pdl(os.environ)


def pdl_for_capability(kind: str, major: int) -> bool:
    """Whether kernels for a device of this kind ("cuda", "musa", ...) and compute-capability major build with PDL
    under the current ``MATE_SSU_PDL`` setting (the one rule; NotImplementedError when forced on where it cannot
    run)."""
    supported = kind == "cuda" and major >= 9
    if _PDL is None:
        return supported
    if _PDL and not supported:
        raise NotImplementedError(f"{PDL_ENV}=1: programmatic dependent launch needs a CUDA device of compute "
                                  f"capability 9.0 or newer, got {kind} {major}.x")  # fmt: skip
    return _PDL


_MAJOR: dict = {}


def pdl_for(dev: torch.device) -> bool:
    """``pdl_for_capability`` for a torch device (its capability looked up once)."""
    major = _MAJOR.get(dev)
    if major is None:
        major = _MAJOR[dev] = torch.cuda.get_device_capability(dev)[0] if dev.type == "cuda" else 0
    return pdl_for_capability(dev.type, major)


def pdl_for_arch(arch: str) -> bool:
    """``pdl_for_capability`` for a CUDA compile target such as "sm_90a" (``mate prewarm --target``)."""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    if not digits:
        raise ValueError(f"target: expected a CUDA arch such as sm_90a, got {arch!r}")
    return pdl_for_capability("cuda", int(digits) // 10)


def _key(one_token, P, N, ratio, state_dt, io_dt, dt_dt, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt, tied,
         vstate, vio, small_grid=False, pdl=False):  # fmt: skip
    if state_dt in TWO_BYTE_STATES:
        tag = _small_tag(_TAG_2B) if small_grid and one_token else _TAG_2B
    else:
        tag = _TAG_F32 if state_dt == torch.float32 and not one_token else "ssu"
    if not one_token and not _TRANSPOSED:
        tag += _TR_OFF
    if pdl:
        tag += _PDL_ON
    return (tag, one_token, P, N, ratio, state_dt, io_dt, dt_dt, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt,
            tied, vstate, vio)  # fmt: skip


def _builder(key):
    (tag, one_token, P, N, ratio, state_dt, io_dt, dt_dt, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt, tied, vstate,
     vio) = key  # fmt: skip
    pdl = tag.endswith(_PDL_ON)  # (the last option of a tag, see _key)
    tag = tag.removesuffix(_PDL_ON)
    transposed = not tag.endswith(_TR_OFF)
    tag = tag.removesuffix(_TR_OFF)
    # the 2-byte-state options; fp32 states keep the factory's defaults but for the packed kernel's register cap
    opts = _tag_options(tag) if state_dt in TWO_BYTE_STATES else {}
    if tag.startswith("ssu:f32pmb="):
        f32_cap = int(tag.split("=")[1])
    else:  # the plain key: the default cap, on the fp32 packed kernel only
        f32_cap = F32_DEFAULTS["packed_min_blocks"] if state_dt == torch.float32 and not one_token else 0

    def build():
        extra = {} if transposed and not one_token else dict(transposed_reduce=False)
        if pdl:
            extra.update(pdl=True)
        if f32_cap:
            extra.update(min_blocks=f32_cap)
        if opts:
            kmod = _kmod()
            extra.update(
                tiling=kmod.choose_tiling(
                    P, N, _DT[state_dt], opts["per_thread" if one_token else "packed_per_thread"]
                ),
                pack_early=opts["pack_early"],
                # separate caps and chunk counts: with 4 chunks the packed bf16 kernel (139 registers) spills 152
                # bytes under an 8-CTA cap; with 2 it fits 8 CTAs (64 registers)
                min_blocks=opts["min_blocks"] if one_token else opts["packed_min_blocks"],
            )
        return _kmod().ssu_kernel(
            dim=P,
            dstate=N,
            heads_per_group=ratio,
            state_dtype=_DT[state_dt],
            io_dtype=_DT[io_dt],
            dt_dtype=_DT[dt_dt],
            d_dtype=_DT[d_dt],
            dt_bias_dtype=_DT[dtb_dt],
            src_dtype=_DT[src_dt],
            dst_dtype=_DT[dst_dt],
            meta_dtype=_DT[meta_dt],
            ibuf_dtype=_DT[ibuf_dt],
            tied=tied,
            one_token=one_token,
            vector_state=vstate,
            vector_io=vio,
            **extra,
        )

    return build


def build_kernel(key):
    """The ``T.prim_func`` of a kernel key (what a parallel pre-compilation step hands to ``tilelang.compile``)."""
    return _builder(key)()


def _get(key, device):
    kern = _kernels.get(key)
    if kern is None:
        kern = CACHE.get(key, _builder(key), device, prewarm_hint=PREWARM_HINT, pass_configs=_pass_configs())
        _kernels[key] = kern
    return kern


def _row_table(t):
    if t.stride(-1) != 1:
        # the kernel reads B/C rows with dense last dim; a strided last dim is rare (never in production)
        return t.contiguous()
    return t


def plan(call: SSUCall):
    """(kernel key, launch arguments) of a call, or None when there is nothing to launch."""
    state = call.state
    dev = state.device
    nseq = call.nseq
    if nseq == 0 or call.rows == 0:
        return None
    if nseq > MAX_SEQUENCES:
        raise NotImplementedError(
            f"selective_state_update (tilelang): more than {MAX_SEQUENCES} sequences in one call ({nseq})"
        )
    _, H, P, N = state.shape
    one_token = (
        call.seqlen == 1
        and call.cu_seqlens is None
        and call.num_accepted is None
        and call.ibuf is None
        and call.parent is None
    )
    state_dt = state.dtype
    io_dt = call.x.dtype
    vec = _VEC_CACHE.get((state_dt, N)) or _vec_of(state_dt, N)
    ibuf = call.ibuf
    B = call.B
    C = call.C
    if B.stride(2) != 1 or C.stride(2) != 1:
        B = _row_table(B)
        C = _row_table(C)
    vstate, vio = _vector_access(vec, state, B, C, ibuf)

    flags = 0
    D = call.D
    if D is not None:
        flags |= FLAG_D
        d_dt = D.dtype
    else:
        d_dt = torch.float32
        D = _dummy("D", dev, d_dt, (1, 1))
    z = call.z
    if z is not None:
        flags |= FLAG_Z
    else:
        z = _dummy("z", dev, io_dt, (1, 1, 1))
    dtb = call.dt_bias
    if dtb is not None:
        flags |= FLAG_DT_BIAS
        dtb_dt = dtb.dtype
    else:
        dtb_dt = torch.float32
        dtb = _dummy("dtb", dev, dtb_dt, (1, 1))
    if call.dt_softplus:
        flags |= FLAG_SOFTPLUS

    src = call.src
    dst = call.dst
    if src is not None:
        flags |= FLAG_SRC
        src_t, src_sb, src_st, src_dt = src.base, src.stride_b, src.stride_t, src.base.dtype
    else:
        src_dt = dst.base.dtype if dst is not None else torch.int32
        src_t, src_sb, src_st = _dummy("idx", dev, src_dt, (1,)), 0, 0
    if dst is not None:
        flags |= FLAG_DST
        dst_t, dst_sb, dst_st, dst_dt = dst.base, dst.stride_b, dst.stride_t, dst.base.dtype
    else:
        dst_dt = src_dt
        dst_t, dst_sb, dst_st = _dummy("idx", dev, dst_dt, (1,)), 0, 0
    if src_t.numel() == 0 or dst_t.numel() == 0:
        raise ValueError("state_batch_indices / dst_state_batch_indices: an empty slot table with sequences to run")

    mode = _MODES[call.write_mode]
    tied = call.tie_hdim
    ratio = H // B.shape[1]

    pdl = pdl_for(dev)
    if one_token:
        meta_dt = torch.int32
        ibuf_dt = state_dt
        small = _small_grid(nseq, H, P, N, state_dt, dev)
        key = _key(True, P, N, ratio, state_dt, io_dt, call.dt.dtype, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt,
                   tied, vstate, vio, small, pdl)  # fmt: skip
        args = (state, call.x, call.dt, call.A, B, C, D, z, dtb, call.out, src_t, dst_t,
                nseq, 1, src_sb, src_st, dst_sb, dst_st, call.pad_slot_id, flags, mode)  # fmt: skip
        return key, args

    cu = call.cu_seqlens
    acc = call.num_accepted
    iidx = call.ibuf_indices
    parent = call.parent
    meta_dt = next((t.dtype for t in (cu, acc, iidx, parent) if t is not None), torch.int32)
    for name, t in (("cu_seqlens", cu), ("num_accepted_tokens", acc), ("intermediate_state_indices", iidx),
                    ("retrieve_parent_token", parent)):  # fmt: skip
        if t is not None and t.dtype != meta_dt:
            raise NotImplementedError(
                f"selective_state_update (tilelang): {name} of dtype {t.dtype} mixed with {meta_dt} metadata "
                "(cu_seqlens / num_accepted_tokens / intermediate_state_indices / retrieve_parent_token must share "
                "one integer dtype)"
            )
    if cu is not None:
        flags |= FLAG_CU
        if cu.stride(0) != 1:
            cu = cu.contiguous()
    else:
        cu = _dummy("meta", dev, meta_dt, (1,))
    if acc is not None:
        flags |= FLAG_ACC
        if acc.stride(0) != 1:
            acc = acc.contiguous()
    else:
        acc = _dummy("meta", dev, meta_dt, (1,))
    if iidx is not None:
        flags |= FLAG_IIDX
        if iidx.stride(0) != 1:
            iidx = iidx.contiguous()
    else:
        iidx = _dummy("meta", dev, meta_dt, (1,))
    if parent is not None:
        flags |= FLAG_PARENT
    else:
        parent = _dummy("meta", dev, meta_dt, (1, 1))
    if ibuf is None:
        ibuf_dt = state_dt
        ibuf = _dummy("ibuf", dev, state_dt, (1, 1, P, N))
    else:
        ibuf_dt = ibuf.dtype
    key = _key(False, P, N, ratio, state_dt, io_dt, call.dt.dtype, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt,
               tied, vstate, vio, pdl=pdl)  # fmt: skip
    seqlen = call.seqlen if call.seqlen is not None else 0
    args = (state, call.x, call.dt, call.A, B, C, D, z, dtb, call.out, src_t, dst_t, cu, acc, ibuf, iidx, parent,
            nseq, seqlen, src_sb, src_st, dst_sb, dst_st, call.pad_slot_id, flags, mode, call.cache_steps)  # fmt: skip
    return key, args


def selective_state_update(call: SSUCall) -> torch.Tensor:
    """Run one normalised call: a single kernel launch on the current stream, no host<->device sync."""
    planned = plan(call)
    if planned is not None:
        key, args = planned
        kern = _kernels.get(key)
        if kern is None:
            kern = _get(key, call.state.device)
        kern(*args)
    return finish(call)


# ------------------------------------------------------------------------------- launch recipes (fast path)

RESULT = "<result>"  # the pseudo-argument a launch recipe allocates when the caller passed no ``out``

# The public argument each tensor position of a launch comes from: the first of these that the caller passed.
# The normaliser hands every one of them through as it is or as a view of it (unsqueeze / expand / reshape /
# a slot table's 1-D base); make_recipe verifies that on the call it is built from and gives up otherwise.
_ARG_SOURCES = (
    ("state",), ("x",), ("dt",), ("A",), ("B",), ("C",), ("D",), ("z",), ("dt_bias",), ("out", RESULT),
    ("state_batch_indices",), ("dst_state_batch_indices", "state_batch_indices"), ("cu_seqlens",),
    ("num_accepted_tokens",), ("intermediate_states_buffer",), ("intermediate_state_indices",),
    ("retrieve_parent_token",),
)  # fmt: skip
_A_STATE, _A_B, _A_C, _A_IBUF = 0, 4, 5, 14  # positions _vector_access reads


# Recipes call the tvm_ffi function behind a kept kernel directly: TileLang's Python call wrapper (argument
# count check, output-slot loops, executable lookup; ~9 us per call on the CI CPU) does nothing for these
# kernels, which have no outputs to allocate. MATE_TILELANG_WRAPPER=1 keeps the wrapper.
DIRECT_FFI_CALL = os.environ.get("MATE_TILELANG_WRAPPER", "0") != "1"


def direct_callable(kern):
    """The function ``kern(*args)`` ends up calling (``<module>.main`` of TileLang's tvm_ffi adapter) when calling
    it directly is equivalent, i.e. a tvm_ffi adapter without outputs to allocate; else ``kern`` itself."""
    if not DIRECT_FFI_CALL:
        return kern
    adapter = getattr(kern, "adapter", None)
    if (
        adapter is None
        or type(adapter).__name__ != "TVMFFIKernelAdapter"
        or getattr(adapter, "result_idx", None)
        or getattr(adapter, "_ffi_callee_allocated_output_abi", False)
    ):
        return kern
    try:
        ex = adapter._get_executable()
        mod = ex.jit() if getattr(type(ex), "jit", None) is not None else ex  # a fresh compile / a disk-cache load
        fn = mod.main
    except Exception:  # another TileLang layout: keep the wrapper
        return kern
    return fn if callable(fn) else kern


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    p = a.untyped_storage().data_ptr()
    return p != 0 and p == b.untyped_storage().data_ptr()


class LaunchRecipe:
    """How to launch a call again from new tensors with the same metadata, without normalising or planning.

    Built by :func:`make_recipe` from the slow path's own result (normalised call + plan) for one call: the
    launch arguments with every caller tensor replaced by "argument ``i`` as passed" or "argument ``i`` viewed
    with this (shape, stride, offset)", the output allocation when the caller passed no ``out``, and the
    compiled kernels keyed by the one data-pointer-dependent part of the kernel key (vector accesses)."""

    __slots__ = ("template", "idents", "views", "alloc", "result_index", "vterms", "has_ibuf", "base_key", "kernels",
                 "device")  # fmt: skip

    def _fill(self, tensors: tuple):
        """``(result, vector-access flags, launch arguments)`` (flags and arguments None: nothing to launch)."""
        alloc = self.alloc
        if alloc is None:
            result = tensors[self.result_index]
        else:
            result = torch.empty(alloc[0], dtype=alloc[1], device=alloc[2])
        template = self.template
        if template is None:
            return result, None, None
        ins = tensors + (result,)
        args = list(template)
        for pos, i in self.idents:
            args[pos] = ins[i]
        for pos, i, shape, stride, delta in self.views:
            src = ins[i]
            if shape is None:  # the whole (contiguous) tensor as 1-D: a 2-D slot table's base
                args[pos] = src.view(-1)
            else:
                args[pos] = torch.as_strided(src, shape, stride, src.storage_offset() + delta)
        vflags = _vector_pointers(
            self.vterms, args[_A_STATE], args[_A_B], args[_A_C], args[_A_IBUF] if self.has_ibuf else None
        )
        return result, vflags, args

    def build(self, tensors: tuple):
        """``(result, kernel key, launch arguments)`` for new tensors (key and arguments None: nothing to launch)."""
        result, vflags, args = self._fill(tensors)
        return result, None if vflags is None else self.base_key + vflags, args

    def launch(self, tensors: tuple) -> torch.Tensor:
        result, vflags, args = self._fill(tensors)
        if vflags is not None:
            kern = self.kernels.get(vflags)  # kernels by (vector state, vector B/C): the rest of the key is fixed
            if kern is None:  # a new pointer alignment: the kernel cache (and its capture check) decides
                kern = self.kernels[vflags] = direct_callable(_get(self.base_key + vflags, self.device))
            kern(*args)
        return result


def make_recipe(call: SSUCall, sources: dict, order: tuple) -> LaunchRecipe | None:
    """The :class:`LaunchRecipe` of a normalised call, or None when some launch argument is not a caller tensor,
    a view of one or a dummy (a contiguous copy, scratch output): such metadata always takes the slow path.

    ``sources`` maps the public argument names to what the caller passed; ``order`` is the order of the
    tensors :meth:`LaunchRecipe.build` receives."""
    if call.copy_back:
        return None
    index = {name: i for i, name in enumerate(order)}
    index[RESULT] = len(order)
    result = call.result
    srcs = dict(sources)
    rec = LaunchRecipe()
    if sources.get("out") is not None:
        if result is not sources["out"]:
            return None
        rec.alloc, rec.result_index = None, index["out"]
    else:
        if not result.is_contiguous() or result.storage_offset() != 0:
            return None
        rec.alloc, rec.result_index = (tuple(result.shape), result.dtype, result.device), None
        srcs[RESULT] = result
    rec.device = call.state.device
    planned = plan(call)
    rec.template = rec.idents = rec.views = rec.base_key = None
    rec.kernels = {}
    rec.vterms, rec.has_ibuf = None, False
    if planned is None:
        return rec
    key, args = planned
    dummies = tuple(_dummies.values())
    template = list(args)
    idents, views = [], []
    for pos, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or any(a is d for d in dummies):
            continue
        names = _ARG_SOURCES[pos] if pos < len(_ARG_SOURCES) else ()
        name = next((n for n in names if srcs.get(n) is not None), None)
        if name is None:
            return None
        src = srcs[name]
        template[pos] = None
        if a is src:
            idents.append((pos, index[name]))
        elif a.dtype == src.dtype and _same_storage(a, src):
            # the normaliser's views keep their source's storage offset up to a metadata-determined shift
            delta = a.storage_offset() - src.storage_offset()
            shape, stride = tuple(a.shape), tuple(a.stride())
            if delta == 0 and shape == (src.numel(),) and stride == (1,) and src.is_contiguous():
                shape = stride = None  # src.view(-1): the same view, ~1 us cheaper than as_strided
            views.append((pos, index[name], shape, stride, delta))
        else:
            return None
    rec.template, rec.idents, rec.views = tuple(template), tuple(idents), tuple(views)
    vec = _VEC_CACHE.get((call.state.dtype, call.dstate)) or _vec_of(call.state.dtype, call.dstate)
    rec.has_ibuf = call.ibuf is not None
    checked = (args[_A_STATE], args[_A_B], args[_A_C], args[_A_IBUF] if rec.has_ibuf else None)
    rec.vterms = _vector_strides(vec, *checked)
    if _vector_pointers(rec.vterms, *checked) != key[-2:]:
        return None  # the positions the recipe re-checks are not the tensors plan() checked
    rec.base_key = key[:-2]
    kern = _kernels.get(key)
    rec.kernels = {key[-2:]: direct_callable(kern if kern is not None else _get(key, rec.device))}
    return rec


# ------------------------------------------------------------------------------------------------ prewarm


def prewarm_keys(*, state_dtype, io_dtype, heads, dim, dstate, groups, slot_dtype, packed, meta_dtype, tie_hdim,
                 pdl=False):  # fmt: skip
    """The kernel keys one serving configuration calls: the one-token kernel, plus the packed one when
    ``packed``; dt as fp32 and in the io dtype (both occur in production); D / dt_bias fp32; aligned pools.
    ``pdl``: the keys of the PDL build (``pdl_for(device)`` / ``pdl_for_arch(target)`` decides)."""
    ratio = heads // groups
    keys = []
    # (2-byte states: the one-token kernel of small grids too, MATE_SSU_BF16_SMALL_GRID)
    small_grids = (False, True) if state_dtype in TWO_BYTE_STATES and _SMALL_GRID else (False,)
    for one_token, small in [(True, sg) for sg in small_grids] + ([(False, False)] if packed else []):
        for dt_dt in dict.fromkeys((torch.float32, io_dtype)):
            keys.append(
                _key(
                    one_token,
                    dim,
                    dstate,
                    ratio,
                    state_dtype,
                    io_dtype,
                    dt_dt,
                    torch.float32,
                    torch.float32,
                    slot_dtype,
                    slot_dtype,
                    meta_dtype if not one_token else torch.int32,
                    state_dtype,
                    tie_hdim,
                    True,
                    True,
                    small,
                    pdl,
                )  # fmt: skip
            )
    return keys


def prewarm(device, *, state_dtype, io_dtype, heads, dim, dstate, groups, slot_dtype, packed, meta_dtype, tie_hdim):
    """Compile (without launching) every kernel the configuration will call."""
    for key in prewarm_keys(
        state_dtype=state_dtype,
        io_dtype=io_dtype,
        heads=heads,
        dim=dim,
        dstate=dstate,
        groups=groups,
        slot_dtype=slot_dtype,
        packed=packed,
        meta_dtype=meta_dtype,
        tie_hdim=tie_hdim,
        pdl=pdl_for(torch.device(device)),
    ):
        _get(key, device)


def compile_grid() -> list[CompileItem]:
    """A representative grid: one-token + packed, bf16/fp32/fp16 state, P 64/80/128, N 128/256, tied/untied."""
    f32, bf16, f16, i32, i64 = torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64
    grid = [
        # (one_token, P, N, ratio, state, io, dt, tied)
        (True, 64, 128, 16, bf16, bf16, f32, True),
        (True, 64, 128, 16, f32, bf16, bf16, True),
        (False, 64, 128, 16, bf16, bf16, f32, True),
        (False, 64, 128, 16, f32, bf16, f32, True),
        (True, 128, 256, 24, bf16, bf16, f32, False),
        (False, 80, 128, 1, f16, f16, f16, False),
    ]
    items = []
    # as they run on the target (sm_90a) under the current MATE_SSU_PDL setting (default: without PDL)
    pdl = pdl_for_arch("sm_90a")
    for one_token, P, N, ratio, sdt, iodt, dtdt, tied in grid:
        key = _key(one_token, P, N, ratio, sdt, iodt, dtdt, f32, f32, i32, i32 if one_token else i64, i32, sdt, tied,
                   True, True, pdl=pdl)  # fmt: skip
        label = (
            f"{'one_token' if one_token else 'packed'} P{P} N{N} H/G{ratio} state={_DT[sdt]} io={_DT[iodt]} "
            f"dt={_DT[dtdt]} {'tied' if tied else 'untied'}{' pdl' if pdl else ''}"
        )
        items.append(CompileItem(family="ssu", label=label, build=_builder(key), pass_configs=dict(PASS_CONFIGS)))
    # the other PDL form (MATE_SSU_PDL=1 / auto on CUDA 9.0+) of two of them: one-token fp32, packed bf16
    for one_token, sdt in ((True, f32), (False, bf16)) if not pdl else ():
        key = _key(one_token, 64, 128, 16, sdt, bf16, f32, f32, f32, i32, i32 if one_token else i64, i32, sdt, True,
                   True, True, pdl=True)  # fmt: skip
        label = f"{'one_token' if one_token else 'packed'} P64 N128 H/G16 state={_DT[sdt]} io=bfloat16 dt=float32 tied"
        items.append(CompileItem(family="ssu", label=f"{label} pdl", build=_builder(key),
                                 pass_configs=dict(PASS_CONFIGS)))  # fmt: skip
    # the fp32 packed kernel without its register cap (MATE_SSU_F32_PACKED_MIN_BLOCKS=0, the former default)
    base = _key(False, 64, 128, 16, f32, bf16, f32, f32, f32, i32, i64, i32, f32, True, True, True)
    key = (f32_tag({"packed_min_blocks": 0}),) + base[1:]
    label = f"packed P64 N128 H/G16 state=float32 io=bfloat16 dt=float32 tied {key[0]}"
    items.append(CompileItem(family="ssu", label=label, build=_builder(key), pass_configs=dict(PASS_CONFIGS)))
    # the packed kernel with the plain row reduction (MATE_SSU_TRANSPOSED_REDUCE=0), fp32 and 2-byte states
    for sdt in (f32, bf16):
        base = _key(False, 64, 128, 16, sdt, bf16, f32, f32, f32, i32, i64, i32, sdt, True, True, True)
        key = (base[0].removesuffix(_TR_OFF) + _TR_OFF,) + base[1:]
        label = f"packed P64 N128 H/G16 state={_DT[sdt]} io=bfloat16 dt=float32 tied {key[0]}"
        items.append(CompileItem(family="ssu", label=label, build=_builder(key), pass_configs=dict(PASS_CONFIGS)))
    # the former 2-byte default (no register caps, late narrowing): still selectable for A/B runs
    ab = {"pack_early": False, "min_blocks": 0, "per_thread": 4, "packed_min_blocks": 0, "packed_per_thread": 4}
    for one_token in (True, False):
        base = _key(one_token, 64, 128, 16, bf16, bf16, f32, f32, f32, i32, i32 if one_token else i64, i32, bf16, True,
                    True, True)  # fmt: skip
        key = (bf16_tag(ab),) + base[1:]
        label = f"{'one_token' if one_token else 'packed'} P64 N128 H/G16 state=bfloat16 io=bfloat16 dt=float32 tied"
        items.append(CompileItem(family="ssu", label=f"{label} {key[0]}", build=_builder(key),
                                 pass_configs=dict(PASS_CONFIGS)))  # fmt: skip
    return items


__all__ = [
    "selective_state_update", "plan", "build_kernel", "prewarm", "prewarm_keys", "compile_grid", "PASS_CONFIGS",
    "LaunchRecipe", "make_recipe", "direct_callable", "parse_bf16_options", "bf16_tag", "set_bf16_options",
    "BF16_ENV", "BF16_DEFAULTS", "SMALL_GRID_ENV", "parse_small_grid", "F32_ENV", "F32_DEFAULTS",
    "parse_f32_options", "f32_tag", "set_f32_options", "REDUCE_ENV", "parse_transposed_reduce",
    "PDL_ENV", "parse_pdl", "pdl_for", "pdl_for_arch", "pdl_for_capability",
]  # fmt: skip
