"""The SSD TileLang planner and launcher on the CPU: tile choice, what raises NotImplementedError, the specs a
call plans, the launch-time choices (sequences per CTA, prefetch), what the launcher hands the kernels."""

from __future__ import annotations

import math

import pytest
import torch
from mate.mamba._contract.ssd import normalize_ssd
from mate.mamba._platform.device import Hardware
from mate.mamba._tilelang import ssd as tl_ssd
from mate.mamba._tilelang import ssd_plan
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
    p = ssd_plan.tiles(P, N, L, io)
    assert (p.block_P, p.block_L, p.scores_in_shared) == (64, block_L, shared)
    from mate_kernels.ssd import fused_smem_bytes

    smem = fused_smem_bytes(dim_block=64, dstate=N, block_L=block_L, io_bytes=2, num_stages=2, scores_in_shared=shared)
    assert smem <= ssd_plan.SMEM_LIMIT


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
        ssd_plan.tiles(P, N, L, io)


@pytest.mark.parametrize(
    "P, N, L, block_P, block_L",
    [
        pytest.param(80, 64, 64, 80, 64, id="P80-c64"),  # 64-token tiles: the tail's GEMMs need 128 rows
        pytest.param(80, 64, 128, 80, 128, id="P80-N64"),  # and so does the tail's state GEMM (N rows)
        pytest.param(96, 128, 256, 96, 64, id="P96-N128"),  # 64 + 32 at 128-token tiles does not fit
        pytest.param(112, 128, 256, 112, 64, id="P112"),  # 64 + 48: no MN-major tail of 48
        pytest.param(48, 256, 256, 48, 64, id="P48-N256"),
    ],
)
def test_narrow_p_plan(P, N, L, block_P, block_L):
    from mate_kernels.ssd import fused_smem_bytes

    p = ssd_plan.tiles(P, N, L, torch.bfloat16)
    assert (p.block_P, p.block_L, p.narrow_p) == (block_P, block_L, True)
    smem = fused_smem_bytes(dim_block=block_P, dstate=N, block_L=block_L, io_bytes=2, num_stages=2,
                            scores_in_shared=p.scores_in_shared, narrow_p=True)  # fmt: skip
    assert smem <= ssd_plan.SMEM_LIMIT


@pytest.mark.parametrize(
    "P, N, L, block_P",
    [
        pytest.param(80, 128, 256, 80, id="P80-N128-c256"),  # Nemotron-3 Nano 4B
        pytest.param(80, 128, 128, 80, id="P80-N128-c128"),
        pytest.param(160, 128, 128, 80, id="P160-two-blocks"),
    ],
)
def test_tail_plan(P, N, L, block_P):
    """A head dim of 64 k + 16 runs the MN-major tiling with a tail part at 128-token tiles where they fit."""
    from mate_kernels.ssd import fused_smem_bytes, p_parts

    p = ssd_plan.tiles(P, N, L, torch.bfloat16)
    assert (p.block_P, p.block_L, p.narrow_p, p.scores_in_shared) == (block_P, 128, False, False)
    assert p_parts(block_P) == (64, 16)
    smem = fused_smem_bytes(dim_block=block_P, dstate=N, block_L=128, io_bytes=2, num_stages=2)
    assert smem <= ssd_plan.SMEM_LIMIT


@pytest.mark.parametrize("block_P", [pytest.param(b, id=f"P{b}") for b in (16, 48, 112, 72)])
def test_p_parts_refuses_a_block_without_a_tail_split(block_P):
    from mate_kernels.ssd import p_parts

    with pytest.raises(ValueError, match="block_P"):
        p_parts(block_P)


@pytest.mark.parametrize("P", [pytest.param(72, id="P72-not-16"), pytest.param(8, id="P8")])
def test_narrow_p_still_needs_16(P):
    with pytest.raises(NotImplementedError, match=f"dim={P}"):
        ssd_plan.tiles(P, 128, 128, torch.bfloat16)


def test_multiple_of_64_keeps_the_measured_tiling():
    p = ssd_plan.tiles(128, 128, 256, torch.bfloat16)
    assert p.block_P == 64 and not p.narrow_p


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


H200 = Hardware("cuda", 9, 132)


def specs(call, hw=H200):
    p = ssd_plan.plan(call, hw)
    return p.scan, p.dt


