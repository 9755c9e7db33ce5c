"""The 2-byte-state kernel options (MATE_SSU_BF16_*): the defaults (the H200 A/B's winner) keep the plain "ssu"
key and reach the kernel factory, another setting reaches it through the key, malformed values raise."""

from __future__ import annotations

import pytest
import torch

tl_ssu = pytest.importorskip("mate._tilelang.ssu")
kssu = pytest.importorskip("mate_kernels.ssu")

F32, BF16, I32 = torch.float32, torch.bfloat16, torch.int32


@pytest.fixture
def factory_args(monkeypatch) -> dict:
    """The keyword arguments the runtime passes to the kernel factory (a stand-in that records them)."""
    seen = {}

    def fake_kernel(**kw):
        seen.update(kw)
        return "prim"

    monkeypatch.setattr(kssu, "ssu_kernel", fake_kernel)
    return seen


def _key(state):
    return tl_ssu._key(True, 64, 128, 16, state, BF16, F32, F32, F32, I32, I32, I32, state, True, True, True)


def test_defaults_keep_the_key():
    assert tl_ssu.parse_bf16_options({}) == tl_ssu.BF16_DEFAULTS
    assert tl_ssu.BF16_DEFAULTS == {
        "pack_early": True, "min_blocks": 8, "per_thread": 4, "packed_min_blocks": 8, "packed_per_thread": 2
    }  # fmt: skip
    assert tl_ssu.bf16_tag(tl_ssu.parse_bf16_options({})) == "ssu"
    assert _key(BF16)[0] == "ssu" and _key(F32)[0] == "ssu" and len(_key(BF16)) == 17


def test_parse_and_tag():
    env = {"MATE_SSU_BF16_PACK": "1", "MATE_SSU_BF16_MIN_BLOCKS": "8", "MATE_SSU_BF16_CHUNKS": "8",
           "MATE_SSU_BF16_PACKED_MIN_BLOCKS": "4", "MATE_SSU_BF16_PACKED_CHUNKS": "4"}  # fmt: skip
    opts = tl_ssu.parse_bf16_options(env)
    assert opts == {
        "pack_early": True,
        "min_blocks": 8,
        "per_thread": 8,
        "packed_min_blocks": 4,
        "packed_per_thread": 4,
    }
    tag = tl_ssu.bf16_tag(opts)
    assert tag == "ssu:pack=1:mb=8:chunks=8:pmb=4:pchunks=4"
    assert tl_ssu._tag_options(tag) == opts
    for bad in ({"MATE_SSU_BF16_PACK": "yes"}, {"MATE_SSU_BF16_MIN_BLOCKS": "x"}, {"MATE_SSU_BF16_CHUNKS": "3"},
                {"MATE_SSU_BF16_MIN_BLOCKS": "64"}, {"MATE_SSU_BF16_PACKED_MIN_BLOCKS": "-1"},
                {"MATE_SSU_BF16_PACKED_CHUNKS": "6"}):  # fmt: skip
        with pytest.raises(ValueError, match="MATE_SSU_BF16"):
            tl_ssu.parse_bf16_options(bad)


