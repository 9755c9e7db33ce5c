"""TileLang SSD varlen prefill (``backend="tilelang"``) against the PyTorch reference (``backend="torch"``).

Both backends see the same device tensors (the reference is pure PyTorch, fp32 inside). Compared: ``out`` and
the returned (or pool-written) states, relative to the reference's largest magnitude, with tolerances of the
kernels' bf16/fp16 tensor-core operands (scores, the state fed to ``C·state``, ``x`` weighted by the decay).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace

import pytest
import torch

pytestmark = pytest.mark.gpu  # skipped without a device or TileLang (tests/conftest.py)

from mate.mamba import ssd_combined_fwd_varlen  # noqa: E402
from mate.mamba._tilelang import ssd as tl_ssd  # noqa: E402
from mate.mamba.chunking import chunk_metadata  # noqa: E402
from mate.mamba.planning import plan_ssd_combined_fwd_varlen  # noqa: E402

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


OUT_TOL = {BF16: 3e-2, F16: 1e-2}
STATE_TOL = {BF16: 3e-2, F16: 1e-2}


@dataclass(frozen=True)
class Case:
    seqlens: tuple = (1, 50, 128, 300)
    history: tuple | None = None
    chunk: int = 128
    H: int = 8
    G: int = 2
    P: int = 64
    N: int = 128
    io: torch.dtype = BF16
    state: torch.dtype = F32
    init: bool = True
    D: str = "head"  # "" | head | full
    z: bool = False
    dt_bias: bool = True
    softplus: bool = True
    dt_limit: tuple = (0.0, math.inf)
    intermediate: bool = False
    pool: str = ""  # "" | dense | paged: final_states_out + final_state_indices
    rows_view: bool = False  # x/B/C as row views of one packed buffer
    dt_dtype: torch.dtype = F32
    out_pad: int = 0  # out as a row view of a wider buffer (8: TMA-compatible rows; 3: not, staged)
    seq_idx: tuple | None = None  # override (seq_idx authority)
    last: tuple | None = None
    checkpoints: tuple | None = None  # vLLM's align-mode prefill checkpoints (a chunk end inside a query)
    extra: dict = field(default_factory=dict)


def build(case: Case, seed: int = 0, dev="cuda"):
    dev = torch.device(dev)
    meta = chunk_metadata(case.seqlens, case.chunk, case.history, device=dev, checkpoints=case.checkpoints)
    seq_idx, last = meta.seq_idx, meta.last_chunk_indices
    if case.seq_idx is not None:
        seq_idx = torch.tensor(case.seq_idx, dtype=torch.int32, device=dev)
    if case.last is not None:
        last = torch.tensor(case.last, dtype=torch.int32, device=dev)
    T, H, P, N, G = int(meta.cu_seqlens[-1]), case.H, case.P, case.N, case.G
    batch = len(case.seqlens)
    g = torch.Generator().manual_seed(seed)
    if case.rows_view:
        width = H * P + 2 * G * N + 8  # padded row: a strided view, as from a split projection
        buf = torch.randn(T, width, generator=g)
        buf[:, H * P :] *= 0.5
        buf = buf.to(case.io).to(dev)
        x = buf[:, : H * P].view(T, H, P)
        B = buf[:, H * P : H * P + G * N].view(T, G, N)
        C = buf[:, H * P + G * N : H * P + 2 * G * N].view(T, G, N)
    else:
        x = torch.randn(T, H, P, generator=g).to(case.io).to(dev)
        B = (torch.randn(T, G, N, generator=g) * 0.5).to(case.io).to(dev)
        C = (torch.randn(T, G, N, generator=g) * 0.5).to(case.io).to(dev)
    if case.softplus:
        dt = torch.randn(T, H, generator=g) - 2.0
    else:
        dt = torch.rand(T, H, generator=g) * 0.2 + 0.01
    dt = dt.to(case.dt_dtype).to(dev)
    A = (-(torch.rand(H, generator=g) + 0.3)).to(dev)
    D = None
    if case.D == "head":
        D = torch.randn(H, generator=g).to(dev)
    elif case.D == "full":
        D = torch.randn(H, P, generator=g).to(dev)
    z = torch.randn(T, H, P, generator=g).to(case.io).to(dev) if case.z else None
    dt_bias = (torch.randn(H, generator=g) * 0.5).to(dev) if case.dt_bias else None
    init = (torch.randn(batch, H, P, N, generator=g) * 0.5).to(case.state).to(dev) if case.init else None
    kw = dict(
        x=x, dt=dt, A=A, B=B, C=C, chunk_size=case.chunk, cu_seqlens=meta.cu_seqlens,
        cu_chunk_seqlens=meta.cu_chunk_seqlens, last_chunk_indices=last, seq_idx=seq_idx, D=D, z=z,
        dt_bias=dt_bias, dt_softplus=case.softplus, dt_limit=case.dt_limit, initial_states=init,
        return_intermediate_states=case.intermediate, state_dtype=case.state,
    )  # fmt: skip
    return kw


def fresh_pool(case: Case, batch: int, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    slots = batch + 5
    shape = (case.H, case.P, case.N)
    if case.pool == "paged":
        page = math.prod(shape) + 256
        storage = torch.randn(slots * page + 64, generator=g).to(case.state).cuda()
        pool = storage[64:].view(slots, page)[:, : math.prod(shape)].view(slots, *shape)
    else:
        pool = torch.randn(slots, *shape, generator=g).to(case.state).cuda()
    idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32).cuda()
    return pool, idx


def run(case: Case, backend: str, seed: int = 0):
    kw = build(case, seed)
    out = torch.full_like(kw["x"], float("nan"), memory_format=torch.contiguous_format)
    if case.out_pad:
        T, H, P = out.shape
        wide = torch.full((T, H * P + case.out_pad), float("nan"), dtype=out.dtype, device=out.device)
        out = wide[:, : H * P].view(T, H, P)
    batch = kw["cu_seqlens"].shape[0] - 1
    if case.pool:
        pool, idx = fresh_pool(case, batch)
        r = ssd_combined_fwd_varlen(**kw, out=out, final_states_out=pool, final_state_indices=idx, backend=backend)
        assert r is None
        return out, pool
    states = ssd_combined_fwd_varlen(**kw, out=out, backend=backend)
    return out, states


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all(), "non-finite values"
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()


CASES = [
    pytest.param(Case(), id="ragged-1-50-128-300_c128_P64N128G2_bf16_f32state_init_Dh"),
    pytest.param(Case(init=False), id="no-init"),
    pytest.param(Case(chunk=64, N=64, G=1, H=4), id="c64_N64_G1"),
    pytest.param(Case(chunk=256, seqlens=(1, 255, 256, 257, 700)), id="c256_lens-1-255-256-257-700"),
    pytest.param(Case(chunk=256, H=4, G=1, P=128, N=256, seqlens=(3, 300, 513)), id="c256_P128_N256_G1_falcon"),
    pytest.param(Case(P=128, io=F16, D="full", z=True, seqlens=(77, 129, 2)), id="P128_fp16_Dfull_z"),
    pytest.param(Case(H=16, G=8, seqlens=(300, 10, 129, 1), history=(0, 37, 200, 5)), id="G8_continuing_short_first"),
    # 8 heads per group (as at the benchmark shapes), chunk 256 = 2 tiles of 128 tokens
    pytest.param(Case(H=16, G=2, chunk=256, z=True, seqlens=(1, 300, 700, 129)), id="rep8_c256_z"),
    pytest.param(Case(state=BF16, seqlens=(200, 33)), id="bf16-state_bf16-init"),
    pytest.param(Case(softplus=False, dt_bias=False, dt_limit=(0.02, 0.15), D=""), id="dt-limit_no-softplus_no-D"),
    pytest.param(Case(intermediate=True, history=(0, 100, 0, 64)), id="intermediate-states"),
    # vLLM 0.33's --mamba-cache-mode align: a short chunk ends each checkpoint inside a query, every chunk's state
    # returned (mate.mamba.chunking builds vLLM's layout: tests/test_vllm_engine.py compares the two)
    pytest.param(
        Case(chunk=256, intermediate=True, seqlens=(700, 500, 129), history=(0, 400, 0), checkpoints=(300, 100, 0)),
        id="vllm-align-checkpoints_c256",
    ),
    pytest.param(
        Case(chunk=128, intermediate=True, H=16, G=1, seqlens=(1000, 64), history=(512, 0), checkpoints=(5, 63)),
        id="vllm-align-checkpoints_c128_tiny-chunks",
    ),
    pytest.param(Case(chunk=256, intermediate=True, state=BF16, z=True), id="intermediate_c256_bf16-state_z"),
    pytest.param(Case(pool="dense"), id="final-states-out_dense-pool"),
    pytest.param(Case(pool="paged", seqlens=(5, 400)), id="final-states-out_paged-pool"),
    pytest.param(Case(rows_view=True, z=True), id="xBC-row-views"),
    pytest.param(Case(dt_dtype=BF16, io=F16, G=1, H=4), id="bf16-dt_fp16-io_G1"),
    pytest.param(Case(seqlens=(200, 200), seq_idx=(0, 0, 1, 1), intermediate=True), id="seq_idx-authority"),
    pytest.param(
        Case(seqlens=(200, 200), seq_idx=(0, 1, 1, 0), last=(3, 2), intermediate=False), id="seq_idx-more-runs"
    ),
    pytest.param(Case(out_pad=8, seqlens=(300, 5)), id="out-row-view_tma-compatible"),
    pytest.param(Case(out_pad=3, seqlens=(300, 5)), id="out-row-view_unaligned-staged"),
    # tens of tiles per sequence
    pytest.param(Case(H=16, G=2, seqlens=(4000, 1, 1500, 700)), id="long-chains_c128"),
    pytest.param(Case(H=8, G=1, chunk=256, seqlens=(6000,), z=True), id="one-long-sequence_c256_z"),
]


@pytest.mark.parametrize("case", CASES)
def test_kernels_match_reference(case: Case):
    out_k, st_k = run(case, "tilelang")
    out_r, st_r = run(case, "torch")
    torch.cuda.synchronize()
    e_out = rel_err(out_k, out_r)
    e_st = rel_err(st_k, st_r)
    tol = OUT_TOL[case.io]
    stol = STATE_TOL[case.io] + (1e-2 if case.state == BF16 else 0)
    assert e_out < tol, f"out rel err {e_out:.3e}"
    assert e_st < stol, f"state rel err {e_st:.3e}"
    if case.pool:
        # slots the call does not name keep their values bit for bit
        batch = len(case.seqlens)
        pool0, idx = fresh_pool(case, batch)
        untouched = torch.ones(pool0.shape[0], dtype=torch.bool, device="cuda")
        untouched[idx.long()] = False
        assert torch.equal(st_k[untouched], pool0[untouched])


def test_fp32_io_raises():
    kw = build(Case(io=F32))
    with pytest.raises(NotImplementedError, match="float32"):
        ssd_combined_fwd_varlen(**kw, backend="tilelang")


def test_dim_not_a_multiple_of_16_raises():
    kw = build(Case(P=72))
    with pytest.raises(NotImplementedError, match="dim=72"):
        ssd_combined_fwd_varlen(**kw, backend="tilelang")


# Head dims that are not a multiple of 64. At 128-token tiles the MN-major tiling with a tail part (80 = 64 + 16:
# seven GEMMs per tile); where the tile is 64 tokens (chunk 64) or the block has no tail split, the K-major one
# (``narrow_p``).
HEAD_DIM_CASES = [
    pytest.param(Case(P=80, H=4, chunk=256, seqlens=(1, 255, 300, 513)), id="P80_c256_N128_tail"),
    pytest.param(Case(P=80, D="full", z=True, seqlens=(77, 129, 2)), id="P80_tail_Dfull_z"),
    pytest.param(Case(P=80, N=64, D="full", z=True, seqlens=(77, 129, 2)), id="P80_N64_narrow_Dfull_z"),
    pytest.param(Case(P=80, intermediate=True, state=BF16, history=(0, 100, 0, 64)), id="P80_intermediate_bf16"),
    pytest.param(Case(P=80, pool="paged", io=F16, seqlens=(5, 400)), id="P80_paged-pool_fp16"),
    pytest.param(Case(P=80, H=8, G=8, chunk=256, seqlens=(3000,), history=(17,)), id="P80_G8_long_continuing"),
    pytest.param(Case(P=160, H=2, G=1, seqlens=(300, 40)), id="P160_two-80-wide-blocks"),
    pytest.param(Case(P=80, chunk=64, z=True, seqlens=(1, 64, 65, 300)), id="P80_c64_narrow"),
    pytest.param(Case(P=112, H=2, G=1, chunk=256, seqlens=(3, 600)), id="P112_narrow"),
]


@pytest.mark.parametrize("case", HEAD_DIM_CASES)
def test_head_dims_off_64_match_reference(case: Case):
    test_kernels_match_reference(case)


# The dt pre-pass at the head counts that give it 8, 4 and 1 heads per CTA (the largest power of two up to 8
# dividing the heads).
DT_HEADS_CASES = [
    pytest.param(Case(), id="H8_ragged_c128"),
    pytest.param(Case(H=24, G=1, chunk=256, seqlens=(1, 255, 256, 257, 700), z=True), id="H24_c256"),
    pytest.param(Case(H=4, G=2, softplus=False, dt_bias=False, dt_limit=(0.02, 0.15)), id="H4_dt-limit"),
    pytest.param(Case(H=3, G=1, seqlens=(5, 300)), id="H3_one-head-per-CTA"),
    pytest.param(Case(H=8, rows_view=True, dt_dtype=BF16, history=(0, 100, 0, 64)), id="row-views_bf16-dt"),
]


@pytest.mark.parametrize("case", DT_HEADS_CASES)
def test_dt_heads_per_cta_matches_reference(case: Case):
    from mate.mamba._tilelang.cache import CACHE

    test_kernels_match_reference(case)
    dt_spec, scan = plan_ssd_combined_fwd_varlen(**build(case), backend="tilelang")[:2]
    assert dt_spec.heads_per_cta == max(d for d in (1, 2, 4, 8) if case.H % d == 0)
    assert dt_spec in CACHE.kernels and scan in CACHE.kernels


# The runs table the dt pre-pass computes: its scan runs over block_L threads (64 at N 256), in several rounds when
# there are more chunks than threads; a seq_idx that re-opens a sequence; final states into a pool by index.
RUNS_CASES = [
    pytest.param(Case(chunk=64, N=64, G=1, H=4, seqlens=(4000, 5000, 1)), id="c64_143-chunks_over-64-threads"),
    pytest.param(Case(chunk=256, H=4, G=1, P=128, N=256, seqlens=(3, 300, 513)), id="N256_64-thread-scan"),
    pytest.param(Case(seqlens=(200, 200), seq_idx=(0, 1, 1, 0), last=(3, 2)), id="seq_idx-more-runs"),
    pytest.param(Case(pool="paged", seqlens=(5, 400)), id="paged-pool"),
    pytest.param(Case(intermediate=True, state=BF16, history=(0, 100, 0, 64)), id="intermediate_bf16_history"),
]


@pytest.mark.parametrize("case", RUNS_CASES)
def test_runs_table_matches_reference(case: Case):
    test_kernels_match_reference(case)


# Several sequences per scan CTA (the kernel reads every k-th run bound) and the L2 prefetch of the next entering
# state that comes with it: the planner predicts the makespan for the SM count, so on a device reported as having
# one SM these small calls take k = the batch (and the prefetching kernel where there are initial states). The
# shapes are those of CASES, the batches new: 1-token sequences, a sequence continuing with a short first chunk,
# more runs than sequences, no initial states, pools, intermediate states.
SPC_CASES = [
    pytest.param(Case(), id="4-per-CTA_ragged"),
    pytest.param(Case(init=False), id="4-per-CTA_no-init"),
    pytest.param(Case(chunk=256, seqlens=(1, 255, 256, 257, 700, 3, 129, 64)), id="8-per-CTA_c256"),
    pytest.param(Case(intermediate=True, history=(0, 100, 0, 64)), id="intermediate-states"),
    pytest.param(Case(pool="paged", seqlens=(5, 400)), id="paged-pool"),
    pytest.param(Case(seqlens=(200, 200), seq_idx=(0, 1, 1, 0), last=(3, 2)), id="seq_idx-more-runs"),
    pytest.param(Case(H=16, G=8, seqlens=(300, 10, 129, 1), history=(0, 37, 200, 5)), id="G8_continuing"),
    pytest.param(Case(chunk=256, H=4, G=1, P=128, N=256, seqlens=(3, 300, 513, 1)), id="P128_N256"),
    pytest.param(Case(P=128, io=F16, D="full", z=True, seqlens=(77, 129, 2, 5)), id="P128_fp16_Dfull_z"),
]


def _one_sm(monkeypatch) -> list:
    """Plan as for a device with one SM and record each launch's plan."""
    from mate.mamba._platform.device import Hardware
    from mate.mamba._tilelang import ssd_plan

    monkeypatch.setattr(tl_ssd, "hardware", lambda dev: Hardware("cuda", 9, 1))
    plans, plan = [], ssd_plan.plan
    monkeypatch.setattr(tl_ssd, "plan", lambda call, hw: plans.append(plan(call, hw)) or plans[-1])
    return plans


