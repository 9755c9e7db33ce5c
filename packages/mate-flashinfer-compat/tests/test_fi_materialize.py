"""FlashInfer's ``replayssm_materialize`` in MATE's FlashInfer-shaped package (served where no real FlashInfer is
installed): FlashInfer 0.7.2's signature (``test_fi_real.py`` compares it with the installed wheel's), the call
forwarded to ``mate.mamba.materialize_replayed_layers``, and FlashInfer's checks (CPU: the pointer tables hold
CPU addresses and the reference backend runs)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import torch
from mate_flashinfer_compat.mamba import replayssm_materialize

# the runtime's GPU test module holds the layered pools and the per-layer loop they are checked against
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "mate-runtime" / "tests" / "gpu"))
from test_materialize_layers_kernels import LCase, check, config, pointer_tables  # noqa: E402

# FlashInfer 0.7.2.post1's flashinfer.mamba.replayssm_materialize (flashinfer/mamba/replayssm_materialize.py)
MATERIALIZE_SIGNATURE = (
    "state_ptrs, state_slot_strides, x_cache_ptrs, x_cache_slot_strides, B_cache_ptrs, B_cache_slot_strides, "
    "dt_cache_ptrs, dt_cache_slot_strides, A_ptrs, state_scale_ptrs, state_scale_slot_strides, src_slots, "
    "dst_slots, ring_start, replay_prefix_len, active_request_indices, *, state_dtype, input_dtype, matrixA_dtype, "
    "dim, dstate, num_heads, heads_per_group, max_window, ring_buffer_len, pad_slot_id=-1, rand_seed=None, "
    "philox_rounds=0, dependency_inputs=None, dependency_outputs=None"
)


def signature_text(fn) -> str:
    """Names, the keyword-only marker and defaults, as FlashInfer's signature reads."""
    out, star = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(p.name + (f"={p.default!r}" if p.default is not p.empty else ""))
    return ", ".join(out)


def test_signature_is_flashinfer_0_7_2s():
    assert signature_text(replayssm_materialize) == MATERIALIZE_SIGNATURE


def _through_flashinfer_name(layers, tables, c):
    replayssm_materialize(*pointer_tables(layers, c).values(), *tables.values(), **config(c, "cpu"))


@pytest.mark.parametrize(
    "c",
    [
        pytest.param(LCase(), id="bf16"),
        pytest.param(LCase(state=torch.float8_e4m3fn, H=2, slots=(8, 11)), id="fp8-scaled"),
        pytest.param(LCase(state=torch.int8, H=2, slots=(9, 12), rounds=10), id="int8-stochastic-rounding"),
    ],
)
def test_replayssm_materialize_is_materialize_replayed_layers(c):
    check(c, run=_through_flashinfer_name, exact=True, dev="cpu")


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        pytest.param({"input_dtype": torch.float16}, ValueError, "input_dtype", id="input-not-bf16"),
        pytest.param({"max_window": 17}, ValueError, "max_window", id="window"),
        pytest.param(
            {"philox_rounds": 10, "rand_seed": torch.zeros(1, dtype=torch.int64)},
            NotImplementedError,
            "philox_rounds",
            id="stochastic-rounding-of-bf16",
        ),  # fmt: skip
    ],
)
def test_flashinfer_checks(kw, error, match):
    c = LCase(slots=(9,))
    from test_materialize_layers_kernels import build

    layers, tables = build(c, dev="cpu")
    with pytest.raises(error, match=match):
        replayssm_materialize(*pointer_tables(layers, c).values(), *tables.values(), **{**config(c), **kw})
