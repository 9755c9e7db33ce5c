"""The SGLang hook in fresh interpreters started the way the ``.pth`` line starts them: against the real SGLang
0.5.23 (``real``, marked ``engine``: ``nox -s engines`` installs it) and against a stand-in tree laid out like it
(``stand-in``: the default CPU suite, where the engine is not installed). The stand-in is the only way to show
the hook's behaviour with an SGLang layout or version other than the one installed, so those cases use it alone."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
ROOT = PKG.parents[0]
PATHS = [PKG / "src", ROOT / "mate-runtime" / "src", ROOT / "mate-kernels" / "src"]
SHIMS = ROOT.parent / "tools" / "engines" / "cpu_shims"  # what the real engine imports that a CPU box lacks
PTH = (PKG / "src" / "mate_sglang.pth").read_text().strip()
OPS = "sglang/kernels/ops/mamba/triton_ops"

FAKE = {
    "sglang/__init__.py": "__version__ = '0.5.23'\n",
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/mamba/__init__.py": "",
    f"{OPS}/__init__.py": """
        from .ssd_combined import mamba_chunk_scan_combined
        from .ssu_dispatch import initialize_mamba_selective_state_update_backend, selective_state_update
    """,
    f"{OPS}/ssu_dispatch.py": """
        from abc import ABC, abstractmethod
        class MambaSSUBackend(ABC):
            @property
            @abstractmethod
            def name(self): ...
            @abstractmethod
            def __call__(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                         state_batch_indices=None, pad_slot_id=-1, out=None, disable_state_update=False,
                         intermediate_states_buffer=None, cache_steps=None, retrieve_parent_token=None,
                         intermediate_state_indices=None): ...
        class TritonSSUBackend(MambaSSUBackend):
            def __init__(self, *, enable_stochastic_rounding=False, cache_philox_rounds=0):
                pass
            name = "triton"
            def __call__(self, *a, **k):
                raise RuntimeError("the stand-in Triton backend must not run")
        _BACKEND_REGISTRY = {"triton": TritonSSUBackend, "flashinfer": TritonSSUBackend}
        _mamba_ssu_backend = None
        def initialize_mamba_selective_state_update_backend(server_args):
            global _mamba_ssu_backend
            _mamba_ssu_backend = _BACKEND_REGISTRY[server_args.mamba_backend](
                enable_stochastic_rounding=server_args.enable_mamba_cache_stochastic_rounding,
                cache_philox_rounds=server_args.mamba_cache_philox_rounds,
            )
        def selective_state_update(state, x, dt, A, B, C, **kw):
            _mamba_ssu_backend(state, x, dt, A, B, C, **kw)
    """,
    f"{OPS}/ssd_combined.py": """
        def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                initial_states=None, seq_idx=None, chunk_indices=None, chunk_offsets=None, cu_seqlens=None,
                dt_softplus=False, dt_limit=(0.0, float("inf")), out=None, return_final_states=False,
                return_varlen_states=False, return_intermediate_states=False, state_dtype=None,
                return_track_states=False, track_seq_idx=None, track_end_locs=None):
            raise RuntimeError("the stand-in Triton prefill must not run")
    """,
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/attention/__init__.py": "",
    "sglang/srt/layers/attention/mamba/__init__.py": "",
    "sglang/srt/layers/attention/mamba/mamba.py": """
        from sglang.kernels.ops.mamba.triton_ops import mamba_chunk_scan_combined, selective_state_update
        from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch
    """,
}


def has_sglang() -> bool:
    return importlib.util.find_spec("sglang") is not None


TREES = [
    pytest.param("stand-in", id="stand-in"),
    pytest.param("real", id="real", marks=[pytest.mark.engine, pytest.mark.skipif(not has_sglang(), reason=(
        "the real SGLang is installed by `nox -s engines`"))]),
]  # fmt: skip


@pytest.fixture
def tree(request, tmp_path):
    """The paths to put in front of MATE's: the stand-in tree, or nothing but the CPU shims (the real SGLang)."""
    if request.param == "real":
        tv = importlib.util.find_spec("torchvision")  # (this process may see the shim through PYTHONPATH)
        return [SHIMS] if tv is None or str(SHIMS) in str(tv.origin) else []
    return [write_fake(tmp_path, FAKE)]


