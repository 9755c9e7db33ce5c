"""``mate-mamba bench norm`` without a device: the per-rank shapes it derives from the model registry, the cases its
options select (``--list``), its one-line errors, the summary's speed-ups, and MATE's call as the bench makes it
(on the reference backend)."""

from __future__ import annotations

import argparse

import pytest
import torch
from mate.mamba.bench import norm as bench
from mate.mamba.bench.shapes import SSD_CASES


def test_every_registry_case_is_a_norm_shape():
    assert list(bench.NORM_SHAPES) == list(SSD_CASES)  # the registry has no one-group model at TP > 1
    for name, c in SSD_CASES.items():
        s = bench.NORM_SHAPES[name]
        assert (s.hidden, s.group_size) == (c.heads * c.dim, c.heads * c.dim // c.groups), name
        assert s.proj_width == 2 * s.hidden + 2 * c.groups * c.dstate + c.heads


@pytest.mark.parametrize(
    "name, hidden, group_size, path",
    [
        pytest.param("nemotron-h-8b-tp1", 8192, 1024, "pytorch", id="8-groups-tp1"),
        pytest.param("nemotron-h-8b-tp2", 4096, 1024, "pytorch", id="8-groups-tp2"),
        pytest.param("nemotron-3-super-120b-tp8", 1024, 1024, "pytorch", id="one-group-per-rank"),
        pytest.param("mamba2-2.7b-tp1", 5120, 5120, "triton", id="one-group-tp1"),
        pytest.param("zamba2-7b-tp1", 7168, 3584, "pytorch", id="2-groups"),
    ],
)
def test_shape_and_vllm_path(name, hidden, group_size, path):
    s = bench.NORM_SHAPES[name]
    assert (s.hidden, s.group_size, bench.vllm_path(s)) == (hidden, group_size, path)


def test_case_selection():
    every = bench.cases(False)
    assert len(every) == len(bench.NORM_SHAPES) * len(bench.TOKENS)
    quick = bench.cases(True)
    assert {c.shape.name for c in quick} == set(bench.QUICK_SHAPES) and {c.tokens for c in quick} < set(bench.TOKENS)
    assert {bench.vllm_path(c.shape) for c in quick} == {"triton", "pytorch"}
    args = bench.build_parser().parse_args(["--models", "nemotron-h-8b", "--tokens", "8,1", "--dtype", "bf16,fp16"])
    sel = bench.cases(False, args.models, args.tokens, args.dtype)
    assert [(c.dtype, c.shape.name, c.tokens) for c in sel] == [
        (dt, n, t) for dt in ("bf16", "fp16") for n in ("nemotron-h-8b-tp1", "nemotron-h-8b-tp2") for t in (1, 8)
    ]
    assert bench.cases(True, ["zamba2-7b-tp1"]) == []  # --quick less what --models leaves out


def test_bytes_per_call_counts_x_z_out_and_weight():
    case = bench.Case(bench.NORM_SHAPES["nemotron-h-8b-tp1"], 64, "bf16")
    assert case.bytes_per_call == (3 * 64 * 8192 + 8192) * 2


def test_list_needs_no_device(capsys):
    assert bench.main(["--list", "--quick", "--tokens", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(bench.QUICK_SHAPES) and all("tokens=    1" in line for line in lines)
    assert "vllm=triton" in next(line for line in lines if line.startswith("mamba2-2.7b-tp1"))


def test_no_case_selected_is_an_error(capsys):
    assert bench.main(["--list", "--quick", "--tokens", "8"]) == 2  # 8 is not a quick token count
    assert "select no case" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, name",
    [
        pytest.param(["--models", "nemotron-h-9b"], "--models", id="unknown-model"),
        pytest.param(["--tokens", "0"], "--tokens", id="zero-tokens"),
        pytest.param(["--tokens", "1,x"], "--tokens", id="not-ints"),
        pytest.param(["--dtype", "fp32"], "--dtype", id="fp32"),
        pytest.param(["--impls", "mate,triton"], "--impls", id="unknown-impl"),
    ],
)
def test_rejects_bad_values_in_one_line(capsys, argv, name):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {name}: expected" in err and "Traceback" not in err


def test_every_option_has_plain_help():
    parser = bench.build_parser()
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings
    for rst in ("``", ":func:", ":data:"):
        assert rst not in parser.format_help()


def test_summary_speedups_and_differences():
    base = dict(shape="s", dtype="bf16", tokens=8, vllm_path="pytorch")
    rows = [
        dict(base, impl="mate", us=2.0, gbps=500.0, pct_ceiling=16.0, max_abs_diff=0.0, host_us=9.0),
        dict(base, impl="vllm", us=10.0, gbps=100.0, pct_ceiling=3.0, max_abs_diff=0.0625, host_us=60.0),
        dict(base, impl="vllm-triton", us=3.0, gbps=333.0, pct_ceiling=10.0, max_abs_diff=0.0078125),
        dict(base, impl="vllm-compiled", error="RuntimeError: x"),
    ]
    (line,), cols = bench.summary(rows)
    assert line["vllm / mate"] == 5.0 and line["vllm-triton / mate"] == 1.5 and "vllm-compiled / mate" not in line
    assert line["vllm-compiled µs"] == "n/a" and line["max |peer - mate|"] == 0.0625
    assert line["host vllm µs"] == 60.0 and cols[-2:] == ["host mate µs", "host vllm µs"]


def test_mate_call_as_the_bench_makes_it_matches_the_reference():
    """The bench's MATE call (z a row view of the in_proj output, weight in x's dtype) on the reference backend."""
    from mate.mamba.testing import rms_norm_gated_rows

    case = bench.Case(bench.NORM_SHAPES["zamba2-7b-tp1"], 3, "bf16")
    torch.manual_seed(0)
    w = bench.Window(case, torch.device("cpu"))
    assert w.z.stride() == (case.shape.proj_width, 1)
    weight = torch.randn(case.shape.hidden).to(torch.bfloat16)
    diffs, failed = bench._diffs({"mate": bench._mate(case, weight, backend="torch")}, w)
    assert failed == {} and diffs == {"mate": None}  # no reference call given: nothing to compare against
    y = bench._mate(case, weight, backend="torch")(w)
    want = rms_norm_gated_rows(w.x, weight, None, z=w.z, eps=bench.EPS, group_size=3584, norm_before_gate=False)
    torch.testing.assert_close(y.double(), want, rtol=1e-2, atol=1e-2)