def test_switch_reaches_only_two_byte_states(monkeypatch, factory_args):
    seen = factory_args
    # the defaults: register caps 8 (one-token) and 8 (packed), 4 and 2 chunks per thread, early narrowing
    assert tl_ssu.build_kernel(_key(BF16)) == "prim"
    assert seen["pack_early"] is True and seen["min_blocks"] == 8
    assert seen["tiling"] == kssu.choose_tiling(64, 128, "bfloat16", 4)
    seen.clear()
    tl_ssu.build_kernel((_key(BF16)[0], False) + _key(BF16)[2:])  # packed: its own register cap and chunks
    assert seen["pack_early"] is True and seen["min_blocks"] == 8
    assert seen["tiling"] == kssu.choose_tiling(64, 128, "bfloat16", 2)
    seen.clear()
    tl_ssu.build_kernel(_key(F32))  # fp32 states: the factory's defaults
    assert "pack_early" not in seen and "tiling" not in seen and "min_blocks" not in seen
    # the former default, switched on for an A/B run
    prev = tl_ssu.set_bf16_options({"pack_early": False, "min_blocks": 0, "packed_min_blocks": 0,
                                    "packed_per_thread": 4})  # fmt: skip
    try:
        assert _key(BF16)[0] == "ssu:pack=0:mb=0:chunks=4:pmb=0:pchunks=4"
        assert _key(torch.float16)[0] == "ssu:pack=0:mb=0:chunks=4:pmb=0:pchunks=4"
        assert _key(F32)[0] == "ssu"
        seen.clear()
        tl_ssu.build_kernel(_key(BF16))
        assert seen["pack_early"] is False and seen["min_blocks"] == 0
    finally:
        tl_ssu._TAG_2B = prev
    assert _key(BF16)[0] == "ssu"


def test_chunks_option_tiling():
    t4 = kssu.choose_tiling(64, 128, "bfloat16")
    t8 = kssu.choose_tiling(64, 128, "bfloat16", 8)
    assert (t4.rows_per_thread, t4.block_p) == (4, 32)
    assert (t8.rows_per_thread, t8.block_p) == (8, 64)
    assert t4 == kssu.choose_tiling(64, 128, "bfloat16", 4)
    with pytest.raises(ValueError, match="per_thread"):
        kssu.choose_tiling(64, 128, "bfloat16", 3)


def test_bench_env_variants():
    from mate.bench import ssu as bench

    spec = "MATE_SSU_BF16_PACK=1,MATE_SSU_BF16_MIN_BLOCKS=8"
    assert bench.variant_name(spec) == "mate[PACK=1,MIN_BLOCKS=8]"
    impls, skipped = bench.load_impls(["mate"], (spec,))
    assert list(impls) == ["mate", "mate[PACK=1,MIN_BLOCKS=8]"] and not skipped
    with pytest.raises(ValueError, match="--env"):
        bench.load_impls(["mate"], ("MATE_SSU_OTHER=1",))
    with pytest.raises(ValueError, match="MATE_SSU_BF16_CHUNKS"):
        bench.load_impls(["mate"], ("MATE_SSU_BF16_CHUNKS=3",))
    base = dict(op="one-token", shape="s", heads=128, dim=64, dstate=128, groups=8, state="bf16", batch=64)
    rows = [
        dict(base, impl="mate", us=10.0, tbps=4.0),
        dict(base, impl="mate[PACK=1,MIN_BLOCKS=8]", us=5.0, tbps=8.0),
        dict(base, impl="vllm", us=11.0, tbps=3.6),
    ]
    (line,) = bench.pivot(rows)
    assert line["best peer / MATE"] == 1.1  # the variant is a column, not a peer
    assert line["mate[PACK=1,MIN_BLOCKS=8]"] == "5.00 (8.00)"
    sel = bench.selected_cases(True, "bf16")
    assert sel and all(c.state == torch.bfloat16 for c in sel) and len(sel) < len(bench.cases(True))


def test_bench_variant_call_switches_and_restores(monkeypatch):
    import mate.mamba.ssu as mssu
    from mate.bench import ssu as bench

    seen = []
    monkeypatch.setattr(bench, "_mate", lambda st, w: seen.append((tl_ssu._TAG_2B, mssu.FAST_PATH)) or "y")
    call = bench._mate_with_options("MATE_SSU_BF16_PACKED_MIN_BLOCKS=0")
    fast, tag = mssu.FAST_PATH, tl_ssu._TAG_2B
    assert call(None, None) == "y"
    assert seen == [("ssu:pack=1:mb=8:chunks=4:pmb=0:pchunks=2", False)]
    assert (mssu.FAST_PATH, tl_ssu._TAG_2B) == (fast, tag)


def _packed_key(state):
    return tl_ssu._key(False, 64, 128, 16, state, BF16, F32, F32, F32, I32, torch.int64, I32, state, True, True, True)


