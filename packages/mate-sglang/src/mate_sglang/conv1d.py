"""SGLang 0.5.23's causal conv1d entry points, served by MATE's vLLM-shaped ``causal_conv1d_fn`` /
``causal_conv1d_update``.

SGLang has two layers, both replaced when ``MATE_SGLANG_CONV1D=1``:

* the Triton functions of ``sglang/kernels/ops/mamba/causal_conv1d_triton.py``, which the mixers, the GDN / KDA
  backends and LFM2 import by name, some under ``*_triton`` aliases: :func:`causal_conv1d_fn_triton` (``x [dim,
  tokens]`` packed, the pool before ``query_start_loc``, the host-side ``seq_lens_cpu`` its launch grid needs) and
  :func:`causal_conv1d_update_triton` (``x [batch, dim]`` or ``[batch, dim, seqlen]``, ``num_accept_tokens``, the
  speculative verify's intermediate windows and EAGLE tree tables);
* the wrappers of ``sglang/srt/layers/attention/mamba/causal_conv1d.py`` (:func:`causal_conv1d_fn`,
  :func:`causal_conv1d_update`), which on CUDA run SGLang's compiled kernel and elsewhere the Triton functions.

The mapping onto MATE: the sentinel is ``pad_slot_id`` (-1) and there is no null block (MATE's ``null_block_id`` is
None in the prefill and ``pad_slot_id`` in the update, which knows one sentinel); ``num_accept_tokens`` is vLLM's
``num_accepted_tokens`` (the same sliding window); ``seq_lens_cpu`` and ``metadata`` are launch data, unused. Results
as SGLang returns them: the Triton update writes a new tensor and leaves ``x`` alone; the wrapper's update writes into
``x`` and returns it (its compiled kernel's form); both prefill layers return a new tensor (the wrapper's compiled
kernel writes into ``x``, its Triton path does not; SGLang's callers use the returned tensor). SGLang's kernels read the
history in ``x``'s dtype, vLLM's and MATE's read ``x`` in the pool's: where the two agree (every served model) the
arithmetic is the same.

A call form listed in :func:`refusal` runs SGLang's own function (set in :data:`ENGINE_CONV1D` by the hook), and so
does a call MATE refuses with ``NotImplementedError``; each reason is warned once per process. Outside SGLang (no
engine function recorded) such a call raises ``NotImplementedError`` naming the reason.
"""

from __future__ import annotations

from ._adapter import adapter

PAD_SLOT_ID = -1

# SGLang's functions, by the name the hook replaced: what a call MATE does not serve runs.
ENGINE_CONV1D: dict = {}
_REFUSED: set = set()


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def refusal(x, pool, *, query_start_loc=True, block_table=None, cache_seqlens=None, spec_tree=()) -> str | None:
    """Why MATE does not serve an SGLang conv1d call (None: it does). ``query_start_loc`` True: not a prefill."""
    if pool is None:
        return "no conv_states (MATE's prefill updates a state pool)"
    if query_start_loc is None:
        return "no query_start_loc (the [batch, dim, seqlen] prefill form)"
    if block_table is not None:
        return "block_table (SGLang's CUDA-graph prefill launch table)"
    if cache_seqlens is not None:
        return "cache_seqlens (a circular-buffer conv state)"
    if any(t is not None for t in spec_tree):
        return "intermediate_conv_window / retrieve_* (the speculative verify's per-step windows and EAGLE trees)"
    if getattr(x, "dtype", None) is not None and getattr(pool, "dtype", None) not in (None, x.dtype):
        return (
            f"x in {_dtype(x)} beside a {_dtype(pool)} conv state (SGLang reads the history in x's dtype, MATE reads x "
            "in the pool's)"
        )
    return None


def _run(name, reason, serve, args, kwargs):
    if reason is None:
        try:
            return serve()
        except NotImplementedError as e:
            reason = str(e)
    orig = ENGINE_CONV1D.get(name)
    if orig is None:
        raise NotImplementedError(f"{name}: MATE does not serve {reason}")
    if (name, reason) not in _REFUSED:
        _REFUSED.add((name, reason))
        adapter().warn(f"{name}: MATE does not serve {reason}; SGLang's own function runs this call form")
    return orig(*args, **kwargs)


def _pad(pad_slot_id) -> int:
    return PAD_SLOT_ID if pad_slot_id is None else pad_slot_id  # None: SGLang masks nothing; -1 is no slot either


