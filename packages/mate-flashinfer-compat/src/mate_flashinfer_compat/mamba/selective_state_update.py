"""FlashInfer 0.7.2's ``flashinfer.mamba.selective_state_update`` served by MATE (names, order, defaults, return
value, semantics).

FlashInfer semantics reproduced here (read from FlashInfer 0.7.2's Python wrapper and CUDA kernels), where they
differ from ``mate.mamba``:

* **Path choice.** 3-D ``x`` without ``cu_seqlens`` and ``cache_steps == 0`` is the one-token path; 3-D ``x``
  with ``cu_seqlens`` is the packed multi-token path (``cache_steps`` = the maximum sequence length, required
  >= 1); 4-D ``x``, or 3-D ``x`` with ``cache_steps >= 1`` (one token), is the dense multi-token path.
* **One-token path.** Reads ``src[b]`` (column 0 of a 2-D table) and writes the new state to ``dst[b]`` (to
  ``src[b]`` without a destination table) unless ``disable_state_update``; a sentinel read slot reads zeros and
  writes nothing. ``num_accepted_tokens`` is ignored on this path, as FlashInfer's kernel does (the read slot
  stays ``src[b, 0]``). FlashInfer also ignores ``intermediate_states_buffer`` here; MATE rejects it
  (``ValueError``) instead of silently not writing a buffer the caller asked for.
* **Multi-token paths: three exclusive write modes.** A destination table publishes every token's state to
  ``dst[b, t]`` *even with* ``disable_state_update=True`` (FlashInfer does not gate it); an
  ``intermediate_states_buffer`` takes every token's state at ``buf[idx * cache_steps + t]`` (``idx`` =
  ``intermediate_state_indices[b]``, else the read slot) and the pool is not written, also regardless of
  ``disable_state_update``; otherwise only the final state is written back to the *read* slot (with
  ``num_accepted_tokens``: ``src[b, acc - 1]``), gated by ``disable_state_update``. Destination + buffer is a
  ``ValueError``. A sentinel read slot writes nothing; a sentinel destination entry is skipped.
* **Flat tables** ``[n]`` on the multi-token paths name entry ``b`` for every token (FlashInfer addresses a 1-D
  table with a zero token stride), unlike ``mate.mamba`` / vLLM's Triton kernel (entry ``b + t``).
* ``algorithm``: ``auto``, ``simple``, ``vertical``, ``horizontal`` and the legacy ``async_horizontal``
  (= ``simple``) are accepted (MATE picks its own tiling); anything else is a ``ValueError``. ``backend``:
  FlashInfer's ``auto`` / ``flashinfer`` / ``cake`` all mean MATE's automatic choice; MATE's own ``tilelang`` /
  ``torch`` select that backend. ``rand_seed`` / ``philox_rounds`` round an fp16 state's writes
  stochastically with FlashInfer's generator (Philox-4x32) and rule (13 random bits below the fp16 mantissa,
  truncated); MATE draws one counter per eight values where FlashInfer draws one per four, so the bits differ
  from FlashInfer's, the distribution does not (``mate.mamba._reference.rounding``); another state dtype with a
  seed raises ``NotImplementedError``. An int16 ``state`` with ``state_scale`` (and an int16
  ``intermediate_states_buffer`` with ``intermediate_state_scales``) is FlashInfer's block-scaled state, served
  by both of MATE's backends; unlike FlashInfer, a scale beside a float state, or an int16 tensor without its
  scales, is a ``ValueError``.

* **Dtypes.** FlashInfer compiles its kernel per (state, x, dt, A, index) dtype: B/C/z/out in x's dtype,
  D/dt_bias in dt's dtype, A in fp32/bf16/fp16. A bf16/fp16 ``A`` is cast to fp32 here (exact: FlashInfer
  computes in fp32 too).

MATE is more permissive than FlashInfer's kernels in what it accepts (untied dt/A/D/dt_bias, ``D=None``,
strided x/B/C rows, D/dt_bias in another dtype than dt, source/destination/intermediate tables of different
int dtypes, B/C in fp32 beside a bf16/fp16 x); every form FlashInfer accepts means the same here.
"""

from __future__ import annotations

import torch

from .._adapter import adapter

ALGORITHMS = ("auto", "simple", "vertical", "horizontal")
_BACKENDS = {"auto": "auto", "flashinfer": "auto", "cake": "auto", "tilelang": "tilelang", "torch": "torch"}


def _bad(name, value, expected):
    desc = (
        f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})" if isinstance(value, torch.Tensor) else repr(value)
    )
    raise ValueError(f"{name}: got {desc}; expected {expected}")


def _fp32_keeping_broadcasts(t):
    """``t`` in fp32 with its stride-0 (tied, per-head) dims kept: a plain cast copies into dense strides,
    which would turn the tied form into the untied one (a slower kernel for the same numbers)."""
    keep = tuple(slice(None) if s else slice(0, 1) for s in t.stride())
    return t[keep].float().expand(t.shape)


