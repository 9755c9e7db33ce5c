"""The ``mate`` command line: --version, info (with the settings table), the CPU demo (and that it fails when
the numbers are wrong), help text for every option, and the wiring of the subcommands that hand their arguments
to other modules."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
from mate.mamba import cli
from mate.mamba._tilelang.cache import cache_dir

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
    from mate.mamba import settings

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
    import mate.mamba

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"mate-mamba {mate.mamba.__version__}"


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
    from mate.mamba._reference import ssu as naive_ssu

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
    assert err.startswith("mate-mamba demo: " + names) and "expected" in err


def _fake_module(monkeypatch, name):
    seen = []
    mod = types.ModuleType(name)
    mod.main = lambda argv: seen.append(list(argv)) or 7
    monkeypatch.setitem(sys.modules, name, mod)
    return seen


@pytest.mark.parametrize("kernel", ["ssu", "ssd", "norm", "conv1d"])
def test_bench_hands_every_argument_to_its_module(monkeypatch, kernel):
    seen = _fake_module(monkeypatch, f"mate.mamba.bench.{kernel}")
    assert cli.main(["bench", kernel, "--batch", "8", "--help", "x"]) == 7
    assert seen == [["--batch", "8", "--help", "x"]]


def test_prewarm_hands_every_argument_to_its_module(monkeypatch):
    seen = _fake_module(monkeypatch, "mate.mamba.prewarm_model")
    assert cli.main(["prewarm", "--model", "nemotron-h-8b", "--tp", "2"]) == 7
    assert seen == [["--model", "nemotron-h-8b", "--tp", "2"]]


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["bench", "ssu"], "mate.mamba.bench.ssu"),
        (["bench", "ssd"], "mate.mamba.bench.ssd"),
        (["prewarm"], "mate.mamba.prewarm_model"),
    ],
    ids=["bench-ssu", "bench-ssd", "prewarm"],
)
def test_missing_module_is_reported_not_raised(monkeypatch, capsys, argv, module):
    monkeypatch.setitem(sys.modules, module, None)  # importing it now raises ModuleNotFoundError
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"mate-mamba: {module} is not part of this installation")


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
        cli.main(["bench", "conv2d"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--backend", "triton"])
    assert exc.value.code == 2


def test_console_script_and_python_m():
    pyproject = pathlib.Path(__file__).parents[1] / "pyproject.toml"
    scripts = pyproject.read_text().split("[project.scripts]", 1)[1].split("[", 1)[0]
    assert scripts.strip() == 'mate-mamba = "mate.mamba.cli:main"'
    proc = subprocess.run([sys.executable, "-m", "mate.mamba", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for command in ("info", "demo", "bench", "prewarm", "--version"):
        assert command in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "mate.mamba", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.startswith("mate-mamba "), proc.stderr


# --- user mistakes: one line naming what is wrong, no traceback (``--debug`` shows it) ------------------------

SMALL_MODEL = {"model_type": "nemotron_h", "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 64,
               "n_groups": 1, "chunk_size": 64}  # fmt: skip


def _config(tmp_path, text: str) -> str:
    p = tmp_path / "config.json"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("{not json", "not JSON (", id="not-json"),
        pytest.param("[1, 2]", "expected a JSON object (a model's config.json), got an array", id="json-list"),
        pytest.param('"nemotron"', "got a string", id="json-string"),
        pytest.param('{"model_type": "nemotron_h", "mamba_num_heads": 8}', "no Mamba2 'dim' field", id="no-dim"),
        pytest.param('{"mamba_num_heads": "8", "mamba_head_dim": 64}', "field 'mamba_num_heads': got '8'",
                     id="field-a-string"),
        pytest.param('{"mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 64.5}',
                     "field 'ssm_state_size': got 64.5", id="field-not-integer"),
        pytest.param('{"mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 64, "n_groups": -1}',
                     "field 'n_groups': got -1", id="field-negative"),
    ],
)  # fmt: skip
def test_prewarm_config_errors_name_the_file_and_the_field(tmp_path, capsys, text, says):
    path = _config(tmp_path, text)
    assert cli.main(["prewarm", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mate-mamba prewarm: {path}: ") and says in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_prewarm_missing_file_is_one_line(tmp_path, capsys):
    assert cli.main(["prewarm", str(tmp_path / "nowhere"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and err.count("\n") == 1


def _no_compiling(monkeypatch):
    from mate.mamba._tilelang.cache import CACHE

    def refuse(*a, **k):
        raise AssertionError("a kernel was compiled")

    monkeypatch.setattr(CACHE, "compile_only", refuse)
    monkeypatch.setattr(CACHE, "get", refuse)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_100a", "hopper"])
def test_prewarm_target_refuses_an_architecture_the_kernels_cannot_run_on(tmp_path, capsys, monkeypatch, arch):
    _no_compiling(monkeypatch)
    path = _config(tmp_path, json.dumps(SMALL_MODEL))
    assert cli.main(["prewarm", path, "--target", arch]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"mate-mamba prewarm: --target: got {arch!r}; expected one of sm_90a") and err.count("\n") == 1
    )


def test_prewarm_target_without_tilelang_is_one_line(tmp_path, capsys, monkeypatch):
    _no_compiling(monkeypatch)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tilelang" else real(name, *a))
    path = _config(tmp_path, json.dumps(SMALL_MODEL))
    assert cli.main(["prewarm", path, "--target", "sm_90a"]) == 2
    err = capsys.readouterr().err
    assert "needs TileLang" in err and "pip install 'mate-runtime[cuda]'" in err and err.count("\n") == 1
    assert cli.main(["prewarm", path, "--target", "sm_90a", "--dry-run"]) == 0  # listing needs no TileLang


def test_prewarm_refuses_a_local_gpu_the_kernels_cannot_run_on(monkeypatch):
    import torch
    from mate.mamba import prewarm_model

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    with pytest.raises(ValueError, match=r"is sm_80 \(NVIDIA A100\); the kernels run on sm_90a"):
        prewarm_model.check_device(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    prewarm_model.check_device(torch.device("cuda", 0))


def test_prewarm_debug_shows_the_traceback(tmp_path):
    path = _config(tmp_path, "[1]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        cli.main(["--debug", "prewarm", path, "--dry-run"])


@pytest.mark.parametrize(
    ("device", "says"),
    [
        pytest.param("gpu", "--device: got 'gpu'; expected auto, cpu, cuda, cuda:N or musa", id="gpu"),
        pytest.param("cuda:x", "--device: got 'cuda:x'; expected", id="bad-index"),
        pytest.param("meta", "--device: got 'meta'; expected", id="meta"),
    ],
)
def test_demo_bad_device_is_one_line(capsys, device, says):
    assert cli.main(["demo", "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mate-mamba demo: {says}") and err.count("\n") == 1


def test_demo_cuda_without_a_cuda_device_is_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert cli.main(["demo", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mate-mamba demo: --device: got 'cuda'; no cuda device is usable") and "--device cpu" in err
    assert err.count("\n") == 1


def test_demo_unusable_backend_is_one_line(capsys):
    assert cli.main([*SMALL_DEMO, "--backend", "tilelang"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mate-mamba demo: backend='tilelang' runs on CUDA or MUSA tensors") and err.count("\n") == 1


def test_debug_shows_the_traceback_of_a_user_mistake():
    from mate.mamba.demo import UsageError

    with pytest.raises(UsageError, match="--device"):
        cli.main(["--debug", "demo", "--device", "gpu"])


def test_passthrough_user_mistake_is_one_line_unless_debug(monkeypatch, capsys):
    mod = types.ModuleType("mate.mamba.bench.ssu")

    def main(argv):
        raise ValueError("--batch: got 0; expected a positive int")

    mod.main = main
    monkeypatch.setitem(sys.modules, "mate.mamba.bench.ssu", mod)
    assert cli.main(["bench", "ssu", "--batch", "0"]) == 2
    assert capsys.readouterr().err == "mate-mamba: --batch: got 0; expected a positive int\n"
    with pytest.raises(ValueError):
        cli.main(["--debug", "bench", "ssu", "--batch", "0"])


def test_version_needs_nothing_else(capsys):
    import mate.mamba

    with pytest.raises(SystemExit) as exc:
        cli.main(["--debug", "--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"mate-mamba {mate.mamba.__version__}"