def test_f32_packed_register_cap_option(monkeypatch, factory_args):
    assert tl_ssu.parse_f32_options({}) == tl_ssu.F32_DEFAULTS == {"packed_min_blocks": 6}
    assert _packed_key(F32)[0] == "ssu"
    for bad in ("x", "-1", "33"):
        with pytest.raises(ValueError, match="MATE_SSU_F32_PACKED_MIN_BLOCKS"):
            tl_ssu.parse_f32_options({"MATE_SSU_F32_PACKED_MIN_BLOCKS": bad})
    seen = factory_args
    tl_ssu.build_kernel(_packed_key(F32))
    assert seen["min_blocks"] == 6  # the default: the measured 6-CTA cap, under the plain key
    for key in (_key(F32), _packed_key(BF16)):  # only the fp32 packed kernel takes it
        seen.clear()
        tl_ssu.build_kernel(key)
        assert seen.get("min_blocks") != 6
    prev = tl_ssu.set_f32_options(tl_ssu.parse_f32_options({"MATE_SSU_F32_PACKED_MIN_BLOCKS": "0"}))
    try:
        # only the fp32 packed kernel's key and build change
        assert _packed_key(F32)[0] == "ssu:f32pmb=0"
        assert _key(F32)[0] == "ssu" and _key(BF16)[0] == "ssu" and _packed_key(BF16)[0] == "ssu"
        seen.clear()
        tl_ssu.build_kernel(_packed_key(F32))
        assert "min_blocks" not in seen and "pack_early" not in seen and "tiling" not in seen
    finally:
        tl_ssu._TAG_F32 = prev
    assert _packed_key(F32)[0] == "ssu"


def test_bench_f32_variant(monkeypatch):
    import mate.mamba.ssu as mssu
    from mate.bench import ssu as bench

    spec = "MATE_SSU_F32_PACKED_MIN_BLOCKS=5"
    assert bench.variant_name(spec) == "mate[F32_PACKED_MIN_BLOCKS=5]"
    seen = []
    monkeypatch.setattr(bench, "_mate", lambda st, w: seen.append((tl_ssu._TAG_F32, tl_ssu._TAG_2B)) or "y")
    tags = (tl_ssu._TAG_F32, tl_ssu._TAG_2B)
    assert bench._mate_with_options(spec)(None, None) == "y"
    assert seen == [("ssu:f32pmb=5", "ssu")]
    assert (tl_ssu._TAG_F32, tl_ssu._TAG_2B) == tags and mssu.FAST_PATH is True
    with pytest.raises(ValueError, match="MATE_SSU_F32_PACKED_MIN_BLOCKS"):
        bench.load_impls(["mate"], ("MATE_SSU_F32_PACKED_MIN_BLOCKS=99",))


# ---- the small-grid choice of the one-token kernel (MATE_SSU_BF16_SMALL_GRID)


@pytest.mark.parametrize(
    "nseq, heads, P, N, state, setting, small",
    [
        pytest.param(1, 128, 64, 128, torch.bfloat16, 4, True, id="H128-batch1-256-CTAs"),
        pytest.param(2, 128, 64, 128, torch.bfloat16, 4, True, id="H128-batch2-512-CTAs"),
        pytest.param(3, 128, 64, 128, torch.bfloat16, 4, False, id="H128-batch3-768-CTAs"),
        pytest.param(8, 16, 64, 128, torch.float16, 4, True, id="H16-batch8-fp16"),
        pytest.param(1, 24, 128, 256, torch.bfloat16, 4, True, id="H24-P128-N256"),
        pytest.param(1, 32, 80, 128, torch.bfloat16, 4, False, id="P80-two-chunks-per-thread"),
        pytest.param(1, 128, 64, 128, torch.float32, 4, False, id="fp32-state-never"),
        pytest.param(1, 128, 64, 128, torch.bfloat16, 0, False, id="off"),
    ],
)
def test_small_grid_choice(monkeypatch, nseq, heads, P, N, state, setting, small):
    """CTAs = sequences x heads x P blocks (P 64 at N 128: 2 blocks of 32 rows) against setting x SMs (132)."""
    monkeypatch.setattr(tl_ssu, "is_accelerator", lambda dev: True)
    monkeypatch.setattr(tl_ssu, "sm_count", lambda dev: 132)
    monkeypatch.setattr(tl_ssu, "_SMALL_GRID", setting)
    assert tl_ssu._small_grid(nseq, heads, P, N, state, torch.device("cuda")) is small