def _per_token_table(table, tokens):
    """FlashInfer reads a 1-D table with a zero token stride: every token of sequence b names entry b."""
    if table is None or not isinstance(table, torch.Tensor) or table.dim() != 1:
        return table
    return table.unsqueeze(1).expand(table.shape[0], max(tokens, 1))


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    state_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    intermediate_state_scales: torch.Tensor | None = None,
    rand_seed: torch.Tensor | None = None,
    philox_rounds: int = 10,
    cache_steps: int = 0,
    algorithm: str = "auto",
    dst_state_batch_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """FlashInfer 0.7.2's ``flashinfer.mamba.selective_state_update``, served by MATE (see the module docstring
    for the semantics). Returns ``out`` (or a new tensor shaped like FlashInfer's normalised ``x``)."""
    mamba = adapter().runtime()
    if algorithm == "async_horizontal":  # FlashInfer's backward-compatible alias
        algorithm = "simple"
    if algorithm not in ALGORITHMS:
        _bad("algorithm", algorithm, f"one of {ALGORITHMS + ('async_horizontal',)}")
    mate_backend = _BACKENDS.get(backend) if isinstance(backend, str) else None
    if mate_backend is None:
        _bad("backend", backend, f"one of {tuple(_BACKENDS)}")
    if intermediate_states_buffer is not None and dst_state_batch_indices is not None:
        raise ValueError("intermediate_states_buffer and dst_state_batch_indices are mutually exclusive")
    if not isinstance(cache_steps, int) or isinstance(cache_steps, bool) or cache_steps < 0:
        _bad("cache_steps", cache_steps, "an int >= 0")
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            _bad(name, t, "a torch.Tensor")
    if A.dtype in (torch.bfloat16, torch.float16):
        A = _fp32_keeping_broadcasts(
            A
        )  # FlashInfer's matrixA_t may be 16-bit; it computes in fp32, so the cast is exact

    # FlashInfer's canonical forms (its wrapper's unsqueezes), so the same calls mean the same thing.
    is_varlen = cu_seqlens is not None and x.dim() == 3
    is_mtp = cache_steps >= 1 and not is_varlen
    if state.dim() == 3:
        state = state.unsqueeze(1)
    if A.dim() == 2:
        A = A.unsqueeze(0)
    if isinstance(D, torch.Tensor) and D.dim() == 1:
        D = D.unsqueeze(0)
    if isinstance(dt_bias, torch.Tensor) and dt_bias.dim() == 1:
        dt_bias = dt_bias.unsqueeze(0)

    def canon(t):
        if t is None or is_varlen:
            return t
        if t.dim() == 2:
            t = t.unsqueeze(1)
        if is_mtp and t.dim() == 3:
            t = t.unsqueeze(1)
        return t

    x_in = x
    x, dt, B, C, z = canon(x), canon(dt), canon(B), canon(C), canon(z)
    if cu_seqlens is not None and not is_varlen:
        _bad("cu_seqlens", cu_seqlens, "None with a 4-D x (packed rows use a 3-D x [total_tokens, heads, dim])")
    if x.dim() not in (3, 4):
        _bad("x", x_in, "[batch, dim], [batch, heads, dim], [batch, T, heads, dim] or packed [tokens, heads, dim]")

    if out is None:
        output = result = torch.empty_like(x)
    else:
        result = out
        output = out if out.shape == x.shape else out.view(x.shape)

    one_token = x.dim() == 3 and not is_varlen
    if one_token:
        if intermediate_states_buffer is not None:
            _bad(
                "intermediate_states_buffer",
                intermediate_states_buffer,
                "None on FlashInfer's one-token path (3-D x, no cu_seqlens, cache_steps=0), which never writes it; "
                "pass cache_steps >= 1 for the multi-token path",
            )
        # num_accepted_tokens: FlashInfer's one-token kernel never reads it (the read slot is src[b, 0]); a
        # consumer that passes it on this path gets exactly that, so it is not forwarded.
        # positionally, in mate.mamba.selective_state_update's order (binding a dozen keywords costs ~0.6 us)
        mamba.selective_state_update(
            state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, state_scale, output,
            disable_state_update,
            None, None,  # intermediate_states_buffer, intermediate_state_indices
            intermediate_state_scales, rand_seed, philox_rounds,
            0,  # cache_steps
            algorithm, dst_state_batch_indices,
            None, None,  # cu_seqlens, num_accepted_tokens
            mate_backend,
            final_write_to_dst=True,
        )  # fmt: skip
        return result

    if is_varlen:
        if cache_steps < 1:
            _bad("cache_steps", cache_steps, ">= 1 with cu_seqlens (FlashInfer: the maximum sequence length)")
        tokens = cache_steps
    else:
        tokens = x.shape[1]
        if intermediate_states_buffer is not None and cache_steps < 1:
            _bad("cache_steps", cache_steps, ">= 1 with intermediate_states_buffer (the buffer's steps per entry)")
    src = _per_token_table(state_batch_indices, tokens)
    dst = _per_token_table(dst_state_batch_indices, tokens)
    if intermediate_states_buffer is not None or dst is not None:
        disable_state_update = False  # FlashInfer gates only the final write on it
    mamba.selective_state_update(  # positionally, as above
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, src, pad_slot_id, state_scale, output,
        disable_state_update, intermediate_states_buffer, intermediate_state_indices, intermediate_state_scales,
        rand_seed, philox_rounds, cache_steps, algorithm, dst, cu_seqlens, num_accepted_tokens, mate_backend,
        accepted_writes_per_token=False,
    )  # fmt: skip
    return result


__all__ = ["selective_state_update"]
