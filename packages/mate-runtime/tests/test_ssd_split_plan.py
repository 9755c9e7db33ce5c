"""The split SSD variant on the CPU: its plan and kernel keys, the variant switch, and a PyTorch emulation of
the three split kernels' index math (tiles aligned to chunk starts, empty tail tiles, the runs kernel's bounds
and dest, the opening rule, chunk-end reporting) against the reference backend.

The emulation mirrors ``mate_kernels.ssd.ssd_chunk_kernel`` / ``ssd_state_pass_kernel`` /
``ssd_chunk_out_kernel`` step for step in fp32 (the kernels' bf16 operands are left out), so a wrong tile
offset, mask, decay or hand-over in the design shows up here; the TileLang code itself is checked against the
reference only on a GPU (``tests/gpu/test_ssd_kernels.py``, parametrised over both variants).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from mate._tilelang import ssd as tl_ssd
from mate.mamba import ssd_combined_fwd_varlen
from mate.mamba._ssd_call import normalize_ssd
from mate.mamba.chunking import chunk_metadata

pytest.importorskip("mate_kernels.ssd")

NAMES = ["x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices", "seq_idx"]


def _kwargs(seqlens, chunk, *, history=None, H=4, G=2, P=8, N=16, z=True, init=True, seq_idx=None, last=None,
            seed=0, **kw):  # fmt: skip
    meta = chunk_metadata(seqlens, chunk, history)
    T = int(meta.cu_seqlens[-1])
    g = torch.Generator().manual_seed(seed)
    args = dict(
        x=torch.randn(T, H, P, generator=g), dt=torch.randn(T, H, generator=g) - 2.0,
        A=-(torch.rand(H, generator=g) + 0.3), B=torch.randn(T, G, N, generator=g) * 0.5,
        C=torch.randn(T, G, N, generator=g) * 0.5, chunk_size=chunk, cu_seqlens=meta.cu_seqlens,
        cu_chunk_seqlens=meta.cu_chunk_seqlens,
        last_chunk_indices=meta.last_chunk_indices if last is None else torch.tensor(last, dtype=torch.int32),
        seq_idx=meta.seq_idx if seq_idx is None else torch.tensor(seq_idx, dtype=torch.int32),
        D=torch.randn(H, generator=g), z=torch.randn(T, H, P, generator=g) if z else None,
        dt_bias=torch.randn(H, generator=g) * 0.5, dt_softplus=True,
        initial_states=torch.randn(len(seqlens), H, P, N, generator=g) * 0.5 if init else None,
        state_dtype=torch.float32,
    )  # fmt: skip
    args.update(kw)
    return args


def _call(args):
    args = dict(args)
    return normalize_ssd(*[args.pop(n) for n in NAMES], **args)


def runs_tables(seq_idx: list[int], last: list[int], batch: int, fsi: list[int] | None):
    """What ssd_runs_kernel writes: bounds [batch + 1] (first chunk of each run, padded with nchunks; surplus
    runs stay with the last CTA) and dest [nchunks] (state row of each chunk's end state, or -1)."""
    nc = len(seq_idx)
    opens = [c for c in range(nc) if c == 0 or seq_idx[c] != seq_idx[c - 1]]
    bounds = [opens[r] if r < len(opens) else nc for r in range(batch)] + [nc]
    dest = [-1] * nc
    for b, lc in enumerate(last):
        if 0 <= lc < nc:
            dest[lc] = fsi[b] if fsi is not None else b
    return bounds, dest


# PyTorch stand-ins of the split kernels, with the kernels' argument lists (the launcher test below runs the real
# launcher with them; ``emulate_split`` calls them directly on fp32 tensors).


def fake_runs(use_fsi: bool):
    def run(seq_idx, last, fsi, bounds, dest):
        b, d = runs_tables(seq_idx.tolist(), last.tolist(), bounds.shape[0] - 1, fsi.tolist() if use_fsi else None)
        bounds.copy_(torch.tensor(b, dtype=torch.int32))
        dest.copy_(torch.tensor(d, dtype=torch.int32))

    return run


def fake_chunk(*, BL, S, rep, softplus=True, lo=0.0, hi=math.inf, has_dtb=True, has_D=True, D_per_dim=False):
    def run(x, dt, A, B, C, cu, dt_bias, D, out, dA_ws, local_ws):
        cu = cu.tolist()
        pad = lambda t: torch.cat([t.float(), torch.zeros(S * BL, *t.shape[1:])])  # noqa: E731 (TMA zero fill)
        x, B, C, dt = pad(x), pad(B), pad(C), pad(dt)
        Dv = (D.float() if D_per_dim else D.float()[:, None]) if has_D else torch.zeros(1)
        rows = torch.arange(BL)
        causal = rows[:, None] >= rows[None, :]
        for t in range(dA_ws.shape[0]):
            c, sub = divmod(t, S)
            s0 = cu[c] + sub * BL
            valid = rows < cu[c + 1] - s0
            xt = x[s0 : s0 + BL]  # [BL, H, P]: rows past the chunk's end are read, then masked through dt' = 0
            Bt = B[s0 : s0 + BL].repeat_interleave(rep, dim=1)
            Ct = C[s0 : s0 + BL].repeat_interleave(rep, dim=1)
            v = dt[s0 : s0 + BL] + (dt_bias.float() if has_dtb else 0.0)
            if softplus:
                v = torch.where(v > 20.0, v, torch.log1p(torch.exp(v)))
            v = torch.where(valid[:, None], v.clamp(min=lo, max=hi), 0.0)  # dt' [BL, H]
            dA = torch.cumsum(v * A.float(), dim=0)
            dA_ws[t] = dA.T
            decay = torch.exp(torch.where(causal, dA.T[:, :, None] - dA.T[:, None, :], -math.inf))
            scores = torch.einsum("mhn,khn->hmk", Ct, Bt) * decay * v.T[:, None, :]
            y = torch.einsum("hmk,khp->mhp", scores, xt) + Dv * xt
            out[s0 + rows[valid]] = y[valid].to(out.dtype)
            w = torch.exp(dA[-1] - dA) * v
            local_ws[t] = torch.einsum("khn,khp,kh->hpn", Bt, xt, w).to(local_ws.dtype)

    return run


def fake_pass(*, BL, S, intermediate):
    def run(dA_ws, local_ws, seq_idx, bounds, dest, init, ent_ws, states_out, flags):
        seq, bounds, dest = seq_idx.tolist(), bounds.tolist(), dest.tolist()
        for b in range(len(bounds) - 1):
            s = torch.zeros(local_ws.shape[1:])
            for t in range(bounds[b] * S, bounds[b + 1] * S):
                c, sub = divmod(t, S)
                if sub == 0 and (c == 0 or seq[c] != seq[c - 1]):
                    s = init[seq[c]].float() if flags & 2 else torch.zeros_like(s)
                ent_ws[t] = s.to(ent_ws.dtype)
                s = torch.exp(dA_ws[t, :, BL - 1])[:, None] * s + local_ws[t].float()
                if sub == S - 1 and (intermediate or dest[c] >= 0):
                    states_out[c if intermediate else dest[c]] = s.to(states_out.dtype)

    return run


def fake_out(*, BL, S, rep):
    def run(C, cu, dA_ws, ent_ws, z, out, flags):
        cu = cu.tolist()
        rows = torch.arange(BL)
        for t in range(dA_ws.shape[0]):
            c, sub = divmod(t, S)
            s0 = cu[c] + sub * BL
            idx = s0 + rows[rows < cu[c + 1] - s0]
            Ct = C[idx].float().repeat_interleave(rep, dim=1)
            inter = torch.einsum("mhn,hpn->mhp", Ct, ent_ws[t].float())
            y = out[idx].float() + torch.exp(dA_ws[t, :, : idx.numel()].T)[..., None] * inter
            if flags & 1:
                y = y * F.silu(z[idx].float())
            out[idx] = y.to(out.dtype)

    return run


def emulate_split(call, block_L: int):
    """(out, states) as the split kernels compute them, fp32, tile by tile (the fakes on the call's tensors)."""
    H, P, N, L = call.heads, call.dim, call.dstate, call.chunk_size
    nc, batch, rep = call.nchunks, call.batch, call.heads // call.groups
    BL, S = block_L, L // block_L
    ntiles = nc * S
    use_fsi = call.final_state_indices is not None
    bounds, dest = torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(nc, dtype=torch.int32)
    fake_runs(use_fsi)(call.seq_idx, call.last_chunk_indices, call.final_state_indices if use_fsi else None,
                       bounds, dest)  # fmt: skip
    out = torch.zeros(call.tokens, H, P)
    dA_ws, local_ws, ent_ws = torch.zeros(ntiles, H, BL), torch.zeros(ntiles, H, P, N), torch.zeros(ntiles, H, P, N)
    D = call.D[:, 0] if call.D is not None else None
    chunk = fake_chunk(BL=BL, S=S, rep=rep, has_D=D is not None)
    chunk(call.x, call.dt, call.A, call.B, call.C, call.cu_chunk_seqlens, call.dt_bias, D, out, dA_ws, local_ws)
    if call.return_intermediate_states:
        so = torch.zeros(nc, H, P, N)
    elif use_fsi:
        so = call.final_states_out.float().clone()
    else:
        so = torch.zeros(batch, H, P, N)
    init = call.initial_states if call.initial_states is not None else torch.zeros(1, H, P, N)
    flags = 2 if call.initial_states is not None else 0
    fake_pass(BL=BL, S=S, intermediate=call.return_intermediate_states)(
        dA_ws, local_ws.flatten(2), call.seq_idx, bounds, dest, init.flatten(2), ent_ws.view(ntiles, H, P * N),
        so.view(so.shape[0], H, P * N), flags,
    )  # fmt: skip
    z = call.z if call.z is not None else torch.zeros(1, H, P)
    fake_out(BL=BL, S=S, rep=rep)(call.C, call.cu_chunk_seqlens, dA_ws, ent_ws, z, out, int(call.z is not None))
    return out, so


CASES = [
    pytest.param(dict(seqlens=(1, 50, 128, 300), chunk=128), 128, id="ragged_c128_tile128"),
    pytest.param(dict(seqlens=(1, 255, 256, 257, 700), chunk=256), 128, id="c256_two-tiles-per-chunk"),
    pytest.param(dict(seqlens=(3, 300, 513), chunk=256, N=32), 64, id="c256_tile64_four-per-chunk"),
    pytest.param(dict(seqlens=(300, 10, 129, 1), history=(0, 37, 200, 5), chunk=128), 64, id="continuing_short"),
    pytest.param(dict(seqlens=(200, 33), chunk=256, return_intermediate_states=True), 128, id="intermediate"),
    pytest.param(dict(seqlens=(200, 200), chunk=128, seq_idx=(0, 0, 1, 1), init=False), 64, id="seq_idx_no-init"),
    pytest.param(dict(seqlens=(200, 200), chunk=128, seq_idx=(0, 1, 1, 0), last=(3, 2)), 128, id="seq_idx_more-runs"),
]


@pytest.mark.parametrize("spec, block_L", CASES)
def test_split_emulation_matches_reference(spec, block_L):
    spec = dict(spec)
    args = _kwargs(spec.pop("seqlens"), spec.pop("chunk"), **spec)
    out_e, st_e = emulate_split(_call(args), block_L)
    ref_out = torch.full_like(args["x"], float("nan"))
    st_r = ssd_combined_fwd_varlen(**args, out=ref_out, backend="torch")
    torch.testing.assert_close(out_e, ref_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(st_e, st_r, rtol=1e-4, atol=1e-4)


def test_split_emulation_pool_rows():
    args = _kwargs((5, 400, 90), 128)
    pool = torch.randn(8, 4, 8, 16)
    idx = torch.tensor([6, 0, 3], dtype=torch.int32)
    ref_pool = pool.clone()
    ssd_combined_fwd_varlen(**args, out=torch.empty_like(args["x"]), final_states_out=ref_pool,
                            final_state_indices=idx, backend="torch")  # fmt: skip
    _, st_e = emulate_split(_call({**args, "final_states_out": pool, "final_state_indices": idx}), 64)
    torch.testing.assert_close(st_e, ref_pool, rtol=1e-4, atol=1e-4)  # untouched rows keep their values


@pytest.mark.parametrize(
    "H, G, P, N, L, block_L, hb",
    [
        pytest.param(128, 8, 64, 128, 128, 128, 8, id="nemotron-c128"),
        pytest.param(128, 8, 64, 128, 256, 128, 8, id="nemotron-c256"),
        pytest.param(80, 1, 64, 128, 256, 128, 8, id="mamba2-2.7b"),
        pytest.param(24, 1, 128, 256, 256, 64, 8, id="falcon-h1"),
        pytest.param(12, 4, 64, 64, 64, 64, 1, id="c64_rep3"),
        pytest.param(8, 2, 64, 128, 128, 128, 4, id="rep4"),
    ],
)
def test_split_plan(H, G, P, N, L, block_L, hb):
    from mate_kernels.ssd import split_chunk_smem_bytes, split_out_smem_bytes

    sp = tl_ssd.split_plan(H, G, P, N, L, torch.bfloat16)
    assert (sp["block_L"], sp["heads_per_cta"], sp["local_dtype"]) == (block_L, hb, "float32")
    assert (H // G) % sp["heads_per_cta"] == 0 and L % sp["block_L"] == 0
    assert (P * N) % sp["block_E"] == 0
    for f in (split_chunk_smem_bytes, split_out_smem_bytes):
        assert f(dim_block=64, dstate=N, block_L=block_L, io_bytes=2, num_stages=2) <= tl_ssd.SMEM_LIMIT


def test_split_plan_raises_where_the_fused_plan_does():
    with pytest.raises(NotImplementedError, match="dim=80"):
        tl_ssd.split_plan(8, 2, 80, 128, 128, torch.bfloat16)
    with pytest.raises(NotImplementedError, match="float32"):
        tl_ssd.split_plan(8, 2, 64, 128, 128, torch.float32)


def test_split_tuning_knobs(monkeypatch):
    monkeypatch.setenv("MATE_SSD_SPLIT_LOCAL", "io")
    assert tl_ssd.split_plan(8, 2, 64, 128, 128, torch.float16)["local_dtype"] == "float16"
    monkeypatch.setenv("MATE_SSD_SPLIT_HEADS", "2")
    assert tl_ssd.split_plan(128, 8, 64, 128, 128, torch.bfloat16)["heads_per_cta"] == 2
    monkeypatch.setenv("MATE_SSD_SPLIT_HEADS", "3")  # must divide heads / groups, else the default
    assert tl_ssd.split_plan(128, 8, 64, 128, 128, torch.bfloat16)["heads_per_cta"] == 8


def _bf16_call(**kw):
    args = _kwargs((5, 300), 128, H=8, G=2, P=64, N=128, **kw)
    for k in ("x", "B", "C", "z"):
        args[k] = args[k].to(torch.bfloat16) if args[k] is not None else None
    return _call(args)


def test_variant_switch_and_keys():
    call = _bf16_call()
    assert tl_ssd.selected_variant() == "fused"  # the default until a GPU run shows split is right and faster
    fused_keys = tl_ssd.variant_keys(call)
    assert [k[0] for k in fused_keys] == ["ssd_fused", "ssd_runs"]
    with tl_ssd.use_variant("split"):
        assert tl_ssd.selected_variant() == "split"
        keys = tl_ssd.variant_keys(call)
    assert tl_ssd.selected_variant() == "fused"
    assert [k[0] for k in keys] == ["ssd_chunk", "ssd_pass", "ssd_out", "ssd_runs"]
    ckey, pkey, okey, _ = keys
    # z and initial states stay runtime flags; intermediate states change only the state-pass kernel
    inter = tl_ssd.split_kernel_keys(_bf16_call(return_intermediate_states=True))
    assert inter[0] == ckey and inter[2] == okey and inter[1] != pkey and inter[1][-1] is True
    assert tl_ssd.split_kernel_keys(_bf16_call(z=False, init=False)) == (ckey, pkey, okey)
    for key in keys:  # every key has a builder
        assert callable(tl_ssd.builder_for(key))
    with pytest.raises(ValueError, match="variant"):
        with tl_ssd.use_variant("fastest"):
            pass


def test_bad_env_value_raises(monkeypatch):
    monkeypatch.setattr(tl_ssd, "SSD_VARIANT", "splt")
    with pytest.raises(ValueError, match="MATE_SSD_KERNEL"):
        tl_ssd.selected_variant()


def test_prewarm_keys_follow_the_variant():
    kw = dict(heads=128, groups=8, dim=64, dstate=128, chunk_size=256, io_dtype=torch.bfloat16,
              state_dtype=torch.float32, dt_dtype=torch.float32)  # fmt: skip
    fk, rk = tl_ssd.prewarm_keys(**kw, variant="split")
    assert [k[0] for k in fk] == ["ssd_chunk", "ssd_pass", "ssd_pass", "ssd_out"]
    assert [k[-1] for k in fk[1:3]] == [False, True]
    assert [k[0] for k in tl_ssd.prewarm_keys(**kw)[0]] == ["ssd_fused", "ssd_fused"]
    assert len(rk) == 2


def _fake_for(key, calls):
    """A fake kernel for a launcher key; records (kind, number of arguments)."""
    kind = key[0]
    if kind == "ssd_runs":
        fn = fake_runs(key[-1])
    else:
        H, G, P, N, L, io = key[1:7]
        sp = tl_ssd.split_plan(H, G, P, N, L, getattr(torch, io))
        BL, S, rep = sp["block_L"], L // sp["block_L"], H // G
        if kind == "ssd_chunk":
            _, _, _, _, _, _, _, _, _, _, D_per_dim, _, softplus, lo, hi, has_dtb, has_D, _ = key
            fn = fake_chunk(BL=BL, S=S, rep=rep, softplus=softplus, lo=lo, hi=hi, has_dtb=has_dtb, has_D=has_D,
                            D_per_dim=D_per_dim)  # fmt: skip
        elif kind == "ssd_pass":
            fn = fake_pass(BL=BL, S=S, intermediate=key[-1])
        elif kind == "ssd_out":
            fn = fake_out(BL=BL, S=S, rep=rep)
        else:
            raise AssertionError(f"the split launcher asked for {kind}")

    def run(*args):
        calls.append((key, len(args)))
        return fn(*args)

    return run


LAUNCH_CASES = [
    pytest.param(dict(seqlens=(1, 50, 128, 300), chunk=128), id="c128_z_init"),
    pytest.param(dict(seqlens=(5, 255, 257), chunk=256, D="full", z=False), id="c256_two-tiles_D[H,P]"),
    pytest.param(dict(seqlens=(3, 300), chunk=256, N=256, G=1, H=2, init=False), id="N256_tile64_no-init"),
    pytest.param(dict(seqlens=(200, 33), chunk=128, history=(0, 37), return_intermediate_states=True), id="inter"),
    pytest.param(dict(seqlens=(5, 400, 90), chunk=128, pool=True), id="paged-pool"),
    pytest.param(dict(seqlens=(77, 129), chunk=128, rows_view=True, dt_limit=(0.02, 0.2)), id="row-views_dt-limit"),
]


@pytest.mark.parametrize("spec", LAUNCH_CASES)
def test_split_launcher_with_fake_kernels(spec, monkeypatch):
    """The real split launcher (argument order, views, flags, staging, workspaces, the returned/pool states)
    driving PyTorch stand-ins of its kernels on the CPU, against the reference backend."""
    spec = dict(spec)
    D_kind, pool, rows_view = spec.pop("D", "head"), spec.pop("pool", False), spec.pop("rows_view", False)
    H, G, N = spec.pop("H", 4), spec.pop("G", 2), spec.pop("N", 64)
    args = _kwargs(spec.pop("seqlens"), spec.pop("chunk"), H=H, G=G, P=64, N=N, **spec)
    g = torch.Generator().manual_seed(5)
    if D_kind == "full":
        args["D"] = torch.randn(H, 64, generator=g)
    T = args["x"].shape[0]
    if rows_view:  # x/B/C as row views of one packed projection buffer (read in place: 16-byte aligned rows)
        buf = torch.cat([args["x"].flatten(1), args["B"].flatten(1), args["C"].flatten(1), torch.zeros(T, 8)], 1)
        buf = buf.to(torch.float16)
        args["x"] = buf[:, : H * 64].view(T, H, 64)
        args["B"] = buf[:, H * 64 : H * 64 + G * N].view(T, G, N)
        args["C"] = buf[:, H * 64 + G * N : H * 64 + 2 * G * N].view(T, G, N)
    for k in ("x", "B", "C", "z"):
        if args.get(k) is not None:
            args[k] = args[k].to(torch.float16)
    batch = args["cu_seqlens"].shape[0] - 1
    if pool:
        page = H * 64 * N + 64
        storage = torch.randn((batch + 3) * page, generator=g)
        args["final_states_out"] = storage.view(batch + 3, page)[:, : H * 64 * N].view(batch + 3, H, 64, N)
        args["final_state_indices"] = torch.tensor([4, 0, 2], dtype=torch.int32)
    ref_args = {k: (v.clone() if k == "final_states_out" else v) for k, v in args.items()}
    ref_out = torch.full_like(args["x"], float("nan"), memory_format=torch.contiguous_format)
    ref_st = ssd_combined_fwd_varlen(**ref_args, out=ref_out, backend="torch")

    calls = []
    monkeypatch.setattr(tl_ssd, "_get", lambda key, builder, device: _fake_for(key, calls))
    out = torch.full_like(args["x"], float("nan"), memory_format=torch.contiguous_format)
    with tl_ssd.use_variant("split"):
        st = tl_ssd.ssd_combined_fwd_varlen(_call({**args, "out": out}))
    assert [k[0] for k, _ in calls] == ["ssd_runs", "ssd_chunk", "ssd_pass", "ssd_out"]
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=1e-2, atol=1e-2)
    if pool:
        assert st is None
        torch.testing.assert_close(args["final_states_out"], ref_args["final_states_out"], rtol=1e-2, atol=1e-2)
    else:
        torch.testing.assert_close(st, ref_st, rtol=1e-2, atol=1e-2)


def test_split_launcher_argument_counts_match_the_kernels(monkeypatch):
    """Each split kernel is launched with exactly as many arguments as its prim_func declares."""
    pytest.importorskip("tilelang")
    calls = []
    monkeypatch.setattr(tl_ssd, "_get", lambda key, builder, device: _fake_for(key, calls))
    args = _kwargs((5, 300), 128, H=4, G=2, P=64, N=64)
    for k in ("x", "B", "C", "z"):
        args[k] = args[k].to(torch.bfloat16)
    with tl_ssd.use_variant("split"):
        tl_ssd.ssd_combined_fwd_varlen(_call({**args, "out": torch.empty_like(args["x"])}))
    for key, nargs in calls:
        assert len(tl_ssd.builder_for(key)().params) == nargs, key[0]


def test_tma_ok_checks_every_stride():
    """TMA-read tensors (x, B, C; z and out under split): a size-1 dim's stride reaches the TMA descriptor as
    given, so an unaligned or zero one must send the tensor to staging instead of failing the launch."""
    buf = torch.zeros(4096, dtype=torch.float16)
    assert tl_ssd._tma_ok(buf[: 2 * 4 * 64].view(2, 4, 64))
    assert tl_ssd._tma_ok(buf.as_strided((1, 4, 64), (264, 64, 1)))  # one token, 16-byte aligned row stride
    assert not tl_ssd._tma_ok(buf.as_strided((1, 4, 64), (261, 64, 1)))  # one token, 522-byte row stride
    assert not tl_ssd._tma_ok(buf.as_strided((2, 1, 64), (264, 3, 1)))  # G = 1 with an odd group stride
    assert not tl_ssd._tma_ok(buf[:64].view(1, 1, 64).expand(3, 1, 64))  # a broadcast (zero-stride) dim
    assert not tl_ssd._tma_ok(buf[1:257].view(1, 4, 64))  # base not 16-byte aligned
