"""mate._import_hooks: a callback runs right after its module executes (or at once if it already has), and an
owner's cancel drops only that owner's pending hooks."""

from __future__ import annotations

import sys

from mate import _import_hooks


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
