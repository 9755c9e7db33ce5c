"""The SSU eager fast path's launch recipes: replay a remembered call's launch with new tensors.

Validation and planning depend only on metadata (shapes, strides, dtypes, devices, which arguments are None, the
scalar options), never on tensor data. A :class:`LaunchRecipe`, derived from the slow path's own result
(normalised call + plan), relaunches the same kernel for a call with equal metadata; the one per-call decision
left, the pointer-alignment part of the spec (vector accesses), is re-evaluated on every call.

Recipes call the tvm_ffi function behind a compiled kernel directly: TileLang's Python call wrapper (argument
count check, output-slot loops, executable lookup; ~9 us per call on a 2-core CPU) does nothing for these
kernels, which have no outputs to allocate. The function converts every torch tensor argument on every call, so
the dummies standing in for absent inputs are passed as tvm_ffi tensors made once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import linecache

import torch
from mate.mamba._contract.ssu import SSUCall
from mate.mamba._tilelang.ssu_plan import arg_names, dummies, vec_of, vector_pointers, vector_strides
from mate.mamba._tilelang.tl_internals import direct_callable, ffi_tensor, is_ffi_function

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
    compiled kernels keyed by the one data-pointer-dependent part of the spec (vector accesses). ``launch`` is
    generated from these (:func:`_launch_source`): a hit pays no loop over the arguments."""

    __slots__ = ("template", "idents", "views", "alloc", "result_index", "vterms", "checked", "base_spec", "kernels",
                 "kernel", "device", "launch", "ffi")  # fmt: skip

    def _spec(self, vflags: tuple[bool, bool]):
        spec = self.base_spec
        if (spec.vector_state, spec.vector_io) == vflags:
            return spec
        return dataclasses.replace(spec, vector_state=vflags[0], vector_io=vflags[1])

    def new_kernel(self, vflags: tuple[bool, bool]):
        """The kernel of a pointer alignment not launched yet (the kernel cache and its capture check decide)."""
        kern = direct_callable(self.kernel(self._spec(vflags), self.device))
        if self.ffi and not is_ffi_function(kern):
            raise RuntimeError(f"the SSU kernel of {vflags} is not a tvm_ffi function like the recipe's first one")
        self.kernels[vflags] = kern
        return kern


def _launch_source(rec: LaunchRecipe, n: int) -> tuple[str, dict]:
    """The source of ``launch(tensors)`` of a recipe (``n`` keyed tensors) and the names it reads."""
    names = {"_empty": torch.empty, "_as_strided": torch.as_strided, "_kernels": rec.kernels, "_new": rec.new_kernel}
    body = [f"{', '.join(f'_{i}' for i in range(n))}, = t"]
    if rec.alloc is None:
        body.append(f"result = _{rec.result_index}")
    else:
        names["_shape"], names["_dtype"], names["_device"] = rec.alloc
        body.append("result = _empty(_shape, dtype=_dtype, device=_device)")
    if rec.template is None:
        body.append("return result")
        return _function("launch", body), names
    ins = [f"_{i}" for i in range(n)] + ["result"]
    args = []
    for pos, v in enumerate(rec.template):
        if type(v) is int:  # noqa: E721 (exactly an int: its repr is the value)
            args.append(repr(v))
        else:  # a dummy for an absent input: converted once for a tvm_ffi kernel
            names[f"_c{pos}"] = ffi_tensor(v) if rec.ffi and isinstance(v, torch.Tensor) else v
            args.append(f"_c{pos}")
    for pos, i in rec.idents:
        args[pos] = ins[i]
    made = {}  # (shape, stride, delta) -> the views made so far with it, (source, name)
    for pos, i, shape, stride, delta in rec.views:
        src = ins[i]
        if shape is None:  # the whole (contiguous) tensor as 1-D: a 2-D slot table's base
            view = f"{src}.view(-1)"
        else:
            names[f"_s{pos}"] = (shape, stride)
            view = f"_as_strided({src}, *_s{pos}, {src}.storage_offset() + {delta})"
        for other, name in made.get((shape, stride, delta), ()):
            # one table as source and destination (passed twice by vLLM, once by FlashInfer): one view (~1 us)
            view = name if src == other else f"{name} if {src} is {other} else {view}"
        made.setdefault((shape, stride, delta), []).append((src, f"_v{pos}"))
        body.append(f"_v{pos} = {view}")
        args[pos] = f"_v{pos}"
    vs, vio, nb_state, nb_ibuf, nb_io = rec.vterms
    st, b, c, ib = (None if i is None else args[i] for i in rec.checked)
    state_terms = [f"{st}.data_ptr() % {nb_state}"] + ([f"{ib}.data_ptr() % {nb_ibuf}"] if ib is not None else [])
    body.append(f"vs = not ({' or '.join(state_terms)})" if vs else "vs = False")
    body.append(f"vio = not ({b}.data_ptr() % {nb_io} or {c}.data_ptr() % {nb_io})" if vio else "vio = False")
    body += [
        "kern = _kernels.get((vs, vio))",
        "if kern is None:",
        "    kern = _new((vs, vio))",
        f"kern({', '.join(args)})",
        "return result",
    ]
    return _function("launch", body), names


def _function(name: str, body: list[str]) -> str:
    return f"def {name}(t):\n" + "".join(f"    {line}\n" for line in body)


def _compile(rec: LaunchRecipe, n: int):
    """``rec.launch``, its recipe reachable as ``launch.recipe`` (tests, the host benchmark)."""
    src, names = _launch_source(rec, n)
    filename = f"<mate.mamba._tilelang.ssu_recipe launch {hashlib.sha1(src.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # one entry per distinct source
    exec(compile(src, filename, "exec"), names)  # our own source, generated from the recipe
    launch = names["launch"]
    launch.recipe = rec
    return launch


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
    rec.ffi = False
    if planned is None:
        rec.launch = _compile(rec, len(order))
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
    kern = direct_callable(kernel(spec, rec.device))
    rec.kernels, rec.ffi = {vflags: kern}, is_ffi_function(kern)
    rec.launch = _compile(rec, len(order))
    return rec
