"""MATE inside the real vLLM 0.33.0, as a deployment runs it: vLLM loads its ``vllm.general_plugins`` entry points
(``MATE_VLLM_ENABLE=1``), builds its SSU backend with its own initializer from a ``MambaConfig`` and a KV-cache
config holding a Mamba2 group, and its mixer calls vLLM's dispatch function (decode, speculative decode) and the
prefill it imports, fed with metadata from vLLM's own ``compute_varlen_chunk_metadata``.

Run by ``nox -s engines``, which installs the released vLLM wheel ``--no-deps`` with the pure-Python modules its
imports need (``tools/engines/requirements.txt``); skipped where vLLM is not installed. vLLM's own kernels are
Triton or its compiled CPU extension (neither runs from the wheel on a CPU-only machine), so the numbers are
checked against the float64 recurrence of ``mate.mamba.testing``.
"""

from __future__ import annotations

import json
import warnings

import mate_vllm.plugin as plugin
import pytest
import torch
from mate.mamba import settings
from mate_vllm import ops

pytestmark = pytest.mark.engine
# the whole release (vllm.plugins, vllm.config, ...), not just its Mamba ops as some GPU boxes carry for benchmarks
pytest.importorskip("vllm.plugins", reason="the real vLLM is installed by `nox -s engines`")

import vllm  # noqa: E402
from test_vllm_conformance import _tol, check_ssu, decode_tensors, oracle, prefill_tensors, vllm_expect  # noqa: E402
from vllm.config import MambaConfig  # noqa: E402
from vllm.model_executor.layers.mamba import mamba_mixer2 as mixer  # noqa: E402
from vllm.model_executor.layers.mamba.ops import ssu_dispatch as sd  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.v1.attention.backends.mamba2_attn import compute_varlen_chunk_metadata  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec  # noqa: E402

with settings.override(MATE_VLLM_ENABLE="1"):  # what the deployment's environment says
    load_general_plugins()  # vLLM's own loader: reads the entry points, calls mate_vllm.plugin.register


def kv_cache_config() -> KVCacheConfig:
    spec = MambaSpec(block_size=16, shapes=((3, 64), (4, 4, 8)), dtypes=(torch.bfloat16, torch.float32))
    return KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])


@pytest.fixture
def backend():
    """Initialises vLLM's process-wide SSU backend as its model runner does, and restores it afterwards."""
    saved = sd._mamba_ssu_backend
    sd._mamba_ssu_backend = None
    sd.initialize_mamba_ssu_backend(MambaConfig(backend="flashinfer"), kv_cache_config(), use_replayssm=False)
    yield sd._mamba_ssu_backend
    sd._mamba_ssu_backend = saved


def test_the_plugin_loaded_through_vllms_entry_points_and_patched_every_path():
    assert vllm.__version__ == "0.33.0"
    st = plugin.status()
    assert st["version"] == "0.33.0"
    assert st["ssu"] == "registered for ['triton', 'flashinfer']"
    assert st["replayssm"] in ("watched", "left to vLLM")
    reg = {k.value: v.__name__ for k, v in sd._BACKEND_REGISTRY.items()}
    assert reg == {"triton": "MateSSUBackend", "flashinfer": "MateSSUBackend", "cpu": "CPUSSUBackend"}
    assert mixer.mamba_chunk_scan_combined_varlen is ops.mamba_chunk_scan_combined_varlen
    assert mixer.selective_state_update is sd.selective_state_update  # the mixer decodes through the dispatch
    # MATE_VLLM_CONV1D=auto (the default): the update by the measured rule, the prefill left to vLLM
    assert mixer.causal_conv1d_update is ops.causal_conv1d_update_auto
    assert mixer.causal_conv1d_fn is ops.ENGINE_CONV1D.get("causal_conv1d_fn", mixer.causal_conv1d_fn)
    assert mixer.causal_conv1d_fn is not ops.causal_conv1d_fn


def test_vllms_initializer_builds_mates_backend(backend):
    assert backend.name == "mate" and isinstance(backend, sd.MambaSSUBackend)
    assert sd.get_mamba_ssu_backend() is backend


