"""mate.mamba.settings: MATE's own rows name no adapter; an adapter's rows join the table when it declares them, or
when the table needs a row it does not hold (the entry point group mate.mamba.adapters); a name is declared
once."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from mate.mamba._platform import settings


@pytest.fixture
def table(monkeypatch):
    """A table holding MATE's own rows only, that has not looked for adapters yet."""
    monkeypatch.setattr(settings, "_ROWS", {k: v for k, v in settings._ROWS.items() if k in MATE_OWN})
    monkeypatch.setattr(settings, "_values", {})
    monkeypatch.setattr(settings, "_discovered", False)


MATE_OWN = ("MATE_SSU_PDL", "MATE_CHECK_INPUTS", "MATE_CACHE_DIR")
ROW = settings.Setting("MATE_TEST_SWITCH", "1", settings.ON_OFF, "a test adapter's switch", settings.on_off)


class _EntryPoint:
    def __init__(self, name, declaration):
        self.name, self.declaration = name, declaration

    def load(self):
        return self.declaration


def _broken():
    raise RuntimeError("a half-installed adapter")


def test_mates_own_rows_name_no_adapter(monkeypatch):
    # a fresh copy of the module: in this process the adapters' start-up hooks may have declared theirs already
    spec = importlib.util.spec_from_file_location("settings_as_imported", settings.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, fresh)  # (dataclasses looks its module up there)
    spec.loader.exec_module(fresh)
    assert tuple(fresh._ROWS) == MATE_OWN


def test_a_row_is_declared_once(table):
    assert settings.declare(ROW) == (ROW,) and settings.declare(ROW) == (ROW,)
    with pytest.raises(ValueError, match="MATE_TEST_SWITCH: declared as .* but the table holds"):
        settings.declare(settings.Setting("MATE_TEST_SWITCH", "0", settings.ON_OFF, "another", settings.on_off))


def test_the_adapters_rows_load_when_the_table_needs_them(table, monkeypatch):
    eps = [_EntryPoint("mate-broken", _broken), _EntryPoint("mate-test", lambda: (ROW,))]
    monkeypatch.setattr(settings, "adapters", lambda: eps)
    assert settings.get("MATE_TEST_SWITCH") is True  # not declared yet: loaded from its entry point
    assert list(settings.SETTINGS) == [*MATE_OWN, "MATE_TEST_SWITCH"]  # the broken adapter is left out
    assert [name for name, _, _ in settings.describe()] == [*MATE_OWN, "MATE_TEST_SWITCH"]
    with pytest.raises(KeyError):
        settings.get("MATE_NOT_A_SETTING")


def test_every_installed_adapter_names_its_settings():
    for ep in settings.adapters():
        assert ep.name == ep.dist.name  # (mate-mamba info lists the distribution)
        rows = ep.load()()
        assert rows and all(isinstance(r, settings.Setting) and r.name in settings.SETTINGS for r in rows), ep.name
