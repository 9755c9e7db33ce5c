"""What the SSU kernels (:mod:`.ssu`) and their launcher agree on: the bits of the ``flags`` argument, the write
modes and the tiling of a state row over the lanes of a warp (:func:`choose_tiling`); the state formats are
:mod:`.formats`'."""

from dataclasses import dataclass

from .formats import BYTES

# bits of the ``flags`` scalar argument
FLAG_D = 1
FLAG_Z = 2
FLAG_DT_BIAS = 4
FLAG_SOFTPLUS = 8
FLAG_SRC = 16  # a read table is given (else the read slot is the sequence index)
FLAG_DST = 32  # a destination table is given
FLAG_CU = 64  # cu_seqlens is given (else uniform ``seqlen`` rows per sequence)
FLAG_ACC = 128  # num_accepted_tokens is given
FLAG_IIDX = 256  # intermediate_state_indices is given
FLAG_PARENT = 512  # retrieve_parent_token is given

# write modes (the ``mode`` scalar argument)
MODE_NONE = 0
MODE_FINAL = 1
MODE_PER_TOKEN = 2
MODE_INTERMEDIATE = 3


def softplus(T, d):
    """``log(1 + e^d)`` of an fp32 TIR expression, ``d`` itself above 20 (where fp32 cannot tell them apart)."""
    return T.if_then_else(d > 20.0, d, T.log1p(T.exp(T.min(d, 20.0))))


def flag_bit(T, flags, flag):
    """1 when ``flag`` is set in ``flags``, else 0 (int32): absent inputs are read at index 0 of their dummy and
    masked arithmetically, so every input load is issued without a branch."""
    return T.shift_right(flags, flag.bit_length() - 1) & 1


def ring_dt(T, raw, bias, hb, flags):
    """A new token's processed dt, what a ReplaySSM ring caches: ``raw + bias`` (``bias`` counted where ``hb``,
    :func:`flag_bit` of ``FLAG_DT_BIAS``, is 1), softplus where ``flags`` ask for it."""
    d = T.cast(raw, "float32") + bias * T.cast(hb, "float32")
    return T.if_then_else((flags & FLAG_SOFTPLUS) != 0, softplus(T, d), d)


@dataclass(frozen=True)
class SSUTiling:
    """How one CTA holds its ``block_p`` state rows: each row's ``N`` values over ``lanes`` consecutive lanes of a
    warp, ``vecs`` chunks of ``vec`` values per lane, ``rows_per_thread`` rows per thread."""

    vec: int  # contiguous state values per 16-byte access
    vecs: int  # chunks per lane per row
    lanes: int  # lanes per state row (a power of two <= 32)
    rows_per_thread: int
    threads: int
    block_p: int  # state rows per CTA

    @property
    def rows_per_pass(self) -> int:
        return self.threads // self.lanes


def choose_tiling(dim: int, dstate: int, state_dtype: str, per_thread: int = 4) -> SSUTiling:
    """The tiling for (P, N, state dtype): 16-byte state chunks, at most 32 lanes per row, 128 threads,
    ``block_p`` ~16 rows per CTA (so batch 1 at H 128, P 64 already launches 512 CTAs).

    ``per_thread``: 16-byte state chunks per thread when P allows (default 4: 8 KB of state per 128-thread CTA);
    a power of two (the launcher's tuning table picks it per state dtype and kernel)."""
    if per_thread < 1 or per_thread & (per_thread - 1):
        raise ValueError(f"per_thread: expected a power of two >= 1, got {per_thread!r}")
    if state_dtype not in BYTES:
        raise ValueError(f"state_dtype: expected one of {tuple(BYTES)}, got {state_dtype!r}")
    vec = 16 // BYTES[state_dtype]
    while dstate % vec:
        vec //= 2
    chunks = dstate // vec
    lanes = 1
    while lanes < 32 and chunks % (lanes * 2) == 0:
        lanes *= 2
    vecs = chunks // lanes
    threads = 128
    rows_per_pass = threads // lanes
    # shrink the CTA when P is small or not a multiple of one pass
    while threads > 32 and dim % rows_per_pass and rows_per_pass > 1:
        threads //= 2
        rows_per_pass = threads // lanes
    # ``per_thread`` (default four) 16-byte state chunks per thread (8 KB of state per 128-thread CTA) when P allows
    rows_per_thread = max(1, per_thread // vecs)
    while rows_per_thread > 1 and dim % (rows_per_pass * rows_per_thread):
        rows_per_thread //= 2
    return SSUTiling(vec, vecs, lanes, rows_per_thread, threads, rows_per_pass * rows_per_thread)