def test_stochastic_rounding_is_served_from_vllms_config():
    """--enable-mamba-cache-stochastic-rounding: vLLM's initializer builds MATE's backend from the config, and the
    mixer's decode on an fp16 pool rounds the final stores stochastically (torch's generator draws the seed: the
    same draw gives the same bits, within one fp16 step of the exact state)."""
    saved = sd._mamba_ssu_backend
    sd._mamba_ssu_backend = None
    try:
        cfg = MambaConfig(backend="flashinfer")
        # vLLM's own validator refuses the flag off CUDA (this machine), so it is set past the validator
        object.__setattr__(cfg, "enable_stochastic_rounding", True)
        object.__setattr__(cfg, "stochastic_rounding_philox_rounds", 7)
        sd.initialize_mamba_ssu_backend(cfg, kv_cache_config())
        assert sd.get_mamba_ssu_backend().name == "mate"
        src = torch.tensor([[4], [2], [7]], dtype=torch.int32)
        pools = []
        for seed in (3, 3):
            t = decode_tensors(rows=3, S=9, H=4, G=2, N=32, io=torch.float16, state_dtype=torch.float16, seed=3)
            pool0 = t.state.clone()
            torch.manual_seed(seed)
            mixer.selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z,
                                         dt_softplus=True, state_batch_indices=src, dst_state_batch_indices=src,
                                         out=t.out)  # fmt: skip
            e = vllm_expect(pool0.float(), t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, src=src, dst=src)
            rows = src.view(-1).long()
            exact = e.state[rows].double()
            assert bool(((t.state[rows].double() - exact).abs() <= exact.abs() * 2.0**-10 + 1e-6).all())
            pools.append(t.state)
        assert torch.equal(pools[0], pools[1])
    finally:
        sd._mamba_ssu_backend = saved


def test_replayssm_default_follows_the_shipped_rule(backend, caplog):
    """MATE_VLLM_REPLAYSSM=auto (the default) with the rule mate-vllm ships (FlashInfer faster everywhere in the
    runs of record): FlashInfer's own checkpointing_ssu stays in vLLM's slot, no warning, the rule logged once."""
    from flashinfer.mamba.checkpointing_ssu import checkpointing_ssu

    with warnings.catch_warnings(record=True) as seen, caplog.at_level("INFO", logger="mate_vllm"):
        warnings.simplefilter("always")
        for _ in range(2):
            sd.initialize_mamba_ssu_backend(MambaConfig(backend="flashinfer"), kv_cache_config(), use_replayssm=True)
    assert not [w for w in seen if "--use-replayssm" in str(w.message)]
    assert sd._flashinfer_replayssm_kernel is checkpointing_ssu
    said = plugin.status()["replayssm"]
    assert said.startswith("FlashInfer's kernel serves every ReplaySSM call")
    assert [r.getMessage() for r in caplog.records if r.name == "mate_vllm"] in ([f"--use-replayssm: {said}"], [])


def _replay_exact(pool, x, dt, A, B, C, D, dt_bias, slots, W):
    """The plain recurrence in float64: each slot's checkpoint through its live ring tokens, then the new tokens
    (y per token, the state after the live tokens, which a flush writes back)."""
    state, xc, bc, dc, rs, pnat = (pool[k] for k in ("state", "x_cache", "B_cache", "dt_cache", "ring_start", "pnat"))
    nb, T, H, P = x.shape
    L, G = xc.shape[2], B.shape[2]
    heads = torch.arange(H) // (H // G)
    a = A[:, 0, 0].double()
    y = torch.zeros(nb, T, H, P, dtype=torch.float64)
    folded = {}
    for b, s in enumerate(slots.tolist()):
        if s == 0:  # vLLM's null block
            continue
        h = state[s].double()
        for j in range(int(pnat[s])):
            row = (int(rs[s]) + j) % L
            d = dc[s, :, row].double()
            h = (
                torch.exp(a * d)[:, None, None] * h
                + (d[:, None] * xc[s, :, row].double())[..., None] * bc[s, heads, row].double()[:, None, :]
            )
        folded[s] = h
        for t in range(T):
            d = torch.nn.functional.softplus(dt[b, t, :, 0].double() + dt_bias[:, 0].double())
            bt, ct = B[b, t, heads].double(), C[b, t, heads].double()
            h = torch.exp(a * d)[:, None, None] * h + (d[:, None] * x[b, t].double())[..., None] * bt[:, None, :]
            y[b, t] = (h * ct[:, None, :]).sum(-1) + D[:, 0].double()[:, None] * x[b, t].double()
    return y, folded


