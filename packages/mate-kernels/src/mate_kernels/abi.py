"""Kernel ABIs, named once: each kernel family's launch arguments as one keyword description.

A family's description (e.g. :data:`SSU_ARGS`) lists every argument any of its kernels takes, in launch order,
with its type and the kernels and variant it belongs to. From it come

* the ``T.prim_func`` signatures of every kernel and variant (:func:`prim_func`: no signature is written by hand);
* the planner's launch arguments (:func:`launch_args`: named values in, the positional tuple out);
* the tensor dtypes of a kernel spec (``Arg.dtype_field``: the spec field that names the argument's dtype).

A variant is an optional trailing group of arguments: ``"scaled"`` (the fp32 row scales of block-scaled states),
``"sr"`` (the seed of stochastic rounding) or ``"split"`` (the SSD scan's run states, the split design), or two
groups joined by ``+`` (``"scaled+sr"``: a block-scaled state rounded stochastically takes both, in launch order).
Imports nothing (TileLang is passed in as ``T``).
"""

from __future__ import annotations

import itertools
import linecache
import operator
from dataclasses import dataclass, replace

ONE_TOKEN, PACKED = "one_token", "packed"
REPLAY, MATERIALIZE, MATERIALIZE_LAYERS, SCAN = "replay", "materialize", "materialize_layers", "scan"
REPLAY_TABLE, REPLAY_ROWS = "replay_table", "replay_rows"
VARIANTS = (None, "scaled", "sr", "scaled+sr", "split")


@dataclass(frozen=True)
class Arg:
    """One launch argument: ``type`` is ``"tensor"`` (its TileLang type comes from the kernel's tensor types under
    ``name``) or a scalar type (``"int32"``, ``"int64"``); ``kernels`` the kernels that take it; ``variant`` None
    (every variant) or the variant whose trailing group it belongs to; ``dtype_field`` the spec field that names a
    tensor's dtype (None: fixed by the kernel)."""

    name: str
    type: str = "tensor"
    kernels: tuple[str, ...] = (ONE_TOKEN, PACKED)
    variant: str | None = None
    dtype_field: str | None = None


_BOTH, _PACKED = (ONE_TOKEN, PACKED), (PACKED,)

# The SSU kernels (mate_kernels.ssu): the one-token kernel and the packed one. Absent optional tensors are passed
# as small dummies; which are present travels in ``flags``.
SSU_ARGS = (
    Arg("state", dtype_field="state_dtype"),
    Arg("x", dtype_field="io_dtype"),
    Arg("dt", dtype_field="dt_dtype"),
    Arg("A"),
    Arg("B"),
    Arg("C"),
    Arg("D", dtype_field="d_dtype"),
    Arg("z"),
    Arg("dt_bias", dtype_field="dt_bias_dtype"),
    Arg("out"),
    Arg("src", dtype_field="src_dtype"),
    Arg("dst", dtype_field="dst_dtype"),
    Arg("cu", kernels=_PACKED, dtype_field="meta_dtype"),
    Arg("acc_tok", kernels=_PACKED),
    Arg("ibuf", kernels=_PACKED, dtype_field="ibuf_dtype"),
    Arg("iidx", kernels=_PACKED),
    Arg("parent", kernels=_PACKED),
    Arg("nseq", "int32"),
    Arg("seqlen", "int32"),
    Arg("src_sb", "int64"),
    Arg("src_st", "int64"),
    Arg("dst_sb", "int64"),
    Arg("dst_st", "int64"),
    Arg("pad", "int64"),
    Arg("flags", "int32"),
    Arg("mode", "int32"),
    Arg("cache_steps", "int64", kernels=_PACKED),
    Arg("state_scale", variant="scaled"),
    Arg("ibuf_scale", kernels=_PACKED, variant="scaled"),
    Arg("rand_seed", variant="sr"),
)


def _one_kernel(kernel: str, *args: Arg) -> tuple[Arg, ...]:
    """The description of a family of one kernel: every argument taken by ``kernel``."""
    return tuple(replace(a, kernels=(kernel,)) for a in args)