def test_small_grid_key_and_prewarm():
    """A small grid's one-token key: the current options without the one-token cap, narrowing late (the packed
    kernel's fields as they are); the packed kernel never changes; prewarm compiles both one-token kernels."""
    bf, f32, i32, i64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
    one = tl_ssu._key(True, 64, 128, 16, bf, bf, f32, f32, f32, i32, i32, i32, bf, True, True, True, True)
    assert one[0] == "ssu:pack=0:mb=0:chunks=4:pmb=8:pchunks=2"
    assert tl_ssu._tag_options(one[0]) == {**tl_ssu.BF16_DEFAULTS, "pack_early": False, "min_blocks": 0}
    packed = tl_ssu._key(False, 64, 128, 16, bf, bf, f32, f32, f32, i32, i64, i32, bf, True, True, True, True)
    assert packed[0] == "ssu"
    keys = tl_ssu.prewarm_keys(state_dtype=bf, io_dtype=bf, heads=128, dim=64, dstate=128, groups=8,
                               slot_dtype=i32, packed=True, meta_dtype=i32, tie_hdim=True)  # fmt: skip
    assert {k[0] for k in keys if k[1]} == {"ssu", one[0]} and {k[0] for k in keys if not k[1]} == {"ssu"}


def test_small_grid_bad_value_raises():
    with pytest.raises(ValueError, match=tl_ssu.SMALL_GRID_ENV):
        tl_ssu.parse_small_grid({tl_ssu.SMALL_GRID_ENV: "many"})


# ---- the row reduction of y = s . C (MATE_SSU_TRANSPOSED_REDUCE)


def test_transposed_reduce_option(monkeypatch, factory_args):
    """The packed kernel: default on (the plain keys, the factory's default), off tags packed keys ":tr=0" and
    reaches the factory with the tag's other options intact. The one-token kernel: always the plain reduction
    (measured no faster transposed), whatever the setting, under its plain key. Malformed values raise."""
    assert tl_ssu.parse_transposed_reduce({}) is True
    assert tl_ssu.parse_transposed_reduce({tl_ssu.REDUCE_ENV: "0"}) is False
    for bad in ("", "2", "plain"):
        with pytest.raises(ValueError, match=tl_ssu.REDUCE_ENV):
            tl_ssu.parse_transposed_reduce({tl_ssu.REDUCE_ENV: bad})
    seen = factory_args
    small = tl_ssu._key(True, 64, 128, 16, BF16, BF16, F32, F32, F32, I32, I32, I32, BF16, True, True, True, True)
    for setting in (True, False):
        monkeypatch.setattr(tl_ssu, "_TRANSPOSED", setting)
        assert _key(F32)[0] == "ssu" and _key(BF16)[0] == "ssu"
        assert tl_ssu._key(True, 64, 128, 16, BF16, BF16, F32, F32, F32, I32, I32, I32, BF16, True, True, True,
                           True) == small  # fmt: skip
        for key in (_key(F32), _key(BF16), small):
            seen.clear()
            tl_ssu.build_kernel(key)
            assert seen["transposed_reduce"] is False
    monkeypatch.setattr(tl_ssu, "_TRANSPOSED", True)
    for state in (F32, BF16):
        assert _packed_key(state)[0] == "ssu"
        seen.clear()
        tl_ssu.build_kernel(_packed_key(state))
        assert "transposed_reduce" not in seen  # the factory's default (True)
    monkeypatch.setattr(tl_ssu, "_TRANSPOSED", False)
    assert _packed_key(F32)[0] == "ssu:tr=0" and _packed_key(BF16)[0] == "ssu:tr=0"
    seen.clear()
    tl_ssu.build_kernel(_packed_key(F32))
    assert seen["transposed_reduce"] is False and seen["min_blocks"] == 6  # the fp32 packed register cap stays
    seen.clear()
    tl_ssu.build_kernel(_packed_key(BF16))
    assert seen["transposed_reduce"] is False and seen["min_blocks"] == 8  # the 2-byte packed options stay


