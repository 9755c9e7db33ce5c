"""A test marked ``gpu`` (the markers are declared in the root pyproject.toml) is skipped, with the reason, where
it cannot run: without a CUDA or MUSA device or without TileLang (``mate.mamba.testing.gpu_skip_reason``). A test
marked ``engine`` needs the real FlashInfer (``flashinfer-python``) and skips itself, saying why, without it."""

from __future__ import annotations

import pytest
from mate.mamba.testing import gpu_skip_reason


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None and (reason := gpu_skip_reason()) is not None:
        pytest.skip(reason)
