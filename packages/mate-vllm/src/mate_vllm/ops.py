"""vLLM 0.33's native Mamba2 op signatures, served by MATE.

``selective_state_update`` follows vLLM's Triton op (``vllm/model_executor/layers/mamba/ops/mamba_ssm.py``):

* ``D`` and ``dt_bias`` are positional (after ``C``); ``out`` is required and written in place; returns None.
* **Without** ``state_batch_indices`` sequence ``b`` reads and writes slot ``b`` and nothing is masked: the
  sentinel only applies to entries of a given table (vLLM's kernel compares ``null_block_id`` with the loaded
  table entry, never with ``b``). A ``dst_state_batch_indices`` without a source table is ignored, as vLLM's
  kernel does (its destination pointer is then slot ``b``).
* **With** a table the sentinel is ``null_block_id`` (default **0**: slot 0 is vLLM's reserved null block). A
  row whose *source* slot is null reads a zero state and writes no state at all; a null destination entry is
  skipped.
* Without ``num_accepted_tokens`` the sequence writes one final state, to ``dst[b, 0]`` (to ``src[b, 0]``
  without a destination table, to slot ``b`` without any table), also for multi-token packed rows
  (``cu_seqlens``). With it, the read slot is ``src[b, max(acc - 1, 0)]`` and token ``t`` publishes its state
  to ``dst[b, t]`` (``src[b, t]`` without a destination table).
* A flat ``[n]`` table is vLLM's ``unsqueeze(1)``: entry ``(b, t)`` is ``table[b + t]`` (the MTP6 form).
* Dtypes: vLLM's kernel loads every operand and computes in fp32, so any float dtype is valid there. A bf16 /
  fp16 ``A`` is cast to fp32 here (exact); B/C in fp32 beside a bf16/fp16 ``x`` are served by the runtime;
  ``z``/``out`` in another dtype than ``x``, and B/C in a 16-bit dtype other than ``x``'s, raise
  ``NotImplementedError``.
* ``is_blackwell`` is a tuning hint (ignored: MATE picks its own tiling).
* ``enable_stochastic_rounding`` (an fp16 state; ``--enable-mamba-cache-stochastic-rounding``): as vLLM's kernel,
  the final state store is rounded stochastically with a fresh seed per call (``torch.randint`` on the state's
  device, so a captured graph draws a new one per replay) and ``cache_philox_rounds`` Philox rounds (0: 10, as
  ``tl.randint``); the per-token stores of speculative decoding (``num_accepted_tokens``) round to nearest, as
  there. The random bits are MATE's (``mate.mamba._reference.rounding``), not Triton's: the same distribution, other
  values.

Difference kept on purpose: when the source slot is live but the final-write destination ``dst[b, 0]`` is the
null block, vLLM's kernel writes into the null block (slot 0, whose contents vLLM never reads); MATE skips it.

``mamba_chunk_scan_combined_varlen`` is :func:`mate.mamba.adapters.mamba_chunk_scan_combined_varlen`: vLLM's
positional order (``initial_states`` right after ``dt_bias``), vLLM 0.33's ``final_states_out`` /
``final_state_indices`` (the final states go straight into the state pool and None is returned), the returned
states in ``state_dtype``, else in ``C``'s dtype (vLLM's rule, also with fp32 ``initial_states``).
"""

from __future__ import annotations

import torch
from mate.mamba.adapters import mamba_chunk_scan_combined_varlen

from ._adapter import adapter

NULL_BLOCK_ID = 0
_HALF = (torch.bfloat16, torch.float16)
_FLOAT = (torch.float32, *_HALF)  # the dtypes MATE computes in; others are the runtime's ValueError


def _fp32_keeping_broadcasts(t):
    """``t`` in fp32 with its stride-0 (tied, per-head) dims kept: a plain cast copies into dense strides,
    which would turn the tied form into the untied one (a slower kernel for the same numbers)."""
    keep = tuple(slice(None) if s else slice(0, 1) for s in t.stride())
    return t[keep].float().expand(t.shape)


def _dtype(t):
    return getattr(t, "dtype", None)


