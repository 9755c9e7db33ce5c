"""mate.mamba._import_hooks: a callback runs right after its module executes (or at once if it already has), and an
owner's cancel drops only that owner's pending hooks."""

from __future__ import annotations

import sys

from mate.mamba import _import_hooks


def _write_module(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("VALUE = 41\n")


def test_callback_runs_after_the_module_executes_and_hook_is_removed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "mate_hook_target_a")
    seen = []
    _import_hooks.when_imported("mate_hook_target_a", lambda m: seen.append(m.VALUE), owner="test-a")
    assert seen == []
    import mate_hook_target_a  # noqa: F401

    assert seen == [41]
    assert not any(getattr(f, "owner", None) == "test-a" for f in sys.meta_path)
    sys.modules.pop("mate_hook_target_a", None)


def test_every_hook_waiting_for_one_module_fires_in_the_order_armed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "mate_hook_target_c")
    seen = []
    _import_hooks.when_imported("mate_hook_target_c", lambda m: seen.append(("first", m.VALUE)), owner="test-c")
    _import_hooks.when_imported("mate_hook_target_c", lambda m: seen.append(("second", m.VALUE)), owner="test-c")
    _import_hooks.when_imported("mate_hook_target_c", lambda m: seen.append(("other", m.VALUE)), owner="test-d")
    import mate_hook_target_c  # noqa: F401

    assert seen == [("first", 41), ("second", 41), ("other", 41)]
    assert not any(getattr(f, "owner", None) in ("test-c", "test-d") for f in sys.meta_path)
    sys.modules.pop("mate_hook_target_c", None)


def test_set_attr_is_restored(monkeypatch):
    class Owner:
        def method(self):
            return "original"

    patches = _import_hooks.Patches("test-e", "nothing.")
    patches.set_attr(Owner, "method", lambda self: "patched")
    patches.set_attr(Owner, "added", 1)
    assert Owner().method() == "patched" and Owner.added == 1
    patches.restore()
    assert Owner().method() == "original" and not hasattr(Owner, "added")


def test_already_imported_module_runs_the_callback_at_once():
    seen = []
    _import_hooks.when_imported("json", lambda m: seen.append(m.__name__), owner="test-b")
    assert seen == ["json"]


def test_cancel_drops_only_the_owners_pending_hooks():
    _import_hooks.when_imported("mate_hook_never_imported_1", lambda m: None, owner="owner-1")
    _import_hooks.when_imported("mate_hook_never_imported_2", lambda m: None, owner="owner-2")
    _import_hooks.cancel("owner-1")
    owners = [getattr(f, "owner", None) for f in sys.meta_path]
    assert "owner-1" not in owners and "owner-2" in owners
    _import_hooks.cancel("owner-2")
    assert "owner-2" not in [getattr(f, "owner", None) for f in sys.meta_path]


def test_patches_restore_registry_entries_and_rebound_functions(monkeypatch):
    import types

    def original():
        return "engine"

    def replacement():
        return "mate"

    engine = types.ModuleType("fakeengine.ops")
    user = types.ModuleType("fakeengine.mixer")  # imported the function by name
    other = types.ModuleType("elsewhere")
    for m in (engine, user, other):
        m.run = original
        monkeypatch.setitem(sys.modules, m.__name__, m)
    registry = {"triton": "TritonBackend"}

    p = _import_hooks.Patches("owner-p", "fakeengine.")
    p.set_entry(registry, "triton", "triton", "MateBackend")
    p.set_entry(registry, "mate", "mate", "MateBackend")
    p.set_entry(registry, "triton", "triton", "MateBackend2")  # the first replaced value is what comes back
    assert sorted(p.rebind(engine, "run", original, replacement)) == ["fakeengine.mixer", "fakeengine.ops"]
    assert registry == {"triton": "MateBackend2", "mate": "MateBackend"}
    assert engine.run is replacement and user.run is replacement and other.run is original
    _import_hooks.when_imported("fakeengine_never_imported", lambda m: None, owner="owner-p")

    p.restore()
    assert registry == {"triton": "TritonBackend"}
    assert engine.run is original and user.run is original and other.run is original
    assert "owner-p" not in [getattr(f, "owner", None) for f in sys.meta_path]


def test_ledger_is_one_per_owner():
    from mate.mamba._import_hooks import Patches, ledger

    a = ledger("test-owner-a", "pkg.")
    assert isinstance(a, Patches) and (a.owner, a.prefix) == ("test-owner-a", "pkg.")
    assert ledger("test-owner-a", "pkg.") is a
    assert ledger("test-owner-b", "pkg.") is not a