@pytest.mark.parametrize("T", [pytest.param(1, id="standard-decode"), pytest.param(3, id="speculative-3")])
@pytest.mark.parametrize("mode", [pytest.param("1", id="every-call"), pytest.param("auto", id="rule-names-it")])
def test_replayssm_flashinfer_path_runs_mates_replay(backend, T, mode, tmp_path):
    """MATE_VLLM_REPLAYSSM=1, or auto with a rule naming this call: vLLM's initializer sets its FlashInfer ReplaySSM
    kernel and MATE's op (or the router, which picks it) replaces it; vLLM's own
    selective_state_update_replayssm_flashinfer (its reshaping, pad slot 0, the scratch trio, the philox_rounds it
    always passes) then runs MATE's reference on this CPU: outputs equal the float64 recurrence, flushed
    checkpoints hold the replayed state, the others are untouched, and the new tokens join the ring."""
    g = torch.Generator().manual_seed(7 + T)
    S, H, P, N, G, W = 7, 4, 8, 16, 2, 4
    L = W + T
    rule = tmp_path / "rule.json"
    cell = dict(state="float32", tokens=T, heads=H, dim=P, dstate=N, groups=G, batches=[2, 8])
    rule.write_text(json.dumps(dict(source="a synthetic measurement", mate=[cell])))
    with settings.override(MATE_VLLM_REPLAYSSM=mode, MATE_VLLM_REPLAYSSM_RULE=str(rule)):
        sd.initialize_mamba_ssu_backend(MambaConfig(backend="flashinfer"), kv_cache_config(), use_replayssm=True)
    if mode == "1":
        assert sd._flashinfer_replayssm_kernel is ops.checkpointing_ssu
        assert plugin.status()["replayssm"].startswith("served by MATE")
    else:
        assert sd._flashinfer_replayssm_kernel.__name__ == "checkpointing_ssu_routed"
        assert plugin.status()["replayssm"].startswith("MATE serves ReplaySSM for float32 state")
    pool = dict(
        state=torch.randn(S, H, P, N, generator=g) * 0.5,
        x_cache=torch.randn(S, H, L, P, generator=g).to(torch.bfloat16),
        B_cache=torch.randn(S, G, L, N, generator=g).to(torch.bfloat16),
        dt_cache=torch.rand(S, H, L, generator=g) * 0.3,
        ring_start=torch.randint(0, L, (S,), generator=g, dtype=torch.int32),
        pnat=torch.tensor([0, W, 1, W - T, W, 0, 2], dtype=torch.int32).clamp(0, W),
    )
    slots = torch.tensor([2, 0, 4, 3, 1, 6], dtype=torch.int32)  # slot 0: vLLM's null block (a padded row)
    nb = slots.numel()
    x = torch.randn(nb, T, H, P, generator=g).to(torch.bfloat16)
    dt = (torch.randn(nb, T, H, 1, generator=g) * 0.5).to(torch.bfloat16).expand(nb, T, H, P)
    A = (-(torch.rand(H, generator=g) + 0.5)).view(H, 1, 1).expand(H, P, N)
    Bm = torch.randn(nb, T, G, N, generator=g).to(torch.bfloat16)
    Cm = torch.randn(nb, T, G, N, generator=g).to(torch.bfloat16)
    D = torch.randn(H, 1, generator=g).to(torch.bfloat16).expand(H, P)
    dt_bias = (torch.randn(H, 1, generator=g) * 0.3).to(torch.bfloat16).expand(H, P)
    out = torch.full((nb, T, H, P), float("nan"), dtype=torch.bfloat16)
    before = {k: v.clone() for k, v in pool.items()}
    y_ref, folded = _replay_exact(pool, x, dt, A, Bm, Cm, D, dt_bias, slots, W)
    args = (x[:, 0], dt[:, 0], A, Bm[:, 0], Cm[:, 0], out[:, 0]) if T == 1 else (x, dt, A, Bm, Cm, out)
    sd.selective_state_update_replayssm_flashinfer(
        pool["state"], *args, pool["x_cache"], pool["B_cache"], pool["dt_cache"], pool["ring_start"], pool["pnat"],
        torch.ones(S, dtype=torch.int32), W, D=D, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots,
        null_block_id=sd.NULL_BLOCK_ID, update_trackers=False,
    )  # fmt: skip
    live = slots != 0
    got = out.double()[live]
    ref = y_ref[live]
    assert bool(((got - ref).abs() <= 2e-2 * ref.abs().max() + 1e-2 * ref.abs()).all())
    assert bool(out[~live].isnan().all())  # the padded row is not written
    for s in range(S):
        if s in folded and int(before["pnat"][s]) + T > W:  # a flush writes the replayed state back
            torch.testing.assert_close(pool["state"][s].double(), folded[s], rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(pool["state"][s], before["state"][s])
    for b, s in enumerate(slots.tolist()):
        if s == 0:
            continue
        for t in range(T):
            row = (int(before["ring_start"][s]) + int(before["pnat"][s]) + t) % L
            assert torch.equal(pool["x_cache"][s, :, row], x[b, t])
    assert torch.equal(pool["ring_start"], before["ring_start"]) and torch.equal(pool["pnat"], before["pnat"])


def test_decode_through_vllms_dispatch(backend):
    """The mixer's decode: [N, 1] int32 tables (vLLM 0.33's form), null block 0, a null source."""
    t = decode_tensors(rows=3, S=9, H=4, G=2, io=torch.bfloat16, seed=3)
    src = torch.tensor([[4], [0], [7]], dtype=torch.int32)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, src=src, dst=src)
    mixer.selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, dt_softplus=True,
                                 state_batch_indices=src, dst_state_batch_indices=src, out=t.out)  # fmt: skip
    check_ssu(t, e, pool0, io=torch.bfloat16)
    assert e.written == {4, 7}


