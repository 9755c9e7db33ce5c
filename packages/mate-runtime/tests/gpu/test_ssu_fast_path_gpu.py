"""The eager fast path of ``selective_state_update`` on the GPU: a hit (replayed launch recipe, direct tvm_ffi
entry) writes exactly what the slow path writes, and can be captured in a CUDA graph.

The CPU tests (``tests/test_ssu_fast_path.py``) prove that a hit produces the slow path's kernel key and
arguments; these check the same kernels on a device, bit for bit (same kernel, same inputs).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu  # skipped without a device or TileLang (tests/conftest.py)

H, P, N, G = 8, 64, 128, 2
BF16, F32, I32 = torch.bfloat16, torch.float32, torch.int32


def build(form: str, seed: int = 0) -> dict:
    """vLLM's decode (flat tables) or MTP 3 (cu_seqlens, accepted counts, 2-D tables) call, on CUDA."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dev = "cuda"
    batch, T = (4, 1) if form == "decode" else (3, 3)
    rows = batch * T
    slots = 2 * rows + 2
    inner = H * P * N
    pages = (torch.randn(slots, inner + 512, generator=g) * 0.5).to(BF16).to(dev)
    state = pages[:, 256 : 256 + inner].view(slots, H, P, N)
    conv = torch.randn(rows, H * P + 2 * G * N, generator=g).to(BF16).to(dev)
    x = conv[:, : H * P].unflatten(-1, (H, P))
    B = conv[:, H * P : H * P + G * N].unflatten(-1, (G, N))
    C = conv[:, H * P + G * N :].unflatten(-1, (G, N))
    dt = (torch.randn(rows, H, generator=g) * 0.5).to(dev).unsqueeze(-1).expand(rows, H, P)
    A = (-(torch.rand(H, generator=g) + 0.5)).to(dev).view(H, 1, 1).expand(H, P, N)
    D = torch.randn(H, generator=g).to(dev).unsqueeze(1).expand(H, P)
    dt_bias = (torch.randn(H, generator=g) * 0.3).to(dev).unsqueeze(1).expand(H, P)
    z = torch.randn(rows, H, P, generator=g).to(BF16).to(dev)
    out = torch.zeros(rows, H, P, dtype=BF16, device=dev)
    kw = dict(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, dt_softplus=True, out=out,
              pad_slot_id=0, backend="tilelang")  # fmt: skip
    src = torch.arange(1, rows + 1, dtype=I32)
    if form == "decode":
        kw.update(state_batch_indices=src.to(dev), dst_state_batch_indices=(src + rows).to(dev))
    else:
        kw.update(
            state_batch_indices=src.view(batch, T).to(dev),
            dst_state_batch_indices=(src + rows).view(batch, T).to(dev),
            cu_seqlens=torch.arange(0, rows + 1, T, dtype=I32).to(dev),
            num_accepted_tokens=torch.tensor([1, 3, 2], dtype=I32).to(dev),
        )
    kw["_pages"] = pages
    return kw


def run(kw: dict):
    from mate.mamba import selective_state_update

    args = {k: v for k, v in kw.items() if not k.startswith("_")}
    state, x, dt, A, B, C, D = (args.pop(n) for n in ("state", "x", "dt", "A", "B", "C", "D"))
    return selective_state_update(state, x, dt, A, B, C, D, **args)


@pytest.fixture
def fresh():
    from mate.mamba import settings
    from mate.mamba import ssu as api

    api.clear_fast_path_cache()
    with settings.override(MATE_CHECK_INPUTS="0"):  # checking the index data keeps every call on the full path
        yield api
    api.clear_fast_path_cache()


@pytest.mark.parametrize("form", ["decode", "mtp"])
def test_hit_writes_what_the_slow_path_writes(fresh, form, monkeypatch):
    api = fresh
    monkeypatch.setattr(api.FAST, "enabled", False)
    slow = build(form)
    run(slow)
    monkeypatch.setattr(api.FAST, "enabled", True)
    run(build(form))  # miss: slow path, then the recipe is remembered
    assert any(v is not api.FAST.SLOW for v in api.FAST.cache.values())
    calls = []
    original = api.normalize_ssu
    monkeypatch.setattr(api, "normalize_ssu", lambda *a, **k: calls.append(1) or original(*a, **k))
    hit = build(form)
    run(hit)
    torch.cuda.synchronize()
    assert not calls, "the third call must be a hit"
    assert torch.equal(hit["out"], slow["out"])
    assert torch.equal(hit["_pages"], slow["_pages"])  # the whole page buffer: written slots and untouched bytes


def test_hits_call_the_direct_ffi_entry(fresh):
    api = fresh
    run(build("decode"))
    recipe = next(v for v in api.FAST.cache.values() if v is not api.FAST.SLOW).recipe  # (its launch's)
    kernels = list(recipe.kernels.values())
    assert kernels
    assert all(not hasattr(k, "adapter") for k in kernels), "expected the tvm_ffi function, not the wrapper"


def test_a_hit_can_be_captured(fresh):
    api = fresh
    run(build("mtp"))
    run(build("mtp"))  # the recipe exists: the captured call is a hit
    captured, eager = build("mtp", seed=3), build("mtp", seed=3)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(captured)
    g.replay()
    run(eager)
    torch.cuda.synchronize()
    assert torch.equal(captured["out"], eager["out"])
    assert torch.equal(captured["_pages"], eager["_pages"])
    assert len(api.FAST.cache) == 1
