"""The ``torch.library`` custom ops behind ``mate.mamba``, so ``torch.compile(fullgraph=True)`` traces MATE.

Each op's parameters are written once, in a table (:data:`SSU_PARAMS`, :data:`SSD_PARAMS`,
:data:`REPLAY_PARAMS`: name, schema type, default, and the flags below). From the table come the op's schema
(inferred by ``torch.library`` from a signature built out of the table), the argument order the op's
implementation passes to the normaliser, the traced entries (``trace_ssu`` / ``trace_ssd`` / ``trace_replay``)
and the eager entries' argument split (:meth:`OpTable.entry`). The public functions in ``mate.mamba`` write the
same parameters out once more, as their documented signature, and pass them on in table order; a test holds the
two to the same names, order, defaults and keyword-only rows. Adding a parameter: one table row, the
normaliser's parameter, the public signature (and its docstring).

* ``mate::selective_state_update`` mutates ``state``, ``out``, ``intermediate_states_buffer`` and the block
  scales of quantised states (``state_scale``, ``intermediate_state_scales``) and returns
  nothing (an op may not return an alias of an input: the traced entry allocates ``out`` and returns it).
* ``mate::ssd_combined_fwd_varlen`` mutates ``out`` and ``final_states_out`` and returns the state tensor
  (a new tensor; an empty one when the final states went into ``final_states_out``).
* ``mate::replay_state_update`` mutates ``state`` and ``state_scale`` (a flush), the rings ``x_cache``,
  ``B_cache``, ``dt_cache`` (the appended tokens) and ``out``, and returns nothing.

Each op's real implementation normalises once and dispatches to a backend; its fake implementation runs the
same normaliser on fake tensors, so a bad call is rejected while tracing with the same ``ValueError`` /
``NotImplementedError`` as in eager mode, and allocates the returned state tensor.

Eager calls do not go through the ops: the dispatcher's argument boxing costs far more than the SSU's host
budget. The public functions call the eager path directly unless ``torch.compiler.is_compiling()``, and only
then emit the op through the traced entry.
"""

from __future__ import annotations

import inspect
import linecache
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from mate.mamba._contract.conv1d import normalize_conv1d_fn, normalize_conv1d_update
from mate.mamba._contract.decode_step import normalize_decode_step
from mate.mamba._contract.norm import normalize_norm
from mate.mamba._contract.replay import normalize_materialize_layers, normalize_replay
from mate.mamba._contract.ssd import normalize_ssd
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._dispatch import run

REQUIRED = inspect.Parameter.empty  # the default of a parameter the caller must pass


@dataclass(frozen=True)
class Param:
    """One parameter of an op, in the order of the public signature.

    ``type`` is the op schema's type (``out`` is a plain ``Tensor`` there: the traced entry allocates it when
    the caller passes None). ``mutated``: the op writes it in place. ``keyword``: keyword-only in the public
    signature (whose positional parameters are the other rows, in table order). ``implemented=False``:
    accepted for signature compatibility only; anything but None raises ``NotImplementedError`` in the
    normaliser (the eager fast path sends such calls to it).
    """

    name: str
    type: object
    default: object = REQUIRED
    mutated: bool = False
    keyword: bool = False
    implemented: bool = True

    @property
    def is_tensor(self) -> bool:
        return self.type in (torch.Tensor, torch.Tensor | None)


T, OptT = torch.Tensor, torch.Tensor | None

