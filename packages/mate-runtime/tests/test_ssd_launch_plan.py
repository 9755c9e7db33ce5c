"""The SSD TileLang launcher's plan on the CPU: tile choice, what raises NotImplementedError, kernel keys."""

from __future__ import annotations

import math

import pytest
import torch
from mate._tilelang import ssd as tl_ssd
from mate.mamba._ssd_call import normalize_ssd
from mate.mamba.chunking import chunk_metadata

pytest.importorskip("mate_kernels.ssd")


@pytest.mark.parametrize(
    "P, N, L, io, block_L, shared",
    [
        pytest.param(64, 128, 128, torch.bfloat16, 128, False, id="nemotron-c128"),
        pytest.param(64, 128, 256, torch.bfloat16, 128, False, id="nemotron-c256"),
        pytest.param(64, 64, 64, torch.float16, 64, True, id="c64"),
        pytest.param(128, 256, 256, torch.bfloat16, 64, True, id="falcon-h1"),
    ],
)
def test_plan_picks_a_fitting_tile(P, N, L, io, block_L, shared):
    p = tl_ssd.plan(P, N, L, io)
    assert (p["block_P"], p["block_L"], p["scores_in_shared"]) == (64, block_L, shared)
    from mate_kernels.ssd import fused_smem_bytes

    smem = fused_smem_bytes(dim_block=64, dstate=N, block_L=block_L, io_bytes=2, num_stages=2, scores_in_shared=shared)
    assert smem <= tl_ssd.SMEM_LIMIT


@pytest.mark.parametrize(
    "P, N, L, io, words",
    [
        pytest.param(64, 128, 128, torch.float32, "float32", id="fp32-io"),
        pytest.param(64, 128, 32, torch.bfloat16, "chunk_size=32", id="chunk-32"),
        pytest.param(64, 96, 128, torch.bfloat16, "dstate=96", id="dstate-96"),
        pytest.param(72, 128, 128, torch.bfloat16, "dim=72", id="dim-72-not-16"),
    ],
)
def test_plan_raises_not_implemented(P, N, L, io, words):
    with pytest.raises(NotImplementedError, match=words):
        tl_ssd.plan(P, N, L, io)


@pytest.mark.parametrize(
    "P, N, L, block_P, block_L",
    [
        pytest.param(80, 128, 256, 80, 64, id="P80-N128"),  # a 128-token tile does not fit beside the x transpose
        pytest.param(80, 64, 128, 80, 128, id="P80-N64"),
        pytest.param(160, 128, 128, 80, 64, id="P160-two-blocks"),
        pytest.param(48, 256, 256, 48, 64, id="P48-N256"),
    ],
)
def test_narrow_p_plan(P, N, L, block_P, block_L):
    from mate_kernels.ssd import fused_smem_bytes

    p = tl_ssd.plan(P, N, L, torch.bfloat16)
    assert (p["block_P"], p["block_L"], p["narrow_p"]) == (block_P, block_L, True)
    smem = fused_smem_bytes(dim_block=block_P, dstate=N, block_L=block_L, io_bytes=2, num_stages=2,
                            scores_in_shared=p["scores_in_shared"], precomputed_dt=True, decay_rows=True,
                            narrow_p=True)  # fmt: skip
    assert smem <= tl_ssd.SMEM_LIMIT


@pytest.mark.parametrize("P", [pytest.param(72, id="P72-not-16"), pytest.param(8, id="P8")])
def test_narrow_p_still_needs_16(P):
    with pytest.raises(NotImplementedError, match=f"dim={P}"):
        tl_ssd.plan(P, 128, 128, torch.bfloat16)


def test_multiple_of_64_keeps_the_measured_tiling():
    p = tl_ssd.plan(128, 128, 256, torch.bfloat16)
    assert p["block_P"] == 64 and "narrow_p" not in p


