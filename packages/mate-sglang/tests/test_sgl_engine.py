"""MATE inside the real SGLang 0.5.23, as a deployment runs it: the hook armed at interpreter start-up by
``mate_sglang.pth`` (``MATE_SGLANG_ENABLE=1``), then SGLang's own server-argument parser, SSU backend registry and
backend construction, the dispatch function its Mamba2 mixer calls for decode / verify / EAGLE trees, and the prefill
its mixer imports, fed with metadata built by SGLang's own metadata code.

Run by ``nox -s engines``, which installs the released SGLang wheel ``--no-deps`` with the pure-Python modules its
imports need (``tools/engines/requirements.txt``); skipped where SGLang is not installed. SGLang's own Mamba kernels
are Triton, which needs a GPU, so the numbers are checked against the float64 recurrence of ``mate.mamba.testing``.
"""

from __future__ import annotations

import argparse
import importlib.util
from types import SimpleNamespace

import mate_sglang.hook as hook
import pytest
import torch
from mate.mamba import settings
from mate_sglang import ops

pytestmark = pytest.mark.engine

if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("sglang.srt") is None:
    pytest.skip("the real SGLang is installed by `nox -s engines`", allow_module_level=True)
if not settings.get("MATE_SGLANG_ENABLE"):  # run by hand without the switch: arm the hook as a launcher would
    hook.enable()

import sglang  # noqa: E402
import sglang.kernels.ops.mamba.triton_ops as triton_ops  # noqa: E402
import sglang.kernels.ops.mamba.triton_ops.ssu_dispatch as sd  # noqa: E402
import sglang.srt.layers.attention.mamba.mamba as mixer  # noqa: E402
from sglang.srt.layers.attention.mamba.mamba2_metadata import Mamba2Metadata  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from test_sgl_conformance import F32, oracle_prefill, oracle_ssu, prefill, rel, ssu_tensors, tol  # noqa: E402


def server_args(*argv: str) -> ServerArgs:
    """ServerArgs as ``sglang serve`` builds them from its command line (SGLang's parser and constructor)."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "unused", *argv]))


@pytest.fixture
def backend():
    """Restores SGLang's process-wide backend after a test that initialises it."""
    saved = sd._mamba_ssu_backend
    yield
    sd._mamba_ssu_backend = saved


def test_the_hook_knows_this_sglang_and_patched_every_path():
    assert sglang.__version__ == "0.5.23"
    st = hook.status()
    assert st["version"] == "0.5.23"
    assert st["ssu"] == "registered as ['mate', 'triton', 'flashinfer']"
    assert st["choices"] == "--mamba-backend choices ['triton', 'flashinfer', 'mate']"
    mate_cls = sd._BACKEND_REGISTRY["mate"]
    assert dict(sd._BACKEND_REGISTRY) == {"triton": mate_cls, "flashinfer": mate_cls, "mate": mate_cls}
    assert issubclass(mate_cls, sd.MambaSSUBackend)
    # the prefill the mixer calls, the package attribute it imports it from, and the defining module
    for where in (mixer, triton_ops, triton_ops.ssd_combined):
        assert where.mamba_chunk_scan_combined is ops.mamba_chunk_scan_combined, where.__name__
    # the decode: the mixer calls SGLang's dispatch function, which calls the initialised backend
    assert mixer.selective_state_update is sd.selective_state_update


@pytest.mark.parametrize("choice", [pytest.param("mate", id="mate"), pytest.param("triton", id="triton-default"),
                                    pytest.param("flashinfer", id="flashinfer")])  # fmt: skip
def test_mamba_backend_is_constructed_as_sglang_constructs_it(choice, backend):
    args = server_args("--mamba-backend", choice) if choice != "triton" else server_args()
    assert args.mamba_backend == choice
    sd.initialize_mamba_selective_state_update_backend(args)
    assert type(sd._mamba_ssu_backend) is sd._BACKEND_REGISTRY["mate"]
    assert sd._mamba_ssu_backend.name == "mate"


def test_unknown_mamba_backend_is_refused_by_sglangs_parser_with_mate_among_the_choices(capsys):
    with pytest.raises(SystemExit):
        server_args("--mamba-backend", "cuda")
    assert "'triton', 'flashinfer', 'mate'" in capsys.readouterr().err


def test_stochastic_rounding_flags_reach_the_backend(backend):
    """SGLang's --enable-mamba-cache-stochastic-rounding / --mamba-cache-philox-rounds, read by SGLang's own
    initialiser, construct MATE's backend with them (its calls then round the fp16 final stores)."""
    args = SimpleNamespace(mamba_backend="mate", enable_mamba_cache_stochastic_rounding=True,
                           mamba_cache_philox_rounds=7)  # fmt: skip
    sd.initialize_mamba_selective_state_update_backend(args)
    b = sd._mamba_ssu_backend
    assert type(b) is sd._BACKEND_REGISTRY["mate"] and b.enable_stochastic_rounding and b.cache_philox_rounds == 7


