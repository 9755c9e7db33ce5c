"""TileLang launchers for ``causal_conv1d_fn`` / ``causal_conv1d_update``: one normalised call -> one kernel
launch on the current stream, no host sync and no allocation but the prefill's returned tensor (with
``MATE_CHECK_INPUTS=1`` the tables are read back and checked first, outside graph capture). :mod:`.conv1d_plan`
decides the kernel and its arguments; each run leaves the dispatcher's fast path a launcher for calls of the same
metadata."""

from __future__ import annotations

import dataclasses

import torch
from mate.mamba._contract.conv1d import Conv1dFnCall, Conv1dUpdateCall, check_fn_data, check_update_data
from mate.mamba._contract.dtypes import DTYPE_NAMES
from mate.mamba._contract.template import CallTemplate
from mate.mamba._platform import settings
from mate.mamba._platform.device import is_capturing, tilelang_target
from mate.mamba._tilelang.cache import compile_missing, kernel_lookup
from mate.mamba._tilelang.conv1d_plan import TUNING, args_fn, args_update, pointers, spec_fn, spec_update, update_group
from mate.mamba._tilelang.specs import Conv1dFnSpec, Conv1dUpdateSpec
from mate_kernels.conv1d import vector_width

PREWARM_HINT = "mate.mamba.prewarm_causal_conv1d(dim=..., width=..., io_dtype=..., state_dtype=...)"
kernel, _kernels = kernel_lookup(PREWARM_HINT)


def run_update(call: Conv1dUpdateCall, sources: dict | None = None):
    """Run one normalised call: ``(result, launcher)``. The launcher (None without ``sources``, with
    ``MATE_CHECK_INPUTS=1`` or for a call whose fields are not the caller's tensors or views of them: the result
    of an ``out``-less call whose x is not in the pool's dtype is a copy) runs a call of the same metadata from the
    caller's tensors: the call rebuilt without validation
    (:class:`~mate.mamba._contract.template.CallTemplate`), the kernel decided here reused."""
    if settings.get("MATE_CHECK_INPUTS") and not is_capturing(call.state.device):
        check_update_data(call)
        sources = None
    launch = _launcher(call, spec_update, args_update)
    launch(call)
    return call.result, CallTemplate.launcher(call, sources, _returning(launch, "result"))


def run_fn(call: Conv1dFnCall, sources: dict | None = None):
    """As :func:`run_update`; ``out`` is the call's new tensor (rebuilt as one of x's geometry per call)."""
    if settings.get("MATE_CHECK_INPUTS") and not is_capturing(call.state.device):
        check_fn_data(call)
        sources = None
    launch = _launcher(call, spec_fn, args_fn)
    if spec_fn(call) is None and call.x.shape[1]:
        launch = _zero_out  # no sequence: every token is outside one
    launch(call)
    return call.out, CallTemplate.launcher(call, sources, _returning(launch, "out"), fresh=("out",))


def _launcher(call, spec_of, args_of):
    """``launch(call)`` for calls of ``call``'s metadata: the compiled kernel of ``spec_of(call)``, looked up once
    per pointer alignment (:func:`~.conv1d_plan.pointers`, checked per call: the vector form needs 16 bytes), run
    on ``args_of(call)``."""
    if spec_of(call) is None:
        return lambda c: None
    device = call.state.device
    kernels: dict = {}

    def launch(c):
        key = pointers(c)
        kern = kernels.get(key)
        if kern is None:
            kern = kernels[key] = kernel(spec_of(c), device)
        kern(*args_of(c))

    return launch


def _returning(launch, field: str):
    """``launch`` returning the launched call's ``field`` (what the op returns)."""

    def run(c):
        launch(c)
        return getattr(c, field)

    return run


def _zero_out(call: Conv1dFnCall) -> None:
    call.out.zero_()


