"""MATE beside the real FlashInfer (``flashinfer-python`` 0.7.2): ``flashinfer.mamba.selective_state_update`` is
MATE's while the rest of FlashInfer stays real and importable, and MATE's function, called through FlashInfer's
package with FlashInfer's argument forms on CPU tensors, gives the float64 recurrence's numbers
(``mate.mamba.testing``, through ``test_fi_conformance``'s helpers).

Marked ``engine``: they run where the real engines are installed (each test skips, saying why, where
``flashinfer`` with a ``flashinfer-python`` dist-info does not import). Each runs in a fresh interpreter that
starts as the ``.pth`` line starts every interpreter of the environment.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
RUNTIME_SRC = TESTS.parents[1] / "mate-runtime" / "src"
KERNELS_SRC = TESTS.parents[1] / "mate-kernels" / "src"
PTH = (SRC / "mate_flashinfer_compat.pth").read_text().strip()

pytestmark = pytest.mark.engine


def _env(mode):
    env = {k: v for k, v in os.environ.items() if k != "MATE_FLASHINFER_COMPAT"}
    if mode is not None:
        env["MATE_FLASHINFER_COMPAT"] = mode
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(RUNTIME_SRC), str(KERNELS_SRC), str(TESTS), *inherited])
    return env


@functools.cache
def real_flashinfer_skip_reason() -> str | None:
    try:
        version = importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return "flashinfer-python is not installed"
    r = subprocess.run(
        [sys.executable, "-c", "import flashinfer, flashinfer.mamba"],
        env=_env("off"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"flashinfer-python {version} is installed but does not import here: {last}"
    return None


@pytest.fixture(autouse=True)
def _needs_real_flashinfer():
    if (reason := real_flashinfer_skip_reason()) is not None:
        pytest.skip(reason)


def run(code, mode=None):
    prelude = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(name)s %(levelname)s %(message)s')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", f"{PTH}\n{prelude}{textwrap.dedent(code)}"],
        env=_env(mode),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("mode", [pytest.param(None, id="unset"), pytest.param("auto", id="auto")])
def test_selective_state_update_is_mates_and_the_rest_of_flashinfer_is_real(mode):
    out = run(
        """
        from flashinfer.mamba import selective_state_update as fi_ssu  # vLLM's FlashInferSSUBackend import
        import flashinfer, flashinfer.mamba as fm
        import mate_flashinfer_compat as m
        from mate_flashinfer_compat.mamba import selective_state_update as mate_ssu
        assert fi_ssu is mate_ssu and fm.selective_state_update is mate_ssu
        import importlib, inspect
        real = importlib.import_module("flashinfer.mamba.selective_state_update").selective_state_update
        assert real is not mate_ssu and real.__module__ == "flashinfer.mamba.selective_state_update"
        assert list(inspect.signature(real).parameters) == list(inspect.signature(mate_ssu).parameters)
        cake = importlib.import_module("flashinfer.mamba.cake_selective_state_update")
        assert cake.selective_state_update is real  # cake_selective_state_update keeps calling FlashInfer's
        for name, module in (("checkpointing_ssu", "flashinfer.mamba.checkpointing_ssu"),
                             ("allocate_checkpointing_ssu_scratch", "flashinfer.mamba.checkpointing_ssu"),
                             ("replayssm_materialize", "flashinfer.mamba.replayssm_materialize"),
                             ("cake_selective_state_update", "flashinfer.mamba.cake_selective_state_update")):
            assert getattr(fm, name).__module__ == module, (name, getattr(fm, name).__module__)
        from flashinfer.mamba.checkpointing_ssu import checkpointing_ssu  # vLLM's checkpointing import
        from flashinfer import BatchDecodeWithPagedKVCacheWrapper  # attention stays FlashInfer's
        assert checkpointing_ssu is fm.checkpointing_ssu
        assert BatchDecodeWithPagedKVCacheWrapper.__module__.startswith("flashinfer.")
        assert not getattr(flashinfer, "__mate_alias__", False) and not getattr(fm, "__mate_alias__", False)
        print("STATUS", m.status()["flashinfer"], m.status()["flashinfer.mamba"])
        """,
        mode,
    )
    assert "STATUS FlashInfer {'selective_state_update': 'mate'}" in out, out
    reports = [line for line in out.splitlines() if line.startswith("mate_flashinfer_compat ")]
    assert len(reports) == 1 and " INFO " in reports[0], out
    assert "flashinfer.mamba.selective_state_update is MATE's inside FlashInfer 0.7.2" in reports[0], out


def test_flashinfer_call_forms_give_the_recurrences_numbers():
    """Through ``flashinfer.mamba.selective_state_update``: SGLang's FlashInfer backend decode call (1-D slots,
    -1 pad, ``rand_seed=None``, ``philox_rounds=10``, ``cache_steps=0``), vLLM's decode call (null block 0, a
    destination table) and packed MTP call (``[N, 1 + K]`` tables, ``num_accepted_tokens``), SGLang's dense
    verify (``disable_state_update=True``, 5-D intermediate buffer), and the unserved options named."""
    out = run(
        """
        import torch
        import flashinfer.mamba as fm
        from mate_flashinfer_compat.mamba import selective_state_update as mate_ssu
        from test_fi_conformance import BF16, F32, check, expect, tensors
        ssu = fm.selective_state_update
        assert ssu is mate_ssu

        # SGLang FlashInferSSUBackend, decode
        t = tensors(rows=4, S=7, H=4, G=2, io=BF16, weight=F32, seed=1)
        pool0 = t.state.clone()
        src = torch.tensor([6, -1, 2, 0], dtype=torch.int32)
        out = torch.empty_like(t.x)
        e = expect(t, z=t.z, state_batch_indices=src, pad_slot_id=-1, final_write_to_dst=True)
        y = ssu(t.state, t.x, t.dt, t.A, t.B, t.C, D=t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
                state_batch_indices=src, pad_slot_id=-1, out=out, disable_state_update=False,
                intermediate_states_buffer=None, cache_steps=0, intermediate_state_indices=None, rand_seed=None,
                philox_rounds=10)
        assert y is out
        check(t, y, e, pool0, BF16)
        assert e.written == {6, 2, 0}

        # vLLM FlashInferSSUBackend, decode: flat src/dst, null block 0
        t = tensors(rows=3, S=8, H=4, G=2, seed=2)
        pool0 = t.state.clone()
        src = torch.tensor([3, 0, 5], dtype=torch.int32)
        dst = torch.tensor([4, 0, 6], dtype=torch.int32)
        out = torch.empty_like(t.x)
        e = expect(t, state_batch_indices=src, dst_state_batch_indices=dst, pad_slot_id=0, final_write_to_dst=True)
        ssu(t.state, t.x, t.dt, t.A, t.B, t.C, D=t.D, z=None, dt_bias=t.dt_bias, dt_softplus=True,
            state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=None, num_accepted_tokens=None,
            cache_steps=0, pad_slot_id=0, out=out, rand_seed=None, philox_rounds=10, algorithm="auto")
        check(t, out, e, pool0)
        assert e.written == {4, 6}

        # vLLM FlashInferSSUBackend, MTP: packed rows, [N, 1 + K] tables, accepted tokens, cache_steps = 1 + K
        cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
        src = torch.tensor([[1, 2, 3], [0, 0, 0], [4, 5, 6]], dtype=torch.int32)
        dst = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 0, 15]], dtype=torch.int32)
        acc = torch.tensor([2, 1, 3], dtype=torch.int32)
        t = tensors(rows=7, S=16, H=4, G=2, io=BF16, weight=F32, seed=8)
        pool0 = t.state.clone()
        out = torch.empty_like(t.x)
        e = expect(t, z=t.z, state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu,
                   num_accepted_tokens=acc, pad_slot_id=0)
        ssu(t.state, t.x, t.dt, t.A, t.B, t.C, D=t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
            state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu, num_accepted_tokens=acc,
            cache_steps=src.size(-1), pad_slot_id=0, out=out, rand_seed=None, philox_rounds=10, algorithm="auto")
        check(t, out, e, pool0, BF16)
        assert e.written == {7, 8, 9, 13, 15}

        # SGLang FlashInferSSUBackend, dense verify: buffer [N, T, H, P, N], pool untouched
        b, T = 3, 4
        t = tensors(rows=b * T, S=6, H=4, G=2, seed=7)
        pool0 = t.state.clone()
        d4 = lambda v: v.reshape(b, T, *v.shape[1:])
        src = torch.tensor([5, -1, 1], dtype=torch.int32)
        buf = torch.zeros(4, T, 4, 4, 8)
        idx = torch.tensor([3, 0, 1], dtype=torch.int32)
        out = torch.empty(b, T, 4, 4)
        e = expect(t, x=d4(t.x), dt=d4(t.dt), B=d4(t.B), C=d4(t.C), z=d4(t.z), state_batch_indices=src,
                   intermediate_states_buffer=buf, intermediate_state_indices=idx, cache_steps=T)
        ssu(t.state, d4(t.x), d4(t.dt), t.A, d4(t.B), d4(t.C), D=t.D, z=d4(t.z), dt_bias=t.dt_bias,
            dt_softplus=True, state_batch_indices=src, pad_slot_id=-1, out=out, disable_state_update=True,
            intermediate_states_buffer=buf, cache_steps=T, intermediate_state_indices=idx, rand_seed=None,
            philox_rounds=10)
        check(t, out, e, pool0)
        torch.testing.assert_close(buf.double(), e.ibuf.double(), atol=1e-4, rtol=1e-4)
        assert torch.equal(t.state, pool0)

        # what MATE does not serve is named
        t = tensors(rows=2, S=3, seed=9)
        for kw, name, error in ((dict(rand_seed=torch.zeros(1, dtype=torch.int64)), "rand_seed", NotImplementedError),
                                (dict(state_scale=torch.ones(3, 2, 4)), "state_scale", ValueError)):
            try:
                ssu(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, **kw)
            except error as err:
                assert name in str(err), err
            else:
                raise AssertionError(name)
        print("ok")
        """
    )
    assert "ok" in out


@pytest.mark.parametrize("engine", [pytest.param("sglang", id="sglang"), pytest.param("vllm", id="vllm")])
def test_the_engines_own_flashinfer_backend_runs_mate(engine):
    """The engine's real ``FlashInferSSUBackend`` (SGLang 0.5.23's / vLLM 0.33's ``ssu_dispatch``), constructed as
    the engine constructs it, takes ``flashinfer.mamba.selective_state_update`` and so calls MATE: decode and
    verify (SGLang) or decode and packed MTP (vLLM) give the recurrence's numbers. Skips where the engine does
    not import."""
    module = {
        "sglang": "sglang.kernels.ops.mamba.triton_ops.ssu_dispatch",
        "vllm": "vllm.model_executor.layers.mamba.ops.ssu_dispatch",
    }[engine]
    out = run(
        f"""
        import importlib, torch
        try:
            sd = importlib.import_module({module!r})
        except Exception as e:  # noqa: BLE001
            print("SKIP", repr(e)); raise SystemExit(0)
        from mate_flashinfer_compat.mamba import selective_state_update as mate_ssu
        from test_fi_conformance import BF16, F32, check, expect, tensors
        ENGINE = {engine!r}
        """
        + """
        if ENGINE == "sglang":
            backend = sd.FlashInferSSUBackend(enable_stochastic_rounding=False, cache_philox_rounds=0)
        else:
            from vllm.config.mamba import MambaConfig
            backend = sd.FlashInferSSUBackend(MambaConfig())
        assert backend._kernel is mate_ssu, backend._kernel
        t = tensors(rows=4, S=9, H=4, G=2, io=BF16, weight=F32, seed=31)
        pool0 = t.state.clone()
        out = torch.empty_like(t.x)
        if ENGINE == "sglang":  # decode: 1-D slots, -1 pad
            src = torch.tensor([6, -1, 2, 0], dtype=torch.int32)
            e = expect(t, z=t.z, state_batch_indices=src, pad_slot_id=-1, final_write_to_dst=True)
            backend(t.state, t.x, t.dt, t.A, t.B, t.C, D=t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
                    state_batch_indices=src, pad_slot_id=-1, out=out)
        else:  # decode: flat src / dst, null block 0
            src = torch.tensor([3, 0, 5, 7], dtype=torch.int32)
            dst = torch.tensor([4, 0, 6, 8], dtype=torch.int32)
            e = expect(t, z=t.z, state_batch_indices=src, dst_state_batch_indices=dst, pad_slot_id=0,
                       final_write_to_dst=True)
            backend(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, dt_softplus=True,
                    state_batch_indices=src, dst_state_batch_indices=dst, null_block_id=0, out=out)
        check(t, out, e, pool0, BF16)

        if ENGINE == "sglang":  # verify: dense 4-D, disable_state_update, 5-D intermediate buffer
            b, T = 2, 3
            t = tensors(rows=b * T, S=5, H=4, G=2, seed=32)
            pool0 = t.state.clone()
            d4 = lambda v: v.reshape(b, T, *v.shape[1:])
            src = torch.tensor([4, 1], dtype=torch.int32)
            idx = torch.tensor([1, 0], dtype=torch.int32)
            buf = torch.zeros(2, T, 4, 4, 8)
            out = torch.empty(b, T, 4, 4)
            e = expect(t, x=d4(t.x), dt=d4(t.dt), B=d4(t.B), C=d4(t.C), z=d4(t.z), state_batch_indices=src,
                       intermediate_states_buffer=buf, intermediate_state_indices=idx, cache_steps=T)
            backend(t.state, d4(t.x), d4(t.dt), t.A, d4(t.B), d4(t.C), D=t.D, z=d4(t.z), dt_bias=t.dt_bias,
                    dt_softplus=True, state_batch_indices=src, out=out, disable_state_update=True,
                    intermediate_states_buffer=buf, cache_steps=T, intermediate_state_indices=idx)
            check(t, out, e, pool0)
            torch.testing.assert_close(buf.double(), e.ibuf.double(), atol=1e-4, rtol=1e-4)
        else:  # packed MTP: [N, 1 + K] tables, num_accepted_tokens
            cu = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
            src = torch.tensor([[1, 2, 3], [0, 0, 0], [4, 5, 6]], dtype=torch.int32)
            dst = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 0, 15]], dtype=torch.int32)
            acc = torch.tensor([2, 1, 3], dtype=torch.int32)
            t = tensors(rows=7, S=16, H=4, G=2, io=BF16, weight=F32, seed=33)
            pool0 = t.state.clone()
            out = torch.empty_like(t.x)
            e = expect(t, z=t.z, state_batch_indices=src, dst_state_batch_indices=dst, cu_seqlens=cu,
                       num_accepted_tokens=acc, pad_slot_id=0)
            backend(t.state, t.x, t.dt, t.A, t.B, t.C, t.D, t.dt_bias, z=t.z, dt_softplus=True,
                    state_batch_indices=src, dst_state_batch_indices=dst, null_block_id=0, out=out,
                    num_accepted_tokens=acc, cu_seqlens=cu)
            check(t, out, e, pool0, BF16)
            assert e.written == {7, 8, 9, 13, 15}
        print("ok")
        """
    )
    if "SKIP" in out:
        pytest.skip(f"{engine} does not import here: {out.split('SKIP', 1)[1].strip()}")
    assert "ok" in out, out


@pytest.mark.parametrize("how", [pytest.param("off", id="off"), pytest.param("uninstall", id="uninstall")])
def test_off_and_uninstall_leave_flashinfer_its_own(how):
    out = run(
        """
        import mate_flashinfer_compat as m
        if UNINSTALL:
            import flashinfer.mamba
            m.uninstall()
        import flashinfer.mamba as fm
        assert fm.selective_state_update.__module__ == "flashinfer.mamba.selective_state_update"
        print("STATUS", m.status()["flashinfer.mamba"])
        """.replace("UNINSTALL", str(how == "uninstall")),
        "off" if how == "off" else None,
    )
    assert "STATUS {'selective_state_update': 'flashinfer'}" in out, out
    if how == "off":
        assert "mate_flashinfer_compat " not in out, out


def test_replayssm_materialize_has_the_real_signature():
    """MATE's ``replayssm_materialize`` (served without FlashInfer) takes the installed FlashInfer's parameters:
    names, order, kinds and defaults."""
    out = run(
        """
        import importlib, inspect
        real = importlib.import_module("flashinfer.mamba.replayssm_materialize")  # (the function shadows it)
        from mate_flashinfer_compat.mamba import replayssm_materialize as mine
        def shape(fn):
            return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
        assert shape(real.replayssm_materialize) == shape(mine), (shape(real.replayssm_materialize), shape(mine))
        print("same")
        """,
        "off",
    )
    assert "same" in out, out


def test_alias_beside_the_real_flashinfer_keeps_it():
    out = run(
        """
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import flashinfer, flashinfer.mamba as fm
        from mate_flashinfer_compat.mamba import selective_state_update as mate_ssu
        assert not getattr(flashinfer, "__mate_alias__", False) and fm.selective_state_update is mate_ssu
        assert fm.checkpointing_ssu.__module__ == "flashinfer.mamba.checkpointing_ssu"
        print("WARN", [str(x.message) for x in w if "mate-flashinfer-compat" in str(x.message)])
        """,
        "alias",
    )
    assert "MATE_FLASHINFER_COMPAT=alias, but a real FlashInfer is installed" in out, out


@pytest.mark.gpu
def test_gpu_mate_inside_flashinfer_matches_flashinfer_s_own_kernel():
    """On the GPU, in this (already started) interpreter: ``flashinfer.mamba.selective_state_update`` (MATE's)
    against FlashInfer's own kernel (its implementation module), same inputs, for SGLang's one-token decode,
    vLLM's packed MTP and SGLang's dense verify with an intermediate buffer (bf16 inputs, fp32 state)."""
    import importlib

    import flashinfer.mamba as fm
    import torch
    from mate_flashinfer_compat.mamba import selective_state_update as mine
    from test_fi_conformance import BF16, F32, tensors

    theirs = importlib.import_module("flashinfer.mamba.selective_state_update").selective_state_update
    assert fm.selective_state_update is mine and theirs is not mine
    dev = "cuda"
    i32 = dict(dtype=torch.int32, device=dev)

    def both(rows, S, call, seed):
        got = []
        for fn in (mine, theirs):
            t = tensors(rows=rows, S=S, H=8, P=64, N=128, G=2, io=BF16, weight=BF16, state_dtype=F32, device=dev,
                        seed=seed)  # fmt: skip
            got.append((t, *call(fn, t)))
        return got

    def close(a, b):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)

    # SGLang decode: 1-D slots with a -1 pad, philox_rounds=10 without rand_seed
    src = torch.tensor([5, -1, 2, 9, 0, 7], **i32)

    def decode(fn, t):
        out = torch.empty_like(t.x)
        fn(t.state, t.x, t.dt, t.A, t.B, t.C, D=t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
           state_batch_indices=src, pad_slot_id=-1, out=out, disable_state_update=False, cache_steps=0,
           rand_seed=None, philox_rounds=10)  # fmt: skip
        return (out,)

    (ta, ya), (tb, yb) = both(6, 12, decode, seed=21)
    live = src != -1  # a pad row's output is not part of the contract compared here
    close(ya[live], yb[live])
    close(ta.state, tb.state)

    # vLLM packed MTP: [N, 1 + K] tables, num_accepted_tokens, cache_steps = 1 + K, null block 0
    cu = torch.tensor([0, 3, 4, 7], **i32)
    msrc = torch.tensor([[1, 2, 3], [0, 0, 0], [4, 5, 6]], **i32)
    mdst = torch.tensor([[7, 8, 9], [10, 11, 12], [13, 0, 15]], **i32)
    acc = torch.tensor([2, 1, 3], **i32)

    def mtp(fn, t):
        out = torch.empty_like(t.x)
        fn(t.state, t.x, t.dt, t.A, t.B, t.C, D=t.D, z=t.z, dt_bias=t.dt_bias, dt_softplus=True,
           state_batch_indices=msrc, dst_state_batch_indices=mdst, cu_seqlens=cu, num_accepted_tokens=acc,
           cache_steps=3, pad_slot_id=0, out=out, rand_seed=None, philox_rounds=10, algorithm="auto")  # fmt: skip
        return (out,)

    (ta, ya), (tb, yb) = both(7, 16, mtp, seed=22)
    live = torch.tensor([0, 1, 2, 4, 5, 6], device=dev)  # row 3 is the null-block sequence
    close(ya[live], yb[live])
    close(ta.state, tb.state)

    # SGLang dense verify: disable_state_update=True, 5-D intermediate buffer, intermediate_state_indices
    b, T = 3, 4
    vsrc = torch.tensor([5, -1, 1], **i32)
    idx = torch.tensor([2, 0, 1], **i32)

    def verify(fn, t):
        d4 = lambda v: v.reshape(b, T, *v.shape[1:])  # noqa: E731
        buf = torch.zeros(3, T, 8, 64, 128, device=dev)
        out = torch.empty(b, T, 8, 64, dtype=BF16, device=dev)
        fn(t.state, d4(t.x), d4(t.dt), t.A, d4(t.B), d4(t.C), D=t.D, z=d4(t.z), dt_bias=t.dt_bias,
           dt_softplus=True, state_batch_indices=vsrc, pad_slot_id=-1, out=out, disable_state_update=True,
           intermediate_states_buffer=buf, cache_steps=T, intermediate_state_indices=idx, rand_seed=None,
           philox_rounds=10)  # fmt: skip
        return out, buf

    (ta, ya, ba), (tb, yb, bb) = both(b * T, 6, verify, seed=23)
    for r in range(b):
        if int(vsrc[r]) != -1:
            close(ya[r], yb[r])
            close(ba[int(idx[r])], bb[int(idx[r])])
    close(ta.state, tb.state)
