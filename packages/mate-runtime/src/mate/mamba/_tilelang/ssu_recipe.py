"""The SSU eager fast path's launch recipes: replay a remembered call's launch with new tensors.

Validation and planning depend only on metadata (shapes, strides, dtypes, devices, which arguments are None, the
scalar options), never on tensor data. A :class:`LaunchRecipe`, derived from the slow path's own result
(normalised call + plan), relaunches the same kernel for a call with equal metadata; the one per-call decision
left, the pointer-alignment part of the spec (vector accesses), is re-evaluated on every call.

Recipes call the tvm_ffi function behind a compiled kernel directly: TileLang's Python call wrapper (argument
count check, output-slot loops, executable lookup; ~9 us per call on a 2-core CPU) does nothing for these
kernels, which have no outputs to allocate.
"""

from __future__ import annotations

import dataclasses

import torch
from mate.mamba._contract.ssu import SSUCall
from mate.mamba._tilelang.ssu_plan import arg_names, dummies, vec_of, vector_pointers, vector_strides
from mate.mamba._tilelang.tl_internals import direct_callable

RESULT = "<result>"  # the pseudo-argument a launch recipe allocates when the caller passed no ``out``

# The public argument each tensor launch argument (by its ABI name, mate_kernels.abi.SSU_ARGS) comes from: the
# first of these that the caller passed. The normaliser hands every one of them through as it is or as a view of it
# (unsqueeze / expand / reshape / a slot table's 1-D base); make_recipe verifies that on the call it is built from
# and gives up otherwise.
SOURCES = {
    "state": ("state",), "x": ("x",), "dt": ("dt",), "A": ("A",), "B": ("B",), "C": ("C",), "D": ("D",), "z": ("z",),
    "dt_bias": ("dt_bias",), "out": ("out", RESULT), "src": ("state_batch_indices",),
    "dst": ("dst_state_batch_indices", "state_batch_indices"), "cu": ("cu_seqlens",),
    "acc_tok": ("num_accepted_tokens",), "ibuf": ("intermediate_states_buffer",),
    "iidx": ("intermediate_state_indices",), "parent": ("retrieve_parent_token",), "state_scale": ("state_scale",),
    "ibuf_scale": ("intermediate_state_scales",), "rand_seed": ("rand_seed",),
}  # fmt: skip
CHECKED = ("state", "B", "C", "ibuf")  # the arguments whose vector access the recipe re-checks per call


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    p = a.untyped_storage().data_ptr()
    return p != 0 and p == b.untyped_storage().data_ptr()


class LaunchRecipe:
    """How to launch a call again from new tensors with the same metadata, without normalising or planning.

    Built by :func:`make_recipe` from the slow path's own result (normalised call + plan) for one call: the
    launch arguments with every caller tensor replaced by "argument ``i`` as passed" or "argument ``i`` viewed
    with this (shape, stride, offset)", the output allocation when the caller passed no ``out``, and the
    compiled kernels keyed by the one data-pointer-dependent part of the spec (vector accesses)."""

    __slots__ = ("template", "idents", "views", "alloc", "result_index", "vterms", "checked", "base_spec", "kernels",
                 "kernel", "device")  # fmt: skip

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
        st, b, c, ib = self.checked
        vflags = vector_pointers(self.vterms, args[st], args[b], args[c], args[ib] if ib is not None else None)
        return result, vflags, args

    def build(self, tensors: tuple):
        """``(result, spec, launch arguments)`` for new tensors (spec and arguments None: nothing to launch)."""
        result, vflags, args = self._fill(tensors)
        return result, None if vflags is None else self._spec(vflags), args

    def _spec(self, vflags: tuple[bool, bool]):
        spec = self.base_spec
        if (spec.vector_state, spec.vector_io) == vflags:
            return spec
        return dataclasses.replace(spec, vector_state=vflags[0], vector_io=vflags[1])

    def launch(self, tensors: tuple) -> torch.Tensor:
        result, vflags, args = self._fill(tensors)
        if vflags is not None:
            kern = self.kernels.get(vflags)  # kernels by (vector state, vector B/C): the rest of the spec is fixed
            if kern is None:  # a new pointer alignment: the kernel cache (and its capture check) decides
                kern = self.kernels[vflags] = direct_callable(self.kernel(self._spec(vflags), self.device))
            kern(*args)
        return result


def make_recipe(call: SSUCall, planned, sources: dict, kernel) -> LaunchRecipe | None:
    """The :class:`LaunchRecipe` of a normalised call and its plan (``(spec, launch arguments)`` or None), or None
    when some launch argument is not a caller tensor, a view of one or a dummy (a contiguous copy, scratch output):
    such metadata always takes the slow path.

    ``sources`` maps the public argument names to what the caller passed, in the order of the tensors
    :meth:`LaunchRecipe.launch` receives; ``kernel(spec, device)`` the compiled kernel of a spec."""
    if call.copy_back:
        return None
    order = tuple(sources)
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
    rec.device, rec.kernel = call.state.device, kernel
    rec.template = rec.idents = rec.views = rec.base_spec = None
    rec.kernels = {}
    rec.vterms = rec.checked = None
    if planned is None:
        return rec
    spec, args = planned
    stand_ins = dummies()
    template = list(args)
    idents, views = [], []
    names = arg_names(spec)
    for pos, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or any(a is d for d in stand_ins):
            continue
        name = next((n for n in SOURCES.get(names[pos], ()) if srcs.get(n) is not None), None)
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
    vec = vec_of(call.state.dtype, call.dstate)
    pos = {name: i for i, name in enumerate(names)}
    rec.checked = tuple(pos[n] if n != "ibuf" or call.ibuf is not None else None for n in CHECKED)
    checked = tuple(args[i] if i is not None else None for i in rec.checked)
    rec.vterms = vector_strides(vec, *checked)
    vflags = (spec.vector_state, spec.vector_io)
    if vector_pointers(rec.vterms, *checked) != vflags:
        return None  # the positions the recipe re-checks are not the tensors plan() checked
    rec.base_spec = spec
    rec.kernels = {vflags: direct_callable(kernel(spec, rec.device))}
    return rec