SSU_PARAMS = (
    Param("state", T, mutated=True),
    Param("x", T),
    Param("dt", T),
    Param("A", T),
    Param("B", T),
    Param("C", T),
    Param("D", OptT),
    Param("z", OptT, None),
    Param("dt_bias", OptT, None),
    Param("dt_softplus", bool, False),
    Param("state_batch_indices", OptT, None),
    Param("pad_slot_id", int, -1),
    Param("state_scale", OptT, None, mutated=True),
    Param("out", T, None, mutated=True),
    Param("disable_state_update", bool, False),
    Param("intermediate_states_buffer", OptT, None, mutated=True),
    Param("intermediate_state_indices", OptT, None),
    Param("intermediate_state_scales", OptT, None, mutated=True),
    Param("rand_seed", OptT, None),
    Param("philox_rounds", int, 10),
    Param("cache_steps", int, 0),
    Param("algorithm", str, "auto"),
    Param("dst_state_batch_indices", OptT, None),
    Param("cu_seqlens", OptT, None),
    Param("num_accepted_tokens", OptT, None),
    # the engines' extensions (keyword-only): SGLang's EAGLE trees, vLLM's one final write, FlashInfer's
    # final-only write with num_accepted_tokens
    Param("retrieve_parent_token", OptT, None, keyword=True),
    Param("final_write_to_dst", bool, False, keyword=True),
    Param("accepted_writes_per_token", bool, True, keyword=True),
    # last in the table (the dispatch choice: the normaliser takes every row but this one); in the public
    # signature it is the seed's last positional parameter, before the extensions
    Param("backend", str, "auto"),
)

SSD_PARAMS = (
    Param("x", T),
    Param("dt", T),
    Param("A", T),
    Param("B", T),
    Param("C", T),
    Param("chunk_size", int),
    Param("cu_seqlens", T),
    Param("cu_chunk_seqlens", T),
    Param("last_chunk_indices", T),
    Param("seq_idx", T),
    Param("out", T, None, mutated=True),
    Param("D", OptT, None),
    Param("z", OptT, None),
    Param("dt_bias", OptT, None),
    Param("dt_softplus", bool, False, keyword=True),
    Param("dt_limit", Sequence[float], (0.0, math.inf), keyword=True),
    Param("initial_states", OptT, None, keyword=True),
    Param("return_intermediate_states", bool, False, keyword=True),
    Param("state_dtype", torch.dtype | None, None, keyword=True),
    Param("checkpoint_token_indices", OptT, None, keyword=True, implemented=False),
    Param("checkpoint_state_slots", OptT, None, keyword=True, implemented=False),
    Param("checkpoint_states", OptT, None, keyword=True, implemented=False),
    Param("final_states_out", OptT, None, keyword=True, mutated=True),
    Param("final_state_indices", OptT, None, keyword=True),
    # block-scaled quantised pools (the SSU's state_scale layout): the scales of initial_states, and those the
    # call writes beside final_states_out
    Param("initial_states_scale", OptT, None, keyword=True),
    Param("final_states_scale", OptT, None, keyword=True, mutated=True),
    Param("backend", str, "auto", keyword=True),
)

# ``mate.mamba.replay_state_update``: FlashInfer 0.7.2's ``checkpointing_ssu`` order
REPLAY_PARAMS = (
    Param("state", T, mutated=True),
    Param("x_cache", T, mutated=True),
    Param("B_cache", T, mutated=True),
    Param("dt_cache", T, mutated=True),
    Param("ring_start", T),
    Param("prev_num_accepted_tokens", T),
    Param("x", T),
    Param("dt", T),
    Param("A", T),
    Param("B", T),
    Param("C", T),
    Param("out", T, mutated=True),
    Param("D", OptT, None),
    Param("z", OptT, None),
    Param("dt_bias", OptT, None),
    Param("dt_softplus", bool, False),
    Param("state_batch_indices", OptT, None),
    Param("pad_slot_id", int, -1),
    Param("state_scale", OptT, None, mutated=True),
    Param("rand_seed", OptT, None),
    Param("philox_rounds", int, 10),
    Param("d_split", int | None, None),
    Param("cu_seqlens", OptT, None),
    Param("max_seqlen", int | None, None),
    Param("enable_pdl", bool, False),
    Param("cb_scaled", OptT, None),
    Param("cumAdt_vec", OptT, None),
    Param("cb_old", OptT, None),
    Param("precompute_heads_per_cta", int, 0),
    Param("algorithm", str, "auto"),
    Param("backend", str, "auto", keyword=True),
)

# ``mate.mamba.rms_norm_gated``: vLLM 0.33's ``rms_norm_gated`` order
NORM_PARAMS = (
    Param("x", T),
    Param("weight", T),
    Param("bias", OptT),
    Param("z", OptT, None),
    Param("eps", float, 1e-6),
    Param("group_size", int | None, None),
    Param("norm_before_gate", bool, True),
    Param("backend", str, "auto", keyword=True),
)

