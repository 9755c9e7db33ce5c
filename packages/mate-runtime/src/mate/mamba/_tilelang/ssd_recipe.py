"""The SSD eager fast path's launch recipe: a remembered call's launches replayed from the caller's tensors.

The launch object of a call form and pointer alignment (``_Launch`` in :mod:`.ssd`) decides everything but the
tensors. Its recipe is derived from one dry run of it (the kernels replaced by recorders, so nothing launches):
each launch argument is a caller's tensor as passed, a view of one (made again at the new tensor's own storage
offset), a tensor allocated per call (the returned states; ``out`` where the caller passed none) or a constant
of the launch object (workspace, dummies, flags; for a tvm_ffi kernel converted to a tvm_ffi tensor once).
``launch(tensors)`` is generated from that: a hit checks the pointer alignment the launch object was made for,
allocates what the call returns and calls the kernels, and no call object is rebuilt. Another alignment takes the
general launcher (the call rebuilt, the launch object of its alignment). A launch object that stages a copy, or
that fills the split design's run bounds per call (one made during a graph capture), has no recipe.
"""

from __future__ import annotations

import hashlib
import linecache

import torch
from mate.mamba._tilelang.tl_internals import ffi_tensor, is_ffi_function


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    p = a.untyped_storage().data_ptr()
    return p != 0 and p == b.untyped_storage().data_ptr()


class _Builder:
    """The source of one recipe's ``launch``: its body lines, the names it reads, and what each recorded tensor
    is (an expression of the body)."""

    def __init__(self, sources: dict, general):
        self.order = tuple(sources.values())
        self.body: list[str] = []
        self.names = {"_empty": torch.empty, "_empty_strided": torch.empty_strided, "_as_strided": torch.as_strided,
                      "_general": general}  # fmt: skip
        self.known: dict = {}  # id(tensor) -> its expression
        self.consts: dict = {}  # id(constant) -> its name, per (object, converted)

    def tensor(self, a: torch.Tensor) -> str | None:
        """The expression of a recorded tensor that is a caller's tensor or a view of one (None: neither)."""
        expr = self.known.get(id(a))  # an allocation
        if expr is not None:
            return expr
        for i, src in enumerate(self.order):
            if src is a:
                return f"_{i}"
        views = [i for i, src in enumerate(self.order) if src is not None and src.dtype == a.dtype and
                 _same_storage(a, src)]  # fmt: skip
        if len({id(self.order[i]) for i in views}) != 1:  # none, or two sources share the storage: which is it?
            return None
        i = views[0]
        src = self.order[i]
        delta = a.storage_offset() - src.storage_offset()
        if delta == 0 and a.shape == src.shape and a.stride() == src.stride():
            return f"_{i}"  # the same view as the source itself (D [H] read through its [H, P] expansion)
        name = f"_v{len(self.known)}"
        self.names[f"{name}_geometry"] = (tuple(a.shape), tuple(a.stride()))
        self.body.append(f"{name} = _as_strided(_{i}, *{name}_geometry, _{i}.storage_offset() + {delta})")
        self.known[id(a)] = name
        return name

    def allocate(self, a: torch.Tensor, name: str) -> str:
        """``name``: a new tensor of ``a``'s geometry per call, standing for ``a``."""
        self.names[f"{name}_shape"], self.names[f"{name}_stride"] = tuple(a.shape), tuple(a.stride())
        self.names[f"{name}_dtype"], self.names[f"{name}_device"] = a.dtype, a.device
        if a.is_contiguous():
            self.body.append(f"{name} = _empty({name}_shape, dtype={name}_dtype, device={name}_device)")
        else:
            self.body.append(
                f"{name} = _empty_strided({name}_shape, {name}_stride, dtype={name}_dtype, device={name}_device)"
            )
        self.known[id(a)] = name
        return name

    def constant(self, v, ffi: bool) -> str:
        key = (id(v), ffi)
        name = self.consts.get(key)
        if name is None:
            if type(v) is int:  # noqa: E721 (exactly an int: its repr is the value)
                return repr(v)
            name = self.consts[key] = f"_c{len(self.consts)}"
            self.names[name] = ffi_tensor(v) if ffi and isinstance(v, torch.Tensor) else v
        return name


def make_recipe(call, launch, pointers: dict, sources: dict, general):
    """``launch(tensors)`` replaying ``launch`` (the launch object ``call`` ran on, made for the alignments
    ``pointers``: field name -> address modulo 16) for the caller's tensors of a call of the same metadata
    (``sources``: the keyed tensors by name, in the order of ``tensors``), or None where the launch object stages a
    copy or refills the run bounds, or a launch argument is not accounted for. ``general(tensors)`` serves calls of
    another alignment."""
    if launch.staged or launch.out_buf is not None or launch.st_buf is not None:
        return None
    if launch.p.design == "split" and not launch.runs_filled:
        return None
    recorded = []
    kernels = {name: (lambda *args, _n=name: recorded.append((_n, args))) for name in launch.kernels}
    result = launch(call, kernels)  # the dry run: nothing launches; the states it returns are the one allocation

    b = _Builder(sources, general)
    n = len(b.order)
    # the alignment the launch object was made for, checked before anything is allocated (a fresh out: after)
    fresh_out = sources.get("out") is None
    checks, late = [], []
    for name, mod in pointers.items():
        t = getattr(call, name)
        if name == "out" and fresh_out:
            late.append((t, mod))
            continue
        i = next((i for i, s in enumerate(b.order) if s is t), None)
        if i is None:
            return None  # (the normaliser passes these fields on as the caller passed them)
        checks.append(f"_{i}.data_ptr() % 16 != {mod}")
    if checks:
        b.body += [f"if {' or '.join(checks)}:", "    return _general(t)"]
    if fresh_out:
        b.allocate(call.out, "out")
        for _, mod in late:
            b.body += [f"if out.data_ptr() % 16 != {mod}:", "    return _general(t)"]
    if result is not None:
        if result is call.out or any(result is s for s in b.order):
            return None
        b.allocate(result, "result")

    consts = {id(v) for v in vars(launch).values() if isinstance(v, torch.Tensor)}
    for i, (name, args) in enumerate(recorded):
        kern = launch.kernels[name]
        b.names[f"_k{i}"] = kern
        exprs = []  # an expression, or None for a constant (named below)
        for a in args:
            if not isinstance(a, torch.Tensor) or (id(a) in consts and id(a) not in b.known):
                exprs.append(None)
                continue
            expr = b.tensor(a)
            if expr is None:
                return None
            exprs.append(expr)
        # tvm_ffi takes the stream to launch on from the first torch tensor it converts: a kernel that has no
        # per-call tensor (the hand-over) keeps its constants as torch tensors
        ffi = is_ffi_function(kern) and any(e is not None for e in exprs)
        exprs = [b.constant(a, ffi) if e is None else e for a, e in zip(args, exprs, strict=True)]
        b.body.append(f"_k{i}({', '.join(exprs)})")
    b.body.append("return result" if result is not None else "return None")
    src = f"def launch(t):\n    {', '.join(f'_{i}' for i in range(n))}, = t\n" + "".join(f"    {x}\n" for x in b.body)
    filename = f"<mate.mamba._tilelang.ssd_recipe launch {hashlib.sha1(src.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    exec(compile(src, filename, "exec"), b.names)  # our own source, generated from the dry run
    fn = b.names["launch"]
    fn.launch_object = launch  # (tests, the host benchmark)
    return fn


__all__ = ["make_recipe"]
