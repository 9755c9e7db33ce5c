"""The eager fast path of ``ssd_combined_fwd_varlen`` on the GPU: a hit (the launch recipe: the kernels' tvm_ffi entries
called with the caller's tensors) writes exactly what the slow path writes, and can be captured in a CUDA graph.

The CPU tests (``tests/test_fast_path_ops.py``) prove that a hit passes the slow path's kernels the slow path's
arguments; these run the kernels, bit for bit (same kernels, same inputs). The shapes are Nemotron-H 8B's per rank
(TP1: the serial design; TP2 forced to the split one), the kernels ``prewarm_ssd_combined_fwd_varlen`` compiles.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu  # skipped without a device or TileLang (tests/conftest.py)

P, N, CHUNK = 64, 128, 128
BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32
SEQLENS = (1, 300, 1000, 64)


def build(form: str, seed: int = 0, heads: int = 128, groups: int = 8) -> dict:
    """``returned``: bench ssd's call (fp32 initial states, the final states returned); ``pool``: vLLM's mixer call
    (x/B/C rows of one conv1d output, dt a column slice, out a view, the final states into a strided page pool by
    slot)."""
    from mate.mamba.chunking import chunk_metadata

    g = torch.Generator(device="cpu").manual_seed(seed)
    dev = "cuda"
    H, G = heads, groups
    meta = chunk_metadata(list(SEQLENS), CHUNK, device=dev)
    T, batch = sum(SEQLENS), len(SEQLENS)
    conv = (torch.randn(T, H * P + 2 * G * N, generator=g) * 0.5).to(BF16).to(dev)
    proj = (torch.randn(T, H + 64, generator=g) - 2.0).to(dev)
    kw = dict(
        x=conv[:, : H * P].view(T, H, P), dt=proj[:, 64:], A=(-(torch.rand(H, generator=g) + 0.3)).to(dev),
        B=conv[:, H * P : H * P + G * N].view(T, G, N), C=conv[:, H * P + G * N :].view(T, G, N), chunk_size=CHUNK,
        cu_seqlens=meta.cu_seqlens, cu_chunk_seqlens=meta.cu_chunk_seqlens,
        last_chunk_indices=meta.last_chunk_indices, seq_idx=meta.seq_idx,
        out=torch.zeros(T, H * P, dtype=BF16, device=dev).view(T, H, P), D=torch.randn(H, generator=g).to(dev),
        dt_bias=(torch.randn(H, generator=g) * 0.5).to(dev), dt_softplus=True,
        initial_states=(torch.randn(batch, H, P, N, generator=g) * 0.5).to(dev), state_dtype=F32,
        backend="tilelang",
    )  # fmt: skip
    if form == "pool":
        slots, inner = batch + 3, H * P * N
        pages = torch.randn(slots, inner + 256, generator=g).to(dev)
        kw["final_states_out"] = pages[:, 128 : 128 + inner].view(slots, H, P, N)
        kw["final_state_indices"] = torch.tensor([4, 1, 6, 2], dtype=I32).to(dev)
        kw["_pages"] = pages
    return kw


def run(kw: dict):
    from mate.mamba import ssd_combined_fwd_varlen

    args = {k: v for k, v in kw.items() if not k.startswith("_")}
    names = ("x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices",
             "seq_idx")  # fmt: skip
    positional = [args.pop(n) for n in names]
    return ssd_combined_fwd_varlen(*positional, **args)


@pytest.fixture
def fresh():
    from mate.mamba import settings
    from mate.mamba import ssd as api

    api.FAST.clear()
    with settings.override(MATE_CHECK_INPUTS="0"):  # checking the index data keeps every call on the full path
        yield api
    api.FAST.clear()


FORMS = [
    pytest.param("returned", None, id="returned-tp1"),
    pytest.param("pool", None, id="vllm-pool-tp1"),
    pytest.param("pool", "split", id="vllm-pool-tp2-split"),
]


def _design(design):
    from contextlib import nullcontext

    from mate.mamba._tilelang import ssd_plan

    return nullcontext() if design is None else ssd_plan.forcing(design, runs=5)


def _shape(design):
    return dict(heads=64, groups=4) if design == "split" else {}


@pytest.mark.parametrize("form, design", FORMS)
def test_hit_writes_what_the_slow_path_writes(fresh, monkeypatch, form, design):
    api = fresh
    with _design(design):
        monkeypatch.setattr(api.FAST, "enabled", False)
        slow = build(form, **_shape(design))
        slow_states = run(slow)
        monkeypatch.setattr(api.FAST, "enabled", True)
        run(build(form, **_shape(design)))  # a miss: the slow path, then the recipe is remembered
        (launcher,) = api.FAST.cache.values()
        assert hasattr(launcher, "launch_object"), "expected a launch recipe"
        calls = []
        original = api.FAST.normalize
        monkeypatch.setattr(api.FAST, "normalize", lambda *a: calls.append(1) or original(*a))
        hit = build(form, **_shape(design))
        states = run(hit)
        torch.cuda.synchronize()
    assert not calls, "the second call of the form must be a hit"
    assert torch.equal(hit["out"], slow["out"])
    if form == "pool":
        assert states is None and slow_states is None
        assert torch.equal(hit["_pages"], slow["_pages"])  # the whole page buffer: written slots, untouched bytes
    else:
        assert torch.equal(states, slow_states)


def test_hits_call_the_direct_ffi_entry(fresh):
    api = fresh
    run(build("returned"))
    (launcher,) = api.FAST.cache.values()
    kernels = list(launcher.launch_object.kernels.values())
    assert kernels and all(not hasattr(k, "adapter") for k in kernels), "expected tvm_ffi functions, not wrappers"


@pytest.mark.parametrize("form, design", FORMS)
def test_a_hit_can_be_captured_on_a_side_stream(fresh, form, design):
    """A captured hit launches every kernel on the capture stream (tvm_ffi takes it from the first torch tensor of
    each launch: the split design's hand-over has only constants, kept as torch tensors)."""
    api = fresh
    with _design(design):
        run(build(form, **_shape(design)))
        run(build(form, **_shape(design)))  # the form is the latest: the captured call is a hit
        captured, eager = build(form, 3, **_shape(design)), build(form, 3, **_shape(design))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            states = run(captured)
        graph.replay()
        want = run(eager)
        torch.cuda.synchronize()
    assert torch.equal(captured["out"], eager["out"])
    if form == "pool":
        assert torch.equal(captured["_pages"], eager["_pages"])
    else:
        assert torch.equal(states, want)
    assert len(api.FAST.cache) == 1