def test_spec_decode_through_vllms_dispatch(backend):
    """vLLM's speculative decode: [N, 1 + K] int32 tables, num_accepted_tokens, packed rows with cu_seqlens."""
    cu = torch.tensor([0, 3, 5, 8], dtype=torch.int32)
    src = torch.tensor([[1, 2, 3], [0, 0, 0], [7, 8, 9]], dtype=torch.int32)
    dst = torch.tensor([[10, 11, 12], [13, 14, 15], [16, 0, 18]], dtype=torch.int32)
    acc = torch.tensor([2, 1, 3], dtype=torch.int32)
    t = decode_tensors(rows=8, S=20, H=4, G=2, seed=7)
    pool0 = t.state.clone()
    e = vllm_expect(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, src=src, dst=dst, cu=cu, acc=acc)
    mixer.selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, dt_softplus=True,
                                 state_batch_indices=src, dst_state_batch_indices=dst, out=t.out,
                                 num_accepted_tokens=acc, cu_seqlens=cu)  # fmt: skip
    check_ssu(t, e, pool0)
    assert e.written == {10, 11, 12, 16, 18}


def test_prefill_as_the_mixer_calls_it_with_vllms_chunk_metadata(monkeypatch):
    # vLLM decides pinned host buffers from its platform; on this CPU-only torch pinning is unavailable
    monkeypatch.setattr("vllm.utils.torch_utils.PIN_MEMORY", False)
    seqlens, chunk = [19, 30, 7], 16  # the second sequence starts inside a chunk
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    cu_chunk, last, seq_idx = compute_varlen_chunk_metadata(cu, chunk)
    t = prefill_tensors(seqlens, H=4, G=2, seed=11)
    pool = torch.zeros(6, 4, 4, 8)
    slots = torch.tensor([5, 2, 3], dtype=torch.int32)
    got = mixer.mamba_chunk_scan_combined_varlen(
        t.x, t.dt, t.A, t.B, t.C, chunk_size=chunk, D=t.D, z=None, dt_bias=t.dt_bias, seq_idx=seq_idx,
        cu_seqlens=cu, cu_chunk_seqlens=cu_chunk, last_chunk_indices=last, initial_states=t.init,
        return_intermediate_states=False, dt_softplus=True, dt_limit=(0.0, float("inf")), out=t.out,
        state_dtype=pool.dtype, final_states_out=pool, final_state_indices=slots,
    )  # fmt: skip
    assert got is None
    e = oracle(t, seqlens, (cu, cu_chunk, last, seq_idx), D=t.D, dt_bias=t.dt_bias, initial_states=t.init,
               dt_softplus=True)  # fmt: skip
    torch.testing.assert_close(t.out.double(), e.y, **_tol(torch.float32))
    torch.testing.assert_close(pool[slots.long()].double(), e.final, **_tol(torch.float32))
    assert pool[[0, 1, 4]].abs().sum() == 0


def test_an_empty_prefill_sequence_from_vllms_metadata_is_refused_by_name(monkeypatch):
    """vLLM's metadata marks an empty sequence's last chunk -1; vLLM's prefill only schedules sequences with
    tokens, and its own kernel would derive the next sequence's chunk range from that -1. MATE names it."""
    monkeypatch.setattr("vllm.utils.torch_utils.PIN_MEMORY", False)
    seqlens = [19, 0, 7]
    cu = torch.tensor([0, 19, 19, 26], dtype=torch.int32)
    cu_chunk, last, seq_idx = compute_varlen_chunk_metadata(cu, 16)
    assert last.tolist()[1] == -1
    t = prefill_tensors(seqlens, seed=12)
    with pytest.raises(ValueError, match="last_chunk_indices"):
        mixer.mamba_chunk_scan_combined_varlen(t.x, t.dt, t.A, t.B, t.C, 16, cu, cu_chunk, last, seq_idx, t.out)


