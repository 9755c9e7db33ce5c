"""The custom ops behind ``mate.mamba``: ``torch.compile(fullgraph=True)`` traces the public functions and the
compiled result equals eager (state, out and returned tensors); bad calls are rejected while tracing."""

from __future__ import annotations

import inspect
import linecache

import mate.mamba.decode_step as api_decode_step
import mate.mamba.norm as api_norm
import mate.mamba.replay as api_replay
import mate.mamba.ssd as api_ssd
import mate.mamba.ssu as api_ssu
import pytest
import torch
from mate.mamba import replay_state_update, rms_norm_gated, selective_state_update, ssd_combined_fwd_varlen
from mate.mamba._contract.decode_step import normalize_decode_step
from mate.mamba._contract.norm import normalize_norm
from mate.mamba._contract.replay import normalize_replay
from mate.mamba._contract.ssd import normalize_ssd
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._ops import DECODE_STEP_PARAMS, NORM_PARAMS, REPLAY_PARAMS, REQUIRED, SSD_PARAMS, SSU_PARAMS


def _ssu_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    S, H, P, N, G, b = 5, 4, 4, 8, 2, 3
    return dict(
        state=torch.randn(S, H, P, N, generator=g),
        x=torch.randn(b, H, P, generator=g),
        dt=torch.rand(b, H, generator=g).unsqueeze(-1).expand(b, H, P),
        A=-torch.rand(H, generator=g),
        B=torch.randn(b, G, N, generator=g),
        C=torch.randn(b, G, N, generator=g),
        D=torch.randn(H, generator=g),
        z=torch.randn(b, H, P, generator=g),
        dt_bias=torch.rand(H, generator=g),
        idx=torch.tensor([3, -1, 0], dtype=torch.int32),
    )


def _decode_step(state, x, dt, A, B, C, D, z, dt_bias, idx):
    y = selective_state_update(
        state, x, dt, A, B, C, D, z=z, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=idx
    )
    return y * 2.0 + 1.0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_decode_step_equals_eager(backend):
    torch._dynamo.reset()
    a = _ssu_inputs()
    b = {k: (v.clone() if k == "state" else v) for k, v in a.items()}
    y_ref = _decode_step(**a)
    y = torch.compile(_decode_step, fullgraph=True, backend=backend)(**b)
    assert torch.equal(y, y_ref)
    assert torch.equal(b["state"], a["state"])  # the in-place state update survives functionalisation
    assert not torch.equal(b["state"][3], _ssu_inputs()["state"][3])  # ... and did happen


def test_compiled_decode_with_caller_out_and_mtp_writes():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    S, H, P, N, rows = 12, 2, 4, 8, 6
    state = torch.randn(S, H, P, N, generator=g)
    x = torch.randn(rows, H, P, generator=g)
    dt = torch.rand(rows, H, P, generator=g)
    A = -torch.rand(H, generator=g)
    B = torch.randn(rows, 1, N, generator=g)
    C = torch.randn(rows, 1, N, generator=g)
    src = torch.arange(6, dtype=torch.int32).view(2, 3)
    dst = src + 6
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    acc = torch.tensor([2, 1], dtype=torch.int32)

    def f(state, out):
        selective_state_update(
            state, x, dt, A, B, C, None, state_batch_indices=src, dst_state_batch_indices=dst,
            cu_seqlens=cu, num_accepted_tokens=acc, out=out, pad_slot_id=-1,
        )  # fmt: skip
        return out.sum()

    s_ref, o_ref = state.clone(), torch.empty_like(x)
    r_ref = f(s_ref, o_ref)
    s, o = state.clone(), torch.empty_like(x)
    r = torch.compile(f, fullgraph=True, backend="aot_eager")(s, o)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref) and torch.equal(r, r_ref)


