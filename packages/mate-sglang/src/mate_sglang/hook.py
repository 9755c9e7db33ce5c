"""Registers MATE in SGLang's SSU backend registry, and routes SGLang's chunked prefill to MATE.

SGLang selects its decode kernel through ``_BACKEND_REGISTRY`` in
``sglang/srt/layers/attention/mamba/ops/ssu_dispatch.py`` (``MambaSSUBackend`` subclasses keyed by the
``--mamba-backend`` string, constructed without arguments). SGLang has no plugin entry point, so:

* :func:`enable` arms post-import patches in this interpreter (call it before SGLang starts, e.g. in a launcher);
* with ``MATE_SGLANG_ENABLE=1`` the ``mate_sglang.pth`` start-up line arms them in *every* interpreter of the
  environment, which covers SGLang's scheduler subprocesses.

When ``ssu_dispatch`` is imported, MATE's backend is registered as ``"mate"`` and takes over the names in
``MATE_SGLANG_SSU_BACKENDS`` (default ``triton,flashinfer``: SGLang's ``--mamba-backend`` choices are fixed, so
the configured one is served by MATE; ``none`` registers ``"mate"`` only). When ``ops/ssd_combined.py`` is
imported, ``mamba_chunk_scan_combined`` (and every SGLang module that imported it by name) becomes
:func:`mate_sglang.ops.mamba_chunk_scan_combined`, unless ``MATE_SGLANG_PREFILL=0``. An SGLang whose registry
or signatures differ gets a warning naming what is missing and is left untouched. Stdlib only at import time.
"""

from __future__ import annotations

import os
import warnings

OWNER = "mate-sglang"
ENV_ENABLE = "MATE_SGLANG_ENABLE"
ENV_SSU = "MATE_SGLANG_SSU_BACKENDS"
ENV_PREFILL = "MATE_SGLANG_PREFILL"
SSU_DISPATCH = "sglang.srt.layers.attention.mamba.ops.ssu_dispatch"
SSD_COMBINED = "sglang.srt.layers.attention.mamba.ops.ssd_combined"

SSU_CALL_PARAMS = (
    "state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "state_batch_indices", "out",
    "disable_state_update", "intermediate_states_buffer", "cache_steps", "retrieve_parent_token",
    "intermediate_state_indices",
)  # fmt: skip
PREFILL_PARAMS = (
    "x", "dt", "A", "B", "C", "chunk_size", "D", "z", "dt_bias", "initial_states", "seq_idx", "chunk_indices",
    "chunk_offsets", "cu_seqlens", "dt_softplus", "dt_limit", "out", "return_final_states", "return_varlen_states",
    "return_intermediate_states", "state_dtype",
)  # fmt: skip


def _ledger():
    from mate._import_hooks import ledger  # imported on use: module import stays stdlib-only

    return ledger(OWNER, "sglang.")


_state = {"ssu": None, "prefill": None}


def _warn(msg: str) -> None:
    warnings.warn(f"mate-sglang: {msg}", stacklevel=3)


def _when_imported(name: str, callback) -> None:
    from mate._import_hooks import when_imported as _hook  # imported on use: module import stays stdlib-only

    _hook(name, callback, owner=OWNER)


def _guard(fn):
    def run(module):
        try:
            fn(module)
        except Exception as e:  # noqa: BLE001  (a hook must never take SGLang down)
            _warn(f"{fn.__name__} failed and was skipped: {e!r}")

    return run


# ------------------------------------------------------------------------------------------------ SSU


def make_backend_class(base):
    """A ``MambaSSUBackend`` subclass (SGLang's ABC, passed in) that serves SGLang's backend call with MATE."""
    from . import ops

    class MateSSUBackend(base):
        """MATE's selective_state_update behind SGLang's SSU backend interface (SGLang's Triton semantics)."""

        @property
        def name(self) -> str:
            return "mate"

        def __call__(
            self,
            state,
            x,
            dt,
            A,
            B,
            C,
            D=None,
            z=None,
            dt_bias=None,
            dt_softplus=False,
            state_batch_indices=None,
            out=None,
            disable_state_update=False,
            intermediate_states_buffer=None,
            cache_steps=None,
            retrieve_parent_token=None,
            intermediate_state_indices=None,
        ):
            ops.selective_state_update(
                state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                state_batch_indices=state_batch_indices, out=out, disable_state_update=disable_state_update,
                intermediate_states_buffer=intermediate_states_buffer, cache_steps=cache_steps,
                retrieve_parent_token=retrieve_parent_token, intermediate_state_indices=intermediate_state_indices,
            )  # fmt: skip

    return MateSSUBackend


