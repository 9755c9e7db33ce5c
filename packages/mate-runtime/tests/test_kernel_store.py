"""MATE's compiled-kernel cache (``mate.mamba._tilelang.store``, ``MATE_CACHE_DIR``) on the CPU.

The store/load layer runs with a fake compile (files of known content, a fake loader that checks them), so the
checksum, lock and atomic-publish logic is tested in seconds; one test compiles a real sm_90a kernel (nvcc, a few
seconds) and loads it in a fresh process with no compile.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import warnings

import pytest
from mate.mamba import cli, settings
from mate.mamba._tilelang import cache as cache_mod
from mate.mamba._tilelang import store as store_mod
from mate.mamba._tilelang.ssu import compile_grid

TARGET = {"kind": "cuda", "arch": "sm_90a"}
SPECS = compile_grid()[:2]
FAKE_VERSIONS = {"mate": "test", "mate_kernels": "test", "tilelang": "test", "cuda": "test"}


class FakeKernel:
    def __init__(self, payload: str):
        self.payload = payload


def fake_write(kernel, d):
    for name in store_mod.FILES:
        with open(os.path.join(d, name), "w") as f:
            f.write(f"{name}:{kernel.payload}")


def fake_load(self, entry, key, target):
    with open(os.path.join(entry, store_mod.LIBRARY)) as f:
        text = f.read()
    assert text.startswith(f"{store_mod.LIBRARY}:"), text  # a complete file, never a partial one
    return FakeKernel(text.split(":", 1)[1])


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A cache directory under tmp_path, fixed versions, and a compile that takes ``delay`` seconds."""
    monkeypatch.setattr(store_mod, "_toolkit_versions", lambda: FAKE_VERSIONS)
    monkeypatch.setattr(store_mod, "write_kernel_files", fake_write)
    monkeypatch.setattr(store_mod.Store, "_load", fake_load)
    calls = []

    def compile_prim_func(prim_func, *, target, pass_configs=None):
        calls.append(prim_func)
        cache_mod._timing.phases["lower"] = 0.0  # a real compile lowers (else: a TileLang disk-cache hit)
        time.sleep(0.2)
        return FakeKernel(f"compiled-{len(calls)}")

    monkeypatch.setattr(cache_mod, "compile_prim_func", compile_prim_func)
    store_mod._warned.clear()
    with settings.override(MATE_CACHE_DIR=str(tmp_path / "cache")):
        yield calls, store_mod.store()


def get(kc, spec):
    return kc.compile_only(spec, lambda: spec, target=TARGET, pass_configs=spec.pass_configs())


def test_second_cache_loads_what_the_first_compiled(fake):
    calls, st = fake
    first = cache_mod.KernelCache()
    k1 = get(first, SPECS[0])
    assert (first.compiles, first.disk_loads) == (1, 0)
    assert first.log[0].phases.get("build") is not None and "store" in first.log[0].phases
    second = cache_mod.KernelCache()  # a new process's cache, same directory
    k2 = get(second, SPECS[0])
    assert (second.compiles, second.disk_loads) == (0, 1)
    assert k2.payload == k1.payload == "compiled-1" and len(calls) == 1
    assert get(second, SPECS[1]).payload == "compiled-2" and second.compiles == 1  # another spec, another entry
    assert [st.check(e.path) for e in st.entries()] == [None, None]


@pytest.mark.parametrize(
    "damage, problem",
    [
        pytest.param("flip", "does not match its checksum", id="corrupt-library"),
        pytest.param("truncate", "does not match its checksum", id="truncated-library"),
        pytest.param("manifest", "another kernel", id="mismatched-manifest"),
        pytest.param("no-manifest", "missing manifest", id="half-written"),
    ],
)
def test_a_bad_entry_warns_once_is_never_loaded_and_is_rebuilt(fake, damage, problem):
    calls, st = fake
    get(cache_mod.KernelCache(), SPECS[0])
    entry = st.entries()[0].path
    lib, man = os.path.join(entry, store_mod.LIBRARY), os.path.join(entry, store_mod.MANIFEST)
    if damage == "flip":
        with open(lib, "r+b") as f:
            b = f.read(1)
            f.seek(0)
            f.write(bytes([b[0] ^ 1]))
    elif damage == "truncate":
        os.truncate(lib, 3)
    elif damage == "manifest":
        m = json.load(open(man))
        m["key"]["spec"] = "another"
        json.dump(m, open(man, "w"))
    else:
        os.remove(man)
    assert problem in st.check(entry)
    with pytest.warns(store_mod.CacheWarning, match=problem):
        k = get(cache_mod.KernelCache(), SPECS[0])
    assert k.payload == "compiled-2" and len(calls) == 2  # rebuilt, not loaded
    assert st.check(entry) is None  # the rebuilt entry replaced it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get(cache_mod.KernelCache(), SPECS[0]).payload == "compiled-2"  # loads, no warning