def test_specs_follow_the_call():
    base, dt = specs(_call(D=torch.zeros(4), dt_bias=torch.zeros(4), dt_softplus=True))
    assert (base.heads, base.groups, base.dim, base.dstate, base.chunk_size) == (4, 2, 64, 128, 128)
    assert (dt.last_dtype, dt.fsi_dtype, dt.use_final_indices) == ("int32", "int32", False)
    # z and initial states are runtime flags: the same compiled kernel (one sequence per CTA here: no prefetch)
    z = torch.zeros(305, 4, 64, dtype=torch.bfloat16)
    init = torch.zeros(2, 4, 64, 128, dtype=torch.bfloat16)  # the default state dtype is C's (bf16)
    same, _ = specs(
        _call(D=torch.zeros(4), dt_bias=torch.zeros(4), dt_softplus=True, z=z, initial_states=init,
              state_dtype=torch.bfloat16),
        Hardware("cuda", 9, 1000),
    )  # fmt: skip
    assert same == base
    # D per (head, dim), dt_limit, intermediate states, the pool's dtype are compile-time
    assert specs(_call(D=torch.zeros(4, 64), dt_bias=torch.zeros(4), dt_softplus=True))[0] != base
    # the dt options shape the pre-pass only: the scan reads the dt' it wrote
    lim, dlim = specs(_call(dt_limit=(0.01, 0.2)))
    assert (dlim.dt_min, dlim.dt_max) == (0.01, 0.2) and lim == specs(_call())[0]
    assert specs(_call(return_intermediate_states=True))[0].intermediate is True
    pool = torch.zeros(6, 4, 64, 128, dtype=torch.float16)
    k, d = specs(_call(final_states_out=pool, final_state_indices=torch.tensor([3, 1], dtype=torch.int64)))
    assert k.state_dtype == "float16" and (d.fsi_dtype, d.use_final_indices) == ("int64", True)
    assert math.isinf(dt.dt_max) and (dt.has_dt_bias, dt.dt_softplus) == (True, True)


def test_a_call_without_d_runs_the_scan_with_d():
    """(the scan without D releases x_s under an asynchronous wgmma: tests/test_ssd_generated_code.py)"""
    with_d, _ = specs(_call(D=torch.zeros(4)))
    without, _ = specs(_call())
    assert without == with_d and without.has_D


def test_dt_spec_mirrors_the_scan():
    scan, dt = specs(_call(dt_bias=torch.zeros(4), dt_softplus=True, dt_limit=(0.01, 0.2)))
    for field in ("heads", "chunk_size", "block_L", "cu_dtype", "seq_idx_dtype"):
        assert getattr(dt, field) == getattr(scan, field), field
    assert (dt.dt_dtype, dt.has_dt_bias, dt.dt_softplus, dt.dt_min, dt.dt_max) == ("float32", True, True, 0.01, 0.2)


@pytest.mark.parametrize(("heads", "hb"), [(128, 8), (24, 8), (12, 4), (6, 2), (3, 1)])
def test_dt_heads_per_cta(heads, hb):
    assert ssd_plan.dt_heads_per_cta(heads) == hb


@pytest.mark.parametrize(
    "ctas, batch, tiles, spc",
    [
        pytest.param(128, 32, 4, 32, id="nemotron-32x512-whole-batch"),
        pytest.param(128, 8, 16, 8, id="nemotron-8x2048-whole-batch"),
        pytest.param(128, 5, 13, 5, id="nemotron-ragged5-whole-batch"),
        pytest.param(128, 1, 64, 1, id="one-sequence"),
        pytest.param(80, 8, 16, 1, id="mamba2-8x2048-one-per-CTA"),
        pytest.param(80, 32, 4, 4, id="mamba2-32x512-4"),
        pytest.param(48, 8, 32, 1, id="falcon-h1-8x2048-one-per-CTA"),
        pytest.param(256, 4, 16, 4, id="two-waves-per-sequence"),
        pytest.param(128, 1000, 1, 1000, id="1000-one-tile-sequences"),
    ],
)
def test_seqs_per_cta_shortest_makespan(ctas, batch, tiles, spc):
    assert ssd_plan.seqs_per_cta(batch, ctas, 132, tiles) == spc


def test_seqs_per_cta_prediction():
    """The makespan the choice minimises, in tiles on the busiest SM: Mamba2 8 x 2048 (80 CTAs per sequence)
    is 5 waves of one 16-tile sequence plus a start each (85) with one sequence per CTA, 3 waves of 2 with 2."""
    assert ssd_plan._shortest_makespan(8, 80, 132, 16) == 1  # 5 * 17 = 85 < 3 * 33 = 99
    assert ssd_plan._shortest_makespan(8, 128, 132, 16) == 8  # 1 * 129 < 2 * 65 < 4 * 33 < 8 * 17


