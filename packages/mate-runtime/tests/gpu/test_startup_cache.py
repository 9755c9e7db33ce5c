"""A kernel cache built ahead of time without a GPU loads on the GPU with zero compiles, and computes right.

The cache directory is ``$STARTUP_AOT_CACHE_DIR`` when set (e.g. one built on a CPU machine with
``mate-mamba prewarm packages/mate-runtime/tests/data/nemotron_h_8b --target sm_90a`` and copied here); otherwise this
test builds it first in a subprocess that sees no GPU (``CUDA_VISIBLE_DEVICES=""``, ``--target sm_90a``, empty
TileLang cache). Then a fresh process with ``MATE_CACHE_DIR`` pointed at it and an empty TileLang cache calls the
public prewarm functions of the Nemotron-H 8B configuration (10 kernels) and runs its one-token and packed decode
steps and a prefill against the reference backend: it must compile nothing.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu  # skipped without a device or TileLang (tests/conftest.py)

TESTS = pathlib.Path(__file__).resolve().parents[1]
CONFIG = TESTS / "data" / "nemotron_h_8b" / "config.json"
ENV_DIR = "STARTUP_AOT_CACHE_DIR"

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import torch
from mate.mamba._tilelang.cache import CACHE
from mate.mamba._tilelang.store import versions
from mate.mamba import prewarm_selective_state_update, prewarm_ssd_combined_fwd_varlen
from mate.mamba.prewarm_model import read_config

F32, BF16, I32 = torch.float32, torch.bfloat16, torch.int32
m = read_config(sys.argv[1])
t0 = time.perf_counter()
prewarm_selective_state_update(state_dtype=F32, io_dtype=BF16, batch=4, heads=m.heads, dim=m.dim, dstate=m.dstate,
                               groups=m.groups, slot_dtype=I32, packed=True, meta_dtype=I32, dt_dim=1)
prewarm_ssd_combined_fwd_varlen(m.heads, m.groups, m.dim, m.dstate, m.chunk_size, BF16, F32, F32)
prewarm = {"seconds": time.perf_counter() - t0, "compiles": CACHE.compiles, "loads": CACHE.disk_loads}

import test_ssd_kernels as sd
import test_ssu_kernels as su

ssu = dict(state=F32, io=BF16, H=m.heads, G=m.groups, P=m.dim, N=m.dstate, batch=4)
su.check(su.Case(**ssu, form="one"))
su.check(su.Case(**ssu, form="packed", T=3, accepted=True, table="2d", dst=True))
case = sd.Case(H=m.heads, G=m.groups, P=m.dim, N=m.dstate, chunk=m.chunk_size)
out_k, st_k = sd.run(case, "tilelang")
out_r, st_r = sd.run(case, "torch")
torch.cuda.synchronize()
print(json.dumps({"prewarm": prewarm, "compiles": CACHE.compiles, "loads": CACHE.disk_loads,
                  "ssd_out": sd.rel_err(out_k, out_r), "ssd_state": sd.rel_err(st_k, st_r),
                  "ssd_tol": [sd.OUT_TOL[case.io], sd.STATE_TOL[case.io]],
                  "versions": versions({"kind": "cuda", "arch": "sm_90a"})}))
"""


@pytest.fixture(scope="module")
def aot_cache(tmp_path_factory) -> str:
    given = os.environ.get(ENV_DIR)
    if given:
        return given
    d = tmp_path_factory.mktemp("aot")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "MATE_CACHE_DIR": str(d / "mate"),
           "TILELANG_CACHE_DIR": str(d / "tilelang")}  # fmt: skip
    cmd = [sys.executable, "-m", "mate.mamba", "prewarm", str(CONFIG), "--target", "sm_90a"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "10/10 kernels ready" in p.stdout and "10 compiled" in p.stdout, p.stdout[-3000:]
    return str(d / "mate")


def test_cpu_built_cache_loads_with_zero_compiles(aot_cache, tmp_path):
    listing = subprocess.run([sys.executable, "-m", "mate.mamba", "cache", "list"], capture_output=True, text=True,
                             env={**os.environ, "MATE_CACHE_DIR": aot_cache})  # fmt: skip
    env = {**os.environ, "MATE_CACHE_DIR": aot_cache, "TILELANG_CACHE_DIR": str(tmp_path / "tilelang-empty")}
    env.pop("MATE_SSU_PDL", None)  # the build the CPU made (PDL off)
    p = subprocess.run([sys.executable, "-c", CHILD, str(CONFIG), str(pathlib.Path(__file__).parent)], env=env,
                       capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-5000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    why = f"this host's key versions {r['versions']}; the cache holds:\n{listing.stdout[-4000:]}"
    assert r["prewarm"]["compiles"] == 0 and r["prewarm"]["loads"] == 10, f"{r['prewarm']}; {why}"
    assert r["compiles"] == 0, f"the calls compiled {r['compiles']} kernels the prewarm did not cover; {why}"
    assert r["ssd_out"] < r["ssd_tol"][0] and r["ssd_state"] < r["ssd_tol"][1], r
    print(f"prewarm from the CPU-built cache: {r['prewarm']['seconds']:.2f}s for 10 kernels")
