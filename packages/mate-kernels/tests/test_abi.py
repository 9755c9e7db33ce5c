"""The kernels' ABIs (``mate_kernels.abi.SSU_ARGS``, ``REPLAY_ARGS``, ``MATERIALIZE_ARGS``): each kernel and variant
takes exactly the arguments named here, in this order (the generated CUDA's parameter list; ``nox -s compile`` holds the
generated code to its recorded hash), and launch arguments are built by name."""

from __future__ import annotations

import pytest
from mate_kernels.abi import (
    MATERIALIZE,
    MATERIALIZE_ARGS,
    ONE_TOKEN,
    PACKED,
    REPLAY,
    REPLAY_ARGS,
    SSU_ARGS,
    args_of,
    launch_args,
)

ONE_TOKEN_BASE = ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "out", "src", "dst", "nseq", "seqlen",
                  "src_sb", "src_st", "dst_sb", "dst_st", "pad", "flags", "mode")  # fmt: skip
REPLAY_BASE = ("state", "x_cache", "B_cache", "dt_cache", "ring_start", "pnat", "x", "dt", "A", "B", "C", "D", "z",
               "dt_bias", "out", "slots", "cu", "nseq", "ntok", "window", "pad", "flags")  # fmt: skip
MATERIALIZE_BASE = ("state", "x_cache", "B_cache", "dt_cache", "A", "ring_start", "prefix", "src", "dst", "batch",
                    "pad")  # fmt: skip
PACKED_BASE = ONE_TOKEN_BASE[:12] + ("cu", "acc_tok", "ibuf", "iidx", "parent") + ONE_TOKEN_BASE[12:] + ("cache_steps",)


@pytest.mark.parametrize(
    "kernel, variant, names",
    [
        pytest.param(ONE_TOKEN, None, ONE_TOKEN_BASE, id="one-token"),
        pytest.param(ONE_TOKEN, "scaled", ONE_TOKEN_BASE + ("state_scale",), id="one-token-scaled"),
        pytest.param(ONE_TOKEN, "sr", ONE_TOKEN_BASE + ("rand_seed",), id="one-token-sr"),
        pytest.param(PACKED, None, PACKED_BASE, id="packed"),
        pytest.param(PACKED, "scaled", PACKED_BASE + ("state_scale", "ibuf_scale"), id="packed-scaled"),
        pytest.param(PACKED, "sr", PACKED_BASE + ("rand_seed",), id="packed-sr"),
    ],
)
def test_each_kernel_takes_its_arguments_in_order(kernel, variant, names):
    assert tuple(a.name for a in args_of(SSU_ARGS, kernel, variant)) == names


@pytest.mark.parametrize(
    "family, kernel, variant, names",
    [
        pytest.param(REPLAY_ARGS, REPLAY, None, REPLAY_BASE, id="replay"),
        pytest.param(REPLAY_ARGS, REPLAY, "scaled", REPLAY_BASE + ("state_scale",), id="replay-scaled"),
        pytest.param(REPLAY_ARGS, REPLAY, "sr", REPLAY_BASE + ("rand_seed",), id="replay-sr"),
        pytest.param(MATERIALIZE_ARGS, MATERIALIZE, None, MATERIALIZE_BASE, id="materialize"),
        pytest.param(
            MATERIALIZE_ARGS, MATERIALIZE, "scaled", MATERIALIZE_BASE + ("state_scale",), id="materialize-scaled"
        ),  # fmt: skip
        # a block-scaled checkpoint rounded stochastically: both trailing groups, in launch order
        pytest.param(
            REPLAY_ARGS, REPLAY, "scaled+sr", REPLAY_BASE + ("state_scale", "rand_seed"), id="replay-scaled-sr"
        ),
        pytest.param(MATERIALIZE_ARGS, MATERIALIZE, "sr", MATERIALIZE_BASE + ("rand_seed",), id="materialize-sr"),
        pytest.param(
            MATERIALIZE_ARGS,
            MATERIALIZE,
            "scaled+sr",
            MATERIALIZE_BASE + ("state_scale", "rand_seed"),
            id="materialize-scaled-sr",
        ),  # fmt: skip
    ],
)
def test_each_replay_kernel_takes_its_arguments_in_order(family, kernel, variant, names):
    assert tuple(a.name for a in args_of(family, kernel, variant)) == names


@pytest.mark.parametrize(
    "family, int32, int64, fields",
    [
        pytest.param(
            REPLAY_ARGS,
            {"nseq", "ntok", "window", "flags"},
            {"pad"},
            {"state_dtype", "io_dtype", "dt_dtype", "slot_dtype"},
            id="replay",
        ),  # fmt: skip
        pytest.param(
            MATERIALIZE_ARGS, {"batch"}, {"pad"}, {"state_dtype", "io_dtype", "index_dtype"}, id="materialize"
        ),  # fmt: skip
    ],
)
def test_replay_scalar_types_and_dtype_fields(family, int32, int64, fields):
    assert {a.name for a in family if a.type == "int32"} == int32
    assert {a.name for a in family if a.type == "int64"} == int64
    named = [a.dtype_field for a in family if a.dtype_field]
    assert len(named) == len(set(named)) and set(named) == fields  # every tensor dtype field of the spec, once


def test_scalar_types_and_dtype_fields():
    types = {a.name: a.type for a in SSU_ARGS}
    assert {n for n, t in types.items() if t == "int32"} == {"nseq", "seqlen", "flags", "mode"}
    assert {n for n, t in types.items() if t == "int64"} == {"src_sb", "src_st", "dst_sb", "dst_st", "pad",
                                                             "cache_steps"}  # fmt: skip
    fields = [a.dtype_field for a in SSU_ARGS if a.dtype_field]
    assert len(fields) == len(set(fields)) == 9  # every tensor dtype field of the spec, once


def test_launch_args_by_name():
    args = args_of(SSU_ARGS, ONE_TOKEN, "sr")
    values = {a.name: i for i, a in enumerate(reversed(args))}
    assert launch_args(args, values) == tuple(range(len(args) - 1, -1, -1))
    with pytest.raises(KeyError):
        launch_args(args, {"state": 0})
    with pytest.raises(ValueError, match="variant"):
        args_of(SSU_ARGS, PACKED, "fp8")


SCAN_BASE = ("x", "B", "C", "cu_chunk_seqlens", "seq_idx", "bounds", "dest", "D", "z", "initial_states", "out",
             "states_out", "dtA", "tmeta", "flags")  # fmt: skip


@pytest.mark.parametrize(
    "variant, names",
    [pytest.param(None, SCAN_BASE, id="serial"), pytest.param("split", SCAN_BASE + ("run_states",), id="split")],
)
def test_the_ssd_scan_takes_its_arguments_in_order(variant, names):
    from mate_kernels.abi import SCAN, SSD_SCAN_ARGS

    assert tuple(a.name for a in args_of(SSD_SCAN_ARGS, SCAN, variant)) == names
    assert [a.name for a in SSD_SCAN_ARGS if a.type != "tensor"] == ["flags"]