@pytest.mark.parametrize(
    "spc, init, want",
    [
        pytest.param(32, True, True, id="whole-batch-per-CTA"),
        pytest.param(8, True, True, id="8-per-CTA"),
        pytest.param(1, True, False, id="one-per-CTA"),
        pytest.param(8, False, False, id="nothing-to-prefetch"),
    ],
)
def test_prefetch_choice(spc, init, want):
    assert ssd_plan.wants_prefetch(spc, init) is want


def _launch(monkeypatch, call, sms):
    """Run the launcher on the CPU with fake kernels; returns [(spec, args)] in launch order."""
    monkeypatch.setattr(tl_ssd, "hardware", lambda dev: Hardware("cuda", 9, sms))
    launched = []
    monkeypatch.setattr(tl_ssd, "kernel", lambda spec, dev: lambda *args: launched.append((spec, args)))
    tl_ssd.run(call)
    return launched


@pytest.mark.parametrize("pool", [False, True], ids=["returned-states", "pool-by-index"])
def test_launcher_runs_the_pre_pass_then_the_scan(monkeypatch, pool):
    kw = {}
    if pool:
        kw = dict(final_states_out=torch.zeros(6, 4, 64, 128), final_state_indices=torch.tensor([3, 1]))
    call = _call(**kw)
    launched = _launch(monkeypatch, call, 132)
    assert [s.factory for s, _ in launched] == ["ssd_dt_kernel", "ssd_fused_kernel"]
    (dt, dt_args), (scan, scan_args) = launched
    assert len(dt_args) == 11 and len(scan_args) == 15
    assert (dt, scan) == (ssd_plan.plan(call, H200).dt, ssd_plan.plan(call, H200).scan)
    assert dt.use_final_indices is pool


@pytest.mark.parametrize("sms, stride", [pytest.param(132, 1, id="one-per-CTA"), pytest.param(1, 2, id="two")])
def test_seqs_per_cta_launches_a_bounds_view(monkeypatch, sms, stride):
    """The scan kernel gets every k-th run bound (a view of the table the pre-pass writes, ending on
    bounds[batch]); the same spec for every k (nothing more to compile)."""
    launched = _launch(monkeypatch, _call(), sms)
    (dt, dt_args), (scan, args) = launched
    bounds, full = args[5], dt_args[9]
    assert bounds.stride(0) == stride and bounds.untyped_storage().data_ptr() == full.untyped_storage().data_ptr()
    assert bounds.shape[0] == 2 // stride + 1 and full.shape[0] == 3
    assert scan == ssd_plan.plan(_call(), H200).scan


@pytest.mark.parametrize(("init", "sms", "want"), [(True, 1, True), (True, 132, False), (False, 1, False)])
def test_launcher_runs_the_prefetch_kernel_where_it_opens_many_sequences(monkeypatch, init, sms, want):
    """2 short sequences, 2 per CTA: the scan with the prefetch (not without initial states to prefetch, nor with
    one sequence per CTA)."""
    kw = dict(initial_states=torch.zeros(2, 4, 64, 128)) if init else {}
    (_, _), (scan, _) = _launch(monkeypatch, _call(**kw), sms)
    assert scan.prefetch is want


def test_serving_specs_cover_every_launch_form():
    kw = dict(heads=4, groups=2, dim=64, dstate=128, chunk_size=128, io_dtype=torch.bfloat16,
              state_dtype=torch.float32, dt_dtype=torch.float32)  # fmt: skip
    served = set(ssd_plan.serving_specs(**kw))
    # 4 heads may split on an H200: the two scans with and without the prefetch, both pre-passes, the split scan
    # per state output form, the state pass and the hand-over
    assert len(served) == 10
    meta = chunk_metadata([5, 300], 128)
    for hw in (Hardware("cuda", 9, 1), H200):
        for kwargs in ({}, {"return_intermediate_states": True}, {"initial_states": torch.zeros(2, 4, 64, 128)}):
            call = _call(D=torch.zeros(4), dt_bias=torch.zeros(4), dt_softplus=True, state_dtype=torch.float32,
                         **kwargs)  # fmt: skip
            assert call.last_chunk_indices.dtype == meta.last_chunk_indices.dtype
            for design in ssd_plan.DESIGNS:
                with ssd_plan.forcing(design):
                    assert set(ssd_plan.plan(call, hw).specs()) <= served
    # 128 heads never split on 132 SMs: no split kernels to compile
    many = dict(kw, heads=128, groups=8)
    assert len(ssd_plan.serving_specs(**many)) == 6
    assert len(ssd_plan.serving_specs(**many, sms=1024)) == 10