# The ReplaySSM decode kernel (mate_kernels.ssu_replay). D, z, dt_bias, slots and cu are dummies when absent
# (``flags``); ``ntok`` is the tokens per sequence (``max_seqlen`` packed), ``window`` the ring's L - T.
REPLAY_ARGS = _one_kernel(
    REPLAY,
    Arg("state", dtype_field="state_dtype"),
    Arg("x_cache"),
    Arg("B_cache"),
    Arg("dt_cache"),
    Arg("ring_start"),
    Arg("pnat"),
    Arg("x", dtype_field="io_dtype"),
    Arg("dt", dtype_field="dt_dtype"),
    Arg("A"),
    Arg("B"),
    Arg("C"),
    Arg("D"),
    Arg("z"),
    Arg("dt_bias"),
    Arg("out"),
    Arg("slots", dtype_field="slot_dtype"),
    Arg("cu"),
    Arg("nseq", "int32"),
    Arg("ntok", "int32"),
    Arg("window", "int32"),
    Arg("pad", "int64"),
    Arg("flags", "int32"),
    Arg("state_scale", variant="scaled"),
    Arg("rand_seed", variant="sr"),
)

# The two kernels of ReplaySSM's table design (mate_kernels.ssu_replay_table, then ssu_replay.replay_rows_kernel):
# the table kernel, one CTA per (sequence, group), writes each head's token table into ``table`` (and appends B
# and dt' to the rings); the rows kernel reads it and does the state rows' work (and appends x).
REPLAY_TABLE_ARGS = _one_kernel(
    REPLAY_TABLE,
    Arg("B_cache", dtype_field="io_dtype"),
    Arg("dt_cache"),
    Arg("ring_start"),
    Arg("pnat"),
    Arg("dt", dtype_field="dt_dtype"),
    Arg("A"),
    Arg("B"),
    Arg("C"),
    Arg("dt_bias"),
    Arg("slots", dtype_field="slot_dtype"),
    Arg("cu"),
    Arg("table"),
    Arg("nseq", "int32"),
    Arg("ntok", "int32"),
    Arg("window", "int32"),
    Arg("pad", "int64"),
    Arg("flags", "int32"),
)
REPLAY_ROWS_ARGS = _one_kernel(
    REPLAY_ROWS,
    Arg("state", dtype_field="state_dtype"),
    Arg("x_cache"),
    Arg("B_cache"),
    Arg("ring_start"),
    Arg("pnat"),
    Arg("x", dtype_field="io_dtype"),
    Arg("C"),
    Arg("D"),
    Arg("z"),
    Arg("out"),
    Arg("slots", dtype_field="slot_dtype"),
    Arg("cu"),
    Arg("table"),
    Arg("nseq", "int32"),
    Arg("ntok", "int32"),
    Arg("window", "int32"),
    Arg("pad", "int64"),
    Arg("flags", "int32"),
    Arg("state_scale", variant="scaled"),
    Arg("rand_seed", variant="sr"),
)

# The ReplaySSM materialisation kernel (mate_kernels.ssu_materialize): the four request tables share one dtype.
MATERIALIZE_ARGS = _one_kernel(
    MATERIALIZE,
    Arg("state", dtype_field="state_dtype"),
    Arg("x_cache", dtype_field="io_dtype"),
    Arg("B_cache"),
    Arg("dt_cache"),
    Arg("A"),
    Arg("ring_start", dtype_field="index_dtype"),
    Arg("prefix"),
    Arg("src"),
    Arg("dst"),
    Arg("batch", "int32"),
    Arg("pad", "int64"),
    Arg("state_scale", variant="scaled"),
    Arg("rand_seed", variant="sr"),
)

# The multi-layer materialisation kernel (mate_kernels.ssu_materialize.materialize_layers_kernel): FlashInfer's
# per-layer int64 tables of base addresses and slot strides (in elements), read on the device; slot tables
# ``[layers, batch]`` and request tables ``[batch]`` int32. The scale tables are passed for every state format
# (zeros beside an unscaled one) and read only by a block-scaled build; the seed of a stochastically rounding one
# trails.
MATERIALIZE_LAYERS_ARGS = _one_kernel(
    MATERIALIZE_LAYERS,
    Arg("state_ptrs"),
    Arg("state_strides"),
    Arg("x_ptrs"),
    Arg("x_strides"),
    Arg("B_ptrs"),
    Arg("B_strides"),
    Arg("dt_ptrs"),
    Arg("dt_strides"),
    Arg("A_ptrs"),
    Arg("scale_ptrs"),
    Arg("scale_strides"),
    Arg("src"),
    Arg("dst"),
    Arg("ring_start"),
    Arg("prefix"),
    Arg("active"),
    Arg("heads", "int32"),
    Arg("ring_len", "int32"),
    Arg("pad", "int64"),
    Arg("rand_seed", variant="sr"),
)


