"""Stochastic rounding of fp32 state values to fp16, and of scaled values to an int8 / fp8-e4m3 block-scaled
state's numbers, as the reference backend writes a state with ``rand_seed``.

The random stream is Philox-4x32 with ``philox_rounds`` rounds (FlashInfer 0.7.2's generator), keyed by the seed
(its low and high 32 bits). One counter serves eight consecutive elements: the value at flat element offset ``o``
of the ``[rows, H, P, N]`` tensor it is written to takes the 16-bit half ``o % 2`` of word ``(o % 8) // 2`` of
the output for counter ``(o - o % 8 low, high, 0, 0)``, of which it uses 13 bits (FlashInfer draws one counter per
four values and uses 13 bits of each word: MATE's draw halves the generator's work, which bounds the rounding's
cost on a GPU without a stochastic-rounding instruction). The rounding adds those bits below the fp16 mantissa of
``|x|`` and truncates, so ``|x|`` rounds up with probability equal to its remainder (unbiased); values below fp16's
smallest normal flush to signed zero and above its largest become infinite, as FlashInfer's software path does. A
seed is one step's: the caller changes it between steps (a one-element device tensor, so a captured graph reads
the new value). A multi-layer materialisation keys layer ``l`` with :func:`layer_seed` of the seed and ``l``.

An int8 / fp8-e4m3 number (:func:`round_scaled`) takes all 16 bits ``u`` of its offset: the magnitude ``a`` of the
scaled value (the value times its row's encode factor, qmax / max|row|) goes to the grid point below it, or the one
above with probability its remainder, ``step * floor(a / step + u / 2^16)``, saturated at qmax and signed as the
value. The grid's step is 1 for int8; for fp8-e4m3 2^(e - 3) in the binade [2^e, 2^(e+1)) and 2^-9 below 2^-6
(``mate_kernels.formats``' ``mantissa`` and ``min_exp``). Every operation after the scaling is exact in fp32, so
a kernel that scales the same fp32 value rounds it to the same number; the expected stored value is the scaled one
(within qmax, to the 2^-16 resolution of ``u``). FlashInfer 0.7.2 rounds fp8-e4m3 magnitudes by the same rule and
int8 values by ``floor(x + u / 2^16)`` (signed, the same expectation), from other random bits.
"""

from __future__ import annotations

import torch

_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
# SplitMix64's increment and its finaliser's multipliers (Stafford's mix13)
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def layer_seed(seed: int, layer: int) -> int:
    """The Philox key (a signed int64) of layer ``layer`` of ``materialize_replayed_layers`` with ``rand_seed``
    ``seed``: FlashInfer 0.7.2's ``layer_philox_seed``, the SplitMix64 finaliser of ``seed ^ (golden * (layer +
    1))`` in uint64 arithmetic, so the layers round with independent streams."""
    z = (seed & _M64) ^ ((_GOLDEN * (layer + 1)) & _M64)
    z = ((z ^ (z >> 30)) * _MIX1) & _M64
    z = ((z ^ (z >> 27)) * _MIX2) & _M64
    z ^= z >> 31
    return z - (1 << 64) if z >> 63 else z


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of the 64-bit product of the constant ``a`` and the uint32 values ``b`` (int64
    tensors), in 16-bit limbs so no int64 product overflows."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    lo_part = a_lo * b  # < 2^48
    hi = (a_hi * b + (lo_part >> 16)) >> 16
    lo = (((a_hi * b) & 0xFFFF) << 16) + lo_part
    return hi & _M32, lo & _M32


def philox4x32(seed: int, counter: torch.Tensor, rounds: int) -> tuple[torch.Tensor, ...]:
    """The four output words of Philox-4x32-``rounds`` for key ``seed`` and counters ``(counter, 0, 0)`` (int64
    counters, split into two 32-bit words), as int64 tensors of uint32 values."""
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    c0, c1 = counter & _M32, (counter >> 32) & _M32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & _M32, (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def random_bits(seed: int, offset: torch.Tensor, rounds: int) -> torch.Tensor:
    """The 16 random bits of each flat element offset (half ``offset % 2`` of word ``(offset % 8) // 2`` of its
    group's counter ``offset - offset % 8``)."""
    words = torch.stack(philox4x32(seed, offset - offset % 8, rounds), dim=-1)
    word = words.gather(-1, ((offset % 8) // 2).unsqueeze(-1)).squeeze(-1)
    return (word >> (16 * (offset % 2))) & 0xFFFF


def round_to_fp16(x: torch.Tensor, seed: int, offset: torch.Tensor, rounds: int) -> torch.Tensor:
    """``x`` (fp32) rounded stochastically to fp16 with 13 random bits per element from :func:`random_bits`."""
    bits = x.contiguous().view(torch.int32).to(torch.int64) & _M32
    sign = bits & 0x80000000
    mag = (bits & 0x7FFFFFFF) + (random_bits(seed, offset, rounds) & 0x1FFF)
    exp = (mag >> 23) & 0xFF
    mant = mag & 0x7FFFFF
    normal = ((exp - 112) << 10) | (mant >> 13)
    h = torch.where(exp > 142, torch.full_like(mag, 0x7C00), normal)
    h = torch.where(exp < 113, torch.zeros_like(mag), h)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    inf = (bits & 0x7FFFFFFF) == 0x7F800000
    h = torch.where(inf, torch.full_like(mag, 0x7C00), h)
    h = torch.where(nan, torch.full_like(mag, 0x7E00), h)
    h = h | (sign >> 16)
    return (h - ((h & 0x8000) << 1)).to(torch.int16).view(torch.float16)  # the uint16 bits as int16


def round_scaled(x: torch.Tensor, fmt, seed: int, offset: torch.Tensor, rounds: int) -> torch.Tensor:
    """The scaled fp32 values ``x`` rounded stochastically to the numbers of the block-scaled ``fmt``
    (``mate_kernels.formats.StateFormat``, int8 or fp8-e4m3), 16 random bits each from :func:`random_bits`."""
    a = x.abs()
    if fmt.integer:
        step_bits = torch.full_like(a, 1.0).view(torch.int32)
    else:  # the binade's step, at least the smallest (below the smallest normal)
        step_bits = ((a.view(torch.int32) & 0x7F800000) - (fmt.mantissa << 23)).clamp(min=(127 + fmt.min_exp) << 23)
    step = step_bits.view(torch.float32)
    v = a * (0x7F000000 - step_bits).view(torch.float32)  # a / step, exactly (the steps are powers of two)
    k = torch.floor(v)
    u = random_bits(seed, offset, rounds).to(torch.float32)
    up = (v - k) * 65536.0 >= 65536.0 - u  # the remainder's 16 bits plus u carry: exact, no addition rounded
    r = torch.clamp((k + up.to(torch.float32)) * step, max=fmt.qmax)
    return torch.where(x < 0, -r, r).to(getattr(torch, fmt.name))


__all__ = ["layer_seed", "philox4x32", "random_bits", "round_scaled", "round_to_fp16"]