# (heads x P blocks per sequence, batch, chunks, tiles per chunk, mean tiles per sequence) -> runs on 132 SMs. The
# cells measured on the H200 (docs/benchmarks/ssd.md) name the faster design there.
@pytest.mark.parametrize(
    ("ctas", "batch", "nchunks", "tpc", "mean", "runs"),
    [
        pytest.param(16, 1, 64, 1, 64, 8, id="H16_1x8192_c128_split-measured-62-vs-259us"),
        pytest.param(16, 1, 256, 1, 256, 8, id="H16_1x32768_8-runs"),
        pytest.param(64, 1, 64, 1, 64, 2, id="H64_1x8192_split-measured-181-vs-245us"),
        pytest.param(32, 1, 64, 1, 64, 4, id="H32-N256_1x8192_split-measured-175-vs-447us"),
        pytest.param(48, 1, 32, 2, 64, 5, id="H24-P128-N256_1x8192_c256_split-measured-284-vs-439us"),
        pytest.param(48, 1, 32, 2, 64, 5, id="H48_1x8192_c256_split-measured-162-vs-247us"),
        pytest.param(80, 1, 32, 2, 64, 3, id="H80_1x8192_c256_split-measured-240-vs-248us"),
        pytest.param(96, 1, 32, 2, 64, 0, id="H96-P80_1x8192_c256_serial-measured-841-vs-1111us"),
        pytest.param(112, 1, 32, 2, 64, 0, id="H112-N64_1x8192_c256_serial-measured-208-vs-291us"),
        pytest.param(128, 1, 64, 1, 64, 0, id="H128_1x8192_serial-measured-249-vs-338us"),
        pytest.param(16, 5, 67, 1, 13, 8, id="H16_ragged5_split-measured-71-vs-135us"),
        pytest.param(64, 5, 67, 1, 13, 0, id="H64_ragged5_serial-measured-158-vs-206us"),
        pytest.param(32, 5, 67, 1, 13, 4, id="H32-N256_ragged5_split-measured-200-vs-226us"),
        pytest.param(128, 5, 67, 1, 13, 0, id="H128_ragged5_serial-measured-276-vs-376us"),
        pytest.param(128, 64, 64, 1, 1, 0, id="H128_64x64_serial"),
        pytest.param(16, 16, 128, 1, 8, 0, id="H16_16x1024_serial"),
        pytest.param(16, 1, 1, 1, 1, 0, id="one-chunk_serial"),
    ],
)
def test_split_rule(ctas, batch, nchunks, tpc, mean, runs):
    got = ssd_plan.split_runs(batch=batch, nchunks=nchunks, tiles_per_chunk=tpc, ctas_per_run=ctas, sms=132,
                              mean_tiles=mean)  # fmt: skip
    assert got == runs
    if runs:  # the pick beats the plain scan's prediction and its neighbours
        cost = ssd_plan.split_makespan(runs, nchunks, tpc, ctas, 132)
        assert cost < ssd_plan.serial_makespan(batch, ctas, 132, mean) * ssd_plan.RAGGED_MARGIN
        for other in (runs - 1, runs + 1):
            if other >= 2:
                assert cost <= ssd_plan.split_makespan(other, nchunks, tpc, ctas, 132)


def _long_call(H=16, G=1, tokens=8192, **kw):
    meta = chunk_metadata([tokens], 128)
    P, N = 64, 128
    return normalize_ssd(
        torch.zeros(tokens, H, P, dtype=torch.bfloat16), torch.zeros(tokens, H), torch.zeros(H),
        torch.zeros(tokens, G, N, dtype=torch.bfloat16), torch.zeros(tokens, G, N, dtype=torch.bfloat16), 128,
        meta.cu_seqlens, meta.cu_chunk_seqlens, meta.last_chunk_indices, meta.seq_idx, **kw,
    )  # fmt: skip


