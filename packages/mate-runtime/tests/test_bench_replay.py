"""``mate-mamba bench replay`` without a device: the cells its options select (``--list`` prints them), the
registry's shapes, the configurations the prebuild workers build, the bytes counted per call, one cell's tensors
as vLLM passes them (built on the CPU), the restore around the agreement check, and the report's ratio and
target columns."""

from __future__ import annotations

import pytest
import torch

bench = pytest.importorskip("mate.mamba.bench.replay")


def plan(*argv):
    return bench.build_plan(bench.build_parser().parse_args(list(argv)))


def test_full_grid_covers_the_issue():
    """Both models x fp32/bf16/int8 x 1/2/4/6 tokens x batch 1..1024 per ring cycle, and the no-flush and
    all-flush steps at batch 64 of each (model, state, tokens)."""
    cells = plan()
    cycle = [c for c in cells if c.phase == "cycle"]
    assert {(c.shape.name, bench.DT_NAME[c.state], c.T, c.batch) for c in cycle} == {
        (m, s, T, b) for m in bench.MODELS for s in ("fp32", "bf16", "int8") for T in (1, 2, 4, 6)
        for b in (1, 8, 64, 256, 1024)
    }  # fmt: skip
    assert len(cycle) == 120 and len(cells) == 120 + 2 * 24
    assert {(c.batch, c.phase) for c in cells if c.phase != "cycle"} == {(64, "replay"), (64, "flush")}
    assert len(bench.configs(cells)) == 24


def test_quick_plan_is_small():
    cells = plan("--quick")
    assert {c.shape.name for c in cells} == {"nemotron-h-8b-tp1"} and {c.T for c in cells} == {1, 6}
    assert {c.batch for c in cells} == {1, 64} and len(cells) == 16
    assert len(bench.configs(cells)) == 4


@pytest.mark.parametrize(
    "argv, n_cells, n_configs",
    [
        pytest.param(["--models", "nemotron-3-super-120b-tp8"], 84, 12, id="one-model"),
        pytest.param(["--state", "int8", "--tokens", "2,4"], 2 * 2 * 7, 4, id="int8-mtp"),
        pytest.param(["--batches", "256,1024"], 2 * 3 * 4 * 2, 24, id="no-phase-batch"),
        pytest.param(["--quick", "--phases", "flush"], 4, 4, id="quick-flush-only"),
        pytest.param(["--quick", "--batches", "128", "--tokens", "4"], 2, 2, id="quick-overridden"),
    ],
)
def test_filters(argv, n_cells, n_configs):
    cells = plan(*argv)
    assert len(cells) == n_cells and len(bench.configs(cells)) == n_configs


def test_shapes_are_the_registrys_per_rank_cases():
    tp1, tp8 = (bench.shape_of(m) for m in bench.MODELS)
    assert (tp1.heads, tp1.dim, tp1.dstate, tp1.groups) == (128, 64, 128, 8)
    assert (tp8.heads, tp8.dim, tp8.dstate, tp8.groups) == (16, 64, 128, 1)


