"""mate-kernels on its own: the package imports without TileLang, the tiling and shared-memory planners obey
the rules the kernels rely on, and (where TileLang is installed) every factory returns a ``T.prim_func`` with
the argument list its launcher passes. Compiling for sm_90a is the runtime's compile check (`nox -s compile`)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from mate_kernels import ssd, ssu

HAS_TILELANG = importlib.util.find_spec("tilelang") is not None


def test_import_does_not_need_tilelang():
    code = "import sys, mate_kernels.ssu, mate_kernels.ssd; print('tilelang' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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
    nbytes = {"float32": 4, "bfloat16": 2, "float16": 2}[state_dtype]
    assert t.vec * nbytes <= 16 and dstate % t.vec == 0
    assert t.lanes * t.vecs * t.vec == dstate, "the lanes of a row hold the whole row"
    assert 32 % t.lanes == 0 and t.lanes <= 32, "a row's lanes stay inside one warp (shuffle reduction)"
    assert t.threads % 32 == 0 and t.threads <= 128
    assert t.block_p == t.rows_per_pass * t.rows_per_thread
    if dim >= t.rows_per_pass:
        assert dim % t.rows_per_pass == 0 or t.rows_per_pass == 1


def test_ssu_tiling_rejects_unknown_state_dtype():
    with pytest.raises(ValueError, match="state_dtype"):
        ssu.choose_tiling(64, 128, "int16")


@pytest.mark.parametrize("block_L", [64, 128])
@pytest.mark.parametrize("dstate", [64, 128, 256])
def test_ssd_shared_memory_plan_grows_with_the_tile(block_L, dstate):
    small = ssd.fused_smem_bytes(dim_block=64, dstate=dstate, block_L=block_L, io_bytes=2, num_stages=1)
    two = ssd.fused_smem_bytes(dim_block=64, dstate=dstate, block_L=block_L, io_bytes=2, num_stages=2)
    assert two > small > block_L * (64 + 2 * dstate) * 2


@pytest.mark.skipif(not HAS_TILELANG, reason="TileLang is not installed")
@pytest.mark.parametrize("one_token", [True, False], ids=["one-token", "packed"])
def test_ssu_factory_returns_a_prim_func_with_the_documented_arguments(one_token):
    f = ssu.ssu_kernel(dim=64, dstate=128, heads_per_group=16, state_dtype="bfloat16", io_dtype="bfloat16",
                       one_token=one_token)  # fmt: skip
    names = [p.name.removesuffix("_handle") for p in f.params]
    head = ["state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "out", "src", "dst"]
    assert names[: len(head)] == head
    assert ("cache_steps" in names) == (not one_token)


def test_ssd_prepass_plan_trades_the_scan_buffers_for_per_stage_records():
    kw = dict(dim_block=64, dstate=128, block_L=128, io_bytes=2, num_stages=2)
    plain, pre = ssd.fused_smem_bytes(**kw), ssd.fused_smem_bytes(**kw, precomputed_dt=True)
    # per stage: + cumsum (block_L fp32) + the 128-byte tile record; fixed: - two scan buffers of 256 fp32
    assert pre - plain == 2 * (128 * 4 + ssd.META_WIDTH * 4) - 2 * 256 * 4
    assert ssd.META_WIDTH * 4 == 128  # a TMA destination per stage stays 128-byte aligned


@pytest.mark.skipif(not HAS_TILELANG, reason="TileLang is not installed")
@pytest.mark.parametrize(
    "precomputed_dt, lean", [(False, False), (True, False), (True, True)], ids=["fused", "prepass", "lean"]
)
def test_ssd_fused_factory_takes_the_prepass_buffers_before_flags(precomputed_dt, lean):
    f = ssd.ssd_fused_kernel(
        heads=8, groups=2, dim=64, dstate=128, chunk_size=128, precomputed_dt=precomputed_dt, lean=lean
    )
    names = [p.name.removesuffix("_handle") for p in f.params]
    assert names[-3:] == ["dtA", "tmeta", "flags"]


@pytest.mark.skipif(not HAS_TILELANG, reason="TileLang is not installed")
def test_ssd_dt_kernel_arguments_and_tile_check():
    f = ssd.ssd_dt_kernel(heads=8, chunk_size=256, block_L=128)
    names = [p.name.removesuffix("_handle") for p in f.params]
    assert names == ["dt", "A", "dt_bias", "cu_chunk_seqlens", "seq_idx", "dtA", "tmeta"]
    with pytest.raises(ValueError, match="block_L"):
        ssd.ssd_dt_kernel(heads=8, chunk_size=64, block_L=128)
