"""``mate-mamba bench ssd``'s model registry, on the CPU: served models expand into the per-rank shapes vLLM runs them
at, ``--models`` / ``--batches`` / ``--quick`` select exactly the cells named (``build_plan``, nothing run),
``--designs`` takes the planner's designs only where the planner can be held to one, and the report's summary
and speed-ups are computed per cell."""

from __future__ import annotations

import contextlib

import pytest

shapes = pytest.importorskip("mate.mamba.bench.shapes")
bench_ssd = pytest.importorskip("mate.mamba.bench.ssd")


def _plan(argv):
    return bench_ssd.build_plan(bench_ssd.build_parser().parse_args(argv))


# ------------------------------------------------------------------------------------------------ registry


@pytest.mark.parametrize(
    "name, H, P, N, G, chunk",
    [
        pytest.param("nemotron-h-8b-tp1", 128, 64, 128, 8, 128, id="nemotron-h-8b-tp1"),
        pytest.param("nemotron-h-8b-tp2", 64, 64, 128, 4, 128, id="nemotron-h-8b-tp2"),
        pytest.param("nemotron-h-56b-tp8", 32, 64, 256, 1, 128, id="nemotron-h-56b-tp8"),
        pytest.param("nemotron-3-nano-30b-tp1", 64, 64, 128, 8, 128, id="nemotron-3-nano-30b-tp1"),
        pytest.param("nemotron-3-super-120b-tp8", 16, 64, 128, 1, 128, id="nemotron-3-super-120b-tp8"),
        pytest.param("nemotron-3-nano-4b-tp1", 96, 80, 128, 8, 256, id="nemotron-3-nano-4b-tp1"),
        pytest.param("granite-4.0-h-tiny-tp1", 48, 64, 128, 1, 256, id="granite-4.0-h-tiny-tp1"),
        pytest.param("falcon-h1-7b-tp1", 24, 128, 256, 1, 256, id="falcon-h1-7b-tp1"),
        pytest.param("mamba2-2.7b-tp1", 80, 64, 128, 1, 256, id="mamba2-2.7b-tp1"),
        pytest.param("zamba2-7b-tp1", 112, 64, 64, 2, 256, id="zamba2-7b-tp1"),
    ],
)
def test_registry_expands_to_per_rank_shapes(name, H, P, N, G, chunk):
    c = shapes.SSD_CASES[name]
    assert (c.heads, c.dim, c.dstate, c.groups, c.chunk_size) == (H, P, N, G, chunk)
    assert c.name == f"{c.model}-tp{c.tp}"


def test_registry_is_exactly_the_cases_above():
    assert list(shapes.SSD_CASES) == [
        "nemotron-h-8b-tp1", "nemotron-h-8b-tp2", "nemotron-h-56b-tp8", "nemotron-3-nano-30b-tp1",
        "nemotron-3-super-120b-tp8", "nemotron-3-nano-4b-tp1", "granite-4.0-h-tiny-tp1", "falcon-h1-7b-tp1",
        "mamba2-2.7b-tp1", "zamba2-7b-tp1",
    ]  # fmt: skip


@pytest.mark.parametrize("name", list(shapes.SSD_CASES), ids=list(shapes.SSD_CASES))
def test_every_case_splits_heads_evenly_over_groups(name):
    c = shapes.SSD_CASES[name]
    assert c.groups >= 1 and c.heads % c.groups == 0


@pytest.mark.parametrize(
    "model, tp, H, G",
    [
        pytest.param(shapes.ServedModel("m", 128, 64, 128, 8, 128, (8,)), 8, 16, 1, id="groups-equal-tp"),
        pytest.param(shapes.ServedModel("m", 128, 64, 128, 8, 128, (4,)), 4, 32, 2, id="groups-over-tp"),
        pytest.param(shapes.ServedModel("m", 80, 64, 128, 1, 256, (4,)), 4, 20, 1, id="one-group-replicated"),
    ],
)
def test_per_rank_groups_as_vllm_shards_them(model, tp, H, G):
    c = shapes.per_rank(model, tp)
    assert (c.heads, c.groups, c.name) == (H, G, f"m-tp{tp}")