def test_plan_picks_the_split_design_from_the_shape():
    few = ssd_plan.plan(_long_call(), H200)
    assert (few.design, few.runs, few.scan.split, few.scan.prefetch) == ("split", 8, True, False)
    assert [s.factory for s in few.specs()] == ["ssd_dt_kernel", "ssd_run_states_kernel", "ssd_combine_kernel",
                                                "ssd_fused_kernel"]  # fmt: skip
    assert (few.states.block_L, few.states.block_P) == (few.scan.block_L, few.scan.block_P)
    many = ssd_plan.plan(_long_call(H=128, G=8), H200)
    assert (many.design, many.scan.split) == ("serial", False)


def test_forcing_a_design():
    call = _long_call()
    with ssd_plan.forcing("serial"):
        assert ssd_plan.plan(call, H200).design == "serial"
    with ssd_plan.forcing("split", runs=3):
        assert (ssd_plan.plan(call, H200).design, ssd_plan.plan(call, H200).runs) == ("split", 3)
    with ssd_plan.forcing("split"):
        assert ssd_plan.plan(_long_call(H=128, G=8), H200).runs >= 2
    with ssd_plan.forcing("split"), pytest.raises(NotImplementedError, match="fewer than 2 chunks"):
        ssd_plan.plan(_long_call(tokens=100), H200)
    assert ssd_plan.plan(call, H200).design == "split"  # the context is gone
    with pytest.raises(ValueError, match="design must be one of"):
        with ssd_plan.forcing("chunked"):
            pass
    with pytest.raises(ValueError, match="runs"):
        with ssd_plan.forcing("serial", runs=2):
            pass


