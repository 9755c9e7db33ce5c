"""Run a TileLang kernel's generated CUDA source on the CPU, as C++ (``cuda_shim.h``), on torch CPU tensors.

For MATE's decode kernels (registers, shared memory with ``__syncthreads``, warp shuffles outside lane-dependent
branches; no tensor cores, no asynchronous copies), this executes the very code the device would: its index
arithmetic, guards, branches and conversions, against the reference backend, on a machine without a GPU. What it
cannot show: timing, and what only the device does (the memory model between CTAs, which these kernels do not rely
on). A vector access that the device would fault on (a 16-byte access into a tensor at an address that is not
16-byte aligned) is counted and reported.

``Emulated(prim_func, pass_configs)`` lowers the function with TileLang (no nvcc; ``pass_configs``: the kernel
spec's, so the source is the one its compiled kernel has), rewrites the source for the shim, builds it
with g++ into a shared library (cached by the source's hash) and calls it: ``kern(args, grid=(gx, gy, gz),
threads=n)`` with the prim_func's arguments in order (tensors and scalars, as the launcher passes them).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("MATE_EMULATE_CACHE", Path(tempfile.gettempdir()) / "mate-emulate"))


def unavailable() -> str | None:
    """Why the emulator cannot run here (None when it can)."""
    import importlib.util

    if importlib.util.find_spec("tilelang") is None:
        return "needs TileLang (the generated CUDA source)"
    if shutil.which("g++") is None:
        return "needs g++ (C++20)"
    return None


def kernel_source(prim_func, pass_configs: dict | None = None) -> str:
    """The CUDA source TileLang generates for sm_90a under ``pass_configs`` (the spec's: the same source its
    compiled kernel has)."""
    import tilelang
    from tilelang import tvm

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with tvm.transform.PassContext(opt_level=3, config=pass_configs or {}), target:
        art = tilelang.lower(prim_func, target=target)
    return art.kernel_source


_SIG = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)\s*\{')
_VEC = re.compile(r"\*\((\w+) ?\*\)\(")
_SMEM = re.compile(r"extern __shared__ __align__\(\d+\) ([\w ]+?) (\w+)\[\];")
_STATIC_SMEM = re.compile(r"\b__shared__ __align__\((\d+)\) ")


def _params(source: str):
    m = _SIG.search(source)
    if m is None:
        raise ValueError("no kernel definition in the source")
    params = []
    for p in m.group(2).split(","):
        p = p.strip().replace("__restrict__", "").split()
        name = p[-1].lstrip("*")
        ptr = "*" in " ".join(p)
        ctype = " ".join(p[:-1]).replace("const", "").replace("*", "").strip()
        params.append((name, ctype, ptr))
    return m.group(1), params


def _translate(source: str) -> tuple[str, str, list]:
    name, params = _params(source)
    body = source[: source.index('extern "C"')]
    body = "\n".join(line for line in body.splitlines() if not line.startswith("#")) + source[len(body) :]
    body = _VEC.sub(lambda m: f"*vec<{m.group(1)}>(", body)
    body = _SMEM.sub(lambda m: f"{m.group(1)}* {m.group(2)} = ({m.group(1)}*)mate_dyn_smem;", body)
    # a static shared array: one object every thread of the CTA sees (the CTAs run one after another)
    body = _STATIC_SMEM.sub(lambda m: f"alignas({m.group(1)}) static ", body)
    args = []
    for i, (_, ctype, ptr) in enumerate(params):
        args.append(f"({ctype}*)a[{i}]" if ptr else f"*({ctype}*)a[{i}]")
    wrapper = (
        f'\nextern "C" long mate_emulate(void** a, int gx, int gy, int gz, int threads, const uintptr_t* ranges, '
        f"int nranges) {{\n  global_ranges.clear();\n  for (int i = 0; i < nranges; ++i) "
        f"global_ranges.push_back(Range{{ranges[2 * i], ranges[2 * i + 1]}});\n  misaligned = 0;\n"
        f"  emulate_grid(gx, gy, gz, threads, [&] {{ {name}({', '.join(args)}); }});\n  return misaligned.load();\n}}\n"
    )
    return '#include "cuda_shim.h"\n' + body + wrapper, name, params


_SCALARS = {"int": ctypes.c_int32, "int64_t": ctypes.c_int64, "uint": ctypes.c_uint32, "float": ctypes.c_float}


def _is_var(sym) -> bool:
    return hasattr(sym, "name") and not hasattr(sym, "value")  # a shape or stride symbol (an IntImm has a value)


def _evaluate(expr, values: dict) -> int | None:
    """An extent or stride written in other symbols (a dense tensor's stride ``rec * H``), with ``values``'
    symbols put in; None while one of them is unbound."""
    from tilelang import tvm

    free = []
    tvm.tirx.stmt_functor.post_order_visit(expr, lambda n: free.append(n) if isinstance(n, tvm.tirx.Var) else None)
    if any(v.name not in values for v in free):
        return None
    bound = tvm.tirx.stmt_functor.substitute(expr, {v: tvm.tirx.const(values[v.name], v.dtype) for v in free})
    return int(tvm.arith.Analyzer().simplify(bound))


class Emulated:
    def __init__(self, prim_func, pass_configs: dict | None = None):
        self.func = prim_func
        self.source = kernel_source(prim_func, pass_configs)
        src, self.name, self.kparams = _translate(self.source)
        digest = hashlib.sha256((src + (HERE / "cuda_shim.h").read_text()).encode()).hexdigest()[:20]
        CACHE.mkdir(parents=True, exist_ok=True)
        lib = CACHE / f"{self.name}-{digest}.so"
        if not lib.exists():
            # this process's own files until the rename: parallel test processes may build the same library
            cpp = CACHE / f"{self.name}-{digest}.{os.getpid()}.cpp"
            cpp.write_text(src)
            tmp = lib.with_suffix(f".{os.getpid()}.so")
            cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", f"-I{HERE}", str(cpp), "-o",
                   str(tmp)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"g++ failed on {cpp}:\n{done.stderr[-3000:]}")
            os.replace(tmp, lib)
        self.lib = ctypes.CDLL(str(lib))
        self.lib.mate_emulate.restype = ctypes.c_long

    def __call__(self, *args, grid, threads) -> None:
        """Run over ``grid`` with ``threads`` per CTA; AssertionError for a misaligned vector access."""
        f = self.func
        if len(args) != len(f.params):
            raise TypeError(f"{len(f.params)} arguments expected, got {len(args)}")
        values, pointers, keep = {}, {}, []
        ranges, derived = [], []
        for p, a in zip(f.params, args, strict=True):
            buf = f.buffer_map.get(p)
            if buf is None:
                a = a.item() if isinstance(a, torch.Tensor) else a
                values[p.name] = a if isinstance(a, float) else int(a)  # a float is an fp32 parameter
                continue
            if not isinstance(a, torch.Tensor) or a.device.type != "cpu":
                raise TypeError(f"{p.name}: a CPU tensor expected")
            pointers[buf.data.name] = a.data_ptr()
            lo = a.data_ptr()
            extent = sum((s - 1) * st for s, st in zip(a.shape, a.stride(), strict=True)) + 1
            ranges += [lo, lo + extent * a.element_size()]
            for dim, (sym, val) in enumerate(zip(buf.shape, a.shape, strict=True)):
                self._bind(values, sym, val, p.name, f"shape[{dim}]", derived)
            for dim, (sym, val) in enumerate(zip(buf.strides, a.stride(), strict=True)):
                if a.shape[dim] == 1:  # a size-1 dim's stride is free: it only binds a symbol nothing else has
                    if _is_var(sym):
                        values.setdefault(sym.name, int(val))
                    continue
                self._bind(values, sym, val, p.name, f"stride({dim})", derived)
        for sym, val, name, what in derived:  # once every symbol is bound
            want = _evaluate(sym, values)
            if want != int(val):
                raise ValueError(f"{name}.{what} = {val}, the kernel expects {sym} = {want}")
        slots = (ctypes.c_void_p * len(self.kparams))()
        for i, (name, ctype, ptr) in enumerate(self.kparams):
            if ptr:
                slots[i] = pointers[name]
            else:
                c = _SCALARS[ctype](values[name])
                keep.append(c)
                slots[i] = ctypes.addressof(c)
        rng = (ctypes.c_uint64 * len(ranges))(*ranges)
        bad = self.lib.mate_emulate(slots, *grid, threads, rng, len(ranges) // 2)
        assert bad == 0, f"{bad} vector accesses into tensors at misaligned addresses"

    @staticmethod
    def _bind(values, sym, val, name, what, derived):
        if not _is_var(sym) and not hasattr(sym, "value"):
            derived.append((sym, val, name, what))
        elif _is_var(sym):
            old = values.setdefault(sym.name, int(val))
            if old != int(val):
                raise ValueError(f"{name}.{what} = {val}, but {sym.name} = {old} from an earlier argument")
        elif int(sym) != int(val):
            raise ValueError(f"{name}.{what} = {val}, the kernel expects {int(sym)}")


_built: dict = {}  # spec -> Emulated, once per process


def launch_spec(spec, args, *, dim: int, heads: int, rows: int) -> None:
    """Run the kernel of a decode kernel spec (SSU, ReplaySSM, materialisation: ``spec.build()``, its
    ``pass_configs()`` and ``tiling``) on ``args`` over their common launch grid ``(P blocks, heads, rows)``, with
    ``tiling.threads`` per CTA. Each spec's library is built once per process."""
    em = _built.get(spec)
    if em is None:
        em = _built[spec] = Emulated(spec.build(), spec.pass_configs())
    t = spec.tiling
    em(*args, grid=(-(-dim // t.block_p), heads, rows), threads=t.threads)


__all__ = ["Emulated", "kernel_source", "launch_spec", "unavailable"]
