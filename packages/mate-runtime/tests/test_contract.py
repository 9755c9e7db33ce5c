"""The public contract of ``mate.mamba``: signatures against the seed, every rejection path of the
normalisers / prewarm functions / backend choice (a ``ValueError`` naming the argument, or a
``NotImplementedError`` naming the capability), nothing written when a call is rejected, and an import that
does not pull in TileLang."""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys

import pytest
import torch
from mate.mamba import (
    prewarm_selective_state_update,
    prewarm_ssd_combined_fwd_varlen,
    selective_state_update,
    ssd_combined_fwd_varlen,
)
from mate.mamba._contract.ssu import normalize_ssu

PK = inspect.Parameter.POSITIONAL_OR_KEYWORD
KO = inspect.Parameter.KEYWORD_ONLY
REQ = inspect.Parameter.empty

# ------------------------------------------------------------------------------------------ signatures
# (name, default, kind) exactly as the seed's API reference states them.

SEED_SSU = [
    ("state", REQ, PK),
    ("x", REQ, PK),
    ("dt", REQ, PK),
    ("A", REQ, PK),
    ("B", REQ, PK),
    ("C", REQ, PK),
    ("D", REQ, PK),
    ("z", None, PK),
    ("dt_bias", None, PK),
    ("dt_softplus", False, PK),
    ("state_batch_indices", None, PK),
    ("pad_slot_id", -1, PK),
    ("state_scale", None, PK),
    ("out", None, PK),
    ("disable_state_update", False, PK),
    ("intermediate_states_buffer", None, PK),
    ("intermediate_state_indices", None, PK),
    ("intermediate_state_scales", None, PK),
    ("rand_seed", None, PK),
    ("philox_rounds", 10, PK),
    ("cache_steps", 0, PK),
    ("algorithm", "auto", PK),
    ("dst_state_batch_indices", None, PK),
    ("cu_seqlens", None, PK),
    ("num_accepted_tokens", None, PK),
    ("backend", "auto", PK),
]

SEED_PREWARM_SSU = [
    ("state_dtype", REQ, KO),
    ("io_dtype", REQ, KO),
    ("batch", REQ, KO),
    ("heads", REQ, KO),
    ("dim", REQ, KO),
    ("dstate", REQ, KO),
    ("groups", REQ, KO),
    ("slot_dtype", REQ, KO),
    ("rows_per_cta", 4, KO),
    ("lanes_per_row", 32, KO),
    ("packed", False, KO),
    ("meta_dtype", torch.int32, KO),
    ("dt_dim", None, KO),
]

# Everything after dt_bias is keyword-only in mate.mamba (docs/mamba.md: vLLM and the seed order them differently).
SEED_SSD = [
    ("x", REQ, PK),
    ("dt", REQ, PK),
    ("A", REQ, PK),
    ("B", REQ, PK),
    ("C", REQ, PK),
    ("chunk_size", REQ, PK),
    ("cu_seqlens", REQ, PK),
    ("cu_chunk_seqlens", REQ, PK),
    ("last_chunk_indices", REQ, PK),
    ("seq_idx", REQ, PK),
    ("out", None, PK),
    ("D", None, PK),
    ("z", None, PK),
    ("dt_bias", None, PK),
    ("dt_softplus", False, KO),
    ("dt_limit", (0.0, math.inf), KO),
    ("initial_states", None, KO),
    ("return_intermediate_states", False, KO),
    ("state_dtype", None, KO),
    ("checkpoint_token_indices", None, KO),
    ("checkpoint_state_slots", None, KO),
    ("checkpoint_states", None, KO),
]
SSD_EXTENSIONS = {
    "final_states_out": None, "final_state_indices": None, "initial_states_scale": None, "final_states_scale": None,
    "backend": "auto",
}  # fmt: skip
# the engines' extensions the adapters pass (documented in selective_state_update's docstring)
SSU_EXTENSIONS = {"retrieve_parent_token": None, "final_write_to_dst": False, "accepted_writes_per_token": True}

SEED_PREWARM_SSD = [
    ("heads", REQ, PK),
    ("groups", REQ, PK),
    ("dim", REQ, PK),
    ("dstate", REQ, PK),
    ("chunk_size", REQ, PK),
    ("io_dtype", torch.bfloat16, PK),
    ("state_dtype", torch.bfloat16, PK),
    ("dt_dtype", torch.float32, PK),
    ("block_M", 32, PK),
]


PREWARM_EXT = {"jobs": None}  # worker processes for the compiles
PREWARM_SSU_EXT = {"jobs": None, "philox_rounds": 0}  # + the kernels of fp16 stochastic rounding


def _params(fn):
    return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(
    "fn,seed,extensions",
    [
        pytest.param(selective_state_update, SEED_SSU, SSU_EXTENSIONS, id="selective_state_update"),
        pytest.param(prewarm_selective_state_update, SEED_PREWARM_SSU, PREWARM_SSU_EXT, id="prewarm_ssu"),
        pytest.param(ssd_combined_fwd_varlen, SEED_SSD, SSD_EXTENSIONS, id="ssd_combined_fwd_varlen"),
        pytest.param(prewarm_ssd_combined_fwd_varlen, SEED_PREWARM_SSD, PREWARM_EXT, id="prewarm_ssd"),
    ],
)
def test_signature_matches_seed(fn, seed, extensions):
    got = _params(fn)
    assert got[: len(seed)] == seed, "names, order, defaults and kinds of the seed's parameters"
    extra = got[len(seed) :]
    assert [(n, d) for n, d, _ in extra] == list(extensions.items())
    assert all(k == KO for _, _, k in extra), "extensions after the seed's parameters are keyword-only"


def test_mamba_exports():
    import mate.mamba

    assert set(mate.mamba.__all__) == {
        "selective_state_update",
        "prewarm_selective_state_update",
        "ssd_combined_fwd_varlen",
        "prewarm_ssd_combined_fwd_varlen",
        "plan_selective_state_update",
        "plan_ssd_combined_fwd_varlen",
        "plan_replay_state_update",
        "replay_state_update",
        "materialize_replayed_state",
        "materialize_replayed_layers",
        "advance_replay_ring",
        "prewarm_replay_state_update",
        "rms_norm_gated",
        "prewarm_rms_norm_gated",
        "plan_rms_norm_gated",
        "causal_conv1d_fn",
        "causal_conv1d_update",
        "prewarm_causal_conv1d",
        "plan_causal_conv1d_fn",
        "plan_causal_conv1d_update",
        "mamba2_decode_step",
        "prewarm_mamba2_decode_step",
        "plan_mamba2_decode_step",
    }


