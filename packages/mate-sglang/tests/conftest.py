"""A test marked ``gpu`` (the marker is declared in the root pyproject.toml) is skipped, with the reason, where
it cannot run: without a CUDA or MUSA device or without TileLang (``mate.mamba.testing.gpu_skip_reason``)."""

from __future__ import annotations

import pytest
from mate.mamba.testing import gpu_skip_reason


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and (reason := gpu_skip_reason()) is not None:
        pytest.skip(reason)
