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