def test_a_second_bad_load_of_one_entry_warns_no_more(fake):
    _, st = fake
    get(cache_mod.KernelCache(), SPECS[0])
    entry = st.entries()[0].path
    os.truncate(os.path.join(entry, store_mod.LIBRARY), 1)
    with pytest.warns(store_mod.CacheWarning):
        assert st.load(SPECS[0], TARGET, SPECS[0].pass_configs())[0] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert st.load(SPECS[0], TARGET, SPECS[0].pass_configs())[0] is None


def test_versions_are_part_of_the_key(fake, monkeypatch):
    calls, st = fake
    get(cache_mod.KernelCache(), SPECS[0])
    monkeypatch.setattr(store_mod, "_toolkit_versions", lambda: {**FAKE_VERSIONS, "cuda": "other"})
    kc = cache_mod.KernelCache()
    get(kc, SPECS[0])
    assert kc.compiles == 1 and len(st.entries()) == 2
    # another architecture is another entry too
    k = store_mod.entry_key(SPECS[0], {"kind": "cuda", "arch": "sm_100a"}, {})
    assert k["versions"]["arch"] == "cuda:sm_100a" and st.entry_path(k) not in {e.path for e in st.entries()}


def test_off_keeps_nothing_on_disk(fake, tmp_path):
    calls, _ = fake
    with settings.override(MATE_CACHE_DIR="off"):
        assert store_mod.store() is None
        get(cache_mod.KernelCache(), SPECS[0])
        get(cache_mod.KernelCache(), SPECS[0])
    assert len(calls) == 2 and not (tmp_path / "cache").exists()


