"""mate.mamba.adapters: a callback runs right after its module executes (or at once if it already has), an owner's
cancel drops only that owner's pending hooks, a ledger puts back what it replaced; an Adapter declares its settings,
checks versions, guards its hooks and resolves the runtime."""

from __future__ import annotations

import sys
import types
import warnings

import pytest
from mate.mamba import adapters
from mate.mamba._platform import settings


def _write_module(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("VALUE = 41\n")


def test_callback_runs_after_the_module_executes_and_hook_is_removed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "mate_hook_target_a")
    seen = []
    adapters.when_imported("mate_hook_target_a", lambda m: seen.append(m.VALUE), owner="test-a")
    assert seen == []
    import mate_hook_target_a  # noqa: F401

    assert seen == [41]
    assert not any(getattr(f, "owner", None) == "test-a" for f in sys.meta_path)
    sys.modules.pop("mate_hook_target_a", None)


def test_every_hook_waiting_for_one_module_fires_in_the_order_armed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "mate_hook_target_c")
    seen = []
    adapters.when_imported("mate_hook_target_c", lambda m: seen.append(("first", m.VALUE)), owner="test-c")
    adapters.when_imported("mate_hook_target_c", lambda m: seen.append(("second", m.VALUE)), owner="test-c")
    adapters.when_imported("mate_hook_target_c", lambda m: seen.append(("other", m.VALUE)), owner="test-d")
    import mate_hook_target_c  # noqa: F401

    assert seen == [("first", 41), ("second", 41), ("other", 41)]
    assert not any(getattr(f, "owner", None) in ("test-c", "test-d") for f in sys.meta_path)
    sys.modules.pop("mate_hook_target_c", None)


def test_set_attr_is_restored(monkeypatch):
    class Owner:
        def method(self):
            return "original"

    patches = adapters.Patches("test-e", "nothing.")
    patches.set_attr(Owner, "method", lambda self: "patched")
    patches.set_attr(Owner, "added", 1)
    assert Owner().method() == "patched" and Owner.added == 1
    patches.restore()
    assert Owner().method() == "original" and not hasattr(Owner, "added")


def test_already_imported_module_runs_the_callback_at_once():
    seen = []
    adapters.when_imported("json", lambda m: seen.append(m.__name__), owner="test-b")
    assert seen == ["json"]


def test_cancel_drops_only_the_owners_pending_hooks():
    adapters.when_imported("mate_hook_never_imported_1", lambda m: None, owner="owner-1")
    adapters.when_imported("mate_hook_never_imported_2", lambda m: None, owner="owner-2")
    adapters.cancel("owner-1")
    owners = [getattr(f, "owner", None) for f in sys.meta_path]
    assert "owner-1" not in owners and "owner-2" in owners
    adapters.cancel("owner-2")
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

    p = adapters.Patches("owner-p", "fakeengine.")
    p.set_entry(registry, "triton", "triton", "MateBackend")
    p.set_entry(registry, "mate", "mate", "MateBackend")
    p.set_entry(registry, "triton", "triton", "MateBackend2")  # the first replaced value is what comes back
    assert sorted(p.rebind(engine, "run", original, replacement)) == ["fakeengine.mixer", "fakeengine.ops"]
    assert registry == {"triton": "MateBackend2", "mate": "MateBackend"}
    assert engine.run is replacement and user.run is replacement and other.run is original
    adapters.when_imported("fakeengine_never_imported", lambda m: None, owner="owner-p")

    p.restore()
    assert registry == {"triton": "TritonBackend"}
    assert engine.run is original and user.run is original and other.run is original
    assert "owner-p" not in [getattr(f, "owner", None) for f in sys.meta_path]


def _adapter(**kw):
    import mate.mamba

    args = dict(
        name="mate-test", version=mate.mamba.__version__, package="fakeengine", engine="FakeEngine", tested=("1.2.0",)
    )
    return adapters.Adapter(**{**args, **kw})


def test_an_adapter_of_another_release_is_refused():
    with pytest.raises(ImportError, match=r"mate-test 9\.9\.9 needs mate-runtime 9\.9\.9, found 0\.1\.0 at "):
        _adapter(version="9.9.9")


def test_an_adapter_declares_its_settings_at_its_first_read(monkeypatch):
    monkeypatch.setattr(settings, "_ROWS", dict(settings._ROWS))  # (the test's row leaves with the test)
    monkeypatch.setattr(settings, "_values", {})
    monkeypatch.setattr(settings, "_discovered", True)  # (no installed adapter's rows)
    row = settings.Setting("MATE_TEST_ADAPTER_SWITCH", "0", settings.ON_OFF, "a test adapter's switch", settings.on_off)
    a = _adapter(settings=lambda: (row,))
    assert "MATE_TEST_ADAPTER_SWITCH" not in settings.SETTINGS
    assert a.setting("MATE_TEST_ADAPTER_SWITCH") is False and settings.SETTINGS["MATE_TEST_ADAPTER_SWITCH"] is row
    with settings.override(MATE_TEST_ADAPTER_SWITCH="yes"):
        assert a.setting("MATE_TEST_ADAPTER_SWITCH") is True


def test_versions_status_and_restore(monkeypatch):
    a = _adapter(status=("version", "ssu"))
    assert a.ledger.owner == "mate-test" and a.ledger.prefix == "fakeengine."
    assert [a.is_tested(v) for v in ("1.2.0", "1.2.0.post1", "1.2.0+cu128", "1.2.1", "1.2.0.dev1")] == [
        True, True, True, False, False,
    ]  # fmt: skip
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert a.check_version(types.SimpleNamespace(__version__="1.2.0")) == "1.2.0"
        assert a.check_version(types.SimpleNamespace(__version__="2.0")) == "2.0"
    assert [str(w.message) for w in seen] == [
        "mate-test: mate-test is tested against FakeEngine 1.2.0, found 2.0: MATE is registered where FakeEngine's "
        "registry and signatures match, and each patch that does not match is skipped with a warning"
    ]
    registry = {"triton": "TritonBackend"}
    a.ledger.set_entry(registry, "triton", "triton", "MateBackend")
    a.state["ssu"] = "registered"
    assert a.status() == {"version": "2.0", "ssu": "registered"}
    a.restore()
    assert registry == {"triton": "TritonBackend"} and a.status() == {"version": None, "ssu": None}


def test_a_failing_patch_is_a_warning_and_the_import_goes_on(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_module(tmp_path, "mate_hook_target_f")
    a = _adapter()

    def patch_it(module):
        raise RuntimeError(f"cannot patch {module.__name__}")

    a.when_imported("mate_hook_target_f", patch_it)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import mate_hook_target_f  # noqa: F401
    assert [str(w.message) for w in seen] == [
        "mate-test: patch_it failed and was skipped: RuntimeError('cannot patch mate_hook_target_f')"
    ]
    sys.modules.pop("mate_hook_target_f", None)


def test_the_runtime_is_mate_mamba_and_a_missing_one_is_named(monkeypatch):
    import mate.mamba

    a = _adapter()
    monkeypatch.setitem(sys.modules, "mate", None)  # as if mate-runtime were uninstalled under a running adapter
    with pytest.raises(ImportError, match="mate-test: the MATE runtime is not installed; pip install mate-runtime=="):
        a.runtime()
    monkeypatch.undo()
    assert a.runtime() is mate.mamba and callable(mate.mamba.selective_state_update)