def _call(**kw):
    meta = chunk_metadata([5, 300], 128)
    T, H, P, N, G = 305, 4, 64, 128, 2
    args = dict(
        x=torch.zeros(T, H, P, dtype=torch.bfloat16), dt=torch.zeros(T, H), A=torch.zeros(H),
        B=torch.zeros(T, G, N, dtype=torch.bfloat16), C=torch.zeros(T, G, N, dtype=torch.bfloat16), chunk_size=128,
        cu_seqlens=meta.cu_seqlens, cu_chunk_seqlens=meta.cu_chunk_seqlens,
        last_chunk_indices=meta.last_chunk_indices, seq_idx=meta.seq_idx,
    )  # fmt: skip
    args.update(kw)
    names = ["x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices", "seq_idx"]
    return normalize_ssd(*[args.pop(n) for n in names], **args)


@pytest.fixture
def fused_design():
    with tl_ssd.using("fused"):
        yield


def test_kernel_keys_follow_the_call(fused_design):
    base, rkey = tl_ssd.kernel_keys(_call(D=torch.zeros(4), dt_bias=torch.zeros(4), dt_softplus=True))
    assert base[0] == "ssd_fused" and rkey == ("ssd_runs", "int32", "int32", "int32", False)
    # z and initial states are runtime flags: the same compiled kernel
    z = torch.zeros(305, 4, 64, dtype=torch.bfloat16)
    init = torch.zeros(2, 4, 64, 128, dtype=torch.bfloat16)  # the default state dtype is C's (bf16)
    same, _ = tl_ssd.kernel_keys(
        _call(
            D=torch.zeros(4),
            dt_bias=torch.zeros(4),
            dt_softplus=True,
            z=z,
            initial_states=init,
            state_dtype=torch.bfloat16,
        )
    )
    assert same == base
    # D per (head, dim), dt_limit, intermediate states, the pool's dtype are compile-time
    assert tl_ssd.kernel_keys(_call(D=torch.zeros(4, 64), dt_bias=torch.zeros(4), dt_softplus=True))[0] != base
    lim = tl_ssd.kernel_keys(_call(dt_limit=(0.01, 0.2)))[0]
    assert (lim[-5], lim[-4]) == (0.01, 0.2)
    assert tl_ssd.kernel_keys(_call(return_intermediate_states=True))[0][-1] is True
    pool = torch.zeros(6, 4, 64, 128, dtype=torch.float16)
    k, r = tl_ssd.kernel_keys(_call(final_states_out=pool, final_state_indices=torch.tensor([3, 1], dtype=torch.int64)))
    assert k[7] == "float16" and r == ("ssd_runs", "int32", "int32", "int64", True)
    assert math.isinf(base[-4])


def test_prepass_design_adds_the_dt_pass_with_the_call_dt_options():
    call = _call(D=torch.zeros(4), dt_bias=torch.zeros(4), dt_softplus=True, dt_limit=(0.01, 0.2))
    fused, rkey, dkey = tl_ssd.kernel_keys(call, "prepass")
    assert fused[0] == "ssd_prepass" and fused[1:] == tl_ssd.kernel_keys(call, "fused")[0][1:]
    assert rkey[0] == "ssd_runs"
    # heads, chunk, tile, then the dt options the pre-pass compiles in
    # (and by default the runs table's key after the decay-rows flag: the pre-pass computes it)
    base = dkey[: tl_ssd.DT_DECAY_ROWS + 1]
    assert base[:4] == ("ssd_dt", 4, 128, 128) and (base[-4], base[-3]) == (0.01, 0.2) and base[-1] is False
    assert dkey[tl_ssd.DT_DECAY_ROWS + 1 :] == (rkey[2:],)


def test_lean_design_is_the_prepass_keys_under_its_own_name():
    call = _call(D=torch.zeros(4), dt_bias=torch.zeros(4), dt_softplus=True)
    lean = tl_ssd.kernel_keys(call, "lean")
    pre = tl_ssd.kernel_keys(call, "prepass")
    assert lean[0][0] == "ssd_lean" and lean[0][1:] == pre[0][1:] and lean[1] == pre[1]
    # the same pre-pass, but writing the decay rows
    d = tl_ssd.DT_DECAY_ROWS
    assert lean[2][:d] == pre[2][:d] and lean[2][d + 1 :] == pre[2][d + 1 :]
    assert (lean[2][d], pre[2][d]) == (True, False)