def test_transposed_reduce_factory_choice():
    """The factory takes the transposed reduction only where a thread's rows fit its row's lanes."""
    for P, N, state in ((64, 128, "float32"), (64, 128, "bfloat16"), (80, 128, "bfloat16"), (128, 256, "float32")):
        t = kssu.choose_tiling(P, N, state)
        assert t.rows_per_thread <= t.lanes


def test_bench_transposed_reduce_variant(monkeypatch):
    from mate.bench import ssu as bench

    spec = "MATE_SSU_TRANSPOSED_REDUCE=0"
    assert bench.variant_name(spec) == "mate[TRANSPOSED_REDUCE=0]"
    seen = []
    monkeypatch.setattr(bench, "_mate", lambda st, w: seen.append(tl_ssu._TRANSPOSED) or "y")
    assert bench._mate_with_options(spec)(None, None) == "y"
    assert seen == [False] and tl_ssu._TRANSPOSED is True


def test_bench_pdl_variant_sets_and_restores(monkeypatch):
    """A variant's settings hold during its call only; the ones it does not name take their defaults there."""
    from mate.bench import ssu as bench

    monkeypatch.setattr(tl_ssu, "_TRANSPOSED", False)  # a process-wide setting the variant does not name
    seen = []
    monkeypatch.setattr(bench, "_mate", lambda st, w: seen.append((tl_ssu._PDL, tl_ssu._TRANSPOSED)) or "y")
    assert bench._mate_with_options("MATE_SSU_PDL=1")(None, None) == "y"
    assert seen == [(True, True)] and tl_ssu._PDL is False and tl_ssu._TRANSPOSED is False


# ---- programmatic dependent launch (MATE_SSU_PDL, off by default)


def test_pdl_setting_parse():
    assert tl_ssu.parse_pdl({}) is False  # off
    assert tl_ssu.parse_pdl({tl_ssu.PDL_ENV: "auto"}) is None
    assert tl_ssu.parse_pdl({tl_ssu.PDL_ENV: "1"}) is True and tl_ssu.parse_pdl({tl_ssu.PDL_ENV: "0"}) is False
    for bad in ("", "2", "on", "AUTO"):
        with pytest.raises(ValueError, match=tl_ssu.PDL_ENV):
            tl_ssu.parse_pdl({tl_ssu.PDL_ENV: bad})


@pytest.mark.parametrize(
    "setting, kind, major, expected",
    [
        pytest.param(None, "cuda", 9, True, id="auto-hopper"),
        pytest.param(None, "cuda", 10, True, id="auto-blackwell"),
        pytest.param(None, "cuda", 8, False, id="auto-ampere"),
        pytest.param(None, "musa", 0, False, id="auto-musa"),
        pytest.param(None, "cpu", 0, False, id="auto-cpu"),
        pytest.param(False, "cuda", 9, False, id="off-hopper"),
        pytest.param(True, "cuda", 9, True, id="on-hopper"),
        pytest.param(True, "cuda", 8, NotImplementedError, id="on-ampere"),
        pytest.param(True, "musa", 0, NotImplementedError, id="on-musa"),
    ],
)
def test_pdl_rule(monkeypatch, setting, kind, major, expected):
    monkeypatch.setattr(tl_ssu, "_PDL", setting)
    if expected is NotImplementedError:
        with pytest.raises(NotImplementedError, match=tl_ssu.PDL_ENV):
            tl_ssu.pdl_for_capability(kind, major)
    else:
        assert tl_ssu.pdl_for_capability(kind, major) is expected