def _ssd_inputs(seed=0, *, P=4, N=8, L=16, io_dtype=torch.float32):
    """Two sequences (20 and 7 tokens; the first spans two chunks at L 16). The GPU test passes a shape the
    TileLang kernels serve (P a multiple of 64, N 64/128/256, L >= 64, bf16/fp16 x/B/C)."""
    g = torch.Generator().manual_seed(seed)
    H, G = 2, 1
    lens = [20, 7]
    T = sum(lens)
    cu_chunks = [0, 16, 20, 27] if L == 16 else [0, 20, 27]
    return dict(
        x=torch.randn(T, H, P, generator=g).to(io_dtype),
        dt=torch.randn(T, H, generator=g),
        A=-torch.rand(H, generator=g),
        B=torch.randn(T, G, N, generator=g).to(io_dtype),
        C=torch.randn(T, G, N, generator=g).to(io_dtype),
        chunk_size=L,
        cu_seqlens=torch.tensor([0, 20, 27], dtype=torch.int32),
        cu_chunk_seqlens=torch.tensor(cu_chunks, dtype=torch.int32),
        last_chunk_indices=torch.tensor([len(cu_chunks) - 3, len(cu_chunks) - 2], dtype=torch.int32),
        seq_idx=torch.tensor([0, 0, 1] if L == 16 else [0, 1], dtype=torch.int32),
        D=torch.randn(H, generator=g),
        dt_bias=torch.rand(H, generator=g),
        initial_states=torch.randn(2, H, P, N, generator=g),
    )


def _prefill(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, D, dt_bias,
             initial_states, out):  # fmt: skip
    states = ssd_combined_fwd_varlen(
        x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D, None, dt_bias,
        dt_softplus=True, initial_states=initial_states,
    )  # fmt: skip
    return states * 1.0


def test_compiled_prefill_equals_eager():
    torch._dynamo.reset()
    a = _ssd_inputs()
    out_ref = torch.empty_like(a["x"])
    st_ref = _prefill(**a, out=out_ref)
    out = torch.empty_like(a["x"])
    st = torch.compile(_prefill, fullgraph=True, backend="aot_eager")(**a, out=out)
    assert torch.equal(out, out_ref) and torch.equal(st, st_ref)
    assert st.shape == (2, 2, 4, 8)


def test_compiled_prefill_final_states_out_returns_none():
    torch._dynamo.reset()
    a = _ssd_inputs(2)
    a.pop("initial_states")

    def f(pool, out):
        r = ssd_combined_fwd_varlen(
            a["x"], a["dt"], a["A"], a["B"], a["C"], a["chunk_size"], a["cu_seqlens"], a["cu_chunk_seqlens"],
            a["last_chunk_indices"], a["seq_idx"], out, final_states_out=pool,
            final_state_indices=torch.tensor([3, 1], dtype=torch.int32),
        )  # fmt: skip
        assert r is None
        return out + 0

    pool_ref, out_ref = torch.zeros(4, 2, 4, 8), torch.empty_like(a["x"])
    f(pool_ref, out_ref)
    pool, out = torch.zeros(4, 2, 4, 8), torch.empty_like(a["x"])
    torch.compile(f, fullgraph=True, backend="aot_eager")(pool, out)
    assert torch.equal(pool, pool_ref) and torch.equal(out, out_ref)
    assert pool_ref[3].abs().sum() > 0 and pool_ref[0].abs().sum() == 0


def test_bad_call_is_rejected_while_tracing():
    torch._dynamo.reset()
    a = _ssu_inputs()
    a["idx"] = a["idx"].float()  # a float slot table
    with pytest.raises(Exception, match="state_batch_indices"):
        torch.compile(_decode_step, fullgraph=True, backend="aot_eager")(**a)


