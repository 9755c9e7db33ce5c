"""A test marked ``gpu`` (the marker is declared in the root pyproject.toml) is skipped, with the reason, where
it cannot run: without a CUDA or MUSA device or without TileLang (``mate.mamba.testing.gpu_skip_reason``).

The suite runs with ``MATE_CHECK_INPUTS=1`` (the TileLang backend checks the index tables' values on every call,
as the reference always does) unless the environment says otherwise; set before any setting is read."""

from __future__ import annotations

import os

os.environ.setdefault("MATE_CHECK_INPUTS", "1")

import pytest  # noqa: E402
from mate.mamba.testing import gpu_skip_reason  # noqa: E402


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and (reason := gpu_skip_reason()) is not None:
        pytest.skip(reason)


@pytest.fixture
def unchecked_inputs():
    """The production path: ``MATE_CHECK_INPUTS=0`` within the test (for tests of host syncs and allocations,
    which the debugging check adds); the decode fast path's memory is cleared on the way in and out, since forms
    first seen with the check on are remembered as slow."""
    from mate.mamba import settings, ssu

    ssu.clear_fast_path_cache()
    with settings.override(MATE_CHECK_INPUTS="0"):
        yield
    ssu.clear_fast_path_cache()