def _unserved_dtypes(x, B, C, z, out):
    """The dtype mixes vLLM's kernel computes (it loads every operand as fp32) that MATE does not serve: a
    ``NotImplementedError`` naming the form, instead of the runtime's ``ValueError`` for a foreign request."""
    xd = x.dtype
    if _dtype(B) is xd and _dtype(C) is xd and _dtype(out) is xd and (z is None or _dtype(z) is xd):
        return  # every operand in x's dtype (every decode call): served, nothing more to look at
    if xd not in _FLOAT:
        return  # not a float x: the runtime's ValueError says what is wrong
    for name, t in (("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            continue
        served = t.dtype == xd or (t.dtype == torch.float32 and xd in _HALF)
        if t.dtype in _FLOAT and not served:
            raise NotImplementedError(
                f"{name} in {str(t.dtype).removeprefix('torch.')} beside x in {str(xd).removeprefix('torch.')} "
                "is not supported by MATE yet (B/C in x's dtype, or fp32 beside a bf16/fp16 x)"
            )
    for name, t in (("z", z), ("out", out)):
        if isinstance(t, torch.Tensor) and t.dtype in _FLOAT and t.dtype != xd:
            raise NotImplementedError(
                f"{name} in {str(t.dtype).removeprefix('torch.')} beside x in {str(xd).removeprefix('torch.')} "
                f"is not supported by MATE yet ({name} in x's dtype)"
            )


def selective_state_update(
    state,
    x,
    dt,
    A,
    B,
    C,
    D,
    dt_bias,
    z=None,
    dt_softplus=False,
    state_batch_indices=None,
    dst_state_batch_indices=None,
    null_block_id=NULL_BLOCK_ID,
    out=None,
    num_accepted_tokens=None,
    cu_seqlens=None,
    is_blackwell=False,
    enable_stochastic_rounding=False,
    cache_philox_rounds=0,
):
    """vLLM's ``selective_state_update`` (see the module docstring). Writes ``out`` and the state pool."""
    if out is None:
        raise ValueError("out: got None; expected a preallocated tensor shaped like x (vLLM's op writes it in place)")
    if not isinstance(cache_philox_rounds, int) or isinstance(cache_philox_rounds, bool) or cache_philox_rounds < 0:
        raise ValueError(f"cache_philox_rounds: got {cache_philox_rounds!r}; expected a non-negative int")
    rand_seed = None
    if enable_stochastic_rounding:
        if isinstance(state, torch.Tensor) and state.dtype != torch.float16:
            raise ValueError(
                f"state: got dtype {str(state.dtype).removeprefix('torch.')}; expected float16 with "
                "enable_stochastic_rounding (vLLM's kernel rounds into an fp16 state)"
            )
        if num_accepted_tokens is None and isinstance(state, torch.Tensor):  # (vLLM: the final store only)
            rand_seed = torch.randint(0, 2**32, (1,), device=state.device)
    if num_accepted_tokens is not None and state_batch_indices is None:
        raise ValueError("state_batch_indices: got None; expected a slot table when num_accepted_tokens is given")
    if isinstance(x, torch.Tensor):
        _unserved_dtypes(x, B, C, z, out)
    if isinstance(A, torch.Tensor) and A.dtype in _HALF:
        A = _fp32_keeping_broadcasts(A)  # vLLM's kernel loads A as fp32; the cast is exact
    if state_batch_indices is None:
        # vLLM masks only loaded table entries: implicit slots 0..b-1 are all live (slot 0 included), and a
        # destination table without a source table is never read. -1 is no slot, so nothing is masked.
        null_block_id, dst_state_batch_indices = -1, None
    # positionally, in mate.mamba.selective_state_update's order (binding 13 keywords costs ~0.6 us a call)
    adapter().runtime().selective_state_update(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, null_block_id,
        None,  # state_scale
        out,
        False, None, None, None,  # disable_state_update, intermediate_states_buffer, its indices, its scales
        rand_seed, cache_philox_rounds or 10,
        0, "auto",  # cache_steps, algorithm
        dst_state_batch_indices, cu_seqlens, num_accepted_tokens,
        "auto",  # backend
        final_write_to_dst=num_accepted_tokens is None,
    )  # fmt: skip
    return None


def rms_norm_gated(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """vLLM 0.33's ``layernorm_gated.rms_norm_gated`` (its Triton kernel, ``is_rms_norm=True``): the same signature,
    arithmetic (fp32, one rounding on the store) and result, a new tensor of x's shape; bad input is MATE's
    ``ValueError`` where vLLM asserts."""
    return (
        adapter()
        .runtime()
        .rms_norm_gated(x, weight, bias, z=z, eps=eps, group_size=group_size, norm_before_gate=norm_before_gate)
    )


# vLLM's own conv1d functions, set by the plugin when it routes them: a call form MATE refuses
# (NotImplementedError, raised before anything is written) runs there instead, with one warning per reason.
ENGINE_CONV1D: dict = {}
_REFUSED: set = set()


def _or_vllms(name, call, args):
    try:
        return call()
    except NotImplementedError as e:
        orig = ENGINE_CONV1D.get(name)
        if orig is None:
            raise
        reason = str(e)
        if reason not in _REFUSED:
            _REFUSED.add(reason)
            adapter().warn(f"{name}: MATE does not serve this call ({reason}); vLLM's own {name} runs it")
        return orig(*args)


def causal_conv1d_fn(
    x,
    weight,
    bias,
    conv_states,
    query_start_loc,
    cache_indices=None,
    has_initial_state=None,
    activation="silu",
    pad_slot_id=-1,
    null_block_id=NULL_BLOCK_ID,
    metadata=None,
    validate_data=False,
):
    """vLLM 0.33's ``causal_conv1d_fn`` (``ops/causal_conv1d.py``, the packed prefill), the same signature and result:
    ``mate.mamba.causal_conv1d_fn``. ``metadata`` (vLLM's launch-grid cache) and ``validate_data`` change no result."""
    args = (x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, activation,
            pad_slot_id, null_block_id, metadata, validate_data)  # fmt: skip
    return _or_vllms("causal_conv1d_fn", lambda: adapter().runtime().causal_conv1d_fn(*args), args)


def _update_entry(route, doc):
    """vLLM 0.33's ``causal_conv1d_update`` signature (written once) over ``route(args)``, the arguments as one
    positional tuple."""

    def causal_conv1d_update(
        x,
        conv_state,
        weight,
        bias=None,
        activation=None,
        conv_state_indices=None,
        num_accepted_tokens=None,
        query_start_loc=None,
        max_query_len=-1,
        null_block_id=NULL_BLOCK_ID,
        validate_data=False,
        out=None,
    ):
        return route((x, conv_state, weight, bias, activation, conv_state_indices, num_accepted_tokens,
                      query_start_loc, max_query_len, null_block_id, validate_data, out))  # fmt: skip

    causal_conv1d_update.__doc__ = doc
    return causal_conv1d_update


def _mate_update(args):
    return _or_vllms("causal_conv1d_update", lambda: adapter().runtime().causal_conv1d_update(*args), args)


causal_conv1d_update = _update_entry(
    _mate_update,
    """vLLM 0.33's ``causal_conv1d_update`` (the decode step, one token or MTP), the same signature and result, the
    pool updated in place: ``mate.mamba.causal_conv1d_update``.""",
)

# MATE_VLLM_CONV1D=auto: MATE's causal_conv1d_update serves one-token calls (no num_accepted_tokens, no
# query_start_loc) of at least this many sequences, vLLM's the rest. Measured against vLLM 0.33's Triton kernel,
# graph-replayed, Nemotron-H 8B's conv dim 10240, width 4, bf16 (docs/benchmarks/conv1d.md, H100, 2026-12-07 at
# 893c4dd): one token 0.82x at batch 1, 2.0x at 64, 2.57x at 1024; MTP 6 0.58x / 0.90x / 1.08x; the prefill 0.68x.
CONV1D_UPDATE_MIN_BATCH = 64


def serves_conv1d_update(x, num_accepted_tokens, query_start_loc) -> bool:
    """Whether ``MATE_VLLM_CONV1D=auto`` gives a ``causal_conv1d_update`` call to MATE
    (:data:`CONV1D_UPDATE_MIN_BATCH`); read from the arguments' shapes only (no device sync, so a captured graph
    keeps its choice)."""
    one_token = num_accepted_tokens is None and query_start_loc is None
    return one_token and isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] >= CONV1D_UPDATE_MIN_BATCH


def _auto_update(args):
    if serves_conv1d_update(args[0], args[6], args[7]):
        return _mate_update(args)
    return ENGINE_CONV1D["causal_conv1d_update"](*args)


causal_conv1d_update_auto = _update_entry(
    _auto_update,
    """vLLM 0.33's ``causal_conv1d_update`` under ``MATE_VLLM_CONV1D=auto`` (its signature): MATE's
    (:func:`causal_conv1d_update`) for the calls :func:`serves_conv1d_update` names, vLLM's own function for the
    rest.""",
)
causal_conv1d_update_auto.__name__ = causal_conv1d_update_auto.__qualname__ = "causal_conv1d_update_auto"


def checkpointing_ssu(*args, **kwargs) -> torch.Tensor:
    """vLLM 0.33's ReplaySSM decode kernel slot (``ssu_dispatch._flashinfer_replayssm_kernel``): called with
    FlashInfer 0.7.2's ``checkpointing_ssu`` arguments (vLLM passes the scratch trio and ``pad_slot_id`` 0, the
    null block; D / dt_bias bf16 ``[H, P]`` of stride 0 over P; dt of stride 0 over P), which are
    ``mate.mamba.replay_state_update``'s; returns ``out``. The scratch tensors are validated and unused."""
    return adapter().runtime().replay_state_update(*args, **kwargs)


# checkpointing_ssu's arguments up to ``out``, in FlashInfer 0.7.2's order (vLLM passes them positionally)
REPLAY_ARGS = ("state", "x_cache", "B_cache", "dt_cache", "ring_start", "prev_num_accepted_tokens", "x", "dt", "A",
               "B", "C", "out")  # fmt: skip


def replay_call_key(args, kwargs) -> tuple:
    """What :mod:`mate_vllm.replay_rule` decides a ``checkpointing_ssu`` call by: (state dtype name, tokens per
    step, batch, heads, head dim, state size, groups). Packed calls (``cu_seqlens``) count ``max_seqlen`` tokens."""
    got = {**dict(zip(REPLAY_ARGS, args, strict=False)), **kwargs}  # (the positional ones; the rest by name)
    state, x, B, cu = got["state"], got["x"], got["B"], got.get("cu_seqlens")
    T, batch = (got["max_seqlen"], cu.shape[0] - 1) if cu is not None else (x.shape[1], x.shape[0])
    _, H, P, N = state.shape
    return str(state.dtype).removeprefix("torch."), int(T), int(batch), H, P, N, B.shape[-2]


def routed_checkpointing_ssu(flashinfer, rule):
    """vLLM's ReplaySSM kernel slot under ``rule`` (a :class:`mate_vllm.replay_rule.Rule`): each call runs
    :func:`checkpointing_ssu` (MATE) or ``flashinfer`` (FlashInfer's kernel, which vLLM put in the slot) as the rule
    says for its :func:`replay_call_key`. A decision is kept per key, so a call costs one dict lookup more (and a
    CUDA graph, captured per batch size, none). A call whose key cannot be read goes to MATE, whose contract names
    the bad argument."""
    chosen: dict = {}

    def checkpointing_ssu_routed(*args, **kwargs):
        try:
            key = replay_call_key(args, kwargs)
        except (KeyError, AttributeError, IndexError, TypeError, ValueError):
            return checkpointing_ssu(*args, **kwargs)
        fn = chosen.get(key)
        if fn is None:
            fn = chosen[key] = checkpointing_ssu if rule.kernel(*key) == "mate" else flashinfer
        return fn(*args, **kwargs)

    return checkpointing_ssu_routed


__all__ = [
    "selective_state_update", "mamba_chunk_scan_combined_varlen", "checkpointing_ssu", "routed_checkpointing_ssu",
    "replay_call_key", "rms_norm_gated",
    "causal_conv1d_fn", "causal_conv1d_update", "NULL_BLOCK_ID",
]  # fmt: skip