def test_unsupported_capability_is_rejected_while_tracing():
    torch._dynamo.reset()
    a = _ssu_inputs()

    def f(state, x, dt, A, B, C):
        return selective_state_update(state, x, dt, A, B, C, None, rand_seed=torch.zeros(1, dtype=torch.int64))

    with pytest.raises(Exception, match="rand_seed"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(a["state"], a["x"], a["dt"], a["A"], a["B"], a["C"])


@pytest.mark.parametrize(
    ("public", "table", "normaliser"),
    [
        pytest.param(selective_state_update, SSU_PARAMS, normalize_ssu, id="ssu"),
        pytest.param(ssd_combined_fwd_varlen, SSD_PARAMS, normalize_ssd, id="ssd"),
        pytest.param(replay_state_update, REPLAY_PARAMS, normalize_replay, id="replay"),
        pytest.param(rms_norm_gated, NORM_PARAMS, normalize_norm, id="norm"),
        pytest.param(api_decode_step.mamba2_decode_step, DECODE_STEP_PARAMS, normalize_decode_step, id="decode_step"),
    ],
)
def test_public_signature_and_normaliser_follow_the_op_table(public, table, normaliser):
    """The parameter table is the one list; the public signature repeats it (its positional parameters are the
    table's other rows in order, its keyword-only ones the keyword rows; same defaults) and the normaliser takes
    it in table order, all but the trailing ``backend``."""
    params = inspect.signature(public).parameters.values()
    positional = [(p.name, p.default) for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert positional == [(p.name, p.default) for p in table if not p.keyword]
    assert keyword == {p.name: p.default for p in table if p.keyword}
    assert len(positional) + len(keyword) == len(params)
    norm = inspect.signature(normaliser).parameters
    assert list(norm) == [p.name for p in table[:-1]] and table[-1].name == "backend"
    assert all(norm[p.name].default == p.default for p in table[:-1] if p.default is not REQUIRED)
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in norm.values())


@pytest.mark.parametrize("compiling", [False, True])
@pytest.mark.parametrize("op", ["ssu", "ssd", "replay", "norm", "decode_step"])
def test_public_functions_forward_every_argument_in_table_order(monkeypatch, op, compiling):
    """Each public function passes every argument to its eager or traced entry in table order."""
    table, public, module = {
        "ssu": (SSU_PARAMS, selective_state_update, api_ssu),
        "ssd": (SSD_PARAMS, ssd_combined_fwd_varlen, api_ssd),
        "replay": (REPLAY_PARAMS, replay_state_update, api_replay),
        "norm": (NORM_PARAMS, rms_norm_gated, api_norm),
        "decode_step": (DECODE_STEP_PARAMS, api_decode_step.mamba2_decode_step, api_decode_step),
    }[op]
    seen = []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    entry = ("trace_" if compiling else "eager_") + op
    monkeypatch.setattr(module, entry, lambda *a: seen.append(a))
    sentinels = {p.name: object() for p in table}
    positional = [sentinels[p.name] for p in table if not p.keyword]
    public(*positional, **{p.name: sentinels[p.name] for p in table if p.keyword})
    assert seen[0] == tuple(sentinels[p.name] for p in table)


@pytest.mark.parametrize("compiling", [False, True])
def test_the_prefill_adapter_forwards_every_argument_in_table_order(monkeypatch, compiling):
    """``mamba_chunk_scan_combined_varlen`` (vLLM's names and order) reaches the same entry as the public function
    with each argument in its table position; what vLLM's op does not take is its default."""
    from mate.mamba.adapters import mamba_chunk_scan_combined_varlen

    seen = []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    monkeypatch.setattr(api_ssd, "trace_ssd" if compiling else "eager_ssd", lambda *a: seen.append(a))
    vllm = list(inspect.signature(mamba_chunk_scan_combined_varlen).parameters)
    sentinels = {name: object() for name in vllm}
    mamba_chunk_scan_combined_varlen(**sentinels)
    want = tuple(sentinels[p.name] if p.name in sentinels else p.default for p in SSD_PARAMS)
    assert seen[0] == want and len(want) == len(SSD_PARAMS)


def test_ops_are_registered_with_declared_mutations():
    schema = str(torch.ops.mate.selective_state_update.default._schema)
    assert "Tensor(a0!) state" in schema and "Tensor(a13!) out" in schema
    assert "intermediate_states_buffer" in schema and "-> ()" in schema
    schema = str(torch.ops.mate.ssd_combined_fwd_varlen.default._schema)
    assert "Tensor(a10!) out" in schema and "final_states_out" in schema and "-> Tensor" in schema
    schema = str(torch.ops.mate.replay_state_update.default._schema)
    for arg in ("Tensor(a0!) state", "Tensor(a1!) x_cache", "Tensor(a2!) B_cache", "Tensor(a3!) dt_cache",
                "Tensor(a11!) out", "Tensor(a18!)? state_scale", "Tensor ring_start", "-> ()"):  # fmt: skip
        assert arg in schema, arg


@pytest.mark.slow
def test_inductor_decode_step_equals_eager():
    torch._dynamo.reset()
    a = _ssu_inputs(3)
    b = {k: (v.clone() if k == "state" else v) for k, v in a.items()}
    y_ref = _decode_step(**a)
    y = torch.compile(_decode_step, fullgraph=True)(**b)
    torch.testing.assert_close(y, y_ref)
    assert torch.equal(b["state"], a["state"])


def test_compiled_decode_on_a_strided_pool_view():
    """vLLM's state is a view of a page (stride(0) = page size, a storage offset): the traced in-place update must
    land in the page exactly as in eager."""
    torch._dynamo.reset()
    a = _ssu_inputs(4)
    S, H, P, N = a["state"].shape
    page = torch.randn(S, H * P * N + 24)

    def pool(p):
        return p[:, 8 : 8 + H * P * N].view(S, H, P, N)

    page_ref = page.clone()
    b = dict(a, state=pool(page_ref))
    y_ref = _decode_step(**b)
    page_c = page.clone()
    c = dict(a, state=pool(page_c))
    assert c["state"].storage_offset() == 8 and c["state"].stride(0) == H * P * N + 24
    y = torch.compile(_decode_step, fullgraph=True, backend="aot_eager")(**c)
    assert torch.equal(y, y_ref) and torch.equal(page_c, page_ref)
    assert not torch.equal(page_c, page)


@pytest.mark.gpu
def test_gpu_compiled_decode_and_prefill_equal_eager():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(5)
    S, H, P, N, b = 8, 8, 64, 128, 4
    dev = "cuda"
    state = torch.randn(S, H, P, N, generator=g).to(dev)
    x = torch.randn(b, H, P, generator=g).to(dev, torch.bfloat16)
    dt = torch.rand(b, H, generator=g).to(dev).unsqueeze(-1).expand(b, H, P)
    A = (-torch.rand(H, generator=g)).to(dev)
    B = torch.randn(b, 2, N, generator=g).to(dev, torch.bfloat16)
    C = torch.randn(b, 2, N, generator=g).to(dev, torch.bfloat16)
    idx = torch.tensor([3, -1, 0, 6], dtype=torch.int32, device=dev)

    def step(state):
        return selective_state_update(state, x, dt, A, B, C, None, dt_softplus=True, state_batch_indices=idx) * 1.0

    s_ref = state.clone()
    y_ref = step(s_ref)
    s = state.clone()
    y = torch.compile(step, fullgraph=True, backend="aot_eager")(s)
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)

    gpu_shape = dict(P=64, N=64, L=64, io_dtype=torch.bfloat16)
    a = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in _ssd_inputs(6, **gpu_shape).items()}
    out_ref = torch.empty_like(a["x"])
    st_ref = _prefill(**a, out=out_ref)
    out = torch.empty_like(a["x"])
    st = torch.compile(_prefill, fullgraph=True, backend="aot_eager")(**a, out=out)
    assert torch.equal(out, out_ref) and torch.equal(st, st_ref)