@pytest.mark.parametrize("case", SPC_CASES)
def test_seqs_per_cta_matches_reference(case: Case, monkeypatch):
    plans = _one_sm(monkeypatch)
    test_kernels_match_reference(case)
    assert plans and {p.seqs_per_cta for p in plans} == {len(case.seqlens)}  # one CTA walks the whole batch
    assert {p.scan.prefetch for p in plans} == {case.init}


def test_seqs_per_cta_graph_replay_equals_eager(monkeypatch):
    plans = _one_sm(monkeypatch)
    monkeypatch.setattr(sys.modules[__name__], "GRAPH_CASE", Case(seqlens=(1, 100, 300, 64), z=True))
    test_graph_replay_equals_eager()
    assert plans and {(p.seqs_per_cta, p.scan.prefetch) for p in plans} == {(4, True)}


@pytest.mark.parametrize("chunk", [8, 32, 512])
def test_chunk_sizes_outside_the_kernels_raise(chunk):
    """The reference serves every power of two from 8; the kernels 64, 128 and 256."""
    kw = build(Case(chunk=chunk, seqlens=(5, 600)))
    with pytest.raises(NotImplementedError, match="chunk_size"):
        ssd_combined_fwd_varlen(**kw, backend="tilelang")
    assert ssd_combined_fwd_varlen(**kw, backend="torch").shape[0] == 2


