"""A test marked ``tilelang`` needs TileLang installed (no device: it builds kernel programs, it does not run
them) and is skipped, with the reason, without it. mate-kernels has no GPU tests: running kernels is
mate-runtime's, whose ``conftest.py`` owns the ``gpu`` marker."""

from __future__ import annotations

import importlib.util

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tilelang: needs TileLang installed (builds kernel programs, runs nothing)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("tilelang") is not None and importlib.util.find_spec("tilelang") is None:
        pytest.skip("needs TileLang (pip install 'mate-kernels[cuda]')")