@pytest.mark.parametrize(
    "model, tp",
    [
        pytest.param(shapes.ServedModel("m", 24, 128, 256, 1, 256, (16,)), 16, id="heads-not-divisible"),
        pytest.param(shapes.ServedModel("m", 112, 64, 64, 2, 256, (4,)), 4, id="two-groups-over-four-ranks"),
    ],
)
def test_per_rank_refuses_what_vllm_cannot_shard(model, tp):
    with pytest.raises(ValueError, match="do not split"):
        shapes.per_rank(model, tp)


@pytest.mark.parametrize(
    "name, case",
    [
        pytest.param("nemotron-3-super-120b-tp8", "nemotron-3-super-120b-tp8", id="case-name"),
        pytest.param("nemotron-h-8b", "nemotron-h-8b-tp1", id="model-smallest-tp"),
        pytest.param("nemotron-h-56b", "nemotron-h-56b-tp8", id="model-served-at-tp8-only"),
    ],
)
def test_ssd_case_lookup_for_the_tools(name, case):
    assert shapes.ssd_case(name).name == case


def test_ssd_case_lookup_names_the_cases():
    with pytest.raises(KeyError, match="nemotron-h-8b-tp1"):
        shapes.ssd_case("nemotron-h-9b")


def test_batches_as_data():
    b = shapes.SSD_BATCHES
    assert shapes.REGISTRY_BATCHES == ("1x8192", "1x32768", "16x1024", "64x64", "ragged5")
    assert b["ragged5"] == [137, 4000, 1, 900, 3000]
    for name in ("1x8192", "1x32768", "16x1024", "64x64", "8x2048", "32x512"):
        n, t = map(int, name.split("x"))
        assert b[name] == [t] * n, name


# ------------------------------------------------------------------------------------------------ --models


@pytest.mark.parametrize(
    "text, cases",
    [
        pytest.param("nemotron-3-super-120b-tp8", ["nemotron-3-super-120b-tp8"], id="one-case"),
        pytest.param("nemotron-h-8b", ["nemotron-h-8b-tp1", "nemotron-h-8b-tp2"], id="model-every-tp"),
        pytest.param("zamba2-7b-tp1, nemotron-h-8b-tp2", ["zamba2-7b-tp1", "nemotron-h-8b-tp2"], id="order-kept"),
        pytest.param("nemotron-h-8b,nemotron-h-8b-tp1", ["nemotron-h-8b-tp1", "nemotron-h-8b-tp2"], id="deduplicated"),
        pytest.param("all", list(shapes.SSD_CASES), id="all"),
    ],
)
def test_models_parsing(text, cases):
    assert bench_ssd.build_parser().parse_args(["--models", text]).models == cases


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("nemotron-h-9b", id="unknown-model"),
        pytest.param("nemotron-h-8b-tp8", id="tp-not-served"),
        pytest.param(",", id="empty"),
    ],
)
def test_models_bad_names_exit_2_naming_the_choices(capsys, text):
    with pytest.raises(SystemExit) as exc:
        bench_ssd.main(["--models", text])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --models: expected a comma list of models or cases of all, nemotron-h-8b," in err
    assert "nemotron-3-super-120b-tp8" in err and "Traceback" not in err