def test_two_byte_a_matches_the_fp32_call():
    """A bf16 ``A`` (the engines' prefill accepts one) is cast to fp32: the kernels give the fp32 call's result."""
    kw = build(Case())
    out_a, out_b = torch.empty_like(kw["x"]), torch.empty_like(kw["x"])
    s_a = ssd_combined_fwd_varlen(**{**kw, "A": kw["A"].to(BF16)}, out=out_a, backend="tilelang")
    s_b = ssd_combined_fwd_varlen(**{**kw, "A": kw["A"].to(BF16).float()}, out=out_b, backend="tilelang")
    torch.cuda.synchronize()
    assert torch.equal(out_a, out_b) and torch.equal(s_a, s_b)


GRAPH_CASE = Case(seqlens=(1, 100, 300), z=True)


def test_graph_replay_equals_eager():
    case = GRAPH_CASE
    kw = build(case)
    out = torch.empty_like(kw["x"])
    eager_states = ssd_combined_fwd_varlen(**kw, out=out, backend="tilelang").clone()
    eager_out = out.clone()
    out.zero_()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ssd_combined_fwd_varlen(**kw, out=out, backend="tilelang")  # warm on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        states = ssd_combined_fwd_varlen(**kw, out=out, backend="tilelang")
    out.zero_()
    states.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager_out)
    assert torch.equal(states, eager_states)
    # new inputs copied into the captured buffers give the new result
    kw2 = build(case, seed=3)
    kw["x"].copy_(kw2["x"])
    kw["initial_states"].copy_(kw2["initial_states"])
    graph.replay()
    out2 = torch.empty_like(out)
    ref_states = ssd_combined_fwd_varlen(**{**kw}, out=out2, backend="tilelang")
    torch.cuda.synchronize()
    assert torch.equal(out, out2)
    assert torch.equal(states, ref_states)