def test_variant_comes_from_the_environment_and_using_overrides_it(monkeypatch):
    monkeypatch.delenv(tl_ssd.KERNEL_ENV, raising=False)
    assert tl_ssd.variant() == tl_ssd.DEFAULT_VARIANT == "lean"
    monkeypatch.setenv(tl_ssd.KERNEL_ENV, " Fused ")
    assert tl_ssd.variant() == "fused"
    with tl_ssd.using("prepass"):
        assert tl_ssd.variant() == "prepass"
    assert tl_ssd.variant() == "fused"
    monkeypatch.setenv(tl_ssd.KERNEL_ENV, "split")
    with pytest.raises(ValueError, match="MATE_SSD_KERNEL"):
        tl_ssd.variant()
    with pytest.raises(ValueError, match="kind"):
        with tl_ssd.using("split"):
            pass


@pytest.mark.parametrize(
    "impls",
    ["mate-split", "mate,triton", ",", "mate-prepass+overlap", "mate-lean+fast"],
    ids=["unknown-design", "unknown-peer", "empty", "overlap-not-lean", "unknown-option"],
)
def test_bench_ssd_rejects_unknown_impls_before_touching_a_device(impls):
    from mate.bench import ssd as bench_ssd

    with pytest.raises(ValueError, match="--impls"):
        bench_ssd.main(["--impls", impls])


def test_tile_knobs(monkeypatch):
    monkeypatch.setenv(tl_ssd.THREADS_ENV, "512")
    p = tl_ssd.plan(64, 128, 256, torch.bfloat16)
    # four consumer warpgroups take the scores from shared memory; 128-token tiles then do not fit
    assert (p["threads"], p["scores_in_shared"], p["block_L"]) == (512, True, 64)
    monkeypatch.setenv(tl_ssd.THREADS_ENV, "0")
    monkeypatch.setenv(tl_ssd.BLOCK_L_ENV, "64")
    p = tl_ssd.plan(64, 128, 256, torch.bfloat16)
    assert (p["threads"], p["scores_in_shared"], p["block_L"]) == (256, True, 64)
    # explicit arguments win over the environment
    assert tl_ssd.plan(64, 128, 256, torch.bfloat16, block_L=128)["block_L"] == 128