@pytest.mark.parametrize("intermediate", [False, True], ids=["final-states", "intermediate-states"])
def test_launcher_runs_the_split_design(monkeypatch, intermediate):
    """The pre-pass, the state pass over even run bounds computed on the device, the hand-over, then the split
    scan over the same runs reading the run states the hand-over made true."""
    call = _long_call(return_intermediate_states=intermediate)
    launched = _launch(monkeypatch, call, 132)
    assert [s.factory for s, _ in launched] == ["ssd_dt_kernel", "ssd_run_states_kernel", "ssd_combine_kernel",
                                                "ssd_fused_kernel"]  # fmt: skip
    (_, dt_args), (_, pargs), (_, cargs), (scan, sargs) = launched
    assert scan.split and scan.intermediate is intermediate and len(sargs) == 16
    runs = sargs[5]
    assert runs.tolist() == [r * 64 // 8 for r in range(9)]  # 8 runs of 8 chunks
    assert pargs[3] is runs and pargs[5] is dt_args[5] and pargs[6] is dt_args[6]  # the pre-pass's rows, records
    run_states, run_dec = pargs[7], pargs[8]
    assert run_states.shape == (8, 16, 64, 128) and run_dec.shape == (8, 16)
    assert cargs[0].data_ptr() == run_states.data_ptr() and cargs[0].shape == (8, 16, 64 * 128)
    assert cargs[1] is run_dec and sargs[15] is run_states and pargs[-1] == sargs[14]


def _quantised(dtype, slots=6, strided=False):
    """A block-scaled pool [slots, 4, 64, 128] of ``dtype`` and its scales (every second slot of a twice-as-long
    allocation where ``strided``; 4 extra values per slot then break the 16-byte chunks)."""
    if strided:
        pool = torch.zeros(slots, 4 * 64 * 128 + 4, dtype=dtype)[:, 4:].view(slots, 4, 64, 128)
    else:
        pool = torch.zeros(slots, 4, 64, 128, dtype=dtype)
    return pool, torch.ones(slots, 4, 64)


@pytest.mark.parametrize("qdtype", [torch.int16, torch.int8, torch.float8_e4m3fn], ids=["int16", "int8", "fp8"])
def test_a_quantised_pool_plans_the_fp32_scan_between_its_conversions(qdtype):
    """Quantised initial states are decoded into fp32 rows before the pre-pass, a quantised final_states_out is
    written by the scan as fp32 rows per sequence (the pre-pass maps sequence b to row b) and encoded into the
    named slots after it; the scan is the fp32-state one."""
    init, init_scale = _quantised(qdtype, slots=2)
    pool, pool_scale = _quantised(qdtype)
    fsi = torch.tensor([3, 1], dtype=torch.int64)
    call = _call(initial_states=init, initial_states_scale=init_scale, final_states_out=pool,
                 final_state_indices=fsi, final_states_scale=pool_scale)  # fmt: skip
    p = ssd_plan.plan(call, H200)
    name = str(qdtype).removeprefix("torch.")
    assert (p.scan.state_dtype, p.scan.init_dtype) == ("float32", "float32")
    assert p.dt.use_final_indices is False
    assert (p.decode.qdtype, p.decode.direction, p.decode.vector_state) == (name, "decode", True)
    assert (p.encode.qdtype, p.encode.direction, p.encode.index_dtype) == (name, "encode", "int64")
    assert p.specs()[0] == p.decode and p.specs()[-1] == p.encode
    # only the quantised side converts; a float pool beside quantised initial states is written by the scan
    half = _call(initial_states=init, initial_states_scale=init_scale,
                 final_states_out=torch.zeros(6, 4, 64, 128), final_state_indices=fsi)  # fmt: skip
    hp = ssd_plan.plan(half, H200)
    assert hp.encode is None and hp.decode == p.decode and hp.dt.use_final_indices is True
    assert hp.scan.state_dtype == "float32" and hp.scan.init_dtype == "float32"


def test_a_strided_quantised_pool_takes_scalar_accesses():
    pool, scale = _quantised(torch.int8, strided=True)
    call = _call(final_states_out=pool, final_state_indices=torch.tensor([3, 1]), final_states_scale=scale)
    assert ssd_plan.plan(call, H200).encode.vector_state is False
    dense, dscale = _quantised(torch.int8)
    call = _call(final_states_out=dense, final_state_indices=torch.tensor([3, 1]), final_states_scale=dscale)
    assert ssd_plan.plan(call, H200).encode.vector_state is True


def test_launcher_decodes_then_scans_then_encodes(monkeypatch):
    init, init_scale = _quantised(torch.int16, slots=2)
    pool, pool_scale = _quantised(torch.int16)
    fsi = torch.tensor([3, 1])
    call = _call(initial_states=init, initial_states_scale=init_scale, final_states_out=pool,
                 final_state_indices=fsi, final_states_scale=pool_scale)  # fmt: skip
    launched = _launch(monkeypatch, call, 132)
    assert [s.factory for s, _ in launched] == ["state_codec_kernel", "ssd_dt_kernel", "ssd_fused_kernel",
                                                "state_codec_kernel"]  # fmt: skip
    (dec, dargs), (_, dt_args), (_, sargs), (enc, eargs) = launched
    assert dargs[0] is init and dargs[1] is init_scale
    fp32_init = dargs[2]
    assert fp32_init.dtype == torch.float32 and fp32_init.shape == (2, 4, 64, 128)
    assert sargs[9] is fp32_init  # the scan's init
    fp32_final = sargs[11]
    assert fp32_final.dtype == torch.float32 and fp32_final.shape == (2, 4, 64, 128)
    assert eargs[0] is fp32_final and eargs[2] is pool and eargs[3] is pool_scale
    assert eargs[1].tolist() == [3, 1] and dt_args[8] is dt_args[7]  # the pre-pass maps sequence b to row b


def test_serving_specs_of_a_quantised_pool():
    kw = dict(heads=128, groups=8, dim=64, dstate=128, chunk_size=128, io_dtype=torch.bfloat16,
              state_dtype=torch.int8, dt_dtype=torch.float32)  # fmt: skip
    served = ssd_plan.serving_specs(**kw)
    codecs = [s for s in served if s.factory == "state_codec_kernel"]
    assert sorted(s.direction for s in codecs) == ["decode", "encode"]
    assert {s.state_dtype for s in served if s.factory == "ssd_fused_kernel"} == {"float32"}
    init, init_scale = _quantised(torch.int8, slots=1)
    pool, pool_scale = _quantised(torch.int8)
    meta = chunk_metadata([300], 128)
    T = 300
    call = normalize_ssd(
        torch.zeros(T, 128, 64, dtype=torch.bfloat16), torch.zeros(T, 128), torch.zeros(128),
        torch.zeros(T, 8, 128, dtype=torch.bfloat16), torch.zeros(T, 8, 128, dtype=torch.bfloat16), 128,
        meta.cu_seqlens, meta.cu_chunk_seqlens, meta.last_chunk_indices, meta.seq_idx, D=torch.zeros(128),
        dt_bias=torch.zeros(128), dt_softplus=True,
        initial_states=torch.zeros(1, 128, 64, 128, dtype=torch.int8), initial_states_scale=torch.ones(1, 128, 64),
        final_states_out=torch.zeros(6, 128, 64, 128, dtype=torch.int8),
        final_state_indices=torch.tensor([2], dtype=torch.int32), final_states_scale=torch.ones(6, 128, 64),
    )  # fmt: skip
    assert set(ssd_plan.plan(call, H200).specs()) <= set(served)