@pytest.mark.usefixtures("unchecked_inputs")
def test_steady_state_allocates_only_the_returned_states():
    case = Case(seqlens=(17, 300, 129), z=True)
    kw = build(case)
    out = torch.empty_like(kw["x"])
    ssd_combined_fwd_varlen(**kw, out=out, backend="tilelang")  # compile + workspace
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    states = ssd_combined_fwd_varlen(**kw, out=out, backend="tilelang")
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()["allocation.all.allocated"]
    assert after - before == 1, f"{after - before} allocations (expected 1: the returned states)"
    assert states.shape == (3, case.H, case.P, case.N)
    # the pool-writing form allocates nothing at all
    pool, idx = fresh_pool(replace(case, pool="dense"), 3)
    ssd_combined_fwd_varlen(**kw, out=out, final_states_out=pool, final_state_indices=idx, backend="tilelang")
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    ssd_combined_fwd_varlen(**kw, out=out, final_states_out=pool, final_state_indices=idx, backend="tilelang")
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


# The split design (mate_kernels.ssd_split): even runs of chunks cut through the sequences; the state pass and the
# hand-over give each run its true entering state, then the scan walks every run at once. Forced here
# with a run count that puts the cuts at awkward places: inside a sequence, on a sequence boundary, runs holding
# several sequences, runs past the last chunk (empty), short last chunks, every state output form.
SPLIT_CASES = [
    pytest.param(Case(seqlens=(6000,), H=4, G=1), 5, id="one-sequence_5-runs"),
    pytest.param(Case(), 4, id="ragged_4-runs"),
    pytest.param(Case(init=False, seqlens=(2000, 30, 700)), 6, id="no-init_6-runs"),
    pytest.param(Case(chunk=256, z=True, seqlens=(1, 300, 700, 129)), 4, id="c256_z_4-runs"),
    pytest.param(Case(intermediate=True, history=(0, 100, 0, 64)), 3, id="intermediate_3-runs"),
    pytest.param(
        Case(chunk=256, intermediate=True, state=BF16, z=True, seqlens=(900, 40)),
        3,
        id="intermediate_c256_bf16-state_z",
    ),  # fmt: skip
    pytest.param(Case(pool="paged", seqlens=(5, 400)), 3, id="paged-pool_3-runs"),
    pytest.param(Case(pool="dense", seqlens=(1000, 3, 260)), 5, id="dense-pool_5-runs"),
    pytest.param(Case(state=BF16, seqlens=(700, 33)), 4, id="bf16-state_4-runs"),
    pytest.param(Case(P=128, io=F16, D="full", z=True, seqlens=(77, 1290, 2)), 6, id="P128_fp16_Dfull_z"),
    pytest.param(Case(chunk=256, H=4, G=1, P=128, N=256, seqlens=(3, 3000, 513)), 5, id="P128_N256_falcon"),
    pytest.param(Case(P=80, H=4, chunk=256, seqlens=(1, 255, 3000, 513)), 5, id="P80_c256_tail"),
    pytest.param(
        Case(softplus=False, dt_bias=False, dt_limit=(0.02, 0.15), D="", seqlens=(900,)), 4, id="dt-limit_no-D"
    ),  # fmt: skip
    pytest.param(Case(seqlens=(200,)), 5, id="more-runs-than-chunks"),
    pytest.param(Case(H=16, G=8, seqlens=(3000, 10, 129, 1), history=(0, 37, 200, 5)), 7, id="G8_continuing"),
    pytest.param(Case(chunk=64, N=64, G=1, H=4, seqlens=(4000, 1)), 9, id="c64_N64"),
]