def mixer_decode_tensors(bs, T=None, H=4, P=4, N=8, G=2, S=8, seed=0):
    """The decode operands as SGLang's mixer builds them: A, dt, D, dt_bias per head, expanded to [.., P(, N)]
    by stride-0 views; x/B/C row views; fp32 state pool."""
    t = ssu_tensors(bs, T=T, H=H, P=P, N=N, G=G, S=S, seed=seed, io=torch.bfloat16)
    g = torch.Generator().manual_seed(seed + 100)
    lead = (bs,) if T is None else (bs, T)
    t.A = (-torch.rand(H, generator=g) - 0.1)[:, None, None].expand(-1, P, N)
    t.dt = (torch.randn(*lead, H, generator=g) * 0.5).to(torch.bfloat16)[..., None].expand(*lead, H, P)
    t.dt_bias = (torch.rand(H, generator=g) * 0.2)[:, None].expand(-1, P)
    t.D = torch.randn(H, generator=g)[:, None].expand(-1, P)
    return t


def test_decode_through_sglangs_dispatch(backend):
    sd.initialize_mamba_selective_state_update_backend(server_args())
    t = mixer_decode_tensors(4, seed=1)
    pool0 = t.state.clone()
    idx = torch.tensor([6, -1, 0, 3], dtype=torch.int32)  # -1: SGLang's pad slot
    mixer.selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, z=None, dt_bias=t.dt_bias,
                                 dt_softplus=True, state_batch_indices=idx, out=t.out)  # fmt: skip
    t.z = None
    exp = oracle_ssu(t, pool0, state_batch_indices=idx)
    assert exp.written == {6, 0, 3}
    torch.testing.assert_close(t.out.double(), exp.y64, **tol(torch.bfloat16))
    torch.testing.assert_close(t.state.double(), exp.state.double(), **tol(torch.bfloat16))


@pytest.mark.parametrize("tree", [pytest.param(False, id="mtp-verify"), pytest.param(True, id="eagle-tree")])
def test_verify_through_sglangs_dispatch(tree, backend):
    """The mixer's target-verify call: dense [bs, T, H, P], disable_state_update, the intermediate buffer indexed
    by int32 intermediate_state_indices, and for EAGLE trees SGLang's int64 retrieve_parent_token."""
    sd.initialize_mamba_selective_state_update_backend(server_args("--mamba-backend", "mate"))
    bs, T = 3, 4
    t = mixer_decode_tensors(bs, T=T, seed=2)
    pool0 = t.state.clone()
    src = torch.tensor([5, 2, -1], dtype=torch.int32)
    ibuf_idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    parent = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2], [-1, 0, 0, 0]], dtype=torch.int64) if tree else None
    buf = torch.zeros(bs, T, *t.state.shape[1:])
    kw = dict(state_batch_indices=src, disable_state_update=True, cache_steps=T, retrieve_parent_token=parent,
              intermediate_state_indices=ibuf_idx)  # fmt: skip
    mixer.selective_state_update(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, z=None, dt_bias=t.dt_bias, dt_softplus=True,
                                 out=t.out, intermediate_states_buffer=buf, **kw)  # fmt: skip
    t.z = None
    exp = oracle_ssu(t, pool0, intermediate_states_buffer=torch.zeros_like(buf), **kw)
    assert torch.equal(t.state, pool0)
    torch.testing.assert_close(t.out.double(), exp.y64, **tol(torch.bfloat16))
    torch.testing.assert_close(buf.double(), exp.ibuf.double(), **tol(torch.bfloat16))
    assert buf[1].abs().sum() == 0  # the pad row's buffer row stays untouched


def test_prefill_as_the_mixer_calls_it_with_track_states():
    """The mixer's extend call: [1, T, H, P] views, pseudo-chunk metadata from SGLang's own Mamba2Metadata,
    varlen and track states returned, ``out`` written in place."""
    lens, chunk = [5, 37, 20], 16
    c = prefill(lens, seed=21)
    c.z = None
    idx, off = Mamba2Metadata._query_start_loc_to_chunk_indices_offsets(c.cu_t, chunk, c.T)
    tsid = torch.tensor([1, 2, 0], dtype=torch.int64)
    tend = torch.tensor([32, 62, 5], dtype=torch.int64)
    states, varlen, track = mixer.mamba_chunk_scan_combined(
        c.x, c.dt, c.A, c.B, c.C, chunk_size=chunk, D=c.D, z=None, dt_bias=c.dt_bias, seq_idx=c.seq_idx,
        chunk_indices=idx, chunk_offsets=off, cu_seqlens=c.cu_t, initial_states=c.init, return_varlen_states=True,
        return_final_states=False, return_track_states=True, track_seq_idx=tsid, track_end_locs=tend,
        dt_softplus=True, dt_limit=(0.0, float("inf")), out=c.out, state_dtype=F32,
    )  # fmt: skip
    e, after = oracle_prefill(c, bounds=[32])
    assert rel(c.out[0], e.y) < 1e-5 and rel(varlen, e.final) < 1e-5
    assert rel(track[0, 0], after[32]) < 1e-5 and rel(track[0, 1], e.final[2]) < 1e-5
    assert rel(track[0, 2], e.final[0]) < 1e-5
    assert states.shape[:2] == (1, 4)
