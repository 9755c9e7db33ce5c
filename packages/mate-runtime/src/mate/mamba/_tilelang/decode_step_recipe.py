"""The decode step's eager fast path above the fused kernel's batch: a remembered call's three launches replayed from
the caller's tensors.

Above :data:`~.decode_step_plan.FUSED_MAX_BATCH` the step is xBC's copy into a workspace and MATE's three ops on it
(the contract's ``three_ops``: the conv1d update in place on the copy, the SSU, the gated norm). A hit of the
dispatcher's fast path used to rebuild the step's call and run the three ops' launchers, each normalising and
planning its sub-call again. The recipe is derived once, from the three ops' own planners
(:func:`~.conv1d_plan.plan_update`, :func:`~.ssu_plan.plan`, :func:`~.norm_plan.plan`) on the sub-calls
``three_ops`` makes over the very workspace buffers the slow path used: each launch argument is a caller's tensor as
passed, a view of one (made again at the new tensor's own storage offset, attributed to the one caller tensor whose
memory holds it), the ``out`` the call allocates (when the caller passed none), or a constant (the workspace, the
planners' dummies, scalars; for a tvm_ffi kernel converted to a tvm_ffi tensor once). ``launch(tensors)`` is
generated from that (as :mod:`.ssd_recipe`'s): it checks that every caller tensor it reads has the 16-byte alignment
the plans were made for (a spec's one pointer-dependent part), else it takes the general launcher (the call rebuilt
and run as the slow path runs it), then copies xBC, calls the three kernels and returns ``out``. The specs and the
argument order are the planners' (nothing is spelled here); an argument the planners make per call (a copy, a
cast) leaves the call form without a recipe (the general launcher serves it). The workspace buffers are the slow
path's, fixed per recipe: a CUDA graph captured over a hit reads and writes the same buffers as every later hit.
"""

from __future__ import annotations

import hashlib
import linecache

import torch
from mate.mamba._tilelang.tl_internals import direct_callable, ffi_tensor, is_ffi_function

ALIGN = 16  # bytes: the planners' vector alignment (every pointer decision is on the address modulo this)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    p = a.untyped_storage().data_ptr()
    return p != 0 and p == b.untyped_storage().data_ptr()


def _span(t: torch.Tensor) -> tuple[int, int] | None:
    """The first and last storage elements a tensor reaches (None: no element)."""
    lo = hi = t.storage_offset()
    for n, s in zip(t.shape, t.stride(), strict=True):
        if n == 0:
            return None
        if s > 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi


class _Builder:
    """The source of one recipe's ``launch``: its body lines, the names it reads, what each tensor is."""

    def __init__(self, sources: dict, constants: tuple, general):
        self.order = tuple(sources.values())
        self.constants = constants  # tensors whose storage holds only MATE's fixed buffers (workspace, dummies)
        self.body: list[str] = []
        self.names = {"_empty": torch.empty, "_as_strided": torch.as_strided, "_general": general}
        self.known: dict = {}  # id(tensor) -> its expression (a per-call allocation)
        self.views: dict = {}  # (source index, shape, stride, delta) -> its name
        self.consts: dict = {}  # (id, ffi) -> name
        self.read: set = set()  # the caller tensors the kernels read or write (their alignment is checked)

    def tensor(self, a: torch.Tensor) -> str | None:
        """The expression of a per-call tensor (a caller's, a view of one, an allocation), or None when ``a`` is
        none of these."""
        expr = self.known.get(id(a))
        if expr is not None:
            return expr
        for i, src in enumerate(self.order):
            if src is a:
                self.read.add(i)
                return f"_{i}"
        span = _span(a)
        found = [
            i for i, src in enumerate(self.order)
            if src is not None and src.dtype == a.dtype and _same_storage(a, src) and span is not None
            and (s := _span(src)) is not None and s[0] <= span[0] and span[1] <= s[1]
        ]  # fmt: skip
        if len({id(self.order[i]) for i in found}) != 1:  # in none, or in two caller tensors: which is it?
            return None
        i = found[0]
        src = self.order[i]
        self.read.add(i)
        delta = a.storage_offset() - src.storage_offset()
        if delta == 0 and a.shape == src.shape and a.stride() == src.stride():
            return f"_{i}"
        key = (i, tuple(a.shape), tuple(a.stride()), delta)
        name = self.views.get(key)
        if name is None:
            name = self.views[key] = f"_v{len(self.views)}"
            self.names[f"{name}_geometry"] = key[1:3]
            self.body.append(f"{name} = _as_strided(_{i}, *{name}_geometry, _{i}.storage_offset() + {delta})")
        return name

    def is_constant(self, a: torch.Tensor) -> bool:
        return any(_same_storage(a, c) for c in self.constants)

    def constant(self, v, ffi: bool) -> str:
        if type(v) is int:  # noqa: E721 (exactly an int: its repr is the value)
            return repr(v)
        key = (id(v), ffi)
        name = self.consts.get(key)
        if name is None:
            name = self.consts[key] = f"_c{len(self.consts)}"
            self.names[name] = ffi_tensor(v) if ffi and isinstance(v, torch.Tensor) else v
        return name