# The SSD chunk scan (mate_kernels.ssd_scan): the serial design's kernel, and the split design's with the runs'
# entering states trailing.
SSD_SCAN_ARGS = _one_kernel(
    SCAN,
    Arg("x"),
    Arg("B"),
    Arg("C"),
    Arg("cu_chunk_seqlens"),
    Arg("seq_idx"),
    Arg("bounds"),
    Arg("dest"),
    Arg("D"),
    Arg("z"),
    Arg("initial_states"),
    Arg("out"),
    Arg("states_out"),
    Arg("dtA"),
    Arg("tmeta"),
    Arg("flags", "int32"),
    Arg("run_states", variant="split"),
)


class ArgList(tuple):
    """The arguments of one kernel and variant, in launch order (a tuple of :class:`Arg`), with what a planner
    reads of them on every new call form: ``names``, ``dtype_fields`` (``(spec field, argument name)`` pairs) and
    ``get`` (the launch tuple from named values, one C call)."""

    def __new__(cls, args):
        self = super().__new__(cls, args)
        self.names = tuple(a.name for a in self)
        self.dtype_fields = tuple((a.dtype_field, a.name) for a in self if a.dtype_field is not None)
        get = operator.itemgetter(*self.names)
        self.get = get if len(self.names) > 1 else lambda values: (get(values),)
        return self


_ARG_LISTS: dict = {}


def args_of(family: tuple[Arg, ...], kernel: str, variant: str | None = None) -> ArgList:
    """The arguments of one kernel and variant of ``family``, in launch order (made once per kernel and variant)."""
    key = (id(family), kernel, variant)  # (a family is a module constant: its id is its name)
    found = _ARG_LISTS.get(key)
    if found is None:
        if variant not in VARIANTS:
            raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
        groups = (None,) if variant is None else (None, *variant.split("+"))
        found = _ARG_LISTS[key] = ArgList(a for a in family if kernel in a.kernels and a.variant in groups)
    return found


def launch_args(args: ArgList, values: dict) -> tuple:
    """The positional launch arguments of a kernel whose arguments are ``args``, from their named ``values``."""
    return args.get(values)


_serial = itertools.count()


def prim_func(T, name: str, family: tuple[Arg, ...], kernel: str, variant: str | None, types, body):
    """The ``T.prim_func`` ``name`` taking ``args_of(family, kernel, variant)`` and running the ``T.macro``
    ``body``, which receives every argument of ``family`` that ``kernel`` takes, in order (None for those of other
    variants). ``types``: the tensor types by argument name (attributes of a namespace).

    TileLang reads a prim_func's parameters from its Python source, so the function is written out as source
    (kept in ``linecache`` under a name of its own) and compiled here; the parameter names, their order and
    types are the ABI, and the generated code is that of the same function written by hand."""
    own = args_of(family, kernel, variant)
    every = [a for a in family if kernel in a.kernels]
    # scalars as ``T.int32`` in the source (TileLang reads scalar annotations from the text), tensors by name
    annotations = {f"_t{i}": getattr(types, a.name) for i, a in enumerate(own) if a.type == "tensor"}
    params = ", ".join(f"{a.name}: {'_t%d' % i if a.type == 'tensor' else 'T.' + a.type}" for i, a in enumerate(own))
    passed = ", ".join(a.name if a in own else "None" for a in every)
    source = f"def {name}({params}):\n    _body({passed})\n"
    filename = f"<mate_kernels.abi {name} {next(_serial)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    scope = {"T": T, "_body": body, **annotations}  # its globals: TileLang re-evaluates the annotations there
    exec(compile(source, filename, "exec"), scope)
    return T.prim_func(scope[name])


__all__ = ["Arg", "ArgList", "SSU_ARGS", "REPLAY_ARGS", "REPLAY_TABLE_ARGS", "REPLAY_ROWS_ARGS", "MATERIALIZE_ARGS",
           "MATERIALIZE_LAYERS_ARGS", "SSD_SCAN_ARGS", "ONE_TOKEN", "PACKED", "REPLAY", "REPLAY_TABLE", "REPLAY_ROWS",
           "MATERIALIZE", "MATERIALIZE_LAYERS", "SCAN", "VARIANTS",
           "args_of", "launch_args", "prim_func"]  # fmt: skip
