"""The TileLang internals MATE relies on (``mate.mamba._tilelang.tl_internals.SURFACE``) exist in the installed
TileLang: an upgrade that moves one fails here, by name, instead of degrading the fast path, the kernel store or
the compile-time breakdown silently. Needs TileLang: ``nox -s compile`` runs it."""

from __future__ import annotations

import pytest


def test_every_internal_is_there():
    pytest.importorskip("tilelang")
    from mate.mamba._tilelang.tl_internals import missing_surface

    assert missing_surface() == []


def test_a_missing_internal_is_named(monkeypatch):
    from mate.mamba._tilelang import tl_internals

    monkeypatch.setattr(tl_internals, "SURFACE", (("json", "dumps"), ("json", "no_such_thing"), ("no_such_mod", "x")))
    missing = tl_internals.missing_surface()
    assert [m.split(" ")[0] for m in missing] == ["json.no_such_thing", "no_such_mod.x"]


def test_a_recipe_converts_its_dummies_once_for_a_tvm_ffi_kernel(monkeypatch):
    """A launch recipe whose kernel is a tvm_ffi function passes the dummies of absent inputs as tvm_ffi tensors
    made once (the same memory), the caller's tensors as they are: the function receives the slow path's
    arguments."""
    tvm_ffi = pytest.importorskip("tvm_ffi")
    import torch
    from mate.mamba import _dispatch as dispatch
    from mate.mamba import settings
    from mate.mamba import ssu as api
    from mate.mamba._tilelang import ssu as tl_ssu
    from mate.mamba._tilelang import ssu_plan
    from mate.mamba._tilelang.ssu_recipe import LaunchRecipe

    calls = []
    fn = tvm_ffi.convert(lambda *args: calls.append(args))
    monkeypatch.setattr(dispatch, "resolve_backend", lambda b, d: "tilelang")
    monkeypatch.setattr(tl_ssu, "kernel", lambda spec, device: fn)
    monkeypatch.setattr(tl_ssu, "_kernels", {})
    H, P, N, rows = 4, 16, 32, 6
    kw = dict(
        state=torch.zeros(20, H, P, N), x=torch.randn(rows, H, P), dt=torch.rand(rows, H, P), A=-torch.rand(H),
        B=torch.randn(rows, 1, N), C=torch.randn(rows, 1, N), D=None, state_batch_indices=torch.arange(rows,
        dtype=torch.int32).view(2, 3), pad_slot_id=-1, cu_seqlens=torch.tensor([0, 3, 6], dtype=torch.int32),
        num_accepted_tokens=torch.tensor([3, 3], dtype=torch.int32), out=torch.empty(rows, H, P),
    )  # fmt: skip
    api.clear_fast_path_cache()
    try:
        with settings.override(MATE_CHECK_INPUTS="0"):
            for _ in range(2):  # a miss (the slow path), then a hit (the recipe)
                api.selective_state_update(**kw)
        recipe = api.FAST.latest[2].recipe
        assert isinstance(recipe, LaunchRecipe) and recipe.ffi
    finally:
        api.clear_fast_path_cache()
    full = {n: kw.get(n) for n in ("state", "x", "dt", "A", "B", "C", "D")}
    rest = {n: v for n, v in kw.items() if n not in full}
    _, expected = ssu_plan.plan(api.normalize_ssu(**full, **rest))
    dummies = [i for i, a in enumerate(expected) if any(a is d for d in ssu_plan.dummies())]
    assert dummies  # the packed kernel's absent intermediate buffer, its indices and the parent table
    miss, hit = calls
    for got in (miss, hit):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            if isinstance(e, torch.Tensor):
                t = torch.from_dlpack(g)
                assert (t.data_ptr(), t.shape, t.stride(), t.dtype) == (e.data_ptr(), e.shape, e.stride(), e.dtype)
            else:
                assert g == e
    consts = {i: recipe.launch.__globals__[f"_c{i}"] for i in dummies}
    assert all(isinstance(c, tvm_ffi.Tensor) for c in consts.values())
