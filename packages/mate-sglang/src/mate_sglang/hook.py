"""Registers MATE in SGLang's SSU backend registry, adds it to ``--mamba-backend``, and routes SGLang's chunked
prefill to MATE.

Written against SGLang 0.5.23, whose Mamba ops live in ``sglang/kernels/ops/mamba/triton_ops/``:

* ``ssu_dispatch.py`` selects the decode kernel through ``_BACKEND_REGISTRY`` (``MambaSSUBackend`` subclasses keyed
  by the ``--mamba-backend`` string), constructed once per scheduler as
  ``cls(enable_stochastic_rounding=..., cache_philox_rounds=...)``;
* ``ssd_combined.py`` holds ``mamba_chunk_scan_combined``, which the mixer (``srt/layers/attention/mamba/mamba.py``)
  imports by name from the ``triton_ops`` package;
* ``--mamba-backend`` is the ``mamba_backend`` field of ``srt/arg_groups/fields/exec_.py``'s ``ExecMamba``, whose
  argparse choices are ``triton`` and ``flashinfer``.

SGLang has no plugin entry point, so :func:`enable` arms post-import patches in this interpreter (call it before
SGLang starts, e.g. in a launcher), and with ``MATE_SGLANG_ENABLE=1`` the ``mate_sglang.pth`` start-up line arms
them in *every* interpreter of the environment, which covers SGLang's scheduler subprocesses. Then:

* ``--mamba-backend`` accepts ``mate``, and the registry holds MATE's backend as ``"mate"`` and under the names in
  ``MATE_SGLANG_SSU_BACKENDS`` (default ``triton,flashinfer``: whichever backend is configured, MATE serves it;
  ``none``: ``--mamba-backend mate`` only);
* ``mamba_chunk_scan_combined`` (and every SGLang module that imported it by name) becomes
  :func:`mate_sglang.ops.mamba_chunk_scan_combined`, track states included, unless ``MATE_SGLANG_PREFILL=0``.
* with ``MATE_SGLANG_CONV1D=1``, the causal conv1d functions of ``kernels/ops/mamba/causal_conv1d_triton.py`` and
  ``srt/layers/attention/mamba/causal_conv1d.py``, and every SGLang module's binding of them, become
  :mod:`mate_sglang.conv1d`'s; the call forms MATE does not serve run SGLang's (off by default until MATE's conv1d
  kernels are measured against SGLang's).

When ``sglang`` is imported the hook reads its version: another version than 0.5.23 gets a warning saying that
MATE serves only where the registry and signatures match 0.5.23's; an SGLang without the ``triton_ops`` layout
gets a warning naming its version, and nothing is patched. A patch whose registry or signature differs is skipped
with a warning naming what differs. Stdlib only at import time.
"""

from __future__ import annotations

import os
import warnings

from ._adapter import ENV_CONV1D, ENV_ENABLE, ENV_PREFILL, ENV_SSU, NAME, adapter

MAMBA_OPS = "sglang.kernels.ops.mamba.triton_ops"
SSU_DISPATCH = f"{MAMBA_OPS}.ssu_dispatch"
SSD_COMBINED = f"{MAMBA_OPS}.ssd_combined"
SERVER_FIELDS = "sglang.srt.arg_groups.fields.exec_"
BACKEND_CHOICE = "mate"

SSU_CALL_PARAMS = (
    "state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus", "state_batch_indices", "pad_slot_id",
    "out", "disable_state_update", "intermediate_states_buffer", "cache_steps", "retrieve_parent_token",
    "intermediate_state_indices",
)  # fmt: skip
BACKEND_INIT_PARAMS = ("enable_stochastic_rounding", "cache_philox_rounds")
PREFILL_PARAMS = (
    "x", "dt", "A", "B", "C", "chunk_size", "D", "z", "dt_bias", "initial_states", "seq_idx", "chunk_indices",
    "chunk_offsets", "cu_seqlens", "dt_softplus", "dt_limit", "out", "return_final_states", "return_varlen_states",
    "return_intermediate_states", "state_dtype", "return_track_states", "track_seq_idx", "track_end_locs",
)  # fmt: skip


# ------------------------------------------------------------------------------------------------ SSU


