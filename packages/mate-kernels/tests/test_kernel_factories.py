"""mate-kernels on its own: the package imports without TileLang, the tiling and shared-memory planners obey
the rules the kernels rely on, the factories check their arguments before any toolchain is needed, and (where
TileLang is installed) every factory returns a ``T.prim_func`` with the argument list its launcher passes.
Compiling for sm_90a, and pinning each compile-grid kernel's generated CUDA, is the runtime's compile check
(`nox -s compile`)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from mate_kernels import formats, ssd, ssu, state_codec


def _names(f):
    return [p.name.removesuffix("_handle") for p in f.params]


def test_import_does_not_need_tilelang():
    code = (
        "import sys, mate_kernels.formats, mate_kernels.ssu, mate_kernels.ssd, mate_kernels.state_codec; "
        "print('tilelang' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# The factories' parameters are the fields of the runtime's kernel specs (one spec field per parameter): a
# parameter added or removed here is a change of that contract.
FACTORY_PARAMETERS = {
    ssu.ssu_kernel: (
        "dim dstate heads_per_group state_dtype io_dtype dt_dtype d_dtype dt_bias_dtype src_dtype dst_dtype "
        "meta_dtype ibuf_dtype tied one_token vector_state vector_io tiling pack_early min_blocks pdl philox_rounds "
        "staged"
    ),
    state_codec.state_codec_kernel: "dim dstate qdtype direction index_dtype vector_state per_thread",
    ssd.ssd_fused_kernel: (
        "heads groups dim dstate chunk_size io_dtype state_dtype init_dtype D_dtype cu_dtype seq_idx_dtype has_D "
        "D_per_dim intermediate block_P block_L num_stages scores_in_shared narrow_p prefetch split"
    ),
    ssd.ssd_run_states_kernel: ("heads groups dim dstate chunk_size io_dtype init_dtype block_P block_L num_stages"),
    ssd.ssd_combine_kernel: "heads dim dstate",
    ssd.ssd_dt_kernel: (
        "heads chunk_size block_L dt_dtype dt_bias_dtype cu_dtype seq_idx_dtype has_dt_bias dt_softplus dt_min "
        "dt_max heads_per_cta last_dtype fsi_dtype use_final_indices"
    ),
    ssd.fused_smem_bytes: "dim_block dstate block_L io_bytes num_stages scores_in_shared narrow_p",
    ssd.states_smem_bytes: "dim_block dstate block_L io_bytes num_stages",
}


@pytest.mark.parametrize("factory", list(FACTORY_PARAMETERS), ids=lambda f: f.__name__)
def test_factory_parameters_are_the_spec_fields_and_keyword_only(factory):
    params = inspect.signature(factory).parameters
    assert list(params) == FACTORY_PARAMETERS[factory].split()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())


@pytest.mark.parametrize(
    "dim,dstate,state_dtype",
    [
        pytest.param(64, 128, "bfloat16", id="P64-N128-bf16"),
        pytest.param(64, 128, "float32", id="P64-N128-fp32"),
        pytest.param(80, 128, "float16", id="P80-N128-fp16"),
        pytest.param(128, 256, "bfloat16", id="P128-N256-bf16"),
        pytest.param(96, 64, "float32", id="P96-N64-fp32"),
        pytest.param(64, 96, "bfloat16", id="P64-N96-bf16"),
        pytest.param(8, 16, "float32", id="P8-N16-fp32"),
    ],
)
def test_ssu_tiling_covers_the_state_row_with_16_byte_chunks(dim, dstate, state_dtype):
    t = ssu.choose_tiling(dim, dstate, state_dtype)
    nbytes = formats.BYTES[state_dtype]
    assert t.vec * nbytes <= 16 and dstate % t.vec == 0
    assert t.lanes * t.vecs * t.vec == dstate, "the lanes of a row hold the whole row"
    assert 32 % t.lanes == 0 and t.lanes <= 32, "a row's lanes stay inside one warp (shuffle reduction)"
    assert t.threads % 32 == 0 and t.threads <= 128
    assert t.block_p == t.rows_per_pass * t.rows_per_thread
    if dim >= t.rows_per_pass:
        assert dim % t.rows_per_pass == 0 or t.rows_per_pass == 1


def test_ssu_tiling_rejects_unknown_state_dtype_and_chunk_counts():
    with pytest.raises(ValueError, match="state_dtype"):
        ssu.choose_tiling(64, 128, "uint16")
    with pytest.raises(ValueError, match="per_thread"):
        ssu.choose_tiling(64, 128, "bfloat16", per_thread=3)


# The registry pinned to literals, written independently of it: every other reader (the kernels, the runtime's
# dtype tables and planners, the reference, the benchmarks, the tests) takes its values from the registry.
# (name, label, bytes, tuning key, qmax, integer, rounding)
FORMAT_ROWS = [
    ("float32", "fp32", 4, "fp32", None, False, ("nearest-even",)),
    ("bfloat16", "bf16", 2, "2-byte", None, False, ("nearest-even",)),
    ("float16", "fp16", 2, "2-byte", None, False, ("nearest-even", "stochastic")),
    ("int16", "int16", 2, "int16", 32767.0, True, ("nearest-even",)),
    ("int8", "int8", 1, "int8", 127.0, True, ("nearest-even", "stochastic")),
    ("float8_e4m3fn", "fp8", 1, "fp8", 448.0, False, ("nearest-even", "stochastic")),
]


def test_state_format_registry_rows():
    rows = [(f.name, f.label, f.bytes, f.tuning_key, f.qmax, f.integer, f.rounding) for f in formats.FORMATS.values()]
    assert rows == FORMAT_ROWS
    assert all(type(f.qmax) is float for f in formats.FORMATS.values() if f.block_scaled)  # the kernels' literals
    assert formats.QMAX == {"int16": 32767.0, "int8": 127.0, "float8_e4m3fn": 448.0}
    assert formats.BYTES == {name: nbytes for name, _, nbytes, *_ in FORMAT_ROWS}
    assert {f.name: f.sr_tuning_key for f in formats.FORMATS.values() if f.sr_tuning_key} == {"float16": "fp16-sr"}
    # the stochastic rounding grid of a block-scaled float format: e4m3's 3 mantissa bits, subnormal step 2^-9
    assert {f.name: (f.mantissa, f.min_exp) for f in formats.FORMATS.values() if f.mantissa} == {
        "float8_e4m3fn": (3, -9)
    }


@pytest.mark.parametrize(
    ("dtype", "vec", "lanes"),
    [pytest.param("int16", 8, 16, id="int16"), pytest.param("int8", 16, 8, id="int8"),
     pytest.param("float8_e4m3fn", 16, 8, id="fp8")],
)  # fmt: skip
def test_ssu_tiling_of_block_scaled_states(dtype, vec, lanes):
    """A quantised state is tiled by its width like a float one (16-byte chunks)."""
    t = ssu.choose_tiling(64, 128, dtype, 2)
    assert (t.vec, t.lanes, t.vecs * t.rows_per_thread) == (vec, lanes, 2)


@pytest.mark.parametrize("per_thread", [1, 2, 4, 8])
def test_ssu_tiling_per_thread_sets_the_state_chunks_a_thread_holds(per_thread):
    t = ssu.choose_tiling(64, 128, "bfloat16", per_thread)  # 8 values per chunk, 16 lanes, one chunk per lane
    assert (t.vecs, t.lanes) == (1, 16)
    assert t.rows_per_thread * t.vecs == per_thread


@pytest.mark.parametrize("block_L", [64, 128])
@pytest.mark.parametrize("dstate", [64, 128, 256])
def test_ssd_shared_memory_plan_grows_with_the_tile(block_L, dstate):
    small = ssd.fused_smem_bytes(dim_block=64, dstate=dstate, block_L=block_L, io_bytes=2, num_stages=1)
    two = ssd.fused_smem_bytes(dim_block=64, dstate=dstate, block_L=block_L, io_bytes=2, num_stages=2)
    assert two > small > block_L * (64 + 2 * dstate) * 2


def test_ssd_shared_memory_plan_counts_each_buffer():
    kw = dict(dim_block=64, dstate=128, block_L=128, io_bytes=2)
    one, two = ssd.fused_smem_bytes(**kw, num_stages=1), ssd.fused_smem_bytes(**kw, num_stages=2)
    # per stage: the x, B, C tiles, the pre-pass's four fp32 rows and its 128-byte tile record
    assert two - one == 128 * (64 + 2 * 128) * 2 + ssd.DT_ROWS * 128 * 4 + ssd.META_WIDTH * 4
    # once: the state (as a GEMM operand) and the output tile
    assert 2 * one - two == (128 + 128) * 64 * 2
    # scores in shared memory: one bf16 [block_L, block_L] tile per stage
    assert ssd.fused_smem_bytes(**kw, num_stages=2, scores_in_shared=True) - two == 2 * 128 * 128 * 2
    # narrow P: the transposed x tile, once
    assert ssd.fused_smem_bytes(**kw, num_stages=2, narrow_p=True) - two == 128 * 64 * 2
    assert ssd.META_WIDTH * 4 == 128  # a TMA destination per stage stays 128-byte aligned


SSD_SHAPE = dict(heads=8, groups=2, dim=64, dstate=128, chunk_size=128)


@pytest.mark.parametrize(
    "bad, match",
    [
        pytest.param(dict(heads=6, groups=4), "groups", id="heads-groups"),
        pytest.param(dict(block_P=48), "divide dim", id="block_P-divides-dim"),
        pytest.param(dict(block_L=96), "block_L", id="block_L-divides-chunk"),
        pytest.param(dict(dim=40, block_P=40, narrow_p=True), "multiple of 16", id="block_P-16"),
        pytest.param(dict(dim=112, block_P=112), "tail of 0, 16 or 32", id="mn-major-needs-a-split"),
        pytest.param(dict(dim=80, block_P=80, chunk_size=64, block_L=64), "block_L 128", id="tail-needs-block_L-128"),
        pytest.param(dict(dim=80, block_P=80, dstate=64), "dstate 128 or 256", id="tail-needs-dstate-128"),
    ],
)
def test_ssd_fused_kernel_checks_its_tile_before_importing_tilelang(bad, match):
    with pytest.raises(ValueError, match=match):
        ssd.ssd_fused_kernel(**{**SSD_SHAPE, **bad})


@pytest.mark.parametrize(
    "kw, match",
    [
        pytest.param(dict(heads=8, chunk_size=64, block_L=128), "block_L", id="block_L-divides-chunk"),
        pytest.param(dict(heads=6, chunk_size=128, heads_per_cta=4), "heads_per_cta", id="heads-divide"),
        pytest.param(dict(heads=8, chunk_size=128, heads_per_cta=0), "heads_per_cta", id="heads-positive"),
    ],
)
def test_ssd_dt_kernel_checks_before_importing_tilelang(kw, match):
    with pytest.raises(ValueError, match=match):
        ssd.ssd_dt_kernel(**kw)


@pytest.mark.parametrize(
    "bad, match",
    [
        pytest.param(dict(heads=6, groups=4), "groups", id="heads-groups"),
        pytest.param(dict(block_P=48), "divide dim", id="block_P-divides-dim"),
        pytest.param(dict(block_L=96), "block_L", id="block_L-divides-chunk"),
    ],
)
def test_ssd_state_pass_checks_its_tile_before_importing_tilelang(bad, match):
    shape = {k: SSD_SHAPE[k] for k in ("heads", "groups", "dim", "dstate", "chunk_size")}
    with pytest.raises(ValueError, match=match):
        ssd.ssd_run_states_kernel(**{**shape, **bad})


def test_ssd_hand_over_needs_whole_blocks_of_the_state():
    with pytest.raises(ValueError, match="multiple of 1024"):
        ssd.ssd_combine_kernel(heads=4, dim=16, dstate=32)


@pytest.mark.tilelang
def test_ssd_split_kernels_read_what_the_split_scan_and_state_pass_exchange():
    """The split scan takes the run states after the plain scan's arguments; the state pass writes them and the
    run decays, with the pre-pass's rows and records as the scan reads them."""
    scan = ssd.ssd_fused_kernel(**SSD_SHAPE, block_P=64, block_L=64, split=True)
    assert _names(scan)[-2:] == ["flags", "run_states"]
    states = ssd.ssd_run_states_kernel(
        **{k: SSD_SHAPE[k] for k in ("heads", "groups", "dim", "dstate", "chunk_size")}, block_P=64, block_L=64
    )
    assert _names(states) == [
        "x", "B", "cu_chunk_seqlens", "bounds", "initial_states", "dtA", "tmeta", "run_states", "run_dec", "flags",
    ]  # fmt: skip
    bufs = {b.name: [str(d) for d in b.shape[1:]] for b in states.buffer_map.values()}
    scan_bufs = {b.name: [str(d) for d in b.shape[1:]] for b in scan.buffer_map.values()}
    assert bufs["run_states"] == scan_bufs["run_states"] and bufs["dtA"] == scan_bufs["dtA"]