def test_prefix_caching_align_mode_prefill_with_vllms_checkpoint_chunks(monkeypatch):
    """``--mamba-cache-mode align``: vLLM's own chunking rule with prefill checkpoints
    (``BaseMambaAttentionMetadataBuilder._compute_chunk_metadata``) forces a chunk end inside a sequence, so the
    chunk after it is short and not the sequence's last (and a continuing sequence opens with a short chunk too);
    the mixer then asks for every chunk-end state (``return_intermediate_states``, no pool write) and reads the
    checkpoint and final states out of them. MATE's states at the checkpoint chunks and the last chunks equal the
    recurrence's."""
    from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder as Builder

    monkeypatch.setattr("vllm.utils.torch_utils.PIN_MEMORY", False)
    seqlens, chunk = [45, 30, 21], 16
    computed = torch.tensor([0, 5, 32])  # tokens already in the cache: the second sequence continues mid-chunk
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    checkpoints = [20, 0, 9]  # a checkpoint 20 tokens into the first query and 9 into the third
    cu_chunk, seq_idx, last, ckpt = Builder._compute_chunk_metadata(chunk, 3, computed, cu, checkpoints)
    sizes = torch.tensor(cu_chunk).diff().tolist()
    assert any(s < chunk and c not in last for c, s in enumerate(sizes)), "no short chunk inside a sequence"
    assert ckpt[1] == -1 and ckpt[0] >= 0 and ckpt[2] >= 0
    meta = tuple(torch.tensor(v, dtype=torch.int32) for v in (cu_chunk, last, seq_idx))
    t = prefill_tensors(seqlens, H=4, G=2, seed=13)
    states = mixer.mamba_chunk_scan_combined_varlen(
        t.x, t.dt, t.A, t.B, t.C, chunk_size=chunk, D=t.D, z=None, dt_bias=t.dt_bias, seq_idx=meta[2],
        cu_seqlens=cu, cu_chunk_seqlens=meta[0], last_chunk_indices=meta[1], initial_states=t.init,
        return_intermediate_states=True, dt_softplus=True, dt_limit=(0.0, float("inf")), out=t.out,
        state_dtype=torch.float32, final_states_out=None, final_state_indices=None,
    )  # fmt: skip
    e = oracle(t, seqlens, (cu, meta[0], meta[1], meta[2]), D=t.D, dt_bias=t.dt_bias, initial_states=t.init,
               dt_softplus=True)  # fmt: skip
    assert states.shape == (len(sizes), 4, 4, 8)
    torch.testing.assert_close(t.out.double(), e.y, **_tol(torch.float32))
    torch.testing.assert_close(states.double(), e.chunk_end, **_tol(torch.float32))
    torch.testing.assert_close(states[meta[1].long()].double(), e.final, **_tol(torch.float32))


def test_mates_align_mode_chunking_equals_vllms():
    """``mate.mamba.chunking.chunk_metadata(..., checkpoints=...)`` builds the chunk layout vLLM 0.33's align mode
    builds (``BaseMambaAttentionMetadataBuilder._compute_chunk_metadata`` with prefill checkpoints), over random
    batches: chunk ends, owners, last chunks and checkpoint chunks equal; so MATE's tests and benchmarks of that
    layout use vLLM's rule."""
    from mate.mamba.chunking import chunk_boundaries
    from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder as Builder

    g = torch.Generator().manual_seed(5)
    checked = 0
    for _ in range(200):
        batch = int(torch.randint(1, 5, (1,), generator=g))
        chunk = (16, 64, 256)[int(torch.randint(0, 3, (1,), generator=g))]
        seqlens = torch.randint(1, 700, (batch,), generator=g).tolist()
        computed = torch.randint(0, 900, (batch,), generator=g).tolist()
        marks = [int(torch.randint(1, n, (1,), generator=g)) if n > 1 and bool(torch.rand(1, generator=g) < 0.6)
                 else 0 for n in seqlens]  # fmt: skip
        cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()])
        want = Builder._compute_chunk_metadata(chunk, batch, torch.tensor(computed), cu, marks if any(marks) else None)
        _, cuc, sq, last, ckpt = chunk_boundaries(seqlens, chunk, computed, marks)
        assert (cuc, sq, last, ckpt) == tuple(want), (seqlens, computed, marks, chunk)
        checked += any(marks)
    assert checked > 100