def make_backend_class(base):
    """A ``MambaSSUBackend`` subclass (SGLang's ABC, passed in) that serves SGLang's backend call with MATE."""
    from . import ops

    class MateSSUBackend(base):
        """MATE's selective_state_update behind SGLang's SSU backend interface (SGLang's Triton semantics).

        Constructed as SGLang constructs every backend: with ``--enable-mamba-cache-stochastic-rounding`` the
        fp16 state cache's final stores are rounded stochastically, ``cache_philox_rounds`` Philox rounds (as
        SGLang's Triton backend rounds them)."""

        def __init__(self, *, enable_stochastic_rounding: bool = False, cache_philox_rounds: int = 0) -> None:
            self.enable_stochastic_rounding = bool(enable_stochastic_rounding)
            self.cache_philox_rounds = cache_philox_rounds

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
            pad_slot_id=ops.PAD_SLOT_ID,
            out=None,
            disable_state_update=False,
            intermediate_states_buffer=None,
            cache_steps=None,
            retrieve_parent_token=None,
            intermediate_state_indices=None,
        ):
            ops.selective_state_update(
                state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
                state_batch_indices=state_batch_indices, pad_slot_id=pad_slot_id, out=out,
                disable_state_update=disable_state_update, intermediate_states_buffer=intermediate_states_buffer,
                cache_steps=cache_steps, retrieve_parent_token=retrieve_parent_token,
                intermediate_state_indices=intermediate_state_indices,
                enable_stochastic_rounding=self.enable_stochastic_rounding,
                cache_philox_rounds=self.cache_philox_rounds,
            )  # fmt: skip

    return MateSSUBackend


def _patch_ssu_dispatch(sd) -> None:
    import inspect  # (here, not at module import: the .pth line runs in every interpreter)

    a = adapter()
    registry = getattr(sd, "_BACKEND_REGISTRY", None)
    base = getattr(sd, "MambaSSUBackend", None)
    if not isinstance(registry, dict) or not inspect.isclass(base) or any(not isinstance(k, str) for k in registry):
        a.state["ssu"] = "skipped: no str-keyed _BACKEND_REGISTRY / MambaSSUBackend"
        a.warn(
            f"{sd.__name__} has no str-keyed _BACKEND_REGISTRY / MambaSSUBackend class (an SGLang version this hook "
            "does not know); the MATE SSU backend is not registered"
        )
        return
    params = tuple(inspect.signature(base.__call__).parameters)[1:]
    if params != SSU_CALL_PARAMS:
        a.state["ssu"] = "skipped: MambaSSUBackend.__call__ signature differs"
        a.warn(f"SGLang's MambaSSUBackend.__call__ takes {params}, expected {SSU_CALL_PARAMS}; MATE is not registered")
        return
    triton = registry.get("triton")
    init = tuple(
        n for n, p in inspect.signature(getattr(triton, "__init__", object.__init__)).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    )  # fmt: skip
    if triton is not None and init != BACKEND_INIT_PARAMS:
        a.state["ssu"] = "skipped: backend constructor differs"
        a.warn(
            f"SGLang constructs its SSU backends with {init}, expected {BACKEND_INIT_PARAMS}; MATE is not registered"
        )
        return
    cls = make_backend_class(base)
    names = []
    for name in ["mate", *a.setting(ENV_SSU)]:
        if name != "mate" and name not in registry:
            a.warn(f"{ENV_SSU}: SGLang has no mamba backend named {name!r}; valid: {sorted(registry)}")
            continue
        a.ledger.set_entry(registry, name, name, cls)
        names.append(name)
    current = getattr(sd, "_mamba_ssu_backend", None)
    if current is not None and not isinstance(current, cls):
        a.warn(f"SGLang's SSU backend was initialised ({type(current).__name__}) before MATE registered; it stays")
    a.state["ssu"] = f"registered as {names}"


# ---------------------------------------------------------------------------------- --mamba-backend