@pytest.mark.parametrize(("case", "runs"), SPLIT_CASES)
def test_split_design_matches_reference(case: Case, runs: int):
    from mate.mamba._tilelang import ssd_plan

    with ssd_plan.forcing("split", runs=runs):
        kw = build(case)
        planned = plan_ssd_combined_fwd_varlen(**kw, out=torch.empty_like(kw["x"]))
        assert [s.factory for s in planned] == ["ssd_dt_kernel", "ssd_run_states_kernel", "ssd_combine_kernel",
                                                "ssd_fused_kernel"]  # fmt: skip
        test_kernels_match_reference(case)


def test_split_design_graph_replay_equals_eager(monkeypatch):
    from mate.mamba._tilelang import ssd_plan

    monkeypatch.setattr(sys.modules[__name__], "GRAPH_CASE", Case(seqlens=(1, 1000, 300, 64), z=True))
    with ssd_plan.forcing("split", runs=6):
        test_graph_replay_equals_eager()


def test_planner_splits_a_long_sequence_at_few_heads():
    """On the device's own SM count: 16 heads x 8192 tokens split, 128 heads do not."""
    few = build(Case(H=16, G=1, seqlens=(8192,)))
    many = build(Case(H=128, G=8, seqlens=(8192,)))
    assert plan_ssd_combined_fwd_varlen(**few, out=torch.empty_like(few["x"]))[1].factory == "ssd_run_states_kernel"
    assert plan_ssd_combined_fwd_varlen(**many, out=torch.empty_like(many["x"]))[1].factory == "ssd_fused_kernel"
