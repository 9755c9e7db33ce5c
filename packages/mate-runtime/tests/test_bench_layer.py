"""``mate-mamba bench layer`` without a device: the cells its options select (``--list``), their byte counts, and
the windows' layout (run on the CPU)."""

from __future__ import annotations

import pytest
import torch
from mate.mamba.bench import layer
from mate.mamba.cli import main as cli_main


def test_list_prints_the_default_cells_without_a_device(capsys):
    assert cli_main(["bench", "layer", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[5] for ln in lines] == [f"batch={b}" for b in layer.BATCHES]
    assert all(ln.startswith("nemotron-h-8b-tp1 H=128 P=64 N=128 G=8 ") for ln in lines)


def test_list_follows_the_options(capsys):
    assert layer.main(["--list", "--batches", "3,1", "--models", "nemotron-h-8b-tp1"]) == 0
    assert [ln.split()[5] for ln in capsys.readouterr().out.strip().splitlines()] == ["batch=3", "batch=1"]
    with pytest.raises(SystemExit):
        layer.main(["--list", "--batches", "0"])


def test_bytes_count_the_state_both_ways():
    one, two = layer.nbytes(layer.Planned("nemotron-h-8b-tp1", 1)), layer.nbytes(layer.Planned("nemotron-h-8b-tp1", 2))
    state = 2 * 128 * 64 * 128 * 2  # read and written, bf16
    assert state < one and two - one > state


def test_window_is_a_valid_call_on_the_reference():
    from mate.mamba import mamba2_decode_step

    w = layer.make_window(layer.Planned("nemotron-h-8b-tp1", 2), 3, torch.device("cpu"))
    assert w["conv_state"].stride(1) == 1 and w["xBC"].stride(0) == w["z"].stride(0)
    assert int(w["state_indices"].min()) >= 1  # slot 0 is the null block, vLLM's pad_slot_id
    out = mamba2_decode_step(**w, backend="torch")
    assert out is w["out"] and bool(torch.isfinite(out.float()).all())