# how the traced entry converts a scalar to its schema type (None: passed as it is)
_COERCE = {
    bool: bool,
    int: None,
    int | None: None,
    float: float,
    str: None,
    torch.dtype | None: None,
    Sequence[float]: lambda v: [float(f) for f in v],
    str | None: None,
}


class OpTable:
    """What one parameter table derives: names, positions, the op's signature and the traced argument list."""

    def __init__(self, params: tuple[Param, ...]):
        if params[-1].name != "backend":
            raise ValueError("the backend parameter comes last (the normaliser takes all the others)")
        self.params = params
        self.names = tuple(p.name for p in params)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.mutated = tuple(p.name for p in params if p.mutated)
        # the tensors a call is keyed on, the scalar options, and what the eager fast path requires of the
        # rest: an exact Python class per scalar and None for what is not implemented
        self.tensor_names = tuple(p.name for p in params if p.is_tensor and p.implemented)
        self.scalar_names = tuple(p.name for p in params if not p.is_tensor)
        self.exact = tuple((self.index[p.name], p.type) for p in params if not p.is_tensor) + tuple(
            (self.index[p.name], None) for p in params if not p.implemented
        )
        self._tensor_pos = tuple(self.index[n] for n in self.tensor_names)
        self._scalar_pos = tuple(self.index[n] for n in self.scalar_names)
        self._coerce = tuple(None if p.is_tensor else _COERCE[p.type] for p in params)
        # the traced entry allocates a plain-Tensor ``out`` the caller left None (an optional one is the op's)
        out = self.index.get("out")
        self._out = out if out is not None and params[out].type is torch.Tensor else None
        self._x = self.index.get("x")  # None: the op has no x (its traced entry allocates its out itself)

    def signature(self, returns) -> inspect.Signature:
        """The op's signature: every parameter positional (the traced entry passes them all), no defaults."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return inspect.Signature(
            [inspect.Parameter(p.name, kind, annotation=p.type) for p in self.params], return_annotation=returns
        )

    def entry(self, name: str, target, *, split: bool = False):
        """A function ``name`` taking the table's parameters, positionally in table order, that returns
        ``target(args)`` (every argument in table order), or with ``split`` ``target(tensors, scalars, args)``:
        the keyed tensors, then either the scalar options and None, when every scalar has exactly its row's
        class and every unimplemented row is None (the call can be keyed; :meth:`join` rebuilds ``args`` from
        the two), or None and ``args``. A split entry's ``target`` is a :class:`mate.mamba._dispatch.FastPath`:
        a keyable call of the form of its latest hit (``target.latest``) is replayed here, one call less.

        Generated once from the table as Python source (kept in ``linecache``, so tracebacks show it): the
        decode fast path runs it on every call, where building the same tuples by position from a packed
        argument tuple costs about 0.3-0.5 us more (measured 2026-12-01 at de44131, 2-core CPU host)."""
        params = ", ".join(self.names)
        body = f"({params},)"
        names = {"_target": target}
        if split:
            terms = []
            for i, cls in self.exact:
                terms.append(_keyable(self.names[i], cls, names))
            tensors = ", ".join(self.tensor_names)
            scalars = ", ".join(self.scalar_names)
            src = (
                f"def {name}({params}):\n"
                f"    if {' and '.join(terms)}:\n"
                f"        t = ({tensors},)\n"
                f"        s = ({scalars},)\n"
                "        latest = _target.latest\n"
                "        if s == latest[0] and latest[1](t):\n"
                "            return latest[2](t)\n"
                "        return _target(t, s, None)\n"
                f"    return _target(({tensors},), None, {body})\n"
            )
        else:
            src = f"def {name}({params}):\n    return _target({body})\n"
        filename = f"<mate.mamba._ops {name}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        exec(compile(src, filename, "exec"), names)  # our own table's source, nothing from outside
        fn = names[name]
        fn.__module__ = getattr(target, "__module__", __name__)
        return fn

    def join(self, tensors: tuple, scalars: tuple) -> tuple:
        """The argument tuple of a keyable call from its keyed tensors and scalar options (the unimplemented
        rows are None)."""
        args = [None] * len(self.names)
        for i, v in zip(self._tensor_pos, tensors, strict=True):
            args[i] = v
        for i, v in zip(self._scalar_pos, scalars, strict=True):
            args[i] = v
        return tuple(args)

    def ordered(self, args: tuple, kwargs: dict) -> tuple:
        """The op's arguments in table order, however the dispatcher passed them."""
        if not kwargs:
            return args
        full = list(args) + [None] * (len(self.names) - len(args))
        for name, value in kwargs.items():
            full[self.index[name]] = value
        return tuple(full)

    def op_args(self, args: tuple) -> list:
        """The traced call's arguments: scalars in the schema's types, ``out`` allocated when None."""
        vals = [v if c is None else c(v) for c, v in zip(self._coerce, args, strict=True)]
        if self._out is not None and vals[self._out] is None:
            x = vals[self._x]
            vals[self._out] = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        return vals