def _setting(name: str):
    """A MATE_* switch, parsed by ``mate.settings`` (stdlib only; ``ValueError`` naming a malformed variable)."""
    from mate import settings  # imported on use: the .pth line imports this module in every interpreter

    return settings.get(name)


def _patch_ssu_dispatch(sd) -> None:
    import inspect  # (here, not at module import: the .pth line runs in every interpreter)

    registry = getattr(sd, "_BACKEND_REGISTRY", None)
    base = getattr(sd, "MambaSSUBackend", None)
    if not isinstance(registry, dict) or not inspect.isclass(base) or any(not isinstance(k, str) for k in registry):
        _state["ssu"] = "skipped: no str-keyed _BACKEND_REGISTRY / MambaSSUBackend"
        _warn(
            f"{sd.__name__} has no str-keyed _BACKEND_REGISTRY / MambaSSUBackend class (an SGLang version this hook "
            "does not know); the MATE SSU backend is not registered"
        )
        return
    params = tuple(inspect.signature(base.__call__).parameters)[1:]
    if params != SSU_CALL_PARAMS:
        _state["ssu"] = "skipped: MambaSSUBackend.__call__ signature differs"
        _warn(f"SGLang's MambaSSUBackend.__call__ takes {params}, expected {SSU_CALL_PARAMS}; MATE is not registered")
        return
    cls = make_backend_class(base)
    names = []
    for name in ["mate", *_setting(ENV_SSU)]:
        if name != "mate" and name not in registry:
            _warn(f"{ENV_SSU}: SGLang has no mamba backend named {name!r}; valid: {sorted(registry)}")
            continue
        _ledger().set_entry(registry, name, name, cls)
        names.append(name)
    current = getattr(sd, "_mamba_ssu_backend", None)
    if current is not None and not isinstance(current, cls):
        _warn(f"SGLang's SSU backend was initialised ({type(current).__name__}) before MATE registered; it stays")
    _state["ssu"] = f"registered as {names}"


# -------------------------------------------------------------------------------------------- prefill


def _patch_ssd_combined(mod) -> None:
    import inspect

    from . import ops

    orig = getattr(mod, "mamba_chunk_scan_combined", None)
    if orig is None or not callable(orig) or orig is ops.mamba_chunk_scan_combined:
        if orig is None:
            _state["prefill"] = "skipped: no mamba_chunk_scan_combined"
            _warn(f"{mod.__name__} has no mamba_chunk_scan_combined; the prefill is not routed to MATE")
        return
    try:
        params = tuple(inspect.signature(orig).parameters)
    except (TypeError, ValueError):
        params = ()
    known = set(PREFILL_PARAMS)
    if params[:6] != PREFILL_PARAMS[:6] or params[6:10] != PREFILL_PARAMS[6:10] or not set(params) <= known:
        _state["prefill"] = "skipped: signature differs"
        _warn(
            f"SGLang's mamba_chunk_scan_combined takes {params}; MATE serves {PREFILL_PARAMS} (per-token seq_idx "
            "scheme); the prefill is not routed to MATE"
        )
        return
    patched = _ledger().rebind(mod, "mamba_chunk_scan_combined", orig, ops.mamba_chunk_scan_combined)
    _state["prefill"] = f"routed in {patched}"


# ---------------------------------------------------------------------------------------------- entry


def enable() -> None:
    """Arm the registry and prefill patches in this interpreter (applied when SGLang imports the modules).

    A malformed ``MATE_SGLANG_SSU_BACKENDS`` / ``MATE_SGLANG_PREFILL`` raises ``ValueError`` naming it."""
    prefill = _setting(ENV_PREFILL)
    _setting(ENV_SSU)  # a malformed value raises here, not later inside SGLang's imports
    _when_imported(SSU_DISPATCH, _guard(_patch_ssu_dispatch))
    if prefill:
        _when_imported(SSD_COMBINED, _guard(_patch_ssd_combined))


def enable_from_env() -> None:
    """What the ``.pth`` line runs: :func:`enable` when ``MATE_SGLANG_ENABLE=1``; never raises (a malformed
    value of one of its switches in ``mate.settings``, or a failure to arm, is a warning naming it, and nothing
    is armed)."""
    if not os.environ.get(ENV_ENABLE):
        # unset: the setting's default (off), decided without importing anything, since this line runs at
        # the start of every interpreter of the environment
        return
    try:
        if _setting(ENV_ENABLE):
            enable()
    except Exception as e:  # noqa: BLE001  (a start-up line must never break an interpreter)
        _warn(f"the SGLang hook is not armed: {e}")


def disable() -> None:
    """Restore what was replaced and drop pending hooks."""
    _ledger().restore()
    _state.update(ssu=None, prefill=None)


def status() -> dict:
    return dict(_state)