def test_shapes_option_is_gone(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_ssd.main(["--shapes", "nemotron-h-8b"])
    assert exc.value.code == 2
    capsys.readouterr()


# ------------------------------------------------------------------------------------------------ build_plan

QUICK = [
    ("nemotron-h-8b-tp1", "1x8192", 128),
    ("nemotron-h-8b-tp1", "1x8192", 256),
    ("nemotron-h-8b-tp1", "32x512", 128),
    ("nemotron-h-8b-tp1", "32x512", 256),
]


@pytest.mark.parametrize(
    "argv, plan",
    [
        pytest.param(["--quick"], QUICK, id="quick"),
        pytest.param(["--quick", "--batches", "32x512"], QUICK[2:], id="quick-batches"),
        pytest.param(["--quick", "--models", "nemotron-h-8b"], QUICK, id="quick-model"),
        pytest.param(["--quick", "--models", "zamba2-7b"], [], id="quick-other-model"),
        pytest.param(
            ["--models", "nemotron-3-super-120b-tp8"],
            [("nemotron-3-super-120b-tp8", b, 128) for b in ("1x8192", "1x32768", "16x1024", "64x64", "ragged5")],
            id="one-case-registry-batches",
        ),
        pytest.param(
            ["--models", "nemotron-h-8b", "--batches", "ragged5,1x8192"],
            [
                ("nemotron-h-8b-tp1", "ragged5", 128),
                ("nemotron-h-8b-tp1", "1x8192", 128),
                ("nemotron-h-8b-tp2", "ragged5", 128),
                ("nemotron-h-8b-tp2", "1x8192", 128),
            ],
            id="model-every-tp-batches",
        ),  # fmt: skip
        pytest.param(
            ["--models", "falcon-h1-7b-tp1", "--batches", "8x2048"],
            [("falcon-h1-7b-tp1", "8x2048", 256)],
            id="batch-outside-the-registry-five",
        ),
    ],
)
def test_plan_of_argv(argv, plan):
    assert _plan(argv) == plan


def test_default_plan_is_the_registry_at_the_five_batches_and_own_chunks():
    plan = _plan([])
    assert len(plan) == len(shapes.SSD_CASES) * 5
    assert [p.case for p in plan[::5]] == list(shapes.SSD_CASES)
    assert all(p.chunk == shapes.SSD_CASES[p.case].chunk_size for p in plan)
    assert {p.batch for p in plan} == set(shapes.REGISTRY_BATCHES)
    assert _plan(["--models", "all"]) == plan


def test_empty_plan_exits_2_before_any_device(capsys):
    assert bench_ssd.main(["--quick", "--models", "zamba2-7b"]) == 2
    assert "select no case" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ --designs


@pytest.fixture
def forcing_planner(monkeypatch):
    """The planner's ``forcing``, recording the design held while it is (the real context runs inside)."""
    from mate.mamba._tilelang import ssd_plan

    held, real = [], ssd_plan.forcing

    @contextlib.contextmanager
    def forcing(design, runs=None):
        held.append(design)
        try:
            with real(design, runs):
                yield
        finally:
            held.pop()

    monkeypatch.setattr(ssd_plan, "forcing", forcing)
    return held


def test_designs_default_is_auto():
    assert bench_ssd.build_parser().parse_args([]).designs == ["auto"]
    assert bench_ssd.build_parser().parse_args(["--designs", "auto"]).designs == ["auto"]
    assert bench_ssd.designs() == ("serial", "split")  # the planner's


@pytest.mark.parametrize(
    "text, designs, impls",
    [
        pytest.param("serial,split", ["serial", "split"], ["mate-serial", "mate-split"], id="both"),
        pytest.param("split", ["split"], ["mate-split"], id="one"),
        pytest.param("auto, serial", ["auto", "serial"], ["mate", "mate-serial"], id="auto-beside-a-design"),
    ],
)
def test_designs_parsing(text, designs, impls):
    args = bench_ssd.build_parser().parse_args(["--designs", text])
    assert args.designs == designs
    assert [bench_ssd.design_impl(d) for d in args.designs] == impls


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("fused", "expected a comma list of designs of auto, serial, split", id="unknown-design"),
        pytest.param(",", "expected a comma list of designs", id="empty"),
    ],
)
def test_designs_bad_names_exit_2(capsys, text, message):
    with pytest.raises(SystemExit) as exc:
        bench_ssd.main(["--designs", text])
    assert exc.value.code == 2
    assert f"argument --designs: {message}" in capsys.readouterr().err