def _keyable(name: str, cls, names: dict) -> str:
    """The source test that argument ``name`` of schema type ``cls`` can be keyed exactly (``names``: the globals
    the test reads): None for an unimplemented row, an exact class, None or an exact class for an optional one,
    a pair of Python numbers for a sequence of floats (the one such row, ``dt_limit``, is a (min, max) pair: another
    value takes the normaliser, which rejects it)."""
    if cls is None:
        return f"{name} is None"
    if typing.get_origin(cls) is Sequence:  # Sequence[float]; no generator (~0.4 us a call)
        names["_number"] = (float, int)
        return (f"({name}.__class__ is tuple and len({name}) == 2 and {name}[0].__class__ in _number and "
                f"{name}[1].__class__ in _number)")  # fmt: skip
    optional = isinstance(cls, types.UnionType)
    (exact,) = [c for c in typing.get_args(cls) if c is not type(None)] if optional else (cls,)
    alias = f"_{exact.__name__}"
    names[alias] = exact
    return f"({name} is None or {name}.__class__ is {alias})" if optional else f"{name}.__class__ is {alias}"


SSU = OpTable(SSU_PARAMS)
SSD = OpTable(SSD_PARAMS)
REPLAY = OpTable(REPLAY_PARAMS)
NORM = OpTable(NORM_PARAMS)

# ------------------------------------------------------------------------------------------------ SSU


def _out_op(name: str, op: str, table: OpTable, normalize):
    """The custom op ``mate::name`` of an op that writes ``out`` in place and returns nothing: its real
    implementation normalises and dispatches, its fake validates only (nothing is allocated)."""

    def impl(*args, **kwargs) -> None:
        args = table.ordered(args, kwargs)
        run(op, normalize(*args[:-1]), args[-1])

    impl.__signature__ = table.signature(None)
    custom = torch.library.custom_op(f"mate::{name}", impl, mutates_args=table.mutated)

    @custom.register_fake
    def fake(*args, **kwargs) -> None:
        normalize(*table.ordered(args, kwargs)[:-1])

    return custom


_out_op("selective_state_update", "ssu", SSU, normalize_ssu)


def _traced_out(table: OpTable, op):
    """The traced call of an op that writes ``out`` and returns nothing: emits ``op``, returns ``out``."""

    def trace(args: tuple) -> torch.Tensor:
        vals = table.op_args(args)
        op(*vals)
        return vals[table.index["out"]]

    return trace


# The traced selective_state_update (the table's parameters, positionally): emits the op, returns out (allocated
# here when None).
trace_ssu = SSU.entry("trace_ssu", _traced_out(SSU, torch.ops.mate.selective_state_update))


# ------------------------------------------------------------------------------------------------ SSD


def _ssd_impl(*args, **kwargs) -> torch.Tensor:
    args = SSD.ordered(args, kwargs)
    call = normalize_ssd(*args[:-1])
    states = run("ssd", call, args[-1])
    if states is None:  # written into final_states_out
        return torch.empty((0,), dtype=call.state_dtype, device=call.x.device)
    return states