def write_fake(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def run(code: str, env_extra: dict, extra_paths=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATE_SGLANG") and k != "PYTHONPATH"}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*extra_paths, *PATHS])
    code = PTH + "\n" + textwrap.dedent(code)  # what site.py does with the .pth line at start-up
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True)


SCENARIO = """
    import torch
    import mate_sglang.hook as hook, mate_sglang.ops as mops
    from types import SimpleNamespace
    from sglang.srt.layers.attention.mamba import mamba as mixer
    from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch as sd, ssd_combined
    import sglang.kernels.ops.mamba.triton_ops as ops_pkg
    print("STATUS", hook.status())
    print("PREFILL_ROUTED", mixer.mamba_chunk_scan_combined is mops.mamba_chunk_scan_combined,
          ops_pkg.mamba_chunk_scan_combined is mops.mamba_chunk_scan_combined,
          ssd_combined.mamba_chunk_scan_combined is mops.mamba_chunk_scan_combined)
    print("REGISTRY", {k: v.__name__ for k, v in sd._BACKEND_REGISTRY.items()})
    sd.initialize_mamba_selective_state_update_backend(SimpleNamespace(
        mamba_backend="triton", enable_mamba_cache_stochastic_rounding=False, mamba_cache_philox_rounds=0))
    print("BACKEND", sd._mamba_ssu_backend.name)
    g = torch.Generator().manual_seed(0)
    S, H, P, N, T = 6, 2, 4, 8, 3
    state = torch.randn(S, H, P, N, generator=g); x = torch.randn(2, T, H, P, generator=g)
    dt = torch.rand(2, T, H, generator=g).unsqueeze(-1).expand(2, T, H, P)
    A = (-torch.rand(H, generator=g)).view(H, 1, 1).expand(H, P, N)
    B = torch.randn(2, T, 1, N, generator=g); C = torch.randn(2, T, 1, N, generator=g)
    src = torch.tensor([3, -1], dtype=torch.int32)
    kw = dict(state_batch_indices=src, disable_state_update=True, cache_steps=T, dt_softplus=True)
    b1, o1 = torch.zeros(S, T, H, P, N), torch.empty_like(x)
    sd.selective_state_update(state, x, dt, A, B, C, out=o1, intermediate_states_buffer=b1, **kw)
    b2, o2 = torch.zeros(S, T, H, P, N), torch.empty_like(x)
    mops.selective_state_update(state, x, dt, A, B, C, out=o2, intermediate_states_buffer=b2, **kw)
    print("SAME", torch.equal(b1, b2) and torch.equal(o1, o2) and bool(b1[3].abs().sum() > 0))
    hook.disable()
    print("RESTORED", sd._BACKEND_REGISTRY["triton"].__name__, "mate" in sd._BACKEND_REGISTRY,
          mixer.mamba_chunk_scan_combined is mops.mamba_chunk_scan_combined)
"""


def test_pth_line_is_light_and_inert_without_the_env():
    r = run("import sys\nassert 'torch' not in sys.modules and 'sglang' not in sys.modules\nprint('ok')", {})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


@pytest.mark.parametrize("tree", TREES, indirect=True)
def test_enabled_hook_registers_mate_and_routes_the_prefill(tree):
    r = run(SCENARIO, {"MATE_SGLANG_ENABLE": "1"}, tree)
    assert r.returncode == 0, r.stderr
    assert "PREFILL_ROUTED True True True" in r.stdout
    assert "{'triton': 'MateSSUBackend', 'flashinfer': 'MateSSUBackend', 'mate': 'MateSSUBackend'}" in r.stdout
    assert "BACKEND mate" in r.stdout and "SAME True" in r.stdout
    assert "RESTORED TritonSSUBackend False False" in r.stdout
    assert "'version': '0.5.23'" in r.stdout and "mate-sglang is tested against" not in r.stderr


@pytest.mark.parametrize("tree", TREES, indirect=True)
def test_backend_names_env_keeps_sglangs_own(tree):
    code = """
        from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch as sd
        print("REGISTRY", {k: v.__name__ for k, v in sd._BACKEND_REGISTRY.items()})
    """
    r = run(code, {"MATE_SGLANG_ENABLE": "1", "MATE_SGLANG_SSU_BACKENDS": "none", "MATE_SGLANG_PREFILL": "0"}, tree)
    assert r.returncode == 0, r.stderr
    assert "'triton': 'TritonSSUBackend'" in r.stdout and "'mate': 'MateSSUBackend'" in r.stdout
    assert "'flashinfer': 'MateSSUBackend'" not in r.stdout


@pytest.mark.parametrize("tree", TREES, indirect=True)
def test_disabled_hook_does_nothing(tree):
    code = SCENARIO.split("    sd.initialize_mamba")[0]  # up to the registry: nothing of MATE's is in SGLang
    r = run(code, {}, tree)
    assert r.returncode == 0, r.stderr
    assert "PREFILL_ROUTED False False False" in r.stdout and "MateSSUBackend" not in r.stdout


def test_another_sglang_version_with_this_layout_is_served_with_a_warning(tmp_path):
    files = dict(FAKE)
    files["sglang/__init__.py"] = "__version__ = '0.6.0'\n"
    r = run(SCENARIO, {"MATE_SGLANG_ENABLE": "1"}, [write_fake(tmp_path, files)])
    assert r.returncode == 0, r.stderr
    assert "mate-sglang is tested against SGLang 0.5.23, found 0.6.0" in r.stderr
    assert "BACKEND mate" in r.stdout and "SAME True" in r.stdout


def test_an_sglang_without_this_layout_is_named_and_left_alone(tmp_path):
    """The layout of SGLang releases before 0.5.23 (ops under srt/layers/attention/mamba/ops)."""
    old = "sglang/srt/layers/attention/mamba/ops"
    files = {"sglang/__init__.py": "__version__ = '0.5.9'\n", "sglang/srt/__init__.py": "",
             "sglang/srt/layers/__init__.py": "", "sglang/srt/layers/attention/__init__.py": "",
             "sglang/srt/layers/attention/mamba/__init__.py": "", f"{old}/__init__.py": "",
             f"{old}/ssu_dispatch.py": "_BACKEND_REGISTRY = {}\n"}  # fmt: skip
    code = """
        import mate_sglang.hook as hook
        from sglang.srt.layers.attention.mamba.ops import ssu_dispatch as sd
        print("REGISTRY", sd._BACKEND_REGISTRY, hook.status())
    """
    r = run(code, {"MATE_SGLANG_ENABLE": "1"}, [write_fake(tmp_path, files)])
    assert r.returncode == 0, r.stderr
    assert "REGISTRY {}" in r.stdout
    assert "SGLang 0.5.9 has no sglang.kernels.ops.mamba.triton_ops.ssu_dispatch" in r.stderr


def test_other_registry_and_signatures_are_left_alone_with_a_warning(tmp_path):
    files = dict(FAKE)
    files[f"{OPS}/ssu_dispatch.py"] = (
        "def selective_state_update(*a, **k):\n    return 'sglang'\n"
        "def initialize_mamba_selective_state_update_backend(*a):\n    pass\n"
    )
    files[f"{OPS}/ssd_combined.py"] = (
        "def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, "
        "last_chunk_indices, seq_idx, out):\n    return 'sglang'\n"
    )
    code = """
        from sglang.srt.layers.attention.mamba import mamba as mixer
        print("OWN", mixer.mamba_chunk_scan_combined(*range(11)), mixer.selective_state_update())
    """
    r = run(code, {"MATE_SGLANG_ENABLE": "1"}, [write_fake(tmp_path, files)])
    assert r.returncode == 0, r.stderr
    assert "OWN sglang sglang" in r.stdout
    assert "str-keyed _BACKEND_REGISTRY" in r.stderr and "not routed to MATE" in r.stderr


def test_a_backend_constructor_of_another_shape_is_left_alone(tmp_path):
    files = dict(FAKE)
    files[f"{OPS}/ssu_dispatch.py"] = FAKE[f"{OPS}/ssu_dispatch.py"].replace(
        "def __init__(self, *, enable_stochastic_rounding=False, cache_philox_rounds=0):", "def __init__(self):"
    )
    code = """
        from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch as sd
        print("REGISTRY", sorted(sd._BACKEND_REGISTRY))
    """
    r = run(code, {"MATE_SGLANG_ENABLE": "1"}, [write_fake(tmp_path, files)])
    assert "REGISTRY ['flashinfer', 'triton']" in r.stdout
    assert "SGLang constructs its SSU backends with ()" in r.stderr


def test_imports_cleanly_without_sglang():
    code = """
        import sys, mate_sglang, mate_sglang.hook as hook
        hook.enable()
        assert "sglang" not in sys.modules and "torch" not in sys.modules
        print("ok", hook.status())
    """
    r = run(code, {"MATE_SGLANG_ENABLE": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_pth_line_reads_the_switch_through_mate_settings_without_importing_torch():
    r = run("import sys\nassert 'torch' not in sys.modules and 'mate.mamba.settings' in sys.modules\nprint('ok')",
            {"MATE_SGLANG_ENABLE": "1"})  # fmt: skip
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_malformed_switch_warns_at_start_up_and_arms_nothing(tmp_path):
    fake = write_fake(tmp_path, FAKE)
    code = """
        from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch as sd
        print("REGISTRY", sorted(sd._BACKEND_REGISTRY))
    """
    r = run(code, {"MATE_SGLANG_ENABLE": "yes please"}, [fake])
    assert r.returncode == 0, r.stderr
    assert "REGISTRY ['flashinfer', 'triton']" in r.stdout
    assert "the SGLang hook is not armed: MATE_SGLANG_ENABLE='yes please': expected one of" in r.stderr
    r = run("import mate_sglang.hook as h\nh.enable()", {"MATE_SGLANG_PREFILL": "maybe"}, [fake])
    assert r.returncode != 0 and "ValueError: MATE_SGLANG_PREFILL='maybe'" in r.stderr