def test_two_threads_first_calling_one_spec_compile_once(fake):
    calls, _ = fake
    kc = cache_mod.KernelCache()
    got = []
    threads = [threading.Thread(target=lambda: got.append(get(kc, SPECS[0]))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and kc.compiles == 1 and got[0] is got[1]


PROCESS = textwrap.dedent(
    """
    import json, os, sys, time, warnings
    warnings.simplefilter("error")  # a CacheWarning (a partial or corrupt entry seen) fails the process
    from mate.mamba._tilelang import cache as cache_mod, store as store_mod
    from mate.mamba._tilelang.ssu import compile_grid
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fakes import FakeKernel, fake_write, fake_load, FAKE_VERSIONS
    store_mod._toolkit_versions = lambda: FAKE_VERSIONS
    store_mod.write_kernel_files = fake_write
    store_mod.Store._load = fake_load
    def compile_prim_func(prim_func, *, target, pass_configs=None):
        cache_mod._timing.phases["lower"] = 0.0
        time.sleep(1.0)
        return FakeKernel(f"pid-{os.getpid()}")
    cache_mod.compile_prim_func = compile_prim_func
    while time.time() < float(sys.argv[1]):  # start together
        time.sleep(0.005)
    spec = compile_grid()[0]
    kc = cache_mod.KernelCache()
    k = kc.compile_only(spec, lambda: spec, target={"kind": "cuda", "arch": "sm_90a"})
    st = store_mod.store()
    print(json.dumps({"compiles": kc.compiles, "loads": kc.disk_loads, "payload": k.payload,
                      "sound": [st.check(e.path) for e in st.entries()]}))
    """
)


def test_two_processes_sharing_the_directory_compile_once(tmp_path):
    (tmp_path / "fakes.py").write_text(
        "import os\nfrom mate.mamba._tilelang import store as store_mod\n"
        + "\n".join(__import__("inspect").getsource(o) for o in (FakeKernel, fake_write, fake_load))
        + f"\nFAKE_VERSIONS = {FAKE_VERSIONS!r}\n"
    )
    script = tmp_path / "proc.py"
    script.write_text(PROCESS)
    env = {**os.environ, "MATE_CACHE_DIR": str(tmp_path / "shared")}
    start = str(time.time() + 6.0)  # both past their imports
    procs = [subprocess.Popen([sys.executable, str(script), start], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["compiles"] for r in results) == [0, 1], results
    assert sorted(r["loads"] for r in results) == [0, 1], results
    assert results[0]["payload"] == results[1]["payload"]  # the loader got the compiler's kernel
    assert all(r["sound"] == [None] for r in results), results


def test_publish_never_shows_a_partial_entry(fake):
    """A reader polling the entry while a writer stages it sees nothing, then the whole entry."""
    _, st = fake
    key = store_mod.entry_key(SPECS[0], TARGET, {})
    entry = st.entry_path(key)
    seen, done = [], threading.Event()

    def slow_write(d):
        for name in store_mod.FILES:
            with open(os.path.join(d, name), "w") as f:
                f.write(f"{name}:slow")
            time.sleep(0.05)

    def reader():
        while not done.is_set():
            if os.path.isdir(entry):
                seen.append(st.check(entry, key))

    t = threading.Thread(target=reader)
    t.start()
    st.publish(entry, key, slow_write)
    deadline = time.time() + 5
    while not seen and time.time() < deadline:  # the reader sees the published entry too
        time.sleep(0.01)
    done.set()
    t.join()
    assert seen and set(seen) == {None}


def populate(st, n=2):
    for i, spec in enumerate(SPECS[:n]):
        key = store_mod.entry_key(spec, TARGET, spec.pass_configs())
        st.publish(st.entry_path(key), key, lambda d, i=i: fake_write(FakeKernel(f"k{i}"), d))


def test_cli_list_verify_export_clear_import(fake, tmp_path, capsys):
    _, st = fake
    populate(st)
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and str(SPECS[0]) in out and "cuda:sm_90a" in out and "cuda test" in out
    assert cli.main(["cache", "verify"]) == 0
    assert "2/2 entries sound" in capsys.readouterr().out
    tar = str(tmp_path / "kernels.tar.gz")
    assert cli.main(["cache", "export", tar]) == 0
    assert len([m for m in tarfile.open(tar).getmembers() if m.name.endswith("manifest.json")]) == 2
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out and st.entries() == []
    assert cli.main(["cache", "import", tar]) == 0
    assert "2 entries added" in capsys.readouterr().out
    assert [st.check(e.path) for e in st.entries()] == [None, None]
    assert cli.main(["cache", "import", tar]) == 0
    assert "0 entries added" in capsys.readouterr().out  # already here
    os.truncate(os.path.join(st.entries()[1].path, store_mod.PARAMS), 2)
    assert cli.main(["cache", "verify"]) == 1
    assert "params.json does not match its checksum" in capsys.readouterr().out


def test_import_skips_a_corrupt_entry(fake, tmp_path):
    _, st = fake
    populate(st)
    os.truncate(os.path.join(st.entries()[0].path, store_mod.LIBRARY), 2)
    tar = str(tmp_path / "kernels.tar")
    with tarfile.open(tar, "w") as t:  # export would leave it out: write the corrupt one by hand
        for e in st.entries():
            t.add(e.path, arcname=f"{store_mod.LAYOUT}/{e.name}")
    st.clear()
    with pytest.warns(store_mod.CacheWarning, match="skipped"):
        assert st.import_(tar) == (1, 1)


def test_cache_dir_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.parse("MATE_CACHE_DIR", None) == str(tmp_path / "xdg" / "mate")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert settings.parse("MATE_CACHE_DIR", "") == os.path.join(os.path.expanduser("~"), ".cache", "mate")
    assert settings.parse("MATE_CACHE_DIR", "/Images/Cache") == "/Images/Cache"  # a path keeps its case
    assert settings.parse("MATE_CACHE_DIR", "OFF") is None


def test_a_read_only_directory_still_serves(fake, tmp_path):
    calls, st = fake
    populate(st, 1)
    os.chmod(st.base, 0o555)
    try:
        if os.access(st.base, os.W_OK):
            pytest.skip("running as a user that writes into read-only directories (root)")
        kc = cache_mod.KernelCache()
        assert get(kc, SPECS[0]).payload == "k0" and kc.disk_loads == 1
        with pytest.warns(store_mod.CacheWarning, match="cannot write"):
            get(kc, SPECS[1])
        assert kc.compiles == 1
    finally:
        os.chmod(st.base, 0o755)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="needs TileLang")
def test_real_kernel_compiles_once_then_loads_in_a_new_process(tmp_path):
    """The smallest SSU spec for sm_90a (nvcc on the CPU): one process compiles and stores it, a fresh one loads
    it with no compile and no factory build (its TileLang cache directory is empty)."""
    code = textwrap.dedent(
        """
        import json, time
        import tilelang  # (imports apart from the timed load)
        from mate.mamba._tilelang.cache import CACHE
        from mate.mamba._tilelang.ssu import compile_grid
        spec = compile_grid()[0]
        built = []
        t0 = time.perf_counter()
        k = CACHE.compile_only(spec, lambda: built.append(1) or spec.build(), target={"kind": "cuda", "arch": "sm_90a"},
                               pass_configs=spec.pass_configs())
        print(json.dumps({"compiles": CACHE.compiles, "loads": CACHE.disk_loads, "built": len(built),
                          "seconds": time.perf_counter() - t0, "source": len(k.get_kernel_source()),
                          "callable": callable(k)}))
        """
    )
    runs = []
    for i in range(2):
        env = {**os.environ, "MATE_CACHE_DIR": str(tmp_path / "mate"), "TILELANG_CACHE_DIR": str(tmp_path / f"tl{i}")}
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert (runs[0]["compiles"], runs[0]["loads"], runs[0]["built"]) == (1, 0, 1), runs
    assert (runs[1]["compiles"], runs[1]["loads"], runs[1]["built"]) == (0, 1, 0), runs
    assert runs[1]["seconds"] < 1.0 and runs[1]["source"] == runs[0]["source"] > 0 and runs[1]["callable"], runs
