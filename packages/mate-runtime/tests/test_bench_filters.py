"""The benchmarks' case filters (``mate bench ssd --shapes/--batches``, ``mate bench ssu --state/--batches``):
validated on the CPU before any device is needed, and selecting exactly the cases named."""

from __future__ import annotations

import pytest
import torch

bench_ssd = pytest.importorskip("mate.bench.ssd")
bench_ssu = pytest.importorskip("mate.bench.ssu")


@pytest.mark.parametrize(
    "argv, names",
    [
        pytest.param(["--shapes", "nemotron-h-9b"], "--shapes", id="unknown-shape"),
        pytest.param(["--batches", "3x1000"], "--batches", id="unknown-batch"),
    ],
)
def test_ssd_filters_reject_unknown_names(argv, names):
    with pytest.raises(ValueError, match=names):
        bench_ssd.main(argv + ["--impls", "vllm"])


def test_ssu_batches_filter():
    every = bench_ssu.selected_cases(False)
    ones = bench_ssu.selected_cases(False, None, (1,))
    assert ones == [c for c in every if c.batch == 1]
    assert {c.shape.name for c in ones} == {c.shape.name for c in every if c.T == 1 and c.batch == 1}
    assert len({c.shape.name for c in ones}) == 5  # the headline shape (bf16 and fp32) and the four others
    f32 = bench_ssu.selected_cases(False, "fp32", (1, 8))
    assert f32 and all(c.state == torch.float32 and c.batch in (1, 8) for c in f32)
    assert {c.T for c in f32} == {1, 6}  # one-token at 1 and 8, MTP 6 at 8
