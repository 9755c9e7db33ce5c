"""``mate-mamba bench conv1d`` without a device: the cells its options select (``--list`` prints them), the
registry's conv dims, the bytes counted per call, and one window's tensors as vLLM passes them (its pool layout,
the null block never named, the MTP form's tables), built on the CPU."""

from __future__ import annotations

import pytest
import torch

bench = pytest.importorskip("mate.mamba.bench.conv1d")


def plan(*argv):
    return bench.build_plan(bench.build_parser().parse_args(list(argv)))


def test_quick_plan_is_the_headline_case():
    cells = plan("--quick")
    assert {c.case for c in cells} == {"nemotron-h-8b-tp1"}
    ups = [(c.batch, c.T) for c in cells if c.op == "update"]
    assert ups == [(b, T) for T in (1, bench.MTP) for b in ("1", "64", "1024")]
    assert [c.batch for c in cells if c.op == "fn"] == ["1x8192", "ragged5"]


def test_full_plan_and_filters():
    cells = plan("--models", "nemotron-h-8b", "--ops", "update")
    assert {c.case for c in cells} == {"nemotron-h-8b-tp1", "nemotron-h-8b-tp2"} and {c.op for c in cells} == {"update"}
    assert len(cells) == 2 * 2 * len(bench.UPDATE_BATCHES)
    assert [c.batch for c in plan("--models", "mamba2-2.7b-tp1", "--ops", "fn")] == list(bench.FN_BATCHES)


def test_conv_dim_from_the_registry():
    from mate.mamba.bench.shapes import SSD_CASES

    assert bench.conv_dim(SSD_CASES["nemotron-h-8b-tp1"]) == 128 * 64 + 2 * 8 * 128
    assert bench.conv_dim(SSD_CASES["nemotron-h-8b-tp2"]) == 64 * 64 + 2 * 4 * 128


def test_list_prints_the_cells_without_a_device(capsys):
    assert bench.main(["--quick", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(plan("--quick"))
    assert lines[0].startswith("nemotron-h-8b-tp1 dim=10240 update batch=1 one token")
    assert "MTP 6" in lines[3] and "prefill" in lines[-1]


@pytest.mark.parametrize(
    "argv, name",
    [
        pytest.param(["--models", "nemotron-h-9b"], "--models", id="unknown-model"),
        pytest.param(["--ops", "scan"], "--ops", id="unknown-op"),
        pytest.param(["--impls", "mate,triton"], "--impls", id="unknown-impl"),
    ],
)
def test_rejects_unknown_names_in_one_line(capsys, argv, name):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {name}: expected a comma list" in err and "Traceback" not in err


def test_bytes_per_call():
    dim, es = 100, 2
    one = bench.Planned("c", "update", "8", 1)
    assert bench.nbytes(one, dim) == dim * 5 * es + 2 * 8 * dim * es + 8 * dim * (3 + 3) * es
    mtp = bench.Planned("c", "update", "8", 6)  # reads the width - 1 window, writes state_len = 3 + 5 columns
    assert bench.nbytes(mtp, dim) == dim * 5 * es + 2 * 48 * dim * es + 8 * dim * (3 + 8) * es
    fn = bench.Planned("c", "fn", "ragged5", 0)  # 3 of 5 sequences with a history; every one writes its state
    assert bench.nbytes(fn, dim) == dim * 5 * es + 2 * 8038 * dim * es + (3 + 5) * 3 * dim * es


@pytest.mark.parametrize("T", [pytest.param(1, id="one-token"), pytest.param(6, id="mtp6")])
def test_update_window_is_vllms_call(T):
    w = bench.make_window(bench.Planned("c", "update", "8", T), 40, 3, "cpu")
    pool = w["conv_state"]
    assert pool.shape == (9, 40, 3 + (T - 1)) and pool.stride(1) == 1  # [slots, dim, state_len], dim contiguous
    idx = w["conv_state_indices"]
    assert idx.shape == (8, T) and idx.dtype == torch.int32
    assert sorted(idx[:, 0].tolist()) == list(range(1, 9))  # slot 0: vLLM's null block
    assert w["x"].shape == (8 * T, 40)
    if T > 1:
        assert w["query_start_loc"].tolist() == list(range(0, 8 * T + 1, T)) and w["max_query_len"] == T
        assert bool(((w["num_accepted_tokens"] >= 1) & (w["num_accepted_tokens"] <= T)).all())
    from mate.mamba import causal_conv1d_update

    kw = {k: w[k] for k in ("num_accepted_tokens", "query_start_loc", "max_query_len") if k in w}
    y = causal_conv1d_update(w["x"], pool, w["weight"], w["bias"], "silu", idx, **kw, backend="torch")
    assert y is w["x"]  # vLLM's call: in place into x (the pool's dtype)


def test_fn_window_is_vllms_call():
    w = bench.make_window(bench.Planned("c", "fn", "ragged5", 0), 40, 3, "cpu")
    assert w["x"].shape == (40, 8038) and w["x"].stride() == (1, 40)  # the transpose of [tokens, dim]
    assert w["query_start_loc"].tolist() == [0, 137, 4137, 4138, 5038, 8038]
    assert w["has_initial_state"].tolist() == [True, False, True, False, True]
    assert sorted(w["cache_indices"].tolist()) == [1, 2, 3, 4, 5] and w["conv_states"].stride(1) == 1


def test_every_option_has_plain_help():
    import argparse

    parser = bench.build_parser()
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings
    text = parser.format_help()
    for rst in ("``", ":func:", ":data:", ".. ", "%%"):
        assert rst not in text