def make_recipe(call, sources: dict, general, xbc: torch.Tensor, out: torch.Tensor, launches, constants: tuple):
    """``launch(tensors)`` for calls of ``call``'s metadata on the three-op route, or None where a launch argument is
    not accounted for. ``sources``: the caller's keyed tensors by name, in the order of ``tensors``; ``general``:
    the launcher of calls of another alignment; ``xbc`` / ``out``: the workspace copy of xBC and the norm's output
    (``call.out`` itself when dense); ``launches``: ``(kernel lookup, planned)`` per op in launch order, ``planned``
    a planner's ``(spec, args)`` or None (nothing to launch); ``constants``: MATE's fixed buffers the arguments may
    reach (the workspace, the planners' dummies)."""
    b = _Builder(sources, constants, general)
    n = len(b.order)
    device = call.xBC.device
    fresh_out = sources.get("out") is None
    if fresh_out:  # the normaliser allocated call.out: a new one per call, contiguous
        if not call.out.is_contiguous():
            return None
        b.names["_out_shape"], b.names["_out_dtype"] = tuple(call.out.shape), call.out.dtype
        b.names["_device"] = device
        b.known[id(call.out)] = "out"
    kernel_lines = []
    for i, (lookup, planned) in enumerate(launches):
        if planned is None:
            continue
        spec, args = planned
        kern = direct_callable(lookup(spec, device))
        b.names[f"_k{i}"] = kern
        exprs = []  # an expression, or None for a constant
        for a in args:
            if not isinstance(a, torch.Tensor):
                exprs.append(None)
                continue
            expr = b.tensor(a)
            if expr is None:
                if not b.is_constant(a):
                    return None  # made by the planner for this call (a copy, a cast): not replayable
                exprs.append(None)
                continue
            exprs.append(expr)
        # tvm_ffi takes the stream from the first torch tensor it converts: constants stay torch tensors for a
        # kernel with no per-call tensor
        ffi = is_ffi_function(kern) and any(e is not None for e in exprs)
        exprs = [b.constant(a, ffi) if e is None else e for a, e in zip(args, exprs, strict=True)]
        kernel_lines.append(f"_k{i}({', '.join(exprs)})")
    x_src = next((i for i, s in enumerate(b.order) if s is call.xBC), None)
    if x_src is None or (not fresh_out and call.out is not sources["out"]):
        return None  # (the normaliser passes both on as the caller passed them)
    # the alignment every plan was made for, checked before anything is allocated or written
    checks = [f"_{i}.data_ptr() % {ALIGN} != {b.order[i].data_ptr() % ALIGN}" for i in sorted(b.read)]
    head = [f"if {' or '.join(checks)}:", "    return _general(t)"] if checks else []
    if fresh_out:
        head.append("out = _empty(_out_shape, dtype=_out_dtype, device=_device)")
        head += [f"if out.data_ptr() % {ALIGN} != {call.out.data_ptr() % ALIGN}:", "    return _general(t)"]
    b.names["_xbc"] = xbc
    tail = []
    if out is not call.out:  # the norm wrote the workspace: the caller's rows get it
        b.names["_out_ws"] = out
        tail.append(f"{'out' if fresh_out else b.tensor(call.out)}.copy_(_out_ws)")
    result = "out" if fresh_out else f"_{next(i for i, s in enumerate(b.order) if s is call.out)}"
    body = head + [f"_xbc.copy_(_{x_src})"] + b.body + kernel_lines + tail + [f"return {result}"]
    src = f"def launch(t):\n    {', '.join(f'_{i}' for i in range(n))}, = t\n" + "".join(f"    {x}\n" for x in body)
    filename = f"<mate.mamba._tilelang.decode_step_recipe launch {hashlib.sha1(src.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), b.names)  # our own source, generated from the planners' arguments
    fn = b.names["launch"]
    fn.launches = tuple(planned for _, planned in launches)  # (tests, the host benchmark)
    return fn


__all__ = ["make_recipe"]
