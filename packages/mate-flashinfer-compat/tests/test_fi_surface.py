"""Where FlashInfer's Mamba names resolve under each ``MATE_FLASHINFER_COMPAT`` mode, each test in a fresh
interpreter that starts as the ``.pth`` line starts every interpreter of an environment.

"Beside a FlashInfer" here uses a small imitation of FlashInfer 0.7.2's package tree (the layout of its
``flashinfer/mamba/__init__.py``, submodules and signature), so that this runs on any CPU machine;
``test_fi_real.py`` checks the same against the real ``flashinfer-python`` where it is installed.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
RUNTIME_SRC = Path(__file__).resolve().parents[2] / "mate-runtime" / "src"
KERNELS_SRC = Path(__file__).resolve().parents[2] / "mate-kernels" / "src"
PTH = (SRC / "mate_flashinfer_compat.pth").read_text().strip()

no_real_flashinfer = pytest.mark.skipif(
    importlib.machinery.PathFinder.find_spec("flashinfer") is not None,
    reason="a real FlashInfer is installed in this environment (test_fi_real.py covers it)",
)


def run(code, mode=None, path=()):
    """``code`` in a fresh interpreter whose first statement is the ``.pth`` line; stdout + stderr, asserting
    it exited 0. Logging goes to stdout as ``NAME LEVEL message``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MATE_FLASHINFER_COMPAT")}
    if mode is not None:
        env["MATE_FLASHINFER_COMPAT"] = mode
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*path, SRC, RUNTIME_SRC, KERNELS_SRC))
    prelude = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(name)s %(levelname)s %(message)s')\n"
    )
    r = subprocess.run(
        [sys.executable, "-W", "always", "-c", f"{PTH}\n{prelude}{textwrap.dedent(code)}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


SSU_SIGNATURE = (
    "state, x, dt, A, B, C, D, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None, pad_slot_id=-1, "
    "state_scale=None, out=None, disable_state_update=False, intermediate_states_buffer=None, "
    "intermediate_state_indices=None, intermediate_state_scales=None, rand_seed=None, philox_rounds=10, "
    "cache_steps=0, algorithm='auto', dst_state_batch_indices=None, cu_seqlens=None, num_accepted_tokens=None, "
    "backend='auto'"
)


def imitation(root: Path, signature: str = SSU_SIGNATURE) -> Path:
    """FlashInfer 0.7.2's package layout: ``flashinfer/mamba/`` a package whose ``__init__`` imports its
    functions from same-named submodules; ``cake_selective_state_update`` calls the submodule's function."""
    fi = root / "flashinfer"
    (fi / "mamba").mkdir(parents=True)
    (fi / "__init__.py").write_text(
        "__version__ = '0.7.2.post1'\n"
        "def BatchDecodeWithPagedKVCacheWrapper(): return 'fi-attention'\n"
        "from . import mamba as mamba\n"
    )
    files = {
        "__init__.py": "from .cake_selective_state_update import cake_selective_state_update\n"
        "from .selective_state_update import selective_state_update\n"
        "from .checkpointing_ssu import allocate_checkpointing_ssu_scratch, checkpointing_ssu\n"
        "from .replayssm_materialize import replayssm_materialize\n"
        "__all__ = ['cake_selective_state_update', 'selective_state_update', 'checkpointing_ssu',\n"
        "           'allocate_checkpointing_ssu_scratch', 'replayssm_materialize']\n",
        "selective_state_update.py": f"def selective_state_update({signature}):\n    return 'fi-ssu:' + backend\n",
        "cake_selective_state_update.py": "from .selective_state_update import selective_state_update\n"
        "def cake_selective_state_update(*args, **kwargs):\n"
        "    return selective_state_update(*args, backend='cake', **kwargs)\n",
        "checkpointing_ssu.py": "def checkpointing_ssu(*a, **k): return 'fi-ckpt'\n"
        "def allocate_checkpointing_ssu_scratch(*a, **k): return 'fi-scratch'\n",
        "replayssm_materialize.py": "def replayssm_materialize(*a, **k): return 'fi-replay'\n",
    }
    for name, text in files.items():
        (fi / "mamba" / name).write_text(text)
    return root


# ------------------------------------------------------------------------------------------ auto (default)


@no_real_flashinfer
@pytest.mark.parametrize("mode", [pytest.param(None, id="unset"), pytest.param("auto", id="auto")])
def test_auto_without_flashinfer_creates_no_flashinfer_module(mode):
    out = run(
        """
        import importlib.util
        assert "torch" not in sys.modules, "the start-up hook must stay light"
        assert importlib.util.find_spec("flashinfer") is None  # vLLM's / SGLang's has_flashinfer() stay false
        try:
            import flashinfer  # noqa: F401
        except ModuleNotFoundError as e:
            print("NOFI", e.name)
        import mate_flashinfer_compat as m
        print("STATUS", m.status()["flashinfer"], m.status()["flashinfer.mamba"])
        """,
        mode,
    )
    assert "NOFI flashinfer" in out and "STATUS None {'selective_state_update': None}" in out, out
    assert "Warning" not in out and "mate_flashinfer_compat" not in out.replace("STATUS", ""), out


def test_mate_flashinfer_compat_mamba_is_shaped_like_flashinfer_mamba():
    out = run(
        """
        import mate_flashinfer_compat.mamba as fm
        sub = sys.modules["mate_flashinfer_compat.mamba.selective_state_update"]
        ckpt = sys.modules["mate_flashinfer_compat.mamba.checkpointing_ssu"]
        mat = sys.modules["mate_flashinfer_compat.mamba.replayssm_materialize"]
        assert fm.__path__ and fm.__all__ == [
            "selective_state_update", "checkpointing_ssu", "allocate_checkpointing_ssu_scratch",
            "replayssm_materialize"], fm.__all__
        assert fm.selective_state_update is sub.selective_state_update  # the function shadows its submodule
        assert fm.checkpointing_ssu is ckpt.checkpointing_ssu
        assert fm.allocate_checkpointing_ssu_scratch is ckpt.allocate_checkpointing_ssu_scratch
        assert fm.replayssm_materialize is mat.replayssm_materialize
        assert fm.SERVED == ("selective_state_update",)
        assert fm.STANDALONE == ("checkpointing_ssu", "allocate_checkpointing_ssu_scratch", "replayssm_materialize")
        assert fm.NOT_SERVED == ("cake_selective_state_update", "SSDCombined", "ssd_combined_fwd")
        assert not set(fm.NOT_SERVED) & set(fm.STANDALONE)
        for name in fm.NOT_SERVED:
            try:
                getattr(fm, name)
            except AttributeError as e:
                assert "MATE does not serve" in str(e) and name in str(e), e
            else:
                raise AssertionError(name)
        print("ok")
        """
    )
    assert "ok" in out


def test_auto_beside_flashinfer_serves_only_selective_state_update(tmp_path):
    out = run(
        """
        import mate_flashinfer_compat as m
        from mate_flashinfer_compat.mamba import selective_state_update as mate_ssu
        assert "flashinfer" not in sys.modules  # nothing of FlashInfer is imported before the process does
        print("BEFORE", m.status()["flashinfer.mamba"])
        from flashinfer.mamba import selective_state_update  # vLLM's / SGLang's backend import
        import flashinfer, flashinfer.mamba as fm
        real = sys.modules["flashinfer.mamba.selective_state_update"].selective_state_update
        assert selective_state_update is mate_ssu and fm.selective_state_update is mate_ssu
        assert real is not mate_ssu and real.__module__ == "flashinfer.mamba.selective_state_update"
        assert fm.checkpointing_ssu() == "fi-ckpt" and fm.allocate_checkpointing_ssu_scratch() == "fi-scratch"
        assert fm.replayssm_materialize() == "fi-replay" and flashinfer.BatchDecodeWithPagedKVCacheWrapper()
        assert fm.cake_selective_state_update(*range(7)) == "fi-ssu:cake"  # cake stays FlashInfer's
        from flashinfer.mamba.checkpointing_ssu import checkpointing_ssu
        assert checkpointing_ssu() == "fi-ckpt"
        m.install()  # idempotent: no second hook, no second report
        print("AFTER", m.status()["flashinfer.mamba"])
        m.uninstall()
        assert fm.selective_state_update is real
        print("RESTORED", m.status()["flashinfer.mamba"])
        """,
        path=[imitation(tmp_path)],
    )
    assert "BEFORE {'selective_state_update': 'mate (when flashinfer.mamba is imported)'}" in out, out
    assert "AFTER {'selective_state_update': 'mate'}" in out, out
    assert "RESTORED {'selective_state_update': 'flashinfer'}" in out, out
    reports = [line for line in out.splitlines() if line.startswith("mate_flashinfer_compat INFO")]
    assert len(reports) == 1, out
    assert "flashinfer.mamba.selective_state_update is MATE's inside FlashInfer 0.7.2.post1" in reports[0]
    assert "checkpointing_ssu" in reports[0] and "MATE_FLASHINFER_COMPAT=off" in reports[0]
    assert "Warning" not in out, out


def test_flashinfer_imported_before_the_hook_is_served_on_install(tmp_path):
    out = run(
        """
        import mate_flashinfer_compat as m
        m.uninstall()  # as if the .pth line had not run (python -S, or FlashInfer imported before it)
        import flashinfer.mamba as fm
        assert fm.selective_state_update.__module__ == "flashinfer.mamba.selective_state_update"
        m.install()  # flashinfer.mamba already imported: served now
        from mate_flashinfer_compat.mamba import selective_state_update as mate_ssu
        assert fm.selective_state_update is mate_ssu
        print("ok")
        """,
        path=[imitation(tmp_path)],
    )
    assert "ok" in out


def test_a_flashinfer_whose_signature_differs_is_left_alone_with_a_warning(tmp_path):
    out = run(
        """
        import flashinfer.mamba as fm
        assert fm.selective_state_update.__module__ == "flashinfer.mamba.selective_state_update"
        import mate_flashinfer_compat as m
        print("STATUS", m.status()["flashinfer.mamba"])
        """,
        path=[imitation(tmp_path, signature="state, x, dt, A, B, C, D, backend='auto', new_option=None")],
    )
    assert "FlashInfer 0.7.2.post1's flashinfer.mamba.selective_state_update takes" in out, out
    assert "MATE does not serve it and FlashInfer's own function stays" in out
    assert "STATUS {'selective_state_update': \"flashinfer (its signature" in out, out


# ------------------------------------------------------------------------------------------------ alias


@no_real_flashinfer
def test_alias_without_flashinfer_is_flashinfer_mamba_only_and_loud_elsewhere():
    out = run(
        """
        import importlib, importlib.util
        assert importlib.util.find_spec("flashinfer") is not None and "torch" not in sys.modules
        import flashinfer, flashinfer.mamba as fm
        import mate_flashinfer_compat.mamba as mine
        sub = sys.modules["flashinfer.mamba.selective_state_update"]
        assert fm.__path__ == [] and fm.__all__ == mine.__all__ and flashinfer.mamba is fm
        assert fm.selective_state_update is mine.selective_state_update is sub.selective_state_update
        from flashinfer.mamba.checkpointing_ssu import checkpointing_ssu  # vLLM's ReplaySSM import
        assert checkpointing_ssu is fm.checkpointing_ssu is mine.checkpointing_ssu
        assert fm.allocate_checkpointing_ssu_scratch is mine.allocate_checkpointing_ssu_scratch
        from flashinfer.mamba import replayssm_materialize
        mat_module = importlib.import_module("flashinfer.mamba.replayssm_materialize")  # (the function shadows it)
        assert replayssm_materialize is fm.replayssm_materialize is mine.replayssm_materialize
        assert mat_module.replayssm_materialize is mine.replayssm_materialize
        assert not hasattr(flashinfer, "BatchDecodeWithPagedKVCacheWrapper")
        for stmt in ("from flashinfer import BatchDecodeWithPagedKVCacheWrapper", "import flashinfer.sampling",
                     "flashinfer.norm", "importlib.util.find_spec('flashinfer.comm')",
                     "import flashinfer.mamba.cake_selective_state_update", "fm.cake_selective_state_update"):
            try:
                exec(stmt)
            except (ImportError, AttributeError) as e:
                print(type(e).__name__, "|", e)
            else:
                print("NO ERROR", stmt)
        import mate_flashinfer_compat as m
        print("STATUS", m.status()["flashinfer"], m.status()["flashinfer.mamba"])
        """,
        "alias",
    )
    assert "NO ERROR" not in out, out
    lines = [line for line in out.splitlines() if " | " in line]
    kinds = ["ImportError", "ImportError", "AttributeError", "ImportError", "ImportError"]
    assert [line.split(" | ")[0] for line in lines] == [*kinds, "AttributeError"], out
    for line, name in zip(lines, ("BatchDecodeWithPagedKVCacheWrapper", "sampling", "norm", "comm"), strict=False):
        assert f"flashinfer.{name}: this flashinfer is MATE's alias (MATE_FLASHINFER_COMPAT=alias" in line, line
    for line in lines[4:]:
        assert (
            "that MATE does not serve; mate-flashinfer-compat serves only selective_state_update, "
            "checkpointing_ssu, allocate_checkpointing_ssu_scratch, replayssm_materialize"
        ) in line, line
    assert (
        "STATUS MATE's alias (flashinfer.mamba only) {'selective_state_update': 'mate', 'checkpointing_ssu': 'mate', "
        "'allocate_checkpointing_ssu_scratch': 'mate', 'replayssm_materialize': 'mate'}"
    ) in out
    assert sum("flashinfer is MATE's alias" in line and " INFO " in line for line in out.splitlines()) == 1, out


def test_alias_beside_flashinfer_keeps_it_and_serves_as_auto(tmp_path):
    out = run(
        """
        import flashinfer, flashinfer.mamba as fm
        from mate_flashinfer_compat.mamba import selective_state_update as mate_ssu
        assert not getattr(flashinfer, "__mate_alias__", False) and flashinfer.BatchDecodeWithPagedKVCacheWrapper()
        assert fm.selective_state_update is mate_ssu and fm.checkpointing_ssu() == "fi-ckpt"
        print("ok")
        """,
        "alias",
        path=[imitation(tmp_path)],
    )
    assert "ok" in out and "MATE_FLASHINFER_COMPAT=alias, but a real FlashInfer is installed" in out, out


# -------------------------------------------------------------------------------------------------- off


@pytest.mark.parametrize("beside", [pytest.param(False, id="no-flashinfer"), pytest.param(True, id="beside")])
def test_off_leaves_flashinfer_alone(tmp_path, beside):
    if not beside and importlib.machinery.PathFinder.find_spec("flashinfer") is not None:
        pytest.skip("a real FlashInfer is installed in this environment")
    out = run(
        """
        try:
            import flashinfer.mamba as fm
        except ImportError:
            print("NOFI")
        else:
            print("SSU", fm.selective_state_update.__module__)
        import mate_flashinfer_compat as m
        print("STATUS", m.status()["flashinfer.mamba"])
        """,
        "off",
        path=[imitation(tmp_path)] if beside else [],
    )
    if beside:
        assert "SSU flashinfer.mamba.selective_state_update" in out and "'flashinfer'}" in out, out
    else:
        assert "NOFI" in out and "STATUS {'selective_state_update': None}" in out, out
    assert "mate_flashinfer_compat INFO" not in out and "Warning" not in out, out


# --------------------------------------------------------------------------------------- the .pth line


@pytest.mark.parametrize("value", [pytest.param(v, id=v) for v in ("auto", "alias", "off", "force", "bogus")])
def test_pth_line_reads_the_switch_through_mate_settings_without_importing_torch(tmp_path, value):
    """A value outside auto / alias / off (``force``, ``bogus``) installs the finder, which raises the ValueError naming
    the variable at the first ``flashinfer`` import, beside a FlashInfer or not."""
    out = run(
        """
        assert "torch" not in sys.modules and "mate.mamba.settings" in sys.modules, sorted(sys.modules)
        import mate_flashinfer_compat._alias as alias
        print("FINDER", alias._FINDER in sys.meta_path)
        try:
            import flashinfer.mamba
        except ValueError as e:
            print("ERR", e)
        """,
        value,
        path=[imitation(tmp_path)],
    )
    assert f"FINDER {value in ('alias', 'force', 'bogus')}" in out, out
    if value in ("force", "bogus"):
        assert f"ERR MATE_FLASHINFER_COMPAT={value!r}: expected one of auto, alias, off" in out, out
    else:
        assert "ERR" not in out


# ------------------------------------------------------------------------------------- a missing MATE

CALL = """
    import torch
    from mate_flashinfer_compat.mamba import selective_state_update
    s = torch.zeros(2, 1, 4, 4); x = torch.zeros(1, 1, 4)
    try:
        selective_state_update(s, x, x, -torch.ones(1), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), None)
    except ImportError as e:
        print("ERR", e)
"""


def test_missing_mate_is_reported_as_missing():
    hide = "sys.modules['mate'] = None  # as if mate-runtime were not installed\nimport mate_flashinfer_compat\n"
    out = run(hide + textwrap.dedent(CALL), path=[])
    assert "ERR mate-flashinfer-compat: the MATE runtime is not installed" in out, out


def test_broken_mate_is_reported_as_broken(tmp_path):
    (tmp_path / "mate").mkdir()
    (tmp_path / "mate" / "__init__.py").write_text("raise RuntimeError('half-installed')\n")
    out = run("import mate_flashinfer_compat\n" + textwrap.dedent(CALL), path=[tmp_path])
    assert "installed but broken" in out and "half-installed" in out, out
