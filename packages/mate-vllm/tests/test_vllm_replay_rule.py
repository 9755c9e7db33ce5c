"""The ReplaySSM rule of the vLLM adapter (``mate_vllm.replay_rule``): derived from a bench report (a synthetic one
where MATE wins some cells, and the runs of record, where it wins none), read back, and applied per call by the
router that takes vLLM's kernel slot (``mate_vllm.ops.routed_checkpointing_ssu``), on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mate_vllm import ops, replay_rule

ROOT = Path(__file__).resolve().parents[3]
SHAPE = dict(heads=4, dim=8, dstate=16, groups=2)


def _rows(state, T, times):
    """Raw bench rows of one (state, T) at the test shape: {batch: (MATE µs, FlashInfer µs)}."""
    rows = []
    for batch, (mate, fi) in times.items():
        for impl, us in (("mate", mate), ("flashinfer", fi), ("mate-stored", 1.0)):
            rows.append(dict(op="one-token" if T == 1 else f"MTP {T}", T=T, shape="s", **SHAPE, state=state,
                             batch=batch, phase="cycle", impl=impl, us=us))  # fmt: skip
    return rows


def report(rows):
    return {"meta": {"device": "test card", "raw": rows}}


SYNTHETIC = report(
    # bf16, one token: MATE faster from batch 64 on; at 256 slower, at 1024 faster again
    _rows("bf16", 1, {1: (10, 5), 8: (20, 15), 64: (90, 100), 256: (400, 300), 1024: (800, 1000)})
    # int8, MTP 6: faster from batch 8 on
    + _rows("int8", 6, {1: (10, 5), 8: (20, 25), 64: (90, 100), 256: (200, 300), 1024: (800, 1000)})
    # fp32, MTP 2: faster everywhere
    + _rows("fp32", 2, {1: (4, 5), 64: (90, 100)})
    # a flush step where MATE is faster: not a ring cycle, not counted
    + [dict(r, phase="flush", us=1.0 if r["impl"] == "mate" else 9.0) for r in _rows("fp32", 1, {64: (0, 0)})]
)


def test_derive_names_mate_only_between_measured_wins():
    data = replay_rule.derive(SYNTHETIC)
    got = {(c["state"], c["tokens"], tuple(c["batches"])) for c in data["mate"]}
    assert got == {
        ("bfloat16", 1, (1024, None)),  # 64 wins but 256 loses: 65..255 unmeasured, so not MATE's
        ("int8", 6, (8, None)),  # four adjoining wins: one cell
        ("float32", 2, (1, None)),
    }
    assert all(c[k] == v for c in data["mate"] for k, v in SHAPE.items())
    assert "test card" in data["source"]


@pytest.mark.parametrize(
    "state, T, batch, heads, kernel",
    [
        pytest.param("int8", 6, 8, 4, "mate", id="first-measured-win"),
        pytest.param("int8", 6, 5000, 4, "mate", id="past-the-largest-measured"),
        pytest.param("int8", 6, 7, 4, "flashinfer", id="below-the-first-win"),
        pytest.param("bfloat16", 1, 64, 4, "flashinfer", id="win-whose-next-batch-loses"),
        pytest.param("bfloat16", 1, 1024, 4, "mate", id="last-win"),
        pytest.param("float32", 2, 1, 4, "mate", id="every-batch"),
        pytest.param("float32", 2, 1, 8, "flashinfer", id="other-head-shape"),
        pytest.param("float32", 4, 64, 4, "flashinfer", id="unmeasured-tokens"),
        pytest.param("float32", 1, 64, 4, "flashinfer", id="flush-step-not-counted"),
    ],
)
def test_rule_decides_per_call(state, T, batch, heads, kernel):
    rule = replay_rule.parse(replay_rule.derive(SYNTHETIC))
    assert rule.kernel(state, T, batch, heads, 8, 16, 2) == kernel


def test_margin_raises_the_bar():
    got = {(c["state"], tuple(c["batches"])) for c in replay_rule.derive(SYNTHETIC, margin=1.2)["mate"]}
    assert got == {("bfloat16", (1024, None)), ("int8", (256, None))}
    assert replay_rule.derive(SYNTHETIC, margin=1.6)["mate"] == []


def test_the_shipped_rule_is_the_runs_of_record():
    """The rule mate-vllm ships is what the last run of docs/benchmarks/replay.json derives (FlashInfer's kernel
    for every call there), and it says so in one line."""
    records = json.loads((ROOT / "docs" / "benchmarks" / "replay.json").read_text())
    shipped = json.loads(Path(replay_rule.RULE_FILE).read_text())
    assert replay_rule.derive(records) == shipped
    rule = replay_rule.load()
    assert rule.cells == () and rule.describe().startswith("FlashInfer's kernel serves every ReplaySSM call")


def test_tool_writes_a_rule_the_plugin_reads(tmp_path, capsys):
    src, dst = tmp_path / "replay.json", tmp_path / "rule.json"
    src.write_text(json.dumps(SYNTHETIC))
    assert replay_rule.main([str(src), "--write", str(dst)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MATE serves ReplaySSM for ") and "FlashInfer's kernel for the rest" in out
    assert replay_rule.load(str(dst)) == replay_rule.parse(replay_rule.derive(SYNTHETIC))


@pytest.mark.parametrize(
    "data, what",
    [
        pytest.param({"mate": []}, "'source'", id="no-source"),
        pytest.param({"source": "s", "mate": [{"state": "int8"}]}, "'batches'", id="cell-without-key"),
        pytest.param(
            {"source": "s", "mate": [dict(state="int8", tokens=1, **SHAPE, batches=[8, 4])]},
            "batches",
            id="empty-range",
        ),  # fmt: skip
    ],
)
def test_malformed_rule_is_a_value_error_naming_the_form(data, what):
    with pytest.raises(ValueError, match='expected .*"batches": \\[first, last or null\\]') as e:
        replay_rule.parse(data, "rule.json")
    assert str(e.value).startswith("rule.json: ") and what in str(e.value)


def test_tool_refuses_a_report_without_raw_rows(tmp_path, capsys):
    src = tmp_path / "r.json"
    src.write_text(json.dumps({"meta": {}, "rows": []}))
    assert replay_rule.main([str(src)]) == 2
    assert "meta.raw" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ router


def _call(batch, T, state_dtype=torch.float32, packed=False):
    """checkpointing_ssu's arguments as vLLM passes them (12 positional, the rest by name), on the CPU."""
    g = torch.Generator().manual_seed(batch * 10 + T)
    H, P, N, G, W = 4, 8, 16, 2, 4
    S, L = batch + 1, W + T
    bf16 = torch.bfloat16
    state = (torch.randn(S, H, P, N, generator=g) * 0.5).to(state_dtype)
    rings = (torch.randn(S, H, L, P, generator=g).to(bf16), torch.randn(S, G, L, N, generator=g).to(bf16),
             torch.rand(S, H, L, generator=g) * 0.3, torch.zeros(S, dtype=torch.int32),
             torch.full((S,), 2, dtype=torch.int32))  # fmt: skip
    lead = (1, batch * T) if packed else (batch, T)
    x = torch.randn(*lead, H, P, generator=g).to(bf16)
    dt = (torch.randn(*lead, H, 1, generator=g) * 0.5).to(bf16).expand(*lead, H, P)
    A = (-(torch.rand(H, generator=g) + 0.5)).view(H, 1, 1).expand(H, P, N)
    B, C = (torch.randn(*lead, G, N, generator=g).to(bf16) for _ in range(2))
    out = torch.empty(*lead, H, P, dtype=bf16)
    kw = dict(D=None, dt_softplus=True, state_batch_indices=torch.arange(1, S, dtype=torch.int32), pad_slot_id=0)
    if packed:
        kw.update(cu_seqlens=torch.arange(0, batch * T + 1, T, dtype=torch.int32), max_seqlen=T)
    return (state, *rings, x, dt, A, B, C, out), kw


