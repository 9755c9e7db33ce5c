"""``materialize_replayed_layers`` (FlashInfer's ``replayssm_materialize``: pools named by per-layer address tables)
against a plain loop of ``materialize_replayed_state`` on the reference backend, one layer at a time.

Each case builds several layers, each with its own pools: its own slot count, and slot strides padded apart
(the tables carry them), random states, rings and A; one request table shared by the layers, with sentinel
slots, a prefix of 0 (an exact copy) and of ``max_window``, and ``active_request_indices`` selecting some
requests out of order before its ``-1`` tail. The call under test runs on one copy of every pool, the loop on
another; every pool is then compared: exactly for the reference backend (the same recurrence), within the
state format's rounding for a kernel (as ``test_materialize_kernels.py`` compares), the rings, A and every
untouched slot bit-identical. With ``rounds`` the call rounds stochastically (``rand_seed``) and the loop gives
layer ``l`` the key FlashInfer derives for it (``layer_seed``): a kernel then stores >= 99.9 % of the written
numbers bit-identical to the loop's (the same random bits; a number differs only where the fp32 values do).
``tests/test_materialize_layers.py`` runs the reference cases on the CPU and
``tests/test_materialize_layers_emulated.py`` the kernel's generated code on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytestmark = pytest.mark.gpu

from mate.mamba import materialize_replayed_layers, materialize_replayed_state  # noqa: E402
from mate.mamba._reference.rounding import layer_seed  # noqa: E402

BF16, F16, F32, I8, I16, F8 = torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.int16, torch.float8_e4m3fn
QMAX = {I16: 32767.0, I8: 127.0, F8: 448.0}


@dataclass(frozen=True)
class LCase:
    state: torch.dtype = BF16
    a: torch.dtype = F32
    H: int = 4
    ratio: int = 2
    P: int = 64
    N: int = 128
    L: int = 17
    window: int = 16
    slots: tuple = (9, 12, 10)  # per layer
    batch: int = 4
    pad: int = -1
    rounds: int = 0  # > 0: stochastic rounding (fp16, int8, fp8) with rand_seed SEED


SEED = 987


CASES = [
    pytest.param(LCase(), id="bf16-three-layers"),
    pytest.param(LCase(state=F32, a=BF16, pad=7), id="fp32-bf16-A-pad-7"),
    pytest.param(LCase(state=F16, a=F16, ratio=1, P=16, N=32, L=9, window=8), id="fp16-small"),
    pytest.param(LCase(state=F8, H=2, slots=(8, 11)), id="fp8-scaled"),
    pytest.param(LCase(state=I8, H=2, slots=(9,)), id="int8-scaled-one-layer"),
    pytest.param(LCase(state=I16, H=2, P=16, N=32), id="int16-scaled"),
    pytest.param(LCase(state=F16, a=F16, ratio=1, P=16, N=32, L=9, window=8, rounds=10), id="fp16-sr"),
    pytest.param(LCase(state=I8, H=2, slots=(9, 12), rounds=10), id="int8-sr-two-layers"),
    pytest.param(LCase(state=F8, H=2, slots=(8, 11, 10), rounds=5), id="fp8-sr-rounds5"),
]


def _padded(shape, dtype, pad: int, dev, fill):
    """A tensor of ``shape`` whose slots (dim 0) lie ``pad`` elements apart beyond their size, filled by ``fill``."""
    inner = 1
    for n in shape[1:]:
        inner *= n
    store = torch.zeros(shape[0], inner + pad, dtype=dtype, device=dev)
    view = store[:, :inner].unflatten(1, shape[1:])
    view.copy_(fill(shape).to(dtype))
    return store, view


def build(c: LCase, seed: int = 0, dev: str = "cuda"):
    """(layers, tables): per layer its pools (the padded stores and their views); the FlashInfer tables."""
    g = torch.Generator(device=dev).manual_seed(seed)
    H, P, N, L, G, b = c.H, c.P, c.N, c.L, c.H // c.ratio, c.batch

    def rand(shape):
        return torch.randn(*shape, generator=g, device=dev)

    layers = []
    for i, S in enumerate(c.slots):
        pad = 8 * (i + 1)  # each layer its own slot stride
        lay = {}
        truth = rand((S, H, P, N)) * 0.5
        if c.state in QMAX:
            scale = truth.abs().amax(-1) / QMAX[c.state]
            q = truth / scale.unsqueeze(-1)
            q = q if c.state == F8 else q.round()
            lay["state"] = _padded((S, H, P, N), c.state, pad, dev, lambda s, q=q: q)
            lay["scale"] = _padded((S, H, P), F32, pad, dev, lambda s, v=scale: v)
        else:
            lay["state"] = _padded((S, H, P, N), c.state, pad, dev, lambda s, t=truth: t)
        lay["x"] = _padded((S, H, L, P), BF16, pad, dev, rand)
        lay["B"] = _padded((S, G, L, N), BF16, pad, dev, rand)
        lay["dt"] = _padded((S, H, L), F32, pad, dev, lambda s: torch.rand(*s, generator=g, device=dev) * 0.3)
        A = -(torch.rand(H, generator=g, device=dev) + 0.3)
        lay["A"] = (A.to(c.a), A.to(c.a))
        layers.append(lay)
    src = torch.full((len(c.slots), b), c.pad, dtype=torch.int32)
    dst = torch.full_like(src, c.pad)
    for i, S in enumerate(c.slots):
        perm = [s for s in torch.randperm(S, generator=torch.Generator().manual_seed(seed + i)).tolist() if s != c.pad]
        src[i], dst[i] = torch.tensor(perm[:b]), torch.tensor(perm[b : 2 * b])
    src[0, 1] = c.pad  # a sentinel source, and a sentinel destination: nothing written for that layer
    dst[-1, 2] = c.pad
    ring_start = torch.randint(0, L, (b,), generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    prefix = torch.randint(1, c.window + 1, (b,), generator=torch.Generator().manual_seed(seed + 1)).to(torch.int32)
    prefix[0], prefix[3], ring_start[3] = 0, c.window, L - 2  # an exact copy; a whole window, wrapping
    active = torch.full((b,), -1, dtype=torch.int32)
    active[:3] = torch.tensor([3, 0, 2])  # request 1 not selected
    tables = dict(src_slots=src, dst_slots=dst, ring_start=ring_start, replay_prefix_len=prefix,
                  active_request_indices=active)  # fmt: skip
    return layers, {k: v.to(dev) for k, v in tables.items()}


def _clone(layers):
    """A copy of every pool, with the same padded layout."""
    out = []
    for lay in layers:
        new = {}
        for name, (store, view) in lay.items():
            s2 = store.clone()
            new[name] = (s2, s2.as_strided(view.shape, view.stride(), view.storage_offset()))
        out.append(new)
    return out


def pointer_tables(layers, c: LCase) -> dict:
    """FlashInfer's per-layer tables over the pools' views."""
    dev = layers[0]["state"][1].device

    def table(values):
        return torch.tensor(values, dtype=torch.int64, device=dev)

    def of(name):
        return [lay[name][1] for lay in layers]

    scales = [lay["scale"][1] if "scale" in lay else None for lay in layers]
    return dict(
        state_ptrs=table([t.data_ptr() for t in of("state")]),
        state_slot_strides=table([t.stride(0) for t in of("state")]),
        x_cache_ptrs=table([t.data_ptr() for t in of("x")]),
        x_cache_slot_strides=table([t.stride(0) for t in of("x")]),
        B_cache_ptrs=table([t.data_ptr() for t in of("B")]),
        B_cache_slot_strides=table([t.stride(0) for t in of("B")]),
        dt_cache_ptrs=table([t.data_ptr() for t in of("dt")]),
        dt_cache_slot_strides=table([t.stride(0) for t in of("dt")]),
        A_ptrs=table([t.data_ptr() for t in of("A")]),
        state_scale_ptrs=table([0 if s is None else s.data_ptr() for s in scales]),
        state_scale_slot_strides=table([0 if s is None else s.stride(0) for s in scales]),
    )


def config(c: LCase, dev="cuda") -> dict:
    """The call's keywords (``rand_seed`` on ``dev``)."""
    kw = dict(state_dtype=c.state, input_dtype=BF16, matrixA_dtype=c.a, dim=c.P, dstate=c.N, num_heads=c.H,
              heads_per_group=c.ratio, max_window=c.window, ring_buffer_len=c.L, pad_slot_id=c.pad)  # fmt: skip
    if c.rounds:
        kw.update(rand_seed=torch.tensor([SEED], dtype=torch.int64, device=dev), philox_rounds=c.rounds)
    return kw


