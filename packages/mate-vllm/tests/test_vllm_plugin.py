"""The vLLM plugin in fresh interpreters (so the patches and import hooks start clean): against the real vLLM
0.33.0 where a case can run on a CPU (``real``, marked ``engine``: ``nox -s engines`` installs it; the in-process
cases are in test_vllm_engine.py), and against a stand-in tree laid out like it (registry keyed by a closed enum,
backend classes taking the MambaConfig, a mixer that imports the prefill op by name) for the default CPU suite,
where vLLM is not installed, and for what only another vLLM version can show."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

PKG = Path(__file__).resolve().parents[1]
ROOT = PKG.parents[0]
PATHS = [PKG / "src", ROOT / "mate-runtime" / "src", ROOT / "mate-kernels" / "src"]
SHIMS = ROOT.parent / "tools" / "engines" / "cpu_shims"  # what the real engine imports that a CPU box lacks

FAKE = {
    "vllm/__init__.py": "__version__ = '0.33.0'\n",
    "vllm/config/__init__.py": "",
    "vllm/config/mamba.py": """
        import enum
        class MambaBackendEnum(str, enum.Enum):
            TRITON = "triton"
            FLASHINFER = "flashinfer"
            CPU = "cpu"
        class MambaConfig:
            def __init__(self, backend="triton", enable_stochastic_rounding=False):
                self.backend = MambaBackendEnum(backend)
                self.enable_stochastic_rounding = enable_stochastic_rounding
                self.stochastic_rounding_philox_rounds = 0
    """,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/mamba/__init__.py": "",
    "vllm/model_executor/layers/mamba/ops/__init__.py": "",
    "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py": """
        from abc import ABC, abstractmethod
        from vllm.config.mamba import MambaBackendEnum
        NULL_BLOCK_ID = 0
        class MambaSSUBackend(ABC):
            def __init__(self, mamba_config):
                self._mamba_config = mamba_config
            @property
            @abstractmethod
            def name(self): ...
            @abstractmethod
            def __call__(self, state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False,
                         state_batch_indices=None, dst_state_batch_indices=None, null_block_id=NULL_BLOCK_ID,
                         out=None, num_accepted_tokens=None, cu_seqlens=None, is_blackwell=False): ...
        class TritonSSUBackend(MambaSSUBackend):
            name = "triton"
            def __call__(self, *a, **k):
                raise RuntimeError("the stand-in Triton backend must not run")
        _BACKEND_REGISTRY = {MambaBackendEnum.TRITON: TritonSSUBackend, MambaBackendEnum.FLASHINFER: TritonSSUBackend}
        _mamba_ssu_backend = None
        _flashinfer_replayssm_kernel = None
        def _stand_in_checkpointing_ssu(*a, **k):
            raise RuntimeError("the stand-in FlashInfer ReplaySSM kernel must not run")
        def initialize_mamba_ssu_backend(mamba_config, kv_cache_config=None, *, use_replayssm=False):
            global _mamba_ssu_backend, _flashinfer_replayssm_kernel
            _mamba_ssu_backend = _BACKEND_REGISTRY[mamba_config.backend](mamba_config)
            _flashinfer_replayssm_kernel = None
            if use_replayssm and mamba_config.backend == MambaBackendEnum.FLASHINFER:
                _flashinfer_replayssm_kernel = _stand_in_checkpointing_ssu
        def selective_state_update(state, x, dt, A, B, C, D, dt_bias, **kw):
            _mamba_ssu_backend(state, x, dt, A, B, C, D, dt_bias, **kw)
    """,
    "vllm/model_executor/layers/mamba/ops/ssd_combined.py": """
        def mamba_chunk_scan_combined_varlen(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens,
                last_chunk_indices, seq_idx, out, D=None, z=None, dt_bias=None, initial_states=None,
                dt_softplus=False, dt_limit=(0.0, float("inf")), return_intermediate_states=False,
                state_dtype=None, final_states_out=None, final_state_indices=None):
            raise RuntimeError("the stand-in Triton prefill must not run")
    """,
    "vllm/model_executor/layers/mamba/mamba_mixer2.py": """
        from vllm.model_executor.layers.mamba.ops.ssd_combined import mamba_chunk_scan_combined_varlen
        from vllm.model_executor.layers.mamba.ops import ssu_dispatch
    """,
}


def write_fake(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def run(code: str, env_extra: dict, extra_paths=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATE_VLLM") and k != "PYTHONPATH"}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*extra_paths, *PATHS])
    r = subprocess.run([sys.executable, "-W", "always", "-c", textwrap.dedent(code)], env=env, capture_output=True,
                       text=True)  # fmt: skip
    return r


SCENARIO = """
    import torch, mate_vllm.plugin as plugin
    plugin.register()
    from vllm.model_executor.layers.mamba import mamba_mixer2 as mixer
    from vllm.model_executor.layers.mamba.ops import ssu_dispatch as sd, ssd_combined
    from vllm.config.mamba import MambaConfig, MambaBackendEnum
    import mate_vllm.ops as mops
    print("STATUS", plugin.status())
    print("PREFILL_ROUTED", mixer.mamba_chunk_scan_combined_varlen is mops.mamba_chunk_scan_combined_varlen,
          ssd_combined.mamba_chunk_scan_combined_varlen is mops.mamba_chunk_scan_combined_varlen)
    print("REGISTRY", {k.value: v.__name__ for k, v in sd._BACKEND_REGISTRY.items()})
    sd.initialize_mamba_ssu_backend(MambaConfig("triton"))
    print("BACKEND", sd._mamba_ssu_backend.name)
    g = torch.Generator().manual_seed(0)
    S, H, P, N = 6, 2, 4, 8
    state = torch.randn(S, H, P, N, generator=g); x = torch.randn(2, H, P, generator=g)
    dt = torch.rand(2, H, generator=g).unsqueeze(-1).expand(2, H, P)
    A = (-torch.rand(H, generator=g)).view(H, 1, 1).expand(H, P, N)
    B = torch.randn(2, 1, N, generator=g); C = torch.randn(2, 1, N, generator=g)
    D = torch.randn(H, generator=g).view(H, 1).expand(H, P); dtb = torch.rand(H, generator=g).view(H, 1).expand(H, P)
    src = torch.tensor([3, 0], dtype=torch.int32)
    s1, o1 = state.clone(), torch.empty_like(x)
    sd.selective_state_update(s1, x, dt, A, B, C, D, dtb, dt_softplus=True, state_batch_indices=src, out=o1)
    s2, o2 = state.clone(), torch.empty_like(x)
    mops.selective_state_update(s2, x, dt, A, B, C, D, dtb, dt_softplus=True, state_batch_indices=src, out=o2)
    print("SAME", torch.equal(s1, s2) and torch.equal(o1, o2) and not torch.equal(s1[3], state[3]))
    plugin.unregister()
    print("RESTORED", sd._BACKEND_REGISTRY[MambaBackendEnum.TRITON].__name__,
          mixer.mamba_chunk_scan_combined_varlen is mops.mamba_chunk_scan_combined_varlen)
