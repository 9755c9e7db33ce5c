"""TileLang launcher for ``rms_norm_gated``: one normalised :class:`NormCall` -> one kernel launch on the current
stream (:mod:`.norm_plan` decides the kernel), no host<->device synchronisation."""

from __future__ import annotations

import torch
from mate.mamba._contract.dtypes import DTYPE_NAMES
from mate.mamba._contract.norm import NormCall, finish
from mate.mamba._contract.template import CallTemplate
from mate.mamba._platform.device import tilelang_target
from mate.mamba._tilelang.cache import compile_missing, kernel_lookup
from mate.mamba._tilelang.norm_plan import call_spec, launch_args, spec_for, vector_ok
from mate.mamba._tilelang.specs import NormSpec

PREWARM_HINT = (
    "mate.mamba.prewarm_rms_norm_gated(hidden=..., group_size=..., io_dtype=..., weight_dtype=..., z_dtype=..., "
    "has_z=..., has_bias=..., norm_before_gate=...)"
)
kernel, _kernels = kernel_lookup(PREWARM_HINT)  # kernel(spec, device), and its memo (spec -> kernel)


def run(call: NormCall, sources: dict | None = None):
    """``(out in x's shape, launcher)``; the launcher (None without ``sources`` or for a call whose fields are not
    the caller's tensors or views of them) runs a call of the same metadata from the caller's tensors, the spec
    chosen here reused (chosen again when the pointers' alignment differs)."""
    specs: dict = {}  # vector accesses allowed? -> spec
    return _launch(call, specs), CallTemplate.launcher(call, sources, lambda c: _launch(c, specs), fresh=("out",))


def _launch(call: NormCall, specs: dict) -> torch.Tensor:
    if call.rows:
        vector = vector_ok(call)
        spec = specs.get(vector)
        if spec is None:
            spec = specs[vector] = call_spec(call, vector)
        kern = _kernels.get(spec)
        if kern is None:
            kern = kernel(spec, call.x.device)
        kern(*launch_args(call))
    return finish(call)


def serving_specs(*, hidden, group_size, io_dtype, weight_dtype, z_dtype, has_bias, norm_before_gate) -> list:
    """The kernel a configuration's aligned calls use (the engines' x and z are rows of dense buffers)."""
    del hidden  # a runtime dimension: one kernel serves every width of whole groups
    name = DTYPE_NAMES.__getitem__
    return [spec_for(
        group_size=group_size, io_dtype=name(io_dtype), z_dtype=None if z_dtype is None else name(z_dtype),
        weight_dtype=name(weight_dtype), bias_dtype=name(weight_dtype) if has_bias else None,
        norm_before_gate=norm_before_gate, vector=True,
    )]  # fmt: skip


def prewarm(device, *, jobs=1, **config) -> None:
    """Compile (without launching) the kernel of one configuration on ``device`` (see :func:`serving_specs`)."""
    specs = serving_specs(**config)
    compile_missing(specs, target=tilelang_target(device), jobs=jobs)
    for spec in specs:
        kernel(spec, device)


def compile_grid() -> list[NormSpec]:
    """A representative grid: the Mamba2 call (gate first, no bias) at bf16 / fp16, fp32 io, the norm before the
    gate with a bias, a scalar-access group, a wide group."""
    return [
        spec_for(
            group_size=gs, io_dtype=io, z_dtype=z, weight_dtype=w, bias_dtype=b, norm_before_gate=nbg, vector=vector
        )  # fmt: skip
        for gs, io, z, w, b, nbg, vector in (
            (1024, "bfloat16", "bfloat16", "bfloat16", None, False, True),
            (512, "float16", "float16", "float32", None, False, True),
            (5120, "float32", "float32", "float32", None, False, True),
            (1024, "bfloat16", "bfloat16", "bfloat16", "bfloat16", True, True),
            (960, "bfloat16", None, "float32", None, True, False),
            (32768, "bfloat16", "bfloat16", "bfloat16", None, False, True),
        )
    ]


__all__ = ["PREWARM_HINT", "compile_grid", "kernel", "prewarm", "run", "serving_specs"]