def layered(layers, tables, c: LCase, backend: str) -> None:
    kw = config(c, tables["src_slots"].device)
    materialize_replayed_layers(*pointer_tables(layers, c).values(), *tables.values(), **kw, backend=backend)


def _chosen(tables) -> list:
    """The selected requests: the entries of ``active_request_indices`` before its first -1."""
    active = tables["active_request_indices"].tolist()
    return active[: active.index(-1)] if -1 in active else active


def loop(layers, tables, c: LCase) -> None:
    """The plain per-layer loop: ``materialize_replayed_state`` (reference) over each layer's selected requests
    (with ``rounds``, layer ``i`` keyed ``layer_seed(SEED, i)``)."""
    dev = tables["ring_start"].device
    index = torch.tensor(_chosen(tables), dtype=torch.int64, device=dev)
    for i, lay in enumerate(layers):
        sr = {}
        if c.rounds:
            sr = dict(rand_seed=torch.tensor([layer_seed(SEED, i)], dtype=torch.int64, device=dev),
                      philox_rounds=c.rounds)  # fmt: skip
        materialize_replayed_state(
            lay["state"][1], lay["x"][1], lay["B"][1], lay["dt"][1], lay["A"][1], tables["ring_start"][index],
            tables["replay_prefix_len"][index], tables["src_slots"][i][index], tables["dst_slots"][i][index],
            state_scale=lay["scale"][1] if "scale" in lay else None, pad_slot_id=c.pad, backend="torch", **sr,
        )  # fmt: skip