def test_pdl_for_devices_and_targets(monkeypatch):
    monkeypatch.setattr(tl_ssu, "_PDL", None)
    assert tl_ssu.pdl_for(torch.device("cpu")) is False
    assert tl_ssu.pdl_for_arch("sm_90a") is True and tl_ssu.pdl_for_arch("sm_100a") is True
    assert tl_ssu.pdl_for_arch("sm_89") is False
    with pytest.raises(ValueError, match="target"):
        tl_ssu.pdl_for_arch("hopper")
    monkeypatch.setattr(tl_ssu, "_PDL", True)
    with pytest.raises(NotImplementedError, match=tl_ssu.PDL_ENV):
        tl_ssu.pdl_for(torch.device("cpu"))


def test_pdl_key_and_factory(monkeypatch, factory_args):
    """No PDL: plain keys, no ``pdl`` for the factory; PDL: ":pdl=1" last in the tag, after the other options,
    and the factory gets it with them intact."""
    seen = factory_args
    tl_ssu.build_kernel(_packed_key(F32))
    assert "pdl" not in seen
    monkeypatch.setattr(tl_ssu, "_TRANSPOSED", False)
    one = tl_ssu._key(True, 64, 128, 16, F32, BF16, F32, F32, F32, I32, I32, I32, F32, True, True, True, pdl=True)
    packed = tl_ssu._key(False, 64, 128, 16, BF16, BF16, F32, F32, F32, I32, torch.int64, I32, BF16, True, True,
                         True, pdl=True)  # fmt: skip
    assert one[0] == "ssu:pdl=1" and packed[0] == "ssu:tr=0:pdl=1"
    seen.clear()
    tl_ssu.build_kernel(packed)
    assert seen["pdl"] is True and seen["transposed_reduce"] is False and seen["min_blocks"] == 8
    seen.clear()
    tl_ssu.build_kernel(one)
    assert seen["pdl"] is True and seen["transposed_reduce"] is False


def test_prewarm_keys_follow_pdl():
    kw = dict(state_dtype=BF16, io_dtype=BF16, heads=128, dim=64, dstate=128, groups=8, slot_dtype=I32, packed=True,
              meta_dtype=I32, tie_hdim=True)  # fmt: skip
    off, on = tl_ssu.prewarm_keys(**kw), tl_ssu.prewarm_keys(**kw, pdl=True)
    assert len(off) == len(on) and not any(k[0].endswith(":pdl=1") for k in off)
    assert [k[0] for k in on] == [k[0] + ":pdl=1" for k in off] and [k[1:] for k in on] == [k[1:] for k in off]


def test_compile_grid_builds_both_launch_forms(monkeypatch):
    """The main grid as sm_90a runs it under the setting, plus the PDL form of two configurations when that is off."""
    off = [i.label for i in tl_ssu.compile_grid()]
    assert sum(label.endswith(" pdl") for label in off) == 2
    monkeypatch.setattr(tl_ssu, "_PDL", None)  # auto: sm_90a takes PDL, the whole main grid is built with it
    auto = [i.label for i in tl_ssu.compile_grid()]
    assert sum(label.endswith(" pdl") for label in auto) == 6 and len(auto) == len(off) - 2


def test_bench_after_producer_pivot():
    """The producer's own time is a column, never the best peer."""
    from mate.bench import ssu as bench

    base = dict(op="one-token", shape="s", heads=1, dim=64, dstate=128, groups=1, state="bf16", batch=1)
    rows = [dict(base, impl="mate", us=3.0, tbps=1.0), dict(base, impl="vllm", us=4.0, tbps=0.8),
            dict(base, impl=bench.PRODUCER, us=2.0, tbps=None)]  # fmt: skip
    (line,) = bench.pivot(rows)
    assert line[bench.PRODUCER] == "2.00" and line["best peer / MATE"] == round(4.0 / 3.0, 2)