def test_design_context_holds_the_planner_to_the_design():
    """Inside the context the planner plans the design named (Nemotron-H 8B at 1 x 8192 is serial by the rule);
    outside it, and with auto, the rule decides again."""
    import torch

    w = bench_ssd.make_window(shapes.SSD_CASES["nemotron-h-8b-tp1"], [8192], 128, 0, torch.device("cpu"))
    with bench_ssd.design_context("split"):
        assert bench_ssd.planned_design(w, 128) == "split"
    assert bench_ssd.planned_design(w, 128) == "serial"
    with bench_ssd.design_context("auto"):
        assert bench_ssd.planned_design(w, 128) == "serial"


def test_planned_design_reads_the_plan():
    """The auto row's design: split where the plan holds the split design's state pass (on the CPU the planner
    plans for an H200's 132 SMs)."""
    import torch

    few = bench_ssd.make_window(shapes.SSD_CASES["nemotron-3-super-120b-tp8"], [8192], 128, 0, torch.device("cpu"))
    many = bench_ssd.make_window(shapes.SSD_CASES["nemotron-h-8b-tp1"], [8192], 128, 0, torch.device("cpu"))
    assert bench_ssd.planned_design(few, 128) == "split"
    assert bench_ssd.planned_design(many, 128) == "serial"


# ------------------------------------------------------------------------------------------------ report


def _row(case, batch, impl, us, **kw):
    return dict(case=case, batch=batch, chunk=128, impl=impl, us=us, **kw)


def test_speedups_for_every_mate_row():
    rows = [
        _row("c", "1x8192", "mate-serial", 50.0, design="serial"),
        _row("c", "1x8192", "mate-split", 25.0, design="split"),
        _row("c", "1x8192", "vllm", 100.0),
    ]
    bench_ssd.add_speedups(rows)
    assert [r.get("speedup_vs_vllm") for r in rows] == [2.0, 4.0, None]
    alone = [_row("c", "1x8192", "mate", 50.0)]
    bench_ssd.add_speedups(alone)
    assert "speedup_vs_vllm" not in alone[0]  # no vLLM row, no ratio


def test_summary_per_case_and_batch_and_design():
    rows = []
    for batch, (serial, split, vllm) in {"1x8192": (50.0, 25.0, 100.0), "64x64": (10.0, None, 12.0)}.items():
        cell = [_row("c-tp1", batch, "mate-serial", serial, design="serial"), _row("c-tp1", batch, "vllm", vllm)]
        if split is not None:
            cell.insert(1, _row("c-tp1", batch, "mate-split", split, design="split"))
        else:
            cell.insert(1, dict(case="c-tp1", batch=batch, chunk=128, impl="mate-split", error="NotImplementedError"))
        bench_ssd.add_speedups(cell)
        rows += cell
    table, cols = bench_ssd.summary_rows(rows)
    assert cols == ["case", "batch", "chunk", "mate-serial us", "mate-split us", "vllm us", "vllm / mate-serial",
                    "vllm / mate-split"]  # fmt: skip
    assert table[0] == {"case": "c-tp1", "batch": "1x8192", "chunk": 128, "mate-serial us": 50.0,
                        "mate-split us": 25.0, "vllm us": 100.0, "vllm / mate-serial": 2.0,
                        "vllm / mate-split": 4.0}  # fmt: skip
    assert table[1]["mate-split us"] is None and table[1]["vllm / mate-serial"] == 1.2


def test_summary_of_the_planners_choice_names_its_design():
    rows = [_row("c-tp1", "1x8192", "mate", 40.0, design="serial"), _row("c-tp1", "1x8192", "vllm", 60.0)]
    bench_ssd.add_speedups(rows)
    table, cols = bench_ssd.summary_rows(rows)
    assert cols == ["case", "batch", "chunk", "design", "mate us", "vllm us", "vllm / mate"]
    assert table == [dict(case="c-tp1", batch="1x8192", chunk=128, design="serial", **{"mate us": 40.0},
                          **{"vllm us": 60.0, "vllm / mate": 1.5})]  # fmt: skip


