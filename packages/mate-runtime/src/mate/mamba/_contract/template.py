"""A normalised call rebuilt from new tensors of the same metadata, without validating them again.

Validation and normalisation depend only on metadata (shapes, strides, dtypes, devices, which arguments are
None, the scalar options), never on tensor data. So a call whose metadata equals an earlier call's normalises to
the same description with other tensors: each tensor field of the earlier call is a caller's tensor as passed,
or a view of one (``unsqueeze`` / ``expand`` / ``reshape``: the same storage at a metadata-determined offset), or
an output the normaliser allocated. :class:`CallTemplate` records which, once, and rebuilds the call from the new
tensors. A field that is none of these (a copy the normaliser made) makes the call's metadata untemplatable: such
calls always normalise.
"""

from __future__ import annotations

import dataclasses

import torch

_AS_PASSED, _VIEW, _FRESH = 0, 1, 2


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    p = a.untyped_storage().data_ptr()
    return p != 0 and p == b.untyped_storage().data_ptr()


class CallTemplate:
    """How to rebuild one normalised call (a frozen dataclass of tensors and plain values) from new tensors."""

    __slots__ = ("cls", "fixed", "passed", "rules")

    @classmethod
    def of(cls, call, sources: tuple, fresh: tuple[str, ...] = ()) -> CallTemplate | None:
        """The template of ``call`` normalised from ``sources`` (the caller's keyed tensors, None where not
        passed), or None when a tensor field is not derived from them. ``fresh``: the fields the normaliser
        allocates when the caller passes none (rebuilt as new tensors of the same shape and strides: e.g.
        ``torch.empty_like`` of a transposed input)."""
        t = cls()
        t.cls = type(call)
        t.fixed, t.rules = {}, []
        for f in dataclasses.fields(call):
            v = getattr(call, f.name)
            if not isinstance(v, torch.Tensor):
                t.fixed[f.name] = v
                continue
            rule = _rule(v, sources, f.name in fresh)
            if rule is None:
                return None
            t.rules.append((f.name, *rule))
        # the fields passed as they are, apart: most of a call, rebuilt by a plain index each
        t.passed = tuple((r[0], r[2]) for r in t.rules if r[1] == _AS_PASSED)
        t.rules = [r for r in t.rules if r[1] != _AS_PASSED]
        return t

    @classmethod
    def launcher(cls, call, sources: dict | None, launch, fresh: tuple[str, ...] = ()):
        """The dispatcher's launcher for calls of ``call``'s metadata: ``tensors -> launch(call rebuilt from
        them)``; None without ``sources`` (the caller's keyed tensors by name) or for a call whose fields are not
        derived from them."""
        if sources is None:
            return None
        template = cls.of(call, tuple(sources.values()), fresh=fresh)
        return None if template is None else lambda tensors: launch(template.rebuild(tensors))

    def rebuild(self, tensors: tuple):
        """The call with ``tensors`` (the same keyed order as the sources the template was made from)."""
        fields = dict(self.fixed)
        for name, i in self.passed:
            fields[name] = tensors[i]
        for name, kind, i, shape, stride, delta, dtype in self.rules:
            if kind == _VIEW:
                src = tensors[i]
                fields[name] = torch.as_strided(src, shape, stride, src.storage_offset() + delta)
            else:
                fields[name] = torch.empty_strided(shape, stride, dtype=dtype, device=tensors[i].device)
        call = object.__new__(self.cls)  # the fields are the validated ones: no __init__ (frozen) per call
        object.__setattr__(call, "__dict__", fields)
        return call


def _rule(v: torch.Tensor, sources: tuple, fresh: bool):
    for i, src in enumerate(sources):
        if src is v:
            return _AS_PASSED, i, None, None, 0, None
    for i, src in enumerate(sources):
        if src is not None and v.dtype == src.dtype and _same_storage(v, src):
            return _VIEW, i, tuple(v.shape), tuple(v.stride()), v.storage_offset() - src.storage_offset(), None
    if fresh and v.storage_offset() == 0 and v.untyped_storage().nbytes() == v.numel() * v.element_size():
        # new on every call (a dense allocation of its own, any dim order), on the device of any source (a valid
        # call's tensors share one device)
        i = next(i for i, s in enumerate(sources) if s is not None)
        return _FRESH, i, tuple(v.shape), tuple(v.stride()), 0, v.dtype
    return None


__all__ = ["CallTemplate"]