_ssd_impl.__signature__ = SSD.signature(torch.Tensor)
_ssd_op = torch.library.custom_op("mate::ssd_combined_fwd_varlen", _ssd_impl, mutates_args=SSD.mutated)


@_ssd_op.register_fake
def _ssd_fake(*args, **kwargs) -> torch.Tensor:
    call = normalize_ssd(*SSD.ordered(args, kwargs)[:-1])
    if call.final_states_out is not None:
        shape = (0,)
    else:
        first = call.nchunks if call.return_intermediate_states else call.batch
        shape = (first, call.heads, call.dim, call.dstate)
    return call.x.new_empty(shape, dtype=call.state_dtype)


def _trace_ssd(args: tuple) -> torch.Tensor | None:
    states = torch.ops.mate.ssd_combined_fwd_varlen(*SSD.op_args(args))
    return None if args[SSD.index["final_states_out"]] is not None else states


# The traced ssd_combined_fwd_varlen (the table's parameters, positionally): emits the op; returns the states, or
# None when they were written into final_states_out.
trace_ssd = SSD.entry("trace_ssd", _trace_ssd)


__all__ = ["SSD", "SSD_PARAMS", "SSU", "SSU_PARAMS", "OpTable", "Param", "trace_ssd", "trace_ssu"]
__all__ += ["CONV1D_FN", "CONV1D_FN_PARAMS", "CONV1D_UPDATE", "CONV1D_UPDATE_PARAMS", "trace_conv1d_fn",
            "trace_conv1d_update"]  # fmt: skip


# ------------------------------------------------------------------------------------------------ ReplaySSM


_out_op("replay_state_update", "replay", REPLAY, normalize_replay)


# The traced replay_state_update (the table's parameters, positionally): emits the op, returns out.
trace_replay = REPLAY.entry("trace_replay", _traced_out(REPLAY, torch.ops.mate.replay_state_update))

__all__ += ["materialize_layers_op", "trace_replay"]


# mate::materialize_replayed_layers (FlashInfer's replayssm_materialize): its pools are reached through address
# tables, so torch sees them only as the anchors ``dependency_inputs`` (read) and ``dependency_outputs`` (written);
# the public function validates, the op normalises again (cheap: no table is read) and dispatches.


def _layers_call(*args):
    tables, (deps_in, deps_out), rest = args[:16], args[16:18], args[18:]
    sdt, idt, adt, dim, dstate, heads, ratio, window, ring, pad, seed, rounds = rest[:12]
    return normalize_materialize_layers(
        *tables, state_dtype=sdt, input_dtype=idt, matrixA_dtype=adt, dim=dim, dstate=dstate, num_heads=heads,
        heads_per_group=ratio, max_window=window, ring_buffer_len=ring, pad_slot_id=pad, rand_seed=seed,
        philox_rounds=rounds, dependency_inputs=deps_in, dependency_outputs=deps_out,
    )  # fmt: skip


@torch.library.custom_op("mate::materialize_replayed_layers", mutates_args=("dependency_outputs",))
def materialize_layers_op(
    state_ptrs: torch.Tensor, state_slot_strides: torch.Tensor, x_cache_ptrs: torch.Tensor,
    x_cache_slot_strides: torch.Tensor, B_cache_ptrs: torch.Tensor, B_cache_slot_strides: torch.Tensor,
    dt_cache_ptrs: torch.Tensor, dt_cache_slot_strides: torch.Tensor, A_ptrs: torch.Tensor,
    state_scale_ptrs: torch.Tensor, state_scale_slot_strides: torch.Tensor, src_slots: torch.Tensor,
    dst_slots: torch.Tensor, ring_start: torch.Tensor, replay_prefix_len: torch.Tensor,
    active_request_indices: torch.Tensor, dependency_inputs: list[torch.Tensor],
    dependency_outputs: list[torch.Tensor], state_dtype: torch.dtype, input_dtype: torch.dtype,
    matrixA_dtype: torch.dtype, dim: int, dstate: int, num_heads: int, heads_per_group: int, max_window: int,
    ring_buffer_len: int, pad_slot_id: int, rand_seed: torch.Tensor | None, philox_rounds: int, backend: str,
) -> None:  # fmt: skip
    args = tuple(locals().values())
    run("materialize_layers", _layers_call(*args[:-1]), backend)