@pytest.mark.tilelang
@pytest.mark.parametrize("one_token", [True, False], ids=["one-token", "packed"])
def test_ssu_factory_returns_a_prim_func_with_the_documented_arguments(one_token):
    f = ssu.ssu_kernel(dim=64, dstate=128, heads_per_group=16, state_dtype="bfloat16", io_dtype="bfloat16",
                       one_token=one_token)  # fmt: skip
    head = ["state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "out", "src", "dst"]
    packed = ["cu", "acc_tok", "ibuf", "iidx", "parent"]
    scalars = ["nseq", "seqlen", "src_sb", "src_st", "dst_sb", "dst_st", "pad", "flags", "mode"]
    assert _names(f) == (head + scalars if one_token else head + packed + scalars + ["cache_steps"])


@pytest.mark.tilelang
@pytest.mark.parametrize("narrow_p", [False, True], ids=["P64", "narrow-P80"])
def test_ssd_fused_factory_arguments_and_the_prepass_layout_it_reads(narrow_p):
    P = 80 if narrow_p else 64
    f = ssd.ssd_fused_kernel(**{**SSD_SHAPE, "dim": P}, block_P=P, block_L=64, narrow_p=narrow_p)
    assert _names(f) == [
        "x", "B", "C", "cu_chunk_seqlens", "seq_idx", "bounds", "dest", "D", "z", "initial_states", "out",
        "states_out", "dtA", "tmeta", "flags",
    ]  # fmt: skip
    dt = ssd.ssd_dt_kernel(heads=8, chunk_size=128, block_L=64)
    scan_bufs = {b.name: [str(d) for d in b.shape[1:]] for b in f.buffer_map.values()}
    dt_bufs = {b.name: [str(d) for d in b.shape[1:]] for b in dt.buffer_map.values()}
    # the scan reads what the pre-pass writes: [tiles, H, DT_ROWS, block_L] rows, [tiles, META_WIDTH] records
    assert scan_bufs["dtA"] == dt_bufs["dtA"] == ["8", str(ssd.DT_ROWS), "64"]
    assert scan_bufs["tmeta"] == dt_bufs["tmeta"] == [str(ssd.META_WIDTH)]


@pytest.mark.tilelang
@pytest.mark.parametrize("heads_per_cta", [1, 8])
def test_ssd_dt_kernel_arguments_include_the_runs_table(heads_per_cta):
    f = ssd.ssd_dt_kernel(heads=8, chunk_size=256, block_L=128, heads_per_cta=heads_per_cta)
    assert _names(f) == [
        "dt", "A", "dt_bias", "cu_chunk_seqlens", "seq_idx", "dtA", "tmeta", "last_chunk_indices",
        "final_state_indices", "bounds", "dest",
    ]  # fmt: skip