def test_list_prints_the_cells_without_a_device(capsys):
    assert bench.main(["--quick", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(plan("--quick")) + 1
    assert lines[0].startswith("nemotron-h-8b-tp1 H128 P64 N128 G8 bf16 one-token batch=1 cycle ring=17")
    assert lines[-1] == "16 cells; 4 configurations to build (shape, state, T)"


@pytest.mark.parametrize(
    "argv, name",
    [
        pytest.param(["--models", "nemotron-h-8b-tp2"], "--models", id="model-not-in-the-grid"),
        pytest.param(["--state", "fp16"], "--state", id="unknown-state"),
        pytest.param(["--tokens", "0"], "--tokens", id="zero-tokens"),
        pytest.param(["--tokens", "17"], "--tokens", id="tokens-past-the-window"),
        pytest.param(["--batches", "8,x"], "--batches", id="bad-batch"),
        pytest.param(["--phases", "warm"], "--phases", id="unknown-phase"),
        pytest.param(["--impls", "mate,vllm"], "--impls", id="unknown-impl"),
    ],
)
def test_rejects_bad_options_in_one_line(capsys, argv, name):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {name}: expected" in err and "Traceback" not in err


def test_rejects_negative_prebuild_jobs(capsys):
    assert bench.main(["--prebuild-jobs", "-1"]) == 2
    assert "--prebuild-jobs" in capsys.readouterr().err


def test_moved_bytes_count_the_int8_scales():
    """A block-scaled state moves its fp32 row scales beside its numbers; the stored call reads and writes the
    state once per call (MTP: every token's state written)."""
    shape = bench.shape_of("nemotron-3-super-120b-tp8")
    bf16 = bench.Case(shape, torch.bfloat16, 64, 6, "flush")
    int8 = bench.Case(shape, torch.int8, 64, 6, "flush")
    H, P, N = 16, 64, 128
    assert bench.slot_bytes(int8) == H * P * (N + 4) and bench.slot_bytes(bf16) == H * P * N * 2
    (r16, _), (r8, s8) = bench.moved_bytes(bf16), bench.moved_bytes(int8)
    assert r16 - r8 == 64 * 2 * (bench.slot_bytes(bf16) - bench.slot_bytes(int8))  # every sequence flushes
    assert s8 == 64 * 7 * bench.slot_bytes(int8)


def test_serving_configs_are_the_grids():
    cfgs = bench.serving_configs()
    assert len(cfgs) == 24 and {c["state_dtype"] for c in cfgs} == {torch.float32, torch.bfloat16, torch.int8}
    assert {c["tokens"] for c in cfgs} == {1, 2, 4, 6} and {c["window"] for c in cfgs} == {16}


def test_setup_on_the_cpu_and_the_agreement_checks_restore():
    """One cell's tensors as vLLM passes them (dt stride 0 over P, A tied, an int8 pool with its scales, each
    window its own slots), and the agreement check: every implementation starts from the same window, and the
    pools are as before afterwards."""
    case = bench.Case(bench.shape_of("nemotron-3-super-120b-tp8"), torch.int8, 4, 2)
    st = bench.Setup(case, "cpu", stored=True, windows=3)
    assert st.state.dtype == torch.int8 and st.scale.shape == (12, 16, 64) and st.stored.shape[0] == 24
    w = st.windows[1]
    assert w.slots.tolist() == [4, 5, 6, 7] and w.dt.stride()[-1] == 0 and st.A.stride() == (1, 0, 0)
    assert w.s_src.tolist() == [[8, 9], [10, 11], [12, 13], [14, 15]]
    before = [t.clone() for t in st.ring_tensors()]
    seen = []

    def scribble(value):
        def impl(st, w):
            seen.append(st.scale[w.slots.long()].clone())
            for t in st.ring_tensors():
                t[w.slots.long()] = value
            w.out.fill_(value)

        return impl

    def stored(st, w):
        st.stored.zero_()

    errs, failed = bench._y_err(st, {"mate": scribble(1), "flashinfer": scribble(2), "mate-stored": stored})
    assert failed == {} and errs == {"mate": 0.0, "flashinfer": 1.0}
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[0], before[1][:4])
    assert all(torch.equal(a, b) for a, b in zip(st.ring_tensors(), before, strict=True))


def _row(impl, us, batch=64, T=1, phase="cycle"):
    return dict(op="one-token" if T == 1 else f"MTP {T}", T=T, shape="s", state="bf16", batch=batch, phase=phase,
                impl=impl, us=us, tbps=1.0)  # fmt: skip


@pytest.mark.parametrize(
    "batch, T, stored_us, target",
    [
        pytest.param(64, 1, 130.0, ">= 1.3: met", id="one-token-met"),
        pytest.param(1024, 1, 120.0, ">= 1.3: missed", id="one-token-missed"),
        pytest.param(64, 6, 199.0, ">= 2.0: missed", id="mtp6-missed"),
        pytest.param(256, 6, 200.0, ">= 2.0: met", id="mtp6-met"),
        pytest.param(8, 1, 200.0, None, id="below-the-target-batch"),
        pytest.param(64, 4, 300.0, None, id="no-target-at-mtp4"),
    ],
)
def test_pivot_ratios_and_targets(batch, T, stored_us, target):
    rows = [_row("mate", 100.0, batch, T), _row("flashinfer", 80.0, batch, T), _row("mate-stored", stored_us, batch, T)]
    (line,) = bench.pivot(rows)
    assert line["flashinfer / MATE"] == 0.8 and line["stored / MATE"] == round(stored_us / 100.0, 3)
    assert line.get("target") == target


def test_pivot_reports_a_failed_implementation():
    rows = [_row("mate", 100.0, phase="flush"), dict(_row("flashinfer", 0.0, phase="flush"), error="boom")]
    rows[1].pop("us")
    (line,) = bench.pivot(rows)
    assert line["flashinfer"] == "failed" and "flashinfer / MATE" not in line and "target" not in line