@pytest.mark.parametrize(
    "name, value",
    [
        pytest.param(tl_ssd.THREADS_ENV, "384", id="threads-384"),
        pytest.param(tl_ssd.BLOCK_L_ENV, "96", id="block-L-96"),
        pytest.param(tl_ssd.BLOCK_L_ENV, "big", id="block-L-word"),
    ],
)
def test_tile_knobs_reject_bad_values(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        tl_ssd.plan(64, 128, 256, torch.bfloat16)


def test_cache_key_follows_the_tile_knobs(monkeypatch, fused_design):
    key, rkey = tl_ssd.kernel_keys(_call(D=torch.zeros(4), dt_bias=torch.zeros(4), dt_softplus=True))
    default = tl_ssd.cache_key(key, tl_ssd.builder_for(key))
    monkeypatch.setenv(tl_ssd.THREADS_ENV, "512")
    wide = tl_ssd.cache_key(key, tl_ssd.builder_for(key))
    # same kernel key, different tiles: never the same compiled kernel
    assert default[: len(key)] == wide[: len(key)] == key and default != wide
    assert tl_ssd.cache_key(rkey, tl_ssd.builder_for(rkey)) == rkey  # kernels without planned tiles


def test_prewarm_model_caches_under_the_launcher_key():
    from mate.prewarm_model import ModelSSM, plan_kernels

    model = ModelSSM(model_type="mamba2", heads=8, dim=64, dstate=128, groups=2, chunk_size=128)
    _, _, items = plan_kernels(model, tp=1, state_dtype=torch.float32, io_dtype=torch.bfloat16, mtp_tokens=0)
    fkeys, rkeys = tl_ssd.prewarm_keys(
        heads=8, groups=2, dim=64, dstate=128, chunk_size=128, io_dtype=torch.bfloat16, state_dtype=torch.float32,
        dt_dtype=torch.float32,
    )  # fmt: skip
    expected = {ck for k in fkeys + rkeys for ck, _ in tl_ssd.builds(k)}
    assert len(expected) == len(fkeys) * 2 + len(rkeys)  # each lean kernel with and without the L2 prefetch
    assert {key for fam, _label, key, _b, _pc in items if fam == "ssd"} == expected


def test_overlap_option(monkeypatch):
    lean_key = tl_ssd.kernel_keys(_call(), "lean")[0]
    pre_key = tl_ssd.kernel_keys(_call(), "prepass")[0]
    monkeypatch.delenv(tl_ssd.OVERLAP_ENV, raising=False)
    assert tl_ssd._fused_builder(lean_key).tiles["overlap"] is True  # the default (measured faster)
    default = tl_ssd.cache_key(lean_key, tl_ssd._fused_builder(lean_key))
    monkeypatch.setenv(tl_ssd.OVERLAP_ENV, "0")
    assert "overlap" not in tl_ssd._fused_builder(lean_key).tiles  # off: the first measured kernel, its key
    assert tl_ssd.cache_key(lean_key, tl_ssd._fused_builder(lean_key)) != default
    monkeypatch.setenv(tl_ssd.OVERLAP_ENV, "1")
    assert tl_ssd.cache_key(lean_key, tl_ssd._fused_builder(lean_key)) == default
    # only the lean design at a P block that is a multiple of 64
    assert "overlap" not in tl_ssd._fused_builder(pre_key).tiles
    narrow = tl_ssd.plan(80, 128, 128, torch.bfloat16)
    assert "overlap" not in tl_ssd._fused_builder(lean_key, narrow).tiles
    # asked for by the caller's tiles (the compile check), whatever the environment
    monkeypatch.setenv(tl_ssd.OVERLAP_ENV, "1")
    tiles = {**tl_ssd.plan(64, 128, 128, torch.bfloat16), "overlap": False}
    assert "overlap" not in tl_ssd._fused_builder(lean_key, tiles).tiles
    monkeypatch.setenv(tl_ssd.OVERLAP_ENV, "2")
    with pytest.raises(ValueError, match=tl_ssd.OVERLAP_ENV):
        tl_ssd._fused_builder(lean_key)


def test_preload_option(monkeypatch):
    lean_key = tl_ssd.kernel_keys(_call(), "lean")[0]
    pre_key = tl_ssd.kernel_keys(_call(), "prepass")[0]
    monkeypatch.delenv(tl_ssd.PRELOAD_ENV, raising=False)
    assert tl_ssd._fused_builder(lean_key).tiles.get("preload", False) is tl_ssd.PRELOAD_DEFAULT
    for raw, on in (("1", True), ("0", False)):
        monkeypatch.setenv(tl_ssd.PRELOAD_ENV, raw)
        assert tl_ssd._fused_builder(lean_key).tiles.get("preload", False) is on
        assert "preload" not in tl_ssd._fused_builder(pre_key).tiles  # lean only
    monkeypatch.setenv(tl_ssd.PRELOAD_ENV, "yes")
    with pytest.raises(ValueError, match=tl_ssd.PRELOAD_ENV):
        tl_ssd._fused_builder(lean_key)


def test_preload_needs_lean():
    from mate_kernels.ssd import ssd_fused_kernel

    with pytest.raises(ValueError, match="preload"):
        ssd_fused_kernel(heads=8, groups=2, dim=64, dstate=128, chunk_size=128, preload=True)


def test_overlap_needs_lean_decay_rows_and_a_64_multiple():
    from mate_kernels.ssd import ssd_fused_kernel

    base = dict(heads=8, groups=2, dim=64, dstate=128, chunk_size=128, block_P=64, overlap=True)
    for bad in (dict(), dict(lean=True, precomputed_dt=True), dict(lean=True, precomputed_dt=True, decay_rows=True,
                                                                   dim=80, block_P=80, narrow_p=True)):  # fmt: skip
        with pytest.raises(ValueError, match="overlap"):
            ssd_fused_kernel(**{**base, **bad})


def test_options_and_the_bench_impl_names(monkeypatch):
    from mate.bench.ssd import mate_kind, parse_kind

    monkeypatch.delenv(tl_ssd.OVERLAP_ENV, raising=False)
    monkeypatch.delenv(tl_ssd.DT_HEADS_ENV, raising=False)
    lean_key, _, dkey = tl_ssd.kernel_keys(_call(), "lean")
    with tl_ssd.options(overlap=False, dt_heads=1):
        assert "overlap" not in tl_ssd._fused_builder(lean_key).tiles
        assert tl_ssd._dt_builder(dkey).tiles is None
        with tl_ssd.options(overlap=True, preload=True):
            assert tl_ssd._fused_builder(lean_key).tiles["overlap"] is True
            assert tl_ssd._fused_builder(lean_key).tiles["preload"] is True
    # the defaults: overlap on, 4 heads in this call: 4 per dt pre-pass CTA
    assert tl_ssd._fused_builder(lean_key).tiles["overlap"] is True
    assert tl_ssd._dt_builder(dkey).tiles == {"heads_per_cta": 4}
    assert mate_kind("mate-lean+overlap") == "lean+overlap" and mate_kind("mate") is None
    assert parse_kind("lean+overlap+dt8") == ("lean", {"overlap": True, "dt_heads": 8})
    assert parse_kind("lean+sync+dt1+preload") == ("lean", {"overlap": False, "dt_heads": 1, "preload": True})
    assert parse_kind("lean+hpc8") == ("lean", {"heads_per_cta": 8})
    assert parse_kind("lean+dtruns") == ("lean", {"runs_in_dt": True})
    assert parse_kind("prepass") == ("prepass", {}) and parse_kind(None) == (None, {})
    for bad in ("prepass+overlap", "lean+fast"):
        with pytest.raises(ValueError, match="lean"):
            parse_kind(bad)


@pytest.mark.parametrize(
    "heads, n, hb", [(128, 8, 8), (24, 16, 8), (80, 8, 8), (4, 8, 4), (6, 8, 2), (7, 8, 1), (128, 1, 1)]
)
def test_dt_heads_option(monkeypatch, heads, n, hb):
    monkeypatch.setenv(tl_ssd.DT_HEADS_ENV, str(n))
    assert tl_ssd._dt_heads(heads) == hb
    key = ("ssd_dt", heads, 256, 128, "float32", "float32", "int32", "int32", True, 0.0, math.inf, True, True)
    build = tl_ssd._dt_builder(key)
    assert build.tiles == ({"heads_per_cta": hb} if hb > 1 else None)
    assert tl_ssd.cache_key(key, build) == (key if hb == 1 else key + ((("heads_per_cta", hb),),))
    monkeypatch.setenv(tl_ssd.DT_HEADS_ENV, "3")
    with pytest.raises(ValueError, match=tl_ssd.DT_HEADS_ENV):
        tl_ssd._dt_heads(heads)
    monkeypatch.delenv(tl_ssd.DT_HEADS_ENV)  # the default: up to DT_HEADS_DEFAULT
    assert tl_ssd._dt_heads(heads) == max(d for d in (1, 2, 4, 8) if heads % d == 0)


def test_dt_kernel_heads_per_cta_must_divide_heads():
    from mate_kernels.ssd import ssd_dt_kernel

    with pytest.raises(ValueError, match="heads_per_cta"):
        ssd_dt_kernel(heads=6, chunk_size=128, heads_per_cta=4)


@pytest.mark.parametrize(
    "kind, heads, batch, env, hpc",
    [
        pytest.param("ssd_lean", 128, 32, "8", 8, id="32x512-8"),
        pytest.param("ssd_lean", 128, 8, "8", 2, id="8x2048-2"),
        pytest.param("ssd_lean", 128, 1, "8", 1, id="1x8192-1"),
        pytest.param("ssd_lean", 128, 5, "8", 1, id="ragged5-1"),
        pytest.param("ssd_lean", 24, 64, "8", 2, id="H24-64seqs-2"),
        pytest.param("ssd_lean", 128, 32, "", 1, id="unset-1"),
        pytest.param("ssd_prepass", 128, 32, "8", 1, id="prepass-1"),
    ],
)
def test_heads_per_cta_leaves_three_waves(monkeypatch, kind, heads, batch, env, hpc):
    monkeypatch.setenv(tl_ssd.HPC_ENV, env)
    assert tl_ssd.heads_per_cta(tl_ssd.hpc_candidates(kind, heads), heads, 1, batch, 132) == hpc


def test_heads_per_cta_variants_are_prewarmed_and_launched(monkeypatch):
    from mate.prewarm_model import ModelSSM, plan_kernels

    lean_key, rkey, dkey = tl_ssd.kernel_keys(_call(), "lean")
    monkeypatch.delenv(tl_ssd.HPC_ENV, raising=False)
    default = tl_ssd.cache_key(lean_key, tl_ssd.builder_for(lean_key))
    assert [ck for ck, _ in tl_ssd.builds(lean_key)][0] == default  # then the same with the L2 prefetch
    monkeypatch.setenv(tl_ssd.HPC_ENV, "8")
    variants = tl_ssd.builds(lean_key)  # 4 heads in this call: 1, 2, 4 per CTA, each without / with the prefetch
    got = [((b.tiles or {}).get("heads_per_cta", 1), "prefetch" in b.tiles) for _, b in variants]
    assert got == [(1, False), (1, True), (2, False), (2, True), (4, False), (4, True)]
    assert len({ck for ck, _ in variants}) == 6 and tl_ssd.builds(rkey)[0][0] == rkey
    model = ModelSSM(model_type="mamba2", heads=8, dim=64, dstate=128, groups=2, chunk_size=128)
    _, _, items = plan_kernels(model, tp=1, state_dtype=torch.float32, io_dtype=torch.bfloat16, mtp_tokens=0)
    labels = [label for fam, label, *_ in items if fam == "ssd"]
    assert "ssd lean 8 heads per CTA" in labels and "ssd lean intermediate 2 heads per CTA" in labels
    # the launcher picks a variant from the call's batch and the device's SMs, and launches it
    launched = []
    monkeypatch.setattr(tl_ssd, "is_accelerator", lambda dev: True)
    monkeypatch.setattr(tl_ssd, "sm_count", lambda dev: 1)  # 2 sequences x 4 heads >= 3 waves of 1 SM at 2 per CTA
    monkeypatch.setattr(
        tl_ssd, "_get", lambda key, builder, dev: launched.append((key, builder(key))) or (lambda *a: None)
    )
    with tl_ssd.using("lean"):
        tl_ssd.ssd_combined_fwd_varlen(_call())
    fused = [b for key, b in launched if key[0] == "ssd_lean"]
    assert len(fused) == 1 and fused[0].tiles["heads_per_cta"] == 2


def test_fused_kernel_heads_per_cta_checks():
    from mate_kernels.ssd import ssd_fused_kernel

    base = dict(heads=8, groups=2, dim=64, dstate=128, chunk_size=128, block_P=64)
    lean = dict(lean=True, precomputed_dt=True, decay_rows=True)
    for bad in (dict(heads_per_cta=3, **lean), dict(heads_per_cta=2), dict(heads_per_cta=0, **lean)):
        with pytest.raises(ValueError, match="heads_per_cta"):
            ssd_fused_kernel(**{**base, **bad})


@pytest.mark.parametrize("pool", [False, True], ids=["returned-states", "pool-by-index"])
def test_runs_in_dt_option_keys_and_launches(monkeypatch, pool):
    kw = {}
    if pool:
        kw = dict(final_states_out=torch.zeros(6, 4, 64, 128), final_state_indices=torch.tensor([3, 1]))
    call = _call(**kw)
    monkeypatch.setenv(tl_ssd.RUNS_IN_DT_ENV, "0")
    fused, rkey, dkey = tl_ssd.kernel_keys(call, "lean")
    assert len(dkey) == tl_ssd.DT_DECAY_ROWS + 1  # off: the pre-pass of the sixth session and its key
    monkeypatch.delenv(tl_ssd.RUNS_IN_DT_ENV, raising=False)
    _, rkey2, merged = tl_ssd.kernel_keys(call, "lean")  # on by default
    assert rkey2 == rkey and merged == dkey + (rkey[2:],)
    assert len(tl_ssd.kernel_keys(call, "fused")) == 2  # no pre-pass: the runs kernel stays
    # prewarm: one merged pre-pass per runs kernel it stands in for, and no runs kernel
    kw = dict(heads=4, groups=2, dim=64, dstate=128, chunk_size=128, io_dtype=torch.bfloat16,
              state_dtype=torch.float32, dt_dtype=torch.float32, kind="lean")  # fmt: skip
    _, helpers = tl_ssd.prewarm_keys(**kw)
    monkeypatch.setenv(tl_ssd.RUNS_IN_DT_ENV, "0")
    _, separate = tl_ssd.prewarm_keys(**kw)
    assert [k[0] for k in helpers] == ["ssd_dt", "ssd_dt"] and [k[0] for k in separate[:2]] == ["ssd_runs"] * 2
    assert [k[-1] for k in helpers] == [r[2:] for r in separate[:2]]
    monkeypatch.delenv(tl_ssd.RUNS_IN_DT_ENV, raising=False)
    # the launcher: no runs kernel; the pre-pass gets the runs tables' inputs and outputs
    launched = []

    def fake_get(key, builder, dev):
        builder(key)  # (builds the build function: the key must unpack)
        return lambda *args: launched.append((key[0], len(args)))

    monkeypatch.setattr(tl_ssd, "_get", fake_get)
    with tl_ssd.using("lean"):
        tl_ssd.ssd_combined_fwd_varlen(call)
    assert [k for k, _ in launched] == ["ssd_dt", "ssd_lean"] and dict(launched)["ssd_dt"] == 11
    monkeypatch.setenv(tl_ssd.RUNS_IN_DT_ENV, "0")
    launched.clear()
    with tl_ssd.using("lean"):
        tl_ssd.ssd_combined_fwd_varlen(call)
    assert [k for k, _ in launched] == ["ssd_runs", "ssd_dt", "ssd_lean"] and dict(launched)["ssd_dt"] == 7


@pytest.mark.parametrize(
    "ctas, batch, tiles, env, spc",
    [
        pytest.param(128, 32, 4, "", 32, id="nemotron-32x512-whole-batch"),
        pytest.param(128, 8, 16, "", 8, id="nemotron-8x2048-whole-batch"),
        pytest.param(128, 5, 13, "", 5, id="nemotron-ragged5-whole-batch"),
        pytest.param(128, 1, 64, "", 1, id="one-sequence"),
        pytest.param(128, 32, 4, "8", 8, id="limit-8"),
        pytest.param(128, 32, 4, "12", 8, id="limit-12-largest-divisor-below"),
        pytest.param(128, 32, 4, "1", 1, id="limit-1-off"),
        pytest.param(80, 8, 16, "", 1, id="mamba2-8x2048-one-per-CTA"),
        pytest.param(80, 32, 4, "", 4, id="mamba2-32x512-4"),
        pytest.param(48, 8, 32, "", 1, id="falcon-h1-8x2048-one-per-CTA"),
        pytest.param(256, 4, 16, "", 4, id="two-waves-per-sequence"),
        pytest.param(128, 1000, 1, "", 1000, id="1000-one-tile-sequences"),
    ],
)
def test_seqs_per_cta_shortest_makespan(monkeypatch, ctas, batch, tiles, env, spc):
    monkeypatch.setenv(tl_ssd.SPC_ENV, env)
    assert tl_ssd.seqs_per_cta(batch, ctas, 132, tiles) == spc


def test_seqs_per_cta_prediction():
    """The makespan the choice minimises, in tiles on the busiest SM: Mamba2 8 x 2048 (80 CTAs per sequence)
    is 5 waves of one 16-tile sequence plus a start each (85) with one sequence per CTA, 3 waves of 2 with 2."""
    assert tl_ssd._shortest_makespan(8, 1, 80, 132, 16) == 1
    assert tl_ssd._shortest_makespan(8, 2, 80, 132, 16) == 1  # 5 * 17 = 85 < 3 * 33 = 99
    assert tl_ssd._shortest_makespan(8, 8, 128, 132, 16) == 8  # 1 * 129 < 2 * 65 < 4 * 33 < 8 * 17


def test_seqs_per_cta_bad_value_raises(monkeypatch):
    monkeypatch.setenv(tl_ssd.SPC_ENV, "-3")
    with pytest.raises(ValueError, match=tl_ssd.SPC_ENV):
        tl_ssd.seqs_per_cta(32, 128, 132)


@pytest.mark.parametrize("env, stride", [("1", 1), ("2", 2), ("8", 2), ("", 2)])
def test_seqs_per_cta_launches_a_bounds_view(monkeypatch, env, stride):
    """The fused kernel gets every k-th run bound (a view of the workspace's table, ending on bounds[batch]);
    the same kernel key for every k (nothing more to compile)."""
    monkeypatch.setenv(tl_ssd.SPC_ENV, env)
    monkeypatch.setattr(tl_ssd, "is_accelerator", lambda dev: True)
    monkeypatch.setattr(tl_ssd, "sm_count", lambda dev: 1)  # 2 sequences x 4 heads: k = 2 leaves 4 CTAs >= 3
    launched = []

    def fake_get(key, builder, dev):
        return lambda *args: launched.append((key, args))

    monkeypatch.setattr(tl_ssd, "_get", fake_get)
    with tl_ssd.using("lean"):
        tl_ssd.ssd_combined_fwd_varlen(_call())
    ((key, args),) = [(k, a) for k, a in launched if k[0] == "ssd_lean"]
    ((_, dt_args),) = [(k, a) for k, a in launched if k[0] == "ssd_dt"]
    bounds, full = args[7], dt_args[9]  # the fused kernel's view, the table the pre-pass writes
    assert bounds.stride(0) == stride and bounds.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
    assert bounds.shape[0] == 2 // stride + 1 and full.shape[0] == 3
    assert key == tl_ssd.kernel_keys(_call(), "lean")[0]


@pytest.mark.parametrize(
    "env, spc, want",
    [
        pytest.param("", 32, True, id="whole-batch-per-CTA"),
        pytest.param("", 8, True, id="8-per-CTA"),
        pytest.param("", 1, False, id="one-per-CTA"),
        pytest.param("1", 1, True, id="forced-on"),
        pytest.param("0", 8, False, id="forced-off"),
    ],
)
def test_prefetch_choice(monkeypatch, env, spc, want):
    monkeypatch.setenv(tl_ssd.PREFETCH_ENV, env)
    assert tl_ssd.wants_prefetch(spc) is want


def test_prefetch_bad_value_raises(monkeypatch):
    monkeypatch.setenv(tl_ssd.PREFETCH_ENV, "2")
    with pytest.raises(ValueError, match=tl_ssd.PREFETCH_ENV):
        tl_ssd.wants_prefetch(8)


@pytest.mark.parametrize("init, spc_env, want", [(True, "", True), (True, "1", False), (False, "", False)])
def test_launcher_builds_the_prefetch_kernel_where_it_opens_many_sequences(monkeypatch, init, spc_env, want):
    """2 short sequences, 2 per CTA: the lean kernel with the prefetch (not without initial states to prefetch,
    nor with one sequence per CTA)."""
    monkeypatch.delenv(tl_ssd.PREFETCH_ENV, raising=False)
    monkeypatch.setenv(tl_ssd.SPC_ENV, spc_env)
    monkeypatch.setattr(tl_ssd, "is_accelerator", lambda dev: True)
    monkeypatch.setattr(tl_ssd, "sm_count", lambda dev: 1)
    built = []
    monkeypatch.setattr(
        tl_ssd, "_get", lambda key, builder, dev: built.append((key, builder(key))) or (lambda *a: None)
    )
    kw = dict(initial_states=torch.zeros(2, 4, 64, 128)) if init else {}
    with tl_ssd.using("lean"):
        tl_ssd.ssd_combined_fwd_varlen(_call(**kw))
    (build,) = [b for key, b in built if key[0] == "ssd_lean"]
    assert build.tiles.get("prefetch", False) is want