@materialize_layers_op.register_fake
def _materialize_layers_fake(*args) -> None:
    _layers_call(*args[:-1])  # a bad call fails while tracing as it does eagerly


# ------------------------------------------------------------------------------------------------ gated RMSNorm


def _norm_impl(*args, **kwargs) -> torch.Tensor:
    args = NORM.ordered(args, kwargs)
    return run("norm", normalize_norm(*args[:-1]), args[-1])


_norm_impl.__signature__ = NORM.signature(torch.Tensor)
_norm_op = torch.library.custom_op("mate::rms_norm_gated", _norm_impl, mutates_args=())


@_norm_op.register_fake
def _norm_fake(*args, **kwargs) -> torch.Tensor:
    call = normalize_norm(*NORM.ordered(args, kwargs)[:-1])
    return call.out.view(call.shape)


# The traced rms_norm_gated (the table's parameters, positionally): emits the op, returns its new tensor.
trace_norm = NORM.entry("trace_norm", lambda args: torch.ops.mate.rms_norm_gated(*NORM.op_args(args)))


# ------------------------------------------------------------------------------------------------ causal conv1d

# vLLM 0.33's causal_conv1d_fn and causal_conv1d_update, less ``metadata`` and ``validate_data`` (vLLM's launch-grid
# cache and debug asserts, which change no result: the public functions take them and drop them)
CONV1D_FN_PARAMS = (
    Param("x", T),
    Param("weight", T),
    Param("bias", OptT),
    Param("conv_states", T, mutated=True),
    Param("query_start_loc", T),
    Param("cache_indices", OptT, None),
    Param("has_initial_state", OptT, None),
    Param("activation", str | None, "silu"),
    Param("pad_slot_id", int, -1),
    Param("null_block_id", int | None, 0),
    Param("backend", str, "auto", keyword=True),
)

CONV1D_UPDATE_PARAMS = (
    Param("x", T, mutated=True),  # the result goes into x itself without out when x has the pool's dtype
    Param("conv_state", T, mutated=True),
    Param("weight", T),
    Param("bias", OptT, None),
    Param("activation", str | None, None),
    Param("conv_state_indices", OptT, None),
    Param("num_accepted_tokens", OptT, None),
    Param("query_start_loc", OptT, None),
    Param("max_query_len", int, -1),
    Param("null_block_id", int | None, 0),
    Param("out", OptT, None, mutated=True),
    Param("backend", str, "auto", keyword=True),
)

CONV1D_FN = OpTable(CONV1D_FN_PARAMS)
CONV1D_UPDATE = OpTable(CONV1D_UPDATE_PARAMS)


def _activation_name(activation):
    """vLLM's bool activation as the schema's string (``True`` is ``"silu"``); anything else as given."""
    if activation is True:
        return "silu"
    return None if activation is False else activation


def _conv1d_fn_impl(*args, **kwargs) -> torch.Tensor:
    args = CONV1D_FN.ordered(args, kwargs)
    return run("conv1d_fn", normalize_conv1d_fn(*args[:-1]), args[-1])


_conv1d_fn_impl.__signature__ = CONV1D_FN.signature(torch.Tensor)
_conv1d_fn_op = torch.library.custom_op("mate::causal_conv1d_fn", _conv1d_fn_impl, mutates_args=CONV1D_FN.mutated)


@_conv1d_fn_op.register_fake
def _conv1d_fn_fake(*args, **kwargs) -> torch.Tensor:
    return normalize_conv1d_fn(*CONV1D_FN.ordered(args, kwargs)[:-1]).out


def _new_result(call) -> torch.Tensor:
    """What the update op returns: the result when it is a new tensor (no ``out``, x not of the pool's dtype),
    else an empty tensor (an op may not return an alias of an input: the traced entry returns x or out)."""
    if call.round_via_state and call.result.dtype != call.state.dtype:
        return call.result
    return call.result.new_empty((0,))