"""


TREES = [
    pytest.param("stand-in", id="stand-in"),
    pytest.param("real", id="real", marks=[pytest.mark.engine, pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="the real vLLM is installed by `nox -s engines`")]),
]  # fmt: skip


@pytest.fixture
def tree(request, tmp_path):
    """The paths to put in front of MATE's: the stand-in tree, or nothing but the CPU shims (the real vLLM)."""
    if request.param == "real":
        tv = importlib.util.find_spec("torchvision")  # (this process may see the shim through PYTHONPATH)
        return [SHIMS] if tv is None or str(SHIMS) in str(tv.origin) else []
    return [write_fake(tmp_path, FAKE)]


def test_entry_point_is_declared():
    meta = tomllib.loads((PKG / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vllm.general_plugins"] == {"mate": "mate_vllm.plugin:register"}
    assert not any("vllm" in d.split("=")[0] for d in meta["project"]["dependencies"])


def test_enabled_plugin_registers_the_ssu_backend_and_routes_the_prefill(tmp_path):
    fake = write_fake(tmp_path, FAKE)
    r = run(SCENARIO, {"MATE_VLLM_ENABLE": "1"}, [fake])
    assert r.returncode == 0, r.stderr
    assert "PREFILL_ROUTED True True" in r.stdout
    assert "'triton': 'MateSSUBackend'" in r.stdout and "'flashinfer': 'MateSSUBackend'" in r.stdout
    assert "'cpu'" not in r.stdout  # only the GPU backends are taken over by default
    assert "BACKEND mate" in r.stdout and "SAME True" in r.stdout
    assert "RESTORED TritonSSUBackend False" in r.stdout


@pytest.mark.parametrize("tree", TREES, indirect=True)
def test_ssu_backend_selection_env(tree):
    code = """
        import mate_vllm.plugin as plugin
        plugin.register()
        from vllm.model_executor.layers.mamba.ops import ssu_dispatch as sd
        print("REGISTRY", {k.value: v.__name__ for k, v in sd._BACKEND_REGISTRY.items()})
    """
    r = run(code, {"MATE_VLLM_ENABLE": "1", "MATE_VLLM_SSU_BACKENDS": "flashinfer,bogus"}, tree)
    assert r.returncode == 0, r.stderr
    assert "'triton': 'TritonSSUBackend', 'flashinfer': 'MateSSUBackend'" in r.stdout
    assert "no mamba backend named 'bogus'" in r.stderr


@pytest.mark.parametrize("tree", TREES, indirect=True)
def test_disabled_plugin_does_nothing(tree):
    code = SCENARIO.split("    sd.initialize_mamba")[0]  # up to the registry: nothing of MATE's is in vLLM
    r = run(code, {}, tree)
    assert r.returncode == 0, r.stderr
    assert "PREFILL_ROUTED False False" in r.stdout and "MateSSUBackend" not in r.stdout


def test_another_vllm_version_is_served_with_a_warning(tmp_path):
    files = dict(FAKE)
    files["vllm/__init__.py"] = "__version__ = '0.34.0'\n"
    r = run(SCENARIO, {"MATE_VLLM_ENABLE": "1"}, [write_fake(tmp_path, files)])
    assert r.returncode == 0, r.stderr
    assert "mate-vllm is tested against vLLM 0.33.0, found 0.34.0" in r.stderr
    assert "BACKEND mate" in r.stdout and "SAME True" in r.stdout


def test_other_registry_and_signatures_are_left_alone_with_a_warning(tmp_path):
    files = dict(FAKE)
    files["vllm/model_executor/layers/mamba/ops/ssu_dispatch.py"] = """
        def selective_state_update(*a, **k):
            return "vllm's own"
    """
    files["vllm/model_executor/layers/mamba/ops/ssd_combined.py"] = """
        def mamba_chunk_scan_combined_varlen(x, dt, A, B, C, chunk_size, seq_idx, out):
            return "vllm's own"
    """
    fake = write_fake(tmp_path, files)
    code = """
        import mate_vllm.plugin as plugin
        plugin.register()
        from vllm.model_executor.layers.mamba import mamba_mixer2 as mixer
        print("OWN", mixer.mamba_chunk_scan_combined_varlen(*range(8)), mixer.ssu_dispatch.selective_state_update())
        print("STATUS", plugin.status())
    """
    r = run(code, {"MATE_VLLM_ENABLE": "1"}, [fake])
    assert r.returncode == 0, r.stderr
    assert "OWN vllm's own vllm's own" in r.stdout
    assert "no _BACKEND_REGISTRY" in r.stderr and "not routed to MATE" in r.stderr


def test_imports_cleanly_without_vllm():
    code = """
        import sys, mate_vllm, mate_vllm.plugin as plugin
        plugin.register()  # enabled, but vLLM is absent: nothing to patch, nothing raised
        assert "vllm" not in sys.modules and "torch" not in sys.modules
        print("ok", plugin.status())
    """
    r = run(code, {"MATE_VLLM_ENABLE": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_stochastic_rounding_config_reaches_the_backend(tmp_path):
    """--enable-mamba-cache-stochastic-rounding: MATE's backend is built with it (its calls round the fp16 final
    stores, the Philox rounds from the config)."""
    fake = write_fake(tmp_path, FAKE)
    code = """
        import mate_vllm.plugin as plugin
        plugin.register()
        from vllm.model_executor.layers.mamba.ops import ssu_dispatch as sd
        from vllm.config.mamba import MambaConfig
        cfg = MambaConfig("triton", enable_stochastic_rounding=True)
        cfg.stochastic_rounding_philox_rounds = 7
        sd.initialize_mamba_ssu_backend(cfg)
        b = sd._mamba_ssu_backend
        print("BACKEND", b.name, b._sr, b._sr_rounds)
    """
    r = run(code, {"MATE_VLLM_ENABLE": "1"}, [fake])
    assert "BACKEND mate True 7" in r.stdout, r.stderr


SYNTHETIC_RULE = {
    "source": "a synthetic measurement",
    "mate": [{"state": "bfloat16", "tokens": 6, "heads": 128, "dim": 64, "dstate": 128, "groups": 8,
              "batches": [64, None]}],
}  # fmt: skip


@pytest.mark.parametrize(
    "env, backend, slot, said",
    [
        pytest.param(
            {},
            "flashinfer",
            "flashinfer",
            "FlashInfer's kernel serves every ReplaySSM call",
            id="default-auto-shipped-rule",
        ),  # fmt: skip
        pytest.param(
            {"MATE_VLLM_REPLAYSSM": "auto", "rule": SYNTHETIC_RULE},
            "flashinfer",
            "routed",
            "MATE serves ReplaySSM for bfloat16 state, 6 token(s) per step, H128 P64 N128 G8, batch 64+; "
            "FlashInfer's kernel for the rest (a synthetic measurement)",
            id="auto-synthetic-rule",
        ),  # fmt: skip
        pytest.param({"MATE_VLLM_REPLAYSSM": "1"}, "flashinfer", "mate", "served by MATE", id="1-every-call"),
        pytest.param({"MATE_VLLM_REPLAYSSM": "0"}, "flashinfer", "flashinfer", None, id="0-left-to-vllm"),
        pytest.param({"MATE_VLLM_REPLAYSSM": "1"}, "triton", "none", None, id="triton-left-to-vllm"),
    ],
)
def test_replayssm_kernel_slot(tmp_path, env, backend, slot, said):
    """--use-replayssm on each initialisation: auto (default) routes per call by the rule where it names a cell
    for MATE (logged once), else leaves FlashInfer's kernel (logged once); 1 puts MATE's op in the slot; 0 and the
    Triton backend leave vLLM's kernel with one warning."""
    fake = write_fake(tmp_path, FAKE)
    env = dict(env)
    if "rule" in env:
        path = tmp_path / "rule.json"
        path.write_text(json.dumps(env.pop("rule")))
        env["MATE_VLLM_REPLAYSSM_RULE"] = str(path)
    code = f"""
        import logging
        logging.basicConfig(level=logging.INFO)
        import mate_vllm.plugin as plugin, mate_vllm.ops as mops
        plugin.register()
        from vllm.model_executor.layers.mamba.ops import ssu_dispatch as sd
        from vllm.config.mamba import MambaConfig
        for _ in range(2):
            sd.initialize_mamba_ssu_backend(MambaConfig({backend!r}), use_replayssm=True)
        k = sd._flashinfer_replayssm_kernel
        name = ("none" if k is None else "mate" if k is mops.checkpointing_ssu else "flashinfer"
                if k is sd._stand_in_checkpointing_ssu else "routed" if k.__name__ == "checkpointing_ssu_routed" else k)
        print("SLOT", name)
        print("STATUS", plugin.status()["replayssm"])
    """
    r = run(code, {"MATE_VLLM_ENABLE": "1", **env}, [fake])
    assert r.returncode == 0, r.stderr
    assert f"SLOT {slot}\n" in r.stdout
    status = r.stdout.split("STATUS ", 1)[1].strip()
    warned = r.stderr.count("--use-replayssm: the Mamba decode runs vLLM's own ReplaySSM kernel")
    if said is None:
        assert status == "left to vLLM" and warned == 1
    else:
        assert status.startswith(said) and warned == 0
        logged = r.stderr.count(f"INFO:mate_vllm:--use-replayssm: {said}")
        assert logged == (0 if slot == "mate" else 1)


@pytest.mark.parametrize("value", ["0", ""])
def test_enable_flag_values(tmp_path, value):
    fake = write_fake(tmp_path, FAKE)
    code = """
        import mate_vllm.plugin as plugin
        plugin.register()
        from vllm.model_executor.layers.mamba.ops import ssu_dispatch as sd
        print("REGISTRY", {k.value: v.__name__ for k, v in sd._BACKEND_REGISTRY.items()})
    """
    r = run(code, {"MATE_VLLM_ENABLE": value}, [fake])
    assert "MateSSUBackend" not in r.stdout and r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"MATE_VLLM_ENABLE": "ture"}, id="enable"),
        pytest.param({"MATE_VLLM_ENABLE": "1", "MATE_VLLM_PREFILL": "2"}, id="prefill"),
        pytest.param({"MATE_VLLM_ENABLE": "1", "MATE_VLLM_REPLAYSSM": "fast"}, id="replayssm"),
    ],
)
def test_malformed_switch_raises_naming_the_variable(tmp_path, env):
    fake = write_fake(tmp_path, FAKE)
    code = """
        import sys, mate_vllm.plugin as plugin
        try:
            plugin.register()
        except ValueError as e:
            print("ERR", e)
        assert "torch" not in sys.modules
    """
    r = run(code, env, [fake])
    assert r.returncode == 0, r.stderr
    name = next(n for n in env if env[n] != "1")
    assert f"ERR {name}={env[name]!r}: expected one of" in r.stdout