def test_generated_entries_split_and_forward_in_table_order():
    """The eager SSU entry (generated from the table) hands on the keyed tensors and either the scalar options
    (from which join() rebuilds every argument) or, when a scalar is not exactly its row's class or an
    unimplemented option is given, every argument."""
    from mate.mamba._dispatch import FastPath
    from mate.mamba._ops import SSU

    got = []

    class Probe:  # a FastPath without a latest hit
        latest = FastPath.NONE

        def __call__(self, *a):
            got.append(a)

    entry = SSU.entry("probe", Probe(), split=True)
    args = {p.name: (p.default if p.default is not REQUIRED else object()) for p in SSU_PARAMS}
    args.update(x=object(), out=object())
    entry(*args.values())
    tensors, scalars, everything = got[-1]
    assert tensors == tuple(args[n] for n in SSU.tensor_names) and "rand_seed" in SSU.tensor_names
    assert scalars == tuple(args[n] for n in SSU.scalar_names) and SSU.scalar_names[-1] == "backend"
    assert everything is None and SSU.join(tensors, scalars) == tuple(args.values())
    for change in ({"dt_softplus": 1}, {"backend": None}, {"pad_slot_id": True}):
        changed = {**args, **change}
        entry(*changed.values())
        assert got[-1] == (tuple(changed[n] for n in SSU.tensor_names), None, tuple(changed.values())), change
    assert "def probe(state, x, dt" in "".join(linecache.getlines("<mate.mamba._ops probe>"))