def test_speedup_chart(tmp_path):
    pytest.importorskip("matplotlib")
    rows = []
    for case in ("a-tp1", "b-tp8"):
        for batch in ("1x8192", "ragged5"):
            cell = [_row(case, batch, "mate-serial", 50.0), _row(case, batch, "mate-split", 30.0),
                    _row(case, batch, "vllm", 80.0)]  # fmt: skip
            bench_ssd.add_speedups(cell)
            rows += cell
    path = bench_ssd.plot_speedups(rows, str(tmp_path / "ssd.png"), "a device")
    assert path and (tmp_path / "ssd.png").stat().st_size > 0


def test_speedup_chart_without_vllm_rows_is_none(tmp_path):
    assert bench_ssd.plot_speedups([_row("a", "1x8192", "mate", 5.0)], str(tmp_path / "x.png")) is None


def test_main_writes_a_row_per_design_and_the_summary(monkeypatch, tmp_path, forcing_planner):
    """``main`` end to end with the device work stubbed: each design timed inside its forcing context (warm-up and
    graph capture included), a design that cannot serve a call a row with its error, vLLM without a context."""
    import json

    import torch

    seen = []

    def fn_for(impl):
        def make(w, L):
            def call():
                held = forcing_planner[-1] if forcing_planner else None
                if impl == "mate" and held == "split" and w["batch"] == "64x64":
                    raise NotImplementedError("split: one chunk per sequence")
                return held

            return call

        return make

    def graph_time_us(fns, **kw):
        seen.append([f() for f in fns][0])  # the bench's capture calls run in the caller's context
        return {None: 100.0, "serial": 50.0, "split": 25.0}[seen[-1]]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "stub")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench_ssd, "start", lambda: (torch.device("cuda", 0), 4.0))
    monkeypatch.setattr(bench_ssd, "windows_for", lambda n: 2)
    monkeypatch.setattr(bench_ssd, "mate_fn", fn_for("mate"))
    monkeypatch.setattr(bench_ssd, "vllm_fn", fn_for("vllm"))
    monkeypatch.setattr(bench_ssd, "check_agreement", lambda *a: 1e-3)
    monkeypatch.setattr(bench_ssd, "graph_time_us", graph_time_us)
    monkeypatch.setattr(bench_ssd, "host_time_us", lambda fn, **kw: 7.0)
    monkeypatch.setattr(  # a stub window: which batch it is, the one the split design refuses or another
        bench_ssd,
        "make_window",
        lambda s, seqlens, L, seed, dev, pool, layout=None: {
            "batch": "64x64" if len(seqlens) == 64 else "x",
            "intermediate": False,
        },
    )
    argv = ["--models", "zamba2-7b-tp1", "--batches", "1x8192,64x64", "--designs", "serial,split",
            "--out", str(tmp_path), "--name", "r"]  # fmt: skip
    assert bench_ssd.main(argv) == 0
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    got = [(r["batch"], r["impl"], r.get("design"), r.get("us"), r.get("speedup_vs_vllm")) for r in rows]
    assert got == [
        ("1x8192", "mate-serial", "serial", 50.0, 2.0),
        ("1x8192", "mate-split", "split", 25.0, 4.0),
        ("1x8192", "vllm", None, 100.0, None),
        ("64x64", "mate-serial", "serial", 50.0, 2.0),
        ("64x64", "mate-split", "split", None, None),
        ("64x64", "vllm", None, 100.0, None),
    ]
    assert "NotImplementedError: split: one chunk per sequence" in rows[4]["error"]
    assert {k: rows[0][k] for k in ("model", "tp", "H", "P", "N", "G", "tokens", "chunk")} == dict(
        model="zamba2-7b", tp=1, H=112, P=64, N=64, G=2, tokens=8192, chunk=256
    )
    tflops = bench_ssd.flops(8192, shapes.SSD_CASES["zamba2-7b-tp1"], 256) / 50.0 / 1e6
    assert rows[0]["tflops"] == round(tflops, 1) and rows[0]["pct_peak"] == round(100 * tflops / 790, 1)
    md = (tmp_path / "r.md").read_text()
    assert "## Summary" in md and "| zamba2-7b-tp1 | 1x8192 | 256 | 50 | 25 | 100.0 | 2 | 4 |" in md
    assert forcing_planner == []  # every context left


