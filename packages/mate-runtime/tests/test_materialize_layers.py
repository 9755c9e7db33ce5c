"""``mate.mamba.materialize_replayed_layers`` (FlashInfer's ``replayssm_materialize`` contract) on the reference
backend, on the CPU (the pointer tables hold CPU addresses): the cases of
``tests/gpu/test_materialize_layers_kernels.py`` bit-identical to a plain per-layer loop of
``materialize_replayed_state``, and its argument checks."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))

from mate.mamba import materialize_replayed_layers  # noqa: E402
from mate.mamba._reference.rounding import layer_seed  # noqa: E402
from test_materialize_layers_kernels import CASES, LCase, build, check, config, layered, pointer_tables  # noqa: E402


@pytest.mark.parametrize("c", CASES)
def test_reference_layers_match_per_layer_loop(c):
    check(c, run=lambda layers, tables, c: layered(layers, tables, c, "torch"), exact=True, dev="cpu")


def test_layer_seeds_are_flashinfers():
    """FlashInfer 0.7.2's ``layer_philox_seed`` (mamba/conversion.cuh) for seed 987, layers 0-2, and a negative
    seed: its C++ built with g++ printed these."""
    assert [layer_seed(987, layer) for layer in range(3)] == [4602466301185413001, -5194574128675476147,
                                                                4975437242464396117]  # fmt: skip
    assert layer_seed(-5, 7) == 145124084266247496


def _call(c=LCase(), *, tables=None, **overrides):
    layers, t = build(c, dev="cpu")
    ptr = pointer_tables(layers, c)
    args = {**ptr, **t, **(tables or {})}
    kw = {**config(c), **overrides}
    materialize_replayed_layers(*args.values(), **kw, backend="torch")


def _int64(n=3):
    return torch.zeros(n, dtype=torch.int64)


@pytest.mark.parametrize(
    ("overrides", "tables", "error", "match"),
    [
        pytest.param({"input_dtype": torch.float16}, None, ValueError, "input_dtype", id="input-not-bf16"),
        pytest.param({"max_window": 17}, None, ValueError, "max_window", id="window-above-16"),
        pytest.param({"max_window": 0}, None, ValueError, "max_window", id="window-zero"),
        pytest.param({"heads_per_group": 3}, None, ValueError, "heads_per_group", id="ratio-not-divisor"),
        pytest.param({"ring_buffer_len": 0}, None, ValueError, "ring_buffer_len", id="ring-zero"),
        pytest.param({"state_dtype": torch.int8, "dim": 32}, None, ValueError, "state_dtype", id="8-bit-shape"),
        pytest.param({"state_dtype": torch.int32}, None, ValueError, "state_dtype", id="state-dtype"),
        pytest.param({}, {"x_cache_ptrs": _int64().int()}, ValueError, "x_cache_ptrs", id="table-int32"),
        pytest.param(
            {}, {"dt_cache_slot_strides": _int64(2)}, ValueError, "dt_cache_slot_strides", id="table-length"
        ),  # fmt: skip
        pytest.param({}, {"src_slots": torch.zeros(3, dtype=torch.int32)}, ValueError, "src_slots", id="slots-1d"),
        pytest.param(
            {}, {"dst_slots": torch.zeros(3, 5, dtype=torch.int32)}, ValueError, "dst_slots", id="slots-shape"
        ),  # fmt: skip
        pytest.param(
            {}, {"ring_start": torch.zeros(4, dtype=torch.int64)}, ValueError, "ring_start", id="meta-int64"
        ),  # fmt: skip
        pytest.param(
            {},
            {"active_request_indices": torch.zeros(5, dtype=torch.int32)},
            ValueError,
            "active_request_indices",
            id="active-shape",
        ),  # fmt: skip
        pytest.param({"dependency_outputs": [1]}, None, ValueError, "dependency_outputs", id="anchor-not-tensor"),
        pytest.param({"philox_rounds": 10}, None, ValueError, "rand_seed", id="rounds-without-seed"),
        pytest.param(
            {"philox_rounds": 10, "rand_seed": torch.zeros(1, dtype=torch.int64)},
            None,
            NotImplementedError,
            "philox_rounds",
            id="stochastic-rounding-of-bf16",
        ),  # fmt: skip
        pytest.param(
            {"philox_rounds": 10, "rand_seed": torch.zeros(1, dtype=torch.int32)},
            None,
            ValueError,
            "rand_seed",
            id="seed-int32",
        ),  # fmt: skip
        pytest.param(
            {"philox_rounds": 10, "rand_seed": torch.zeros(2, dtype=torch.int64), "state_dtype": torch.float16},
            None,
            ValueError,
            "rand_seed",
            id="seed-two-elements",
        ),  # fmt: skip
    ],
)
def test_argument_errors_name_the_argument(overrides, tables, error, match):
    with pytest.raises(error, match=match):
        _call(tables=tables, **overrides)


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        pytest.param("active_request_indices", [0, 4, -1, -1], "active_request_indices", id="active-past-batch"),
        pytest.param("active_request_indices", [1, 1, -1, -1], "active_request_indices", id="active-twice"),
        pytest.param("ring_start", [0, 17, 0, 0], "ring_start", id="ring-start-past-ring"),
        pytest.param("replay_prefix_len", [0, 17, 0, 0], "replay_prefix_len", id="prefix-past-window"),
    ],
)
def test_reference_checks_the_selected_metadata(name, value, match):
    values = {"active_request_indices": [0, 1, -1, -1], "ring_start": [0, 0, 0, 0], "replay_prefix_len": [1, 1, 1, 1],
              name: value}  # fmt: skip
    tables = {k: torch.tensor(v, dtype=torch.int32) for k, v in values.items()}
    with pytest.raises(ValueError, match=match):
        _call(tables=tables)


def test_unselected_requests_are_not_checked():
    """Metadata after the first -1 of active_request_indices is never read (FlashInfer's kernel stops there)."""
    c = replace(LCase(), slots=(9,))
    tables = {"active_request_indices": torch.tensor([0, -1, 3, 2], dtype=torch.int32),
              "ring_start": torch.tensor([0, 99, 99, 99], dtype=torch.int32)}  # fmt: skip
    _call(c, tables=tables)
