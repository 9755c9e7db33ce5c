"""What MATE uses of TileLang beyond its public API (``tilelang.compile``, ``T.*``), in one place.

Three needs reach inside TileLang 0.1.15: the eager fast path calls the tvm_ffi function behind a compiled kernel
directly (TileLang's Python call wrapper costs ~9 us per call and does nothing for kernels without outputs to
allocate), its constant tensor arguments converted to tvm_ffi tensors once; MATE's kernel store saves a compiled
kernel's files and loads them back as a kernel without recompiling; the compile-time breakdown times TileLang's
compile stages. :data:`SURFACE` names every module
attribute this file touches, and ``tests/test_tilelang_internals.py`` (run by ``nox -s compile``, where TileLang
is installed) fails loudly when a TileLang upgrade moves one of them.
"""

from __future__ import annotations

import importlib
import sys

# (module, attribute path) of every TileLang internal used below
SURFACE = (
    ("tilelang.jit", "JITKernel.from_database"),
    ("tilelang.jit.adapter.base", "CachedTextSource"),
    ("tilelang.jit.adapter", "TVMFFIKernelAdapter._get_executable"),
    ("tilelang.engine.param", "load_kernel_params"),
    ("tilelang.engine.param", "dump_kernel_params"),
    ("tilelang.engine.lower", "lower_to_host_device_ir"),
    ("tilelang.engine.lower", "device_codegen"),
    ("tilelang.engine.lower", "host_codegen"),
    ("tilelang.contrib.nvcc", "compile_cuda"),
    ("tilelang.cache.kernel_cache", "KernelCache._safe_write_executable"),
    ("tilelang.cache.kernel_cache", "KernelCache._save_kernel_to_disk"),
    ("tvm_ffi", "Function"),
    ("tvm_ffi", "from_dlpack"),
)


def missing_surface() -> list[str]:
    """The entries of :data:`SURFACE` the installed TileLang lacks (empty when all are there)."""
    missing = []
    for module, path in SURFACE:
        try:
            obj = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{module}.{path} ({type(exc).__name__}: {exc})")
    return missing


# ------------------------------------------------------------------------------------------- the fast path


def direct_callable(kern):
    """The function ``kern(*args)`` ends up calling (``<module>.main`` of TileLang's tvm_ffi adapter) when calling
    it directly is equivalent, i.e. a tvm_ffi adapter without outputs to allocate; else ``kern`` itself."""
    adapter = getattr(kern, "adapter", None)
    if (
        adapter is None
        or type(adapter).__name__ != "TVMFFIKernelAdapter"
        or getattr(adapter, "result_idx", None)
        or getattr(adapter, "_ffi_callee_allocated_output_abi", False)
    ):
        return kern
    try:
        ex = adapter._get_executable()
        mod = ex.jit() if getattr(type(ex), "jit", None) is not None else ex  # a fresh compile / a disk-cache load
        fn = mod.main
    except Exception:  # another TileLang layout: keep the wrapper
        return kern
    return fn if callable(fn) else kern


def is_ffi_function(fn) -> bool:
    """Whether ``fn`` is a tvm_ffi function (what :func:`direct_callable` returns where calling it is equivalent)."""
    mod = sys.modules.get("tvm_ffi")
    return mod is not None and isinstance(fn, mod.Function)


def ffi_tensor(t):
    """A torch tensor as a tvm_ffi tensor (sharing its memory, keeping it alive): a tvm_ffi function converts a
    torch tensor argument on every call (~0.2 us each on a 2-core CPU), an ffi tensor not at all."""
    import tvm_ffi

    return tvm_ffi.from_dlpack(t)


# ------------------------------------------------------------------------------------------- the kernel store


def result_indices(kernel) -> list:
    """The output indices a compiled kernel allocates (none for MATE's kernels)."""
    return list(getattr(getattr(kernel, "adapter", None), "result_idx", None) or [])


def kernel_files(kernel) -> dict:
    """What the store keeps of a compiled kernel: ``library`` (a callable writing the shared library to a path),
    ``params`` (JSON), ``signature`` (JSON of a body-less copy of the prim_func: the launcher reads only the
    parameters, buffers and attributes; a few KB to parse where the full function is ~200 KB), the device and host
    sources, and TileLang's own cache entry (None if none)."""
    from tilelang import tvm
    from tilelang.engine.param import dump_kernel_params
    from tvm import tirx

    func = kernel.prim_func
    sig = tirx.PrimFunc(func.params, tirx.Evaluate(0), func.ret_type, func.buffer_map, func.attrs)
    return {
        "library": lambda path: kernel.adapter.get_exportable_executable().export_library(path),
        "params": dump_kernel_params(kernel.params),
        "signature": tvm.ir.save_json(sig),
        "device_source": kernel.adapter.get_device_source() or "",
        "host_source": kernel.adapter.get_host_source() or "",
        "tilelang_entry": getattr(kernel, "_tilelang_cache_path", None),
    }


def load_kernel(*, signature_json: str, params_json: str, host_source: str, device_source: str, library: str,
                target, out_idx, execution_backend: str, pass_configs):  # fmt: skip
    """A compiled kernel from the store's files (paths for the sources and the library), without compiling."""
    from tilelang import tvm
    from tilelang.engine.param import load_kernel_params
    from tilelang.jit import JITKernel
    from tilelang.jit.adapter.base import CachedTextSource

    return JITKernel.from_database(
        func=tvm.ir.load_json(signature_json),
        host_kernel_source=CachedTextSource(path=host_source),
        device_kernel_source=CachedTextSource(path=device_source),
        kernel_lib_path=library,
        params=load_kernel_params(params_json),
        target=target,
        target_host=None,
        out_idx=out_idx,
        execution_backend=execution_backend,
        pass_configs=pass_configs,
    )


# -------------------------------------------------------------------------------- the compile-time breakdown


def wrap_compile_stages(timed) -> None:
    """Wrap TileLang's compile stages with ``timed(phase, fn, exclusive_of=())`` (each phase named as in
    ``mate.mamba._tilelang.cache.PHASES``)."""
    from tilelang.cache.kernel_cache import KernelCache as TLKernelCache
    from tilelang.contrib import nvcc

    lower = sys.modules["tilelang.engine.lower"]
    lower.lower_to_host_device_ir = timed("lower", lower.lower_to_host_device_ir)
    lower.device_codegen = timed("codegen", lower.device_codegen, ("nvcc",))
    nvcc.compile_cuda = timed("nvcc", nvcc.compile_cuda)
    lower.host_codegen = timed("wrapper", lower.host_codegen)
    TLKernelCache._safe_write_executable = staticmethod(timed("wrapper", TLKernelCache._safe_write_executable))
    TLKernelCache._save_kernel_to_disk = timed("tilelang-cache", TLKernelCache._save_kernel_to_disk, ("wrapper",))


__all__ = ["SURFACE", "missing_surface", "direct_callable", "is_ffi_function", "ffi_tensor", "result_indices",
           "kernel_files", "load_kernel", "wrap_compile_stages"]  # fmt: skip