def _patch_server_fields(mod) -> None:
    """Add ``mate`` to the argparse choices of ``--mamba-backend`` (``ExecMamba.mamba_backend``'s ``Arg``).

    SGLang builds its parser from the fields' ``Annotated`` hints (``typing.get_type_hints``), evaluated anew on
    every call, so the hint itself is replaced by an evaluated one whose ``Arg`` lists ``mate``."""
    import typing

    a = adapter()
    cls = getattr(mod, "ExecMamba", None)
    try:
        hint = typing.get_type_hints(cls, include_extras=True)["mamba_backend"]
        (arg,) = [m for m in getattr(hint, "__metadata__", ()) if isinstance(getattr(m, "choices", None), list)]
    except Exception:  # noqa: BLE001  (any other shape is a layout this hook does not know)
        a.state["choices"] = "skipped: no ExecMamba.mamba_backend with choices"
        a.warn(f"{mod.__name__} has no ExecMamba.mamba_backend field with choices; --mamba-backend mate is unavailable")
        return
    if BACKEND_CHOICE in arg.choices:
        return
    fields = {f: getattr(arg, f) for f in arg.__struct_fields__}
    fields["choices"] = [*arg.choices, BACKEND_CHOICE]
    fields["help"] = f"{fields.get('help', '')} 'mate': MATE's TileLang kernels (mate-sglang).".strip()
    a.ledger.set_entry(cls.__annotations__, "ExecMamba.mamba_backend", "mamba_backend", typing.Annotated[
        hint.__origin__, type(arg)(**fields)
    ])  # fmt: skip
    a.state["choices"] = f"--mamba-backend choices {fields['choices']}"


# ------------------------------------------------------------------------------------------- version


def _check_sglang(mod) -> bool:
    """Whether this SGLang has the layout the hook patches; warns naming the version when it is not 0.5.23."""
    a = adapter()
    roots = list(getattr(mod, "__path__", ()))
    layout = os.path.join(*MAMBA_OPS.split(".")[1:], "ssu_dispatch.py")
    if not any(os.path.exists(os.path.join(r, layout)) for r in roots):
        a.warn(
            f"SGLang {a.engine_version(mod)} has no {SSU_DISPATCH} (mate-sglang knows the layout of SGLang "
            f"{', '.join(a.tested)}); nothing is patched and SGLang serves its own kernels"
        )
        return False  # (the other modules' hooks are armed only after this check)
    a.check_version(mod)
    return True


# -------------------------------------------------------------------------------------------- prefill


def _patch_ssd_combined(mod) -> None:
    import inspect

    from . import ops

    a = adapter()
    orig = getattr(mod, "mamba_chunk_scan_combined", None)
    if orig is None or not callable(orig) or orig is ops.mamba_chunk_scan_combined:
        if orig is None:
            a.state["prefill"] = "skipped: no mamba_chunk_scan_combined"
            a.warn(f"{mod.__name__} has no mamba_chunk_scan_combined; the prefill is not routed to MATE")
        return
    try:
        params = tuple(inspect.signature(orig).parameters)
    except (TypeError, ValueError):
        params = ()
    known = set(PREFILL_PARAMS)
    if params[:6] != PREFILL_PARAMS[:6] or params[6:10] != PREFILL_PARAMS[6:10] or not set(params) <= known:
        a.state["prefill"] = "skipped: signature differs"
        a.warn(
            f"SGLang's mamba_chunk_scan_combined takes {params}; MATE serves {PREFILL_PARAMS} (per-token seq_idx "
            "scheme); the prefill is not routed to MATE"
        )
        return
    patched = a.ledger.rebind(mod, "mamba_chunk_scan_combined", orig, ops.mamba_chunk_scan_combined)
    a.state["prefill"] = f"routed in {patched}"


# --------------------------------------------------------------------------------------------- conv1d

