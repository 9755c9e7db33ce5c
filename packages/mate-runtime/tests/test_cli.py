"""The ``mate`` command line: --version, info (with the settings table), the CPU demo (and that it fails when
the numbers are wrong), help text for every option, and the wiring of the subcommands that hand their arguments
to other modules."""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
import types

import pytest
from mate import cli
from mate._tilelang.cache import cache_dir

# A small shape that still has several chunks per sequence, a 1-token sequence and an MTP step.
SMALL_DEMO = [
    "demo",
    "--device", "cpu",
    "--heads", "4", "--groups", "2", "--dim", "16", "--dstate", "24",
    "--chunk-size", "16", "--seqlens", "37,1,16,5",
    "--decode-steps", "2", "--mtp-tokens", "3", "--reps", "1",
]  # fmt: skip


def test_info_reports_versions_device_backends_and_cache(capsys):
    import torch

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in " ".join(out.split())
    assert "mate-runtime" in out and "mate-kernels" in out
    assert "backend torch" in out and "usable" in out
    assert "backend tilelang" in out
    assert cache_dir() in out
    if not torch.cuda.is_available():
        assert "not usable: no CUDA or MUSA device" in out


def test_info_prints_the_settings_table(capsys, monkeypatch):
    from mate import settings

    for k in [k for k in os.environ if k.startswith("MATE_")]:
        monkeypatch.delenv(k)
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "settings (environment variables" in out
    for name, setting in settings.SETTINGS.items():
        assert f"{name}={setting.default} (default)" in out
    assert " ".join(settings.SETTINGS["MATE_SSU_PDL"].help.split()) in " ".join(out.split())
    assert "not a MATE setting" not in out
    monkeypatch.setenv("MATE_SSU_PDL", "auto")
    monkeypatch.setenv("MATE_SSD_KERNEL", "lean")  # an option MATE no longer reads
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "MATE_SSU_PDL=auto (set)" in out
    assert "MATE_SSD_KERNEL=lean: not a MATE setting, ignored" in out


def test_info_reports_a_malformed_setting_without_failing(capsys, monkeypatch):
    monkeypatch.setenv("MATE_FLASHINFER_COMPAT", "sometimes")
    assert cli.main(["info"]) == 0
    assert "MATE_FLASHINFER_COMPAT=invalid (" in capsys.readouterr().out


def test_version(capsys):
    import mate

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"mate {mate.__version__}"


def test_every_option_has_help_text():
    parser = cli.build_parser()
    parsers = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += list(action.choices.values())
            assert {a.dest for a in action._choices_actions} == set(action.choices)
            assert all(a.help for a in action._choices_actions)
    for p in parsers:
        for action in p._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, (p.prog, action.option_strings or action.dest)
        assert "``" not in p.format_help()


def test_info_reports_missing_tilelang_cleanly(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tilelang" else real(name, *a))
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "tilelang" in out and "not installed (pip install 'mate-runtime[cuda]'" in out
    assert "TileLang not importable" in out


def test_info_reports_broken_tilelang_cleanly(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "tilelang" else real(name, *a)
    )
    monkeypatch.setitem(sys.modules, "tilelang", None)  # `import tilelang` now raises ImportError
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "installed but fails to import: ModuleNotFoundError" in out


def test_demo_on_cpu_passes_and_reports_errors_and_times(capsys):
    assert cli.main(SMALL_DEMO) == 0
    out = capsys.readouterr().out
    for stage in ("[1/4] prefill", "[2/4] decode", "[3/4] MTP", "[4/4] time per eager call", "PASS: 7 checks"):
        assert stage in out
    for check in ("prefill y", "prefill final states", "decode y", "decode states", "MTP y", "MTP per-token states"):
        assert check in out
    assert "ssd_combined_fwd_varlen" in out and "selective_state_update (MTP 3)" in out
    assert "backend 'torch'" in out


def test_demo_exits_nonzero_above_tolerance(capsys):
    assert cli.main([*SMALL_DEMO, "--tol", "0"]) == 1
    assert "FAIL:" in capsys.readouterr().out


def test_demo_catches_a_wrong_decode_backend(capsys, monkeypatch):
    from mate.mamba import naive_ssu

    real = naive_ssu.selective_state_update

    def off_by_a_bit(call):
        y = real(call)
        call.result.mul_(1.1)  # 10% too large: far above the bf16 tolerance
        return y

    monkeypatch.setattr(naive_ssu, "selective_state_update", off_by_a_bit)
    assert cli.main(SMALL_DEMO) == 1
    out = capsys.readouterr().out
    assert "FAIL: decode y, MTP y above tolerance" in out


def test_demo_fp32_uses_the_tight_tolerance(capsys):
    assert cli.main([*SMALL_DEMO, "--dtype", "fp32"]) == 0
    assert "(tol 5e-03)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--groups", "3"], "--groups"),
        (["--seqlens", "4,0"], "--seqlens"),
        (["--seqlens", "a,b"], "--seqlens"),
        (["--heads", "0"], "--heads"),
    ],
    ids=["groups-not-dividing", "zero-length", "not-ints", "zero-heads"],
)
def test_demo_rejects_bad_options_in_one_line(capsys, args, names):
    assert cli.main([*SMALL_DEMO, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mate demo: " + names) and "expected" in err


def _fake_module(monkeypatch, name):
    seen = []
    mod = types.ModuleType(name)
    mod.main = lambda argv: seen.append(list(argv)) or 7
    monkeypatch.setitem(sys.modules, name, mod)
    return seen


@pytest.mark.parametrize("kernel", ["ssu", "ssd"])
def test_bench_hands_every_argument_to_its_module(monkeypatch, kernel):
    seen = _fake_module(monkeypatch, f"mate.bench.{kernel}")
    assert cli.main(["bench", kernel, "--batch", "8", "--help", "x"]) == 7
    assert seen == [["--batch", "8", "--help", "x"]]


def test_prewarm_hands_every_argument_to_its_module(monkeypatch):
    seen = _fake_module(monkeypatch, "mate.prewarm_model")
    assert cli.main(["prewarm", "--model", "nemotron-h-8b", "--tp", "2"]) == 7
    assert seen == [["--model", "nemotron-h-8b", "--tp", "2"]]


@pytest.mark.parametrize(
    ("argv", "module"),
    [(["bench", "ssu"], "mate.bench.ssu"), (["bench", "ssd"], "mate.bench.ssd"), (["prewarm"], "mate.prewarm_model")],
    ids=["bench-ssu", "bench-ssd", "prewarm"],
)
def test_missing_module_is_reported_not_raised(monkeypatch, capsys, argv, module):
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ModuleNotFoundError
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"mate: {module} is not part of this installation")


def test_missing_dependency_of_a_module_is_named(monkeypatch, capsys):
    def broken(name, *a, **k):
        raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    assert cli.main(["bench", "ssd"]) == 1
    assert "needs the module 'matplotlib'" in capsys.readouterr().err


def test_usage_errors(capsys):
    assert cli.main([]) == 2
    assert "info" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "conv1d"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--backend", "triton"])
    assert exc.value.code == 2


def test_console_script_and_python_m():
    pyproject = pathlib.Path(__file__).parents[1] / "pyproject.toml"
    scripts = pyproject.read_text().split("[project.scripts]", 1)[1].split("[", 1)[0]
    assert scripts.strip() == 'mate = "mate.cli:main"'
    proc = subprocess.run([sys.executable, "-m", "mate", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("info", "demo", "bench", "prewarm", "--version"):
        assert command in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "mate", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("mate "), proc.stderr