def test_a_pool_window_feeds_mate_a_quantised_call():
    """``--pool``: MATE's call reads quantised initial states and writes into a quantised pool by index (the
    planner's conversions around the scan); the bytes it moves count the pool's dtype and scales."""
    import torch
    from mate.mamba.planning import plan_ssd_combined_fwd_varlen

    case = shapes.SSD_CASES["nemotron-h-8b-tp1"]
    w = bench_ssd.make_window(case, [100, 30], 128, 0, torch.device("cpu"), "int8")
    args, kwargs = bench_ssd.mate_args(w, 128)
    assert kwargs["initial_states"].dtype == torch.int8 and kwargs["final_states_out"].dtype == torch.int8
    factories = [s.factory for s in plan_ssd_combined_fwd_varlen(*args, **kwargs)]
    assert factories[0] == factories[-1] == "state_codec_kernel"
    deq = w["init_q"].float() * w["init_scale"].unsqueeze(-1)
    assert ((deq - w["init"]).abs() <= w["init_scale"].unsqueeze(-1) * 0.5 + 1e-7).all()
    rows = 2 * case.heads * case.dim
    assert bench_ssd.nbytes(130, 2, case) - bench_ssd.nbytes(130, 2, case, "int8") == 2 * rows * (3 * 128 - 4)


def test_align_batches_build_vllms_prefix_caching_layout():
    """The prefix-caching batches: ``cont8x2000`` continues after 800 cached tokens and returns final states;
    ``align8x2000`` also ends a chunk at each prefill checkpoint (absolute token 2400, vLLM's rule for 400-token
    blocks: ``floor((seq_len - 1) / 400) * 400``), off the 256 grid, and returns every chunk's state, so its bytes
    count every chunk's state written. Neither is in the default registry run."""
    import torch

    case = shapes.SSD_CASES["nemotron-h-8b-tp1"]
    cpu = torch.device("cpu")
    lay = shapes.SSD_LAYOUTS["align8x2000"]
    seq_len = lay.history[0] + shapes.SSD_BATCHES["align8x2000"][0]
    assert lay.history[0] + lay.checkpoints[0] == (seq_len - 1) // 400 * 400 == 2400 and 2400 % 256
    cont = bench_ssd.make_window(case, shapes.SSD_BATCHES["cont8x2000"], 256, 0, cpu, None,
                                 shapes.SSD_LAYOUTS["cont8x2000"])  # fmt: skip
    align = bench_ssd.make_window(case, shapes.SSD_BATCHES["align8x2000"], 256, 0, cpu, None, lay)
    _, kw_cont = bench_ssd.mate_args(cont, 256)
    _, kw_align = bench_ssd.mate_args(align, 256)
    assert kw_cont["return_intermediate_states"] is False and kw_align["return_intermediate_states"] is True
    sizes = align["meta"].cu_chunk_seqlens.diff().tolist()
    ck = align["meta"].checkpoint_chunk_indices.tolist()
    assert all(c >= 0 for c in ck) and align["meta"].nchunks == cont["meta"].nchunks + 8
    assert sizes[ck[0]] == 2400 % 256  # the short chunk that ends the checkpoint
    per_seq = case.heads * case.dim * case.dstate * 4
    assert (bench_ssd.nbytes(16000, 8, case, written=align["meta"].nchunks) - bench_ssd.nbytes(16000, 8, case)
            == (align["meta"].nchunks - 8) * per_seq)  # fmt: skip
    assert not {"cont8x2000", "align8x2000"} & set(shapes.REGISTRY_BATCHES)