def serving_specs(*, dim, width, io_dtype, state_dtype, weight_dtype, index_dtype, has_bias, silu) -> list:
    """The kernels one serving configuration launches: the prefill (with and without the tables vLLM passes) and
    the update's forms (one token, MTP dense and packed; the result into x or a caller's out), each in its vector
    and scalar form."""
    del dim  # a runtime dimension
    n = DTYPE_NAMES
    common = dict(width=width, x_dtype=n[io_dtype], state_dtype=n[state_dtype], weight_dtype=n[weight_dtype],
                  bias_dtype=n[weight_dtype], has_bias=has_bias, silu=silu)  # fmt: skip
    idx = n[index_dtype]
    specs = [Conv1dFnSpec(**common, qsl_dtype=idx, slot_dtype=idx, has_slots=True, has_init=True, has_null=True,
                          threads=TUNING["threads"], block_t=TUNING["block_t"])]  # fmt: skip
    for varlen, spec_decode in ((False, False), (False, True), (True, True)):
        for via in (True, False):
            specs.append(Conv1dUpdateSpec(
                **common, slot_dtype=idx, acc_dtype=idx if spec_decode else "int32",
                qsl_dtype=idx if varlen else "int32", varlen=varlen, spec_decode=spec_decode, has_slots=True,
                has_null=True, round_via_state=via, threads=TUNING["update_threads"],
                group=update_group(varlen, spec_decode),
            ))  # fmt: skip
    # each in the vector form (vLLM's layout at aligned pointers) and the scalar one (any other call)
    dts = {n[io_dtype], n[state_dtype], n[weight_dtype]}
    vec = {Conv1dFnSpec: vector_width(*dts), Conv1dUpdateSpec: vector_width(*dts, nbytes=TUNING["update_vec_bytes"])}
    return specs + [dataclasses.replace(s, vec=vec[type(s)]) for s in specs]


def prewarm(device, **config) -> None:
    specs = serving_specs(**config)
    compile_missing(specs, target=tilelang_target(device), jobs=1)
    for spec in specs:
        kernel(spec, device)


def compile_grid() -> list:
    """Representative configurations: every serving form (:func:`serving_specs`) at width 4 with bf16 io and pool
    (int32 tables, bias) and with fp16 io over an fp32 pool (fp32 products: the pool and weight dtypes differ;
    int64 tables, no bias, no silu); the prefill without tables at widths 2 and 6; the one-token update with fp32
    io at width 6, and over a bf16 pool with and without the result's rounding through the pool's dtype (the
    forms differ only there)."""
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    specs = serving_specs(dim=0, width=4, io_dtype=bf16, state_dtype=bf16, weight_dtype=bf16,
                          index_dtype=torch.int32, has_bias=True, silu=True)  # fmt: skip
    specs += serving_specs(dim=0, width=4, io_dtype=f16, state_dtype=f32, weight_dtype=f16,
                           index_dtype=torch.int64, has_bias=False, silu=False)  # fmt: skip
    plain = dict(qsl_dtype="int32", slot_dtype="int32", has_slots=False, has_init=False, has_null=False,
                 threads=TUNING["threads"], block_t=TUNING["block_t"])  # fmt: skip
    for width, io in ((2, "bfloat16"), (6, "float32")):
        specs.append(Conv1dFnSpec(width=width, x_dtype=io, state_dtype=io, weight_dtype=io, bias_dtype=io,
                                  has_bias=True, silu=True, **plain))  # fmt: skip
    for width, io, pool, via in ((6, "float32", "float32", True), (4, "float32", "bfloat16", True),
                                 (4, "float32", "bfloat16", False)):  # fmt: skip
        specs.append(Conv1dUpdateSpec(
            width=width, x_dtype=io, state_dtype=pool, weight_dtype=io, bias_dtype=io, slot_dtype="int32",
            acc_dtype="int32", qsl_dtype="int32", has_bias=True, silu=True, varlen=False, spec_decode=False,
            has_slots=False, has_null=False, round_via_state=via, threads=TUNING["update_threads"],
        ))  # fmt: skip
    return specs


__all__ = ["PREWARM_HINT", "compile_grid", "kernel", "prewarm", "run_fn", "run_update", "serving_specs"]