@pytest.mark.parametrize("packed", [pytest.param(False, id="dense"), pytest.param(True, id="packed")])
def test_call_key_reads_what_the_rule_needs(packed):
    args, kw = _call(3, 2, packed=packed)
    assert ops.replay_call_key(args, kw) == ("float32", 2, 3, 4, 8, 16, 2)


def test_router_sends_each_call_where_the_rule_says():
    """MATE's op (the reference on this CPU: the recurrence's numbers) where the rule names the call, FlashInfer's
    kernel (a recording stand-in) elsewhere; the decision is kept per key."""
    rule = replay_rule.Rule((replay_rule.Cell("float32", 1, 4, 8, 16, 2, 2, 8),), "synthetic")
    seen = []

    def flashinfer(*args, **kwargs):
        seen.append(ops.replay_call_key(args, kwargs))
        return args[11]

    routed = ops.routed_checkpointing_ssu(flashinfer, rule)
    args, kw = _call(3, 1)
    want = args[11].clone()
    ref_args = tuple(a.clone() if i < 6 else a for i, a in enumerate(args))
    ops.adapter().runtime().replay_state_update(*ref_args[:11], want, **kw, backend="torch")
    assert torch.equal(routed(*args, **kw), want) and seen == []
    for batch, T in ((1, 1), (9, 1), (3, 2)):
        args, kw = _call(batch, T)
        routed(*args, **kw)
    assert [k[1:3] for k in seen] == [(1, 1), (1, 9), (2, 3)]


def test_router_leaves_a_call_it_cannot_read_to_mates_contract():
    rule = replay_rule.Rule((replay_rule.Cell("float32", 1, 4, 8, 16, 2, 1, None),), "synthetic")
    routed = ops.routed_checkpointing_ssu(lambda *a, **k: pytest.fail("FlashInfer's kernel ran"), rule)
    args, kw = _call(2, 1)
    with pytest.raises(ValueError, match="^state"):
        routed(args[0].tolist(), *args[1:], **kw)