def test_a_generated_entry_replays_the_latest_form_itself():
    """A keyable call whose scalars equal the latest hit's and whose tensors its check accepts is launched by the
    entry (the FastPath is not called); any other call goes to the FastPath."""
    from mate.mamba._ops import SSU

    args = {p.name: (p.default if p.default is not REQUIRED else object()) for p in SSU_PARAMS}
    scalars = tuple(args[n] for n in SSU.scalar_names)
    seen, launched, called = [], [], []

    class Probe:
        latest = (scalars, lambda t: seen.append(t) or t[1] is args["x"], lambda t: launched.append(t) or "y")

        def __call__(self, *a):
            called.append(a)

    entry = SSU.entry("probe_latest", Probe(), split=True)
    assert entry(*args.values()) == "y" and not called
    assert launched == seen == [tuple(args[n] for n in SSU.tensor_names)]
    entry(*{**args, "x": object()}.values())  # the check refuses
    entry(*{**args, "pad_slot_id": 7}.values())  # other scalars: not checked
    assert len(called) == 2 and len(launched) == 1 and len(seen) == 2


def _replay_pool(seed=0):
    """A pool of 6 slots (H 4, P 4, N 8, G 2) with rings of 5 rows and window 3, and a 2-token step of 3
    sequences: slot 4 flushes (3 live + 2 new > 3), slot 1 does not, the middle sequence is a pad."""
    g = torch.Generator().manual_seed(seed)
    S, H, P, N, G, L, T, b = 6, 4, 4, 8, 2, 5, 2, 3
    pool = dict(
        state=torch.randn(S, H, P, N, generator=g),
        x_cache=torch.randn(S, H, L, P, generator=g),
        B_cache=torch.randn(S, G, L, N, generator=g),
        dt_cache=torch.rand(S, H, L, generator=g) * 0.3,
        ring_start=torch.tensor([0, 4, 2, 1, 3, 0], dtype=torch.int32),
        prev_num_accepted_tokens=torch.tensor([0, 1, 2, 0, 3, 1], dtype=torch.int32),
    )
    step = dict(
        x=torch.randn(b, T, H, P, generator=g), dt=torch.randn(b, T, H, generator=g) * 0.5,
        A=-(torch.rand(H, generator=g) + 0.3), B=torch.randn(b, T, G, N, generator=g),
        C=torch.randn(b, T, G, N, generator=g), D=torch.randn(H, generator=g), dt_bias=torch.rand(H, generator=g),
        slots=torch.tensor([4, -1, 1], dtype=torch.int32),
    )  # fmt: skip
    return pool, step


def _replay_step(state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, D,
                 dt_bias, slots, out):  # fmt: skip
    y = replay_state_update(
        state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out, D,
        dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots, pad_slot_id=-1,
    )  # fmt: skip
    return y * 2.0


def test_compiled_replay_step_equals_eager():
    """The traced ReplaySSM step equals eager: out, the flushed checkpoint and the appended ring rows (the op's
    in-place writes survive functionalisation), and the call did flush and append."""
    torch._dynamo.reset()
    pool, step = _replay_pool()
    ref = {k: v.clone() for k, v in pool.items()}
    mine = {k: v.clone() for k, v in pool.items()}
    out_ref = torch.full_like(step["x"], float("nan"))
    out = torch.full_like(step["x"], float("nan"))
    y_ref = _replay_step(**ref, **step, out=out_ref)
    y = torch.compile(_replay_step, fullgraph=True, backend="aot_eager")(**mine, **step, out=out)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0, equal_nan=True)  # (the pad's rows stay NaN)
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0, equal_nan=True)
    for k in pool:
        assert torch.equal(mine[k], ref[k]), k
    assert not torch.equal(ref["state"][4], pool["state"][4])  # slot 4 flushed
    assert torch.equal(ref["state"][1], pool["state"][1])  # slot 1 did not
    assert not torch.equal(ref["x_cache"][1], pool["x_cache"][1])  # the new tokens appended
    assert torch.isnan(out[1]).all()  # the pad's rows untouched


def test_bad_replay_call_is_rejected_while_tracing():
    torch._dynamo.reset()
    pool, step = _replay_pool(1)
    pool["dt_cache"] = pool["dt_cache"].to(torch.float64)
    with pytest.raises(Exception, match="dt_cache"):
        compiled = torch.compile(_replay_step, fullgraph=True, backend="aot_eager")
        compiled(**pool, **step, out=torch.empty_like(step["x"]))