def _conv1d_update_impl(*args, **kwargs) -> torch.Tensor:
    args = CONV1D_UPDATE.ordered(args, kwargs)
    call = normalize_conv1d_update(*args[:-1])
    run("conv1d_update", call, args[-1])
    return _new_result(call)


_conv1d_update_impl.__signature__ = CONV1D_UPDATE.signature(torch.Tensor)
_conv1d_update_op = torch.library.custom_op(
    "mate::causal_conv1d_update", _conv1d_update_impl, mutates_args=CONV1D_UPDATE.mutated
)


@_conv1d_update_op.register_fake
def _conv1d_update_fake(*args, **kwargs) -> torch.Tensor:
    return _new_result(normalize_conv1d_update(*CONV1D_UPDATE.ordered(args, kwargs)[:-1]))


def _trace_conv1d_fn(args: tuple) -> torch.Tensor:
    args = list(args)
    args[CONV1D_FN.index["activation"]] = _activation_name(args[CONV1D_FN.index["activation"]])
    return torch.ops.mate.causal_conv1d_fn(*CONV1D_FN.op_args(tuple(args)))


def _trace_conv1d_update(args: tuple) -> torch.Tensor:
    args = list(args)
    args[CONV1D_UPDATE.index["activation"]] = _activation_name(args[CONV1D_UPDATE.index["activation"]])
    new = torch.ops.mate.causal_conv1d_update(*CONV1D_UPDATE.op_args(tuple(args)))
    x, state, out = args[0], args[1], args[CONV1D_UPDATE.index["out"]]
    if out is not None:
        return out
    return x if x.dtype == state.dtype else new


# The traced causal_conv1d_fn / causal_conv1d_update (the tables' parameters, positionally): emit the ops and
# return what vLLM's functions return.
trace_conv1d_fn = CONV1D_FN.entry("trace_conv1d_fn", _trace_conv1d_fn)
trace_conv1d_update = CONV1D_UPDATE.entry("trace_conv1d_update", _trace_conv1d_update)


# ------------------------------------------------------------------------------------------------ fused decode step

# ``mate.mamba.mamba2_decode_step``: the layer's tensors positionally, the slot table and the options keyword-only
DECODE_STEP_PARAMS = (
    Param("xBC", T),
    Param("z", T),
    Param("dt", T),
    Param("conv_state", T, mutated=True),
    Param("conv_weight", T),
    Param("conv_bias", OptT),
    Param("ssm_state", T, mutated=True),
    Param("A", T),
    Param("D", OptT),
    Param("dt_bias", OptT),
    Param("norm_weight", T),
    Param("state_indices", T, keyword=True),
    Param("ngroups", int, keyword=True),
    Param("pad_slot_id", int, -1, keyword=True),
    Param("norm_group_size", int | None, None, keyword=True),
    Param("eps", float, 1e-6, keyword=True),
    Param("out", OptT, None, mutated=True, keyword=True),
    Param("backend", str, "auto", keyword=True),
)

DECODE_STEP = OpTable(DECODE_STEP_PARAMS)
_out_op("mamba2_decode_step", "decode_step", DECODE_STEP, normalize_decode_step)


def _trace_decode_step(args: tuple) -> torch.Tensor:
    """Emits the op with ``out`` (allocated here when None: ``[batch, heads * head_dim]`` in xBC's dtype, the
    shape of z), returns it."""
    vals = DECODE_STEP.op_args(args)
    i = DECODE_STEP.index["out"]
    if vals[i] is None:
        z = vals[DECODE_STEP.index["z"]]
        vals[i] = torch.empty(z.shape, dtype=z.dtype, device=z.device)
    torch.ops.mate.mamba2_decode_step(*vals)
    return vals[i]


# The traced mamba2_decode_step (the table's parameters, positionally): emits the op, returns out.
trace_decode_step = DECODE_STEP.entry("trace_decode_step", _trace_decode_step)

__all__ += ["DECODE_STEP", "DECODE_STEP_PARAMS", "trace_decode_step"]