# FlashInfer 0.7.2's checkpointing_ssu (flashinfer/mamba/checkpointing_ssu.py), written out from its source
FI_CHECKPOINTING_SSU = [
    ("state", inspect.Parameter.empty), ("x_cache", inspect.Parameter.empty), ("B_cache", inspect.Parameter.empty),
    ("dt_cache", inspect.Parameter.empty), ("ring_start", inspect.Parameter.empty),
    ("prev_num_accepted_tokens", inspect.Parameter.empty), ("x", inspect.Parameter.empty),
    ("dt", inspect.Parameter.empty), ("A", inspect.Parameter.empty), ("B", inspect.Parameter.empty),
    ("C", inspect.Parameter.empty), ("out", inspect.Parameter.empty), ("D", None), ("z", None), ("dt_bias", None),
    ("dt_softplus", False), ("state_batch_indices", None), ("pad_slot_id", -1), ("state_scale", None),
    ("rand_seed", None), ("philox_rounds", 10), ("d_split", None), ("cu_seqlens", None), ("max_seqlen", None),
    ("enable_pdl", False), ("cb_scaled", None), ("cumAdt_vec", None), ("cb_old", None),
    ("precompute_heads_per_cta", 0), ("algorithm", "auto"),
]  # fmt: skip


def test_replay_state_update_has_checkpointing_ssus_signature():
    """FlashInfer's parameters in its order with its defaults, then MATE's keyword-only ``backend``."""
    import mate.mamba

    params = inspect.signature(mate.mamba.replay_state_update).parameters.values()
    positional = [(p.name, p.default) for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == FI_CHECKPOINTING_SSU
    assert [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY] == ["backend"]


# --------------------------------------------------------------------------------------- import hygiene


def _run_python(code):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_import_mate_mamba_does_not_import_tilelang():
    code = (
        "import sys, torch\n"
        "import mate.mamba as mm\n"
        "assert 'tilelang' not in sys.modules, 'import'\n"
        "s = torch.zeros(2, 2, 4, 8); x = torch.randn(2, 2, 4); dt = torch.rand(2, 2, 4)\n"
        "A = -torch.rand(2); B = torch.randn(2, 1, 8); C = torch.randn(2, 1, 8)\n"
        "mm.selective_state_update(s, x, dt, A, B, C, None)\n"
        "mm.prewarm_selective_state_update(state_dtype=torch.float32, io_dtype=torch.float32, batch=1, heads=2,\n"
        "    dim=4, dstate=8, groups=1, slot_dtype=torch.int32)\n"
        "assert 'tilelang' not in sys.modules, 'a CPU call'\n"
        "print('ok', [m for m in sys.modules if m.startswith('mate')])\n"
    )
    r = _run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


# ---------------------------------------------------------------------------- SSU rejection paths

H, P, N, G = 4, 4, 8, 2


def _ssu_base(layout="one"):
    """A valid call: ``one`` (3 one-token rows, flat table), ``packed`` (cu_seqlens + 2-D tables + accepted
    counts) or ``dense`` ([2, 3, H, P])."""
    g = torch.Generator().manual_seed(0)
    lead = {"one": (3,), "packed": (5,), "dense": (2, 3)}[layout]
    kw = dict(
        state=torch.randn(8, H, P, N, generator=g),
        x=torch.randn(*lead, H, P, generator=g),
        dt=torch.rand(*lead, H, P, generator=g),
        A=-torch.rand(H, generator=g),
        B=torch.randn(*lead, G, N, generator=g),
        C=torch.randn(*lead, G, N, generator=g),
        D=torch.randn(H, generator=g),
        z=torch.randn(*lead, H, P, generator=g),
        dt_bias=torch.randn(H, generator=g),
        out=torch.full((*lead, H, P), 5.0),
    )
    if layout == "one":
        kw["state_batch_indices"] = torch.tensor([0, 1, 2], dtype=torch.int32)
    elif layout == "packed":
        kw["state_batch_indices"] = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
        kw["dst_state_batch_indices"] = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
        kw["cu_seqlens"] = torch.tensor([0, 3, 5], dtype=torch.int32)
        kw["num_accepted_tokens"] = torch.tensor([1, 2], dtype=torch.int32)
    return kw


def _meta(shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def _noncontig_state():
    return torch.randn(8, H, N, P).transpose(2, 3)  # [8, H, P, N] with P, N swapped in memory


I32 = torch.int32


def _ibuf(shape=(4, 3, H, P, N), dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype)


VE, NIE = ValueError, NotImplementedError
SBI, DSBI, ISB = "state_batch_indices", "dst_state_batch_indices", "intermediate_states_buffer"
ISI, FSO = "intermediate_state_indices", "final_states_out"


def _i32(*shape):
    return torch.zeros(shape, dtype=I32)


def _pool(dtype=torch.float32):
    return torch.zeros(4, H, P, N, dtype=dtype)


def _ib(buf, **kw):
    return dict(intermediate_states_buffer=buf, **kw)


FINAL = dict(final_states_out=_pool(), final_state_indices=_i32(2))

# (id, layout, overrides, exception, argument or capability named in the message)
SSU_CASES = [
    # valid requests MATE does not implement
    ("rand_seed", "one", dict(rand_seed=torch.zeros(1, dtype=torch.int64)), NIE, "rand_seed"),
    # block-scaled quantised states: the scales go with an int16/int8/fp8 state and only with one
    ("state_scale_float_state", "one", dict(state_scale=torch.ones(8, H, P)), VE, "state_scale"),
    ("int16_state_without_scale", "one", dict(state=torch.zeros(8, H, P, N, dtype=torch.int16)), VE, "state_scale"),
    ("state_scale_shape", "one", dict(state=torch.zeros(8, H, P, N, dtype=torch.int16),
                                      state_scale=torch.ones(8, H, N)), VE, "state_scale"),  # fmt: skip
    (
        "state_scale_dtype",
        "one",
        dict(state=torch.zeros(8, H, P, N, dtype=torch.int8), state_scale=torch.ones(8, H, P, dtype=torch.bfloat16)),
        VE,
        "state_scale",
    ),
    ("intermediate_state_scales_alone", "one", dict(intermediate_state_scales=torch.ones(1)), VE,
     "intermediate_state_scales"),  # fmt: skip
    ("uint8_state", "one", dict(state=torch.zeros(8, H, P, N, dtype=torch.uint8)), VE, "state"),
    # scalars
    ("algorithm", "one", dict(algorithm="fastest"), VE, "algorithm"),
    ("pad_slot_id_float", "one", dict(pad_slot_id=-1.0), VE, "pad_slot_id"),
    ("pad_slot_id_bool", "one", dict(pad_slot_id=True), VE, "pad_slot_id"),
    ("cache_steps_negative", "one", dict(cache_steps=-1), VE, "cache_steps"),
    ("cache_steps_bool", "one", dict(cache_steps=True), VE, "cache_steps"),
    ("philox_rounds_float", "one", dict(philox_rounds=10.0), VE, "philox_rounds"),
    ("backend", "one", dict(backend="cuda"), VE, "backend"),
    # state
    ("state_not_tensor", "one", dict(state=[[0.0]]), VE, "state"),
    ("state_2d", "one", dict(state=torch.zeros(8, 4)), VE, "state"),
    ("state_f64", "one", dict(state=torch.zeros(8, H, P, N, dtype=torch.float64)), VE, "state"),
    ("state_inner_not_dense", "one", dict(state=_noncontig_state()), VE, "state"),
    # x and layout
    ("x_f64", "one", dict(x=torch.zeros(3, H, P, dtype=torch.float64)), VE, "x"),
    ("x_2d_with_4d_state", "one", dict(x=torch.zeros(3, H * P)), VE, "x"),
    ("x_heads_mismatch", "one", dict(x=torch.zeros(3, H + 1, P)), VE, "x"),
    ("x_other_device", "one", dict(x=_meta((3, H, P))), VE, "x"),
    ("x_dense_with_cu_seqlens", "dense", dict(cu_seqlens=torch.tensor([0, 3, 6], dtype=I32)), VE, "cu_seqlens"),
    ("cu_seqlens_float", "packed", dict(cu_seqlens=torch.tensor([0.0, 3.0, 5.0])), VE, "cu_seqlens"),
    ("cu_seqlens_2d", "packed", dict(cu_seqlens=torch.tensor([[0, 3, 5]], dtype=I32)), VE, "cu_seqlens"),
    ("cu_seqlens_empty", "packed", dict(cu_seqlens=torch.zeros(0, dtype=I32)), VE, "cu_seqlens"),
    # dt
    ("dt_shape", "one", dict(dt=torch.rand(3, H, P + 1)), VE, "dt"),
    ("dt_per_head_shape", "one", dict(dt=torch.rand(3, H + 1)), VE, "dt"),
    ("dt_int", "one", dict(dt=torch.ones(3, H, P, dtype=I32)), VE, "dt"),
    ("dt_f64", "one", dict(dt=torch.rand(3, H, P, dtype=torch.float64)), VE, "dt"),
    # B / C / z
    ("B_dtype", "one", dict(B=torch.zeros(3, G, N, dtype=torch.bfloat16)), VE, "B"),
    ("B_dstate", "one", dict(B=torch.zeros(3, G, N + 1)), VE, "B"),
    ("B_groups_not_divisor", "one", dict(B=torch.zeros(3, 3, N), C=torch.zeros(3, 3, N)), VE, "B"),
    ("B_rows", "one", dict(B=torch.zeros(4, G, N)), VE, "B"),
    ("C_shape", "one", dict(C=torch.zeros(3, 1, N)), VE, "C"),
    ("C_dtype", "one", dict(C=torch.zeros(3, G, N, dtype=torch.float16)), VE, "C"),
    ("z_shape", "one", dict(z=torch.zeros(3, H, P + 1)), VE, "z"),
    ("z_dtype", "one", dict(z=torch.zeros(3, H, P, dtype=torch.float16)), VE, "z"),
    # A / D / dt_bias
    ("A_bf16", "one", dict(A=-torch.rand(H).to(torch.bfloat16)), VE, "A"),
    ("A_heads", "one", dict(A=-torch.rand(H + 1)), VE, "A"),
    ("A_2d_with_4d_state", "one", dict(A=-torch.rand(P, N)), VE, "A"),
    ("A_3d_shape", "one", dict(A=-torch.rand(H, P, N + 1)), VE, "A"),
    ("A_4d", "one", dict(A=-torch.rand(1, H, P, N)), VE, "A"),
    ("D_shape", "one", dict(D=torch.randn(H + 1)), VE, "D"),
    ("D_2d_shape", "one", dict(D=torch.randn(H, P + 1)), VE, "D"),
    ("D_3d", "one", dict(D=torch.randn(H, P, 1)), VE, "D"),
    ("D_int", "one", dict(D=torch.ones(H, dtype=I32)), VE, "D"),
    ("dt_bias_shape", "one", dict(dt_bias=torch.randn(P + 1)), VE, "dt_bias"),
    ("dt_bias_f64", "one", dict(dt_bias=torch.randn(H, dtype=torch.float64)), VE, "dt_bias"),
    # out
    ("out_shape", "one", dict(out=torch.zeros(3, H, P + 1)), VE, "out"),
    ("out_dtype", "one", dict(out=torch.zeros(3, H, P, dtype=torch.bfloat16)), VE, "out"),
    ("out_other_device", "one", dict(out=_meta((3, H, P))), VE, "out"),
    # tables
    ("src_float", "one", dict(state_batch_indices=torch.tensor([0.0, 1.0, 2.0])), VE, SBI),
    ("src_int16", "one", dict(state_batch_indices=torch.tensor([0, 1, 2], dtype=torch.int16)), VE, SBI),
    ("src_3d", "one", dict(state_batch_indices=torch.zeros(3, 1, 1, dtype=I32)), VE, SBI),
    ("src_too_short", "one", dict(state_batch_indices=torch.tensor([0, 1], dtype=I32)), VE, SBI),
    ("src_too_few_rows_2d", "packed", dict(state_batch_indices=torch.zeros(1, 3, dtype=I32)), VE, SBI),
    ("dst_float", "packed", dict(dst_state_batch_indices=torch.zeros(2, 3)), VE, DSBI),
    ("dst_too_few_rows", "packed", dict(dst_state_batch_indices=torch.zeros(1, 3, dtype=I32)), VE, DSBI),
    ("dst_cols_dense", "dense", dict(state_batch_indices=_i32(2, 3), dst_state_batch_indices=_i32(2, 2)), VE, DSBI),
    ("acc_shape", "packed", dict(num_accepted_tokens=torch.tensor([1, 1, 1], dtype=I32)), VE, "num_accepted_tokens"),
    ("acc_float", "packed", dict(num_accepted_tokens=torch.tensor([1.0, 1.0])), VE, "num_accepted_tokens"),
    ("acc_without_src", "packed", dict(state_batch_indices=None, dst_state_batch_indices=None), VE, SBI),
    # intermediate buffer
    ("ibuf_with_dst", "packed", _ib(_ibuf()), VE, DSBI),
    ("ibuf_dtype", "dense", _ib(_ibuf(dtype=torch.float64)), VE, ISB),
    ("ibuf_3d", "dense", _ib(torch.zeros(4, P, N)), VE, ISB),
    ("ibuf_5d_trailing", "dense", _ib(_ibuf((4, 3, H, P, N + 1))), VE, ISB),
    ("ibuf_5d_cache_steps_mismatch", "dense", _ib(_ibuf(), cache_steps=5), VE, ISB),
    ("ibuf_5d_not_flattenable", "dense", _ib(_ibuf((3, 4, H, P, N)).transpose(0, 1)), VE, ISB),
    ("ibuf_4d_without_cache_steps", "dense", _ib(_ibuf((12, H, P, N))), VE, ISB),
    ("ibuf_4d_trailing", "dense", _ib(_ibuf((12, H, P + 1, N)), cache_steps=3), VE, ISB),
    ("ibuf_inner_not_dense", "dense", _ib(_ibuf((12, H, N, P)).transpose(2, 3), cache_steps=3), VE, ISB),
    ("ibuf_cache_steps_below_T", "dense", _ib(_ibuf((12, H, P, N)), cache_steps=2), VE, "cache_steps"),
    ("ibuf_indices_float", "dense", _ib(_ibuf(), intermediate_state_indices=torch.zeros(2)), VE, ISI),
    ("ibuf_indices_too_short", "dense", _ib(_ibuf(), intermediate_state_indices=_i32(1)), VE, ISI),
    ("ibuf_indices_without_ibuf", "dense", dict(intermediate_state_indices=_i32(2)), VE, ISI),
]  # fmt: skip


def _snapshot(kw):
    return {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}


@pytest.mark.parametrize(
    "layout,overrides,exc,name", [pytest.param(*c[1:], id=c[0]) for c in SSU_CASES]
)  # fmt: skip
def test_ssu_rejections(layout, overrides, exc, name):
    kw = _ssu_base(layout)
    kw.update(overrides)
    kw = {k: v for k, v in kw.items() if v is not None or k in ("D",)}
    before = _snapshot(kw)
    with pytest.raises(exc) as info:
        selective_state_update(**kw)
    msg = str(info.value)
    if exc is ValueError:
        assert msg.startswith(f"{name}:"), msg
    else:
        assert name in msg and "not supported" in msg, msg
    for k, v in before.items():  # nothing is written before validation passes
        assert torch.equal(kw[k], v), f"{k} was modified by a rejected call"


def test_ssu_base_calls_are_valid():
    """The bases of test_ssu_rejections are accepted (so each rejection is caused by its one override)."""
    for layout in ("one", "packed", "dense"):
        selective_state_update(**_ssu_base(layout))
    kw = _ssu_base("dense")
    kw["intermediate_states_buffer"] = _ibuf()
    kw["intermediate_state_indices"] = torch.tensor([0, 1], dtype=I32)
    selective_state_update(**kw)


def test_ssu_retrieve_parent_token_rejections():
    """The adapter-only ``retrieve_parent_token`` (SGLang EAGLE trees) is validated by the normaliser."""
    kw = _ssu_base("dense")
    kw.pop("out")
    parent = torch.zeros(2, 3, dtype=I32)
    with pytest.raises(ValueError, match=r"^retrieve_parent_token:"):
        normalize_ssu(**kw, retrieve_parent_token=parent)
    kw["intermediate_states_buffer"] = _ibuf()
    with pytest.raises(ValueError, match=r"^retrieve_parent_token:"):
        normalize_ssu(**kw, retrieve_parent_token=torch.zeros(2, 2, dtype=I32))
    with pytest.raises(ValueError, match=r"^retrieve_parent_token:"):
        normalize_ssu(**kw, retrieve_parent_token=torch.zeros(2, 3))
    normalize_ssu(**kw, retrieve_parent_token=parent)


def test_tilelang_backend_on_cpu_tensors():
    kw = _ssu_base("one")
    before = _snapshot(kw)
    with pytest.raises(NotImplementedError, match="tilelang"):
        selective_state_update(**kw, backend="tilelang")
    for k, v in before.items():
        assert torch.equal(kw[k], v)
    with pytest.raises(NotImplementedError, match="tilelang"):
        ssd_combined_fwd_varlen(*_ssd_positional(), backend="tilelang")


def test_auto_backend_on_cpu_is_the_reference():
    kw = _ssu_base("one")
    a = selective_state_update(**dict(kw, state=kw["state"].clone(), out=None), backend="auto")
    b = selective_state_update(**dict(kw, state=kw["state"].clone(), out=None), backend="torch")
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------- SSD rejection paths

T, CS = 20, 16


def _ssd_base():
    g = torch.Generator().manual_seed(1)
    return dict(
        x=torch.randn(T, H, P, generator=g),
        dt=torch.rand(T, H, generator=g),
        A=-torch.rand(H, generator=g),
        B=torch.randn(T, G, N, generator=g),
        C=torch.randn(T, G, N, generator=g),
        chunk_size=CS,
        cu_seqlens=torch.tensor([0, 4, 20], dtype=I32),
        cu_chunk_seqlens=torch.tensor([0, 4, 20], dtype=I32),
        last_chunk_indices=torch.tensor([0, 1], dtype=I32),
        seq_idx=torch.tensor([0, 1], dtype=I32),
        out=torch.full((T, H, P), 5.0),
        D=torch.randn(H, generator=g),
        z=torch.randn(T, H, P, generator=g),
        dt_bias=torch.randn(H, generator=g),
    )


def _ssd_positional():
    kw = _ssd_base()
    return [kw[k] for k in list(kw)[:10]]


SSD_CASES = [
    ("checkpoint_token_indices", dict(checkpoint_token_indices=_i32(1)), NIE, "checkpoint_token_indices"),
    ("checkpoint_state_slots", dict(checkpoint_state_slots=torch.zeros(1, dtype=I32)), NIE, "checkpoint_state_slots"),
    ("checkpoint_states", dict(checkpoint_states=torch.zeros(1, H, P, N)), NIE, "checkpoint_states"),
    ("backend", dict(backend="triton"), VE, "backend"),
    ("x_4d", dict(x=torch.zeros(1, T, H, P)), VE, "x"),
    ("x_f64", dict(x=torch.zeros(T, H, P, dtype=torch.float64)), VE, "x"),
    ("x_not_tensor", dict(x=None), VE, "x"),
    ("dt_3d", dict(dt=torch.rand(T, H, P)), VE, "dt"),
    ("dt_tokens", dict(dt=torch.rand(T + 1, H)), VE, "dt"),
    ("dt_other_device", dict(dt=_meta((T, H))), VE, "dt"),
    ("A_HPN", dict(A=-torch.rand(H, P)), VE, "A"),
    ("A_heads", dict(A=-torch.rand(H + 1)), VE, "A"),
    ("B_dtype", dict(B=torch.zeros(T, G, N, dtype=torch.float16)), VE, "B"),
    ("B_tokens", dict(B=torch.zeros(T - 1, G, N)), VE, "B"),
    ("B_groups_not_divisor", dict(B=torch.zeros(T, 3, N), C=torch.zeros(T, 3, N)), VE, "B"),
    ("C_shape", dict(C=torch.zeros(T, G, N + 1)), VE, "C"),
    ("C_dtype", dict(C=torch.zeros(T, G, N, dtype=torch.bfloat16)), VE, "C"),
    ("chunk_size_48", dict(chunk_size=48), NotImplementedError, "chunk_size"),
    ("chunk_size_4", dict(chunk_size=4), NotImplementedError, "chunk_size"),
    ("chunk_size_0", dict(chunk_size=0), VE, "chunk_size"),
    ("chunk_size_float", dict(chunk_size=16.0), VE, "chunk_size"),
    ("chunk_size_bool", dict(chunk_size=True), VE, "chunk_size"),
    ("cu_seqlens_float", dict(cu_seqlens=torch.tensor([0.0, 20.0])), VE, "cu_seqlens"),
    ("cu_seqlens_no_batch", dict(cu_seqlens=torch.tensor([0], dtype=I32)), VE, "cu_seqlens"),
    ("cu_chunk_seqlens_no_chunk", dict(cu_chunk_seqlens=torch.tensor([0], dtype=I32)), VE, "cu_chunk_seqlens"),
    ("cu_chunk_seqlens_2d", dict(cu_chunk_seqlens=torch.tensor([[0, 4, 20]], dtype=I32)), VE, "cu_chunk_seqlens"),
    ("seq_idx_per_token", dict(seq_idx=torch.zeros(T, dtype=I32)), VE, "seq_idx"),
    ("seq_idx_float", dict(seq_idx=torch.zeros(2)), VE, "seq_idx"),
    ("last_chunk_indices_shape", dict(last_chunk_indices=torch.zeros(3, dtype=I32)), VE, "last_chunk_indices"),
    ("out_shape", dict(out=torch.zeros(T, H, P + 1)), VE, "out"),
    ("out_dtype", dict(out=torch.zeros(T, H, P, dtype=torch.bfloat16)), VE, "out"),
    ("D_shape", dict(D=torch.randn(H + 1)), VE, "D"),
    ("D_HP_shape", dict(D=torch.randn(H, P + 1)), VE, "D"),
    ("D_3d", dict(D=torch.randn(H, P, 1)), VE, "D"),
    ("D_int", dict(D=torch.ones(H, dtype=I32)), VE, "D"),
    ("z_shape", dict(z=torch.zeros(T, H, P + 1)), VE, "z"),
    ("z_dtype", dict(z=torch.zeros(T, H, P, dtype=torch.float16)), VE, "z"),
    ("dt_bias_HP", dict(dt_bias=torch.randn(H, P)), VE, "dt_bias"),
    ("dt_bias_shape", dict(dt_bias=torch.randn(H + 1)), VE, "dt_bias"),
    ("dt_limit_none", dict(dt_limit=None), VE, "dt_limit"),
    ("dt_limit_triple", dict(dt_limit=(0.0, 1.0, 2.0)), VE, "dt_limit"),
    ("dt_limit_reversed", dict(dt_limit=(1.0, 0.5)), VE, "dt_limit"),
    ("dt_limit_text", dict(dt_limit=("a", "b")), VE, "dt_limit"),
    ("initial_states_shape", dict(initial_states=torch.zeros(3, H, P, N)), VE, "initial_states"),
    ("initial_states_f64", dict(initial_states=torch.zeros(2, H, P, N, dtype=torch.float64)), VE, "initial_states"),
    ("state_dtype_f64", dict(state_dtype=torch.float64), VE, "state_dtype"),
    ("state_dtype_int16", dict(state_dtype=torch.int16), VE, "state_dtype"),
    ("final_states_out_alone", dict(final_states_out=torch.zeros(4, H, P, N)), VE, FSO),
    ("final_state_indices_alone", dict(final_state_indices=_i32(2)), VE, FSO),
    ("final_with_intermediate", dict(**FINAL, return_intermediate_states=True), VE, "return_intermediate_states"),
    ("final_states_out_shape", dict(FINAL, final_states_out=torch.zeros(4, H, P, N + 1)), VE, FSO),
    ("final_states_out_dtype", dict(FINAL, final_states_out=_pool(torch.float64)), VE, FSO),
    ("final_state_indices_shape", dict(FINAL, final_state_indices=_i32(3)), VE, "final_state_indices"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,exc,name", [pytest.param(*c[1:], id=c[0]) for c in SSD_CASES])
def test_ssd_rejections(overrides, exc, name):
    kw = _ssd_base()
    kw.update(overrides)
    before = _snapshot(kw)
    with pytest.raises(exc) as info:
        ssd_combined_fwd_varlen(**kw)
    msg = str(info.value)
    if exc is ValueError:
        assert msg.startswith(f"{name}:"), msg
    else:
        assert name in msg and "not supported" in msg, msg
    for k, v in before.items():
        assert torch.equal(kw[k], v), f"{k} was modified by a rejected call"


def test_ssd_base_call_is_valid():
    kw = _ssd_base()
    res = ssd_combined_fwd_varlen(**kw)
    assert res.shape == (2, H, P, N)
    pool = torch.zeros(4, H, P, N)
    assert ssd_combined_fwd_varlen(**kw, final_states_out=pool, final_state_indices=torch.tensor([3, 1])) is None
    assert pool[3].abs().sum() > 0 and pool[1].abs().sum() > 0


def test_ssd_positional_parameters_stop_at_dt_bias():
    args = list(_ssd_base().values())  # x ... dt_bias: 14 positional
    ssd_combined_fwd_varlen(*args)
    with pytest.raises(TypeError):
        ssd_combined_fwd_varlen(*args, True)  # dt_softplus is keyword-only


# ------------------------------------------------------------------------------------ prewarm checks

PREWARM_SSU_OK = dict(
    state_dtype=torch.float32,
    io_dtype=torch.bfloat16,
    batch=4,
    heads=8,
    dim=64,
    dstate=128,
    groups=2,
    slot_dtype=torch.int32,
)

PREWARM_SSU_CASES = [
    ("state_dtype", dict(state_dtype=torch.float64)),
    ("state_dtype", dict(state_dtype=torch.int32)),
    ("io_dtype", dict(io_dtype=torch.float64)),
    ("slot_dtype", dict(slot_dtype=torch.int16)),
    ("meta_dtype", dict(meta_dtype=torch.float32)),
    ("batch", dict(batch=0)),
    ("heads", dict(heads=-1)),
    ("dim", dict(dim=64.0)),
    ("dstate", dict(dstate=True)),
    ("groups", dict(groups=0)),
    ("groups", dict(groups=3)),
    ("rows_per_cta", dict(rows_per_cta=0)),
    ("lanes_per_row", dict(lanes_per_row="32")),
    ("dt_dim", dict(dt_dim=64)),
    ("jobs", dict(jobs=0)),
    ("jobs", dict(jobs=2.0)),
    ("philox_rounds", dict(philox_rounds=-1)),
    ("philox_rounds", dict(philox_rounds=10)),  # (PREWARM_SSU_OK's state is not fp16)
]


@pytest.mark.parametrize(
    "name,overrides", [pytest.param(n, o, id=f"{n}={list(o.values())[0]!r}") for n, o in PREWARM_SSU_CASES]
)
def test_prewarm_ssu_rejections(name, overrides):
    with pytest.raises(ValueError) as info:
        prewarm_selective_state_update(**dict(PREWARM_SSU_OK, **overrides))
    assert str(info.value).startswith(f"{name}:"), str(info.value)


def test_prewarm_ssu_valid_is_a_noop_without_device():
    assert prewarm_selective_state_update(**PREWARM_SSU_OK) is None
    assert prewarm_selective_state_update(**PREWARM_SSU_OK, packed=True, dt_dim=1, meta_dtype=torch.int64) is None
    for quantised in (torch.int16, torch.int8, torch.float8_e4m3fn):  # the block-scaled kernels
        assert prewarm_selective_state_update(**dict(PREWARM_SSU_OK, state_dtype=quantised), packed=True) is None
    fp16 = dict(PREWARM_SSU_OK, state_dtype=torch.float16)  # the stochastically rounding kernels
    assert prewarm_selective_state_update(**fp16, packed=True, philox_rounds=10) is None


PREWARM_SSD_OK = dict(heads=8, groups=2, dim=64, dstate=128, chunk_size=128)

PREWARM_SSD_CASES = [
    ("heads", dict(heads=0)),
    ("groups", dict(groups=-2)),
    ("groups", dict(groups=3)),
    ("dim", dict(dim=None)),
    ("dstate", dict(dstate=1.5)),
    ("block_M", dict(block_M=0)),
    ("chunk_size", dict(chunk_size=0)),
    ("io_dtype", dict(io_dtype=torch.float64)),
    ("state_dtype", dict(state_dtype=torch.int32)),
    ("dt_dtype", dict(dt_dtype=torch.int32)),
    ("jobs", dict(jobs=True)),
]


@pytest.mark.parametrize(
    "name,overrides", [pytest.param(n, o, id=f"{n}={list(o.values())[0]!r}") for n, o in PREWARM_SSD_CASES]
)
def test_prewarm_ssd_rejections(name, overrides):
    with pytest.raises(ValueError) as info:
        prewarm_ssd_combined_fwd_varlen(**dict(PREWARM_SSD_OK, **overrides))
    assert str(info.value).startswith(f"{name}:"), str(info.value)


def test_prewarm_ssd_valid_is_a_noop_without_device():
    assert prewarm_ssd_combined_fwd_varlen(**PREWARM_SSD_OK) is None
    for quantised in (torch.int16, torch.int8, torch.float8_e4m3fn):  # a block-scaled pool's kernels
        assert prewarm_ssd_combined_fwd_varlen(**dict(PREWARM_SSD_OK, state_dtype=quantised)) is None


# ------------------------------------------------- data-dependent rejections of the reference backend
# The normalisers never read index data (a kernel call must not synchronise); the reference backend does,
# and rejects bad index data with a ValueError before anything is written (no silent wrap of a negative
# slot, no aliasing of the next table row, no spill into the next intermediate entry).


def _ssu_data_base():
    """Two packed sequences of 2 tokens, 2-D tables, an 8-slot pool living in a page buffer."""
    g = torch.Generator().manual_seed(2)
    R = 4
    page = torch.randn(9, H * P * N + 8, generator=g)
    return dict(
        state=page[1:, 4 : 4 + H * P * N].view(8, H, P, N),
        x=torch.randn(R, H, P, generator=g),
        dt=torch.rand(R, H, P, generator=g),
        A=-torch.rand(H, generator=g),
        B=torch.randn(R, G, N, generator=g),
        C=torch.randn(R, G, N, generator=g),
        D=None,
        out=torch.full((R, H, P), 5.0),
        state_batch_indices=torch.tensor([[0, 1], [2, 3]], dtype=I32),
        dst_state_batch_indices=torch.tensor([[4, 5], [6, 7]], dtype=I32),
        cu_seqlens=torch.tensor([0, 2, 4], dtype=I32),
    ), page


def _t(v):
    return torch.tensor(v, dtype=I32)


NO_DST = dict(dst_state_batch_indices=None)

SSU_DATA_CASES = [
    ("src_negative_not_pad", dict(state_batch_indices=_t([[-2, 1], [2, 3]])), SBI),
    ("src_negative_not_pad0", dict(state_batch_indices=_t([[-1, 1], [2, 3]]), pad_slot_id=0), SBI),
    ("src_past_pool", dict(state_batch_indices=_t([[0, 1], [8, 3]])), SBI),
    ("dst_past_pool", dict(dst_state_batch_indices=_t([[4, 5], [6, 8]])), DSBI),
    ("dst_negative_not_pad", dict(dst_state_batch_indices=_t([[4, 5], [-3, 7]])), DSBI),
    ("dst_2d_too_few_columns", dict(dst_state_batch_indices=_t([[4], [6]])), DSBI),
    ("dst_flat_too_short", dict(dst_state_batch_indices=_t([4, 6])), DSBI),
    ("acc_past_columns", dict(num_accepted_tokens=_t([3, 1])), "num_accepted_tokens"),
    ("acc_past_flat_table", dict(num_accepted_tokens=_t([1, 3]), state_batch_indices=_t([0, 2, 3]),
                                 dst_state_batch_indices=None), "num_accepted_tokens"),
    ("parent_past_cache_steps", _ib(torch.zeros(4, 2, H, P, N), **NO_DST) | dict(
        cu_seqlens=None, x=torch.randn(2, 2, H, P), dt=torch.rand(2, 2, H, P), B=torch.randn(2, 2, G, N),
        C=torch.randn(2, 2, G, N), out=None, state_batch_indices=_t([0, 1]),
        retrieve_parent_token=_t([[-1, 2], [-1, 0]])), "retrieve_parent_token"),
    ("acc_src_past_pool", dict(num_accepted_tokens=_t([2, 1]), state_batch_indices=_t([[0, 9], [2, 3]])), SBI),
    ("acc_publish_past_pool", dict(num_accepted_tokens=_t([1, 1]), dst_state_batch_indices=None,
                                   state_batch_indices=_t([[0, 1], [2, 11]])), SBI),
    ("cu_seqlens_past_rows", dict(cu_seqlens=_t([0, 2, 5])), "cu_seqlens"),
    ("cu_seqlens_decreasing", dict(cu_seqlens=_t([0, 3, 2])), "cu_seqlens"),
    ("cu_seqlens_negative_start", dict(cu_seqlens=_t([-1, 2, 4])), "cu_seqlens"),
    ("no_table_more_sequences_than_slots", dict(state_batch_indices=None, dst_state_batch_indices=None,
                                                state=torch.zeros(1, H, P, N)), "state"),
    ("ibuf_sequence_longer_than_cache_steps", _ib(torch.zeros(4, 1, H, P, N), **NO_DST), "cache_steps"),
    ("ibuf_index_past_buffer", _ib(torch.zeros(2, 2, H, P, N), intermediate_state_indices=_t([0, 2]), **NO_DST), ISI),
    ("ibuf_index_negative", _ib(torch.zeros(2, 2, H, P, N), intermediate_state_indices=_t([-1, 0]), **NO_DST), ISI),
    ("ibuf_read_slot_past_buffer", _ib(torch.zeros(2, 2, H, P, N), **NO_DST), ISB),
]  # fmt: skip


@pytest.mark.parametrize("overrides,name", [pytest.param(*c[1:], id=c[0]) for c in SSU_DATA_CASES])
def test_ssu_reference_rejects_bad_index_data(overrides, name):
    kw, page = _ssu_data_base()
    kw.update(overrides)
    kw = {k: v for k, v in kw.items() if v is not None or k == "D"}
    before = _snapshot(kw)
    page_before = page.clone()
    with pytest.raises(ValueError) as info:
        selective_state_update(**kw, backend="torch")
    assert str(info.value).startswith(f"{name}:"), str(info.value)
    assert torch.equal(page, page_before), "the pool was written before the index data was rejected"
    for k, v in before.items():
        assert torch.equal(kw[k], v), f"{k} was modified by a rejected call"


def test_ssu_data_base_is_valid():
    kw, page = _ssu_data_base()
    before = page.clone()
    selective_state_update(**kw, backend="torch")
    assert not torch.equal(page, before)
    # sentinels are fine anywhere a slot is named
    kw, _ = _ssu_data_base()
    kw["state_batch_indices"] = _t([[-1, 1], [2, 3]])
    kw["dst_state_batch_indices"] = _t([[4, -1], [-1, 7]])
    selective_state_update(**kw, backend="torch")


SSD_DATA_CASES = [
    ("chunk_longer_than_chunk_size", dict(cu_chunk_seqlens=_t([0, 2, 20])), "cu_chunk_seqlens"),
    # the tables of a new user's first mistakes: decreasing / short cu_seqlens, chunks ending short of the tokens
    ("cu_seqlens_decreasing", dict(cu_seqlens=_t([0, 12, 4])), "cu_seqlens"),
    ("cu_seqlens_short_of_tokens", dict(cu_seqlens=_t([0, 4, 19])), "cu_seqlens"),
    ("cu_seqlens_not_from_zero", dict(cu_seqlens=_t([1, 4, 20])), "cu_seqlens"),
    ("cu_chunk_seqlens_short_of_tokens", dict(cu_chunk_seqlens=_t([0, 4, 19])), "cu_chunk_seqlens"),
    ("cu_chunk_seqlens_not_from_zero", dict(cu_chunk_seqlens=_t([2, 4, 20])), "cu_chunk_seqlens"),
    ("chunk_spans_two_sequences", dict(cu_chunk_seqlens=_t([0, 8, 20]), cu_seqlens=_t([0, 4, 20])), "cu_chunk_seqlens"),
    (
        "too_few_chunks_for_the_tokens",
        dict(cu_chunk_seqlens=_t([0, 4]), seq_idx=_t([0]), last_chunk_indices=_t([0, 0])),
        "cu_chunk_seqlens",
    ),
    ("cu_chunk_seqlens_decreasing", dict(cu_chunk_seqlens=_t([0, 4, 3])), "cu_chunk_seqlens"),
    ("cu_chunk_seqlens_past_tokens", dict(cu_chunk_seqlens=_t([0, 8, 21])), "cu_chunk_seqlens"),
    ("cu_chunk_seqlens_negative", dict(cu_chunk_seqlens=_t([-1, 4, 20])), "cu_chunk_seqlens"),
    ("seq_idx_past_batch", dict(seq_idx=_t([0, 2])), "seq_idx"),
    ("seq_idx_negative", dict(seq_idx=_t([-1, 0])), "seq_idx"),
    ("last_chunk_indices_past_chunks", dict(last_chunk_indices=_t([0, 2])), "last_chunk_indices"),
    ("last_chunk_indices_negative", dict(last_chunk_indices=_t([-1, 1])), "last_chunk_indices"),
    ("final_state_indices_past_pool", dict(FINAL, final_state_indices=_t([0, 4])), "final_state_indices"),
    ("final_state_indices_negative", dict(FINAL, final_state_indices=_t([-1, 0])), "final_state_indices"),
]


@pytest.mark.parametrize("overrides,name", [pytest.param(*c[1:], id=c[0]) for c in SSD_DATA_CASES])
def test_ssd_reference_rejects_bad_index_data(overrides, name):
    kw = _ssd_base()
    kw.update({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in overrides.items()})
    before = _snapshot(kw)
    with pytest.raises(ValueError) as info:
        ssd_combined_fwd_varlen(**kw, backend="torch")
    assert str(info.value).startswith(f"{name}:"), str(info.value)
    for k, v in before.items():
        assert torch.equal(kw[k], v), f"{k} was modified by a rejected call"


def _ssu_culprit_call(**kw):
    base = dict(
        state=torch.zeros(4, H, P, N), x=torch.randn(2, H, P), dt=torch.rand(2, H, P), A=-torch.rand(H),
        B=torch.randn(2, G, N), C=torch.randn(2, G, N), D=torch.ones(H), z=torch.randn(2, H, P),
    )  # fmt: skip
    return selective_state_update(**(base | kw), backend="torch")


def _ssd_culprit_call(**kw):
    return ssd_combined_fwd_varlen(**(_ssd_base() | kw), backend="torch")


# The argument whose shape breaks the majority is the one named, wherever the first failed check falls.
CULPRIT_CASES = [
    pytest.param(_ssu_culprit_call, dict(x=torch.randn(2, H + 1, P)), "x", "heads", id="ssu_x_heads"),
    pytest.param(_ssu_culprit_call, dict(x=torch.randn(2, H, P + 1)), "x", "dim", id="ssu_x_dim"),
    pytest.param(_ssu_culprit_call, dict(x=torch.randn(3, H, P)), "x", "rows", id="ssu_x_rows"),
    pytest.param(_ssu_culprit_call, dict(dt=torch.rand(2, H + 1, P)), "dt", "heads", id="ssu_dt_heads"),
    pytest.param(_ssu_culprit_call, dict(C=torch.randn(2, G, N + 1)), "C", "dstate", id="ssu_C_dstate"),
    pytest.param(_ssd_culprit_call, dict(x=torch.randn(T, H + 1, P)), "x", "heads", id="ssd_x_heads"),
    pytest.param(_ssd_culprit_call, dict(x=torch.randn(T + 1, H, P)), "x", "tokens", id="ssd_x_tokens"),
    pytest.param(_ssd_culprit_call, dict(B=torch.randn(T - 1, G, N)), "B", "tokens", id="ssd_B_tokens"),
    pytest.param(_ssd_culprit_call, dict(D=torch.ones(H + 1)), "D", "heads", id="ssd_D_heads"),
    pytest.param(_ssd_culprit_call, dict(seq_idx=_t([0, 0, 1])), "seq_idx", "chunks", id="ssd_seq_idx_chunks"),
]


@pytest.mark.parametrize("call,overrides,name,quantity", CULPRIT_CASES)
def test_shape_errors_name_the_argument_that_breaks_the_majority(call, overrides, name, quantity):
    with pytest.raises(ValueError) as info:
        call(**overrides)
    assert str(info.value).startswith(f"{name}:"), str(info.value)
    assert quantity in str(info.value), str(info.value)


def test_without_a_majority_the_first_failed_check_names_the_argument():
    # B and C alone carry the groups: two votes, no majority; the check on C (shaped like B) names C
    with pytest.raises(ValueError, match="^C:"):
        _ssu_culprit_call(C=torch.randn(2, G * 2, N))


def test_ssd_bad_tables_leave_out_unwritten():
    """The issue's example: a chunk table ending at 28 of 29 tokens used to leave out[28] as it was (NaN)."""
    from mate.mamba.chunking import chunk_metadata

    meta = chunk_metadata([20, 9], 16)
    g = torch.Generator().manual_seed(3)
    x, B = torch.randn(29, H, P, generator=g), torch.randn(29, G, N, generator=g)
    out = torch.full_like(x, float("nan"))
    short = meta.cu_chunk_seqlens.clone()
    short[-1] = 28
    with pytest.raises(ValueError, match="^cu_chunk_seqlens:.*token count \\(29\\)"):
        ssd_combined_fwd_varlen(
            x, torch.rand(29, H), -torch.rand(H), B, B, 16, meta.cu_seqlens, short, meta.last_chunk_indices,
            meta.seq_idx, out, backend="torch",
        )  # fmt: skip
    assert out.isnan().all()


def _tl_stubbed(monkeypatch, module):
    """The TileLang launcher ``module`` on CPU tensors with its planner replaced by a sentinel: reaching it means
    the index-data check let the call through."""

    class Planned(Exception):
        pass

    def planned(*a, **k):
        raise Planned

    monkeypatch.setattr(module, "plan", planned)
    return Planned


@pytest.mark.parametrize("setting", [pytest.param("1", id="checked"), pytest.param("0", id="unchecked")])
def test_tilelang_launchers_check_index_data_in_debug_mode(monkeypatch, setting):
    from mate.mamba import settings
    from mate.mamba._contract.ssd import normalize_ssd
    from mate.mamba._tilelang import ssd as tl_ssd
    from mate.mamba._tilelang import ssu as tl_ssu

    kw, _ = _ssu_data_base()
    kw["state_batch_indices"] = _t([[0, 1], [8, 3]])  # slot 8 of 8
    ssu_call = normalize_ssu(**kw)
    ssd_kw = _ssd_base() | dict(seq_idx=_t([0, 2]))
    ssd_call = normalize_ssd(**ssd_kw)
    for module, call, name in ((tl_ssu, ssu_call, SBI), (tl_ssd, ssd_call, "seq_idx")):
        launcher = module.run
        Planned = _tl_stubbed(monkeypatch, module)
        with settings.override(MATE_CHECK_INPUTS=setting):
            if setting == "1":
                with pytest.raises(ValueError, match=f"^{name}:"):
                    launcher(call)
                # never while a graph is being captured (the check reads the tables back: a sync)
                monkeypatch.setattr(module, "is_capturing", lambda dev: True)
            with pytest.raises(Planned):
                launcher(call)


# ----------------------------------------------------------------------------------- backend choice


@pytest.mark.parametrize(
    "requested,device,installed,expected",
    [
        pytest.param("auto", "cpu", True, "torch", id="auto_cpu"),
        pytest.param("auto", "cuda", True, "tilelang", id="auto_cuda_tilelang"),
        pytest.param("auto", "cuda", False, "torch", id="auto_cuda_no_tilelang"),
        pytest.param("torch", "cuda", True, "torch", id="torch_on_cuda"),
        pytest.param("tilelang", "cuda", True, "tilelang", id="tilelang_cuda"),
        pytest.param("tilelang", "cpu", True, NotImplementedError, id="tilelang_cpu"),
        pytest.param("tilelang", "meta", True, NotImplementedError, id="tilelang_meta"),
        pytest.param("tilelang", "cuda", False, ModuleNotFoundError, id="tilelang_cuda_not_installed"),
        pytest.param("triton", "cuda", True, ValueError, id="unknown_backend"),
        pytest.param(None, "cpu", True, ValueError, id="backend_none"),
    ],
)
def test_resolve_backend(monkeypatch, requested, device, installed, expected):
    from mate.mamba import _dispatch as _backends

    monkeypatch.setattr(_backends, "tilelang_installed", lambda: installed)
    dev = torch.device(device)  # constructing a cuda/musa device object needs no device
    if isinstance(expected, str):
        assert _backends.resolve_backend(requested, dev) == expected
    else:
        with pytest.raises(expected) as info:
            _backends.resolve_backend(requested, dev)
        assert ("backend" in str(info.value)) or expected is not ValueError
        if expected is ValueError:
            assert str(info.value).startswith("backend:")