def check(c: LCase, *, run=None, exact: bool = False, seed: int = 0, dev: str = "cuda") -> None:
    """``run(layers, tables, c)`` (default: the TileLang backend) against :func:`loop`, compared as the module
    docstring says (``exact``: bit-identical everywhere)."""
    layers, tables = build(c, seed, dev)
    mine, ref = _clone(layers), _clone(layers)
    (run or (lambda lay, t, c: layered(lay, t, c, "tilelang")))(mine, tables, c)
    loop(ref, tables, c)
    if dev == "cuda":
        torch.cuda.synchronize()
    assert any(not torch.equal(r["state"][0], lay["state"][0]) for r, lay in zip(ref, layers, strict=True))
    for i, (m, r) in enumerate(zip(mine, ref, strict=True)):
        for name in ("x", "B", "dt", "A"):
            assert torch.equal(m[name][0], layers[i][name][0]), f"layer {i}: {name} was written"
        for name in ("state", "scale"):
            if name not in m:
                continue
            got, want = m[name][0].float(), r[name][0].float()
            if exact or c.state == F32 and name == "state":
                tol = 1e-5 if not exact else 0.0
            else:
                # a 2-byte state: one rounding step; a quantised one: a step of its scale (and 1e-4 on scales)
                tol = 1e-4 if name == "scale" else (2.0 if c.state in QMAX else 2e-2)
            assert torch.allclose(got, want, atol=tol, rtol=tol), (
                f"layer {i} {name}: max |diff| {(got - want).abs().max().item()}"
            )
        if c.rounds:  # the written numbers: the same random bits as the loop's
            src, dst = tables["src_slots"][i].tolist(), tables["dst_slots"][i].tolist()
            written = [dst[b] for b in _chosen(tables) if c.pad not in (src[b], dst[b])]
            equal = m["state"][1][written].view(torch.uint8) == r["state"][1][written].view(torch.uint8)
            assert float(equal.float().mean()) >= 0.999, f"layer {i}: stochastically rounded numbers differ"


@pytest.mark.parametrize("c", CASES)
def test_tilelang_layers_match_per_layer_loop(c):
    check(c)


def test_tilelang_layers_capture_in_a_graph():
    """The kernel reads the tables on the device: a captured call replays with new table contents."""
    c = LCase()
    layers, tables = build(c)
    mine, ref = _clone(layers), _clone(layers)
    layered(mine, tables, c, "tilelang")  # compiled before capture
    mine = _clone(layers)
    ptr = pointer_tables(mine, c)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        materialize_replayed_layers(*ptr.values(), *tables.values(), **config(c), backend="tilelang")
    tables["replay_prefix_len"].fill_(3)  # new metadata, read at replay
    graph.replay()
    torch.cuda.synchronize()
    loop(ref, tables, c)
    for m, r in zip(mine, ref, strict=True):
        assert torch.allclose(m["state"][0].float(), r["state"][0].float(), atol=2e-2, rtol=2e-2)


def test_reference_layers_refuse_graph_capture():
    c = LCase()
    layers, tables = build(c)
    ptr = pointer_tables(layers, c)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(NotImplementedError, match="graph capture"), torch.cuda.graph(graph):
        materialize_replayed_layers(*ptr.values(), *tables.values(), **config(c), backend="torch")