def causal_conv1d_fn_triton(x, weight, bias, conv_states, query_start_loc, seq_lens_cpu, cache_indices=None,
                            has_initial_state=None, activation="silu", pad_slot_id=PAD_SLOT_ID, validate_data=False,
                            block_table=None, **kwargs):  # fmt: skip
    """SGLang's Triton ``causal_conv1d_fn``: a new ``[dim, tokens]`` tensor, the pool updated in place."""
    args = (x, weight, bias, conv_states, query_start_loc, seq_lens_cpu, cache_indices, has_initial_state, activation,
            pad_slot_id, validate_data, block_table)  # fmt: skip
    reason = refusal(x, conv_states, query_start_loc=query_start_loc, block_table=block_table)

    def serve():
        return adapter().runtime().causal_conv1d_fn(
            x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, activation,
            pad_slot_id=_pad(pad_slot_id), null_block_id=None,
        )  # fmt: skip

    return _run("causal_conv1d_fn_triton", reason, serve, args, kwargs)


def causal_conv1d_update_triton(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                                conv_state_indices=None, num_accept_tokens=None, intermediate_conv_window=None,
                                intermediate_state_indices=None, retrieve_next_token=None, retrieve_next_sibling=None,
                                retrieve_parent_token=None, pad_slot_id=PAD_SLOT_ID, metadata=None,
                                validate_data=False):  # fmt: skip
    """SGLang's Triton ``causal_conv1d_update``: a new tensor of x's shape (x untouched; rows of a ``pad_slot_id``
    sequence left unwritten), the pool updated in place."""
    args = (x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices, num_accept_tokens,
            intermediate_conv_window, intermediate_state_indices, retrieve_next_token, retrieve_next_sibling,
            retrieve_parent_token, pad_slot_id, metadata, validate_data)  # fmt: skip
    tree = (intermediate_conv_window, retrieve_next_token, retrieve_next_sibling, retrieve_parent_token)
    reason = refusal(x, conv_state, cache_seqlens=cache_seqlens, spec_tree=tree)

    def serve():
        import torch

        return adapter().runtime().causal_conv1d_update(
            x, conv_state, weight, bias, activation, conv_state_indices, num_accepted_tokens=num_accept_tokens,
            null_block_id=_pad(pad_slot_id), out=torch.empty_like(x),
        )  # fmt: skip

    return _run("causal_conv1d_update_triton", reason, serve, args, {})


def causal_conv1d_fn(x, weight, bias=None, query_start_loc=None, cache_indices=None, has_initial_state=None,
                     conv_states=None, activation="silu", pad_slot_id=PAD_SLOT_ID, **kwargs):  # fmt: skip
    """SGLang's ``srt/layers/attention/mamba/causal_conv1d.causal_conv1d_fn``: a new ``[dim, tokens]`` tensor, the
    pool updated in place."""
    args = (x, weight, bias, query_start_loc, cache_indices, has_initial_state, conv_states, activation, pad_slot_id)
    reason = refusal(x, conv_states, query_start_loc=query_start_loc, block_table=kwargs.get("block_table"))

    def serve():
        return adapter().runtime().causal_conv1d_fn(
            x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, activation,
            pad_slot_id=_pad(pad_slot_id), null_block_id=None,
        )  # fmt: skip

    return _run("causal_conv1d_fn", reason, serve, args, kwargs)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None, pad_slot_id=PAD_SLOT_ID):  # fmt: skip
    """SGLang's ``srt/layers/attention/mamba/causal_conv1d.causal_conv1d_update``: the result written into ``x`` and
    returned (rows of a ``pad_slot_id`` sequence keep x's values), the pool updated in place."""
    args = (x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices, pad_slot_id)
    reason = refusal(x, conv_state, cache_seqlens=cache_seqlens)

    def serve():
        return (
            adapter()
            .runtime()
            .causal_conv1d_update(
                x, conv_state, weight, bias, activation, conv_state_indices, null_block_id=_pad(pad_slot_id)
            )
        )

    return _run("causal_conv1d_update", reason, serve, args, {})


__all__ = [
    "ENGINE_CONV1D", "PAD_SLOT_ID", "causal_conv1d_fn", "causal_conv1d_fn_triton", "causal_conv1d_update",
    "causal_conv1d_update_triton", "refusal",
]  # fmt: skip
