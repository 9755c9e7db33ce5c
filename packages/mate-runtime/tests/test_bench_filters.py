"""The benchmarks' command lines (``mate-mamba bench ssd``, ``mate-mamba bench ssu``): validated on the CPU before any
device
is needed, selecting exactly the cases named, every option documented in plain text, and the implementations
compared being MATE's planned kernels (and, with ``--pdl``, the same under MATE_SSU_PDL=1) beside the peers."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

bench_ssd = pytest.importorskip("mate.mamba.bench.ssd")
bench_ssu = pytest.importorskip("mate.mamba.bench.ssu")


@pytest.mark.parametrize(
    "argv, names",
    [
        pytest.param(["--models", "nemotron-h-9b"], "--models", id="unknown-model"),
        pytest.param(["--batches", "3x1000"], "--batches", id="unknown-batch"),
        pytest.param(["--impls", "mate-lean"], "--impls", id="deleted-design"),
        pytest.param(["--impls", "mate-lean+overlap,vllm"], "--impls", id="deleted-option"),
        pytest.param(["--impls", "mate,triton"], "--impls", id="unknown-peer"),
        pytest.param(["--impls", ","], "--impls", id="empty-impls"),
    ],
)
def test_ssd_rejects_unknown_names_in_one_line(capsys, argv, names):
    with pytest.raises(SystemExit) as exc:
        bench_ssd.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {names}: expected a comma list" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, names",
    [
        pytest.param(["--impls", "mate,triton"], "--impls", id="unknown-impl"),
        pytest.param(["--batches", "1,x"], "--batches", id="not-ints"),
        pytest.param(["--batches", "0"], "--batches", id="zero-batch"),
    ],
)
def test_ssu_rejects_bad_values_in_one_line(capsys, argv, names):
    with pytest.raises(SystemExit) as exc:
        bench_ssu.main(argv)
    assert exc.value.code == 2
    assert f"argument {names}: expected" in capsys.readouterr().err


@pytest.mark.parametrize("bench", [bench_ssu, bench_ssd], ids=["ssu", "ssd"])
def test_no_option_variant_machinery(bench, capsys):
    """The implementations are MATE (the planned kernels) and the peers: no option that sets kernel options, no
    implementation named for a kernel variant (the SSD bench's designs are the planner's, ``--designs``)."""
    with pytest.raises(SystemExit) as exc:
        bench.main(["--env", "MATE_SSU_PDL=1"])
    assert exc.value.code == 2
    capsys.readouterr()
    for name in ("variant_name", "_mate_with_options", "parse_kind", "mate_kind", "LEAN_OPTIONS"):
        assert not hasattr(bench, name)
    assert set(bench.IMPLS) <= {"mate", "vllm", "flashinfer"}


@pytest.mark.parametrize("bench", [bench_ssu, bench_ssd], ids=["ssu", "ssd"])
def test_every_option_has_plain_help(bench):
    parser = bench.build_parser()
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings
    text = parser.format_help()
    for rst in ("``", ":func:", ":data:", ".. "):
        assert rst not in text


def test_ssu_defaults():
    args = bench_ssu.build_parser().parse_args([])
    assert args.impls == ["mate", "vllm", "flashinfer"] and not args.pdl and args.batches == ()
    args = bench_ssu.build_parser().parse_args(["--impls", "vllm, mate,vllm", "--batches", "8,1", "--pdl"])
    assert args.impls == ["vllm", "mate"] and args.batches == (8, 1) and args.pdl


def test_ssu_batches_filter():
    every = bench_ssu.selected_cases(False)
    ones = bench_ssu.selected_cases(False, None, (1,))
    assert ones == [c for c in every if c.batch == 1]
    assert {c.shape.name for c in ones} == {c.shape.name for c in every if c.T == 1 and c.batch == 1}
    assert len({c.shape.name for c in ones}) == 5  # the headline shape (bf16 and fp32) and the four others
    f32 = bench_ssu.selected_cases(False, "fp32", (1, 8))
    assert f32 and all(c.state == torch.float32 and c.batch in (1, 8) for c in f32)
    assert {c.T for c in f32} == {1, 6}  # one-token at 1 and 8, MTP 6 at 8
    bf16 = bench_ssu.selected_cases(True, "bf16")
    assert bf16 and all(c.state == torch.bfloat16 for c in bf16) and len(bf16) < len(bench_ssu.cases(True))


def test_ssu_pdl_column_is_a_mate_column_not_a_peer():
    impls, skipped = bench_ssu.load_impls(["mate"], pdl=True)
    assert list(impls) == ["mate", bench_ssu.PDL_IMPL] and not skipped
    assert list(bench_ssu.load_impls(["mate"])[0]) == ["mate"]
    base = dict(op="one-token", shape="s", heads=128, dim=64, dstate=128, groups=8, state="bf16", batch=64)
    rows = [
        dict(base, impl="mate", us=10.0, tbps=4.0),
        dict(base, impl=bench_ssu.PDL_IMPL, us=5.0, tbps=8.0),
        dict(base, impl="vllm", us=11.0, tbps=3.6),
        dict(base, impl=bench_ssu.PRODUCER, us=1.0, tbps=None),
    ]
    (line,) = bench_ssu.pivot(rows)
    assert line["best peer / MATE"] == 1.1  # neither the PDL column nor the producer kernel is a peer
    assert line[bench_ssu.PDL_IMPL] == "5.00 (8.00)" and line[bench_ssu.PRODUCER] == "1.00"


def test_ssu_pdl_column_plans_under_the_setting_only_during_its_call(monkeypatch):
    from mate.mamba import settings
    from mate.mamba import ssu as api

    seen, cleared = [], []
    monkeypatch.setattr(bench_ssu, "_mate", lambda st, w: seen.append(settings.get("MATE_SSU_PDL")) or "y")
    monkeypatch.setattr(api, "clear_fast_path_cache", lambda: cleared.append(len(seen)))
    before = settings.get("MATE_SSU_PDL")
    assert bench_ssu._mate_pdl(None, None) == "y"
    assert seen == ["1"] and settings.get("MATE_SSU_PDL") == before
    assert cleared == [0, 1]  # the fast path's memory forgotten on entering and on leaving the setting


def test_ssu_stochastic_rounding_cases_and_their_cost_column():
    """``--state fp16+sr``: the fp16 cases rounded stochastically; their line reports MATE's round-to-nearest fp16
    time over its own (the rounding's cost)."""
    sr = bench_ssu.selected_cases(True, "fp16+sr")
    assert sr and all(c.state == torch.float16 and c.sr for c in sr)
    plain = bench_ssu.selected_cases(True, "fp16")
    assert [dataclasses.replace(c, sr=True) for c in plain] == sr
    base = dict(op="one-token", shape="s", heads=128, dim=64, dstate=128, groups=8, batch=64, tbps=3.0)
    rows = [dict(base, state="fp16", impl="mate", us=50.0), dict(base, state="fp16+sr", impl="mate", us=52.0)]
    lines = {line["state"]: line for line in bench_ssu.pivot(rows)}
    assert lines["fp16+sr"]["MATE fp16 / MATE"] == round(50.0 / 52.0, 2) and "MATE fp16 / MATE" not in lines["fp16"]


def test_ssu_state_list_and_ceiling_column():
    """``--state int8,bf16``: the cases of both formats (so the int8 line can report the bf16 peers); a bad name
    exits 2 before any device is needed; MATE's line carries its fraction of the copy ceiling."""
    args = bench_ssu.build_parser().parse_args(["--state", "int8,bf16", "--quick"])
    chosen = bench_ssu.selected_cases(True, args.state)
    assert {c.state_name for c in chosen} == {"int8", "bf16"}
    with pytest.raises(SystemExit) as exc:
        bench_ssu.build_parser().parse_args(["--state", "int8,int4"])
    assert exc.value.code == 2
    base = dict(op="one-token", shape="s", heads=128, dim=64, dstate=128, groups=8, batch=64)
    rows = [
        dict(base, state="int8", impl="mate", us=50.0, tbps=2.5, pct_ceiling=83.3),
        dict(base, state="bf16", impl="vllm", us=100.0, tbps=2.7, pct_ceiling=90.0),
    ]
    lines = {line["state"]: line for line in bench_ssu.pivot(rows)}
    assert lines["int8"]["MATE % of copy ceiling"] == 83.3 and lines["int8"]["best bf16 peer / MATE"] == 2.0
    assert "MATE % of copy ceiling" not in lines["bf16"]