CONV1D_TRITON = "sglang.kernels.ops.mamba.causal_conv1d_triton"
CONV1D_SRT = "sglang.srt.layers.attention.mamba.causal_conv1d"
# (module, its function, mate_sglang.conv1d's replacement, the parameters it was written against)
CONV1D_ENTRIES = {
    CONV1D_TRITON: (
        ("causal_conv1d_fn", "causal_conv1d_fn_triton", (
            "x", "weight", "bias", "conv_states", "query_start_loc", "seq_lens_cpu", "cache_indices",
            "has_initial_state", "activation", "pad_slot_id", "validate_data", "block_table", "kwargs",
        )),
        ("causal_conv1d_update", "causal_conv1d_update_triton", (
            "x", "conv_state", "weight", "bias", "activation", "cache_seqlens", "conv_state_indices",
            "num_accept_tokens", "intermediate_conv_window", "intermediate_state_indices", "retrieve_next_token",
            "retrieve_next_sibling", "retrieve_parent_token", "pad_slot_id", "metadata", "validate_data",
        )),
    ),
    CONV1D_SRT: (
        ("causal_conv1d_fn", "causal_conv1d_fn", (
            "x", "weight", "bias", "query_start_loc", "cache_indices", "has_initial_state", "conv_states",
            "activation", "pad_slot_id", "kwargs",
        )),
        ("causal_conv1d_update", "causal_conv1d_update", (
            "x", "conv_state", "weight", "bias", "activation", "cache_seqlens", "conv_state_indices", "pad_slot_id",
        )),
    ),
}  # fmt: skip


def _patch_conv1d(mod) -> None:
    """Replace the module's conv1d functions, and every SGLang module's binding of them under any name (the mixers
    import the Triton ones as ``causal_conv1d_*_triton``), with :mod:`mate_sglang.conv1d`'s."""
    import inspect
    import sys

    from . import conv1d

    a = adapter()
    done = {}
    for attr, mine_name, expected in CONV1D_ENTRIES[mod.__name__]:
        orig, mine = getattr(mod, attr, None), getattr(conv1d, mine_name)
        if orig is mine:
            continue
        try:
            params = tuple(inspect.signature(orig).parameters)
        except (TypeError, ValueError):
            params = ()
        if params != expected:
            a.warn(f"SGLang's {mod.__name__}.{attr} takes {params}, expected {expected}; it is not routed to MATE")
            continue
        conv1d.ENGINE_CONV1D[mine_name] = orig
        bound = a.ledger.rebind(mod, attr, orig, mine)
        for m in list(sys.modules.values()):
            name = getattr(m, "__name__", "") or ""
            if name.startswith("sglang."):
                for alias, value in list(vars(m).items()):
                    if value is orig:
                        a.ledger.set_attr(m, alias, mine)
                        bound.append(f"{name}.{alias}")
        done[attr] = sorted(bound)
    state = dict(a.state.get("conv1d") or {})
    state[mod.__name__] = done
    a.state["conv1d"] = state


# ---------------------------------------------------------------------------------------------- entry


def enable() -> None:
    """Arm the registry and prefill patches in this interpreter (applied when SGLang imports the modules).

    A malformed ``MATE_SGLANG_SSU_BACKENDS`` / ``MATE_SGLANG_PREFILL`` raises ``ValueError`` naming it."""
    a = adapter()
    prefill = a.setting(ENV_PREFILL)
    conv = a.setting(ENV_CONV1D)
    a.setting(ENV_SSU)  # a malformed value raises here, not later inside SGLang's imports

    def arm(sglang) -> None:
        if not _check_sglang(sglang):
            return
        a.when_imported(SERVER_FIELDS, _patch_server_fields)
        a.when_imported(SSU_DISPATCH, _patch_ssu_dispatch)
        if prefill:
            a.when_imported(SSD_COMBINED, _patch_ssd_combined)
        if conv:
            a.when_imported(CONV1D_TRITON, _patch_conv1d)
            a.when_imported(CONV1D_SRT, _patch_conv1d)

    a.when_imported("sglang", arm)


def enable_from_env() -> None:
    """What the ``.pth`` line runs: :func:`enable` when ``MATE_SGLANG_ENABLE=1``; never raises (a malformed
    value of one of its switches in ``mate.mamba.settings``, or a failure to arm, is a warning naming it, and nothing
    is armed)."""
    if not os.environ.get(ENV_ENABLE):
        # unset: the setting's default (off), decided without importing anything, since this line runs at
        # the start of every interpreter of the environment
        return
    try:
        if adapter().setting(ENV_ENABLE):
            enable()
    except Exception as e:  # noqa: BLE001  (a start-up line must never break an interpreter)
        warnings.warn(f"{NAME}: the SGLang hook is not armed: {e}", stacklevel=2)


def disable() -> None:
    """Restore what was replaced and drop pending hooks."""
    adapter().restore()


def status() -> dict:
    return adapter().status()
