"""``mate-mamba prewarm`` (``mate.mamba.prewarm_model``) on small temporary config.json files, on the CPU."""

from __future__ import annotations

import importlib.util
import json

import pytest
from mate.mamba.prewarm_model import main, per_rank, read_config

NEMOTRON_H = {"model_type": "nemotron_h", "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128,
              "n_groups": 8, "chunk_size": 128, "hidden_size": 4096}  # fmt: skip
MAMBA2 = {"model_type": "mamba2", "num_heads": 80, "head_dim": 64, "state_size": 128, "n_groups": 1,
          "chunk_size": 256, "hidden_size": 2560, "expand": 2}  # fmt: skip
FALCON_H1 = {"model_type": "falcon_h1", "mamba_n_heads": 24, "mamba_d_head": 128, "mamba_d_state": 256,
             "mamba_n_groups": 1, "mamba_chunk_size": 256, "hidden_size": 3072}  # fmt: skip


def write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize(
    "cfg, expect",
    [
        pytest.param(NEMOTRON_H, (128, 64, 128, 8, 128), id="nemotron-h"),
        pytest.param(MAMBA2, (80, 64, 128, 1, 256), id="mamba2"),
        pytest.param(FALCON_H1, (24, 128, 256, 1, 256), id="falcon-h1"),
        pytest.param({**MAMBA2, "num_heads": None}, (80, 64, 128, 1, 256), id="mamba2-heads-from-expand"),
        pytest.param({"model_type": "x", "text_config": NEMOTRON_H}, (128, 64, 128, 8, 128), id="nested"),
    ],
)
def test_read_config(tmp_path, cfg, expect):
    m = read_config(write(tmp_path, cfg))
    assert (m.heads, m.dim, m.dstate, m.groups, m.chunk_size) == expect


def test_missing_field_names_it(tmp_path):
    cfg = {k: v for k, v in NEMOTRON_H.items() if k != "ssm_state_size"}
    with pytest.raises(ValueError, match="dstate"):
        read_config(write(tmp_path, cfg))


@pytest.mark.parametrize(
    "cfg, tp, expect",
    [
        pytest.param(NEMOTRON_H, 1, (128, 8), id="nemotron-tp1"),
        pytest.param(NEMOTRON_H, 8, (16, 1), id="nemotron-tp8"),
        pytest.param(MAMBA2, 4, (20, 1), id="mamba2-tp4-replicated-group"),
    ],
)
def test_per_rank(tmp_path, cfg, tp, expect):
    assert per_rank(read_config(write(tmp_path, cfg)), tp) == expect


def test_per_rank_rejects_bad_tp(tmp_path):
    with pytest.raises(ValueError, match="--tp"):
        per_rank(read_config(write(tmp_path, NEMOTRON_H)), 3)
    with pytest.raises(ValueError, match="n_groups"):
        per_rank(read_config(write(tmp_path, {**NEMOTRON_H, "n_groups": 6, "mamba_num_heads": 96})), 4)


def test_dry_run_lists_every_kernel(tmp_path, capsys):
    d = tmp_path / "model"
    d.mkdir()
    write(d, NEMOTRON_H)
    assert main([str(d), "--tp", "2", "--mtp-tokens", "5", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "per rank heads 64, groups 4" in out
    assert "ssu one-token" in out and "ssu packed (MTP 5 + 1)" in out
    # the chunk scan (final and intermediate states, each with and without the L2 prefetch) fed by the dt pre-pass,
    # which also computes the runs table (final states returned or written into a pool)
    for label in ("ssd chunk scan\n", "ssd chunk scan L2 prefetch\n", "ssd chunk scan intermediate\n",
                  "ssd chunk scan intermediate L2 prefetch\n", "ssd dt pre-pass\n",
                  "ssd dt pre-pass (final states into a pool)\n"):  # fmt: skip
        assert label in out, label
    assert "(dry run: nothing compiled)" in out


def test_bad_config_exits_nonzero(tmp_path, capsys):
    assert main([str(tmp_path / "missing.json"), "--dry-run"]) == 2
    assert main([write(tmp_path, NEMOTRON_H), "--tp", "3", "--dry-run"]) == 2
    assert "--tp" in capsys.readouterr().err


def test_unsupported_shape_exits_nonzero(tmp_path, capsys):
    # d_state 96 is not served by the SSD kernels: the error names it
    assert main([write(tmp_path, {**NEMOTRON_H, "ssm_state_size": 96}), "--dry-run"]) == 2
    assert "dstate=96" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="needs TileLang")
def test_compile_only_for_sm90a(tmp_path, capsys):
    small = {"model_type": "nemotron_h", "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 64,
             "n_groups": 1, "chunk_size": 64}  # fmt: skip
    from mate.mamba import settings

    cfg = write(tmp_path, small)
    with settings.override(MATE_CACHE_DIR=str(tmp_path / "cache")):
        assert main([cfg, "--target", "sm_90a", "--jobs", "2", "--verbose"]) == 0
        out = capsys.readouterr().out
        # 4 SSU; 4 chunk scans (final / intermediate states, each with and without the L2 prefetch); 2 dt
        # pre-passes (final states returned, written into a pool by index); 8 heads may split a sequence on an
        # H200: the split scan in both state forms, its state pass and its hand-over
        # (TileLang's own disk cache, outside tmp_path, may hold them from an earlier run: built, not lowered)
        assert "14/14 kernels ready" in out and "0 loaded from the cache" in out, out
        assert "compile time by phase" in out and "build" in out, out
        # a second run (its own process's memory is warm: clear it) loads every kernel from the cache directory
        from mate.mamba._tilelang.cache import CACHE

        CACHE.kernels.clear()
        assert main([cfg, "--target", "sm_90a"]) == 0
        assert "0 compiled, 14 loaded from the cache, 0 from TileLang's" in capsys.readouterr().out


def test_jobs_must_be_positive(tmp_path, capsys):
    assert main([write(tmp_path, NEMOTRON_H), "--target", "sm_90a", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="needs TileLang")
def test_compile_missing_compiles_in_workers(tmp_path):
    # what the public prewarm functions run first: the kernels missing from the cache are compiled by worker
    # processes into the cache directory, none in this process; one job (or the cache off) leaves them here
    import torch
    from mate.mamba import settings
    from mate.mamba._tilelang import ssu_plan
    from mate.mamba._tilelang.cache import CACHE, compile_missing, in_store

    target = {"kind": "cuda", "arch": "sm_90a"}
    specs = ssu_plan.serving_specs(
        state_dtype=torch.float32, io_dtype=torch.bfloat16, heads=4, dim=32, dstate=32, groups=1,
        slot_dtype=torch.int32, packed=False, meta_dtype=torch.int32, tie_hdim=True,
    )  # fmt: skip
    assert len(specs) == 2
    with settings.override(MATE_CACHE_DIR=str(tmp_path / "cache")):
        compile_missing(specs, target=target, jobs=1)
        assert not any(in_store(s, target) for s in specs)
        n_log = len(CACHE.log)
        compile_missing(specs, target=target, jobs=2)
        assert all(in_store(s, target) for s in specs)
        assert len(CACHE.log) == n_log and not any(s in CACHE.kernels for s in specs)
    with settings.override(MATE_CACHE_DIR="off"):
        assert not in_store(specs[0], target)
